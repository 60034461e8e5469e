// The kernels' layout of a quantized weight, built on the host at load time from any stored format (GPTQ v1/v2, AWQ,
// AutoRound, bitsandbytes) through QuantReader, so every format shares one set of kernels (CUDA, and the CPU
// reference's row decoder, which reads rows instead of GPTQ's K-packed columns):
//   codes   uint32 [rows, K * bits / 32]: row n's codes along K, LSB first, K in act-order (`perm`) order
//   scales  fp16 [rows, groups] and zeros uint8 [rows, groups] (affine: w = s (q - z)); zeros dropped when constant
//   absmax  fp32 [rows_padded, K / 64] and table fp32 [16] (bitsandbytes: w = table[q] absmax)
// Several linears that read the same input (q/k/v, gate/up) are stacked along rows.
//
// 4-bit affine codes are tiled for the tensor-core GEMV (mma.m16n8k16, weights as the A operand): rows padded to 16,
// K to 64; uint4 number ((row_block * (K/64) + kb) * 32 + lane) holds, in word j, the 16x16 tile at k0 = 64 kb + 16 j
// as lane `lane` (g = lane / 4, t = lane % 4) needs it: nibbles 0/4 = row g, k0 + 2t / +1; 1/5 = row g + 8, same k;
// 2/6 = row g, k0 + 2t + 8 / +9; 3/7 = row g + 8, same k. Nibble pairs (i, i + 4) become one bf16x2 register.
// 8-bit affine codes are tiled as two such 4-bit planes per 16x64 block (groups of whole 32-position multiples, or
// one group): uint4 number (((row_block * (K/64) + kb) * 2 + plane) * 32 + lane), plane 0 the low nibbles, plane 1
// the high ones, so a block's 1024 bytes are contiguous and q = lo + 16 hi. Lookup codes (bitsandbytes) use the
// 4-bit tiles with each register's pair in one byte instead (byte r of word j = A register r: row g + 8 (r & 1),
// k0 + 2t + 8 (r >> 1), low nibble first), so one byte indexes a table of bf16x2 pairs.
#pragma once

#include <cstdint>
#include <vector>

#include "model/weights.h"

namespace qinfer {

struct RepackedQuant {
    int rows = 0, k = 0, bits = 4, group = 0, groups = 0;
    bool lut = false;
    bool tiled = false;             // the mma tile layout above (4-bit, 8-bit affine as two 4-bit planes)
    int rows_padded = 0, k_padded = 0;  // tiled: multiples of 16 and 64; else rows and k
    std::vector<uint32_t> codes;   // [rows, k * bits / 32], or tiled [rows_padded / 16, k_padded / 64, bits / 4 planes, 32 lanes, 4 words]
    std::vector<uint16_t> scales;  // fp16 bits [rows_padded, groups]
    std::vector<uint8_t> zeros;    // [rows_padded, groups], empty when every zero equals const_zero
    int const_zero = 0;
    std::vector<float> absmax;     // [rows_padded, k / 64]
    std::vector<float> table;      // [16]
    std::vector<int32_t> perm;     // [k]: position i holds input channel perm[i]; empty: identity

    int words_per_row() const { return k * bits / 32; }
    // Stores row `row`'s codes, uint8 [k] in position order (perm applied), into `codes` (its fields zero before; rows
    // g and g + 8 of a tiled block share words, so they are not stored at once).
    void put_row(int64_t row, const uint8_t * q);
    // Where code (row, pos) lives (tiled 8-bit: its low (plane 0) or high (plane 1) nibble).
    size_t word_index(int64_t row, int64_t pos, int * shift, int plane = 0) const;
    // Reads back what the kernels will see (round-trip tests).
    uint32_t code(int64_t row, int64_t pos) const;
    float weight(int64_t row, int64_t channel) const;  // the dequantized value of input channel `channel`
    // Row `row` dequantized, fp32 [k] in input-channel order: the same values as QuantReader::row (untiled layout).
    void row(int64_t row, float * out) const;
};

// Why this linear cannot use the repacked layout and its kernels (empty: it can): bit widths 4 and 8 with groups of whole 16-byte
// chunks, bitsandbytes with K a multiple of 64, act-order whose groups are contiguous after sorting.
std::string cuda_quant_unsupported(const Linear & l);

// Whether repack_quant(tile = true) builds the tile layout for this scheme at K = in_features: 4-bit codes (affine or
// lookup), and 8-bit affine codes whose groups start where a 16x16 tile pair does (one group, or multiples of 32).
bool quant_tiles(const QuantScheme & s, int in_features);

// Whether repack_quant can stack these parts: the same method, bits, group and K, the same act-order.
bool quant_stackable(const std::vector<const Linear *> & parts);

// Repacks the parts (same scheme, same K, same act-order) stacked along rows. Throws naming the tensor when the
// layout cannot be built.
// tile: use the tensor-core layout when the format allows (4-bit, 8-bit affine); gate/up stacks need every part's rows to
// be a multiple of 16 for it, so the caller passes false otherwise.
RepackedQuant repack_quant(const std::vector<const Linear *> & parts, bool tile = true);

}  // namespace qinfer
