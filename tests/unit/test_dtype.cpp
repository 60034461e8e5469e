#include <gtest/gtest.h>

#include <cmath>

#include "core/dtype.h"

using namespace qinfer;

TEST(DType, Bf16RoundsToNearestEven) {
    EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
    EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
    // 1 + 2^-8 is exactly half way between two bf16 values: ties go to even (1.0).
    EXPECT_EQ(f32_to_bf16(1.0f + 1.0f / 256), 0x3f80);
    EXPECT_EQ(f32_to_bf16(1.0f + 3.0f / 256), 0x3f82);
    EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
}

TEST(DType, F16RoundTripsEveryValue) {
    for (uint32_t h = 0; h < 65536; h++) {
        float f = f16_to_f32(uint16_t(h));
        if (std::isnan(f)) continue;
        EXPECT_EQ(f32_to_f16(f), h) << "h = " << h;
    }
    EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
    EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
    EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);               // rounds to infinity
    EXPECT_EQ(f32_to_f16(1.0f + 1.0f / 2048), 0x3c00);     // tie to even
}

TEST(DType, Names) {
    DType t;
    ASSERT_TRUE(dtype_from_name("F8_E4M3", &t));
    EXPECT_EQ(t, DType::F8_E4M3);
    EXPECT_EQ(dtype_size(DType::BF16), 2u);
    EXPECT_FALSE(dtype_from_name("Q4_K", &t));
}
