// The MoE router's logits for steps of a few to a few hundred tokens (ops.h, moe_router_logits): y fp32 [c, R] =
// x bf16 [c, H] W bf16 [R, H]^T, R the experts (+ 1: the shared expert's gate). cuBLASLt picked small-N kernels for
// this shape that took 23.7 us a layer at 16 tokens (Qwen1.5-MoE-A2.7B, 61 x 2048 on an H200; 12 us at 64), a third of
// a decode step's routed-expert time, for 250 KB of weights (bench/results/2026-12-01-h200-moe-router, call 1).
// Here warp w of block (b, tg) takes router row 8 b + w for the T tokens of group tg: each lane reads 16-byte chunks of
// its row (lane, lane + 32, ...) and the same chunks of the T inputs (L1/L2 hits after the first warp), fp32 sums per
// token, then a warp reduction; every output is one warp's, in a fixed order (deterministic).
#include "backends/cuda/common.cuh"
#include "backends/cuda/ops.h"
#include "core/check.h"

namespace qinfer::cuda {
namespace {

constexpr int k_router_warps = 8;  // router rows a block
constexpr int k_router_tokens = 8;  // tokens a block

__device__ __forceinline__ float dot8(const uint4 & a, const uint4 & b) {
    const __nv_bfloat162 * pa = reinterpret_cast<const __nv_bfloat162 *>(&a);
    const __nv_bfloat162 * pb = reinterpret_cast<const __nv_bfloat162 *>(&b);
    float s = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float2 fa = __bfloat1622float2(pa[i]), fb = __bfloat1622float2(pb[i]);
        s = fmaf(fa.x, fb.x, s);
        s = fmaf(fa.y, fb.y, s);
    }
    return s;
}

__global__ void __launch_bounds__(k_router_warps * 32) router_logits_kernel(const bf16 * x, int c, int H, const bf16 * w, int R, float * y) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int r = blockIdx.x * k_router_warps + warp, t0 = blockIdx.y * k_router_tokens;
    const int chunks = H / 8;
    const uint4 * wr = reinterpret_cast<const uint4 *>(w + size_t(min(r, R - 1)) * H);
    // The row's first chunks do not depend on the kernel ahead: requested before waiting for it.
    uint4 w0 = lane < chunks ? wr[lane] : make_uint4(0, 0, 0, 0);
    pdl_wait();
    if (r >= R) return;
    const int nt = min(k_router_tokens, c - t0);
    const uint4 * xr = reinterpret_cast<const uint4 *>(x + size_t(t0) * H);
    float acc[k_router_tokens] = {};
    for (int ch = lane; ch < chunks; ch += 32) {
        const uint4 wv = ch == lane ? w0 : wr[ch];
#pragma unroll
        for (int t = 0; t < k_router_tokens; t++) {
            if (t < nt) acc[t] += dot8(wv, xr[size_t(t) * chunks + ch]);
        }
    }
#pragma unroll
    for (int t = 0; t < k_router_tokens; t++) acc[t] = warp_sum(acc[t]);
    if (lane < nt) {
        float v = 0;
#pragma unroll
        for (int t = 0; t < k_router_tokens; t++) v = lane == t ? acc[t] : v;
        y[size_t(t0 + lane) * R + r] = v;
    }
}

}  // namespace

bool moe_router_applies(const bf16 * x, int H, const bf16 * w) {
    return H % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(w) % 16 == 0;
}

void moe_router_logits(const bf16 * x, int c, int H, const bf16 * w, int R, float * y, cudaStream_t stream) {
    QINFER_CHECK(moe_router_applies(x, H, w)) << "MoE router: hidden " << H << " and 16-byte aligned rows";
    QINFER_CHECK(c >= 1 && R >= 1) << "MoE router: " << c << " tokens, " << R << " rows";
    const dim3 grid((R + k_router_warps - 1) / k_router_warps, (c + k_router_tokens - 1) / k_router_tokens);
    launch_kernel(router_logits_kernel, grid, dim3(k_router_warps * 32), 0, stream, x, c, H, w, R, y);
}

}  // namespace qinfer::cuda
