// The tensor-parallel plan (model/tp_plan.h): every head, intermediate column and vocabulary row on exactly one rank
// (KV heads shared only beyond one rank a KV head), and a layer computed from the shards, partial sums added as the
// all-reduce adds them, equal to the layer computed whole.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <tuple>

#include "model/tp_plan.h"
#include "tools/presets.h"

namespace qinfer {
namespace {

ModelConfig preset(const char * name) { return parse_model_config(find_preset(name).config.dump(), name); }

void check_cover(const char * name, int tp, int inter_align, int vocab_align) {
    SCOPED_TRACE(std::string(name) + " tp " + std::to_string(tp));
    const ModelConfig c = preset(name);
    const std::vector<TpShard> plan = plan_tensor_parallel(c, tp, inter_align, vocab_align);
    ASSERT_EQ(int(plan.size()), tp);
    const int rep = c.num_attention_heads / c.num_key_value_heads;
    const int inter = c.num_experts > 0 ? c.moe_intermediate_size : c.intermediate_size;
    std::vector<int> q_owner(size_t(c.num_attention_heads), -1);
    int inter_at = 0, vocab_at = 0;
    for (const TpShard & s : plan) {
        ASSERT_GE(s.n_q_heads, 1);
        for (int h = s.q_head0; h < s.q_head0 + s.n_q_heads; h++) {
            ASSERT_EQ(q_owner[size_t(h)], -1) << "query head " << h << " on two ranks";
            q_owner[size_t(h)] = s.rank;
            EXPECT_GE(h / rep, s.kv_head0) << "query head " << h << " reads a KV head its rank does not hold";
            EXPECT_LT(h / rep, s.kv_head0 + s.n_kv_heads) << "query head " << h << " reads a KV head its rank does not hold";
        }
        if (tp <= c.num_key_value_heads) {
            EXPECT_EQ(s.n_q_heads, s.n_kv_heads * rep) << "whole groups";
        }
        EXPECT_EQ(s.inter0, inter_at);
        EXPECT_EQ(s.vocab0, vocab_at);
        if (s.rank < tp - 1) {
            EXPECT_EQ(s.n_inter % inter_align, 0);
            EXPECT_EQ(s.n_vocab % vocab_align, 0);
        }
        inter_at += s.n_inter;
        vocab_at += s.n_vocab;
    }
    for (int o : q_owner) EXPECT_GE(o, 0) << "a query head on no rank";
    EXPECT_EQ(inter_at, inter);
    EXPECT_EQ(vocab_at, c.vocab_size);
}

TEST(TensorParallelPlan, CoversEveryHeadColumnAndRow) {
    for (int tp : {1, 2, 3, 4, 8}) check_cover("qwen2.5-72b", tp, 128, 64);
    for (int tp : {1, 2, 3, 4, 8}) check_cover("qwen2.5-7b", tp, 128, 64);
    for (int tp : {1, 2, 4}) check_cover("qwen2.5-0.5b", tp, 128, 64);
    for (int tp : {1, 2, 4}) check_cover("qwen3-30b-a3b", tp, 128, 64);
    for (int tp : {1, 2, 4, 8}) check_cover("qwen3-235b-a22b", tp, 128, 64);
}

TEST(TensorParallelPlan, UnevenHeadsSplitByWholeGroups) {
    // Qwen2.5-72B on 3 ranks: 8 KV groups of 8 query heads as 2 / 3 / 3.
    const std::vector<TpShard> p72 = plan_tensor_parallel(preset("qwen2.5-72b"), 3);
    EXPECT_EQ(p72[0].n_q_heads, 16);
    EXPECT_EQ(p72[1].n_q_heads, 24);
    EXPECT_EQ(p72[2].n_q_heads, 24);
    EXPECT_EQ(p72[0].n_inter + p72[1].n_inter + p72[2].n_inter, 29568);
    // 7B on 8 ranks: 4 KV heads, each on two ranks, its 7 query heads as 3 / 4.
    const std::vector<TpShard> p7 = plan_tensor_parallel(preset("qwen2.5-7b"), 8);
    EXPECT_EQ(p7[0].kv_head0, 0);
    EXPECT_EQ(p7[1].kv_head0, 0);
    EXPECT_EQ(p7[0].n_q_heads, 3);
    EXPECT_EQ(p7[1].n_q_heads, 4);
    EXPECT_EQ(p7[7].q_head0, 24);
}

TEST(TensorParallelPlan, RefusesSplitsThatCannotWork) {
    EXPECT_THROW(plan_tensor_parallel(preset("qwen2.5-7b"), 6), std::exception);    // 6 ranks over 4 KV heads
    EXPECT_THROW(plan_tensor_parallel(preset("qwen2.5-0.5b"), 3), std::exception);  // 3 ranks over 2 KV heads
    EXPECT_THROW(plan_tensor_parallel(preset("qwen2.5-0.5b"), 0), std::exception);
    EXPECT_THROW(plan_tensor_parallel(preset("qwen2.5-0.5b"), 16), std::exception);  // more ranks than 14 query heads
}

// A small layer in fp64: causal GQA attention and its o_proj, the SwiGLU MLP, the lm_head; weights [out, in].
struct Layer {
    int H, n_q, n_kv, d, I, V, T;
    std::vector<double> x, wq, wk, wv, wo, wg, wu, wd, wl;
};

Layer random_layer(int n_q, int n_kv) {
    Layer L{16, n_q, n_kv, 4, 48, 48, 5, {}, {}, {}, {}, {}, {}, {}, {}, {}};
    std::mt19937 rng(7);
    std::normal_distribution<double> nd(0, 0.5);
    auto fill = [&](std::vector<double> & v, size_t n) {
        v.resize(n);
        for (double & e : v) e = nd(rng);
    };
    fill(L.x, size_t(L.T) * L.H);
    fill(L.wq, size_t(n_q) * L.d * L.H);
    fill(L.wk, size_t(n_kv) * L.d * L.H);
    fill(L.wv, size_t(n_kv) * L.d * L.H);
    fill(L.wo, size_t(L.H) * n_q * L.d);
    fill(L.wg, size_t(L.I) * L.H);
    fill(L.wu, size_t(L.I) * L.H);
    fill(L.wd, size_t(L.H) * L.I);
    fill(L.wl, size_t(L.V) * L.H);
    return L;
}

// y[t, o] = sum_i x[t, i] w[row0 + o, col0 + i] for o < n_out, i < n_in (w has `w_cols` columns).
std::vector<double> matmul(const std::vector<double> & x, int T, int n_in, const std::vector<double> & w, int w_cols, int row0, int n_out, int col0) {
    std::vector<double> y(size_t(T) * n_out, 0.0);
    for (int t = 0; t < T; t++) {
        for (int o = 0; o < n_out; o++) {
            double s = 0;
            for (int i = 0; i < n_in; i++) s += x[size_t(t) * n_in + i] * w[size_t(row0 + o) * w_cols + col0 + i];
            y[size_t(t) * n_out + o] = s;
        }
    }
    return y;
}

// Attention sublayer of query heads [q0, q0 + nq) (reading KV heads from kv0 on) and o_proj's matching input columns.
std::vector<double> attention_part(const Layer & L, int q0, int nq, int kv0, int nkv) {
    const int rep = L.n_q / L.n_kv, d = L.d;
    const std::vector<double> q = matmul(L.x, L.T, L.H, L.wq, L.H, q0 * d, nq * d, 0);
    const std::vector<double> k = matmul(L.x, L.T, L.H, L.wk, L.H, kv0 * d, nkv * d, 0);
    const std::vector<double> v = matmul(L.x, L.T, L.H, L.wv, L.H, kv0 * d, nkv * d, 0);
    std::vector<double> attn(size_t(L.T) * nq * d, 0.0);
    for (int t = 0; t < L.T; t++) {
        for (int h = 0; h < nq; h++) {
            const int kvh = (q0 + h) / rep - kv0;
            std::vector<double> p(size_t(t) + 1);
            double mx = -1e300, sum = 0;
            for (int j = 0; j <= t; j++) {
                double s = 0;
                for (int e = 0; e < d; e++) s += q[(size_t(t) * nq + h) * d + e] * k[(size_t(j) * nkv + kvh) * d + e];
                p[size_t(j)] = s / std::sqrt(double(d));
                mx = std::max(mx, p[size_t(j)]);
            }
            for (double & e : p) sum += (e = std::exp(e - mx));
            for (int j = 0; j <= t; j++) {
                for (int e = 0; e < d; e++) attn[(size_t(t) * nq + h) * d + e] += p[size_t(j)] / sum * v[(size_t(j) * nkv + kvh) * d + e];
            }
        }
    }
    return matmul(attn, L.T, nq * d, L.wo, L.n_q * d, 0, L.H, q0 * d);
}

// MLP sublayer over intermediate columns [i0, i0 + ni): gate/up rows, down's matching input columns.
std::vector<double> mlp_part(const Layer & L, int i0, int ni) {
    const std::vector<double> g = matmul(L.x, L.T, L.H, L.wg, L.H, i0, ni, 0), u = matmul(L.x, L.T, L.H, L.wu, L.H, i0, ni, 0);
    std::vector<double> act(g.size());
    for (size_t i = 0; i < g.size(); i++) act[i] = g[i] / (1 + std::exp(-g[i])) * u[i];
    return matmul(act, L.T, ni, L.wd, L.I, 0, L.H, i0);
}

void expect_near(const std::vector<double> & got, const std::vector<double> & want, const std::string & what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    for (size_t i = 0; i < got.size(); i++) ASSERT_NEAR(got[i], want[i], 1e-9) << what << " element " << i;
}

TEST(TensorParallelPlan, ShardedLayerSumsToTheWholeLayer) {
    // (query heads, KV heads, ranks): even groups, uneven groups, whole groups one a rank, KV heads shared by ranks.
    for (auto [n_q, n_kv, tp] : {std::tuple{6, 2, 2}, std::tuple{6, 3, 2}, std::tuple{4, 4, 3}, std::tuple{8, 2, 4}, std::tuple{6, 2, 6}}) {
        SCOPED_TRACE(std::to_string(n_q) + "/" + std::to_string(n_kv) + " heads, tp " + std::to_string(tp));
        const Layer L = random_layer(n_q, n_kv);
        ModelConfig c;
        c.num_attention_heads = n_q;
        c.num_key_value_heads = n_kv;
        c.head_dim = L.d;
        c.hidden_size = L.H;
        c.intermediate_size = L.I;
        c.vocab_size = L.V;
        const std::vector<TpShard> plan = plan_tensor_parallel(c, tp, 8, 8);
        std::vector<double> attn(size_t(L.T) * L.H, 0.0), mlp = attn;
        for (const TpShard & s : plan) {  // the all-reduce: partial sums added
            const std::vector<double> a = attention_part(L, s.q_head0, s.n_q_heads, s.kv_head0, s.n_kv_heads), m = mlp_part(L, s.inter0, s.n_inter);
            for (size_t i = 0; i < attn.size(); i++) {
                attn[i] += a[i];
                mlp[i] += m[i];
            }
        }
        expect_near(attn, attention_part(L, 0, n_q, 0, n_kv), "attention + o_proj");
        expect_near(mlp, mlp_part(L, 0, L.I), "MLP");
        // Vocabulary rows: the ranks' logits side by side are the whole lm_head's; the best of the ranks' bests is the
        // whole argmax.
        const std::vector<double> whole = matmul(L.x, L.T, L.H, L.wl, L.H, 0, L.V, 0);
        for (int t = 0; t < L.T; t++) {
            int best = -1;
            double best_v = -1e300;
            for (const TpShard & s : plan) {
                const std::vector<double> part = matmul(L.x, L.T, L.H, L.wl, L.H, s.vocab0, s.n_vocab, 0);
                for (int v = 0; v < s.n_vocab; v++) {
                    ASSERT_NEAR(part[size_t(t) * s.n_vocab + v], whole[size_t(t) * L.V + s.vocab0 + v], 1e-12);
                    if (part[size_t(t) * s.n_vocab + v] > best_v) {
                        best_v = part[size_t(t) * s.n_vocab + v];
                        best = s.vocab0 + v;
                    }
                }
            }
            EXPECT_EQ(best, int(std::max_element(whole.begin() + long(t) * L.V, whole.begin() + long(t + 1) * L.V) - (whole.begin() + long(t) * L.V)));
        }
    }
}

}  // namespace
}  // namespace qinfer
