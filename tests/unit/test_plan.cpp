// qinfer's memory model of the CUDA engine against peaks measured on an H100 (qinfer's allocator, 1 GB = 1e9 bytes,
// 2048 generated): bench/results/2026-11-26-h100-bf16 and bench/results/2026-11-26-h100-quant; more rows below. These
// were measured with the token embedding on the GPU (--embedding-on-gpu since it moved to host memory by default);
// 7B GPTQ-Int4 at 30720 with 4096-token prefill passes at b80b229 (bench/results/2026-11-26-h100-b80b229); 0.5B and
// 1.5B at 30720 with 4096- and 2048-token passes at 41251f5 (bench/results/2026-11-26-h100-chunk-small).
#include <gtest/gtest.h>

#include "model/decode_splits.h"
#include "model/prefill_chunk.h"
#include "model/prefill_splits.h"
#include "tools/plan.h"
#include "tools/presets.h"
#include "tools/synth_quant.h"

namespace qinfer {

// A preset's config.json, with `qinfer synth --quant QUANT`'s quantization_config unless quant is "".
static ModelConfig preset_config(const char * preset, const char * quant) {
    ModelConfig c = parse_model_config(find_preset(preset).config.dump(), preset);
    if (*quant) {
        SynthQuant q;
        q.kind = quant;
        c.quant = parse_quant_config(synth_quant_config(q).dump(), quant);
    }
    return c;
}

// One measured peak at batch 1, 2048 generated.
struct Measured {
    const char * preset;
    const char * quant;  // "" for BF16
    int input;
    double peak_gb;
};

TEST(Plan, MemoryModelMatchesMeasuredPeaks) {
    const Measured rows[] = {
        {"qwen2.5-7b", "", 1, 15.35},         {"qwen2.5-7b", "", 30720, 17.30},     {"qwen2.5-1.5b", "", 1, 3.150},
        {"qwen2.5-1.5b", "", 30720, 4.201},   {"qwen2.5-0.5b", "", 1, 1.016},       {"qwen2.5-0.5b", "", 30720, 1.582},
        {"qwen2.5-7b", "gptq-int4", 1, 5.668}, {"qwen2.5-7b", "gptq-int4", 30720, 8.427}, {"qwen2.5-7b", "awq", 1, 5.719},
        {"qwen2.5-7b", "gptq-int8", 1, 8.931}, {"qwen2.5-0.5b", "gptq-int4", 1, 0.484},
    };
    for (const Measured & m : rows) {
        const ModelConfig c = preset_config(m.preset, m.quant);
        const double est = estimate_cuda_memory(c, KVDType::BF16, 1, m.input, m.input + 2048, /*embedding_on_gpu=*/true).total() / 1e9;
        EXPECT_NEAR(est, m.peak_gb, 0.02 * m.peak_gb) << m.preset << " " << m.quant << " input " << m.input;
        std::printf("[ plan ] %-13s %-10s input %5d: model %.3f GB, measured %.3f GB\n", m.preset, *m.quant ? m.quant : "bf16", m.input,
                    est, m.peak_gb);
    }
}

// The default placement (an untied token embedding in pinned host memory), measured at cd6a074
// (bench/results/2026-11-26-h100-cd6a074; batch 1, 2048 generated); 7B GPTQ-Int4 at 30720 with 4096-token prefill
// passes at 31e49b1 (bench/results/2026-11-26-h100-dequant); 7B YaRN at 129024 with 8192-token passes, GPTQ-Int4 at
// 9893a16 and BF16 at e9c0fa9 (bench/results/2026-11-27-h100-decode-tma, bench/results/2026-11-27-h100-split-keys);
// int8 and fp8 caches below.
TEST(Plan, MemoryModelMatchesHostEmbeddingPeaks) {
    const Measured rows[] = {{"qwen2.5-7b", "", 1, 14.262},           {"qwen2.5-7b", "gptq-int4", 1, 4.576},
                             {"qwen2.5-7b", "gptq-int4", 30720, 7.337}, {"qwen2.5-7b-yarn", "gptq-int4", 129024, 13.65},
                             {"qwen2.5-7b-yarn", "", 129024, 23.03}};
    for (const Measured & m : rows) {
        const ModelConfig c = preset_config(m.preset, m.quant);
        const double est = estimate_cuda_memory(c, KVDType::BF16, 1, m.input, m.input + 2048).total() / 1e9;
        EXPECT_NEAR(est, m.peak_gb, 0.02 * m.peak_gb) << m.preset << " " << m.quant << " input " << m.input;
        std::printf("[ plan ] %-13s %-10s input %5d, embedding in host memory: model %.3f GB, measured %.3f GB\n", m.preset,
                    *m.quant ? m.quant : "bf16", m.input, est, m.peak_gb);
    }
    // Quantized caches with GPTQ-Int4 weights at 0626479, prefill attention on the bf16 dequantization of the prompt
    // (bench/results/2026-11-27-h100-kv-prefill).
    const struct {
        KVDType kv;
        double peak_gb;
    } caches[] = {{KVDType::INT8, 10.39}, {KVDType::FP8, 10.16}};
    for (const auto & m : caches) {
        const double est = estimate_cuda_memory(preset_config("qwen2.5-7b-yarn", "gptq-int4"), m.kv, 1, 129024, 129024 + 2048).total() / 1e9;
        EXPECT_NEAR(est, m.peak_gb, 0.02 * m.peak_gb) << "kv " << kv_dtype_name(m.kv);
        std::printf("[ plan ] qwen2.5-7b-yarn gptq-int4  input 129024, %s cache: model %.3f GB, measured %.3f GB\n", kv_dtype_name(m.kv), est, m.peak_gb);
    }
}

// Batches and KV dtypes, measured at 50c8e40 (bench/results/2026-11-26-h100-50c8e40; the embedding on the GPU then):
// the seed's batch table (input 1, 1024 generated) and the largest batch at 8192 + 16 tokens.
TEST(Plan, MemoryModelMatchesBatchRows) {
    struct Measured {
        const char * preset;
        const char * quant;  // "" for BF16
        KVDType kv;
        int batch, input, context;
        double peak_gb;
    };
    const Measured rows[] = {
        {"qwen2.5-7b", "", KVDType::BF16, 1, 1, 1025, 15.29},           {"qwen2.5-7b", "", KVDType::BF16, 16, 1, 1025, 16.22},
        {"qwen2.5-7b", "", KVDType::BF16, 100, 1, 1025, 21.29},         {"qwen2.5-7b", "", KVDType::INT8, 100, 1, 1025, 18.50},
        {"qwen2.5-7b", "gptq-int4", KVDType::BF16, 1, 1, 1025, 5.61},   {"qwen2.5-7b", "gptq-int4", KVDType::BF16, 100, 1, 1025, 11.91},
        {"qwen2.5-7b", "gptq-int4", KVDType::INT8, 100, 1, 1025, 9.12}, {"qwen2.5-7b", "", KVDType::BF16, 146, 8192, 8208, 84.23},
        {"qwen2.5-7b", "", KVDType::INT4, 517, 8192, 8208, 84.24},      {"qwen2.5-7b", "gptq-int4", KVDType::BF16, 164, 8192, 8208, 83.82},
        {"qwen2.5-7b", "gptq-int4", KVDType::INT4, 583, 8192, 8208, 84.12},
    };
    for (const Measured & m : rows) {
        const ModelConfig c = preset_config(m.preset, m.quant);
        const double est = estimate_cuda_memory(c, m.kv, m.batch, m.input, m.context, /*embedding_on_gpu=*/true).total() / 1e9;
        EXPECT_NEAR(est, m.peak_gb, 0.02 * m.peak_gb) << m.preset << " " << m.quant << " kv " << int(m.kv) << " batch " << m.batch;
        std::printf("[ plan ] %-15s %-10s kv %d batch %3d input %6d: model %.3f GB, measured %.3f GB\n", m.preset,
                    *m.quant ? m.quant : "bf16", int(m.kv), m.batch, m.input, est, m.peak_gb);
    }
}

// The shape of the model where no measurement exists yet: memory grows with batch and context, a quantized cache
// holds less (int4 least), and at 8192 + 16 tokens on 80 GB the int4 cache allows at least 3x the bf16 batch.
TEST(Plan, BatchesAndCacheDtypes) {
    const ModelConfig c = parse_model_config(find_preset("qwen2.5-7b").config.dump(), "7b");
    auto gb = [&](KVDType kv, int batch, int context) { return estimate_cuda_memory(c, kv, batch, 1, context).total() / 1e9; };
    for (KVDType kv : {KVDType::BF16, KVDType::FP8, KVDType::INT8, KVDType::INT4}) {
        EXPECT_LT(gb(kv, 1, 1025), gb(kv, 4, 1025));
        EXPECT_LT(gb(kv, 4, 1025), gb(kv, 100, 1025));
        EXPECT_LT(gb(kv, 1, 1025), gb(kv, 1, 8192));
    }
    EXPECT_LT(gb(KVDType::INT8, 64, 1025), gb(KVDType::BF16, 64, 1025));
    EXPECT_LT(gb(KVDType::INT4, 64, 1025), gb(KVDType::INT8, 64, 1025));
    // KV bytes per token and layer and KV head: bf16 2 d, int8 d + 8 (scale, zero), int4 d / 2 + 8.
    const double d = c.head_dim, per_bf16 = 2 * d, per_int4 = d / 2 + 8;
    const double kv_bf16 = estimate_cuda_memory(c, KVDType::BF16, 10, 1, 1024).kv, kv_int4 = estimate_cuda_memory(c, KVDType::INT4, 10, 1, 1024).kv;
    EXPECT_NEAR(kv_int4 / kv_bf16, per_int4 / per_bf16, 1e-9);
    auto max_batch = [&](KVDType kv) {
        int b = 0;
        while (estimate_cuda_memory(c, kv, b + 1, 8192, 8208).total() <= 79e9) b++;
        return b;
    };
    EXPECT_GE(max_batch(KVDType::INT4), 3 * max_batch(KVDType::BF16));
}

// Prefill passes: a 32nd of the cache (an 8th with quantized weights) in multiples of 128 within [1024, 4096], 8192
// from 65536 tokens of cache on (the seed's rows for 7B: 1024 up to 30720 + 2048 tokens, 8192 at 63488 + 2048 and
// 129024 + 2048), or as many 1024-token blocks as fit 0.2 GB of activations where that is longer (0.5B: 4096,
// 1.5B: 2048).
TEST(Plan, PrefillChunkFollowsTheCache) {
    const double b7 = prefill_bytes_per_token(preset_config("qwen2.5-7b", ""));
    EXPECT_EQ(prefill_chunk_for_cache(16, false, b7), 1024);
    EXPECT_EQ(prefill_chunk_for_cache(32768, false, b7), 1024);
    EXPECT_EQ(prefill_chunk_for_cache(65535, false, b7), 1920);
    EXPECT_EQ(prefill_chunk_for_cache(65536, false, b7), 8192);
    EXPECT_EQ(prefill_chunk_for_cache(100000, false, b7), 8192);
    EXPECT_EQ(prefill_chunk_for_cache(131072, false, b7), 8192);
    EXPECT_EQ(prefill_chunk_for_cache(1 << 30, false, b7), 8192);
    EXPECT_EQ(prefill_chunk_for_cache(65535, true, b7), 4096);
    EXPECT_EQ(prefill_chunk_for_cache(65536, true, b7), 8192);
    EXPECT_EQ(prefill_chunk_for_cache(131072, true, b7), 8192);
    EXPECT_EQ(prefill_chunk_for_cache(8192, true, b7), 1024);
    EXPECT_EQ(prefill_chunk_for_cache(16384, true, b7), 2048);
    EXPECT_EQ(prefill_chunk_for_cache(32768, true, b7), 4096);
    EXPECT_EQ(prefill_chunk_for_cache(32768, false, prefill_bytes_per_token(preset_config("qwen2.5-1.5b", ""))), 2048);
    EXPECT_EQ(prefill_chunk_for_cache(32768, false, prefill_bytes_per_token(preset_config("qwen2.5-0.5b", ""))), 4096);
    EXPECT_EQ(prefill_chunk_for_cache(16, false, prefill_bytes_per_token(preset_config("qwen2.5-0.5b", ""))), 4096);
    // Routed experts: 4096 at least (every expert's weights are read once a pass).
    const double b30 = prefill_bytes_per_token(preset_config("qwen3-30b-a3b", ""));
    EXPECT_EQ(prefill_chunk_for_cache(16, false, b30), 1024);
    EXPECT_EQ(prefill_chunk_for_cache(16, false, b30, true), 4096);
    EXPECT_EQ(prefill_chunk_for_cache(131072, false, b30, true), 8192);
}

// Key splits of the prefill attention's last wave on 132 SMs: the tail pairs after the full waves split where the
// rounds of shorter blocks end sooner; none where the tail is empty, a pass starts the prompt (its lightest tiles are
// short) or the keys are few.
TEST(Plan, PrefillSplitsFillTheLastWave) {
    auto plan = [](int n, int pos0, int heads, int forced = 0) {
        const PrefillSplitPlan p = prefill_split_plan(n, pos0, heads, 132, forced);
        return std::vector<int>{p.full_blocks, p.tail_pairs, p.splits};
    };
    using V = std::vector<int>;
    EXPECT_EQ(plan(1024, 29696, 28), (V{132, 92, 4}));  // 7B's last pass at 30720: 224 pairs, 1.7 waves
    EXPECT_EQ(plan(2048, 28672, 12), (V{132, 60, 2}));  // 1.5B: 192 pairs
    EXPECT_EQ(plan(4096, 26624, 14), (V{396, 52, 5}));  // 0.5B: 448 pairs
    EXPECT_EQ(plan(4096, 26624, 28), (V{792, 104, 5}));  // 7B GPTQ-Int4's 4096-token pass: 896 pairs
    EXPECT_EQ(plan(1024, 0, 28), (V{224, 0, 1}));        // a prompt's first pass: its tail pairs are 1-4 tiles
    EXPECT_EQ(plan(1024, 3072, 28), (V{224, 0, 1}));     // 25-28 tiles: three splits' rounds cost more than one
    EXPECT_EQ(plan(128, 8192, 28), (V{0, 28, 4}));       // a short chunk after a long prefix: 28 pairs on 132 SMs
    EXPECT_EQ(plan(4224, 30720, 12), (V{396, 0, 1}));    // 33 x 12 = 396 pairs: three full waves
    EXPECT_EQ(plan(300, 2000, 14, 3), (V{0, 42, 3}));     // forced (tests): every pair
    EXPECT_EQ(plan(300, 0, 14, 5), (V{42, 0, 1}));      // forced, but the lightest pair has one tile
    EXPECT_EQ(plan(300, 2000, 14, 1), (V{42, 0, 1}));
}

// Tensor parallel over two H200s (--load-format dummy, the embedding in host memory, batch 1, 2048 generated): each
// GPU's estimate summed against the peak of both GPUs together (bench/results/2026-11-29-h200x2-tp at 136ae6a and
// 2d40d6d, bench/results/2026-11-30-h200x2-tp-window at d72b2cf; 57B-A14B at 30720 with MoE passes of 4096 tokens,
// bench/results/2026-11-30-h200x2-moe-wgmma at 9e7ac47): the model is within 0.4% of each.
TEST(Plan, TensorParallelMatchesMeasuredPeaks) {
    const Measured rows[] = {{"qwen2.5-72b", "", 1, 146.129},          {"qwen2.5-72b", "", 6144, 148.507},
                             {"qwen2.5-72b", "", 14336, 151.191},      {"qwen2.5-72b", "", 30720, 156.56},
                             {"qwen2.5-72b", "gptq-int4", 1, 41.927}, {"qwen2.5-72b", "gptq-int4", 30720, 54.438},
                             {"qwen2.5-72b", "gptq-int8", 1, 77.0},   {"qwen2.5-7b", "", 1, 15.373},
                             {"qwen2-57b-a14b", "", 1, 114.986},       {"qwen2-57b-a14b", "", 30720, 118.133}};
    for (const Measured & m : rows) {
        const ModelConfig c = preset_config(m.preset, m.quant);
        double est = 0;
        for (const MemoryEstimate & r : estimate_cuda_tp_memory(c, 2, KVDType::BF16, 1, m.input, m.input + 2048)) est += r.total() / 1e9;
        EXPECT_NEAR(est, m.peak_gb, 0.01 * m.peak_gb) << m.preset << " " << m.quant << " input " << m.input;
        std::printf("[ plan ] --tp 2 %-13s %-10s input %5d: model %.3f GB, measured %.3f GB\n", m.preset, *m.quant ? m.quant : "bf16", m.input,
                    est, m.peak_gb);
    }
}

// Each rank holds its share of the split tensors and a whole copy of the rest (lm_head, norms): the ranks' weights
// add up to the whole model's plus (tp - 1) copies of what is replicated.
TEST(Plan, TensorParallelWeightsAddUp) {
    for (const char * quant : {"", "gptq-int4"}) {
        const ModelConfig c = preset_config("qwen2.5-72b", quant);
        const double whole = estimate_cuda_memory(c, KVDType::BF16, 1, 1, 16).weights;
        const double replicated = double(c.vocab_size) * c.hidden_size * 2 + double(2 * c.num_hidden_layers + 1) * c.hidden_size * 2;
        for (int tp : {2, 4, 8}) {
            double sum = 0;
            for (const MemoryEstimate & r : estimate_cuda_tp_memory(c, tp, KVDType::BF16, 1, 1, 16)) sum += r.weights;
            EXPECT_NEAR(sum, whole + (tp - 1) * replicated, 1e-6 * whole) << (*quant ? quant : "bf16") << " --tp " << tp;
        }
    }
}

// Decode splits in whole waves of 396 blocks (3 per SM on an H100): with the 2048-key splits 7B (4 KV heads) at
// 129024 + 2048 keys needs 64 splits, which fit one wave (99);
// short contexts fill one wave; the cap holds.
TEST(DecodeSplits, WholeWaves) {
    EXPECT_EQ(decode_splits_for(131072, 4, 1, 396), 99);
    EXPECT_EQ(decode_splits_for(32768, 4, 1, 396), 99);
    EXPECT_EQ(decode_splits_for(1, 2, 1, 396), 198);
    EXPECT_EQ(decode_splits_for(1, 4, 100, 396), 1);
    EXPECT_EQ(decode_splits_for(1 << 30, 1, 1, 396), 1024);
    // The same cache in one wave of 264 blocks (2 per SM, the tensor-core kernel at head_dim 128).
    EXPECT_EQ(decode_splits_for(131072, 4, 1, 264), 66);
    for (int len : {1, 17, 4097, 129024, 1 << 20})
        for (int batch : {1, 3, 64})
            EXPECT_GE(decode_splits_for(len, 4, batch, 396) * k_decode_split_keys, std::min(len, 1024 * 1024));
}

}  // namespace qinfer
