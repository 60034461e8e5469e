#include <gtest/gtest.h>

#include "core/check.h"
#include "runtime/kv_cache.h"

using namespace qinfer;

TEST(KVCache, BlocksAreAllocatedAndReused) {
    BlockTable t(4, 16);
    int a = t.add_sequence();
    t.reserve(a, 17);  // 2 blocks
    EXPECT_EQ(t.blocks(a).size(), 2u);
    EXPECT_EQ(t.free_blocks(), 2);
    int b = t.add_sequence();
    EXPECT_THROW(t.reserve(b, 48), Error);  // needs 3, only 2 free
    t.reserve(b, 32);
    EXPECT_EQ(t.free_blocks(), 0);
    t.free_sequence(a);
    EXPECT_EQ(t.free_blocks(), 2);
    EXPECT_EQ(t.block_of(b, 20), t.blocks(b)[1]);
}

TEST(KVCache, CpuCacheAddressesDistinctSlots) {
    KVCacheShape s;
    s.n_layers = 2;
    s.n_kv_heads = 2;
    s.head_dim = 4;
    s.block_size = 4;
    s.n_blocks = 3;
    CpuKVCache c(s);
    int seq = c.table().add_sequence();
    c.table().reserve(seq, 9);
    for (int l = 0; l < 2; l++) {
        for (int p = 0; p < 9; p++) c.k(l, seq, p)[0] = float(l * 100 + p);
    }
    for (int l = 0; l < 2; l++) {
        for (int p = 0; p < 9; p++) EXPECT_EQ(c.k(l, seq, p)[0], float(l * 100 + p));
    }
}
