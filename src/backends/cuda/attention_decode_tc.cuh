// Pieces the tensor-core decode attention kernels share (attention_decode_tc.cu, attention_decode_q8.cu): the tile
// and copy sizes, and the merge of the warps' (m, l, O) into a split's partial result.
#pragma once

#include <cmath>

#include "backends/cuda/attention_common.cuh"
#include "backends/cuda/common.cuh"
#include "backends/cuda/wgmma.cuh"

namespace qinfer::cuda::decode_tc {

constexpr int k_tile = 64;  // keys per shared-memory tile; also the fewest keys of a split (attention.cu's combine)
constexpr int k_copy_rows = 16;  // keys per tensor copy: a split starts at a multiple of 16, so 16 keys share a page

// The m16n8 C fragment's columns: o[dt][e] of lane (g, tq) is column 8 dt + 2 tq + e.
struct MmaColumns {
    __device__ __forceinline__ int operator()(int dt, int e) const { return dt * 8 + 2 * int(threadIdx.x % 4) + e; }
};

// This block's split (blockIdx.x) of sequence blockIdx.z: keys [begin, end) of the sequence's len; the whole block
// returns when it is empty (begin >= len: a short sequence in a grid sized for the longest context).
struct DecodeSplit {
    int len, begin, end, first_block;  // first_block: the table index of the block holding key `begin`
    const int * table;                 // the sequence's block table
};
__device__ __forceinline__ DecodeSplit decode_split(const DecodeArgs & a) {
    const int b = blockIdx.z, len = a.len_dev[b];
    const int split = decode_split_size(len, a.scratch.max_splits, a.min_split);
    const int begin = int(blockIdx.x) * split;
    return {len, begin, min(len, begin + split), begin / a.cache.block_size, a.cache.block_table + int64_t(b) * a.cache.table_stride};
}
// The split's block-table entries into shared `blocks` (the caller's barrier publishes them).
__device__ __forceinline__ void copy_split_blocks(const DecodeSplit & sp, int block_size, int * blocks) {
    for (int i = threadIdx.x; i <= (sp.end - 1) / block_size - sp.first_block; i += blockDim.x) blocks[i] = sp.table[sp.first_block + i];
}

// A barrier over the k_decode_warps computing warps only (named barrier 1; a copy warp, where there is one, has
// returned by then). Any architecture.
__device__ __forceinline__ void computing_warps_sync() { asm volatile("bar.sync 1, %0;\n" ::"n"(k_decode_threads) : "memory"); }

// The start of the split kernels whose tiles come by tensor copies (the bf16 one in attention_decode_tc.cu, the
// raw-code one in attention_decode_q8.cu; sm_90a only): the split's block-table entries into `blocks`, the STAGES
// stage barriers at `full` set for one arrival each (the copy warp's) and those at `empty` for one arrival per
// computing warp, both tensor maps prefetched, then a block barrier that publishes all of it.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
template <int STAGES>
__device__ __forceinline__ void start_tma_split(const DecodeSplit & sp, int block_size, int * blocks, uint64_t * full, uint64_t * empty,
                                                const void * k_map, const void * v_map) {
    copy_split_blocks(sp, block_size, blocks);
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; s++) {
            sm90::mbar_init(&full[s], 1);
            sm90::mbar_init(&empty[s], k_decode_warps);
        }
        sm90::fence_mbar_init();
        sm90::prefetch_tensor_map(k_map);
        sm90::prefetch_tensor_map(v_map);
    }
    __syncthreads();
}
#endif

// Whether tile t of the split holds only keys before the new one (written by earlier steps, so it may be requested
// before pdl_wait()).
__device__ __forceinline__ bool tile_precedes_new_key(const DecodeSplit & sp, int t) { return min(sp.begin + (t + 1) * k_tile, sp.end) <= sp.len - 1; }

// a.early_kv: the first tiles (up to STAGES - 1) whose keys all precede the new one, written by earlier steps, are
// requested before pdl_wait(), so they overlap the end of the kernel ahead; returns how many were. Without it the
// kernel waited at its start and none are.
template <int STAGES, class Load>
__device__ __forceinline__ int request_early_tiles(const DecodeArgs & a, const DecodeSplit & sp, int n_tiles, const Load & load_tile) {
    int n = 0;
    if (a.early_kv) {
        while (n < STAGES - 1 && n < n_tiles && tile_precedes_new_key(sp, n)) load_tile(n++);
        pdl_wait();
    }
    return n;
}

// The copy warp of a tensor-copy split kernel (a fifth warp beside the k_decode_warps that compute): every tile of
// the split in order, tile t into stage t % STAGES once the computing warps have released the tile that was there
// (empty[s], one arrival per warp). With a.early_kv the first tiles whose keys all precede the new one are requested
// before pdl_wait(), as request_early_tiles does; the computing warps then wait for the kernel ahead themselves.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
template <int STAGES, class Load>
__device__ __forceinline__ void copy_split_tiles(const DecodeArgs & a, const DecodeSplit & sp, int n_tiles, uint64_t * empty, const Load & load_tile) {
    int t = 0;
    if (a.early_kv) {
        while (t < STAGES && t < n_tiles && tile_precedes_new_key(sp, t)) load_tile(t++);
        pdl_wait();
    }
    for (; t < n_tiles; t++) {
        if (t >= STAGES) sm90::mbar_wait(&empty[t % STAGES], (t / STAGES - 1) & 1);
        load_tile(t);
    }
}
#endif

// After the last tile (its shared memory free, every warp past the barrier): the warps' (m, l, O) of each row merged
// into the split's partial result; col(dt, e) is the column of this lane's o[dt][e]. A lane holds rows g (m0, l0,
// o[dt][0..1]) and g + 8 (m1, l1, o[dt][2..3]; only where more than 8 query heads share the KV head).
// The warps' O rows lie D + 4 floats apart, column c at c + c / 32: one store of the raw-code kernel's columns
// (16 (2 tq + e) + dt: 32 tq apart) then meets banks 4 g + tq + const, all 32 different, where rows D apart put the
// whole warp on one bank; the MMA columns (8 dt + 2 tq + e) meet 2 lanes a bank instead of 8. Rows are read 32
// consecutive columns a warp, conflict-free either way. On an H200 the int8 kernel went from 14.3 / 21.8 / 48.8 us
// to 11.0 / 18.4 / 45.5 at 4096 / 30720 / 129024 keys (7B layer), the bf16 tensor-copy kernel 1-4% faster
// (bench/results/2026-12-01-h200-decode-copy-warp, call 3).
template <int D, class Col>
__device__ __forceinline__ void merge_warps(unsigned char * smem, const DecodeArgs & a, int b, int kvh, int split_id, const float (&o)[D / 8][4],
                                            float m0, float l0, float m1, float l1, Col col) {
    constexpr int R = k_max_rep_tc;
    const int n_rep = a.n_head / a.n_kv, warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, tq = lane % 4;
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    float * wm = reinterpret_cast<float *>(smem);  // [warps][R]
    float * wl = wm + k_decode_warps * R;          // [warps][R]
    float * wo = wl + k_decode_warps * R;          // [warps][R][D + 4]
    auto at = [](int row, int c) { return row * (D + 4) + c + c / 32; };
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = g + 8 * h;
        if (r >= n_rep) continue;
        if (tq == 0) {
            wm[warp * R + r] = h ? m1 : m0;
            wl[warp * R + r] = h ? l1 : l0;
        }
#pragma unroll
        for (int dt = 0; dt < D / 8; dt++) {
            wo[at(warp * R + r, col(dt, 0))] = o[dt][2 * h];
            wo[at(warp * R + r, col(dt, 1))] = o[dt][2 * h + 1];
        }
    }
    computing_warps_sync();
    for (int i = threadIdx.x; i < n_rep * D; i += k_decode_threads) {
        const int r = i / D, c = i % D;
        float mx = -INFINITY;
#pragma unroll
        for (int w = 0; w < k_decode_warps; w++) mx = fmaxf(mx, wm[w * R + r]);
        float lsum = 0, osum = 0;
#pragma unroll
        for (int w = 0; w < k_decode_warps; w++) {
            const float cw = wm[w * R + r] == -INFINITY ? 0.f : exp2f(wm[w * R + r] - mx);
            lsum += wl[w * R + r] * cw;
            osum += wo[at(w * R + r, c)] * cw;
        }
        if (a.out) {  // the only split: the combine's result (weight e^0 = 1) written here
            a.out[(int64_t(b) * a.n_head + kvh * n_rep + r) * D + c] = __float2bfloat16(osum / lsum);
            continue;
        }
        const int64_t prow = (int64_t(b) * a.n_head + kvh * n_rep + r) * a.scratch.max_splits + split_id;
        a.scratch.partial_out[prow * D + c] = osum;
        if (c == 0) {
            a.scratch.partial_ml[prow * 2] = mx * float(M_LN2);  // the combine kernel works in natural-log units
            a.scratch.partial_ml[prow * 2 + 1] = lsum;
        }
    }
}

constexpr size_t k_merge_bytes(int d) { return (2 * k_decode_warps * k_max_rep_tc + k_decode_warps * k_max_rep_tc * size_t(d + 4)) * sizeof(float); }

}  // namespace qinfer::cuda::decode_tc
