// Tensor parallel: which part of each weight a rank holds (Megatron-style). q/k/v and gate/up are split by output,
// o_proj and down by input (each rank's partial sums meet in one all-reduce after each), the vocabulary by rows of the
// embedding and lm_head. The loader and the NCCL step of the tensor-parallel issue build on this plan.
//
// Attention heads go to ranks as whole GQA groups (a KV head with its query heads), as evenly as the groups allow, so
// that no rank holds a KV head it does not own: Qwen2.5-72B (64 query heads, 8 KV heads) on 3 ranks takes 2 / 3 / 3
// groups, 16 / 24 / 24 query heads. With more ranks than KV heads (the rank count a multiple of the KV heads), each KV
// head is held by tp / n_kv ranks, which split its group's query heads (7B's 7 a group on 8 ranks: 3 / 4).
#pragma once

#include <vector>

#include "io/model_config.h"

namespace qinfer {

struct TpShard {
    int rank = 0;
    int q_head0 = 0, n_q_heads = 0;    // its query heads [q_head0, q_head0 + n_q_heads)
    int kv_head0 = 0, n_kv_heads = 0;  // the KV heads they read (shared with other ranks when tp > n_kv)
    int inter0 = 0, n_inter = 0;       // its part of the MLP's intermediate dimension (gate/up rows, down columns)
    int vocab0 = 0, n_vocab = 0;       // its rows of the embedding and the lm_head
};

// One shard per rank. The intermediate dimension is cut on multiples of `inter_align` (a quantized checkpoint's group
// size along down_proj's input, 128 for most), the vocabulary on multiples of `vocab_align`; the last rank takes any
// remainder. Fails with a one-line error where the heads cannot be split (more ranks than query heads, or more ranks
// than KV heads without being a multiple of them).
// [begin, end) of rank r's part of a dimension of `size` cut on multiples of `align` (the last rank takes any remainder).
std::pair<int, int> tp_part(int size, int align, int parts, int r);

// The GPUs' tensor parallel: decode steps of up to this many rows compute the logits of their rank's share of the
// vocabulary (lm_head is whole on every rank) and all-gather them: a rank reads 1/ranks of lm_head (7B: 0.55 of
// 1.09 GB) for an all-gather of rows x vocab fp32. Larger steps (continuous batching) compute every logit on every rank.
constexpr int k_tp_split_logits_rows = 16;

std::vector<TpShard> plan_tensor_parallel(const ModelConfig & c, int tp, int inter_align = 128, int vocab_align = 64);

}  // namespace qinfer
