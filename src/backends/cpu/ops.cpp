#include "backends/cpu/ops.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "core/check.h"
#include "core/parallel.h"
#include "model/quant.h"
#include "model/quant_repack.h"

namespace qinfer::cpu {

namespace {

// fp16 -> fp32 by table: exact, branch-free and fast enough for a reference backend.
const float * f16_table() {
    static const std::vector<float> table = [] {
        std::vector<float> t(65536);
        for (uint32_t i = 0; i < 65536; i++) t[i] = f16_to_f32(uint16_t(i));
        return t;
    }();
    return table.data();
}

// 16 independent accumulators so the compiler vectorises the loop without reassociating floats.
constexpr int k_lanes = 16;

float dot_bf16(const uint16_t * w, const float * x, int k) {
    float acc[k_lanes] = {};
    int i = 0;
    for (; i + k_lanes <= k; i += k_lanes) {
        for (int j = 0; j < k_lanes; j++) acc[j] += bf16_to_f32(w[i + j]) * x[i + j];
    }
    float s = 0;
    for (int j = 0; j < k_lanes; j++) s += acc[j];
    for (; i < k; i++) s += bf16_to_f32(w[i]) * x[i];
    return s;
}

float dot_f16(const uint16_t * w, const float * x, int k) {
    const float * t = f16_table();
    float acc[k_lanes] = {};
    int i = 0;
    for (; i + k_lanes <= k; i += k_lanes) {
        for (int j = 0; j < k_lanes; j++) acc[j] += t[w[i + j]] * x[i + j];
    }
    float s = 0;
    for (int j = 0; j < k_lanes; j++) s += acc[j];
    for (; i < k; i++) s += t[w[i]] * x[i];
    return s;
}

float dot_f32(const float * w, const float * x, int k) {
    float acc[k_lanes] = {};
    int i = 0;
    for (; i + k_lanes <= k; i += k_lanes) {
        for (int j = 0; j < k_lanes; j++) acc[j] += w[i + j] * x[i + j];
    }
    float s = 0;
    for (int j = 0; j < k_lanes; j++) s += acc[j];
    for (; i < k; i++) s += w[i] * x[i];
    return s;
}

}  // namespace

float weight_at(const Weight & w, int64_t i) {
    switch (w.dtype) {
    case DType::BF16: return bf16_to_f32(static_cast<const uint16_t *>(w.data)[i]);
    case DType::F16: return f16_table()[static_cast<const uint16_t *>(w.data)[i]];
    case DType::F32: return static_cast<const float *>(w.data)[i];
    default: QINFER_FAIL() << w.name << ": unsupported dtype " << dtype_name(w.dtype);
    }
}

void weight_row(const Weight & w, int64_t row, float * out) {
    const int64_t cols = w.shape.back();
    const int64_t base = row * cols;
    switch (w.dtype) {
    case DType::BF16: {
        const uint16_t * p = static_cast<const uint16_t *>(w.data) + base;
        for (int64_t i = 0; i < cols; i++) out[i] = bf16_to_f32(p[i]);
        break;
    }
    case DType::F16: {
        const uint16_t * p = static_cast<const uint16_t *>(w.data) + base;
        const float * t = f16_table();
        for (int64_t i = 0; i < cols; i++) out[i] = t[p[i]];
        break;
    }
    case DType::F32: std::memcpy(out, static_cast<const float *>(w.data) + base, size_t(cols) * 4); break;
    default: QINFER_FAIL() << w.name << ": unsupported dtype " << dtype_name(w.dtype);
    }
}

std::vector<float> weight_to_f32(const Weight & w) {
    std::vector<float> out(size_t(w.numel()));
    for (int64_t i = 0; i < w.numel(); i++) out[size_t(i)] = weight_at(w, i);
    return out;
}

void moe_route(const float * logits, int E, int k, bool renormalise, int * ids, float * weights) {
    const float mx = *std::max_element(logits, logits + E);
    std::vector<float> p(static_cast<size_t>(E));
    float sum = 0;
    for (int e = 0; e < E; e++) sum += (p[size_t(e)] = std::exp(logits[e] - mx));
    for (float & v : p) v /= sum;
    std::vector<int> order(static_cast<size_t>(E));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[size_t(a)] > p[size_t(b)]; });
    float top = 0;
    for (int j = 0; j < k; j++) top += p[size_t(order[size_t(j)])];
    for (int j = 0; j < k; j++) {
        ids[j] = order[size_t(j)];
        weights[j] = renormalise ? p[size_t(ids[j])] / top : p[size_t(ids[j])];
    }
}

float dot_row(const Weight & w, int64_t row, const float * x, int k) {
    const int64_t base = row * k;
    switch (w.dtype) {
    case DType::BF16: return dot_bf16(static_cast<const uint16_t *>(w.data) + base, x, k);
    case DType::F16: return dot_f16(static_cast<const uint16_t *>(w.data) + base, x, k);
    case DType::F32: return dot_f32(static_cast<const float *>(w.data) + base, x, k);
    default: QINFER_FAIL() << w.name << ": unsupported dtype " << dtype_name(w.dtype);
    }
}

void embedding(const Weight & table, const int * ids, int n, float * out) {
    const int64_t vocab = table.shape[0], hidden = table.shape[1];
    for (int t = 0; t < n; t++) {
        if (ids[t] < 0 || ids[t] >= vocab) QINFER_FAIL() << "token id " << ids[t] << " is outside the vocabulary [0, " << vocab << ")";
        weight_row(table, ids[t], out + int64_t(t) * hidden);
    }
}

void rms_norm(const float * x, const Weight & w, float eps, int n, int dim, float * y) {
    std::vector<float> weight = weight_to_f32(w);
    for (int t = 0; t < n; t++) {
        const float * xr = x + int64_t(t) * dim;
        float * yr = y + int64_t(t) * dim;
        double ss = 0;  // variance in wide precision: torch's fp32 mean uses a tree sum, close to this
        for (int i = 0; i < dim; i++) ss += double(xr[i]) * xr[i];
        float inv = 1.0f / std::sqrt(float(ss / dim) + eps);
        for (int i = 0; i < dim; i++) yr[i] = weight[i] * (xr[i] * inv);
    }
}

void linear(const float * x, int n, const Linear & l, float * y) {
    const int K = l.in_features, N = l.out_features;
    const Weight & W = l.weight;
    if (l.quantized()) {
        // Dequantize a block of rows by the format's formula (model/quant.h), then multiply in fp32.
        const QuantReader reader(l);
        constexpr int k_rows = 8;
        parallel_for((N + k_rows - 1) / k_rows, [&](int64_t b) {
            thread_local std::vector<float> rows;
            rows.resize(size_t(k_rows) * K);
            const int64_t r0 = b * k_rows, r1 = std::min<int64_t>(N, r0 + k_rows);
            for (int64_t r = r0; r < r1; r++) {
                if (l.cpu_rows) {
                    l.cpu_rows->row(r, rows.data() + (r - r0) * K);
                } else {
                    reader.row(r, rows.data() + (r - r0) * K);
                }
            }
            for (int t = 0; t < n; t++) {
                const float * xt = x + int64_t(t) * K;
                for (int64_t r = r0; r < r1; r++) y[int64_t(t) * N + r] = dot_f32(rows.data() + (r - r0) * K, xt, K);
            }
        });
    } else if (n == 1) {
        // Decode: one pass over the weights, rows split across threads.
        parallel_for(N, [&](int64_t r) { y[r] = dot_row(W, r, x, K); });
    } else {
        // Prefill: widen a block of weight rows to fp32 once, then use it for every token.
        constexpr int k_rows = 8;
        const int64_t n_blocks = (N + k_rows - 1) / k_rows;
        parallel_for(n_blocks, [&](int64_t b) {
            thread_local std::vector<float> rows;
            rows.resize(size_t(k_rows) * K);
            const int64_t r0 = b * k_rows, r1 = std::min<int64_t>(N, r0 + k_rows);
            for (int64_t r = r0; r < r1; r++) weight_row(W, r, rows.data() + (r - r0) * K);
            for (int t = 0; t < n; t++) {
                const float * xt = x + int64_t(t) * K;
                for (int64_t r = r0; r < r1; r++) y[int64_t(t) * N + r] = dot_f32(rows.data() + (r - r0) * K, xt, K);
            }
        });
    }
    if (l.bias.present()) {
        std::vector<float> b = weight_to_f32(l.bias);
        for (int t = 0; t < n; t++) {
            for (int r = 0; r < N; r++) y[int64_t(t) * N + r] += b[r];
        }
    }
}

void rope(float * x, int n, int n_heads, int head_dim, const float * cos, const float * sin) {
    const int half = head_dim / 2;
    std::vector<float> tmp(head_dim);
    for (int t = 0; t < n; t++) {
        const float * c = cos + int64_t(t) * head_dim;
        const float * s = sin + int64_t(t) * head_dim;
        for (int h = 0; h < n_heads; h++) {
            float * v = x + (int64_t(t) * n_heads + h) * head_dim;
            // q * cos + rotate_half(q) * sin, rotate_half(q) = concat(-q[half:], q[:half])
            for (int i = 0; i < half; i++) {
                tmp[i] = v[i] * c[i] - v[i + half] * s[i];
                tmp[i + half] = v[i + half] * c[i + half] + v[i] * s[i + half];
            }
            std::memcpy(v, tmp.data(), size_t(head_dim) * 4);
        }
    }
}

void silu_mul(const float * gate, const float * up, int64_t n, float * out) {
    for (int64_t i = 0; i < n; i++) {
        float g = gate[i];
        out[i] = g / (1.0f + std::exp(-g)) * up[i];
    }
}

void add(float * x, const float * y, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] += y[i];
}

}  // namespace qinfer::cpu
