// qinfer plan: what fits a card, from qinfer's own memory model of the CUDA engine (weights as the engine stores them,
// the block-rounded KV cache, prefill workspaces), checked against measured peaks (tests/unit/test_plan.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include "io/model_config.h"
#include "runtime/kv_cache.h"

namespace qinfer {

struct MemoryEstimate {
    double weights = 0;    // bytes on the device: bf16 dense tensors, repacked quantized projections
    double kv = 0;         // KV cache for batch x context (rounded up to 16-token blocks)
    double workspace = 0;  // activations of one prefill chunk, decode scratch, dequantization buffer
    double total() const { return weights + kv + workspace; }
};

// The device memory of the CUDA engine for `batch` sequences of `context` tokens whose prompts are `prompt` tokens,
// with the weights of `c` (c.quant says how each projection is stored). embedding_on_gpu: as EngineOptions (an
// untied token embedding is otherwise in host memory).
MemoryEstimate estimate_cuda_memory(const ModelConfig & c, KVDType kv, int batch, int prompt, int context, bool embedding_on_gpu = false);

// The same for each GPU of a tensor-parallel run over `tp` GPUs (model/qwen_cuda_tp.cpp): each rank's shard of the heads
// and intermediate columns (model/qwen_tp.h shard_config), lm_head whole on every rank, an act-order GPTQ o_proj whole.
std::vector<MemoryEstimate> estimate_cuda_tp_memory(const ModelConfig & c, int tp, KVDType kv, int batch, int prompt, int context);

}  // namespace qinfer
