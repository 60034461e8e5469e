// Decode attention timings on Qwen2.5-7B's and 0.5B's shapes (bf16 cache), with the
// caches of several layers visited in turn as one decode step does, so every call reads its keys from DRAM rather than
// from the 50 MB L2. Printed for the perf log; nothing here is asserted (correctness lives in test_cuda_ops.cpp).
#include <algorithm>
#include <cstdio>
#include <numeric>

#include "core/env.h"
#include "cuda/helpers.h"

namespace qinfer::test {
namespace {

using cuda::bf16;

// The tensor-core split kernel (each way of loading its tiles) and its combine, per layer.
void time_decode(const char * name, int n_head, int n_kv, int d, int len) {
    const int block_size = 16;
    const int blocks = (len + block_size - 1) / block_size;
    const size_t elems = size_t(blocks) * n_kv * block_size * d;  // one layer's K (or V)
    // Layers enough that their caches (K and V) pass 200 MB, twice the L2 at least.
    const int layers = std::max(2, int(200e6 / (2.0 * elems * 2) + 1));
    std::vector<uint16_t> host(elems);
    uint32_t state = 12345u;
    for (uint16_t & x : host) {
        state = state * 1664525u + 1013904223u;
        x = f32_to_bf16((int(state >> 9) % 2001 - 1000) * 1e-3f);
    }
    std::vector<int> table(static_cast<size_t>(blocks));
    std::iota(table.begin(), table.end(), 0);  // a lone sequence's blocks, in the order the engine hands them out
    std::vector<DeviceBuffer> k, v;
    for (int l = 0; l < layers; l++) {
        k.push_back(upload(host));
        v.push_back(upload(host));
    }
    DeviceBuffer bt = upload(table), dlen = upload(std::vector<int>{len});
    DeviceBuffer dq = upload_bf16(randn(size_t(n_head) * d)), dout(size_t(n_head) * d * 2, "test");
    const int splits = cuda::decode_splits(len, n_kv, d);
    DeviceBuffer po(size_t(n_head) * splits * d * 4, "test"), pml(size_t(n_head) * splits * 2 * 4, "test");
    const cuda::DecodeScratch scratch{po.as<float>(), pml.as<float>(), splits};
    auto layer = [&](int l) {
        return cuda::KVLayer{k[size_t(l)].as<bf16>(), v[size_t(l)].as<bf16>(), bt.as<int>(), block_size, 0, {}, int64_t(blocks) * n_kv * block_size};
    };
    for (cuda::DecodeKernel kernel : decode_kernels(d, layer(0))) {
        if (kernel == cuda::DecodeKernel::Simt) continue;
        auto step = [&] {
            for (int l = 0; l < layers; l++) {
                cuda::attention_decode(dq.as<bf16>(), layer(l), dlen.as<int>(), n_head, n_kv, d, scratch, dout.as<bf16>(), nullptr, 1, kernel);
            }
        };
        const double us = 1e3 * time_ms(20, step, 2) / layers;
        const double kv_bytes = 2.0 * len * n_kv * d * 2;
        std::printf("[ kernel ] attention_decode (%s) %s layer len %d (%d splits, %d layers in turn): %.1f us, %.0f GB/s of KV\n",
                    decode_kernel_name(kernel), name, len, splits, layers, us, kv_bytes / (us * 1e-6) / 1e9);
    }
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// QINFER_DECODE_TIMING_LEN=N times that one length instead (for profiling a single case under ncu).
TEST(CudaDecodeTimings, Qwen7BShapes) {
    REQUIRE_GPU();
    const int only = env_int("QINFER_DECODE_TIMING_LEN", 0);
    if (only > 0) return time_decode("7B", 28, 4, 128, only);
    for (int len : {1024, 2048, 4096, 8192, 30720, 129024}) time_decode("7B", 28, 4, 128, len);
}

// Qwen2.5-0.5B: 14 query heads, 2 KV heads, head_dim 64.
TEST(CudaDecodeTimings, Qwen05BShapes) {
    REQUIRE_GPU();
    for (int len : {1024, 2048, 4096}) time_decode("0.5B", 14, 2, 64, len);
}

}  // namespace
}  // namespace qinfer::test
