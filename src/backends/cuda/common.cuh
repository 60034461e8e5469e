// Shared CUDA helpers: error checks, bf16 conversions, warp reductions.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "core/check.h"

#define CUDA_CHECK(expr)                                                                                       \
    do {                                                                                                       \
        cudaError_t err_ = (expr);                                                                             \
        if (err_ != cudaSuccess) QINFER_FAIL() << "CUDA error " << cudaGetErrorString(err_) << " at " #expr; \
    } while (0)

namespace qinfer::cuda {

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ float warp_min(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fminf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over a block of `n_warps` warps; `shared` holds n_warps floats. Every thread gets the total.
template <int n_warps> __device__ __forceinline__ float block_sum(float v, float * shared) {
    v = warp_sum(v);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    float total = 0;
#pragma unroll
    for (int i = 0; i < n_warps; i++) total += shared[i];
    __syncthreads();
    return total;
}

__device__ __forceinline__ float silu(float x) { return x / (1.0f + __expf(-x)); }

}  // namespace qinfer::cuda
