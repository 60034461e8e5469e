// Mixture-of-experts kernels (ops.h, "mixture of experts"): routing on the device (softmax, top-k, optional
// renormalisation), the token-expert assignments grouped by expert, the routed experts' SwiGLU MLPs in two launches
// over all experts (grouped tensor-core GEMMs; SiLU-mul in the gate/up epilogue; decode steps take moe_decode.cu's
// GEMVs instead), and the weighted combine into the residual stream. Nothing here goes through the host, so a MoE
// decode step can be captured in a graph.
#include <algorithm>
#include <climits>

#include "backends/cuda/common.cuh"
#include "backends/cuda/moe_gemm.cuh"
#include "backends/cuda/moe_route.cuh"
#include "backends/cuda/moe_tiles.cuh"
#include "backends/cuda/moe_wgmma.h"
#include "backends/cuda/ops.h"

namespace qinfer::cuda {
namespace {

constexpr int k_route_warps = 4;

__global__ void __launch_bounds__(k_route_warps * 32) route_kernel(const float * logits, int stride, int c, int E, int k, bool renormalise,
                                                                   int * ids, float * weights) {
    pdl_wait();
    const int t = blockIdx.x * k_route_warps + threadIdx.x / 32;
    if (t >= c) return;
    route_token(logits + size_t(t) * stride, E, k, renormalise, ids + size_t(t) * k, weights + size_t(t) * k);
}

// Block-wide exclusive prefix sum of one value per thread (blockDim.x == THREADS); `scratch` holds THREADS / 32 ints.
template <int THREADS> __device__ __forceinline__ int block_exclusive_sum(int v, int * scratch, int * total) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    int incl = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int u = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += u;
    }
    if (lane == 31) scratch[warp] = incl;
    __syncthreads();
    int before = 0, all = 0;
#pragma unroll
    for (int w = 0; w < THREADS / 32; w++) {
        before += w < warp ? scratch[w] : 0;
        all += scratch[w];
    }
    __syncthreads();
    *total = all;
    return before + incl - v;
}

// A small step in one block (c top_k <= k_small_assignments, E <= the block's threads): every warp routes tokens,
// then each expert's count, offset and tile offset come from one prefix sum, and each assignment finds its sorted row
// as its expert's offset plus the earlier assignments to the same expert (the same stable order as group_kernel):
// those in its own warp of assignments by __match_any_sync, those of earlier warps from their per-warp counts. Against
// 256 threads with a serial scan of all earlier assignments: 14.8 -> 10.1 us a layer at 64 tokens (Qwen1.5-MoE-A2.7B
// on an H200, bench/results/2026-12-01-h200-moe-router, call 3).
constexpr int k_small_threads = 1024;
constexpr int k_small_assignments = 256;
static_assert(k_small_threads >= k_moe_max_experts && k_small_threads >= k_small_assignments, "one thread per expert and per assignment");
__global__ void __launch_bounds__(k_small_threads) route_group_small_kernel(const float * logits, int stride, int c, int E, int k,
                                                                            bool renormalise, int tile_rows, int * ids, float * weights,
                                                                            int * offsets, int * tiles, int * token_of, int * slot_of) {
    constexpr int k_assign_warps = k_small_assignments / 32;
    pdl_wait();
    __shared__ int sids[k_small_assignments];
    __shared__ int count[k_moe_max_experts], first[k_moe_max_experts];
    __shared__ int warp_count[k_assign_warps][k_moe_max_experts];  // assignments to each expert in each warp of them
    __shared__ int scratch[k_small_threads / 32];
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, n = c * k;
    for (int t = warp; t < c; t += k_small_threads / 32) {
        route_token(logits + size_t(t) * stride, E, k, renormalise, sids + t * k, weights + size_t(t) * k);
    }
    if (tid < k_moe_max_experts) count[tid] = 0;
    for (int i = tid; i < k_assign_warps * k_moe_max_experts; i += k_small_threads) (&warp_count[0][0])[i] = 0;
    __syncthreads();
    int e = -1, rank = 0;
    if (tid < n) {
        e = sids[tid];
        ids[tid] = e;
        atomicAdd(&count[e], 1);
    }
    if (warp < k_assign_warps) {  // whole warps: lanes past n hold e = -1 and match only each other
        const unsigned same = __match_any_sync(0xffffffffu, e);
        rank = __popc(same & ((1u << lane) - 1u));
        if (e >= 0 && rank == 0) warp_count[warp][e] = __popc(same);
    }
    __syncthreads();
    const int mine = tid < E ? count[tid] : 0;
    int total = 0;
    const int off = block_exclusive_sum<k_small_threads>(mine, scratch, &total);
    const int tl = block_exclusive_sum<k_small_threads>((mine + tile_rows - 1) / tile_rows, scratch, &total);
    if (tid < E) {
        first[tid] = off;
        offsets[tid] = off;
        tiles[tid] = tl;
    }
    if (tid == E - 1) {
        offsets[E] = off + mine;
        tiles[E] = total;
    }
    __syncthreads();
    if (tid < n) {
        int p = first[e] + rank;
        for (int w = 0; w < warp; w++) p += warp_count[w][e];
        token_of[p] = tid / k;
        slot_of[tid] = p;
    }
}

constexpr int k_group_threads = 256;

// One block per expert: every block counts all n assignments per expert (shared atomics), takes its expert's offset
// and tile offset from the counts of the experts before it, then lists its assignments in order (a stable sort).
__global__ void __launch_bounds__(k_group_threads) group_kernel(const int * ids, int n, int E, int k, int tile_rows, int * offsets, int * tiles,
                                                                int * token_of, int * slot_of) {
    pdl_wait();
    __shared__ int hist[k_moe_max_experts];
    __shared__ int warp_counts[k_group_threads / 32];
    __shared__ int start;
    const int e = blockIdx.x, tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    for (int i = tid; i < E; i += k_group_threads) hist[i] = 0;
    __syncthreads();
    for (int i = tid; i < n; i += k_group_threads) atomicAdd(&hist[ids[i]], 1);
    __syncthreads();
    if (tid == 0) {
        int off = 0, tl = 0;
        for (int j = 0; j < e; j++) {
            off += hist[j];
            tl += (hist[j] + tile_rows - 1) / tile_rows;
        }
        offsets[e] = off;
        tiles[e] = tl;
        if (e == E - 1) {
            offsets[E] = off + hist[e];
            tiles[E] = tl + (hist[e] + tile_rows - 1) / tile_rows;
        }
        start = off;
    }
    __syncthreads();
    if (hist[e] == 0) return;
    int base = start;
    for (int from = 0; from < n; from += k_group_threads) {
        const int i = from + tid;
        const bool mine = i < n && ids[i] == e;
        const unsigned ballot = __ballot_sync(0xffffffffu, mine);
        if (lane == 0) warp_counts[warp] = __popc(ballot);
        __syncthreads();
        int before = 0, total = 0;
#pragma unroll
        for (int w = 0; w < k_group_threads / 32; w++) {
            before += w < warp ? warp_counts[w] : 0;
            total += warp_counts[w];
        }
        if (mine) {
            const int p = base + before + __popc(ballot & ((1u << lane) - 1));
            token_of[p] = i / k;
            slot_of[i] = p;
        }
        base += total;
        __syncthreads();
    }
}

// ---- grouped GEMM: y[p, :] = x[row(p), :] W_e^T for the sorted rows p of every expert e ----
// Tokens are the A operand of mma.m16n8k16 (rows of x, gathered through token_of), weight rows the B operand (W_e
// row-major [rows, K] is B in "col" layout). Tiles of BM rows x BN weight rows, K in steps of BK through a STAGES-deep
// cp.async ring, fragments by ldmatrix, fp32 accumulation. Each block finds its (expert, row tile) in `tiles`; blocks
// beyond the step's tiles leave at once (the grid is sized for the worst case, so it does not depend on the routing).
using namespace moe_mma;

template <int BM, int BN, int WM, int WN, int STAGES, int BK> constexpr size_t gemm_smem() {
    const size_t ring = size_t(STAGES) * (BM + BN) * stage_row<BK>() * sizeof(bf16), out = size_t(BM) * (BN + 4) * sizeof(float);
    return ring > out ? ring : out;
}

template <int BM, int BN, int WM, int WN, int STAGES, int BK, bool SWIGLU>
__global__ void __launch_bounds__(WM * WN * 32) moe_gemm_kernel(GemmArgs a) {
    constexpr int k_bk = BK, k_row = stage_row<BK>();
    constexpr int threads = WM * WN * 32, TM = BM / WM, TN = BN / WN, MT = TM / 16, NT = TN / 8;
    static_assert(TM % 16 == 0 && TN % 8 == 0 && (NT == 1 || NT % 2 == 0), "warp tile");
    extern __shared__ __align__(16) unsigned char smem[];
    bf16 * As = reinterpret_cast<bf16 *>(smem);                  // [STAGES][BM][k_row]
    bf16 * Bs = As + size_t(STAGES) * BM * k_row;                // [STAGES][BN][k_row]
    __shared__ int a_rows[BM];                                   // x's row of each tile row (-1: none)
    __shared__ int b_rows[BN];                                   // weight row of each tile column (-1: none)
    pdl_wait();
    MoeTile tile;
    if (!moe_tile_of(a.tiles, a.offsets, a.E, int(blockIdx.y), BM, tile)) return;
    const int e = tile.expert, row0 = tile.row0, rows = tile.rows;
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, wm = warp / WN, wn = warp % WN;
    const int f0 = blockIdx.x * (SWIGLU ? BN / 2 : BN);  // first output feature
    for (int r = tid; r < BM; r += threads) a_rows[r] = r < rows ? (a.token_of ? a.token_of[row0 + r] : row0 + r) : -1;
    for (int r = tid; r < BN; r += threads) {
        int f = f0 + r, wr = f;
        if constexpr (SWIGLU) {
            f = f0 + r % (BN / 2);
            wr = r < BN / 2 ? f : a.n + f;
        }
        b_rows[r] = f < a.n ? wr : -1;
    }
    __syncthreads();
    const bf16 * w = a.w + int64_t(e) * a.w_stride;
    const int nk = (a.k + k_bk - 1) / k_bk;
    // Each thread copies one fixed 16-byte column of fixed rows (threads / cpr apart) of every stage, their sources
    // found once here: a stage's copies are then an add and a cp.async each. On an H200 (same call, alternated twice;
    // bench/results/2026-12-03-h200-moe-beside-lean, call 2) Qwen1.5-MoE-A2.7B BF16 decoded 2,319.65 / 2,315.14 ->
    // 2,387.98 / 2,379.56 tok/s at batch 16 and 5,556.47 / 5,562.31 -> 5,710.53 / 5,711.21 at 64 with it, against
    // each chunk's row, column, source row (a shared-memory lookup) and bounds computed anew in every stage (call 1's
    // ncu: integer instructions 55% of those executed, HMMA 2.5%).
    constexpr int cpr = k_bk / 8, rpp = threads / cpr;  // 16-byte chunks a stage row, rows a pass of the threads
    static_assert(threads % cpr == 0 && BN % rpp == 0, "stage rows");
    constexpr int a_passes = (BM + rpp - 1) / rpp, b_passes = BN / rpp;
    const int col = (tid % cpr) * 8, r0 = tid / cpr;
    const bf16 * a_src[a_passes];  // null: no token row (zeros)
    const bf16 * b_src[b_passes];  // null: past the output features (zeros)
#pragma unroll
    for (int i = 0; i < a_passes; i++) {
        const int src = r0 + i * rpp < BM ? a_rows[r0 + i * rpp] : -1;
        a_src[i] = src >= 0 ? a.x + int64_t(src) * a.k + col : nullptr;
    }
#pragma unroll
    for (int i = 0; i < b_passes; i++) {
        const int src = b_rows[r0 + i * rpp];
        b_src[i] = src >= 0 ? w + int64_t(src) * a.k + col : nullptr;
    }
    auto load = [&](int stage, int kb) {
        const int kk = kb * k_bk;
        const bool k_ok = kk + col < a.k;
        bf16 * as = As + size_t(stage) * BM * k_row + r0 * k_row + col;
        bf16 * bs = Bs + size_t(stage) * BN * k_row + r0 * k_row + col;
#pragma unroll
        for (int i = 0; i < a_passes; i++) {
            if (r0 + i * rpp >= BM) break;
            const bool ok = a_src[i] && k_ok;
            cp_async16(as + i * rpp * k_row, ok ? a_src[i] + kk : a.x, ok);
        }
#pragma unroll
        for (int i = 0; i < b_passes; i++) {
            const bool ok = b_src[i] && k_ok;
            cp_async16(bs + i * rpp * k_row, ok ? b_src[i] + kk : w, ok);
        }
    };
    float acc[MT][NT][4] = {};
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < nk) load(s, s);
        cp_async_commit();
    }
    for (int kb = 0; kb < nk; kb++) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        if (kb + STAGES - 1 < nk) load((kb + STAGES - 1) % STAGES, kb + STAGES - 1);
        cp_async_commit();
        const bf16 * as = As + size_t(kb % STAGES) * BM * k_row;
        const bf16 * bs = Bs + size_t(kb % STAGES) * BN * k_row;
#pragma unroll
        for (int ks = 0; ks < k_bk / 16; ks++) {
            uint32_t af[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                ldmatrix_x4(af[mt], as + (wm * TM + mt * 16 + lane % 16) * k_row + ks * 16 + (lane / 16) * 8);
            }
            uint32_t bfr[NT][2];
            if constexpr (NT == 1) {
                ldmatrix_x2(bfr[0], bs + (wn * TN + lane % 8) * k_row + ks * 16 + ((lane / 8) % 2) * 8);
            } else {
#pragma unroll
                for (int nt = 0; nt < NT; nt += 2) {
                    uint32_t r[4];
                    ldmatrix_x4(r, bs + (wn * TN + nt * 8 + lane % 8 + (lane / 16) * 8) * k_row + ks * 16 + ((lane / 8) % 2) * 8);
                    bfr[nt][0] = r[0];
                    bfr[nt][1] = r[1];
                    bfr[nt + 1][0] = r[2];
                    bfr[nt + 1][1] = r[3];
                }
            }
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
#pragma unroll
                for (int nt = 0; nt < NT; nt++) mma16816(acc[mt][nt], af[mt], bfr[nt][0], bfr[nt][1]);
            }
        }
    }
    cp_async_wait<0>();
    __syncthreads();
    float * cs = reinterpret_cast<float *>(smem);  // [BM][BN + 4]
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            const int r = wm * TM + mt * 16 + lane / 4, col = wn * TN + nt * 8 + 2 * (lane % 4);
            cs[r * (BN + 4) + col] = acc[mt][nt][0];
            cs[r * (BN + 4) + col + 1] = acc[mt][nt][1];
            cs[(r + 8) * (BN + 4) + col] = acc[mt][nt][2];
            cs[(r + 8) * (BN + 4) + col + 1] = acc[mt][nt][3];
        }
    }
    __syncthreads();
    constexpr int out_cols = SWIGLU ? BN / 2 : BN;
    for (int i = tid; i < BM * out_cols; i += threads) {
        const int r = i / out_cols, col = i % out_cols;
        if (r >= rows || f0 + col >= a.n) continue;
        float v = cs[r * (BN + 4) + col];
        if constexpr (SWIGLU) {
            // As the unfused path: gate and up rounded to bf16 (the projection's output), then silu(gate) * up.
            const float gate = __bfloat162float(__float2bfloat16(v));
            const float up = __bfloat162float(__float2bfloat16(cs[r * (BN + 4) + BN / 2 + col]));
            v = silu(gate) * up;
        }
        a.y[int64_t(row0 + r) * a.n + f0 + col] = __float2bfloat16(v);
    }
}

template <int BM, int BN, int WM, int WN, int STAGES, int BK, bool SWIGLU> void launch_gemm(const GemmArgs & a, int max_tiles, cudaStream_t stream) {
    constexpr size_t smem = gemm_smem<BM, BN, WM, WN, STAGES, BK>();
    static PerDevice<size_t> configured;
    auto kernel = moe_gemm_kernel<BM, BN, WM, WN, STAGES, BK, SWIGLU>;
    allow_dynamic_smem(kernel, smem, configured);
    const int out_per_block = SWIGLU ? BN / 2 : BN;
    const dim3 grid((a.n + out_per_block - 1) / out_per_block, max_tiles);
    launch_kernel(kernel, grid, dim3(WM * WN * 32), smem, stream, a);
}

// Small tiles (16 rows, 64 weight rows, eight warps) where experts get few rows each (small batches): many blocks over
// the selected experts' weights. On an H200 with Qwen1.5-MoE-A2.7B at batch 16 / 64 they decoded 2038 / 5977 tok/s
// against 1966 / 5616 with 32 weight rows and four warps (6-deep) and 2001 / 5703 with 128 weight rows (3-deep), same
// call (bench/results/2026-11-28-h200-moe-device). A stage takes K 128 (256 bytes of each weight row), 3 deep (three
// blocks an SM): against K 64 six deep, 2,363.69 / 2,353.96 -> 2,397.65 / 2,389.41 tok/s at batch 16 and 5,549.04 /
// 5,542.27 -> 5,622.84 / 5,616.76 at 64; K 128 four deep (two blocks an SM) 2,389.20 / 2,379.53 and 5,584.92 /
// 5,585.49 (bench/results/2026-12-03-h200-gemm-tune, call 1). The down projection of 16-row tiles goes to the resident
// launch of moe_down_rows16.cu; gate/up stays here (as a resident grid it lost, same file). Large tiles (64 x 128)
// where experts get many rows (prefill): each weight tile is read once per 64 rows.
template <bool SWIGLU> void grouped_gemm(const GemmArgs & a, int tile_rows, int assignments, cudaStream_t stream) {
    const int max_tiles = moe_max_tiles(assignments, tile_rows, a.E);
    if (tile_rows == 16) {
        if constexpr (SWIGLU) launch_gemm<16, 64, 1, 8, 3, 128, true>(a, max_tiles, stream);
        else down_rows16(a, max_tiles, stream);
        return;
    }
    launch_gemm<64, 128, 2, 2, 3, 64, SWIGLU>(a, max_tiles, stream);
}

constexpr int k_combine_threads = 256;

// x[t] += sum_j weight[t, j] y[slot_of[t k + j]] (+ sigmoid(gate[t]) shared[t]), in fp32, in a fixed order; eight
// values per thread (16-byte loads), a block per token and 2048 values.
__global__ void __launch_bounds__(k_combine_threads) combine_kernel(float * x, bool accumulate, int H, int k, const float * weights, const int * slot_of,
                                                                    const bf16 * y, const bf16 * shared, const float * shared_gate,
                                                                    int gate_stride) {
    pdl_wait();
    const int t = blockIdx.y, i = (blockIdx.x * k_combine_threads + threadIdx.x) * 8;
    if (i >= H) return;
    float v[8] = {};
    float4 * xp = reinterpret_cast<float4 *>(x + size_t(t) * H + i);
    if (accumulate) {
        const float4 x0 = xp[0], x1 = xp[1];
        v[0] = x0.x, v[1] = x0.y, v[2] = x0.z, v[3] = x0.w, v[4] = x1.x, v[5] = x1.y, v[6] = x1.z, v[7] = x1.w;
    }
    auto add = [&](float s, const uint4 & u) {
        const __nv_bfloat162 * h = reinterpret_cast<const __nv_bfloat162 *>(&u);
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const float2 f = __bfloat1622float2(h[q]);
            v[2 * q] += s * f.x;
            v[2 * q + 1] += s * f.y;
        }
    };
    // Every load issued before the first add: the slots, then all the rows (one expert after another, each row's
    // load waited for its slot's: two round trips to memory instead of two a chosen expert).
    int slot[k_moe_max_topk];
    float weight[k_moe_max_topk];
    uint4 row[k_moe_max_topk];
#pragma unroll
    for (int j = 0; j < k_moe_max_topk; j++) {
        if (j < k) {
            slot[j] = slot_of ? slot_of[size_t(t) * k + j] : t * k + j;
            weight[j] = weights[size_t(t) * k + j];
        }
    }
#pragma unroll
    for (int j = 0; j < k_moe_max_topk; j++) {
        if (j < k) row[j] = *reinterpret_cast<const uint4 *>(y + size_t(slot[j]) * H + i);
    }
    uint4 shared_row = {};
    float gate = 0;
    if (shared) {
        shared_row = *reinterpret_cast<const uint4 *>(shared + size_t(t) * H + i);
        gate = shared_gate[size_t(t) * gate_stride];
    }
#pragma unroll
    for (int j = 0; j < k_moe_max_topk; j++) {
        if (j < k) add(weight[j], row[j]);
    }
    if (shared) add(1.0f / (1.0f + expf(-gate)), shared_row);
    xp[0] = make_float4(v[0], v[1], v[2], v[3]);
    xp[1] = make_float4(v[4], v[5], v[6], v[7]);
}

}  // namespace

size_t moe_routing_ints(int max_tokens, int top_k, int n_experts) { return 3 * size_t(max_tokens) * top_k + 2 * (size_t(n_experts) + 1); }

MoeRouting moe_routing_in(int * ints, float * weights, int max_tokens, int top_k, int n_experts) {
    const size_t ck = size_t(max_tokens) * top_k, e1 = size_t(n_experts) + 1;
    MoeRouting r;
    r.ids = ints;
    r.offsets = r.ids + ck;
    r.tiles = r.offsets + e1;
    r.token_of = r.tiles + e1;
    r.slot_of = r.token_of + ck;
    r.weights = weights;
    return r;
}

// The wgmma tiles from 32 rows per expert on average: on an H200 (same call, bench/results/2026-11-30-h200x2-moe-wgmma)
// Qwen3-30B-A3B served 1000 prompts of 1000 -> 100 tokens at 29.30 requests/s with them against 15.12 with the 64-row
// mma.sync tiles (passes of 1280 tokens: ~80 rows an expert), 40.35 against 20.14 with passes of 4096 (~256 rows);
// Qwen1.5-MoE-A2.7B's time to first token at 30720 0.979 -> 0.622 s (passes of 1024: ~68 rows). Between 16 and 32
// rows an expert the two were not compared.
int moe_tile_rows(int tokens, int top_k, int n_experts) {
    const int64_t assignments = int64_t(tokens) * top_k;
    if (assignments >= int64_t(32) * n_experts && sm90a_device()) return k_moe_wgmma_rows;
    return assignments >= 16 * n_experts ? 64 : 16;
}

int moe_max_tiles(int assignments, int tile_rows, int n_experts) {
    return std::min(assignments, (assignments + tile_rows - 1) / tile_rows + std::min(n_experts, assignments));
}

void moe_route(const float * logits, int stride, int c, int n_experts, int top_k, bool renormalise, int tile_rows, const MoeRouting & r,
               cudaStream_t stream) {
    QINFER_CHECK(n_experts >= 1 && n_experts <= k_moe_max_experts) << "MoE: " << n_experts << " experts (at most " << k_moe_max_experts << ")";
    QINFER_CHECK(top_k >= 1 && top_k <= std::min(k_moe_max_topk, n_experts)) << "MoE: top-" << top_k << " of " << n_experts;
    if (c * top_k <= k_small_assignments) {
        launch_kernel(route_group_small_kernel, dim3(1), dim3(k_small_threads), 0, stream, logits, stride, c, n_experts, top_k, renormalise,
                      tile_rows, r.ids, r.weights, r.offsets, r.tiles, r.token_of, r.slot_of);
        return;
    }
    launch_kernel(route_kernel, dim3((c + k_route_warps - 1) / k_route_warps), dim3(k_route_warps * 32), 0, stream, logits, stride, c, n_experts,
                  top_k, renormalise, r.ids, r.weights);
    launch_kernel(group_kernel, dim3(n_experts), dim3(k_group_threads), 0, stream, static_cast<const int *>(r.ids), c * top_k, n_experts,
                  top_k, tile_rows, r.offsets, r.tiles, r.token_of, r.slot_of);
}

void moe_experts(const bf16 * xn, int c, int top_k, const MoeExperts & w, const MoeRouting & r, int tile_rows, bf16 * act, bf16 * out,
                 cudaStream_t stream) {
    QINFER_CHECK(w.hidden % 8 == 0 && w.inter % 8 == 0) << "MoE experts: hidden " << w.hidden << " and intermediate " << w.inter
                                                       << " must be multiples of 8";
    QINFER_CHECK(tile_rows == 16 || tile_rows == 64 || tile_rows == k_moe_wgmma_rows) << "MoE experts: tile of " << tile_rows << " rows";
    QINFER_CHECK(c > k_moe_gemv_max_tokens) << "MoE experts: " << c << " tokens (decode steps take moe_decode)";
    if (tile_rows == k_moe_wgmma_rows) {
        // The tensor copies need the sorted rows' inputs contiguous: gathered into `out`, free until down writes it.
        const int rows = c * top_k;
        gather_rows(xn, r.token_of, rows, w.hidden, out, stream);
        MoeWgmmaGemm g;
        g.n_experts = w.n_experts;
        g.offsets = r.offsets;
        g.tiles = r.tiles;
        g.max_tiles = moe_max_tiles(rows, tile_rows, w.n_experts);
        g.x = out;
        g.x_rows = rows;
        g.w = w.gate_up;
        g.w_rows = 2 * w.inter;
        g.n = w.inter;
        g.k = w.hidden;
        g.swiglu = true;
        g.y = act;
        moe_gemm_wgmma(g, stream);
        g.x = act;
        g.w = w.down;
        g.w_rows = w.hidden;
        g.n = w.hidden;
        g.k = w.inter;
        g.swiglu = false;
        g.y = out;
        moe_gemm_wgmma(g, stream);
        return;
    }
    GemmArgs a;
    a.offsets = r.offsets;
    a.tiles = r.tiles;
    a.E = w.n_experts;
    a.x = xn;
    a.token_of = r.token_of;
    a.w = w.gate_up;
    a.w_stride = int64_t(2) * w.inter * w.hidden;
    a.n = w.inter;
    a.k = w.hidden;
    a.y = act;
    grouped_gemm<true>(a, tile_rows, c * top_k, stream);
    a.x = act;
    a.token_of = nullptr;
    a.w = w.down;
    a.w_stride = int64_t(w.hidden) * w.inter;
    a.n = w.hidden;
    a.k = w.inter;
    a.y = out;
    grouped_gemm<false>(a, tile_rows, c * top_k, stream);
}

void moe_combine(float * x, bool accumulate, int c, int hidden, int top_k, const MoeRouting & r, const bf16 * out, const bf16 * shared, const float * shared_gate,
                 int gate_stride, cudaStream_t stream) {
    QINFER_CHECK(hidden % 8 == 0) << "MoE combine: hidden " << hidden << " must be a multiple of 8";
    launch_kernel(combine_kernel, dim3((hidden + 8 * k_combine_threads - 1) / (8 * k_combine_threads), c), dim3(k_combine_threads), 0, stream, x, accumulate, hidden, top_k, static_cast<const float *>(r.weights),
                  static_cast<const int *>(r.slot_of), out, shared, shared_gate, gate_stride);
}

}  // namespace qinfer::cuda
