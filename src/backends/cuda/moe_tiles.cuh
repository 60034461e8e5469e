// A grouped GEMM block's row tile (moe.cu, moe_wgmma.cu, moe_down_rows16.cu): the routing (moe_route) numbers each expert's tiles of
// tile_rows sorted rows after the tiles of the experts before it.
#pragma once

namespace qinfer::cuda {

struct MoeTile {
    int expert, row0, rows;  // the tile's expert, its first sorted row, and how many of its tile_rows rows it holds
};

// Row tile g of a step: tiles / offsets int [n_experts + 1] as MoeRouting has them. False where g is past the step's
// tiles (grids are sized for the worst case). L2: read them through L2 only (ld.cg), for a kernel that reads them
// before its pdl_wait, when this SM's L1 may still hold an earlier step's.
template <bool L2 = false>
__device__ __forceinline__ bool moe_tile_of(const int * tiles, const int * offsets, int n_experts, int g, int tile_rows, MoeTile & t) {
    auto ld = [](const int * p) { return L2 ? __ldcg(p) : *p; };
    if (g >= ld(tiles + n_experts)) return false;
    int lo = 0, hi = n_experts;
    while (lo < hi) {  // the last expert whose first tile is at or before g
        const int mid = (lo + hi + 1) / 2;
        if (ld(tiles + mid) <= g) lo = mid;
        else hi = mid - 1;
    }
    t.expert = lo;
    t.row0 = ld(offsets + lo) + (g - ld(tiles + lo)) * tile_rows;
    t.rows = min(tile_rows, ld(offsets + lo + 1) - t.row0);
    return true;
}

}  // namespace qinfer::cuda
