// Helpers of the CUDA kernel tests: random bf16-exact inputs, uploads, poisoned outputs, error measures.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "backends/cpu/ops.h"
#include "backends/cuda/allocator.h"
#include "backends/cuda/ops.h"
#include "core/dtype.h"
#include "model/weights.h"

namespace qinfer::test {

using cuda::DeviceBuffer;

// CUDA devices present (0 where the runtime finds none).
inline int gpu_count() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

inline bool have_gpu() { return gpu_count() > 0; }

#define REQUIRE_GPU()                                   \
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device"; \
    else (void)0

inline std::mt19937 & rng() {
    static std::mt19937 r(std::random_device{}());
    return r;
}

// Random values already rounded to bf16, so the CPU and GPU see identical inputs.
inline std::vector<float> randn(size_t n, float std = 1.0f) {
    std::normal_distribution<float> d(0.0f, std);
    std::vector<float> v(n);
    for (float & x : v) x = round_bf16(d(rng()));
    return v;
}

inline std::vector<uint16_t> to_bf16(const std::vector<float> & v) {
    std::vector<uint16_t> o(v.size());
    for (size_t i = 0; i < v.size(); i++) o[i] = f32_to_bf16(v[i]);
    return o;
}

template <typename T> DeviceBuffer upload(const std::vector<T> & v) {
    DeviceBuffer b(std::max<size_t>(1, v.size()) * sizeof(T), "test");
    cudaMemcpy(b.get(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice);
    return b;
}
inline DeviceBuffer upload_bf16(const std::vector<float> & v) { return upload(to_bf16(v)); }

// Mean milliseconds per call of `reps` back-to-back calls of fn on the default stream, after `warmup` untimed calls
// (CUDA events). For the timing lines tests print, never for assertions.
template <class F> double time_ms(int reps, F && fn, int warmup = 0) {
    for (int i = 0; i < warmup; i++) fn();
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    cudaEventRecord(e0);
    for (int i = 0; i < reps; i++) fn();
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return double(ms) / reps;
}

inline DeviceBuffer poisoned(size_t bytes) {
    DeviceBuffer b(bytes, "test");
    cudaMemset(b.get(), 0xff, bytes);  // NaN in bf16 and fp32
    return b;
}

inline std::vector<float> download_f32(const DeviceBuffer & b, size_t n) {
    std::vector<float> v(n);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    cudaMemcpy(v.data(), b.get(), n * sizeof(float), cudaMemcpyDeviceToHost);
    return v;
}

inline std::vector<uint16_t> download_u16(const DeviceBuffer & b, size_t n) {
    std::vector<uint16_t> h(n);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    cudaMemcpy(h.data(), b.get(), n * sizeof(uint16_t), cudaMemcpyDeviceToHost);
    return h;
}

inline std::vector<float> download_bf16(const DeviceBuffer & b, size_t n) {
    const std::vector<uint16_t> h = download_u16(b, n);
    std::vector<float> v(n);
    for (size_t i = 0; i < n; i++) v[i] = bf16_to_f32(h[i]);
    return v;
}

// max |got - want| / max |want|; NaN anywhere is an infinite error.
inline double rel_err(const std::vector<float> & got, const std::vector<float> & want) {
    double num = 0, den = 1e-30;
    for (size_t i = 0; i < want.size(); i++) {
        if (!std::isfinite(got[i])) return INFINITY;
        num = std::max(num, double(std::fabs(got[i] - want[i])));
        den = std::max(den, double(std::fabs(want[i])));
    }
    return num / den;
}

inline Weight host_weight(const std::vector<float> & v, std::vector<int64_t> shape) {
    Weight w;
    w.data = v.data();
    w.dtype = DType::F32;
    w.shape = std::move(shape);
    return w;
}

// CPU reference of a linear layer without bias: y [m, n] = x [m, k] W^T for fp32 weights w [n, k].
inline std::vector<float> reference_linear(const std::vector<float> & x, int m, const std::vector<float> & w, int n, int k) {
    Linear l;
    l.in_features = k;
    l.out_features = n;
    l.weight = host_weight(w, {n, k});
    std::vector<float> y(size_t(m) * n);
    cpu::linear(x.data(), m, l, y.data());
    return y;
}

// A projection of a decode step as the engine runs it, for the timing tests.
struct GemvShape {
    const char * name;
    int n, k;
    cuda::GemvIn in;
    cuda::GemvOut out;
};

// GEMV arguments over device buffers: m rows of k inputs x, norm weights, n outputs y (a.w is the caller's).
inline cuda::GemvArgs gemv_args(int n, int k, int m, const DeviceBuffer & x, const DeviceBuffer & norm_w, DeviceBuffer & y) {
    cuda::GemvArgs a;
    a.n = n;
    a.k = k;
    a.x = x.get();
    a.m = m;
    a.norm_w = norm_w.as<cuda::bf16>();
    a.y = y.get();
    return a;
}

// CPU reference of the fused norm: bf16(w * x * rsqrt(mean(x^2) + eps)), as the kernels stage it.
inline std::vector<float> norm_rows(const std::vector<float> & x, const std::vector<float> & w, int m, int k, float eps) {
    std::vector<float> y(x.size());
    cpu::rms_norm(x.data(), host_weight(w, {k}), eps, m, k, y.data());
    for (float & v : y) v = round_bf16(v);
    return y;
}

// The prefill attention kernels that take this head_dim (the pipelined one: 64 and 128).
inline std::vector<cuda::PrefillKernel> prefill_kernels(int head_dim) {
    if (cuda::prefill_wgmma_available(head_dim)) {
        return {cuda::PrefillKernel::Tiled, cuda::PrefillKernel::Pipelined, cuda::PrefillKernel::Wgmma, cuda::PrefillKernel::Tma,
                cuda::PrefillKernel::TmaPingpong};
    }
    if (head_dim == 64 || head_dim == 128) return {cuda::PrefillKernel::Tiled, cuda::PrefillKernel::Pipelined};
    return {cuda::PrefillKernel::Tiled};
}

// The decode attention kernels that take this cache, head_dim and GQA group (n_rep query heads a KV head): the SIMT
// one up to 8 a group, the tensor-core one at 64 and 128, its tensor-copy form where cuda::decode_tma_applies.
inline std::vector<cuda::DecodeKernel> decode_kernels(int head_dim, const cuda::KVLayer & cache, int n_rep = 1) {
    std::vector<cuda::DecodeKernel> kernels;
    if (n_rep <= 8) kernels.push_back(cuda::DecodeKernel::Simt);
    if (head_dim == 64 || head_dim == 128) kernels.push_back(cuda::DecodeKernel::TensorCore);
    if (cuda::decode_tma_applies(cache, head_dim, n_rep)) kernels.push_back(cuda::DecodeKernel::TensorCoreTma);
    return kernels;
}
inline const char * decode_kernel_name(cuda::DecodeKernel kernel) {
    switch (kernel) {
    case cuda::DecodeKernel::Simt: return "simt";
    case cuda::DecodeKernel::TensorCore: return "tensor cores";
    case cuda::DecodeKernel::TensorCoreTma: return "tensor cores, tensor copies";
    default: return "auto";
    }
}

// The decode kernels' correctness cases: each kernel, the tensor-core ones also with their early tile requests
// (cuda::set_decode_early_kv); run() sets the mode and puts back the start-up setting.
struct DecodeCase {
    cuda::DecodeKernel kernel;
    bool early_kv;
    template <class F> void run(F && f) const {
        cuda::set_decode_early_kv(early_kv);
        f();
        cuda::reset_decode_early_kv();
    }
};
inline std::vector<DecodeCase> decode_cases(int head_dim, const cuda::KVLayer & cache, int n_rep = 1) {
    std::vector<DecodeCase> cases;
    for (cuda::DecodeKernel kernel : decode_kernels(head_dim, cache, n_rep)) {
        cases.push_back({kernel, false});
        if (kernel != cuda::DecodeKernel::Simt) cases.push_back({kernel, true});
    }
    return cases;
}

}  // namespace qinfer::test
