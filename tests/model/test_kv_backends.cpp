// A quantized KV cache on the GPU against the CPU cache of the same dtype (the specification), end to end: the
// logits of a prefill and of decode steps on the same bf16 checkpoint.
#include <gtest/gtest.h>

#include <cmath>

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

}  // namespace

TEST(KvBackends, CudaQuantizedCacheMatchesCpu) {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
    SynthOptions o;
    o.preset = "tiny-qwen2";
    o.out_dir = test::temp_dir("kv-backends");
    o.seed = 5;
    o.dtype = DType::BF16;
    o.dtype_given = true;
    o.quiet = true;
    synthesize(o);
    for (const char * kv : {"fp8", "int8", "int4"}) {
        const std::vector<float> cpu = run(o.out_dir, "cpu", kv), gpu = run(o.out_dir, "cuda", kv);
        ASSERT_EQ(cpu.size(), gpu.size());
        double num = 0, den = 0;
        for (size_t i = 0; i < cpu.size(); i++) {
            num = std::max(num, double(std::fabs(gpu[i] - cpu[i])));
            den = std::max(den, double(std::fabs(cpu[i])));
        }
        const double err = num / den, tol = std::string(kv) == "int4" ? 1e-1 : 5e-2;
        std::printf("[ kv ] %-4s CUDA vs CPU cache: relative logit error %.2e (tolerance %.0e)\n", kv, err, tol);
        // bf16 activations on the GPU against fp32 on the CPU, and codes of slightly different K/V values.
        EXPECT_LT(err, tol) << kv;
    }
}
