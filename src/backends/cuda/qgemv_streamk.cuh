// Stream-K tensor-core GEMV for 4-bit affine weights in the tile layout of model/quant_repack.h (up to 8 tokens).
//
// The work of a matrix is one flat sequence of 64-wide K blocks (512 bytes of codes each): row block by row block
// (16 output rows), and within a row block the gate matrix and then the up matrix for the fused SwiGLU projection.
// The grid is one full wave of blocks; block b multiplies an equal share [B0, B1) of the sequence and its 8 warps
// split that share evenly, so every warp streams the same number of code bytes whatever the shape: no tail, no wave
// quantization, and short matrices still fill the GPU.
//
// A warp that covers a whole row block writes its outputs directly. Pieces of row blocks cut by a warp boundary are
// left in shared memory and added up by the block at the end, in warp order; a row block cut by a block boundary
// leaves the block's sum in scratch, adds its length to the row block's counter, and the block that completes the
// count adds the pieces in block order and writes the outputs, then sets the counter back to zero. The order of every
// sum is fixed by the shape, so results do not depend on timing.
//
// Each warp streams its codes through a ring of k_stages slots in shared memory (cp.async, k_stages - 1 K blocks in
// flight), so the depth costs no registers. Group scales and zero points of the block's rows are staged in shared
// memory, packed per (row, group) as fp16 scale | bf16(128 + zero) << 16; inputs needing RMSNorm, an act-order gather
// or zero padding are staged by the block. Codes and group parameters are requested before pdl_wait(): they do not
// depend on the kernel ahead.
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
constexpr int k_min_blocks_per_warp = 4;      // K blocks per warp at least (small matrices get fewer blocks)
constexpr int k_max_stage_bytes = 48 * 1024;  // largest input staged in shared memory (bf16 [m, k_padded])
constexpr size_t k_ring_bytes = size_t(k_warps) * k_stages * 512;

static_assert(k_threads == qstage::k_threads, "the staging helpers reduce over qstage::k_threads threads");

enum class XSrc { Global, StageNorm, StageBf16 };

// The flat work (host-computed): n_rb row blocks of rb_len = matrices x nkb K blocks; block b of the grid covers
// [b base + min(b, rem), ...), base or base + 1 K blocks.
struct Work {
    int n_rb = 0, nkb = 0, rb_len = 0;
    int total = 0;  // n_rb x rb_len
    int base = 0, rem = 0;
    int rbs_per_block = 0;  // most row blocks one block touches (staged group parameters)
};

__host__ __device__ inline int block_begin(int b, const Work & wk) { return b * wk.base + (b < wk.rem ? b : wk.rem); }
// The block holding flat position f (base >= 1).
__device__ inline int block_of(int f, const Work & wk) {
    const int big = wk.rem * (wk.base + 1);
    return f < big ? f / (wk.base + 1) : wk.rem + (f - big) / wk.base;
}
// Packed group parameters: gstride = groups | 1, so the 8 rows a warp reads fall in different banks.
__host__ __device__ inline int group_stride(int groups) { return groups | 1; }
// Shared memory after the rings and the staged input: group parameters, then the warps' pieces.
__host__ __device__ inline size_t param_words(int rbs_per_block, int mats, int groups) { return size_t(rbs_per_block) * mats * 16 * group_stride(groups); }
__host__ __device__ inline size_t piece_floats(int mats, int m) { return size_t(k_warps) * 2 * mats * m * 16; }

__device__ __forceinline__ uint32_t pack_group(uint16_t scale, int zero) {
    return uint32_t(scale) | (uint32_t(__bfloat16_as_ushort(__float2bfloat16(128.0f + float(zero)))) << 16);
}

// Output row o of token tok from the sums s0 (and s1, the up projection, for SiluMulBf16).
template <GemvOut OUT> __device__ __forceinline__ void store_value(const GemvArgs & a, int tok, int o, float s0, float s1) {
    if (o >= a.n || tok >= a.m) return;
    const size_t dst = size_t(tok) * a.n + o;
    if constexpr (OUT == GemvOut::Bf16) {
        static_cast<bf16 *>(a.y)[dst] = __float2bfloat16(s0);
    } else if constexpr (OUT == GemvOut::F32) {
        static_cast<float *>(a.y)[dst] = s0;
    } else if constexpr (OUT == GemvOut::AddF32) {
        static_cast<float *>(a.y)[dst] += s0;
    } else {
        // transformers rounds gate and up to bf16 before silu(gate) * up.
        const float gt = __bfloat162float(__float2bfloat16(s0)), up = __bfloat162float(__float2bfloat16(s1));
        static_cast<bf16 *>(a.y)[dst] = __float2bfloat16(silu(gt) * up);
    }
}

// Lane (g, t) of an m16n8 accumulator holds rows g and g + 8 for tokens 2t and 2t + 1 (value i: row g + 8 (i >= 2),
// token 2t + (i & 1)).
__device__ __forceinline__ int frag_row(int g, int i) { return g + (i >= 2 ? 8 : 0); }
__device__ __forceinline__ int frag_tok(int t, int i) { return 2 * t + (i & 1); }

template <GemvOut OUT, XSrc XS> __global__ void __launch_bounds__(k_threads, k_blocks_per_sm)
    qgemv_streamk_kernel(QuantMatrix w, const bf16 * x_global, int ldx, GemvArgs a, QgemvScratch scratch, Work wk) {
    constexpr int MATS = OUT == GemvOut::SiluMulBf16 ? 2 : 1;
    extern __shared__ uint4 smem_raw[];
    __shared__ float norm_red[k_warps];
    __shared__ int slot_rb[k_warps * 2], slot_len[k_warps * 2];  // the warps' pieces: row block (-1: none), K blocks

    const int kp = w.k_padded, nkb = wk.nkb, L = wk.rb_len, m = a.m, G = w.groups, gs = group_stride(G);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int B0 = block_begin(blockIdx.x, wk), B1 = block_begin(blockIdx.x + 1, wk);
    const int f0 = B0 + warp * (B1 - B0) / k_warps, f1 = B0 + (warp + 1) * (B1 - B0) / k_warps;
    const int rb_first = B0 / L, rb_last = (B1 - 1) / L;

    // Codes of flat position f: row block rb, matrix mat, K block kb at ((mat n_rb + rb) nkb + kb) x 512 bytes.
    auto code_ptr = [&](int f) {
        const int rb = f / L, r = f - rb * L, mat = MATS == 1 ? 0 : r / nkb, kb = r - mat * nkb;
        return reinterpret_cast<const uint4 *>(w.codes) + (size_t(mat * wk.n_rb + rb) * nkb + kb) * 32 + lane;
    };
    // The requester runs k_stages - 1 K blocks ahead of the multiplication; one cp.async group per K block.
    uint4 * ring = smem_raw + size_t(warp) * k_stages * 32 + lane;  // slot s: ring[s * 32]
    int f_req = f0, req_left = 0;
    const uint4 * src = nullptr;
    auto request = [&](uint4 * dst) {
        if (f_req < f1) {
            if (req_left == 0) {
                src = code_ptr(f_req);
                req_left = nkb - (f_req % nkb);
            }
            cp_async16(dst, src);
            src += 32;
            req_left--;
        }
        cp_async_commit();
        f_req++;
    };
#pragma unroll
    for (int s = 0; s < k_stages - 1; s++) request(ring + s * 32);

    bf16 * sx = reinterpret_cast<bf16 *>(reinterpret_cast<char *>(smem_raw) + k_ring_bytes);
    uint32_t * sq = reinterpret_cast<uint32_t *>(sx + (XS == XSrc::Global ? 0 : size_t(m) * kp));
    float * pieces = reinterpret_cast<float *>(sq + param_words(wk.rbs_per_block, MATS, G));  // [warp][slot][mat][m][16]
    for (int i = threadIdx.x; i < (rb_last - rb_first + 1) * MATS * 16 * G; i += k_threads) {
        const int lr = i / G, gi = i % G;
        const int rb = rb_first + lr / (MATS * 16), mat = (lr / 16) % MATS;
        const size_t gidx = (size_t(mat * wk.n_rb + rb) * 16 + lr % 16) * G + gi;
        sq[lr * gs + gi] = pack_group(w.scales[gidx], w.zeros ? int(w.zeros[gidx]) : w.const_zero);
    }
    if (lane < 2) slot_rb[warp * 2 + lane] = -1;

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

    // B fragments: token min(g, m - 1) (columns beyond m repeat the last token and are not written out).
    const uint32_t * xrow = reinterpret_cast<const uint32_t *>(XS == XSrc::Global ? x_global + size_t(min(g, m - 1)) * ldx
                                                                                  : sx + size_t(min(g, m - 1)) * kp);
    float tot[4] = {}, gate[4] = {}, c[4] = {};
    int rb = f0 / L, mat = MATS == 1 ? 0 : (f0 - rb * L) / nkb;
    int seg_end = f0 - (f0 - rb * L - mat * nkb) + nkb;  // end of the current (row block, matrix)
    int rb_start = f0;                                    // where this warp's piece of the row block began
    int n_slots = 0;
    // The current matrix's group parameters and group; groups are multiples of 32 positions
    // (cuda_quant_unsupported), so a group can only start at j = 0 or j = 2 of a 64-wide block.
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
    auto start_segment = [&](int kb) {
        q_lo = sq + ((rb - rb_first) * MATS + mat) * 16 * gs + g * gs;
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
    // This warp's sums of row block rb over `len` K blocks are complete (gate, tot): the outputs, or a piece.
    auto finish_rb = [&](int len) {
        if (len == L) {
#pragma unroll
            for (int i = 0; i < 4; i++) store_value<OUT>(a, frag_tok(t, i), rb * 16 + frag_row(g, i), MATS == 2 ? gate[i] : tot[i], tot[i]);
        } else {
            const int s = warp * 2 + n_slots++;
            float * p = pieces + size_t(s) * MATS * m * 16;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int tok = frag_tok(t, i);
                if (tok >= m) continue;
                if constexpr (MATS == 2) p[tok * 16 + frag_row(g, i)] = gate[i];
                p[(MATS - 1) * m * 16 + tok * 16 + frag_row(g, i)] = tot[i];
            }
            if (lane == 0) {
                slot_rb[s] = rb;
                slot_len[s] = len;
            }
        }
#pragma unroll
        for (int i = 0; i < 4; i++) tot[i] = gate[i] = 0.0f;
    };
    // One 64-wide K block at pos0 of the current matrix.
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

    if (f0 < f1) {
        start_segment(f0 - rb * L - mat * nkb);
        int slot = 0;
        for (int f = f0; f < f1; f++) {
            if (f == seg_end) {
                flush();
                if (MATS == 2 && mat == 0) {
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        gate[i] = tot[i];
                        tot[i] = 0.0f;
                    }
                    mat = 1;
                } else {
                    finish_rb(f - rb_start);
                    rb++;
                    mat = 0;
                    rb_start = f;
                }
                seg_end += nkb;
                start_segment(0);
            }
            cp_async_wait<k_stages - 2>();                          // K block f has landed
            request(ring + (slot == 0 ? k_stages - 1 : slot - 1) * 32);  // refill the slot read in the previous step
            multiply(ring[slot * 32]);
            xk += 32;
            pos0 += 64;
            slot = slot == k_stages - 1 ? 0 : slot + 1;
        }
        flush();
        if (MATS == 2 && mat == 0) {  // the range ended inside a gate matrix: its sums are the gate's
#pragma unroll
            for (int i = 0; i < 4; i++) {
                gate[i] = tot[i];
                tot[i] = 0.0f;
            }
        }
        finish_rb(f1 - rb_start);
    }
    cp_async_wait<0>();
    __syncthreads();

    // The block's pieces, in warp order, grouped by row block (slots of one row block are consecutive); group j is
    // added by warp j % 8.
    int group = -1, prev = -1, g_first = 0;
    for (int s = 0; s <= 2 * k_warps; s++) {
        const int r = s < 2 * k_warps ? slot_rb[s] : -2;
        if (r == -1 || r == prev) continue;
        // Slots [g_first, s) holding row block prev form a group.
        if (prev >= 0 && group % k_warps == warp) {
            int len = 0;
            for (int u = g_first; u < s; u++) len += slot_rb[u] == prev ? slot_len[u] : 0;
            const int vals = m * 16;
            const bool complete = len == L;
            float * piece = scratch.partial + (size_t(prev) + blockIdx.x) * MATS * vals;
            for (int v = lane; v < vals; v += 32) {
                float s0 = 0, s1 = 0;
                for (int u = g_first; u < s; u++) {
                    if (slot_rb[u] != prev) continue;
                    const float * p = pieces + size_t(u) * MATS * vals;
                    s0 += p[v];
                    if constexpr (MATS == 2) s1 += p[vals + v];
                }
                if (complete) {
                    store_value<OUT>(a, v / 16, prev * 16 + v % 16, s0, s1);
                } else {
                    piece[v] = s0;
                    if constexpr (MATS == 2) piece[vals + v] = s1;
                }
            }
            if (!complete) {
                __threadfence();
                __syncwarp();
                int done = 0;
                if (lane == 0) done = atomicAdd(scratch.counters + prev, len) + len;
                done = __shfl_sync(0xffffffffu, done, 0);
                if (done == L) {  // the last piece of the row block: add the blocks' pieces in block order
                    __threadfence();
                    const int b_last = block_of(prev * L + L - 1, wk);
                    for (int v = lane; v < vals; v += 32) {
                        float s0 = 0, s1 = 0;
                        for (int b = block_of(prev * L, wk); b <= b_last; b++) {
                            const float * p = scratch.partial + (size_t(prev) + b) * MATS * vals;
                            s0 += __ldcg(p + v);
                            if constexpr (MATS == 2) s1 += __ldcg(p + vals + v);
                        }
                        store_value<OUT>(a, v / 16, prev * 16 + v % 16, s0, s1);
                    }
                    if (lane == 0) scratch.counters[prev] = 0;
                }
            }
        }
        group++;
        prev = r;
        g_first = s;
    }
}

}  // namespace qinfer::cuda::streamk4
