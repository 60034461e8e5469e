// The subcommands of the `qinfer` binary.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>

#include "io/model_config.h"
#include "runtime/sampler.h"
#include "tools/args.h"

namespace qinfer {

int cmd_synth(int argc, char ** argv);
int cmd_run(int argc, char ** argv);
int cmd_logits(int argc, char ** argv);
int cmd_info(int argc, char ** argv);
int cmd_dequant(int argc, char ** argv);
int cmd_kv_fidelity(int argc, char ** argv);
int cmd_plan(int argc, char ** argv);
int cmd_bench(int argc, char ** argv);
int cmd_bench_throughput(int argc, char ** argv);  // bench --throughput (cmd_throughput.cpp)
int cmd_bench_serve(int argc, char ** argv);       // bench --serve URL (cmd_loadgen.cpp)
int cmd_bench_kernels(int argc, char ** argv);     // bench --kernels (cmd_kernels.cpp)
int cmd_bench_bandwidth(int argc, char ** argv);   // bench --bandwidth (cmd_bandwidth.cpp)
int cmd_bench_allreduce(int argc, char ** argv);   // bench --allreduce (cmd_allreduce.cpp; CUDA with NCCL)
// A `bench --NAME` mode that times GPU kernels (--kernels, --bandwidth): --help prints `usage`; otherwise the options
// (NAME among them as a flag) go to `run`, after a one-line error where this qinfer has no CUDA backend or the machine
// no GPU. `run` is null in builds without CUDA.
int gpu_bench_mode(int argc, char ** argv, const char * name, const char * usage, int (*run)(const Args &));
// Output files are opened once before any work, so that an unwritable path fails at once, not after the benchmark.
void check_writable(const char * flag, const std::string & path);
// j to `path` (indented one space), where path is not empty: the --json of the bench modes that write one document
// (--kernels, --bandwidth, --allreduce).
void write_json_output(const std::string & path, const nlohmann::json & j);
// bench --trace FILE.csv: CUPTI's record of every kernel (backends/cuda/kernel_trace.h), kept from start to write.
void start_kernel_trace();
void discard_kernel_trace();
size_t write_kernel_trace(const std::string & path);
int cmd_plot(int argc, char ** argv);
int cmd_memory_table(int argc, char ** argv);
int cmd_tokenize(int argc, char ** argv);
int cmd_detokenize(int argc, char ** argv);
int cmd_chat(int argc, char ** argv);
int cmd_serve(int argc, char ** argv);

// Sampling flags (--greedy, --temperature, --top-k, --top-p, --min-p, --repetition-penalty, --presence-penalty,
// --frequency-penalty, --seed) over the checkpoint's generation_config.json defaults.
SamplingParams sampling_from_args(const Args & a, const GenerationConfig & gc);

}  // namespace qinfer
