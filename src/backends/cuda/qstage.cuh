// Staging a GEMV input row in shared memory for the quantized kernels: RMSNorm (rounded to bf16, as the unquantized
// path does) or bf16, gathered in act-order, in one pass of global loads when the row fits in registers.
#pragma once

#include <cooperative_groups.h>
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

// RMSNorm of one fp32 row x [K] into bf16 dst [n_pos] (zero at positions >= K): for_each_input's two-pass form (the row
// read twice, the second time from L1; few registers), for the MoE experts' gate/up launches (MoeNormIn). All
// k_threads threads must call; red: shared float [k_threads / 32].
__device__ __forceinline__ void stage_rms_norm_row(const float * x, const bf16 * w, float eps, int K, int n_pos, bf16 * dst, float * red) {
    GemvArgs a;
    a.x = x;
    a.norm_w = w;
    a.eps = eps;
    auto store = [&](int i, float v) {
        if (i < n_pos) dst[i] = __float2bfloat16(v);
    };
    for_each_input<GemvIn::NormF32, decltype(store), false>(a, nullptr, 0, K, n_pos, red, store);
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

// Four normalised values bf16(w * (x * inv)) stored at float4 index i4 of a staged row (in b_pair_order if asked).
__device__ __forceinline__ void scale_store_norm(bf16 * dst, int i4, const float4 & v, const uint2 & nw, float inv, bool pair_order) {
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
            if (i4 < n4) scale_store_norm(dst, i4, v[u], nw[u], inv, pair_order);
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
                if (i4 < n4) scale_store_norm(dst, i4, v[u], nw[u], inv, pair_order);
            }
        }
    }
    for (int i = K + threadIdx.x; i < n_pos; i += k_threads) dst[pair_order ? b_pair_order(i) : i] = __float2bfloat16(0.0f);
}

// Normalised rows staged by a thread-block cluster (Hopper), for the ring GEMV (qgemv_ring.cuh) where the launch asks
// for it: every block of a GEMV stages the same m rows, and the fp32 rows every block reads from L2 set the cost
// (7B's qkv, 288 blocks: 4.1 MB a row, ~0.7 us of L2 bandwidth each). In a cluster of C blocks, block r reads only its
// 1/C of each row (in whole 64-wide K blocks), all m rows in one batch of loads, adds its sums of squares per row,
// and after a cluster barrier reads the C blocks' sums in rank order (every block gets the same bits), normalises its
// part and stores it into the shared memory of every block of the cluster; a second barrier, and each block holds
// all m rows. Up to k_cluster_rows rows of up to k_cluster_slice float4 a part (cluster_norm_fits). Same rounding as
// stage_norm_vec: bf16(w * (x * inv)). part: shared float [k_cluster_rows]; red: shared float [k_threads / 32 *
// k_cluster_rows]. All threads of every block must call.
constexpr int k_cluster_rows = 4;
constexpr int k_cluster_per_thread = 1;  // float4 a thread holds of each row (two spilled at 80 registers)
constexpr int k_cluster_slice = k_cluster_per_thread * k_threads;

// Host: whether rows of K values split over a cluster of c blocks fit stage_norm_cluster (a.vec_norm assumed).
inline bool cluster_norm_fits(int m, int K, int c) {
    const int nkb = (K + 63) / 64;
    return c >= 2 && m <= k_cluster_rows && (nkb + c - 1) / c * 16 <= k_cluster_slice;
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ void stage_norm_cluster(const GemvArgs & a, int m, int n_pos, bf16 * dst, int stride, float * red, float * part,
                                                   bool pair_order) {
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    const int C = int(cluster.num_blocks()), r = int(cluster.block_rank());
    const int K = a.k, n4 = K / 4, nkb = (K + 63) / 64;
    const int f0 = r * nkb / C * 16, f1 = min((r + 1) * nkb / C * 16, n4);  // this block's float4 of each row
    const float4 * x4 = reinterpret_cast<const float4 *>(a.x);
    const uint2 * w4 = reinterpret_cast<const uint2 *>(a.norm_w);  // 4 bf16 per uint2
    // The part's values of every row in one batch of loads (through L1: read again below, after the barrier; holding
    // them over it spilled the ring's registers).
    auto load = [&](int t, int i4) { return i4 < f1 && t < m ? __ldg(x4 + size_t(t) * n4 + i4) : make_float4(0, 0, 0, 0); };
    float4 v[k_cluster_rows][k_cluster_per_thread];
#pragma unroll
    for (int u = 0; u < k_cluster_per_thread; u++) {
#pragma unroll
        for (int t = 0; t < k_cluster_rows; t++) v[t][u] = load(t, f0 + threadIdx.x + u * k_threads);
    }
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
    for (int t = 0; t < k_cluster_rows; t++) {
        float sq = 0;
#pragma unroll
        for (int u = 0; u < k_cluster_per_thread; u++) sq += v[t][u].x * v[t][u].x + v[t][u].y * v[t][u].y + v[t][u].z * v[t][u].z + v[t][u].w * v[t][u].w;
        sq = warp_sum(sq);
        if (lane == 0) red[warp * k_cluster_rows + t] = sq;
    }
    __syncthreads();
    if (threadIdx.x < k_cluster_rows) {
        float total = 0;
        for (int w = 0; w < k_threads / 32; w++) total += red[w * k_cluster_rows + threadIdx.x];
        part[threadIdx.x] = total;
    }
    cluster.sync();  // every block's sums are in its shared memory
    float inv[k_cluster_rows];
#pragma unroll
    for (int t = 0; t < k_cluster_rows; t++) {
        float total = 0;
        for (int z = 0; z < C; z++) total += cluster.map_shared_rank(part, z)[t];
        inv[t] = rsqrtf(total / K + a.eps);
    }
#pragma unroll
    for (int u = 0; u < k_cluster_per_thread; u++) {
        const int i4 = f0 + threadIdx.x + u * k_threads;
        if (i4 >= f1) continue;
        const uint2 nw = w4[i4];
#pragma unroll
        for (int t = 0; t < k_cluster_rows; t++) {
            if (t >= m) break;
            const float4 x = load(t, i4);
            for (int z = 0; z < C; z++) scale_store_norm(cluster.map_shared_rank(dst, z) + size_t(t) * stride, i4, x, nw, inv[t], pair_order);
        }
    }
    for (int t = 0; t < m; t++) {
        for (int i = K + threadIdx.x; i < n_pos; i += k_threads) dst[size_t(t) * stride + (pair_order ? b_pair_order(i) : i)] = __float2bfloat16(0.0f);
    }
    cluster.sync();  // every block's parts are in every block's rows; no block leaves while another reads its sums
}
#endif

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
