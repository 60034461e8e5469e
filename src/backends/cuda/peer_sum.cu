// The ranks' partial sums added into the residual over peer memory (peer_sum.h says how and why).
#include <algorithm>

#include "backends/cuda/common.cuh"
#include "backends/cuda/peer_sum.h"

namespace qinfer::cuda {

namespace {

constexpr int k_threads = 256;

__device__ __forceinline__ void store_release_sys(uint32_t * p, uint32_t v) {
    asm volatile("st.release.sys.global.u32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ uint32_t load_acquire_sys(const uint32_t * p) {
    uint32_t v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ uint64_t global_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
    return t;
}

// Grid: enough blocks of k_threads for one float4 a thread (at most k_peer_max_blocks, then strided).
__global__ void __launch_bounds__(k_threads) peer_add_partials_kernel(float * __restrict__ x, PeerRanks p, int which, size_t n4) {
    const int b = blockIdx.x;
    __shared__ uint32_t epoch;
    pdl_wait();  // the partial sums come from the kernels ahead, on every rank
    if (threadIdx.x == 0) epoch = p.epochs[b] + 1;
    __syncthreads();
    const uint32_t e = epoch;
    if (int(threadIdx.x) < p.ranks) {
        // Thread q meets rank q: this rank's arrival at call e into q's flags, then q's arrival awaited in ours.
        const int q = int(threadIdx.x);
        store_release_sys(p.flags[q] + b * k_peer_max_ranks + p.rank, e);
        const uint32_t * theirs = p.flags[p.rank] + b * k_peer_max_ranks + q;
        const uint64_t t0 = global_ns();
        for (uint32_t spins = 0; int(load_acquire_sys(theirs) - e) < 0; spins++) {
            if ((spins & 1023u) == 1023u && double(global_ns() - t0) > k_peer_wait_s * 1e9) __trap();
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) p.epochs[b] = e;
    float4 * x4 = reinterpret_cast<float4 *>(x);
    for (size_t i = size_t(b) * k_threads + threadIdx.x; i < n4; i += size_t(gridDim.x) * k_threads) {
        float4 v[k_peer_max_ranks];
#pragma unroll
        for (int r = 0; r < k_peer_max_ranks; r++) {
            if (r < p.ranks) v[r] = __ldcg(reinterpret_cast<const float4 *>(p.parts[which][r]) + i);
        }
        float4 acc = x4[i];
#pragma unroll
        for (int r = 0; r < k_peer_max_ranks; r++) {
            if (r < p.ranks) {
                acc.x += v[r].x;
                acc.y += v[r].y;
                acc.z += v[r].z;
                acc.w += v[r].w;
            }
        }
        x4[i] = acc;
    }
}

}  // namespace

PeerBuffers::PeerBuffers(size_t capacity_floats) : capacity(capacity_floats) {
    for (DeviceBuffer & part : parts) {
        part = DeviceBuffer(capacity * sizeof(float), "tensor parallel partial sums");
        CUDA_CHECK(cudaMemset(part.get(), 0, capacity * sizeof(float)));
    }
    const size_t flag_bytes = size_t(k_peer_max_blocks) * k_peer_max_ranks * sizeof(uint32_t);
    flags = DeviceBuffer(flag_bytes, "tensor parallel flags");
    epochs = DeviceBuffer(size_t(k_peer_max_blocks) * sizeof(uint32_t), "tensor parallel flags");
    CUDA_CHECK(cudaMemset(flags.get(), 0, flag_bytes));
    CUDA_CHECK(cudaMemset(epochs.get(), 0, epochs.bytes()));
    CUDA_CHECK(cudaDeviceSynchronize());
}

std::vector<PeerRanks> link_peer_ranks(const std::vector<std::unique_ptr<PeerBuffers>> & all) {
    const int ranks = int(all.size());
    QINFER_CHECK(ranks >= 1 && ranks <= k_peer_max_ranks) << "peer sums: " << ranks << " ranks (at most " << k_peer_max_ranks << ")";
    std::vector<PeerRanks> views(all.size());
    for (int r = 0; r < ranks; r++) {
        PeerRanks & v = views[size_t(r)];
        v.rank = r;
        v.ranks = ranks;
        v.capacity = all[r]->capacity;
        for (int q = 0; q < ranks; q++) {
            QINFER_CHECK(all[q]->capacity == v.capacity) << "peer sums: the ranks' buffers differ in size";
            for (int w = 0; w < 2; w++) v.parts[w][q] = all[q]->parts[w].as<float>();
            v.flags[q] = all[q]->flags.as<uint32_t>();
        }
        v.epochs = all[r]->epochs.as<uint32_t>();
    }
    return views;
}

bool enable_peer_access(int n) {
    for (int a = 0; a < n; a++) {
        for (int b = 0; b < n; b++) {
            int can = 0;
            if (a != b && (cudaDeviceCanAccessPeer(&can, a, b) != cudaSuccess || !can)) {
                cudaGetLastError();
                return false;
            }
        }
    }
    const int was = current_device();
    for (int a = 0; a < n; a++) {
        CUDA_CHECK(cudaSetDevice(a));
        for (int b = 0; b < n; b++) {
            if (a == b) continue;
            const cudaError_t e = cudaDeviceEnablePeerAccess(b, 0);
            if (e == cudaErrorPeerAccessAlreadyEnabled) {
                cudaGetLastError();
            } else if (e != cudaSuccess) {
                cudaGetLastError();
                CUDA_CHECK(cudaSetDevice(was));
                return false;
            }
        }
    }
    CUDA_CHECK(cudaSetDevice(was));
    return true;
}

void peer_add_partials(float * x, const PeerRanks & p, int which, size_t n, cudaStream_t stream) {
    QINFER_CHECK(n % 4 == 0 && n <= p.capacity && (which == 0 || which == 1))
        << "peer_add_partials: " << n << " values (buffers of " << p.capacity << "), buffer " << which;
    const size_t n4 = n / 4;
    const int blocks = int(std::clamp<size_t>((n4 + k_threads - 1) / k_threads, 1, k_peer_max_blocks));
    launch_kernel(peer_add_partials_kernel, dim3(blocks), dim3(k_threads), 0, stream, x, p, which, n4);
}

}  // namespace qinfer::cuda
