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
    if (!has_act_order(l)) return {};
    const int K = l.in_features, G = l.scheme.group(K);
    const int32_t * g = static_cast<const int32_t *>(l.g_idx.data);
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

bool quant_tiles(const QuantScheme & s, int in_features) {
    if (s.method == QuantMethod::Bnb4 || s.bits == 4) return true;
    const int group = s.group(in_features);
    return s.bits == 8 && (group >= in_features || group % 32 == 0);
}

size_t RepackedQuant::word_index(int64_t row, int64_t pos, int * shift, int plane) const {
    if (!tiled) {
        const int per_word = 32 / bits;
        *shift = bits * int(pos % per_word);
        return size_t(row * words_per_row() + pos / per_word);
    }
    const int64_t rb = row / 16, gr = row % 16, kb = pos / 64, j = (pos % 64) / 16, kk = pos % 16;
    const int g = int(gr % 8), hi_row = gr >= 8, second = kk >= 8, t = int((kk % 8) / 2), odd = int(kk % 2);
    const int planes = bits / 4, reg = 2 * second + hi_row;  // reg: the bf16x2 register of the A fragment
    *shift = lut ? 8 * reg + 4 * odd : 4 * (reg + 4 * odd);
    return size_t((((rb * (k_padded / 64) + kb) * planes + plane) * 32 + (g * 4 + t)) * 4 + j);
}

void RepackedQuant::put_row(int64_t row, const uint8_t * q) {
    if (!tiled) {
        const int per_word = 32 / bits;
        uint32_t * words = codes.data() + size_t(row) * words_per_row();
        for (int64_t i = 0; i < k; i++) words[i / per_word] |= uint32_t(q[i]) << (bits * (i % per_word));
        return;
    }
    // word_index's arithmetic, hoisted: a 16-position step j of K block kb starts at word ((row_block * (K/64) + kb)
    // * planes * 32 + g * 4) * 4 + j, and its position kk sits in lane t = (kk % 8) / 2 of the row's quad (4 words
    // apart) at the field of A register 2 (kk >= 8) + (row % 16 >= 8), odd element kk % 2.
    const int planes = bits / 4, hi_row = row % 16 >= 8;
    int lane_word[16], shift[16];
    for (int kk = 0; kk < 16; kk++) {
        const int reg = 2 * (kk >= 8) + hi_row, odd = kk % 2;
        lane_word[kk] = 4 * ((kk % 8) / 2);
        shift[kk] = lut ? 8 * reg + 4 * odd : 4 * (reg + 4 * odd);
    }
    uint32_t * const block0 = codes.data() + size_t(row / 16) * (k_padded / 64) * planes * 128 + size_t(row % 8) * 16;
    for (int64_t p0 = 0; p0 < k; p0 += 16) {
        uint32_t * step = block0 + size_t(p0 / 64) * planes * 128 + (p0 % 64) / 16;
        const int n = int(std::min<int64_t>(16, k - p0));
        for (int kk = 0; kk < n; kk++) {
            const uint32_t v = q[p0 + kk];
            if (planes == 2) {
                step[lane_word[kk]] |= (v & 15u) << shift[kk];
                step[128 + lane_word[kk]] |= (v >> 4) << shift[kk];
            } else {
                step[lane_word[kk]] |= v << shift[kk];
            }
        }
    }
}

uint32_t RepackedQuant::code(int64_t row, int64_t pos) const {
    int shift = 0;
    if (tiled && bits == 8) {
        const size_t lo = word_index(row, pos, &shift, 0), hi = word_index(row, pos, &shift, 1);
        return ((codes[lo] >> shift) & 15u) | (((codes[hi] >> shift) & 15u) << 4);
    }
    const size_t w = word_index(row, pos, &shift);
    return (codes[w] >> shift) & ((1u << bits) - 1u);
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

void RepackedQuant::row(int64_t row, float * out) const {
    QINFER_CHECK(!tiled) << "RepackedQuant::row reads the untiled layout";
    const uint32_t * words = codes.data() + size_t(row) * words_per_row();
    const int per_word = 32 / bits;
    const uint32_t mask = (1u << bits) - 1u;
    if (!lut && perm.empty() && group % 8 == 0) {
        // The common case in plain loops the compiler vectorises: bytes in order, low nibble first (LSB-first packing).
        const uint8_t * bytes = reinterpret_cast<const uint8_t *>(words);
        for (int g = 0; g < groups; g++) {
            const float s = f16_to_f32(scales[size_t(row) * groups + g]);
            const int z = zeros.empty() ? const_zero : zeros[size_t(row) * groups + g];
            const int p0 = g * group, p1 = std::min(k, p0 + group);
            if (bits == 8) {
                for (int pos = p0; pos < p1; pos++) out[pos] = s * float(int(bytes[pos]) - z);
            } else {
                for (int i = p0 / 2; i < p1 / 2; i++) {
                    out[2 * i] = s * float(int(bytes[i] & 15) - z);
                    out[2 * i + 1] = s * float(int(bytes[i] >> 4) - z);
                }
            }
        }
        return;
    }
    for (int g = 0; g < groups; g++) {
        const int p0 = g * group, p1 = std::min(k, p0 + group);
        float s = 0, a = 0;
        int z = 0;
        if (lut) {
            a = absmax[size_t(row) * groups + g];
        } else {
            s = f16_to_f32(scales[size_t(row) * groups + g]);
            z = zeros.empty() ? const_zero : zeros[size_t(row) * groups + g];
        }
        for (int pos = p0; pos < p1; pos++) {
            const uint32_t q = (words[pos / per_word] >> (bits * (pos % per_word))) & mask;
            out[perm.empty() ? pos : perm[size_t(pos)]] = lut ? table[q] * a : s * float(int(q) - z);
        }
    }
}

// Why `p` cannot be stacked under `first` (whose act-order permutation is `perm`) in one repacked matrix; empty: it can.
static std::string stack_mismatch(const Linear & first, const std::vector<int32_t> & perm, const Linear & p) {
    const int k = first.in_features;
    if (p.in_features != k || p.scheme.bits != first.scheme.bits || p.scheme.method != first.scheme.method ||
        p.scheme.group(k) != first.scheme.group(k)) {
        return "fused projections need the same quantization (" + p.scheme.describe() + " vs " + first.scheme.describe() + ")";
    }
    if (&p != &first && act_order_perm(p) != perm) return "fused projections need the same act-order (g_idx)";
    return "";
}

bool quant_stackable(const std::vector<const Linear *> & parts) {
    if (parts.empty()) return false;
    const std::vector<int32_t> perm = act_order_perm(*parts[0]);
    return std::all_of(parts.begin(), parts.end(),
                       [&](const Linear * p) { return p->quantized() && stack_mismatch(*parts[0], perm, *p).empty(); });
}

RepackedQuant repack_quant(const std::vector<const Linear *> & parts, bool tile) {
    QINFER_CHECK(!parts.empty()) << "repack_quant: no parts";
    const Linear & first = *parts[0];
    RepackedQuant r;
    r.k = first.in_features;
    r.lut = first.scheme.method == QuantMethod::Bnb4;
    r.bits = r.lut ? 4 : first.scheme.bits;
    r.group = r.lut ? 64 : first.scheme.group(r.k);
    r.groups = r.lut ? r.k / 64 : (r.k + r.group - 1) / r.group;
    r.perm = act_order_perm(first);
    r.tiled = tile && quant_tiles(first.scheme, r.k);
    for (const Linear * p : parts) {
        const std::string why = cuda_quant_unsupported(*p);
        const std::string & name = p->scheme.method == QuantMethod::Bnb4 ? p->weight.name : p->qweight.name;
        if (!why.empty()) QINFER_FAIL() << name << ": " << why;
        const std::string mismatch = stack_mismatch(first, r.perm, *p);
        if (!mismatch.empty()) QINFER_FAIL() << name << ": " << mismatch;
        r.rows += p->out_features;
    }
    r.rows_padded = r.tiled ? (r.rows + 15) / 16 * 16 : r.rows;
    r.k_padded = r.tiled ? (r.k + 63) / 64 * 64 : r.k;
    r.codes.assign(size_t(r.rows_padded) * r.k_padded * r.bits / 32, 0u);
    if (r.lut) {
        r.absmax.assign(size_t(r.rows_padded) * r.groups, 0.0f);
        const float * t = static_cast<const float *>(first.quant_map.data);
        r.table.assign(t, t + 16);
    } else {
        r.scales.assign(size_t(r.rows_padded) * r.groups, 0);
        r.zeros.resize(size_t(r.rows_padded) * r.groups);
    }
    int row0 = 0;
    for (const Linear * p : parts) {
        const QuantReader reader(*p);
        if (r.lut) {
            const float * t = static_cast<const float *>(p->quant_map.data);
            if (!std::equal(t, t + 16, r.table.begin())) QINFER_FAIL() << p->quant_map.name << ": fused projections need the same code table";
        }
        // Rows own disjoint words in both layouts (a tiled word holds rows g and g + 8: two passes, even then odd).
        const auto fill_row = [&](int64_t n) {
            const int64_t row = row0 + n;
            thread_local std::vector<uint8_t> by_channel, by_pos;
            by_channel.resize(size_t(r.k));
            reader.codes_row(n, by_channel.data());
            const uint8_t * q = by_channel.data();
            if (!r.perm.empty()) {
                by_pos.resize(size_t(r.k));
                for (int64_t i = 0; i < r.k; i++) by_pos[size_t(i)] = by_channel[size_t(r.perm[size_t(i)])];
                q = by_pos.data();
            }
            r.put_row(row, q);
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
        };
        if (r.tiled) {
            // Rows r and r + 8 of a 16-row block share words: fill rows 0-7 of every block, then rows 8-15.
            for (int half = 0; half < 2; half++) {
                parallel_for(p->out_features, [&](int64_t n) {
                    if (((row0 + n) % 16 >= 8) == bool(half)) fill_row(n);
                });
            }
        } else {
            parallel_for(p->out_features, fill_row);
        }
        row0 += p->out_features;
    }
    if (!r.lut && std::all_of(r.zeros.begin(), r.zeros.end(), [&](uint8_t z) { return z == r.zeros[0]; })) {
        r.const_zero = r.zeros.empty() ? 0 : r.zeros[0];
        r.zeros.clear();
    }
    return r;
}

}  // namespace qinfer
