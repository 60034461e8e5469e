#include "io/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <queue>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <unistd.h>

#include "core/env.h"
#include "core/check.h"
#include "io/model_config.h"

namespace qinfer {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// Qwen2/Qwen2.5/Qwen3's pre-tokenizer split pattern (used when only vocab.json + merges.txt are given).
const char * k_qwen_pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// GPT-2's bytes_to_unicode: printable bytes map to themselves, the rest to 256, 257, ...
std::vector<uint32_t> byte_to_codepoint() {
    std::vector<uint32_t> map(256);
    uint32_t next = 256;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        map[size_t(b)] = printable ? uint32_t(b) : next++;
    }
    return map;
}

void append_utf8(std::string & s, uint32_t cp) {
    uint8_t buf[4];
    utf8proc_ssize_t n = utf8proc_encode_char(utf8proc_int32_t(cp), buf);
    s.append(reinterpret_cast<char *>(buf), size_t(n));
}

// Byte-level spelling (vocab.json) -> raw bytes. Returns false when a character is outside the byte map.
bool spelling_to_bytes(const std::string & spelling, std::string * out) {
    static const std::vector<int> cp_to_byte = [] {
        std::vector<int> m(512, -1);
        auto b2c = byte_to_codepoint();
        for (int b = 0; b < 256; b++) m[b2c[size_t(b)]] = b;
        return m;
    }();
    out->clear();
    const auto * p = reinterpret_cast<const utf8proc_uint8_t *>(spelling.data());
    utf8proc_ssize_t left = utf8proc_ssize_t(spelling.size());
    while (left > 0) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t n = utf8proc_iterate(p, left, &cp);
        if (n <= 0 || cp < 0 || cp >= 512 || cp_to_byte[size_t(cp)] < 0) return false;
        out->push_back(char(cp_to_byte[size_t(cp)]));
        p += n;
        left -= n;
    }
    return true;
}

std::string bytes_to_spelling(std::string_view bytes) {
    static const std::vector<uint32_t> b2c = byte_to_codepoint();
    std::string s;
    for (unsigned char b : bytes) append_utf8(s, b2c[b]);
    return s;
}

uint64_t pair_key(int a, int b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }

}  // namespace

struct Tokenizer::Regex {
    pcre2_code * code = nullptr;
    ~Regex() {
        if (code) pcre2_code_free(code);
    }
};

Tokenizer::Tokenizer() = default;
Tokenizer::~Tokenizer() = default;

namespace {

constexpr char k_cache_magic[8] = {'Q', 'T', 'O', 'K', 'C', 'A', 'C', '1'};

// Cache file for these inputs, or "" when they cannot be stat'ed.
std::string cache_path_for(const std::string & json_path, const std::string & config_path) {
    std::error_code ec;
    const fs::path canon = fs::canonical(json_path, ec);
    if (ec) return "";
    std::string key = canon.string();
    for (const std::string & f : {json_path, config_path}) {
        if (!fs::exists(f, ec)) continue;
        key += '|';
        key += std::to_string(fs::file_size(f, ec));
        key += '|';
        key += std::to_string(fs::last_write_time(f, ec).time_since_epoch().count());
    }
    uint64_t h = 1469598103934665603ull;  // FNV-1a
    for (unsigned char c : key) h = (h ^ c) * 1099511628211ull;
    const fs::path base = read_env().cache_dir;
    char name[32];
    std::snprintf(name, sizeof name, "%016llx.bin", static_cast<unsigned long long>(h));
    return (base / "tokenizers" / name).string();
}

void put_u32(std::string & out, uint32_t v) { out.append(reinterpret_cast<const char *>(&v), 4); }
void put_str(std::string & out, const std::string & s) {
    put_u32(out, uint32_t(s.size()));
    out += s;
}

struct CacheReader {
    const std::string & data;
    size_t pos = 0;
    bool ok = true;
    uint32_t u32() {
        if (pos + 4 > data.size()) {
            ok = false;
            return 0;
        }
        uint32_t v;
        std::memcpy(&v, data.data() + pos, 4);
        pos += 4;
        return v;
    }
    std::string str() {
        const uint32_t n = u32();
        if (!ok || pos + n > data.size()) {
            ok = false;
            return {};
        }
        std::string s = data.substr(pos, n);
        pos += n;
        return s;
    }
};

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::load_file(const std::string & path) {
    const std::string config_path = (fs::path(path).parent_path() / "tokenizer_config.json").string();
    const std::string cache = cache_path_for(path, config_path);
    if (!cache.empty()) {
        if (auto t = load_cache(cache)) return t;
    }
    auto t = from_json_text(read_text_file(path), path, config_path);
    if (!cache.empty()) t->save_cache(cache);
    return t;
}

std::unique_ptr<Tokenizer> Tokenizer::parse(const std::string & json_text, const std::string & what) {
    return from_json_text(json_text, what, "");
}

void Tokenizer::save_cache(const std::string & path) const {
    std::string out(k_cache_magic, sizeof k_cache_magic);
    put_u32(out, uint32_t(vocab_.size()));
    for (const auto & [bytes, id] : vocab_) {
        put_str(out, bytes);
        put_u32(out, uint32_t(id));
    }
    put_u32(out, uint32_t(merges_.size()));
    for (const auto & [key, v] : merges_) {
        put_u32(out, uint32_t(key >> 32));
        put_u32(out, uint32_t(key));
        put_u32(out, uint32_t(v.first));
        put_u32(out, uint32_t(v.second));
    }
    put_u32(out, uint32_t(added_.size()));
    for (const auto & a : added_) {
        put_u32(out, uint32_t(a.id));
        put_u32(out, a.special ? 1u : 0u);
        put_str(out, a.content);
    }
    put_str(out, pattern_);
    put_str(out, chat_template_);
    put_str(out, eos_token_);
    // Best effort: a read-only home only costs the next load its speed.
    std::error_code ec;
    fs::create_directories(fs::path(path).parent_path(), ec);
    const std::string tmp = path + ".tmp" + std::to_string(::getpid());
    {
        std::ofstream f(tmp, std::ios::binary);
        if (!f) return;
        f.write(out.data(), std::streamsize(out.size()));
        if (!f) return;
    }
    fs::rename(tmp, path, ec);
    if (ec) fs::remove(tmp, ec);
}

std::unique_ptr<Tokenizer> Tokenizer::load_cache(const std::string & path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) return nullptr;
    std::stringstream ss;
    ss << f.rdbuf();
    const std::string data = ss.str();
    if (data.size() < sizeof k_cache_magic || data.compare(0, sizeof k_cache_magic, k_cache_magic, sizeof k_cache_magic) != 0) return nullptr;
    CacheReader r{data, sizeof k_cache_magic};
    std::unique_ptr<Tokenizer> t(new Tokenizer());
    const uint32_t n_vocab = r.u32();
    t->vocab_.reserve(n_vocab);
    for (uint32_t i = 0; i < n_vocab && r.ok; i++) {
        std::string bytes = r.str();
        t->vocab_[std::move(bytes)] = int(r.u32());
    }
    const uint32_t n_merges = r.u32();
    t->merges_.reserve(n_merges);
    for (uint32_t i = 0; i < n_merges && r.ok; i++) {
        const uint64_t hi = r.u32(), lo = r.u32();
        const int rank = int(r.u32()), merged = int(r.u32());
        t->merges_.emplace((hi << 32) | lo, std::make_pair(rank, merged));
    }
    const uint32_t n_added = r.u32();
    for (uint32_t i = 0; i < n_added && r.ok; i++) {
        AddedToken a;
        a.id = int(r.u32());
        a.special = r.u32() != 0;
        a.content = r.str();
        t->added_.push_back(std::move(a));
    }
    t->pattern_ = r.str();
    t->chat_template_ = r.str();
    t->eos_token_ = r.str();
    if (!r.ok || r.pos != data.size()) return nullptr;  // truncated or foreign: parse the JSON instead
    try {
        t->finish_load();
    } catch (const Error &) {
        return nullptr;
    }
    return t;
}

std::unique_ptr<Tokenizer> Tokenizer::from_json_text(const std::string & text, const std::string & path, const std::string & config_path) {
    std::unique_ptr<Tokenizer> t(new Tokenizer());
    // A SAX pass picks out what the tokenizer needs (model.vocab and model.merges hold 150k entries each) without
    // building the JSON document: building it is most of the load time.
    struct Handler : json::json_sax_t {
        std::vector<std::string> path;  // object keys, "[]" inside arrays
        std::vector<std::pair<std::string, int>> vocab;
        std::vector<std::pair<std::string, std::string>> merges;
        std::vector<std::string> pair;
        std::vector<AddedToken> added;
        std::string model_type, pattern;
        bool bad = false;
        bool at(std::initializer_list<const char *> p) const {
            if (path.size() != p.size()) return false;
            size_t i = 0;
            for (const char * k : p) {
                if (*k && path[i] != k) return false;
                i++;
            }
            return true;
        }
        bool number(int64_t v) {
            if (at({"model", "vocab", ""})) vocab.emplace_back(path.back(), int(v));
            else if (at({"added_tokens", "[]", "id"})) added.back().id = int(v);
            return true;
        }
        bool null() override { return true; }
        bool boolean(bool v) override {
            if (at({"added_tokens", "[]", "special"})) added.back().special = v;
            return true;
        }
        bool number_integer(number_integer_t v) override { return number(v); }
        bool number_unsigned(number_unsigned_t v) override { return number(int64_t(v)); }
        bool number_float(number_float_t, const string_t &) override {
            if (at({"model", "vocab", ""})) bad = true;
            return true;
        }
        bool string(string_t & v) override {
            if (at({"model", "merges", "[]"})) {
                const size_t sp = v.find(' ');
                if (sp == std::string::npos) bad = true;
                else merges.emplace_back(v.substr(0, sp), v.substr(sp + 1));
            } else if (at({"model", "merges", "[]", "[]"})) {
                pair.push_back(std::move(v));
            } else if (at({"model", "type"})) {
                model_type = v;
            } else if (at({"added_tokens", "[]", "content"})) {
                added.back().content = v;
            } else if (!path.empty() && path[0] == "pre_tokenizer" && path.back() == "Regex") {
                pattern = v;
            }
            return true;
        }
        bool binary(binary_t &) override { return true; }
        bool start_object(std::size_t) override {
            if (at({"added_tokens", "[]"})) {
                added.emplace_back();
                added.back().id = -1;  // required: a missing id fails in finish_load
            }
            path.emplace_back();
            return true;
        }
        bool key(string_t & k) override {
            path.back() = std::move(k);
            return true;
        }
        bool end_object() override {
            path.pop_back();
            return true;
        }
        bool start_array(std::size_t) override {
            path.emplace_back("[]");
            return true;
        }
        bool end_array() override {
            path.pop_back();
            if (at({"model", "merges", "[]"})) {
                if (pair.size() != 2) bad = true;
                else merges.emplace_back(std::move(pair[0]), std::move(pair[1]));
                pair.clear();
            }
            return true;
        }
        bool parse_error(std::size_t, const std::string &, const nlohmann::detail::exception &) override { return false; }
    } h;
    if (!json::sax_parse(text, &h) || h.path.size() != 0) QINFER_FAIL() << path << ": not valid JSON";
    if (h.bad) QINFER_FAIL() << path << ": model.vocab needs integer ids and model.merges 'a b' strings or [a, b] pairs";
    if (h.model_type != "BPE") QINFER_FAIL() << path << ": only BPE tokenizers are supported (model.type '" << h.model_type << "')";
    std::vector<std::pair<std::string, int>> & vocab_entries = h.vocab;
    std::vector<std::pair<std::string, std::string>> & merges = h.merges;
    if (vocab_entries.empty()) QINFER_FAIL() << path << ": model.vocab is missing or empty";
    t->vocab_.reserve(vocab_entries.size());
    for (const auto & [spelling, id] : vocab_entries) {
        std::string bytes;
        if (!spelling_to_bytes(spelling, &bytes)) QINFER_FAIL() << path << ": vocab entry '" << spelling << "' is not byte-level";
        t->vocab_[bytes] = id;
    }
    t->merges_.reserve(merges.size());
    for (size_t r = 0; r < merges.size(); r++) {
        std::string a, b;
        if (!spelling_to_bytes(merges[r].first, &a) || !spelling_to_bytes(merges[r].second, &b)) {
            QINFER_FAIL() << path << ": merge " << r << " is not byte-level";
        }
        auto ia = t->vocab_.find(a), ib = t->vocab_.find(b), iab = t->vocab_.find(a + b);
        if (ia == t->vocab_.end() || ib == t->vocab_.end() || iab == t->vocab_.end()) {
            QINFER_FAIL() << path << ": merge " << r << " ('" << merges[r].first << "' '" << merges[r].second << "') uses tokens not in the vocab";
        }
        t->merges_.emplace(pair_key(ia->second, ib->second), std::make_pair(int(r), iab->second));
    }
    t->added_ = std::move(h.added);
    t->pattern_ = h.pattern.empty() ? k_qwen_pattern : h.pattern;
    if (!config_path.empty() && fs::exists(config_path)) {
        json c = json::parse(read_text_file(config_path), nullptr, false);
        if (c.is_object()) {
            if (c.contains("chat_template") && c["chat_template"].is_string()) t->chat_template_ = c["chat_template"];
            if (c.contains("eos_token") && c["eos_token"].is_string()) t->eos_token_ = c["eos_token"];
        }
    }
    t->finish_load();
    return t;
}

std::unique_ptr<Tokenizer> Tokenizer::load_dir(const std::string & dir) {
    if (fs::exists(fs::path(dir) / "tokenizer.json")) return load_file((fs::path(dir) / "tokenizer.json").string());
    fs::path vocab_path = fs::path(dir) / "vocab.json", merges_path = fs::path(dir) / "merges.txt";
    if (!fs::exists(vocab_path) || !fs::exists(merges_path)) {
        QINFER_FAIL() << dir << ": no tokenizer.json, and no vocab.json + merges.txt";
    }
    // Rebuild the tokenizer.json form in memory from the two files and tokenizer_config.json.
    json tok = {{"model", {{"type", "BPE"}, {"vocab", json::parse(read_text_file(vocab_path.string()))}, {"merges", json::array()}}}};
    std::istringstream merges(read_text_file(merges_path.string()));
    std::string line;
    while (std::getline(merges, line)) {
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (line.empty() || line.rfind("#version", 0) == 0) continue;
        tok["model"]["merges"].push_back(line);
    }
    fs::path cfg = fs::path(dir) / "tokenizer_config.json";
    if (fs::exists(cfg)) {
        json c = json::parse(read_text_file(cfg.string()), nullptr, false);
        if (c.is_object() && c.contains("added_tokens_decoder")) {
            for (auto it = c["added_tokens_decoder"].begin(); it != c["added_tokens_decoder"].end(); ++it) {
                tok["added_tokens"].push_back({{"id", std::stoi(it.key())}, {"content", it.value().value("content", "")},
                                               {"special", it.value().value("special", false)}});
            }
        }
    }
    return from_json_text(tok.dump(), dir, cfg.string());
}

void Tokenizer::finish_load() {
    int max_id = -1;
    for (const auto & [bytes, id] : vocab_) {
        if (id < 0 || id >= (1 << 22)) QINFER_FAIL() << "tokenizer: vocab id " << id << " is out of range";
        max_id = std::max(max_id, id);
    }
    for (const auto & a : added_) {
        if (a.id < 0 || a.id >= (1 << 22)) QINFER_FAIL() << "tokenizer: added token id " << a.id << " is out of range";
        max_id = std::max(max_id, a.id);
    }
    n_tokens_ = max_id + 1;
    id_bytes_.assign(size_t(n_tokens_), std::string());
    special_.assign(size_t(n_tokens_), 0);
    for (const auto & [bytes, id] : vocab_) id_bytes_[size_t(id)] = bytes;
    for (int b = 0; b < 256; b++) {
        auto it = vocab_.find(std::string(1, char(b)));
        if (it == vocab_.end()) QINFER_FAIL() << "tokenizer: byte " << b << " has no token (byte-level vocab incomplete)";
        byte_id_[b] = it->second;
    }
    added_by_first_byte_.assign(256, {});
    for (const auto & a : added_) {
        if (a.id < 0 || a.content.empty()) QINFER_FAIL() << "tokenizer: added token with bad id or empty content";
        id_bytes_[size_t(a.id)] = a.content;
        special_[size_t(a.id)] = a.special;
        added_by_first_byte_[static_cast<unsigned char>(a.content[0])].push_back(&a);
    }
    for (auto & v : added_by_first_byte_) {
        std::sort(v.begin(), v.end(), [](auto x, auto y) { return x->content.size() > y->content.size(); });
    }
    regex_ = std::make_unique<Regex>();
    int err = 0;
    PCRE2_SIZE off = 0;
    regex_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern_.c_str()), pattern_.size(), PCRE2_UTF | PCRE2_UCP, &err, &off, nullptr);
    if (!regex_->code) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        QINFER_FAIL() << "tokenizer: split pattern does not compile at " << off << ": " << reinterpret_cast<char *>(msg);
    }
    pcre2_jit_compile(regex_->code, PCRE2_JIT_COMPLETE);
}

bool Tokenizer::is_special(int id) const { return id >= 0 && id < n_tokens_ && special_[size_t(id)]; }

int Tokenizer::token_id(const std::string & content) const {
    for (const auto & a : added_) {
        if (a.content == content) return a.id;
    }
    auto it = vocab_.find(content);
    return it == vocab_.end() ? -1 : it->second;
}

const std::string & Tokenizer::token_bytes(int id) const {
    if (id < 0 || id >= n_tokens_) QINFER_FAIL() << "token id " << id << " is outside the tokenizer's vocabulary [0, " << n_tokens_ << ")";
    return id_bytes_[size_t(id)];
}

// BPE over one pre-tokenized piece: start from bytes, merge the adjacent pair of lowest rank (leftmost first)
// until none is in the merge table. A heap keeps long pieces (CJK runs, long digit-free words) O(n log n).
void Tokenizer::bpe(const std::string & piece, std::vector<int> & out) const {
    const int n = int(piece.size());
    if (n == 1) {
        out.push_back(byte_id_[static_cast<unsigned char>(piece[0])]);
        return;
    }
    {
        std::lock_guard<std::mutex> lock(cache_mutex_);
        auto cached = cache_.find(piece);
        if (cached != cache_.end()) {
            out.insert(out.end(), cached->second.begin(), cached->second.end());
            return;
        }
    }
    std::vector<int> id(static_cast<size_t>(n)), prev(static_cast<size_t>(n)), next(static_cast<size_t>(n));
    for (int i = 0; i < n; i++) {
        id[size_t(i)] = byte_id_[static_cast<unsigned char>(piece[size_t(i)])];
        prev[size_t(i)] = i - 1;
        next[size_t(i)] = i + 1 < n ? i + 1 : -1;
    }
    struct Cand {
        int rank, pos, left, right;
        bool operator>(const Cand & o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
    };
    std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
    auto push = [&](int pos) {
        const int nx = next[size_t(pos)];
        if (nx < 0) return;
        auto it = merges_.find(pair_key(id[size_t(pos)], id[size_t(nx)]));
        if (it != merges_.end()) heap.push({it->second.first, pos, id[size_t(pos)], id[size_t(nx)]});
    };
    for (int i = 0; i + 1 < n; i++) push(i);
    while (!heap.empty()) {
        const Cand c = heap.top();
        heap.pop();
        const int nx = next[size_t(c.pos)];
        // Stale entries: a side was merged away since this candidate was pushed.
        if (id[size_t(c.pos)] != c.left || nx < 0 || id[size_t(nx)] != c.right) continue;
        id[size_t(c.pos)] = merges_.at(pair_key(c.left, c.right)).second;
        id[size_t(nx)] = -1;
        next[size_t(c.pos)] = next[size_t(nx)];
        if (next[size_t(nx)] >= 0) prev[size_t(next[size_t(nx)])] = c.pos;
        if (prev[size_t(c.pos)] >= 0) push(prev[size_t(c.pos)]);
        push(c.pos);
    }
    std::vector<int> result;
    for (int i = 0; i >= 0; i = next[size_t(i)]) result.push_back(id[size_t(i)]);
    out.insert(out.end(), result.begin(), result.end());
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (cache_.size() < 200000) cache_.emplace(piece, std::move(result));
}

// NFC, then the split regex ("Isolated": matches and the text between them are pieces), then BPE per piece.
void Tokenizer::encode_ordinary(std::string_view text, std::vector<int> & out) const {
    if (text.empty()) return;
    // NFC with an explicit length (utf8proc_NFC would stop at a NUL character).
    utf8proc_uint8_t * nfc = nullptr;
    const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t *>(text.data()), utf8proc_ssize_t(text.size()), &nfc,
                                            utf8proc_option_t(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
    if (n < 0) QINFER_FAIL() << "tokenizer: NFC normalisation failed (" << utf8proc_errmsg(n) << ")";
    const std::string norm(reinterpret_cast<char *>(nfc), size_t(n));
    std::free(nfc);
    pcre2_match_data * md = pcre2_match_data_create_from_pattern(regex_->code, nullptr);
    size_t pos = 0;
    const auto * subject = reinterpret_cast<PCRE2_SPTR>(norm.data());
    while (pos < norm.size()) {
        int rc = pcre2_match(regex_->code, subject, norm.size(), pos, PCRE2_NO_UTF_CHECK, md, nullptr);
        if (rc < 0) {
            bpe(norm.substr(pos), out);
            break;
        }
        const PCRE2_SIZE * ov = pcre2_get_ovector_pointer(md);
        if (ov[0] > pos) bpe(norm.substr(pos, ov[0] - pos), out);
        if (ov[1] == ov[0]) {  // an empty match: step one character
            size_t step = 1;
            while (ov[1] + step < norm.size() && (static_cast<unsigned char>(norm[ov[1] + step]) & 0xc0) == 0x80) step++;
            pos = ov[1] + step;
            continue;
        }
        bpe(norm.substr(ov[0], ov[1] - ov[0]), out);
        pos = ov[1];
    }
    pcre2_match_data_free(md);
}

std::vector<int> Tokenizer::encode(std::string_view text, Invalid invalid) const {
    std::string fixed;
    if (utf8_replace_invalid(text) != text) {
        if (invalid == Invalid::Error) {
            // Name the first bad byte.
            const auto * p = reinterpret_cast<const utf8proc_uint8_t *>(text.data());
            utf8proc_ssize_t left = utf8proc_ssize_t(text.size()), at = 0;
            while (left > 0) {
                utf8proc_int32_t cp;
                utf8proc_ssize_t n = utf8proc_iterate(p + at, left, &cp);
                if (n <= 0) break;
                at += n;
                left -= n;
            }
            QINFER_FAIL() << "input is not valid UTF-8 (first bad byte at offset " << at << ")";
        }
        fixed = utf8_replace_invalid(text);
        text = fixed;
    }
    std::vector<int> out;
    size_t start = 0, i = 0;
    while (i < text.size()) {
        const AddedToken * hit = nullptr;
        for (const AddedToken * a : added_by_first_byte_[static_cast<unsigned char>(text[i])]) {
            if (text.compare(i, a->content.size(), a->content) == 0) {
                hit = a;
                break;
            }
        }
        if (!hit) {
            i++;
            continue;
        }
        encode_ordinary(text.substr(start, i - start), out);
        out.push_back(hit->id);
        i += hit->content.size();
        start = i;
    }
    encode_ordinary(text.substr(start), out);
    return out;
}

std::vector<std::string> Tokenizer::pieces(std::string_view text) const {
    std::vector<std::string> out;
    for (int id : encode(text)) {
        const bool added = std::any_of(added_.begin(), added_.end(), [&](const AddedToken & a) { return a.id == id; });
        out.push_back(added ? id_bytes_[size_t(id)] : bytes_to_spelling(id_bytes_[size_t(id)]));
    }
    return out;
}

std::string Tokenizer::decode(const std::vector<int> & ids, bool skip_special) const {
    std::string bytes;
    for (int id : ids) {
        if (skip_special && is_special(id)) continue;
        bytes += token_bytes(id);
    }
    return utf8_replace_invalid(bytes);
}

std::string Tokenizer::Stream::push(int id) {
    if (!(skip_special_ && t_.is_special(id))) pending_ += t_.token_bytes(id);
    const size_t n = utf8_complete_prefix(pending_);
    std::string out = utf8_replace_invalid(std::string_view(pending_).substr(0, n));
    pending_.erase(0, n);
    return out;
}

std::string Tokenizer::Stream::flush() {
    std::string out = utf8_replace_invalid(pending_);
    pending_.clear();
    return out;
}

size_t utf8_complete_prefix(std::string_view s) {
    // Look back at most 3 bytes for a lead byte whose sequence is not complete yet.
    const size_t n = s.size();
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        const unsigned char c = static_cast<unsigned char>(s[n - back]);
        if ((c & 0xc0) == 0x80) continue;  // continuation byte: keep looking for the lead
        size_t need = c >= 0xf0 && c <= 0xf4 ? 4 : c >= 0xe0 ? 3 : c >= 0xc2 && c < 0xe0 ? 2 : 1;
        if (c >= 0xf5 || (c >= 0x80 && c < 0xc2)) need = 1;  // invalid lead: complete as it is (replaced later)
        return need > back ? n - back : n;
    }
    return n;
}

std::string utf8_replace_invalid(std::string_view s) {
    std::string out;
    out.reserve(s.size());
    const auto * p = reinterpret_cast<const utf8proc_uint8_t *>(s.data());
    utf8proc_ssize_t left = utf8proc_ssize_t(s.size());
    while (left > 0) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t n = utf8proc_iterate(p, left, &cp);
        if (n <= 0) {
            out += "\xef\xbf\xbd";  // U+FFFD for one bad byte, as Python's errors="replace" does per maximal prefix
            // Skip the maximal subpart of an ill-formed sequence (one lead plus valid continuations).
            utf8proc_ssize_t skip = 1;
            const unsigned char c = p[0];
            const int need = c >= 0xf0 && c <= 0xf4 ? 4 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xc2 && c <= 0xdf ? 2 : 1;
            while (skip < need && skip < left && (p[skip] & 0xc0) == 0x80) skip++;
            if (need > 1 && skip > 1) {
                // A truncated but well-started sequence counts as one maximal subpart only when its prefix is valid.
                utf8proc_int32_t tmp;
                if (utf8proc_iterate(p, skip, &tmp) == UTF8PROC_ERROR_INVALIDUTF8 && skip == need) skip = 1;
            }
            p += skip;
            left -= skip;
            continue;
        }
        out.append(reinterpret_cast<const char *>(p), size_t(n));
        p += n;
        left -= n;
    }
    return out;
}

}  // namespace qinfer
