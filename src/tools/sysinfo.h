// Facts about the machine a benchmark ran on.
#pragma once

#include <string>

namespace qinfer {

struct SystemInfo {
    std::string card;      // GPU name, or the CPU model
    std::string driver;    // GPU driver version ("" on the CPU)
    std::string cuda;      // CUDA runtime version ("" on the CPU)
    std::string software;  // one line for tables
    double bandwidth = 0;  // bytes/s the bench measured (CPU: a parallel read; GPU: a device copy)
    std::string bandwidth_source;
};

SystemInfo system_info(bool gpu);
// Measured read bandwidth of host memory with all threads, in bytes/s (best of five passes over 1 GiB).
double measure_host_bandwidth();
std::string git_commit();

}  // namespace qinfer
