#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "core/check.h"

namespace qinfer {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {
constexpr uint64_t k_max_header = 100u * 1000 * 1000;  // the reference reader's limit
}

int64_t TensorInfo::numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
}

std::string shape_str(const std::vector<int64_t> & shape) {
    std::string s = "[";
    for (size_t i = 0; i < shape.size(); i++) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
}

SafetensorsHeader parse_safetensors(const uint8_t * data, size_t size, const std::string & what) {
    if (size < 8) QINFER_FAIL() << what << ": file is " << size << " bytes, too short for a safetensors header";
    uint64_t n = 0;
    for (int i = 0; i < 8; i++) n |= uint64_t(data[i]) << (8 * i);
    if (n > k_max_header) QINFER_FAIL() << what << ": header length " << n << " exceeds the 100 MB limit";
    if (n > size - 8) {
        QINFER_FAIL() << what << ": header length " << n << " runs past the end of the file (" << size
                      << " bytes); the file is truncated or not safetensors";
    }
    SafetensorsHeader h;
    h.data_start = 8 + n;
    const uint64_t buffer_size = size - h.data_start;

    // Duplicate keys at the top level are an error; nlohmann would silently keep the last one.
    std::set<std::string> seen;
    bool duplicate = false;
    std::string duplicate_name;
    json::parser_callback_t cb = [&](int depth, json::parse_event_t event, json & parsed) {
        if (depth == 1 && event == json::parse_event_t::key) {
            std::string k = parsed.get<std::string>();
            if (!seen.insert(k).second && !duplicate) {
                duplicate = true;
                duplicate_name = k;
            }
        }
        return true;
    };
    json j = json::parse(data + 8, data + 8 + n, cb, /*allow_exceptions=*/false);
    if (j.is_discarded()) QINFER_FAIL() << what << ": header is not valid JSON";
    if (!j.is_object()) QINFER_FAIL() << what << ": header is not a JSON object";
    if (duplicate) QINFER_FAIL() << what << ": tensor '" << duplicate_name << "' appears twice in the header";

    for (auto it = j.begin(); it != j.end(); ++it) {
        const std::string & name = it.key();
        const json & v = it.value();
        if (name == "__metadata__") {
            if (!v.is_object()) QINFER_FAIL() << what << ": __metadata__ is not an object";
            for (auto m = v.begin(); m != v.end(); ++m) {
                if (!m.value().is_string()) QINFER_FAIL() << what << ": __metadata__['" << m.key() << "'] is not a string";
                h.metadata[m.key()] = m.value().get<std::string>();
            }
            continue;
        }
        if (!v.is_object()) QINFER_FAIL() << what << ": entry '" << name << "' is not an object";
        TensorInfo t;
        t.name = name;
        auto dt = v.find("dtype");
        if (dt == v.end() || !dt->is_string()) QINFER_FAIL() << what << ": tensor '" << name << "' has no dtype";
        if (!dtype_from_name(dt->get<std::string>(), &t.dtype)) {
            QINFER_FAIL() << what << ": tensor '" << name << "' has unknown dtype '" << dt->get<std::string>() << "'";
        }
        auto sh = v.find("shape");
        if (sh == v.end() || !sh->is_array()) QINFER_FAIL() << what << ": tensor '" << name << "' has no shape";
        uint64_t numel = 1;
        bool overflow = false;
        for (const auto & d : *sh) {
            if (!d.is_number_unsigned()) {
                QINFER_FAIL() << what << ": tensor '" << name << "' has a shape entry that is not a non-negative integer";
            }
            uint64_t dim = d.get<uint64_t>();
            if (dim > (uint64_t(1) << 48)) overflow = true;
            if (dim != 0 && numel > (uint64_t(1) << 62) / dim) overflow = true;
            if (!overflow) numel *= dim;
            t.shape.push_back(int64_t(dim));
        }
        if (overflow) QINFER_FAIL() << what << ": tensor '" << name << "' has a shape too large to address";
        auto off = v.find("data_offsets");
        if (off == v.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
            !(*off)[1].is_number_unsigned()) {
            QINFER_FAIL() << what << ": tensor '" << name << "' needs data_offsets [begin, end]";
        }
        t.begin = (*off)[0].get<uint64_t>();
        t.end = (*off)[1].get<uint64_t>();
        if (t.begin > t.end) QINFER_FAIL() << what << ": tensor '" << name << "' has begin > end in data_offsets";
        if (t.end > buffer_size) {
            QINFER_FAIL() << what << ": tensor '" << name << "' ends at byte " << t.end << " of a " << buffer_size
                          << "-byte data buffer (truncated file or bad offsets)";
        }
        uint64_t expect = numel * dtype_size(t.dtype);
        if (t.end - t.begin != expect) {
            QINFER_FAIL() << what << ": tensor '" << name << "' " << dtype_name(t.dtype) << shape_str(t.shape)
                          << " needs " << expect << " bytes but data_offsets give " << (t.end - t.begin);
        }
        h.tensors.push_back(std::move(t));
    }
    std::vector<const TensorInfo *> by_offset;
    for (const auto & t : h.tensors) by_offset.push_back(&t);
    std::sort(by_offset.begin(), by_offset.end(), [](auto a, auto b) { return a->begin < b->begin; });
    for (size_t i = 1; i < by_offset.size(); i++) {
        if (by_offset[i]->begin < by_offset[i - 1]->end) {
            QINFER_FAIL() << what << ": tensors '" << by_offset[i - 1]->name << "' and '" << by_offset[i]->name
                          << "' overlap in the data buffer";
        }
    }
    return h;
}

MappedFile::MappedFile(const std::string & path) : path_(path) {
    int fd = ::open(path.c_str(), O_RDONLY);
    if (fd < 0) QINFER_FAIL() << path << ": cannot open (" << std::strerror(errno) << ")";
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ::close(fd);
        QINFER_FAIL() << path << ": not a regular file";
    }
    size_ = size_t(st.st_size);
    if (size_ > 0) {
        void * p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            ::close(fd);
            QINFER_FAIL() << path << ": mmap failed (" << std::strerror(errno) << ")";
        }
        data_ = static_cast<const uint8_t *>(p);
    }
    ::close(fd);
}

MappedFile::~MappedFile() {
    if (data_) ::munmap(const_cast<uint8_t *>(data_), size_);
}

Checkpoint::Checkpoint(const std::string & dir) : dir_(dir) {
    if (!fs::is_directory(dir)) QINFER_FAIL() << dir << ": not a directory";
    fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
    if (fs::exists(index_path)) {
        std::ifstream in(index_path);
        json j = json::parse(in, nullptr, false);
        if (j.is_discarded() || !j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
            QINFER_FAIL() << index_path.string() << ": not a valid index (needs an object 'weight_map')";
        }
        std::map<std::string, std::string> weight_map;
        std::set<std::string> shards;
        for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
            if (!it.value().is_string()) QINFER_FAIL() << index_path.string() << ": weight_map['" << it.key() << "'] is not a file name";
            std::string f = it.value().get<std::string>();
            if (f.find('/') != std::string::npos || f == ".." ) QINFER_FAIL() << index_path.string() << ": shard name '" << f << "' is not a plain file name";
            weight_map[it.key()] = f;
            shards.insert(f);
        }
        for (const auto & s : shards) {
            fs::path p = fs::path(dir) / s;
            if (!fs::exists(p)) QINFER_FAIL() << dir << ": missing shard " << s << " (listed in model.safetensors.index.json)";
            open_file(p.string());
        }
        for (const auto & [name, file] : weight_map) {
            auto it = index_.find(name);
            if (it == index_.end() || file_names_[it->second.first] != file) {
                QINFER_FAIL() << dir << ": tensor '" << name << "' is listed in the index under " << file << " but is not in that shard";
            }
        }
        if (index_.size() != weight_map.size()) {
            for (const auto & [name, loc] : index_) {
                if (!weight_map.count(name)) QINFER_FAIL() << dir << ": tensor '" << name << "' in shard " << file_names_[loc.first] << " is not listed in the index";
            }
        }
        return;
    }
    fs::path single = fs::path(dir) / "model.safetensors";
    if (fs::exists(single)) {
        open_file(single.string());
        return;
    }
    std::vector<std::string> found;
    for (const auto & e : fs::directory_iterator(dir)) {
        if (e.path().extension() == ".safetensors") found.push_back(e.path().string());
    }
    if (found.size() == 1) {
        open_file(found[0]);
        return;
    }
    if (found.empty()) QINFER_FAIL() << dir << ": no model.safetensors or model.safetensors.index.json (--load-format dummy runs a config.json alone on random weights)";
    QINFER_FAIL() << dir << ": several .safetensors files but no model.safetensors.index.json to say which tensors are where";
}

void Checkpoint::open_file(const std::string & path) {
    File f;
    f.map = std::make_unique<MappedFile>(path);
    f.header = parse_safetensors(f.map->data(), f.map->size(), path);
    for (size_t ti = 0; ti < f.header.tensors.size(); ti++) {  // the mapping is page-aligned: the file offset decides
        const TensorInfo & t = f.header.tensors[ti];
        if ((f.header.data_start + t.begin) % dtype_size(t.dtype) == 0) continue;
        std::vector<uint64_t> & copy = f.aligned[ti];
        copy.resize(size_t(t.end - t.begin + 7) / 8);
        std::memcpy(copy.data(), f.map->data() + f.header.data_start + t.begin, size_t(t.end - t.begin));
    }
    size_t fi = files_.size();
    std::string base = fs::path(path).filename().string();
    for (size_t ti = 0; ti < f.header.tensors.size(); ti++) {
        const std::string & name = f.header.tensors[ti].name;
        if (index_.count(name)) QINFER_FAIL() << dir_ << ": tensor '" << name << "' is stored in two files";
        index_[name] = {fi, ti};
    }
    files_.push_back(std::move(f));
    file_names_.push_back(base);
}

TensorView Checkpoint::get(const std::string & name) const {
    auto it = index_.find(name);
    if (it == index_.end()) QINFER_FAIL() << dir_ << ": missing tensor '" << name << "'";
    const File & f = files_[it->second.first];
    const TensorInfo & t = f.header.tensors[it->second.second];
    const auto copy = f.aligned.find(it->second.second);
    if (copy != f.aligned.end()) return TensorView{&t, copy->second.data()};
    return TensorView{&t, f.map->data() + f.header.data_start + t.begin};
}

std::vector<std::string> Checkpoint::names() const {
    std::vector<std::string> out;
    for (const auto & kv : index_) out.push_back(kv.first);
    return out;
}

uint64_t Checkpoint::total_bytes() const {
    uint64_t total = 0;
    for (const auto & f : files_) {
        for (const auto & t : f.header.tensors) total += t.end - t.begin;
    }
    return total;
}

void SafetensorsWriter::add(const std::string & name, DType dtype, std::vector<int64_t> shape) {
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    size_t nbytes = size_t(numel) * dtype_size(dtype);
    total_ += nbytes;
    tensors_.push_back({name, dtype, std::move(shape), nbytes});
}

std::vector<std::string> SafetensorsWriter::names() const {
    std::vector<std::string> out;
    for (const auto & t : tensors_) out.push_back(t.name);
    return out;
}

void SafetensorsWriter::write(const std::string & path, const std::map<std::string, std::string> & metadata,
                              const Fill & fill) const {
    json header = json::object();
    if (!metadata.empty()) header["__metadata__"] = metadata;
    uint64_t offset = 0;
    for (const auto & t : tensors_) {
        header[t.name] = {{"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.nbytes}}};
        offset += t.nbytes;
    }
    std::string text = header.dump();
    while ((text.size() + 8) % 8 != 0) text.push_back(' ');
    std::ofstream out(path, std::ios::binary);
    if (!out) QINFER_FAIL() << path << ": cannot open for writing";
    uint64_t n = text.size();
    uint8_t len[8];
    for (int i = 0; i < 8; i++) len[i] = uint8_t(n >> (8 * i));
    out.write(reinterpret_cast<const char *>(len), 8);
    out.write(text.data(), std::streamsize(text.size()));
    std::vector<uint8_t> buf;
    for (size_t i = 0; i < tensors_.size(); i++) {
        buf.assign(tensors_[i].nbytes, 0);
        fill(i, buf.data(), buf.size());
        out.write(reinterpret_cast<const char *>(buf.data()), std::streamsize(buf.size()));
    }
    if (!out) QINFER_FAIL() << path << ": write failed (disk full?)";
}

}  // namespace qinfer
