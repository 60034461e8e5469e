// Helpers of the tensor-core GEMV for tiled 4-bit and 8-bit weights in the tile layout of model/quant_repack.h (the kernel:
// qgemv_ring.cuh): each lane holds 16 bytes per 64 values of K and 16-row block, i.e. four 16x16 tiles of the A
// operand of mma.m16n8k16. A code word becomes four bf16x2 registers with one shift and one LOP3 each
// ((w & 0x000F000F) | 0x43004300 is the pair 128 + q), and one HSUB2 subtracts 128 + zero exactly. The inputs (tokens
// as the 8 columns of B) are bf16, the products accumulate in fp32 per quantization group, and each group's partial
// sums are scaled and added into fp32 totals: the arithmetic of the fp32 GEMV, on tensor cores. Also here: the
// input staging kernel for rows too long to stage in the GEMV's shared memory, and dequantization for prefill.
#pragma once

#include <cuda_bf16.h>

#include <algorithm>
#include <type_traits>

#include "backends/cuda/common.cuh"
#include "backends/cuda/ops.h"
#include "backends/cuda/qstage.cuh"

namespace qinfer::cuda::mma4 {

constexpr int k_warps = 8;
constexpr int k_threads = k_warps * 32;

// The ring kernels' loads stay where they are written (requested a whole ring ahead): common.cuh's pinned load.
__device__ __forceinline__ uint4 load_stream(const uint4 * p) { return load_stream_pinned(p); }

__device__ __forceinline__ uint32_t lop3_and_or(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t d;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));  // (a & b) | c
    return d;
}

__device__ __forceinline__ uint32_t bf16x2_sub(uint32_t a, uint32_t b) {
    __nv_bfloat162 x = *reinterpret_cast<__nv_bfloat162 *>(&a), y = *reinterpret_cast<__nv_bfloat162 *>(&b);
    __nv_bfloat162 d = __hsub2(x, y);
    return *reinterpret_cast<uint32_t *>(&d);
}

__device__ __forceinline__ uint32_t bf16x2_add(uint32_t a, uint32_t b) {
    __nv_bfloat162 x = *reinterpret_cast<__nv_bfloat162 *>(&a), y = *reinterpret_cast<__nv_bfloat162 *>(&b);
    __nv_bfloat162 d = __hadd2(x, y);
    return *reinterpret_cast<uint32_t *>(&d);
}

__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// c = a b: a group's first k16 step, its sums starting from zero (no zeroing of c beforehand).
__device__ __forceinline__ void mma_bf16_fresh(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};\n"
                 : "=f"(c[0]), "=f"(c[1]), "=f"(c[2]), "=f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.0f));
}

// Inputs of the tensor-core GEMV: out bf16 [m, k_padded] = RMSNorm(x) or x, in act-order, zero beyond k. One block per token.
template <GemvIn IN> __global__ void __launch_bounds__(k_threads) stage_inputs_kernel(QuantMatrix w, GemvArgs a, bf16 * out) {
    pdl_wait();
    __shared__ float red[k_warps];
    const int tok = blockIdx.x;
    qstage::for_each_input<IN>(a, w.perm, tok, a.k, w.k_padded, red, [&](int i, float v) {
        if (i < w.k_padded) out[size_t(tok) * w.k_padded + i] = __float2bfloat16(v);
    });
}

// The fused GEMMs' inputs (qgemm_rs.cu, qgemm_mma.cu) in the tile layout's K order: x itself where its rows are
// that order and 16-byte aligned (no act-order, k a multiple of 8), else x gathered / padded into the scratch's head,
// bf16 [m, k_padded], by stage_inputs_kernel. x null when the scratch is too small for that.
struct GemmInput {
    const bf16 * x = nullptr;
    int ldx = 0;                // its row length
    size_t scratch_used = 0;    // bytes of the scratch it took
};
inline size_t gather_bytes(const QuantMatrix & w, int m) { return size_t(m) * w.k_padded * sizeof(bf16); }
// The gather's scratch whatever x's address (an unaligned x needs it on top).
inline size_t gather_scratch_bytes(const QuantMatrix & w, int m) { return w.perm || w.k % 8 != 0 ? gather_bytes(w, m) : 0; }
inline GemmInput gemm_input(const QuantMatrix & w, const bf16 * x, int m, void * scratch, size_t scratch_bytes, cudaStream_t stream) {
    if (!w.perm && w.k % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0) return {x, w.k, 0};
    const size_t bytes = gather_bytes(w, m);
    if (!scratch || scratch_bytes < bytes) return {};
    GemvArgs a;
    a.x = x;
    a.k = w.k;
    a.m = m;
    launch_kernel(stage_inputs_kernel<GemvIn::Bf16>, dim3(m), dim3(k_threads), 0, stream, w, a, static_cast<bf16 *>(scratch));
    CUDA_CHECK(cudaGetLastError());
    return {static_cast<const bf16 *>(scratch), w.k_padded, bytes};
}

// Where K splits' fp32 partial sums of `bytes` go: the scratch after its first `used` bytes; null where it is too small.
inline float * partial_scratch(void * scratch, size_t scratch_bytes, size_t used, size_t bytes) {
    return scratch && scratch_bytes >= used + bytes ? reinterpret_cast<float *>(static_cast<unsigned char *>(scratch) + used) : nullptr;
}

// y = the sum of K splits' fp32 partial sums, in split order (the same bits on every call): partial [splits, m * n],
// y [m * n] (bf16). The split GEMMs' second kernel (qgemm_mma.cu).
template <class Out> __global__ void reduce_splits_kernel(const float * partial, int splits, size_t mn, Out * y) {
    pdl_wait();
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < mn; i += size_t(gridDim.x) * blockDim.x) {
        float sum = 0.0f;
        for (int z = 0; z < splits; z++) sum += partial[size_t(z) * mn + i];
        y[i] = Out(sum);
    }
}

// The raw fp16 scales and zero points of rows r and r + 8 for group gi, as the register-dequantizing GEMMs load them
// a group ahead of their use (qgemm_mma.cu, qgemm_rs.cu). Through per-lane row pointers instead of this index
// arithmetic, 16 tokens were 3.5% slower on an H200 (qgemm_mma's main loop grew 782 -> 805 instructions;
// bench/results/2026-11-29-h200-batch1).
struct RawParams {
    uint16_t s[2];
    int z[2];
};

__device__ __forceinline__ RawParams load_params(const QuantMatrix & w, int64_t row, int gi) {
    RawParams p;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int64_t gidx = (row + 8 * h) * w.groups + gi;  // scales and zeros cover rows_padded
        p.s[h] = w.scales[gidx];
        p.z[h] = w.zeros ? int(w.zeros[gidx]) : w.const_zero;
    }
    return p;
}

// Lookup codes' (bitsandbytes NF4 / FP4) group parameters: the fp32 absmax of rows r and r + 8 for group gi.
struct LutParams {
    float absmax[2];
};
__device__ __forceinline__ LutParams load_absmax(const QuantMatrix & w, int64_t row, int gi) {
    return {{w.absmax[row * w.groups + gi], w.absmax[(row + 8) * w.groups + gi]}};  // absmax covers rows_padded
}
// A group's raw parameters for affine (RawParams) or lookup (LutParams) codes.
template <bool LUT> using GroupRaw = std::conditional_t<LUT, LutParams, RawParams>;
template <bool LUT> __device__ __forceinline__ GroupRaw<LUT> load_group(const QuantMatrix & w, int64_t row, int gi) {
    if constexpr (LUT) return load_absmax(w, row, gi);
    else return load_params(w, row, gi);
}

// Lookup codes hold each A register's bf16 pair in one byte (quant_repack.h), which indexes a table of the 256 pairs
// (table[b & 15], table[b >> 4]) in shared memory: `copies` copies of it, pair b's copy c at lut[b * copies + c], so
// that lane l reading copy l % copies meets no other lane in its bank when copies is 32 (at most two when 16). The
// values are rounded to bf16 (transformers rounds table * absmax instead: within bf16 tolerance). All `threads` threads
// of the block call; the table is ready after a __syncthreads().
__device__ __forceinline__ void fill_pair_table(const float * table, uint32_t * lut, int copies, int threads) {
    for (int b = threadIdx.x; b < 256; b += threads) {
        const __nv_bfloat162 pair = __floats2bfloat162_rn(table[b & 15], table[b >> 4]);
        const uint32_t bits = *reinterpret_cast<const uint32_t *>(&pair);
#pragma unroll 8
        for (int c = 0; c < copies; c++) lut[b * copies + (c + b) % copies] = bits;  // stores of a warp in distinct banks
    }
}
// A register of lookup codes: its pair from byte r of the code word (lut_lane: the table at this lane's copy).
__device__ __forceinline__ uint32_t lut_pair(const uint32_t * lut_lane, int copies, uint32_t word, int r) {
    return lut_lane[__byte_perm(word, 0, 0x4440 + r) * copies];
}

// The K splits of the register-dequantizing GEMMs (qgemm_mma.cu, qgemm_rs.cu) for a grid of `blocks` with `slots`
// resident at once: a grid of at least half a wave runs unsplit (a split shortens each block, whose pipeline fill and
// parameter loads then weigh more, and adds partial sums: 7B's Int4 gate_up at m 16, 296 blocks of 396 slots, took
// 46.4 us in qgemm_mma split 4 ways by a wave-cost rule, against 27.2 us for the m-1 GEMV; ncu,
// bench/results/2026-11-29-h200-qgemm-mma); a shorter one is split into at most one wave, `most` splits at most.
inline int k_splits(int64_t blocks, int64_t slots, int most) {
    return 2 * blocks >= slots ? 1 : int(std::clamp<int64_t>(slots / blocks, 1, std::max(1, most)));
}
// Bytes of the fp32 partial sums of `splits` K splits of y [m, w.rows] (none for one split).
inline size_t split_sums_bytes(const QuantMatrix & w, int m, int splits) {
    return splits > 1 ? size_t(splits) * m * w.rows * sizeof(float) : 0;
}
// A split GEMM's scratch for any m' <= m: the gathered inputs, then the most partial sums (splits_of(m'): its splits).
template <class SplitsOf> size_t split_gemm_scratch_bytes(const QuantMatrix & w, int m, SplitsOf && splits_of) {
    size_t partials = 0;
    for (int mm = 1; mm <= m; mm++) partials = std::max(partials, split_sums_bytes(w, mm, splits_of(mm)));
    return gather_scratch_bytes(w, m) + partials;
}
// y [m, w.rows] by a split GEMM: its inputs (gemm_input), the partial sums of `splits` K splits in the scratch after
// them (one split where they do not fit), launch(x, ldx, splits, partial) for the GEMM kernel (partial null for one
// split), then the splits added in order. False where the inputs cannot be gathered (nothing launched). (Leaving
// o_proj's and down's splits to the RMSNorm after them instead, no reduce launch: 7B GPTQ-Int4 batch 16 -7.5% on an
// H200, the 16-block norm reading 7-14 fp32 rows a row; bench/results/2026-12-01-h200-mma-warps.)
template <class Launch>
bool run_split_gemm(const QuantMatrix & w, const bf16 * x, int m, bf16 * y, int splits, void * scratch, size_t scratch_bytes,
                    cudaStream_t stream, Launch && launch) {
    const GemmInput in = gemm_input(w, x, m, scratch, scratch_bytes, stream);
    if (!in.x) return false;
    float * partial = splits > 1 ? partial_scratch(scratch, scratch_bytes, in.scratch_used, split_sums_bytes(w, m, splits)) : nullptr;
    if (!partial) splits = 1;
    launch(in.x, in.ldx, splits, partial);
    if (splits > 1) {
        const size_t mn = size_t(m) * w.rows;
        launch_kernel(reduce_splits_kernel<bf16>, dim3(unsigned(std::min<size_t>((mn + 255) / 256, 4096))), dim3(256), 0, stream,
                      static_cast<const float *>(partial), splits, mn, y);
        CUDA_CHECK(cudaGetLastError());
    }
    return true;
}

// Code field f (0..7: A register f % 4, its second element when f >= 4) of one tile word, given that word of each
// plane (8-bit: the low plane, then the high one). Lookup tiles hold a register's pair in one byte.
template <int PLANES, bool LUT> __device__ __forceinline__ uint32_t tile_code(const uint32_t (&word)[PLANES], int f) {
    const int shift = LUT ? 8 * (f % 4) + 4 * (f / 4) : 4 * f;
    uint32_t q = (word[0] >> shift) & 0xFu;
    if constexpr (PLANES == 2) q |= ((word[1] >> shift) & 0xFu) << 4;
    return q;
}

// One weight as transformers computes it, in fp32 (rounded to bf16 by the caller): scale (q - zero), or table[q] absmax.
template <bool LUT> __device__ __forceinline__ float tile_weight(const QuantMatrix & w, int64_t gidx, uint32_t q) {
    if constexpr (LUT) return w.table[q] * w.absmax[gidx];
    const float s = __half2float(__ushort_as_half(w.scales[gidx])), z = w.zeros ? float(w.zeros[gidx]) : float(w.const_zero);
    return s * (float(q) - z);
}

// The dequantized weight from the tile layout without act-order: bf16 [rows, k] (k a multiple of 8). A warp takes
// dequant_tiles consecutive 16 x 64 tiles (one lane's 16 bytes of codes per plane and tile), requests all their
// codes and group parameters at once, then turns each tile into bf16 in shared memory and writes it out in whole
// 128-byte lines; value = scale * (q - zero) (or table[q] * absmax) rounded once, as below.
// Where a tile lies within one quantization group (group a multiple of 64, every lookup format) its rows' parameters
// are loaded once per tile.
constexpr int k_dequant_tiles = 4;
// Tiles per warp for a code kind: 8-bit codes (two planes) take half as many, the same bytes of codes in flight with
// fewer registers than the 4-bit kernel (54: four blocks per SM). With four tiles they took 80 registers, three
// blocks per SM, and on an H100 7B's Int8 qkv took 0.024 ms against 0.020 now, gate_up 0.157 / 0.147, down 0.085 /
// 0.076 (bench/results/2026-11-27-h100-qgemm-splitk).
template <int PLANES> constexpr int dequant_tiles() { return k_dequant_tiles / PLANES; }

template <int PLANES, bool LUT> __global__ void __launch_bounds__(k_threads) dequantize_tiled_rows_kernel(QuantMatrix w, bf16 * out) {
    constexpr int ld = 72;  // tile row stride in bf16 (144 bytes: 16-byte aligned, conflict-free both ways)
    constexpr int T = dequant_tiles<PLANES>();
    __shared__ __align__(16) bf16 tile[k_warps][16 * ld];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int nkb = w.k_padded / 64;
    const int64_t tasks = int64_t(w.rows_padded / 16) * nkb;  // row block x K block, in the order the codes are stored
    const int64_t task0 = (int64_t(blockIdx.x) * k_warps + warp) * T;
    const bool tile_group = w.group % 64 == 0;
    // Rows g and g + 8 (h) of tile i: its group parameters (affine: scale, zero; lookup: absmax), when tile_group.
    uint32_t words[T][4][PLANES];  // [tile][word j][plane]
    float par_s[T][2], par_z[T][2];
#pragma unroll
    for (int i = 0; i < T; i++) {
        const int64_t task = task0 + i;
        if (task >= tasks) break;
#pragma unroll
        for (int p = 0; p < PLANES; p++) {
            const uint4 v = load_stream(reinterpret_cast<const uint4 *>(w.codes) + (task * PLANES + p) * 32 + lane);
            words[i][0][p] = v.x, words[i][1][p] = v.y, words[i][2][p] = v.z, words[i][3][p] = v.w;
        }
        if (tile_group) {
            const int kb = int(task % nkb);
            const int64_t rb = task / nkb;
            const int gi = min(kb * 64 / w.group, w.groups - 1);
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int64_t gidx = (rb * 16 + g + 8 * h) * w.groups + gi;  // scales and absmax cover rows_padded
                if constexpr (LUT) {
                    par_s[i][h] = w.absmax[gidx];
                } else {
                    par_s[i][h] = __half2float(__ushort_as_half(w.scales[gidx]));
                    par_z[i][h] = w.zeros ? float(w.zeros[gidx]) : float(w.const_zero);
                }
            }
        }
    }
    bf16 * tw = tile[warp];
#pragma unroll
    for (int i = 0; i < T; i++) {
        const int64_t task = task0 + i;
        if (task >= tasks) break;
        const int kb = int(task % nkb);
        const int64_t rb = task / nkb;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            // Word j holds positions 16j + {2t, 2t + 1, 2t + 8, 2t + 9} of rows g and g + 8 (field p: row g + 8 (p & 1),
            // position + 8 ((p >> 1) & 1) + (p >> 2)); 16 positions never straddle a group (groups are multiples of 32).
            const int gi = min((kb * 64 + 16 * j) / w.group, w.groups - 1);
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int64_t gidx = (rb * 16 + g + 8 * h) * w.groups + gi;
#pragma unroll
                for (int second = 0; second < 2; second++) {
                    const int p = h + 2 * second;
                    float v[2];
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        const uint32_t q = tile_code<PLANES, LUT>(words[i][j], p + 4 * e);
                        if (!tile_group) {
                            v[e] = tile_weight<LUT>(w, gidx, q);
                        } else if constexpr (LUT) {
                            v[e] = w.table[q] * par_s[i][h];
                        } else {
                            v[e] = par_s[i][h] * (float(q) - par_z[i][h]);
                        }
                    }
                    *reinterpret_cast<__nv_bfloat162 *>(tw + (g + 8 * h) * ld + 16 * j + 8 * second + 2 * t) = __floats2bfloat162_rn(v[0], v[1]);
                }
            }
        }
        __syncwarp();
        // Eight lanes per row: each store instruction writes four rows' whole 128-byte lines. (Two lanes per row, 16
        // rows per instruction, took 0.189 ms for 7B's Int4 gate_up against 0.131 this way: 1.81 -> 2.61 TB/s on an
        // H100, bench/results/2026-11-27-h100-qgemm-splitk.)
        const int col = (lane % 8) * 8, pos = kb * 64 + col;
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const int r = 4 * u + lane / 8;
            const int64_t row = rb * 16 + r;
            if (row < w.rows && pos < w.k) *reinterpret_cast<uint4 *>(out + row * w.k + pos) = *reinterpret_cast<const uint4 *>(tw + r * ld + col);
        }
        __syncwarp();
    }
}

// The dequantized weight from the tile layout with act-order: bf16 [rows, k] in input-channel order, one thread per
// code word of the low plane (scattered 2-byte stores).
template <int PLANES, bool LUT> __global__ void dequantize_tiled_kernel(QuantMatrix w, bf16 * out) {
    const int nkb = w.k_padded / 64;
    const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;  // one 32-bit word
    if (idx >= int64_t(w.rows_padded / 16) * nkb * 128) return;
    const int j = int(idx % 4), lane = int((idx / 4) % 32), kb = int((idx / 128) % nkb);
    const int64_t rb = idx / (128 * int64_t(nkb));
    const int g = lane / 4, t = lane % 4;
    uint32_t word[PLANES];
#pragma unroll
    for (int p = 0; p < PLANES; p++) word[p] = w.codes[((idx / 128) * PLANES + p) * 128 + idx % 128];
#pragma unroll
    for (int p = 0; p < 8; p++) {
        const int hi_row = p & 1, second = (p >> 1) & 1, odd = p >> 2;
        const int64_t row = rb * 16 + g + 8 * hi_row;
        const int pos = kb * 64 + j * 16 + 8 * second + 2 * t + odd;
        if (row >= w.rows || pos >= w.k) continue;
        const int64_t gidx = row * w.groups + pos / w.group;
        out[row * w.k + (w.perm ? w.perm[pos] : pos)] = __float2bfloat16(tile_weight<LUT>(w, gidx, tile_code<PLANES, LUT>(word, p)));
    }
}

}  // namespace qinfer::cuda::mma4
