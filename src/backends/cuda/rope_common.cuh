// The per-pair pieces of "q/k/v bias + RoPE + KV-cache store" of qkv_rope_cache_kernel (elementwise.cu). A pair is
// the two elements (j, j + d/2) of one head of one token, which rotate-half RoPE mixes.
#pragma once

#include "backends/cuda/common.cuh"
#include "backends/cuda/ops.h"

namespace qinfer::cuda::rope {

// Position of token t: pos_dev[t] in a decode batch, else pos0 (or *pos0_dev) + t.
__device__ __forceinline__ int position(const QkvRopeArgs & a, int t) { return a.pos_dev ? a.pos_dev[t] : (a.pos0_dev ? *a.pos0_dev : a.pos0) + t; }

// transformers adds the bias in the linear layer's output dtype (bf16). col: the head's first column.
__device__ __forceinline__ void add_bias(const QkvRopeArgs & a, int col, int j, float & x0, float & x1) {
    if (!a.bias) return;
    const int half = a.head_dim / 2;
    x0 = __bfloat162float(__float2bfloat16(x0 + __bfloat162float(a.bias[col + j])));
    x1 = __bfloat162float(__float2bfloat16(x1 + __bfloat162float(a.bias[col + j + half])));
}

// cos and sin of pair j's angle at `pos`, times the rope scaling's attention factor.
__device__ __forceinline__ void cos_sin(const QkvRopeArgs & a, int pos, int j, float & c, float & s) {
    sincosf(float(pos) * a.inv_freq[j], &s, &c);
    c *= a.attention_scaling;
    s *= a.attention_scaling;
}

// Rotate-half RoPE of the pair at `pos`.
__device__ __forceinline__ void rotate(const QkvRopeArgs & a, int pos, int j, float & x0, float & x1) {
    float c, s;
    cos_sin(a, pos, j, c, s);
    const float y0 = x0 * c - x1 * s, y1 = x1 * c + x0 * s;
    x0 = y0;
    x1 = y1;
}

// Cache row of KV head kvh for token t at pos: (block * n_kv + kvh) * block_size + slot; a decode batch's token t
// reads row t of the block tables.
__device__ __forceinline__ int64_t cache_row(const QkvRopeArgs & a, int t, int pos, int kvh) {
    const int * table = a.pos_dev ? a.cache.block_table + int64_t(a.row_seq ? a.row_seq[t] : t) * a.cache.table_stride : a.cache.block_table;
    const int block = table[pos / a.cache.block_size], slot = pos % a.cache.block_size;
    return (int64_t(block) * a.n_kv + kvh) * a.cache.block_size + slot;
}

}  // namespace qinfer::cuda::rope
