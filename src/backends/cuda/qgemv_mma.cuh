// Tensor-core GEMV for 4-bit affine weights in the tile layout of model/quant_repack.h (up to 8 tokens).
//
// A warp owns 16 weight rows (32 for gate/up: the gate and up blocks of the same outputs) over a contiguous range of
// K; each lane reads 16 bytes per 64 values of K and row block, i.e. four 16x16 tiles of the A operand of
// mma.m16n8k16. A code word becomes four bf16x2 registers with one shift and one LOP3 each ((w & 0x000F000F) |
// 0x43004300 is the pair 128 + q), and one HSUB2 subtracts 128 + zero exactly. The inputs (tokens as the 8 columns
// of B) are bf16, the products accumulate in fp32 per quantization group, and each group's partial sums are scaled
// and added into fp32 totals: the arithmetic of the fp32 GEMV, on tensor cores.
#pragma once

#include <cuda_bf16.h>

#include "backends/cuda/common.cuh"
#include "backends/cuda/ops.h"
#include "backends/cuda/qstage.cuh"

namespace qinfer::cuda::mma4 {

constexpr int k_warps = 8;
constexpr int k_threads = k_warps * 32;
constexpr int k_batch = 4;  // 64-wide K blocks loaded ahead per warp

__device__ __forceinline__ uint4 load_stream(const uint4 * p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

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

__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 128 + z in both halves of a bf16x2.
__device__ __forceinline__ uint32_t zero_pair(float z) {
    const uint32_t h = __bfloat16_as_ushort(__float2bfloat16(128.0f + z));
    return h | (h << 16);
}

// KS warps split K for the same rows; a block holds k_warps / KS row blocks. No per-block staging: inputs arrive as
// bf16 rows [m, ldx] (normalised or gathered beforehand by stage_inputs_kernel when needed); each warp reads its B
// fragments straight from global memory (L1/L2 hits) at the start of each batch; group scales and zeros are read from
// global memory one group ahead. Blocks synchronise only to add up the KS partial sums. (A first version staged
// inputs, scales and zeros per block: 1% slower, removed.)
// Weights: the next batch is loaded into registers while the current one is multiplied (4 KB per warp in flight). A
// 4-deep cp.async ring in shared memory (12 KB in flight per warp, no spills) was 4% slower on an H100 (perf-log).
template <GemvOut OUT, int KS> __global__ void __launch_bounds__(k_threads, 2)
    qgemv_mma_kernel(QuantMatrix w, const bf16 * x, int ldx, GemvArgs a) {
    pdl_wait();
    constexpr int MATS = OUT == GemvOut::SiluMulBf16 ? 2 : 1;
    constexpr int RBPB = k_warps / KS;
    const int K64 = w.k_padded, nkb = K64 / 64, m = a.m, G = w.groups;
    const int n_rb = (a.n + 15) / 16;
    __shared__ float red[k_warps][32][MATS * 4];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, part = warp % KS, slot = warp / KS;
    const int g = lane / 4, t = lane % 4;
    const int rb = blockIdx.x * RBPB + slot;
    const bool active = rb < n_rb;
    const int kb_begin = part * nkb / KS, kb_end = (part + 1) * nkb / KS;
    auto row_block = [&](int mat) { return mat == 0 ? rb : rb + n_rb; };
    const uint4 * codes = reinterpret_cast<const uint4 *>(w.codes);
    const uint32_t * xrow = reinterpret_cast<const uint32_t *>(x + size_t(min(g, m - 1)) * ldx);

    uint4 next[MATS][k_batch];
    auto load_batch = [&](int kb0) {
#pragma unroll
        for (int mat = 0; mat < MATS; mat++) {
#pragma unroll
            for (int u = 0; u < k_batch; u++) {
                const int kb = kb0 + u;
                next[mat][u] = active && kb < kb_end ? load_stream(codes + (size_t(row_block(mat)) * nkb + kb) * 32 + lane) : make_uint4(0, 0, 0, 0);
            }
        }
    };
    // Scales and zeros of rows g and g + 8 for a group: the current one, and the next one already requested.
    struct GroupParams {
        uint16_t s_lo[MATS], s_hi[MATS];
        uint8_t z_lo[MATS], z_hi[MATS];
    };
    auto fetch_group = [&](int gi, GroupParams & p) {
        gi = min(gi, G - 1);
#pragma unroll
        for (int mat = 0; mat < MATS; mat++) {
            const size_t lo = (size_t(row_block(mat)) * 16 + g) * G + gi, hi = lo + size_t(8) * G;
            p.s_lo[mat] = w.scales[lo];
            p.s_hi[mat] = w.scales[hi];
            p.z_lo[mat] = w.zeros ? w.zeros[lo] : uint8_t(w.const_zero);
            p.z_hi[mat] = w.zeros ? w.zeros[hi] : uint8_t(w.const_zero);
        }
    };

    float tot[MATS][4] = {}, c[MATS][4] = {};
    float s_lo[MATS] = {}, s_hi[MATS] = {};
    uint32_t zz_lo[MATS] = {}, zz_hi[MATS] = {};
    auto flush = [&]() {
#pragma unroll
        for (int mat = 0; mat < MATS; mat++) {
            tot[mat][0] = fmaf(s_lo[mat], c[mat][0], tot[mat][0]);
            tot[mat][1] = fmaf(s_lo[mat], c[mat][1], tot[mat][1]);
            tot[mat][2] = fmaf(s_hi[mat], c[mat][2], tot[mat][2]);
            tot[mat][3] = fmaf(s_hi[mat], c[mat][3], tot[mat][3]);
            c[mat][0] = c[mat][1] = c[mat][2] = c[mat][3] = 0.0f;
        }
    };
    if (active && kb_begin < kb_end) {
        load_batch(kb_begin);
        int cur_group = min((kb_begin * 64) / w.group, G - 1);
        GroupParams pending;
        fetch_group(cur_group, pending);
        auto take = [&](const GroupParams & p) {
#pragma unroll
            for (int mat = 0; mat < MATS; mat++) {
                s_lo[mat] = __half2float(__ushort_as_half(p.s_lo[mat]));
                s_hi[mat] = __half2float(__ushort_as_half(p.s_hi[mat]));
                zz_lo[mat] = zero_pair(float(p.z_lo[mat]));
                zz_hi[mat] = zero_pair(float(p.z_hi[mat]));
            }
        };
        take(pending);
        fetch_group(cur_group + 1, pending);
        for (int kb0 = kb_begin; kb0 < kb_end; kb0 += k_batch) {
            uint4 cur[MATS][k_batch];
#pragma unroll
            for (int mat = 0; mat < MATS; mat++) {
#pragma unroll
                for (int u = 0; u < k_batch; u++) cur[mat][u] = next[mat][u];
            }
            if (kb0 + k_batch < kb_end) load_batch(kb0 + k_batch);
            uint32_t b[k_batch][4][2];
#pragma unroll
            for (int u = 0; u < k_batch; u++) {
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const int k0 = (kb0 + u) * 64 + j * 16;
                    const bool in = kb0 + u < kb_end;
                    b[u][j][0] = in ? __ldg(xrow + (k0 + 2 * t) / 2) : 0u;
                    b[u][j][1] = in ? __ldg(xrow + (k0 + 2 * t + 8) / 2) : 0u;
                }
            }
#pragma unroll
            for (int u = 0; u < k_batch; u++) {
                const int kb = kb0 + u;
                if (kb >= kb_end) break;
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const int k0 = kb * 64 + j * 16;
                    const int gi = min(k0 / w.group, G - 1);
                    if (gi != cur_group) {
                        flush();
                        cur_group = gi;
                        take(pending);
                        fetch_group(gi + 1, pending);
                    }
#pragma unroll
                    for (int mat = 0; mat < MATS; mat++) {
                        const uint32_t word = reinterpret_cast<const uint32_t *>(&cur[mat][u])[j];
                        constexpr uint32_t mask = 0x000F000Fu, magic = 0x43004300u;
                        uint32_t fr[4];
                        fr[0] = bf16x2_sub(lop3_and_or(word, mask, magic), zz_lo[mat]);
                        fr[1] = bf16x2_sub(lop3_and_or(word >> 4, mask, magic), zz_hi[mat]);
                        fr[2] = bf16x2_sub(lop3_and_or(word >> 8, mask, magic), zz_lo[mat]);
                        fr[3] = bf16x2_sub(lop3_and_or(word >> 12, mask, magic), zz_hi[mat]);
                        mma_bf16(c[mat], fr, b[u][j][0], b[u][j][1]);
                    }
                }
            }
        }
        flush();
    }
    if constexpr (KS > 1) {
#pragma unroll
        for (int mat = 0; mat < MATS; mat++) {
#pragma unroll
            for (int i = 0; i < 4; i++) red[warp][lane][mat * 4 + i] = tot[mat][i];
        }
        __syncthreads();
        if (part == 0) {
#pragma unroll
            for (int mat = 0; mat < MATS; mat++) {
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    float v = 0;
                    for (int p = 0; p < KS; p++) v += red[warp + p][lane][mat * 4 + i];
                    tot[mat][i] = v;
                }
            }
        }
    }
    if (part != 0 || !active) return;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int o = rb * 16 + g + (i >= 2 ? 8 : 0), tok = 2 * t + (i & 1);
        if (o >= a.n || tok >= m) continue;
        const size_t dst = size_t(tok) * a.n + o;
        if constexpr (OUT == GemvOut::Bf16) {
            static_cast<bf16 *>(a.y)[dst] = __float2bfloat16(tot[0][i]);
        } else if constexpr (OUT == GemvOut::F32) {
            static_cast<float *>(a.y)[dst] = tot[0][i];
        } else if constexpr (OUT == GemvOut::AddF32) {
            static_cast<float *>(a.y)[dst] += tot[0][i];
        } else {
            const float gt = __bfloat162float(__float2bfloat16(tot[0][i])), up = __bfloat162float(__float2bfloat16(tot[MATS - 1][i]));
            static_cast<bf16 *>(a.y)[dst] = __float2bfloat16(silu(gt) * up);
        }
    }
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

// The dequantized weight from the tile layout: bf16 [rows, k] in input-channel order.
__global__ void dequantize_tiled_kernel(QuantMatrix w, bf16 * out) {
    const int nkb = w.k_padded / 64;
    const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;  // one 32-bit word
    if (idx >= int64_t(w.rows_padded / 16) * nkb * 128) return;
    const int j = int(idx % 4), lane = int((idx / 4) % 32), kb = int((idx / 128) % nkb);
    const int64_t rb = idx / (128 * int64_t(nkb));
    const int g = lane / 4, t = lane % 4;
    const uint32_t v = w.codes[idx];
#pragma unroll
    for (int p = 0; p < 8; p++) {
        const int hi_row = p & 1, second = (p >> 1) & 1, odd = p >> 2;
        const int64_t row = rb * 16 + g + 8 * hi_row;
        const int pos = kb * 64 + j * 16 + 8 * second + 2 * t + odd;
        if (row >= w.rows || pos >= w.k) continue;
        const int64_t gi = row * w.groups + pos / w.group;
        const float s = __half2float(__ushort_as_half(w.scales[gi])), z = w.zeros ? float(w.zeros[gi]) : float(w.const_zero);
        const float q = float((v >> (4 * p)) & 0xFu);
        out[row * w.k + (w.perm ? w.perm[pos] : pos)] = __float2bfloat16(s * (q - z));
    }
}

}  // namespace qinfer::cuda::mma4
