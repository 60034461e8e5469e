#include "io/model_config.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/check.h"
#include "io/json_reader.h"

namespace qinfer {

using json = nlohmann::json;
namespace fs = std::filesystem;

const char * arch_model_type(Arch a) {
    switch (a) {
    case Arch::Qwen2: return "qwen2";
    case Arch::Qwen3: return "qwen3";
    case Arch::Qwen2Moe: return "qwen2_moe";
    case Arch::Qwen3Moe: return "qwen3_moe";
    case Arch::Llama: return "llama";
    }
    return "?";
}

const char * rope_type_name(RopeType t) {
    switch (t) {
    case RopeType::Default: return "default";
    case RopeType::Linear: return "linear";
    case RopeType::Dynamic: return "dynamic";
    case RopeType::Yarn: return "yarn";
    case RopeType::Llama3: return "llama3";
    }
    return "?";
}

bool ModelConfig::is_moe_layer(int layer) const {
    if (num_experts <= 0) return false;
    if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) != mlp_only_layers.end()) return false;
    return (layer + 1) % decoder_sparse_step == 0;
}

int ModelConfig::max_context() const {
    const RopeScaling & s = rope_scaling;
    if (s.type == RopeType::Default) return max_position_embeddings;
    int original = s.original_max_position_embeddings > 0 ? s.original_max_position_embeddings : max_position_embeddings;
    return std::max<int>(max_position_embeddings, int(std::min(double(1 << 30), s.factor * original)));
}

uint64_t ModelConfig::kv_bytes_per_token(int elem_bytes) const {
    return uint64_t(2) * num_hidden_layers * kv_dim() * elem_bytes;
}

std::string read_text_file(const std::string & path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) QINFER_FAIL() << path << ": cannot open";
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

namespace {


RopeScaling parse_rope_scaling(const json & r, const std::string & what) {
    RopeScaling s;
    if (!r.is_object()) QINFER_FAIL() << what << ": rope_scaling must be an object or null";
    JsonReader rd{r, what};
    std::string type = rd.get_str_or("rope_type", rd.get_str_or("type", "default"));
    if (type == "default") {
        s.type = RopeType::Default;
    } else if (type == "linear") {
        s.type = RopeType::Linear;
    } else if (type == "dynamic") {
        s.type = RopeType::Dynamic;
    } else if (type == "yarn") {
        s.type = RopeType::Yarn;
    } else if (type == "llama3") {
        s.type = RopeType::Llama3;
    } else {
        QINFER_FAIL() << what << ": rope scaling type '" << type << "' is not supported (default, linear, dynamic, yarn, llama3)";
    }
    s.factor = rd.get_num_or("factor", 1.0);
    if (s.type != RopeType::Default && !(s.factor >= 1.0 || s.type == RopeType::Linear) ) {
        QINFER_FAIL() << what << ": rope scaling factor must be >= 1, got " << s.factor;
    }
    if (!(s.factor > 0)) QINFER_FAIL() << what << ": rope scaling factor must be positive";
    s.original_max_position_embeddings = rd.get_int_or("original_max_position_embeddings", 0);
    s.attention_factor = rd.get_num_or("attention_factor", 0.0);
    s.beta_fast = rd.get_num_or("beta_fast", 32.0);
    s.beta_slow = rd.get_num_or("beta_slow", 1.0);
    s.mscale = rd.get_num_or("mscale", 0.0);
    s.mscale_all_dim = rd.get_num_or("mscale_all_dim", 0.0);
    s.truncate = rd.get_bool_or("truncate", true);
    s.low_freq_factor = rd.get_num_or("low_freq_factor", 1.0);
    s.high_freq_factor = rd.get_num_or("high_freq_factor", 4.0);
    if (s.type == RopeType::Llama3) {
        if (s.original_max_position_embeddings <= 0) QINFER_FAIL() << what << ": llama3 rope scaling needs original_max_position_embeddings";
        if (!(s.high_freq_factor > s.low_freq_factor)) QINFER_FAIL() << what << ": llama3 rope scaling needs high_freq_factor > low_freq_factor";
    }
    return s;
}

}  // namespace

ModelConfig parse_model_config(const std::string & text, const std::string & what) {
    json j = json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object()) QINFER_FAIL() << what << ": not a JSON object";
    JsonReader rd{j, what};
    ModelConfig c;
    std::string mt = rd.get_str_or("model_type", "");
    if (mt == "qwen2") {
        c.arch = Arch::Qwen2;
    } else if (mt == "qwen3") {
        c.arch = Arch::Qwen3;
    } else if (mt == "qwen2_moe") {
        c.arch = Arch::Qwen2Moe;
    } else if (mt == "qwen3_moe") {
        c.arch = Arch::Qwen3Moe;
    } else if (mt == "llama") {
        c.arch = Arch::Llama;
    } else if (mt.empty()) {
        QINFER_FAIL() << what << ": no model_type";
    } else {
        QINFER_FAIL() << what << ": unknown model_type '" << mt << "' (supported: qwen2, qwen3, qwen2_moe, qwen3_moe, llama)";
    }
    c.vocab_size = rd.get_int("vocab_size");
    c.hidden_size = rd.get_int("hidden_size");
    c.intermediate_size = rd.get_int_or("intermediate_size", 0);
    c.num_hidden_layers = rd.get_int("num_hidden_layers");
    c.num_attention_heads = rd.get_int("num_attention_heads");
    c.num_key_value_heads = rd.get_int_or("num_key_value_heads", c.num_attention_heads);
    if (c.vocab_size <= 0 || c.hidden_size <= 0 || c.num_hidden_layers <= 0 || c.num_attention_heads <= 0 ||
        c.num_key_value_heads <= 0) {
        QINFER_FAIL() << what << ": vocab_size, hidden_size, num_hidden_layers and head counts must be positive";
    }
    // Limits far above any published model, so a hostile config cannot ask for absurd allocations.
    if (c.vocab_size > (1 << 24) || c.hidden_size > (1 << 17) || c.intermediate_size > (1 << 20) || c.num_hidden_layers > 1024 ||
        c.num_attention_heads > 1024) {
        QINFER_FAIL() << what << ": sizes out of range (vocab " << c.vocab_size << ", hidden " << c.hidden_size << ", layers "
                      << c.num_hidden_layers << ", heads " << c.num_attention_heads << ")";
    }
    if (c.num_attention_heads % c.num_key_value_heads != 0) {
        QINFER_FAIL() << what << ": num_attention_heads " << c.num_attention_heads << " is not a multiple of num_key_value_heads "
                      << c.num_key_value_heads;
    }
    if (rd.has("head_dim")) {
        c.head_dim = rd.get_int("head_dim");
    } else {
        if (c.hidden_size % c.num_attention_heads != 0) {
            QINFER_FAIL() << what << ": hidden_size " << c.hidden_size << " is not a multiple of num_attention_heads and no head_dim is given";
        }
        c.head_dim = c.hidden_size / c.num_attention_heads;
    }
    if (c.head_dim <= 0 || c.head_dim % 2 != 0 || c.head_dim > 1024) {
        QINFER_FAIL() << what << ": head_dim must be even and in 2..1024, got " << c.head_dim;
    }
    c.max_position_embeddings = rd.get_int_or("max_position_embeddings", 32768);
    c.rms_norm_eps = rd.get_num_or("rms_norm_eps", 1e-6);
    std::string act = rd.get_str_or("hidden_act", "silu");
    if (act != "silu") QINFER_FAIL() << what << ": hidden_act '" << act << "' is not supported (silu)";
    if (rd.has("partial_rotary_factor") && rd.get_num_or("partial_rotary_factor", 1.0) != 1.0) {
        QINFER_FAIL() << what << ": partial_rotary_factor != 1 is not supported";
    }

    // RoPE: rope_theta + rope_scaling (hub configs) or rope_parameters (transformers 5).
    c.rope_theta = rd.get_num_or("rope_theta", 10000.0);
    if (rd.has("rope_parameters")) {
        const json & rp = j["rope_parameters"];
        if (!rp.is_object()) QINFER_FAIL() << what << ": rope_parameters must be an object";
        JsonReader rr{rp, what};
        c.rope_theta = rr.get_num_or("rope_theta", c.rope_theta);
        c.rope_scaling = parse_rope_scaling(rp, what);
    } else if (rd.has("rope_scaling")) {
        c.rope_scaling = parse_rope_scaling(j["rope_scaling"], what);
    }
    if (!(c.rope_theta > 0)) QINFER_FAIL() << what << ": rope_theta must be positive";

    c.tie_word_embeddings = rd.get_bool_or("tie_word_embeddings", false);
    switch (c.arch) {
    case Arch::Qwen2:
        c.qkv_bias = true;
        break;
    case Arch::Qwen2Moe:
        c.qkv_bias = rd.get_bool_or("qkv_bias", true);
        break;
    case Arch::Qwen3:
    case Arch::Qwen3Moe:
        c.qk_norm = true;
        c.qkv_bias = c.o_bias = rd.get_bool_or("attention_bias", false);
        break;
    case Arch::Llama:
        c.qkv_bias = c.o_bias = rd.get_bool_or("attention_bias", false);
        c.mlp_bias = rd.get_bool_or("mlp_bias", false);
        break;
    }

    // Sliding window: only Qwen2/Qwen3 define it, and only when use_sliding_window is true. Refuse it clearly.
    if (rd.get_bool_or("use_sliding_window", false)) {
        int max_window_layers = rd.get_int_or("max_window_layers", c.num_hidden_layers);
        if (max_window_layers < c.num_hidden_layers) {
            QINFER_FAIL() << what << ": use_sliding_window is true (sliding_window " << rd.get_int_or("sliding_window", 0)
                          << " from layer " << max_window_layers << "); sliding-window attention is not supported";
        }
    }
    if (rd.has("layer_types")) {
        if (!j["layer_types"].is_array()) QINFER_FAIL() << what << ": layer_types must be a list";
        for (const auto & t : j["layer_types"]) {
            if (!t.is_string() || t.get<std::string>() != "full_attention") {
                QINFER_FAIL() << what << ": layer_types asks for '" << t.dump() << "' attention; only full_attention is supported";
            }
        }
    }

    if (c.arch == Arch::Qwen2Moe || c.arch == Arch::Qwen3Moe) {
        c.num_experts = rd.get_int("num_experts");
        c.num_experts_per_tok = rd.get_int("num_experts_per_tok");
        c.moe_intermediate_size = rd.get_int("moe_intermediate_size");
        c.shared_expert_intermediate_size =
            c.arch == Arch::Qwen2Moe ? rd.get_int_or("shared_expert_intermediate_size", 0) : 0;
        c.norm_topk_prob = rd.get_bool_or("norm_topk_prob", c.arch == Arch::Qwen3Moe);
        c.decoder_sparse_step = rd.get_int_or("decoder_sparse_step", 1);
        if (c.decoder_sparse_step <= 0) QINFER_FAIL() << what << ": decoder_sparse_step must be positive";
        if (rd.has("mlp_only_layers")) {
            if (!j["mlp_only_layers"].is_array()) QINFER_FAIL() << what << ": mlp_only_layers must be a list";
            for (const auto & v : j["mlp_only_layers"]) {
                if (!v.is_number_integer()) QINFER_FAIL() << what << ": mlp_only_layers must hold integers";
                c.mlp_only_layers.push_back(v.get<int>());
            }
        }
        if (c.num_experts > 4096 || c.moe_intermediate_size > (1 << 20)) QINFER_FAIL() << what << ": MoE sizes out of range";
        if (c.num_experts > 0 && (c.num_experts_per_tok <= 0 || c.num_experts_per_tok > c.num_experts)) {
            QINFER_FAIL() << what << ": num_experts_per_tok " << c.num_experts_per_tok << " must be in 1.." << c.num_experts;
        }
    }
    bool any_dense = false;
    for (int i = 0; i < c.num_hidden_layers; i++) any_dense |= !c.is_moe_layer(i);
    if (any_dense && c.intermediate_size <= 0) QINFER_FAIL() << what << ": missing key 'intermediate_size'";

    std::string dt = rd.get_str_or("torch_dtype", rd.get_str_or("dtype", "bfloat16"));
    c.torch_dtype = dtype_from_torch_name(dt);
    c.bos_token_id = rd.has("bos_token_id") && j["bos_token_id"].is_number_integer() ? j["bos_token_id"].get<int>() : -1;
    c.eos_token_ids = rd.get_ids("eos_token_id");
    return c;
}

ModelConfig load_model_config(const std::string & dir) {
    if (!fs::is_directory(dir)) QINFER_FAIL() << dir << ": not a directory";
    fs::path p = fs::path(dir) / "config.json";
    if (!fs::exists(p)) QINFER_FAIL() << dir << ": no config.json (is this a Hugging Face checkpoint folder?)";
    const std::string text = read_text_file(p.string());
    ModelConfig c = parse_model_config(text, p.string());
    c.quant = load_quant_config(dir, text);
    return c;
}

GenerationConfig parse_generation_config(const std::string & text, const std::string & what) {
    json j = json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object()) QINFER_FAIL() << what << ": not a JSON object";
    JsonReader rd{j, what};
    GenerationConfig g;
    g.do_sample = rd.get_bool_or("do_sample", false);
    g.temperature = float(rd.get_num_or("temperature", 1.0));
    g.top_k = rd.get_int_or("top_k", 50);
    g.top_p = float(rd.get_num_or("top_p", 1.0));
    g.min_p = float(rd.get_num_or("min_p", 0.0));
    g.repetition_penalty = float(rd.get_num_or("repetition_penalty", 1.0));
    g.eos_token_ids = rd.get_ids("eos_token_id");
    auto pad = rd.get_ids("pad_token_id");
    g.pad_token_id = pad.empty() ? -1 : pad[0];
    return g;
}

GenerationConfig load_generation_config(const std::string & dir, const ModelConfig & config) {
    fs::path p = fs::path(dir) / "generation_config.json";
    GenerationConfig g;
    if (fs::exists(p)) g = parse_generation_config(read_text_file(p.string()), p.string());
    if (g.eos_token_ids.empty()) g.eos_token_ids = config.eos_token_ids;
    return g;
}

}  // namespace qinfer
