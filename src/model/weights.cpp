#include "model/weights.h"

#include <cmath>
#include <nlohmann/json.hpp>
#include <set>

#include "core/check.h"
#include "model/random_weights.h"

namespace qinfer {

int64_t Weight::numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
}

namespace {

void visit_linear(const ModelConfig & c, const WeightVisitor & visit, const std::string & prefix, int in, int out, bool bias,
                  Linear & l) {
    l.in_features = in;
    l.out_features = out;
    l.scheme = c.quant.scheme_for(prefix);
    const QuantScheme & s = l.scheme;
    const int64_t K = in, N = out;
    switch (s.method) {
    case QuantMethod::None: visit(prefix + ".weight", {N, K}, WeightRole::Linear, l.weight); break;
    case QuantMethod::Gptq:
    case QuantMethod::Awq: {
        const int64_t G = (K + s.group(in) - 1) / s.group(in);
        if (s.method == QuantMethod::Gptq) {
            if ((K * s.bits) % 32 != 0 || (N * s.bits) % 32 != 0) {
                QINFER_FAIL() << prefix << ": " << s.bits << "-bit GPTQ packing needs in and out features (" << K << ", " << N
                              << ") times the bits to be multiples of 32";
            }
            visit(prefix + ".qweight", {K * s.bits / 32, N}, WeightRole::QWeight, l.qweight);
            visit(prefix + ".qzeros", {G, N * s.bits / 32}, WeightRole::QZeros, l.qzeros);
            visit(prefix + ".scales", {G, N}, WeightRole::QScales, l.scales);
            visit(prefix + ".g_idx", {K}, WeightRole::QGIdx, l.g_idx);
        } else {
            if (N % 8 != 0) QINFER_FAIL() << prefix << ": AWQ packing needs out features (" << N << ") to be a multiple of 8";
            if (s.packing == QuantPacking::AwqGemv) {
                if (K % s.group(in) != 0) {
                    QINFER_FAIL() << prefix << ": the AWQ GEMV layout needs in features (" << K << ") divisible by the group size " << s.group(in);
                }
                const int64_t W = awq_gemv_zeros_width(K, s.group(in));
                visit(prefix + ".qweight", {N, K / 8}, WeightRole::QWeight, l.qweight);
                visit(prefix + ".qzeros", {N, W}, WeightRole::QZeros, l.qzeros);
                visit(prefix + ".scales", {N, 8 * W}, WeightRole::QScales, l.scales);
            } else {
                visit(prefix + ".qweight", {K, N / 8}, WeightRole::QWeight, l.qweight);
                visit(prefix + ".qzeros", {G, N / 8}, WeightRole::QZeros, l.qzeros);
                visit(prefix + ".scales", {G, N}, WeightRole::QScales, l.scales);
            }
        }
        break;
    }
    case QuantMethod::Bnb4: {
        const int64_t blocks = (N * K + s.block_size - 1) / s.block_size;
        const std::string w = prefix + ".weight";
        visit(w, {(N * K + 1) / 2, 1}, WeightRole::BnbCodes, l.weight);
        visit(w + ".absmax", {blocks}, WeightRole::BnbAbsmax, l.absmax);
        visit(w + ".quant_map", {16}, WeightRole::BnbQuantMap, l.quant_map);
        if (s.double_quant) {
            visit(w + ".nested_absmax", {(blocks + 255) / 256}, WeightRole::BnbNestedAbsmax, l.nested_absmax);
            visit(w + ".nested_quant_map", {256}, WeightRole::BnbNestedQuantMap, l.nested_quant_map);
        }
        visit(w + ".quant_state.bitsandbytes__" + quant_packing_name(s.packing), {-1}, WeightRole::BnbQuantState, l.quant_state);
        break;
    }
    }
    if (bias) visit(prefix + ".bias", {N}, WeightRole::Bias, l.bias);
}

void visit_mlp(const ModelConfig & c, const WeightVisitor & visit, const std::string & prefix, int hidden, int inter, bool bias,
               MlpWeights & m) {
    visit_linear(c, visit, prefix + ".gate_proj", hidden, inter, bias, m.gate_proj);
    visit_linear(c, visit, prefix + ".up_proj", hidden, inter, bias, m.up_proj);
    visit_linear(c, visit, prefix + ".down_proj", inter, hidden, bias, m.down_proj);
}

}  // namespace

void visit_weights(const ModelConfig & c, ModelWeights & w, const WeightVisitor & visit) {
    const int H = c.hidden_size;
    visit("model.embed_tokens.weight", {c.vocab_size, H}, WeightRole::Embedding, w.embed_tokens);
    w.layers.resize(c.num_hidden_layers);
    for (int i = 0; i < c.num_hidden_layers; i++) {
        const std::string p = "model.layers." + std::to_string(i);
        LayerWeights & L = w.layers[i];
        visit(p + ".input_layernorm.weight", {H}, WeightRole::Norm, L.input_layernorm);
        AttentionWeights & A = L.self_attn;
        visit_linear(c, visit, p + ".self_attn.q_proj", H, c.q_dim(), c.qkv_bias, A.q_proj);
        visit_linear(c, visit, p + ".self_attn.k_proj", H, c.kv_dim(), c.qkv_bias, A.k_proj);
        visit_linear(c, visit, p + ".self_attn.v_proj", H, c.kv_dim(), c.qkv_bias, A.v_proj);
        visit_linear(c, visit, p + ".self_attn.o_proj", c.q_dim(), H, c.o_bias, A.o_proj);
        if (c.qk_norm) {
            visit(p + ".self_attn.q_norm.weight", {c.head_dim}, WeightRole::Norm, A.q_norm);
            visit(p + ".self_attn.k_norm.weight", {c.head_dim}, WeightRole::Norm, A.k_norm);
        }
        visit(p + ".self_attn.k_scale", {-1}, WeightRole::KvScale, A.k_scale);
        visit(p + ".self_attn.v_scale", {-1}, WeightRole::KvScale, A.v_scale);
        visit(p + ".self_attn.kv_scale", {-1}, WeightRole::KvScale, A.kv_scale);
        visit(p + ".post_attention_layernorm.weight", {H}, WeightRole::Norm, L.post_attention_layernorm);
        L.is_moe = c.is_moe_layer(i);
        if (!L.is_moe) {
            visit_mlp(c, visit, p + ".mlp", H, c.intermediate_size, c.mlp_bias, L.mlp);
            continue;
        }
        MoeWeights & M = L.moe;
        visit(p + ".mlp.gate.weight", {c.num_experts, H}, WeightRole::Router, M.gate);
        M.experts.resize(c.num_experts);
        for (int e = 0; e < c.num_experts; e++) {
            visit_mlp(c, visit, p + ".mlp.experts." + std::to_string(e), H, c.moe_intermediate_size, false, M.experts[e]);
        }
        M.has_shared_expert = c.shared_expert_intermediate_size > 0;
        if (M.has_shared_expert) {
            visit_mlp(c, visit, p + ".mlp.shared_expert", H, c.shared_expert_intermediate_size, false, M.shared_expert);
            visit(p + ".mlp.shared_expert_gate.weight", {1, H}, WeightRole::Router, M.shared_expert_gate);
        }
    }
    visit("model.norm.weight", {H}, WeightRole::Norm, w.norm);
    if (!c.tie_word_embeddings) visit("lm_head.weight", {c.vocab_size, H}, WeightRole::Linear, w.lm_head);
}

namespace {

bool dtype_fits(WeightRole role, DType t, const QuantScheme & s) {
    const bool fp = t == DType::BF16 || t == DType::F16 || t == DType::F32;
    switch (role) {
    case WeightRole::QWeight:
    case WeightRole::QZeros:
    case WeightRole::QGIdx: return t == DType::I32;
    case WeightRole::KvScale: return t == DType::F32;
    case WeightRole::BnbCodes:
    case WeightRole::BnbQuantState: return t == DType::U8;
    case WeightRole::BnbAbsmax: return s.double_quant ? t == DType::U8 : t == DType::F32;
    case WeightRole::BnbQuantMap:
    case WeightRole::BnbNestedAbsmax:
    case WeightRole::BnbNestedQuantMap: return t == DType::F32;
    default: return fp;
    }
}

const char * expected_dtype(WeightRole role, const QuantScheme & s) {
    switch (role) {
    case WeightRole::QWeight:
    case WeightRole::QZeros:
    case WeightRole::QGIdx: return "I32";
    case WeightRole::KvScale: return "F32";
    case WeightRole::BnbCodes:
    case WeightRole::BnbQuantState: return "U8";
    case WeightRole::BnbAbsmax: return s.double_quant ? "U8 (double quantization)" : "F32";
    case WeightRole::BnbQuantMap:
    case WeightRole::BnbNestedAbsmax:
    case WeightRole::BnbNestedQuantMap: return "F32";
    default: return "BF16, F16 or F32";
    }
}

// The JSON bitsandbytes stores next to each 4-bit weight must describe the tensor the config implies.
void check_bnb_state(const std::string & dir, Linear & l) {
    const Weight & w = l.quant_state;
    std::string text(static_cast<const char *>(w.data), size_t(w.numel()));
    auto j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object()) QINFER_FAIL() << dir << ": '" << w.name << "' is not a JSON object";
    const std::string type = j.value("quant_type", std::string());
    if (type != quant_packing_name(l.scheme.packing)) {
        QINFER_FAIL() << dir << ": '" << w.name << "' has quant_type '" << type << "', the config says " << quant_packing_name(l.scheme.packing);
    }
    if (!j.contains("blocksize") || !j["blocksize"].is_number_integer() || j["blocksize"].get<int>() != l.scheme.block_size) {
        QINFER_FAIL() << dir << ": '" << w.name << "' needs blocksize " << l.scheme.block_size << " (other block sizes are not supported)";
    }
    if (j.contains("shape")) {
        std::vector<int64_t> shape;
        for (const auto & d : j["shape"]) shape.push_back(d.is_number_integer() ? d.get<int64_t>() : -1);
        if (shape != std::vector<int64_t>{l.out_features, l.in_features}) {
            QINFER_FAIL() << dir << ": '" << w.name << "' describes shape " << shape_str(shape) << ", config.json implies "
                          << shape_str({l.out_features, l.in_features});
        }
    }
    if (l.scheme.double_quant) {
        if (!j.contains("nested_offset") || !j["nested_offset"].is_number()) QINFER_FAIL() << dir << ": '" << w.name << "' has no nested_offset";
        if (j.value("nested_blocksize", 0) != 256) QINFER_FAIL() << dir << ": '" << w.name << "' needs nested_blocksize 256";
        l.nested_offset = j["nested_offset"].get<float>();
    }
}

// The checkpoint's tensors into the weight slots: every name, shape and dtype checked.
void map_checkpoint(Model * m) {
    const std::string & dir = m->dir;
    m->checkpoint = std::make_unique<Checkpoint>(dir);
    const Checkpoint & ck = *m->checkpoint;
    std::vector<std::string> missing;
    std::set<std::string> used;
    QuantScheme scheme;  // of the linear being visited (its tensors come together)
    visit_weights(m->config, m->weights, [&](const std::string & name, const std::vector<int64_t> & shape, WeightRole role,
                                             Weight & slot) {
        if (role == WeightRole::QWeight || role == WeightRole::BnbCodes) {
            scheme = m->config.quant.scheme_for(name.substr(0, name.rfind(role == WeightRole::QWeight ? ".qweight" : ".weight")));
        }
        if (!ck.has(name)) {
            // Optional: g_idx (k / group size) and the fp8 KV scales (computed from the first values).
            if (role != WeightRole::QGIdx && role != WeightRole::KvScale) missing.push_back(name);
            return;
        }
        used.insert(name);
        TensorView t = ck.get(name);
        const bool any_length = shape.size() == 1 && shape[0] == -1;
        if (!any_length && t.shape() != shape) {
            QINFER_FAIL() << dir << ": tensor '" << name << "' has shape " << shape_str(t.shape()) << ", config.json"
                          << (m->config.quant.quantized() ? " and its quantization config imply " : " implies ") << shape_str(shape);
        }
        if (!dtype_fits(role, t.dtype(), scheme)) {
            QINFER_FAIL() << dir << ": tensor '" << name << "' has dtype " << dtype_name(t.dtype()) << "; expected "
                          << expected_dtype(role, scheme)
                          << (role == WeightRole::Linear ? " (a quantized checkpoint needs its quantization_config)" : "");
        }
        slot.data = t.data;
        slot.dtype = t.dtype();
        slot.shape = t.shape();
        slot.name = name;
    });
    auto list = [](const std::vector<std::string> & names) {
        std::string s;
        for (size_t i = 0; i < names.size() && i < 4; i++) s += (i ? ", " : "") + names[i];
        if (names.size() > 4) s += " (+" + std::to_string(names.size() - 4) + " more)";
        return s;
    };
    for (const std::string & name : missing) {
        const size_t dot = name.rfind(".weight");
        if (dot != std::string::npos && ck.has(name.substr(0, dot) + ".qweight")) {
            QINFER_FAIL() << dir << ": '" << name.substr(0, dot) << "' has .qweight but no quantization config (config.json quantization_config "
                          << "or quantize_config.json)";
        }
    }
    if (!missing.empty()) QINFER_FAIL() << dir << ": missing tensors: " << list(missing);
    std::vector<std::string> unexpected;
    for (const auto & name : ck.names()) {
        bool harmless = name.find("rotary_emb.inv_freq") != std::string::npos;
        // Tied checkpoints sometimes also store lm_head.weight (a copy of the embedding).
        if (name == "lm_head.weight" && m->config.tie_word_embeddings) harmless = true;
        if (!used.count(name) && !harmless) unexpected.push_back(name);
    }
    if (!unexpected.empty()) QINFER_FAIL() << dir << ": unexpected tensors: " << list(unexpected);
    if (m->config.tie_word_embeddings) m->weights.lm_head = m->weights.embed_tokens;
}

// What the config does not say about the tensors: bitsandbytes' JSON, g_idx's range, the fp8 KV scales' values.
void check_weights(Model * m) {
    const std::string & dir = m->dir;
    for_each_linear(m->weights, [&](Linear & l) {
        if (l.scheme.method == QuantMethod::Bnb4) check_bnb_state(dir, l);
        if (l.g_idx.present()) {
            const int32_t * g = static_cast<const int32_t *>(l.g_idx.data);
            const int groups = (l.in_features + l.scheme.group(l.in_features) - 1) / l.scheme.group(l.in_features);
            for (int k = 0; k < l.in_features; k++) {
                if (g[k] < 0 || g[k] >= groups) {
                    QINFER_FAIL() << dir << ": '" << l.g_idx.name << "'[" << k << "] = " << g[k] << " is outside the " << groups << " groups";
                }
            }
        }
    });
    for (const LayerWeights & L : m->weights.layers) {
        for (const Weight * s : {&L.self_attn.k_scale, &L.self_attn.v_scale, &L.self_attn.kv_scale}) {
            if (!s->present()) continue;
            const float v = *static_cast<const float *>(s->data);
            if (s->numel() != 1) QINFER_FAIL() << dir << ": '" << s->name << "' must be one value (per-tensor fp8 KV scale), has " << s->numel();
            if (!(v > 0) || !std::isfinite(v)) QINFER_FAIL() << dir << ": '" << s->name << "' is " << v << "; an fp8 KV scale must be positive";
        }
    }
}

}  // namespace

std::unique_ptr<Model> load_model(const std::string & dir, const LoadOptions & opt) {
    auto m = std::make_unique<Model>();
    m->dir = dir;
    m->config = load_model_config(dir);
    if (opt.past_context > m->config.max_context()) {
        if (m->config.rope_scaling.type != RopeType::Default) {
            QINFER_FAIL() << dir << ": running past the model's context of " << m->config.max_context()
                          << " tokens needs plain RoPE (this model scales its RoPE by its context)";
        }
        m->config.max_position_embeddings = opt.past_context;
    }
    if (opt.dummy) {
        m->dummy = dummy_weights(m->config, m->weights);
    } else {
        map_checkpoint(m.get());
    }
    check_weights(m.get());
    return m;
}

float checkpoint_kv_scale(const AttentionWeights & a, bool value) {
    const Weight & s = value ? a.v_scale : a.k_scale;
    if (s.present()) return *static_cast<const float *>(s.data);
    if (a.kv_scale.present()) return *static_cast<const float *>(a.kv_scale.data);
    return 0.0f;
}

void for_each_linear(ModelWeights & w, const std::function<void(Linear &)> & f) {
    auto mlp = [&](MlpWeights & m) {
        f(m.gate_proj);
        f(m.up_proj);
        f(m.down_proj);
    };
    for (LayerWeights & L : w.layers) {
        f(L.self_attn.q_proj);
        f(L.self_attn.k_proj);
        f(L.self_attn.v_proj);
        f(L.self_attn.o_proj);
        if (!L.is_moe) mlp(L.mlp);
        for (MlpWeights & e : L.moe.experts) mlp(e);
        if (L.moe.has_shared_expert) mlp(L.moe.shared_expert);
    }
}

uint64_t stored_bytes(const Model & m) {
    uint64_t total = 0;
    ModelWeights w = m.weights;
    visit_weights(m.config, w, [&](const std::string &, const std::vector<int64_t> &, WeightRole, Weight & slot) {
        if (slot.present()) total += slot.nbytes();
    });
    return total;
}

uint64_t decode_weight_bytes(const Model & m) {
    const ModelConfig & c = m.config;
    double total = 0;
    ModelWeights w = m.weights;  // the visitor reads each slot's dtype and shape
    visit_weights(c, w, [&](const std::string & name, const std::vector<int64_t> &, WeightRole role, Weight & slot) {
        double bytes = double(slot.nbytes());
        if (role == WeightRole::Embedding) bytes /= c.vocab_size;  // one gathered row
        if (name.find(".mlp.experts.") != std::string::npos) bytes *= double(c.num_experts_per_tok) / c.num_experts;
        total += bytes;
    });
    if (c.tie_word_embeddings) total += double(w.embed_tokens.nbytes());
    return uint64_t(total);
}

uint64_t parameter_count(const ModelConfig & config) {
    uint64_t n = 0;
    ModelWeights w;
    ModelConfig c = config;
    c.quant = QuantConfig{};  // the logical parameters, not the packed words
    visit_weights(c, w, [&](const std::string &, const std::vector<int64_t> & shape, WeightRole role, Weight &) {
        if (role == WeightRole::KvScale) return;  // optional cache scales, not parameters
        uint64_t k = 1;
        for (auto d : shape) k *= uint64_t(d);
        n += k;
    });
    return n;
}

}  // namespace qinfer
