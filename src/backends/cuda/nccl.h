// NCCL as qinfer calls it (tensor parallel, model/qwen_cuda_tp.cpp; bench --allreduce): its errors as one line, and
// communicators with NVLink SHARP (NVLS, NVLink multicast) off, which on these machines can take a host's shared GPUs
// out of service.
#pragma once

#include <nccl.h>

#include <cstdlib>
#include <vector>

#include "core/check.h"

#define NCCL_CHECK(expr)                                                                                                \
    do {                                                                                                                \
        const ncclResult_t r_ = (expr);                                                                                 \
        if (r_ != ncclSuccess) QINFER_FAIL() << "NCCL: " << ncclGetErrorString(r_) << " (" << ncclGetLastError(nullptr) << ") at " #expr; \
    } while (0)

namespace qinfer::cuda {

// Before any communicator is made.
inline void nccl_nvls_off() { setenv("NCCL_NVLS_ENABLE", "0", 1); }

// One communicator for each of GPUs 0..n-1 of this process.
inline std::vector<ncclComm_t> nccl_local_comms(int n) {
    nccl_nvls_off();
    std::vector<ncclComm_t> comms(static_cast<size_t>(n));
    std::vector<int> devices(static_cast<size_t>(n));
    for (int d = 0; d < n; d++) devices[size_t(d)] = d;
    NCCL_CHECK(ncclCommInitAll(comms.data(), n, devices.data()));
    return comms;
}

}  // namespace qinfer::cuda
