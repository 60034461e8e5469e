// The MoE router's logits for steps of more tokens than the GEMVs take, where moe_router_pays (ops.h,
// moe_router_logits): y fp32 [c, R] = x bf16 [c, H] W bf16 [R, H]^T, R the experts (+ 1: the shared expert's gate).
// cuBLASLt picked small-N kernels for this shape that took 23.7 us a layer in a decode step of 16 tokens
// (Qwen1.5-MoE-A2.7B, 61 x 2048 on an H200; 12 us at 64; 8% of the step), and 43 us alone at 8 tokens, for 250 KB of
// weights; this kernel 3.6 / 4.2 us a layer in those steps (bench/results/2026-12-01-h200-moe-router). Here block (r,
// tg) takes router row r for the T tokens of group tg: its threads cover the row's 16-byte chunks (one or two each for
// Qwen's hidden sizes), every load of a thread (its weight chunks, the same chunks of the T inputs) requested at once,
// fp32 sums per token, then a warp and a block reduction in a fixed order (deterministic). A first form, one warp a
// router row walking the row's chunks in turn (8 rows and 8 tokens a block: 16 blocks at 16 tokens), took 16-25 us: a
// round trip to memory per chunk, on 16 SMs.
#include "backends/cuda/common.cuh"
#include "backends/cuda/ops.h"
#include "core/check.h"

namespace qinfer::cuda {
namespace {

constexpr int k_router_threads = 256;
constexpr int k_router_tokens = 8;  // tokens a block
constexpr int k_router_chunks = 2;  // 16-byte chunks a thread: hidden sizes up to 4096 in one pass

__global__ void __launch_bounds__(k_router_threads) router_logits_kernel(const bf16 * x, int c, int H, const bf16 * w, int R, float * y) {
    __shared__ float part[k_router_threads / 32][k_router_tokens];
    const int r = blockIdx.x, t0 = blockIdx.y * k_router_tokens, tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int chunks = H / 8, nt = min(k_router_tokens, c - t0);
    const uint4 * wr = reinterpret_cast<const uint4 *>(w + size_t(r) * H);
    const uint4 * xr = reinterpret_cast<const uint4 *>(x + size_t(t0) * H);
    float acc[k_router_tokens] = {};
    for (int ch0 = tid; ch0 < chunks; ch0 += k_router_chunks * k_router_threads) {
        uint4 wv[k_router_chunks];
#pragma unroll
        for (int u = 0; u < k_router_chunks; u++) {  // the weights do not depend on the kernel ahead
            const int ch = ch0 + u * k_router_threads;
            wv[u] = ch < chunks ? wr[ch] : make_uint4(0, 0, 0, 0);
        }
        if (ch0 == tid) pdl_wait();
        uint4 xv[k_router_chunks][k_router_tokens];
#pragma unroll
        for (int u = 0; u < k_router_chunks; u++) {
            const int ch = ch0 + u * k_router_threads;
#pragma unroll
            for (int t = 0; t < k_router_tokens; t++) xv[u][t] = ch < chunks && t < nt ? xr[size_t(t) * chunks + ch] : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < k_router_chunks; u++) {
#pragma unroll
            for (int t = 0; t < k_router_tokens; t++) acc[t] += dot8(wv[u], xv[u][t]);
        }
    }
    if (tid >= chunks) pdl_wait();  // threads without a chunk (hidden under 2048) wait too
#pragma unroll
    for (int t = 0; t < k_router_tokens; t++) acc[t] = warp_sum(acc[t]);
    if (lane == 0) {
#pragma unroll
        for (int t = 0; t < k_router_tokens; t++) part[warp][t] = acc[t];
    }
    __syncthreads();
    if (tid < nt) {
        float v = 0;
#pragma unroll
        for (int wi = 0; wi < k_router_threads / 32; wi++) v += part[wi][tid];
        y[size_t(t0 + tid) * R + r] = v;
    }
}

}  // namespace

// Where the kernel beat cuBLASLt alone on an H200 (`CudaMoeRouter.Timings`, bench/results/2026-12-01-h200-moe-router,
// call 3): its time grows with the inputs it reads again for each router row (c R), cuBLASLt's stays at 6-15 us past
// 16 tokens. Qwen1.5-MoE-A2.7B (61 rows) 3.9 / 4.1 / 5.5 / 8.9 us at 5 / 16 / 64 / 128 tokens against 10.6 / 13.7 /
// 12.7 / 13.0, 14.8 against 12.9 at 256; Qwen3-30B-A3B (128 rows) 5.5 against 7.7 at 32, 9.1 against 7.1 at 64;
// Qwen2-57B-A14B (65 rows) 6.0 / 9.8 against 11.9 / 12.0 at 64 / 128, 16.8 against 15.3 at 256.
bool moe_router_pays(int c, int R) { return int64_t(c) * R < 8192; }

bool moe_router_applies(const bf16 * x, int H, const bf16 * w) {
    return H % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(w) % 16 == 0;
}

void moe_router_logits(const bf16 * x, int c, int H, const bf16 * w, int R, float * y, cudaStream_t stream) {
    QINFER_CHECK(moe_router_applies(x, H, w)) << "MoE router: hidden " << H << " and 16-byte aligned rows";
    QINFER_CHECK(c >= 1 && R >= 1) << "MoE router: " << c << " tokens, " << R << " rows";
    const dim3 grid(R, (c + k_router_tokens - 1) / k_router_tokens);
    launch_kernel(router_logits_kernel, grid, dim3(k_router_threads), 0, stream, x, c, H, w, R, y);
}

}  // namespace qinfer::cuda
