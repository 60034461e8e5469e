// Quantized kernels against the CPU reference (cpu::linear dequantizes by each format's formula): the decode GEMV
// for m = 1, 3 and 8 with every input/output form, dequantization + cuBLASLt for m = 16 and 257, the fused prefill
// GEMM (sm_90a) for m = 16 to 513, the register-dequantizing GEMMs (mma.sync: sm_80 and up; wgmma: sm_90a) for m = 5
// to 512 and the rule that picks among them, on odd shapes
// (K and N not multiples of 128 where the format allows) for every format the CUDA backend runs.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <string>
#include <gtest/gtest.h>

#include "backends/cpu/ops.h"
#include "backends/cuda/ops.h"
#include "cuda/helpers.h"
#include "model/quant.h"
#include "model/quant_repack.h"
#include "model/qwen_cuda.h"
#include "unit/quant_helpers.h"

using namespace qinfer;
using namespace qinfer::test;
using cuda::bf16;
using cuda::DeviceBuffer;

namespace {

using DevQuant = cuda_engine::DevLinear;

DevQuant upload_quant(const Linear & l, bool tile = true) { return cuda_engine::upload_repacked(repack_quant({&l}, tile)); }

std::vector<QuantScheme> cuda_schemes() {
    return {gptq_scheme(4, 128, true, QuantPacking::GptqV1),        gptq_scheme(4, 32, false, QuantPacking::GptqV2, true),
            gptq_scheme(4, -1, false, QuantPacking::GptqV1),        gptq_scheme(8, -1, true, QuantPacking::GptqV1),
            gptq_scheme(8, 32, false, QuantPacking::GptqV2, true),  gptq_scheme(4, 64, false, QuantPacking::AwqGemm),
            gptq_scheme(4, 64, false, QuantPacking::AwqGemv),
            bnb_scheme(QuantPacking::Nf4, false),                   bnb_scheme(QuantPacking::Fp4, true)};
}

}  // namespace

class QuantGemv : public ::testing::TestWithParam<std::tuple<int, int>> {};

// A setting of the quantized GEMV's launch rules that a pass of the test forces: deep, the deep-ring variant
// (cuda::set_qgemv_ring_deep; false: never) for the forms that take it (bf16 input from global memory added to a
// residual); beside, the gate/up of one row as a MoE block's shared expert runs it (GemvArgs::beside: its K parts from
// one up), only that; fast (set_qgemv_ring_fast) and split (set_qgemv_ring_split): -1 the rules, 1 wherever they can.
struct GemvMode {
    const char * name;
    bool deep = false;
    bool beside = false;
    int fast = -1;
    int split = -1;
};

// Every format, m, input and output form of the quantized GEMV for one weight shape, each case under every mode: the
// weights, inputs and the CPU reference are made once a case (the reference is most of the test's time).
static void check_quant_gemv(int n, int k, const std::vector<GemvMode> & modes) {
    for (const QuantScheme & s : cuda_schemes()) {
        for (int silu = 0; silu < 2; silu++) {
            const int rows = silu ? 2 * n : n;
            auto ql = make_quant_linear(s, rows, k, rng()());
            DevQuant dq = upload_quant(ql->l, !silu || n % 16 == 0);  // as the engine stacks gate/up
            for (int m : {1, 3, 8}) {
                DeviceBuffer scratch(cuda::qgemv_scratch_bytes(dq.q.k_padded, m), "test");
                for (int in = 0; in < 2; in++) {
                    std::vector<float> x = randn(size_t(m) * k), norm_w = randn(size_t(k), 0.2f);
                    for (float & v : norm_w) v = round_bf16(v + 1.0f);
                    DeviceBuffer dnorm = upload_bf16(norm_w);
                    DeviceBuffer dx = in == 1 ? upload(x) : upload_bf16(x);
                    const std::vector<float> xin = in ? norm_rows(x, norm_w, m, k, 1e-6f) : x;
                    std::vector<float> ref(size_t(m) * rows);
                    cpu::linear(xin.data(), m, ql->l, ref.data());
                    for (int out = silu ? 3 : 0; out < (silu ? 4 : 3); out++) {
                        std::vector<float> y0 = randn(size_t(m) * n), want(size_t(m) * n);
                        for (int r = 0; r < m; r++) {
                            for (int j = 0; j < n; j++) {
                                float v = ref[size_t(r) * rows + j];
                                if (out == 2) v += y0[size_t(r) * n + j];
                                if (silu) {
                                    const float g = round_bf16(v), u = round_bf16(ref[size_t(r) * rows + n + j]);
                                    v = g / (1 + std::exp(-g)) * u;
                                }
                                want[size_t(r) * n + j] = v;
                            }
                        }
                        for (const GemvMode & mode : modes) {
                            if (mode.deep && (in != 0 || out != 2)) continue;
                            if (mode.beside && (!silu || m != 1)) continue;
                            cuda::set_qgemv_ring_deep(mode.deep);
                            cuda::set_qgemv_ring_fast(mode.fast);
                            cuda::set_qgemv_ring_split(mode.split);
                            DeviceBuffer dy = out == 2 ? upload(y0) : poisoned(size_t(m) * n * 4);
                            cuda::GemvArgs a = gemv_args(n, k, m, dx, dnorm, dy);
                            a.beside = mode.beside;
                            const cuda::GemvIn gin = in ? cuda::GemvIn::NormF32 : cuda::GemvIn::Bf16;
                            cuda::qgemv(dq.q, a, gin, cuda::GemvOut(out), scratch.get(), nullptr);
                            if (out != 2) {
                                // A second call gives the same bits (the K parts are added in a fixed order).
                                const size_t bytes = size_t(m) * n * (out == 1 ? 4 : 2);
                                std::vector<char> first(bytes), second(bytes);
                                cudaMemcpy(first.data(), dy.get(), bytes, cudaMemcpyDeviceToHost);
                                cudaMemset(dy.get(), 0xFF, dy.bytes());
                                cuda::qgemv(dq.q, a, gin, cuda::GemvOut(out), scratch.get(), nullptr);
                                cudaMemcpy(second.data(), dy.get(), bytes, cudaMemcpyDeviceToHost);
                                EXPECT_TRUE(first == second) << s.describe() << " n " << n << " k " << k << " m " << m << " " << mode.name
                                                             << ": second call differs";
                            }
                            const auto got = (out == 1 || out == 2) ? download_f32(dy, want.size()) : download_bf16(dy, want.size());
                            // Relative to the output's scale: fp32 reassociation (the zero point applied per chunk), one
                            // bf16 rounding step of the staged normalised input (CPU and GPU rsqrt differ in the last
                            // bit), a bf16 output, and for silu the product of two such values. Lookup tables
                            // (bitsandbytes) enter the tiled kernel's MMAs rounded to bf16: 2^-9 per weight.
                            const double tol_f32 = dq.q.tiled && dq.q.lut ? 6e-3 : in ? 2e-3 : 2e-5;
                            const double tol = (out == 1 || out == 2) ? tol_f32 : silu ? 2e-2 : 8e-3;
                            EXPECT_LT(rel_err(got, want), tol) << s.describe() << " n " << n << " k " << k << " m " << m << " in " << in
                                                               << " out " << out << " " << mode.name;
                        }
                    }
                }
            }
        }
    }
    cuda::reset_qgemv_ring_deep();
    cuda::set_qgemv_ring_fast(-1);
    cuda::set_qgemv_ring_split(-1);
}

TEST_P(QuantGemv, MatchesCpu) {
    REQUIRE_GPU();
    const auto [n, k] = GetParam();
    std::vector<GemvMode> modes = {{"plain"}, {"deep", true}, {"beside", false, true}};
    // The ring kernel's fast rounds wherever they fit (by default only on parts of three rounds).
    if (k >= 1024) modes.insert(modes.end(), {{"fast", false, false, 1}, {"fast deep", true, false, 1}});
    // Every grid's second half in split blocks (by default only a long grid's part-filled last wave).
    modes.push_back({"split", false, false, -1, 1});
    if (k >= 1024) modes.push_back({"split deep", true, false, -1, 1});
    check_quant_gemv(n, k, modes);
}

// N = rows of the weight (a multiple of 8 for GPTQ packing), K a multiple of 64 but not of 128 where possible.
INSTANTIATE_TEST_SUITE_P(OddShapes, QuantGemv,
                         ::testing::Values(std::tuple{8, 192}, std::tuple{264, 4160}, std::tuple{1160, 896}, std::tuple{4864, 320}, std::tuple{20000, 128}));

// The decode step's gate/up -> down pair with its activations in b_pair_order (GemvArgs::pair_io): gate/up writes
// exactly the plain activations, each 64-wide block permuted, and down reading them so gives the same bits as down
// reading the plain ones; for m 1..8, down's input staged in shared memory (k >= 8192 at m 1) or read from global
// memory, deep ring or not, added to a residual or written as bf16.
TEST(CudaQuant, PairOrderedActivationsMatchPlain) {
    REQUIRE_GPU();
    auto pair_pos = [](int i) {
        const int e = i & 63, w = e >> 1;
        return (i & ~63) | ((w & 3) << 4) | ((w >> 2) << 1) | (e & 1);
    };
    const QuantScheme schemes[] = {gptq_scheme(4, 128, true, QuantPacking::GptqV1), gptq_scheme(8, 32, false, QuantPacking::GptqV2),
                                   gptq_scheme(4, 64, false, QuantPacking::AwqGemm)};
    for (const QuantScheme & s : schemes) {
        for (const auto & [h, inter] : {std::pair{320, 4160}, std::pair{1152, 8256}}) {
            auto gu = make_quant_linear(s, 2 * inter, h, rng()());
            auto dn = make_quant_linear(s, h, inter, rng()());
            DevQuant dgu = upload_quant(gu->l), ddn = upload_quant(dn->l);
            ASSERT_TRUE(cuda::qgemv_pair_io_ok(dgu.q, ddn.q)) << s.describe();
            for (int m : {1, 2, 3, 4, 8}) {
                std::vector<float> x = randn(size_t(m) * h), norm_w = randn(size_t(h), 0.2f), y0 = randn(size_t(m) * h);
                for (float & v : norm_w) v = round_bf16(v + 1.0f);
                DeviceBuffer dx = upload(x), dnorm = upload_bf16(norm_w);
                DeviceBuffer scratch(cuda::qgemv_scratch_bytes(std::max(dgu.q.k_padded, ddn.q.k_padded), m), "test");
                DeviceBuffer act[2] = {poisoned(size_t(m) * inter * 2), poisoned(size_t(m) * inter * 2)};
                for (int p = 0; p < 2; p++) {
                    cuda::GemvArgs a = gemv_args(inter, h, m, dx, dnorm, act[p]);
                    a.pair_io = p == 1;
                    cuda::qgemv(dgu.q, a, cuda::GemvIn::NormF32, cuda::GemvOut::SiluMulBf16, scratch.get(), nullptr);
                }
                const auto plain = download_bf16(act[0], size_t(m) * inter), paired = download_bf16(act[1], size_t(m) * inter);
                int moved = 0;
                for (int r = 0; r < m; r++) {
                    for (int i = 0; i < inter; i++) moved += paired[size_t(r) * inter + pair_pos(i)] != plain[size_t(r) * inter + i];
                }
                EXPECT_EQ(moved, 0) << s.describe() << " m " << m << ": gate/up's pair-ordered output is not the plain one permuted";
                for (int deep = 0; deep < 2; deep++) {
                    cuda::set_qgemv_ring_deep(deep == 1);
                    for (cuda::GemvOut out : {cuda::GemvOut::AddF32, cuda::GemvOut::Bf16}) {
                        const bool add = out == cuda::GemvOut::AddF32;
                        std::vector<float> got[2];
                        for (int p = 0; p < 2; p++) {
                            DeviceBuffer dy = add ? upload(y0) : poisoned(size_t(m) * h * 2);
                            cuda::GemvArgs a = gemv_args(h, inter, m, act[p], dnorm, dy);
                            a.pair_io = p == 1;
                            cuda::qgemv(ddn.q, a, cuda::GemvIn::Bf16, out, scratch.get(), nullptr);
                            got[p] = add ? download_f32(dy, size_t(m) * h) : download_bf16(dy, size_t(m) * h);
                        }
                        EXPECT_TRUE(got[0] == got[1]) << s.describe() << " h " << h << " inter " << inter << " m " << m << " deep " << deep
                                                      << " add " << add << ": down on pair-ordered activations differs";
                    }
                }
                cuda::reset_qgemv_ring_deep();
            }
        }
    }
}

TEST(CudaQuant, DequantizeThenGemmMatchesCpu) {
    REQUIRE_GPU();
    for (const QuantScheme & s : cuda_schemes()) {
        for (auto [m, n, k] : {std::tuple{16, 264, 192}, std::tuple{257, 1160, 4160}}) {
            auto ql = make_quant_linear(s, n, k, rng()());
            DevQuant dq = upload_quant(ql->l);
            DeviceBuffer w = poisoned(size_t(n) * k * 2);
            cuda::dequantize(dq.q, w.as<bf16>(), nullptr);
            // The dequantized weight itself: each value the format's, rounded once to bf16.
            std::vector<float> want_w = qinfer::dequantize(ql->l), got_w = download_bf16(w, want_w.size());
            for (float & v : want_w) v = round_bf16(v);
            EXPECT_EQ(rel_err(got_w, want_w), 0.0) << s.describe();
            std::vector<float> x = randn(size_t(m) * k);
            DeviceBuffer dx = upload_bf16(x), dy = poisoned(size_t(m) * n * 4);
            cuda::gemm(dx.as<bf16>(), w.as<bf16>(), m, n, k, dy.get(), true, nullptr);
            std::vector<float> want(size_t(m) * n);
            cpu::linear(x.data(), m, ql->l, want.data());
            EXPECT_LT(rel_err(download_f32(dy, want.size()), want), 1e-2) << s.describe() << " m " << m;
        }
    }
}

// The register-dequantizing GEMMs (qgemm_mma, and qgemm_rs where the build and device are sm_90a; every m: one and
// several token tiles, K split where the grid is short of the SMs) against the CPU reference and against dequantize +
// cuBLASLt; act-order and x at an odd address go through the gathered inputs.
struct RegisterGemm {
    const char * name;
    bool (*applies)(const cuda::QuantMatrix &);
    size_t (*scratch_bytes)(const cuda::QuantMatrix &, int);
    bool (*run)(const cuda::QuantMatrix &, const bf16 *, int, bf16 *, void *, size_t, cudaStream_t);
};

static int check_register_gemm(const RegisterGemm & kernel) {
    int checked = 0;
    for (const QuantScheme & s : cuda_schemes()) {
        for (auto [n, k, m_list] : {std::tuple{264, 192, std::vector<int>{5, 9, 16, 17}}, std::tuple{1160, 4160, std::vector<int>{33, 64, 129, 200}},
                                    std::tuple{4864, 320, std::vector<int>{24, 300, 512}}, std::tuple{200, 896, std::vector<int>{65, 100}}}) {
            auto ql = make_quant_linear(s, n, k, rng()());
            DevQuant dq = upload_quant(ql->l);
            if (!kernel.applies(dq.q)) continue;
            for (int m : m_list) {
                std::vector<float> x = randn(size_t(m) * k);
                std::vector<float> want(size_t(m) * n);
                cpu::linear(x.data(), m, ql->l, want.data());
                const std::vector<uint16_t> xb = to_bf16(x);
                const std::string what = std::string(kernel.name) + " " + s.describe() + " m " + std::to_string(m) + " n " + std::to_string(n) +
                                         " k " + std::to_string(k);
                for (bool odd : {false, true}) {
                    DeviceBuffer dx(size_t(m) * k * 2 + 16, "test"), dy = poisoned(size_t(m) * n * 2 + 16);
                    bf16 * xp = dx.as<bf16>() + (odd ? 1 : 0);
                    cudaMemcpy(xp, xb.data(), xb.size() * 2, cudaMemcpyHostToDevice);
                    DeviceBuffer scratch(size_t(m) * dq.q.k_padded * 2 + kernel.scratch_bytes(dq.q, m), "test");
                    const bool ran = kernel.run(dq.q, xp, m, dy.as<bf16>(), scratch.get(), scratch.bytes(), nullptr);
                    EXPECT_TRUE(ran) << what;
                    if (!ran) continue;
                    const std::vector<float> got = download_bf16(dy, size_t(m) * n);
                    EXPECT_LT(rel_err(got, want), 1e-2) << what << " odd " << odd;
                    std::vector<uint16_t> tail(8);
                    cudaMemcpy(tail.data(), dy.as<bf16>() + size_t(m) * n, 16, cudaMemcpyDeviceToHost);
                    for (uint16_t v : tail) EXPECT_EQ(v, 0xFFFFu) << what << " wrote past y";
                    // A second call gives the same bits (K splits are added in a fixed order).
                    cudaMemset(dy.get(), 0xFF, dy.bytes());
                    EXPECT_TRUE(kernel.run(dq.q, xp, m, dy.as<bf16>(), scratch.get(), scratch.bytes(), nullptr)) << what;
                    EXPECT_TRUE(download_bf16(dy, size_t(m) * n) == got) << what << ": second call differs";
                    checked++;
                    if (odd) continue;
                    DeviceBuffer w = poisoned(size_t(n) * k * 2), dy2 = poisoned(size_t(m) * n * 2);
                    cuda::dequantize(dq.q, w.as<bf16>(), nullptr);
                    cuda::gemm(xp, w.as<bf16>(), m, n, k, dy2.get(), false, nullptr);
                    // Not the same bf16 weights: qgemm_mma scales per-group fp32 sums (the GEMV's arithmetic), qgemm_rs
                    // rounds the scale to bf16 before its product.
                    EXPECT_LT(rel_err(got, download_bf16(dy2, size_t(m) * n)), 1e-2) << what << " vs dequantize + GEMM";
                }
            }
        }
    }
    return checked;
}

// qgemm_mma by its rule, then with blocks of 6 and of 8 warps at up to 32 tokens (set_qgemm_mma_warps).
TEST(CudaQuant, MmaGemmMatchesCpu) {
    REQUIRE_GPU();
    auto plain = [](const cuda::QuantMatrix & w, const bf16 * x, int m, bf16 * y, void * scratch, size_t bytes, cudaStream_t stream) {
        return cuda::qgemm_mma(w, x, m, y, scratch, bytes, stream);
    };
    for (int warps : {0, 6, 8}) {
        cuda::set_qgemm_mma_warps(warps);
        EXPECT_GT(check_register_gemm({"mma", cuda::qgemm_mma_applies, cuda::qgemm_mma_scratch_bytes, plain}), 0) << "warps " << warps;
    }
    cuda::set_qgemm_mma_warps(0);
}

// qgemm_rs by its rule, then as if the device had 4 or 6 SMs, so that tiles of the last wave are dealt out in
// pieces of K (1160 rows, k 4160: 10 tiles at m 33 / 64 on 8 slots, 8 whole and 2 in four pieces; 14 at m 129, 12
// whole and 2 in two pieces on 4 slots, in three on 6; at m 200 tiles of 256 tokens, pieces and whole ones). Tiles
// of 256 tokens store y by tensor stores: 4864 rows at m 300 / 512 (whole tiles, k 320), tokens past m and rows past
// n (1160) not written.
TEST(CudaQuant, RsGemmMatchesCpu) {
    REQUIRE_GPU();
    for (int sms : {0, 4, 6}) {
        SCOPED_TRACE(testing::Message() << "SMs " << (sms ? std::to_string(sms) : "of the device"));
        cuda::set_qgemm_rs_slots(sms);
        auto plain = [](const cuda::QuantMatrix & w, const bf16 * x, int m, bf16 * y, void * scratch, size_t bytes, cudaStream_t stream) {
            return cuda::qgemm_rs(w, x, m, y, scratch, bytes, stream);
        };
        const int checked = check_register_gemm({"wgmma-rs", cuda::qgemm_rs_applies, cuda::qgemm_rs_scratch_bytes, plain});
        cuda::set_qgemm_rs_slots(0);
        if (checked == 0) GTEST_SKIP() << "no register-sourced wgmma GEMM on this build or device (sm_90a only)";
    }
}

// One check of a GEMM's SwiGLU tiles on dq, a stacked [gate; up] weight of 2 inter rows: gemm(x, y, silu_mul) with
// silu_mul false, then cuda::silu_mul, against gemm with silu_mul true. fits false: refused, y untouched. exact: the
// same bits, else within bf16 rounding and the same bits on a second call. 1 where it was checked.
static int check_swiglu(const DevQuant & dq, int m, int inter, bool fits, bool exact, const std::string & what,
                        const std::function<bool(const bf16 *, bf16 *, bool)> & gemm) {
    const int n = 2 * inter, k = dq.q.k;
    DeviceBuffer dx = upload_bf16(randn(size_t(m) * k)), gu = poisoned(size_t(m) * n * 2), want = poisoned(size_t(m) * inter * 2);
    DeviceBuffer got = poisoned(size_t(m) * inter * 2 + 16);
    if (!gemm(dx.as<bf16>(), gu.as<bf16>(), false)) {
        ADD_FAILURE() << what << ": the GEMM did not run";
        return 0;
    }
    cuda::silu_mul(gu.as<bf16>(), m, inter, want.as<bf16>(), nullptr);
    const bool ran = gemm(dx.as<bf16>(), got.as<bf16>(), true);
    const std::vector<uint16_t> got_bits = download_u16(got, size_t(m) * inter + 8);
    if (!fits) {
        EXPECT_FALSE(ran) << what;
        EXPECT_TRUE(std::all_of(got_bits.begin(), got_bits.end(), [](uint16_t v) { return v == 0xFFFFu; })) << what << ": a refused call wrote y";
        return 0;
    }
    if (!ran) {
        ADD_FAILURE() << what << ": refused";
        return 0;
    }
    for (size_t i = size_t(m) * inter; i < got_bits.size(); i++) EXPECT_EQ(got_bits[i], 0xFFFFu) << what << " wrote past y";
    if (exact) {
        const std::vector<uint16_t> want_bits = download_u16(want, size_t(m) * inter);
        EXPECT_TRUE(std::equal(want_bits.begin(), want_bits.end(), got_bits.begin())) << what << ": not silu_mul's bits";
    } else {
        EXPECT_LT(rel_err(download_bf16(got, size_t(m) * inter), download_bf16(want, size_t(m) * inter)), 1e-2) << what;
        DeviceBuffer again = poisoned(size_t(m) * inter * 2);
        EXPECT_TRUE(gemm(dx.as<bf16>(), again.as<bf16>(), true)) << what;
        EXPECT_TRUE(download_u16(again, size_t(m) * inter) == download_u16(got, size_t(m) * inter)) << what << ": second call differs";
    }
    return 1;
}

// qgemm_mma's SwiGLU tiles (silu_mul = true) on a stacked [gate; up] weight: the same bits as its y then
// cuda::silu_mul, every format it takes (affine and lookup codes; act-order through the gathered inputs), token counts over one and several
// tiles and every token tile width, blocks of 6 and 8 warps (halves of 12 row blocks: whole tiles; 13: a last tile
// cut short); refused (false, y untouched) where half the rows is not a multiple of 16 or K would be split (k 128 is
// never split).
TEST(CudaQuant, MmaGemmSwigluMatchesSiluMul) {
    REQUIRE_GPU();
    int checked = 0;
    for (const QuantScheme & s : cuda_schemes()) {
        for (auto [inter, k, fits, warps] : {std::tuple{192, 128, true, 8}, std::tuple{208, 128, true, 8}, std::tuple{192, 128, true, 6},
                                             std::tuple{208, 128, true, 6}, std::tuple{200, 128, false, 0}, std::tuple{64, 8192, false, 0}}) {
            auto ql = make_quant_linear(s, 2 * inter, k, rng()());
            DevQuant dq = upload_quant(ql->l);
            if (!cuda::qgemm_mma_applies(dq.q)) continue;
            for (int m : {5, 16, 17, 40, 64}) {
                const std::string what = s.describe() + " m " + std::to_string(m) + " inter " + std::to_string(inter) + " k " +
                                         std::to_string(k) + " warps " + std::to_string(warps);
                DeviceBuffer scratch(size_t(m) * dq.q.k_padded * 2 + cuda::qgemm_mma_scratch_bytes(dq.q, m), "test");
                cuda::set_qgemm_mma_warps(warps);
                checked += check_swiglu(dq, m, inter, fits, true, what, [&](const bf16 * x, bf16 * y, bool silu) {
                    return cuda::qgemm_mma(dq.q, x, m, y, scratch.get(), scratch.bytes(), nullptr, silu);
                });
                cuda::set_qgemm_mma_warps(0);
            }
        }
    }
    EXPECT_GT(checked, 0);
}

// qgemm_rs's SwiGLU tiles (silu_mul = true) on a stacked [gate; up] weight, every format it takes, one and several
// token tiles of every width: where K is whole (k 128) the same bits as its y then cuda::silu_mul; where K is dealt out
// in pieces (k 4160, as if the device had 4 or 6 SMs, or the device's own: every tile in pieces) against that within
// bf16 rounding, and the same bits on a second call; halves of 13 row blocks cut the last tile short; refused (false,
// y untouched) where half the rows is not a multiple of 16.
TEST(CudaQuant, RsGemmSwigluMatchesSiluMul) {
    REQUIRE_GPU();
    int checked = 0;
    for (const QuantScheme & s : cuda_schemes()) {
        for (auto [inter, k, fits] : {std::tuple{192, 128, true}, std::tuple{208, 128, true}, std::tuple{200, 128, false}, std::tuple{576, 4160, true}}) {
            auto ql = make_quant_linear(s, 2 * inter, k, rng()());
            DevQuant dq = upload_quant(ql->l);
            if (!cuda::qgemm_rs_applies(dq.q)) continue;
            for (int sms : {0, 4, 6}) {
                if (sms && k == 128) continue;
                cuda::set_qgemm_rs_slots(sms);
                for (int m : {5, 16, 17, 40, 64, 129}) {
                    const std::string what = s.describe() + " m " + std::to_string(m) + " inter " + std::to_string(inter) + " k " +
                                             std::to_string(k) + " SMs " + std::to_string(sms);
                    DeviceBuffer scratch(size_t(m) * dq.q.k_padded * 2 + cuda::qgemm_rs_scratch_bytes(dq.q, m), "test");
                    checked += check_swiglu(dq, m, inter, fits, k == 128, what, [&](const bf16 * x, bf16 * y, bool silu) {
                        return cuda::qgemm_rs(dq.q, x, m, y, scratch.get(), scratch.bytes(), nullptr, silu);
                    });
                }
            }
            cuda::set_qgemm_rs_slots(0);
        }
    }
    if (checked == 0) GTEST_SKIP() << "no register-sourced wgmma GEMM on this build or device (sm_90a only)";
}

// cuda::quant_linear on the path cuda::quant_path picks, for m on both sides of each of the rule's bounds, every format
// (bitsandbytes included), as the engine calls it for batched steps and prefill.
TEST(CudaQuant, QuantLinearMatchesCpu) {
    REQUIRE_GPU();
    const int n = 1160, k = 896;
    for (const QuantScheme & s : cuda_schemes()) {
        auto ql = make_quant_linear(s, n, k, rng()());
        DevQuant dq = upload_quant(ql->l);
        for (int m : {1, 4, 5, 8, 9, 64, 65, 128, 129, 513}) {
            std::vector<float> x = randn(size_t(m) * k);
            std::vector<float> want(size_t(m) * n);
            cpu::linear(x.data(), m, ql->l, want.data());
            DeviceBuffer dx = upload_bf16(x), dy = poisoned(size_t(m) * n * 2);
            DeviceBuffer gemv_scratch(cuda::qgemv_scratch_bytes(dq.q.k_padded, cuda::k_qgemv_max_m), "test");
            DeviceBuffer scratch(std::max<size_t>(16, cuda::quant_linear_scratch_bytes(dq.q, m)), "test");
            const cuda::QuantPath path = cuda::quant_path(dq.q, m);
            ASSERT_TRUE(cuda::quant_linear(path, dq.q, dx.as<bf16>(), m, dy.as<bf16>(), gemv_scratch.get(), scratch.get(), scratch.bytes(), nullptr))
                << s.describe() << " m " << m << " " << cuda::quant_path_name(path);
            const double tol = dq.q.lut ? 1.5e-2 : 1e-2;
            EXPECT_LT(rel_err(download_bf16(dy, want.size()), want), tol) << s.describe() << " m " << m << " " << cuda::quant_path_name(path);
        }
    }
}

// Lookup codes at 9-16 rows on a weight of 32 M codes (the rule's bound) take qgemm_mma through cuda::quant_linear,
// and match the CPU.
TEST(CudaQuant, QuantLinearLargeLutTakesMma) {
    REQUIRE_GPU();
    const int n = 4096, k = 8192, m = 16;
    auto ql = make_quant_linear(bnb_scheme(QuantPacking::Nf4, false), n, k, rng()());
    DevQuant dq = upload_quant(ql->l);
    const cuda::QuantPath path = cuda::quant_path(dq.q, m);
    ASSERT_EQ(path, cuda::QuantPath::Mma) << cuda::quant_path_name(path);
    std::vector<float> x = randn(size_t(m) * k), want(size_t(m) * n);
    cpu::linear(x.data(), m, ql->l, want.data());
    DeviceBuffer dx = upload_bf16(x), dy = poisoned(size_t(m) * n * 2);
    DeviceBuffer gemv_scratch(cuda::qgemv_scratch_bytes(dq.q.k_padded, cuda::k_qgemv_max_m), "test");
    DeviceBuffer scratch(std::max<size_t>(16, cuda::quant_linear_scratch_bytes(dq.q, m)), "test");
    ASSERT_TRUE(cuda::quant_linear(path, dq.q, dx.as<bf16>(), m, dy.as<bf16>(), gemv_scratch.get(), scratch.get(), scratch.bytes(), nullptr));
    EXPECT_LT(rel_err(download_bf16(dy, want.size()), want), 1.5e-2);
}

// Timings for the record (not assertions): 1024 tokens through each Qwen2.5-7B projection, quantized (GPTQ-Int4 and
// -Int8 with group 128, NF4: dequantize to bf16, then cuBLASLt; and where it applies qgemm_rs, which the engine
// takes at 1024 rows for affine codes) against cuBLASLt on bf16 weights of the same shape, and the dequantization
// alone (GB/s of codes and parameters read plus bf16 written).
TEST(CudaQuant, PrefillGemmTimings) {
    REQUIRE_GPU();
    const int m = 1024;
    const std::pair<const char *, QuantScheme> formats[] = {{"GPTQ-Int4", gptq_scheme(4, 128, true, QuantPacking::GptqV1)},
                                                            {"GPTQ-Int8", gptq_scheme(8, 128, true, QuantPacking::GptqV1)},
                                                            {"NF4", bnb_scheme(QuantPacking::Nf4, false)}};
    for (auto [name, n, k] : {std::tuple{"qkv", 4608, 3584}, std::tuple{"o_proj", 3584, 3584}, std::tuple{"gate_up", 37888, 3584},
                              std::tuple{"down", 3584, 18944}}) {
        DeviceBuffer w(size_t(n) * k * 2, "test"), x = upload_bf16(randn(size_t(m) * k)), y(size_t(m) * n * 2, "test");
        const double flop = 2.0 * m * n * k;
        for (const auto & [format, scheme] : formats) {
            auto ql = make_quant_linear(scheme, n, k, 7);
            DevQuant dq = upload_quant(ql->l);
            // The bf16 baseline multiplies this format's weights dequantized (random values: an all-zero matrix lets
            // the tensor cores draw less power and run faster than on real weights).
            cuda::dequantize(dq.q, w.as<bf16>(), nullptr);
            const double bf16_ms = time_ms(10, [&] { cuda::gemm(x.as<bf16>(), w.as<bf16>(), m, n, k, y.get(), false, nullptr); }, 1);
            const double dq_ms = time_ms(10, [&] { cuda::dequantize(dq.q, w.as<bf16>(), nullptr); }, 1);
            const double quant_ms = time_ms(10, [&] {
                cuda::dequantize(dq.q, w.as<bf16>(), nullptr);
                cuda::gemm(x.as<bf16>(), w.as<bf16>(), m, n, k, y.get(), false, nullptr);
            }, 1);
            const double dq_bytes = double(dq.codes.bytes() + dq.scales.bytes() + dq.zeros.bytes() + dq.absmax.bytes()) + double(w.bytes());
            std::printf("[ kernel ] prefill GEMM %-7s %-9s m %d n %d k %d: bf16 %.3f ms (%.0f TFLOP/s), dequantize %.3f ms (%.0f GB/s), "
                        "dequantize+GEMM %.3f ms (%.0f TFLOP/s, %.0f%%)",
                        name, format, m, n, k, bf16_ms, flop / bf16_ms / 1e9, dq_ms, dq_bytes / dq_ms / 1e6, quant_ms, flop / quant_ms / 1e9,
                        100.0 * bf16_ms / quant_ms);
            if (cuda::qgemm_rs_applies(dq.q)) {
                DeviceBuffer scratch(std::max<size_t>(16, cuda::qgemm_rs_scratch_bytes(dq.q, m)), "test");
                const double fused_ms = time_ms(10, [&] { cuda::qgemm_rs(dq.q, x.as<bf16>(), m, y.as<bf16>(), scratch.get(), scratch.bytes(), nullptr); }, 1);
                std::printf(", fused %.3f ms (%.0f TFLOP/s, %.0f%%)", fused_ms, flop / fused_ms / 1e9, 100.0 * bf16_ms / fused_ms);
            }
            std::printf("\n");
        }
    }
}

// Timings for the record (not assertions): one decode step's quantized GEMVs of Qwen2.5-7B (GPTQ-Int4 and -Int8 with
// group 128, NF4), each with the input and output forms the engine uses (qkv and gate_up with the RMSNorm fused in),
// as GB/s of the weight's bytes on the device (codes, scales, zeros, absmax). The codes are cycled through copies of at least 128 MB in all, so no call finds its weights in the
// 50 MB L2 (scripts/device.sh qgemv). QINFER_QGEMV_TIMING_CASE=FORMAT:SHAPE (e.g. GPTQ-Int4:gate_up) times that case
// alone, m 1 (for ncu: scripts/device/qgemv-ncu.sh).
TEST(CudaQuant, DecodeGemvTimings) {
    REQUIRE_GPU();
    const char * only_env = std::getenv("QINFER_QGEMV_TIMING_CASE");
    const std::string only = only_env ? only_env : "";
    const GemvShape shapes[] = {{"qkv", 4608, 3584, cuda::GemvIn::NormF32, cuda::GemvOut::Bf16},
                            {"o_proj", 3584, 3584, cuda::GemvIn::Bf16, cuda::GemvOut::AddF32},
                            {"gate_up", 18944, 3584, cuda::GemvIn::NormF32, cuda::GemvOut::SiluMulBf16},
                            {"down", 3584, 18944, cuda::GemvIn::Bf16, cuda::GemvOut::AddF32}};
    const std::pair<const char *, QuantScheme> formats[] = {{"GPTQ-Int4", gptq_scheme(4, 128, true, QuantPacking::GptqV1)},
                                                            {"GPTQ-Int8", gptq_scheme(8, 128, true, QuantPacking::GptqV1)},
                                                            {"NF4", bnb_scheme(QuantPacking::Nf4, false)}};
    for (const GemvShape & sh : shapes) {
        for (const auto & [format, scheme] : formats) {
            if (!only.empty() && only != std::string(format) + ":" + sh.name) continue;
            const bool silu = sh.out == cuda::GemvOut::SiluMulBf16;
            const int rows = silu ? 2 * sh.n : sh.n;
            auto ql = make_quant_linear(scheme, rows, sh.k, 11);
            DevQuant dq = upload_quant(ql->l);
            const size_t code_bytes = dq.codes.bytes();
            const int copies = int(std::max<size_t>(1, (size_t(128) << 20) / code_bytes + 1));
            DeviceBuffer codes(code_bytes * copies, "test");
            for (int c = 0; c < copies; c++) {
                cudaMemcpy(codes.as<char>() + c * code_bytes, dq.codes.get(), code_bytes, cudaMemcpyDeviceToDevice);
            }
            for (int m : {1, 4}) {
                if (!only.empty() && m != 1) continue;
                const bool norm = sh.in == cuda::GemvIn::NormF32;
                DeviceBuffer dx = norm ? upload(randn(size_t(m) * sh.k)) : upload_bf16(randn(size_t(m) * sh.k));
                DeviceBuffer dnorm = upload_bf16(std::vector<float>(size_t(sh.k), 1.0f));
                DeviceBuffer dy(size_t(m) * sh.n * 4, "test"), scratch(cuda::qgemv_scratch_bytes(dq.q.k_padded, m), "test");
                cudaMemset(dy.get(), 0, dy.bytes());
                cuda::GemvArgs a = gemv_args(sh.n, sh.k, m, dx, dnorm, dy);
                cuda::QuantMatrix q = dq.q;
                int call = 0;
                // Microseconds per call with the deep ring off or on (each call reads another copy of the codes).
                auto time_us = [&](bool deep) {
                    cuda::set_qgemv_ring_deep(deep);
                    const double t = 1e3 * time_ms(200, [&] {
                        q.codes = reinterpret_cast<const uint32_t *>(codes.as<char>() + (call++ % copies) * code_bytes);
                        cuda::qgemv(q, a, sh.in, sh.out, scratch.get(), nullptr);
                    }, 3);
                    cuda::reset_qgemv_ring_deep();
                    return t;
                };
                const double us = time_us(false);
                const double bytes = double(code_bytes + dq.scales.bytes() + dq.zeros.bytes() + dq.absmax.bytes());  // as stored on the device
                std::printf("[ kernel ] qgemv %-9s %-7s m %d n %d k %d: %.1f us, %.0f GB/s\n", format, sh.name, m, rows, sh.k, us, bytes / us / 1e3);
                if (sh.in == cuda::GemvIn::Bf16 && sh.out == cuda::GemvOut::AddF32) {  // the deep ring's forms
                    const double deep_us = time_us(true);
                    std::printf("[ kernel ] qgemv %-9s %-7s m %d n %d k %d, deep ring: %.1f us, %.0f GB/s\n", format, sh.name, m, rows, sh.k, deep_us,
                                bytes / deep_us / 1e3);
                }
                if (m == 1 && format == formats[0].first) {  // the same projection with bf16 weights (the unquantized GEMV), for scale
                    const size_t w_bytes = size_t(rows) * sh.k * 2;
                    const int w_copies = int(std::max<size_t>(1, (size_t(128) << 20) / w_bytes + 1));
                    DeviceBuffer w(w_bytes * w_copies, "test");
                    cudaMemset(w.get(), 0, w.bytes());
                    const double bf16_us = 1e3 * time_ms(100, [&] {
                        a.w = reinterpret_cast<const bf16 *>(w.as<char>() + (call++ % w_copies) * w_bytes);
                        cuda::gemv(a, sh.in, sh.out, nullptr);
                    }, 3);
                    std::printf("[ kernel ] gemv  BF16      %-7s m %d n %d k %d: %.1f us, %.0f GB/s\n", sh.name, m, rows, sh.k, bf16_us, w_bytes / bf16_us / 1e3);
                }
            }
        }
    }
}
