// Decode attention on tensor cores (flash-decoding with GQA packing), for head_dim 64 and 128.
//
// grid (max_splits, n_kv, batch), 4 warps per block. The n_rep query heads sharing KV head h are the rows of one
// m16n8k16 tile (padded to 16 with zeros), so a key is read once for all of them and multiplied on tensor cores. The
// split's keys stream through shared memory 64 at a time, double-buffered with cp.async (KVTilePipe: a quantized
// cache's codes arrive raw and are dequantized to bf16 in shared memory); warp w takes keys [16w, 16w + 16) of each tile: S = Q K^T (two n-tiles),
// online softmax per row in the log2 domain, O += P V with V fragments from ldmatrix.trans (the prefill kernel's
// fragments, attention.cu). The warps' (m, l, O) merge through shared memory into the split's partial result, which
// attention_combine_kernel reads as it reads the SIMT kernel's.
#include <cmath>

#include "backends/cuda/attention_common.cuh"
#include "backends/cuda/common.cuh"
#include "backends/cuda/kv_quant.cuh"

namespace qinfer::cuda {

namespace {

constexpr int k_tile = 64;  // keys per shared-memory tile; also the fewest keys of a split (attention.cu's combine)

// a.early_kv: what does not depend on the kernel ahead is read before pdl_wait(): the context length and the block
// table (set before the step) and the first tiles whose keys all precede the new one (written by earlier steps); the
// queries and the new key's K/V come from the kernel ahead (the QKV projection's epilogue or qkv_rope_cache). With
// programmatic dependent launch those loads overlap the end of that kernel.
template <int D, KVKind K, int STAGES> __global__ void __launch_bounds__(k_decode_threads) attention_decode_tc_kernel(DecodeArgs a) {
    if (!a.early_kv) pdl_wait();
    using Pipe = KVTilePipe<D, K, k_decode_threads, k_tile, false, STAGES>;
    constexpr int ld = Pipe::ld;
    extern __shared__ __align__(16) unsigned char smem_raw[];  // Pipe's tiles, then the warps' merge
    __shared__ int blocks[k_decode_max_split_keys / 16 + 2];

    const int split_id = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;
    const int len = a.len_dev[b];
    const int split = decode_split_size(len, a.scratch.max_splits, a.min_split);
    const int begin = split_id * split;
    if (begin >= len) return;
    const int end = min(len, begin + split);
    const int n_rep = a.n_head / a.n_kv;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, tq = lane % 4;
    const int bs = a.cache.block_size;

    const int first_block = begin / bs;
    const int * table = a.cache.block_table + int64_t(b) * a.cache.table_stride;
    for (int i = threadIdx.x; i <= (end - 1) / bs - first_block; i += k_decode_threads) blocks[i] = table[first_block + i];
    __syncthreads();

    // Tile t: keys begin + 64 t ..
    auto row_of = [&](int j) { return (int64_t(blocks[j / bs - first_block]) * a.n_kv + kvh) * bs + j % bs; };
    auto load_tile = [&](int t) { Pipe::load(smem_raw, a.cache, t, begin + t * k_tile, end, row_of); };
    const int n_tiles = (end - begin + k_tile - 1) / k_tile;
    int n_loaded = 0;  // tiles requested so far, in order (one cp.async group each)
    if (a.early_kv) {
        while (n_loaded < STAGES - 1 && n_loaded < n_tiles && min(begin + (n_loaded + 1) * k_tile, end) <= len - 1) load_tile(n_loaded++);
        pdl_wait();
    }

    // Q fragments (A operand): row r is query head kvh * n_rep + r; rows n_rep..15 are zero (row g + 8 always is).
    uint32_t qf[D / 16][4];
    const bf16 * q = a.q + (int64_t(b) * a.n_head + int64_t(kvh) * n_rep) * D;
#pragma unroll
    for (int kc = 0; kc < D / 16; kc++) {
        const int c0 = kc * 16 + 2 * tq, c1 = c0 + 8;
        qf[kc][0] = g < n_rep ? load_pair(q + g * D + c0) : 0u;
        qf[kc][1] = 0u;
        qf[kc][2] = g < n_rep ? load_pair(q + g * D + c1) : 0u;
        qf[kc][3] = 0u;
    }

    const float scale_log2 = a.scale * float(M_LOG2E);
    float o[D / 8][4] = {};
    float m0 = -INFINITY, l0 = 0;  // row g; row g + 8 is padding and never read
    // Tiles 0 .. STAGES - 2 first; tile t + STAGES - 1 goes into the stage tile t - 1 left (free after its barrier).
    for (int t = n_loaded; t < STAGES - 1 && t < n_tiles; t++) load_tile(t);
    for (int t = 0; t < n_tiles; t++) {
        if (t + STAGES - 1 < n_tiles) load_tile(t + STAGES - 1);
        const bf16 * ks = Pipe::ready(smem_raw, a.cache, t, min(STAGES - 1, n_tiles - 1 - t)), * vs = ks + Pipe::tile_elems;
        const int kw = warp * 16;  // this warp's keys within the tile
        float s[2][4];
#pragma unroll
        for (int nt = 0; nt < 2; nt++) {
            s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0;
#pragma unroll
            for (int kc = 0; kc < D / 16; kc++) {
                const bf16 * kr = &ks[(kw + nt * 8 + g) * ld + kc * 16 + 2 * tq];
                mma_16816(s[nt], qf[kc], load_pair(kr), load_pair(kr + 8));
            }
        }
        float mx = -INFINITY;
        const int k0 = begin + t * k_tile + kw;
#pragma unroll
        for (int nt = 0; nt < 2; nt++) {
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int key = k0 + nt * 8 + 2 * tq + e;
                s[nt][e] = key < end ? s[nt][e] * scale_log2 : -INFINITY;
                mx = fmaxf(mx, s[nt][e]);
            }
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float new_m = fmaxf(m0, mx);
        const float ref = new_m == -INFINITY ? 0.f : new_m;  // a row with no key yet keeps exp2 finite
        const float alpha = exp2f(m0 - ref);
        m0 = new_m;
        l0 *= alpha;
#pragma unroll
        for (int dt = 0; dt < D / 8; dt++) {
            o[dt][0] *= alpha;
            o[dt][1] *= alpha;
        }
        // P as one A fragment over the warp's 16 keys: row g in registers 0 and 2, the padding row g + 8 zero.
        const float p00 = exp2f(s[0][0] - ref), p01 = exp2f(s[0][1] - ref), p10 = exp2f(s[1][0] - ref), p11 = exp2f(s[1][1] - ref);
        l0 += p00 + p01 + p10 + p11;
        const uint32_t pf[4] = {pack_bf16(p00, p01), 0u, pack_bf16(p10, p11), 0u};
#pragma unroll
        for (int dt = 0; dt < D / 8; dt++) {
            const bf16 * row = &vs[(kw + (lane % 16)) * ld + dt * 8];
            uint32_t b0, b1;
            const uint32_t addr = uint32_t(__cvta_generic_to_shared(row));
            asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n" : "=r"(b0), "=r"(b1) : "r"(addr));
            mma_16816(o[dt], pf, b0, b1);
        }
        __syncthreads();  // the tile (and its stage) are overwritten next
    }
    pdl_trigger();  // the keys are read (QINFER_PDL_TRIGGER=loop builds)
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);

    // Merge the warps (the tiles' shared memory is free now): per row, m and l, and O.
    float * wm = reinterpret_cast<float *>(smem_raw);  // [warps][8]
    float * wl = wm + k_decode_warps * 8;              // [warps][8]
    float * wo = wl + k_decode_warps * 8;              // [warps][8][D]
    if (g < n_rep) {
        if (tq == 0) {
            wm[warp * 8 + g] = m0;
            wl[warp * 8 + g] = l0;
        }
#pragma unroll
        for (int dt = 0; dt < D / 8; dt++) {
            const int c = dt * 8 + 2 * tq;
            wo[(warp * 8 + g) * D + c] = o[dt][0];
            wo[(warp * 8 + g) * D + c + 1] = o[dt][1];
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < n_rep * D; i += k_decode_threads) {
        const int r = i / D, c = i % D;
        float mx = -INFINITY;
#pragma unroll
        for (int w = 0; w < k_decode_warps; w++) mx = fmaxf(mx, wm[w * 8 + r]);
        float lsum = 0, osum = 0;
#pragma unroll
        for (int w = 0; w < k_decode_warps; w++) {
            const float cw = wm[w * 8 + r] == -INFINITY ? 0.f : exp2f(wm[w * 8 + r] - mx);
            lsum += wl[w * 8 + r] * cw;
            osum += wo[(w * 8 + r) * D + c] * cw;
        }
        const int64_t prow = (int64_t(b) * a.n_head + kvh * n_rep + r) * a.scratch.max_splits + split_id;
        a.scratch.partial_out[prow * D + c] = osum;
        if (c == 0) {
            a.scratch.partial_ml[prow * 2] = mx * float(M_LN2);  // the combine kernel works in natural-log units
            a.scratch.partial_ml[prow * 2 + 1] = lsum;
        }
    }
}

template <int D, KVKind K, int STAGES> void launch(DecodeArgs a, dim3 grid, cudaStream_t stream) {
    constexpr size_t smem = KVTilePipe<D, K, k_decode_threads, k_tile, false, STAGES>::smem_bytes;
    static_assert(smem >= (2 * k_decode_warps * 8 + k_decode_warps * 8 * D) * sizeof(float), "the warp merge fits the tiles' memory");
    static size_t configured = 0;  // once per instantiation, before any graph capture (the engine warms up first)
    allow_dynamic_smem(attention_decode_tc_kernel<D, K, STAGES>, smem, configured);
    a.min_split = k_tile;
    launch_kernel(attention_decode_tc_kernel<D, K, STAGES>, grid, k_decode_threads, smem, stream, a);
}

}  // namespace

bool launch_attention_decode_tc(const DecodeArgs & a, int head_dim, dim3 grid, cudaStream_t stream) {
    if (a.n_head / a.n_kv > 8 || (head_dim != 64 && head_dim != 128)) return false;
    const bool three = decode_tc_stages(head_dim) == 3;
    for_kv_kind(a.cache.quant.kind, [&](auto kind) {
        constexpr KVKind K = decltype(kind)::value;
        if (head_dim == 64) three ? launch<64, K, 3>(a, grid, stream) : launch<64, K, 2>(a, grid, stream);
        else three ? launch<128, K, 3>(a, grid, stream) : launch<128, K, 2>(a, grid, stream);
    });
    return true;
}

}  // namespace qinfer::cuda
