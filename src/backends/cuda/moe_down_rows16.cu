// The routed experts' down projection in steps of small batches (16-row tiles, moe.cu's grouped_gemm): one resident
// grid (SMs x 3 blocks) over the step's (row tile, 64 weight rows) items, dealt round-robin. Each block looks its items
// up once into shared memory and streams their K blocks through one 3-deep ring of K 128, the next item's first stages
// requested while the current item's last ones are multiplied; the epilogue writes from registers.
//
// The launch ahead is always the gate/up launch of the same routing, and the weights do not depend on it: so each
// block finds its items (the routing, two launches back, read through L2 with ld.cg: this SM's L1 may hold an earlier
// step's) and requests its first two stages' weight rows before pdl_wait, beside gate/up's last blocks; their inputs
// (gate/up's output) after it.
//
// Measured on an H200, Qwen1.5-MoE-A2.7B BF16 at input 1, one round in one call (bench/results/2026-12-03-h200-moe-resident,
// call 4): against moe.cu's 16-row kernel for down, 2,381.44 -> 2,449.90 tok/s at batch 16 (+2.9%) and 5,612.13 ->
// 5,662.80 at 64 (+0.9%); the same resident grid with the weights requested after pdl_wait 2,399.85 / 5,626.46; gate/up
// resident as well 2,427.57 / 5,647.79 (calls 1-2, alternated twice: gate/up 132.1 -> 136.0 us a layer at batch 16, the
// static deal cannot route around SMs the shared expert holds). Requesting the first stages early from moe.cu's kernel
// instead (every block of a grid sized for the worst case) lost 2.2% / 2.4% (call 3).
#include <algorithm>
#include <map>

#include "backends/cuda/common.cuh"
#include "backends/cuda/moe_gemm.cuh"
#include "backends/cuda/moe_tiles.cuh"
#include "backends/cuda/ops.h"

namespace qinfer::cuda::moe_mma {
namespace {

constexpr int k_threads = 256, k_bk = 128, k_stages = 3, k_bn = 64;  // 8 warps of 8 weight rows; K 128 a stage
constexpr int k_row = stage_row<k_bk>();
constexpr size_t k_ring_bytes = size_t(k_stages) * (16 + k_bn) * k_row * sizeof(bf16);

__global__ void __launch_bounds__(k_threads) down_rows16_kernel(GemmArgs a, int n_tiles) {
    constexpr int cpr = k_bk / 8, rpp = k_threads / cpr, b_passes = k_bn / rpp;  // 16 chunks a row, 16 rows a pass
    static_assert(rpp == 16, "one pass of the threads covers the 16 token rows");
    extern __shared__ __align__(16) unsigned char smem[];
    bf16 * As = reinterpret_cast<bf16 *>(smem);   // [stages][16][k_row]
    bf16 * Bs = As + size_t(k_stages) * 16 * k_row;  // [stages][64][k_row]
    MoeTile * items = reinterpret_cast<MoeTile *>(smem + k_ring_bytes);
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, G = int(gridDim.x), b = int(blockIdx.x);
    // Item i of this block is w = b + i G of the step's n_items: row tile w / n_tiles, weight rows 64 (w % n_tiles) on.
    const int n_items = __ldcg(a.tiles + a.E) * n_tiles;
    const int mine = b < n_items ? (n_items - b + G - 1) / G : 0;
    if (mine == 0) return;
    for (int i = tid; i < mine; i += k_threads) moe_tile_of<true>(a.tiles, a.offsets, a.E, (b + i * G) / n_tiles, 16, items[i]);
    __syncthreads();
    const int nk = (a.k + k_bk - 1) / k_bk, total = mine * nk;
    const int col = (tid % cpr) * 8, r0 = tid / cpr;
    // The load cursor: item li, K block kb, and this thread's sources in it (null: zeros).
    int li = 0, kb = 0;
    const bf16 * a_src = nullptr;
    const bf16 * b_src[b_passes];
    auto enter = [&](int i) {
        const MoeTile it = items[i];
        const int f0 = ((b + i * G) % n_tiles) * k_bn;
        a_src = r0 < it.rows ? a.x + int64_t(it.row0 + r0) * a.k + col : nullptr;
        const bf16 * w = a.w + int64_t(it.expert) * a.w_stride;
#pragma unroll
        for (int p = 0; p < b_passes; p++) {
            const int f = f0 + r0 + p * rpp;
            b_src[p] = f < a.n ? w + int64_t(f) * a.k + col : nullptr;
        }
    };
    auto load = [&](int slot, bool with_a, bool with_b) {
        const int kk = kb * k_bk;
        const bool k_ok = kk + col < a.k;
        if (with_a) {
            const bool ok = a_src && k_ok;
            cp_async16(As + (size_t(slot) * 16 + r0) * k_row + col, ok ? a_src + kk : a.x, ok);
        }
        if (with_b) {
#pragma unroll
            for (int p = 0; p < b_passes; p++) {
                const bool ok = b_src[p] && k_ok;
                cp_async16(Bs + (size_t(slot) * k_bn + r0 + p * rpp) * k_row + col, ok ? b_src[p] + kk : a.w, ok);
            }
        }
    };
    auto advance = [&]() {
        if (++kb == nk) {
            kb = 0;
            if (++li < mine) enter(li);
        }
    };
    enter(0);
    // The first item's first stages: weight rows as one group before pdl_wait, inputs after it, a group a stage. The
    // main loop's waits then run one group later and still find each stage's group complete.
    const int early = min(k_stages - 1, nk);
    for (int s = 0; s < early; s++) {
        kb = s;
        load(s, false, true);
    }
    cp_async_commit();
    pdl_wait();
    kb = 0;
    int issued = 0;
    for (; issued < early; issued++) {
        load(issued, true, false);
        cp_async_commit();
        advance();
    }
    for (; issued < k_stages - 1; issued++) {  // items shorter than the ring (K under 256)
        if (issued < total) {
            load(issued, true, true);
            advance();
        }
        cp_async_commit();
    }
    float acc[4] = {};  // rows lane / 4 and lane / 4 + 8, weight rows 8 warp + 2 (lane % 4) and the next
    int ci = 0, ckb = 0;  // the item and K block being multiplied
    for (int s = 0; s < total; s++) {
        cp_async_wait<k_stages - 2>();
        __syncthreads();
        if (s + k_stages - 1 < total) {
            load((s + k_stages - 1) % k_stages, true, true);
            advance();
        }
        cp_async_commit();
        const bf16 * as = As + size_t(s % k_stages) * 16 * k_row;
        const bf16 * bs = Bs + size_t(s % k_stages) * k_bn * k_row;
#pragma unroll
        for (int ks = 0; ks < k_bk / 16; ks++) {
            uint32_t af[4], bfr[2];
            ldmatrix_x4(af, as + (lane % 16) * k_row + ks * 16 + (lane / 16) * 8);
            ldmatrix_x2(bfr, bs + (warp * 8 + lane % 8) * k_row + ks * 16 + ((lane / 8) % 2) * 8);
            mma16816(acc, af, bfr[0], bfr[1]);
        }
        if (++ckb < nk) continue;
        const MoeTile it = items[ci];
        const int f = ((b + ci * G) % n_tiles) * k_bn + warp * 8 + 2 * (lane % 4);  // n is a multiple of 8
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int r = lane / 4 + 8 * h;
            if (r < it.rows && f < a.n) {
                *reinterpret_cast<__nv_bfloat162 *>(a.y + int64_t(it.row0 + r) * a.n + f) = __floats2bfloat162_rn(acc[2 * h], acc[2 * h + 1]);
            }
        }
        acc[0] = acc[1] = acc[2] = acc[3] = 0.0f;
        ckb = 0;
        ci++;
    }
    cp_async_wait<0>();
}

}  // namespace

void down_rows16(const GemmArgs & a, int max_tiles, cudaStream_t stream) {
    QINFER_CHECK(!a.token_of && a.n % 8 == 0 && a.k % 8 == 0) << "MoE down (16-row tiles): sorted rows in, n " << a.n << " and k " << a.k
                                                              << " multiples of 8";
    const int n_tiles = (a.n + k_bn - 1) / k_bn;
    static PerDevice<size_t> configured;
    static PerDevice<std::map<size_t, int>> fits;  // blocks an SM by shared-memory bytes (asked once each: eager steps launch this often)
    // The item table bounds a block's items: the grid is SMs x b blocks for the largest b (3 at most) that still fits
    // an SM with the table sized for it.
    const int64_t items = int64_t(n_tiles) * max_tiles;
    int grid = 0;
    size_t smem = 0;
    for (int b = 3; b >= 1 && grid == 0; b--) {
        const int64_t cap = int64_t(sm_count()) * b;
        smem = k_ring_bytes + size_t((items + cap - 1) / cap) * sizeof(MoeTile);
        allow_dynamic_smem(down_rows16_kernel, smem, configured);
        auto [it, fresh] = fits.here().try_emplace(smem, 0);
        if (fresh) CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&it->second, down_rows16_kernel, k_threads, smem));
        if (it->second >= b) grid = int(std::min(items, cap));
    }
    QINFER_CHECK(grid > 0) << "MoE down (16-row tiles): " << items << " items do not fit one block an SM";
    launch_kernel(down_rows16_kernel, dim3(grid), dim3(k_threads), smem, stream, a, n_tiles);
}

}  // namespace qinfer::cuda::moe_mma
