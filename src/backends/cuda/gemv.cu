// Decode GEMV entry points: gemv() (the balanced kernel of gemv_balanced.cu where its table fits, else the row
// kernels of gemv_rows.cuh) and gemv_qkv_rope(); also the PDL switch and the SM count the launch rules use.
#include <algorithm>
#include <atomic>
#include <cstdlib>

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
static GemvArgs launch_args(const GemvArgs & args, GemvIn in, const char * who) {
    if (args.k % 8 != 0) QINFER_FAIL() << who << ": k = " << args.k << " must be a multiple of 8";
    if (in == GemvIn::NormF32 && !args.norm_w) QINFER_FAIL() << who << ": NormF32 input needs norm weights";
    GemvArgs a = args;
    a.vec_norm = in == GemvIn::NormF32 && qstage::vec_norm_ok(a);
    return a;
}

void gemv(const GemvArgs & args, GemvIn in, GemvOut out, cudaStream_t stream) {
    const GemvArgs a = launch_args(args, in, "gemv");
    if (gemv_balanced(a, in, out, stream)) return;
    if (in == GemvIn::Bf16) gemv_rows_bf16(a, out, stream);
    else gemv_rows_norm(a, out, stream);
}

// Fused at head_dim 128 (H100, same call, a6f6ebb: 1.5B +1.1%, 7B +0.3%); at head_dim 64, 0.5B went 1297 -> 1241 tok/s
// fused under PDL (2.2% faster without PDL; bench/results/2026-11-27-h100-fused-rope). set_fused_rope(1 / 0) forces
// it on / off (tests run both on one shape).
static std::atomic<int> fused_rope_mode{-1};

void set_fused_rope(int mode) { fused_rope_mode = mode; }

void gemv_qkv_rope(const GemvArgs & args, GemvIn in, const QkvRopeArgs & r, cudaStream_t stream) {
    static const int env_mode = [] {
        const char * v = std::getenv("QINFER_FUSED_ROPE");
        return v ? std::atoi(v) : -1;
    }();
    const int mode = fused_rope_mode != -1 ? int(fused_rope_mode) : env_mode;
    const bool fuse = mode == 1 || (mode == -1 && r.head_dim == 128);
    const bool fits = fuse && r.cache.quant.kind == KVKind::BF16 && !r.q_norm && !r.k_norm && !r.fp8_amax && r.head_dim % 2 == 0 &&
                      r.n == args.m && args.n == (r.n_head + 2 * r.n_kv) * r.head_dim && r.q_out;
    if (fits) {
        GemvArgs a = launch_args(args, in, "gemv_qkv_rope");
        a.n = args.n / 2;  // RoPE pairs
        if (gemv_balanced_qkv_rope(a, in, r, stream)) return;
    }
    gemv(args, in, GemvOut::Bf16, stream);
    qkv_rope_cache(r, stream);
}

}  // namespace qinfer::cuda
