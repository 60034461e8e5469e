#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "core/dtype.h"
#include "runtime/block_pool.h"
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
    // A fresh table hands out blocks 0, 1, 2, ...; freed blocks come back in the order they were held.
    EXPECT_EQ(t.blocks(b), (std::vector<int>{2, 3}));
    const int c = t.add_sequence();
    t.reserve(c, 32);
    EXPECT_EQ(t.blocks(c), (std::vector<int>{0, 1}));
}

// The serving pool: a released sequence's blocks come back in their order; of its cached blocks (a prefix chain) the
// last is evicted first, so the prefix outlives its tail.
TEST(BlockPool, ReleasedBlocksComeBackInOrderAndTailsEvictFirst) {
    BlockPool p(6, 4);
    std::vector<int> a, b;
    ASSERT_TRUE(p.allocate(3, a));
    EXPECT_EQ(a, (std::vector<int>{0, 1, 2}));
    p.release(a);
    ASSERT_TRUE(p.allocate(3, b));
    EXPECT_EQ(b, (std::vector<int>{0, 1, 2}));
    const int tokens[4] = {1, 2, 3, 4};
    uint64_t parent = 0;
    for (int blk : b) {
        const uint64_t h = BlockPool::chain_hash(parent, tokens, 4);
        p.publish(blk, h, parent, tokens);
        parent = h;
    }
    p.release(b);
    EXPECT_EQ(p.available(), 6);
    std::vector<int> c, d;
    ASSERT_TRUE(p.allocate(3, c));  // the never-used blocks first
    EXPECT_EQ(c, (std::vector<int>{3, 4, 5}));
    ASSERT_TRUE(p.allocate(2, d));  // then the cached ones, the chain's tail first
    EXPECT_EQ(d, (std::vector<int>{2, 1}));
    EXPECT_EQ(p.cached(), 1);
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
    std::vector<float> k(8), v(8);
    for (int l = 0; l < 2; l++) {
        for (int p = 0; p < 9; p++) {
            for (int i = 0; i < 8; i++) k[size_t(i)] = float(l * 100 + p) + 0.25f * float(i), v[size_t(i)] = -k[size_t(i)];
            c.write(l, c.table().blocks(seq), p, 1, k.data(), v.data());
        }
    }
    std::vector<float> rk(9 * 8), rv(9 * 8);
    for (int l = 0; l < 2; l++) {
        c.read(l, c.table().blocks(seq), 9, rk.data(), rv.data());
        for (int p = 0; p < 9; p++) {
            for (int i = 0; i < 8; i++) {
                EXPECT_EQ(rk[size_t(p * 8 + i)], float(l * 100 + p) + 0.25f * float(i));
                EXPECT_EQ(rv[size_t(p * 8 + i)], -rk[size_t(p * 8 + i)]);
            }
        }
    }
}

TEST(KVCache, E4m3) {
    EXPECT_EQ(f32_to_e4m3(448.0f), 0x7e);
    EXPECT_EQ(f32_to_e4m3(1000.0f), 0x7e);  // saturates
    EXPECT_EQ(f32_to_e4m3(-448.0f), 0xfe);
    EXPECT_EQ(f32_to_e4m3(1.0f), 0x38);
    EXPECT_EQ(f32_to_e4m3(std::ldexp(1.0f, -9)), 0x01);  // smallest subnormal
    EXPECT_EQ(f32_to_e4m3(std::ldexp(1.0f, -6)), 0x08);  // smallest normal
    EXPECT_EQ(f32_to_e4m3(1.0625f), 0x38);               // halfway between 1 and 1.125: to even
    EXPECT_EQ(f32_to_e4m3(1.1875f), 0x3a);               // halfway between 1.125 and 1.25: to even
    for (int b = 0; b < 256; b++) {
        if ((b & 0x7f) == 0x7f) continue;  // NaN
        const float f = e4m3_to_f32(uint8_t(b));
        EXPECT_EQ(e4m3_to_f32(f32_to_e4m3(f)), f) << b;  // every value round-trips
    }
    EXPECT_TRUE(std::isnan(e4m3_to_f32(0x7f)));
}

// Each dtype's stored values: bf16 rounding; fp8 within half a step of e4m3 at the layer scale; int8/int4 within
// half a step of the token's own range.
TEST(KVCache, QuantizedDtypesRoundTripWithinHalfAStep) {
    for (KVDType t : {KVDType::BF16, KVDType::FP8, KVDType::INT8, KVDType::INT4}) {
        KVCacheShape s;
        s.n_layers = 1;
        s.n_kv_heads = 3;
        s.head_dim = 10;
        s.block_size = 4;
        s.n_blocks = 4;
        s.dtype = t;
        CpuKVCache c(s);
        const int seq = c.table().add_sequence();
        c.table().reserve(seq, 13);
        std::vector<float> k(13 * 30), v(13 * 30);
        for (size_t i = 0; i < k.size(); i++) {
            k[i] = std::sin(float(i) * 0.37f) * 3.0f + (i % 30 == 5 ? 7.0f : 0.0f);
            v[i] = std::cos(float(i) * 0.91f) * 0.02f;
        }
        for (int h = 0; h < 3; h++) std::fill_n(v.begin() + 12 * 30 + h * 10, 10, 0.5f);  // a constant head
        c.write(0, c.table().blocks(seq), 0, 13, k.data(), v.data());
        std::vector<float> rk(k.size()), rv(v.size());
        c.read(0, c.table().blocks(seq), 13, rk.data(), rv.data());
        for (int which = 0; which < 2; which++) {
            const std::vector<float> & x = which ? v : k;
            const std::vector<float> & r = which ? rv : rk;
            for (size_t head = 0; head < 13 * 3; head++) {
                float mn = INFINITY, mx = -INFINITY, amax = 0;
                for (int i = 0; i < 10; i++) {
                    mn = std::min(mn, x[head * 10 + size_t(i)]);
                    mx = std::max(mx, x[head * 10 + size_t(i)]);
                }
                for (float e : x) amax = std::max(amax, std::fabs(e));
                for (int i = 0; i < 10; i++) {
                    const float want = x[head * 10 + size_t(i)], got = r[head * 10 + size_t(i)];
                    float tol = 0;
                    switch (t) {
                    case KVDType::BF16: tol = std::fabs(want) * 0x1p-8f; break;
                    case KVDType::FP8: tol = std::max(std::fabs(want) * 0x1p-4f, amax / 448.0f * 0x1p-9f) * 1.001f; break;
                    case KVDType::INT8: tol = (mx - mn) / 255.0f * 0.5f * 1.001f + 1e-6f; break;
                    case KVDType::INT4: tol = (mx - mn) / 15.0f * 0.5f * 1.001f + 1e-6f; break;
                    default: break;
                    }
                    ASSERT_LE(std::fabs(got - want), tol) << kv_dtype_name(t) << " head " << head << " element " << i;
                }
            }
        }
        // Constant heads come back exactly.
        for (int i = 0; i < 30; i++) EXPECT_EQ(rv[size_t(12 * 30 + i)], 0.5f) << kv_dtype_name(t);
    }
    EXPECT_THROW(parse_kv_dtype("int2"), Error);
}
