#include "io/npy.h"

#include <fstream>
#include <regex>

#include "core/check.h"

namespace qinfer {

void write_npy_f32(const std::string & path, const float * data, const std::vector<int64_t> & shape) {
    std::string dims;
    int64_t n = 1;
    for (size_t i = 0; i < shape.size(); i++) {
        dims += std::to_string(shape[i]) + (shape.size() == 1 || i + 1 < shape.size() ? "," : "");
        n *= shape[i];
    }
    std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + dims + "), }";
    while ((10 + header.size() + 1) % 64 != 0) header.push_back(' ');
    header.push_back('\n');
    std::ofstream out(path, std::ios::binary);
    if (!out) QINFER_FAIL() << path << ": cannot open for writing";
    out.write("\x93NUMPY\x01\x00", 8);
    uint16_t len = uint16_t(header.size());
    char lb[2] = {char(len & 0xff), char(len >> 8)};
    out.write(lb, 2);
    out.write(header.data(), std::streamsize(header.size()));
    out.write(reinterpret_cast<const char *>(data), std::streamsize(size_t(n) * 4));
    if (!out) QINFER_FAIL() << path << ": write failed";
}

std::vector<float> read_npy_f32(const std::string & path, std::vector<int64_t> * shape) {
    std::ifstream in(path, std::ios::binary);
    if (!in) QINFER_FAIL() << path << ": cannot open";
    char magic[10];
    in.read(magic, 10);
    if (!in || std::string(magic, 6) != "\x93NUMPY") QINFER_FAIL() << path << ": not a .npy file";
    size_t hlen = size_t(uint8_t(magic[8])) | (size_t(uint8_t(magic[9])) << 8);
    std::string header(hlen, '\0');
    in.read(header.data(), std::streamsize(hlen));
    if (header.find("'<f4'") == std::string::npos) QINFER_FAIL() << path << ": only little-endian float32 .npy is supported";
    if (header.find("'fortran_order': False") == std::string::npos) QINFER_FAIL() << path << ": Fortran order is not supported";
    std::smatch m;
    if (!std::regex_search(header, m, std::regex("'shape': \\(([0-9, ]*)\\)"))) QINFER_FAIL() << path << ": no shape in header";
    shape->clear();
    std::string dims = m[1];
    int64_t n = 1;
    const std::regex number("[0-9]+");
    for (std::sregex_iterator it(dims.begin(), dims.end(), number), end; it != end; ++it) {
        shape->push_back(std::stoll(it->str()));
        n *= shape->back();
    }
    std::vector<float> data(static_cast<size_t>(n));
    in.read(reinterpret_cast<char *>(data.data()), std::streamsize(size_t(n) * 4));
    if (!in) QINFER_FAIL() << path << ": truncated data";
    return data;
}

}  // namespace qinfer
