// Prefill GEMM through cuBLASLt: y[m, n] = x[m, k] W[n, k]^T, bf16 inputs, fp32 accumulation, bf16 or fp32 out.
// Row-major x and W are column-major x^T [k, m] and W^T [k, n], so cuBLAS computes y^T = (W^T)^T x^T.
#include <cublasLt.h>

#include <map>
#include <tuple>

#include "backends/cuda/allocator.h"
#include "backends/cuda/ops.h"
#include "core/check.h"

namespace qinfer::cuda {

namespace {

#define CUBLAS_CHECK(expr)                                                                          \
    do {                                                                                            \
        cublasStatus_t st_ = (expr);                                                                \
        if (st_ != CUBLAS_STATUS_SUCCESS) QINFER_FAIL() << "cuBLASLt error " << int(st_) << " at " #expr; \
    } while (0)

constexpr size_t k_workspace = 16u << 20;

struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
};

struct Context {
    cublasLtHandle_t handle = nullptr;
    // One workspace a stream: GEMMs of two streams may run at once (a MoE block's shared expert beside its routed
    // experts), and cuBLASLt's workspace is scratch for the duration of a call.
    std::map<cudaStream_t, DeviceBuffer> workspaces;
    std::map<std::tuple<int, int, int, bool>, Plan> plans;

    Plan & plan(int m, int n, int k, bool y_f32) {
        auto key = std::make_tuple(m, n, k, y_f32);
        auto it = plans.find(key);
        if (it != plans.end()) return it->second;
        Plan p;
        CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        cublasOperation_t trans_a = CUBLAS_OP_T;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof(trans_a)));
        CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, k, n, k));  // W^T, transposed by the op
        CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, k, m, k));  // x^T
        CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, y_f32 ? CUDA_R_32F : CUDA_R_16BF, n, m, n));
        cublasLtMatmulPreference_t pref;
        CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
        size_t ws = k_workspace;
        CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
        // The heuristic's first choice. Timing its first 8 candidates once per decode-step shape (L2 flushed) and
        // keeping the fastest measured level on an H200: Qwen1.5-MoE-A2.7B BF16 batch 16 / 64 -0.4% / -0.1%, 7B BF16
        // +0.5-1.7% / -0.1-+1.2%, same call, the picks varying between runs (bench/results/2026-12-03-h200-gemm-tune).
        cublasLtMatmulHeuristicResult_t result{};
        int found = 0;
        CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(handle, p.desc, p.a, p.b, p.c, p.c, pref, 1, &result, &found));
        cublasLtMatmulPreferenceDestroy(pref);
        if (found == 0) QINFER_FAIL() << "cuBLASLt has no algorithm for a " << m << "x" << n << "x" << k << " bf16 GEMM";
        p.algo = result.algo;
        return plans.emplace(key, p).first->second;
    }
};

// One context per device (its workspaces live there), made on the device's first GEMM; each device is driven by one
// thread (a tensor-parallel rank), so a context is never shared between threads.
Context & context() {
    static Context contexts[k_max_devices];
    const int device = current_device();
    QINFER_CHECK(device < k_max_devices) << "cuBLASLt: CUDA device " << device << " beyond the " << k_max_devices << " qinfer handles";
    Context & c = contexts[device];
    if (!c.handle) CUBLAS_CHECK(cublasLtCreate(&c.handle));
    return c;
}

}  // namespace

void gemm_reserve(cudaStream_t stream) { context().workspaces[stream].ensure(k_workspace, "cuBLASLt workspace"); }

void gemm_release(cudaStream_t stream) { context().workspaces.erase(stream); }

void gemm(const bf16 * x, const bf16 * w, int m, int n, int k, void * y, bool y_f32, cudaStream_t stream) {
    if (m == 0) return;
    Context & ctx = context();
    DeviceBuffer & workspace = ctx.workspaces[stream];
    workspace.ensure(k_workspace, "cuBLASLt workspace");
    Plan & p = ctx.plan(m, n, k, y_f32);
    const float alpha = 1.0f, beta = 0.0f;
    CUBLAS_CHECK(cublasLtMatmul(ctx.handle, p.desc, &alpha, w, p.a, x, p.b, &beta, y, p.c, y, p.c, &p.algo,
                                workspace.get(), k_workspace, stream));
}

}  // namespace qinfer::cuda
