// Staging a GEMV input row in shared memory for the quantized kernels: RMSNorm (rounded to bf16, as the unquantized
// path does) or bf16, gathered in act-order, in one pass of global loads when the row fits in registers.
// Every block stages its own copy of the rows, and what that costs is the fp32 bytes all blocks read from L2: 7B's qkv
// (288 blocks) ~0.6 / 1.8 / 3.1 us over a plain bf16 input at 1 / 2 / 4 rows on an H200. Half as many blocks cut
// that overhead to 0.7 us at 4 rows but slowed the GEMV more. Two other designs lost too
// (bench/results/2026-12-02-h200-norm-cluster): all rows' sums of squares first and the rows read a second time (-2.8%
// at batch 4), and thread-block clusters that split the rows between their blocks (-17% at batch 1, -5.7% at 4).
#pragma once

#include <cstdint>

#include "backends/cuda/common.cuh"
#include "backends/cuda/ops.h"

namespace qinfer::cuda::qstage {

constexpr int k_threads = 256;
constexpr int k_reg_values = 32;  // normalised inputs of up to 8192 values are held in registers (one pass)

// Calls f(i, value) for positions i = base + threadIdx.x over bases 0, 256, ... < n_pos, so the 32 lanes of a warp
// hold 32 consecutive positions (f may reduce over a warp); value is 0 at positions >= K. All threads must call.
// ONE_PASS = false reads the row twice instead of holding 64 values per thread (for kernels short of registers).
template <GemvIn IN, class F, bool ONE_PASS = true>
__device__ __forceinline__ void for_each_input(const GemvArgs & a, const int * perm, int tok, int K, int n_pos, float * red, F f) {
    const float * xf = static_cast<const float *>(a.x) + size_t(tok) * K;
    const bf16 * xb = static_cast<const bf16 *>(a.x) + size_t(tok) * K;
    if constexpr (IN == GemvIn::NormF32) {
        if (ONE_PASS && K <= k_reg_values * k_threads) {
            float v[k_reg_values], nw[k_reg_values], sq = 0;
#pragma unroll
            for (int u = 0; u < k_reg_values; u++) {
                const int i = threadIdx.x + u * k_threads;
                v[u] = 0;
                nw[u] = 0;
                if (i < K) {
                    const int j = perm ? perm[i] : i;
                    v[u] = xf[j];
                    nw[u] = __bfloat162float(a.norm_w[j]);
                }
                sq += v[u] * v[u];
            }
            const float inv = rsqrtf(block_sum<k_threads / 32>(sq, red) / K + a.eps);
#pragma unroll
            for (int u = 0; u < k_reg_values; u++) {
                if (u * k_threads >= n_pos) break;
                f(threadIdx.x + u * k_threads, __bfloat162float(__float2bfloat16(nw[u] * (v[u] * inv))));
            }
            return;
        }
        float sq = 0;
        for (int i = threadIdx.x; i < K; i += k_threads) sq += xf[i] * xf[i];
        const float inv = rsqrtf(block_sum<k_threads / 32>(sq, red) / K + a.eps);
        for (int base = 0; base < n_pos; base += k_threads) {
            const int i = base + threadIdx.x;
            float v = 0;
            if (i < K) {
                const int j = perm ? perm[i] : i;
                v = __bfloat162float(__float2bfloat16(__bfloat162float(a.norm_w[j]) * (xf[j] * inv)));
            }
            f(i, v);
        }
    } else {
        for (int base = 0; base < n_pos; base += k_threads) {
            const int i = base + threadIdx.x;
            f(i, i < K ? __bfloat162float(xb[perm ? perm[i] : i]) : 0.0f);
        }
    }
}

// Host: whether stage_norm_vec may stage a.x (fp32 rows 16-byte aligned, norm weights 8-byte aligned, K % 4 == 0).
inline bool vec_norm_ok(const GemvArgs & a) {
    return a.k % 4 == 0 && reinterpret_cast<uintptr_t>(a.x) % 16 == 0 && reinterpret_cast<uintptr_t>(a.norm_w) % 8 == 0;
}

// Where position i of a row is staged for the ring GEMV's 16-byte B loads (qgemv_ring.cuh): within each 64-wide K
// block, the bf16 pair w (positions 2w, 2w + 1) moves to pair (w % 4) * 8 + w / 4, so that the eight pairs one lane
// multiplies in a block (w = t, t + 4, ..., t + 28) lie together.
__device__ __forceinline__ int b_pair_order(int i) {
    const int e = i & 63, w = e >> 1;
    return (i & ~63) | ((w & 3) << 4) | ((w >> 2) << 1) | (e & 1);
}

// RMSNorm of one fp32 row into bf16 dst [n_pos] (zero at positions >= K), without act-order, for K % 4 == 0: every
// thread requests its float4 inputs and 4-value norm weights of a batch of up to R x 1024 positions at once, so a row
// of up to R x 1024 costs one round trip to memory before the block sum instead of one per 256 positions (rows
// longer than that are read twice, a batch at a time). All threads must call. Same rounding as for_each_input.
// pair_order: positions stored where b_pair_order puts them (n_pos a multiple of 64).
template <int R>
__device__ __forceinline__ void stage_norm_vec(const GemvArgs & a, int tok, int K, int n_pos, bf16 * dst, float * red,
                                               bool pair_order = false) {
    const float4 * x4 = reinterpret_cast<const float4 *>(static_cast<const float *>(a.x) + size_t(tok) * K);
    const uint2 * w4 = reinterpret_cast<const uint2 *>(a.norm_w);  // 4 bf16 per uint2
    const int n4 = K / 4;
    constexpr int batch = R * k_threads;
    auto scale_store = [&](int i4, const float4 & v, const uint2 & nw, float inv) {
        const __nv_bfloat162 w01 = *reinterpret_cast<const __nv_bfloat162 *>(&nw.x), w23 = *reinterpret_cast<const __nv_bfloat162 *>(&nw.y);
        const __nv_bfloat162 y01 = __floats2bfloat162_rn(__low2float(w01) * (v.x * inv), __high2float(w01) * (v.y * inv));
        const __nv_bfloat162 y23 = __floats2bfloat162_rn(__low2float(w23) * (v.z * inv), __high2float(w23) * (v.w * inv));
        uint2 out;
        out.x = *reinterpret_cast<const uint32_t *>(&y01);
        out.y = *reinterpret_cast<const uint32_t *>(&y23);
        if (pair_order) {
            *reinterpret_cast<uint32_t *>(dst + b_pair_order(i4 * 4)) = out.x;
            *reinterpret_cast<uint32_t *>(dst + b_pair_order(i4 * 4 + 2)) = out.y;
            return;
        }
        *reinterpret_cast<uint2 *>(dst + size_t(i4) * 4) = out;
    };
    if (n4 <= batch) {
        float4 v[R];
        uint2 nw[R];
        float sq = 0;
#pragma unroll
        for (int u = 0; u < R; u++) {
            const int i4 = threadIdx.x + u * k_threads;
            v[u] = i4 < n4 ? x4[i4] : make_float4(0, 0, 0, 0);
            nw[u] = i4 < n4 ? w4[i4] : make_uint2(0, 0);
        }
#pragma unroll
        for (int u = 0; u < R; u++) sq += v[u].x * v[u].x + v[u].y * v[u].y + v[u].z * v[u].z + v[u].w * v[u].w;
        const float inv = rsqrtf(block_sum<k_threads / 32>(sq, red) / K + a.eps);
#pragma unroll
        for (int u = 0; u < R; u++) {
            const int i4 = threadIdx.x + u * k_threads;
            if (i4 < n4) scale_store(i4, v[u], nw[u], inv);
        }
    } else {
        float sq = 0;
        for (int base = 0; base < n4; base += batch) {
            float4 v[R];
#pragma unroll
            for (int u = 0; u < R; u++) {
                const int i4 = base + threadIdx.x + u * k_threads;
                v[u] = i4 < n4 ? x4[i4] : make_float4(0, 0, 0, 0);
            }
#pragma unroll
            for (int u = 0; u < R; u++) sq += v[u].x * v[u].x + v[u].y * v[u].y + v[u].z * v[u].z + v[u].w * v[u].w;
        }
        const float inv = rsqrtf(block_sum<k_threads / 32>(sq, red) / K + a.eps);
        for (int base = 0; base < n4; base += batch) {
            float4 v[R];
            uint2 nw[R];
#pragma unroll
            for (int u = 0; u < R; u++) {
                const int i4 = base + threadIdx.x + u * k_threads;
                v[u] = i4 < n4 ? x4[i4] : make_float4(0, 0, 0, 0);
                nw[u] = i4 < n4 ? w4[i4] : make_uint2(0, 0);
            }
#pragma unroll
            for (int u = 0; u < R; u++) {
                const int i4 = base + threadIdx.x + u * k_threads;
                if (i4 < n4) scale_store(i4, v[u], nw[u], inv);
            }
        }
    }
    for (int i = K + threadIdx.x; i < n_pos; i += k_threads) dst[pair_order ? b_pair_order(i) : i] = __float2bfloat16(0.0f);
}

// A MoE block's input (MoeNormIn: the residual and its norm weights) as stage_norm_vec / vec_norm_ok take it.
__host__ __device__ inline GemvArgs norm_args(const MoeNormIn & n, int K) {
    GemvArgs a;
    a.x = n.x;
    a.norm_w = n.norm_w;
    a.eps = n.eps;
    a.k = K;
    return a;
}

// The BF16 GEMVs' prologue: the m rows of an fp32 input RMS-normalised into bf16 xs [m, k] (float4 batches where
// a.vec_norm, else one pass per 256 values). All threads must call; xs is ready after a __syncthreads().
__device__ __forceinline__ void stage_norm_rows(const GemvArgs & a, int m_rows, bf16 * xs, float * red) {
    const int k = a.k;
    for (int m = 0; m < m_rows; m++) {
        if (a.vec_norm) {
            stage_norm_vec<4>(a, m, k, k, xs + int64_t(m) * k, red);
            continue;
        }
        const float * x = static_cast<const float *>(a.x) + int64_t(m) * k;
        float ss = 0;
        for (int i = threadIdx.x; i < k; i += k_threads) ss += x[i] * x[i];
        const float inv = rsqrtf(block_sum<k_threads / 32>(ss, red) / k + a.eps);
        for (int i = threadIdx.x; i < k; i += k_threads) {
            xs[int64_t(m) * k + i] = __float2bfloat16(__bfloat162float(a.norm_w[i]) * (x[i] * inv));
        }
    }
}

}  // namespace qinfer::cuda::qstage
