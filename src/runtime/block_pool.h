// The KV blocks of continuous batching (runtime/scheduler.h): which blocks are free, which are shared, and which full
// blocks hold a known prefix. A full block is identified by its tokens and everything before them (a hash chain), so
// requests that share a prefix share its blocks without copying; a block nobody uses keeps its contents and its
// place in the prefix index until it is needed for something else, least recently used first.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <unordered_map>
#include <vector>

namespace qinfer {

class BlockPool {
public:
    BlockPool(int n_blocks, int block_size);
    int n_blocks() const { return n_blocks_; }
    int block_size() const { return block_size_; }
    // Blocks that allocate() can hand out now: never used, or cached and unreferenced (evicted on demand).
    int available() const { return int(free_.size() + evictable_.size()); }
    int used() const { return n_blocks_ - available(); }  // referenced by a sequence
    int cached() const { return int(index_.size()); }     // full blocks in the prefix index (used or not)
    // n fresh blocks appended to `out`, each referenced once; false (nothing taken) when fewer are available.
    bool allocate(int n, std::vector<int> & out);
    // One reference less on each block, the last one first; an unreferenced block returns to the free list (the
    // sequence's blocks come out of it again in their order), or, when it is in the prefix index, to the evictable
    // list (most recently released last: of one sequence's blocks its last is evicted first).
    void release(const std::vector<int> & blocks);
    // The hash of a full block: its tokens (block_size of them) after the prefix whose last block hashed to `parent`
    // (0 for the first block).
    static uint64_t chain_hash(uint64_t parent, const int * tokens, int block_size);
    // The block holding exactly these tokens after that prefix, referenced once more, or -1.
    int lookup(uint64_t hash, uint64_t parent, const int * tokens);
    // Enters a full block into the prefix index (no effect when the hash is there already, or the block is in it).
    void publish(int block, uint64_t hash, uint64_t parent, const int * tokens);
    int refs(int block) const { return refs_[size_t(block)]; }

private:
    struct Entry {
        int block;
        uint64_t parent;
        std::vector<int> tokens;  // checked on lookup, so that a hash collision never shares a wrong block
    };
    void unindex(int block);
    int n_blocks_, block_size_;
    std::vector<int> refs_;
    std::vector<int> free_;                       // never used or uncached: taken from the back
    std::list<int> evictable_;                    // cached and unreferenced, least recently released first
    std::vector<std::list<int>::iterator> lru_;   // a block's place in evictable_ (valid while it is there)
    std::vector<bool> in_lru_;
    std::unordered_map<uint64_t, Entry> index_;   // hash -> block
    std::vector<uint64_t> block_hash_;            // the hash a block is indexed under
    std::vector<bool> indexed_;
};

}  // namespace qinfer
