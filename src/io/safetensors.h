// safetensors reading (mmap, zero-copy but for tensors stored misaligned, which are copied) and writing.
// Layout: u64 little-endian header length N | N bytes of JSON | byte buffer. Offsets are relative to the buffer.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace qinfer {

struct TensorInfo {
    std::string name;
    DType dtype = DType::F32;
    std::vector<int64_t> shape;
    uint64_t begin = 0;  // offset into the byte buffer
    uint64_t end = 0;    // exclusive
    int64_t numel() const;
};

struct SafetensorsHeader {
    std::vector<TensorInfo> tensors;  // in header order
    std::map<std::string, std::string> metadata;
    uint64_t data_start = 0;  // 8 + N: file offset of the byte buffer
};

// Parses and validates a header against the whole file's bytes [data, data + size): header length, JSON,
// dtypes, shapes, offsets inside the file, sizes equal to numel * dtype size, no overlaps, no duplicate names.
// `what` names the file in error messages. Throws qinfer::Error.
SafetensorsHeader parse_safetensors(const uint8_t * data, size_t size, const std::string & what);

// A read-only memory mapping of a whole file.
class MappedFile {
public:
    explicit MappedFile(const std::string & path);
    ~MappedFile();
    MappedFile(const MappedFile &) = delete;
    MappedFile & operator=(const MappedFile &) = delete;
    const uint8_t * data() const { return data_; }
    size_t size() const { return size_; }
    const std::string & path() const { return path_; }

private:
    std::string path_;
    const uint8_t * data_ = nullptr;
    size_t size_ = 0;
};

// A view of one tensor's bytes inside a mapped file.
struct TensorView {
    const TensorInfo * info = nullptr;
    const void * data = nullptr;
    const std::string & name() const { return info->name; }
    DType dtype() const { return info->dtype; }
    const std::vector<int64_t> & shape() const { return info->shape; }
    int64_t numel() const { return info->numel(); }
    size_t nbytes() const { return size_t(info->end - info->begin); }
};

// Every tensor of a checkpoint folder: model.safetensors.index.json with its shards, or a single
// model.safetensors (or the one *.safetensors file a folder holds, as AutoGPTQ's model_file_base_name allows).
class Checkpoint {
public:
    explicit Checkpoint(const std::string & dir);
    bool has(const std::string & name) const { return index_.count(name) != 0; }
    TensorView get(const std::string & name) const;  // throws naming the tensor when absent
    std::vector<std::string> names() const;          // sorted
    const std::vector<std::string> & files() const { return file_names_; }
    uint64_t total_bytes() const;

private:
    struct File {
        std::unique_ptr<MappedFile> map;
        SafetensorsHeader header;
        // Tensor index -> a copy of a tensor stored at a file offset its element size does not divide (in 8-byte
        // words: aligned for every dtype), so that typed reads of it are aligned. safetensors' own writer orders
        // tensors from the widest element type down and never does that; other writers (qinfer synth's among them,
        // after bitsandbytes' odd-length quant_state bytes) may.
        std::map<size_t, std::vector<uint64_t>> aligned;
    };
    void open_file(const std::string & path);
    std::string dir_;
    std::vector<std::string> file_names_;
    std::vector<File> files_;
    std::map<std::string, std::pair<size_t, size_t>> index_;  // name -> (file, tensor)
};

// Writes one safetensors file: header padded with spaces to a multiple of 8, tensors in the order added.
// Tensors are declared first and their bytes produced one at a time while writing, so a 15 GB checkpoint
// never sits in memory.
class SafetensorsWriter {
public:
    using Fill = std::function<void(size_t index, uint8_t * out, size_t nbytes)>;
    void add(const std::string & name, DType dtype, std::vector<int64_t> shape);
    size_t bytes() const { return total_; }
    size_t count() const { return tensors_.size(); }
    const std::string & name(size_t i) const { return tensors_[i].name; }
    std::vector<std::string> names() const;
    void write(const std::string & path, const std::map<std::string, std::string> & metadata, const Fill & fill) const;

private:
    struct Entry {
        std::string name;
        DType dtype;
        std::vector<int64_t> shape;
        size_t nbytes;
    };
    std::vector<Entry> tensors_;
    size_t total_ = 0;
};

std::string shape_str(const std::vector<int64_t> & shape);  // "[896, 4864]"

}  // namespace qinfer
