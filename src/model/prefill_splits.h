// Key splits of the prefill attention's last wave, shared by the CUDA backend (attention_prefill_tma.cu) and the memory
// model (tools/plan.cpp), which sizes the scratch from it.
//
// The warp-specialised prefill kernel runs one block an SM, a block being one head's 128 queries over all their keys.
// A pass of a long prompt gives blocks of nearly equal work (7B's 1024-token pass at 29696 cached tokens: 224 blocks
// of 233-240 key tiles), so on 132 SMs the second wave holds 92 blocks and 40 SMs wait: 1.70 waves of work take 2.
// Here the blocks after the last full wave ("tail pairs": a query tile and a head) run as `splits` blocks each, every
// one over a 1/splits share of the pair's keys; the last of a pair's blocks to finish merges the others' partial
// results (fp32 accumulators and softmax statistics through a scratch in global memory) into its own and stores the
// rows. 7B's last pass then runs its 92 tail pairs as 368 blocks of ~59 tiles, three rounds, instead of one round of
// ~236 tiles. Measured on an H200 (bench/results/2026-12-04-h200-prefill-splits): time to first token at 30720
// 0.5B 0.171 -> 0.158 s, 1.5B 0.342 -> 0.312, 7B 1.087 -> 1.071, 7B GPTQ-Int4 1.051 -> 1.030; at 6144 and 14336
// the same or faster.
#pragma once

#include <algorithm>
#include <cstddef>

namespace qinfer {

constexpr int k_prefill_split_rows = 128;          // queries a block takes (the kernel's two warpgroups of 64)
constexpr int k_prefill_split_tile = 128;          // keys a tile
constexpr int k_prefill_split_threads = 256;       // the consumer threads whose accumulators a partial result holds
constexpr int k_prefill_split_slots_per_sm = 4;    // partial results the scratch holds, per SM
constexpr int k_prefill_split_max = 6;             // splits a pair takes at most
constexpr int k_prefill_split_min_tiles = 8;       // key tiles a split takes at least
// A split's fixed cost in tiles (its start, partial store and merge): on an H200, 7B's last pass at 30720 took 965 us
// in splits against 904 that its tiles alone predict (2.19 us a tile of 128 x 128 at head_dim 128, from the unsplit
// pass: 1036 us for 2 x 236 tiles): ~20 us a round of splits.
constexpr int k_prefill_split_cost_tiles = 8;

struct PrefillSplitPlan {
    int full_blocks = 0;  // pairs that run whole, first (blocks 0 .. full_blocks - 1)
    int tail_pairs = 0;   // pairs after them, each as `splits` blocks
    int splits = 1;       // 1: no splits
};

inline int prefill_split_slots(int sms) { return k_prefill_split_slots_per_sm * sms; }

// Whether a sequence of `keys` keys may split (two splits of k_prefill_split_min_tiles tiles at least): where the
// engine makes the scratch, and where the memory model counts it.
inline bool prefill_split_may_apply(int keys) { return keys > 2 * k_prefill_split_min_tiles * k_prefill_split_tile; }

// Scratch for `sms` SMs at this head_dim: per slot, each consumer thread's accumulators (head_dim / 2 fp32) and its
// rows' (m0, m1, l0, l1); then an int counter per slot, from this byte offset.
inline size_t prefill_split_counters_offset(int head_dim, int sms) {
    return size_t(prefill_split_slots(sms)) * k_prefill_split_threads * (size_t(head_dim) / 2 + 4) * sizeof(float);
}
inline size_t prefill_split_scratch_bytes(int head_dim, int sms) {
    return prefill_split_counters_offset(head_dim, sms) + size_t(prefill_split_slots(sms)) * sizeof(int);
}

// The launch of n queries at positions pos0.. over n_head heads on `sms` SMs. Pairs go heaviest first: pair p is
// head p % n_head of query tile (q_tiles - 1 - p / n_head). Splits where they shorten the tail's rounds, costed as
// rounds x (tiles a split + k_prefill_split_cost_tiles), each split at least k_prefill_split_min_tiles tiles of the
// lightest pair. forced > 1 (tests): every pair in min(forced, the lightest pair's tiles) splits; forced 1: none.
inline PrefillSplitPlan prefill_split_plan(int n, int pos0, int n_head, int sms, int forced = 0) {
    PrefillSplitPlan none;
    const int q_tiles = (n + k_prefill_split_rows - 1) / k_prefill_split_rows, pairs = q_tiles * n_head;
    none.full_blocks = pairs;
    if (n <= 0 || sms <= 0 || forced == 1) return none;
    auto tiles_of = [&](int pair) {
        const int q_tile = q_tiles - 1 - pair / n_head;
        return (pos0 + std::min((q_tile + 1) * k_prefill_split_rows, n) + k_prefill_split_tile - 1) / k_prefill_split_tile;
    };
    const int slots = prefill_split_slots(sms), lightest = tiles_of(pairs - 1);
    if (forced > 1) {
        const int s = std::min(forced, lightest);
        if (s < 2 || size_t(pairs) * s > size_t(slots)) return none;
        return {0, pairs, s};
    }
    const int full = pairs / sms * sms, tail = pairs - full;
    if (tail == 0) return none;
    const int heaviest = tiles_of(full);
    int best = 1, best_cost = heaviest;  // the tail whole: one round
    for (int s = 2; s <= k_prefill_split_max; s++) {
        if (lightest < s * k_prefill_split_min_tiles || tail * s > slots) break;
        const int rounds = (tail * s + sms - 1) / sms;
        const int cost = rounds * ((heaviest + s - 1) / s + k_prefill_split_cost_tiles);
        if (cost < best_cost) {
            best = s;
            best_cost = cost;
        }
    }
    if (best == 1) return none;
    return {full, tail, best};
}

}  // namespace qinfer
