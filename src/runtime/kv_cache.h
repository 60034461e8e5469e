// KV cache in fixed-size blocks with a block table per sequence (the vLLM "paged" layout), so batching,
// prefix reuse and quantized caches build on it without rewrites.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

namespace qinfer {

struct KVCacheShape {
    int n_layers = 0;
    int n_kv_heads = 0;
    int head_dim = 0;
    int block_size = 16;  // tokens per block
    int n_blocks = 0;
};

// Block bookkeeping, shared by every backend: which blocks are free, which sequence owns which blocks.
class BlockTable {
public:
    explicit BlockTable(int n_blocks, int block_size);
    int add_sequence();
    void free_sequence(int seq);
    // Makes room for `n_tokens` tokens in total; throws qinfer::Error when the pool runs out.
    void reserve(int seq, int n_tokens);
    int length(int seq) const;
    void set_length(int seq, int n_tokens);  // after the tokens' K/V are written
    const std::vector<int> & blocks(int seq) const;
    int block_size() const { return block_size_; }
    int free_blocks() const { return int(free_.size()); }
    int n_blocks() const { return n_blocks_; }
    // (block, slot) of token `pos` of a sequence.
    int block_of(int seq, int pos) const { return blocks(seq)[size_t(pos / block_size_)]; }

private:
    struct Sequence {
        std::vector<int> blocks;
        int length = 0;
    };
    const Sequence & get(int seq) const;
    int n_blocks_;
    int block_size_;
    std::vector<int> free_;
    std::map<int, Sequence> seqs_;
    int next_id_ = 0;
};

// The CPU cache: fp32 K and V of every layer, [layer][block][slot][kv_head][head_dim].
class CpuKVCache {
public:
    explicit CpuKVCache(const KVCacheShape & shape);
    const KVCacheShape & shape() const { return shape_; }
    BlockTable & table() { return table_; }
    const BlockTable & table() const { return table_; }
    float * k(int layer, int seq, int pos) { return at(k_, layer, seq, pos); }
    float * v(int layer, int seq, int pos) { return at(v_, layer, seq, pos); }
    const float * k(int layer, int seq, int pos) const { return const_cast<CpuKVCache *>(this)->k(layer, seq, pos); }
    const float * v(int layer, int seq, int pos) const { return const_cast<CpuKVCache *>(this)->v(layer, seq, pos); }
    size_t bytes() const { return (k_.size() + v_.size()) * sizeof(float); }

private:
    float * at(std::vector<float> & buf, int layer, int seq, int pos);
    KVCacheShape shape_;
    BlockTable table_;
    std::vector<float> k_, v_;
};

}  // namespace qinfer
