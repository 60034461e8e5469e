// A quantized KV cache on the GPU against the CPU cache of the same dtype (the specification), end to end: the
// logits of a prefill and of decode steps on the same bf16 checkpoint.
#include <gtest/gtest.h>

#include <cmath>

#include "model/qwen.h"
#include "runtime/engine.h"
#include "tools/synth.h"
#include "../unit/test_helpers.h"

using namespace qinfer;

namespace {

// Logits of a 40-token prompt (every position) followed by 6 single-token steps: fp32 [46, vocab].
std::vector<float> run(const std::string & dir, const std::string & backend, const std::string & kv) {
    EngineOptions eo;
    eo.backend = backend;
    eo.kv_dtype = kv;
    eo.max_context = 64;
    auto engine = make_engine(dir, eo);
    const int V = engine->config().vocab_size;
    std::vector<int> prompt;
    for (int i = 0; i < 40; i++) prompt.push_back((i * 37 + 11) % V);
    const int s = engine->new_sequence(64);
    std::vector<float> all, step;
    engine->forward(s, prompt, true, all);
    for (int i = 0; i < 6; i++) {
        engine->forward(s, {(i * 53 + 7) % V}, false, step);
        all.insert(all.end(), step.begin(), step.end());
    }
    engine->free_sequence(s);
    return all;
}

SynthOptions tiny_bf16(const std::string & name, float kv_scale = 0) {
    SynthOptions o;
    o.preset = "tiny-qwen2";
    o.out_dir = test::temp_dir(name);
    o.seed = 5;
    o.dtype = DType::BF16;
    o.dtype_given = true;
    o.quiet = true;
    o.kv_scale = kv_scale;
    synthesize(o);
    return o;
}

}  // namespace

// A checkpoint's k_scale / v_scale (vLLM's fp8 KV scales) are the cache's scales; without them, amax / 448 of the
// first forward's values.
TEST(KvBackends, CheckpointFp8Scales) {
    const SynthOptions with = tiny_bf16("kv-scales", 0.0123f), without = tiny_bf16("kv-no-scales");
    EngineOptions eo;
    eo.backend = "cpu";
    eo.kv_dtype = "fp8";
    eo.max_context = 16;
    for (const SynthOptions * o : {&with, &without}) {
        CpuQwenEngine e(load_model(o->out_dir), eo);
        const int s = e.new_sequence(16);
        std::vector<float> logits;
        e.forward(s, {3, 1, 4, 1, 5}, false, logits);
        for (int l = 0; l < e.config().num_hidden_layers; l++) {
            for (bool value : {false, true}) {
                if (o == &with) {
                    EXPECT_EQ(e.kv_cache().fp8_scale(l, value), 0.0123f) << "layer " << l;
                } else {
                    EXPECT_GT(e.kv_cache().fp8_scale(l, value), 0.0f);
                    EXPECT_NE(e.kv_cache().fp8_scale(l, value), 0.0123f);
                }
            }
        }
    }
}

TEST(KvBackends, CudaQuantizedCacheMatchesCpu) {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
    const SynthOptions o = tiny_bf16("kv-backends"), scaled = tiny_bf16("kv-backends-scaled", 0.05f);
    for (const char * kv : {"fp8", "fp8 (checkpoint scales)", "int8", "int4"}) {
        const bool ck = std::string(kv).find("checkpoint") != std::string::npos;
        const std::string dir = ck ? scaled.out_dir : o.out_dir, dtype = ck ? "fp8" : kv;
        const std::vector<float> cpu = run(dir, "cpu", dtype), gpu = run(dir, "cuda", dtype);
        ASSERT_EQ(cpu.size(), gpu.size());
        double num = 0, den = 0;
        for (size_t i = 0; i < cpu.size(); i++) {
            num = std::max(num, double(std::fabs(gpu[i] - cpu[i])));
            den = std::max(den, double(std::fabs(cpu[i])));
        }
        const double err = num / den, tol = std::string(kv) == "int4" ? 1e-1 : 5e-2;
        std::printf("[ kv ] %-24s CUDA vs CPU cache: relative logit error %.2e (tolerance %.0e)\n", kv, err, tol);
        // bf16 activations on the GPU against fp32 on the CPU, and codes of slightly different K/V values.
        EXPECT_LT(err, tol) << kv;
    }
}
