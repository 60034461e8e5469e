// The CUDA kernels' layout of a quantized weight, built on the host at load time from any stored format
// (GPTQ v1/v2, AWQ, AutoRound, bitsandbytes) through QuantReader, so every format shares one set of kernels:
//   codes   uint32 [rows, K * bits / 32]: row n's codes along K, LSB first, K in act-order (`perm`) order
//   scales  fp16 [rows, groups] and zeros uint8 [rows, groups] (affine: w = s (q - z)); zeros dropped when constant
//   absmax  fp32 [rows, K / 64] and table fp32 [16] (bitsandbytes: w = table[q] absmax)
// Several linears that read the same input (q/k/v, gate/up) are stacked along rows.
#pragma once

#include <cstdint>
#include <vector>

#include "model/weights.h"

namespace qinfer {

struct RepackedQuant {
    int rows = 0, k = 0, bits = 4, group = 0, groups = 0;
    bool lut = false;
    std::vector<uint32_t> codes;   // [rows, k * bits / 32]
    std::vector<uint16_t> scales;  // fp16 bits [rows, groups]
    std::vector<uint8_t> zeros;    // [rows, groups], empty when every zero equals const_zero
    int const_zero = 0;
    std::vector<float> absmax;     // [rows, k / 64]
    std::vector<float> table;      // [16]
    std::vector<int32_t> perm;     // [k]: position i holds input channel perm[i]; empty: identity

    int words_per_row() const { return k * bits / 32; }
    // Reads back what the kernels will see (round-trip tests).
    uint32_t code(int64_t row, int64_t pos) const;
    float weight(int64_t row, int64_t channel) const;  // the dequantized value of input channel `channel`
};

// Why this linear cannot use the CUDA kernels (empty: it can): bit widths 4 and 8 with groups of whole 16-byte
// chunks, bitsandbytes with K a multiple of 64, act-order whose groups are contiguous after sorting.
std::string cuda_quant_unsupported(const Linear & l);

// Repacks the parts (same scheme, same K, same act-order) stacked along rows. Throws naming the tensor when the
// layout cannot be built.
RepackedQuant repack_for_cuda(const std::vector<const Linear *> & parts);

}  // namespace qinfer
