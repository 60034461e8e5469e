// CUDA_CHECK(call): a failed CUDA runtime call becomes a qinfer::Error naming the call (host code, .cu and .cpp alike).
#pragma once

#include <cuda_runtime.h>

#include "core/check.h"

#define CUDA_CHECK(expr)                                                                                       \
    do {                                                                                                       \
        cudaError_t err_ = (expr);                                                                             \
        if (err_ != cudaSuccess) QINFER_FAIL() << "CUDA error " << cudaGetErrorString(err_) << " at " #expr; \
    } while (0)
