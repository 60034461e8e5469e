// Causal prefill attention on Hopper warpgroup MMAs (wgmma, sm_90a), for head_dim 64 and 128.
//
// FlashAttention-3's data path without its warp specialisation: a block owns 128 queries of one head as two
// warpgroups of 64. K/V tiles of 128 keys stream through shared memory with the next one in flight (KVTilePipe,
// cp.async; a quantized cache's codes are dequantized into the same tiles), stored in wgmma's 128-byte-swizzled
// panels. S = Q K^T reads Q and K from shared memory through descriptors (both K-major); O += P V takes P from
// registers, since the fp32 S accumulator rounded to bf16 pairs is the A fragment, and V from shared memory N-major.
// The online softmax is the pipelined kernel's (log2 domain, the scale inside exp2's FMA, masks on diagonal tiles
// only), per warp on its 16 rows. Where the pipelined kernel's warps multiply 16 x 64 tiles through mma.sync with a
// ldmatrix per two MMAs, a warpgroup here multiplies 64 x 128 with one instruction per 16 of the reduction.
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
    using Pipe = KVTilePipe<D, K, k_threads, k_keys, true>;
    static constexpr size_t q_offset = (Pipe::smem_bytes + 1023) / 1024 * 1024;  // Q: [D / 64][k_rows][64], swizzled
    static constexpr size_t bytes = q_offset + size_t(k_rows) * D * 2 + 1024;  // + the base's alignment to 1024
};

// grid (n_head, query tiles): heads fastest (a KV group's heads share its tiles in L2), the heaviest query tiles first.
template <int D, KVKind K> __global__ void __launch_bounds__(k_threads, 1) attention_prefill_wgmma_kernel(PrefillArgs a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using Layout = WgmmaSmem<D, K>;
    using Pipe = typename Layout::Pipe;
    extern __shared__ unsigned char smem_raw[];
    unsigned char * smem = smem_raw + ((1024 - sm90::smem_addr(smem_raw) % 1024) % 1024);
    unsigned char * qs = smem + Layout::q_offset;

    const int head = blockIdx.x, kvh = head / (a.n_head / a.n_kv);
    const int wg = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32, g = lane / 4, tq = lane % 4;
    const int q_tile = (gridDim.y - 1 - blockIdx.y) * k_rows;
    const int wg_row = q_tile + wg * 64, warp_row = wg_row + warp * 16;
    const int row0 = warp_row + g, row1 = row0 + 8;
    const int last_row = min(q_tile + k_rows, a.n) - 1;
    const int n_keys = a.pos0 + last_row + 1;  // causal: keys this block needs
    // The last key any row of this warpgroup sees (the MMAs are warpgroup-wide); -1 when its rows lie past the chunk.
    const int wg_last_key = wg_row < a.n ? a.pos0 + min(wg_row + 63, a.n - 1) : -1;

    // Q tile, rows past the chunk zero: cp.async into the first K/V tile's commit group.
    for (int c = threadIdx.x; c < k_rows * (D / 8); c += k_threads) {
        const int r = c / (D / 8), ch = c % (D / 8), row = q_tile + r;
        const bool valid = row < a.n;
        cp_async16(qs + sm90::swizzle128_offset(r, ch, k_rows), a.q + (int64_t(valid ? row : 0) * a.n_head + head) * D + ch * 8, valid);
    }
    const int bs = a.cache.block_size;
    auto row_of = [&](int j) { return (int64_t(a.cache.block_table[j / bs]) * a.n_kv + kvh) * bs + j % bs; };
    auto load_tile = [&](int t) { Pipe::load(smem, a.cache, t, t * k_keys, n_keys, row_of); };

    const uint32_t q_addr = sm90::smem_addr(qs) + wg * 64 * 128;
    float o[D / 2] = {};  // this warpgroup's 64 x D output: D / 8 m16n8 fragments per warp
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0, l1 = 0;
    const int n_tiles = (n_keys + k_keys - 1) / k_keys;
    load_tile(0);
    for (int t = 0; t < n_tiles; t++) {
        if (t + 1 < n_tiles) load_tile(t + 1);
        const bf16 * ks = Pipe::ready(smem, a.cache, t, t + 1 < n_tiles), * vs = ks + Pipe::tile_elems;
        const int k0 = t * k_keys;
        if (k0 <= wg_last_key) {
            // S = Q K^T: 64 rows x 128 keys, one k16 step of the head dim per instruction.
            float s[k_keys / 2];
            const uint32_t k_addr = sm90::smem_addr(ks);
            sm90::wgmma_fence();
#pragma unroll
            for (int kc = 0; kc < D / 16; kc++) {
                const uint32_t panel = kc / 4, within = (kc % 4) * 32;
                sm90::wgmma_m64n128k16_ss(s, sm90::desc128(q_addr + panel * k_rows * 128 + within, 16, 1024),
                                          sm90::desc128(k_addr + panel * k_keys * 128 + within, 16, 1024), kc > 0);
            }
            sm90::wgmma_commit();
            sm90::wgmma_wait<0>();
            sm90::fence_operands(s);
            // Mask (causal, and rows past the chunk) where the tile reaches past the warp's first row's last key or the
            // warp holds rows past the chunk.
            if (k0 + k_keys - 1 > a.pos0 + warp_row || warp_row + 15 >= a.n) {
#pragma unroll
                for (int nt = 0; nt < k_keys / 8; nt++) {
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int key = k0 + nt * 8 + 2 * tq + (e & 1);
                        const int row = e < 2 ? row0 : row1;
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
            mx0 *= a.scale_log2;
            mx1 *= a.scale_log2;
            const float new_m0 = fmaxf(m0, mx0), new_m1 = fmaxf(m1, mx1);
            // A fully masked row keeps reference 0 so exp2 never sees (-inf) - (-inf).
            const float ref0 = new_m0 == -INFINITY ? 0.f : new_m0, ref1 = new_m1 == -INFINITY ? 0.f : new_m1;
            const float alpha0 = exp2f(m0 - ref0), alpha1 = exp2f(m1 - ref1);
            m0 = new_m0;
            m1 = new_m1;
            l0 *= alpha0;
            l1 *= alpha1;
#pragma unroll
            for (int dt = 0; dt < D / 8; dt++) {
                o[dt * 4 + 0] *= alpha0;
                o[dt * 4 + 1] *= alpha0;
                o[dt * 4 + 2] *= alpha1;
                o[dt * 4 + 3] *= alpha1;
            }
            // P = exp2(S * scale - m) as bf16 A fragments, 16 keys each.
            uint32_t pf[k_keys / 16][4];
#pragma unroll
            for (int nt = 0; nt < k_keys / 8; nt++) {
                const float p0 = exp2f(fmaf(s[nt * 4 + 0], a.scale_log2, -ref0)), p1 = exp2f(fmaf(s[nt * 4 + 1], a.scale_log2, -ref0));
                const float p2 = exp2f(fmaf(s[nt * 4 + 2], a.scale_log2, -ref1)), p3 = exp2f(fmaf(s[nt * 4 + 3], a.scale_log2, -ref1));
                l0 += p0 + p1;
                l1 += p2 + p3;
                pf[nt / 2][(nt % 2) * 2 + 0] = pack_bf16(p0, p1);
                pf[nt / 2][(nt % 2) * 2 + 1] = pack_bf16(p2, p3);
            }
            // O += P V: 16 keys per instruction; V's panels of 64 head dims lie k_keys * 128 bytes apart.
            const uint32_t v_addr = sm90::smem_addr(vs);
            sm90::fence_operands(o);
            sm90::wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < k_keys / 16; kk++) {
                const uint64_t v_desc = sm90::desc128(v_addr + kk * 16 * 128, k_keys * 128, 1024);
                if constexpr (D == 128) sm90::wgmma_m64n128k16_rs_nmajor(o, pf[kk], v_desc);
                else sm90::wgmma_m64n64k16_rs_nmajor(o, pf[kk], v_desc);
            }
            sm90::wgmma_commit();
            sm90::wgmma_wait<0>();
            sm90::fence_operands(o);
        }
        __syncthreads();  // the tile (and its stage) are overwritten next
    }
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    const float inv0 = l0 > 0 ? 1.0f / l0 : 0.f, inv1 = l1 > 0 ? 1.0f / l1 : 0.f;
#pragma unroll
    for (int dt = 0; dt < D / 8; dt++) {
        const int col = dt * 8 + 2 * tq;
        if (row0 < a.n) {
            *reinterpret_cast<__nv_bfloat162 *>(a.out + (int64_t(row0) * a.n_head + head) * D + col) =
                __floats2bfloat162_rn(o[dt * 4 + 0] * inv0, o[dt * 4 + 1] * inv0);
        }
        if (row1 < a.n) {
            *reinterpret_cast<__nv_bfloat162 *>(a.out + (int64_t(row1) * a.n_head + head) * D + col) =
                __floats2bfloat162_rn(o[dt * 4 + 2] * inv1, o[dt * 4 + 3] * inv1);
        }
    }
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

template <int D> void launch_kind(const PrefillArgs & a, cudaStream_t stream) {
    switch (a.cache.quant.kind) {
    case KVKind::BF16: return launch<D, KVKind::BF16>(a, stream);
    case KVKind::FP8: return launch<D, KVKind::FP8>(a, stream);
    case KVKind::INT8: return launch<D, KVKind::INT8>(a, stream);
    case KVKind::INT4: return launch<D, KVKind::INT4>(a, stream);
    }
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
    if (a.d == 64) launch_kind<64>(a, stream);
    else launch_kind<128>(a, stream);
    return true;
}

}  // namespace qinfer::cuda
