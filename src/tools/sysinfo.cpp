#include "tools/sysinfo.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <fstream>
#include <vector>

#include "core/env.h"
#include "core/parallel.h"

#ifndef QINFER_SOURCE_DIR
#define QINFER_SOURCE_DIR "."
#endif

namespace qinfer {

#ifdef QINFER_CUDA
void cuda_system_info(SystemInfo * info);
#endif

double measure_host_bandwidth() {
    // 1 GiB, far past any last-level cache, read in 8 KB blocks, each XOR-ed into eight independent lanes that the
    // compiler turns into vector loads: the cores cost next to nothing. (One 64-bit XOR chain per thread read 34 GB/s
    // on a 2-thread EPYC where this reads 44-66 and the engine's own decode 41.5: bandwidth shares above 100%.)
    const size_t n = (size_t(1) << 30) / sizeof(uint64_t);
    constexpr int64_t block = 1024;  // uint64 values
    std::vector<uint64_t> buf(n);
    parallel_for(int64_t(n), [&](int64_t i) { buf[size_t(i)] = uint64_t(i) * 0x9e3779b97f4a7c15ull; });
    double best = 0;
    uint64_t sink = 0;
    for (int pass = 0; pass < 5; pass++) {
        auto t0 = std::chrono::steady_clock::now();
        uint64_t total = 0;
#pragma omp parallel for reduction(^ : total) schedule(static)
        for (int64_t b = 0; b < int64_t(n) / block; b++) {
            const uint64_t * p = buf.data() + b * block;
            uint64_t lanes[8] = {};
            for (int64_t i = 0; i < block; i += 8) {
#pragma omp simd
                for (int j = 0; j < 8; j++) lanes[j] ^= p[i + j];
            }
            for (uint64_t v : lanes) total ^= v;
        }
        double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        sink ^= total;
        best = std::max(best, double(n * sizeof(uint64_t)) / secs);
    }
    if (sink == 42) std::fprintf(stderr, " ");  // keeps the reads from being optimised away
    return best;
}

SystemInfo system_info(bool gpu) {
    SystemInfo s;
#ifdef QINFER_CUDA
    if (gpu) {
        cuda_system_info(&s);
        return s;
    }
#else
    (void)gpu;
#endif
    std::ifstream in("/proc/cpuinfo");
    std::string line;
    while (std::getline(in, line)) {
        if (line.rfind("model name", 0) == 0) {
            s.card = line.substr(line.find(':') + 2);
            break;
        }
    }
    if (s.card.empty()) s.card = "unknown CPU";
    s.card += " (" + std::to_string(max_threads()) + " threads)";
    s.software = "CPU backend";
    s.bandwidth = measure_host_bandwidth();
    s.bandwidth_source = "measured: parallel read of 1 GiB";
    return s;
}

std::string git_commit() {
    // Set by scripts/device.sh callers where the working tree travels without .git.
    if (const std::string env = read_env().commit; !env.empty()) return env;
    std::string cmd = std::string("git -C '") + QINFER_SOURCE_DIR + "' rev-parse --short=12 HEAD 2>/dev/null";
    FILE * p = popen(cmd.c_str(), "r");
    if (!p) return "unknown";
    char buf[64] = {};
    std::string out = fgets(buf, sizeof buf, p) ? buf : "";
    pclose(p);
    while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
    if (out.empty()) return "unknown";
    FILE * d = popen((std::string("git -C '") + QINFER_SOURCE_DIR + "' status --porcelain --untracked-files=no 2>/dev/null").c_str(), "r");
    if (d) {
        if (fgets(buf, sizeof buf, d)) out += "-dirty";
        pclose(d);
    }
    return out;
}

}  // namespace qinfer
