// Decode GEMV entry points: gemv() (the balanced kernel of gemv_balanced.cu where its table fits, else the row
// kernels of gemv_rows.cuh); also the PDL switch and the SM count the launch rules use.
#include <algorithm>
#include <atomic>

#include "backends/cuda/gemv_common.cuh"
#include "backends/cuda/ops.h"
#include "backends/cuda/qstage.cuh"

namespace qinfer::cuda {

static std::atomic<bool> pdl_default{false};

void set_pdl_default(bool on) { pdl_default = on; }

thread_local bool pdl_suspended = false;

bool pdl_enabled() {
    static const bool hopper = [] {
        int dev = 0, major = 0;
        CUDA_CHECK(cudaGetDevice(&dev));
        CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
        return major >= 9;  // griddepcontrol needs Hopper
    }();
    return hopper && !pdl_suspended && pdl_default.load();
}

bool sm90a_device() {
#if defined(QINFER_SM90A)
    static const bool hopper = [] {
        int dev = 0, major = 0, minor = 0;
        if (cudaGetDevice(&dev) != cudaSuccess) return false;
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
        return major == 9 && minor == 0;
    }();
    return hopper;
#else
    return false;
#endif
}

int sm_count() {
    static int n = [] {
        int dev = 0, count = 0;
        CUDA_CHECK(cudaGetDevice(&dev));
        CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, dev));
        return count;
    }();
    return n;
}

static std::atomic<bool> half_rows_on{true};

void set_gemv_half_rows(bool on) { half_rows_on = on; }

bool gemv_half_rows_on() { return half_rows_on; }

// The caller's arguments checked (k, norm weights) and completed with the launch settings every BF16 GEMV kernel reads.
static GemvArgs launch_args(const GemvArgs & args, GemvIn in) {
    if (args.k % 8 != 0) QINFER_FAIL() << "gemv: k = " << args.k << " must be a multiple of 8";
    if (in == GemvIn::NormF32 && !args.norm_w) QINFER_FAIL() << "gemv: NormF32 input needs norm weights";
    GemvArgs a = args;
    a.vec_norm = in == GemvIn::NormF32 && qstage::vec_norm_ok(a);
    return a;
}

void gemv(const GemvArgs & args, GemvIn in, GemvOut out, cudaStream_t stream) {
    const GemvArgs a = launch_args(args, in);
    if (gemv_balanced(a, in, out, stream)) return;
    if (in == GemvIn::Bf16) gemv_rows_bf16(a, out, stream);
    else gemv_rows_norm(a, out, stream);
}

}  // namespace qinfer::cuda
