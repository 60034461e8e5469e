// CPU reference ops: plain, readable, fp32 arithmetic, exactly the math transformers does.
// Activations are fp32 row-major; weights stay in the checkpoint dtype (bf16/fp16/fp32).
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/parallel.h"

#include "model/weights.h"

namespace qinfer::cpu {

// Weight element i as fp32.
float weight_at(const Weight & w, int64_t i);
// Weight row `row` of a 2-D weight, fp32 [cols].
void weight_row(const Weight & w, int64_t row, float * out);
std::vector<float> weight_to_f32(const Weight & w);

// out[t] = table[ids[t]]: fp32 [n, hidden]
void embedding(const Weight & table, const int * ids, int n, float * out);

// RMSNorm (Qwen2RMSNorm): y = x * rsqrt(mean(x^2) + eps) * w. x, y: fp32 [n, dim] (may alias); w: [dim].
void rms_norm(const float * x, const Weight & w, float eps, int n, int dim, float * y);

// y = x W^T + b. x: fp32 [n, in_features]; y: fp32 [n, out_features].
void linear(const float * x, int n, const Linear & l, float * y);

// Rotate-half RoPE in place. x: fp32 [n, n_heads, head_dim]; cos, sin: fp32 [n, head_dim].
void rope(float * x, int n, int n_heads, int head_dim, const float * cos, const float * sin);

// out = silu(gate) * up, elementwise over n values.
void silu_mul(const float * gate, const float * up, int64_t n, float * out);

// x += y over n values.
void add(float * x, const float * y, int64_t n);

// MoE routing of one token (Qwen2MoeSparseMoeBlock / Qwen3MoeSparseMoeBlock): p = softmax(logits[0:E]) in fp32, the
// top k by p (largest first, ties to the lower expert, as torch.topk) into ids [k], their weights p, or p over the
// sum of the chosen p (renormalise: norm_topk_prob), into weights [k].
void moe_route(const float * logits, int E, int k, bool renormalise, int * ids, float * weights);

// Dot product of a weight row with an fp32 vector (the decode hot loop).
float dot_row(const Weight & w, int64_t row, const float * x, int k);

// Causal GQA attention (transformers' eager attention): n queries at positions pos0..pos0+n-1 over keys 0..pos.
// q, out: fp32 [n, n_head, d]; k_row(j), v_row(j): fp32 [n_kv, d] of token j. Query head h reads KV head
// h / (n_head / n_kv) (repeat_kv); scores scaled by d^-0.5; softmax in fp32.
template <class KRow, class VRow>
void attention(const float * q, int n, int pos0, int n_head, int n_kv, int d, KRow k_row, VRow v_row, float * out) {
    const int n_rep = n_head / n_kv;
    const float scale = 1.0f / std::sqrt(float(d));
    parallel_for(int64_t(n) * n_head, [&](int64_t job) {
        const int t = int(job / n_head), h = int(job % n_head), kvh = h / n_rep, pos = pos0 + t;
        const float * qv = q + (int64_t(t) * n_head + h) * d;
        std::vector<float> scores(static_cast<size_t>(pos) + 1);
        float max_score = -INFINITY;
        for (int j = 0; j <= pos; j++) {
            const float * kv = k_row(j) + int64_t(kvh) * d;
            float s = 0;
            for (int i = 0; i < d; i++) s += qv[i] * kv[i];
            scores[size_t(j)] = s * scale;
            max_score = std::max(max_score, scores[size_t(j)]);
        }
        float sum = 0;
        for (float & s : scores) sum += (s = std::exp(s - max_score));
        float * o = out + (int64_t(t) * n_head + h) * d;
        std::fill(o, o + d, 0.0f);
        for (int j = 0; j <= pos; j++) {
            const float * vv = v_row(j) + int64_t(kvh) * d;
            const float p = scores[size_t(j)] / sum;
            for (int i = 0; i < d; i++) o[i] += p * vv[i];
        }
    });
}

}  // namespace qinfer::cpu
