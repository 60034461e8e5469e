// Asks L2 for byte ranges a decode step reads soon (l2_prefetch, ops.h). A decode step leaves DRAM mostly idle while
// its short kernels fill and drain (qkv, the attention, o_proj at batch 1: docs/persistent-decode.md), so a kernel on
// a second stream that requests the next projection's weights then lets that projection read L2 instead. Nothing is
// written: the kernel only issues prefetches, one 4 KB chunk a lane at a time, spread over every SM so that no one
// SM's copy engine paces them.
#include <algorithm>

#include "backends/cuda/common.cuh"
#include "backends/cuda/ops.h"

namespace qinfer::cuda {

namespace {

constexpr int k_prefetch_threads = 32;
constexpr int64_t k_chunk = 4096;

struct ChunkSpans {
    const char * base[L2Spans::k_max];
    int64_t bytes[L2Spans::k_max];  // multiples of 16, base 16-byte aligned
    int64_t first[L2Spans::k_max + 1];  // chunk index where span i begins; first[n] = chunks in all
    int n;
};

__global__ void __launch_bounds__(k_prefetch_threads) l2_prefetch_kernel(ChunkSpans s) {
    const int64_t total = s.first[s.n];
    for (int64_t g = int64_t(blockIdx.x) * k_prefetch_threads + threadIdx.x; g < total; g += int64_t(gridDim.x) * k_prefetch_threads) {
        int i = 0;
        while (g >= s.first[i + 1]) i++;
        const int64_t off = (g - s.first[i]) * k_chunk;
        const char * p = s.base[i] + off;
        const int64_t left = s.bytes[i] - off, bytes = left < k_chunk ? left : k_chunk;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(p), "r"(uint32_t(bytes)) : "memory");
#else
        for (int64_t b = 0; b < bytes; b += 128) asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p + b));
#endif
    }
}

}  // namespace

void L2Spans::add(const void * p, size_t n_bytes) {
    if (!p || n_bytes == 0 || n == k_max) return;
    // The bulk prefetch takes 16-byte aligned ranges of whole 16-byte units: the range is trimmed inward to them.
    const uintptr_t a = reinterpret_cast<uintptr_t>(p), begin = (a + 15) & ~uintptr_t(15), end = (a + n_bytes) & ~uintptr_t(15);
    if (end <= begin) return;
    ptr[n] = reinterpret_cast<const void *>(begin);
    bytes[n] = end - begin;
    n++;
}

size_t L2Spans::total() const {
    size_t t = 0;
    for (int i = 0; i < n; i++) t += bytes[i];
    return t;
}

void l2_prefetch(const L2Spans & spans, cudaStream_t stream) {
    if (spans.n == 0) return;
    ChunkSpans s{};
    s.n = spans.n;
    s.first[0] = 0;
    for (int i = 0; i < spans.n; i++) {
        s.base[i] = static_cast<const char *>(spans.ptr[i]);
        s.bytes[i] = int64_t(spans.bytes[i]);
        s.first[i + 1] = s.first[i] + (s.bytes[i] + k_chunk - 1) / k_chunk;
    }
    const int grid = int(std::min<int64_t>(sm_count(), (s.first[s.n] + k_prefetch_threads - 1) / k_prefetch_threads));
    // Launched normally: it reads nothing the kernels ahead write, and its stream has no kernel ahead to overlap.
    l2_prefetch_kernel<<<grid, k_prefetch_threads, 0, stream>>>(s);
    CUDA_CHECK(cudaGetLastError());
}

}  // namespace qinfer::cuda
