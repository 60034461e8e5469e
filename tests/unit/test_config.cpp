#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "io/model_config.h"
#include "model/rope.h"
#include "tools/presets.h"

using namespace qinfer;
using json = nlohmann::json;

namespace {
std::string error_of(const json & j) {
    try {
        parse_model_config(j.dump(), "config.json");
    } catch (const Error & e) {
        return e.what();
    }
    return "";
}
}  // namespace

TEST(Config, EveryPresetParses) {
    for (const auto & name : preset_names()) {
        ModelConfig c = parse_model_config(find_preset(name).config.dump(), name);
        EXPECT_GT(c.num_hidden_layers, 0) << name;
        EXPECT_EQ(c.num_attention_heads % c.num_key_value_heads, 0) << name;
    }
}

TEST(Config, Qwen25SevenB) {
    ModelConfig c = parse_model_config(find_preset("qwen2.5-7b").config.dump(), "7b");
    EXPECT_EQ(c.arch, Arch::Qwen2);
    EXPECT_EQ(c.head_dim, 128);
    EXPECT_TRUE(c.qkv_bias);
    EXPECT_FALSE(c.o_bias);
    EXPECT_FALSE(c.tie_word_embeddings);
    EXPECT_EQ(c.kv_bytes_per_token(2), 57344u);  // ANCHORS.md: 57,344 bytes per token for 7B in bf16
}

TEST(Config, Qwen3AndMoe) {
    ModelConfig q3 = parse_model_config(find_preset("qwen3-8b").config.dump(), "q3");
    EXPECT_TRUE(q3.qk_norm);
    EXPECT_FALSE(q3.qkv_bias);
    ModelConfig moe = parse_model_config(find_preset("tiny-qwen2-moe").config.dump(), "moe");
    EXPECT_TRUE(moe.is_moe_layer(0));
    EXPECT_FALSE(moe.is_moe_layer(1));  // mlp_only_layers
    EXPECT_EQ(moe.shared_expert_intermediate_size, 64);
    ModelConfig q3m = parse_model_config(find_preset("tiny-qwen3-moe").config.dump(), "q3m");
    EXPECT_FALSE(q3m.is_moe_layer(0));  // decoder_sparse_step 2
    EXPECT_TRUE(q3m.is_moe_layer(1));
    EXPECT_TRUE(q3m.norm_topk_prob);
}

TEST(Config, RejectsClearly) {
    json base = find_preset("qwen2.5-0.5b").config;
    json j = base;
    j["model_type"] = "gpt2";
    EXPECT_NE(error_of(j).find("unknown model_type 'gpt2'"), std::string::npos);
    j = base;
    j.erase("hidden_size");
    EXPECT_NE(error_of(j).find("missing key 'hidden_size'"), std::string::npos);
    j = base;
    j["use_sliding_window"] = true;
    j["max_window_layers"] = 21;
    EXPECT_NE(error_of(j).find("sliding-window attention is not supported"), std::string::npos);
    j = base;
    j["num_key_value_heads"] = 3;
    EXPECT_NE(error_of(j).find("not a multiple"), std::string::npos);
    j = base;
    j["rope_scaling"] = {{"type", "longrope"}, {"factor", 2.0}};
    EXPECT_NE(error_of(j).find("'longrope' is not supported"), std::string::npos);
    j = base;
    j["vocab_size"] = "many";
    EXPECT_NE(error_of(j).find("'vocab_size' must be a non-negative integer"), std::string::npos);
    EXPECT_NE(error_of(json::array()).find("not a JSON object"), std::string::npos);
    // Sliding window configured but off (every official Qwen2.5 config) is fine.
    j = base;
    j["use_sliding_window"] = false;
    EXPECT_EQ(error_of(j), "");
}

TEST(Config, RopeParametersOfTransformers5) {
    json j = find_preset("tiny-qwen2").config;
    j.erase("rope_theta");
    j.erase("rope_scaling");
    j["rope_parameters"] = {{"rope_type", "linear"}, {"rope_theta", 5000.0}, {"factor", 2.0}};
    ModelConfig c = parse_model_config(j.dump(), "c");
    EXPECT_EQ(c.rope_theta, 5000.0);
    EXPECT_EQ(c.rope_scaling.type, RopeType::Linear);
}

TEST(Rope, YarnDefaultsMatchFormula) {
    json j = find_preset("tiny-qwen2-yarn").config;  // factor 4 from 32 to 128 positions
    ModelConfig c = parse_model_config(j.dump(), "c");
    RopeFreqs f = compute_rope_freqs(c, 0);
    EXPECT_NEAR(f.attention_scaling, 0.1 * std::log(4.0) + 1.0, 1e-6);
    // The highest frequency is extrapolated (unchanged), the lowest interpolated (divided by the factor).
    EXPECT_FLOAT_EQ(f.inv_freq[0], 1.0f);
    float base_last = 1.0f / std::pow(float(c.rope_theta), float(c.head_dim - 2) / float(c.head_dim));
    EXPECT_NEAR(f.inv_freq.back(), base_last / 4, 1e-9);
}

TEST(GenerationConfig, Defaults) {
    GenerationConfig g = parse_generation_config(find_preset("qwen2.5-7b").generation_config.dump(), "g");
    EXPECT_TRUE(g.do_sample);
    EXPECT_FLOAT_EQ(g.temperature, 0.7f);
    EXPECT_EQ(g.top_k, 20);
    EXPECT_EQ(g.eos_token_ids, (std::vector<int>{151645, 151643}));
}
