// Helpers for tests: temporary folders and raw safetensors bytes.
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>
#include <unistd.h>

namespace qinfer::test {

inline std::string temp_dir(const std::string & name) {
    auto d = std::filesystem::temp_directory_path() / ("qinfer-test-" + name + "-" + std::to_string(::getpid()));
    std::filesystem::remove_all(d);
    std::filesystem::create_directories(d);
    return d.string();
}

// A safetensors file from a header JSON and a data buffer of `data_bytes` bytes.
inline std::vector<uint8_t> make_safetensors(const std::string & header, size_t data_bytes) {
    std::vector<uint8_t> out(8 + header.size() + data_bytes, 0);
    uint64_t n = header.size();
    for (int i = 0; i < 8; i++) out[size_t(i)] = uint8_t(n >> (8 * i));
    std::copy(header.begin(), header.end(), out.begin() + 8);
    return out;
}

inline void write_file(const std::string & path, const std::vector<uint8_t> & bytes) {
    std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char *>(bytes.data()), std::streamsize(bytes.size()));
}

inline void write_text(const std::string & path, const std::string & text) { std::ofstream(path) << text; }

}  // namespace qinfer::test
