// Staging a GEMV input row in shared memory for the quantized kernels: RMSNorm (rounded to bf16, as the unquantized
// path does) or bf16, gathered in act-order, in one pass of global loads when the row fits in registers.
#pragma once

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

}  // namespace qinfer::cuda::qstage
