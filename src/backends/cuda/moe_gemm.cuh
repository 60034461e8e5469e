// The bf16 grouped MoE GEMMs' shared pieces (moe.cu: the tiles of 16 and 64 rows; moe_down_rows16.cu: the resident
// down launch of 16-row tiles): their arguments and the mma.sync building blocks.
#pragma once

#include <cstdint>

#include "backends/cuda/common.cuh"
#include "backends/cuda/ops.h"

namespace qinfer::cuda::moe_mma {

// y[p, :] = x[row(p), :] W_e^T for the sorted rows p of every expert e (row(p) = token_of[p], or p where null).
struct GemmArgs {
    const bf16 * x = nullptr;
    const int * token_of = nullptr;  // null: row p of x
    const bf16 * w = nullptr;        // [E, w_rows, k]
    int64_t w_stride = 0;            // elements per expert
    int n = 0, k = 0;                // output features (SwiGLU: I, over 2I weight rows), inputs
    const int * offsets = nullptr, * tiles = nullptr;
    int E = 0;
    bf16 * y = nullptr;  // [rows, n]
};

// BK: K a stage. Shared rows are BK + 8 bf16 apart (144 or 272 bytes: the 8 rows of an ldmatrix fall in distinct banks).
template <int BK> constexpr int stage_row() { return BK + 8; }

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void * p) {
    const uint32_t a = uint32_t(__cvta_generic_to_shared(p));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n" : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], const void * p) {
    const uint32_t a = uint32_t(__cvta_generic_to_shared(p));
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(a));
}
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The down projection of a step's 16-row tiles (x: the SwiGLU rows in sorted order, token_of null), launched right
// after the gate/up launch of the same routing (moe_down_rows16.cu says why that matters).
void down_rows16(const GemmArgs & a, int max_tiles, cudaStream_t stream);

}  // namespace qinfer::cuda::moe_mma
