// The MoE kernels (backends/cuda/moe.cu) against a CPU reference of the model's MoE block (the CPU backend's routing,
// cpu::moe_route; each projection's output rounded to bf16 as the unfused CUDA path does): routing and grouping exactly, the grouped GEMMs and the combine within bf16
// tolerance, for 4..128 experts, top-k 1..8, 1..300 tokens (some experts get no rows, some many), both row tiles,
// hidden and intermediate sizes that are not multiples of the 64-wide K steps; a batch's rows equal each row alone.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "backends/cuda/ops.h"
#include "cuda/helpers.h"

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

    // Reference: each assignment's expert output (rounded as the kernels round), then the combine in fp32.
    std::vector<float> expert_out(size_t(c) * k * H);  // by assignment t * k + j
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
    for (int tile : {16, 64}) {
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
        // Experts and combine.
        DeviceBuffer act = poisoned(ck * I * 2), out = poisoned(ck * H * 2), x = upload(x0);
        cuda::moe_experts(xn_d.as<cuda::bf16>(), c, k, w, rb.r, tile, act.as<cuda::bf16>(), out.as<cuda::bf16>(), nullptr);
        const std::vector<float> out_sorted = download_bf16(out, ck * H);
        std::vector<float> got_out(ck * H);
        for (size_t a = 0; a < ck; a++) std::copy_n(out_sorted.begin() + long(slot_of[a]) * H, H, got_out.begin() + long(a) * H);
        EXPECT_LT(rel_err(got_out, expert_out), 2e-2);
        cuda::moe_combine(x.as<float>(), c, H, k, rb.r, out.as<cuda::bf16>(), p.shared ? shared_d.as<cuda::bf16>() : nullptr,
                          p.shared ? logits_d.as<float>() + E : nullptr, stride, nullptr);
        const std::vector<float> got_x = download_f32(x, size_t(c) * H);
        EXPECT_LT(rel_err(got_x, x_want), 2e-2);

        // A batch's rows equal each row run alone (through the same kernels: beyond k_moe_gemv_max_tokens, "alone" is
        // the row repeated that many times plus one), bit for bit.
        if (c > 1 && c <= 20) {
            const int reps = c <= cuda::k_moe_gemv_max_tokens ? 1 : cuda::k_moe_gemv_max_tokens + 1;
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
                                           MoeCase{60, 4, 300, 264, 104, false, true}, MoeCase{16, 8, 129, 64, 24, true, false}));

}  // namespace
