// End-to-end: the CPU backend against logits and greedy tokens recorded from Hugging Face transformers
// (scripts/make_goldens.py). The checkpoints are rebuilt here with `qinfer synth` (deterministic), except the
// one transformers wrote itself, which is committed.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/npy.h"
#include "model/rope.h"
#include "runtime/engine.h"
#include "runtime/generate.h"
#include "tools/args.h"
#include "tools/synth.h"
#include "../unit/test_helpers.h"

using namespace qinfer;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

const fs::path k_goldens = fs::path(QINFER_TEST_DATA) / "goldens";

std::vector<std::string> golden_names() {
    std::ifstream in(k_goldens / "index.json");
    if (!in) return {};
    return json::parse(in).get<std::vector<std::string>>();
}

// max |a - b| / max |b|
double rel_error(const std::vector<float> & a, const std::vector<float> & b) {
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); i++) {
        num = std::max(num, double(std::fabs(a[i] - b[i])));
        den = std::max(den, double(std::fabs(b[i])));
    }
    return num / den;
}

class Golden : public ::testing::TestWithParam<std::string> {};
class GoldenCuda : public ::testing::TestWithParam<std::string> {};


}  // namespace

static void check_golden(const std::string & name, const std::string & backend);

TEST(Goldens, Present) { ASSERT_FALSE(golden_names().empty()) << "no goldens under " << k_goldens << "; run scripts/make_goldens.py"; }

TEST_P(Golden, CpuMatchesTransformers) { check_golden(GetParam(), "cpu"); }

// The CUDA backend runs bf16 weights and activations (fp32 checkpoints are converted at load), so it is held to
// bf16 tolerances against transformers' fp32 logits.
TEST_P(GoldenCuda, CudaMatchesTransformers) {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
    check_golden(GetParam(), "cuda");
}

static void check_golden(const std::string & name, const std::string & backend) {
    const bool gpu = backend == "cuda";
    json meta = json::parse(std::ifstream(k_goldens / (name + ".json")));
    std::string dir;
    if (meta.contains("checkpoint")) {
        dir = (k_goldens / meta["checkpoint"].get<std::string>()).string();
    } else {
        dir = test::temp_dir("golden-" + backend + "-" + name);
        SynthOptions o;
        o.preset = meta["preset"];
        o.out_dir = dir;
        o.seed = meta["seed"];
        std::string dt = meta["dtype"];
        o.dtype = dt == "bf16" ? DType::BF16 : dt == "fp16" ? DType::F16 : DType::F32;
        o.dtype_given = dt != "quant";
        if (meta.contains("synth")) {
            // The synth options of a quantized case, e.g. --quant gptq-int4 --group-size 32 --desc-act.
            std::vector<std::string> opts = meta["synth"];
            std::vector<char *> argv = {const_cast<char *>("qinfer"), const_cast<char *>("synth")};
            for (auto & s : opts) argv.push_back(s.data());
            Args a(int(argv.size()), argv.data(), 2, {"desc-act", "asym", "double-quant"});
            o.quant = synth_quant_from_args(a);
        }
        synthesize(o);
    }
    const std::string dtype = meta["dtype"];
    // Quantized cases: transformers ran the fp32 dequantized weights (fp16 unquantized tensors widened exactly).
    const bool exact = !gpu && (dtype == "fp32" || dtype == "bf16-as-fp32" || dtype == "quant");
    std::vector<int> prompt = meta["prompt"], greedy = meta["greedy"];

    EngineOptions eo;
    eo.backend = backend;
    eo.max_context = int(prompt.size() + greedy.size());
    auto engine = make_engine(dir, eo);

    // RoPE frequencies equal transformers' inv_freq and attention_scaling.
    RopeFreqs f = compute_rope_freqs(engine->config(), 0);
    std::vector<float> hf_inv = meta["rope"]["inv_freq"];
    ASSERT_EQ(f.inv_freq.size(), hf_inv.size());
    for (size_t i = 0; i < hf_inv.size(); i++) EXPECT_NEAR(f.inv_freq[i], hf_inv[i], 1e-6 * std::fabs(hf_inv[i]) + 1e-12) << i;
    EXPECT_NEAR(f.attention_scaling, meta["rope"]["attention_scaling"].get<double>(), 1e-6);

    // Logits of the whole sequence (prompt + transformers' greedy continuation), teacher-forced.
    std::vector<int> all = prompt;
    all.insert(all.end(), greedy.begin(), greedy.end());
    int seq = engine->new_sequence(int(all.size()));
    std::vector<float> logits;
    engine->forward(seq, all, true, logits);
    engine->free_sequence(seq);
    std::vector<int64_t> shape;
    std::vector<float> ref = read_npy_f32((k_goldens / meta["logits"].get<std::string>()).string(), &shape);
    ASSERT_EQ(shape, (std::vector<int64_t>{int64_t(all.size()), engine->config().vocab_size}));
    double err = rel_error(logits, ref);
    // fp32: transformers' fp32 math; bf16/fp16: transformers rounds every activation to the weight dtype while qinfer's
    // CPU reference keeps fp32, so the difference is a few bf16/fp16 rounding steps.
    double tol = gpu ? 5e-2 : exact ? 1e-4 : dtype == "bf16" ? 2e-2 : 2e-3;
    EXPECT_LT(err, tol) << name << ": relative logit error " << err;
    std::printf("[ golden ] %-5s %-28s relative logit error %.2e (tolerance %.0e)\n", backend.c_str(), name.c_str(), err, tol);

    // Greedy continuation from the prompt, through the KV cache one token at a time.
    GenerateOptions g;
    g.max_new_tokens = int(greedy.size());
    g.ignore_eos = true;
    GenerateResult r = generate(*engine, prompt, g);
    if (exact) {
        EXPECT_EQ(r.tokens, greedy) << name;
    } else {
        size_t same = 0;
        while (same < greedy.size() && r.tokens[same] == greedy[same]) same++;
        std::printf("[ golden ] %-5s %-28s greedy tokens identical for the first %zu of %zu\n", backend.c_str(), name.c_str(), same,
                    greedy.size());
        EXPECT_GE(same, 1u);
    }
    if (gpu) {
        // The device's greedy decode (CUDA graph, decode attention over the growing cache) must pick, at every step,
        // a token that the prefill path also ranks first, up to bf16 near-ties.
        std::vector<int> seq_tokens = prompt;
        seq_tokens.insert(seq_tokens.end(), r.tokens.begin(), r.tokens.end() - 1);
        int s2 = engine->new_sequence(int(seq_tokens.size()));
        std::vector<float> all_logits;
        engine->forward(s2, seq_tokens, true, all_logits);
        engine->free_sequence(s2);
        const int V = engine->config().vocab_size;
        for (size_t i = 0; i < r.tokens.size(); i++) {
            const float * row = all_logits.data() + (prompt.size() - 1 + i) * size_t(V);
            float mx = -INFINITY, amax = 0;
            for (int v = 0; v < V; v++) {
                mx = std::max(mx, row[v]);
                amax = std::max(amax, std::fabs(row[v]));
            }
            EXPECT_GE(row[r.tokens[i]], mx - 2e-2f * amax) << name << ": decode step " << i << " chose token " << r.tokens[i];
        }
    }
}

static std::string test_name(const ::testing::TestParamInfo<std::string> & info) {
    std::string n = info.param;
    for (char & ch : n) {
        if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
    }
    return n;
}
INSTANTIATE_TEST_SUITE_P(Transformers, Golden, ::testing::ValuesIn(golden_names()), test_name);
INSTANTIATE_TEST_SUITE_P(Transformers, GoldenCuda, ::testing::ValuesIn(golden_names()), test_name);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(Golden);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(GoldenCuda);
