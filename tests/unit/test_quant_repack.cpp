// The CUDA layout built on the host reads back exactly what the stored format says, for every format.
#include <gtest/gtest.h>

#include "core/check.h"
#include "model/quant.h"
#include "model/quant_repack.h"
#include "unit/quant_helpers.h"

namespace qinfer {

namespace {

void expect_round_trip(const std::vector<const Linear *> & parts) {
    const RepackedQuant r = repack_quant(parts);
    int row0 = 0;
    for (const Linear * p : parts) {
        const QuantReader reader(*p);
        for (int n = 0; n < p->out_features; n++) {
            for (int k = 0; k < p->in_features; k++) {
                ASSERT_EQ(r.weight(row0 + n, k), reader.weight(n, k)) << p->scheme.describe() << " row " << n << " channel " << k;
            }
        }
        row0 += p->out_features;
    }
    EXPECT_EQ(r.rows, row0);
}

}  // namespace

TEST(QuantRepack, EveryFormatRoundTripsBitExactly) {
    using test::make_quant_linear;
    const std::vector<QuantScheme> schemes = {
        test::gptq_scheme(4, 32, true, QuantPacking::GptqV1),           test::gptq_scheme(4, -1, false, QuantPacking::GptqV1),
        test::gptq_scheme(4, 64, false, QuantPacking::GptqV2, true),    test::gptq_scheme(8, 32, true, QuantPacking::GptqV1, true),
        test::gptq_scheme(8, 16, false, QuantPacking::GptqV2),          test::gptq_scheme(4, 32, false, QuantPacking::AwqGemm),
        test::gptq_scheme(4, 32, false, QuantPacking::AwqGemv),         test::gptq_scheme(4, 64, false, QuantPacking::AwqGemv),
        test::bnb_scheme(QuantPacking::Nf4, false),                     test::bnb_scheme(QuantPacking::Fp4, true),
    };
    for (const QuantScheme & s : schemes) {
        auto a = make_quant_linear(s, 40, 192, 1), b = make_quant_linear(s, 24, 192, 2);
        expect_round_trip({&a->l});
        expect_round_trip({&a->l, &b->l});  // stacked like q/k/v (same act-order: same perm seed)
    }
}

// A row's codes unpacked a word at a time (what repack_quant reads) equal the reader's codes one by one, in every
// packing and bit width (GPTQ 3-bit fields straddle words: the per-code path; 32 rows, as 3-bit packing needs).
TEST(QuantRepack, CodesRowEqualsCodeByCode) {
    for (const QuantScheme & s : {test::gptq_scheme(2, 32, true, QuantPacking::GptqV1), test::gptq_scheme(3, 32, false, QuantPacking::GptqV2),
                                  test::gptq_scheme(4, 64, true, QuantPacking::GptqV1, true), test::gptq_scheme(8, 32, false, QuantPacking::GptqV2),
                                  test::gptq_scheme(4, 32, false, QuantPacking::AwqGemm), test::gptq_scheme(4, 64, false, QuantPacking::AwqGemv),
                                  test::bnb_scheme(QuantPacking::Nf4, false), test::bnb_scheme(QuantPacking::Fp4, true)}) {
        for (int k : {192, 320}) {
            auto a = test::make_quant_linear(s, 32, k, 5);
            const QuantReader reader(a->l);
            std::vector<uint8_t> row(static_cast<size_t>(k));
            for (int n = 0; n < 32; n++) {
                reader.codes_row(n, row.data());
                for (int i = 0; i < k; i++) ASSERT_EQ(row[size_t(i)], reader.code(n, i)) << s.describe() << " k " << k << " row " << n << " channel " << i;
            }
        }
    }
}

TEST(QuantRepack, RowDecoderEqualsTheReader) {
    for (const QuantScheme & s : {test::gptq_scheme(4, 32, false, QuantPacking::GptqV2, true), test::gptq_scheme(8, -1, true, QuantPacking::GptqV1),
                                  test::gptq_scheme(4, 64, false, QuantPacking::AwqGemm), test::gptq_scheme(4, 32, false, QuantPacking::AwqGemv),
                                  test::bnb_scheme(QuantPacking::Nf4, true)}) {
        auto a = test::make_quant_linear(s, 24, 320, 3);
        const RepackedQuant r = repack_quant({&a->l}, false);
        const QuantReader reader(a->l);
        std::vector<float> got(320), want(320);
        for (int n = 0; n < 24; n++) {
            r.row(n, got.data());
            reader.row(n, want.data());
            ASSERT_EQ(got, want) << s.describe() << " row " << n;
        }
    }
}

TEST(QuantRepack, RefusesWhatTheKernelsCannotRun) {
    auto three = test::make_quant_linear(test::gptq_scheme(3, 32, true, QuantPacking::GptqV1), 32, 96, 1);
    EXPECT_THROW(repack_quant({&three->l}), Error);
    auto g16 = test::make_quant_linear(test::gptq_scheme(4, 16, true, QuantPacking::GptqV1), 32, 96, 1);
    EXPECT_THROW(repack_quant({&g16->l}), Error);
    auto a = test::make_quant_linear(test::gptq_scheme(4, 32, true, QuantPacking::GptqV1, true), 32, 96, 1, 5);
    auto b = test::make_quant_linear(test::gptq_scheme(4, 32, true, QuantPacking::GptqV1, true), 32, 96, 2, 6);
    EXPECT_THROW(repack_quant({&a->l, &b->l}), Error);  // different act-orders cannot share one input permutation
}

// MoE experts are stacked in one matrix only where repack_quant can stack them (else the CUDA engine uploads them one
// by one): the same act-order, bits, group and K.
TEST(QuantRepack, StackableExperts) {
    const QuantScheme g4 = test::gptq_scheme(4, 32, true, QuantPacking::GptqV1), act = test::gptq_scheme(4, 32, true, QuantPacking::GptqV1, true);
    auto a = test::make_quant_linear(g4, 32, 96, 1), b = test::make_quant_linear(g4, 48, 96, 2);
    EXPECT_TRUE(quant_stackable({&a->l, &b->l}));
    const RepackedQuant r = repack_quant({&a->l, &b->l});
    EXPECT_EQ(r.rows, 80);
    auto same1 = test::make_quant_linear(act, 32, 96, 1, 5), same2 = test::make_quant_linear(act, 32, 96, 2, 5);
    EXPECT_TRUE(quant_stackable({&same1->l, &same2->l}));
    auto other = test::make_quant_linear(act, 32, 96, 3, 6);
    EXPECT_FALSE(quant_stackable({&same1->l, &other->l}));
    auto g8 = test::make_quant_linear(test::gptq_scheme(8, 32, true, QuantPacking::GptqV1), 32, 96, 4);
    EXPECT_FALSE(quant_stackable({&a->l, &g8->l}));
    auto g64 = test::make_quant_linear(test::gptq_scheme(4, 64, true, QuantPacking::GptqV1), 32, 128, 5);
    EXPECT_FALSE(quant_stackable({&a->l, &g64->l}));
    EXPECT_FALSE(quant_stackable({}));
}

}  // namespace qinfer
