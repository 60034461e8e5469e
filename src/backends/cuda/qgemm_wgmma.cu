// GEMM for tiled 4- and 8-bit affine weights on Hopper (sm_90a) with the weights dequantized tile by tile into shared
// memory on their way into warpgroup MMAs: MoE prefill's grouped projections (moe_qgemm: each block one routing row
// tile of sorted tokens times its expert's rows of the stacked matrix, gate/up with SwiGLU in the epilogue). Dense
// projections of every row count go to qgemm_rs (weights dequantized in registers as wgmma's A), which beat this
// kernel's dense form on every 7B shape from 128 to 1024 rows by 1.6-2.5x (gate_up Int4 at m 512 184.2 against 298.6
// us; bench/results/2026-12-02-h200-rs-wide, call 3); the dense form and its K splits were removed then.
//
// The weights are the A operand (rows of W along the MMA's M), the tokens the B operand:
//   block (routing row tile, row tile): 128 rows of W x BN tokens, K in steps of 64 (one K block of the tile layout,
//   model/quant_repack.h), STAGES stages in shared memory guarded by mbarriers; two consumer warpgroups of 64 rows
//   (warp w owns 16-row block w of the tile) and one producer warp.
//   producer: per K block one tensor copy of the x tile (BN rows of 64 bf16, 128-byte swizzle; rows past the step's
//     sorted rows and columns past k arrive as zeros) and one bulk copy per row block of its 512 bytes of codes per
//     plane (the tile layout keeps a row block's K block contiguous).
//   consumers: while the four wgmma.m64nBNk16 of K block kb run (both operands from shared memory), each warp turns
//     its row block's codes of K block kb + 1 into that stage's A tile (128 rows x 64, 128-byte swizzle) by
//     stmatrix: a lane's 16 bytes per plane are the A fragments of four k16 steps (the GEMV's layout,
//     qgemv_ring.cuh), each made bf16 pairs q - z exactly (LOP3 into 128 + q, one HSUB2; 8-bit: the high plane's
//     16 (hi - zh) added, still exact), then times the group's fp16 scale in fp32, rounded once to bf16: the very
//     value cuda::dequantize writes (s (q - z) in fp32, rounded), so this GEMM multiplies the same bf16 weights as
//     dequantize + cuBLASLt. Then the MMAs are waited for, the stage goes back to the producer, and the warpgroup
//     synchronises so its A tile is complete before the next MMAs. (One group left in flight across K blocks, the
//     stage released a K block later, was slower on an H100: 7B Int4 gate_up at m 1024 0.517 -> 0.533 ms, at m 128
//     with three stages 0.126 -> 0.178; bench/results/2026-11-27-h100-qgemm-splitk.)
//   epilogue: the fp32 accumulators (rows x tokens) are written to shared memory transposed, then out as bf16 in
//     16-byte row chunks of y (rows past n and tokens past the tile's are not written); SwiGLU tiles hold 64 gate
//     rows beside the same features' 64 up rows.
// Earlier forms, measured on an H100 (7B gate_up, m 1024; cuBLASLt 800 TFLOP/s on the same bf16 weights): A from the
// consumers' registers, 516 TFLOP/s (ptxas serialised the MMAs whose register operands were being written, C7513,
// so dequantization and MMAs alternated); a separate warpgroup of three dequantizing warps, 411 (too few warps).
#include <cuda.h>

#include <algorithm>
#include <cstdlib>

#include "backends/cuda/common.cuh"
#include "backends/cuda/moe_tiles.cuh"
#include "backends/cuda/ops.h"
#include "backends/cuda/qgemv_mma.cuh"
#include "backends/cuda/tensor_map.h"
#include "backends/cuda/wgmma.cuh"

namespace qinfer::cuda {

namespace {

constexpr int k_bm = 128;  // weight rows per block: two consumer warpgroups of 64 (8 row blocks of 16)
constexpr int k_consumer_threads = 256;
constexpr int k_threads = k_consumer_threads + 32;  // + the producer warp (288 threads: up to 224 registers each)

// A kernel's shape: BN tokens per block, STAGES stages, BLOCKS blocks per SM (launch bound; 2 leaves 112 registers
// per thread, enough for 64 accumulators).
template <int BN, int PLANES, int STAGES> struct QgemmSmem {
    static constexpr int x_bytes = BN * 128;             // x tile: [BN tokens][64 K] bf16, 128-byte swizzle
    static constexpr int a_bytes = k_bm * 128;           // A tile: [128 rows][64 K] bf16, 128-byte swizzle
    static constexpr int code_bytes = 8 * PLANES * 512;  // the 8 row blocks' codes of one K block
    static constexpr int stage_bytes = x_bytes + a_bytes + code_bytes;
    // Staged output: fp32 [BN tokens][out_ld], rows of the tile along it (132: the warp's 4 token columns x 8 rows
    // fall in distinct banks), rounded to bf16 on the way out.
    static constexpr int out_ld = k_bm + 4;
    static constexpr size_t bar_offset = size_t(STAGES) * stage_bytes;
    static constexpr size_t bytes = bar_offset + 2 * STAGES * sizeof(uint64_t) + 1024;  // + the base's alignment
    static_assert(stage_bytes % 1024 == 0, "stages keep the swizzle's 1024-byte alignment");
    static_assert(size_t(BN) * out_ld * 4 <= bar_offset, "the staged output fits the stages");
    static_assert(bytes <= 227 * 1024, "within a block's shared memory");
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)  // the kernel body is sm_90a only
// Group parameters of a lane's rows r0 (e = 0) and r0 + 8 (e = 1) for the two halves of a K block (k16 steps 0-1,
// 2-3; halves differ only with groups of 32): fp16 scale bits and zero points.
struct Params {
    uint32_t s[2][2], z[2][2];  // [half][e]
};

// The bf16 pair v (two exact integers q - z) times s in fp32, each rounded once to bf16.
__device__ __forceinline__ uint32_t scale_pair(uint32_t v, float s) {
    const __nv_bfloat162 r = __floats2bfloat162_rn(__uint_as_float(v << 16) * s, __uint_as_float(v & 0xFFFF0000u) * s);
    return *reinterpret_cast<const uint32_t *>(&r);
}

__device__ __forceinline__ uint32_t pack_rn(float lo, float hi) {
    const __nv_bfloat162 r = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t *>(&r);
}

// Four 8 x 8 bf16 matrices from the warp's registers into shared memory: matrix i from register i (lane l holds row
// l / 4, columns 2 (l % 4), + 1), row r of matrix i at the address lane 8 i + r gives.
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, const uint32_t (&r)[4]) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
                 : "memory");
}

template <int BN> __device__ __forceinline__ void wgmma_ss(float (&d)[BN / 2], uint64_t a_desc, uint64_t b_desc) {
    if constexpr (BN == 256) sm90::wgmma_m64n256k16_ss_acc(d, a_desc, b_desc);
    else sm90::wgmma_m64n128k16_ss(d, a_desc, b_desc, 1);
}

// The A fragments of one row block and K block: af[j][r] is mma.m16n8k16's A register r of k16 step j.
template <int PLANES>
__device__ __forceinline__ void dequantize_fragments(const uint4 (&codes)[PLANES], const Params & p, uint32_t (&af)[4][4]) {
    constexpr uint32_t mask = 0x000F000Fu;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        float s[2];
        uint32_t zz[2][PLANES];
#pragma unroll
        for (int e = 0; e < 2; e++) {
            s[e] = __half2float(__ushort_as_half(uint16_t(p.s[h][e])));
            const uint32_t z = p.z[h][e];
            if constexpr (PLANES == 1) {
                zz[e][0] = uint32_t(__bfloat16_as_ushort(__float2bfloat16(128.0f + float(z)))) * 0x10001u;  // 128 + z
            } else {
                zz[e][0] = (0x4300u | (z & 15u)) * 0x10001u;         // 128 + zl
                zz[e][PLANES - 1] = (0x4500u | (z >> 4)) * 0x10001u;  // 2048 + 16 zh
            }
        }
#pragma unroll
        for (int jj = 0; jj < 2; jj++) {
            const int j = 2 * h + jj;
            const uint32_t lo_word = reinterpret_cast<const uint32_t *>(&codes[0])[j];
#pragma unroll
            for (int r = 0; r < 4; r++) {
                const int e = r & 1;  // registers 0, 2: row g; 1, 3: row g + 8
                uint32_t v = mma4::bf16x2_sub(mma4::lop3_and_or(lo_word >> (4 * r), mask, 0x43004300u), zz[e][0]);
                if constexpr (PLANES == 2) {
                    const uint32_t hi_word = reinterpret_cast<const uint32_t *>(&codes[PLANES - 1])[j];
                    v = mma4::bf16x2_add(v, mma4::bf16x2_sub(mma4::lop3_and_or(hi_word >> (4 * r), mask, 0x45004500u), zz[e][PLANES - 1]));
                }
                af[j][r] = scale_pair(v, s[e]);
            }
        }
    }
}
#endif

// MODE: k_grouped (the routed experts of a step, moe_qgemm: block x is the routing's row tile x of BN sorted rows,
// its expert's rows of the stacked matrix multiplied; y [sorted rows, g.w_rows]); k_grouped_swiglu (the same over
// gate_up: a block's first four row blocks are 64 gate rows, the last four the same features' up rows, and y [sorted
// rows, g.w_rows / 2] = silu(bf16(gate)) * bf16(up)).
constexpr int k_grouped = 1, k_grouped_swiglu = 2;
struct Groups {
    const int * offsets = nullptr, * tiles = nullptr;  // MoeRouting's, built with tile_rows = BN
    int n_experts = 0, w_rows = 0;                     // rows of one expert in the stacked matrix
};

template <int BN, int PLANES, int STAGES, int BLOCKS, int MODE>
__global__ void __launch_bounds__(k_threads, BLOCKS)
    qgemm_wgmma_kernel(QuantMatrix w, bf16 * y, const __grid_constant__ CUtensorMap x_map, Groups grp) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int k_stages = STAGES;
    using Layout = QgemmSmem<BN, PLANES, STAGES>;
    extern __shared__ unsigned char smem_raw[];
    unsigned char * smem = smem_raw + ((1024 - sm90::smem_addr(smem_raw) % 1024) % 1024);
    // full: x and codes landed; empty: both warpgroups' MMAs on the stage are done.
    uint64_t * full = reinterpret_cast<uint64_t *>(smem + Layout::bar_offset), * empty = full + k_stages;
    auto x_tile = [&](int s) { return smem + s * Layout::stage_bytes; };
    auto a_tile = [&](int s) { return smem + s * Layout::stage_bytes + Layout::x_bytes; };
    auto code_tile = [&](int s) { return smem + s * Layout::stage_bytes + Layout::x_bytes + Layout::a_bytes; };

    const int nk = w.k_padded / 64;  // K blocks, all of them in every block
    // The block's tokens (rows of x and y from tok0, tok_rows of them) and its expert's row blocks (from rb_base, n_rb).
    MoeTile tl;
    if (!moe_tile_of(grp.tiles, grp.offsets, grp.n_experts, blockIdx.x, BN, tl)) return;  // past the step's tiles
    const int tok0 = tl.row0, tok_rows = tl.rows, n_rb = grp.w_rows / 16, rb_base = tl.expert * n_rb;
    // Local row block l's row block of the matrix, -1 past it (SwiGLU: gate blocks 0-3, the up blocks of the same
    // features 4-7).
    auto rb_of = [&](int l) {
        if constexpr (MODE == k_grouped_swiglu) {
            const int half = n_rb / 2, j = blockIdx.y * 4 + (l & 3);
            return j < half ? (l < 4 ? j : half + j) : -1;
        } else {
            const int j = blockIdx.y * (k_bm / 16) + l;
            return j < n_rb ? j : -1;
        }
    };
    int present = 0;
#pragma unroll
    for (int l = 0; l < k_bm / 16; l++) present += rb_of(l) >= 0;
    const int warp_idx = __shfl_sync(0xffffffffu, int(threadIdx.x) / 32, 0);  // uniform for ptxas
    const int lane = threadIdx.x % 32;

    sm90::init_stage_barriers(full, empty, k_stages, k_consumer_threads);

    if (warp_idx == 8) {  // the producer
        const unsigned char * codes = reinterpret_cast<const unsigned char *>(w.codes);
        if (lane == 0) sm90::prefetch_tensor_map(&x_map);
        for (int i = 0; i < nk; i++) {
            const int kb = i, s = i % k_stages;
            if (i >= k_stages) sm90::mbar_wait(&empty[s], (i / k_stages - 1) & 1);
            if (lane == 0) {
                sm90::mbar_arrive_expect_tx(&full[s], uint32_t(Layout::x_bytes + present * PLANES * 512));
                sm90::tma_load_2d(x_tile(s), &x_map, &full[s], kb * 64, tok0);
            }
            __syncwarp();
            const int rb = lane < k_bm / 16 ? rb_of(lane) : -1;
            if (rb >= 0) {
                const size_t at = (size_t(rb_base + rb) * nk + kb) * PLANES * 512;
                sm90::bulk_load(code_tile(s) + lane * PLANES * 512, codes + at, PLANES * 512, &full[s]);
            }
        }
        return;
    }

    const int wg = warp_idx / 4, g = lane / 4, t = lane % 4, rbl = warp_idx;
    const int rb_mine = rb_base + rb_of(rbl);
    const bool mine = rb_of(rbl) >= 0;  // row blocks past the weight keep stale A rows: their outputs are never stored
    auto load_params = [&](int kb, Params & p) {
        if (!mine) return;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int gi = min((kb * 64 + 32 * h) / w.group, w.groups - 1);
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const size_t at = size_t(rb_mine * 16 + g + 8 * e) * w.groups + gi;
                p.s[h][e] = w.scales[at];
                p.z[h][e] = w.zeros ? uint32_t(w.zeros[at]) : uint32_t(w.const_zero);
            }
        }
    };
    // stmatrix addresses: lane l gives row l % 8 of matrix l / 8 (registers 0..3: rows 0-7 / 8-15 x k 0-7 / 8-15).
    const int st_row = rbl * 16 + lane % 8 + 8 * ((lane / 8) & 1), st_chunk = lane / 16;
    // The split's i-th K block's codes (once landed) into its stage's A tile, this warp's 16 rows.
    auto dequantize_block = [&](int i, const Params & p) {
        const int s = i % k_stages;
        sm90::mbar_wait(&full[s], (i / k_stages) & 1);
        if (mine) {
            uint4 codes[PLANES];
#pragma unroll
            for (int pl = 0; pl < PLANES; pl++) codes[pl] = *reinterpret_cast<const uint4 *>(code_tile(s) + (rbl * PLANES + pl) * 512 + lane * 16);
            uint32_t af[4][4];
            dequantize_fragments<PLANES>(codes, p, af);
            const uint32_t a_base = sm90::smem_addr(a_tile(s));
#pragma unroll
            for (int j = 0; j < 4; j++) stmatrix_x4(a_base + sm90::swizzle128_offset(st_row, 2 * j + st_chunk, k_bm), af[j]);
        }
        sm90::fence_proxy_async_smem();  // the A tile's writes, visible to the warpgroup's wgmma
    };

    float d[BN / 2];
#pragma unroll
    for (int i = 0; i < BN / 2; i++) d[i] = 0.0f;
    Params next = {};
    load_params(0, next);
    {
        const Params p = next;
        dequantize_block(0, p);
        if (nk > 1) load_params(1, next);
    }
    sm90::named_barrier(1 + wg, 128);
    for (int i = 0; i < nk; i++) {
        const int s = i % k_stages;
        const uint32_t a_addr = sm90::smem_addr(a_tile(s)) + wg * 64 * 128, x_addr = sm90::smem_addr(x_tile(s));
        sm90::wgmma_fence();
#pragma unroll
        for (int j = 0; j < 4; j++) wgmma_ss<BN>(d, sm90::desc128(a_addr + j * 32, 16, 1024), sm90::desc128(x_addr + j * 32, 16, 1024));
        sm90::wgmma_commit();
        if (i + 1 < nk) {
            // The next parameters are requested after dequantize_block's proxy fence, which would otherwise wait for
            // them (a guess from the first timings: ~0.9 us per K block at any m, far above the MMAs' time).
            const Params p = next;
            dequantize_block(i + 1, p);
            if (i + 2 < nk) load_params(i + 2, next);
        }
        sm90::wgmma_wait<0>();
        sm90::mbar_arrive(&empty[s]);
        sm90::named_barrier(1 + wg, 128);  // the warpgroup's A tile of kb + 1 is whole
    }
    sm90::fence_operands(d);

    // Epilogue: every stage is consumed (both warpgroups past their last wait), so the stages hold the output tile.
    sm90::named_barrier(3, k_consumer_threads);
    float * so = reinterpret_cast<float *>(smem);
    const int row_l = warp_idx * 16 + g;
#pragma unroll
    for (int j = 0; j < BN / 8; j++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int tok = 8 * j + 2 * t + (e & 1), row = row_l + (e >= 2 ? 8 : 0);
            so[tok * Layout::out_ld + row] = d[4 * j + e];
        }
    }
    sm90::named_barrier(3, k_consumer_threads);
    if constexpr (MODE == k_grouped_swiglu) {
        // Staged rows 0-63: gate features f0.., 64-127: the same features' up.
        const int n = grp.w_rows / 2, f0 = blockIdx.y * (k_bm / 2);
        for (int c = threadIdx.x; c < BN * (k_bm / 16); c += k_consumer_threads) {
            const int tok = c / (k_bm / 16), f = (c % (k_bm / 16)) * 8;
            if (tok >= tok_rows || f0 + f >= n) continue;  // n % 8 == 0
            const float * gate = so + tok * Layout::out_ld + f, * up = gate + k_bm / 2;
            float v[8];
#pragma unroll
            for (int i = 0; i < 8; i++) v[i] = silu_mul_rounded(gate[i], up[i]);
            *reinterpret_cast<uint4 *>(y + size_t(tok0 + tok) * n + f0 + f) =
                make_uint4(pack_rn(v[0], v[1]), pack_rn(v[2], v[3]), pack_rn(v[4], v[5]), pack_rn(v[6], v[7]));
        }
        return;
    }
    const int n = grp.w_rows, row_tile = blockIdx.y * k_bm;
    for (int c = threadIdx.x; c < BN * (k_bm / 8); c += k_consumer_threads) {
        const int tok = c / (k_bm / 8), row = row_tile + (c % (k_bm / 8)) * 8;
        if (tok >= tok_rows || row >= n) continue;
        const float * src = so + tok * Layout::out_ld + (row - row_tile);
        bf16 * dst = y + size_t(tok0 + tok) * n + row;
        if (n % 8 == 0) {
            const float4 lo = *reinterpret_cast<const float4 *>(src), hi = *reinterpret_cast<const float4 *>(src + 4);
            *reinterpret_cast<uint4 *>(dst) = make_uint4(pack_rn(lo.x, lo.y), pack_rn(lo.z, lo.w), pack_rn(hi.x, hi.y), pack_rn(hi.z, hi.w));
        } else {
            for (int i = 0; i < 8 && row + i < n; i++) dst[i] = __float2bfloat16(src[i]);
        }
    }
#else
    __trap();  // launched only where qgemm_applies (an sm_90a build on a compute capability 9.0 device)
#endif
}

// The grouped kernels (moe_qgemm): a block per (routing row tile, row tile of the expert's matrix), no K split.
template <int PLANES, int STAGES, int BLOCKS, int MODE>
void launch_grouped(const QuantMatrix & w, const bf16 * x, int x_rows, int kx, const Groups & grp, int max_tiles, bf16 * y, cudaStream_t stream) {
    constexpr int BN = k_moe_qgemm_rows;
    CUtensorMap x_map;
    if (!cache_tensor_map(&x_map, x, x_rows, kx, BN)) QINFER_FAIL() << "MoE qgemm: the tensor map of the sorted rows [" << x_rows << ", " << kx << "] was refused";
    constexpr size_t smem = QgemmSmem<BN, PLANES, STAGES>::bytes;
    static_assert(smem * BLOCKS <= 228 * 1024 - BLOCKS * 1024, "the blocks fit an SM's shared memory");
    static PerDevice<size_t> configured;
    allow_dynamic_smem(qgemm_wgmma_kernel<BN, PLANES, STAGES, BLOCKS, MODE>, smem, configured);
    const int row_tiles = MODE == k_grouped_swiglu ? (grp.w_rows / 2 + k_bm / 2 - 1) / (k_bm / 2) : (grp.w_rows + k_bm - 1) / k_bm;
    const dim3 grid(max_tiles, row_tiles, 1);
    qgemm_wgmma_kernel<BN, PLANES, STAGES, BLOCKS, MODE><<<grid, k_threads, smem, stream>>>(w, y, x_map, grp);
    CUDA_CHECK(cudaGetLastError());
}

}  // namespace

bool qgemm_applies(const QuantMatrix & w) {
    return sm90a_device() && w.tiled && !w.lut && (w.bits == 4 || w.bits == 8) && w.group > 0;
}

bool moe_qgemm_apply(const MoeQuantExperts & w) {
    return moe_qexperts_apply(w) && qgemm_applies(w.gate_up) && qgemm_applies(w.down);
}

// qgemm_rs.cu's grouped mode, for the A/B of QINFER_MOE_RS (1: it, else this file's kernel).
void moe_qgemm_rs(const bf16 * xn, int c, int top_k, const MoeQuantExperts & w, const MoeRouting & r, bf16 * act, bf16 * out, cudaStream_t stream);

void moe_qgemm(const bf16 * xn, int c, int top_k, const MoeQuantExperts & w, const MoeRouting & r, bf16 * act, bf16 * out, cudaStream_t stream) {
    QINFER_CHECK(moe_qgemm_apply(w)) << "MoE qgemm: the experts' layout or this device does not take the grouped kernel";
    static const bool rs = [] {
        const char * v = std::getenv("QINFER_MOE_RS");
        return v && std::atoi(v) == 1;
    }();
    if (rs) return moe_qgemm_rs(xn, c, top_k, w, r, act, out, stream);
    const int rows = c * top_k;
    if (rows <= 0) return;
    // The tensor copies need the sorted rows' inputs contiguous: gathered into `out`, free until down writes it.
    gather_rows(xn, r.token_of, rows, w.hidden, out, stream);
    const int max_tiles = moe_max_tiles(rows, k_moe_qgemm_rows, w.n_experts);
    Groups grp{r.offsets, r.tiles, w.n_experts, 2 * w.inter};
    if (w.gate_up.bits == 4) launch_grouped<1, 3, 2, k_grouped_swiglu>(w.gate_up, out, rows, w.hidden, grp, max_tiles, act, stream);
    else launch_grouped<2, 4, 1, k_grouped_swiglu>(w.gate_up, out, rows, w.hidden, grp, max_tiles, act, stream);
    grp.w_rows = w.hidden;
    if (w.down.bits == 4) launch_grouped<1, 3, 2, k_grouped>(w.down, act, rows, w.inter, grp, max_tiles, out, stream);
    else launch_grouped<2, 4, 1, k_grouped>(w.down, act, rows, w.inter, grp, max_tiles, out, stream);
}

}  // namespace qinfer::cuda
