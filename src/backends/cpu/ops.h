// CPU reference ops: plain, readable, fp32 arithmetic, exactly the math transformers does.
// Activations are fp32 row-major; weights stay in the checkpoint dtype (bf16/fp16/fp32).
#pragma once

#include <vector>

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

// Dot product of a weight row with an fp32 vector (the decode hot loop).
float dot_row(const Weight & w, int64_t row, const float * x, int k);

}  // namespace qinfer::cpu
