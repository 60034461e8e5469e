// qinfer bench --allreduce --tp N: the time of one NCCL all-reduce over N GPUs of this host for the messages tensor
// parallel sends (one decode row of a model's hidden state, fp32 as the decode step reduces it and bf16 as prefill
// does, up to many rows), each three ways: issued eagerly, replayed inside a CUDA graph of `reps` calls (as the decode
// step does), and NCCL's all_reduce_perf-style figure (the eager time as algorithm and bus bandwidth: bytes / time and
// 2 (n - 1) / n of that). One thread drives each GPU, as in the engine; the GPUs' clocks are not pinned. Beside them, for
// the fp32 messages of decode steps (up to 4 rows), the engine's own sum over peer memory (backends/cuda/peer_sum.h)
// replayed in a graph the same way, launched as the engine launches it (programmatic dependent launch on).
#include <algorithm>
#include <cstring>
#include <cstdio>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/nccl.h"
#include "backends/cuda/ops.h"
#include "backends/cuda/peer_sum.h"
#include "core/check.h"
#include "model/rank_workers.h"
#include "tools/args.h"
#include "tools/commands.h"
#include "tools/sysinfo.h"

namespace qinfer {

namespace {

using json = nlohmann::json;

struct Message {
    std::string what;
    size_t count;
    bool f32;
};

// Microseconds a call of `call` takes on stream s: issued eagerly (first) and replayed in a CUDA graph of reps calls.
std::pair<double, double> time_calls(const std::function<void()> & call, cudaStream_t s, int reps) {
    for (int i = 0; i < 20; i++) call();  // warm-up
    CUDA_CHECK(cudaStreamSynchronize(s));
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    CUDA_CHECK(cudaEventRecord(e0, s));
    for (int i = 0; i < reps; i++) call();
    CUDA_CHECK(cudaEventRecord(e1, s));
    CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    const double eager = ms * 1e3 / reps;
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < reps; i++) call();
    CUDA_CHECK(cudaStreamEndCapture(s, &g));
    CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
    CUDA_CHECK(cudaGraphLaunch(ge, s));  // warm-up
    CUDA_CHECK(cudaStreamSynchronize(s));
    CUDA_CHECK(cudaEventRecord(e0, s));
    CUDA_CHECK(cudaGraphLaunch(ge, s));
    CUDA_CHECK(cudaEventRecord(e1, s));
    CUDA_CHECK(cudaEventSynchronize(e1));
    CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    CUDA_CHECK(cudaGraphExecDestroy(ge));
    CUDA_CHECK(cudaGraphDestroy(g));
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return {eager, ms * 1e3 / reps};
}

}  // namespace

int cmd_bench_allreduce(int argc, char ** argv) {
    for (int i = 2; i < argc; i++) {
        if (!std::strcmp(argv[i], "--help")) {
            std::printf("usage: qinfer bench --allreduce [--tp 2] [--hidden 3584,8192] [--rows 1,8,256] [--reps 200] [--json FILE]\n"
                        "the time of one NCCL all-reduce over --tp GPUs for each model width x rows, fp32 (decode) and bf16\n"
                        "(prefill): eager, inside a CUDA graph (plain and over a symmetric window), and the eager time as\n"
                        "all_reduce_perf's algbw / busbw; beside them, for fp32 messages of up to 4 rows, the engine's own sum\n"
                        "over peer memory in a CUDA graph (what --tp decode steps use)\n");
            return 0;
        }
    }
    Args a(argc, argv, 2, {"allreduce"});
    a.flag("allreduce");
    const int tp = int(a.integer("tp", 2));
    const std::vector<int> hiddens = a.has("hidden") ? a.int_list("hidden") : std::vector<int>{3584, 8192};
    const std::vector<int> rows = a.has("rows") ? a.int_list("rows") : std::vector<int>{1, 8, 256};
    const int reps = (int(a.integer("reps", 200)) + 1) / 2 * 2;  // even: the peer sums' buffers alternate
    const std::string json_path = a.str("json");
    a.check_unused();
    int devices = 0;
    CUDA_CHECK(cudaGetDeviceCount(&devices));
    if (tp < 2 || tp > devices) QINFER_FAIL() << "--tp " << tp << ": needs 2.." << devices << " GPUs (" << devices << " present)";
    if (reps < 1) QINFER_FAIL() << "--reps must be at least 1";
    std::vector<ncclComm_t> comms = cuda::nccl_local_comms(tp);
    std::vector<Message> msgs;
    for (int h : hiddens) {
        for (int m : rows) {
            if (h < 1 || m < 1) QINFER_FAIL() << "--hidden and --rows take positive sizes";
            for (bool f32 : {true, false}) msgs.push_back({std::to_string(m) + " x " + std::to_string(h), size_t(h) * size_t(m), f32});
        }
    }
    size_t max_bytes = 0;
    for (const Message & m : msgs) max_bytes = std::max(max_bytes, m.count * (m.f32 ? 4 : 2));
    RankWorkers workers(tp, 1);
    std::vector<cudaStream_t> streams(static_cast<size_t>(tp));
    std::vector<void *> bufs(static_cast<size_t>(tp)), wbufs(static_cast<size_t>(tp));
    std::vector<ncclWindow_t> wins(static_cast<size_t>(tp));
    const size_t wbytes = (max_bytes + NCCL_WIN_REQUIRED_ALIGNMENT - 1) / NCCL_WIN_REQUIRED_ALIGNMENT * NCCL_WIN_REQUIRED_ALIGNMENT;
    auto on_ranks = [&](const std::function<void(size_t)> & fn) {
        workers.run_all([&](size_t r) {
            CUDA_CHECK(cudaSetDevice(int(r)));
            fn(r);
        }, [] {});
    };
    on_ranks([&](size_t r) {
        CUDA_CHECK(cudaStreamCreateWithFlags(&streams[r], cudaStreamNonBlocking));
        CUDA_CHECK(cudaMalloc(&bufs[r], max_bytes));
        CUDA_CHECK(cudaMemset(bufs[r], 0, max_bytes));
        NCCL_CHECK(ncclMemAlloc(&wbufs[r], wbytes));
        NCCL_CHECK(ncclCommWindowRegister(comms[r], wbufs[r], wbytes, &wins[r], NCCL_WIN_COLL_SYMMETRIC));
        CUDA_CHECK(cudaMemset(wbufs[r], 0, wbytes));
    });
    const bool windows = std::all_of(wins.begin(), wins.end(), [](ncclWindow_t w) { return w != nullptr; });
    // The peer sums' buffers, sized for the largest fp32 message of at most k_peer_rows rows.
    constexpr int k_peer_rows = 4;
    size_t peer_capacity = 0;
    for (const Message & m : msgs) {
        if (m.f32 && m.count <= size_t(k_peer_rows) * size_t(*std::max_element(hiddens.begin(), hiddens.end()))) peer_capacity = std::max(peer_capacity, m.count);
    }
    std::vector<std::unique_ptr<cuda::PeerBuffers>> peer_bufs(static_cast<size_t>(tp));
    std::vector<cuda::PeerRanks> peer_views;
    const bool peers = peer_capacity > 0 && tp <= cuda::k_peer_max_ranks && cuda::enable_peer_access(tp);
    if (peers) {
        cuda::set_pdl_default(true);  // as the engine launches its kernels (NCCL's calls are not affected)
        on_ranks([&](size_t r) { peer_bufs[r] = std::make_unique<cuda::PeerBuffers>(peer_capacity); });
        peer_views = cuda::link_peer_ranks(peer_bufs);
    }
    if (!windows) std::printf("(NCCL left the symmetric windows unregistered: no symmetric kernels between these GPUs)\n");
    const SystemInfo sys = system_info(true);
    std::printf("all-reduce over %d x %s (NCCL %d.%d.%d, NVLS off), %d calls a figure\n\n", tp, sys.card.c_str(), NCCL_MAJOR, NCCL_MINOR,
                NCCL_PATCH, reps);
    std::printf("| message | dtype | bytes | eager us | in graph us | window, in graph us | peer sum, in graph us | algbw GB/s | busbw GB/s |\n"
                "|---|---|---:|---:|---:|---:|---:|---:|---:|\n");
    json out = json::array();
    for (const Message & m : msgs) {
        const ncclDataType_t type = m.f32 ? ncclFloat32 : ncclBfloat16;
        std::vector<double> eager(static_cast<size_t>(tp)), graphed(static_cast<size_t>(tp)), windowed(static_cast<size_t>(tp)),
            peered(static_cast<size_t>(tp));
        const bool peer_row = peers && m.f32 && m.count <= peer_capacity;
        on_ranks([&](size_t r) {
            cudaStream_t s = streams[r];
            std::tie(eager[r], graphed[r]) =
                time_calls([&] { NCCL_CHECK(ncclAllReduce(bufs[r], bufs[r], m.count, type, ncclSum, comms[r], s)); }, s, reps);
            if (windows) {
                windowed[r] = time_calls([&] { NCCL_CHECK(ncclAllReduce(wbufs[r], wbufs[r], m.count, type, ncclSum, comms[r], s)); }, s, reps).second;
            }
            if (peer_row) {
                // The two buffers alternate call by call (reps is even: each graph starts with buffer 0).
                int which = 0;
                peered[r] = time_calls([&] {
                    cuda::peer_add_partials(static_cast<float *>(bufs[r]), peer_views[r], which, m.count, s);
                    which ^= 1;
                }, s, reps).second;
            }
        });
        const size_t bytes = m.count * (m.f32 ? 4 : 2);
        const double us = *std::max_element(eager.begin(), eager.end()), gus = *std::max_element(graphed.begin(), graphed.end());
        const double wus = *std::max_element(windowed.begin(), windowed.end());
        const double algbw = bytes / (us * 1e-6) / 1e9, busbw = algbw * 2.0 * (tp - 1) / tp;
        const double pus = *std::max_element(peered.begin(), peered.end());
        char wtext[32] = "-", ptext[32] = "-";
        if (windows) std::snprintf(wtext, sizeof wtext, "%.1f", wus);
        if (peer_row) std::snprintf(ptext, sizeof ptext, "%.1f", pus);
        std::printf("| %s | %s | %zu | %.1f | %.1f | %s | %s | %.2f | %.2f |\n", m.what.c_str(), m.f32 ? "fp32" : "bf16", bytes, us, gus, wtext,
                    ptext, algbw, busbw);
        json row = {{"message", m.what}, {"dtype", m.f32 ? "fp32" : "bf16"}, {"bytes", bytes}, {"eager_us", us}, {"graph_us", gus},
                    {"algbw_gbs", algbw}, {"busbw_gbs", busbw}};
        if (windows) row["window_graph_us"] = wus;
        if (peer_row) row["peer_sum_graph_us"] = pus;
        out.push_back(row);
    }
    on_ranks([&](size_t r) {
        peer_bufs[r].reset();
        cudaFree(bufs[r]);
        if (wins[r]) ncclCommWindowDeregister(comms[r], wins[r]);
        ncclMemFree(wbufs[r]);
        cudaStreamDestroy(streams[r]);
    });
    for (ncclComm_t c : comms) ncclCommDestroy(c);
    write_json_output(json_path, json{{"card", sys.card}, {"gpus", tp}, {"commit", git_commit()}, {"reps", reps}, {"rows", out}});
    return 0;
}

}  // namespace qinfer
