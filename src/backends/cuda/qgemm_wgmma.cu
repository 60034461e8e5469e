// Prefill GEMM for tiled 4- and 8-bit affine weights on Hopper (sm_90a): y[m, n] = x[m, k] W^T with W dequantized
// tile by tile into shared memory on its way into warpgroup MMAs, never written to global memory (the dequantize +
// cuBLASLt path writes and re-reads 2 bytes per weight, 0.19 ms for 7B's gate_up at any m). Measured on an H100
// (bench/results/2026-11-27-h100-qgemm, -27-h100-qgemm-splitk): 7B gate_up 1.9x faster than dequantize + cuBLASLt at
// m 64-128, 1.07x at 512, slower from 1024 (66% of bf16 cuBLASLt on the same weights, the split path 73%); weights of
// fewer row tiles than SMs only with K split, at small m and long K. The engine's rule (qgemm_pays) follows that.
//
// The weights are the A operand (rows of W along the MMA's M), the tokens the B operand:
//   block (token tile, row tile): 128 rows of W x BN tokens (BN 128 or 256), K in steps of 64 (one K block of the
//   tile layout, model/quant_repack.h), k_stages stages in shared memory guarded by mbarriers; two consumer
//   warpgroups of 64 rows (warp w owns 16-row block w of the tile) and one producer warp.
//   producer: per K block one tensor copy of the x tile (BN rows of 64 bf16, 128-byte swizzle; rows past m and
//     columns past k arrive as zeros) and one bulk copy per row block of its 512 bytes of codes per plane (the tile
//     layout keeps a row block's K block contiguous).
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
//     16-byte row chunks of y (rows past n and tokens past m are not written), or as fp32 partial sums of a K split.
//   split K: where the grid has fewer blocks than SMs (7B's qkv, o_proj, down: 28-36 row tiles) each block takes a
//     contiguous share of the K blocks and a second kernel adds the splits' sums in split order.
// Earlier forms, measured on an H100 (7B gate_up, m 1024; cuBLASLt 800 TFLOP/s on the same bf16 weights): A from the
// consumers' registers, 516 TFLOP/s (ptxas serialised the MMAs whose register operands were being written, C7513,
// so dequantization and MMAs alternated); a separate warpgroup of three dequantizing warps, 411 (too few warps).
// Grid: token tiles fastest, so the few token tiles of one row tile run together and read its codes from L2.
// Act-order weights, k not a multiple of 8 and unaligned x take x gathered / padded into bf16 [m, k_padded] first.
#include <cuda.h>

#include <algorithm>

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

// Blocks of k_bm weight rows (the grid's y).
int row_tiles(const QuantMatrix & w) { return (w.rows_padded + k_bm - 1) / k_bm; }

// A kernel's shape: BN tokens per block, STAGES stages, BLOCKS blocks per SM (launch bound; 2 leaves 112 registers
// per thread, enough for BN 128's 64 accumulators).
template <int BN, int PLANES, int STAGES> struct QgemmSmem {
    static constexpr int x_bytes = BN * 128;             // x tile: [BN tokens][64 K] bf16, 128-byte swizzle
    static constexpr int a_bytes = k_bm * 128;           // A tile: [128 rows][64 K] bf16, 128-byte swizzle
    static constexpr int code_bytes = 8 * PLANES * 512;  // the 8 row blocks' codes of one K block
    static constexpr int stage_bytes = x_bytes + a_bytes + code_bytes;
    // Staged output: fp32 [BN tokens][out_ld], rows of the tile along it (132: the warp's 4 token columns x 8 rows
    // fall in distinct banks); fp32 for the K splits' partial sums, rounded to bf16 on the way out otherwise.
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

// MODE: k_dense (one matrix, y [m, w.rows]); k_grouped (the routed experts of a step, moe_qgemm: block x is the
// routing's row tile x of BN sorted rows, its expert's rows of the stacked matrix multiplied; y [sorted rows,
// g.w_rows]); k_grouped_swiglu (the same over gate_up: a block's first four row blocks are 64 gate rows, the last
// four the same features' up rows, and y [sorted rows, g.w_rows / 2] = silu(bf16(gate)) * bf16(up)).
constexpr int k_dense = 0, k_grouped = 1, k_grouped_swiglu = 2;
struct Groups {
    const int * offsets = nullptr, * tiles = nullptr;  // MoeRouting's, built with tile_rows = BN
    int n_experts = 0, w_rows = 0;                     // rows of one expert in the stacked matrix
};

template <int BN, int PLANES, int STAGES, int BLOCKS, int MODE = k_dense>
__global__ void __launch_bounds__(k_threads, BLOCKS)
    qgemm_wgmma_kernel(QuantMatrix w, int m, bf16 * y, float * partial, const __grid_constant__ CUtensorMap x_map, Groups grp) {
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

    // Split K (gridDim.z > 1): block z multiplies K blocks [kb0, kb1) and writes fp32 partial sums to partial[z].
    const int nkb = w.k_padded / 64;
    const int kb0 = int(blockIdx.z) * nkb / int(gridDim.z), kb1 = (int(blockIdx.z) + 1) * nkb / int(gridDim.z), nk = kb1 - kb0;
    // The block's tokens (rows of x and y from tok0, tok_rows of them) and its matrix's row blocks (from rb_base, n_rb).
    int tok0 = blockIdx.x * BN, tok_rows = m - tok0, rb_base = 0, n_rb = w.rows_padded / 16;
    if constexpr (MODE != k_dense) {
        MoeTile tl;
        if (!moe_tile_of(grp.tiles, grp.offsets, grp.n_experts, blockIdx.x, BN, tl)) return;  // past the step's tiles
        tok0 = tl.row0;
        tok_rows = tl.rows;
        n_rb = grp.w_rows / 16;
        rb_base = tl.expert * n_rb;
    }
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
            const int kb = kb0 + i, s = i % k_stages;
            if (i >= k_stages) sm90::mbar_wait(&empty[s], (i / k_stages - 1) & 1);
            if (lane == 0) {
                sm90::mbar_arrive_expect_tx(&full[s], uint32_t(Layout::x_bytes + present * PLANES * 512));
                sm90::tma_load_2d(x_tile(s), &x_map, &full[s], kb * 64, tok0);
            }
            __syncwarp();
            const int rb = lane < k_bm / 16 ? rb_of(lane) : -1;
            if (rb >= 0) {
                const size_t at = (size_t(rb_base + rb) * nkb + kb) * PLANES * 512;
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
    load_params(kb0, next);
    {
        const Params p = next;
        dequantize_block(0, p);
        if (nk > 1) load_params(kb0 + 1, next);
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
            if (i + 2 < nk) load_params(kb0 + i + 2, next);
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
    const int n = MODE == k_dense ? w.rows : grp.w_rows, row_tile = blockIdx.y * k_bm;
    for (int c = threadIdx.x; c < BN * (k_bm / 8); c += k_consumer_threads) {
        const int tok = c / (k_bm / 8), row = row_tile + (c % (k_bm / 8)) * 8;
        if (tok >= tok_rows || row >= n) continue;
        const float * src = so + tok * Layout::out_ld + (row - row_tile);
        if (partial) {  // this split's fp32 sums, added up by mma4::reduce_splits_kernel
            float * dst = partial + (size_t(blockIdx.z) * m + tok0 + tok) * n + row;
            if (n % 8 == 0) {
                reinterpret_cast<float4 *>(dst)[0] = reinterpret_cast<const float4 *>(src)[0];
                reinterpret_cast<float4 *>(dst)[1] = reinterpret_cast<const float4 *>(src)[1];
            } else {
                for (int i = 0; i < 8 && row + i < n; i++) dst[i] = src[i];
            }
            continue;
        }
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

template <int BN, int PLANES, int STAGES, int BLOCKS>
void launch(const QuantMatrix & w, const bf16 * x, int kx, int m, bf16 * y, int splits, float * partial, cudaStream_t stream) {
    CUtensorMap x_map;
    if (!cache_tensor_map(&x_map, x, m, kx, BN)) QINFER_FAIL() << "qgemm: the tensor map of x [" << m << ", " << kx << "] was refused";
    constexpr size_t smem = QgemmSmem<BN, PLANES, STAGES>::bytes;
    static_assert(smem * BLOCKS <= 228 * 1024 - BLOCKS * 1024, "the blocks fit an SM's shared memory");
    static PerDevice<size_t> configured;  // once per instantiation
    allow_dynamic_smem(qgemm_wgmma_kernel<BN, PLANES, STAGES, BLOCKS>, smem, configured);
    const dim3 grid((m + BN - 1) / BN, row_tiles(w), splits);
    qgemm_wgmma_kernel<BN, PLANES, STAGES, BLOCKS><<<grid, k_threads, smem, stream>>>(w, m, y, splits > 1 ? partial : nullptr, x_map, Groups{});
    CUDA_CHECK(cudaGetLastError());
    if (splits > 1) {
        const size_t mn = size_t(m) * w.rows;
        mma4::reduce_splits_kernel<bf16><<<int(std::min<size_t>((mn + 255) / 256, 4096)), 256, 0, stream>>>(partial, splits, mn, y);
        CUDA_CHECK(cudaGetLastError());
    }
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
    qgemm_wgmma_kernel<BN, PLANES, STAGES, BLOCKS, MODE><<<grid, k_threads, smem, stream>>>(w, x_rows, y, nullptr, x_map, grp);
    CUDA_CHECK(cudaGetLastError());
}

// A launch's shape: the tile (1 = 256 tokens, 2 = 128, 3 = 128 with two blocks per SM; set_qgemm_tile overrides) and
// the K splits: where the grid has fewer blocks than SMs (qkv, o_proj and down of 7B: 28-36 row tiles), K is split
// until it does, at least 4 K blocks per split.
struct Shape {
    int tile, bn, splits;
    int blocks;  // token tiles x row tiles, before the split
};
int tile_override = 0;  // set_qgemm_tile
Shape shape_for(const QuantMatrix & w, int m) {
    Shape sh;
    sh.tile = tile_override ? tile_override : m > 128 ? 1 : w.bits == 4 ? 3 : 2;
    if (w.bits != 4 && sh.tile == 3) sh.tile = 2;
    sh.bn = sh.tile == 1 ? 256 : 128;
    sh.blocks = ((m + sh.bn - 1) / sh.bn) * row_tiles(w);
    const int slots = sm_count() * (sh.tile == 3 ? 2 : 1), most = std::max(1, (w.k_padded / 64) / 4);
    sh.splits = std::min(most, std::max(1, (slots + sh.blocks - 1) / sh.blocks));
    return sh;
}
// The splits' fp32 partial sums of y [m, w.rows] (none for one split).
size_t partial_bytes(const QuantMatrix & w, int m, const Shape & sh) {
    return sh.splits > 1 ? size_t(sh.splits) * m * w.rows * sizeof(float) : 0;
}

}  // namespace

void set_qgemm_tile(int tile) { tile_override = tile >= 1 && tile <= 3 ? tile : 0; }

bool qgemm_applies(const QuantMatrix & w) {
    return sm90a_device() && w.tiled && !w.lut && (w.bits == 4 || w.bits == 8) && w.group > 0;
}

// Scratch: the gathered inputs (act-order, k % 8) first, then the splits' partial sums. For any m' <= m: the most
// partial sums fill one token tile (m' 128 or 256) or all m rows.
size_t qgemm_scratch_bytes(const QuantMatrix & w, int m) {
    if (!qgemm_applies(w)) return 0;
    size_t partials = 0;
    for (int mm : {m, std::min(m, 128), std::min(m, 256)}) partials = std::max(partials, partial_bytes(w, mm, shape_for(w, mm)));
    return mma4::gather_scratch_bytes(w, m) + partials;
}

// On an H100 (bench/results/2026-11-27-h100-qgemm-splitk, 7B shapes, against dequantize + cuBLASLt with the
// whole-line dequantize stores) the fused kernel wins on gate_up (296 row tiles) up to m 512 (Int4 m 64-128: 1.9x,
// 256: 1.4x, 512: 1.07x; Int8 1.5x / 1.3x / 1.0x). With K split, down (k 18944) wins at m <= 128 (Int4 1.6x, Int8
// 1.1x); qkv and o_proj (k 3584, 6-10 K blocks per split) mostly lose (Int4 qkv 1.25x at m 16, 0.94x at 128; Int8
// 0.85-0.97x). Hence: m up to k_qgemm_max_m on weights of at least one row tile per SM; m up to k_qgemm_split_max_m
// where the K splits fill the SMs with at least k_split_min_kb K blocks each.
constexpr int k_qgemm_max_m = 512, k_qgemm_split_max_m = 128, k_split_min_kb = 16;
bool qgemm_pays(const QuantMatrix & w, int m) {
    if (!qgemm_applies(w) || m > k_qgemm_max_m) return false;
    if (row_tiles(w) >= sm_count()) return true;
    const Shape sh = shape_for(w, m);
    return m <= k_qgemm_split_max_m && sh.blocks * sh.splits >= sm_count() && (w.k_padded / 64) / sh.splits >= k_split_min_kb;
}

bool qgemm(const QuantMatrix & w, const bf16 * x, int m, bf16 * y, void * scratch, size_t scratch_bytes, cudaStream_t stream) {
    if (!qgemm_applies(w) || m <= 0) return false;
    const mma4::GemmInput in = mma4::gemm_input(w, x, m, scratch, scratch_bytes, stream);
    if (!in.x) return false;
    x = in.x;
    const int kx = in.ldx;
    // Tiles: 256 tokens, one block per SM, where m fills them; else 128 tokens, and for 4-bit codes two blocks per SM
    // of three stages each (one block's MMA waits and epilogue overlap the other's work). K split where the grid is
    // short of the SMs and the scratch holds the partial sums (else one split).
    Shape sh = shape_for(w, m);
    float * partial = sh.splits > 1 ? mma4::partial_scratch(scratch, scratch_bytes, in.scratch_used, partial_bytes(w, m, sh)) : nullptr;
    if (!partial) sh.splits = 1;
    if (w.bits == 4) {
        if (sh.tile == 1) launch<256, 1, 4, 1>(w, x, kx, m, y, sh.splits, partial, stream);
        else if (sh.tile == 2) launch<128, 1, 4, 1>(w, x, kx, m, y, sh.splits, partial, stream);
        else launch<128, 1, 3, 2>(w, x, kx, m, y, sh.splits, partial, stream);
    } else {
        if (sh.tile == 1) launch<256, 2, 4, 1>(w, x, kx, m, y, sh.splits, partial, stream);
        else launch<128, 2, 4, 1>(w, x, kx, m, y, sh.splits, partial, stream);
    }
    return true;
}

bool moe_qgemm_apply(const MoeQuantExperts & w) {
    return moe_qexperts_apply(w) && qgemm_applies(w.gate_up) && qgemm_applies(w.down);
}

void moe_qgemm(const bf16 * xn, int c, int top_k, const MoeQuantExperts & w, const MoeRouting & r, bf16 * act, bf16 * out, cudaStream_t stream) {
    QINFER_CHECK(moe_qgemm_apply(w)) << "MoE qgemm: the experts' layout or this device does not take the grouped kernel";
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
