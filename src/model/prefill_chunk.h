// Tokens per prefill pass of the CUDA engine, shared with the memory model (tools/plan.cpp).
#pragma once

#include <algorithm>

namespace qinfer {

// A longer pass keeps the attention kernel's grid full (on an H100, 7B at 30720 tokens: time to first token 1.92 s
// with 1024-token passes, 1.77 s with 4096) but holds more activations (7B: ~166 KB per token against 57 KB of bf16
// KV). The pass is a 32nd of the per-sequence cache, in multiples of 128, within [1024, 4096]: activations stay near
// a tenth of the KV cache (30720 + 2048 tokens: 1024; 63488 + 2048: 2048; 129024 + 2048: 4096). Quantized weights
// are dequantized once per pass and projection, so there the pass is an 8th of the cache (30720 + 2048: 4096; 7B
// GPTQ-Int4 at 30720 on an H100: time to first token 2.35 -> 1.99 s, peak 6.83 -> 7.34 GB,
// bench/results/2026-11-26-h100-dequant).
inline int prefill_chunk_for_cache(int kv_tokens, bool dequantized_weights) {
    constexpr int k_min = 1024, k_max = 4096;
    const int share = dequantized_weights ? 8 : 32;
    return std::clamp(kv_tokens / share / 128 * 128, k_min, k_max);
}

}  // namespace qinfer
