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
#include "backends/cuda/attention_prefill_wgmma.cuh"
#include "backends/cuda/common.cuh"
#include "backends/cuda/kv_quant.cuh"
#include "backends/cuda/wgmma.cuh"

namespace qinfer::cuda {

namespace {

using namespace prefill_wgmma;
constexpr int k_threads = 128 * k_warpgroups;

template <int D, KVKind K> struct WgmmaSmem {
    static constexpr bool overlapped = K == KVKind::BF16;
    using Pipe = KVTilePipe<D, K, k_threads, k_keys, true, overlapped ? 3 : 2>;
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
    static PerDevice<size_t> configured;  // once per instantiation
    allow_dynamic_smem(attention_prefill_wgmma_kernel<D, K>, smem, configured);
    const dim3 grid(a.n_head, (a.n + k_rows - 1) / k_rows);
    attention_prefill_wgmma_kernel<D, K><<<grid, k_threads, smem, stream>>>(a);
    CUDA_CHECK(cudaGetLastError());
}

}  // namespace

bool prefill_wgmma_available(int head_dim) { return (head_dim == 64 || head_dim == 128) && sm90a_device(); }

bool launch_attention_prefill_wgmma(const PrefillArgs & a, cudaStream_t stream) {
    if (!prefill_wgmma_available(a.d)) return false;
    for_kv_kind(a.cache.quant.kind, [&](auto kind) {
        if (a.d == 64) launch<64, decltype(kind)::value>(a, stream);
        else launch<128, decltype(kind)::value>(a, stream);
    });
    return true;
}

}  // namespace qinfer::cuda
