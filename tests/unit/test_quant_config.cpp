#include <gtest/gtest.h>

#include "core/check.h"
#include "io/quant_config.h"

namespace qinfer {

TEST(QuantConfig, GptqDefaultsAndV2) {
    QuantConfig q = parse_quant_config(R"({"bits": 4, "group_size": 128, "desc_act": false, "sym": true})", "quantize_config.json");
    EXPECT_EQ(q.base.method, QuantMethod::Gptq);  // AutoGPTQ's file has no quant_method
    EXPECT_EQ(q.base.packing, QuantPacking::GptqV1);
    EXPECT_EQ(q.label, "GPTQ-Int4");
    q = parse_quant_config(R"({"quant_method": "gptq", "bits": 8, "group_size": -1, "checkpoint_format": "gptq_v2", "sym": false})", "c");
    EXPECT_EQ(q.base.packing, QuantPacking::GptqV2);
    EXPECT_EQ(q.base.group(3584), 3584);
    EXPECT_FALSE(q.base.sym);
}

TEST(QuantConfig, GptqModelDynamicOverrides) {
    QuantConfig q = parse_quant_config(R"({"quant_method": "gptq", "bits": 4, "group_size": 128,
        "dynamic": {"-:.*\\.mlp\\.down_proj": {}, "+:model\\.layers\\.1\\..*": {"bits": 8, "group_size": 32}}})", "c");
    EXPECT_FALSE(q.scheme_for("model.layers.0.mlp.down_proj").quantized());
    QuantScheme s = q.scheme_for("model.layers.1.self_attn.q_proj");
    EXPECT_EQ(s.bits, 8);
    EXPECT_EQ(s.group_size, 32);
    s = q.scheme_for("model.layers.10.self_attn.q_proj");  // "layers\.1\." does not match layer 10
    EXPECT_EQ(s.bits, 4);
}

TEST(QuantConfig, AutoRoundPackings) {
    QuantConfig q = parse_quant_config(R"({"quant_method": "auto-round", "packing_format": "auto_round:auto_awq", "bits": 4,
        "group_size": 128, "sym": false, "extra_config": {"model.layers.0.mlp.down_proj": {"bits": 16}}})", "c");
    EXPECT_EQ(q.base.method, QuantMethod::Awq);
    EXPECT_FALSE(q.scheme_for("model.layers.0.mlp.down_proj").quantized());
    EXPECT_TRUE(q.scheme_for("model.layers.0.mlp.up_proj").quantized());
    q = parse_quant_config(R"({"quant_method": "intel/auto-round", "backend": "auto_round:auto_gptq", "bits": 4, "group_size": 128})", "c");
    EXPECT_EQ(q.base.packing, QuantPacking::GptqV1);
    q = parse_quant_config(R"({"quant_method": "auto-round", "packing_format": "auto_round", "bits": 4, "group_size": 128})", "c");
    EXPECT_EQ(q.base.packing, QuantPacking::GptqV2);
}

TEST(QuantConfig, AwqAndBitsandbytes) {
    QuantConfig q = parse_quant_config(R"({"w_bit": 4, "q_group_size": 64, "zero_point": true, "version": "GEMM",
        "modules_to_not_convert": ["visual"]})", "quant_config.json");
    EXPECT_EQ(q.base.method, QuantMethod::Awq);
    EXPECT_EQ(q.base.group_size, 64);
    EXPECT_FALSE(q.scheme_for("visual.blocks.0.qkv").quantized());
    q = parse_quant_config(R"({"quant_method": "bitsandbytes", "load_in_4bit": true, "bnb_4bit_quant_type": "nf4",
        "bnb_4bit_use_double_quant": true, "llm_int8_skip_modules": ["lm_head"]})", "c");
    EXPECT_EQ(q.base.packing, QuantPacking::Nf4);
    EXPECT_TRUE(q.base.double_quant);
}

// AutoAWQ's GEMV layout: zeros width from calculate_zeros_width (ceil(groups / 8) words, rounded up to 1, 2 or 4).
TEST(QuantConfig, AwqGemvLayout) {
    QuantConfig q = parse_quant_config(R"({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "GEMV"})", "c");
    EXPECT_EQ(q.base.packing, QuantPacking::AwqGemv);
    EXPECT_EQ(awq_gemv_zeros_width(4096, 128), 4);
    EXPECT_EQ(awq_gemv_zeros_width(4096, 64), 8);
    EXPECT_EQ(awq_gemv_zeros_width(4096, 32), 16);
    EXPECT_EQ(awq_gemv_zeros_width(896, 128), 1);
    EXPECT_EQ(awq_gemv_zeros_width(896, 64), 2);
    EXPECT_EQ(awq_gemv_zeros_width(3584, 64), 8);
    EXPECT_EQ(awq_gemv_zeros_width(18944, 128), 19);
    EXPECT_EQ(awq_gemv_zeros_width(160, 32), 4);
    EXPECT_EQ(awq_gemv_zeros_width(29696, 128), 29);
    EXPECT_THROW(awq_gemv_zeros_width(4096, 16), Error);
}

TEST(QuantConfig, Errors) {
    EXPECT_THROW(parse_quant_config(R"({"quant_method": "awq", "bits": 8})", "c"), Error);
    EXPECT_THROW(parse_quant_config(R"({"quant_method": "awq", "version": "gemv_fast"})", "c"), Error);
    EXPECT_THROW(parse_quant_config(R"({"quant_method": "gptq", "bits": 6})", "c"), Error);
    EXPECT_THROW(parse_quant_config(R"({"quant_method": "gptq", "bits": 4, "lm_head": true})", "c"), Error);
    EXPECT_THROW(parse_quant_config(R"({"quant_method": "bitsandbytes", "load_in_8bit": true})", "c"), Error);
    EXPECT_THROW(parse_quant_config(R"({"quant_method": "gptq", "bits": "4"})", "c"), Error);
    EXPECT_THROW(parse_quant_config("[1, 2]", "c"), Error);
    QuantConfig q = parse_quant_config(R"({"quant_method": "gptq", "bits": 4, "dynamic": {"(": {}}})", "c");
    EXPECT_THROW(q.scheme_for("model.layers.0.mlp.up_proj"), Error);
}

}  // namespace qinfer
