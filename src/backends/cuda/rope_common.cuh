// The per-pair pieces of "q/k/v bias + RoPE + KV-cache store", shared by qkv_rope_cache_kernel (elementwise.cu) and
// the QKV GEMV that does the same in its epilogue (gemv_balanced.cu). A pair is the two elements (j, j + d/2) of one
// head of one token, which rotate-half RoPE mixes.
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

// Where the pair (j, j + d/2) of head `head` of token t goes, and what is applied on the way, for a bf16 cache without
// q/k norms. Depends only on the arguments and the token's position, so the fused QKV GEMV works it out while its
// weights are in flight.
struct PairTarget {
    float c = 1, s = 0;    // attention-scaled cos and sin at the token's position (1, 0: V, not rotated)
    float b0 = 0, b1 = 0;  // the pair's bias (0 without)
    bf16 * dst = nullptr;  // element j of the pair's row: q_out or the cache row; element j + d/2 at dst + d/2
};

__device__ __forceinline__ PairTarget pair_target(const QkvRopeArgs & a, int t, int head, int j) {
    const int d = a.head_dim, half = d / 2;
    PairTarget p;
    if (a.bias) {
        p.b0 = __bfloat162float(a.bias[head * d + j]);
        p.b1 = __bfloat162float(a.bias[head * d + j + half]);
    }
    const bool is_q = head < a.n_head, is_v = head >= a.n_head + a.n_kv;
    const int pos = position(a, t);
    if (!is_v) cos_sin(a, pos, j, p.c, p.s);
    if (is_q) {
        p.dst = a.q_out + (int64_t(t) * a.n_head + head) * d + j;
    } else {
        const int kvh = is_v ? head - a.n_head - a.n_kv : head - a.n_head;
        p.dst = (is_v ? a.cache.v : a.cache.k) + cache_row(a, t, pos, kvh) * d + j;
    }
    return p;
}

// x0, x1: the projection's fp32 sums of the pair's two rows, rounded to bf16 (its output dtype), biased as
// transformers does (add_bias), rotated as rotate() does, stored. V's (c, s) = (1, 0) leave finite values unchanged.
__device__ __forceinline__ void store_pair(const PairTarget & p, int half, float x0, float x1) {
    x0 = __bfloat162float(__float2bfloat16(__bfloat162float(__float2bfloat16(x0)) + p.b0));
    x1 = __bfloat162float(__float2bfloat16(__bfloat162float(__float2bfloat16(x1)) + p.b1));
    p.dst[0] = __float2bfloat16(x0 * p.c - x1 * p.s);
    p.dst[half] = __float2bfloat16(x1 * p.c + x0 * p.s);
}

}  // namespace qinfer::cuda::rope
