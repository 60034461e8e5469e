// NumPy .npy files (version 1.0, little-endian fp32, C order).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace qinfer {

void write_npy_f32(const std::string & path, const float * data, const std::vector<int64_t> & shape);
// Reads an fp32 .npy; throws on other dtypes or malformed headers.
std::vector<float> read_npy_f32(const std::string & path, std::vector<int64_t> * shape);

}  // namespace qinfer
