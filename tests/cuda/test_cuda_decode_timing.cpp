// Decode attention timings on Qwen2.5-7B's and 0.5B's shapes (bf16 caches; int8 and fp8 on 7B's), with the
// caches of several layers visited in turn as one decode step does, so every call reads its keys from DRAM rather than
// from the 50 MB L2. Printed for the perf log; nothing here is asserted (correctness lives in test_cuda_ops.cpp).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <numeric>

#include "cuda/helpers.h"

namespace qinfer::test {
namespace {

using cuda::bf16;

// Each tensor-core decode kernel that takes `layer(0)` (each way of loading its tiles) with its combine, per layer,
// over `layers` caches in turn; kv_bytes: one layer's K and V bytes the kernel reads.
template <class Layer>
void time_kernels(const char * name, const char * cache, int n_head, int n_kv, int d, int len, int layers, Layer && layer, double kv_bytes) {
    DeviceBuffer dlen = upload(std::vector<int>{len});
    DeviceBuffer dq = upload_bf16(randn(size_t(n_head) * d)), dout(size_t(n_head) * d * 2, "test");
    const int splits = cuda::decode_splits(len, n_kv, d);
    DeviceBuffer po(size_t(n_head) * splits * d * 4, "test"), pml(size_t(n_head) * splits * 2 * 4, "test");
    const cuda::DecodeScratch scratch{po.as<float>(), pml.as<float>(), splits};
    for (cuda::DecodeKernel kernel : decode_kernels(d, layer(0))) {
        if (kernel == cuda::DecodeKernel::Simt) continue;
        auto step = [&] {
            for (int l = 0; l < layers; l++) {
                cuda::attention_decode(dq.as<bf16>(), layer(l), dlen.as<int>(), n_head, n_kv, d, scratch, dout.as<bf16>(), nullptr, 1, kernel);
            }
        };
        const double us = 1e3 * time_ms(20, step, 2) / layers;
        std::printf("[ kernel ] attention_decode (%s)%s %s layer len %d (%d splits, %d layers in turn): %.1f us, %.0f GB/s of KV\n",
                    decode_kernel_name(kernel), cache, name, len, splits, layers, us, kv_bytes / (us * 1e-6) / 1e9);
    }
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// Layers enough that their caches (K and V, `layer_bytes` together) pass 200 MB, twice the L2 at least.
int layers_past_l2(double layer_bytes) { return std::max(2, int(200e6 / layer_bytes + 1)); }

// A bf16 cache, per layer.
void time_decode(const char * name, int n_head, int n_kv, int d, int len) {
    const int block_size = 16;
    const int blocks = (len + block_size - 1) / block_size;
    const size_t elems = size_t(blocks) * n_kv * block_size * d;  // one layer's K (or V)
    const int layers = layers_past_l2(2.0 * elems * 2);
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
    DeviceBuffer bt = upload(table);
    auto layer = [&](int l) {
        return cuda::KVLayer{k[size_t(l)].as<bf16>(), v[size_t(l)].as<bf16>(), bt.as<int>(), block_size, 0, {}, int64_t(blocks) * n_kv * block_size};
    };
    time_kernels(name, "", n_head, n_kv, d, len, layers, layer, 2.0 * len * n_kv * d * 2);
}

// An int8 or fp8 cache (codes, int8's per-row scale and zero, fp8's layer scales), per layer. The codes are random
// bytes (fp8: never 0x7f / 0xff, e4m3's NaN patterns); the values do not change the work.
void time_decode_quant(const char * name, cuda::KVKind kind, int n_head, int n_kv, int d, int len) {
    const int block_size = 16;
    const int blocks = (len + block_size - 1) / block_size;
    const size_t rows = size_t(blocks) * n_kv * block_size;
    const bool int8 = kind == cuda::KVKind::INT8;
    const int layers = layers_past_l2(2.0 * rows * (d + (int8 ? 8 : 0)));
    std::vector<uint8_t> codes(rows * d);
    uint32_t state = 777u;
    for (uint8_t & c : codes) {
        state = state * 1664525u + 1013904223u;
        c = uint8_t(state >> 24);
        if (!int8 && (c & 0x7f) == 0x7f) c ^= 1;
    }
    std::vector<float> sz(rows * 2);
    for (size_t r = 0; r < rows; r++) {
        sz[2 * r] = 0.01f + 1e-6f * float(r % 97);
        sz[2 * r + 1] = 120.f + float(r % 17);
    }
    std::vector<int> table(static_cast<size_t>(blocks));
    std::iota(table.begin(), table.end(), 0);
    std::vector<DeviceBuffer> k, v, ksz, vsz;
    for (int l = 0; l < layers; l++) {
        k.push_back(upload(codes));
        v.push_back(upload(codes));
        if (int8) {
            ksz.push_back(upload(sz));
            vsz.push_back(upload(sz));
        }
    }
    DeviceBuffer bt = upload(table), scales = upload(std::vector<float>{0.01f, 0.02f});
    auto layer = [&](int l) {
        cuda::KVLayer kv;
        kv.block_table = bt.as<int>();
        kv.block_size = block_size;
        kv.rows = int64_t(rows);
        kv.quant.kind = kind;
        kv.quant.k = k[size_t(l)].as<uint8_t>();
        kv.quant.v = v[size_t(l)].as<uint8_t>();
        if (int8) {
            kv.quant.k_sz = ksz[size_t(l)].as<float2>();
            kv.quant.v_sz = vsz[size_t(l)].as<float2>();
        }
        kv.quant.fp8_scale = scales.as<float>();
        return kv;
    };
    time_kernels(name, int8 ? " int8" : " fp8", n_head, n_kv, d, len, layers, layer, 2.0 * len * n_kv * (d + (int8 ? 8 : 0)));
}

// QINFER_DECODE_TIMING_LEN=N times that one length instead (for profiling a single case under ncu).
static int timing_len() {
    const char * e = std::getenv("QINFER_DECODE_TIMING_LEN");
    return e ? std::atoi(e) : 0;
}

TEST(CudaDecodeTimings, Qwen7BShapes) {
    REQUIRE_GPU();
    const int only = timing_len();
    if (only > 0) return time_decode("7B", 28, 4, 128, only);
    for (int len : {1024, 2048, 4096, 8192, 30720, 129024}) time_decode("7B", 28, 4, 128, len);
}

// The same shapes over int8 and fp8 caches (issue 6 compares int8 decode with bf16 at 129024);
// QINFER_DECODE_TIMING_LEN as above.
TEST(CudaDecodeTimings, Qwen7BQuantCaches) {
    REQUIRE_GPU();
    const int only = timing_len();
    for (cuda::KVKind kind : {cuda::KVKind::INT8, cuda::KVKind::FP8}) {
        if (only > 0) {
            time_decode_quant("7B", kind, 28, 4, 128, only);
            continue;
        }
        for (int len : {4096, 30720, 129024}) time_decode_quant("7B", kind, 28, 4, 128, len);
    }
}

// Qwen2.5-0.5B: 14 query heads, 2 KV heads, head_dim 64.
TEST(CudaDecodeTimings, Qwen05BShapes) {
    REQUIRE_GPU();
    for (int len : {1024, 2048, 4096}) time_decode("0.5B", 14, 2, 64, len);
}

}  // namespace
}  // namespace qinfer::test
