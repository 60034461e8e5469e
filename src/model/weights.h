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

// The one linear-layer interface: y = x W^T + b. Quantized formats add their tensors here and are repacked at
// load time into the layout of their kernels; model code only ever calls linear().
enum class LinearFormat { Dense };

struct Linear {
    LinearFormat format = LinearFormat::Dense;
    int in_features = 0;
    int out_features = 0;
    Weight weight;  // bf16/fp16/fp32 [out_features, in_features]
    Weight bias;    // [out_features] or absent
};

struct AttentionWeights {
    Linear q_proj;  // [n_head * head_dim, hidden]
    Linear k_proj;  // [n_head_kv * head_dim, hidden]
    Linear v_proj;  // [n_head_kv * head_dim, hidden]
    Linear o_proj;  // [hidden, n_head * head_dim]
    Weight q_norm;  // [head_dim] (Qwen3)
    Weight k_norm;  // [head_dim] (Qwen3)
};

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
enum class WeightRole { Norm, Linear, Bias, Embedding, Router };
using WeightVisitor = std::function<void(const std::string & name, const std::vector<int64_t> & shape, WeightRole role,
                                         Weight & slot)>;
void visit_weights(const ModelConfig & c, ModelWeights & w, const WeightVisitor & visit);

// A loaded model: config, mapped checkpoint and typed weights. Checks every name, shape and dtype; reports
// missing and unexpected tensors by name.
struct Model {
    std::string dir;
    ModelConfig config;
    std::unique_ptr<Checkpoint> checkpoint;
    ModelWeights weights;
};
std::unique_ptr<Model> load_model(const std::string & dir);

// Bytes one decode step reads: every weight once (the embedding only for one row unless it is the tied lm_head).
uint64_t decode_weight_bytes(const Model & m);
uint64_t parameter_count(const ModelConfig & c);

}  // namespace qinfer
