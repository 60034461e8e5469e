#include "model/quant.h"

#include "backends/cpu/ops.h"
#include "core/check.h"
#include "core/parallel.h"

namespace qinfer {

namespace {
// AWQ GEMM: nibble i of a word holds column 8c + ORDER[i], ORDER = 0,2,4,6,1,3,5,7; column 8c + j is nibble REV[j].
constexpr int k_awq_rev[8] = {0, 4, 1, 5, 2, 6, 3, 7};
}  // namespace

QuantReader::QuantReader(const Linear & l) : l_(l), K_(l.in_features), N_(l.out_features) {
    QINFER_CHECK(l.quantized()) << l.weight.name;
    if (l.scheme.method == QuantMethod::Bnb4) {
        codes_ = static_cast<const uint8_t *>(l.weight.data);
        return;
    }
    group_size_ = l.scheme.group(int(K_));
    groups_ = (K_ + group_size_ - 1) / group_size_;
    // With g_idx the groups are the scales' rows, which a tensor-parallel rank's slice of K keeps whole (its channels'
    // groups are the checkpoint's).
    if (l.g_idx.present() && l.scales.present() && l.scheme.packing != QuantPacking::AwqGemv) groups_ = l.scales.numel() / N_;
    qweight_ = static_cast<const uint32_t *>(l.qweight.data);
    qzeros_ = static_cast<const uint32_t *>(l.qzeros.data);
    if (l.g_idx.present()) g_idx_ = static_cast<const int32_t *>(l.g_idx.data);
    if (l.scheme.packing == QuantPacking::AwqGemv) gemv_zeros_width_ = awq_gemv_zeros_width(K_, int(group_size_));
}

uint32_t QuantReader::code(int64_t n, int64_t k) const {
    switch (l_.scheme.packing) {
    case QuantPacking::GptqV1:
    case QuantPacking::GptqV2:
        // qweight [K bits / 32, N]: column n's codes run down the rows.
        return packed_field(l_.scheme.bits, k, [&](int64_t r) { return qweight_[r * N_ + n]; });
    case QuantPacking::AwqGemm: return (qweight_[k * (N_ / 8) + n / 8] >> (4 * k_awq_rev[n % 8])) & 0xFu;
    case QuantPacking::AwqGemv: return (qweight_[n * (K_ / 8) + k / 8] >> (4 * (k % 8))) & 0xFu;
    case QuantPacking::Nf4:
    case QuantPacking::Fp4: {
        const int64_t i = n * K_ + k;
        const uint8_t b = codes_[i / 2];
        return i % 2 == 0 ? b >> 4 : b & 0xFu;  // element 2j in the high nibble
    }
    }
    return 0;
}

void QuantReader::codes_row(int64_t n, uint8_t * out) const {
    switch (l_.scheme.packing) {
    case QuantPacking::GptqV1:
    case QuantPacking::GptqV2: {
        const int bits = l_.scheme.bits;
        if (32 % bits != 0) break;  // 3-bit fields straddle words: code() below
        // qweight [K bits / 32, N]: column n, one word of 32 / bits codes per row of qweight.
        const int per_word = 32 / bits;
        const uint32_t mask = (1u << bits) - 1u;
        for (int64_t k0 = 0; k0 < K_; k0 += per_word) {
            uint32_t w = qweight_[(k0 / per_word) * N_ + n];
            for (int i = 0; i < per_word && k0 + i < K_; i++, w >>= bits) out[k0 + i] = uint8_t(w & mask);
        }
        return;
    }
    case QuantPacking::AwqGemm: {
        const uint32_t * col = qweight_ + n / 8;
        const int shift = 4 * k_awq_rev[n % 8];
        for (int64_t k = 0; k < K_; k++) out[k] = uint8_t((col[k * (N_ / 8)] >> shift) & 0xFu);
        return;
    }
    case QuantPacking::AwqGemv: {
        const uint32_t * words = qweight_ + n * (K_ / 8);
        for (int64_t k = 0; k < K_; k++) out[k] = uint8_t((words[k / 8] >> (4 * (k % 8))) & 0xFu);
        return;
    }
    case QuantPacking::Nf4:
    case QuantPacking::Fp4:
        if (K_ % 2 == 0) {  // row n starts on a byte: element 2j in the high nibble
            const uint8_t * b = codes_ + n * K_ / 2;
            for (int64_t j = 0; j < K_ / 2; j++) {
                out[2 * j] = uint8_t(b[j] >> 4);
                out[2 * j + 1] = uint8_t(b[j] & 0xFu);
            }
            return;
        }
        break;
    }
    for (int64_t k = 0; k < K_; k++) out[k] = uint8_t(code(n, k));
}

float QuantReader::scale(int64_t g, int64_t n) const {
    if (l_.scheme.packing == QuantPacking::AwqGemv) return cpu::weight_at(l_.scales, n * 8 * gemv_zeros_width_ + g);
    return cpu::weight_at(l_.scales, g * N_ + n);
}

int QuantReader::zero(int64_t g, int64_t n) const {
    const int bits = l_.scheme.bits;
    switch (l_.scheme.packing) {
    case QuantPacking::GptqV1:
    case QuantPacking::GptqV2: {
        const int64_t words_per_row = N_ * bits / 32;
        const uint32_t z = packed_field(bits, n, [&](int64_t c) { return qzeros_[g * words_per_row + c]; });
        return int(z) + (l_.scheme.packing == QuantPacking::GptqV1 ? 1 : 0);
    }
    case QuantPacking::AwqGemm: return int((qzeros_[g * (N_ / 8) + n / 8] >> (4 * k_awq_rev[n % 8])) & 0xFu);
    case QuantPacking::AwqGemv: return int((qzeros_[n * gemv_zeros_width_ + g / 8] >> (4 * (g % 8))) & 0xFu);
    default: QINFER_FAIL() << l_.weight.name << ": no zero points in this format";
    }
}

float QuantReader::absmax(int64_t block) const {
    if (!l_.scheme.double_quant) return static_cast<const float *>(l_.absmax.data)[block];
    const uint8_t q = static_cast<const uint8_t *>(l_.absmax.data)[block];
    const float * nested_map = static_cast<const float *>(l_.nested_quant_map.data);
    const float * nested_absmax = static_cast<const float *>(l_.nested_absmax.data);
    return nested_map[q] * nested_absmax[block / 256] + l_.nested_offset;
}

float QuantReader::table(uint32_t code) const { return static_cast<const float *>(l_.quant_map.data)[code]; }

float QuantReader::weight(int64_t n, int64_t k) const {
    if (l_.scheme.method == QuantMethod::Bnb4) return table(code(n, k)) * absmax((n * K_ + k) / l_.scheme.block_size);
    const int64_t g = group(k);
    return scale(g, n) * float(int(code(n, k)) - zero(g, n));
}

void QuantReader::row(int64_t n, float * out) const {
    // The same formulas as weight(), with the row's codes unpacked once (codes_row) and its scales and zeros read once.
    std::vector<uint8_t> q(static_cast<size_t>(K_));
    codes_row(n, q.data());
    if (l_.scheme.method == QuantMethod::Bnb4) {
        for (int64_t k = 0; k < K_; k++) out[k] = table(q[size_t(k)]) * absmax((n * K_ + k) / l_.scheme.block_size);
        return;
    }
    std::vector<float> s(static_cast<size_t>(groups_));
    std::vector<int> z(static_cast<size_t>(groups_));
    for (int64_t g = 0; g < groups_; g++) {
        s[size_t(g)] = scale(g, n);
        z[size_t(g)] = zero(g, n);
    }
    for (int64_t k = 0; k < K_; k++) {
        const size_t g = size_t(group(k));
        out[k] = s[g] * float(int(q[size_t(k)]) - z[g]);
    }
}

std::vector<float> dequantize(const Linear & l) {
    QuantReader r(l);
    std::vector<float> w(size_t(l.out_features) * l.in_features);
    parallel_for(l.out_features, [&](int64_t n) { r.row(n, w.data() + n * l.in_features); });
    return w;
}

bool has_act_order(const Linear & l) {
    if (!l.g_idx.present()) return false;
    const int K = l.in_features, G = l.scheme.group(K);
    const int32_t * g = static_cast<const int32_t *>(l.g_idx.data);
    for (int k = 0; k < K; k++) {
        if (g[k] != k / G) return true;
    }
    return false;
}

}  // namespace qinfer
