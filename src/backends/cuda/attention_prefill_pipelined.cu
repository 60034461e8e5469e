// Causal prefill attention, pipelined (FlashAttention-2 on mma.sync m16n8k16), for head_dim 64 and 128.
//
// The first prefill kernel (attention.cu) loads each 64-key tile synchronously and then computes, with 64 queries
// per block. This one keeps two tiles in flight: while the warps multiply tile t, cp.async brings tile t + 1 into
// shared memory (KVTilePipe: a quantized cache's codes arrive raw and are dequantized in shared memory). A block owns
// 128 queries of one head (8 warps of 16 rows), so each K/V tile serves twice the queries; K fragments come from
// ldmatrix.x4 (two n-tiles per instruction) and V fragments from ldmatrix.x4.trans (two d-tiles per instruction); a
// warp skips the tiles its causal window does not reach. Same online softmax in the log2 domain, same outputs as the
// first kernel.
#include <cmath>

#include "backends/cuda/attention_common.cuh"
#include "backends/cuda/common.cuh"
#include "backends/cuda/kv_quant.cuh"

namespace qinfer::cuda {

namespace {

constexpr int k_warps = 8;
constexpr int k_threads = k_warps * 32;
constexpr int k_rows = k_warps * 16;  // queries per block
constexpr int k_keys = 64;            // keys per tile

__device__ __forceinline__ void ldmatrix_x4(const bf16 * p, uint32_t & r0, uint32_t & r1, uint32_t & r2, uint32_t & r3) {
    const uint32_t addr = uint32_t(__cvta_generic_to_shared(p));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}

__device__ __forceinline__ void ldmatrix_x4_trans(const bf16 * p, uint32_t & r0, uint32_t & r1, uint32_t & r2, uint32_t & r3) {
    const uint32_t addr = uint32_t(__cvta_generic_to_shared(p));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}

// grid (n_head, query tiles): heads vary fastest so the heads of a KV group read its tiles from L2 together; query
// tiles run last-first, the causal ones with the most keys before the light ones.
template <int D, KVKind K> __global__ void __launch_bounds__(k_threads) attention_prefill_pipelined_kernel(PrefillArgs a) {
    using Pipe = KVTilePipe<D, K, k_threads, k_keys>;
    constexpr int ld = Pipe::ld;
    extern __shared__ __align__(16) unsigned char smem_raw[];

    const int head = blockIdx.x, kvh = head / (a.n_head / a.n_kv);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, tq = lane % 4;
    const int q_tile = (gridDim.y - 1 - blockIdx.y) * k_rows;
    const int warp_row = q_tile + warp * 16;  // the warp's first query row (relative to the chunk)
    const int row0 = warp_row + g, row1 = row0 + 8;
    const int last_row = min(q_tile + k_rows, a.n) - 1;
    const int n_keys = a.pos0 + last_row + 1;  // causal: keys this block needs
    // The last key any row of this warp sees; -1 when the warp's rows all lie past the chunk.
    const int warp_last_key = warp_row < a.n ? a.pos0 + min(warp_row + 15, a.n - 1) : -1;

    uint32_t qf[D / 16][4];
#pragma unroll
    for (int kc = 0; kc < D / 16; kc++) {
        const int c0 = kc * 16 + 2 * tq, c1 = c0 + 8;
        auto ld_q = [&](int row, int col) -> uint32_t {
            return row < a.n ? load_pair(a.q + (int64_t(row) * a.n_head + head) * D + col) : 0u;
        };
        qf[kc][0] = ld_q(row0, c0);
        qf[kc][1] = ld_q(row1, c0);
        qf[kc][2] = ld_q(row0, c1);
        qf[kc][3] = ld_q(row1, c1);
    }

    const int bs = a.cache.block_size;
    auto row_of = [&](int j) { return (int64_t(a.cache.block_table[j / bs]) * a.n_kv + kvh) * bs + j % bs; };
    auto load_tile = [&](int t) { Pipe::load(smem_raw, a.cache, t, t * k_keys, n_keys, row_of); };

    float o[D / 8][4] = {};
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0, l1 = 0;
    const int n_tiles = (n_keys + k_keys - 1) / k_keys;
    load_tile(0);
    for (int t = 0; t < n_tiles; t++) {
        if (t + 1 < n_tiles) load_tile(t + 1);
        const bf16 * ks = Pipe::ready(smem_raw, a.cache, t, t + 1 < n_tiles), * vs = ks + Pipe::tile_elems;
        const int k0 = t * k_keys;
        if (k0 <= warp_last_key) {
            // S = Q K^T: 16 rows x 64 keys, as 8 n-tiles; one ldmatrix.x4 gives the B fragments of two n-tiles.
            float s[k_keys / 8][4];
#pragma unroll
            for (int nt = 0; nt < k_keys / 8; nt++) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0;
#pragma unroll
            for (int kc = 0; kc < D / 16; kc++) {
#pragma unroll
                for (int np = 0; np < k_keys / 16; np++) {
                    const int key = np * 16 + (lane % 8) + (lane / 16) * 8, col = kc * 16 + ((lane / 8) % 2) * 8;
                    uint32_t b0, b1, b2, b3;
                    ldmatrix_x4(&ks[key * ld + col], b0, b1, b2, b3);
                    mma_16816(s[2 * np], qf[kc], b0, b1);
                    mma_16816(s[2 * np + 1], qf[kc], b2, b3);
                }
            }
            // Mask (causal, and rows past the chunk) only where the tile reaches past the warp's first row's last
            // key or the warp holds rows past the chunk; the scale into the log2 domain is applied inside exp2's
            // argument (max commutes with a positive scale).
            if (k0 + k_keys - 1 > a.pos0 + warp_row || warp_row + 15 >= a.n) {
#pragma unroll
                for (int nt = 0; nt < k_keys / 8; nt++) {
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int key = k0 + nt * 8 + 2 * tq + (e & 1);
                        const int row = e < 2 ? row0 : row1;
                        if (!(row < a.n && key <= a.pos0 + row)) s[nt][e] = -INFINITY;
                    }
                }
            }
            float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
            for (int nt = 0; nt < k_keys / 8; nt++) {
                mx0 = fmaxf(mx0, fmaxf(s[nt][0], s[nt][1]));
                mx1 = fmaxf(mx1, fmaxf(s[nt][2], s[nt][3]));
            }
            // Scaling before the quad's max gives the same maxima (scale_log2 > 0).
            const SoftmaxStep st = online_softmax_step(mx0 * a.scale_log2, mx1 * a.scale_log2, m0, m1);
            const float ref0 = st.ref.x, ref1 = st.ref.y, alpha0 = st.alpha.x, alpha1 = st.alpha.y;
            l0 *= alpha0;
            l1 *= alpha1;
#pragma unroll
            for (int dt = 0; dt < D / 8; dt++) {
                o[dt][0] *= alpha0;
                o[dt][1] *= alpha0;
                o[dt][2] *= alpha1;
                o[dt][3] *= alpha1;
            }
            // P = exp2(S * scale - m) as bf16 A fragments (16 keys each).
            uint32_t pf[k_keys / 16][4];
#pragma unroll
            for (int nt = 0; nt < k_keys / 8; nt++) {
                const float p0 = exp2f(fmaf(s[nt][0], a.scale_log2, -ref0)), p1 = exp2f(fmaf(s[nt][1], a.scale_log2, -ref0));
                const float p2 = exp2f(fmaf(s[nt][2], a.scale_log2, -ref1)), p3 = exp2f(fmaf(s[nt][3], a.scale_log2, -ref1));
                l0 += p0 + p1;
                l1 += p2 + p3;
                pf[nt / 2][(nt % 2) * 2 + 0] = pack_bf16(p0, p1);
                pf[nt / 2][(nt % 2) * 2 + 1] = pack_bf16(p2, p3);
            }
            // O += P V: ldmatrix.x4.trans gives the B fragments of d-tiles dt and dt + 1 for 16 keys (lanes 0-15 address
            // the keys at column dt * 8, lanes 16-31 at (dt + 1) * 8).
#pragma unroll
            for (int kc = 0; kc < k_keys / 16; kc++) {
#pragma unroll
                for (int dt = 0; dt < D / 8; dt += 2) {
                    uint32_t b0, b1, b2, b3;
                    ldmatrix_x4_trans(&vs[(kc * 16 + (lane % 16)) * ld + (dt + lane / 16) * 8], b0, b1, b2, b3);
                    mma_16816(o[dt], pf[kc], b0, b1);
                    mma_16816(o[dt + 1], pf[kc], b2, b3);
                }
            }
        }
        __syncthreads();  // the tile (and its stage) are overwritten next
    }
    store_prefill_rows<D / 8, true>(&o[0][0], l0, l1, row0, row1, a, head);
}

template <int D, KVKind K> void launch(const PrefillArgs & a, cudaStream_t stream) {
    constexpr size_t smem = KVTilePipe<D, K, k_threads, k_keys>::smem_bytes;
    static PerDevice<size_t> configured;  // once per instantiation
    allow_dynamic_smem(attention_prefill_pipelined_kernel<D, K>, smem, configured);
    const dim3 grid(a.n_head, (a.n + k_rows - 1) / k_rows);
    attention_prefill_pipelined_kernel<D, K><<<grid, k_threads, smem, stream>>>(a);
    CUDA_CHECK(cudaGetLastError());
}

}  // namespace

bool launch_attention_prefill_pipelined(const PrefillArgs & a, cudaStream_t stream) {
    if (a.d != 64 && a.d != 128) return false;
    for_kv_kind(a.cache.quant.kind, [&](auto kind) {
        if (a.d == 64) launch<64, decltype(kind)::value>(a, stream);
        else launch<128, decltype(kind)::value>(a, stream);
    });
    return true;
}

}  // namespace qinfer::cuda
