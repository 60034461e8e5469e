// A timeline of the kernels the GPU runs, kernels inside CUDA graphs included, recorded by CUPTI's activity API
// (CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, which keeps kernels overlapping as they do under programmatic dependent
// launch) for `qinfer bench --trace FILE.csv`. CUPTI is opened with dlopen only when a trace is asked for, so the
// binary does not need it otherwise.
#pragma once

#include <string>

namespace qinfer::cuda {

// Starts recording; false with `why` set where this build or machine has no CUPTI.
bool kernel_trace_start(std::string & why);
// Stops recording and writes one CSV row per kernel, in start order: start_ns,end_ns,graph_id,graph_node_id,stream,
// grid,block,name (name demangled, quoted). Returns the number of kernels written.
size_t kernel_trace_write(const std::string & path);
// Drops what was recorded so far and goes on recording (a warm-up left out of the trace).
void kernel_trace_discard();

}  // namespace qinfer::cuda
