#include "runtime/block_pool.h"

#include <algorithm>

#include "core/check.h"

namespace qinfer {

BlockPool::BlockPool(int n_blocks, int block_size)
    : n_blocks_(n_blocks), block_size_(block_size), refs_(size_t(n_blocks), 0), lru_(size_t(n_blocks)), in_lru_(size_t(n_blocks), false),
      block_hash_(size_t(n_blocks), 0), indexed_(size_t(n_blocks), false) {
    QINFER_CHECK(n_blocks >= 0 && block_size > 0) << "BlockPool: " << n_blocks << " blocks of " << block_size << " tokens";
    free_.resize(size_t(n_blocks));
    for (int i = 0; i < n_blocks; i++) free_[size_t(i)] = n_blocks - 1 - i;  // block 0 first
}

bool BlockPool::allocate(int n, std::vector<int> & out) {
    if (n <= 0) return true;
    if (n > available()) return false;
    for (int i = 0; i < n; i++) {
        int b;
        if (!free_.empty()) {
            b = free_.back();
            free_.pop_back();
        } else {
            b = evictable_.front();  // least recently released
            evictable_.pop_front();
            in_lru_[size_t(b)] = false;
            unindex(b);
        }
        refs_[size_t(b)] = 1;
        out.push_back(b);
    }
    return true;
}

void BlockPool::release(const std::vector<int> & blocks) {
    // Last block first: free blocks go back on the stack so that the next sequence takes them in their order, and
    // cached ones join the eviction list tail first, so a prefix outlives its tails (as vLLM frees a sequence's blocks).
    for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) {
        const int b = *it;
        QINFER_CHECK(b >= 0 && b < n_blocks_ && refs_[size_t(b)] > 0) << "BlockPool: releasing block " << b << ", which is not in use";
        if (--refs_[size_t(b)] > 0) continue;
        if (indexed_[size_t(b)]) {
            lru_[size_t(b)] = evictable_.insert(evictable_.end(), b);
            in_lru_[size_t(b)] = true;
        } else {
            free_.push_back(b);
        }
    }
}

uint64_t BlockPool::chain_hash(uint64_t parent, const int * tokens, int block_size) {
    uint64_t h = parent ^ 0x9E3779B97F4A7C15ull;
    for (int i = 0; i < block_size; i++) {
        h ^= uint64_t(uint32_t(tokens[i])) + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
        h *= 0xBF58476D1CE4E5B9ull;
        h ^= h >> 31;
    }
    return h == 0 ? 1 : h;  // 0 is the empty prefix
}

int BlockPool::lookup(uint64_t hash, uint64_t parent, const int * tokens) {
    auto it = index_.find(hash);
    if (it == index_.end()) return -1;
    const Entry & e = it->second;
    if (e.parent != parent || !std::equal(e.tokens.begin(), e.tokens.end(), tokens)) return -1;
    const int b = e.block;
    if (refs_[size_t(b)] == 0 && in_lru_[size_t(b)]) {
        evictable_.erase(lru_[size_t(b)]);
        in_lru_[size_t(b)] = false;
    }
    refs_[size_t(b)]++;
    return b;
}

void BlockPool::publish(int block, uint64_t hash, uint64_t parent, const int * tokens) {
    QINFER_CHECK(block >= 0 && block < n_blocks_ && refs_[size_t(block)] > 0) << "BlockPool: publishing block " << block << ", which is not in use";
    if (indexed_[size_t(block)] || index_.count(hash)) return;
    index_.emplace(hash, Entry{block, parent, std::vector<int>(tokens, tokens + block_size_)});
    block_hash_[size_t(block)] = hash;
    indexed_[size_t(block)] = true;
}

void BlockPool::unindex(int block) {
    if (!indexed_[size_t(block)]) return;
    index_.erase(block_hash_[size_t(block)]);
    indexed_[size_t(block)] = false;
}

}  // namespace qinfer
