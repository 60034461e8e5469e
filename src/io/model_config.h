// config.json and generation_config.json of a Hugging Face checkpoint folder.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "io/quant_config.h"

namespace qinfer {

enum class Arch { Qwen2, Qwen3, Qwen2Moe, Qwen3Moe, Llama };
const char * arch_model_type(Arch a);  // "qwen2", ...

enum class RopeType { Default, Linear, Dynamic, Yarn, Llama3 };
const char * rope_type_name(RopeType t);

struct RopeScaling {
    RopeType type = RopeType::Default;
    double factor = 1.0;
    int original_max_position_embeddings = 0;  // 0: not given
    // YaRN
    double attention_factor = 0.0;  // 0: not given (derived from factor)
    double beta_fast = 32.0;
    double beta_slow = 1.0;
    double mscale = 0.0;          // 0: not given
    double mscale_all_dim = 0.0;  // 0: not given
    bool truncate = true;
    // llama3
    double low_freq_factor = 1.0;
    double high_freq_factor = 4.0;
};

struct ModelConfig {
    Arch arch = Arch::Qwen2;
    int vocab_size = 0;
    int hidden_size = 0;
    int intermediate_size = 0;
    int num_hidden_layers = 0;
    int num_attention_heads = 0;
    int num_key_value_heads = 0;
    int head_dim = 0;
    int max_position_embeddings = 0;
    double rms_norm_eps = 1e-6;
    double rope_theta = 10000.0;
    RopeScaling rope_scaling;
    bool tie_word_embeddings = false;
    bool qkv_bias = false;     // q/k/v projections have biases (Qwen2)
    bool o_bias = false;       // o_proj has a bias (Llama/Qwen3 attention_bias=true)
    bool mlp_bias = false;     // Llama mlp_bias
    bool qk_norm = false;      // Qwen3 per-head RMSNorm of q and k
    DType torch_dtype = DType::BF16;

    // MoE (num_experts == 0 for dense models)
    int num_experts = 0;
    int num_experts_per_tok = 0;
    int moe_intermediate_size = 0;
    int shared_expert_intermediate_size = 0;  // 0: no shared expert
    bool norm_topk_prob = false;
    int decoder_sparse_step = 1;
    std::vector<int> mlp_only_layers;

    int bos_token_id = -1;
    std::vector<int> eos_token_ids;

    QuantConfig quant;  // unquantized unless the folder says otherwise

    bool is_moe_layer(int layer) const;
    // The longest context the model supports: max_position_embeddings, or the scaled original context when a rope
    // scaling extends it (Qwen2.5 adds YaRN factor 4 to a 32768 config for 131072 tokens).
    int max_context() const;
    int q_dim() const { return num_attention_heads * head_dim; }
    int kv_dim() const { return num_key_value_heads * head_dim; }
    // KV cache bytes per token of context at `elem_bytes` per element (both K and V, all layers).
    uint64_t kv_bytes_per_token(int elem_bytes) const;
};

// Parses and validates config.json text. `what` names the file in errors. Throws qinfer::Error on unknown
// model_type, missing or inconsistent keys, and features that are enabled but not supported (sliding window).
ModelConfig parse_model_config(const std::string & text, const std::string & what);
ModelConfig load_model_config(const std::string & dir);

struct GenerationConfig {
    bool do_sample = false;
    float temperature = 1.0f;
    int top_k = 50;  // transformers' default when the file does not say
    float top_p = 1.0f;
    float min_p = 0.0f;
    float repetition_penalty = 1.0f;
    std::vector<int> eos_token_ids;
    int pad_token_id = -1;
};

// generation_config.json when present, else defaults; eos ids fall back to config.json's.
GenerationConfig load_generation_config(const std::string & dir, const ModelConfig & config);
GenerationConfig parse_generation_config(const std::string & text, const std::string & what);

std::string read_text_file(const std::string & path);

}  // namespace qinfer
