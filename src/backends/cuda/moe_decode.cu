// The routed bf16 experts of a decode step (ops.h, moe_decode) in two launches and no grouping, where they took four:
// the routing and grouping kernel, two grouped GEMVs (removed) and the combine (moe.cu):
//   1. gate/up: a block per (assignment, 16 intermediate features); each block routes its token first (one warp, the
//      routing of moe.cu's kernels), so no kernel runs between the router and the experts. In a trace of
//      Qwen3-30B-A3B's decode step on an H200 this launch took 15.7 us a layer against 15.0 + 3.5 for the grouped
//      GEMV and the routing kernel. Given the residual (MoeDecode::norm), the block also stages its token's RMSNorm in
//      shared memory (float4 batches, qstage::stage_norm_vec), so no RMSNorm kernel runs ahead of the router. Against
//      the two-pass staging (an H200, alternated twice, bench/results/2026-12-03-h200-moe-prologue): Qwen1.5-MoE-A2.7B
//      BF16 586.4 -> 588.7 tok/s, Qwen3-30B-A3B BF16 level.
//      One token with MoeDecode::router_w: the router's logits come from this launch too. Blocks 0 .. router rows - 1
//      (in launch order, so they are given SMs before any other block of the grid) each dot one router row with the
//      token's input (its weights requested before pdl_wait), store the logit and count it in; every block waits for
//      the count before routing, so no router kernel runs between the residual's producer and the experts.
//   2. down: a block per (assignment, 32 output features), each warp four rows with every load in flight; where the
//      caller gives x (no shared expert to wait for), the block of a token's feature tile that finishes last adds the
//      token's top_k rows into x in moe_combine's order, so no combine kernel. Given MoeDecode::ids_ready (one token),
//      the blocks take their expert before pdl_wait and request the first two chunks of each row while the gate/up
//      launch still runs (Qwen3-30B-A3B BF16 +0.5% on an H200; with a shared expert beside it lost 3.2%: the caller
//      decides, model/qwen_cuda_moe.cpp).
#include <algorithm>
#include <climits>

#include "backends/cuda/common.cuh"
#include "backends/cuda/moe_route.cuh"
#include "backends/cuda/ops.h"
#include "backends/cuda/qstage.cuh"

namespace qinfer::cuda {
namespace {

constexpr int k_warps = 8;
constexpr int k_rows = 4;                            // weight rows a warp
constexpr int k_gu_out = k_rows / 2;                 // gate/up: two gate rows and the matching two up rows a warp
constexpr int k_dn_out = k_rows;                     // down: four output features a warp
constexpr int k_gu_per_block = k_warps * k_gu_out;   // 16 intermediate features
constexpr int k_dn_per_block = k_warps * k_dn_out;   // 32 output features: a combine tile

struct DecodeArgs {
    MoeDecode m;
    const bf16 * xn = nullptr;  // [c, hidden]
    bf16 * act = nullptr;       // [c top_k, inter]
    bf16 * out = nullptr;       // [c top_k, hidden]
    float * x = nullptr;        // [c, hidden], or null: no combine here
    bool accumulate = false;
};

// R weight rows (pointers at the row's first chunk) dotted with one input row over chunks [first, chunks) of 16 bytes,
// added to acc, the lanes 32 chunks apart, every load of a pass in flight; each lane ends with the full sums (warp_sum).
template <int R> __device__ __forceinline__ void dot_rows(const uint4 * const (&w)[R], const uint4 * x, int chunks, float (&acc)[R], int first = 0) {
    const int lane = threadIdx.x % 32;
#pragma unroll 4
    for (int c = first + lane; c < chunks; c += 32) {
        const uint4 xv = x[c];
#pragma unroll
        for (int r = 0; r < R; r++) acc[r] += dot8(load_stream(w[r] + c), xv);
    }
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = warp_sum(acc[r]);
}

// The router's logits of one token in the gate/up launch (MoeDecode::router_w): block b < router_rows (launch order)
// dots router row b with xrow in fp32 (chunks a thread, then warps, then the block's warps in order), stores the
// logit and counts it in; then every block waits until all router_rows are counted.
constexpr int k_router_chunks = 4;  // 16-byte chunks of a router row a thread: hidden <= 8192
__device__ __forceinline__ void router_logits_in_block(const MoeDecode & m, int row, const uint4 (&w)[k_router_chunks], const uint4 * xrow,
                                                       float * red) {
    const int chunks = m.experts.hidden / 8, lane = threadIdx.x % 32;
    if (row < m.router_rows) {
        float acc = 0;
#pragma unroll
        for (int u = 0; u < k_router_chunks; u++) {
            const int c = threadIdx.x + u * k_warps * 32;
            if (c < chunks) acc += dot8(w[u], xrow[c]);
        }
        acc = warp_sum(acc);
        if (lane == 0) red[threadIdx.x / 32] = acc;
        __syncthreads();
        if (threadIdx.x == 0) {
            float s = 0;
            for (int i = 0; i < k_warps; i++) s += red[i];
            m.logits[row] = s;
            __threadfence();
            atomicAdd(m.router_count, 1);
        }
    }
    if (threadIdx.x == 0) {
        while (load_acquire(m.router_count) < m.router_rows) __nanosleep(64);
    }
    __syncthreads();
}

__global__ void __launch_bounds__(k_warps * 32) gate_up_kernel(DecodeArgs a) {
    const MoeDecode & m = a.m;
    const int H = m.experts.hidden, I = m.experts.inter, k = m.top_k;
    const int p = blockIdx.y, t = p / k, j = p % k;  // assignment p: token t's j-th expert
    // m.router_w: this block's router row (launch order), its weights requested ahead of the kernel before this one.
    const int router_row = m.router_w ? int(blockIdx.y * gridDim.x + blockIdx.x) : INT_MAX;
    uint4 rw[k_router_chunks];
    if (router_row < m.router_rows) {
        const uint4 * wr = reinterpret_cast<const uint4 *>(m.router_w + size_t(router_row) * H);
#pragma unroll
        for (int u = 0; u < k_router_chunks; u++) {
            const int c = threadIdx.x + u * k_warps * 32;
            rw[u] = c < H / 8 ? load_stream_pinned(wr + c) : make_uint4(0, 0, 0, 0);
        }
    }
    pdl_wait();
    __shared__ int ids[k_moe_max_topk];
    __shared__ float weights[k_moe_max_topk];
    __shared__ float norm_red[k_warps];
    __shared__ float logits[k_moe_max_experts];
    extern __shared__ uint4 xs[];  // m.norm.x: the token's normalised row, bf16 [H]
    if (!m.router_w && threadIdx.x < 32) route_token(m.logits + size_t(t) * m.stride, m.experts.n_experts, k, m.renormalise, ids, weights);
    const uint4 * xrow = reinterpret_cast<const uint4 *>(a.xn + size_t(t) * H);
    if (m.norm.x) {
        bf16 * xb = reinterpret_cast<bf16 *>(xs);
        qstage::stage_norm_vec<4>(qstage::norm_args(m.norm, H), t, H, H, xb, norm_red);
        xrow = xs;
    }
    __syncthreads();
    if (m.router_w) {
        router_logits_in_block(m, router_row, rw, xrow, norm_red);
        if (threadIdx.x < 32) {
            // From L2: the logits were stored by other blocks of this launch, after any copy this SM's L1 may hold.
            for (int e = threadIdx.x; e < m.experts.n_experts; e += 32) logits[e] = __ldcg(m.logits + e);
            __syncwarp();
            route_token(logits, m.experts.n_experts, k, m.renormalise, ids, weights);
        }
        __syncthreads();
    }
    if (blockIdx.x == 0 && j == 0) {
        if (threadIdx.x < k) {
            m.ids[size_t(t) * k + threadIdx.x] = ids[threadIdx.x];
            m.weights[size_t(t) * k + threadIdx.x] = weights[threadIdx.x];
        }
        if (m.ids_ready) publish_ids(m.ids_ready);
    }
    const int f0 = (blockIdx.x * k_warps + threadIdx.x / 32) * k_gu_out;
    if (f0 >= I) return;
    const bf16 * w = m.experts.gate_up + int64_t(ids[j]) * 2 * I * H;  // the expert's gate rows, then its up rows
    const uint4 * rows[k_rows];
#pragma unroll
    for (int r = 0; r < k_rows; r++) {
        const int row = min(f0 + r % k_gu_out, I - 1);  // rows past I read a valid row, and are not written
        rows[r] = reinterpret_cast<const uint4 *>(w + int64_t(row + (r >= k_gu_out ? I : 0)) * H);
    }
    float acc[k_rows] = {};
    dot_rows(rows, xrow, H / 8, acc);
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int r = 0; r < k_gu_out; r++) {
        if (lane != r || f0 + r >= I) continue;
        // As transformers rounds: gate and up to bf16 (the projection's output), then silu(gate) * up.
        const float v = silu(__bfloat162float(__float2bfloat16(acc[r]))) * __bfloat162float(__float2bfloat16(acc[k_gu_out + r]));
        a.act[size_t(p) * I + f0 + r] = __float2bfloat16(v);
    }
}

// EARLY (m.ids_ready): the block takes its expert before pdl_wait and requests the first k_dn_early chunks of each of
// its warps' rows into registers, while the gate/up launch still runs; held to 64 registers (four blocks an SM, as the
// other form takes unbounded).
constexpr int k_dn_early = 2;
template <bool EARLY> __global__ void __launch_bounds__(k_warps * 32, EARLY ? 4 : 0) down_kernel(DecodeArgs a) {
    const MoeDecode & m = a.m;
    const int H = m.experts.hidden, I = m.experts.inter, k = m.top_k, chunks = I / 8;
    const int p = blockIdx.y, t = p / k, lane = threadIdx.x % 32;
    const int f0 = (blockIdx.x * k_warps + threadIdx.x / 32) * k_dn_out;
    const uint4 * rows[k_rows];
    auto find_rows = [&](int expert) {  // the warp's rows of the expert's down matrix (rows past H read row H - 1)
        const bf16 * w = m.experts.down + int64_t(expert) * H * I;
#pragma unroll
        for (int r = 0; r < k_rows; r++) rows[r] = reinterpret_cast<const uint4 *>(w + int64_t(min(f0 + r, H - 1)) * I);
    };
    uint4 early[k_rows][k_dn_early];
    if constexpr (EARLY) {
        find_rows(take_id(m.ids_ready, m.ids, p));
#pragma unroll
        for (int r = 0; r < k_rows; r++) {
#pragma unroll
            for (int u = 0; u < k_dn_early; u++) {
                const int c = lane + 32 * u;
                early[r][u] = f0 < H && c < chunks ? load_stream_pinned(rows[r] + c) : make_uint4(0, 0, 0, 0);
            }
        }
    }
    pdl_wait();
    // The gate/up launch is over (pdl_wait): its router count goes back to zero for the next one.
    if (m.router_w && blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) *m.router_count = 0;
    if (f0 < H) {
        const uint4 * x = reinterpret_cast<const uint4 *>(a.act + size_t(p) * I);
        float acc[k_rows] = {};
        if constexpr (EARLY) {
#pragma unroll
            for (int u = 0; u < k_dn_early; u++) {
                const int c = lane + 32 * u;
                if (c >= chunks) break;
                const uint4 xv = x[c];
#pragma unroll
                for (int r = 0; r < k_rows; r++) acc[r] += dot8(early[r][u], xv);
            }
        } else {
            find_rows(m.ids[p]);
        }
        dot_rows(rows, x, chunks, acc, EARLY ? 32 * k_dn_early : 0);
#pragma unroll
        for (int r = 0; r < k_rows; r++) {
            if (lane == r && f0 + r < H) a.out[size_t(p) * H + f0 + r] = __float2bfloat16(acc[r]);
        }
    }
    if (!a.x) return;
    // The tile's k blocks meet at a counter: the last one in (its rows, and the others' made visible by the fences)
    // adds them up and leaves the counter at zero for the next launch.
    __shared__ bool last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        int * arrived = m.arrivals + size_t(t) * gridDim.x + blockIdx.x;
        last = atomicAdd(arrived, 1) == k - 1;
        if (last) *arrived = 0;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    const int f = blockIdx.x * k_dn_per_block + threadIdx.x;
    if (threadIdx.x >= k_dn_per_block || f >= H) return;
    float * xp = a.x + size_t(t) * H + f;
    float v = a.accumulate ? *xp : 0.0f;
    for (int jj = 0; jj < k; jj++) {
        v += m.weights[size_t(t) * k + jj] * __bfloat162float(__ldcg(a.out + (size_t(t) * k + jj) * H + f));
    }
    *xp = v;
}

}  // namespace

bool moe_decode_applies(int n_experts, int top_k, int hidden, int inter) {
    return n_experts >= 1 && n_experts <= k_moe_max_experts && top_k >= 1 && top_k <= std::min(k_moe_max_topk, n_experts) && hidden % 8 == 0 &&
           inter % 8 == 0 && inter > 0;
}

bool moe_decode_router_applies(int c, int router_rows, int n_experts, int hidden) {
    return c == 1 && router_rows >= n_experts && router_rows <= k_moe_max_experts + 1 && hidden <= k_router_chunks * k_warps * 32 * 8;
}

size_t moe_decode_arrivals(int c, int hidden) { return size_t(c) * ((hidden + k_dn_per_block - 1) / k_dn_per_block); }

void moe_decode(const bf16 * xn, int c, const MoeDecode & m, bf16 * act, bf16 * out, float * x, bool accumulate, cudaStream_t stream) {
    const MoeExperts & w = m.experts;
    QINFER_CHECK(moe_decode_applies(w.n_experts, m.top_k, w.hidden, w.inter))
        << "MoE decode: " << w.n_experts << " experts, top-" << m.top_k << ", hidden " << w.hidden << ", intermediate " << w.inter;
    QINFER_CHECK(c >= 1 && c <= k_moe_gemv_max_tokens) << "MoE decode: " << c << " tokens (at most " << k_moe_gemv_max_tokens << ")";
    QINFER_CHECK(!x || m.arrivals) << "MoE decode: the combine needs its counters";
    DecodeArgs a;
    a.m = m;
    a.xn = xn;
    a.act = act;
    a.out = out;
    a.x = x;
    a.accumulate = accumulate;
    QINFER_CHECK(!m.norm.x || qstage::vec_norm_ok(qstage::norm_args(m.norm, w.hidden)))
        << "MoE decode: the residual or norm weights are not aligned for 16-byte loads";
    const int assignments = c * m.top_k;
    const size_t xs_bytes = m.norm.x ? size_t(w.hidden) * sizeof(bf16) : 0;
    if (m.norm.x) {
        QINFER_CHECK(xs_bytes <= 48 * 1024) << "MoE decode: a normalised row of " << w.hidden << " values does not fit in shared memory";
    }
    int gu_tiles = (w.inter + k_gu_per_block - 1) / k_gu_per_block;
    if (m.router_w) {
        QINFER_CHECK(moe_decode_router_applies(c, m.router_rows, w.n_experts, w.hidden) && m.router_count)
            << "MoE decode: the router in the gate/up launch takes one token, " << w.n_experts << "..." << k_moe_max_experts + 1
            << " router rows and hidden <= " << k_router_chunks * k_warps * 32 * 8 << " (got " << c << " tokens, " << m.router_rows
            << " rows, hidden " << w.hidden << ")";
        gu_tiles = std::max(gu_tiles, (m.router_rows + assignments - 1) / assignments);  // a block for every router row
    }
    launch_kernel(gate_up_kernel, dim3(gu_tiles, assignments), dim3(k_warps * 32), xs_bytes, stream, a);
    QINFER_CHECK(!m.ids_ready || c == 1) << "MoE decode: the routing is handed early for one token only";
    const dim3 dn_grid((w.hidden + k_dn_per_block - 1) / k_dn_per_block, assignments);
    if (m.ids_ready) launch_kernel(down_kernel<true>, dn_grid, dim3(k_warps * 32), 0, stream, a);
    else launch_kernel(down_kernel<false>, dn_grid, dim3(k_warps * 32), 0, stream, a);
}

}  // namespace qinfer::cuda
