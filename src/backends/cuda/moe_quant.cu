// Quantized routed experts on the device (ops.h, "mixture of experts"): every expert's 4- or 8-bit affine codes
// stacked in one tiled matrix per projection (model/quant_repack.h), and one launch per projection over all of a
// step's token-expert assignments, grouped by expert in tiles of k_moe_qtile_rows sorted rows (the routing's tiles).
// A block takes one tile and RBB 16-row blocks of its expert's outputs; its warps split K into KS parts, each lane
// keeps a ring of 16-byte code loads in flight, and the codes become tensor-core A fragments as in the dense
// quantized GEMV (qgemv_mma.cuh): (w & 0x000F000F) | 0x43004300 is the bf16 pair 128 + q, one HSUB2 subtracts
// 128 + zero exactly, products accumulate in fp32 per quantization group, each group's sums are scaled in fp32. The
// tile's rows are the MMA's 8 columns (a token's normalised input for gate/up, its activation row for down), staged in
// shared memory once per block, so an expert's codes are read once per 8 rows and no K block waits for its inputs
// (decode steps: the gate/up blocks stage the RMSNorm of each row's residual themselves, MoeNormIn). The prologue is
// batched: group parameters 8 a load, all of a block's in one round trip (ring4::stage_params_vec), the RMSNorm row in
// float4 batches (qstage::stage_norm_vec). Against one parameter and one input a load (an H200, alternated twice,
// bench/results/2026-12-03-h200-moe-prologue): Qwen2-57B-A14B GPTQ-Int4 277.6 -> 295.9 tok/s at input 1,
// Qwen1.5-MoE-A2.7B GPTQ-Int4 726.5 -> 736.8.
// The routing's tile and row offsets are read into shared memory in one round trip and searched there. One token
// routed in the launch with ids_ready: the down launch's blocks take their expert from the gate/up launch before
// pdl_wait, and request their ring of codes and stage their group parameters while it still runs (an H200, alternated
// twice, bench/results/2026-12-04-h200-moe-early-ids: 57B GPTQ-Int4 298.6 -> 306.3 tok/s, A2.7B GPTQ-Int4 736.3 ->
// 763.0). Gate and up rows of a block share its warps and meet in the epilogue: silu(bf16(gate)) * bf16(up), as
// transformers rounds. Where groups are whole 64-wide K blocks (FAST), the loop checks the group once a K block and
// reads a lane's inputs, staged in qstage::b_pair_order, 8 bytes a 16-wide step, as the dense ring GEMV's fast rounds
// do (an H200, alternated twice, bench/results/2026-12-04-h200-moe-qfast: A2.7B GPTQ-Int4 810.8 -> 835.7 tok/s, 57B
// GPTQ-Int4 305.4 -> 322.3). Nothing goes through the host: graphs can capture it.
#include <algorithm>
#include <atomic>
#include <climits>

#include "backends/cuda/common.cuh"
#include "backends/cuda/gemv_common.cuh"
#include "backends/cuda/moe_route.cuh"
#include "backends/cuda/moe_tiles.cuh"
#include "backends/cuda/ops.h"
#include "backends/cuda/qgemv_mma.cuh"
#include "backends/cuda/qgemv_ring.cuh"
#include "backends/cuda/qstage.cuh"

namespace qinfer::cuda {
namespace {

constexpr int k_warps = 8;
static_assert(k_warps * 32 == ring4::k_threads, "stage_params_vec strides over ring4::k_threads threads");
constexpr int k_ring_loads = 4;  // 16-byte code loads in flight per lane and matrix (4-bit: 4 K blocks, 8-bit: 2)
// The SwiGLU kernel at three blocks per SM (at most 85 registers; the other one fits four at 64): Qwen1.5-MoE-A2.7B's
// decode gate_up grid of 88 x 4 blocks in one wave. Unbounded it took 101 registers, two blocks per SM, two waves
// (an H200: 16.6 us a layer).
constexpr int k_blocks_per_sm = 3;

struct QExpertArgs {
    QuantMatrix w;                   // stacked: expert e's rows are [e MATS n, (e + 1) MATS n) (SwiGLU: n gate rows, n up rows)
    const bf16 * x = nullptr;        // SwiGLU: xn [c, ldx] read through token_of; else [assignments, ldx] by sorted row
    int ldx = 0;
    const int * token_of = nullptr;  // null: sorted row p reads row p of x
    const int * offsets = nullptr, * tiles = nullptr;
    int E = 0;
    int n = 0;                       // outputs per expert (a multiple of 16)
    bf16 * y = nullptr;              // [assignments, n] by sorted row
    // One token routed in the launch (moe_qexperts_routed): tile j is the token's j-th assignment alone. The gate/up
    // launch routes from `logits` (every block; the first writes ids and weights), the down launch reads `ids`.
    const float * logits = nullptr;
    int top_k = 0;
    bool renormalise = false;
    int * ids = nullptr;
    float * weights = nullptr;
    int * ids_ready = nullptr;  // MoeDecode::ids_ready: the down launch's blocks take their expert before pdl_wait
    int beside_blocks = 0;      // gate/up: SM slots another stream's launch holds beside it (parts_for)
    MoeNormIn norm;  // SwiGLU: norm.x set, a row's input is RMSNorm(norm.x) of its token (x unused)
};

// Shared memory: the packed group parameters (uint32 [RBB MATS 16 rows, gs], ring4::pack_group), then the tile's input
// rows (bf16 [xrows, k_padded + 8], zero past k; the row stride's extra 16 bytes put the 8 rows a B load reads in
// different banks).
__host__ __device__ inline int params_words(int rbb, int mats, int groups) { return (rbb * mats * 16 * ring4::group_stride(groups) + 3) / 4 * 4; }

template <int PLANES, bool SWIGLU, int KS, bool FAST = false>
__global__ void __launch_bounds__(k_warps * 32, SWIGLU ? k_blocks_per_sm : 4) moe_qgemv_kernel(QExpertArgs a) {
    constexpr int MATS = SWIGLU ? 2 : 1;
    constexpr int RBB = k_warps / KS;
    constexpr int TILE = 32 * PLANES;              // uint4 per row block and 64-wide K block
    constexpr int RING = k_ring_loads / PLANES;    // K blocks in flight
    constexpr ring4::Codes C = PLANES == 2 ? ring4::Codes::Affine8 : ring4::Codes::Affine4;
    extern __shared__ __align__(16) uint32_t smem[];
    __shared__ float red[k_warps][32][4 * MATS];
    __shared__ int s_tiles[k_moe_max_experts + 1], s_offsets[k_moe_max_experts + 1];
    // The routing comes from the kernel ahead; a down launch given ids_ready takes it before waiting for that kernel's
    // end (its codes and group parameters then requested while the gate/up launch still runs; its inputs after).
    const bool early = !SWIGLU && a.ids_ready != nullptr;
    if (!early) pdl_wait();
    MoeTile tile;
    const bool routed_here = a.ids != nullptr;
    if (routed_here) {
        // One token: its top_k assignments are the tiles, in order.
        __shared__ int r_ids[k_moe_max_topk];
        __shared__ float r_weights[k_moe_max_topk];
        if constexpr (SWIGLU) {
            if (threadIdx.x < 32) route_token(a.logits, a.E, a.top_k, a.renormalise, r_ids, r_weights);
            __syncthreads();
            if (blockIdx.x == 0 && blockIdx.y == 0) {
                if (threadIdx.x < a.top_k) {
                    a.ids[threadIdx.x] = r_ids[threadIdx.x];
                    a.weights[threadIdx.x] = r_weights[threadIdx.x];
                }
                if (a.ids_ready) publish_ids(a.ids_ready);
            }
            tile.expert = r_ids[blockIdx.y];
        } else {
            tile.expert = early ? take_id(a.ids_ready, a.ids, int(blockIdx.y)) : a.ids[blockIdx.y];
        }
        tile.row0 = int(blockIdx.y);
        tile.rows = 1;
    } else {
        // The routing's tile and row offsets in one round trip; the tile's expert found in shared memory.
        for (int i = threadIdx.x; i <= a.E; i += k_warps * 32) {
            s_tiles[i] = a.tiles[i];
            s_offsets[i] = a.offsets[i];
        }
        __syncthreads();
        if (!moe_tile_of(s_tiles, s_offsets, a.E, int(blockIdx.y), k_moe_qtile_rows, tile)) return;
    }
    const int e = tile.expert, row0 = tile.row0, rows = tile.rows;  // rows <= xrows: a token chooses an expert once
    const QuantMatrix & w = a.w;
    const int kp = w.k_padded, nkb = kp / 64, G = w.groups, gs = ring4::group_stride(G), n_rb = a.n / 16;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int part = warp % KS, rbl = warp / KS, rb = blockIdx.x * RBB + rbl;
    const bool active = rb < n_rb;
    const int64_t erb = int64_t(e) * MATS * n_rb;  // the expert's first row block
    const int kb_begin = part * nkb / KS, kb_end = (part + 1) * nkb / KS;

    // The first RING blocks of codes of each matrix, requested before the group parameters and inputs are staged.
    const uint4 * src[MATS];
    uint4 ring[RING][MATS][PLANES];
#pragma unroll
    for (int m = 0; m < MATS; m++) {
        src[m] = reinterpret_cast<const uint4 *>(w.codes) + size_t(erb + int64_t(m) * n_rb + (active ? rb : 0)) * nkb * TILE + lane;
#pragma unroll
        for (int u = 0; u < RING; u++) {
#pragma unroll
            for (int p = 0; p < PLANES; p++) {
                ring[u][m][p] = active && kb_begin + u < kb_end ? mma4::load_stream(src[m] + size_t(kb_begin + u) * TILE + p * 32)
                                                                : make_uint4(0, 0, 0, 0);
            }
        }
    }
    uint32_t * sq = smem;
    ring4::stage_params_vec<C, RBB, MATS>(w, n_rb, G, gs, sq, erb);
    if (early) pdl_wait();
    const int xld = kp + 8;
    bf16 * sx = reinterpret_cast<bf16 *>(smem + params_words(RBB, MATS, G));
    const int chunks = kp / 8;  // 16-byte chunks of a staged row
    auto token = [&](int p) { return a.token_of ? a.token_of[p] : routed_here && SWIGLU ? 0 : p; };  // routed here: the one token
    if (SWIGLU && a.norm.x) {
        __shared__ float norm_red[k_warps];
        const GemvArgs na = qstage::norm_args(a.norm, w.k);
        for (int r = 0; r < rows; r++) qstage::stage_norm_vec<4>(na, token(row0 + r), w.k, kp, sx + r * xld, norm_red, FAST);
    } else {
        for (int i = threadIdx.x; i < rows * chunks; i += k_warps * 32) {
            const int r = i / chunks, ch = i - r * chunks;
            uint4 v = make_uint4(0, 0, 0, 0);
            if (ch * 8 < w.k) v = *reinterpret_cast<const uint4 *>(a.x + size_t(token(row0 + r)) * a.ldx + ch * 8);
            if (FAST) {  // the chunk's four pairs where b_pair_order puts them
                const uint32_t * pv = reinterpret_cast<const uint32_t *>(&v);
#pragma unroll
                for (int q = 0; q < 4; q++) *reinterpret_cast<uint32_t *>(sx + r * xld + qstage::b_pair_order(ch * 8 + 2 * q)) = pv[q];
            } else {
                *reinterpret_cast<uint4 *>(sx + r * xld + ch * 8) = v;
            }
        }
    }
    __syncthreads();

    // B fragments: the tile's row min(g, rows - 1) (columns beyond `rows` repeat the last one and are not written).
    const uint32_t * xrow = reinterpret_cast<const uint32_t *>(sx + min(g, rows - 1) * xld);
    float tot[MATS][4] = {}, c[MATS][4] = {};
    float s_lo[MATS], s_hi[MATS];
    uint32_t zz_lo[MATS][PLANES], zz_hi[MATS][PLANES];
    int gi = min(kb_begin * 64 / w.group, G - 1);
    int group_end = gi == G - 1 ? INT_MAX : (gi + 1) * w.group;
    auto take = [&]() {
#pragma unroll
        for (int m = 0; m < MATS; m++) {
            const uint32_t * q = sq + (rbl * MATS + m) * 16 * gs + g * gs;
            const uint32_t plo = q[gi], phi = q[8 * gs + gi];
            s_lo[m] = __half2float(__ushort_as_half(uint16_t(plo & 0xFFFFu)));
            s_hi[m] = __half2float(__ushort_as_half(uint16_t(phi & 0xFFFFu)));
            if constexpr (PLANES == 2) {
                const uint32_t zlo = plo >> 16, zhi = phi >> 16;
                zz_lo[m][0] = (0x4300u | (zlo & 15u)) * 0x10001u;  // 128 + zl
                zz_hi[m][0] = (0x4300u | (zhi & 15u)) * 0x10001u;
                zz_lo[m][PLANES - 1] = (0x4500u | (zlo >> 4)) * 0x10001u;  // 2048 + 16 zh
                zz_hi[m][PLANES - 1] = (0x4500u | (zhi >> 4)) * 0x10001u;
            } else {
                zz_lo[m][0] = __byte_perm(plo, 0, 0x3232);
                zz_hi[m][0] = __byte_perm(phi, 0, 0x3232);
            }
        }
    };
    auto flush = [&]() {
#pragma unroll
        for (int m = 0; m < MATS; m++) {
            tot[m][0] = fmaf(s_lo[m], c[m][0], tot[m][0]);
            tot[m][1] = fmaf(s_lo[m], c[m][1], tot[m][1]);
            tot[m][2] = fmaf(s_hi[m], c[m][2], tot[m][2]);
            tot[m][3] = fmaf(s_hi[m], c[m][3], tot[m][3]);
            c[m][0] = c[m][1] = c[m][2] = c[m][3] = 0.0f;
        }
    };
    auto next_group = [&]() {
        flush();
        gi++;
        group_end = gi == G - 1 ? INT_MAX : group_end + w.group;
        take();
    };
    // One 16-wide K step j of ring slot u for every matrix and plane, with its B fragment words b0, b1.
    auto multiply = [&](int u, int j, uint32_t b0, uint32_t b1) {
        constexpr uint32_t mask = 0x000F000Fu;
#pragma unroll
        for (int m = 0; m < MATS; m++) {
#pragma unroll
            for (int p = 0; p < PLANES; p++) {
                const uint32_t magic = p == 0 ? 0x43004300u : 0x45004500u;  // 128, or 2048 (the high plane)
                const uint32_t word = reinterpret_cast<const uint32_t *>(&ring[u][m][p])[j];
                uint32_t fr[4];
                fr[0] = mma4::bf16x2_sub(mma4::lop3_and_or(word, mask, magic), zz_lo[m][p]);
                fr[1] = mma4::bf16x2_sub(mma4::lop3_and_or(word >> 4, mask, magic), zz_hi[m][p]);
                fr[2] = mma4::bf16x2_sub(mma4::lop3_and_or(word >> 8, mask, magic), zz_lo[m][p]);
                fr[3] = mma4::bf16x2_sub(mma4::lop3_and_or(word >> 12, mask, magic), zz_hi[m][p]);
                mma4::mma_bf16(c[m], fr, b0, b1);
            }
        }
    };
    if (active) {
        // FAST (groups are whole K blocks): one group check a block, and a lane's B words of a step in one 8-byte load
        // of the inputs staged in b_pair_order. Otherwise groups are multiples of 32 positions: one can start only at
        // j = 0 or 2.
        take();
        const uint2 * xb = reinterpret_cast<const uint2 *>(xrow) + 4 * t;  // FAST: step j of K block kb at xb[16 kb + j]
        for (int kb0 = kb_begin; kb0 < kb_end; kb0 += RING) {
#pragma unroll
            for (int u = 0; u < RING; u++) {
                const int kb = kb0 + u;
                if (kb >= kb_end) break;
                const int pos0 = kb * 64;
                if (FAST && pos0 >= group_end) next_group();
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    if constexpr (FAST) {
                        const uint2 b = xb[16 * kb + j];
                        multiply(u, j, b.x, b.y);
                    } else {
                        if ((j == 0 || j == 2) && pos0 + 16 * j >= group_end) next_group();
                        const int at = (pos0 + 16 * j + 2 * t) / 2;  // inputs 2t, 2t + 1 and 2t + 8, 2t + 9 of the 16
                        multiply(u, j, xrow[at], xrow[at + 4]);
                    }
                }
                if (kb + RING < kb_end) {
#pragma unroll
                    for (int m = 0; m < MATS; m++) {
#pragma unroll
                        for (int p = 0; p < PLANES; p++) ring[u][m][p] = mma4::load_stream(src[m] + size_t(kb + RING) * TILE + p * 32);
                    }
                }
            }
        }
        flush();
    }

    // The KS parts of each row block meet in shared memory, in part order; the row block's first warp writes.
#pragma unroll
    for (int m = 0; m < MATS; m++) {
#pragma unroll
        for (int i = 0; i < 4; i++) red[warp][lane][4 * m + i] = tot[m][i];
    }
    __syncthreads();
    if (part != 0 || !active) return;
    float sum[MATS][4] = {};
#pragma unroll
    for (int q = 0; q < KS; q++) {
#pragma unroll
        for (int m = 0; m < MATS; m++) {
#pragma unroll
            for (int i = 0; i < 4; i++) sum[m][i] += red[rbl * KS + q][lane][4 * m + i];
        }
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int col = 2 * t + (i & 1);
        if (col >= rows) continue;
        const int o = rb * 16 + g + (i >= 2 ? 8 : 0);
        float v = sum[0][i];
        if constexpr (SWIGLU) v = silu(__bfloat162float(__float2bfloat16(v))) * __bfloat162float(__float2bfloat16(sum[1][i]));
        a.y[size_t(row0 + col) * a.n + o] = __float2bfloat16(v);
    }
}

// The most K parts a row block may take: each at least four 64-wide K blocks, at most the block's 8 warps.
int max_parts(int nkb) { return nkb >= 32 ? 8 : nkb >= 16 ? 4 : nkb >= 8 ? 2 : 1; }

// The block's shared memory at `ks` K parts: group parameters of its k_warps / ks row blocks, then xrows staged input
// rows.
size_t smem_bytes(const QuantMatrix & w, int mats, int xrows, int ks) {
    return size_t(params_words(k_warps / ks, mats, w.groups)) * sizeof(uint32_t) + size_t(xrows) * (w.k_padded + 8) * sizeof(bf16);
}
constexpr size_t k_max_smem_bytes = 200 * 1024;

std::atomic<int> forced_parts{0};  // set_moe_qexperts_parts (tests): 0 the rule

// The kernel of K parts KS allowed `smem` bytes of dynamic shared memory, and how many of its blocks an SM then holds
// (gemv_common.cuh's resident_blocks, asked again when the size changes).
template <int PLANES, bool SWIGLU, int KS, bool FAST = false> int prepare_kernel(size_t smem) {
    auto kernel = moe_qgemv_kernel<PLANES, SWIGLU, KS, FAST>;
    static PerDevice<size_t> configured(48 * 1024);
    static PerDevice<Occupancy> occupancy;
    allow_dynamic_smem(kernel, smem, configured);
    return resident_blocks(kernel, k_warps * 32, smem, occupancy);
}

struct Parts {
    int ks = 0;     // K parts per row block (0: none fits the shared memory)
    int waves = 0;  // waves of resident blocks the grid takes
};

// K parts for a launch of `tiles` tiles of up to xrows rows over n outputs: the fewest waves of resident blocks, then
// the most parts (warps in flight) among those. A block's fixed work (group parameters, staged rows, for the routed
// launch the routing) comes once a wave, and an expert's rows are short. Against the most parts always (one H200,
// arms alternated in one call, bench/results/2026-11-30-h200-moe-parts): Qwen3-235B-A22B GPTQ-Int4 at batch 1 117.88
// -> 128.56 tok/s (gate/up 768 blocks in two waves -> 384 in one, routed in the launch; down 1,024 -> 512),
// Qwen2-57B-A14B GPTQ-Int4 266.17 -> 271.62 at input 1 and 182.85 -> 185.83 at 30720 (3.2 / 3.4 waves -> one),
// Qwen1.5-MoE-A2.7B GPTQ-Int4 level (one wave either way: the same launches).
// beside: SM slots another stream's launch holds meanwhile (a shared expert's gate/up beside the routed one). Where
// some split fits one wave beside it, the most parts that do; else the rule above, as if alone. On an H200 (same call,
// alternated twice; bench/results/2026-12-04-h200-moe-split) Qwen1.5-MoE-A2.7B GPTQ-Int4 at input 1 decoded
// 765.22 / 765.18 tok/s with 176 shared blocks beside 352 routed ones (8 parts) for 396 slots, 803.45 / 803.07 with 88
// shared ones (ring_parts) beside 176 routed (4 parts; 766.55 / 766.19 -> 805.59 / 804.93 in a second call); 88
// beside 352: 756.77 / 756.74; 88 beside 88 (2 parts): 744.74 / 744.80.
// Qwen2-57B-A14B's (320 shared blocks) fits no split and keeps its two parts: with one, 307.27 / 307.45 -> 263.04 / 263.05.
template <int PLANES, bool SWIGLU> Parts parts_for(const QuantMatrix & w, int n, int tiles, int xrows, int beside = 0) {
    constexpr int MATS = SWIGLU ? 2 : 1;
    const int n_rb = n / 16, most = max_parts(w.k_padded / 64);
    auto resident = [&](int ks, size_t smem) {
        switch (ks) {
            case 8: return prepare_kernel<PLANES, SWIGLU, 8>(smem);
            case 4: return prepare_kernel<PLANES, SWIGLU, 4>(smem);
            case 2: return prepare_kernel<PLANES, SWIGLU, 2>(smem);
            default: return prepare_kernel<PLANES, SWIGLU, 1>(smem);
        }
    };
    Parts best, beside_fit;
    for (int ks = most; ks >= 1; ks /= 2) {
        if (forced_parts && ks != std::min(int(forced_parts), most)) continue;
        const size_t smem = smem_bytes(w, MATS, xrows, ks);
        const int per_sm = smem <= k_max_smem_bytes ? resident(ks, smem) : 0;
        if (per_sm == 0) continue;
        const int64_t blocks = int64_t((n_rb + k_warps / ks - 1) / (k_warps / ks)) * tiles, slots = int64_t(per_sm) * sm_count();
        const int waves = int((blocks + slots - 1) / slots);
        if (best.ks == 0 || waves < best.waves) best = Parts{ks, waves};
        if (beside > 0 && beside_fit.ks == 0 && blocks + beside <= slots) beside_fit = Parts{ks, 1};
    }
    return beside_fit.ks ? beside_fit : best;
}

// xrows: the most rows a tile holds (k_moe_qtile_rows, or fewer tokens: a token chooses an expert once).
template <int PLANES, bool SWIGLU, int KS> void launch_ks(const QExpertArgs & a, int max_tiles, int xrows, cudaStream_t stream) {
    constexpr int RBB = k_warps / KS;
    const size_t smem = smem_bytes(a.w, SWIGLU ? 2 : 1, xrows, KS);
    const int n_rb = a.n / 16;
    const dim3 grid((n_rb + RBB - 1) / RBB, max_tiles);
    // Groups of whole 64-wide K blocks take the fast form (one group check a block, pair-ordered inputs): on an H200
    // Qwen1.5-MoE-A2.7B GPTQ-Int4 810.4 / 811.1 -> 834.7 / 836.6 tok/s and Qwen2-57B-A14B GPTQ-Int4 305.5 / 305.3 ->
    // 321.9 / 322.6 at input 1 (same call, alternated; bench/results/2026-12-04-h200-moe-qfast). Groups of 32 keep the
    // checked loop.
    if (a.w.group % 64 == 0) {
        prepare_kernel<PLANES, SWIGLU, KS, true>(smem);
        launch_kernel(moe_qgemv_kernel<PLANES, SWIGLU, KS, true>, grid, dim3(k_warps * 32), smem, stream, a);
        return;
    }
    prepare_kernel<PLANES, SWIGLU, KS>(smem);
    launch_kernel(moe_qgemv_kernel<PLANES, SWIGLU, KS>, grid, dim3(k_warps * 32), smem, stream, a);
}

template <int PLANES, bool SWIGLU> void launch(const QExpertArgs & a, int max_tiles, int xrows, cudaStream_t stream) {
    const Parts parts = parts_for<PLANES, SWIGLU>(a.w, a.n, max_tiles, xrows, a.beside_blocks);
    switch (parts.ks) {
    case 8: return launch_ks<PLANES, SWIGLU, 8>(a, max_tiles, xrows, stream);
    case 4: return launch_ks<PLANES, SWIGLU, 4>(a, max_tiles, xrows, stream);
    case 2: return launch_ks<PLANES, SWIGLU, 2>(a, max_tiles, xrows, stream);
    case 1: return launch_ks<PLANES, SWIGLU, 1>(a, max_tiles, xrows, stream);
    default: QINFER_FAIL() << "MoE: the quantized experts' group parameters do not fit in shared memory";
    }
}

template <bool SWIGLU> void launch_planes(const QExpertArgs & a, int max_tiles, int xrows, cudaStream_t stream) {
    if (a.w.bits == 8) return launch<2, SWIGLU>(a, max_tiles, xrows, stream);
    launch<1, SWIGLU>(a, max_tiles, xrows, stream);
}

}  // namespace

bool moe_qexperts_apply(const MoeQuantExperts & w) {
    const int E = w.n_experts;
    auto fits = [&](const QuantMatrix & q, int rows, int k) {
        // Group parameters are staged 8 a load (ring4::stage_params_vec): 16-byte aligned scales, 8-byte aligned zeros.
        const bool aligned = reinterpret_cast<uintptr_t>(q.scales) % 16 == 0 && reinterpret_cast<uintptr_t>(q.zeros) % 8 == 0;
        return q.codes && q.tiled && !q.lut && !q.perm && (q.bits == 4 || q.bits == 8) && aligned && q.rows == int64_t(E) * rows && q.k == k &&
               q.rows_padded == q.rows && smem_bytes(q, 2, k_moe_qtile_rows, max_parts(q.k_padded / 64)) <= k_max_smem_bytes;
    };
    return E >= 1 && w.hidden % 16 == 0 && w.inter % 16 == 0 && fits(w.gate_up, 2 * w.inter, w.hidden) && fits(w.down, w.hidden, w.inter);
}

// Every block of the routed launch routes the token before its first code load, a microsecond or two with its SM slot
// held: worth it where the gate/up grid is one wave of resident blocks, not beyond. On an H200 (same call, two rounds,
// bench/results/2026-11-30-h200x2-moe-decode) Qwen1.5-MoE-A2.7B GPTQ-Int4 (352 blocks) decoded 692.32 / 694.82 ->
// 723.08 / 725.33 tok/s with it, Qwen2-57B-A14B GPTQ-Int4 (1,280 blocks: three waves) 265.59 / 266.10 -> 260.37 / 259.27.
bool moe_qexperts_route_in_launch(const MoeQuantExperts & w, int top_k) {
    const Parts p = w.gate_up.bits == 8 ? parts_for<2, true>(w.gate_up, w.inter, top_k, 1) : parts_for<1, true>(w.gate_up, w.inter, top_k, 1);
    return p.ks > 0 && p.waves == 1;
}

void set_moe_qexperts_parts(int ks) { forced_parts = ks == 1 || ks == 2 || ks == 4 || ks == 8 ? ks : 0; }

namespace {

// The two launches over a step's tiles (`a` holds the routing's side): gate/up with SwiGLU from xn into act, then down
// from act into out.
void run_experts(QExpertArgs a, const MoeQuantExperts & w, const bf16 * xn, bf16 * act, bf16 * out, int max_tiles, int xrows, cudaStream_t stream) {
    QINFER_CHECK(moe_qexperts_apply(w)) << "MoE: the quantized experts' layout does not take the device kernel";
    QINFER_CHECK((a.norm.x || reinterpret_cast<uintptr_t>(xn) % 16 == 0) && reinterpret_cast<uintptr_t>(act) % 16 == 0) << "MoE: inputs not 16-byte aligned";
    a.E = w.n_experts;
    QINFER_CHECK(!a.norm.x || qstage::vec_norm_ok(qstage::norm_args(a.norm, w.hidden)))
        << "MoE: the residual or norm weights are not aligned for 16-byte loads";
    a.w = w.gate_up;
    a.x = xn;
    a.ldx = w.hidden;
    a.n = w.inter;
    a.y = act;
    launch_planes<true>(a, max_tiles, xrows, stream);
    a.w = w.down;
    a.norm = MoeNormIn{};
    a.beside_blocks = 0;
    a.x = act;
    a.ldx = w.inter;
    a.token_of = nullptr;
    a.n = w.hidden;
    a.y = out;
    launch_planes<false>(a, max_tiles, xrows, stream);
}

}  // namespace

void moe_qexperts_routed(const bf16 * xn, const float * logits, int top_k, bool renormalise, const MoeQuantExperts & w, int * ids,
                         float * weights, bf16 * act, bf16 * out, cudaStream_t stream, const MoeNormIn & norm, int * ids_ready,
                         int beside_blocks) {
    QINFER_CHECK(top_k >= 1 && top_k <= std::min(k_moe_max_topk, w.n_experts) && w.n_experts <= k_moe_max_experts)
        << "MoE: top-" << top_k << " of " << w.n_experts;
    QExpertArgs a;
    a.logits = logits;
    a.top_k = top_k;
    a.renormalise = renormalise;
    a.ids = ids;
    a.weights = weights;
    a.ids_ready = ids_ready;
    a.beside_blocks = beside_blocks;
    a.norm = norm;
    run_experts(a, w, xn, act, out, top_k, 1, stream);
}

void moe_qexperts(const bf16 * xn, int c, int top_k, const MoeQuantExperts & w, const MoeRouting & r, bf16 * act, bf16 * out,
                  cudaStream_t stream, const MoeNormIn & norm) {
    QExpertArgs a;
    a.norm = norm;
    a.offsets = r.offsets;
    a.tiles = r.tiles;
    a.token_of = r.token_of;
    // xrows: the most rows a tile holds (a token chooses an expert once).
    run_experts(a, w, xn, act, out, moe_max_tiles(c * top_k, k_moe_qtile_rows, w.n_experts), std::min(c, k_moe_qtile_rows), stream);
}

}  // namespace qinfer::cuda
