// Byte-level BPE tokenizer of Qwen2/Qwen2.5/Qwen3 (the GPT-2 scheme), equal to Hugging Face's tokenizers:
// added tokens matched whole first, NFC normalisation (utf8proc), the split regex (PCRE2, Unicode properties),
// byte-level mapping, BPE merges by rank.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace qinfer {

struct AddedToken {
    int id = 0;
    std::string content;
    bool special = false;  // dropped by decode(skip_special = true)
};

class Tokenizer {
public:
    // A checkpoint folder: tokenizer.json, or vocab.json + merges.txt; tokenizer_config.json when present.
    static std::unique_ptr<Tokenizer> load_dir(const std::string & dir);
    // One tokenizer.json file (with tokenizer_config.json beside it when present).
    static std::unique_ptr<Tokenizer> load_file(const std::string & tokenizer_json);
    // tokenizer.json text already in memory (`what` names it in errors); no tokenizer_config.json, no cache.
    static std::unique_ptr<Tokenizer> parse(const std::string & json_text, const std::string & what);
    ~Tokenizer();

    enum class Invalid { Error, Replace };  // invalid UTF-8 input: throw, or read it as U+FFFD
    std::vector<int> encode(std::string_view text, Invalid invalid = Invalid::Error) const;
    // The byte-level pieces (GPT-2 unicode spelling) of each token, as `--pieces` prints them.
    std::vector<std::string> pieces(std::string_view text) const;
    // Ids to text; bytes that are not valid UTF-8 become U+FFFD (transformers' errors="replace").
    std::string decode(const std::vector<int> & ids, bool skip_special = false) const;
    // Size of the vocabulary including added tokens (ids >= this are embedding padding).
    int size() const { return n_tokens_; }
    bool is_special(int id) const;
    int token_id(const std::string & content) const;  // -1 when absent
    const std::vector<AddedToken> & added_tokens() const { return added_; }
    const std::string & chat_template() const { return chat_template_; }
    const std::string & eos_token() const { return eos_token_; }
    // Bytes of one token (raw, not the byte-level spelling).
    const std::string & token_bytes(int id) const;

    // Decoding one token at a time without ever splitting a UTF-8 character.
    class Stream {
    public:
        explicit Stream(const Tokenizer & t, bool skip_special = true) : t_(t), skip_special_(skip_special) {}
        std::string push(int id);  // the text that is complete so far
        std::string flush();       // whatever is left (incomplete bytes as U+FFFD)

    private:
        const Tokenizer & t_;
        bool skip_special_;
        std::string pending_;
    };

private:
    Tokenizer();
    static std::unique_ptr<Tokenizer> from_json_text(const std::string & text, const std::string & what, const std::string & config_path);
    // A binary copy of the parsed tokenizer under ~/.cache/qinfer/tokenizers (or $QINFER_CACHE), keyed by the files'
    // paths, sizes and times: parsing 7-11 MB of JSON is most of a cold load.
    static std::unique_ptr<Tokenizer> load_cache(const std::string & path);
    void save_cache(const std::string & path) const;
    void finish_load();
    void encode_ordinary(std::string_view text, std::vector<int> & out) const;  // no added tokens inside
    void bpe(const std::string & piece, std::vector<int> & out) const;

    std::unordered_map<std::string, int> vocab_;  // raw bytes -> id
    std::vector<std::string> id_bytes_;           // id -> raw bytes
    std::unordered_map<uint64_t, std::pair<int, int>> merges_;  // (left id, right id) -> (rank, merged id)
    int byte_id_[256] = {};
    std::vector<AddedToken> added_;
    std::vector<char> special_;  // by id
    std::vector<std::vector<const AddedToken *>> added_by_first_byte_;
    int n_tokens_ = 0;
    std::string pattern_;
    std::string chat_template_;
    std::string eos_token_;
    struct Regex;
    std::unique_ptr<Regex> regex_;
    mutable std::mutex cache_mutex_;  // encode may run on several threads
    mutable std::unordered_map<std::string, std::vector<int>> cache_;
};

// Text of ids that is valid UTF-8: invalid sequences replaced by U+FFFD.
std::string utf8_replace_invalid(std::string_view bytes);
// Length of the longest prefix of `bytes` that ends on a character boundary (incomplete tail excluded).
size_t utf8_complete_prefix(std::string_view bytes);

}  // namespace qinfer
