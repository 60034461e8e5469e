#include "runtime/generate.h"

#include <algorithm>
#include <chrono>

#include "core/check.h"

namespace qinfer {

GenerateResult generate(Engine & engine, const std::vector<int> & prompt, const GenerateOptions & opt) {
    const ModelConfig & c = engine.config();
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
    GenerateResult res;
    if (opt.max_new_tokens == 0) return res;
    const int vocab = c.vocab_size;
    const int n_valid = opt.n_valid_tokens > 0 ? std::min(opt.n_valid_tokens, vocab) : vocab;
    Sampler sampler(opt.sampling, n_valid);
    const SamplingParams & sp = opt.sampling;
    const bool device_greedy =
        sp.temperature == 0 && sp.repetition_penalty == 1.0f && sp.presence_penalty == 0 && sp.frequency_penalty == 0;

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
        if (!opt.ignore_eos && std::find(opt.eos_token_ids.begin(), opt.eos_token_ids.end(), tok) != opt.eos_token_ids.end()) {
            res.stop_reason = "eos";
            return false;
        }
        return true;
    };
    try {
        const size_t chunk = opt.prefill_chunk > 0 ? size_t(opt.prefill_chunk) : prompt.size();
        for (size_t off = 0; off < prompt.size(); off += chunk) {
            const size_t end = std::min(prompt.size(), off + chunk);
            engine.forward(seq, std::vector<int>(prompt.begin() + long(off), prompt.begin() + long(end)), false, logits);
            if (opt.on_prefill_progress) opt.on_prefill_progress(int(end), int(prompt.size()));
        }
        stopped = !accept(sampler.sample(logits.data(), vocab, prompt, res.tokens));
        const auto t1 = clock::now();
        res.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();
        while (!stopped && int(res.tokens.size()) < opt.max_new_tokens) {
            const int remaining = opt.max_new_tokens - int(res.tokens.size());
            std::vector<int> more;
            // Greedy steps run on the device in chunks; stop conditions are checked between chunks.
            const int chunk_steps = opt.ignore_eos && !opt.on_token ? remaining : std::min(remaining, 32);
            if (device_greedy && engine.decode_greedy(seq, res.tokens.back(), chunk_steps, n_valid, more)) {
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

}  // namespace qinfer
