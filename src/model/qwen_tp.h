// Tensor parallel on the CPU: one model split over `tp` ranks as model/tp_plan.h plans it (whole GQA groups of heads,
// intermediate columns, vocabulary rows), each rank a CpuQwenEngine over its slices, run in threads of one process
// that meet in an in-process all-reduce after o_proj and down_proj (and gather the logits). It is the specification
// of the GPUs' tensor parallel: its logits equal the whole model's within fp32 rounding (tests/model/test_tp_cpu.cpp).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "model/tp_plan.h"
#include "model/weights.h"
#include "runtime/engine.h"

namespace qinfer {

// The copies a shard's weights point into (column slices, act-order gathers). A column slice is copied once per source
// tensor and range (cols_memo), so that tensors several layers share (--load-format dummy's random weights) are
// copied once and the shard's layers then share them too. Copies keep their address as more are added.
struct ShardBuffers {
    using Key = std::tuple<const void *, int64_t, int64_t, int64_t, int64_t>;  // data, rows, row bytes, first byte, bytes
    std::vector<std::unique_ptr<uint8_t[]>> copies;
    std::map<Key, const uint8_t *> cols_memo;
    // A new copy's memory: zeroed, or left as it is for one that is written whole.
    uint8_t * zeroed(size_t bytes) { return copies.emplace_back(std::make_unique<uint8_t[]>(bytes)).get(); }
    uint8_t * uninitialized(size_t bytes) { return copies.emplace_back(std::make_unique_for_overwrite<uint8_t[]>(bytes)).get(); }
};

// A rank's model: its config (heads and intermediate sizes of the shard; the vocabulary stays whole) and its slices
// of `full`'s weights: row slices are views into the full model's mapped checkpoint, column slices (o_proj's and
// down_proj's inputs) copies kept in `owned`. The full model must outlive it. Quantized projections are split in
// their stored packing (GPTQ 4/8-bit with or without act-order, AWQ GEMM); other formats get a one-line error. An
// act-order down_proj is split by whole quantization groups (a rank's intermediate channels are then those of its
// groups, gate/up's rows with them), so that its slice is an ordinary grouped matrix. The
// intermediate dimensions (dense, expert, shared expert) are cut on multiples of `inter_align` (tp_inter_align).
std::unique_ptr<Model> shard_model(const Model & full, const TpShard & shard, int tp, ShardBuffers & owned,
                                   int inter_align = 1);

// A rank's config as shard_model makes it: its heads and intermediate sizes (the vocabulary stays whole).
ModelConfig shard_config(const ModelConfig & c, const TpShard & shard, int tp, int inter_align);

// The multiple the intermediate dimensions of `full` are cut on: its quantization groups along down_proj's input
// (whole words of codes where there are no groups), and at least `least` (a backend's own need: 1 for the CPU,
// k_tp_gpu_inter_align for the GPUs). tp_quant_align: that multiple for one down_proj scheme (1 when dense).
constexpr int k_tp_gpu_inter_align = 16;  // the GPUs' bf16 kernels: 16-wide blocks of the intermediate dimension
int tp_inter_align(const Model & full, int least);
int tp_quant_align(const QuantScheme & down);

std::unique_ptr<Engine> make_cpu_tp_engine(const std::string & model_dir, const EngineOptions & opt);

}  // namespace qinfer
