#include "model/quant_repack.h"

#include <algorithm>
#include <numeric>
#include <string>

#include "core/check.h"
#include "core/dtype.h"
#include "core/parallel.h"
#include "model/quant.h"

namespace qinfer {

namespace {

// Act-order: sort input channels by group (stable), so each group is a contiguous run of positions.
std::vector<int32_t> act_order_perm(const Linear & l) {
    if (!l.g_idx.present()) return {};
    const int K = l.in_features, G = l.scheme.group(K);
    const int32_t * g = static_cast<const int32_t *>(l.g_idx.data);
    bool identity = true;
    for (int k = 0; k < K && identity; k++) identity = g[k] == k / G;
    if (identity) return {};
    std::vector<int32_t> perm(static_cast<size_t>(K));
    std::iota(perm.begin(), perm.end(), 0);
    std::stable_sort(perm.begin(), perm.end(), [&](int32_t a, int32_t b) { return g[a] < g[b]; });
    for (int i = 0; i < K; i++) {
        if (g[perm[size_t(i)]] != i / G) {
            QINFER_FAIL() << l.g_idx.name << ": groups are not of equal size " << G << " after sorting (irregular g_idx is not supported on CUDA)";
        }
    }
    return perm;
}

}  // namespace

std::string cuda_quant_unsupported(const Linear & l) {
    const QuantScheme & s = l.scheme;
    const int K = l.in_features;
    if (s.method == QuantMethod::Bnb4) {
        if (K % 64 != 0) return "bitsandbytes on CUDA needs in_features to be a multiple of 64, not " + std::to_string(K);
        return "";
    }
    if (s.bits != 4 && s.bits != 8) return std::to_string(s.bits) + "-bit weights run on the CPU backend only";
    const int chunk = 128 / s.bits;  // values per 16-byte load
    if (K % chunk != 0) return "in_features " + std::to_string(K) + " is not a multiple of " + std::to_string(chunk);
    if (s.group(K) % chunk != 0) return "group size " + std::to_string(s.group(K)) + " is not a multiple of " + std::to_string(chunk);
    return "";
}

uint32_t RepackedQuant::code(int64_t row, int64_t pos) const {
    const int per_word = 32 / bits;
    return (codes[size_t(row * words_per_row() + pos / per_word)] >> (bits * (pos % per_word))) & ((1u << bits) - 1u);
}

float RepackedQuant::weight(int64_t row, int64_t channel) const {
    int64_t pos = channel;
    if (!perm.empty()) pos = std::find(perm.begin(), perm.end(), int32_t(channel)) - perm.begin();
    const uint32_t q = code(row, pos);
    if (lut) return table[q] * absmax[size_t(row * (k / 64) + pos / 64)];
    const int64_t g = pos / group;
    const int z = zeros.empty() ? const_zero : zeros[size_t(row * groups + g)];
    return f16_to_f32(scales[size_t(row * groups + g)]) * float(int(q) - z);
}

RepackedQuant repack_for_cuda(const std::vector<const Linear *> & parts) {
    QINFER_CHECK(!parts.empty()) << "repack_for_cuda: no parts";
    const Linear & first = *parts[0];
    RepackedQuant r;
    r.k = first.in_features;
    r.lut = first.scheme.method == QuantMethod::Bnb4;
    r.bits = r.lut ? 4 : first.scheme.bits;
    r.group = r.lut ? 64 : first.scheme.group(r.k);
    r.groups = r.lut ? r.k / 64 : (r.k + r.group - 1) / r.group;
    r.perm = act_order_perm(first);
    for (const Linear * p : parts) {
        const std::string why = cuda_quant_unsupported(*p);
        const std::string & name = p->scheme.method == QuantMethod::Bnb4 ? p->weight.name : p->qweight.name;
        if (!why.empty()) QINFER_FAIL() << name << ": " << why;
        if (p->in_features != r.k || p->scheme.bits != first.scheme.bits || p->scheme.method != first.scheme.method ||
            p->scheme.group(r.k) != first.scheme.group(r.k)) {
            QINFER_FAIL() << name << ": fused projections need the same quantization (" << p->scheme.describe() << " vs "
                          << first.scheme.describe() << ")";
        }
        if (act_order_perm(*p) != r.perm) QINFER_FAIL() << name << ": fused projections need the same act-order (g_idx)";
        r.rows += p->out_features;
    }
    const int wpr = r.words_per_row(), per_word = 32 / r.bits;
    r.codes.assign(size_t(r.rows) * wpr, 0u);
    if (r.lut) {
        r.absmax.resize(size_t(r.rows) * r.groups);
        const float * t = static_cast<const float *>(first.quant_map.data);
        r.table.assign(t, t + 16);
    } else {
        r.scales.resize(size_t(r.rows) * r.groups);
        r.zeros.resize(size_t(r.rows) * r.groups);
    }
    int row0 = 0;
    for (const Linear * p : parts) {
        const QuantReader reader(*p);
        if (r.lut) {
            const float * t = static_cast<const float *>(p->quant_map.data);
            if (!std::equal(t, t + 16, r.table.begin())) QINFER_FAIL() << p->quant_map.name << ": fused projections need the same code table";
        }
        parallel_for(p->out_features, [&](int64_t n) {
            const int64_t row = row0 + n;
            uint32_t * words = r.codes.data() + row * wpr;
            for (int64_t i = 0; i < r.k; i++) {
                const int64_t channel = r.perm.empty() ? i : r.perm[size_t(i)];
                words[i / per_word] |= reader.code(n, channel) << (r.bits * (i % per_word));
            }
            for (int64_t g = 0; g < r.groups; g++) {
                if (r.lut) {
                    r.absmax[size_t(row * r.groups + g)] = reader.absmax((n * r.k) / 64 + g);
                    continue;
                }
                // Position g * group belongs to group g (contiguous after the act-order sort).
                const int64_t channel = r.perm.empty() ? g * r.group : r.perm[size_t(g * r.group)];
                const int64_t stored = reader.group(channel);
                const float s = reader.scale(stored, n);
                r.scales[size_t(row * r.groups + g)] = f32_to_f16(s);
                if (f16_to_f32(r.scales[size_t(row * r.groups + g)]) != s) {
                    QINFER_FAIL() << p->scales.name << ": scale " << s << " is not exact in fp16 (CUDA keeps fp16 scales)";
                }
                const int z = reader.zero(stored, n);
                if (z < 0 || z > 255) QINFER_FAIL() << p->qzeros.name << ": zero point " << z << " does not fit the CUDA layout";
                r.zeros[size_t(row * r.groups + g)] = uint8_t(z);
            }
        });
        row0 += p->out_features;
    }
    if (!r.lut && std::all_of(r.zeros.begin(), r.zeros.end(), [&](uint8_t z) { return z == r.zeros[0]; })) {
        r.const_zero = r.zeros.empty() ? 0 : r.zeros[0];
        r.zeros.clear();
    }
    return r;
}

}  // namespace qinfer
