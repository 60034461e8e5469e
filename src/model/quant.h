// Reading a quantized linear's stored fields by each format's definition (../shared/docs/FORMATS.md sections 3-6):
// the one place that knows the bit layouts. The CPU reference dequantizes through it; the CUDA loader repacks
// through it; the writer in `qinfer synth` is checked against it (and both against scripts/quant_ref.py).
#pragma once

#include <cstdint>
#include <vector>

#include "model/weights.h"

namespace qinfer {

// Bit field `pos` of width `bits` in a little-endian stream of 32-bit words (LSB first; 3-bit fields straddle
// words). word(i) returns the i-th word of the stream.
template <class Word> uint32_t packed_field(int bits, int64_t pos, Word word) {
    const int64_t bit = int64_t(bits) * pos;
    const int64_t w = bit / 32;
    const int shift = int(bit % 32);
    uint64_t v = uint64_t(uint32_t(word(w))) >> shift;
    if (shift + bits > 32) v |= uint64_t(uint32_t(word(w + 1))) << (32 - shift);
    return uint32_t(v) & ((1u << bits) - 1u);
}

class QuantReader {
public:
    explicit QuantReader(const Linear & l);
    int64_t groups() const { return groups_; }
    // Stored integer code of weight [n, k] (n < out_features, k < in_features).
    uint32_t code(int64_t n, int64_t k) const;
    // Row n's codes, uint8 [K] in input-channel order: code(n, k) for every k, unpacked a stored word at a time.
    void codes_row(int64_t n, uint8_t * out) const;
    // GPTQ/AWQ: w = scale(g, n) * (code - zero(g, n)), g = group(k).
    int64_t group(int64_t k) const { return g_idx_ ? g_idx_[k] : k / group_size_; }
    float scale(int64_t g, int64_t n) const;
    int zero(int64_t g, int64_t n) const;  // the effective zero (v1 stores zero - 1)
    // bitsandbytes: w = table(code) * absmax(block of the flattened index n * K + k).
    float absmax(int64_t block) const;
    float table(uint32_t code) const;
    float weight(int64_t n, int64_t k) const;
    void row(int64_t n, float * out) const;  // fp32 [K]

private:
    const Linear & l_;
    int64_t K_, N_, group_size_ = 0, groups_ = 0;
    int64_t gemv_zeros_width_ = 0;  // AWQ GEMV: int32 words of zeros per row (scales: 8 times as many columns)
    const uint32_t * qweight_ = nullptr;
    const uint32_t * qzeros_ = nullptr;
    const int32_t * g_idx_ = nullptr;
    const uint8_t * codes_ = nullptr;
};

// Whether a GPTQ linear's g_idx orders its input channels by activation (desc_act): present and not just k / group
// size, which checkpoints without act-order store too.
bool has_act_order(const Linear & l);

// The dequantized weight, fp32 [N, K].
std::vector<float> dequantize(const Linear & l);

}  // namespace qinfer
