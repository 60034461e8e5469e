// How many splits the decode attention cuts each sequence's cache into (flash-decoding), shared by the CUDA backend
// and the memory model (tools/plan.cpp), which sizes the per-split scratch from it.
#pragma once

#include <algorithm>

namespace qinfer {

constexpr int k_decode_max_split_keys = 2048;  // keys a split may take at most (the kernels' block-table copies)
// Keys per split at most. 2048 puts 7B with YaRN at 129024 keys in
// one wave of 264 blocks (2 per SM) instead of two: on an H100 the tensor-copy kernel took 98.7 us per layer against
// 105.5 with 1024, and the rows went 79.29 -> 80.50 tok/s (BF16) and 101.14 -> 103.04 (GPTQ-Int4)
// (bench/results/2026-11-27-h100-split-keys). Contexts under ~67K keys fill one wave either way.
constexpr int k_decode_split_keys = 2048;

// Grid (splits x KV heads x batch) rounded up to whole waves of `slots` blocks (blocks per SM x SMs), with at least
// one wave and at most k_decode_split_keys keys per split. With 1024-key splits and 396 slots (3
// per SM then), 7B with YaRN at 129024 keys needed 512 blocks, 1.3 waves: rounding to 2 full waves took decode from
// 109.3 to 113.6 tok/s (bench/results/2026-11-26-h100-1370962).
inline int decode_splits_for(int max_len, int n_kv, int batch, int slots) {
    const int per_split = std::max(1, n_kv * batch);
    const int for_length = (max_len + k_decode_split_keys - 1) / k_decode_split_keys;
    const int blocks = std::max(for_length * per_split, slots);
    const int waves = (blocks + slots - 1) / slots;
    return std::min(1024, std::max({1, for_length, waves * slots / per_split}));
}

}  // namespace qinfer
