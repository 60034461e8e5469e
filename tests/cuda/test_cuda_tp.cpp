// Tensor parallel on the GPUs (model/qwen_cuda_tp.cpp), on two GPUs of this host: every position's logits of a
// prompt and of decode steps through the cache equal the whole model's on one GPU within bf16 rounding (partial sums
// rounded and added in another order), for dense models (Qwen2 with KV heads split, Qwen1.5's multi-head attention,
// Qwen3's q/k norms), MoE with a shared expert, GPTQ and AWQ weights split in their packing, act-order GPTQ (down_proj by
// whole groups, o_proj whole over the gathered heads), quantized experts on the device; device greedy decoding and
// continuous batching give the one GPU's tokens; --tp beyond the GPUs present is a one-line error. Three- and
// four-rank cases (heads in uneven whole groups, KV heads shared by ranks, Qwen3 MoE with a KV head a rank) run where
// that many GPUs are present. Skipped with fewer than two GPUs.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cctype>
#include <cmath>

#include "cuda/helpers.h"
#include "model/backend_cases.h"
#include "model/tp_cases.h"
#include "runtime/engine.h"
#include "runtime/scheduler.h"
#include "tools/synth.h"

using namespace qinfer;

namespace {

std::unique_ptr<Engine> gpu_engine(const std::string & dir, int tp) {
    EngineOptions eo;
    eo.backend = "cuda";
    eo.tp = tp;
    eo.max_context = 128;
    return make_engine(dir, eo);
}

// Every position's logits of a 40-token prompt (prefill in one pass), then four more tokens one at a time (decode
// steps), and the device's greedy continuation of 6 tokens. Then two static batches of the same three prompts: batch A
// decodes 5 greedy steps on the device (graphs; under --tp each rank's share of the vocabulary gathered into rows);
// batch B is fed `forced` tokens step by step (the tensor-parallel engine's own greedy tokens, so that both engines see
// the same inputs) and returns each step's logits. Greedy tokens of two engines can differ where a rounding flips a
// near tie (tiny random models have many); logits given the same inputs cannot.
struct Run {
    std::vector<float> logits;
    std::vector<int> greedy, batch_greedy;  // batch_greedy: int [5 steps, 3 rows]
    std::vector<float> batch_logits;        // fp32 [5 steps, 3 rows, vocab]
    bool device_greedy = true;              // the engine decoded greedily on the device (else: its host loop below)
};
constexpr int k_batch = 3, k_batch_steps = 5;

std::vector<int> argmax_rows(const std::vector<float> & logits, int V);

// n_steps greedy tokens of each sequence ([steps, rows]) on the device, or where the engine declines (quantized
// act-order experts stay on the host) from each step's logits on the host.
bool greedy_steps(Engine & e, const std::vector<int> & seqs, std::vector<int> first, int n_steps, std::vector<int> & out) {
    const int V = e.config().vocab_size;
    if (e.decode_greedy_batch(seqs, first, n_steps, V, out)) return true;
    out.clear();
    std::vector<float> step;
    for (int t = 0; t < n_steps; t++) {
        e.forward_batch(seqs, first, step);
        first = argmax_rows(step, V);
        out.insert(out.end(), first.begin(), first.end());
    }
    return false;
}

// The prompt of run_of's first sequence, then its four decode steps' tokens, then the first token of its greedy run.
std::vector<int> greedy_context(int V) {
    std::vector<int> tokens;
    for (int i = 0; i < 40; i++) tokens.push_back((i * 37 + 11) % V);
    for (int t : {5, 77, 3, 140, 9}) tokens.push_back(t % V);
    return tokens;
}

Run run_of(Engine & e, const std::vector<int> * forced) {
    const int V = e.config().vocab_size;
    const std::vector<int> context = greedy_context(V);
    const std::vector<int> prompt(context.begin(), context.begin() + 40);
    Run r;
    const int seq = e.new_sequence(64);
    std::vector<float> step;
    e.forward(seq, prompt, true, r.logits);
    for (size_t i = 40; i + 1 < context.size(); i++) {
        e.forward(seq, {context[i]}, false, step);
        r.logits.insert(r.logits.end(), step.begin(), step.end());
    }
    r.device_greedy = greedy_steps(e, {seq}, {context.back()}, 6, r.greedy);
    e.free_sequence(seq);
    e.plan_batch(2 * k_batch, 64);
    std::vector<int> a, b;
    for (int i = 0; i < 2 * k_batch; i++) {
        const int s = e.new_sequence(64);
        (i < k_batch ? a : b).push_back(s);
        std::vector<int> p;
        for (int j = 0; j < 5 + 4 * (i % k_batch); j++) p.push_back((j * 29 + 7 * (i % k_batch) + 1) % V);
        e.forward(s, p, false, step);
    }
    const std::vector<int> first = {4 % V, 8 % V, 15 % V};
    r.device_greedy = greedy_steps(e, a, first, k_batch_steps, r.batch_greedy) && r.device_greedy;
    const std::vector<int> & feed = forced ? *forced : r.batch_greedy;
    for (int t = 0; t < k_batch_steps; t++) {
        const std::vector<int> in = t == 0 ? first : std::vector<int>(feed.begin() + (t - 1) * k_batch, feed.begin() + t * k_batch);
        e.forward_batch(b, in, step);
        r.batch_logits.insert(r.batch_logits.end(), step.begin(), step.end());
    }
    for (int s : a) e.free_sequence(s);
    for (int s : b) e.free_sequence(s);
    return r;
}

// The index of each row's largest logit: fp32 [rows, V] -> int [rows].
std::vector<int> argmax_rows(const std::vector<float> & logits, int V) {
    std::vector<int> out;
    for (size_t i = 0; i + size_t(V) <= logits.size(); i += size_t(V)) {
        out.push_back(int(std::max_element(logits.begin() + long(i), logits.begin() + long(i + size_t(V))) - logits.begin() - long(i)));
    }
    return out;
}

double rel_error(const std::vector<float> & a, const std::vector<float> & b) {
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); i++) {
        num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
        den += double(b[i]) * b[i];
    }
    return std::sqrt(num / std::max(den, 1e-30));
}

// Each row's relative error (rows of V logits), sorted: the worst last.
std::vector<std::pair<double, size_t>> errors_by_row(const std::vector<float> & a, const std::vector<float> & b, int V) {
    std::vector<std::pair<double, size_t>> rows;
    for (size_t r = 0; (r + 1) * size_t(V) <= b.size(); r++) {
        const std::vector<float> ra(a.begin() + long(r * V), a.begin() + long((r + 1) * V)), rb(b.begin() + long(r * V), b.begin() + long((r + 1) * V));
        rows.emplace_back(rel_error(ra, rb), r);
    }
    std::sort(rows.begin(), rows.end());
    return rows;
}

// Where the rows' errors lie (a failure message): the median row's relative error and the worst rows'. One row far
// off with the rest near the median is a token routed to other experts (a near tie flipped by rounding); every row off
// is a kernel's error.
std::string row_errors(const std::vector<std::pair<double, size_t>> & rows) {
    if (rows.empty()) return "";
    std::string out = "; rows: median " + std::to_string(rows[rows.size() / 2].first) + ", worst";
    for (size_t i = rows.size(); i-- > rows.size() - std::min<size_t>(4, rows.size());) {
        out += " row " + std::to_string(rows[i].second) + " " + std::to_string(rows[i].first);
    }
    return out;
}

// The two engines' free-running greedy tokens are equal, or where they first part, the one GPU's own logits at that
// step (greedy_context, then the tokens both chose) hold a near tie between the two choices: less than 2e-2 of the
// row's largest logit apart, a rounding flip (logits within 1e-2 relative of each other) rather than a wrong token.
void expect_same_greedy_or_near_tie(Engine & one_gpu, const std::vector<int> & split, const std::vector<int> & one) {
    ASSERT_EQ(split.size(), one.size());
    size_t d = 0;
    while (d < split.size() && split[d] == one[d]) d++;
    if (d == split.size()) return;
    std::vector<int> context = greedy_context(one_gpu.config().vocab_size);
    context.insert(context.end(), one.begin(), one.begin() + long(d));
    const int seq = one_gpu.new_sequence(int(context.size()));
    std::vector<float> logits;
    one_gpu.forward(seq, context, false, logits);
    one_gpu.free_sequence(seq);
    float largest = 0;
    for (float v : logits) largest = std::max(largest, std::fabs(v));
    const double gap = std::fabs(double(logits[size_t(split[d])]) - logits[size_t(one[d])]) / std::max(largest, 1e-30f);
    std::printf("[ tp     ] greedy tokens part at step %zu (%d against one GPU's %d): %.2e of the largest logit apart\n", d, split[d], one[d], gap);
    EXPECT_LT(gap, 2e-2) << "greedy step " << d << ": token " << split[d] << " against one GPU's " << one[d] << " is no near tie";
}

void expect_tp_equals_one_gpu(const std::string & dir, int tp, double tol = 1e-2, bool same_greedy = true, int flipped_rows = 0) {
    if (test::gpu_count() < tp) GTEST_SKIP() << "needs " << tp << " GPUs";
    Run one, split, alone;
    {
        auto e = gpu_engine(dir, tp);
        EXPECT_EQ(e->backend_name(), "cuda-tp" + std::to_string(tp));
        split = run_of(*e, nullptr);
    }
    auto one_gpu = gpu_engine(dir, 1);
    one = run_of(*one_gpu, &split.batch_greedy);
    alone = run_of(*one_gpu, nullptr);
    EXPECT_EQ(split.device_greedy, one.device_greedy) << "one engine decoded on the device, the other did not";
    // One GPU alone: its device greedy tokens are the argmax of its own steps' logits given them.
    EXPECT_EQ(argmax_rows(alone.batch_logits, alone.batch_logits.size() / (k_batch * k_batch_steps)), alone.batch_greedy) << "one GPU";
    ASSERT_EQ(one.logits.size(), split.logits.size());
    ASSERT_EQ(one.batch_logits.size(), split.batch_logits.size());
    const double batch_err = rel_error(split.batch_logits, one.batch_logits);
    // The prompt's rows, less the `flipped_rows` worst (tokens whose top-k experts a rounding difference may flip).
    const int V = one_gpu->config().vocab_size;
    const std::vector<std::pair<double, size_t>> by_row = errors_by_row(split.logits, one.logits, V);
    std::vector<float> kept_split, kept_one;
    for (size_t i = 0; i + size_t(flipped_rows) < by_row.size(); i++) {
        const size_t r = by_row[i].second;
        kept_split.insert(kept_split.end(), split.logits.begin() + long(r * V), split.logits.begin() + long((r + 1) * V));
        kept_one.insert(kept_one.end(), one.logits.begin() + long(r * V), one.logits.begin() + long((r + 1) * V));
    }
    const double err = rel_error(kept_split, kept_one);
    // bf16 activations: o_proj's and down's partial sums are rounded to bf16 before they are added in prefill.
    EXPECT_LT(err, tol) << "relative logit error of --tp " << tp << " against one GPU" << row_errors(by_row);
    EXPECT_LT(batch_err, tol) << "relative logit error of --tp " << tp << "'s batch steps against one GPU";
    std::printf("[ tp     ] %-40s relative logit error %.2e, batch steps %.2e\n", dir.c_str(), err, batch_err);
    if (same_greedy) expect_same_greedy_or_near_tie(*one_gpu, split.greedy, one.greedy);
    // The batch's greedy tokens on the device are the argmax of the same steps' logits (the same engine, same inputs).
    EXPECT_EQ(argmax_rows(split.batch_logits, split.batch_logits.size() / (k_batch * k_batch_steps)), split.batch_greedy);
}

struct Case {
    std::string name, preset, quant;
    int group;
    bool desc_act = false;
    double tol = 1e-2;
    bool same_greedy = true;  // the two engines' free-running greedy tokens are compared (see gptq4_act_moe_k64)
    int tp = 2;
    int flipped_rows = 0;     // prompt rows left out of the comparison (see gptq4_qwen3_moe_kv4_tp4)
};
void PrintTo(const Case & c, std::ostream * os) { *os << c.name; }

class CudaTensorParallel : public ::testing::TestWithParam<Case> {};

TEST_P(CudaTensorParallel, LogitsEqualOneGpu) {
    const Case & c = GetParam();
    if (test::gpu_count() < c.tp) GTEST_SKIP() << "needs " << c.tp << " GPUs";
    expect_tp_equals_one_gpu(c.quant.empty() ? test::synth_once("cuda-tp", c.preset, 7) : test::synth_quant("cuda-tp-" + c.name, c.preset, c.quant, c.group, c.desc_act, 7), c.tp, c.tol, c.same_greedy, c.flipped_rows);
}

const Case k_cases[] = {
    {"qwen2", "tiny-qwen2", "", 0},         // 6 query heads over 2 KV heads: a KV head (and its 3 query heads) a rank
    {"qwen1_5", "tiny-qwen1.5", "", 0},     // multi-head attention, untied lm_head
    {"qwen3", "tiny-qwen3", "", 0},         // q/k norms, head_dim 24
    {"llama3", "tiny-llama3", "", 0},
    {"qwen2_moe", "tiny-qwen2-moe", "", 0}, // bf16 experts and a shared expert, one dense layer
    {"qwen3_moe", "tiny-qwen3-moe", "", 0},
    {"gptq4_g32", "tiny-qwen2-k128", "gptq-int4", 32},
    {"gptq8_g32", "tiny-qwen2-k128", "gptq-int8", 32},
    {"awq_g32", "tiny-qwen2-k128", "awq", 32},
    {"gptq4_moe_k64", "tiny-qwen2-moe-k64", "gptq-int4", 32},  // quantized experts: the device kernel at decode
    // act-order: down_proj split by whole groups, o_proj whole on every rank over the gathered heads
    {"gptq4_act_g32", "tiny-qwen2-k128", "gptq-int4", 32, true},
    {"gptq8_act_g32", "tiny-qwen2-k128", "gptq-int8", 32, true},
    // Act-order experts run one by one on their rows (DevLayer::experts_on_host), each rank's down output rounded to
    // bf16 before the ranks' sum: 1.14e-2 from one GPU (2026-11-30, calls 2 and 3; the CPU's --tp 2 equals its --tp 1
    // within 1.8e-7 on the same checkpoint, so the split itself is exact), within the goldens' 5e-2. That is enough
    // to flip the tiny random model's first free-running greedy token, so only the batch's tokens, fed to both
    // engines alike, are compared for it.
    {"gptq4_act_moe_k64", "tiny-qwen2-moe-k64", "gptq-int4", 32, true, 2e-2, false},
    // Three and four GPUs (skipped on fewer). 8 query heads over 4 KV heads on 3 ranks: 1 / 1 / 2 whole groups, so the
    // ranks hold 2 / 2 / 4 query heads (Qwen2.5-72B's 8 KV heads go 2 / 3 / 3); on 4 ranks a group each.
    {"qwen2_kv4_tp3", "tiny-qwen2-kv4", "", 0, false, 1e-2, true, 3},
    {"qwen2_kv4_tp4", "tiny-qwen2-kv4", "", 0, false, 1e-2, true, 4},
    {"gptq4_kv4_tp3", "tiny-qwen2-kv4", "gptq-int4", 32, false, 1e-2, true, 3},
    {"gptq4_kv4_tp4", "tiny-qwen2-kv4", "gptq-int4", 32, false, 1e-2, true, 4},
    {"qwen2_tp4", "tiny-qwen2", "", 0, false, 1e-2, true, 4},  // 2 KV heads on 4 ranks: each held by two, its 3 query heads as 1 / 2
    // Qwen3-235B-A22B's shape in small: 4 KV heads, one a rank at --tp 4; experts split 4 ways (bf16 and GPTQ on the device)
    {"qwen3_moe_kv4_tp4", "tiny-qwen3-moe-kv4", "", 0, false, 1e-2, true, 4},
    // On four H200s one row of 44 (the prompt's 40, then 4 steps) was 0.169 off with the median row at 3.5e-3 (all
    // 2.45e-2, the batch steps 2.8e-3): a token whose two experts of eight flip on a near tie of the router's logits,
    // not a kernel error (which would move every row; the experts' kernels at this rank's shapes match the CPU,
    // CudaMoeQuant gptq4_asym_g32_i64_b40). That row is left out.
    {"gptq4_qwen3_moe_kv4_tp4", "tiny-qwen3-moe-kv4", "gptq-int4", 32, false, 1e-2, true, 4, 1},
    {"qwen3_moe_kv4_tp3", "tiny-qwen3-moe-kv4", "", 0, false, 1e-2, true, 3},
};
INSTANTIATE_TEST_SUITE_P(Presets, CudaTensorParallel, ::testing::ValuesIn(k_cases), [](const auto & info) { return info.param.name; });

// Continuous batching over two GPUs (and four where present: KV heads shared by two ranks): chunked prompts beside
// decoding rows give each request one GPU's tokens.
TEST(CudaTensorParallelScheduling, TokensEqualOneGpu) {
    if (test::gpu_count() < 2) GTEST_SKIP() << "needs 2 GPUs";
    const std::string dir = test::synth_once("cuda-tp", "tiny-qwen2", 7);
    std::vector<int> one;
    for (int tp : {1, 2, 4}) {
        if (tp > test::gpu_count()) break;
        auto e = gpu_engine(dir, tp);
        const std::vector<int> tokens = test::scheduled_tokens(*e);
        if (tp == 1) one = tokens;
        EXPECT_EQ(tokens.size(), 30u) << "--tp " << tp;
        EXPECT_EQ(tokens, one) << "--tp " << tp;
    }
}

// More ranks than GPUs: a one-line error before any weight is read.
TEST(CudaTensorParallelInput, MoreRanksThanGpus) {
    const int n = test::gpu_count();
    if (n < 1) GTEST_SKIP() << "no CUDA device";
    const std::string dir = test::synth_once("cuda-tp", "tiny-qwen1.5", 7);  // 6 KV heads: 3 and 6 ranks split them
    const int tp = n < 3 ? 3 : 6;
    if (tp <= n) GTEST_SKIP() << n << " GPUs";
    try {
        gpu_engine(dir, tp);
        ADD_FAILURE() << "--tp " << tp << " on " << n << " GPUs loaded";
    } catch (const std::exception & e) {
        EXPECT_NE(std::string(e.what()).find("CUDA device(s) present"), std::string::npos) << e.what();
    }
}

}  // namespace
