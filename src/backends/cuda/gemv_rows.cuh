// Row GEMV kernels: y = epilogue(W x), W bf16 [n, k] read once with 16-byte loads, eight in flight per lane. A bf16
// input is read from global memory (shared by all blocks, so L1/L2 hits); an fp32 residual input is RMS-normalised
// into shared memory by every block (RMSNorm fused into the projection, qstage.cuh), behind the block's first weight
// loads. Each output row is computed by `wpr` warps that split k (reduced through shared memory), enough to fill the
// GPU when n is small. Rows of at most 1024 values (0.5B's lm_head: 151936 x 896) take half a warp each (LANES 16):
// a whole warp gave each lane only 3-4 of its 8 loads in flight. gemv_rows_bf16.cu and gemv_rows_norm.cu instantiate
// them for one input kind each (two compiler processes: this file alone took ~50 s to compile for sm_90a).
#pragma once

#include <algorithm>

#include "backends/cuda/gemv_common.cuh"
#include "backends/cuda/ops.h"
#include "backends/cuda/qstage.cuh"

namespace qinfer::cuda::gemv_rows {

namespace {

constexpr int k_warps = 8;
constexpr int k_threads = k_warps * 32;

// Sum over the LANES lanes of a row (LANES 32: the warp; 16: each half on its own).
template <int LANES> __device__ __forceinline__ float row_sum(float v) {
#pragma unroll
    for (int o = LANES / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// MIN_BLOCKS: blocks per SM the register allocation must allow (3 caps a thread at 80 registers; 1: no cap, 87-95).
template <int M, int WPR, GemvIn IN, GemvOut OUT, bool PAIR = true, int LANES = 32, int MIN_BLOCKS = 1>
__global__ void __launch_bounds__(k_threads, MIN_BLOCKS) gemv_kernel(GemvArgs a) {
    extern __shared__ uint4 smem_raw[];
    bf16 * xs = reinterpret_cast<bf16 *>(smem_raw);  // bf16 [M, k]
    __shared__ float red[k_warps][M][2];
    __shared__ float norm_red[k_warps];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int k = a.k;
    static_assert(LANES == 32 || (LANES == 16 && WPR == 1), "half-warp rows take one row per half");
    constexpr int rows_per_warp = 32 / LANES;
    constexpr int rows_per_block = k_warps / WPR * rows_per_warp;
    constexpr int n_mats = OUT == GemvOut::SiluMulBf16 ? 2 : 1;
    constexpr int stride = WPR * LANES;  // 16-byte chunks between a lane's loads
    constexpr int batch = 8;          // loads in flight per lane
    constexpr int per_mat = PAIR ? batch / n_mats : batch;  // a batch takes the same chunks of gate and up (SiluMulBf16)
    const int part = warp % WPR;
    const int rlane = lane % LANES;                                         // lane within the row
    const int warp_row = (warp / WPR) * rows_per_warp + lane / LANES;  // the row's place in the block's group
    const int chunks = k / 8;
    // Load u of a batch at `base`: matrix u / per_mat, chunk base + (u % per_mat) * stride.
    auto row_ptrs = [&](int row, const uint4 * (&w)[2]) {
#pragma unroll
        for (int mat = 0; mat < n_mats; mat++) w[mat] = reinterpret_cast<const uint4 *>(a.w + (int64_t(row) + int64_t(mat) * a.n) * k);
    };

    // The first batch of weights (first row) is requested before anything else: before pdl_wait() (the weights do
    // not depend on the kernel ahead, which may still be running under programmatic dependent launch) and before the
    // input is normalised, so the norm's reduction runs while those loads are in flight. For short rows (k <= 1024
    // with one warp per row) that is the whole row, of both matrices for SiluMulBf16 (PAIR, chosen in launch()).
    uint4 first[batch];
    bool have_first = false;
    auto load_first = [&](int row) {
        if (row >= a.n) return;
        const uint4 * w[2] = {};
        row_ptrs(row, w);
#pragma unroll
        for (int u = 0; u < batch; u++) {
            const int c = part * LANES + rlane + (u % per_mat) * stride;
            first[u] = c < chunks ? load_stream(w[u / per_mat] + c) : make_uint4(0, 0, 0, 0);
        }
        have_first = true;
    };
    load_first(blockIdx.x * rows_per_block + warp_row);
    pdl_wait();

    // Prologue: stage the input rows (float4 batches when aligned: one round trip to memory per 4096 values).
    if constexpr (IN == GemvIn::NormF32) {
        qstage::stage_norm_rows(a, M, xs, norm_red);
        __syncthreads();
    }
    // bf16 input is read straight from global memory: every block reads the same rows, so they stay in L1/L2.
    const bf16 * xsrc = IN == GemvIn::NormF32 ? xs : static_cast<const bf16 *>(a.x);

    for (int row0 = blockIdx.x * rows_per_block; row0 < a.n; row0 += gridDim.x * rows_per_block) {
        const int row = row0 + warp_row;
        float acc[M][2] = {};
        if (row < a.n) {
            const uint4 * w[2] = {};
            row_ptrs(row, w);
            // Batches of eight predicated loads, all issued before any arithmetic. Each matrix still sums its chunks
            // in the order lane, lane + stride, ... (PAIR false: one matrix after the other)
#pragma unroll
            for (int mat0 = 0; mat0 < (PAIR ? 1 : n_mats); mat0++) {
                for (int base = part * LANES + rlane; base < chunks; base += per_mat * stride) {
                    uint4 wv[batch];
                    if (have_first) {  // the prefetched batch is this one (first row, first base)
#pragma unroll
                        for (int u = 0; u < batch; u++) wv[u] = first[u];
                        have_first = false;
                    } else {
#pragma unroll
                        for (int u = 0; u < batch; u++) {
                            const int c = base + (u % per_mat) * stride;
                            wv[u] = c < chunks ? load_stream(w[PAIR ? u / per_mat : mat0] + c) : make_uint4(0, 0, 0, 0);
                        }
                    }
#pragma unroll
                    for (int u = 0; u < batch; u++) {
                        const int c = base + (u % per_mat) * stride;
                        if (c < chunks) {
#pragma unroll
                            for (int m = 0; m < M; m++) {
                                acc[m][PAIR ? u / per_mat : mat0] += dot8(wv[u], reinterpret_cast<const uint4 *>(xsrc + int64_t(m) * k)[c]);
                            }
                        }
                    }
                }
            }
        }
        // A block that strides (one-wave grids) asks for its next row's first batch before this row's reductions.
        load_first(row + gridDim.x * rows_per_block);
        float s[M][2];
#pragma unroll
        for (int m = 0; m < M; m++) {
#pragma unroll
            for (int mat = 0; mat < n_mats; mat++) s[m][mat] = row_sum<LANES>(acc[m][mat]);
        }
        if constexpr (WPR > 1) {
            // The row's warps meet in shared memory; the first of them finishes.
            if (lane == 0) {
#pragma unroll
                for (int m = 0; m < M; m++) {
                    for (int mat = 0; mat < n_mats; mat++) red[warp][m][mat] = s[m][mat];
                }
            }
            __syncthreads();
            if (part == 0) {
#pragma unroll
                for (int m = 0; m < M; m++) {
                    for (int mat = 0; mat < n_mats; mat++) {
                        float t = 0;
                        for (int p = 0; p < WPR; p++) t += red[warp + p][m][mat];
                        s[m][mat] = t;
                    }
                }
            }
            __syncthreads();
        }
        if (part == 0 && row < a.n) {
#pragma unroll
            for (int m = 0; m < M; m++) {
                if (rlane != m) continue;
                gemv_store<OUT>(a, m, row, s[m][0], s[m][n_mats - 1]);
            }
        }
    }
}

// One-warp rows of at most 2048 values run under the register cap that lets three blocks share an SM instead of two
// (80 registers, 16-44 bytes spilled). H100, alternated twice in one call (bench/results/2026-11-28-h100-rows3):
// 0.5B 1413.3 -> 1419.1 tok/s (+0.4%), 1.5B 672.4 -> 677.7 (+0.8%); 7B's rows (k 3584) lost 0.5% under it and keep
// two, except its lm_head (n >= 65536: only vocabularies): there, on an H200, 7B BF16 241.66 / 242.12 -> 243.83 /
// 243.66 tok/s, GPTQ-Int4 503.96 / 503.91 -> 510.92 / 510.46 (bench/results/2026-12-02-h200-nf4-gemm, call 4).
inline bool gemv_rows_three_blocks(int k, int n) { return k <= 2048 || n >= 65536; }

template <int M, int WPR, GemvIn IN, GemvOut OUT, int LANES = 32> void launch(const GemvArgs & a, cudaStream_t stream) {
    const size_t smem = IN == GemvIn::NormF32 ? size_t(M) * a.k * sizeof(bf16) : 0;
    // Gate and up share load batches only where that puts both whole rows into the first batch (k <= 1024 per warp
    // of a row): 0.5B's gate_up, +5% decode; where rows are longer, two streams per batch were ~1% slower (1.5B,
    // 7B; H100, bench/results/2026-11-26-h100-a050da2).
    constexpr int pair_max_k = 1024 * WPR;
    const bool pair = OUT != GemvOut::SiluMulBf16 || a.k <= pair_max_k;
    const bool three = WPR == 1 && gemv_rows_three_blocks(a.k, a.n);
    auto kernel = pair ? gemv_kernel<M, WPR, IN, OUT, true, LANES> : gemv_kernel<M, WPR, IN, OUT, false, LANES>;
    if constexpr (WPR == 1) {
        if (three) kernel = pair ? gemv_kernel<M, WPR, IN, OUT, true, LANES, 3> : gemv_kernel<M, WPR, IN, OUT, false, LANES, 3>;
    }
    const int variant = int(pair) + 2 * int(three);
    static PerDevice<size_t> configured[4];  // per kernel
    if (IN == GemvIn::NormF32) allow_dynamic_smem(kernel, smem, configured[variant]);
    constexpr int rows_per_block = k_warps / WPR * (32 / LANES);
    // One wave of resident blocks strides over the row groups: under programmatic dependent launch the next kernel's
    // blocks, resident early, would otherwise take the slots of this kernel's later waves. On an H100 (PDL on, decode
    // tok/s, bench/results/2026-11-27-h100-wave-pdl): 1.5B +1.8%, 7B +0.2% (-0.3% without PDL), 0.5B -0.5% (noise).
    const int needed = (a.n + rows_per_block - 1) / rows_per_block;
    static PerDevice<Occupancy> occupancy[4];  // per kernel
    int blocks = std::min(needed, std::max(1, resident_blocks(kernel, k_threads, smem, occupancy[variant])) * sm_count());
    // As few blocks as take the same number of rounds, so that the last round is as full as the others: 1.5B's
    // gate_up (1120 row groups) over 224 blocks in five full rounds instead of 264 with a fifth a quarter full.
    // H100, alternated in one call: 1.5B 652.3 -> 662.4 tok/s, 0.5B 1362.4 -> 1386.4, 7B level (264 either way;
    // bench/results/2026-11-28-h100-even-rounds).
    const int rounds = (needed + blocks - 1) / blocks;
    blocks = (needed + rounds - 1) / rounds;
    launch_kernel(kernel, blocks, k_threads, smem, stream, a);
}

// Warps per row: one warp per row for tall matrices; short ones (o_proj/down of small models) split k over more
// warps so that every SM still gets a couple of blocks.
// Rows of at most 1024 values (128 chunks: 8 loads per lane of half a warp) take half a warp each where every SM still
// gets two blocks of 16 rows, unless set_gemv_half_rows(false) (tests); not for SiluMulBf16, whose
// gate and up rows already share a warp's batch.
template <int M, GemvIn IN, GemvOut OUT> void launch_wpr(const GemvArgs & a, cudaStream_t stream) {
    const int rows_per_block = a.n / (2 * sm_count());
    if constexpr (OUT != GemvOut::SiluMulBf16) {
        if (rows_per_block >= 16 && a.k <= 1024 && gemv_half_rows_on()) return launch<M, 1, IN, OUT, 16>(a, stream);
    }
    if (rows_per_block >= 8) return launch<M, 1, IN, OUT>(a, stream);
    if (rows_per_block >= 4) return launch<M, 2, IN, OUT>(a, stream);
    if (rows_per_block >= 2) return launch<M, 4, IN, OUT>(a, stream);
    return launch<M, 8, IN, OUT>(a, stream);
}

template <int M, GemvIn IN> void dispatch_out(const GemvArgs & a, GemvOut out, cudaStream_t s) {
    switch (out) {
    case GemvOut::Bf16: return launch_wpr<M, IN, GemvOut::Bf16>(a, s);
    case GemvOut::F32: return launch_wpr<M, IN, GemvOut::F32>(a, s);
    case GemvOut::AddF32: return launch_wpr<M, IN, GemvOut::AddF32>(a, s);
    case GemvOut::SiluMulBf16: return launch_wpr<M, IN, GemvOut::SiluMulBf16>(a, s);
    }
    QINFER_FAIL() << "gemv: unsupported output kind";
}

// The row kernels for input kind IN, m = 1..4 tokens (gemv_rows_bf16.cu, gemv_rows_norm.cu: one compiler process each).
template <GemvIn IN> void dispatch(const GemvArgs & a, GemvOut out, cudaStream_t s) {
    switch (a.m) {
    case 1: return dispatch_out<1, IN>(a, out, s);
    case 2: return dispatch_out<2, IN>(a, out, s);
    case 3: return dispatch_out<3, IN>(a, out, s);
    case 4: return dispatch_out<4, IN>(a, out, s);
    default: QINFER_FAIL() << "gemv: m = " << a.m << " (1..4 supported; use gemm)";
    }
}

}  // namespace

}  // namespace qinfer::cuda::gemv_rows
