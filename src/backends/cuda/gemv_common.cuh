// Pieces shared by the BF16 decode GEMV kernels (gemv.cu: one or more warps per row; gemv_balanced.cu: one wave of
// blocks over a flat (row, chunk) space).
#pragma once

#include "backends/cuda/common.cuh"
#include "backends/cuda/ops.h"

namespace qinfer::cuda {

// The last occupancy query of one kernel instance on one device.
struct Occupancy {
    size_t smem = size_t(-1);
    int blocks = 0;
};

// Blocks of `kernel` resident per SM with `threads` threads and `smem` bytes, queried again only when smem changes.
// `cache` is the caller's record for this kernel, one a device (tensor-parallel ranks launch from threads of their own).
template <class Kernel> int resident_blocks(Kernel kernel, int threads, size_t smem, PerDevice<Occupancy> & cache) {
    Occupancy & o = cache.here();
    if (smem != o.smem) {
        CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&o.blocks, kernel, threads, smem));
        o.smem = smem;
    }
    return o.blocks;
}

// Writes output row `row` of token m from its fp32 sums (s1: the up projection's sum with SiluMulBf16).
template <GemvOut OUT> __device__ __forceinline__ void gemv_store(const GemvArgs & a, int m, int row, float s0, float s1) {
    const int64_t o = int64_t(m) * a.n + row;
    if constexpr (OUT == GemvOut::Bf16) {
        static_cast<bf16 *>(a.y)[o] = __float2bfloat16(s0);
    } else if constexpr (OUT == GemvOut::F32) {
        static_cast<float *>(a.y)[o] = s0;
    } else if constexpr (OUT == GemvOut::AddF32) {
        static_cast<float *>(a.y)[o] += s0;
    } else {
        // transformers rounds gate and up to bf16 before silu(gate) * up.
        const float g = __bfloat162float(__float2bfloat16(s0)), u = __bfloat162float(__float2bfloat16(s1));
        static_cast<bf16 *>(a.y)[o] = __float2bfloat16(silu(g) * u);
    }
}

// Half-warp rows in the row kernels (set_gemv_half_rows, gemv.cu).
bool gemv_half_rows_on();

// The row kernels for a bf16 / a normalised fp32 input, m 1..4 (gemv_rows_bf16.cu, gemv_rows_norm.cu).
void gemv_rows_bf16(const GemvArgs & a, GemvOut out, cudaStream_t stream);
void gemv_rows_norm(const GemvArgs & a, GemvOut out, cudaStream_t stream);

// The balanced kernel for this shape, if it applies (gemv_balanced.cu); false: use the row kernels.
bool gemv_balanced(const GemvArgs & a, GemvIn in, GemvOut out, cudaStream_t stream);

}  // namespace qinfer::cuda
