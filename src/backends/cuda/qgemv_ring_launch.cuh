// The ring kernel's launch path (qgemv_ring.cuh): K parts per row block, then the output kind and the code kind,
// for one input source. qgemv_ring_global.cu, qgemv_ring_stage_norm.cu and qgemv_ring_stage_bf16.cu instantiate it
// for one source each, so the build spreads its ~150 kernels over three compiler processes; qgemv.cu calls them.
#pragma once

#include <algorithm>
#include <climits>

#include "backends/cuda/common.cuh"
#include "backends/cuda/ops.h"
#include "backends/cuda/qgemv_ring.cuh"
#include "backends/cuda/qstage.cuh"
#include "core/env.h"

namespace qinfer::cuda {

// The tiled layout's ring GEMV with the input read from global memory (x: [m, ldx] bf16, already staged or plain),
// staged and normalised in the kernel (a.x fp32 residual rows), or staged in the kernel (a.x bf16).
void qgemv_ring_global(const QuantMatrix & w, const bf16 * x, int ldx, const GemvArgs & a, GemvOut out, cudaStream_t s);
void qgemv_ring_stage_norm(const QuantMatrix & w, const GemvArgs & a, GemvOut out, cudaStream_t s);
void qgemv_ring_stage_bf16(const QuantMatrix & w, const GemvArgs & a, GemvOut out, cudaStream_t s);

// Whether launches that qualify use the deep ring (ring4::k_ring_deep) for this code kind (by default affine codes,
// 4- and 8-bit, not lookup codes; set_qgemv_ring_deep).
bool qgemv_ring_deep(bool affine);
// The fast rounds' mode (set_qgemv_ring_fast): -1 the rule of ring_launch::ring_fast_for, 1, 0.
int qgemv_ring_fast_mode();
// The split last wave's mode (set_qgemv_ring_split): 1 every grid's second half (tests), else the rule of
// ring_launch::split_from.
int qgemv_ring_split_mode();

// QINFER_QKS=1|2|4|8 forces the warps per row group of the quantized GEMVs (an open knob: two K parts made the 4-bit
// gate_up 7% faster in isolation on an H200, bench/results/2026-11-28-h200-3ca90f2, not yet measured in rows).
inline int forced_ks() { return env().qgemv_k_parts; }

namespace ring_launch {

template <GemvOut OUT> constexpr int mats_of() { return OUT == GemvOut::SiluMulBf16 ? 2 : 1; }

inline ring4::Codes codes_of(const QuantMatrix & w) {
    return w.lut ? ring4::Codes::Lookup4 : w.bits == 8 ? ring4::Codes::Affine8 : ring4::Codes::Affine4;
}

inline size_t ring_smem_bytes(const QuantMatrix & w, int m, bool staged, int rows_blocks) {
    return (staged ? size_t(m) * ring4::stage_stride(w.k_padded, m) * sizeof(bf16) : 0) + size_t(rows_blocks) * 16 * ring4::group_stride(w.groups) * 4 +
           (w.lut ? ring4::k_lut_words * 4 : 0);
}

// Codes requested into L2 beyond the ring kernel's register ring, in 64-wide K blocks. On an H100 (7B GPTQ-Int4 shapes, m 1): down 29.4 -> 26.1 us with 6 blocks (27.9 with 12), o_proj unchanged,
// but gate_up 34.9 -> 37.2 and qkv 9.4 -> 9.6: on for kernels reading their input from global memory (o_proj, down)
// only (bench/results/2026-11-26-h100-ring-ab).
// Bf16 inputs staged as they are (vec_bf16, below) count as read from global memory here: the same kernels' inputs.
constexpr int k_ring_l2_ahead_global = 6, k_ring_l2_ahead_staged = 0;

// The ring kernel's fast rounds (qgemv_ring.cuh) where every K part holds at least one round of RINGK loads (the part's
// last rounds run them with bounded refills). With three rounds asked and the last ones checked, on an H200
// (bench/results/2026-11-28-h200-qring-fast) they took 7B GPTQ-Int4 from 485.5 to 503.5 tok/s but 0.5B GPTQ-Int4 from
// 1715.3 to 1697.0, whose parts hold one or two rounds; with one round and the last ones fast, 7B GPTQ-Int4 500.6 ->
// 513.7, 0.5B GPTQ-Int4 1575.1 -> 1580.5 (bench/results/2026-12-04-h200-ring-tail, same call).
// set_qgemv_ring_fast(0): never (the checked loop for every round, inputs staged in position order), (1): wherever the
// kernel can take them (tests).
inline bool ring_fast_for(const QuantMatrix & w, int ks, int ringk, ring4::Codes c) {
    const int mode = qgemv_ring_fast_mode();
    return mode == 1 || (mode == -1 && (w.k_padded / 64) / ks >= ringk / ring4::planes_of(c));
}

// The ring kernel's grid: n outputs a matrix in row blocks of 16, k_warps / (mats ks) of them a block.
inline int ring_grid(int n, int mats, int ks) {
    const int rbb = ring4::k_warps / (mats * ks);
    return ((n + 15) / 16 + rbb - 1) / rbb;
}

// The first split block (GemvArgs::split_block) of a grid of `grid` blocks of `rbb` row blocks, `wave` of them resident
// at once, or INT_MAX: none. A grid over one wave whose last wave is at most half full has that wave's row blocks in
// split blocks (half the row blocks, twice the K parts each), which run last and stream half as far. It pays where the
// blocks are bound by their own latency, not by the memory system: 8-bit codes, and 4-bit codes of 2-8 rows. On an
// H200 (bench/results/2026-12-04-h200-ring-split, alternated twice): 72B GPTQ-Int4 batch 4 233.3 -> 242.8 tok/s (its
// gate/up 98.6 -> 90.9 us), 32B GPTQ-Int8 batch 1 90.3 -> 91.6, 7B GPTQ-Int8 batch 1 366.4 -> 368.7. 4-bit codes of
// one row already stream near the bandwidth (72B's gate/up 3.46 TB/s) and keep whole blocks: split, their kernels ran
// as fast (72B 73.2 us, 7B 27.4) and the rows lost 0.15-0.5% (72B 74.1 -> 74.0, 7B 507.7 -> 505.2). `split_ok`: the
// launch's codes and rows allow it; tests force splits (set_qgemv_ring_split(1): every grid's second half).
inline int split_from(int grid, int rbb, int wave, bool split_ok) {
    if (rbb < 2) return INT_MAX;
    if (qgemv_ring_split_mode() == 1) return grid / 2;
    if (!split_ok || grid <= wave || 2 * (grid % wave) > wave || grid % wave == 0) return INT_MAX;
    return grid / wave * wave;
}

// The launch's grid: `grid` blocks of rbb row blocks (of n_rb), or with split blocks of rbb / 2 from `split` on.
inline int split_grid(int grid, int n_rb, int rbb, int split) {
    if (split == INT_MAX) return grid;
    const int half = rbb / 2;
    return split + (n_rb - split * rbb + half - 1) / half;
}

template <ring4::Codes C, GemvOut OUT, int KS, ring4::XSrc XS>
void launch_ring(const QuantMatrix & w, const bf16 * x, int ldx, const GemvArgs & a, size_t smem, cudaStream_t s) {
    auto kernel = ring4::qgemv_ring_kernel<C, OUT, KS, XS>;
    static PerDevice<size_t> configured;
    allow_dynamic_smem(kernel, smem, configured);
    // In blocks of 4-bit codes' bytes: 8-bit blocks are twice the size.
    GemvArgs args = a;
    args.vec_norm = XS == ring4::XSrc::StageNorm && !w.perm && qstage::vec_norm_ok(a);
    args.vec_bf16 = XS == ring4::XSrc::StageBf16 && !w.perm && a.k == w.k_padded && reinterpret_cast<uintptr_t>(a.x) % 16 == 0;
    args.vec_params = C != ring4::Codes::Lookup4 && reinterpret_cast<uintptr_t>(w.scales) % 16 == 0 &&
                      reinterpret_cast<uintptr_t>(w.zeros) % 8 == 0;
    args.ring_fast = ring_fast_for(w, KS, ring4::k_ring, C);
    args.stage_stride = ring4::stage_stride(w.k_padded, a.m);
    const bool plain_input = XS == ring4::XSrc::Global || args.vec_bf16;
    const int l2_ahead = (plain_input ? k_ring_l2_ahead_global : k_ring_l2_ahead_staged) / ring4::planes_of(C);
    const int grid = ring_grid(a.n, mats_of<OUT>(), KS);
    constexpr int RBB = ring4::k_warps / (mats_of<OUT>() * KS);
    const int n_rb = (a.n + 15) / 16;
    // Split last waves (split_from): not beside another stream's kernels (a MoE shared expert), not 4-bit codes of one row.
    const bool split_ok = !a.beside && !(C == ring4::Codes::Affine4 && a.m == 1);
    // The deep ring for plain inputs added to a residual (o_proj, down) where the grid leaves room.
    if constexpr (XS != ring4::XSrc::StageNorm && OUT == GemvOut::AddF32) {
        if (plain_input && qgemv_ring_deep(C != ring4::Codes::Lookup4) && grid <= 2 * sm_count()) {
            auto deep = ring4::qgemv_ring_kernel<C, OUT, KS, XS, ring4::k_ring_deep>;
            static PerDevice<size_t> configured_deep;
            allow_dynamic_smem(deep, smem, configured_deep);
            args.ring_fast = ring_fast_for(w, KS, ring4::k_ring_deep, C);
            args.split_block = split_from(grid, RBB, ring4::blocks_per_sm_for<ring4::k_ring_deep>() * sm_count(), split_ok);
            launch_kernel(deep, split_grid(grid, n_rb, RBB, args.split_block), ring4::k_threads, smem, s, w, x, ldx, args, l2_ahead);
            return;
        }
    }
    args.split_block = split_from(grid, RBB, ring4::k_blocks_per_sm * sm_count(), split_ok);
    launch_kernel(kernel, split_grid(grid, n_rb, RBB, args.split_block), ring4::k_threads, smem, s, w, x, ldx, args, l2_ahead);
}

constexpr size_t k_ring_max_smem = 160 * 1024;

// K parts per row block, by waves of resident blocks (k_blocks_per_sm an SM): parts double while the doubled grid
// still fits one wave (a block's 8 warps split as row blocks x matrices x parts), with at least one 64-wide K block per
// part, then while a grid of more than one wave would leave over half of its waves' slots empty; the gate/up GEMV of
// one row starts from two parts; more where the block's group parameters (rows x groups) would not fit in shared
// memory. 0: no split fits. Against the earlier rule (the fewest parts giving two fifths of the resident warps), on an
// H200 (bench/results/2026-12-04-h200-moe-qfast, call 6): 72B GPTQ-Int4 qkv 160 -> 320 blocks, 22.2 -> 18.2 us at m 1;
// its gate/up at m 4 462 blocks (1.17 waves) -> 924, 128.2 -> 102.4 us; 32B's o_proj and down 160 -> 320 blocks,
// -8-26%; the 72B GPTQ-Int4 rows 69.95 -> 72.90 tok/s at batch 1 and 205.8 -> 234.1 at batch 4 (alternated twice).
// Every 7B and 0.5B shape keeps its parts. Mixed: 32B's gate/up at m 4 and Llama-3.1-8B's at m 1 (+4% int4, -7% int8).
// (7B's gate/up at m 1 in two parts, 592 blocks, 1.5 waves: on an H200 7B GPTQ-Int4 batch 1 497.6 -> 504.0 tok/s
// against one part; bench/results/2026-12-01-h200-int8-ring.) A gate/up beside another stream's kernels (a.beside: a
// MoE block's shared expert) starts from one part, so a large one leaves SM slots to the routed experts: Qwen2-57B-A14B
// GPTQ-Int4's (320 blocks instead of 640) took the model from 297.30 / 297.25 to 301.25 / 301.06 tok/s at input 1
// (same call, alternated; bench/results/2026-12-03-h200-moe-prologue, call 4). At one row it keeps that one part:
// Qwen1.5-MoE-A2.7B GPTQ-Int4's 88 blocks instead of 176, beside a routed launch of 176 (moe_qexperts_routed's
// beside_blocks), 798.13 / 798.69 -> 803.45 / 803.07 tok/s at input 1 (same call; bench/results/2026-12-04-h200-moe-split).
template <GemvOut OUT> int ring_parts(const QuantMatrix & w, int n, int m, bool staged, bool beside) {
    constexpr int MATS = mats_of<OUT>();
    const int nkb = w.k_padded / 64, max_ks = ring4::k_warps / MATS;
    const int wave = sm_count() * ring4::k_blocks_per_sm;
    const int forced = forced_ks();
    int ks = forced ? std::min(forced, max_ks) : MATS == 2 && m == 1 && !beside ? std::min(2, max_ks) : 1;
    const bool grow = !forced && !(beside && m == 1);
    // Slots left empty over a grid's waves, as a share of the grid (0 for a grid of one wave or less).
    auto tail_waste = [&](int grid) { return grid <= wave ? 0.0 : double((grid + wave - 1) / wave * wave) / grid - 1.0; };
    while (grow && ks < max_ks && 2 * ks <= nkb && ring_grid(n, MATS, 2 * ks) <= wave) ks *= 2;
    while (grow && ks < max_ks && 2 * ks <= nkb && tail_waste(ring_grid(n, MATS, ks)) > 0.5) ks *= 2;
    while (ks < max_ks && ring_smem_bytes(w, m, staged, ring4::k_warps / ks) > k_ring_max_smem) ks *= 2;
    return ring_smem_bytes(w, m, staged, ring4::k_warps / ks) <= k_ring_max_smem ? ks : 0;
}

template <ring4::Codes C, GemvOut OUT, ring4::XSrc XS>
void launch_ring_ks(const QuantMatrix & w, const bf16 * x, int ldx, const GemvArgs & a, cudaStream_t s) {
    constexpr int MATS = mats_of<OUT>();
    const int ks = ring_parts<OUT>(w, a.n, a.m, XS != ring4::XSrc::Global, a.beside);
    if (ks == 0) QINFER_FAIL() << "qgemv: " << w.groups << " quantization groups per row do not fit in shared memory";
    const size_t smem = ring_smem_bytes(w, a.m, XS != ring4::XSrc::Global, ring4::k_warps / ks);
    switch (ks) {
    case 1: return launch_ring<C, OUT, 1, XS>(w, x, ldx, a, smem, s);
    case 2: return launch_ring<C, OUT, 2, XS>(w, x, ldx, a, smem, s);
    case 4: return launch_ring<C, OUT, 4, XS>(w, x, ldx, a, smem, s);
    default:
        if constexpr (MATS == 1) return launch_ring<C, OUT, 8, XS>(w, x, ldx, a, smem, s);
        return launch_ring<C, OUT, 4, XS>(w, x, ldx, a, smem, s);
    }
}

template <ring4::Codes C, ring4::XSrc XS>
void launch_ring_out(const QuantMatrix & w, const bf16 * x, int ldx, const GemvArgs & a, GemvOut out, cudaStream_t s) {
    switch (out) {
    case GemvOut::Bf16: return launch_ring_ks<C, GemvOut::Bf16, XS>(w, x, ldx, a, s);
    case GemvOut::F32: return launch_ring_ks<C, GemvOut::F32, XS>(w, x, ldx, a, s);
    case GemvOut::AddF32: return launch_ring_ks<C, GemvOut::AddF32, XS>(w, x, ldx, a, s);
    case GemvOut::SiluMulBf16: return launch_ring_ks<C, GemvOut::SiluMulBf16, XS>(w, x, ldx, a, s);
    }
}

template <ring4::XSrc XS>
void launch_ring_codes(const QuantMatrix & w, const bf16 * x, int ldx, const GemvArgs & a, GemvOut out, cudaStream_t s) {
    switch (codes_of(w)) {
    case ring4::Codes::Affine4: return launch_ring_out<ring4::Codes::Affine4, XS>(w, x, ldx, a, out, s);
    case ring4::Codes::Affine8: return launch_ring_out<ring4::Codes::Affine8, XS>(w, x, ldx, a, out, s);
    case ring4::Codes::Lookup4: return launch_ring_out<ring4::Codes::Lookup4, XS>(w, x, ldx, a, out, s);
    }
}

}  // namespace ring_launch

}  // namespace qinfer::cuda
