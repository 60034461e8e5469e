// Token sampling with transformers' order: penalties, then temperature, top-k, top-p, min-p, then a draw.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace qinfer {

struct SamplingParams {
    float temperature = 0.0f;         // 0: greedy (argmax)
    int top_k = 0;                    // 0: off
    float top_p = 1.0f;               // 1: off
    float min_p = 0.0f;               // 0: off
    float repetition_penalty = 1.0f;  // transformers: over prompt and output; >0 logits divided, <0 multiplied
    float presence_penalty = 0.0f;    // OpenAI: over output tokens, once per distinct token
    float frequency_penalty = 0.0f;   // OpenAI: over output tokens, times the count
    uint64_t seed = 0;
};

class Sampler {
public:
    // Only ids below `n_valid` can be drawn (the tokenizer's size; embedding rows past it are padding).
    Sampler(const SamplingParams & p, int n_valid);
    // logits: fp32 [vocab], modified in place. `prompt` and `output` give the penalties their history.
    int sample(float * logits, int vocab, const std::vector<int> & prompt, const std::vector<int> & output);

private:
    SamplingParams p_;
    int n_valid_;
    std::mt19937_64 rng_;
};

int argmax(const float * x, int n);

}  // namespace qinfer
