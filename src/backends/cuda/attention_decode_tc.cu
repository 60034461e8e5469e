// Decode attention on tensor cores (flash-decoding with GQA packing), for head_dim 64 and 128.
//
// grid (max_splits, n_kv, batch), 4 warps per block. The n_rep query heads sharing KV head h (up to 16: Qwen3-235B-A22B's
// 64 over 4) are the rows of one m16n8k16 tile (padded to 16 with zeros), so a key is read once for all of them and
// multiplied on tensor cores; each lane keeps the softmax state of its rows g and, past 8 heads, g + 8. The
// split's keys stream through shared memory 64 at a time in STAGES resident tiles; warp w takes keys [16w, 16w + 16)
// of each tile: S = Q K^T (two n-tiles), online softmax per row in the log2 domain, O += P V with V fragments from
// ldmatrix.trans (the prefill kernel's fragments, attention.cu). The warps' (m, l, O) merge through shared memory into
// the split's partial result, which attention_combine_kernel reads as it reads the SIMT kernel's.
//
// Two ways to bring the tiles in, one tile computation (attend_tile):
//   cp.async (any cache dtype, sm_80+): every thread requests 16-byte chunks into padded rows (KVTilePipe; a
//     quantized cache's codes arrive raw and are dequantized to bf16 in shared memory). Each chunk costs its thread
//     the key's block-table lookup and address arithmetic: at 129024 keys that issue work, not DRAM, set the pace
//     (ncu on H100: ~950 instructions per warp and tile, DRAM at 74%; bench/results/2026-11-27-h100-decode-tma).
//   tensor copies (bf16 caches on sm_90a): a fifth warp, the copy warp, issues one 2-D copy per 16 keys, 64 columns
//     and K or V (tensor_map.h: 128-byte swizzle, so the fragments read conflict-free without padding), completing on
//     the stage's mbarrier; each computing warp releases a stage on its `empty` mbarrier when done with it, and the
//     copy warp refills it once all four have. Before, warp 0 issued the copies between its own tiles and a block
//     barrier ended every tile: the int8 kernel at 129024 keys (7B layer, H200) went from 61.1 to 49.1 us, the bf16
//     one from 76.4 to 75.0 (bench/results/2026-12-01-h200-decode-copy-warp).
#include <cmath>

#include "backends/cuda/attention_common.cuh"
#include "backends/cuda/attention_decode_tc.cuh"
#include "backends/cuda/common.cuh"
#include "backends/cuda/kv_quant.cuh"
#include "backends/cuda/tensor_map.h"
#include "backends/cuda/wgmma.cuh"

namespace qinfer::cuda {

namespace {

using namespace decode_tc;

// Byte offset of 16-byte chunk `chunk` (columns 8 chunk .. 8 chunk + 7) of key row `row` in a K or V tile.
template <int D> struct PaddedTile {  // KVTilePipe's rows of D + 8 bf16
    __device__ __forceinline__ static int at(int row, int chunk) { return (row * (D + 8) + chunk * 8) * 2; }
};
#if !defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL)
struct SwizzledTile {  // panels of 64 columns, 128-byte swizzle (wgmma.cuh); the tensor-copy kernel's (sm_90a)
    __device__ __forceinline__ static int at(int row, int chunk) { return sm90::swizzle128_offset(row, chunk, k_tile); }
};
#endif

// The online softmax of one row (m in the log2 domain, l this lane's partial sum) over the warp's 16 keys, whose
// scaled scores this lane holds as x0, x1 (keys 2 tq, 2 tq + 1) and y0, y1 (keys 8 + 2 tq, 8 + 2 tq + 1), all -inf
// where masked; rescales this row's part of O (o[dt][e0], o[dt][e0 + 1]) when its maximum moves (alpha is otherwise
// exactly 1, so the result is the same bit for bit: 32 of the int8 kernel's ~430 instructions per warp and tile,
// kernels 0.1-1.1% faster on an H100, bench/results/2026-11-27-h100-lazy-fold) and returns the row's probabilities
// packed as the two A-fragment registers of P (keys 2 tq.. and 8 + 2 tq..).
template <int D>
__device__ __forceinline__ uint2 softmax_row(float x0, float x1, float y0, float y1, float (&o)[D / 8][4], int e0, float & m, float & l) {
    const float mx = quad_max(fmaxf(fmaxf(x0, x1), fmaxf(y0, y1)));
    const float new_m = fmaxf(m, mx);
    const float ref = new_m == -INFINITY ? 0.f : new_m;  // a row with no key yet keeps exp2 finite
    if (__any_sync(0xffffffffu, new_m != m)) {
        const float alpha = exp2f(m - ref);
        l *= alpha;
#pragma unroll
        for (int dt = 0; dt < D / 8; dt++) {
            o[dt][e0] *= alpha;
            o[dt][e0 + 1] *= alpha;
        }
    }
    m = new_m;
    const float p00 = exp2f(x0 - ref), p01 = exp2f(x1 - ref), p10 = exp2f(y0 - ref), p11 = exp2f(y1 - ref);
    l += p00 + p01 + p10 + p11;
    return make_uint2(pack_bf16(p00, p01), pack_bf16(p10, p11));
}

// This warp's 16 keys of one tile (K at ks, V at vs, layout Tile), the first one `key0`; keys from `end` on are masked.
// S = Q K^T, the online softmax of row g (m0, l0) and, where more than 8 query heads share the KV head (two_rows),
// of row g + 8 (m1, l1); O += P V. Without two_rows row g + 8 of P is zero and its state is never touched.
template <int D, class Tile>
__device__ __forceinline__ void attend_tile(const unsigned char * ks, const unsigned char * vs, const uint32_t (&qf)[D / 16][4], int key0, int end,
                                            float scale_log2, float (&o)[D / 8][4], float & m0, float & l0, float & m1, float & l1,
                                            bool two_rows) {
    const int lane = threadIdx.x % 32, g = lane / 4, tq = lane % 4, kw = threadIdx.x / 32 * 16;
    float s[2][4];
#pragma unroll
    for (int nt = 0; nt < 2; nt++) {
        s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0;
        const int row = kw + nt * 8 + g;
#pragma unroll
        for (int kc = 0; kc < D / 16; kc++) {
            const unsigned char * kr = ks + 4 * tq;
            mma_16816(s[nt], qf[kc], *reinterpret_cast<const uint32_t *>(kr + Tile::at(row, 2 * kc)),
                      *reinterpret_cast<const uint32_t *>(kr + Tile::at(row, 2 * kc + 1)));
        }
    }
    // s[nt][e] is row g's score of key 8 nt + 2 tq + e, s[nt][2 + e] row g + 8's.
#pragma unroll
    for (int nt = 0; nt < 2; nt++) {
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const bool in = key0 + nt * 8 + 2 * tq + e < end;
            s[nt][e] = in ? s[nt][e] * scale_log2 : -INFINITY;
            s[nt][2 + e] = in ? s[nt][2 + e] * scale_log2 : -INFINITY;
        }
    }
    // P as one A fragment over the warp's 16 keys: row g in registers 0 and 2, row g + 8 in 1 and 3.
    const uint2 p0 = softmax_row<D>(s[0][0], s[0][1], s[1][0], s[1][1], o, 0, m0, l0);
    uint2 p1 = make_uint2(0u, 0u);
    if (two_rows) p1 = softmax_row<D>(s[0][2], s[0][3], s[1][2], s[1][3], o, 2, m1, l1);
    const uint32_t pf[4] = {p0.x, p1.x, p0.y, p1.y};
    const uint32_t v_base = uint32_t(__cvta_generic_to_shared(vs));
#pragma unroll
    for (int dt = 0; dt < D / 8; dt++) {
        uint32_t b0, b1;
        const uint32_t addr = v_base + Tile::at(kw + lane % 16, dt);
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n" : "=r"(b0), "=r"(b1) : "r"(addr));
        mma_16816(o[dt], pf, b0, b1);
    }
}

// Q fragments (A operand) of KV head kvh's query heads: row r is query head kvh * n_rep + r; rows n_rep..15 are zero.
template <int D> __device__ __forceinline__ void load_q_fragments(const DecodeArgs & a, int b, int kvh, uint32_t (&qf)[D / 16][4]) {
    const int n_rep = a.n_head / a.n_kv, lane = threadIdx.x % 32, g = lane / 4, tq = lane % 4;
    const bf16 * q = a.q + (int64_t(b) * a.n_head + int64_t(kvh) * n_rep) * D;
#pragma unroll
    for (int kc = 0; kc < D / 16; kc++) {
        const int c0 = kc * 16 + 2 * tq, c1 = c0 + 8;
        qf[kc][0] = g < n_rep ? load_pair(q + g * D + c0) : 0u;
        qf[kc][1] = g + 8 < n_rep ? load_pair(q + (g + 8) * D + c0) : 0u;
        qf[kc][2] = g < n_rep ? load_pair(q + g * D + c1) : 0u;
        qf[kc][3] = g + 8 < n_rep ? load_pair(q + (g + 8) * D + c1) : 0u;
    }
}

// a.early_kv: what does not depend on the kernel ahead is read before pdl_wait(): the context length and the block
// table (set before the step) and the first tiles whose keys all precede the new one (written by earlier steps); the
// queries and the new key's K/V come from the kernel ahead (the QKV projection's epilogue or qkv_rope_cache). With
// programmatic dependent launch those loads overlap the end of that kernel.
template <int D, KVKind K, int STAGES> __global__ void __launch_bounds__(k_decode_threads) attention_decode_tc_kernel(DecodeArgs a) {
    if (!a.early_kv) pdl_wait();
    using Pipe = KVTilePipe<D, K, k_decode_threads, k_tile, false, STAGES>;
    extern __shared__ __align__(16) unsigned char smem_raw[];  // Pipe's tiles, then the warps' merge
    __shared__ int blocks[k_decode_max_split_keys / 16 + 2];

    const int split_id = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;
    const DecodeSplit sp = decode_split(a);
    if (sp.begin >= sp.len) return;
    const int begin = sp.begin, end = sp.end, first_block = sp.first_block;
    const int bs = a.cache.block_size;

    copy_split_blocks(sp, bs, blocks);
    __syncthreads();

    // Tile t: keys begin + 64 t ..
    auto row_of = [&](int j) { return (int64_t(blocks[j / bs - first_block]) * a.n_kv + kvh) * bs + j % bs; };
    auto load_tile = [&](int t) { Pipe::load(smem_raw, a.cache, t, begin + t * k_tile, end, row_of); };
    const int n_tiles = (end - begin + k_tile - 1) / k_tile;
    const int n_loaded = request_early_tiles<STAGES>(a, sp, n_tiles, load_tile);  // tiles requested so far, in order
    uint32_t qf[D / 16][4];
    load_q_fragments<D>(a, b, kvh, qf);

    const float scale_log2 = a.scale * float(M_LOG2E);
    float o[D / 8][4] = {};
    float m0 = -INFINITY, l0 = 0, m1 = -INFINITY, l1 = 0;  // rows g and g + 8 (used where n_rep > 8)
    const bool two_rows = a.n_head / a.n_kv > 8;
    // Tiles 0 .. STAGES - 2 first; tile t + STAGES - 1 goes into the stage tile t - 1 left (free after its barrier).
    for (int t = n_loaded; t < STAGES - 1 && t < n_tiles; t++) load_tile(t);
    for (int t = 0; t < n_tiles; t++) {
        if (t + STAGES - 1 < n_tiles) load_tile(t + STAGES - 1);
        const bf16 * ks = Pipe::ready(smem_raw, a.cache, t, min(STAGES - 1, n_tiles - 1 - t)), * vs = ks + Pipe::tile_elems;
        attend_tile<D, PaddedTile<D>>(reinterpret_cast<const unsigned char *>(ks), reinterpret_cast<const unsigned char *>(vs), qf,
                                      begin + t * k_tile + threadIdx.x / 32 * 16, end, scale_log2, o, m0, l0, m1, l1, two_rows);
        __syncthreads();  // the tile (and its stage) are overwritten next
    }
    merge_warps<D>(smem_raw, a, b, kvh, split_id, o, m0, l0, m1, l1, MmaColumns{});
}

template <int D, int STAGES> struct TmaDecodeSmem {
    static constexpr int tile_bytes = k_tile * D * 2;  // K or V: [D / 64][k_tile][64] bf16, swizzled
    static constexpr int stage_bytes = 2 * tile_bytes;
    static constexpr size_t bar_offset = size_t(STAGES) * stage_bytes;
    static constexpr size_t bytes = bar_offset + 2 * STAGES * sizeof(uint64_t) + 1024;  // full, empty; + the base's alignment
    static_assert(bar_offset >= k_merge_bytes(D), "the warp merge fits the tiles' memory");
};

// The same split over a bf16 cache, its tiles brought by the tensor copy engine (launched where decode_tma_applies).
template <int D, int STAGES>
__global__ void __launch_bounds__(k_decode_threads + 32)
    attention_decode_tma_kernel(DecodeArgs a, const __grid_constant__ CUtensorMap k_map, const __grid_constant__ CUtensorMap v_map) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    if (!a.early_kv) pdl_wait();
    using Layout = TmaDecodeSmem<D, STAGES>;
    extern __shared__ unsigned char smem_raw[];
    unsigned char * smem = smem_raw + ((1024 - sm90::smem_addr(smem_raw) % 1024) % 1024);
    uint64_t * full = reinterpret_cast<uint64_t *>(smem + Layout::bar_offset), * empty = full + STAGES;
    __shared__ int blocks[k_decode_max_split_keys / 16 + 2];

    const int split_id = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;
    const DecodeSplit sp = decode_split(a);
    if (sp.begin >= sp.len) return;
    const int begin = sp.begin, end = sp.end, first_block = sp.first_block;
    const int bs = a.cache.block_size, warp = threadIdx.x / 32, lane = threadIdx.x % 32;

    start_tma_split<STAGES>(sp, bs, blocks, full, empty, &k_map, &v_map);

    // Tile t (keys begin + 64 t ..) into stage t % STAGES, by the copy warp: lane i copies 16-key group i / (D / 32),
    // panel i / 2 % (D / 64), K (even i) or V. Groups wholly past `end` are not copied.
    constexpr int copies_per_group = 2 * (D / 64);
    auto load_tile = [&](int t) {
        const int k0 = begin + t * k_tile, s = t % STAGES;
        const int groups = (min(end - k0, k_tile) + k_copy_rows - 1) / k_copy_rows;
        if (lane == 0) sm90::mbar_arrive_expect_tx(&full[s], uint32_t(groups * copies_per_group * k_copy_rows * 128));
        __syncwarp();
        if (lane < groups * copies_per_group) {
            const int group = lane / copies_per_group, panel = lane / 2 % (D / 64), is_v = lane % 2, key = k0 + group * k_copy_rows;
            const int row = (blocks[key / bs - first_block] * a.n_kv + kvh) * bs + key % bs;
            unsigned char * dst = smem + s * Layout::stage_bytes + is_v * Layout::tile_bytes + panel * k_tile * 128 + group * k_copy_rows * 128;
            sm90::tma_load_2d(dst, is_v ? &v_map : &k_map, &full[s], panel * 64, row);
        }
    };
    const int n_tiles = (end - begin + k_tile - 1) / k_tile;
    if (warp == k_decode_warps) {
        copy_split_tiles<STAGES>(a, sp, n_tiles, empty, load_tile);
        return;
    }
    if (a.early_kv) pdl_wait();
    uint32_t qf[D / 16][4];
    load_q_fragments<D>(a, b, kvh, qf);

    const float scale_log2 = a.scale * float(M_LOG2E);
    float o[D / 8][4] = {};
    float m0 = -INFINITY, l0 = 0, m1 = -INFINITY, l1 = 0;
    const bool two_rows = a.n_head / a.n_kv > 8;
    for (int t = 0; t < n_tiles; t++) {
        const int s = t % STAGES, k0 = begin + t * k_tile;
        unsigned char * ks = smem + s * Layout::stage_bytes, * vs = ks + Layout::tile_bytes;
        sm90::mbar_wait(&full[s], (t / STAGES) & 1);
        if (end - k0 < k_tile) {
            // The last tile: V rows past `end` (slots never written, or groups not copied) become zero, so that no
            // NaN pattern meets a zero probability in P V.
            const int rows_valid = end - k0, chunks = (k_tile - rows_valid) * (D / 64) * 8;
            for (int i = threadIdx.x; i < chunks; i += k_decode_threads) {
                const int line = i / 8, row = rows_valid + line / (D / 64), panel = line % (D / 64);
                *reinterpret_cast<uint4 *>(vs + panel * k_tile * 128 + row * 128 + (i % 8) * 16) = make_uint4(0, 0, 0, 0);
            }
            computing_warps_sync();  // the last tile: never refilled, read by plain loads only (no proxy fence)
        }
        attend_tile<D, SwizzledTile>(ks, vs, qf, k0 + warp * 16, end, scale_log2, o, m0, l0, m1, l1, two_rows);
        __syncwarp();  // the copy warp refills the stage once every warp has released it
        if (lane == 0) sm90::mbar_arrive(&empty[s]);
    }
    computing_warps_sync();  // every warp past its last tile: the merge reuses the stages
    merge_warps<D>(smem, a, b, kvh, split_id, o, m0, l0, m1, l1, MmaColumns{});
#else
    __trap();  // launched only where decode_tma_applies (an sm_90a build on a compute capability 9.0 device)
#endif
}

template <int D, KVKind K, int STAGES> void launch(DecodeArgs a, dim3 grid, cudaStream_t stream) {
    constexpr size_t smem = KVTilePipe<D, K, k_decode_threads, k_tile, false, STAGES>::smem_bytes;
    static_assert(smem >= k_merge_bytes(D), "the warp merge fits the tiles' memory");
    static PerDevice<size_t> configured;  // once per instantiation, before any graph capture (the engine warms up first)
    allow_dynamic_smem(attention_decode_tc_kernel<D, K, STAGES>, smem, configured);
    a.min_split = k_tile;
    launch_kernel(attention_decode_tc_kernel<D, K, STAGES>, grid, k_decode_threads, smem, stream, a);
}

template <int D, int STAGES> bool launch_tma(DecodeArgs a, dim3 grid, cudaStream_t stream) {
    CUtensorMap k_map, v_map;
    if (!cache_tensor_map(&k_map, a.cache.k, a.cache.rows, D, k_copy_rows) || !cache_tensor_map(&v_map, a.cache.v, a.cache.rows, D, k_copy_rows)) {
        return false;
    }
    constexpr size_t smem = TmaDecodeSmem<D, STAGES>::bytes;
    static PerDevice<size_t> configured;
    allow_dynamic_smem(attention_decode_tma_kernel<D, STAGES>, smem, configured);
    a.min_split = k_tile;
    launch_kernel(attention_decode_tma_kernel<D, STAGES>, grid, k_decode_threads + 32, smem, stream, a, k_map, v_map);
    return true;
}

}  // namespace

bool decode_tma_applies(const KVLayer & cache, int head_dim, int n_rep) {
    const int bs = cache.block_size;
    const bool pages = prefill_wgmma_available(head_dim) && cache.rows > 0 && cache.rows <= INT32_MAX && bs >= k_copy_rows && bs % k_copy_rows == 0;
    if (cache.quant.kind == KVKind::BF16) return pages && n_rep <= k_max_rep_tc;
    // attention_decode_q8.cu: head_dim 128, up to 8 query heads a KV head
    return pages && (cache.quant.kind == KVKind::INT8 || cache.quant.kind == KVKind::FP8) && head_dim == 128 && n_rep <= k_max_rep;
}

bool launch_attention_decode_tc(const DecodeArgs & a, int head_dim, dim3 grid, cudaStream_t stream) {
    if (a.n_head / a.n_kv > k_max_rep_tc || (head_dim != 64 && head_dim != 128)) return false;
    const bool three = decode_tc_stages(head_dim) == 3;
    for_kv_kind(a.cache.quant.kind, [&](auto kind) {
        constexpr KVKind K = decltype(kind)::value;
        if (head_dim == 64) three ? launch<64, K, 3>(a, grid, stream) : launch<64, K, 2>(a, grid, stream);
        else three ? launch<128, K, 3>(a, grid, stream) : launch<128, K, 2>(a, grid, stream);
    });
    return true;
}

bool launch_attention_decode_tma(const DecodeArgs & a, int head_dim, dim3 grid, cudaStream_t stream) {
    if (!decode_tma_applies(a.cache, head_dim, a.n_head / a.n_kv)) return false;
    if (a.cache.quant.kind != KVKind::BF16) return launch_attention_decode_q8(a, grid, stream);
    const bool three = decode_tc_stages(head_dim) == 3;
    if (head_dim == 64) return three ? launch_tma<64, 3>(a, grid, stream) : launch_tma<64, 2>(a, grid, stream);
    return three ? launch_tma<128, 3>(a, grid, stream) : launch_tma<128, 2>(a, grid, stream);
}

}  // namespace qinfer::cuda
