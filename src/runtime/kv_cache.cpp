#include "runtime/kv_cache.h"

#include "core/check.h"

namespace qinfer {

BlockTable::BlockTable(int n_blocks, int block_size) : n_blocks_(n_blocks), block_size_(block_size) {
    QINFER_CHECK(n_blocks >= 0 && block_size > 0);
    for (int b = n_blocks - 1; b >= 0; b--) free_.push_back(b);
}

int BlockTable::add_sequence() {
    int id = next_id_++;
    seqs_[id] = Sequence{};
    return id;
}

void BlockTable::free_sequence(int seq) {
    auto it = seqs_.find(seq);
    if (it == seqs_.end()) return;
    for (int b : it->second.blocks) free_.push_back(b);
    seqs_.erase(it);
}

const BlockTable::Sequence & BlockTable::get(int seq) const {
    auto it = seqs_.find(seq);
    QINFER_CHECK(it != seqs_.end()) << "unknown sequence " << seq;
    return it->second;
}

void BlockTable::reserve(int seq, int n_tokens) {
    Sequence & s = const_cast<Sequence &>(get(seq));
    size_t need = size_t((int64_t(n_tokens) + block_size_ - 1) / block_size_);
    if (need > s.blocks.size() && need - s.blocks.size() > free_.size()) {
        QINFER_FAIL() << "KV cache full: " << n_tokens << " tokens need " << need << " blocks of " << block_size_
                      << ", only " << free_.size() + s.blocks.size() << " available";
    }
    while (s.blocks.size() < need) {
        s.blocks.push_back(free_.back());
        free_.pop_back();
    }
}

int BlockTable::length(int seq) const { return get(seq).length; }

void BlockTable::set_length(int seq, int n_tokens) {
    Sequence & s = const_cast<Sequence &>(get(seq));
    QINFER_CHECK(size_t(n_tokens) <= s.blocks.size() * size_t(block_size_));
    s.length = n_tokens;
}

const std::vector<int> & BlockTable::blocks(int seq) const { return get(seq).blocks; }

CpuKVCache::CpuKVCache(const KVCacheShape & shape) : shape_(shape), table_(shape.n_blocks, shape.block_size) {
    size_t n = size_t(shape.n_layers) * shape.n_blocks * shape.block_size * shape.n_kv_heads * shape.head_dim;
    k_.assign(n, 0.0f);
    v_.assign(n, 0.0f);
}

float * CpuKVCache::at(std::vector<float> & buf, int layer, int seq, int pos) {
    const KVCacheShape & s = shape_;
    int block = table_.block_of(seq, pos);
    int slot = pos % s.block_size;
    size_t token_stride = size_t(s.n_kv_heads) * s.head_dim;
    size_t idx = ((size_t(layer) * s.n_blocks + size_t(block)) * s.block_size + size_t(slot)) * token_stride;
    return buf.data() + idx;
}

}  // namespace qinfer
