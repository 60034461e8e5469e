#include "model/weights.h"

#include <set>

#include "core/check.h"

namespace qinfer {

int64_t Weight::numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
}

namespace {

void visit_linear(const WeightVisitor & visit, const std::string & prefix, int in, int out, bool bias, Linear & l) {
    l.in_features = in;
    l.out_features = out;
    visit(prefix + ".weight", {out, in}, WeightRole::Linear, l.weight);
    if (bias) visit(prefix + ".bias", {out}, WeightRole::Bias, l.bias);
}

void visit_mlp(const WeightVisitor & visit, const std::string & prefix, int hidden, int inter, bool bias, MlpWeights & m) {
    visit_linear(visit, prefix + ".gate_proj", hidden, inter, bias, m.gate_proj);
    visit_linear(visit, prefix + ".up_proj", hidden, inter, bias, m.up_proj);
    visit_linear(visit, prefix + ".down_proj", inter, hidden, bias, m.down_proj);
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
        visit_linear(visit, p + ".self_attn.q_proj", H, c.q_dim(), c.qkv_bias, A.q_proj);
        visit_linear(visit, p + ".self_attn.k_proj", H, c.kv_dim(), c.qkv_bias, A.k_proj);
        visit_linear(visit, p + ".self_attn.v_proj", H, c.kv_dim(), c.qkv_bias, A.v_proj);
        visit_linear(visit, p + ".self_attn.o_proj", c.q_dim(), H, c.o_bias, A.o_proj);
        if (c.qk_norm) {
            visit(p + ".self_attn.q_norm.weight", {c.head_dim}, WeightRole::Norm, A.q_norm);
            visit(p + ".self_attn.k_norm.weight", {c.head_dim}, WeightRole::Norm, A.k_norm);
        }
        visit(p + ".post_attention_layernorm.weight", {H}, WeightRole::Norm, L.post_attention_layernorm);
        L.is_moe = c.is_moe_layer(i);
        if (!L.is_moe) {
            visit_mlp(visit, p + ".mlp", H, c.intermediate_size, c.mlp_bias, L.mlp);
            continue;
        }
        MoeWeights & M = L.moe;
        visit(p + ".mlp.gate.weight", {c.num_experts, H}, WeightRole::Router, M.gate);
        M.experts.resize(c.num_experts);
        for (int e = 0; e < c.num_experts; e++) {
            visit_mlp(visit, p + ".mlp.experts." + std::to_string(e), H, c.moe_intermediate_size, false, M.experts[e]);
        }
        M.has_shared_expert = c.shared_expert_intermediate_size > 0;
        if (M.has_shared_expert) {
            visit_mlp(visit, p + ".mlp.shared_expert", H, c.shared_expert_intermediate_size, false, M.shared_expert);
            visit(p + ".mlp.shared_expert_gate.weight", {1, H}, WeightRole::Router, M.shared_expert_gate);
        }
    }
    visit("model.norm.weight", {H}, WeightRole::Norm, w.norm);
    if (!c.tie_word_embeddings) visit("lm_head.weight", {c.vocab_size, H}, WeightRole::Linear, w.lm_head);
}

std::unique_ptr<Model> load_model(const std::string & dir) {
    auto m = std::make_unique<Model>();
    m->dir = dir;
    m->config = load_model_config(dir);
    m->checkpoint = std::make_unique<Checkpoint>(dir);
    const Checkpoint & ck = *m->checkpoint;
    std::vector<std::string> missing;
    std::set<std::string> used;
    visit_weights(m->config, m->weights, [&](const std::string & name, const std::vector<int64_t> & shape, WeightRole,
                                             Weight & slot) {
        if (!ck.has(name)) {
            missing.push_back(name);
            return;
        }
        used.insert(name);
        TensorView t = ck.get(name);
        if (t.shape() != shape) {
            QINFER_FAIL() << dir << ": tensor '" << name << "' has shape " << shape_str(t.shape()) << ", config.json implies "
                          << shape_str(shape);
        }
        if (t.dtype() != DType::BF16 && t.dtype() != DType::F16 && t.dtype() != DType::F32) {
            QINFER_FAIL() << dir << ": tensor '" << name << "' has dtype " << dtype_name(t.dtype())
                          << "; expected BF16, F16 or F32 (a quantized checkpoint needs its quantization_config)";
        }
        slot.data = t.data;
        slot.dtype = t.dtype();
        slot.shape = shape;
        slot.name = name;
    });
    auto list = [](const std::vector<std::string> & names) {
        std::string s;
        for (size_t i = 0; i < names.size() && i < 4; i++) s += (i ? ", " : "") + names[i];
        if (names.size() > 4) s += " (+" + std::to_string(names.size() - 4) + " more)";
        return s;
    };
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
    return m;
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

uint64_t parameter_count(const ModelConfig & c) {
    uint64_t n = 0;
    ModelWeights w;
    visit_weights(c, w, [&](const std::string &, const std::vector<int64_t> & shape, WeightRole, Weight &) {
        uint64_t k = 1;
        for (auto d : shape) k *= uint64_t(d);
        n += k;
    });
    return n;
}

}  // namespace qinfer
