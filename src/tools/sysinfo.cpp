#include "tools/sysinfo.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <fstream>
#include <vector>

#include "core/parallel.h"

#ifndef QINFER_SOURCE_DIR
#define QINFER_SOURCE_DIR "."
#endif

namespace qinfer {

#ifdef QINFER_CUDA
void cuda_system_info(SystemInfo * info);
#endif

double measure_host_bandwidth() {
    // 1 GiB, far past any last-level cache; 64-bit XOR in 8 independent lanes costs the cores next to nothing.
    const size_t n = (size_t(1) << 30) / sizeof(uint64_t);
    std::vector<uint64_t> buf(n);
    parallel_for(int64_t(n), [&](int64_t i) { buf[size_t(i)] = uint64_t(i) * 0x9e3779b97f4a7c15ull; });
    double best = 0;
    uint64_t sink = 0;
    for (int pass = 0; pass < 5; pass++) {
        auto t0 = std::chrono::steady_clock::now();
        uint64_t total = 0;
#pragma omp parallel for reduction(^ : total) schedule(static)
        for (int64_t b = 0; b < int64_t(n / 8); b++) {
            const uint64_t * p = buf.data() + b * 8;
            total ^= p[0] ^ p[1] ^ p[2] ^ p[3] ^ p[4] ^ p[5] ^ p[6] ^ p[7];
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
    if (const char * env = std::getenv("QINFER_COMMIT"); env && *env) return env;
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
