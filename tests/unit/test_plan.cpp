// qinfer's memory model of the CUDA engine against peaks measured on an H100 (qinfer's allocator, 1 GB = 1e9 bytes,
// 2048 generated): bench/results/2026-11-26-h100-bf16 and bench/results/2026-11-26-h100-quant.
#include <gtest/gtest.h>

#include "tools/plan.h"
#include "tools/presets.h"
#include "tools/synth_quant.h"

namespace qinfer {

TEST(Plan, MemoryModelMatchesMeasuredPeaks) {
    struct Measured {
        const char * preset;
        const char * quant;  // "" for BF16
        int input;
        double peak_gb;
    };
    const Measured rows[] = {
        {"qwen2.5-7b", "", 1, 15.35},         {"qwen2.5-7b", "", 30720, 17.30},     {"qwen2.5-1.5b", "", 1, 3.150},
        {"qwen2.5-1.5b", "", 30720, 4.125},   {"qwen2.5-0.5b", "", 1, 1.016},       {"qwen2.5-0.5b", "", 30720, 1.453},
        {"qwen2.5-7b", "gptq-int4", 1, 5.668}, {"qwen2.5-7b", "gptq-int4", 30720, 7.920}, {"qwen2.5-7b", "awq", 1, 5.719},
        {"qwen2.5-7b", "gptq-int8", 1, 8.931}, {"qwen2.5-0.5b", "gptq-int4", 1, 0.484},
    };
    for (const Measured & m : rows) {
        ModelConfig c = parse_model_config(find_preset(m.preset).config.dump(), m.preset);
        if (*m.quant) {
            SynthQuant q;
            q.kind = m.quant;
            c.quant = parse_quant_config(synth_quant_config(q).dump(), m.quant);
        }
        const double est = estimate_cuda_memory(c, KVDType::BF16, 1, m.input, m.input + 2048).total() / 1e9;
        EXPECT_NEAR(est, m.peak_gb, 0.02 * m.peak_gb) << m.preset << " " << m.quant << " input " << m.input;
        std::printf("[ plan ] %-13s %-10s input %5d: model %.3f GB, measured %.3f GB\n", m.preset, *m.quant ? m.quant : "bf16", m.input,
                    est, m.peak_gb);
    }
}

}  // namespace qinfer
