// Tensor parallel on the CPU (model/qwen_tp.h): the model split over ranks of one process, its partial sums meeting in
// an in-process all-reduce, gives the whole model's logits within fp32 rounding, for every architecture the loader
// takes (biases, Qwen3's q/k norms, MoE with a shared expert, Llama-3, Qwen1.5's full multi-head attention), with
// KV heads held whole or shared by several ranks, and for GPTQ / AWQ weights split in their packing; and continuous
// batching over it gives the same tokens.
#include <gtest/gtest.h>

#include <cmath>

#include "backend_cases.h"
#include "model/quant.h"
#include "model/qwen_tp.h"
#include "model/tp_cases.h"
#include "runtime/engine.h"
#include "runtime/generate.h"
#include "runtime/scheduler.h"
#include "tools/synth.h"

using namespace qinfer;

namespace {

struct TpCase {
    std::string preset;
    int tp;
};
void PrintTo(const TpCase & c, std::ostream * os) { *os << c.preset << " tp" << c.tp; }

std::unique_ptr<Engine> cpu(const std::string & dir, int tp) {
    EngineOptions eo;
    eo.backend = "cpu";
    eo.tp = tp;
    eo.max_context = 128;
    return make_engine(dir, eo);
}

// Every position's logits of a 13-token prompt, then three more tokens one at a time through the cache.
std::vector<float> logits_of(Engine & e, int vocab) {
    std::vector<int> prompt;
    for (int i = 0; i < 13; i++) prompt.push_back((i * 37 + 11) % vocab);
    const int seq = e.new_sequence(32);
    std::vector<float> all, step;
    e.forward(seq, prompt, true, all);
    for (int t : {5, 77, 3}) {
        e.forward(seq, {t % vocab}, false, step);
        all.insert(all.end(), step.begin(), step.end());
    }
    e.free_sequence(seq);
    return all;
}

// The checkpoint at `dir` on `tp` ranks against one: the same config, and logits within fp32 rounding (partial sums
// added in another order), far below any real difference.
void expect_logits_equal_one_rank(const std::string & dir, int tp) {
    auto whole = cpu(dir, 1);
    auto split = cpu(dir, tp);
    EXPECT_EQ(split->config().vocab_size, whole->config().vocab_size);
    EXPECT_EQ(split->config().num_attention_heads, whole->config().num_attention_heads);
    const int V = whole->config().vocab_size;
    const std::vector<float> a = logits_of(*whole, V), b = logits_of(*split, V);
    ASSERT_EQ(a.size(), b.size());
    float amax = 0, diff = 0;
    for (size_t i = 0; i < a.size(); i++) {
        amax = std::max(amax, std::fabs(a[i]));
        diff = std::max(diff, std::fabs(a[i] - b[i]));
    }
    EXPECT_LE(diff, 1e-5f * std::max(amax, 1.0f)) << "max |logit| " << amax;
}

class TensorParallelCpu : public ::testing::TestWithParam<TpCase> {};

TEST_P(TensorParallelCpu, LogitsEqualOneRank) { expect_logits_equal_one_rank(test::synth_once("tp", GetParam().preset, 3), GetParam().tp); }

const TpCase k_tp_cases[] = {
    {"tiny-qwen2", 2}, {"tiny-qwen2", 4},  // 6 query heads on 2 KV heads: whole groups, then KV heads shared by two ranks
    {"tiny-qwen3", 2},  {"tiny-qwen2-moe", 2}, {"tiny-qwen3-moe", 2}, {"tiny-llama3", 2}, {"tiny-qwen1.5", 3},
    {"tiny-qwen2-kv4", 3}, {"tiny-qwen3-moe-kv4", 4}, {"tiny-qwen3-moe-kv4", 3},
};
INSTANTIATE_TEST_SUITE_P(Presets, TensorParallelCpu, ::testing::ValuesIn(k_tp_cases), [](const auto & info) {
    std::string n = info.param.preset + "_tp" + std::to_string(info.param.tp);
    for (char & ch : n) {
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
    }
    return n;
});

// Quantized checkpoints split in their stored packing: GPTQ 4-bit (groups cut at rank boundaries, and act-order with
// g_idx kept whole-grouped), GPTQ 8-bit, AWQ; logits equal one rank's.
struct QuantCase {
    std::string kind;
    int group;
    bool desc_act;
};
class TensorParallelCpuQuant : public ::testing::TestWithParam<QuantCase> {};

TEST_P(TensorParallelCpuQuant, LogitsEqualOneRank) {
    const QuantCase & q = GetParam();
    const std::string name = "tp-" + q.kind + "-g" + std::to_string(q.group) + (q.desc_act ? "-act" : "");
    expect_logits_equal_one_rank(test::synth_quant(name, "tiny-qwen2", q.kind, q.group, q.desc_act, 5), 2);
}

INSTANTIATE_TEST_SUITE_P(Formats, TensorParallelCpuQuant,
                         ::testing::Values(QuantCase{"gptq-int4", 16, false}, QuantCase{"gptq-int4", 32, true}, QuantCase{"gptq-int8", 16, false},
                                           QuantCase{"gptq-int8", 32, true},
                                           QuantCase{"awq", 16, false}),
                         [](const auto & info) {
                             return std::string(info.param.kind == "gptq-int4" ? "gptq4" : info.param.kind == "gptq-int8" ? "gptq8" : "awq") + "_g" +
                                    std::to_string(info.param.group) + (info.param.desc_act ? "_act" : "");
                         });

// An act-order down_proj is split by whole groups: each rank's down slice has no g_idx and holds, in group order, the
// channels of its groups; its gate/up rows are those channels. Checked on the dequantized weights, exactly.
TEST(TensorParallelCpuActOrder, DownSplitByGroups) {
    const std::unique_ptr<Model> full = load_model(test::synth_quant("tp-act-shard", "tiny-qwen2", "gptq-int4", 32, true, 9), LoadOptions{});
    const MlpWeights & m = full->weights.layers[0].mlp;
    ASSERT_TRUE(has_act_order(m.down_proj));
    const int I = full->config.intermediate_size, H = full->config.hidden_size, G = 32;
    const std::vector<float> down = dequantize(m.down_proj), gate = dequantize(m.gate_proj);  // [H, I], [I, H]
    const int32_t * g_idx = static_cast<const int32_t *>(m.down_proj.g_idx.data);
    const int align = tp_inter_align(*full, 1);
    ShardBuffers owned;
    int covered = 0;
    for (const TpShard & s : plan_tensor_parallel(full->config, 2, align)) {
        const std::unique_ptr<Model> shard = shard_model(*full, s, 2, owned, align);
        const MlpWeights & r = shard->weights.layers[0].mlp;
        EXPECT_FALSE(r.down_proj.g_idx.present());
        EXPECT_TRUE(r.gate_proj.g_idx.present() == m.gate_proj.g_idx.present());
        const int n = r.down_proj.in_features;
        const std::vector<float> rdown = dequantize(r.down_proj), rgate = dequantize(r.gate_proj);
        // Its channels: those of groups [covered / G, ...) in group order, as the full matrices hold them.
        std::vector<int> pick;
        for (int g = covered / G; g < (covered + n) / G; g++) {
            for (int k = 0; k < I; k++) {
                if (g_idx[k] == g) pick.push_back(k);
            }
        }
        ASSERT_EQ(int(pick.size()), n);
        for (int j = 0; j < n; j++) {
            for (int h = 0; h < H; h++) {
                ASSERT_EQ(rdown[size_t(h) * n + j], down[size_t(h) * I + pick[size_t(j)]]) << "down row " << h << " channel " << j;
                ASSERT_EQ(rgate[size_t(j) * H + h], gate[size_t(pick[size_t(j)]) * H + h]) << "gate row " << j;
            }
        }
        covered += n;
    }
    EXPECT_EQ(covered, I);
}

// The scheduler over two ranks: chunked prompts beside decoding rows give each request the tokens of one rank.
TEST(TensorParallelCpuScheduling, TokensEqualOneRank) {
    const std::string dir = test::synth_once("tp", "tiny-qwen2", 3);
    std::vector<std::vector<int>> runs;
    for (int tp : {1, 2}) {
        auto e = cpu(dir, tp);
        runs.push_back(test::scheduled_tokens(*e));
    }
    EXPECT_EQ(runs[0].size(), 30u);
    EXPECT_EQ(runs[0], runs[1]);
}

}  // namespace
