// The MoE kernels (backends/cuda/moe.cu) against a CPU reference of the model's MoE block (the CPU backend's routing,
// cpu::moe_route; each projection's output rounded to bf16 as the unfused CUDA path does): routing and grouping exactly, the grouped GEMMs and the combine within bf16
// tolerance, for 4..128 experts, top-k 1..8, 1..300 tokens (some experts get no rows, some many; the experts of up to
// 4 tokens through moe_decode), every row tile,
// hidden and intermediate sizes that are not multiples of the 64-wide K steps; a batch's rows equal each row alone.
// The quantized experts' kernel (moe_quant.cu) against the CPU backend's quantized linears (cpu::linear dequantizes
// by each format's formula), for 4- and 8-bit GPTQ v1/v2 and AWQ codes, groups 32 / 64 / 128 / whole rows, with one
// token routed inside the launch as well. The routed
// experts of decode steps in two launches (moe_decode.cu), against the same reference.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "backends/cpu/ops.h"
#include "backends/cuda/ops.h"
#include "cuda/helpers.h"
#include "model/quant_repack.h"
#include "model/qwen_cuda.h"
#include "unit/quant_helpers.h"

using namespace qinfer;
using namespace qinfer::test;
using cuda::DeviceBuffer;

namespace {

struct MoeCase {
    int experts, top_k, tokens, hidden, inter;
    bool renormalise, shared;
};

struct Routed {
    std::vector<int> ids;        // [c, k]
    std::vector<float> weights;  // [c, k]
};

Routed route_cpu(const std::vector<float> & logits, int c, int E, int k, bool renormalise) {
    Routed r;
    r.ids.resize(size_t(c) * k);
    r.weights.resize(size_t(c) * k);
    for (int t = 0; t < c; t++) {
        cpu::moe_route(logits.data() + size_t(t) * E, E, k, renormalise, r.ids.data() + size_t(t) * k, r.weights.data() + size_t(t) * k);
    }
    return r;
}

// The routing's device buffers for c tokens.
struct RoutingBuffers {
    DeviceBuffer idx, w;
    cuda::MoeRouting r;
    RoutingBuffers(int c, int E, int k) {
        idx = poisoned(cuda::moe_routing_ints(c, k, E) * sizeof(int));
        w = poisoned(size_t(c) * k * sizeof(float));
        r = cuda::moe_routing_in(idx.as<int>(), w.as<float>(), c, k, E);
    }
    static std::vector<int> ints(const int * dev, size_t n) {
        std::vector<int> v(n);
        EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        cudaMemcpy(v.data(), dev, n * sizeof(int), cudaMemcpyDeviceToHost);
        return v;
    }
};

float silu_f(float v) { return v / (1.0f + std::exp(-v)); }

// Each assignment's expert output [c k, hidden] (by assignment t k + j) for stacked bf16 experts gate_up [E, 2 inter,
// hidden] and down [E, hidden, inter], rounded as transformers rounds: the projections' outputs and the activation.
std::vector<float> experts_cpu(const Routed & want, const std::vector<float> & gate_up, const std::vector<float> & down,
                               const std::vector<float> & xn, int c, int k, int H, int I) {
    std::vector<float> expert_out(size_t(c) * k * H);
    for (int t = 0; t < c; t++) {
        for (int j = 0; j < k; j++) {
            const int e = want.ids[size_t(t) * k + j];
            std::vector<float> act(static_cast<size_t>(I));
            for (int f = 0; f < I; f++) {
                double g = 0, u = 0;
                for (int h = 0; h < H; h++) {
                    g += double(gate_up[(size_t(e) * 2 * I + f) * H + h]) * xn[size_t(t) * H + h];
                    u += double(gate_up[(size_t(e) * 2 * I + I + f) * H + h]) * xn[size_t(t) * H + h];
                }
                act[size_t(f)] = round_bf16(silu_f(round_bf16(float(g))) * round_bf16(float(u)));
            }
            for (int h = 0; h < H; h++) {
                double s = 0;
                for (int f = 0; f < I; f++) s += double(down[(size_t(e) * H + h) * I + f]) * act[size_t(f)];
                expert_out[(size_t(t) * k + j) * H + h] = round_bf16(float(s));
            }
        }
    }
    return expert_out;
}

class CudaMoe : public ::testing::TestWithParam<MoeCase> {};

TEST_P(CudaMoe, MatchesCpu) {
    REQUIRE_GPU();
    const MoeCase p = GetParam();
    const int E = p.experts, k = p.top_k, c = p.tokens, H = p.hidden, I = p.inter;
    const int stride = E + (p.shared ? 1 : 0);  // the router's rows, the shared expert's gate last
    std::vector<float> logits = randn(size_t(c) * stride, 2.0f);
    const std::vector<float> xn = randn(size_t(c) * H);
    const std::vector<float> gate_up = randn(size_t(E) * 2 * I * H, 1.0f / std::sqrt(float(H)));
    const std::vector<float> down = randn(size_t(E) * H * I, 1.0f / std::sqrt(float(I)));
    const std::vector<float> x0 = randn(size_t(c) * H);
    const std::vector<float> shared = randn(size_t(c) * H, 0.5f);
    std::vector<float> plain(size_t(c) * E);  // the router's expert columns alone
    for (int t = 0; t < c; t++) std::copy_n(logits.begin() + long(t) * stride, E, plain.begin() + long(t) * E);
    const Routed want = route_cpu(plain, c, E, k, p.renormalise);

    // Reference: each assignment's expert output, then the combine in fp32.
    const std::vector<float> expert_out = experts_cpu(want, gate_up, down, xn, c, k, H, I);
    std::vector<float> x_want = x0;
    for (int t = 0; t < c; t++) {
        const float sg = 1.0f / (1.0f + std::exp(-logits[size_t(t) * stride + E]));
        for (int h = 0; h < H; h++) {
            float v = x_want[size_t(t) * H + h];
            for (int j = 0; j < k; j++) v += want.weights[size_t(t) * k + j] * expert_out[(size_t(t) * k + j) * H + h];
            if (p.shared) v += sg * shared[size_t(t) * H + h];
            x_want[size_t(t) * H + h] = v;
        }
    }

    const DeviceBuffer logits_d = upload(logits), xn_d = upload_bf16(xn), gu_d = upload_bf16(gate_up), down_d = upload_bf16(down),
                       shared_d = upload_bf16(shared);
    const cuda::MoeExperts w{gu_d.as<cuda::bf16>(), down_d.as<cuda::bf16>(), E, H, I};
    std::vector<int> tiles_tried = {16, 64};
    if (cuda::sm90a_device()) tiles_tried.push_back(cuda::k_moe_wgmma_rows);  // the wgmma kernel (moe_wgmma.cu)
    for (int tile : tiles_tried) {
        SCOPED_TRACE("tile " + std::to_string(tile));
        RoutingBuffers rb(c, E, k);
        cuda::moe_route(logits_d.as<float>(), stride, c, E, k, p.renormalise, tile, rb.r, nullptr);
        const size_t ck = size_t(c) * k;
        // Routing: the same experts in the same order, the same weights.
        EXPECT_EQ(rb.ints(rb.r.ids, ck), want.ids);
        const std::vector<float> got_w = download_f32(rb.w, ck);
        for (size_t i = 0; i < ck; i++) ASSERT_NEAR(got_w[i], want.weights[i], 1e-6f) << "assignment " << i;
        // Grouping: expert e's rows list its tokens in order; slot_of inverts it; tiles count whole tiles.
        const std::vector<int> offsets = rb.ints(rb.r.offsets, size_t(E) + 1), tiles = rb.ints(rb.r.tiles, size_t(E) + 1);
        const std::vector<int> token_of = rb.ints(rb.r.token_of, ck), slot_of = rb.ints(rb.r.slot_of, ck);
        ASSERT_EQ(offsets[0], 0);
        ASSERT_EQ(tiles[0], 0);
        for (int e = 0; e < E; e++) {
            std::vector<int> rows;
            for (size_t a = 0; a < ck; a++) {
                if (want.ids[a] == e) rows.push_back(int(a));
            }
            ASSERT_EQ(offsets[size_t(e) + 1] - offsets[size_t(e)], int(rows.size())) << "expert " << e;
            ASSERT_EQ(tiles[size_t(e) + 1] - tiles[size_t(e)], (int(rows.size()) + tile - 1) / tile) << "expert " << e;
            for (size_t i = 0; i < rows.size(); i++) {
                const int sorted = offsets[size_t(e)] + int(i);
                ASSERT_EQ(token_of[size_t(sorted)], rows[i] / k);
                ASSERT_EQ(slot_of[size_t(rows[i])], sorted);
            }
        }
        // Experts and combine (decode steps take moe_decode instead: CudaMoeDecode).
        if (c <= cuda::k_moe_gemv_max_tokens) continue;
        DeviceBuffer act = poisoned(ck * I * 2), out = poisoned(ck * H * 2), x = upload(x0);
        cuda::moe_experts(xn_d.as<cuda::bf16>(), c, k, w, rb.r, tile, act.as<cuda::bf16>(), out.as<cuda::bf16>(), nullptr);
        const std::vector<float> out_sorted = download_bf16(out, ck * H);
        std::vector<float> got_out(ck * H);
        for (size_t a = 0; a < ck; a++) std::copy_n(out_sorted.begin() + long(slot_of[a]) * H, H, got_out.begin() + long(a) * H);
        EXPECT_LT(rel_err(got_out, expert_out), 2e-2);
        cuda::moe_combine(x.as<float>(), true, c, H, k, rb.r, out.as<cuda::bf16>(), p.shared ? shared_d.as<cuda::bf16>() : nullptr,
                          p.shared ? logits_d.as<float>() + E : nullptr, stride, nullptr);
        const std::vector<float> got_x = download_f32(x, size_t(c) * H);
        EXPECT_LT(rel_err(got_x, x_want), 2e-2);
        // Not accumulated (a tensor-parallel rank's partial): the experts' sum alone, whatever x held.
        DeviceBuffer part = poisoned(size_t(c) * H * 4);
        cuda::moe_combine(part.as<float>(), false, c, H, k, rb.r, out.as<cuda::bf16>(), p.shared ? shared_d.as<cuda::bf16>() : nullptr,
                          p.shared ? logits_d.as<float>() + E : nullptr, stride, nullptr);
        std::vector<float> got_part = download_f32(part, size_t(c) * H);
        for (size_t i = 0; i < got_part.size(); i++) got_part[i] += x0[i];  // the residual plus the partial, as the ranks' sum adds them
        EXPECT_LT(rel_err(got_part, x_want), 2e-2);

        // A batch's rows equal each row run alone, bit for bit ("alone": the row repeated k_moe_gemv_max_tokens + 1
        // times, as moe_experts takes steps of more tokens than a decode step).
        if (c <= 20) {
            const int reps = cuda::k_moe_gemv_max_tokens + 1;
            for (int t = 0; t < c; t += std::max(1, c / 3)) {
                std::vector<float> lg, xr;
                for (int i = 0; i < reps; i++) {
                    lg.insert(lg.end(), logits.begin() + long(t) * stride, logits.begin() + long(t + 1) * stride);
                    xr.insert(xr.end(), xn.begin() + long(t) * H, xn.begin() + long(t + 1) * H);
                }
                const DeviceBuffer lg_d = upload(lg), xr_d = upload_bf16(xr);
                RoutingBuffers one(reps, E, k);
                cuda::moe_route(lg_d.as<float>(), stride, reps, E, k, p.renormalise, tile, one.r, nullptr);
                DeviceBuffer act1 = poisoned(size_t(reps) * k * I * 2), out1 = poisoned(size_t(reps) * k * H * 2);
                cuda::moe_experts(xr_d.as<cuda::bf16>(), reps, k, w, one.r, tile, act1.as<cuda::bf16>(), out1.as<cuda::bf16>(), nullptr);
                const std::vector<float> alone = download_bf16(out1, size_t(reps) * k * H);
                const std::vector<int> slot1 = one.ints(one.r.slot_of, size_t(reps) * k);
                for (int j = 0; j < k; j++) {
                    for (int h = 0; h < H; h++) {
                        ASSERT_EQ(alone[size_t(slot1[size_t(j)]) * H + h], got_out[(size_t(t) * k + j) * H + h]) << "token " << t << " slot " << j;
                    }
                }
            }
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaMoe,
                         ::testing::Values(MoeCase{4, 1, 1, 96, 48, false, false}, MoeCase{5, 2, 3, 96, 48, false, true},
                                           MoeCase{8, 2, 17, 200, 72, true, false}, MoeCase{60, 4, 1, 256, 200, false, true},
                                           MoeCase{60, 4, 16, 256, 200, false, true}, MoeCase{64, 8, 5, 136, 88, false, true},
                                           MoeCase{128, 8, 1, 128, 64, true, false}, MoeCase{128, 8, 300, 128, 64, true, false},
                                           MoeCase{60, 4, 300, 264, 104, false, true}, MoeCase{16, 8, 129, 64, 24, true, false},
                                           MoeCase{32, 4, 256, 1024, 320, false, false}, MoeCase{32, 8, 32, 64, 24, false, true}));

// The router's logits for steps past the GEMVs (cuda::moe_router_logits, moe_router.cu) against double-precision
// sums on the CPU, on odd shapes (rows not a multiple of the block's 8, tokens not of its 8); each token's logits
// are the same bits whatever else is in the step.
TEST(CudaMoeRouter, MatchesCpu) {
    REQUIRE_GPU();
    struct Shape {
        int c, H, R;
    };
    for (const Shape sh : {Shape{5, 2048, 61}, Shape{9, 264, 129}, Shape{16, 3584, 65}, Shape{64, 2048, 128}, Shape{255, 136, 8}, Shape{256, 4096, 129}}) {
        SCOPED_TRACE("c " + std::to_string(sh.c) + " H " + std::to_string(sh.H) + " R " + std::to_string(sh.R));
        const std::vector<float> x = randn(size_t(sh.c) * sh.H), w = randn(size_t(sh.R) * sh.H, 0.05f);  // bf16 values
        const DeviceBuffer xd = upload_bf16(x), wd = upload_bf16(w);
        DeviceBuffer y = poisoned(size_t(sh.c) * sh.R * 4);
        ASSERT_TRUE(cuda::moe_router_applies(xd.as<cuda::bf16>(), sh.H, wd.as<cuda::bf16>()));
        cuda::moe_router_logits(xd.as<cuda::bf16>(), sh.c, sh.H, wd.as<cuda::bf16>(), sh.R, y.as<float>(), nullptr);
        const std::vector<float> got = download_f32(y, size_t(sh.c) * sh.R);
        for (int t = 0; t < sh.c; t++) {
            for (int r = 0; r < sh.R; r++) {
                double s = 0, mag = 0;
                for (int h = 0; h < sh.H; h++) {
                    const double v = double(x[size_t(t) * sh.H + h]) * w[size_t(r) * sh.H + h];
                    s += v;
                    mag += std::fabs(v);
                }
                ASSERT_NEAR(got[size_t(t) * sh.R + r], s, 1e-5 * mag + 1e-6) << "token " << t << " row " << r;
            }
        }
        const int t = sh.c / 2;  // that token alone
        const DeviceBuffer x1 = upload_bf16(std::vector<float>(x.begin() + long(t) * sh.H, x.begin() + long(t + 1) * sh.H));
        DeviceBuffer y1 = poisoned(size_t(sh.R) * 4);
        cuda::moe_router_logits(x1.as<cuda::bf16>(), 1, sh.H, wd.as<cuda::bf16>(), sh.R, y1.as<float>(), nullptr);
        const std::vector<float> alone = download_f32(y1, size_t(sh.R));
        for (int r = 0; r < sh.R; r++) ASSERT_EQ(alone[size_t(r)], got[size_t(t) * sh.R + r]) << "row " << r;
    }
}

// The router kernel against cuBLASLt (cuda::gemm, fp32 out) on the MoE presets' router shapes, for the perf log; the
// rule (cuda::moe_router_pays) follows it. Nothing asserted.
TEST(CudaMoeRouter, Timings) {
    REQUIRE_GPU();
    struct Shape {
        const char * model;
        int H, R;
    };
    for (const Shape sh : {Shape{"qwen1.5-moe-a2.7b", 2048, 61}, Shape{"qwen3-30b-a3b", 2048, 128}, Shape{"qwen2-57b-a14b", 3584, 65}}) {
        const int most = 1024;
        const DeviceBuffer xd = upload_bf16(randn(size_t(most) * sh.H)), wd = upload_bf16(randn(size_t(sh.R) * sh.H, 0.05f));
        DeviceBuffer y(size_t(most) * sh.R * 4, "test");
        for (int c : {5, 8, 16, 32, 64, 128, 256, 512, 1024}) {
            const double kernel_us = 1e3 * time_ms(50, [&] {
                cuda::moe_router_logits(xd.as<cuda::bf16>(), c, sh.H, wd.as<cuda::bf16>(), sh.R, y.as<float>(), nullptr);
            }, 5);
            const double gemm_us = 1e3 * time_ms(50, [&] { cuda::gemm(xd.as<cuda::bf16>(), wd.as<cuda::bf16>(), c, sh.R, sh.H, y.get(), true, nullptr); }, 5);
            std::printf("[ kernel ] moe router %s (%d x %d) c %d: kernel %.1f us, cuBLASLt %.1f us\n", sh.model, sh.R, sh.H, c, kernel_us, gemm_us);
        }
    }
}

// The routed experts of decode steps in two launches (cuda::moe_decode, moe_decode.cu): routing, experts in
// assignment order and the combine by the last block of each tile, against the CPU reference; the combine of models
// with a shared expert (moe_combine over rows in assignment order).
struct DecodeCase {
    int experts, top_k, tokens, hidden, inter;
    bool renormalise;
};
void PrintTo(const DecodeCase & p, std::ostream * os) { *os << p.experts << "x" << p.top_k << "_c" << p.tokens << "_h" << p.hidden << "_i" << p.inter; }

class CudaMoeDecode : public ::testing::TestWithParam<DecodeCase> {};

// moe_decode's arguments for a case over the tests' buffers: experts stacked as gate_up bf16 [E, 2I, H], down [E, H, I].
cuda::MoeDecode decode_args(const DecodeCase & p, float * logits, int stride, const DeviceBuffer & gate_up, const DeviceBuffer & down, int * ids,
                            float * weights, int * arrivals) {
    cuda::MoeDecode m;
    m.logits = logits;
    m.stride = stride;
    m.top_k = p.top_k;
    m.renormalise = p.renormalise;
    m.experts = cuda::MoeExperts{gate_up.as<cuda::bf16>(), down.as<cuda::bf16>(), p.experts, p.hidden, p.inter};
    m.ids = ids;
    m.weights = weights;
    m.arrivals = arrivals;
    return m;
}

TEST_P(CudaMoeDecode, MatchesCpu) {
    REQUIRE_GPU();
    const DecodeCase p = GetParam();
    const int E = p.experts, k = p.top_k, c = p.tokens, H = p.hidden, I = p.inter, stride = E + 1;
    ASSERT_TRUE(cuda::moe_decode_applies(E, k, H, I));
    const std::vector<float> logits = randn(size_t(c) * stride, 2.0f), xn = randn(size_t(c) * H), x0 = randn(size_t(c) * H);
    const std::vector<float> gate_up = randn(size_t(E) * 2 * I * H, 1.0f / std::sqrt(float(H)));
    const std::vector<float> down = randn(size_t(E) * H * I, 1.0f / std::sqrt(float(I)));
    const std::vector<float> shared = randn(size_t(c) * H, 0.5f);
    std::vector<float> plain(size_t(c) * E);
    for (int t = 0; t < c; t++) std::copy_n(logits.begin() + long(t) * stride, E, plain.begin() + long(t) * E);
    const Routed want = route_cpu(plain, c, E, k, p.renormalise);
    // Reference: each assignment's expert output, then the combine in fp32 (x_shared: with the shared expert's output
    // and gate as well).
    const std::vector<float> expert_out = experts_cpu(want, gate_up, down, xn, c, k, H, I);
    std::vector<float> x_want = x0, x_shared = x0;
    for (int t = 0; t < c; t++) {
        const float sg = 1.0f / (1.0f + std::exp(-logits[size_t(t) * stride + E]));
        for (int h = 0; h < H; h++) {
            float v = x_want[size_t(t) * H + h];
            for (int j = 0; j < k; j++) v += want.weights[size_t(t) * k + j] * expert_out[(size_t(t) * k + j) * H + h];
            x_want[size_t(t) * H + h] = v;
            x_shared[size_t(t) * H + h] = v + sg * shared[size_t(t) * H + h];
        }
    }

    const DeviceBuffer gu_d = upload_bf16(gate_up), down_d = upload_bf16(down), shared_d = upload_bf16(shared);
    DeviceBuffer arrivals = upload(std::vector<int>(cuda::moe_decode_arrivals(c, H), 0));
    // n tokens through moe_decode, combined into x (accumulated into xin, or the sum alone; none: x left out).
    struct Result {
        std::vector<int> ids;
        std::vector<float> weights, out, x;
    };
    enum class Sum { Accumulate, Alone, None };
    auto run = [&](const std::vector<float> & lg, const std::vector<float> & xr, const std::vector<float> & xin, int n, Sum sum,
                   const cuda::MoeNormIn & norm = {}, int * ids_ready = nullptr) {
        const DeviceBuffer lg_d = upload(lg), xn_d = upload_bf16(xr);
        DeviceBuffer x = sum == Sum::Accumulate ? upload(xin) : poisoned(size_t(n) * H * 4), ids_d = poisoned(size_t(n) * k * 4),
                     w_d = poisoned(size_t(n) * k * 4), act = poisoned(size_t(n) * k * I * 2), out = poisoned(size_t(n) * k * H * 2);
        cuda::MoeDecode m = decode_args(p, lg_d.as<float>(), stride, gu_d, down_d, ids_d.as<int>(), w_d.as<float>(), arrivals.as<int>());
        m.norm = norm;
        m.ids_ready = ids_ready;
        cuda::moe_decode(norm.x ? nullptr : xn_d.as<cuda::bf16>(), n, m, act.as<cuda::bf16>(), out.as<cuda::bf16>(), sum == Sum::None ? nullptr : x.as<float>(),
                         sum == Sum::Accumulate, nullptr);
        Result r;
        r.ids = RoutingBuffers::ints(ids_d.as<int>(), size_t(n) * k);
        r.weights = download_f32(w_d, size_t(n) * k);
        r.out = download_bf16(out, size_t(n) * k * H);
        if (sum == Sum::None) {
            // A model with a shared expert: moe_combine over the rows in assignment order.
            cuda::MoeRouting rt;
            rt.weights = m.weights;
            cuda::moe_combine(x.as<float>(), false, n, H, k, rt, out.as<cuda::bf16>(), shared_d.as<cuda::bf16>(), lg_d.as<float>() + E, stride, nullptr);
        }
        r.x = download_f32(x, size_t(n) * H);
        return r;
    };
    const Result got = run(logits, xn, x0, c, Sum::Accumulate);
    EXPECT_EQ(got.ids, want.ids);
    for (size_t i = 0; i < got.weights.size(); i++) ASSERT_NEAR(got.weights[i], want.weights[i], 1e-6f) << "assignment " << i;
    EXPECT_LT(rel_err(got.out, expert_out), 2e-2);
    EXPECT_LT(rel_err(got.x, x_want), 2e-2);
    // Again: the counters were left at zero, so the combine runs as the first time, bit for bit.
    EXPECT_EQ(run(logits, xn, x0, c, Sum::Accumulate).x, got.x);
    // Not accumulated (a tensor-parallel rank's partial), and with a shared expert combined afterwards.
    for (Sum sum : {Sum::Alone, Sum::None}) {
        std::vector<float> part = run(logits, xn, x0, c, sum).x;
        for (size_t i = 0; i < part.size(); i++) part[i] += x0[i];
        EXPECT_LT(rel_err(part, sum == Sum::Alone ? x_want : x_shared), 2e-2) << (sum == Sum::Alone ? "alone" : "shared");
    }
    // A batch's rows equal each row alone, bit for bit.
    for (int t = 1; t < c; t++) {
        const std::vector<float> lg(logits.begin() + long(t) * stride, logits.begin() + long(t + 1) * stride);
        const std::vector<float> xr(xn.begin() + long(t) * H, xn.begin() + long(t + 1) * H), xi(x0.begin() + long(t) * H, x0.begin() + long(t + 1) * H);
        const std::vector<float> alone = run(lg, xr, xi, 1, Sum::Accumulate).x;
        for (int h = 0; h < H; h++) ASSERT_EQ(alone[size_t(h)], got.x[size_t(t) * H + h]) << "token " << t << " feature " << h;
    }
    // One token with its routing handed to the down launch early (MoeDecode::ids_ready), twice (the two ints went back
    // to zero): bit for bit as without.
    {
        const std::vector<float> lg(logits.begin(), logits.begin() + stride), xr(xn.begin(), xn.begin() + H), xi(x0.begin(), x0.begin() + H);
        DeviceBuffer ready = upload(std::vector<int>(2, 0));
        const Result plain1 = run(lg, xr, xi, 1, Sum::Accumulate);
        for (int rep = 0; rep < 2; rep++) {
            const Result early = run(lg, xr, xi, 1, Sum::Accumulate, {}, ready.as<int>());
            EXPECT_EQ(early.ids, plain1.ids);
            EXPECT_EQ(early.out, plain1.out);
            EXPECT_EQ(early.x, plain1.x);
            EXPECT_EQ(RoutingBuffers::ints(ready.as<int>(), 2), std::vector<int>(2, 0)) << "ids_ready left set";
        }
    }
    // The input normalised by the gate/up launch itself (MoeNormIn: no RMSNorm kernel ahead), x0 as the residual:
    // the same as given the CPU's RMSNorm of x0 as xn (rsqrtf against the CPU's 1 / sqrt: an input may round the other
    // way in bf16, and an output with it, by one bf16 step).
    const std::vector<float> norm_w = randn(size_t(H), 0.3f), xn_of_x0 = norm_rows(x0, norm_w, c, H, 1e-6f);
    const DeviceBuffer x0_d = upload(x0), norm_w_d = upload_bf16(norm_w);
    const Result given = run(logits, xn_of_x0, x0, c, Sum::Alone);
    const Result normed = run(logits, xn_of_x0, x0, c, Sum::Alone, cuda::MoeNormIn{x0_d.as<float>(), norm_w_d.as<cuda::bf16>(), 1e-6f});
    EXPECT_EQ(normed.ids, given.ids);
    EXPECT_LT(rel_err(normed.out, given.out), 1e-2);
    EXPECT_LT(rel_err(normed.x, given.x), 1e-2);
}

// One token with the router's logits computed by the gate/up launch (MoeDecode::router_w, a shared expert's gate as
// the last router row): the logits as the CPU's linear gives them; routing, experts and combine bit for bit as
// moe_decode given those logits; the same again (the router count went back to zero); the input normalised in the
// launch as given normalised.
TEST_P(CudaMoeDecode, RouterInLaunchMatchesCpu) {
    REQUIRE_GPU();
    const DecodeCase p = GetParam();
    const int E = p.experts, k = p.top_k, H = p.hidden, I = p.inter, R = E + 1;
    ASSERT_TRUE(cuda::moe_decode_router_applies(1, R, E, H));
    const std::vector<float> router = randn(size_t(R) * H, 1.0f / std::sqrt(float(H))), x0 = randn(size_t(H)), norm_w = randn(size_t(H), 0.3f);
    const std::vector<float> gate_up = randn(size_t(E) * 2 * I * H, 1.0f / std::sqrt(float(H)));
    const std::vector<float> down = randn(size_t(E) * H * I, 1.0f / std::sqrt(float(I)));
    const std::vector<float> xn = norm_rows(x0, norm_w, 1, H, 1e-6f);
    const std::vector<float> want_logits = reference_linear(xn, 1, router, R, H);
    const DeviceBuffer router_d = upload_bf16(router), gu_d = upload_bf16(gate_up), down_d = upload_bf16(down), xn_d = upload_bf16(xn);
    const DeviceBuffer x0_d = upload(x0), norm_w_d = upload_bf16(norm_w);
    const size_t n_arrivals = cuda::moe_decode_arrivals(1, H) + 1;  // the combine's counters, then the router count
    DeviceBuffer arrivals = upload(std::vector<int>(n_arrivals, 0));
    struct Result {
        std::vector<float> logits, weights, out, x;
        std::vector<int> ids;
    };
    // given: logits to route by (router_w unset), or empty (the launch computes them).
    auto run = [&](const std::vector<float> & given, bool normed) {
        DeviceBuffer lg = given.empty() ? poisoned(size_t(R) * 4) : upload(given), x = upload(x0), ids_d = poisoned(size_t(k) * 4),
                     w_d = poisoned(size_t(k) * 4), act = poisoned(size_t(k) * I * 2), out = poisoned(size_t(k) * H * 2);
        cuda::MoeDecode m = decode_args(p, lg.as<float>(), R, gu_d, down_d, ids_d.as<int>(), w_d.as<float>(), arrivals.as<int>());
        if (normed) m.norm = cuda::MoeNormIn{x0_d.as<float>(), norm_w_d.as<cuda::bf16>(), 1e-6f};
        if (given.empty()) {
            m.router_w = router_d.as<cuda::bf16>();
            m.router_rows = R;
            m.router_count = arrivals.as<int>() + n_arrivals - 1;
        }
        cuda::moe_decode(normed ? nullptr : xn_d.as<cuda::bf16>(), 1, m, act.as<cuda::bf16>(), out.as<cuda::bf16>(), x.as<float>(), true, nullptr);
        Result r;
        r.logits = download_f32(lg, size_t(R));
        r.ids = RoutingBuffers::ints(ids_d.as<int>(), size_t(k));
        r.weights = download_f32(w_d, size_t(k));
        r.out = download_bf16(out, size_t(k) * H);
        r.x = download_f32(x, size_t(H));
        return r;
    };
    const Result got = run({}, false);
    EXPECT_LT(rel_err(got.logits, want_logits), 1e-5);
    const Result routed = run(got.logits, false);
    EXPECT_EQ(got.ids, routed.ids);
    EXPECT_EQ(got.weights, routed.weights);
    EXPECT_EQ(got.out, routed.out);
    EXPECT_EQ(got.x, routed.x);
    const Result again = run({}, false);
    EXPECT_EQ(again.logits, got.logits);
    EXPECT_EQ(again.x, got.x);
    EXPECT_EQ(RoutingBuffers::ints(arrivals.as<int>(), n_arrivals), std::vector<int>(n_arrivals, 0)) << "counters left at zero";
    const Result normed = run({}, true);
    EXPECT_LT(rel_err(normed.logits, got.logits), 1e-2);
    EXPECT_EQ(normed.ids, got.ids);
    EXPECT_LT(rel_err(normed.x, got.x), 1e-2);
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaMoeDecode,
                         ::testing::Values(DecodeCase{4, 1, 1, 96, 48, false}, DecodeCase{60, 4, 1, 256, 200, false}, DecodeCase{60, 4, 4, 264, 104, false},
                                           DecodeCase{64, 8, 3, 136, 88, false}, DecodeCase{128, 8, 4, 128, 64, true}, DecodeCase{8, 2, 2, 200, 72, true},
                                           DecodeCase{5, 3, 4, 64, 24, false}));

TEST(CudaMoeDecode, TakesOnlyWhatItCan) {
    EXPECT_TRUE(cuda::moe_decode_applies(60, 4, 2048, 1408));    // Qwen1.5-MoE-A2.7B
    EXPECT_TRUE(cuda::moe_decode_applies(128, 8, 2048, 768));    // Qwen3-30B-A3B
    EXPECT_FALSE(cuda::moe_decode_applies(60, 4, 2052, 1408));   // hidden not a multiple of 8
    EXPECT_FALSE(cuda::moe_decode_applies(60, 4, 2048, 1404));   // nor the intermediate size
    EXPECT_FALSE(cuda::moe_decode_applies(300, 4, 2048, 1408));  // more experts than the routing takes
    EXPECT_FALSE(cuda::moe_decode_applies(4, 8, 2048, 1408));    // top-8 of 4
}

struct QuantMoeCase {
    const char * name;
    QuantScheme scheme;
    int experts, top_k, tokens, hidden, inter;
};
void PrintTo(const QuantMoeCase & c, std::ostream * os) { *os << c.name; }

class CudaMoeQuant : public ::testing::TestWithParam<QuantMoeCase> {};

// c tokens through the quantized experts on the device, against the CPU: the decode kernel (cuda::moe_qexperts) or,
// grouped, the prefill GEMM (cuda::moe_qgemm; skipped where it does not apply).
void check_quant_experts(const QuantMoeCase & p, int c, bool grouped) {
    const int E = p.experts, k = p.top_k, H = p.hidden, I = p.inter;
    std::vector<std::unique_ptr<OwnedLinear>> owned;
    std::vector<const Linear *> gate_up, down;
    for (int e = 0; e < E; e++) {
        for (int part = 0; part < 2; part++) {
            owned.push_back(make_quant_linear(p.scheme, I, H, rng()()));
            gate_up.push_back(&owned.back()->l);
        }
    }
    for (int e = 0; e < E; e++) {
        owned.push_back(make_quant_linear(p.scheme, H, I, rng()()));
        down.push_back(&owned.back()->l);
    }
    ASSERT_TRUE(quant_stackable(gate_up) && quant_stackable(down));
    const cuda_engine::DevLinear gu_d = cuda_engine::upload_repacked(repack_quant(gate_up, true));
    const cuda_engine::DevLinear down_d = cuda_engine::upload_repacked(repack_quant(down, true));
    const cuda::MoeQuantExperts w{gu_d.q, down_d.q, E, H, I};
    ASSERT_TRUE(cuda::moe_qexperts_apply(w)) << p.name;
    if (grouped && !cuda::moe_qgemm_apply(w)) GTEST_SKIP() << p.name << ": the grouped GEMM does not apply (needs sm_90a and groups)";

    const std::vector<float> logits = randn(size_t(c) * E, 2.0f), xn = randn(size_t(c) * H);
    const Routed want = route_cpu(logits, c, E, k, false);
    // Reference: each assignment's expert through the CPU's quantized linears, rounded as the kernels round.
    std::vector<float> expert_out(size_t(c) * k * H);  // by assignment t * k + j
    std::vector<float> g(static_cast<size_t>(I)), u(static_cast<size_t>(I)), act(static_cast<size_t>(I)), o(static_cast<size_t>(H));
    for (int t = 0; t < c; t++) {
        for (int j = 0; j < k; j++) {
            const int e = want.ids[size_t(t) * k + j];
            cpu::linear(xn.data() + size_t(t) * H, 1, *gate_up[size_t(2 * e)], g.data());
            cpu::linear(xn.data() + size_t(t) * H, 1, *gate_up[size_t(2 * e + 1)], u.data());
            for (int f = 0; f < I; f++) act[size_t(f)] = round_bf16(silu_f(round_bf16(g[size_t(f)])) * round_bf16(u[size_t(f)]));
            cpu::linear(act.data(), 1, *down[size_t(e)], o.data());
            for (int h = 0; h < H; h++) expert_out[(size_t(t) * k + j) * H + h] = round_bf16(o[size_t(h)]);
        }
    }
    const DeviceBuffer logits_d = upload(logits), xn_d = upload_bf16(xn);
    auto run = [&](const DeviceBuffer & lg, const DeviceBuffer & x, int n_tok, std::vector<int> * slot_of, const cuda::MoeNormIn & norm = {}) {
        RoutingBuffers rb(n_tok, E, k);
        cuda::moe_route(lg.as<float>(), E, n_tok, E, k, false, grouped ? cuda::k_moe_qgemm_rows : cuda::k_moe_qtile_rows, rb.r, nullptr);
        const size_t ck = size_t(n_tok) * k;
        DeviceBuffer act_d = poisoned(ck * I * 2), out_d = poisoned(ck * H * 2);
        if (grouped) cuda::moe_qgemm(x.as<cuda::bf16>(), n_tok, k, w, rb.r, act_d.as<cuda::bf16>(), out_d.as<cuda::bf16>(), nullptr);
        else cuda::moe_qexperts(norm.x ? nullptr : x.as<cuda::bf16>(), n_tok, k, w, rb.r, act_d.as<cuda::bf16>(), out_d.as<cuda::bf16>(), nullptr, norm);
        *slot_of = rb.ints(rb.r.slot_of, ck);
        const std::vector<float> sorted = download_bf16(out_d, ck * H);
        std::vector<float> by_assignment(ck * H);
        for (size_t a = 0; a < ck; a++) std::copy_n(sorted.begin() + long((*slot_of)[a]) * H, H, by_assignment.begin() + long(a) * H);
        return by_assignment;
    };
    std::vector<int> slot_of;
    const std::vector<float> got = run(logits_d, xn_d, c, &slot_of);
    EXPECT_LT(rel_err(got, expert_out), 2e-2) << p.name;
    // A batch's rows equal each row alone, bit for bit (an expert's tile holds its rows as independent MMA columns).
    for (int t = 0; t < c && c > 1; t += std::max(1, c / 3)) {
        const std::vector<float> lg(logits.begin() + long(t) * E, logits.begin() + long(t + 1) * E);
        const std::vector<float> xr(xn.begin() + long(t) * H, xn.begin() + long(t + 1) * H);
        std::vector<int> slot1;
        const std::vector<float> alone = run(upload(lg), upload_bf16(xr), 1, &slot1);
        for (size_t i = 0; i < size_t(k) * H; i++) ASSERT_EQ(alone[i], got[size_t(t) * k * H + i]) << p.name << " token " << t << " value " << i;
    }
    if (grouped) return;
    // Token 0 routed inside the launch (moe_qexperts_routed, batch-1 decode): its routing, and its rows bit for bit.
    const DeviceBuffer lg0 = upload(std::vector<float>(logits.begin(), logits.begin() + E));
    const DeviceBuffer xn0 = upload_bf16(std::vector<float>(xn.begin(), xn.begin() + H));
    DeviceBuffer ids_d = poisoned(size_t(k) * 4), w_d = poisoned(size_t(k) * 4), act_d = poisoned(size_t(k) * I * 2), out_d = poisoned(size_t(k) * H * 2);
    cuda::moe_qexperts_routed(xn0.as<cuda::bf16>(), lg0.as<float>(), k, false, w, ids_d.as<int>(), w_d.as<float>(), act_d.as<cuda::bf16>(),
                              out_d.as<cuda::bf16>(), nullptr);
    EXPECT_EQ(RoutingBuffers::ints(ids_d.as<int>(), size_t(k)), std::vector<int>(want.ids.begin(), want.ids.begin() + k)) << p.name;
    const std::vector<float> w0 = download_f32(w_d, size_t(k)), out0 = download_bf16(out_d, size_t(k) * H);
    for (int j = 0; j < k; j++) ASSERT_NEAR(w0[size_t(j)], want.weights[size_t(j)], 1e-6f) << p.name << " assignment " << j;
    for (size_t i = 0; i < size_t(k) * H; i++) ASSERT_EQ(out0[i], got[i]) << p.name << " routed in the launch, value " << i;
    // The routing handed to the down launch early (ids_ready), twice (the two ints went back to zero): bit for bit.
    DeviceBuffer ready = upload(std::vector<int>(2, 0));
    for (int rep = 0; rep < 2; rep++) {
        DeviceBuffer out_e = poisoned(size_t(k) * H * 2);
        cuda::moe_qexperts_routed(xn0.as<cuda::bf16>(), lg0.as<float>(), k, false, w, ids_d.as<int>(), w_d.as<float>(), act_d.as<cuda::bf16>(),
                                  out_e.as<cuda::bf16>(), nullptr, {}, ready.as<int>());
        EXPECT_EQ(download_bf16(out_e, size_t(k) * H), out0) << p.name << " routing handed early";
        EXPECT_EQ(RoutingBuffers::ints(ready.as<int>(), 2), std::vector<int>(2, 0)) << p.name << " ids_ready left set";
    }
    // With another stream's blocks beside the gate/up launch (a shared expert's) its K split may change: the rows
    // still match the reference.
    for (int beside : {1, 200, 1000}) {
        DeviceBuffer out_b = poisoned(size_t(k) * H * 2);
        cuda::moe_qexperts_routed(xn0.as<cuda::bf16>(), lg0.as<float>(), k, false, w, ids_d.as<int>(), w_d.as<float>(), act_d.as<cuda::bf16>(),
                                  out_b.as<cuda::bf16>(), nullptr, {}, nullptr, beside);
        const std::vector<float> want0(expert_out.begin(), expert_out.begin() + long(k) * H);
        EXPECT_LT(rel_err(download_bf16(out_b, size_t(k) * H), want0), 2e-2) << p.name << " beside " << beside << " blocks";
    }
    // The input normalised by the gate/up launch itself (MoeNormIn), a residual as x: the same as given the CPU's
    // RMSNorm of it (an input may round the other way in bf16, and an output with it, by one bf16 step: rsqrtf against
    // the CPU's 1 / sqrt; call 5 of bench/results/2026-11-30-h200-moe-parts saw 2^-9), grouped and routed in the launch.
    const std::vector<float> resid = randn(size_t(c) * H), norm_w = randn(size_t(H), 0.3f), xn_r = norm_rows(resid, norm_w, c, H, 1e-6f);
    const DeviceBuffer resid_d = upload(resid), norm_w_d = upload_bf16(norm_w), xn_r_d = upload_bf16(xn_r);
    const cuda::MoeNormIn norm{resid_d.as<float>(), norm_w_d.as<cuda::bf16>(), 1e-6f};
    std::vector<int> slot_given, slot_normed;
    const std::vector<float> given = run(logits_d, xn_r_d, c, &slot_given), normed = run(logits_d, xn_r_d, c, &slot_normed, norm);
    EXPECT_LT(rel_err(normed, given), 1e-2) << p.name << " normalised in the launch";
    DeviceBuffer out_n = poisoned(size_t(k) * H * 2);
    cuda::moe_qexperts_routed(nullptr, lg0.as<float>(), k, false, w, ids_d.as<int>(), w_d.as<float>(), act_d.as<cuda::bf16>(), out_n.as<cuda::bf16>(),
                              nullptr, norm);
    const std::vector<float> routed_n = download_bf16(out_n, size_t(k) * H), given0(given.begin(), given.begin() + long(k) * H);
    EXPECT_LT(rel_err(routed_n, given0), 1e-2) << p.name << " routed and normalised in the launch";
}

TEST_P(CudaMoeQuant, MatchesCpu) {
    REQUIRE_GPU();
    check_quant_experts(GetParam(), GetParam().tokens, false);
}

// Prefill-sized steps: with few experts some get two or more 128-row tiles, with many some get none.
TEST_P(CudaMoeQuant, GroupedGemmMatchesCpu) {
    REQUIRE_GPU();
    check_quant_experts(GetParam(), GetParam().experts <= 16 ? 700 : 300, true);
}

// Every split of K the launch rule can choose (1, 2, 4 or 8 parts of a row block), forced in turn, on experts deep
// enough for each (gate/up 2048 deep: 32 K blocks; down 512 / 1280 deep), batch-1 (routed in the launch too) and a
// small batch.
TEST(CudaMoeQuant, EveryKSplitMatchesCpu) {
    REQUIRE_GPU();
    const QuantMoeCase cases[] = {{"gptq4_g128_deep", gptq_scheme(4, 128, true, QuantPacking::GptqV1), 6, 2, 1, 2048, 512},
                                  {"gptq8_asym_g64_deep", gptq_scheme(8, 64, false, QuantPacking::GptqV2), 4, 2, 1, 1024, 1280}};
    for (int ks : {1, 2, 4, 8}) {
        cuda::set_moe_qexperts_parts(ks);
        for (const QuantMoeCase & p : cases) {
            SCOPED_TRACE(std::string(p.name) + ", " + std::to_string(ks) + " K parts");
            check_quant_experts(p, 1, false);
            check_quant_experts(p, 5, false);
        }
    }
    cuda::set_moe_qexperts_parts(0);
}

INSTANTIATE_TEST_SUITE_P(
    Formats, CudaMoeQuant,
    ::testing::Values(QuantMoeCase{"gptq4_g128", gptq_scheme(4, 128, true, QuantPacking::GptqV1), 60, 4, 1, 256, 128},
                      QuantMoeCase{"gptq4_g128_b17", gptq_scheme(4, 128, true, QuantPacking::GptqV1), 8, 2, 17, 256, 128},
                      QuantMoeCase{"gptq4_asym_g32_pad", gptq_scheme(4, 32, false, QuantPacking::GptqV2), 16, 4, 5, 224, 96},
                      QuantMoeCase{"gptq4_rows_b64", gptq_scheme(4, -1, true, QuantPacking::GptqV1), 8, 2, 64, 288, 96},
                      QuantMoeCase{"gptq8_rows", gptq_scheme(8, -1, true, QuantPacking::GptqV1), 64, 8, 3, 256, 160},
                      QuantMoeCase{"gptq8_asym_g32_pad", gptq_scheme(8, 32, false, QuantPacking::GptqV2), 5, 2, 9, 160, 96},
                      QuantMoeCase{"awq_g64_e128", gptq_scheme(4, 64, false, QuantPacking::AwqGemm), 128, 8, 2, 192, 128},
                      // One rank's experts of tiny-qwen3-moe-kv4 at --tp 4: down's K one 64-wide block, 40 tokens.
                      QuantMoeCase{"gptq4_asym_g32_i64_b40", gptq_scheme(4, 32, false, QuantPacking::GptqV2), 8, 2, 40, 128, 64}),
    [](const ::testing::TestParamInfo<QuantMoeCase> & info) { return std::string(info.param.name); });

}  // namespace
