// The ranks' partial sums over peer memory (backends/cuda/peer_sum.h) against the CPU: x += part_0 + part_1 + ...
// in rank order, fp32, so every rank must hold exactly the CPU's bits after every call. Rounds of odd sizes alternate
// the two buffers, eager calls mix with replays of a captured graph of two calls (as the decode step's graphs do),
// and each round's partials are copied in on the rank's stream just before its call, so a rank that read a peer's
// buffer early or late shows. "Ranks" are streams: 2 and 3 on one GPU (the kernel only needs each rank's blocks to
// run at once), and 2 on two GPUs with peer access where the host has them. One host thread issues every rank's
// calls, so the ranks' kernels must be able to run at the same time: under CUDA_LAUNCH_BLOCKING (each launch waited
// for) the first rank would wait for a peer never launched, until the kernel's trap; the tests skip there.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/peer_sum.h"
#include "cuda/helpers.h"

using namespace qinfer;
using namespace qinfer::test;

namespace {

bool launches_blocking() {
    const char * v = std::getenv("CUDA_LAUNCH_BLOCKING");
    return v && std::strcmp(v, "0") != 0;
}

void run_ranks_on(const std::vector<int> & devices) {
    if (launches_blocking()) GTEST_SKIP() << "CUDA_LAUNCH_BLOCKING is set: one thread cannot start every rank's kernel";
    const int R = int(devices.size());
    const size_t nr = devices.size();
    const std::vector<size_t> sizes = {4 * 7, 3 * 3584, 8192, 4 * 1001, 4 * 8192};  // the last: the buffers' capacity
    const size_t capacity = 4 * 8192;
    constexpr int rounds = 30;
    // Round k's partials (fresh random values each) and the same x on every rank.
    std::vector<std::vector<float>> part_host(nr * rounds);
    for (auto & p : part_host) p = test::randn(capacity);
    std::vector<float> x_want = test::randn(capacity);
    std::vector<std::unique_ptr<cuda::PeerBuffers>> bufs(nr);
    std::vector<cuda::DeviceBuffer> x(nr), src(nr);
    std::vector<cudaStream_t> streams(nr);
    for (int r = 0; r < R; r++) {
        CUDA_CHECK(cudaSetDevice(devices[size_t(r)]));
        bufs[size_t(r)] = std::make_unique<cuda::PeerBuffers>(capacity);
        x[size_t(r)] = test::upload(x_want);
        std::vector<float> all;
        for (int k = 0; k < rounds; k++) all.insert(all.end(), part_host[size_t(k * R + r)].begin(), part_host[size_t(k * R + r)].end());
        src[size_t(r)] = test::upload(all);
        CUDA_CHECK(cudaStreamCreateWithFlags(&streams[size_t(r)], cudaStreamNonBlocking));
    }
    const std::vector<cuda::PeerRanks> views = cuda::link_peer_ranks(bufs);
    // Rank r's call of round k: its partial copied into buffer k % 2, then the sum.
    auto call = [&](int r, int k, size_t n) {
        const cuda::PeerRanks & v = views[size_t(r)];
        CUDA_CHECK(cudaMemcpyAsync(v.parts[k % 2][r], src[size_t(r)].as<float>() + size_t(k) * capacity, n * sizeof(float),
                                   cudaMemcpyDeviceToDevice, streams[size_t(r)]));
        cuda::peer_add_partials(x[size_t(r)].as<float>(), v, k % 2, n, streams[size_t(r)]);
    };
    auto cpu_call = [&](int k, size_t n) {
        for (size_t i = 0; i < n; i++) {
            float acc = x_want[i];
            for (int r = 0; r < R; r++) acc += part_host[size_t(k * R + r)][i];
            x_want[i] = acc;
        }
    };
    // Graphs of rounds 0 and 1 at the 7B row's size (replayed below as rounds g, g + 1 of the same values).
    const size_t graph_n = 3584;
    std::vector<cudaGraphExec_t> graphs(nr);
    for (int r = 0; r < R; r++) {
        CUDA_CHECK(cudaSetDevice(devices[size_t(r)]));
        cudaGraph_t g = nullptr;
        CUDA_CHECK(cudaStreamBeginCapture(streams[size_t(r)], cudaStreamCaptureModeRelaxed));
        call(r, 0, graph_n);
        call(r, 1, graph_n);
        CUDA_CHECK(cudaStreamEndCapture(streams[size_t(r)], &g));
        CUDA_CHECK(cudaGraphInstantiate(&graphs[size_t(r)], g, 0));
        CUDA_CHECK(cudaGraphDestroy(g));
    }
    for (int k = 0; k < rounds; k += 2) {
        if (k % 6 == 4) {  // a replay: rounds 0 and 1's partials again
            for (int r = 0; r < R; r++) {
                CUDA_CHECK(cudaSetDevice(devices[size_t(r)]));
                CUDA_CHECK(cudaGraphLaunch(graphs[size_t(r)], streams[size_t(r)]));
            }
            cpu_call(0, graph_n);
            cpu_call(1, graph_n);
            continue;
        }
        for (int j = 0; j < 2; j++) {
            const size_t n = sizes[size_t(k + j) % sizes.size()];
            for (int r = 0; r < R; r++) {
                CUDA_CHECK(cudaSetDevice(devices[size_t(r)]));
                call(r, k + j, n);
            }
            cpu_call(k + j, n);
        }
    }
    for (int r = 0; r < R; r++) {
        CUDA_CHECK(cudaSetDevice(devices[size_t(r)]));
        CUDA_CHECK(cudaStreamSynchronize(streams[size_t(r)]));
        std::vector<float> got(capacity);
        CUDA_CHECK(cudaMemcpy(got.data(), x[size_t(r)].get(), capacity * sizeof(float), cudaMemcpyDeviceToHost));
        size_t differ = 0;
        for (size_t i = 0; i < capacity; i++) differ += std::memcmp(&got[i], &x_want[i], sizeof(float)) != 0;
        EXPECT_EQ(differ, 0u) << "rank " << r << " of " << R << ": values that differ from the CPU's sums";
        CUDA_CHECK(cudaGraphExecDestroy(graphs[size_t(r)]));
        CUDA_CHECK(cudaStreamDestroy(streams[size_t(r)]));
    }
    for (int r = 0; r < R; r++) {
        CUDA_CHECK(cudaSetDevice(devices[size_t(r)]));
        bufs[size_t(r)].reset();
        x[size_t(r)] = cuda::DeviceBuffer();
        src[size_t(r)] = cuda::DeviceBuffer();
    }
    CUDA_CHECK(cudaSetDevice(0));
}

TEST(CudaPeerSum, TwoRanksOneGpu) {
    REQUIRE_GPU();
    run_ranks_on({0, 0});
}

TEST(CudaPeerSum, ThreeRanksOneGpu) {
    REQUIRE_GPU();
    run_ranks_on({0, 0, 0});
}

TEST(CudaPeerSum, TwoGpus) {
    if (test::gpu_count() < 2) GTEST_SKIP() << "needs 2 GPUs";
    if (!cuda::enable_peer_access(2)) GTEST_SKIP() << "GPUs 0 and 1 cannot reach each other's memory";
    run_ranks_on({0, 1});
}

TEST(CudaPeerSum, FourGpus) {
    if (test::gpu_count() < 4) GTEST_SKIP() << "needs 4 GPUs";
    if (!cuda::enable_peer_access(4)) GTEST_SKIP() << "GPUs 0-3 cannot all reach each other's memory";
    run_ranks_on({0, 1, 2, 3});
}

}  // namespace
