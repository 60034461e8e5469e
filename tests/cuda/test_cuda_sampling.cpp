// Sampling on the device against the host Sampler's rules (runtime/sampler.h): the distribution of thousands of
// draws (one per row, each at its own position) against the exact probabilities of the rules and against the host
// Sampler's own draws; the decode state and penalty counts it advances; sampled generation end to end.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

#include "backends/cuda/ops.h"
#include "cuda/helpers.h"
#include "runtime/engine.h"
#include "runtime/generate.h"
#include "runtime/sampler.h"
#include "tools/synth.h"
#include "unit/test_helpers.h"

using namespace qinfer;
using namespace qinfer::test;
using cuda::DeviceBuffer;

namespace {

// The probability of every id under the rules: penalties, temperature, top-k (ties: lower id), softmax, top-p (the
// smallest prefix reaching it), min-p (relative to the most likely).
std::vector<double> rule_probabilities(std::vector<float> logits, int n_valid, const SamplingParams & p, const std::vector<int> & prompt,
                                       const std::vector<int> & output) {
    std::vector<int> counts(logits.size(), 0);
    std::vector<bool> seen(logits.size(), false);
    for (int t : prompt) seen[size_t(t)] = true;
    for (int t : output) {
        seen[size_t(t)] = true;
        counts[size_t(t)]++;
    }
    for (int i = 0; i < n_valid; i++) {
        float & l = logits[size_t(i)];
        if (seen[size_t(i)] && p.repetition_penalty != 1.0f) l = l > 0 ? l / p.repetition_penalty : l * p.repetition_penalty;
        if (counts[size_t(i)]) l -= p.presence_penalty + p.frequency_penalty * float(counts[size_t(i)]);
        l /= p.temperature;
    }
    std::vector<int> idx(static_cast<size_t>(n_valid));
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return logits[size_t(a)] > logits[size_t(b)]; });
    idx.resize(size_t(p.top_k));
    std::vector<double> prob;
    double sum = 0;
    for (int i : idx) sum += prob.emplace_back(std::exp(double(logits[size_t(i)]) - double(logits[size_t(idx[0])])));
    for (double & v : prob) v /= sum;
    size_t cut = prob.size();
    double cum = 0;
    for (size_t j = 0; j < prob.size(); j++) {
        cum += prob[j];
        if (cum >= p.top_p) {
            cut = j + 1;
            break;
        }
    }
    size_t c = 1;
    while (c < cut && prob[c] >= p.min_p * prob[0]) c++;
    cut = c;
    const double kept = std::accumulate(prob.begin(), prob.begin() + long(cut), 0.0);
    std::vector<double> out(logits.size(), 0.0);
    for (size_t j = 0; j < cut; j++) out[size_t(idx[j])] = prob[j] / kept;
    return out;
}

}  // namespace

TEST(CudaSampling, DistributionAndState) {
    REQUIRE_GPU();
    const int vocab = 1003, n_valid = 1000, rows = 8000;
    std::vector<float> logits = randn(size_t(vocab), 1.5f);
    logits[1001] = 100.0f;  // past n_valid: never drawn
    SamplingParams p;
    p.temperature = 0.8f;
    p.top_k = 12;
    p.top_p = 0.9f;
    p.min_p = 0.02f;
    p.repetition_penalty = 1.3f;
    p.presence_penalty = 0.2f;
    p.frequency_penalty = 0.1f;
    p.seed = 1234;
    // Make the penalties matter: the best ids are in the history.
    std::vector<int> order(static_cast<size_t>(n_valid));
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int a, int b) { return logits[size_t(a)] > logits[size_t(b)]; });
    const std::vector<int> prompt = {order[0], order[3]}, output = {order[1], order[1], order[5]};
    const std::vector<double> want = rule_probabilities(logits, n_valid, p, prompt, output);

    // The host Sampler agrees with the rule probabilities (so the comparison below is with the Sampler).
    std::vector<double> host(size_t(vocab), 0.0);
    const int host_draws = 20000;
    for (int i = 0; i < host_draws; i++) {
        SamplingParams q = p;
        q.seed = uint64_t(i);
        Sampler s(q, n_valid);
        std::vector<float> l = logits;
        host[size_t(s.sample(l.data(), vocab, prompt, output))] += 1.0 / host_draws;
    }

    // rows identical logits and history; each row at its own position, so every draw is independent.
    std::vector<float> all(size_t(rows) * vocab);
    std::vector<uint8_t> seen(size_t(rows) * vocab, 0);
    std::vector<int> counts(size_t(rows) * vocab, 0), state(3 * size_t(rows) + 1, 0);
    for (int r = 0; r < rows; r++) {
        std::copy(logits.begin(), logits.end(), all.begin() + long(r) * vocab);
        for (int t : prompt) seen[size_t(r) * vocab + size_t(t)] = 1;
        for (int t : output) {
            seen[size_t(r) * vocab + size_t(t)] = 1;
            counts[size_t(r) * vocab + size_t(t)]++;
        }
        state[size_t(rows + r)] = 100 + r;            // position
        state[size_t(2 * rows + 1 + r)] = 101 + r;    // length
    }
    DeviceBuffer dl = upload(all), ds = upload(seen), dc = upload(counts), dst = upload(state), dw(size_t(rows) * vocab * 4, "test");
    DeviceBuffer dout = upload(std::vector<int>(size_t(rows), -1));
    const cuda::SampleParams cp{p.temperature, p.top_p, p.min_p, p.repetition_penalty, p.presence_penalty, p.frequency_penalty, p.top_k, p.seed};
    int * s = dst.as<int>();
    cuda::sample_rows_advance(dl.as<float>(), rows, vocab, n_valid, cp, ds.as<uint8_t>(), dc.as<int>(), dw.as<float>(), s, s + rows,
                              s + 2 * rows, s + 2 * rows + 1, dout.as<int>(), nullptr);
    std::vector<int> got_state(state.size()), got(static_cast<size_t>(rows)), got_counts(counts.size());
    std::vector<uint8_t> got_seen(seen.size());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    cudaMemcpy(got_state.data(), dst.get(), got_state.size() * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(got.data(), dout.get(), got.size() * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(got_counts.data(), dc.get(), got_counts.size() * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(got_seen.data(), ds.get(), got_seen.size(), cudaMemcpyDeviceToHost);
    std::vector<double> device(size_t(vocab), 0.0);
    for (int r = 0; r < rows; r++) {
        const int tok = got[size_t(r)];
        ASSERT_TRUE(tok >= 0 && tok < n_valid) << "row " << r << " drew " << tok;
        EXPECT_GT(want[size_t(tok)], 0.0) << "row " << r << " drew " << tok << ", which the rules exclude";
        EXPECT_EQ(got_state[size_t(r)], tok);
        EXPECT_EQ(got_state[size_t(rows + r)], 101 + r);
        EXPECT_EQ(got_state[size_t(2 * rows + 1 + r)], 102 + r);
        EXPECT_EQ(got_seen[size_t(r) * vocab + size_t(tok)], 1);
        EXPECT_EQ(got_counts[size_t(r) * vocab + size_t(tok)], counts[size_t(r) * vocab + size_t(tok)] + 1);
        device[size_t(tok)] += 1.0 / rows;
    }
    EXPECT_EQ(got_state[size_t(2 * rows)], 1);  // the step counter
    // Frequencies within 5 standard errors of the rule probabilities, for the device and the host alike.
    for (int i = 0; i < vocab; i++) {
        const double w = want[size_t(i)];
        EXPECT_NEAR(device[size_t(i)], w, 5 * std::sqrt(w * (1 - w) / rows) + 1e-9) << "id " << i;
        EXPECT_NEAR(host[size_t(i)], w, 5 * std::sqrt(w * (1 - w) / host_draws) + 1e-9) << "id " << i;
    }
}

// Sampled generation on the device: the requested number of tokens, ids below the tokenizer size, and the same
// tokens again for the same seed (draws depend on the seed and positions only), other tokens for another seed.
TEST(CudaSampling, GenerateIsReproducible) {
    REQUIRE_GPU();
    SynthOptions o;
    o.preset = "tiny-qwen2";
    o.out_dir = temp_dir("cuda-sampling");
    o.quiet = true;
    synthesize(o);
    EngineOptions eo;
    eo.backend = "cuda";
    eo.max_context = 64;
    auto engine = make_engine(o.out_dir, eo);
    GenerateOptions g;
    g.max_new_tokens = 40;
    g.ignore_eos = true;
    g.sampling.temperature = 30.0f;  // the tiny tied preset's logits are wide (std ~30): flatten them
    g.sampling.top_k = 40;
    g.sampling.top_p = 0.95f;
    g.sampling.repetition_penalty = 1.1f;
    g.n_valid_tokens = 250;
    g.sampling.seed = 7;
    const std::vector<int> prompt = {5, 9, 2};
    const std::vector<int> a = generate(*engine, prompt, g).tokens, b = generate(*engine, prompt, g).tokens;
    g.sampling.seed = 8;
    const std::vector<int> c = generate(*engine, prompt, g).tokens;
    ASSERT_EQ(a.size(), 40u);
    EXPECT_EQ(a, b);
    EXPECT_NE(a, c);
    for (int t : a) EXPECT_LT(t, 250);
    // A static batch samples on the device too: reproducible, every sequence its own tokens.
    const std::vector<std::vector<int>> prompts = {{5, 9, 2}, {7}, {1, 2, 3, 4}};
    g.sampling.seed = 7;
    const BatchGenerateResult x = generate_batch(*engine, prompts, g), y = generate_batch(*engine, prompts, g);
    EXPECT_EQ(x.tokens, y.tokens);
    for (const auto & t : x.tokens) {
        ASSERT_EQ(t.size(), 40u);
        for (int id : t) EXPECT_LT(id, 250);
    }
    EXPECT_NE(x.tokens[0], x.tokens[1]);
}

// Continuous batching's per-row picking (pick_rows_advance): greedy rows give the host argmax over their own
// n_valid ids; sampled rows (no penalties) follow the rules' distribution; each row's state advances.
// (rows % 3 == 0: greedy over the whole vocabulary; 1: greedy over 500 ids; 2: sampled over 600 ids.)
TEST(CudaSampling, PickRowsByTheirOwnSettings) {
    REQUIRE_GPU();
    const int vocab = 1003, rows = 6001;
    std::vector<float> logits = randn(size_t(vocab), 1.5f);
    logits[1001] = 100.0f;  // the full-vocabulary greedy rows' pick
    logits[700] = 50.0f;    // past the other rows' n_valid (500, 600)
    SamplingParams p;
    p.temperature = 0.7f;
    p.top_k = 9;
    p.top_p = 0.85f;
    p.min_p = 0.05f;
    const std::vector<double> want = rule_probabilities(logits, 600, p, {}, {});
    std::vector<float> all(size_t(rows) * vocab);
    std::vector<int> state(3 * size_t(rows) + 1, 0);
    std::vector<cuda::RowPick> picks(static_cast<size_t>(rows));
    for (int r = 0; r < rows; r++) {
        std::copy(logits.begin(), logits.end(), all.begin() + long(r) * vocab);
        state[size_t(rows + r)] = 10 + r;
        state[size_t(2 * rows + 1 + r)] = 11 + r;
        cuda::RowPick & k = picks[size_t(r)];
        k.n_valid = r % 3 == 0 ? vocab : r % 3 == 1 ? 500 : 600;
        if (r % 3 == 2) {
            k.temperature = p.temperature;
            k.top_k = p.top_k;
            k.top_p = p.top_p;
            k.min_p = p.min_p;
            k.seed = 77;
        }
    }
    DeviceBuffer dl = upload(all), dst = upload(state), dw(size_t(rows) * vocab * 4, "test"), dout = upload(std::vector<int>(size_t(rows), -1));
    DeviceBuffer dp(picks.size() * sizeof(cuda::RowPick), "test");
    ASSERT_EQ(cudaMemcpy(dp.get(), picks.data(), picks.size() * sizeof(cuda::RowPick), cudaMemcpyHostToDevice), cudaSuccess);
    int * s = dst.as<int>();
    DeviceBuffer dh = upload(std::vector<int>{0}), dc = upload(std::vector<int>(size_t(rows) * vocab, 0));
    cuda::pick_rows_advance(dl.as<float>(), rows, vocab, dp.as<cuda::RowPick>(), dh.as<int>(), dw.as<float>(), dc.as<int>(), s, s + rows, s + 2 * rows,
                            s + 2 * rows + 1, dout.as<int>(), nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<int> got(static_cast<size_t>(rows)), got_state(state.size());
    cudaMemcpy(got.data(), dout.get(), got.size() * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(got_state.data(), dst.get(), got_state.size() * 4, cudaMemcpyDeviceToHost);
    const int argmax_all = 1001;
    const int argmax_500 = int(std::max_element(logits.begin(), logits.begin() + 500) - logits.begin());
    std::vector<double> freq(size_t(vocab), 0.0);
    int sampled = 0;
    for (int r = 0; r < rows; r++) {
        const int tok = got[size_t(r)];
        if (r % 3 == 0) {
            EXPECT_EQ(tok, argmax_all) << "row " << r;
        }
        if (r % 3 == 1) {
            EXPECT_EQ(tok, argmax_500) << "row " << r;
        }
        if (r % 3 == 2) {
            ASSERT_TRUE(tok >= 0 && tok < 600) << "row " << r;
            EXPECT_GT(want[size_t(tok)], 0.0) << "row " << r << " drew " << tok << ", which the rules exclude";
            freq[size_t(tok)] += 1;
            sampled++;
        }
        EXPECT_EQ(got_state[size_t(r)], tok);
        EXPECT_EQ(got_state[size_t(rows + r)], 11 + r);
        EXPECT_EQ(got_state[size_t(2 * rows + 1 + r)], 12 + r);
    }
    EXPECT_EQ(got_state[size_t(2 * rows)], 1);
    for (int i = 0; i < vocab; i++) {
        const double w = want[size_t(i)];
        EXPECT_NEAR(freq[size_t(i)] / sampled, w, 5 * std::sqrt(w * (1 - w) / sampled) + 1e-9) << "id " << i;
    }
}

// Penalties on the device by the rows' own histories: greedy rows give the host Sampler's token, sampled rows the
// rules' distribution, and the counts scratch is zero again afterwards.
TEST(CudaSampling, PickRowsWithPenalties) {
    REQUIRE_GPU();
    const int vocab = 517, rows = 6000;
    std::vector<float> logits = randn(size_t(vocab), 1.5f);
    std::vector<int> order(static_cast<size_t>(vocab));
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int a, int b) { return logits[size_t(a)] > logits[size_t(b)]; });
    const std::vector<int> prompt = {order[0], order[4], order[0]}, output = {order[1], order[1], order[2], order[6]};
    SamplingParams p;
    p.temperature = 0.9f;
    p.top_k = 10;
    p.top_p = 0.95f;
    p.repetition_penalty = 1.4f;
    p.presence_penalty = 0.3f;
    p.frequency_penalty = 0.25f;
    const std::vector<double> want = rule_probabilities(logits, vocab, p, prompt, output);
    SamplingParams g = p;
    g.temperature = 0;
    std::vector<float> l = logits;
    const int greedy = Sampler(g, vocab).sample(l.data(), vocab, prompt, output);
    std::vector<float> all(size_t(rows) * vocab);
    std::vector<int> state(3 * size_t(rows) + 1, 0), history;
    std::vector<cuda::RowPick> picks(static_cast<size_t>(rows));
    for (int r = 0; r < rows; r++) {
        std::copy(logits.begin(), logits.end(), all.begin() + long(r) * vocab);
        state[size_t(rows + r)] = r;
        state[size_t(2 * rows + 1 + r)] = r + 1;
        cuda::RowPick & k = picks[size_t(r)];
        k.n_valid = vocab;
        k.temperature = r % 2 ? p.temperature : 0.0f;
        k.top_k = p.top_k;
        k.top_p = p.top_p;
        k.seed = 5;
        k.repetition_penalty = p.repetition_penalty;
        k.presence_penalty = p.presence_penalty;
        k.frequency_penalty = p.frequency_penalty;
        k.hist_off = int(history.size());
        k.n_prompt = int(prompt.size());
        k.n_output = int(output.size());
        history.insert(history.end(), prompt.begin(), prompt.end());
        history.insert(history.end(), output.begin(), output.end());
    }
    DeviceBuffer dl = upload(all), dst = upload(state), dh = upload(history), dc = upload(std::vector<int>(size_t(rows) * vocab, 0));
    DeviceBuffer dw(size_t(rows) * vocab * 4, "test"), dout = upload(std::vector<int>(size_t(rows), -1)), dp(picks.size() * sizeof(cuda::RowPick), "test");
    ASSERT_EQ(cudaMemcpy(dp.get(), picks.data(), picks.size() * sizeof(cuda::RowPick), cudaMemcpyHostToDevice), cudaSuccess);
    int * s = dst.as<int>();
    cuda::pick_rows_advance(dl.as<float>(), rows, vocab, dp.as<cuda::RowPick>(), dh.as<int>(), dw.as<float>(), dc.as<int>(), s, s + rows, s + 2 * rows,
                            s + 2 * rows + 1, dout.as<int>(), nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<int> got(static_cast<size_t>(rows)), counts(size_t(rows) * vocab);
    cudaMemcpy(got.data(), dout.get(), got.size() * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(counts.data(), dc.get(), counts.size() * 4, cudaMemcpyDeviceToHost);
    EXPECT_TRUE(std::all_of(counts.begin(), counts.end(), [](int c) { return c == 0; })) << "the counts scratch was left dirty";
    std::vector<double> freq(size_t(vocab), 0.0);
    for (int r = 0; r < rows; r++) {
        if (r % 2 == 0) {
            EXPECT_EQ(got[size_t(r)], greedy) << "row " << r;
            continue;
        }
        ASSERT_TRUE(got[size_t(r)] >= 0 && got[size_t(r)] < vocab);
        EXPECT_GT(want[size_t(got[size_t(r)])], 0.0) << "row " << r;
        freq[size_t(got[size_t(r)])] += 2.0 / rows;
    }
    for (int i = 0; i < vocab; i++) {
        const double w = want[size_t(i)];
        EXPECT_NEAR(freq[size_t(i)], w, 5 * std::sqrt(w * (1 - w) / (rows / 2)) + 1e-9) << "id " << i;
    }
}

// The rows of a prefill pass (pick_slots) pick by the same rules as a decode step's rows: each row's token equals
// pick_rows_advance's for the same logits and settings (its position in RowPick::pos), written to its slot; rows of
// slot -1 are left to the host. Greedy, greedy over fewer ids, sampled, and penalised rows, on distinct logits.
TEST(CudaSampling, PickSlotsEqualPickRows) {
    REQUIRE_GPU();
    const int vocab = 733, rows = 257, slots_n = 300;
    const std::vector<float> all = randn(size_t(rows) * vocab, 2.0f);
    const std::vector<int> prompt = {3, 9, 3, 700}, output = {5, 5, 12};
    std::vector<int> state(3 * size_t(rows) + 1, 0), history, slot(static_cast<size_t>(rows));
    std::vector<cuda::RowPick> picks(static_cast<size_t>(rows)), by_slot(static_cast<size_t>(slots_n));
    for (int r = 0; r < rows; r++) {
        state[size_t(rows + r)] = 40 + 3 * r;
        state[size_t(2 * rows + 1 + r)] = 41 + 3 * r;
        cuda::RowPick & k = picks[size_t(r)];
        k.n_valid = r % 5 == 1 ? 400 : vocab;
        if (r % 5 >= 2) {
            k.temperature = 0.8f;
            k.top_k = 1 + r % 40;
            k.top_p = 0.9f;
            k.seed = 1000 + uint64_t(r);
        }
        if (r % 5 == 4) {
            k.repetition_penalty = 1.3f;
            k.presence_penalty = 0.2f;
            k.frequency_penalty = 0.1f;
            k.hist_off = int(history.size());
            k.n_prompt = int(prompt.size());
            k.n_output = int(output.size());
            history.insert(history.end(), prompt.begin(), prompt.end());
            history.insert(history.end(), output.begin(), output.end());
        }
        slot[size_t(r)] = r % 7 == 3 ? -1 : (r * 37) % slots_n;  // distinct slots (37 and 300 are coprime)
        k.pos = state[size_t(rows + r)];
        if (slot[size_t(r)] >= 0) by_slot[size_t(slot[size_t(r)])] = k;
    }
    DeviceBuffer dl = upload(all), dst = upload(state), dh = upload(history), dc = upload(std::vector<int>(size_t(rows) * vocab, 0));
    DeviceBuffer dw(size_t(rows) * vocab * 4, "test"), dout = upload(std::vector<int>(size_t(rows), -1));
    DeviceBuffer dp(picks.size() * sizeof(cuda::RowPick), "test"), dps(by_slot.size() * sizeof(cuda::RowPick), "test");
    ASSERT_EQ(cudaMemcpy(dp.get(), picks.data(), picks.size() * sizeof(cuda::RowPick), cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(dps.get(), by_slot.data(), by_slot.size() * sizeof(cuda::RowPick), cudaMemcpyHostToDevice), cudaSuccess);
    DeviceBuffer dslot = upload(slot), dtok = upload(std::vector<int>(size_t(slots_n), -7));
    int * s = dst.as<int>();
    cuda::pick_rows_advance(dl.as<float>(), rows, vocab, dp.as<cuda::RowPick>(), dh.as<int>(), dw.as<float>(), dc.as<int>(), s, s + rows, s + 2 * rows,
                            s + 2 * rows + 1, dout.as<int>(), nullptr);
    cuda::pick_slots(dl.as<float>(), rows, vocab, dslot.as<int>(), dps.as<cuda::RowPick>(), dh.as<int>(), dw.as<float>(), dc.as<int>(), dtok.as<int>(),
                     nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<int> want(static_cast<size_t>(rows)), got(static_cast<size_t>(slots_n)), counts(size_t(rows) * vocab);
    cudaMemcpy(want.data(), dout.get(), want.size() * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(got.data(), dtok.get(), got.size() * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(counts.data(), dc.get(), counts.size() * 4, cudaMemcpyDeviceToHost);
    EXPECT_TRUE(std::all_of(counts.begin(), counts.end(), [](int c) { return c == 0; })) << "the counts scratch was left dirty";
    std::vector<bool> used(static_cast<size_t>(slots_n), false);
    for (int r = 0; r < rows; r++) {
        if (slot[size_t(r)] < 0) continue;
        used[size_t(slot[size_t(r)])] = true;
        EXPECT_EQ(got[size_t(slot[size_t(r)])], want[size_t(r)]) << "row " << r << " (slot " << slot[size_t(r)] << ")";
    }
    for (int j = 0; j < slots_n; j++) {
        if (!used[size_t(j)]) {
            EXPECT_EQ(got[size_t(j)], -7) << "slot " << j << " was written by no row";
        }
    }
}
