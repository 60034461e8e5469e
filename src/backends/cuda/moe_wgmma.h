// The routed experts' grouped GEMM on Hopper (moe_wgmma.cu), for steps where experts get many sorted rows (prefill,
// large mixed steps): moe.cu's moe_experts runs it for tiles of k_moe_wgmma_rows rows.
#pragma once

#include "backends/cuda/ops.h"

namespace qinfer::cuda {

// One projection of every expert over its sorted rows: y[p, :] = x[p, :] W_e^T for the rows p of expert e, in tiles of
// k_moe_wgmma_rows rows (offsets / tiles from moe_route with that tile). w: [n_experts, w_rows, k] bf16 (K
// contiguous); x: bf16 [x_rows, k], already in the sorted order; k a multiple of 8. SwiGLU: the expert's gate rows
// are 0..n-1 and its up rows n..2n-1 (w_rows = 2 n), y = silu(gate) * up, each rounded to bf16 first. y: bf16 [x_rows, n].
struct MoeWgmmaGemm {
    const bf16 * x = nullptr;
    int x_rows = 0;
    const bf16 * w = nullptr;
    int w_rows = 0, n_experts = 0;
    int n = 0, k = 0;
    bool swiglu = false;
    const int * offsets = nullptr, * tiles = nullptr;
    int max_tiles = 0;  // the grid's row tiles (moe_max_tiles): those past tiles[n_experts] leave at once
    bf16 * y = nullptr;
};
void moe_gemm_wgmma(const MoeWgmmaGemm & g, cudaStream_t stream);

}  // namespace qinfer::cuda
