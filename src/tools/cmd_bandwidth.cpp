// qinfer bench --bandwidth: how fast one kernel reads a region of each size from the GPU's memory, by 16-byte loads
// (the GEMVs' way) and by bulk copies into shared memory (the decode attention's way, also in a paged KV cache's
// layout), so that the engine's kernels can be set against what the card does at their size, not only against the
// datasheet. Each region is read from a different place of a buffer of at least 4 GB in turn, so no read finds its
// bytes in L2; each launch is timed alone (events around it, no programmatic dependent launch), the mean of --reps.
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/check.h"
#include "tools/args.h"
#include "tools/commands.h"
#include "tools/plot.h"
#include "tools/sysinfo.h"

#ifdef QINFER_CUDA
#include <cuda_runtime.h>

#include "backends/cuda/allocator.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/ops.h"
#endif

namespace qinfer {

#ifdef QINFER_CUDA
namespace {

using json = nlohmann::json;

struct NamedProbe {
    std::string name;
    cuda::BandwidthProbe probe;
};

// Loads at 2 / 4 / 8 blocks an SM; copies of 2 KB (a KV page's 16 rows of one head, head_dim 128, int8) in stages of
// 16 KB at 1 / 2 / 4 blocks an SM, of 8 and 32 KB at 2, and the 2 KB copies in pages of 4 and 16 heads (Qwen2.5-7B's
// and Qwen1.5-MoE-A2.7B's KV heads).
std::vector<NamedProbe> probes(int sms) {
    std::vector<NamedProbe> v;
    for (int per_sm : {2, 4, 8}) {
        cuda::BandwidthProbe p;
        p.blocks = per_sm * sms;
        p.unroll = 8;
        v.push_back({"loads 8x16 B, " + std::to_string(per_sm) + "/SM", p});
    }
    auto copies = [&](int chunk, int per_stage, int stages, int per_sm, int heads) {
        cuda::BandwidthProbe p;
        p.copies = true;
        p.chunk = chunk;
        p.per_stage = per_stage;
        p.stages = stages;
        p.heads = heads;
        p.splits = std::max(1, per_sm * sms / heads);
        char name[96];
        std::snprintf(name, sizeof name, "copies %d KB, %d x %d KB stages, %d/SM%s", chunk / 1024, stages, chunk * per_stage / 1024, per_sm,
                      heads > 1 ? (", " + std::to_string(heads) + " heads").c_str() : "");
        v.push_back({name, p});
    };
    copies(2048, 8, 12, 1, 1);
    copies(2048, 8, 6, 2, 1);
    copies(2048, 8, 3, 4, 1);
    copies(8192, 2, 6, 2, 1);
    copies(32768, 1, 3, 2, 1);
    copies(2048, 8, 6, 2, 4);
    copies(2048, 8, 6, 2, 16);
    return v;
}

int run_bandwidth(const Args & a) {
    const std::vector<int> sizes_mb = a.has("sizes-mb") ? a.int_list("sizes-mb") : std::vector<int>{8, 34, 70, 132, 272, 622};
    const int reps = int(a.integer("reps", 20));
    const std::string json_path = a.str("json"), plot_path = a.str("plot");
    a.check_unused();
    if (reps < 1) QINFER_FAIL() << "--reps must be >= 1";
    if (!plot_path.empty() && !plot_available()) QINFER_FAIL() << "--plot: this qinfer was built without libgd (apt-get install libgd-dev, rebuild)";
    check_writable("json", json_path);
    check_writable("plot", plot_path);
    int largest = 0;
    for (int s : sizes_mb) {
        if (s < 1 || s > 16384) QINFER_FAIL() << "--sizes-mb entries must be in 1..16384, got " << s;
        largest = std::max(largest, s);
    }
    const SystemInfo sys = system_info(true);
    const int64_t buffer_bytes = std::max<int64_t>(int64_t(4) << 30, 2 * (int64_t(largest) << 20));
    cuda::DeviceBuffer buffer(size_t(buffer_bytes), "bench");
    CUDA_CHECK(cudaMemset(buffer.get(), 0x5a, size_t(buffer_bytes)));
    const int sms = cuda::sm_count();
    const std::vector<NamedProbe> list = probes(sms);
    int most_blocks = 0;
    for (const auto & p : list) most_blocks = std::max(most_blocks, cuda::probe_grid(p.probe));
    cuda::DeviceBuffer out(size_t(most_blocks) * 4, "bench");
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    json rows = json::array();
    std::printf("card: %s (%d SMs), commit %s; each launch timed alone, mean of %d over regions of a %.1f GB buffer\n\n", sys.card.c_str(), sms,
                git_commit().c_str(), reps, double(buffer_bytes) / 1e9);
    std::printf("| probe | grid | MB | us | TB/s |\n|---|---|---|---|---|\n");
    for (const NamedProbe & np : list) {
        if (!cuda::probe_runs_here(np.probe)) {
            std::printf("| %s | - | - | - | (needs sm_90a) |\n", np.name.c_str());
            continue;
        }
        for (int mb : sizes_mb) {
            const int64_t region = int64_t(mb) << 20;
            const int64_t bytes = cuda::probe_bytes(np.probe, region);
            if (bytes <= 0) continue;
            const int64_t slots = buffer_bytes / region;  // regions read in turn
            double total_ms = 0;
            for (int r = -2; r < reps; r++) {  // two untimed
                const char * at = static_cast<const char *>(buffer.get()) + ((r + 2) % slots) * region;
                CUDA_CHECK(cudaEventRecord(e0));
                cuda::bandwidth_probe(np.probe, at, region, static_cast<uint32_t *>(out.get()), nullptr);
                CUDA_CHECK(cudaEventRecord(e1));
                CUDA_CHECK(cudaEventSynchronize(e1));
                float ms = 0;
                CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
                if (r >= 0) total_ms += ms;
            }
            const double us = 1e3 * total_ms / reps, tbs = double(bytes) / (us * 1e-6) / 1e12;
            std::printf("| %s | %d | %.1f | %.1f | %.2f |\n", np.name.c_str(), cuda::probe_grid(np.probe), double(bytes) / 1e6, us, tbs);
            std::fflush(stdout);
            rows.push_back({{"probe", np.name}, {"grid", cuda::probe_grid(np.probe)}, {"bytes", bytes}, {"us", us}, {"tb_per_s", tbs}});
        }
    }
    CUDA_CHECK(cudaEventDestroy(e0));
    CUDA_CHECK(cudaEventDestroy(e1));
    write_json_output(json_path, json{{"card", sys.card}, {"commit", git_commit()}, {"sms", sms}, {"reps", reps}, {"rows", rows}});
    if (!plot_path.empty()) {
        PlotOptions opt;
        opt.x = "mb";
        opt.y = "tb_per_s";
        opt.title = sys.card + ": one kernel reading a region of each size (bench --bandwidth, " + git_commit() + ")";
        plot_rows(rows, opt, plot_path);
        std::fprintf(stderr, "bench --bandwidth: plot %s\n", plot_path.c_str());
    }
    return 0;
}

}  // namespace
#endif

int cmd_bench_bandwidth(int argc, char ** argv) {
#ifdef QINFER_CUDA
    int (*run)(const Args &) = run_bandwidth;
#else
    int (*run)(const Args &) = nullptr;
#endif
    return gpu_bench_mode(argc, argv, "bandwidth",
                          "usage: qinfer bench --bandwidth [--sizes-mb 8,34,70,132,272,622] [--reps 20] [--json FILE] [--plot FILE.png]\n"
                          "How fast one kernel reads a region of each size from GPU memory: 16-byte loads at 2 / 4 / 8 blocks\n"
                          "an SM, and bulk copies into shared memory (sm_90a), also in a paged KV cache's layout. GPU only.\n",
                          run);
}

}  // namespace qinfer
