#include "runtime/generate.h"

#include <algorithm>
#include <chrono>

#include "core/check.h"

namespace qinfer {

namespace {

// Throws before any work when the request cannot run: empty prompt, ids outside the vocabulary, too long.
void check_request(const ModelConfig & c, const std::vector<int> & prompt, const GenerateOptions & opt) {
    if (prompt.empty()) QINFER_FAIL() << "the prompt is empty: give at least one token";
    if (opt.max_new_tokens < 0) QINFER_FAIL() << "max_new_tokens must be >= 0";
    const int64_t total = int64_t(prompt.size()) + opt.max_new_tokens;
    if (total > c.max_context()) {
        QINFER_FAIL() << "prompt of " << prompt.size() << " tokens + " << opt.max_new_tokens << " new tokens exceeds the model's context of "
                      << c.max_context() << " tokens";
    }
    for (int id : prompt) {
        if (id < 0 || id >= c.vocab_size) QINFER_FAIL() << "token id " << id << " is outside the vocabulary [0, " << c.vocab_size << ")";
    }
}

int valid_ids(const ModelConfig & c, const GenerateOptions & opt) {
    return opt.n_valid_tokens > 0 ? std::min(opt.n_valid_tokens, c.vocab_size) : c.vocab_size;
}

// Greedy without penalties: the device can pick tokens itself.
bool plain_greedy(const SamplingParams & sp) {
    return sp.temperature == 0 && sp.repetition_penalty == 1.0f && sp.presence_penalty == 0 && sp.frequency_penalty == 0;
}

// Prefills a prompt in chunks of opt.prefill_chunk (0: whole), leaving the last position's logits.
void prefill(Engine & engine, int seq, const std::vector<int> & prompt, const GenerateOptions & opt, std::vector<float> & logits) {
    const size_t chunk = opt.prefill_chunk > 0 ? size_t(opt.prefill_chunk) : prompt.size();
    for (size_t off = 0; off < prompt.size(); off += chunk) {
        const size_t end = std::min(prompt.size(), off + chunk);
        engine.forward(seq, std::vector<int>(prompt.begin() + long(off), prompt.begin() + long(end)), false, logits);
        if (opt.on_prefill_progress) opt.on_prefill_progress(int(end), int(prompt.size()));
    }
}

bool is_eos(const GenerateOptions & opt, int tok) {
    return !opt.ignore_eos && std::find(opt.eos_token_ids.begin(), opt.eos_token_ids.end(), tok) != opt.eos_token_ids.end();
}

}  // namespace

GenerateResult generate(Engine & engine, const std::vector<int> & prompt, const GenerateOptions & opt) {
    const ModelConfig & c = engine.config();
    check_request(c, prompt, opt);
    const int64_t total = int64_t(prompt.size()) + opt.max_new_tokens;
    GenerateResult res;
    if (opt.max_new_tokens == 0) return res;
    const int vocab = c.vocab_size;
    const int n_valid = valid_ids(c, opt);
    Sampler sampler(opt.sampling, n_valid);
    const SamplingParams & sp = opt.sampling;
    const bool device_greedy = plain_greedy(sp);

    using clock = std::chrono::steady_clock;
    const auto t0 = clock::now();
    const int seq = engine.new_sequence(int(total));
    std::vector<float> logits;
    bool stopped = false;
    // Appends a token; false when generation must stop.
    auto accept = [&](int tok) {
        res.tokens.push_back(tok);
        if (opt.on_token && !opt.on_token(tok)) {
            res.stop_reason = "callback";
            return false;
        }
        if (is_eos(opt, tok)) {
            res.stop_reason = "eos";
            return false;
        }
        return true;
    };
    try {
        prefill(engine, seq, prompt, opt, logits);
        stopped = !accept(sampler.sample(logits.data(), vocab, prompt, res.tokens));
        const auto t1 = clock::now();
        res.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();
        while (!stopped && int(res.tokens.size()) < opt.max_new_tokens) {
            const int remaining = opt.max_new_tokens - int(res.tokens.size());
            std::vector<int> more;
            // Greedy (and sampled, where the backend can) steps run on the device in chunks; stop conditions are checked
            // between chunks.
            const int chunk_steps = opt.ignore_eos && !opt.on_token ? remaining : std::min(remaining, 32);
            if ((device_greedy && engine.decode_greedy(seq, res.tokens.back(), chunk_steps, n_valid, more)) ||
                (!device_greedy &&
                 engine.decode_sampled({seq}, {res.tokens.back()}, chunk_steps, n_valid, sp, {Engine::History{&prompt, &res.tokens}}, more))) {
                for (int t : more) {
                    if (!accept(t)) {
                        stopped = true;
                        break;
                    }
                }
                continue;
            }
            engine.forward(seq, {res.tokens.back()}, false, logits);
            stopped = !accept(sampler.sample(logits.data(), vocab, prompt, res.tokens));
        }
        res.decode_seconds = std::chrono::duration<double>(clock::now() - t1).count();
    } catch (...) {
        engine.free_sequence(seq);
        throw;
    }
    engine.free_sequence(seq);
    return res;
}

BatchGenerateResult generate_batch(Engine & engine, const std::vector<std::vector<int>> & prompts, const GenerateOptions & opt) {
    const ModelConfig & c = engine.config();
    if (prompts.empty()) QINFER_FAIL() << "a batch needs at least one prompt";
    for (const auto & p : prompts) check_request(c, p, opt);
    const size_t n = prompts.size();
    BatchGenerateResult res;
    res.tokens.resize(n);
    if (opt.max_new_tokens == 0) return res;
    const int vocab = c.vocab_size;
    const int n_valid = valid_ids(c, opt);
    std::vector<Sampler> samplers;
    for (size_t i = 0; i < n; i++) {
        SamplingParams sp = opt.sampling;
        sp.seed += i;
        samplers.emplace_back(sp, n_valid);
    }
    const bool device_greedy = plain_greedy(opt.sampling);

    using clock = std::chrono::steady_clock;
    const auto t0 = clock::now();
    std::vector<int> seqs;
    auto free_all = [&] {
        for (int s : seqs) engine.free_sequence(s);
    };
    try {
        size_t longest = 0;
        for (const auto & p : prompts) longest = std::max(longest, p.size());
        engine.plan_batch(int(n), int(longest) + opt.max_new_tokens);
        for (const auto & p : prompts) seqs.push_back(engine.new_sequence(int(p.size()) + opt.max_new_tokens));
        // Indices of the sequences still generating; all of them have produced the same number of tokens.
        std::vector<size_t> active;
        bool cancelled = false;
        // Appends a token to sequence i; false when that sequence (or, through the callback, the batch) stops.
        auto accept = [&](size_t i, int tok) {
            res.tokens[i].push_back(tok);
            if (opt.on_token && !opt.on_token(tok)) cancelled = true;
            return !cancelled && !is_eos(opt, tok) && int(res.tokens[i].size()) < opt.max_new_tokens;
        };
        std::vector<float> logits;
        for (size_t i = 0; i < n; i++) {
            prefill(engine, seqs[i], prompts[i], opt, logits);
            if (accept(i, samplers[i].sample(logits.data(), vocab, prompts[i], res.tokens[i]))) active.push_back(i);
        }
        const auto t1 = clock::now();
        res.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();
        while (!active.empty() && !cancelled) {
            std::vector<int> step_seqs, step_tokens;
            for (size_t i : active) {
                step_seqs.push_back(seqs[i]);
                step_tokens.push_back(res.tokens[i].back());
            }
            const int remaining = opt.max_new_tokens - int(res.tokens[active[0]].size());
            const int chunk_steps = opt.ignore_eos && !opt.on_token ? remaining : std::min(remaining, 32);
            std::vector<int> more;
            std::vector<size_t> next;
            std::vector<Engine::History> history;
            for (size_t i : active) history.push_back({&prompts[i], &res.tokens[i]});
            if ((device_greedy && engine.decode_greedy_batch(step_seqs, step_tokens, chunk_steps, n_valid, more)) ||
                (!device_greedy && engine.decode_sampled(step_seqs, step_tokens, chunk_steps, n_valid, opt.sampling, history, more))) {
                // Steps past a sequence's end are computed but dropped.
                std::vector<bool> live(active.size(), true);
                for (int s = 0; s < chunk_steps; s++) {
                    for (size_t a = 0; a < active.size(); a++) {
                        if (live[a]) live[a] = accept(active[a], more[size_t(s) * active.size() + a]);
                    }
                }
                for (size_t a = 0; a < active.size(); a++) {
                    if (live[a]) next.push_back(active[a]);
                }
            } else {
                engine.forward_batch(step_seqs, step_tokens, logits);
                for (size_t a = 0; a < active.size(); a++) {
                    const size_t i = active[a];
                    if (accept(i, samplers[i].sample(logits.data() + a * size_t(vocab), vocab, prompts[i], res.tokens[i]))) next.push_back(i);
                }
            }
            active = std::move(next);
        }
        res.decode_seconds = std::chrono::duration<double>(clock::now() - t1).count();
    } catch (...) {
        free_all();
        throw;
    }
    free_all();
    return res;
}

}  // namespace qinfer
