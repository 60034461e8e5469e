// Causal prefill attention on Hopper, warp-specialised (FlashAttention-3's structure), for bf16 caches at head_dim 64
// and 128.
//
// A block owns 128 queries of one head: two consumer warpgroups of 64 queries run the wgmma loop of
// attention_prefill_wgmma.cu (S of tile t + 1 issued with P V of tile t), and one warp of a producer warpgroup (its
// registers handed to the consumers with setmaxnreg) moves the K/V tiles of 128 keys with the tensor copy engine. A 2-D tensor map per cache array (rows of head_dim bf16, boxes of 64
// columns x block_size rows, 128-byte swizzle) lets one instruction bring one cache page's 64 columns straight into
// wgmma's swizzled panel layout, so the consumers issue no loads and no address arithmetic for K/V. Three stages,
// each guarded by two mbarriers: `full` (the producer's expected bytes, completed by the copies) and `empty` (every
// consumer thread arrives once its MMAs on the stage are done). No block-wide barrier after the start; with PINGPONG
// (the default form) the two warpgroups take turns to issue their MMAs, so one's softmax overlaps the other's MMAs.
//
// Keys past the block's last one: pages past it are replaced by its last page (finite data, masked), and the last
// tile's V rows past the end are zeroed in shared memory before any P V reads them (a cache slot never written may
// hold NaN bit patterns; 0 x NaN would reach O). K rows there need nothing: their scores are set to -inf.
//
// Key splits (model/prefill_splits.h): in a one-piece launch the pairs (query tile, head) after the last full wave may
// run as several blocks, each over a share of the pair's key tiles. Each writes its consumers' fp32 accumulators and
// (m, l) to its slot of the scratch, then counts itself in; the last to arrive merges the others' slots into its own
// registers (online-softmax rescaling) and stores the rows, and puts the counter back to zero.
#include <algorithm>
#include <cmath>

#include "backends/cuda/attention_common.cuh"
#include "backends/cuda/attention_prefill_wgmma.cuh"
#include "backends/cuda/common.cuh"
#include "backends/cuda/tensor_map.h"
#include "backends/cuda/wgmma.cuh"
#include "model/prefill_splits.h"

namespace qinfer::cuda {

namespace {

using namespace prefill_wgmma;
constexpr int k_consumer_threads = 128 * k_warpgroups;
constexpr int k_threads = k_consumer_threads + 128;  // + the producer warpgroup (one warp of it works)
constexpr int k_stages = 3;

template <int D> struct TmaSmem {
    static constexpr size_t tile_bytes = size_t(k_keys) * D * 2;  // K or V: [D / 64][k_keys][64] bf16, swizzled
    static constexpr size_t stage_bytes = 2 * tile_bytes;
    static constexpr size_t q_offset = k_stages * stage_bytes;  // Q: [D / 64][k_rows][64], swizzled
    static constexpr size_t bar_offset = q_offset + size_t(k_rows) * D * 2;
    static constexpr size_t flag_offset = bar_offset + 2 * k_stages * sizeof(uint64_t);  // key splits: "merge here"
    static constexpr size_t bytes = flag_offset + 16 + 1024;                              // + the base's alignment
};

// A launch's key splits (splits > 1): blocks [0, full_blocks) are whole pairs, the next tail_pairs x splits take
// split (b - full_blocks) / tail_pairs of pair full_blocks + (b - full_blocks) % tail_pairs. partial: per slot
// (tail pair x splits + split), D / 8 + 1 float4 for each of the 256 consumer threads, a float4 index apart;
// counters: one per tail pair, zero between launches.
struct SplitArgs {
    int full_blocks = 0, tail_pairs = 0, splits = 1;
    float4 * partial = nullptr;
    int * counters = nullptr;
};

// grid (n_head, query tiles, pieces): heads fastest (a KV group's heads share its pages in L2), the heaviest query
// tiles first; with pieces (count > 0) block z takes piece z's queries, output and block table, and the blocks past
// its query tiles end at once.
// PINGPONG (FlashAttention-3's inter-warpgroup schedule): the two consumer warpgroups take turns to issue their MMAs,
// each handing the turn over right after its issue, so one warpgroup's softmax runs while the other's MMAs do.
template <int D, bool PINGPONG>
__global__ void __launch_bounds__(k_threads, 1)
    attention_prefill_tma_kernel(PrefillArgs a, const __grid_constant__ CUtensorMap k_map, const __grid_constant__ CUtensorMap v_map,
                                 const __grid_constant__ PrefillPieceList pieces, const SplitArgs split) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    if (pieces.count > 0) {
        const PrefillPiece & p = pieces.piece[blockIdx.z];
        a.q = p.q;
        a.out = p.out;
        a.cache.block_table = p.block_table;
        a.n = p.n;
        a.pos0 = p.pos0;
    }
    const int q_tiles = (a.n + k_rows - 1) / k_rows;
    // This block's pair (head, query tile in heaviest-first order) and its share of the pair's key tiles.
    int head = blockIdx.x, tile_order = blockIdx.y, part = 0, parts = 1, pair = 0;
    if (split.splits > 1) {
        pair = blockIdx.x;
        if (pair >= split.full_blocks) {
            const int i = pair - split.full_blocks;
            pair = split.full_blocks + i % split.tail_pairs;
            part = i / split.tail_pairs;
            parts = split.splits;
        }
        head = pair % a.n_head;
        tile_order = pair / a.n_head;
    }
    if (tile_order >= q_tiles) return;  // the whole block: no barrier is set up yet
    // Registers per thread after setmaxnreg: an SM quarter holds 16K registers and 3 of the block's 12 warps (one of
    // the producer's, two consumers'): 24 x 32 + 2 x 240 x 32 = 16128. At launch ptxas grants 168 (65536 / 384).
    constexpr int k_producer_registers = 24, k_consumer_registers = 240;
    // Named barriers: 1, 2: each warpgroup's Q; 3: the two warpgroups at the last tile; 4, 5: warpgroup 0 / 1 may
    // issue its MMAs (PINGPONG).
    constexpr int k_bar_tail = 3, k_bar_turn = 4;
    using Layout = TmaSmem<D>;
    extern __shared__ unsigned char smem_raw[];
    unsigned char * smem = smem_raw + ((1024 - sm90::smem_addr(smem_raw) % 1024) % 1024);
    unsigned char * qs = smem + Layout::q_offset;
    uint64_t * full = reinterpret_cast<uint64_t *>(smem + Layout::bar_offset), * empty = full + k_stages;

    const int kvh = head / (a.n_head / a.n_kv);
    const int q_tile = (q_tiles - 1 - tile_order) * k_rows;
    const int last_row = min(q_tile + k_rows, a.n) - 1;
    const int n_keys = a.pos0 + last_row + 1;  // causal: keys this pair needs
    const int n_tiles = (n_keys + k_keys - 1) / k_keys;
    // This block's tiles: t0 .. t0 + my_tiles - 1 (local index i = t - t0 picks the stage).
    const int t0 = part * n_tiles / parts, my_tiles = (part + 1) * n_tiles / parts - t0;
    // Warp-uniform roles (a shuffle, so that ptxas sees uniform branches around the warpgroup MMAs).
    const int warp_idx = __shfl_sync(0xffffffffu, int(threadIdx.x) / 32, 0);

    sm90::init_stage_barriers(full, empty, k_stages, k_consumer_threads);

    if (warp_idx >= 2 * 4) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(k_producer_registers));
        if (warp_idx != 2 * 4) return;
        // The producer: lane i handles page i of each tile (block_size >= 8, so at most 16 pages per tile).
        const int lane = threadIdx.x % 32, bs = a.cache.block_size, pages = k_keys / bs, last_page = (n_keys - 1) / bs;
        if (lane == 0) {
            sm90::prefetch_tensor_map(&k_map);
            sm90::prefetch_tensor_map(&v_map);
        }
        for (int i = 0; i < my_tiles; i++) {
            const int s = i % k_stages, t = t0 + i;
            int row = 0;
            if (lane < pages) row = (a.cache.block_table[min(t * pages + lane, last_page)] * a.n_kv + kvh) * bs;
            if (i >= k_stages) sm90::mbar_wait(&empty[s], (i / k_stages - 1) & 1);
            if (lane == 0) sm90::mbar_arrive_expect_tx(&full[s], uint32_t(Layout::stage_bytes));
            __syncwarp();
            if (lane < pages) {
                unsigned char * ks = smem + s * Layout::stage_bytes, * vs = ks + Layout::tile_bytes;
#pragma unroll
                for (int c = 0; c < D / 64; c++) {
                    const size_t at = size_t(c) * k_keys * 128 + size_t(lane) * bs * 128;
                    sm90::tma_load_2d(ks + at, &k_map, &full[s], c * 64, row);
                    sm90::tma_load_2d(vs + at, &v_map, &full[s], c * 64, row);
                }
            }
        }
        return;
    }

    // The consumers.
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(k_consumer_registers));
    const int wg = __shfl_sync(0xffffffffu, int(threadIdx.x) / 128, 0), warp = warp_idx % 4, g = threadIdx.x % 32 / 4;
    const int wg_row = q_tile + wg * 64;
    RowState rs;
    rs.warp_row = wg_row + warp * 16;
    rs.row0 = rs.warp_row + g;
    rs.row1 = rs.row0 + 8;

    // This warpgroup's 64 rows of Q, rows past the chunk zero.
    for (int c = threadIdx.x % 128; c < 64 * (D / 8); c += 128) {
        const int r = wg * 64 + c / (D / 8), ch = c % (D / 8), row = q_tile + r;
        const bool valid = row < a.n;
        cp_async16(qs + sm90::swizzle128_offset(r, ch, k_rows), a.q + (int64_t(valid ? row : 0) * a.n_head + head) * D + ch * 8, valid);
    }
    cp_async_commit();
    cp_async_wait<0>();
    sm90::fence_proxy_async_smem();
    sm90::named_barrier(1 + wg, 128);

    // Tiles by local index i (tile t0 + i).
    auto k_tile = [&](int i) { return reinterpret_cast<const bf16 *>(smem + (i % k_stages) * Layout::stage_bytes); };
    const int tail_keys = n_keys - (n_tiles - 1) * k_keys;  // keys of the last tile that exist (1..k_keys)
    // Waits for tile i; the pair's last tile's V rows past its keys become zero (both warpgroups, then together).
    auto landed = [&](int i) {
        sm90::mbar_wait(&full[i % k_stages], (i / k_stages) & 1);
        if (t0 + i == n_tiles - 1 && tail_keys < k_keys) {
            unsigned char * vs = smem + (i % k_stages) * Layout::stage_bytes + Layout::tile_bytes;
            const int chunks = (k_keys - tail_keys) * (D / 64) * 8;  // 16-byte chunks of the rows past the end
            for (int c = threadIdx.x; c < chunks; c += k_consumer_threads) {
                const int line = c / 8, key = tail_keys + line / (D / 64), panel = line % (D / 64);
                *reinterpret_cast<uint4 *>(vs + size_t(panel) * k_keys * 128 + key * 128 + (c % 8) * 16) = make_uint4(0, 0, 0, 0);
            }
            sm90::fence_proxy_async_smem();
            sm90::named_barrier(k_bar_tail, k_consumer_threads);
        }
    };
    auto release = [&](int i) { sm90::mbar_arrive(&empty[i % k_stages]); };
    auto await_turn = [&] {
        if constexpr (PINGPONG) sm90::named_barrier(k_bar_turn + wg, k_consumer_threads);
    };
    auto pass_turn = [&] {
        if constexpr (PINGPONG) sm90::named_barrier_arrive(k_bar_turn + 1 - wg, k_consumer_threads);
    };
    if constexpr (PINGPONG) {
        if (wg == 0) sm90::named_barrier_arrive(k_bar_turn, k_consumer_threads);  // warpgroup 0 starts
    }

    const uint32_t q_addr = sm90::smem_addr(qs) + wg * 64 * 128;
    float o[D / 2] = {};  // this warpgroup's 64 x D output: D / 8 m16n8 fragments per warp
    float s[k_keys / 2];  // S, then P, of one tile
    uint32_t pf[k_keys / 16][4];
    // Every tile of the block, fully masked where this warpgroup's rows do not reach it (a per-warpgroup bound
    // around the MMAs would make ptxas serialise them, C7520).
    landed(0);
    await_turn();
    sm90::wgmma_fence();
    issue_qk<D>(s, q_addr, k_tile(0));
    sm90::wgmma_commit();
    pass_turn();
    sm90::wgmma_wait<0>();
    sm90::fence_operands(s);
    for (int t = 0; t < my_tiles; t++) {
        // s = S of tile t; P V of tile t - 1 may still run.
        const float2 alpha = softmax_tile(s, rs, (t0 + t) * k_keys, a);
        sm90::wgmma_wait<0>();
        sm90::fence_operands(o);
        for (auto & f : pf) sm90::fence_operands(f);
        if (t > 0) release(t - 1);  // its K (S of t - 1) and V (P V of t - 1) are read
        rescale_and_pack<D>(o, alpha, s, pf);
        if (t + 1 < my_tiles) landed(t + 1);
        sm90::fence_operands(s);
        sm90::fence_operands(o);
        for (auto & f : pf) sm90::fence_operands(f);
        await_turn();
        sm90::wgmma_fence();
        if (t + 1 < my_tiles) issue_qk<D>(s, q_addr, k_tile(t + 1));
        sm90::wgmma_commit();
        issue_pv<D>(o, pf, k_tile(t) + Layout::tile_bytes / 2);
        sm90::wgmma_commit();
        pass_turn();
        sm90::wgmma_wait<1>();  // S of tile t + 1
        sm90::fence_operands(s);
    }
    sm90::wgmma_wait<0>();
    sm90::fence_operands(o);
    if (parts > 1) {
        // Named barrier 6: the two consumer warpgroups around the count.
        constexpr int k_bar_merge = 6, k_chunks = D / 8 + 1;  // float4 of o, then (m0, m1, l0, l1)
        const int tid = threadIdx.x, slot0 = (pair - split.full_blocks) * parts;
        float4 * mine = split.partial + size_t(slot0 + part) * k_chunks * k_consumer_threads + tid;
#pragma unroll
        for (int c = 0; c < D / 8; c++) mine[c * k_consumer_threads] = make_float4(o[4 * c], o[4 * c + 1], o[4 * c + 2], o[4 * c + 3]);
        mine[(D / 8) * k_consumer_threads] = make_float4(rs.m0, rs.m1, rs.l0, rs.l1);
        __threadfence();
        sm90::named_barrier(k_bar_merge, k_consumer_threads);
        volatile int * merge_here = reinterpret_cast<volatile int *>(smem + Layout::flag_offset);
        if (tid == 0) {
            int * counter = split.counters + (pair - split.full_blocks);
            const bool last = atomicAdd(counter, 1) == parts - 1;
            if (last) *counter = 0;  // every split has counted in: ready for the next launch
            *merge_here = last;
        }
        sm90::named_barrier(k_bar_merge, k_consumer_threads);
        if (!*merge_here) return;
        __threadfence();
        for (int j = 0; j < parts; j++) {
            if (j == part) continue;
            const float4 * theirs = split.partial + size_t(slot0 + j) * k_chunks * k_consumer_threads + tid;
            const float4 ml = __ldcg(theirs + (D / 8) * k_consumer_threads);
            // Rows with no keys in both (m -inf) keep zero sums; else both sides rescale to the larger maximum.
            const float m0 = fmaxf(rs.m0, ml.x), m1 = fmaxf(rs.m1, ml.y);
            const float ref0 = m0 == -INFINITY ? 0.f : m0, ref1 = m1 == -INFINITY ? 0.f : m1;
            const float a0 = exp2f(rs.m0 - ref0), b0 = exp2f(ml.x - ref0), a1 = exp2f(rs.m1 - ref1), b1 = exp2f(ml.y - ref1);
#pragma unroll
            for (int c = 0; c < D / 8; c++) {
                const float4 v = __ldcg(theirs + c * k_consumer_threads);
                o[4 * c + 0] = o[4 * c + 0] * a0 + v.x * b0;
                o[4 * c + 1] = o[4 * c + 1] * a0 + v.y * b0;
                o[4 * c + 2] = o[4 * c + 2] * a1 + v.z * b1;
                o[4 * c + 3] = o[4 * c + 3] * a1 + v.w * b1;
            }
            rs.l0 = rs.l0 * a0 + ml.z * b0;
            rs.l1 = rs.l1 * a1 + ml.w * b1;
            rs.m0 = m0;
            rs.m1 = m1;
        }
    }
    store_prefill_rows<D / 8, true>(o, rs.l0, rs.l1, rs.row0, rs.row1, a, head);
#else
    __trap();  // launched only where prefill_wgmma_available() (an sm_90a build on a compute capability 9.0 device)
#endif
}

// pieces.count 0: a alone; else `a.n` is the longest piece's. split.splits > 1 (one piece): its blocks in one row.
template <int D, bool PINGPONG> bool launch(const PrefillArgs & a, const PrefillPieceList & pieces, const SplitArgs & split, cudaStream_t stream) {
    CUtensorMap k_map, v_map;
    if (!cache_tensor_map(&k_map, a.cache.k, a.cache.rows, D, a.cache.block_size) ||
        !cache_tensor_map(&v_map, a.cache.v, a.cache.rows, D, a.cache.block_size)) {
        return false;
    }
    constexpr size_t smem = TmaSmem<D>::bytes;
    static PerDevice<size_t> configured;  // once per instantiation
    allow_dynamic_smem(attention_prefill_tma_kernel<D, PINGPONG>, smem, configured);
    const dim3 grid = split.splits > 1 ? dim3(split.full_blocks + split.tail_pairs * split.splits)
                                       : dim3(a.n_head, (a.n + k_rows - 1) / k_rows, std::max(1, pieces.count));
    attention_prefill_tma_kernel<D, PINGPONG><<<grid, k_threads, smem, stream>>>(a, k_map, v_map, pieces, split);
    CUDA_CHECK(cudaGetLastError());
    return true;
}

bool applies(const PrefillArgs & a) {
    const int bs = a.cache.block_size;
    return prefill_wgmma_available(a.d) && a.cache.quant.kind == KVKind::BF16 && a.cache.rows > 0 && bs >= 8 && bs <= k_keys &&
           k_keys % bs == 0 && (bs & (bs - 1)) == 0 && a.cache.table_stride == 0 && a.cache.rows <= INT32_MAX;
}

bool launch_any(const PrefillArgs & a, const PrefillPieceList & pieces, const SplitArgs & split, bool pingpong, cudaStream_t stream) {
    if (!applies(a)) return false;
    if (pingpong) return a.d == 64 ? launch<64, true>(a, pieces, split, stream) : launch<128, true>(a, pieces, split, stream);
    return a.d == 64 ? launch<64, false>(a, pieces, split, stream) : launch<128, false>(a, pieces, split, stream);
}

}  // namespace

bool launch_attention_prefill_tma(const PrefillArgs & a, bool pingpong, cudaStream_t stream) {
    return launch_any(a, PrefillPieceList{}, SplitArgs{}, pingpong, stream);
}

bool launch_attention_prefill_tma_pieces(const PrefillArgs & a, const PrefillPieceList & pieces, bool pingpong, const PrefillSplitScratch * scratch,
                                         cudaStream_t stream) {
    QINFER_CHECK(pieces.count >= 1 && pieces.count <= k_prefill_pieces) << "attention_prefill_pieces: " << pieces.count << " pieces in one launch";
    PrefillArgs longest = a;
    longest.n = 0;
    for (int i = 0; i < pieces.count; i++) longest.n = std::max(longest.n, pieces.piece[i].n);
    SplitArgs split;
    if (pieces.count == 1 && scratch && scratch->bytes && longest.n > 0) {
        const PrefillSplitPlan plan = prefill_split_plan(longest.n, pieces.piece[0].pos0, a.n_head, sm_count(), scratch->splits);
        if (plan.splits > 1) {
            QINFER_CHECK(scratch->size >= prefill_split_scratch_bytes(a.d, sm_count())) << "attention_prefill_pieces: split scratch too small";
            split = {plan.full_blocks, plan.tail_pairs, plan.splits, static_cast<float4 *>(scratch->bytes),
                     reinterpret_cast<int *>(static_cast<char *>(scratch->bytes) + prefill_split_counters_offset(a.d, sm_count()))};
        }
    }
    return longest.n == 0 || launch_any(longest, pieces, split, pingpong, stream);
}

}  // namespace qinfer::cuda
