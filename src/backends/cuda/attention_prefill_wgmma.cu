// Causal prefill attention on Hopper warpgroup MMAs (wgmma, sm_90a), for head_dim 64 and 128.
//
// FlashAttention-3's data path without its warp specialisation: a block owns 128 queries of one head as two
// warpgroups of 64. K/V tiles of 128 keys stream through shared memory (KVTilePipe, cp.async; a quantized cache's
// codes are dequantized into the same tiles), stored in wgmma's 128-byte-swizzled panels. S = Q K^T reads Q and K
// from shared memory through descriptors (both K-major); O += P V takes P from registers, since the fp32 S accumulator
// rounded to bf16 pairs is the A fragment, and V from shared memory N-major. The online softmax is the pipelined
// kernel's (log2 domain, the scale inside exp2's FMA, masks on diagonal tiles only), per warp on its 16 rows.
// A bf16 cache keeps three tiles resident so that a warpgroup's MMAs overlap its own softmax (FlashAttention-3's
// intra-warpgroup pipelining): S of tile t + 1 and P V of tile t are issued together, and the exponentials of tile
// t + 1 run while P V of tile t is still on the tensor cores. A quantized cache (one dequantized tile at a time) runs
// the plain order: S, softmax, P V, wait.
#include <cmath>

#include "backends/cuda/attention_common.cuh"
#include "backends/cuda/common.cuh"
#include "backends/cuda/kv_quant.cuh"
#include "backends/cuda/wgmma.cuh"

namespace qinfer::cuda {

namespace {

constexpr int k_warpgroups = 2;
constexpr int k_threads = 128 * k_warpgroups;
constexpr int k_rows = 64 * k_warpgroups;  // queries per block
constexpr int k_keys = 128;                // keys per tile

template <int D, KVKind K> struct WgmmaSmem {
    static constexpr bool overlapped = K == KVKind::BF16;
    using Pipe = KVTilePipe<D, K, k_threads, k_keys, true, overlapped ? 3 : 2>;
    static constexpr size_t q_offset = (Pipe::smem_bytes + 1023) / 1024 * 1024;  // Q: [D / 64][k_rows][64], swizzled
    static constexpr size_t bytes = q_offset + size_t(k_rows) * D * 2 + 1024;  // + the base's alignment to 1024
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// The online-softmax state of a warp's two rows per lane (row0 = its 16-row slice's g, row1 = g + 8).
struct RowState {
    int row0, row1, warp_row;  // relative to the chunk
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0, l1 = 0;
};

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
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    const float new_m0 = fmaxf(r.m0, mx0 * a.scale_log2), new_m1 = fmaxf(r.m1, mx1 * a.scale_log2);
    // A fully masked row keeps reference 0 so exp2 never sees (-inf) - (-inf).
    const float ref0 = new_m0 == -INFINITY ? 0.f : new_m0, ref1 = new_m1 == -INFINITY ? 0.f : new_m1;
    const float2 alpha = make_float2(exp2f(r.m0 - ref0), exp2f(r.m1 - ref1));
    r.m0 = new_m0;
    r.m1 = new_m1;
    float sum0 = 0, sum1 = 0;
#pragma unroll
    for (int nt = 0; nt < k_keys / 8; nt++) {
        s[nt * 4 + 0] = exp2f(fmaf(s[nt * 4 + 0], a.scale_log2, -ref0));
        s[nt * 4 + 1] = exp2f(fmaf(s[nt * 4 + 1], a.scale_log2, -ref0));
        s[nt * 4 + 2] = exp2f(fmaf(s[nt * 4 + 2], a.scale_log2, -ref1));
        s[nt * 4 + 3] = exp2f(fmaf(s[nt * 4 + 3], a.scale_log2, -ref1));
        sum0 += s[nt * 4 + 0] + s[nt * 4 + 1];
        sum1 += s[nt * 4 + 2] + s[nt * 4 + 3];
    }
    r.l0 = r.l0 * alpha.x + sum0;
    r.l1 = r.l1 * alpha.y + sum1;
    return alpha;
}

// o *= alpha per row; P (fp32, accumulator layout) -> bf16 A fragments of 16 keys each.
template <int D> __device__ __forceinline__ void rescale_and_pack(float (&o)[D / 2], float2 alpha, const float (&p)[k_keys / 2],
                                                                  uint32_t (&pf)[k_keys / 16][4]) {
#pragma unroll
    for (int dt = 0; dt < D / 8; dt++) {
        o[dt * 4 + 0] *= alpha.x;
        o[dt * 4 + 1] *= alpha.x;
        o[dt * 4 + 2] *= alpha.y;
        o[dt * 4 + 3] *= alpha.y;
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

// grid (n_head, query tiles): heads fastest (a KV group's heads share its tiles in L2), the heaviest query tiles first.
template <int D, KVKind K> __global__ void __launch_bounds__(k_threads, 1) attention_prefill_wgmma_kernel(PrefillArgs a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using Layout = WgmmaSmem<D, K>;
    using Pipe = typename Layout::Pipe;
    extern __shared__ unsigned char smem_raw[];
    unsigned char * smem = smem_raw + ((1024 - sm90::smem_addr(smem_raw) % 1024) % 1024);
    unsigned char * qs = smem + Layout::q_offset;

    const int head = blockIdx.x, kvh = head / (a.n_head / a.n_kv);
    const int wg = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, g = threadIdx.x % 32 / 4;
    const int q_tile = (gridDim.y - 1 - blockIdx.y) * k_rows;
    const int wg_row = q_tile + wg * 64;
    RowState rs;
    rs.warp_row = wg_row + warp * 16;
    rs.row0 = rs.warp_row + g;
    rs.row1 = rs.row0 + 8;
    const int last_row = min(q_tile + k_rows, a.n) - 1;
    const int n_keys = a.pos0 + last_row + 1;  // causal: keys this block needs
    const int n_tiles = (n_keys + k_keys - 1) / k_keys;
    // Tiles this warpgroup needs: up to its last row's last key; 0 when its rows lie past the chunk. The overlapped
    // order multiplies every tile of the block regardless, fully masked where not needed (one tile more for the
    // first warpgroup; all of them for a warpgroup of the last query tile whose rows lie past the chunk): a branch on
    // a per-warpgroup bound around the MMAs makes ptxas serialise every wgmma (C7520).
    const int wg_tiles = wg_row < a.n ? (a.pos0 + min(wg_row + 63, a.n - 1)) / k_keys + 1 : 0;

    // Q tile, rows past the chunk zero: cp.async into the first K/V tile's commit group.
    for (int c = threadIdx.x; c < k_rows * (D / 8); c += k_threads) {
        const int r = c / (D / 8), ch = c % (D / 8), row = q_tile + r;
        const bool valid = row < a.n;
        cp_async16(qs + sm90::swizzle128_offset(r, ch, k_rows), a.q + (int64_t(valid ? row : 0) * a.n_head + head) * D + ch * 8, valid);
    }
    // Cache row of key j; block sizes are powers of two in practice (16), so shifts replace the divisions.
    const int bs = a.cache.block_size, bs_shift = 31 - __clz(bs);
    const bool bs_pow2 = (bs & (bs - 1)) == 0;
    auto row_of = [&](int j) {
        if (bs_pow2) return ((int64_t(a.cache.block_table[j >> bs_shift]) * a.n_kv + kvh) << bs_shift) + (j & (bs - 1));
        return (int64_t(a.cache.block_table[j / bs]) * a.n_kv + kvh) * bs + j % bs;
    };
    auto load_tile = [&](int t) { Pipe::load(smem, a.cache, t, t * k_keys, n_keys, row_of); };

    const uint32_t q_addr = sm90::smem_addr(qs) + wg * 64 * 128;
    float o[D / 2] = {};  // this warpgroup's 64 x D output: D / 8 m16n8 fragments per warp
    float s[k_keys / 2];  // S, then P, of one tile
    uint32_t pf[k_keys / 16][4];
    if constexpr (Layout::overlapped) {
        load_tile(0);
        if (n_tiles > 1) load_tile(1);
        Pipe::ready(smem, a.cache, 0, n_tiles > 1);
        sm90::wgmma_fence();
        issue_qk<D>(s, q_addr, Pipe::tile(smem, 0));
        sm90::wgmma_commit();
        sm90::wgmma_wait<0>();
        sm90::fence_operands(s);
        for (int t = 0; t < n_tiles; t++) {
            // s = S of tile t; P V of tile t - 1 may still run.
            const float2 alpha = softmax_tile(s, rs, t * k_keys, a);
            sm90::wgmma_wait<0>();
            sm90::fence_operands(o);
            for (auto & f : pf) sm90::fence_operands(f);
            rescale_and_pack<D>(o, alpha, s, pf);
            if (t + 1 < n_tiles) {
                // Tile t + 1 landed for every thread, and every warpgroup is past P V of tile t - 1, whose stage tile
                // t + 2 takes.
                Pipe::ready(smem, a.cache, t + 1, false);
                if (t + 2 < n_tiles) load_tile(t + 2);
            }
            sm90::fence_operands(s);
            sm90::fence_operands(o);
            for (auto & f : pf) sm90::fence_operands(f);
            sm90::wgmma_fence();
            if (t + 1 < n_tiles) issue_qk<D>(s, q_addr, Pipe::tile(smem, t + 1));
            sm90::wgmma_commit();
            issue_pv<D>(o, pf, Pipe::tile(smem, t) + Pipe::tile_elems);
            sm90::wgmma_commit();
            sm90::wgmma_wait<1>();  // S of tile t + 1
            sm90::fence_operands(s);
        }
        sm90::wgmma_wait<0>();
        sm90::fence_operands(o);
    } else {
        load_tile(0);
        for (int t = 0; t < n_tiles; t++) {
            if (t + 1 < n_tiles) load_tile(t + 1);
            const bf16 * ks = Pipe::ready(smem, a.cache, t, t + 1 < n_tiles), * vs = ks + Pipe::tile_elems;
            if (t < wg_tiles) {
                sm90::wgmma_fence();
                issue_qk<D>(s, q_addr, ks);
                sm90::wgmma_commit();
                sm90::wgmma_wait<0>();
                sm90::fence_operands(s);
                const float2 alpha = softmax_tile(s, rs, t * k_keys, a);
                rescale_and_pack<D>(o, alpha, s, pf);
                sm90::fence_operands(o);
                sm90::wgmma_fence();
                issue_pv<D>(o, pf, vs);
                sm90::wgmma_commit();
                sm90::wgmma_wait<0>();
                sm90::fence_operands(o);
            }
            __syncthreads();  // the tile (and its stage) are overwritten next
        }
    }
    store_prefill_rows<D / 8, true>(o, rs.l0, rs.l1, rs.row0, rs.row1, a, head);
#else
    __trap();  // launched only where prefill_wgmma_available() (an sm_90a build on a compute capability 9.0 device)
#endif
}

template <int D, KVKind K> void launch(const PrefillArgs & a, cudaStream_t stream) {
    constexpr size_t smem = WgmmaSmem<D, K>::bytes;
    static size_t configured = 0;  // once per instantiation
    allow_dynamic_smem(attention_prefill_wgmma_kernel<D, K>, smem, configured);
    const dim3 grid(a.n_head, (a.n + k_rows - 1) / k_rows);
    attention_prefill_wgmma_kernel<D, K><<<grid, k_threads, smem, stream>>>(a);
    CUDA_CHECK(cudaGetLastError());
}

}  // namespace

bool prefill_wgmma_available(int head_dim) {
#if defined(QINFER_SM90A)
    if (head_dim != 64 && head_dim != 128) return false;
    static const bool hopper = [] {
        int dev = 0, major = 0, minor = 0;
        if (cudaGetDevice(&dev) != cudaSuccess) return false;
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
        return major == 9 && minor == 0;
    }();
    return hopper;
#else
    (void)head_dim;
    return false;
#endif
}

bool launch_attention_prefill_wgmma(const PrefillArgs & a, cudaStream_t stream) {
    if (!prefill_wgmma_available(a.d)) return false;
    for_kv_kind(a.cache.quant.kind, [&](auto kind) {
        if (a.d == 64) launch<64, decltype(kind)::value>(a, stream);
        else launch<128, decltype(kind)::value>(a, stream);
    });
    return true;
}

}  // namespace qinfer::cuda
