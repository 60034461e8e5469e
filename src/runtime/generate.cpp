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
    const int vocab = c.vocab_size;
    Sampler sampler(opt.sampling, opt.n_valid_tokens > 0 ? opt.n_valid_tokens : vocab);
    using clock = std::chrono::steady_clock;
    auto t0 = clock::now();
    int seq = engine.new_sequence(int(total));
    std::vector<float> logits;
    try {
        const int chunk = opt.prefill_chunk > 0 ? opt.prefill_chunk : int(prompt.size());
        for (size_t off = 0; off < prompt.size(); off += size_t(chunk)) {
            size_t end = std::min(prompt.size(), off + size_t(chunk));
            engine.forward(seq, std::vector<int>(prompt.begin() + long(off), prompt.begin() + long(end)), false, logits);
            if (opt.on_prefill_progress) opt.on_prefill_progress(int(end), int(prompt.size()));
        }
        auto t1 = clock::now();
        for (int i = 0; i < opt.max_new_tokens; i++) {
            int tok = sampler.sample(logits.data(), vocab, prompt, res.tokens);
            res.tokens.push_back(tok);
            if (i == 0) {
                t1 = clock::now();
                res.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();
            }
            bool eos = std::find(opt.eos_token_ids.begin(), opt.eos_token_ids.end(), tok) != opt.eos_token_ids.end();
            if (opt.on_token && !opt.on_token(tok)) {
                res.stop_reason = "callback";
                break;
            }
            if (eos && !opt.ignore_eos) {
                res.stop_reason = "eos";
                break;
            }
            if (i + 1 == opt.max_new_tokens) break;
            engine.forward(seq, {tok}, false, logits);
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
