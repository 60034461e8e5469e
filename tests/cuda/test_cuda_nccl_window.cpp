// NCCL's symmetric windows alone, on two GPUs of this host: in-place fp32 all-reduces of a buffer registered with
// ncclCommWindowRegister(NCCL_WIN_COLL_SYMMETRIC), issued eagerly and replayed from a CUDA graph in alternation, with
// another size and a plain (unregistered) all-gather between them, as a tensor-parallel decode step would mix them.
// Every element is a small integer, so each sum is exact and any stale or early read shows.
//
// Why it exists: with the decode residual in such a window, the engine's tensor-parallel batch tests failed now and
// then (bench/results/2026-11-30-h200x2-tp-window; the window was removed). NCCL's symmetric kernels wait for the
// kernel ahead (cudaGridDependencySynchronize in their entry), so the suspect was the mix this test makes: graph
// replays and eager calls of symmetric collectives on one communicator. It passes on two H200s
// (bench/results/2026-11-30-h200x2-ring-fold, call 2): that mix alone does not reproduce the failures. Skipped with
// fewer than two GPUs.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "backends/cuda/cuda_check.h"
#include "cuda/helpers.h"
#include "backends/cuda/nccl.h"
#include "model/rank_workers.h"

using namespace qinfer;

namespace {

// Rank r's value of element i at round k: the ranks' sum is sum_r value(r, i, k), exact in fp32.
float value(int r, size_t i, int k) { return float((r + 1) * 100 + int(i % 97) + 3 * k); }

TEST(CudaNcclWindow, EagerAndGraphAllReducesAlternate) {
    constexpr int ranks = 2, rounds = 24;
    if (test::gpu_count() < ranks) GTEST_SKIP() << "needs 2 GPUs";
    const std::vector<size_t> counts = {3 * 64, 8192, 3 * 3584};  // elements: a tiny batch, one 72B row, three 7B rows
    size_t max_count = 0;
    for (size_t c : counts) max_count = std::max(max_count, c);
    const size_t bytes = (max_count * sizeof(float) + NCCL_WIN_REQUIRED_ALIGNMENT - 1) / NCCL_WIN_REQUIRED_ALIGNMENT * NCCL_WIN_REQUIRED_ALIGNMENT;
    std::vector<ncclComm_t> comms = cuda::nccl_local_comms(ranks);
    RankWorkers workers(ranks, 1);
    std::vector<int> wrong(ranks, 0), registered(ranks, 0);
    workers.run_all(
        [&](size_t r) {
            CUDA_CHECK(cudaSetDevice(int(r)));
            cudaStream_t s;
            CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
            void * win_buf = nullptr;
            ncclWindow_t win = nullptr;
            NCCL_CHECK(ncclMemAlloc(&win_buf, bytes));
            NCCL_CHECK(ncclCommWindowRegister(comms[r], win_buf, bytes, &win, NCCL_WIN_COLL_SYMMETRIC));
            registered[r] = win != nullptr;
            float * x = static_cast<float *>(win_buf);
            float *plain_send = nullptr, *plain_recv = nullptr;  // an unregistered all-gather between the all-reduces
            CUDA_CHECK(cudaMalloc(&plain_send, 64 * sizeof(float)));
            CUDA_CHECK(cudaMalloc(&plain_recv, ranks * 64 * sizeof(float)));
            std::vector<float> host(max_count), back(max_count);
            // Every collective once eagerly first, as the engine's warm-up step does: NCCL connects the peers at a
            // communicator's first use of a kind, which a stream under capture does not allow.
            for (size_t c : counts) {
                NCCL_CHECK(ncclAllReduce(x, x, c, ncclFloat32, ncclSum, comms[r], s));
                NCCL_CHECK(ncclAllGather(plain_send, plain_recv, 64, ncclFloat32, comms[r], s));
            }
            CUDA_CHECK(cudaStreamSynchronize(s));
            // One graph per size, holding the collectives only; each round's values are copied in before it runs. A
            // capture that fails is ended before the error leaves (a stream left capturing breaks later tests).
            std::vector<cudaGraphExec_t> graphs;
            for (size_t c : counts) {
                cudaGraph_t g = nullptr;
                cudaGraphExec_t ge;
                CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
                try {
                    NCCL_CHECK(ncclAllReduce(x, x, c, ncclFloat32, ncclSum, comms[r], s));
                    NCCL_CHECK(ncclAllGather(plain_send, plain_recv, 64, ncclFloat32, comms[r], s));
                } catch (...) {
                    if (cudaStreamEndCapture(s, &g) == cudaSuccess && g) cudaGraphDestroy(g);
                    throw;
                }
                CUDA_CHECK(cudaStreamEndCapture(s, &g));
                CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
                CUDA_CHECK(cudaGraphDestroy(g));
                graphs.push_back(ge);
            }
            for (int k = 0; k < rounds; k++) {
                const size_t which = size_t(k) % counts.size(), c = counts[which];
                for (size_t i = 0; i < c; i++) host[i] = value(int(r), i, k);
                CUDA_CHECK(cudaMemcpyAsync(x, host.data(), c * sizeof(float), cudaMemcpyHostToDevice, s));
                if (k % 2 == 0) {
                    CUDA_CHECK(cudaGraphLaunch(graphs[which], s));
                } else {
                    NCCL_CHECK(ncclAllReduce(x, x, c, ncclFloat32, ncclSum, comms[r], s));
                    NCCL_CHECK(ncclAllGather(plain_send, plain_recv, 64, ncclFloat32, comms[r], s));
                }
                CUDA_CHECK(cudaMemcpyAsync(back.data(), x, c * sizeof(float), cudaMemcpyDeviceToHost, s));
                CUDA_CHECK(cudaStreamSynchronize(s));
                for (size_t i = 0; i < c; i++) {
                    float sum = 0;
                    for (int q = 0; q < ranks; q++) sum += value(q, i, k);
                    if (back[i] != sum) wrong[r]++;
                }
            }
            for (cudaGraphExec_t ge : graphs) cudaGraphExecDestroy(ge);
            if (win) ncclCommWindowDeregister(comms[r], win);
            ncclMemFree(win_buf);
            cudaFree(plain_send);
            cudaFree(plain_recv);
            cudaStreamDestroy(s);
        },
        [] {});
    for (ncclComm_t c : comms) ncclCommDestroy(c);
    if (!registered[0]) GTEST_SKIP() << "NCCL registered no symmetric window between these GPUs";
    for (int r = 0; r < ranks; r++) EXPECT_EQ(wrong[r], 0) << "rank " << r << ": elements unlike the ranks' sum";
}

}  // namespace
