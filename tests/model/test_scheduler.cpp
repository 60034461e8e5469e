// Continuous batching (runtime/scheduler.h): every request's tokens under the scheduler (chunked prefill, waiting
// for rows, preemption when the pool runs out, prefix hits) equal the same request run alone, and the block pool
// comes back empty. CPU: identical tokens. CUDA: each greedy token is one the teacher-forced forward of the same
// sequence also ranks first, within bf16 near-ties.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <thread>

#include "core/check.h"
#include "runtime/engine.h"
#include "runtime/generate.h"
#include "runtime/scheduler.h"
#include "tools/synth.h"
#include "../unit/test_helpers.h"
#include "backend_cases.h"

using namespace qinfer;

namespace {

using Case = test::BackendCase;

std::string synth_once(const std::string & preset) { return test::synth_once("sched", preset, 5); }

std::unique_ptr<Engine> engine_for(const Case & c) {
    EngineOptions eo;
    eo.backend = c.backend;
    eo.kv_dtype = c.kv_dtype;
    eo.max_context = 256;
    return make_engine(synth_once(c.preset), eo);
}

std::vector<int> prompt(int len, int salt, int vocab) {
    std::vector<int> t;
    for (int i = 0; i < len; i++) t.push_back((len * 31 + i * 7 + salt * 13 + 5) % vocab);
    return t;
}

struct Result {
    std::vector<int> tokens;
    RequestOutcome outcome;
    bool finished = false;
};

// Submits every prompt at once and steps until idle; returns each request's tokens and outcome.
std::vector<Result> run_all(Scheduler & s, const std::vector<std::vector<int>> & prompts, int max_new, const SamplingParams & sp = {}) {
    std::vector<Result> res(prompts.size());
    for (size_t i = 0; i < prompts.size(); i++) {
        RequestOptions r;
        r.prompt = prompts[i];
        r.max_new_tokens = max_new;
        r.ignore_eos = true;
        r.sampling = sp;
        RequestCallbacks cb;
        cb.on_token = [&res, i](const TokenEvent & e) {
            res[i].tokens.push_back(e.token);
            return true;
        };
        cb.on_finish = [&res, i](const RequestOutcome & o) {
            res[i].outcome = o;
            res[i].finished = true;
        };
        s.submit(r, cb);
    }
    s.run_until_idle();
    return res;
}

// Each request's tokens against the same request alone (generate() on a fresh engine of the same case). Greedy, with
// sp's repetition penalty (CUDA: applied to the teacher-forced logits over the prompt and the tokens before).
void expect_equal_alone(const Case & c, const std::vector<std::vector<int>> & prompts, const std::vector<Result> & res, int max_new,
                        const SamplingParams & sp = {}) {
    auto alone = engine_for(c);
    const int V = alone->config().vocab_size;
    for (size_t i = 0; i < prompts.size(); i++) {
        ASSERT_TRUE(res[i].finished) << "request " << i;
        EXPECT_EQ(res[i].outcome.stop_reason, "length") << "request " << i << ": " << res[i].outcome.error;
        ASSERT_EQ(res[i].tokens.size(), size_t(max_new)) << "request " << i;
        EXPECT_EQ(res[i].outcome.tokens, res[i].tokens) << "request " << i;
        if (c.backend == "cpu") {
            GenerateOptions g;
            g.max_new_tokens = max_new;
            g.ignore_eos = true;
            g.sampling = sp;
            EXPECT_EQ(res[i].tokens, generate(*alone, prompts[i], g).tokens) << "request " << i << " (prompt of " << prompts[i].size() << ")";
            continue;
        }
        std::vector<int> fed = prompts[i];
        fed.insert(fed.end(), res[i].tokens.begin(), res[i].tokens.end() - 1);
        const int seq = alone->new_sequence(int(fed.size()));
        std::vector<float> logits;
        alone->forward(seq, fed, true, logits);
        alone->free_sequence(seq);
        for (size_t t = 0; t < res[i].tokens.size(); t++) {
            std::vector<float> penalised(logits.begin() + long((prompts[i].size() - 1 + t) * size_t(V)),
                                         logits.begin() + long((prompts[i].size() + t) * size_t(V)));
            std::vector<bool> seen(static_cast<size_t>(V));
            for (size_t j = 0; j < prompts[i].size() + t; j++) seen[size_t(fed[j])] = true;
            for (int v = 0; v < V; v++) {
                float & l = penalised[size_t(v)];
                if (seen[size_t(v)] && sp.repetition_penalty != 1.0f) l = l > 0 ? l / sp.repetition_penalty : l * sp.repetition_penalty;
            }
            const float * row = penalised.data();
            float mx = -INFINITY, amax = 0;
            for (int v = 0; v < V; v++) {
                mx = std::max(mx, row[v]);
                amax = std::max(amax, std::fabs(row[v]));
            }
            EXPECT_GE(row[res[i].tokens[t]], mx - 2e-2f * amax) << "request " << i << " token " << t;
        }
    }
}

class Scheduling : public ::testing::TestWithParam<Case> {
protected:
    void SetUp() override {
        if (GetParam().backend == "cuda" && !cuda_available()) GTEST_SKIP() << "no CUDA device";
    }
};

// Prompts of the given lengths, four rows a step, 24 tokens a step: prompts are prefilled in chunks beside decoding
// sequences, and requests wait for rows. Each request's tokens equal it alone; the pool comes back empty.
void chunked_equal_alone(const Case & c, std::initializer_list<int> lens, int salt, int max_new, const SamplingParams & sp = {}) {
    auto engine = engine_for(c);
    const int V = engine->config().vocab_size;
    SchedulerOptions so;
    so.pool.max_rows = 4;
    so.pool.max_step_tokens = 24;
    so.pool.max_seq_tokens = 128;
    so.pool.n_blocks = 64;
    Scheduler s(*engine, so);
    std::vector<std::vector<int>> ps;
    for (int len : lens) ps.push_back(prompt(len, salt++, V));
    const auto res = run_all(s, ps, max_new, sp);
    expect_equal_alone(c, ps, res, max_new, sp);
    const SchedulerStats st = s.stats();
    EXPECT_EQ(st.blocks_used, 0) << "blocks still referenced after every request finished";
    EXPECT_EQ(st.running + st.waiting, 0);
}

TEST_P(Scheduling, ChunkedPrefillAndWaitingEqualAlone) { chunked_equal_alone(GetParam(), {1, 17, 70, 5, 33, 16, 2, 48, 9, 31}, 0, 7); }

// Greedy with a repetition penalty (Qwen's generation_config sets 1.05): prompt ends and decode rows apply it over
// the prompt and the output so far (CUDA: on the device, over the staged history).
TEST_P(Scheduling, PenalisedEqualAlone) {
    SamplingParams sp;
    sp.temperature = 0;
    sp.repetition_penalty = 1.3f;
    chunked_equal_alone(GetParam(), {1, 17, 40, 5, 9, 30}, 40, 6, sp);
}

// A pool of 10 blocks (160 tokens) for six requests that end at 46 tokens each (3 blocks): the newest running
// sequences are preempted and computed again, and every request still gets the tokens it gets alone.
TEST_P(Scheduling, PreemptionEqualsAlone) {
    const Case & c = GetParam();
    auto engine = engine_for(c);
    const int V = engine->config().vocab_size;
    SchedulerOptions so;
    so.pool.max_rows = 6;
    so.pool.max_step_tokens = 64;
    so.pool.max_seq_tokens = 64;
    so.pool.n_blocks = 10;
    Scheduler s(*engine, so);
    std::vector<std::vector<int>> ps;
    for (int i = 0; i < 6; i++) ps.push_back(prompt(20, 100 + i, V));
    const auto res = run_all(s, ps, 26);
    expect_equal_alone(c, ps, res, 26);
    EXPECT_GT(s.stats().preemptions, 0u);
    int preempted = 0;
    for (const auto & r : res) preempted += r.outcome.preemptions;
    EXPECT_EQ(uint64_t(preempted), s.stats().preemptions);
    EXPECT_EQ(s.stats().blocks_used, 0);
}

// A 48-token shared prefix: requests admitted after the first finds it in the prefix index take its three blocks
// without computing them, and their tokens equal the request alone; without the prefix cache nothing is shared.
TEST_P(Scheduling, PrefixHitsEqualAlone) {
    const Case & c = GetParam();
    auto engine = engine_for(c);
    const int V = engine->config().vocab_size;
    const std::vector<int> shared = prompt(48, 7, V);
    std::vector<std::vector<int>> ps;
    for (int i = 0; i < 4; i++) {
        std::vector<int> p = shared;
        const std::vector<int> q = prompt(3 + i, 50 + i, V);
        p.insert(p.end(), q.begin(), q.end());
        ps.push_back(p);
    }
    for (bool cache : {true, false}) {
        SchedulerOptions so;
        so.pool.max_rows = 4;
        so.pool.max_step_tokens = 64;
        so.pool.max_seq_tokens = 128;
        so.pool.n_blocks = 40;
        so.prefix_cache = cache;
        Scheduler s(*engine, so);
        const auto first = run_all(s, {ps[0]}, 5);  // fills the index
        const auto rest = run_all(s, {ps.begin() + 1, ps.end()}, 5);
        std::vector<Result> all = first;
        all.insert(all.end(), rest.begin(), rest.end());
        expect_equal_alone(c, ps, all, 5);
        for (size_t i = 1; i < ps.size(); i++) EXPECT_EQ(all[i].outcome.cached_prompt_tokens, cache ? 48 : 0) << "request " << i;
        EXPECT_EQ(s.stats().prefix_hit_tokens, cache ? 3u * 48u : 0u);
        EXPECT_EQ(s.stats().blocks_used, 0);
        EXPECT_EQ(s.stats().blocks_cached > 0, cache);
    }
}

const Case k_cases[] = {
    {"tiny-qwen2", "cpu", "auto"},  {"tiny-qwen3", "cpu", "auto"},  {"tiny-qwen2-moe", "cpu", "auto"}, {"tiny-qwen2", "cpu", "int8"},
    {"tiny-qwen2", "cuda", "auto"}, {"tiny-qwen3", "cuda", "auto"}, {"tiny-qwen2-moe", "cuda", "auto"}, {"tiny-qwen2", "cuda", "int8"},
    {"tiny-qwen2", "cuda", "fp8"},  {"tiny-qwen2", "cuda", "int4"},
};


}  // namespace

INSTANTIATE_TEST_SUITE_P(Backends, Scheduling, ::testing::ValuesIn(k_cases), test::backend_case_name);

namespace {

std::unique_ptr<Engine> cpu_engine() { return engine_for({"tiny-qwen2", "cpu", "auto"}); }

SchedulerOptions small_pool() {
    SchedulerOptions so;
    so.pool.max_rows = 4;
    so.pool.max_step_tokens = 32;
    so.pool.max_seq_tokens = 64;
    so.pool.n_blocks = 16;
    return so;
}

}  // namespace

// Requests that can never run are refused before queueing, with the number of tokens that fit.
TEST(SchedulerRequests, RefusedBeforeQueueing) {
    auto engine = cpu_engine();
    Scheduler s(*engine, small_pool());
    RequestOptions r;
    r.prompt = prompt(60, 1, 256);
    r.max_new_tokens = 10;
    try {
        s.submit(r, {});
        FAIL() << "a 70-token request in 64-token tables was accepted";
    } catch (const Error & e) {
        EXPECT_NE(std::string(e.what()).find("may hold 64 tokens"), std::string::npos) << e.what();
    }
    r.prompt = {};
    EXPECT_THROW(s.submit(r, {}), Error);
    r.prompt = {1, 256};
    EXPECT_THROW(s.submit(r, {}), Error);
    r.prompt = {1, 2};
    r.max_new_tokens = 0;
    EXPECT_THROW(s.submit(r, {}), Error);
    r.max_new_tokens = 2;
    r.logprobs = 21;
    EXPECT_THROW(s.submit(r, {}), Error);
    EXPECT_EQ(s.stats().waiting, 0);
    EXPECT_FALSE(s.step());
}

// Beyond max_waiting waiting requests submit() refuses at once; the accepted ones all complete.
TEST(SchedulerRequests, QueueLimit) {
    auto engine = cpu_engine();
    SchedulerOptions so = small_pool();
    so.max_waiting = 3;
    Scheduler s(*engine, so);
    int finished = 0, refused = 0;
    for (int i = 0; i < 5; i++) {
        RequestOptions r;
        r.prompt = prompt(4, i, 256);
        r.max_new_tokens = 3;
        RequestCallbacks cb;
        cb.on_finish = [&](const RequestOutcome & o) { finished += o.stop_reason == "length" || o.stop_reason == "eos"; };
        try {
            s.submit(r, cb);
        } catch (const Scheduler::QueueFull &) {
            refused++;
        }
    }
    EXPECT_EQ(refused, 2);
    s.run_until_idle();
    EXPECT_EQ(finished, 3);
}

// A cancelled request stops at the next step with its blocks freed; a callback that returns false stops its own.
TEST(SchedulerRequests, CancelAndCallbackStop) {
    auto engine = cpu_engine();
    Scheduler s(*engine, small_pool());
    RequestOutcome a, b;
    RequestOptions r;
    r.prompt = prompt(20, 3, 256);
    r.max_new_tokens = 40;
    r.ignore_eos = true;
    const uint64_t id = s.submit(r, {nullptr, [&](const RequestOutcome & o) { a = o; }});
    int seen = 0;
    s.submit(r, {[&](const TokenEvent &) { return ++seen < 3; }, [&](const RequestOutcome & o) { b = o; }});
    for (int i = 0; i < 4; i++) s.step();
    s.cancel(id);
    s.run_until_idle();
    EXPECT_EQ(a.stop_reason, "cancelled");
    EXPECT_LT(a.tokens.size(), 40u);
    EXPECT_EQ(b.stop_reason, "callback");
    EXPECT_EQ(b.tokens.size(), 3u);
    EXPECT_EQ(s.stats().blocks_used, 0);
}

// The step log: a line per step with its rows and tokens, a line per finished request with its times in order.
TEST(SchedulerRequests, StepLog) {
    auto engine = cpu_engine();
    SchedulerOptions so = small_pool();
    so.step_log = (std::filesystem::temp_directory_path() / ("qinfer-step-log-" + std::to_string(::getpid()) + ".csv")).string();
    uint64_t steps = 0;
    {
        Scheduler s(*engine, so);
        RequestOptions r;
        r.prompt = prompt(40, 5, 256);  // over the 32-token budget: two chunks
        r.max_new_tokens = 3;
        r.ignore_eos = true;
        s.submit(r, {});
        r.prompt = prompt(6, 6, 256);
        s.submit(r, {});
        s.run_until_idle();
        steps = s.stats().steps;
    }
    std::ifstream f(so.step_log);
    std::string line;
    uint64_t step_lines = 0, prompt_tokens = 0, decode_rows = 0;
    int reqs = 0;
    while (std::getline(f, line)) {
        if (line.rfind("step,", 0) == 0) {
            step_lines++;
            double t, ms, wait;
            int rows, chunks, chunk_tokens, admitted, finished, running, waiting;
            ASSERT_EQ(std::sscanf(line.c_str(), "step,%lf,%lf,%lf,%d,%d,%d,%d,%d,%d,%d", &t, &ms, &wait, &rows, &chunks, &chunk_tokens, &admitted,
                                  &finished, &running, &waiting), 10)
                << line;
            prompt_tokens += uint64_t(chunk_tokens);
            decode_rows += uint64_t(rows);
        } else if (line.rfind("req,", 0) == 0) {
            reqs++;
            unsigned long long id;
            double submit, admit, first, fin;
            int prompt_len, cached, out;
            ASSERT_EQ(std::sscanf(line.c_str(), "req,%llu,%lf,%lf,%lf,%lf,%d,%d,%d", &id, &submit, &admit, &first, &fin, &prompt_len, &cached, &out), 8)
                << line;
            EXPECT_LE(submit, admit);
            EXPECT_LE(admit, first);
            EXPECT_LE(first, fin);
            EXPECT_EQ(out, 3);
            EXPECT_NE(line.find(",length"), std::string::npos) << line;
        }
    }
    std::filesystem::remove(so.step_log);
    EXPECT_EQ(step_lines, steps);
    EXPECT_EQ(reqs, 2);
    EXPECT_EQ(prompt_tokens, 46u);  // every prompt token once
    EXPECT_EQ(decode_rows, 4u);     // two tokens after each prompt's first
}

// Log-probabilities: the greedy token's is the largest, and the top list starts with it.
TEST(SchedulerRequests, Logprobs) {
    auto engine = cpu_engine();
    Scheduler s(*engine, small_pool());
    RequestOptions r;
    r.prompt = prompt(9, 4, 256);
    r.max_new_tokens = 4;
    r.ignore_eos = true;
    r.logprobs = 5;
    std::vector<TokenEvent> events;
    s.submit(r, {[&](const TokenEvent & e) {
                     events.push_back(e);
                     return true;
                 },
                 nullptr});
    s.run_until_idle();
    ASSERT_EQ(events.size(), 4u);
    for (const TokenEvent & e : events) {
        ASSERT_EQ(e.top.size(), 5u);
        EXPECT_EQ(e.top[0].first, e.token);
        EXPECT_FLOAT_EQ(e.top[0].second, e.logprob);
        EXPECT_LE(e.logprob, 0.0f);
        for (size_t j = 1; j < e.top.size(); j++) EXPECT_LE(e.top[j].second, e.top[j - 1].second);
    }
}

// Sampled requests keep their own random streams: the same request with the same seed gives the same tokens alone
// and beside others.
TEST(SchedulerRequests, SeededSamplingIndependentOfBatch) {
    auto engine = cpu_engine();
    SamplingParams sp;
    sp.temperature = 0.9f;
    sp.top_p = 0.95f;
    sp.seed = 1234;
    std::vector<std::vector<int>> ps;
    for (int i = 0; i < 4; i++) ps.push_back(prompt(6 + i, 9 + i, 256));
    Scheduler together(*engine, small_pool());
    const auto all = run_all(together, ps, 6, sp);
    Scheduler alone(*engine, small_pool());
    const auto one = run_all(alone, {ps[2]}, 6, sp);
    EXPECT_EQ(all[2].tokens, one[0].tokens);
}

// Requests from other threads while the loop runs in its own (as `qinfer serve` does): all complete.
TEST(SchedulerRequests, ServeLoopAcrossThreads) {
    auto engine = cpu_engine();
    Scheduler s(*engine, small_pool());
    std::thread loop([&] { s.serve_loop(); });
    std::atomic<int> done{0};
    std::vector<std::thread> clients;
    for (int t = 0; t < 4; t++) {
        clients.emplace_back([&, t] {
            for (int i = 0; i < 3; i++) {
                std::mutex m;
                std::condition_variable cv;
                bool fin = false;
                RequestOptions r;
                r.prompt = prompt(5 + i, t * 10 + i, 256);
                r.max_new_tokens = 4;
                s.submit(r, {nullptr, [&](const RequestOutcome &) {
                                 std::lock_guard<std::mutex> lock(m);
                                 fin = true;
                                 cv.notify_one();
                             }});
                std::unique_lock<std::mutex> lock(m);
                cv.wait_for(lock, std::chrono::seconds(30), [&] { return fin; });
                done += fin;
            }
        });
    }
    for (auto & c : clients) c.join();
    s.stop();
    loop.join();
    EXPECT_EQ(done.load(), 12);
    EXPECT_EQ(s.stats().blocks_used, 0);
}

// A short soak (scripts/test.sh runs it again under AddressSanitizer and LeakSanitizer): four client threads submit
// 400 requests of random lengths, settings and cancellations into a small pool while the loop runs; every request
// finishes exactly once and the pool comes back empty. Bounded: 400 requests, 120 s.
TEST(SchedulerRequests, Soak) {
    auto engine = cpu_engine();
    SchedulerOptions so = small_pool();
    so.pool.n_blocks = 12;  // preemptions happen
    so.max_waiting = 64;
    Scheduler s(*engine, so);
    std::thread loop([&] { s.serve_loop(); });
    std::atomic<int> finished{0}, refused{0};
    std::vector<std::thread> clients;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    for (int t = 0; t < 4; t++) {
        clients.emplace_back([&, t] {
            std::mt19937 rng{uint32_t(t)};
            for (int i = 0; i < 100 && std::chrono::steady_clock::now() < deadline; i++) {
                RequestOptions r;
                r.prompt = prompt(1 + int(rng() % 30), t * 1000 + i, 256);
                r.max_new_tokens = 1 + int(rng() % 20);
                r.ignore_eos = rng() % 2;
                r.eos_token_ids = {2};
                r.sampling.temperature = rng() % 2 ? 0.8f : 0.0f;
                r.sampling.top_k = int(rng() % 3) * 10;
                r.sampling.repetition_penalty = rng() % 2 ? 1.1f : 1.0f;
                r.sampling.seed = rng();
                r.logprobs = rng() % 4 == 0 ? 2 : -1;
                const bool cancel = rng() % 5 == 0;
                try {
                    const uint64_t id = s.submit(r, {[&](const TokenEvent &) { return true; }, [&](const RequestOutcome &) { finished++; }});
                    if (cancel) s.cancel(id);
                } catch (const Scheduler::QueueFull &) {
                    refused++;
                    std::this_thread::sleep_for(std::chrono::milliseconds(2));
                }
            }
        });
    }
    for (auto & c : clients) c.join();
    while (finished + refused < 400 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    s.stop();
    loop.join();
    EXPECT_EQ(finished + refused, 400);
    const SchedulerStats st = s.stats();
    EXPECT_EQ(st.blocks_used, 0);
    EXPECT_EQ(st.running + st.waiting, 0);
}
