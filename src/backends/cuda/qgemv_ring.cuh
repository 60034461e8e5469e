// Tensor-core GEMV for 4-bit affine weights in the tile layout of model/quant_repack.h (up to 8 tokens), built for
// memory-level parallelism: every warp keeps a ring of k_ring 64-wide K blocks of codes in flight (6 x 512 bytes),
// requesting block kb + k_ring as soon as block kb is multiplied, so the loads never drain between batches.
//
// A warp owns one 16-row block of one matrix (gate or up for the fused SwiGLU projection) over 1/KS of K; a block of
// 8 warps holds RBB row blocks x MATS matrices x KS parts and adds the parts up in shared memory. Few registers
// (three blocks per SM) and no block-level batches, so the grid fills the GPU in one wave for Qwen's shapes.
// Group scales and zero points of the block's rows are staged in shared memory once, packed per (row, group) as
// fp16 scale | bf16(128 + zero) << 16; the input rows are read from global memory (L1 hits) or, when they need
// RMSNorm, an act-order gather or zero padding, staged in shared memory by the block itself. The codes of the first
// k_ring blocks and the scales are requested before pdl_wait(): they do not depend on the kernel ahead.
//
// Dequantization is the one of qgemv_mma.cuh: (w & 0x000F000F) | 0x43004300 is the bf16 pair 128 + q, one HSUB2
// subtracts 128 + zero exactly, products accumulate in fp32 per group and each group's sums are scaled in fp32.
#pragma once

#include <climits>
#include <cuda_bf16.h>

#include "backends/cuda/common.cuh"
#include "backends/cuda/ops.h"
#include "backends/cuda/qgemv_mma.cuh"
#include "backends/cuda/qstage.cuh"

namespace qinfer::cuda::ring4 {

constexpr int k_warps = 8;
constexpr int k_threads = k_warps * 32;
constexpr int k_ring = 6;             // 64-wide K blocks in flight per warp (8 spilled at 80 registers)
constexpr int k_blocks_per_sm = 3;    // the launch bound the register budget is set for
constexpr int k_max_stage_bytes = 48 * 1024;  // largest input staged in shared memory (bf16 [m, k_padded])

static_assert(k_threads == qstage::k_threads, "the staging helpers reduce over qstage::k_threads threads");

enum class XSrc { Global, StageNorm, StageBf16 };

// One lane asks L2 for `bytes` of codes at p (Hopper's bulk prefetch; nothing below sm_90).
__device__ __forceinline__ void prefetch_l2(const void * p, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(p), "r"(bytes) : "memory");
#endif
}

__device__ __forceinline__ uint32_t pack_group(uint16_t scale, int zero) {
    return uint32_t(scale) | (uint32_t(__bfloat16_as_ushort(__float2bfloat16(128.0f + float(zero)))) << 16);
}

// Shared memory: the staged input (bf16 [m, k_padded], StageNorm/StageBf16 only), then the packed group parameters
// (uint32 [RBB * MATS * 16 rows, gstride]; gstride = groups | 1, so the 8 rows a warp reads fall in different banks).
__host__ __device__ inline int group_stride(int groups) { return groups | 1; }

template <GemvOut OUT, int KS, XSrc XS> __global__ void __launch_bounds__(k_threads, k_blocks_per_sm)
    qgemv_ring_kernel(QuantMatrix w, const bf16 * x_global, int ldx, GemvArgs a, int l2_ahead) {
    constexpr int MATS = OUT == GemvOut::SiluMulBf16 ? 2 : 1;
    constexpr int RBB = k_warps / (MATS * KS);
    static_assert(RBB >= 1 && RBB * MATS * KS == k_warps);
    extern __shared__ uint4 smem_raw[];
    __shared__ float red[k_warps][32][4];
    __shared__ float norm_red[k_warps];

    const int kp = w.k_padded, nkb = kp / 64, m = a.m, G = w.groups, gs = group_stride(G);
    const int n_rb = (a.n + 15) / 16;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int part = warp % KS, mat = (warp / KS) % MATS, rbl = warp / (KS * MATS);
    const int rb = blockIdx.x * RBB + rbl;
    const bool active = rb < n_rb;
    const int grb = mat == 0 ? rb : rb + n_rb;  // row block in the stacked weight
    const int kb_begin = part * nkb / KS, kb_end = (part + 1) * nkb / KS;
    const uint4 * src = reinterpret_cast<const uint4 *>(w.codes) + size_t(grb) * nkb * 32 + lane;  // tile kb at src + kb * 32

    // The first k_ring blocks of codes, requested before anything else.
    uint4 ring[k_ring];
#pragma unroll
    for (int u = 0; u < k_ring; u++) {
        ring[u] = active && kb_begin + u < kb_end ? mma4::load_stream(src + size_t(kb_begin + u) * 32) : make_uint4(0, 0, 0, 0);
    }
    // l2_ahead (set by qgemv.cu; 0: none): blocks [kb_begin + k_ring, + l2_ahead) of codes asked into L2 here, and each
    // round of the loop below moves that window on by k_ring.
    const uint4 * tile0 = src - lane;  // the row block's first tile
    auto prefetch_blocks = [&](int from, int to) {
        to = min(to, kb_end);
        if (lane == 0 && from < to) prefetch_l2(tile0 + size_t(from) * 32, uint32_t(to - from) * 512u);
    };
    if (active && l2_ahead > 0) prefetch_blocks(kb_begin + k_ring, kb_begin + k_ring + l2_ahead);

    bf16 * sx = reinterpret_cast<bf16 *>(smem_raw);
    uint32_t * sq = reinterpret_cast<uint32_t *>(smem_raw) + (XS == XSrc::Global ? 0 : size_t(m) * kp / 2);
    for (int i = threadIdx.x; i < RBB * MATS * 16 * G; i += k_threads) {
        const int lr = i / G, gi = i % G;
        const int rb_i = blockIdx.x * RBB + lr / (MATS * 16), mat_i = (lr / 16) % MATS;
        if (rb_i >= n_rb) continue;
        const size_t row = size_t(mat_i == 0 ? rb_i : rb_i + n_rb) * 16 + lr % 16;
        const size_t gidx = row * G + gi;
        sq[lr * gs + gi] = pack_group(w.scales[gidx], w.zeros ? int(w.zeros[gidx]) : w.const_zero);
    }

    pdl_wait();  // the inputs come from the kernel ahead
    if constexpr (XS != XSrc::Global) {
        constexpr GemvIn IN = XS == XSrc::StageNorm ? GemvIn::NormF32 : GemvIn::Bf16;
        for (int tok = 0; tok < m; tok++) {
            if (XS == XSrc::StageNorm && a.vec_norm) {  // set by qgemv.cu: aligned, no act-order
                qstage::stage_norm_vec<4>(a, tok, a.k, kp, sx + size_t(tok) * kp, norm_red);
                continue;
            }
            auto store = [&](int i, float v) {
                if (i < kp) sx[size_t(tok) * kp + i] = __float2bfloat16(v);
            };
            qstage::for_each_input<IN, decltype(store), false>(a, w.perm, tok, a.k, kp, norm_red, store);
        }
    }
    __syncthreads();

    // B fragments: token min(g, m - 1) (columns beyond m repeat the last token and are not written out).
    const uint32_t * xrow = reinterpret_cast<const uint32_t *>(XS == XSrc::Global ? x_global + size_t(min(g, m - 1)) * ldx
                                                                                  : sx + size_t(min(g, m - 1)) * kp);
    const uint32_t * q_lo = sq + (rbl * MATS + mat) * 16 * gs + g * gs, * q_hi = q_lo + 8 * gs;
    float tot[4] = {}, c[4] = {};
    // The current group's parameters. Groups are multiples of 32 positions (cuda_quant_unsupported), so a group can
    // only start at j = 0 or j = 2 of a 64-wide block, and positions only move forward: no division in the loop.
    int gi = min(kb_begin * 64 / w.group, G - 1);
    int group_end = gi == G - 1 ? INT_MAX : (gi + 1) * w.group;  // first position past the current group
    float s_lo, s_hi;
    uint32_t zz_lo, zz_hi;
    auto take = [&]() {
        const uint32_t plo = q_lo[gi], phi = q_hi[gi];
        s_lo = __half2float(__ushort_as_half(uint16_t(plo & 0xFFFFu)));
        s_hi = __half2float(__ushort_as_half(uint16_t(phi & 0xFFFFu)));
        zz_lo = __byte_perm(plo, 0, 0x3232);
        zz_hi = __byte_perm(phi, 0, 0x3232);
    };
    take();
    auto flush = [&]() {
        tot[0] = fmaf(s_lo, c[0], tot[0]);
        tot[1] = fmaf(s_lo, c[1], tot[1]);
        tot[2] = fmaf(s_hi, c[2], tot[2]);
        tot[3] = fmaf(s_hi, c[3], tot[3]);
        c[0] = c[1] = c[2] = c[3] = 0.0f;
    };
    // One 64-wide K block: xk points at the lane's first B word of the block (input pair kb * 64 + 2t), pos0 = kb * 64.
    auto multiply = [&](const uint4 & codes, const uint32_t * xk, int pos0) {
        uint32_t b[4][2];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            b[j][0] = xk[8 * j];      // inputs pos0 + 16j + 2t, + 1
            b[j][1] = xk[8 * j + 4];  // inputs pos0 + 16j + 2t + 8, + 9
        }
        const uint32_t * words = reinterpret_cast<const uint32_t *>(&codes);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            if ((j == 0 || j == 2) && pos0 + j * 16 >= group_end) {
                flush();
                gi++;
                group_end = gi == G - 1 ? INT_MAX : group_end + w.group;
                take();
            }
            constexpr uint32_t mask = 0x000F000Fu, magic = 0x43004300u;
            const uint32_t word = words[j];
            uint32_t fr[4];
            fr[0] = mma4::bf16x2_sub(mma4::lop3_and_or(word, mask, magic), zz_lo);
            fr[1] = mma4::bf16x2_sub(mma4::lop3_and_or(word >> 4, mask, magic), zz_hi);
            fr[2] = mma4::bf16x2_sub(mma4::lop3_and_or(word >> 8, mask, magic), zz_lo);
            fr[3] = mma4::bf16x2_sub(mma4::lop3_and_or(word >> 12, mask, magic), zz_hi);
            mma4::mma_bf16(c, fr, b[j][0], b[j][1]);
        }
    };
    if (active) {
        // Running pointers (no per-block address arithmetic): the codes k_ring blocks ahead, the lane's inputs. A ring
        // slot is multiplied first and then refilled (no register copy of the codes).
        const uint4 * ahead = src + size_t(kb_begin + k_ring) * 32;
        const uint32_t * xk = xrow + size_t(kb_begin) * 32 + t;
        int pos0 = kb_begin * 64;
        for (int kb0 = kb_begin; kb0 < kb_end; kb0 += k_ring) {
            if (l2_ahead > 0) prefetch_blocks(kb0 + k_ring + l2_ahead, kb0 + 2 * k_ring + l2_ahead);
#pragma unroll
            for (int u = 0; u < k_ring; u++) {
                if (kb0 + u >= kb_end) break;
                multiply(ring[u], xk, pos0);
                if (kb0 + u + k_ring < kb_end) ring[u] = mma4::load_stream(ahead);
                ahead += 32;
                xk += 32;
                pos0 += 64;
            }
        }
        flush();
    }

    // The KS parts and MATS matrices of each row block meet in shared memory; the first warp of the row block writes.
#pragma unroll
    for (int i = 0; i < 4; i++) red[warp][lane][i] = tot[i];
    __syncthreads();
    if (part != 0 || mat != 0 || !active) return;
    float sum[MATS][4] = {};
#pragma unroll
    for (int mt = 0; mt < MATS; mt++) {
#pragma unroll
        for (int p = 0; p < KS; p++) {
#pragma unroll
            for (int i = 0; i < 4; i++) sum[mt][i] += red[(rbl * MATS + mt) * KS + p][lane][i];
        }
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int o = rb * 16 + g + (i >= 2 ? 8 : 0), tok = 2 * t + (i & 1);
        if (o >= a.n || tok >= m) continue;
        const size_t dst = size_t(tok) * a.n + o;
        if constexpr (OUT == GemvOut::Bf16) {
            static_cast<bf16 *>(a.y)[dst] = __float2bfloat16(sum[0][i]);
        } else if constexpr (OUT == GemvOut::F32) {
            static_cast<float *>(a.y)[dst] = sum[0][i];
        } else if constexpr (OUT == GemvOut::AddF32) {
            static_cast<float *>(a.y)[dst] += sum[0][i];
        } else {
            // transformers rounds gate and up to bf16 before silu(gate) * up.
            const float gt = __bfloat162float(__float2bfloat16(sum[0][i])), up = __bfloat162float(__float2bfloat16(sum[MATS - 1][i]));
            static_cast<bf16 *>(a.y)[dst] = __float2bfloat16(silu(gt) * up);
        }
    }
}

}  // namespace qinfer::cuda::ring4
