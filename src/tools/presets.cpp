#include "tools/presets.h"

#include "core/check.h"

namespace qinfer {

using json = nlohmann::json;

namespace {

json qwen2_config(int hidden, int inter, int heads, int kv_heads, int layers, int vocab, bool tied, int max_pos) {
    return json{
        {"architectures", {"Qwen2ForCausalLM"}},
        {"attention_dropout", 0.0},
        {"bos_token_id", 151643},
        {"eos_token_id", 151645},
        {"hidden_act", "silu"},
        {"hidden_size", hidden},
        {"initializer_range", 0.02},
        {"intermediate_size", inter},
        {"max_position_embeddings", max_pos},
        {"max_window_layers", layers},
        {"model_type", "qwen2"},
        {"num_attention_heads", heads},
        {"num_hidden_layers", layers},
        {"num_key_value_heads", kv_heads},
        {"rms_norm_eps", 1e-06},
        {"rope_scaling", nullptr},
        {"rope_theta", 1000000.0},
        {"sliding_window", 32768},
        {"tie_word_embeddings", tied},
        {"torch_dtype", "bfloat16"},
        {"use_cache", true},
        {"use_sliding_window", false},
        {"vocab_size", vocab},
    };
}

json qwen3_config(int hidden, int inter, int heads, int kv_heads, int head_dim, int layers, bool tied) {
    return json{
        {"architectures", {"Qwen3ForCausalLM"}},
        {"attention_bias", false},
        {"attention_dropout", 0.0},
        {"bos_token_id", 151643},
        {"eos_token_id", 151645},
        {"head_dim", head_dim},
        {"hidden_act", "silu"},
        {"hidden_size", hidden},
        {"initializer_range", 0.02},
        {"intermediate_size", inter},
        {"max_position_embeddings", 40960},
        {"max_window_layers", layers},
        {"model_type", "qwen3"},
        {"num_attention_heads", heads},
        {"num_hidden_layers", layers},
        {"num_key_value_heads", kv_heads},
        {"rms_norm_eps", 1e-06},
        {"rope_scaling", nullptr},
        {"rope_theta", 1000000},
        {"sliding_window", nullptr},
        {"tie_word_embeddings", tied},
        {"torch_dtype", "bfloat16"},
        {"use_cache", true},
        {"use_sliding_window", false},
        {"vocab_size", 151936},
    };
}

json qwen2_moe_config(int hidden, int inter, int heads, int kv_heads, int layers, int experts, int top_k, int moe_inter,
                      int shared_inter, int max_pos) {
    return json{
        {"architectures", {"Qwen2MoeForCausalLM"}},
        {"attention_dropout", 0.0},
        {"bos_token_id", 151643},
        {"decoder_sparse_step", 1},
        {"eos_token_id", 151643},
        {"hidden_act", "silu"},
        {"hidden_size", hidden},
        {"initializer_range", 0.02},
        {"intermediate_size", inter},
        {"max_position_embeddings", max_pos},
        {"max_window_layers", layers},
        {"mlp_only_layers", json::array()},
        {"model_type", "qwen2_moe"},
        {"moe_intermediate_size", moe_inter},
        {"norm_topk_prob", false},
        {"num_attention_heads", heads},
        {"num_experts", experts},
        {"num_experts_per_tok", top_k},
        {"num_hidden_layers", layers},
        {"num_key_value_heads", kv_heads},
        {"output_router_logits", false},
        {"rms_norm_eps", 1e-06},
        {"rope_theta", 1000000.0},
        {"router_aux_loss_coef", 0.001},
        {"shared_expert_intermediate_size", shared_inter},
        {"sliding_window", max_pos},
        {"tie_word_embeddings", false},
        {"torch_dtype", "bfloat16"},
        {"use_cache", true},
        {"use_sliding_window", false},
        {"vocab_size", 151936},
    };
}

json qwen_generation_config() {
    return json{{"bos_token_id", 151643}, {"pad_token_id", 151643}, {"do_sample", true},
                {"eos_token_id", {151645, 151643}}, {"repetition_penalty", 1.05}, {"temperature", 0.7},
                {"top_p", 0.8}, {"top_k", 20}};
}

// Tiny models for tests: odd sizes (hidden 96, 6 heads of 16, 2 KV heads, 3 layers), vocab 256.
json tiny(json c) {
    c["vocab_size"] = 256;
    c["bos_token_id"] = 1;
    c["eos_token_id"] = 2;
    c["torch_dtype"] = "float32";
    c["max_position_embeddings"] = 256;
    return c;
}
json tiny_gen() { return json{{"bos_token_id", 1}, {"eos_token_id", 2}, {"do_sample", false}}; }

std::vector<Preset> make_presets() {
    std::vector<Preset> p;
    // Each Qwen2.5 size also as NAME-yarn: the model card's advice for inputs past 32768 tokens (rope_scaling YaRN,
    // factor 4 over the original 32768, max_position_embeddings left as published), good to 131072 tokens.
    auto qwen25 = [&](const char * name, int h, int i, int nh, int nkv, int l, int vocab, bool tied) {
        json c = qwen2_config(h, i, nh, nkv, l, vocab, tied, 32768);
        p.push_back({name, c, qwen_generation_config(), "qwen2.5-tokenizer", 0});
        c["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}};
        p.push_back({std::string(name) + "-yarn", c, qwen_generation_config(), "qwen2.5-tokenizer", 0});
    };
    qwen25("qwen2.5-0.5b", 896, 4864, 14, 2, 24, 151936, true);
    qwen25("qwen2.5-1.5b", 1536, 8960, 12, 2, 28, 151936, true);
    qwen25("qwen2.5-3b", 2048, 11008, 16, 2, 36, 151936, true);
    qwen25("qwen2.5-7b", 3584, 18944, 28, 4, 28, 152064, false);
    qwen25("qwen2.5-14b", 5120, 13824, 40, 8, 48, 152064, false);
    qwen25("qwen2.5-32b", 5120, 27648, 40, 8, 64, 152064, false);
    qwen25("qwen2.5-72b", 8192, 29568, 64, 8, 80, 152064, false);
    p.push_back({"qwen1.5-moe-a2.7b", qwen2_moe_config(2048, 5632, 16, 16, 24, 60, 4, 1408, 5632, 8192),
                 json{{"bos_token_id", 151643}, {"eos_token_id", 151643}, {"do_sample", false}}, "qwen2.5-tokenizer", 0});
    p.push_back({"qwen2-57b-a14b", qwen2_moe_config(3584, 18944, 28, 4, 28, 64, 8, 2560, 20480, 131072),
                 json{{"bos_token_id", 151643}, {"eos_token_id", 151643}, {"do_sample", false}}, "qwen2.5-tokenizer", 0});
    json q3gen = {{"bos_token_id", 151643}, {"pad_token_id", 151643}, {"do_sample", true}, {"eos_token_id", {151645, 151643}},
                  {"temperature", 0.6}, {"top_k", 20}, {"top_p", 0.95}};
    p.push_back({"qwen3-0.6b", qwen3_config(1024, 3072, 16, 8, 128, 28, true), q3gen, "qwen3-tokenizer", 0});
    p.push_back({"qwen3-8b", qwen3_config(4096, 12288, 32, 8, 128, 36, false), q3gen, "qwen3-tokenizer", 0});
    // Qwen3's MoE models: 128 experts, 8 a token, renormalised top-k, every layer sparse.
    auto qwen3_moe = [&](const char * name, int hidden, int inter, int heads, int layers, int moe_inter) {
        json c = qwen3_config(hidden, inter, heads, 4, 128, layers, false);
        c["architectures"] = {"Qwen3MoeForCausalLM"};
        c["model_type"] = "qwen3_moe";
        c["num_experts"] = 128;
        c["num_experts_per_tok"] = 8;
        c["moe_intermediate_size"] = moe_inter;
        c["decoder_sparse_step"] = 1;
        c["mlp_only_layers"] = json::array();
        c["norm_topk_prob"] = true;
        c["router_aux_loss_coef"] = 0.001;
        p.push_back({name, c, q3gen, "qwen3-tokenizer", 0});
    };
    qwen3_moe("qwen3-30b-a3b", 2048, 6144, 32, 48, 768);
    qwen3_moe("qwen3-235b-a22b", 4096, 12288, 64, 94, 1536);
    json llama = {
        {"architectures", {"LlamaForCausalLM"}}, {"attention_bias", false}, {"attention_dropout", 0.0},
        {"bos_token_id", 128000}, {"eos_token_id", 128001}, {"head_dim", 128}, {"hidden_act", "silu"},
        {"hidden_size", 4096}, {"initializer_range", 0.02}, {"intermediate_size", 14336},
        {"max_position_embeddings", 131072}, {"mlp_bias", false}, {"model_type", "llama"},
        {"num_attention_heads", 32}, {"num_hidden_layers", 32}, {"num_key_value_heads", 8},
        {"pretraining_tp", 1}, {"rms_norm_eps", 1e-05},
        {"rope_scaling", {{"factor", 8.0}, {"high_freq_factor", 4.0}, {"low_freq_factor", 1.0},
                          {"original_max_position_embeddings", 8192}, {"rope_type", "llama3"}}},
        {"rope_theta", 500000.0}, {"tie_word_embeddings", false}, {"torch_dtype", "bfloat16"}, {"use_cache", true},
        {"vocab_size", 128256}};
    p.push_back({"llama-3.1-8b", llama,
                 json{{"bos_token_id", 128000}, {"eos_token_id", {128001, 128008, 128009}}, {"do_sample", true},
                      {"temperature", 0.6}, {"top_p", 0.9}},
                 "", 0});

    // Tiny presets (tests and goldens).
    json t2 = tiny(qwen2_config(96, 160, 6, 2, 3, 256, true, 256));
    p.push_back({"tiny-qwen2", t2, tiny_gen(), "", 0});
    // Sizes that are multiples of 64 (bitsandbytes' blocks on the CUDA backend), untied lm_head.
    p.push_back({"tiny-qwen2-k128", tiny(qwen2_config(128, 192, 4, 2, 3, 256, false, 256)), tiny_gen(), "", 0});
    // 8 query heads over 4 KV heads (Qwen2.5-72B's 8 a group, fewer): 3 ranks take 1 / 1 / 2 groups, as 72B's 8 KV
    // heads go 2 / 3 / 3; sizes in whole groups of 32 and 64-wide blocks as tiny-qwen2-k128.
    p.push_back({"tiny-qwen2-kv4", tiny(qwen2_config(128, 192, 8, 4, 3, 256, false, 256)), tiny_gen(), "", 0});
    json t2u = t2;
    t2u["tie_word_embeddings"] = false;
    t2u["num_key_value_heads"] = 6;  // Qwen1.5-style MHA
    p.push_back({"tiny-qwen1.5", t2u, tiny_gen(), "", 0});
    json ty = t2;
    ty["max_position_embeddings"] = 128;
    ty["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32}};
    p.push_back({"tiny-qwen2-yarn", ty, tiny_gen(), "", 0});
    json tyq = t2;  // Qwen2.5's published advice: rope_scaling added, max_position_embeddings left as it was
    tyq["max_position_embeddings"] = 32;
    tyq["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32}};
    p.push_back({"tiny-qwen2-yarn-same-max", tyq, tiny_gen(), "", 0});
    json tl = t2;
    tl["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
    p.push_back({"tiny-qwen2-linear", tl, tiny_gen(), "", 0});
    json t3 = tiny(qwen3_config(96, 160, 6, 2, 24, 3, false));  // head_dim 24 != hidden / heads
    p.push_back({"tiny-qwen3", t3, tiny_gen(), "", 0});
    json tll = llama;
    tll.update(json{{"hidden_size", 96}, {"intermediate_size", 160}, {"num_attention_heads", 6},
                    {"num_key_value_heads", 2}, {"head_dim", 16}, {"num_hidden_layers", 3}});
    tll["rope_scaling"]["original_max_position_embeddings"] = 16;
    tll["rope_theta"] = 10000.0;
    p.push_back({"tiny-llama3", tiny(tll), tiny_gen(), "", 0});
    json tm = tiny(qwen2_moe_config(96, 160, 6, 2, 3, 5, 2, 48, 64, 256));
    tm["mlp_only_layers"] = {1};
    p.push_back({"tiny-qwen2-moe", tm, tiny_gen(), "", 0});
    // Expert sizes in whole 64-wide K blocks and quantization groups (the CUDA quantized experts' kernel), 8 experts.
    p.push_back({"tiny-qwen2-moe-k64", tiny(qwen2_moe_config(128, 192, 4, 2, 3, 8, 2, 64, 128, 256)), tiny_gen(), "", 0});
    json t3m = t3;
    t3m["architectures"] = {"Qwen3MoeForCausalLM"};
    t3m["model_type"] = "qwen3_moe";
    t3m.update(json{{"num_experts", 5}, {"num_experts_per_tok", 2}, {"moe_intermediate_size", 48},
                    {"decoder_sparse_step", 2}, {"mlp_only_layers", json::array()}, {"norm_topk_prob", true}});
    p.push_back({"tiny-qwen3-moe", t3m, tiny_gen(), "", 0});
    // Qwen3-235B-A22B's shape in small: 4 KV heads (one a rank at --tp 4), 16 query heads, every layer sparse, expert
    // sizes whole 64-wide blocks on each of 4 ranks (the quantized experts' kernel).
    json t3m4 = tiny(qwen3_config(128, 192, 16, 4, 16, 3, false));
    t3m4["architectures"] = {"Qwen3MoeForCausalLM"};
    t3m4["model_type"] = "qwen3_moe";
    t3m4.update(json{{"num_experts", 8}, {"num_experts_per_tok", 2}, {"moe_intermediate_size", 256},
                     {"decoder_sparse_step", 1}, {"mlp_only_layers", json::array()}, {"norm_topk_prob", true}});
    p.push_back({"tiny-qwen3-moe-kv4", t3m4, tiny_gen(), "", 0});
    return p;
}

const std::vector<Preset> & all_presets() {
    static const std::vector<Preset> presets = make_presets();
    return presets;
}

}  // namespace

const Preset & find_preset(const std::string & name) {
    for (const auto & p : all_presets()) {
        if (p.name == name) return p;
    }
    std::string names;
    for (const auto & p : all_presets()) names += (names.empty() ? "" : ", ") + p.name;
    QINFER_FAIL() << "unknown preset '" << name << "' (presets: " << names << ")";
}

std::vector<std::string> preset_names() {
    std::vector<std::string> out;
    for (const auto & p : all_presets()) out.push_back(p.name);
    return out;
}

}  // namespace qinfer
