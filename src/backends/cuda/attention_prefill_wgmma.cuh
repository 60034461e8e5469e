// The pieces of the wgmma prefill attention kernels (attention_prefill_wgmma.cu, attention_prefill_tma.cu) that act
// on one warpgroup's 64 query rows: the online softmax of an S tile, the rescale of O and the packing of P into A
// fragments, and the issue of S = Q K^T and O += P V on a tile of 128 keys in 128-byte-swizzled shared memory.
#pragma once

#include <cmath>

#include "backends/cuda/attention_common.cuh"
#include "backends/cuda/wgmma.cuh"

namespace qinfer::cuda::prefill_wgmma {

constexpr int k_warpgroups = 2;            // consumer warpgroups of 64 queries each
constexpr int k_rows = 64 * k_warpgroups;  // queries per block
constexpr int k_keys = 128;                // keys per tile

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// The online-softmax state of a warp's two rows per lane (row0 = its 16-row slice's g, row1 = g + 8).
struct RowState {
    int row0, row1, warp_row;  // relative to the chunk
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0, l1 = 0;
};

// 2^x by one MUFU.EX2, results below 2^-126 flushed to zero (exp2f's non-ftz form scales x around the instruction
// for subnormal results: three more instructions an element). On an H200 the warp-specialised kernel went from 350.5
// to 394.3 TFLOP/s (1024 queries after 3073 keys, d 128, 14/2 heads) and 7B's time to first token at 30720 from
// 1.042 to 1.018 s (bench/results/2026-12-04-h200-prefill-splits, call 2).
__device__ __forceinline__ float exp2_ftz(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// S tile (this warp's 16 rows x 128 keys from k0, accumulator layout) -> P = exp2(S * scale - m) in place, with
// masks (causal, rows past the chunk) where the tile reaches past the warp's first row's last key or the warp holds
// rows past the chunk. Updates m and l; returns the factors (alpha0, alpha1) that rescale the rows' outputs.
__device__ __forceinline__ float2 softmax_tile(float (&s)[k_keys / 2], RowState & r, int k0, const PrefillArgs & a) {
    const int tq = threadIdx.x % 4;
    if (k0 + k_keys - 1 > a.pos0 + r.warp_row || r.warp_row + 15 >= a.n) {
#pragma unroll
        for (int nt = 0; nt < k_keys / 8; nt++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int key = k0 + nt * 8 + 2 * tq + (e & 1);
                const int row = e < 2 ? r.row0 : r.row1;
                if (!(row < a.n && key <= a.pos0 + row)) s[nt * 4 + e] = -INFINITY;
            }
        }
    }
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < k_keys / 8; nt++) {
        mx0 = fmaxf(mx0, fmaxf(s[nt * 4 + 0], s[nt * 4 + 1]));
        mx1 = fmaxf(mx1, fmaxf(s[nt * 4 + 2], s[nt * 4 + 3]));
    }
    // Scaling before the quad's max gives the same maxima (scale_log2 > 0).
    const SoftmaxStep st = online_softmax_step(mx0 * a.scale_log2, mx1 * a.scale_log2, r.m0, r.m1);
    const float2 alpha = st.alpha;
    const float ref0 = st.ref.x, ref1 = st.ref.y;
    float sum0 = 0, sum1 = 0;
#pragma unroll
    for (int nt = 0; nt < k_keys / 8; nt++) {
        s[nt * 4 + 0] = exp2_ftz(fmaf(s[nt * 4 + 0], a.scale_log2, -ref0));
        s[nt * 4 + 1] = exp2_ftz(fmaf(s[nt * 4 + 1], a.scale_log2, -ref0));
        s[nt * 4 + 2] = exp2_ftz(fmaf(s[nt * 4 + 2], a.scale_log2, -ref1));
        s[nt * 4 + 3] = exp2_ftz(fmaf(s[nt * 4 + 3], a.scale_log2, -ref1));
        sum0 += s[nt * 4 + 0] + s[nt * 4 + 1];
        sum1 += s[nt * 4 + 2] + s[nt * 4 + 3];
    }
    r.l0 = r.l0 * alpha.x + sum0;
    r.l1 = r.l1 * alpha.y + sum1;
    return alpha;
}

// o *= alpha per row, skipped where every row of the warp kept its maximum (alpha 1 changes nothing; past the first
// tiles of a long row it is the rule: on an H200 the warp-specialised kernel went from 390 to 398 TFLOP/s at d 128,
// 1.5B's time to first token at 30720 from 0.304 to 0.296 s; bench/results/2026-12-04-h200-prefill-splits, call 3);
// P (fp32, accumulator layout) -> bf16 A fragments of 16 keys each.
template <int D>
__device__ __forceinline__ void rescale_and_pack(float (&o)[D / 2], float2 alpha, const float (&p)[k_keys / 2], uint32_t (&pf)[k_keys / 16][4]) {
    if (!__all_sync(0xffffffffu, alpha.x == 1.f && alpha.y == 1.f)) {
#pragma unroll
        for (int dt = 0; dt < D / 8; dt++) {
            o[dt * 4 + 0] *= alpha.x;
            o[dt * 4 + 1] *= alpha.x;
            o[dt * 4 + 2] *= alpha.y;
            o[dt * 4 + 3] *= alpha.y;
        }
    }
#pragma unroll
    for (int nt = 0; nt < k_keys / 8; nt++) {
        pf[nt / 2][(nt % 2) * 2 + 0] = pack_bf16(p[nt * 4 + 0], p[nt * 4 + 1]);
        pf[nt / 2][(nt % 2) * 2 + 1] = pack_bf16(p[nt * 4 + 2], p[nt * 4 + 3]);
    }
}

// Issues S = Q K^T (64 rows x 128 keys) for this warpgroup: one k16 step of the head dim per instruction.
template <int D> __device__ __forceinline__ void issue_qk(float (&s)[k_keys / 2], uint32_t q_addr, const bf16 * ks) {
    const uint32_t k_addr = sm90::smem_addr(ks);
#pragma unroll
    for (int kc = 0; kc < D / 16; kc++) {
        const uint32_t panel = kc / 4, within = (kc % 4) * 32;
        sm90::wgmma_m64n128k16_ss(s, sm90::desc128(q_addr + panel * k_rows * 128 + within, 16, 1024),
                                  sm90::desc128(k_addr + panel * k_keys * 128 + within, 16, 1024), kc > 0);
    }
}

// Issues O += P V: 16 keys per instruction; V's panels of 64 head dims lie k_keys * 128 bytes apart.
template <int D> __device__ __forceinline__ void issue_pv(float (&o)[D / 2], const uint32_t (&pf)[k_keys / 16][4], const bf16 * vs) {
    const uint32_t v_addr = sm90::smem_addr(vs);
#pragma unroll
    for (int kk = 0; kk < k_keys / 16; kk++) {
        const uint64_t v_desc = sm90::desc128(v_addr + kk * 16 * 128, k_keys * 128, 1024);
        if constexpr (D == 128) sm90::wgmma_m64n128k16_rs_nmajor(o, pf[kk], v_desc);
        else sm90::wgmma_m64n64k16_rs_nmajor(o, pf[kk], v_desc);
    }
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

}  // namespace qinfer::cuda::prefill_wgmma
