// Stream-K tensor-core GEMV for 4-bit affine weights in the tile layout of model/quant_repack.h (up to 8 tokens).
//
// The work of a matrix is one flat sequence: items (16-row blocks of the stacked weight: gate blocks, then up blocks)
// x nkb 64-wide K blocks, which is also the order of the codes in memory (512 bytes per K block). The grid is one
// full wave of warps (W = resident blocks x 8) and warp w multiplies the flat range [w T / W, (w + 1) T / W): every
// warp gets the same number of code bytes whatever the shape, so there is no tail and no wave quantization, and short
// matrices still fill the GPU. A range may start or end inside an item: each piece (segment) leaves its fp32 partial
// sums in scratch, adds its length to the row block's counter, and the warp that completes the count adds the pieces
// of the row block in warp order (deterministic) and writes the output with its epilogue, then sets the counter back
// to zero. A warp that holds a whole row block of a one-matrix projection writes it directly.
//
// Each warp streams its codes through a ring of k_stages slots in shared memory (cp.async, k_stages - 1 blocks in
// flight), so the depth costs no registers and the slot index can follow the flat position. Group scales and zero
// points of the block's items are staged in shared memory, packed per (row, group) as fp16 scale | bf16(128 + zero)
// << 16; inputs needing RMSNorm, an act-order gather or zero padding are staged by the block. Codes and group
// parameters are requested before pdl_wait(): they do not depend on the kernel ahead.
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

namespace qinfer::cuda::streamk4 {

constexpr int k_warps = 8;
constexpr int k_threads = k_warps * 32;
constexpr int k_stages = 8;                   // ring slots per warp (512 bytes each); k_stages - 1 K blocks in flight
constexpr int k_blocks_per_sm = 4;            // the launch bound (64 registers per thread)
constexpr int k_min_blocks_per_warp = 4;      // K blocks per warp at least (small matrices get fewer warps)
constexpr int k_max_stage_bytes = 48 * 1024;  // largest input staged in shared memory (bf16 [m, k_padded])
constexpr size_t k_ring_bytes = size_t(k_warps) * k_stages * 512;

static_assert(k_threads == qstage::k_threads, "the staging helpers reduce over qstage::k_threads threads");

enum class XSrc { Global, StageNorm, StageBf16 };

// The shape of the flat work (host-computed).
struct Work {
    int n_rb = 0;             // 16-row blocks of the output
    int nkb = 0;              // 64-wide K blocks per row
    int64_t total = 0;        // items x nkb, items = row blocks x matrices
    int warps = 0;            // W = gridDim.x x k_warps
    int items_per_block = 0;  // most items one block's ranges touch (rows of staged group parameters / 16)
};

__host__ __device__ inline int64_t range_begin(int64_t w, int64_t W, int64_t T) { return w * T / W; }
// The last warp whose range begins at or before flat position f (the one holding f).
__host__ __device__ inline int warp_of(int64_t f, int64_t W, int64_t T) { return int(((f + 1) * W + T - 1) / T - 1); }
// Packed group parameters: gstride = groups | 1, so the 8 rows a warp reads fall in different banks.
__host__ __device__ inline int group_stride(int groups) { return groups | 1; }

__device__ __forceinline__ uint32_t pack_group(uint16_t scale, int zero) {
    return uint32_t(scale) | (uint32_t(__bfloat16_as_ushort(__float2bfloat16(128.0f + float(zero)))) << 16);
}

// Output rows rb * 16 + g (+ 8), tokens 2t (+ 1) of a lane's mma accumulator layout.
template <GemvOut OUT, int MATS> __device__ __forceinline__ void store_out(const GemvArgs & a, int rb, int g, int t, const float (&s)[MATS][4]) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int o = rb * 16 + g + (i >= 2 ? 8 : 0), tok = 2 * t + (i & 1);
        if (o >= a.n || tok >= a.m) continue;
        const size_t dst = size_t(tok) * a.n + o;
        if constexpr (OUT == GemvOut::Bf16) {
            static_cast<bf16 *>(a.y)[dst] = __float2bfloat16(s[0][i]);
        } else if constexpr (OUT == GemvOut::F32) {
            static_cast<float *>(a.y)[dst] = s[0][i];
        } else if constexpr (OUT == GemvOut::AddF32) {
            static_cast<float *>(a.y)[dst] += s[0][i];
        } else {
            // transformers rounds gate and up to bf16 before silu(gate) * up.
            const float gt = __bfloat162float(__float2bfloat16(s[0][i])), up = __bfloat162float(__float2bfloat16(s[MATS - 1][i]));
            static_cast<bf16 *>(a.y)[dst] = __float2bfloat16(silu(gt) * up);
        }
    }
}

// Shared memory: the code rings (k_ring_bytes), the staged input (bf16 [m, k_padded], StageNorm/StageBf16 only), the
// packed group parameters (uint32 [items_per_block x 16 rows, gstride]).
template <GemvOut OUT, XSrc XS> __global__ void __launch_bounds__(k_threads, k_blocks_per_sm)
    qgemv_streamk_kernel(QuantMatrix w, const bf16 * x_global, int ldx, GemvArgs a, QgemvScratch scratch, Work wk) {
    constexpr int MATS = OUT == GemvOut::SiluMulBf16 ? 2 : 1;
    extern __shared__ uint4 smem_raw[];
    __shared__ float norm_red[k_warps];

    const int kp = w.k_padded, nkb = wk.nkb, m = a.m, G = w.groups, gs = group_stride(G);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int wid = blockIdx.x * k_warps + warp;
    const int64_t T = wk.total, W = wk.warps;
    const int64_t f0 = range_begin(wid, W, T), f1 = range_begin(wid + 1, W, T);
    const int item0 = int(range_begin(int64_t(blockIdx.x) * k_warps, W, T) / nkb);
    const int item1 = int((range_begin(int64_t(blockIdx.x + 1) * k_warps, W, T) - 1) / nkb);

    // The first k_stages - 1 K blocks of codes, requested before anything else; one cp.async group per K block.
    uint4 * ring = smem_raw + size_t(warp) * k_stages * 32 + lane;  // slot s: ring[s * 32]
    const uint4 * src = reinterpret_cast<const uint4 *>(w.codes) + f0 * 32 + lane;
#pragma unroll
    for (int s = 0; s < k_stages - 1; s++) {
        if (f0 + s < f1) cp_async16(ring + s * 32, src + s * 32);
        cp_async_commit();
    }
    src += (k_stages - 1) * 32;  // the next K block to request

    bf16 * sx = reinterpret_cast<bf16 *>(reinterpret_cast<char *>(smem_raw) + k_ring_bytes);
    uint32_t * sq = reinterpret_cast<uint32_t *>(sx + (XS == XSrc::Global ? 0 : size_t(m) * kp));
    for (int i = threadIdx.x; i < (item1 - item0 + 1) * 16 * G; i += k_threads) {
        const int lr = i / G, gi = i % G;
        const size_t gidx = (size_t(item0) * 16 + lr) * G + gi;  // item = row block of the stacked weight
        sq[lr * gs + gi] = pack_group(w.scales[gidx], w.zeros ? int(w.zeros[gidx]) : w.const_zero);
    }

    pdl_wait();  // the inputs come from the kernel ahead
    if constexpr (XS != XSrc::Global) {
        constexpr GemvIn IN = XS == XSrc::StageNorm ? GemvIn::NormF32 : GemvIn::Bf16;
        for (int tok = 0; tok < m; tok++) {
            auto store = [&](int i, float v) {
                if (i < kp) sx[size_t(tok) * kp + i] = __float2bfloat16(v);
            };
            qstage::for_each_input<IN, decltype(store), false>(a, w.perm, tok, a.k, kp, norm_red, store);
        }
    }
    __syncthreads();
    if (f0 >= f1) return;  // more warps than K blocks (tiny matrices)

    // B fragments: token min(g, m - 1) (columns beyond m repeat the last token and are not written out).
    const uint32_t * xrow = reinterpret_cast<const uint32_t *>(XS == XSrc::Global ? x_global + size_t(min(g, m - 1)) * ldx
                                                                                  : sx + size_t(min(g, m - 1)) * kp);
    float tot[4] = {}, c[4] = {};
    int item = int(f0 / nkb);
    int64_t item_end = int64_t(item + 1) * nkb, seg_begin = f0;
    // The current item's group parameters and group; groups are multiples of 32 positions (cuda_quant_unsupported),
    // so a group can only start at j = 0 or j = 2 of a 64-wide block: no division in the loop.
    const uint32_t * q_lo = nullptr, * q_hi = nullptr;
    const uint32_t * xk = nullptr;  // the lane's first B word of the current K block
    int gi = 0, group_end = 0, pos0 = 0;
    float s_lo = 0, s_hi = 0;
    uint32_t zz_lo = 0, zz_hi = 0;
    auto take = [&]() {
        const uint32_t plo = q_lo[gi], phi = q_hi[gi];
        s_lo = __half2float(__ushort_as_half(uint16_t(plo & 0xFFFFu)));
        s_hi = __half2float(__ushort_as_half(uint16_t(phi & 0xFFFFu)));
        zz_lo = __byte_perm(plo, 0, 0x3232);
        zz_hi = __byte_perm(phi, 0, 0x3232);
    };
    auto start_item = [&](int kb) {
        q_lo = sq + (item - item0) * 16 * gs + g * gs;
        q_hi = q_lo + 8 * gs;
        gi = min(kb * 64 / w.group, G - 1);
        group_end = gi == G - 1 ? INT_MAX : (gi + 1) * w.group;  // first position past the current group
        take();
        xk = xrow + size_t(kb) * 32 + t;
        pos0 = kb * 64;
    };
    auto flush = [&]() {
        tot[0] = fmaf(s_lo, c[0], tot[0]);
        tot[1] = fmaf(s_lo, c[1], tot[1]);
        tot[2] = fmaf(s_hi, c[2], tot[2]);
        tot[3] = fmaf(s_hi, c[3], tot[3]);
        c[0] = c[1] = c[2] = c[3] = 0.0f;
    };
    // The segment of item `it` that this warp multiplied (len K blocks) is complete in tot.
    auto finish = [&](int it, int len) {
        flush();
        const int rb = MATS == 2 && it >= wk.n_rb ? it - wk.n_rb : it;
        if (MATS == 1 && len == nkb) {
            const float s[MATS][4] = {{tot[0], tot[1], tot[2], tot[3]}};
            store_out<OUT, MATS>(a, rb, g, t, s);
        } else {
            float * p = scratch.partial + (size_t(it) + wid) * m * 16;  // piece it + wid: unique per (item, warp)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int tok = 2 * t + (i & 1);
                if (tok < m) p[tok * 16 + g + (i >= 2 ? 8 : 0)] = tot[i];
            }
            __threadfence();
            __syncwarp();
            int done = 0;
            if (lane == 0) done = atomicAdd(scratch.counters + rb, len) + len;
            done = __shfl_sync(0xffffffffu, done, 0);
            if (done == MATS * nkb) {  // the last piece of the row block: add all pieces in warp order
                __threadfence();
                float s[MATS][4] = {};
#pragma unroll
                for (int mt = 0; mt < MATS; mt++) {
                    const int it2 = rb + mt * wk.n_rb;
                    const int w_last = warp_of(int64_t(it2 + 1) * nkb - 1, W, T);
                    for (int ww = warp_of(int64_t(it2) * nkb, W, T); ww <= w_last; ww++) {
                        if (range_begin(ww, W, T) == range_begin(ww + 1, W, T)) continue;  // an empty range
                        const float * q = scratch.partial + (size_t(it2) + ww) * m * 16;
#pragma unroll
                        for (int i = 0; i < 4; i++) {
                            const int tok = 2 * t + (i & 1);
                            if (tok < m) s[mt][i] += __ldcg(q + tok * 16 + g + (i >= 2 ? 8 : 0));
                        }
                    }
                }
                store_out<OUT, MATS>(a, rb, g, t, s);
                if (lane == 0) scratch.counters[rb] = 0;
            }
        }
        tot[0] = tot[1] = tot[2] = tot[3] = 0.0f;
    };
    // One 64-wide K block at pos0 of the current item.
    auto multiply = [&](const uint4 & codes) {
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

    start_item(int(f0 - int64_t(item) * nkb));
    int slot = 0;
    for (int64_t f = f0; f < f1; f++) {
        if (f == item_end) {
            finish(item, int(f - seg_begin));
            item++;
            item_end += nkb;
            seg_begin = f;
            start_item(0);
        }
        cp_async_wait<k_stages - 2>();  // K block f has landed
        // Refill the slot read in the previous step with K block f + k_stages - 1.
        uint4 * refill = ring + (slot == 0 ? k_stages - 1 : slot - 1) * 32;
        if (f + k_stages - 1 < f1) cp_async16(refill, src);
        cp_async_commit();
        src += 32;
        multiply(ring[slot * 32]);
        xk += 32;
        pos0 += 64;
        slot = slot == k_stages - 1 ? 0 : slot + 1;
    }
    finish(item, int(f1 - seg_begin));
}

}  // namespace qinfer::cuda::streamk4
