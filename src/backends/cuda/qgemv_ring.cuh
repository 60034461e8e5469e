// Tensor-core GEMV for 4- and 8-bit affine weights in the tile layout of model/quant_repack.h (up to 8 tokens), built
// for memory-level parallelism: every warp keeps a ring of k_ring 16-byte loads of codes in flight (6 64-wide K
// blocks of 4-bit codes, 3 of 8-bit), requesting a block as soon as the one in its slot is multiplied, so the loads
// never drain between batches.
//
// A warp owns one 16-row block of one matrix (gate or up for the fused SwiGLU projection) over 1/KS of K; a block of
// 8 warps holds RBB row blocks x MATS matrices x KS parts and adds the parts up in shared memory. Few registers
// (three blocks per SM) and no block-level batches, so the grid fills the GPU in one wave for Qwen's shapes. A grid's
// part-filled last wave can run as split blocks (GemvArgs::split_block): RBB / 2 row blocks in 2 KS parts each.
// Group scales and zero points of the block's rows are staged in shared memory once, packed per (row, group) as
// fp16 scale | bf16(128 + zero) << 16 (8 per load where aligned: stage_params_vec); the input rows are read from
// global memory (L1 hits) or staged in shared memory by the block itself: when they need RMSNorm, an act-order gather
// or zero padding, and plain bf16 rows where qgemv.cu asks for it (a.vec_bf16: copied by cp.async). The codes of the first
// ring of codes and the scales are requested before pdl_wait(): they do not depend on the kernel ahead. A decode
// step's gate/up writes its SiLU * up rows in b_pair_order (a.pair_io, qstage.cuh) and its down reads them so, two
// 16-byte B loads a K block where eight 4-byte ones touched each of the m rows' lines (7B GPTQ-Int4 +0.8% at batch 1,
// +3.3% at batch 4 on an H200, bench/results/2026-12-01-h200-qgemv-rows). Where a warp's K
// part is long (a.ring_fast, qgemv_ring_launch.cuh), its inner rounds run without bounds checks and read normalised
// inputs staged in pair order by two 16-byte loads per block (the bookkeeping was ~9.5 of 25.7 instructions per MMA).
//
// Dequantization is the one of qgemv_mma.cuh: (w & 0x000F000F) | 0x43004300 is the bf16 pair 128 + q, one HSUB2
// subtracts 128 + zero exactly, products accumulate in fp32 per group and each group's sums are scaled in fp32.
// 8-bit codes (q = lo + 16 hi, zero z = zl + 16 zh) take two MMAs per tile into the same sums: the low plane as
// above less 128 + zl, the high plane OR-ed into 2048 (bf16 steps of 16 there: 2048 + 16 hi) less 2048 + 16 zh, so
// the two A operands are lo - zl and 16 (hi - zh), both exact in bf16, and add up to q - z. Lookup codes
// (bitsandbytes NF4/FP4) hold each A register's two codes in one byte, which indexes a table of the 256 bf16x2 pairs
// (table[lo], table[hi]) in shared memory, kept once per bank (lane l reads copy l: no bank conflicts); the
// block's absmax scales each 64-wide group's sums in fp32 (the table values are rounded to bf16 first, where
// transformers rounds table * absmax: a difference within bf16 tolerance).
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
constexpr int k_ring = 6;             // 16-byte loads of codes in flight per lane (8 spilled at 80 registers)
constexpr int k_blocks_per_sm = 3;    // the launch bound the register budget is set for
// The deep ring (qgemv_ring_deep(); by default for affine codes, qgemv.cu): twice the loads in flight per lane,
// for grids of at most two blocks per SM (7B's down and o_proj: 224 blocks), whose warps each stream a long stretch
// of K with the SMs part-empty; a launch bound of two blocks per SM leaves the registers for it.
constexpr int k_ring_deep = 12;
template <int RINGK> constexpr int blocks_per_sm_for() { return RINGK > k_ring ? 2 : k_blocks_per_sm; }
constexpr int k_max_stage_bytes = 48 * 1024;  // largest input staged in shared memory (bf16 [m, stage_stride])

// Row stride (bf16) of inputs staged in shared memory. Rows of several tokens lie 16 bytes further apart than k_padded
// (a multiple of 64 positions: 128 bytes), so that the 16-byte B loads of one instruction, lanes g reading row g, fall
// in different banks instead of on the same ones: on an H200, 7B GPTQ-Int4 batch 4 +0.7%, batches 1-2 level
// (bench/results/2026-12-01-h200-qgemv-rows).
__host__ __device__ constexpr int stage_stride(int k_padded, int m) { return m > 1 ? k_padded + 8 : k_padded; }

static_assert(k_threads == qstage::k_threads, "the staging helpers reduce over qstage::k_threads threads");

enum class XSrc { Global, StageNorm, StageBf16 };
enum class Codes { Affine4, Affine8, Lookup4 };

__host__ __device__ constexpr int planes_of(Codes c) { return c == Codes::Affine8 ? 2 : 1; }
constexpr int k_lut_words = 256 * 32;  // the bf16x2 pair table, one copy per bank (Lookup4)
// Group parameters loaded per thread before they are stored. On an H100 (7B shapes, m 1), the same loop with a runtime
// batch of 1 took gate_up 44.5 us (Int4) / 61.0 (Int8) / 55.9 (NF4) against 36.1 / 55.9 / 42.7 with 4
// (bench/results/2026-11-26-h100-tiled-8bit-nf4).
constexpr int k_param_batch = 4;

// One lane asks L2 for `bytes` of codes at p (Hopper's bulk prefetch; nothing below sm_90).
__device__ __forceinline__ void prefetch_l2(const void * p, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(p), "r"(bytes) : "memory");
#endif
}

// A group's parameters as the kernel keeps them: fp16 scale | bf16(128 + zero) << 16 (Affine4), fp16 scale | zero << 16
// (Affine8), the fp32 absmax (Lookup4).
template <Codes C> __device__ __forceinline__ uint32_t pack_group(const QuantMatrix & w, size_t gidx) {
    if constexpr (C == Codes::Lookup4) return __float_as_uint(w.absmax[gidx]);
    const uint32_t scale = w.scales[gidx];
    const int zero = w.zeros ? int(w.zeros[gidx]) : w.const_zero;
    if constexpr (C == Codes::Affine8) return scale | (uint32_t(zero) << 16);
    return scale | (uint32_t(__bfloat16_as_ushort(__float2bfloat16(128.0f + float(zero)))) << 16);
}

// The group parameters of a block's RBB x MATS row blocks into sq (as pack_group), 8 per load: one row block's
// parameters are contiguous in scales / zeros (16 rows x G), so a thread reads 8 fp16 scales (16 bytes) and their 8
// zero bytes at once, every load of the block in one batch (two per thread for 7B's gate_up). Needs 16-byte aligned
// scales and 8-byte aligned zeros (checked by the launch). Matrix m's row block rb is row block
// base_rb + m n_rb + rb of w (base_rb: a stacked expert's first, moe_quant.cu; 0 for one matrix). The block's row blocks:
// rbb (at most RBB) from rb_first (-1: blockIdx.x RBB).
template <Codes C, int RBB, int MATS>
__device__ __forceinline__ void stage_params_vec(const QuantMatrix & w, int n_rb, int G, int gs, uint32_t * sq, int64_t base_rb = 0,
                                                 int rb_first = -1, int rbb = RBB) {
    constexpr int k_batch = 2;
    const int per_rb = 2 * G;  // 16 G parameters in loads of 8
    const int n8 = rbb * MATS * per_rb, first = rb_first < 0 ? int(blockIdx.x) * RBB : rb_first;
    for (int i0 = threadIdx.x; i0 < n8; i0 += k_batch * k_threads) {
        uint4 sc[k_batch];
        uint2 zb[k_batch];
#pragma unroll
        for (int u = 0; u < k_batch; u++) {
            const int i = i0 + u * k_threads, c = i / per_rb, rb_c = first + c / MATS;
            sc[u] = make_uint4(0, 0, 0, 0);
            zb[u] = make_uint2(0, 0);
            if (i >= n8 || rb_c >= n_rb) continue;
            const size_t at = (size_t(base_rb + int64_t(c % MATS) * n_rb + rb_c) * 16) * G + size_t(i % per_rb) * 8;
            sc[u] = *reinterpret_cast<const uint4 *>(w.scales + at);
            if (w.zeros) zb[u] = *reinterpret_cast<const uint2 *>(w.zeros + at);
        }
#pragma unroll
        for (int u = 0; u < k_batch; u++) {
            const int i = i0 + u * k_threads, c = i / per_rb;
            if (i >= n8 || first + c / MATS >= n_rb) continue;
            const int e = (i % per_rb) * 8;
            int r = e / G, gi = e - r * G;
            const uint32_t * s16 = reinterpret_cast<const uint32_t *>(&sc[u]);
            const uint32_t * z8 = reinterpret_cast<const uint32_t *>(&zb[u]);
#pragma unroll
            for (int v = 0; v < 8; v++) {
                const uint32_t scale = (s16[v / 2] >> (16 * (v % 2))) & 0xFFFFu;
                const int zero = w.zeros ? int((z8[v / 4] >> (8 * (v % 4))) & 0xFFu) : w.const_zero;
                uint32_t packed;
                if constexpr (C == Codes::Affine8) {
                    packed = scale | (uint32_t(zero) << 16);
                } else {
                    packed = scale | (uint32_t(__bfloat16_as_ushort(__float2bfloat16(128.0f + float(zero)))) << 16);
                }
                sq[(c * 16 + r) * gs + gi] = packed;
                if (++gi == G) gi = 0, r++;
            }
        }
    }
}

// Shared memory: the staged input (bf16 [m, k_padded], StageNorm/StageBf16 only), then the packed group parameters
// (uint32 [RBB * MATS * 16 rows, gstride]; gstride = groups | 1, so the 8 rows a warp reads fall in different banks),
// then for Lookup4 the pair table (uint32 [256, 32]).
__host__ __device__ inline int group_stride(int groups) { return groups | 1; }

template <Codes C, GemvOut OUT, int KS, XSrc XS, int RINGK = k_ring>
__global__ void __launch_bounds__(k_threads, blocks_per_sm_for<RINGK>())
    qgemv_ring_kernel(QuantMatrix w, const bf16 * x_global, int ldx, GemvArgs a, int l2_ahead) {
    constexpr int PLANES = planes_of(C);     // 16-byte loads per lane and 64-wide K block
    constexpr int RING = RINGK / PLANES;     // K blocks in flight
    constexpr int TILE = 32 * PLANES;        // uint4 per row block and K block
    constexpr int MATS = OUT == GemvOut::SiluMulBf16 ? 2 : 1;
    constexpr int RBB = k_warps / (MATS * KS);
    static_assert(RBB >= 1 && RBB * MATS * KS == k_warps);
    extern __shared__ uint4 smem_raw[];
    __shared__ float red[k_warps][32][4];
    __shared__ float norm_red[k_warps];

    const int kp = w.k_padded, nkb = kp / 64, m = a.m, G = w.groups, gs = group_stride(G);
    const int n_rb = (a.n + 15) / 16;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    // A split block (blockIdx.x >= a.split_block, the grid's last wave; ring_launch::split_from) holds half the row
    // blocks, each in twice the K parts, so its warps stream half as far.
    const bool split = RBB >= 2 && int(blockIdx.x) >= a.split_block;
    const int ks = split ? 2 * KS : KS, rbb = split ? RBB / 2 : RBB;
    const int rb_first = split ? a.split_block * RBB + (int(blockIdx.x) - a.split_block) * rbb : int(blockIdx.x) * RBB;
    const int part = warp % ks, mat = (warp / ks) % MATS, rbl = warp / (ks * MATS);
    const int rb = rb_first + rbl;
    const bool active = rb < n_rb;
    const int grb = mat == 0 ? rb : rb + n_rb;  // row block in the stacked weight
    const int kb_begin = part * nkb / ks, kb_end = (part + 1) * nkb / ks;
    // Plane p of K block kb at src + kb * TILE + p * 32.
    const uint4 * src = reinterpret_cast<const uint4 *>(w.codes) + size_t(grb) * nkb * TILE + lane;

    // The first RING blocks of codes, requested before anything else.
    uint4 ring[RING][PLANES];
#pragma unroll
    for (int u = 0; u < RING; u++) {
#pragma unroll
        for (int p = 0; p < PLANES; p++) {
            ring[u][p] = active && kb_begin + u < kb_end ? mma4::load_stream(src + size_t(kb_begin + u) * TILE + p * 32) : make_uint4(0, 0, 0, 0);
        }
    }
    // l2_ahead (set by qgemv.cu; 0: none): blocks [kb_begin + RING, + l2_ahead) of codes asked into L2 here, and each
    // round of the loop below moves that window on by RING.
    const uint4 * tile0 = src - lane;  // the row block's first tile
    auto prefetch_blocks = [&](int from, int to) {
        to = min(to, kb_end);
        if (lane == 0 && from < to) prefetch_l2(tile0 + size_t(from) * TILE, uint32_t(to - from) * TILE * 16u);
    };
    if (active && l2_ahead > 0) prefetch_blocks(kb_begin + RING, kb_begin + RING + l2_ahead);

    bf16 * sx = reinterpret_cast<bf16 *>(smem_raw);
    const int xs = a.stage_stride;  // staged rows' stride
    uint32_t * sq = reinterpret_cast<uint32_t *>(smem_raw) + (XS == XSrc::Global ? 0 : size_t(m) * xs / 2);
    // The block's group parameters: k_param_batch loads in flight per thread before their stores, so the prologue
    // waits for memory once per batch, not once per parameter; affine ones 8 at a time where aligned (a.vec_params).
    const int n_params = rbb * MATS * 16 * G;
    if constexpr (C != Codes::Lookup4) {
        if (a.vec_params) stage_params_vec<C, RBB, MATS>(w, n_rb, G, gs, sq, 0, rb_first, rbb);
    }
    for (int i0 = threadIdx.x; i0 < (C != Codes::Lookup4 && a.vec_params ? 0 : n_params); i0 += k_param_batch * k_threads) {
        uint32_t v[k_param_batch];
        int at[k_param_batch];
#pragma unroll
        for (int u = 0; u < k_param_batch; u++) {
            const int i = i0 + u * k_threads, lr = i / G, gi = i % G;
            const int rb_i = rb_first + lr / (MATS * 16), mat_i = (lr / 16) % MATS;
            at[u] = i < n_params && rb_i < n_rb ? lr * gs + gi : -1;
            if (at[u] >= 0) v[u] = pack_group<C>(w, (size_t(mat_i == 0 ? rb_i : rb_i + n_rb) * 16 + lr % 16) * G + gi);
        }
#pragma unroll
        for (int u = 0; u < k_param_batch; u++) {
            if (at[u] >= 0) sq[at[u]] = v[u];
        }
    }
    uint32_t * lut = sq + RBB * MATS * 16 * gs;  // Lookup4: pair b's copy for lane l at lut[b * 32 + l]
    if constexpr (C == Codes::Lookup4) mma4::fill_pair_table(w.table, lut, 32, k_threads);

    // Inputs in b_pair_order (qstage.cuh) for 16-byte B loads: normalised ones staged so for the fast rounds, or bf16
    // rows that arrive so (a.pair_io: the SiluMulBf16 output of the gate/up GEMV before, staged as they are).
    // Lookup codes never take pair-ordered inputs (qgemv_pair_io_ok): their kernels keep the registers they had.
    const bool pair_order = XS == XSrc::StageNorm ? a.ring_fast : C != Codes::Lookup4 && OUT != GemvOut::SiluMulBf16 && a.pair_io;
    pdl_wait();  // the inputs come from the kernel ahead
    if constexpr (XS != XSrc::Global) {
        constexpr GemvIn IN = XS == XSrc::StageNorm ? GemvIn::NormF32 : GemvIn::Bf16;
        if (XS == XSrc::StageBf16 && a.vec_bf16) {  // rows of k_padded bf16, 16-byte aligned: copied as they are
            const int row16 = kp / 8, n16 = m * row16;
            for (int i = threadIdx.x; i < n16; i += k_threads) {
                cp_async16(sx + size_t(i / row16) * xs + (i % row16) * 8, static_cast<const bf16 *>(a.x) + size_t(i) * 8, true);
            }
            cp_async_commit();
            cp_async_wait<0>();
        }
        for (int tok = 0; tok < (XS == XSrc::StageBf16 && a.vec_bf16 ? 0 : m); tok++) {
            if (XS == XSrc::StageNorm && a.vec_norm) {  // set by qgemv.cu: aligned, no act-order
                qstage::stage_norm_vec<4>(a, tok, a.k, kp, sx + size_t(tok) * xs, norm_red, pair_order);
                continue;
            }
            auto store = [&](int i, float v) {
                // (bf16 rows in pair order are already so: copied as they are)
                const bool reorder = XS == XSrc::StageNorm && pair_order;
                if (i < kp) sx[size_t(tok) * xs + (reorder ? qstage::b_pair_order(i) : i)] = __float2bfloat16(v);
            };
            qstage::for_each_input<IN, decltype(store), false>(a, w.perm, tok, a.k, kp, norm_red, store);
        }
    }
    __syncthreads();

    // B fragments: token min(g, m - 1) (columns beyond m repeat the last token and are not written out).
    const uint32_t * xrow = reinterpret_cast<const uint32_t *>(XS == XSrc::Global ? x_global + size_t(min(g, m - 1)) * ldx
                                                                                  : sx + size_t(min(g, m - 1)) * xs);
    const uint32_t * q_lo = sq + (rbl * MATS + mat) * 16 * gs + g * gs, * q_hi = q_lo + 8 * gs;
    float tot[4] = {}, c[4] = {};
    // The current group's parameters. Groups are multiples of 32 positions (cuda_quant_unsupported), so a group can
    // only start at j = 0 or j = 2 of a 64-wide block, and positions only move forward: no division in the loop.
    int gi = min(kb_begin * 64 / w.group, G - 1);
    int group_end = gi == G - 1 ? INT_MAX : (gi + 1) * w.group;  // first position past the current group
    // Scales of rows g (s_lo) and g + 8 (s_hi); the bf16x2 pairs subtracted from each plane of each row.
    float s_lo, s_hi;
    uint32_t zz_lo[PLANES], zz_hi[PLANES];
    auto take = [&]() {
        const uint32_t plo = q_lo[gi], phi = q_hi[gi];
        if constexpr (C == Codes::Lookup4) {
            s_lo = __uint_as_float(plo);
            s_hi = __uint_as_float(phi);
            return;
        }
        s_lo = __half2float(__ushort_as_half(uint16_t(plo & 0xFFFFu)));
        s_hi = __half2float(__ushort_as_half(uint16_t(phi & 0xFFFFu)));
        if constexpr (C == Codes::Affine8) {
            const uint32_t zlo = plo >> 16, zhi = phi >> 16;
            zz_lo[0] = (0x4300u | (zlo & 15u)) * 0x10001u;  // 128 + zl
            zz_hi[0] = (0x4300u | (zhi & 15u)) * 0x10001u;
            zz_lo[PLANES - 1] = (0x4500u | (zlo >> 4)) * 0x10001u;  // 2048 + 16 zh
            zz_hi[PLANES - 1] = (0x4500u | (zhi >> 4)) * 0x10001u;
        } else {
            zz_lo[0] = __byte_perm(plo, 0, 0x3232);
            zz_hi[0] = __byte_perm(phi, 0, 0x3232);
        }
    };
    take();
    auto flush = [&]() {
        tot[0] = fmaf(s_lo, c[0], tot[0]);
        tot[1] = fmaf(s_lo, c[1], tot[1]);
        tot[2] = fmaf(s_hi, c[2], tot[2]);
        tot[3] = fmaf(s_hi, c[3], tot[3]);
        c[0] = c[1] = c[2] = c[3] = 0.0f;
    };
    auto next_group = [&]() {
        flush();
        gi++;
        group_end = gi == G - 1 ? INT_MAX : group_end + w.group;
        take();
    };
    // One 64-wide K block: xk points at the lane's first B word of the block (input pair kb * 64 + 2t, or in
    // b_pair_order the lane's eight pairs from kb * 64 + 16t), pos0 = kb * 64. group_checks (a constant at each call):
    // whether a group may start inside the block (at j = 0 or 2); the fast rounds below check once per block instead.
    auto multiply = [&](const uint4 (&codes)[PLANES], const uint32_t * xk, int pos0, bool group_checks, bool paired) {
        uint32_t b[4][2];
        if (paired) {
            const uint4 lo = reinterpret_cast<const uint4 *>(xk)[0], hi = reinterpret_cast<const uint4 *>(xk)[1];
            b[0][0] = lo.x, b[0][1] = lo.y, b[1][0] = lo.z, b[1][1] = lo.w;
            b[2][0] = hi.x, b[2][1] = hi.y, b[3][0] = hi.z, b[3][1] = hi.w;
        } else {
#pragma unroll
            for (int j = 0; j < 4; j++) {
                b[j][0] = xk[8 * j];      // inputs pos0 + 16j + 2t, + 1
                b[j][1] = xk[8 * j + 4];  // inputs pos0 + 16j + 2t + 8, + 9
            }
        }
#pragma unroll
        for (int j = 0; j < 4; j++) {
            if (group_checks && (j == 0 || j == 2) && pos0 + j * 16 >= group_end) next_group();
            if constexpr (C == Codes::Lookup4) {
                const uint32_t word = reinterpret_cast<const uint32_t *>(&codes[0])[j];
                uint32_t fr[4];
#pragma unroll
                for (int r = 0; r < 4; r++) fr[r] = mma4::lut_pair(lut + lane, 32, word, r);
                mma4::mma_bf16(c, fr, b[j][0], b[j][1]);
                continue;
            }
            constexpr uint32_t mask = 0x000F000Fu;
#pragma unroll
            for (int p = 0; p < PLANES; p++) {
                const uint32_t magic = p == 0 ? 0x43004300u : 0x45004500u;  // 128, or 2048 (the high plane)
                const uint32_t word = reinterpret_cast<const uint32_t *>(&codes[p])[j];
                uint32_t fr[4];
                fr[0] = mma4::bf16x2_sub(mma4::lop3_and_or(word, mask, magic), zz_lo[p]);
                fr[1] = mma4::bf16x2_sub(mma4::lop3_and_or(word >> 4, mask, magic), zz_hi[p]);
                fr[2] = mma4::bf16x2_sub(mma4::lop3_and_or(word >> 8, mask, magic), zz_lo[p]);
                fr[3] = mma4::bf16x2_sub(mma4::lop3_and_or(word >> 12, mask, magic), zz_hi[p]);
                mma4::mma_bf16(c, fr, b[j][0], b[j][1]);
            }
        }
    };
    if (active) {
        // Running pointers (no per-block address arithmetic): the codes RING blocks ahead, the lane's inputs. A ring
        // slot is multiplied first and then refilled (no register copy of the codes).
        const uint4 * ahead = src + size_t(kb_begin + RING) * TILE;
        const uint32_t * xk = xrow + size_t(kb_begin) * 32 + (pair_order ? 8 * t : t);
        int pos0 = kb_begin * 64;
        int kb0 = kb_begin;
        // Fast rounds (a.ring_fast): every block of the round and every refill lies inside the part, and groups are
        // whole K blocks (a group starts only at a block's first position), so no bounds checks and one group check
        // per block, with the round's addresses as offsets from its first block; normalised inputs in two 16-byte
        // loads per block. The part's last rounds go the same way with their refills bounded; against the checked
        // loop for them, on an H200 (same call, alternated twice): 7B GPTQ-Int4 batch 1 500.6 / 501.3 -> 513.7 /
        // 513.1 tok/s, GPTQ-Int8 356.0 / 355.9 -> 365.9 / 366.2, 0.5B GPTQ-Int4 1575.1 / 1577.6 -> 1580.5 / 1580.2,
        // 72B GPTQ-Int4 67.20 -> 69.65 (bench/results/2026-12-04-h200-ring-tail). Groups of 32 take the checked loop.
        if (a.ring_fast && w.group % 64 == 0) {
            for (; kb0 + 2 * RING <= kb_end; kb0 += RING) {
                if (l2_ahead > 0) prefetch_blocks(kb0 + RING + l2_ahead, kb0 + 2 * RING + l2_ahead);
#pragma unroll
                for (int u = 0; u < RING; u++) {
                    if (pos0 + 64 * u >= group_end) next_group();
                    // (pair_order is a.ring_fast, true here, for normalised inputs: spelt as a constant for them)
                    multiply(ring[u], xk + 32 * u, pos0 + 64 * u, false, XS == XSrc::StageNorm || pair_order);
#pragma unroll
                    for (int p = 0; p < PLANES; p++) ring[u][p] = mma4::load_stream(ahead + u * TILE + p * 32);
                }
                ahead += RING * TILE;
                xk += RING * 32;
                pos0 += RING * 64;
            }
            // The part's last rounds the same way: each slot refilled only while its block lies inside the part.
            for (; kb0 + RING <= kb_end; kb0 += RING) {
#pragma unroll
                for (int u = 0; u < RING; u++) {
                    if (pos0 + 64 * u >= group_end) next_group();
                    multiply(ring[u], xk + 32 * u, pos0 + 64 * u, false, XS == XSrc::StageNorm || pair_order);
                    if (kb0 + u + RING < kb_end) {
#pragma unroll
                        for (int p = 0; p < PLANES; p++) ring[u][p] = mma4::load_stream(ahead + u * TILE + p * 32);
                    }
                }
                ahead += RING * TILE;
                xk += RING * 32;
                pos0 += RING * 64;
            }
            // Fewer than RING blocks left, all in the ring already.
#pragma unroll
            for (int u = 0; u < RING; u++) {
                if (kb0 + u >= kb_end) break;
                if (pos0 + 64 * u >= group_end) next_group();
                multiply(ring[u], xk + 32 * u, pos0 + 64 * u, false, XS == XSrc::StageNorm || pair_order);
            }
            kb0 = kb_end;
        }
        for (; kb0 < kb_end; kb0 += RING) {
            if (l2_ahead > 0) prefetch_blocks(kb0 + RING + l2_ahead, kb0 + 2 * RING + l2_ahead);
#pragma unroll
            for (int u = 0; u < RING; u++) {
                if (kb0 + u >= kb_end) break;
                multiply(ring[u], xk, pos0, true, pair_order);
                if (kb0 + u + RING < kb_end) {
#pragma unroll
                    for (int p = 0; p < PLANES; p++) ring[u][p] = mma4::load_stream(ahead + p * 32);
                }
                ahead += TILE;
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
        for (int p = 0; p < 2 * KS; p++) {
            if (p >= ks) break;
#pragma unroll
            for (int i = 0; i < 4; i++) sum[mt][i] += red[(rbl * MATS + mt) * ks + p][lane][i];
        }
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int o = rb * 16 + g + (i >= 2 ? 8 : 0), tok = 2 * t + (i & 1);
        if (o >= a.n || tok >= m) continue;
        const size_t dst = size_t(tok) * a.n + (OUT == GemvOut::SiluMulBf16 && a.pair_io ? qstage::b_pair_order(o) : o);
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
