// The generation loop: prefill the prompt, then decode one token at a time until a stop condition.
#pragma once

#include <functional>
#include <vector>

#include "runtime/engine.h"
#include "runtime/sampler.h"

namespace qinfer {

struct GenerateOptions {
    int max_new_tokens = 32;
    SamplingParams sampling;
    std::vector<int> eos_token_ids;
    bool ignore_eos = false;
    int n_valid_tokens = 0;      // 0: the whole vocabulary
    int prefill_chunk = 0;       // 0: the whole prompt in one forward
    // Called for each new token; return false to stop.
    std::function<bool(int token)> on_token;
    std::function<void(int done, int total)> on_prefill_progress;
};

struct GenerateResult {
    std::vector<int> tokens;  // generated tokens only
    double prefill_seconds = 0;  // time to first token
    double decode_seconds = 0;   // the remaining tokens
    const char * stop_reason = "length";
};

GenerateResult generate(Engine & engine, const std::vector<int> & prompt, const GenerateOptions & opt);

// A static batch: every prompt is prefilled (one after another), then all sequences decode together, one token each
// per step, until each reaches max_new_tokens or its end of sequence. Sequence i samples with seed + i.
struct BatchGenerateResult {
    std::vector<std::vector<int>> tokens;  // per prompt: generated tokens only
    double prefill_seconds = 0;            // until every sequence has its first token
    double decode_seconds = 0;             // the remaining steps
};
BatchGenerateResult generate_batch(Engine & engine, const std::vector<std::vector<int>> & prompts, const GenerateOptions & opt);

}  // namespace qinfer
