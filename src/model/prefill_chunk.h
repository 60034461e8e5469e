// Tokens per prefill pass of the CUDA engine, shared with the memory model (tools/plan.cpp).
#pragma once

#include <algorithm>

#include "io/model_config.h"

namespace qinfer {

// Bytes of the CUDA engine's prefill workspaces per token of a pass (CudaQwenEngine::ensure_workspace): ids, the
// fp32 residual, the normalised bf16 input, qkv, fp32 queries, attention output, gate_up, the SwiGLU product; MoE
// layers' router logits, routing, expert products and outputs, the shared expert's output, gate_up and inputs.
inline double prefill_bytes_per_token(const ModelConfig & c) {
    const double H = c.hidden_size, I = c.intermediate_size;
    double moe = 0;
    if (c.num_experts > 0) {
        const double k = c.num_experts_per_tok, Ie = c.moe_intermediate_size, Is = std::max(c.shared_expert_intermediate_size, 0);
        moe = 4 * (c.num_experts + 1) + 16 * k + 2 * std::max(k * Ie, Is) + 2 * k * H + 2 * H + 4 * std::max(Ie, Is) + 2 * H;
    }
    return 4 + 4 * H + 2 * H + 2 * double(c.q_dim() + 2 * c.kv_dim()) + 4 * double(c.q_dim()) + 2 * H + 6 * I + moe;
}

// A longer pass keeps the attention kernel's grid full (on an H100, 7B at 30720 tokens: time to first token 1.92 s
// with 1024-token passes, 1.77 s with 4096) but holds more activations (7B: ~166 KB per token against 57 KB of bf16
// KV). The pass is the longest of:
// - a 32nd of the per-sequence cache, in multiples of 128, within [1024, 4096]: activations stay near a tenth of the
//   KV cache (30720 + 2048 tokens: 1024; 49152 + 2048: 1536). Quantized weights are dequantized once per pass and
//   projection, so there it is an 8th of the cache (30720 + 2048: 4096; 7B GPTQ-Int4 at 30720 on an H100: time to
//   first token 2.35 -> 1.99 s, peak 6.83 -> 7.34 GB, bench/results/2026-11-26-h100-dequant). From 65536 tokens of
//   cache on, passes of 8192: each pass pays the weights' read (and dequantization) and the launches once, and the
//   cache dwarfs the activations. 7B YaRN at 129024 on an H100, same-call A/Bs against 4096: time to first token
//   9.76 -> 9.41 s with BF16 weights at 652252a, 9.84 -> 9.67 s with GPTQ-Int4 at 9893a16, +0.7 GB (a later BF16
//   pair across calls showed no gain, 9.49 -> 9.51 s; bench/results/2026-11-27-h100-chunk-long, -decode-tma,
//   -split-keys). 7B YaRN BF16 at 63488 (65536 tokens of cache) on an H200, one call: 2048 (the 32nd) / 4096 / 8192
//   tokens took 3.108 / 2.958 / 2.921 s to the first token, 152.53 / 154.45 / 154.84 tok/s, peak 18.25 / 18.59 /
//   19.27 GB (bench/results/2026-12-01-h200-moe-fold);
// - as many 1024-token blocks (up to 4) as fit 0.2 GB of activations: small models' passes are cheap (0.5B: 42 KB
//   per token, 4096; 1.5B: 76 KB, 2048; 7B: 1024). 0.5B at 30720: time to first token 0.55-0.60 -> 0.41-0.47 s,
//   +0.13 GB (bench/results/2026-11-26-h100-chunk-small);
// - 4096 for models with routed experts (routed_experts): a pass reads every expert's weights once, and the 1024-1280
//   tokens the first two rules give MoE models (~137 KB of activations a token) leave each of Qwen3-30B-A3B's 128
//   experts ~80 rows. On an H200 (same call, bench/results/2026-11-30-h200x2-moe-wgmma), Qwen3-30B-A3B 1000 prompts
//   of 1000 -> 100 tokens: 29.30 -> 40.35 requests/s with the wgmma experts (15.12 -> 20.14 with the mma.sync ones);
//   Qwen1.5-MoE-A2.7B's time to first token at 30720: 0.622 -> 0.476 s.
inline int prefill_chunk_for_cache(int kv_tokens, bool dequantized_weights, double bytes_per_token, bool routed_experts = false) {
    constexpr int k_min = 1024, k_max = 4096, k_long_cache = 65536, k_long_pass = 8192, k_moe = 4096;
    constexpr double k_activation_budget = 0.2e9;
    const int share = dequantized_weights ? 8 : 32;
    const int by_cache = kv_tokens >= k_long_cache ? k_long_pass : std::clamp(kv_tokens / share / 128 * 128, k_min, k_max);
    const int by_budget = std::clamp(int(k_activation_budget / bytes_per_token) / 1024 * 1024, k_min, k_max);
    return std::max({by_cache, by_budget, routed_experts ? k_moe : k_min});
}

}  // namespace qinfer
