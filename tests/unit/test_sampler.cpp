#include <gtest/gtest.h>

#include <map>

#include "core/check.h"
#include "runtime/sampler.h"

using namespace qinfer;

TEST(Sampler, GreedyIsArgmaxWithinValidIds) {
    SamplingParams p;
    Sampler s(p, 3);
    std::vector<float> logits = {0.1f, 2.0f, 0.5f, 9.0f};  // id 3 is padding past the tokenizer
    EXPECT_EQ(s.sample(logits.data(), 4, {}, {}), 1);
}

TEST(Sampler, RepetitionPenaltyLikeTransformers) {
    SamplingParams p;
    p.repetition_penalty = 2.0f;
    Sampler s(p, 3);
    std::vector<float> logits = {3.0f, 2.0f, -1.0f};
    // id 0 was seen: 3 / 2 = 1.5 < 2 -> id 1 wins; negative logits are multiplied.
    EXPECT_EQ(s.sample(logits.data(), 3, {0, 2}, {}), 1);
    EXPECT_FLOAT_EQ(logits[0], 1.5f);
    EXPECT_FLOAT_EQ(logits[2], -2.0f);
}

TEST(Sampler, PresenceAndFrequencyPenalties) {
    SamplingParams p;
    p.presence_penalty = 0.5f;
    p.frequency_penalty = 1.0f;
    Sampler s(p, 2);
    std::vector<float> logits = {3.0f, 1.0f};
    s.sample(logits.data(), 2, {}, {0, 0});
    EXPECT_FLOAT_EQ(logits[0], 3.0f - 0.5f - 2.0f);
}

TEST(Sampler, TopKOneIsGreedyAndSeedIsDeterministic) {
    std::vector<float> base = {0.0f, 1.0f, 0.5f, 0.9f};
    SamplingParams p;
    p.temperature = 1.0f;
    p.top_k = 1;
    Sampler s(p, 4);
    for (int i = 0; i < 20; i++) {
        auto l = base;
        EXPECT_EQ(s.sample(l.data(), 4, {}, {}), 1);
    }
    p.top_k = 0;
    p.seed = 42;
    Sampler a(p, 4), b(p, 4);
    for (int i = 0; i < 50; i++) {
        auto l1 = base, l2 = base;
        EXPECT_EQ(a.sample(l1.data(), 4, {}, {}), b.sample(l2.data(), 4, {}, {}));
    }
}

TEST(Sampler, DistributionFollowsSoftmaxAndTopP) {
    SamplingParams p;
    p.temperature = 1.0f;
    p.seed = 7;
    p.top_p = 0.7f;  // probs 0.5, 0.3, 0.2: top_p keeps the first two
    Sampler s(p, 3);
    std::map<int, int> counts;
    for (int i = 0; i < 20000; i++) {
        std::vector<float> l = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
        counts[s.sample(l.data(), 3, {}, {})]++;
    }
    EXPECT_EQ(counts[2], 0);
    EXPECT_NEAR(counts[0] / 20000.0, 0.625, 0.02);
}

TEST(Sampler, MinPDropsUnlikelyTokens) {
    SamplingParams p;
    p.temperature = 1.0f;
    p.min_p = 0.5f;
    Sampler s(p, 3);
    for (int i = 0; i < 200; i++) {
        std::vector<float> l = {std::log(0.6f), std::log(0.35f), std::log(0.05f)};
        EXPECT_NE(s.sample(l.data(), 3, {}, {}), 2);
    }
}

TEST(Sampler, RejectsBadParameters) {
    SamplingParams p;
    p.top_p = 0.0f;
    EXPECT_THROW(Sampler(p, 4), Error);
    p = SamplingParams{};
    p.temperature = -1;
    EXPECT_THROW(Sampler(p, 4), Error);
}
