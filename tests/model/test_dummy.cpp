// --load-format dummy: the weights built from config.json alone have exactly the layout of a synthesized checkpoint
// of the same config (names, shapes, dtypes) in every format, every tensor has values, no two tensors of one init are
// the same, and the model runs on every backend (CUDA's logits match the CPU's on the same dummy weights).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <tuple>

#include "model/random_weights.h"
#include "model/weights.h"
#include "runtime/engine.h"
#include "tools/args.h"
#include "tools/synth.h"
#include "unit/test_helpers.h"

namespace qinfer {
namespace {

struct DummyCase {
    std::string name, preset;
    std::vector<std::string> quant;  // synth options, e.g. --quant gptq-int4 --group-size 32 --desc-act
    bool cuda = true;                // the CUDA kernels take the preset's shapes in this format
};

std::string synth_dir(const DummyCase & dc, bool config_only) {
    SynthOptions o;
    o.preset = dc.preset;
    o.out_dir = test::temp_dir("dummy-" + dc.name + (config_only ? "-config" : ""));
    o.quiet = true;
    o.config_only = config_only;
    std::vector<std::string> args = {"qinfer", "synth"};
    args.insert(args.end(), dc.quant.begin(), dc.quant.end());
    std::vector<char *> argv;
    for (auto & s : args) argv.push_back(s.data());
    Args a(int(argv.size()), argv.data(), 2, {"desc-act", "asym", "double-quant"});
    o.quant = synth_quant_from_args(a);
    synthesize(o);
    return o.out_dir;
}

using Layout = std::vector<std::tuple<std::string, std::vector<int64_t>, DType, bool>>;
Layout layout_of(const Model & m) {
    Layout out;
    ModelWeights w = m.weights;
    visit_weights(m.config, w, [&](const std::string & name, const std::vector<int64_t> &, WeightRole, Weight & slot) {
        out.emplace_back(name, slot.shape, slot.dtype, slot.present());
    });
    return out;
}

class DummyWeights : public ::testing::TestWithParam<DummyCase> {};

TEST_P(DummyWeights, LayoutOfTheCheckpoint) {
    const auto real = load_model(synth_dir(GetParam(), false));
    const auto dummy = load_model(synth_dir(GetParam(), true), {.dummy = true});
    EXPECT_EQ(dummy->checkpoint, nullptr);
    const Layout a = layout_of(*real), b = layout_of(*dummy);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); i++) {
        EXPECT_EQ(std::get<0>(a[i]), std::get<0>(b[i]));
        EXPECT_EQ(std::get<1>(a[i]), std::get<1>(b[i])) << std::get<0>(a[i]);
        EXPECT_EQ(std::get<2>(a[i]), std::get<2>(b[i])) << std::get<0>(a[i]);
        EXPECT_EQ(std::get<3>(a[i]), std::get<3>(b[i])) << std::get<0>(a[i]);
    }
    // Layout only: the same shapes and dtypes, no values.
    Model bare;
    bare.config = dummy->config;
    dummy_weights(bare.config, bare.weights, false);
    const Layout c = layout_of(bare);
    ASSERT_EQ(c.size(), b.size());
    for (size_t i = 0; i < c.size(); i++) {
        EXPECT_EQ(std::get<1>(c[i]), std::get<1>(b[i])) << std::get<0>(c[i]);
        EXPECT_EQ(std::get<2>(c[i]), std::get<2>(b[i])) << std::get<0>(c[i]);
        EXPECT_FALSE(std::get<3>(c[i])) << std::get<0>(c[i]);
    }
    EXPECT_EQ(decode_weight_bytes(bare), decode_weight_bytes(*real));
    // Two tensors of one init (layers 0 and 1's input norms) view different windows of their pool.
    const Weight & w0 = dummy->weights.layers[0].input_layernorm;
    const Weight & w1 = dummy->weights.layers[1].input_layernorm;
    EXPECT_NE(std::memcmp(w0.data, w1.data, w0.nbytes()), 0);
}

// A prompt of 40 tokens, then one more token: on the GPU a prefill pass and a decode step (quantized MoE experts: the
// prompt's run one by one, the decode step's in the device kernel).
TEST_P(DummyWeights, RunsOnEveryBackend) {
    const std::string dir = synth_dir(GetParam(), true);
    std::vector<int> prompt;
    for (int i = 0; i < 40; i++) prompt.push_back((i * 37 + 3) % 250 + 3);
    const std::vector<int> next = {35};
    std::vector<std::string> backends = {"cpu"};
    if (cuda_available() && GetParam().cuda) backends.push_back("cuda");
    std::vector<std::vector<float>> logits[2];  // [prompt / next][backend]
    for (const std::string & b : backends) {
        EngineOptions eo;
        eo.backend = b;
        eo.max_context = 64;
        eo.dummy_weights = true;
        auto engine = make_engine(dir, eo);
        const int seq = engine->new_sequence(64);
        for (int step = 0; step < 2; step++) {
            std::vector<float> out;
            engine->forward(seq, step == 0 ? prompt : next, false, out);
            for (float v : out) ASSERT_TRUE(std::isfinite(v)) << b;
            logits[step].push_back(out);
        }
    }
    if (backends.size() < 2) return;
    // bf16 weights, bf16 activations on the GPU: the same direction as the CPU's fp32 logits.
    for (int step = 0; step < 2; step++) {
        const std::vector<float> & a = logits[step][0], & b = logits[step][1];
        double dot = 0, na = 0, nb = 0;
        for (size_t i = 0; i < a.size(); i++) {
            dot += double(a[i]) * b[i];
            na += double(a[i]) * a[i];
            nb += double(b[i]) * b[i];
        }
        EXPECT_GT(dot / std::sqrt(na * nb), 0.99) << (step == 0 ? "prompt" : "next token");
    }
}

INSTANTIATE_TEST_SUITE_P(
    Formats, DummyWeights,
    ::testing::Values(DummyCase{"qwen2_bf16", "tiny-qwen2", {}}, DummyCase{"qwen2_moe", "tiny-qwen2-moe", {}},
                      DummyCase{"qwen3_moe", "tiny-qwen3-moe", {}},
                      DummyCase{"gptq4_act", "tiny-qwen2", {"--quant", "gptq-int4", "--group-size", "32", "--desc-act"}},
                      DummyCase{"gptq8_v2", "tiny-qwen3", {"--quant", "gptq-int8", "--group-size", "32", "--gptq-format", "v2"}},
                      // CUDA's GPTQ kernels need in_features in multiples of 32 (the experts' are 48), its bitsandbytes
                      // kernels multiples of 64 (tiny-llama3's are 96).
                      DummyCase{"gptq4_moe", "tiny-qwen2-moe", {"--quant", "gptq-int4", "--group-size", "32"}, false},
                      DummyCase{"gptq4_moe_k64", "tiny-qwen2-moe-k64", {"--quant", "gptq-int4", "--group-size", "32"}},
                      DummyCase{"gptq8_moe_k64", "tiny-qwen2-moe-k64", {"--quant", "gptq-int8", "--group-size", "32", "--gptq-format", "v2"}},
                      DummyCase{"awq", "tiny-qwen2", {"--quant", "awq", "--group-size", "32"}},
                      DummyCase{"nf4_dq", "tiny-llama3", {"--quant", "nf4", "--double-quant"}, false}),
    [](const ::testing::TestParamInfo<DummyCase> & info) { return info.param.name; });

}  // namespace
}  // namespace qinfer
