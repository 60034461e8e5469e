// Typed weight structs that mirror the checkpoint's tensor names (model.layers.{i}.self_attn.q_proj.weight ...).
// Tensors stay in the checkpoint's dtype, viewed in place in the mmapped files.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "io/model_config.h"
#include "io/safetensors.h"

namespace qinfer {

// A view of one checkpoint tensor.
struct Weight {
    const void * data = nullptr;  // nullptr: absent (optional tensors)
    DType dtype = DType::F32;
    std::vector<int64_t> shape;
    std::string name;
    bool present() const { return data != nullptr; }
    int64_t numel() const;
    size_t nbytes() const { return size_t(numel()) * dtype_size(dtype); }
};

struct RepackedQuant;  // model/quant_repack.h

// The one linear-layer interface: y = x W^T + b. A quantized linear carries its format's tensors as stored
// (FORMATS.md sections 3-6); each backend repacks them at load time into the layout of its kernels, and model code
// only ever calls linear(). K = in_features, N = out_features, G = groups = ceil(K / group size).
struct Linear {
    int in_features = 0;
    int out_features = 0;
    QuantScheme scheme;  // method None: dense
    Weight weight;       // dense: bf16/fp16/fp32 [N, K]; bitsandbytes: uint8 codes [ceil(N K / 2), 1]
    Weight bias;         // [N] or absent
    // GPTQ (v1/v2) and AWQ
    Weight qweight;  // int32: GPTQ [K bits / 32, N] packed along K; AWQ [K, N / 8] packed along N
    Weight qzeros;   // int32: GPTQ [G, N bits / 32]; AWQ [G, N / 8]
    Weight scales;   // fp16 [G, N]
    Weight g_idx;    // int32 [K] group of each input channel (GPTQ; absent: k / group size)
    // bitsandbytes 4-bit
    Weight absmax;            // fp32 [blocks] (uint8 with double quantization)
    Weight quant_map;         // fp32 [16]: the code table
    Weight nested_absmax;     // fp32 [ceil(blocks / 256)] (double quantization)
    Weight nested_quant_map;  // fp32 [256] (double quantization)
    Weight quant_state;       // uint8 JSON: blocksize, shape, nested_offset, ...
    float nested_offset = 0;  // from quant_state
    // The CPU reference's row-major repack (set by the CPU engine at load time when the format allows).
    std::shared_ptr<const RepackedQuant> cpu_rows;
    bool quantized() const { return scheme.quantized(); }
};

struct AttentionWeights {
    Linear q_proj;  // [n_head * head_dim, hidden]
    Linear k_proj;  // [n_head_kv * head_dim, hidden]
    Linear v_proj;  // [n_head_kv * head_dim, hidden]
    Linear o_proj;  // [hidden, n_head * head_dim]
    Weight q_norm;  // [head_dim] (Qwen3)
    Weight k_norm;  // [head_dim] (Qwen3)
    // fp8 KV-cache scales stored by vLLM / llm-compressor exports, optional fp32 scalars (x = e4m3 * scale); older
    // checkpoints store one kv_scale for both.
    Weight k_scale, v_scale, kv_scale;
};

// A layer's checkpoint fp8 scale for K (value false) or V, 0 when the checkpoint has none.
float checkpoint_kv_scale(const AttentionWeights & a, bool value);

struct MlpWeights {
    Linear gate_proj;  // [intermediate, hidden]
    Linear up_proj;    // [intermediate, hidden]
    Linear down_proj;  // [hidden, intermediate]
};

struct MoeWeights {
    Weight gate;                      // router [n_experts, hidden]
    std::vector<MlpWeights> experts;  // moe_intermediate_size each
    bool has_shared_expert = false;
    MlpWeights shared_expert;         // shared_expert_intermediate_size
    Weight shared_expert_gate;        // [1, hidden]
};

struct LayerWeights {
    Weight input_layernorm;           // [hidden]
    AttentionWeights self_attn;
    Weight post_attention_layernorm;  // [hidden]
    bool is_moe = false;
    MlpWeights mlp;  // dense layers
    MoeWeights moe;  // sparse layers
};

struct ModelWeights {
    Weight embed_tokens;  // [vocab, hidden]
    std::vector<LayerWeights> layers;
    Weight norm;     // [hidden]
    Weight lm_head;  // [vocab, hidden]; the embedding table when tied
};

// Every tensor a checkpoint of this config holds, in checkpoint order, with its slot in `w`. The loader and
// `qinfer synth` both walk this one list, so they cannot disagree about names or shapes.
enum class WeightRole {
    Norm, Linear, Bias, Embedding, Router,
    QWeight, QZeros, QScales, QGIdx,                                                        // GPTQ / AWQ
    KvScale,                                                                                // optional fp8 KV scales
    BnbCodes, BnbAbsmax, BnbQuantMap, BnbNestedAbsmax, BnbNestedQuantMap, BnbQuantState,  // bitsandbytes
};
using WeightVisitor = std::function<void(const std::string & name, const std::vector<int64_t> & shape, WeightRole role,
                                         Weight & slot)>;
void visit_weights(const ModelConfig & c, ModelWeights & w, const WeightVisitor & visit);

// Every projection of the model (q/k/v/o, and gate/up/down of dense, expert and shared-expert MLPs).
void for_each_linear(ModelWeights & w, const std::function<void(Linear &)> & f);

// Shapes: -1 in a visited shape means any length (bitsandbytes' JSON quant_state).

// A loaded model: config, mapped checkpoint and typed weights. Checks every name, shape and dtype; reports
// missing and unexpected tensors by name.
struct Model {
    std::string dir;
    ModelConfig config;
    std::unique_ptr<Checkpoint> checkpoint;  // null for dummy weights
    std::shared_ptr<const void> dummy;       // the dummy weights' memory (model/random_weights.h)
    ModelWeights weights;
};
struct LoadOptions {
    // > 0: the model may run up to that many tokens beyond config.json's max_position_embeddings (models with plain
    // RoPE only; transformers does not stop there either: the seeds' Qwen1.5-MoE-A2.7B rows go to 30720 on a model
    // of 8192 positions).
    int past_context = 0;
    // vLLM's --load-format dummy: random weights from config.json alone; the folder's weight files are not read (it
    // needs none). For benchmarks of models larger than the disk.
    bool dummy = false;
};
std::unique_ptr<Model> load_model(const std::string & dir, const LoadOptions & opt = {});

// Bytes of every tensor the model holds (its checkpoint's tensor bytes, or the dummy weights' as if stored).
uint64_t stored_bytes(const Model & m);
// Bytes one decode step reads: every weight once (the embedding only for one row unless it is the tied lm_head).
uint64_t decode_weight_bytes(const Model & m);
uint64_t parameter_count(const ModelConfig & c);

}  // namespace qinfer
