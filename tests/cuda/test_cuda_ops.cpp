// Every CUDA kernel against the CPU reference on fresh random inputs of odd shapes, with tolerances that fit bf16
// and outputs poisoned (NaN) beforehand so unwritten elements fail.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <tuple>

#include "backends/cpu/ops.h"
#include "backends/cuda/allocator.h"
#include "backends/cuda/ops.h"
#include "core/dtype.h"
#include "cuda/helpers.h"
#include "model/prefill_splits.h"
#include "model/rope.h"

using namespace qinfer;
using namespace qinfer::test;
using cuda::bf16;
using cuda::DeviceBuffer;


class Gemv : public ::testing::TestWithParam<std::tuple<int, int, int>> {};

TEST_P(Gemv, MatchesCpu) {
    REQUIRE_GPU();
    const auto [n, k, m] = GetParam();
    // The row kernels (half-warp rows where they apply, then whole warps only), then the balanced kernel where it applies.
    for (int mode = 0; mode < 3; mode++) {
        const bool balanced = mode == 2;
        cuda::set_gemv_balanced(balanced);
        cuda::set_gemv_half_rows(mode != 1);
        for (int in = 0; in < 2; in++) {
            for (int out = 0; out < 4; out++) {
                const bool silu = out == 3;
                const int rows = silu ? 2 * n : n;
                std::vector<float> w = randn(size_t(rows) * k, 1.0f / std::sqrt(float(k)));
                std::vector<float> x = randn(size_t(m) * k);
                std::vector<float> norm_w = randn(size_t(k), 0.2f);
                for (float & v : norm_w) v = round_bf16(v + 1.0f);
                std::vector<float> y0 = randn(size_t(m) * n);  // AddF32 accumulates into this
                DeviceBuffer dw = upload_bf16(w), dnorm = upload_bf16(norm_w);
                DeviceBuffer dx = in == 1 ? upload(x) : upload_bf16(x);
                DeviceBuffer dy = out == 2 ? upload(y0) : poisoned(size_t(m) * n * 4);
                cuda::GemvArgs a = gemv_args(n, k, m, dx, dnorm, dy);
                a.w = dw.as<bf16>();
                cuda::gemv(a, in ? cuda::GemvIn::NormF32 : cuda::GemvIn::Bf16, cuda::GemvOut(out), nullptr);
                // CPU reference.
                std::vector<float> xin = in ? norm_rows(x, norm_w, m, k, 1e-6f) : x;
                const std::vector<float> ref = reference_linear(xin, m, w, rows, k);
                std::vector<float> want(size_t(m) * n), got;
                for (int r = 0; r < m; r++) {
                    for (int j = 0; j < n; j++) {
                        float v = ref[size_t(r) * rows + j];
                        if (out == 2) v += y0[size_t(r) * n + j];
                        if (silu) {
                            float g = round_bf16(v), u = round_bf16(ref[size_t(r) * rows + n + j]);
                            v = g / (1 + std::exp(-g)) * u;
                        }
                        want[size_t(r) * n + j] = v;
                    }
                }
                got = (out == 1 || out == 2) ? download_f32(dy, want.size()) : download_bf16(dy, want.size());
                // Errors relative to the largest sum of |w x| terms of an output (a dot product can cancel to near zero):
                // fp32 accumulation-order differences, one bf16 rounding of the staged normalised input, a bf16 output.
                double mass = 1e-30, err = 0;
                for (int r = 0; r < m; r++) {
                    for (int j = 0; j < rows; j++) {
                        double s_abs = 0;
                        for (int i = 0; i < k; i++) s_abs += std::fabs(double(w[size_t(j) * k + i]) * xin[size_t(r) * k + i]);
                        mass = std::max(mass, s_abs);
                    }
                }
                for (size_t i = 0; i < want.size(); i++) err = std::max(err, std::isfinite(got[i]) ? std::fabs(double(got[i]) - want[i]) : INFINITY);
                // silu(gate) * up is bounded by |gate| |up| <= mass^2: its bf16 roundings scale with that (k = 8 gave 1.03e-2
                // relative to mass alone on 2026-11-26).
                const double scale = silu ? std::max(mass, mass * mass) : mass;
                const double tol = (out == 1 || out == 2) ? (in ? 2e-3 : 1e-5) : 8e-3;
                EXPECT_LT(err / scale, tol) << "n " << n << " k " << k << " m " << m << " in " << in << " out " << out
                                            << (balanced ? " balanced" : mode == 0 ? " rows" : " whole-warp rows");
            }
        }
    }
    cuda::set_gemv_balanced(true);
    cuda::set_gemv_half_rows(true);
}

INSTANTIATE_TEST_SUITE_P(OddShapes, Gemv,
                         ::testing::Combine(::testing::Values(1, 7, 257, 4864), ::testing::Values(8, 96, 896, 4104),
                                            ::testing::Values(1, 3, 4)));

// An lm_head's shape (n >= 65536) with rows longer than 2048: the row kernel in its three-blocks-an-SM form
// (gemv_rows_three_blocks), as the decode step calls it (RMSNorm staged, fp32 logits), for 1 and 2 rows.
TEST(CudaOps, GemvLmHeadShapeMatchesCpu) {
    REQUIRE_GPU();
    const int n = 65552, k = 2112;
    cuda::set_gemv_balanced(false);
    for (int m : {1, 2}) {
        std::vector<float> w = randn(size_t(n) * k, 1.0f / std::sqrt(float(k))), x = randn(size_t(m) * k), norm_w = randn(size_t(k), 0.2f);
        for (float & v : norm_w) v = round_bf16(v + 1.0f);
        DeviceBuffer dw = upload_bf16(w), dnorm = upload_bf16(norm_w), dx = upload(x), dy = poisoned(size_t(m) * n * 4);
        cuda::GemvArgs a = gemv_args(n, k, m, dx, dnorm, dy);
        a.w = dw.as<bf16>();
        cuda::gemv(a, cuda::GemvIn::NormF32, cuda::GemvOut::F32, nullptr);
        const std::vector<float> xin = norm_rows(x, norm_w, m, k, 1e-6f);
        const std::vector<float> want = reference_linear(xin, m, w, n, k);
        EXPECT_LT(rel_err(download_f32(dy, want.size()), want), 2e-3) << "m " << m;
    }
    cuda::set_gemv_balanced(true);
}

// Times cuda::gemv on shape sh at m 1 under two settings, set(0) and set(1) before each timing, alternated twice:
// us[rep][setting], microseconds per call. Weights are cycled through copies of at least 128 MB so no call finds them
// in the 50 MB L2. Returns the weight bytes one call reads.
template <class Set> size_t time_gemv_ab(const GemvShape & sh, int reps, Set && set, double (&us)[2][2]) {
    const int rows = sh.out == cuda::GemvOut::SiluMulBf16 ? 2 * sh.n : sh.n;
    const size_t w_bytes = size_t(rows) * sh.k * 2;
    const int copies = int(std::max<size_t>(1, (size_t(128) << 20) / w_bytes + 1));
    DeviceBuffer w = upload_bf16(randn(size_t(rows) * sh.k, 0.02f));
    DeviceBuffer ws(w_bytes * copies, "test");
    for (int c = 0; c < copies; c++) cudaMemcpy(ws.as<char>() + c * w_bytes, w.get(), w_bytes, cudaMemcpyDeviceToDevice);
    DeviceBuffer dx = sh.in == cuda::GemvIn::NormF32 ? upload(randn(size_t(sh.k))) : upload_bf16(randn(size_t(sh.k)));
    DeviceBuffer dnorm = upload_bf16(std::vector<float>(size_t(sh.k), 1.0f));
    DeviceBuffer dy(size_t(sh.n) * 4, "test");
    cudaMemset(dy.get(), 0, dy.bytes());
    cuda::GemvArgs a = gemv_args(sh.n, sh.k, 1, dx, dnorm, dy);
    int call = 0;
    for (int rep = 0; rep < 2; rep++) {
        for (int setting = 0; setting < 2; setting++) {
            set(setting);
            us[rep][setting] = 1e3 * time_ms(reps, [&] {
                a.w = reinterpret_cast<const bf16 *>(ws.as<char>() + (call++ % copies) * w_bytes);
                cuda::gemv(a, sh.in, sh.out, nullptr);
            }, 3);
        }
    }
    return w_bytes;
}

// Timings for the record (not assertions): the BF16 decode GEMVs of Qwen2.5 0.5B / 1.5B / 7B at m 1, with the input
// and output forms the engine uses, the row kernels against the balanced kernel (scripts/device.sh gemv-ab).
TEST(CudaOps, GemvTimings) {
    REQUIRE_GPU();
    const auto N = cuda::GemvIn::NormF32, B = cuda::GemvIn::Bf16;
    const GemvShape shapes[] = {{"7B qkv", 4608, 3584, N, cuda::GemvOut::Bf16},          {"7B o_proj", 3584, 3584, B, cuda::GemvOut::AddF32},
                            {"7B gate_up", 18944, 3584, N, cuda::GemvOut::SiluMulBf16}, {"7B down", 3584, 18944, B, cuda::GemvOut::AddF32},
                            {"1.5B qkv", 2048, 1536, N, cuda::GemvOut::Bf16},        {"1.5B o_proj", 1536, 1536, B, cuda::GemvOut::AddF32},
                            {"1.5B gate_up", 8960, 1536, N, cuda::GemvOut::SiluMulBf16}, {"1.5B down", 1536, 8960, B, cuda::GemvOut::AddF32},
                            {"0.5B qkv", 1152, 896, N, cuda::GemvOut::Bf16},         {"0.5B o_proj", 896, 896, B, cuda::GemvOut::AddF32},
                            {"0.5B gate_up", 4864, 896, N, cuda::GemvOut::SiluMulBf16}, {"0.5B down", 896, 4864, B, cuda::GemvOut::AddF32}};
    for (const GemvShape & sh : shapes) {
        double us[2][2];
        const size_t w_bytes = time_gemv_ab(sh, 200, [](int balanced) { cuda::set_gemv_balanced(balanced == 1); }, us);
        cuda::set_gemv_balanced(true);
        const int rows = sh.out == cuda::GemvOut::SiluMulBf16 ? 2 * sh.n : sh.n;
        std::printf("[ kernel ] gemv BF16 %-12s n %5d k %5d: rows %.1f / %.1f us, balanced %.1f / %.1f us (%.0f / %.0f GB/s)\n", sh.name, rows,
                    sh.k, us[0][0], us[1][0], us[0][1], us[1][1], w_bytes / us[0][0] / 1e3, w_bytes / us[0][1] / 1e3);
    }
}

// Timings for the record: lm_head shapes (151936 rows, fp32 logits from the normalised residual) with the row kernels
// giving rows of at most 1024 values half a warp each (0.5B, and 1024 as Qwen3-0.6B) against whole warps; 1.5B's
// rows (1536) always take whole warps (a control).
TEST(CudaOps, GemvLmHeadTimings) {
    REQUIRE_GPU();
    const auto N = cuda::GemvIn::NormF32;
    const GemvShape shapes[] = {{"0.5B lm_head", 151936, 896, N, cuda::GemvOut::F32},
                                {"k1024 lm_head", 151936, 1024, N, cuda::GemvOut::F32},
                                {"1.5B lm_head", 151936, 1536, N, cuda::GemvOut::F32}};
    for (const GemvShape & sh : shapes) {
        double us[2][2];
        const size_t w_bytes = time_gemv_ab(sh, 100, [](int half) { cuda::set_gemv_half_rows(half == 1); }, us);
        cuda::set_gemv_half_rows(true);
        std::printf("[ kernel ] gemv BF16 %-13s n %6d k %5d: whole warps %.1f / %.1f us, half warps %.1f / %.1f us (%.0f / %.0f GB/s)\n", sh.name,
                    sh.n, sh.k, us[0][0], us[1][0], us[0][1], us[1][1], w_bytes / us[0][0] / 1e3, w_bytes / us[0][1] / 1e3);
    }
}

TEST(CudaOps, Gemm) {
    REQUIRE_GPU();
    for (auto [m, n, k] : {std::tuple{5, 7, 96}, std::tuple{257, 136, 904}, std::tuple{1031, 4864, 896}}) {
        std::vector<float> x = randn(size_t(m) * k), w = randn(size_t(n) * k, 1.0f / std::sqrt(float(k)));
        DeviceBuffer dx = upload_bf16(x), dw = upload_bf16(w);
        for (bool f32 : {false, true}) {
            DeviceBuffer dy = poisoned(size_t(m) * n * 4);
            cuda::gemm(dx.as<bf16>(), dw.as<bf16>(), m, n, k, dy.get(), f32, nullptr);
            const std::vector<float> want = reference_linear(x, m, w, n, k);
            auto got = f32 ? download_f32(dy, want.size()) : download_bf16(dy, want.size());
            EXPECT_LT(rel_err(got, want), f32 ? 1e-4 : 1e-2) << m << "x" << n << "x" << k;
        }
    }
}

TEST(CudaOps, NormsEmbeddingSilu) {
    REQUIRE_GPU();
    // Rows held in registers 4 floats a load (hidden % 4 == 0: 96, 896, 1536, 3584, 5120 span the widths of one to
    // eight loads a thread) and the scalar form (98: not whole float4s; 9000: wider than eight loads a thread).
    for (int n : {1, 7, 257}) {
        for (int h : {96, 98, 896, 1536, 3584, 5120, 9000}) {
            SCOPED_TRACE(std::to_string(n) + " rows of " + std::to_string(h));
            std::vector<float> x = randn(size_t(n) * h), delta = randn(size_t(n) * h), w = randn(size_t(h), 0.2f);
            for (float & v : w) v = round_bf16(v + 1);
            DeviceBuffer dx = upload(x), dd = upload_bf16(delta), dw = upload_bf16(w), dy = poisoned(size_t(n) * h * 2);
            cuda::rms_norm(dx.as<float>(), dw.as<bf16>(), 1e-6f, n, h, dy.as<bf16>(), nullptr);
            EXPECT_LT(rel_err(download_bf16(dy, x.size()), norm_rows(x, w, n, h, 1e-6f)), 1e-2);
            cuda::add_rms_norm(dx.as<float>(), dd.as<bf16>(), dw.as<bf16>(), 1e-6f, n, h, dy.as<bf16>(), nullptr);
            std::vector<float> xs = x;
            for (size_t i = 0; i < xs.size(); i++) xs[i] += delta[i];
            EXPECT_LT(rel_err(download_f32(dx, x.size()), xs), 1e-6);
            EXPECT_LT(rel_err(download_bf16(dy, x.size()), norm_rows(xs, w, n, h, 1e-6f)), 1e-2);
        }
    }
    // Embedding gather with ids on the device: rows of whole 16-byte chunks (96; 3584 and 9000: more chunks than one
    // pass of loads holds) and rows that are not (100: the scalar path).
    for (int hidden : {96, 100, 3584, 9000}) {
        SCOPED_TRACE(hidden);
        std::vector<float> table = randn(size_t(37) * hidden);
        std::vector<int> ids = {36, 0, 5, 5, 17};
        DeviceBuffer dt = upload_bf16(table), di = upload(ids), dx = poisoned(ids.size() * hidden * 4);
        cuda::embedding(dt.as<bf16>(), di.as<int>(), int(ids.size()), hidden, dx.as<float>(), nullptr);
        std::vector<float> want;
        for (int id : ids) want.insert(want.end(), table.begin() + size_t(id) * hidden, table.begin() + size_t(id + 1) * hidden);
        EXPECT_EQ(rel_err(download_f32(dx, want.size()), want), 0.0);
    }
    // SwiGLU on [n, 2 inter]: 16-byte loads (inter % 8 == 0) and one value a load (333).
    for (auto [n, inter] : {std::pair{7, 333}, std::pair{7, 4864}, std::pair{257, 1000}}) {
        SCOPED_TRACE(std::to_string(n) + " rows of " + std::to_string(inter));
        std::vector<float> gu = randn(size_t(n) * 2 * inter);
        DeviceBuffer dgu = upload_bf16(gu), dout = poisoned(size_t(n) * inter * 2);
        cuda::silu_mul(dgu.as<bf16>(), n, inter, dout.as<bf16>(), nullptr);
        std::vector<float> ref(size_t(n) * inter);
        for (int t = 0; t < n; t++) {
            cpu::silu_mul(gu.data() + size_t(t) * 2 * inter, gu.data() + size_t(t) * 2 * inter + inter, inter, ref.data() + size_t(t) * inter);
        }
        EXPECT_LT(rel_err(download_bf16(dout, ref.size()), ref), 1e-2);
    }
}

// A paged cache with a shuffled block table, filled from fp32 K/V [len, n_kv, d] (bf16-rounded).
struct PagedCache {
    int block_size = 16, n_kv, d, len;
    std::vector<int> table;
    DeviceBuffer k, v, bt;
    PagedCache(const std::vector<float> & kh, const std::vector<float> & vh, int len_, int n_kv_, int d_) : n_kv(n_kv_), d(d_), len(len_) {
        const int blocks = (len + block_size - 1) / block_size + 3;
        table.resize(size_t(blocks));
        std::iota(table.begin(), table.end(), 0);
        std::shuffle(table.begin(), table.end(), rng());
        std::vector<uint16_t> kc(size_t(blocks) * n_kv * block_size * d, 0xffff), vc = kc;  // poison unused slots
        for (int t = 0; t < len; t++) {
            for (int h = 0; h < n_kv; h++) {
                for (int i = 0; i < d; i++) {
                    size_t dst = ((size_t(table[size_t(t / block_size)]) * n_kv + h) * block_size + t % block_size) * d + i;
                    kc[dst] = f32_to_bf16(kh[(size_t(t) * n_kv + h) * d + i]);
                    vc[dst] = f32_to_bf16(vh[(size_t(t) * n_kv + h) * d + i]);
                }
            }
        }
        k = upload(kc);
        v = upload(vc);
        bt = upload(table);
    }
    cuda::KVLayer layer() const { return {k.as<bf16>(), v.as<bf16>(), bt.as<int>(), block_size, 0, {}, int64_t(table.size()) * n_kv * block_size}; }
};

class Attention : public ::testing::TestWithParam<std::tuple<int, int, int>> {};

TEST_P(Attention, PrefillAndDecodeMatchCpu) {
    REQUIRE_GPU();
    const auto [len, d, n_rep] = GetParam();
    const int n_kv = 2, n_head = n_kv * n_rep;
    std::vector<float> k = randn(size_t(len) * n_kv * d), v = randn(size_t(len) * n_kv * d);
    PagedCache cache(k, v, len, n_kv, d);
    auto k_row = [&](int j) { return k.data() + size_t(j) * n_kv * d; };
    auto v_row = [&](int j) { return v.data() + size_t(j) * n_kv * d; };

    // Prefill of the last n queries (the rest already cached, as in chunked prefill), n = len or a tail.
    for (int n : {len, std::min(len, 37)}) {
        const int pos0 = len - n;
        std::vector<float> q = randn(size_t(n) * n_head * d, 2.0f);
        DeviceBuffer dq = upload_bf16(q), dout(size_t(n) * n_head * d * 2, "test");
        // Check a sample of query rows at long lengths (the CPU reference is O(n^2)).
        std::vector<int> rows;
        for (int t = 0; t < n; t += std::max(1, n / 64)) rows.push_back(t);
        rows.push_back(n - 1);
        std::vector<float> want_rows;
        for (int t : rows) {
            std::vector<float> o(size_t(n_head) * d);
            cpu::attention(q.data() + size_t(t) * n_head * d, 1, pos0 + t, n_head, n_kv, d, k_row, v_row, o.data());
            want_rows.insert(want_rows.end(), o.begin(), o.end());
        }
        for (cuda::PrefillKernel kernel : prefill_kernels(d)) {
            cudaMemset(dout.get(), 0xff, dout.bytes());
            cuda::attention_prefill(dq.as<bf16>(), cache.layer(), n, pos0, n_head, n_kv, d, dout.as<bf16>(), nullptr, kernel);
            const std::vector<float> got = download_bf16(dout, q.size());
            std::vector<float> got_rows;
            for (int t : rows) got_rows.insert(got_rows.end(), got.begin() + size_t(t) * n_head * d, got.begin() + size_t(t + 1) * n_head * d);
            EXPECT_LT(rel_err(got_rows, want_rows), 2e-2)
                << "prefill len " << len << " n " << n << " d " << d << " rep " << n_rep << " kernel " << int(kernel);
        }
    }
    // Decode: one query at position len - 1 over the whole cache.
    std::vector<float> q = randn(size_t(n_head) * d, 2.0f);
    DeviceBuffer dq = upload_bf16(q), dout = poisoned(size_t(n_head) * d * 2), dlen = upload(std::vector<int>{len});
    const int splits = cuda::decode_splits(len, n_kv, d);
    DeviceBuffer po(size_t(n_head) * splits * d * 4, "test"), pml(size_t(n_head) * splits * 2 * 4, "test");
    cuda::DecodeScratch scratch{po.as<float>(), pml.as<float>(), splits};
    std::vector<float> want(size_t(n_head) * d);
    cpu::attention(q.data(), 1, len - 1, n_head, n_kv, d, k_row, v_row, want.data());
    for (const DecodeCase & c : decode_cases(d, cache.layer(), n_rep)) {
        cudaMemset(dout.get(), 0xff, dout.bytes());
        c.run([&] { cuda::attention_decode(dq.as<bf16>(), cache.layer(), dlen.as<int>(), n_head, n_kv, d, scratch, dout.as<bf16>(), nullptr, 1, c.kernel); });
        EXPECT_LT(rel_err(download_bf16(dout, want.size()), want), 2e-2)
            << "decode len " << len << " d " << d << " rep " << n_rep << " kernel " << int(c.kernel) << " early " << c.early_kv;
    }
    if ((len == 4097 || len == 129024) && n_rep == 7) {
        // Timings for the perf log (not assertions): decode (each kernel) and prefill over this cache.
        for (cuda::DecodeKernel kernel : decode_kernels(d, cache.layer())) {
            const double ms = time_ms(50, [&] {
                cuda::attention_decode(dq.as<bf16>(), cache.layer(), dlen.as<int>(), n_head, n_kv, d, scratch, dout.as<bf16>(), nullptr, 1, kernel);
            });
            const double kv_bytes = 2.0 * len * n_kv * d * 2;
            std::printf("[ kernel ] attention_decode (%s) len %d d %d heads %d/%d: %.1f us, %.0f GB/s of KV\n",
                        decode_kernel_name(kernel), len, d, n_head, n_kv, ms * 1e3,
                        kv_bytes / (ms * 1e-3) / 1e9);
        }
        const int reps = len > 10000 ? 1 : 5;
        std::vector<float> qp = randn(size_t(len) * n_head * d);
        DeviceBuffer dqp = upload_bf16(qp), dop(size_t(len) * n_head * d * 2, "test");
        for (cuda::PrefillKernel kernel : prefill_kernels(d)) {
            const double ms = time_ms(reps, [&] {
                cuda::attention_prefill(dqp.as<bf16>(), cache.layer(), len, 0, n_head, n_kv, d, dop.as<bf16>(), nullptr, kernel);
            });
            const double flops = 4.0 * len * (len + 1) / 2 * d * n_head;
            std::printf("[ kernel ] attention_prefill (%s) len %d d %d heads %d/%d: %.3f ms, %.1f TFLOP/s\n",
                        cuda::prefill_kernel_name(kernel), len, d, n_head, n_kv, ms, flops / (ms * 1e-3) / 1e12);
        }
        // One 1024-query chunk at the end of the cache, as the engine prefills a long prompt.
        const int nc = 1024;
        for (cuda::PrefillKernel kernel : prefill_kernels(d)) {
            const double ms = time_ms(5, [&] {
                cuda::attention_prefill(dqp.as<bf16>(), cache.layer(), nc, len - nc, n_head, n_kv, d, dop.as<bf16>(), nullptr, kernel);
            });
            const double flops = 4.0 * nc * (len - nc / 2.0) * d * n_head;
            std::printf("[ kernel ] attention_prefill (%s) chunk %d at %d d %d heads %d/%d: %.3f ms, %.1f TFLOP/s\n",
                        cuda::prefill_kernel_name(kernel), nc, len - nc, d, n_head, n_kv, ms,
                        flops / (ms * 1e-3) / 1e12);
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Lengths, Attention,
                         ::testing::Combine(::testing::Values(1, 7, 257, 4097), ::testing::Values(64, 128), ::testing::Values(1, 7)));
// The longest row of the seeds (129024 input tokens): a sampled check of prefill queries and the last decode query.
INSTANTIATE_TEST_SUITE_P(LongContext, Attention, ::testing::Combine(::testing::Values(129024), ::testing::Values(128), ::testing::Values(7)));
INSTANTIATE_TEST_SUITE_P(TinyHeads, Attention,
                         ::testing::Combine(::testing::Values(1, 70), ::testing::Values(16, 24), ::testing::Values(3)));
// More than 8 query heads a KV head (Qwen3-235B-A22B: 16): both rows of each lane in the tensor-core decode kernels.
INSTANTIATE_TEST_SUITE_P(WideGroups, Attention,
                         ::testing::Combine(::testing::Values(1, 70, 4097), ::testing::Values(64, 128), ::testing::Values(12, 16)));

// Chunks of several sequences in one cache layer, each over its own block table: attention_prefill_pieces equals
// each chunk's attention_prefill exactly and the CPU's attention within bf16; beyond k_prefill_pieces the pieces
// take several launches. Odd shapes: single queries, a chunk of 24 after 2000 keys, chunks over one and two query
// tiles, a chunk at position 0.
TEST(CudaOps, AttentionPrefillPiecesMatchAlone) {
    REQUIRE_GPU();
    const int block_size = 16, n_kv = 2;
    struct Piece {
        int n, pos0;
    };
    const std::vector<std::vector<Piece>> cases = {
        {{24, 2000}, {24, 1987}, {1, 0}, {37, 130}, {129, 0}, {200, 57}, {5, 4}},
        std::vector<Piece>(35, Piece{3, 0}),  // over k_prefill_pieces: two launches
    };
    for (int d : {64, 128}) {
        for (int n_rep : {1, 7}) {
            const int n_head = n_kv * n_rep;
            for (size_t ci = 0; ci < cases.size(); ci++) {
                std::vector<Piece> ps = cases[ci];
                if (ci == 1) {
                    for (size_t i = 0; i < ps.size(); i++) ps[i].pos0 = int(i * 13 % 97);
                }
                SCOPED_TRACE("d " + std::to_string(d) + " rep " + std::to_string(n_rep) + " case " + std::to_string(ci));
                // Each piece's sequence: its own K/V [len, n_kv, d] in blocks of one shared array, through its own table.
                int n_blocks = 0;
                std::vector<int> first_block;
                for (const Piece & p : ps) {
                    first_block.push_back(n_blocks);
                    n_blocks += (p.pos0 + p.n + block_size - 1) / block_size;
                }
                std::vector<int> order(static_cast<size_t>(n_blocks));
                std::iota(order.begin(), order.end(), 0);
                std::shuffle(order.begin(), order.end(), rng());
                std::vector<uint16_t> kc(size_t(n_blocks) * n_kv * block_size * d, 0xffff), vc = kc;  // poison unused slots
                std::vector<std::vector<float>> ks, vs;
                std::vector<int> tables;  // each piece's table, one after another
                size_t q_total = 0;
                for (size_t i = 0; i < ps.size(); i++) {
                    const int len = ps[i].pos0 + ps[i].n;
                    ks.push_back(randn(size_t(len) * n_kv * d));
                    vs.push_back(randn(size_t(len) * n_kv * d));
                    for (int b = 0; b < (len + block_size - 1) / block_size; b++) tables.push_back(order[size_t(first_block[i] + b)]);
                    for (int t = 0; t < len; t++) {
                        const int block = order[size_t(first_block[i] + t / block_size)];
                        for (int h = 0; h < n_kv; h++) {
                            for (int e = 0; e < d; e++) {
                                const size_t dst = ((size_t(block) * n_kv + h) * block_size + t % block_size) * d + e;
                                kc[dst] = f32_to_bf16(ks[i][(size_t(t) * n_kv + h) * d + e]);
                                vc[dst] = f32_to_bf16(vs[i][(size_t(t) * n_kv + h) * d + e]);
                            }
                        }
                    }
                    q_total += size_t(ps[i].n) * n_head * d;
                }
                DeviceBuffer dk = upload(kc), dv = upload(vc), dt = upload(tables);
                const cuda::KVLayer layer{dk.as<bf16>(), dv.as<bf16>(), nullptr, block_size, 0, {}, int64_t(n_blocks) * n_kv * block_size};
                std::vector<float> q = randn(q_total, 2.0f);
                DeviceBuffer dq = upload_bf16(q), dout = poisoned(q_total * 2), dalone = poisoned(q_total * 2);
                std::vector<cuda::PrefillPiece> pieces;
                size_t q_at = 0;
                for (size_t i = 0; i < ps.size(); i++) {
                    cuda::PrefillPiece p;
                    p.q = dq.as<bf16>() + q_at;
                    p.out = dout.as<bf16>() + q_at;
                    p.block_table = dt.as<int>() + first_block[i];
                    p.n = ps[i].n;
                    p.pos0 = ps[i].pos0;
                    pieces.push_back(p);
                    cuda::KVLayer alone = layer;
                    alone.block_table = p.block_table;
                    cuda::attention_prefill(p.q, alone, p.n, p.pos0, n_head, n_kv, d, dalone.as<bf16>() + q_at, nullptr);
                    q_at += size_t(p.n) * n_head * d;
                }
                cuda::attention_prefill_pieces(pieces.data(), int(pieces.size()), layer, n_head, n_kv, d, nullptr);
                const std::vector<float> got = download_bf16(dout, q_total), alone = download_bf16(dalone, q_total);
                EXPECT_EQ(rel_err(got, alone), 0.0);
                std::vector<float> want(q_total);
                q_at = 0;
                for (size_t i = 0; i < ps.size(); i++) {
                    auto k_row = [&](int j) { return ks[i].data() + size_t(j) * n_kv * d; };
                    auto v_row = [&](int j) { return vs[i].data() + size_t(j) * n_kv * d; };
                    for (int t = 0; t < ps[i].n; t++) {
                        const size_t at = q_at + size_t(t) * n_head * d;
                        cpu::attention(q.data() + at, 1, ps[i].pos0 + t, n_head, n_kv, d, k_row, v_row, want.data() + at);
                    }
                    q_at += size_t(ps[i].n) * n_head * d;
                }
                EXPECT_LT(rel_err(got, want), 2e-2);
            }
        }
    }
}

// Key splits of a one-piece launch (model/prefill_splits.h): forced into 2, 3 and 5 splits on every query tile, and by
// the rule, the output equals the unsplit launch's within two bf16 steps (the merge's fp32 rounding may move a value
// across a rounding boundary) and the CPU's attention within bf16;
// twice in a row, so the counters must have put themselves back to zero. Odd shapes: 300 queries after 2000 keys, a
// chunk of 77 after 1100, one whole tile after 3000; 1024 after 16384 with 28 heads, which the rule splits in 4 on an
// H200.
TEST(CudaOps, AttentionPrefillSplitsMatchWhole) {
    REQUIRE_GPU();
    if (!cuda::prefill_wgmma_available(128)) GTEST_SKIP() << "the warp-specialised prefill kernel needs sm_90a";
    const int block_size = 16;
    struct Case {
        int n, pos0, n_kv, n_rep;
    };
    const Case cases[] = {{300, 2000, 2, 7}, {77, 1100, 2, 1}, {128, 3000, 2, 7}, {1024, 16384, 4, 7}};
    for (int d : {64, 128}) {
        DeviceBuffer scratch(prefill_split_scratch_bytes(d, cuda::sm_count()), "test");
        cudaMemset(scratch.get(), 0, scratch.bytes());
        for (const Case & cs : cases) {
            const int len = cs.pos0 + cs.n, n_head = cs.n_kv * cs.n_rep, n_blocks = (len + block_size - 1) / block_size;
            SCOPED_TRACE("d " + std::to_string(d) + " n " + std::to_string(cs.n) + " pos0 " + std::to_string(cs.pos0) + " heads " +
                         std::to_string(n_head));
            std::vector<int> table(static_cast<size_t>(n_blocks));
            std::iota(table.begin(), table.end(), 0);
            std::shuffle(table.begin(), table.end(), rng());
            const std::vector<float> ks = randn(size_t(len) * cs.n_kv * d), vs = randn(size_t(len) * cs.n_kv * d);
            std::vector<uint16_t> kc(size_t(n_blocks) * cs.n_kv * block_size * d, 0xffff), vc = kc;  // poison unused slots
            for (int t = 0; t < len; t++) {
                for (int h = 0; h < cs.n_kv; h++) {
                    for (int e = 0; e < d; e++) {
                        const size_t dst = ((size_t(table[size_t(t / block_size)]) * cs.n_kv + h) * block_size + t % block_size) * d + e;
                        kc[dst] = f32_to_bf16(ks[(size_t(t) * cs.n_kv + h) * d + e]);
                        vc[dst] = f32_to_bf16(vs[(size_t(t) * cs.n_kv + h) * d + e]);
                    }
                }
            }
            DeviceBuffer dk = upload(kc), dv = upload(vc), dt = upload(table);
            const cuda::KVLayer layer{dk.as<bf16>(), dv.as<bf16>(), nullptr, block_size, 0, {}, int64_t(n_blocks) * cs.n_kv * block_size};
            const size_t q_total = size_t(cs.n) * n_head * d;
            const std::vector<float> q = randn(q_total, 2.0f);
            DeviceBuffer dq = upload_bf16(q), dout = poisoned(q_total * 2);
            cuda::PrefillPiece piece;
            piece.q = dq.as<bf16>();
            piece.out = dout.as<bf16>();
            piece.block_table = dt.as<int>();
            piece.n = cs.n;
            piece.pos0 = cs.pos0;
            auto run = [&](int splits) {
                cudaMemset(dout.get(), 0xff, dout.bytes());
                const cuda::PrefillSplitScratch sc{scratch.get(), scratch.bytes(), splits};
                cuda::attention_prefill_pieces(&piece, 1, layer, n_head, cs.n_kv, d, nullptr, &sc);
                return download_bf16(dout, q_total);
            };
            const std::vector<float> whole = run(1);
            // The CPU's attention for the small cases (the large one's unsplit launch is checked by the tests above).
            const bool check_cpu = cs.n <= 300;
            std::vector<float> want(check_cpu ? q_total : 0);
            auto k_row = [&](int j) { return ks.data() + size_t(j) * cs.n_kv * d; };
            auto v_row = [&](int j) { return vs.data() + size_t(j) * cs.n_kv * d; };
            for (int t = 0; check_cpu && t < cs.n; t++) {
                const size_t at = size_t(t) * n_head * d;
                cpu::attention(q.data() + at, 1, cs.pos0 + t, n_head, cs.n_kv, d, k_row, v_row, want.data() + at);
            }
            if (check_cpu) {
                EXPECT_LT(rel_err(whole, want), 2e-2);
            }
            for (int splits : {2, 3, 5, 0}) {
                const PrefillSplitPlan plan = prefill_split_plan(cs.n, cs.pos0, n_head, cuda::sm_count(), splits);
                if (splits == 0 && cs.n == 1024 && cuda::sm_count() == 132) {
                    EXPECT_EQ(plan.splits, 4) << "the rule's case";
                }
                for (int round = 0; round < 2; round++) {
                    const std::vector<float> got = run(splits);
                    EXPECT_LT(rel_err(got, whole), 8e-3) << "splits " << splits << " (plan " << plan.splits << ") round " << round;
                    if (check_cpu) {
                        EXPECT_LT(rel_err(got, want), 2e-2) << "splits " << splits << " round " << round;
                    }
                }
            }
        }
    }
}

TEST(CudaOps, QkvRopeCache) {
    REQUIRE_GPU();
    for (bool qk_norm : {false, true}) {
        const int n = 7, n_head = 6, n_kv = 2, d = 24, pos0 = 5, width = (n_head + 2 * n_kv) * d;
        std::vector<float> qkv = randn(size_t(n) * width), bias = randn(size_t(width), 0.3f);
        std::vector<float> qn = randn(size_t(d), 0.2f), kn = randn(size_t(d), 0.2f);
        for (float & x : qn) x = round_bf16(x + 1);
        for (float & x : kn) x = round_bf16(x + 1);
        std::vector<float> kh(size_t(pos0 + n) * n_kv * d, 0.0f), vh = kh;
        PagedCache cache(kh, vh, pos0 + n, n_kv, d);
        ModelConfig c;
        c.head_dim = d;
        c.rope_theta = 10000;
        c.rope_scaling.type = RopeType::Yarn;
        c.rope_scaling.factor = 4;
        c.rope_scaling.original_max_position_embeddings = 8;
        c.max_position_embeddings = 32;
        RopeFreqs f = compute_rope_freqs(c, 0);
        DeviceBuffer dqkv = upload_bf16(qkv), db = upload_bf16(bias), dqn = upload_bf16(qn), dkn = upload_bf16(kn);
        DeviceBuffer dinv = upload(f.inv_freq), dq = poisoned(size_t(n) * n_head * d * 2);
        cuda::QkvRopeArgs a;
        a.qkv = dqkv.as<bf16>();
        a.bias = db.as<bf16>();
        a.q_norm = qk_norm ? dqn.as<bf16>() : nullptr;
        a.k_norm = qk_norm ? dkn.as<bf16>() : nullptr;
        a.inv_freq = dinv.as<float>();
        a.attention_scaling = f.attention_scaling;
        a.n = n;
        a.n_head = n_head;
        a.n_kv = n_kv;
        a.head_dim = d;
        a.pos0 = pos0;
        a.cache = cache.layer();
        a.q_out = dq.as<bf16>();
        cuda::qkv_rope_cache(a, nullptr);
        // CPU: bias, (norm), rope.
        std::vector<float> x = qkv;
        for (int t = 0; t < n; t++) {
            for (int i = 0; i < width; i++) x[size_t(t) * width + i] = round_bf16(x[size_t(t) * width + i] + bias[size_t(i)]);
        }
        std::vector<float> q(size_t(n) * n_head * d), k(size_t(n) * n_kv * d), v(size_t(n) * n_kv * d);
        for (int t = 0; t < n; t++) {
            std::copy_n(x.begin() + t * width, n_head * d, q.begin() + t * n_head * d);
            std::copy_n(x.begin() + t * width + n_head * d, n_kv * d, k.begin() + t * n_kv * d);
            std::copy_n(x.begin() + t * width + (n_head + n_kv) * d, n_kv * d, v.begin() + t * n_kv * d);
        }
        if (qk_norm) {
            cpu::rms_norm(q.data(), host_weight(qn, {d}), 1e-6f, n * n_head, d, q.data());
            cpu::rms_norm(k.data(), host_weight(kn, {d}), 1e-6f, n * n_kv, d, k.data());
        }
        std::vector<float> cs(size_t(n) * d), sn(size_t(n) * d);
        for (int t = 0; t < n; t++) rope_cos_sin(f, pos0 + t, cs.data() + t * d, sn.data() + t * d);
        cpu::rope(q.data(), n, n_head, d, cs.data(), sn.data());
        cpu::rope(k.data(), n, n_kv, d, cs.data(), sn.data());
        EXPECT_LT(rel_err(download_bf16(dq, q.size()), q), 1e-2);
        // K and V landed in the right cache slots.
        std::vector<float> kc = download_bf16(cache.k, cache.k.bytes() / 2), vc = download_bf16(cache.v, cache.v.bytes() / 2);
        std::vector<float> got_k, got_v;
        for (int t = 0; t < n; t++) {
            const int p = pos0 + t;
            for (int h = 0; h < n_kv; h++) {
                size_t base = ((size_t(cache.table[size_t(p / 16)]) * n_kv + h) * 16 + p % 16) * d;
                got_k.insert(got_k.end(), kc.begin() + long(base), kc.begin() + long(base + d));
                got_v.insert(got_v.end(), vc.begin() + long(base), vc.begin() + long(base + d));
            }
        }
        EXPECT_LT(rel_err(got_k, k), 1e-2);
        EXPECT_LT(rel_err(got_v, v), 1e-2);
    }
}

// The QKV GEMV then the bias, RoPE and cache store (qkv_rope_cache), as the decode step of a batch runs them (RMSNorm
// of fp32 rows fused into the GEMV, positions and block-table rows per token), against the CPU: norm, matmul, bf16
// output, bias, RoPE, and the q / K / V rows where they belong. One case: head_dim d, m tokens of a decode batch, with
// or without bias.
static void check_qkv_rope(int d, int m, bool with_bias) {
    const int n_head = 6, n_kv = 2, k = 200, rows = (n_head + 2 * n_kv) * d, bs = 16, stride = 4, pool = 13;
    const std::vector<int> positions = {37, 5, 50};
    std::vector<float> x = randn(size_t(m) * k), nw = randn(size_t(k), 0.2f), w = randn(size_t(rows) * k, 0.1f);
    std::vector<float> bias = randn(size_t(rows), 0.3f);
    for (float & v : nw) v = round_bf16(v + 1);
    std::vector<int> blocks(pool), tables(size_t(m) * stride, 0);
    std::iota(blocks.begin(), blocks.end(), 0);
    std::shuffle(blocks.begin(), blocks.end(), rng());
    for (int t = 0; t < m; t++) {
        for (int i = 0; i < stride; i++) tables[size_t(t) * stride + i] = blocks[size_t(t * stride + i)];
    }
    ModelConfig c;
    c.head_dim = d;
    c.rope_theta = 10000;
    RopeFreqs f = compute_rope_freqs(c, 0);
    const size_t cache_elems = size_t(pool) * n_kv * bs * d;
    DeviceBuffer dx = upload(x), dnw = upload_bf16(nw), dw = upload_bf16(w), db = upload_bf16(bias), dinv = upload(f.inv_freq);
    DeviceBuffer dk = poisoned(cache_elems * 2), dv = poisoned(cache_elems * 2), dt = upload(tables);
    DeviceBuffer dpos = upload(std::vector<int>(positions.begin(), positions.begin() + m));
    DeviceBuffer dq = poisoned(size_t(m) * n_head * d * 2), dqkv = poisoned(size_t(m) * rows * 2);
    cuda::GemvArgs a;
    a.w = dw.as<bf16>();
    a.n = rows;
    a.k = k;
    a.x = dx.get();
    a.m = m;
    a.norm_w = dnw.as<bf16>();
    a.eps = 1e-6f;
    a.y = dqkv.get();
    cuda::QkvRopeArgs r;
    r.qkv = dqkv.as<bf16>();
    r.bias = with_bias ? db.as<bf16>() : nullptr;
    r.inv_freq = dinv.as<float>();
    r.attention_scaling = f.attention_scaling;
    r.n = m;
    r.n_head = n_head;
    r.n_kv = n_kv;
    r.head_dim = d;
    r.pos_dev = dpos.as<int>();
    r.cache = {dk.as<bf16>(), dv.as<bf16>(), dt.as<int>(), bs, stride, {}};
    r.q_out = dq.as<bf16>();
    cuda::gemv(a, cuda::GemvIn::NormF32, cuda::GemvOut::Bf16, nullptr);
    cuda::qkv_rope_cache(r, nullptr);

    // CPU: RMSNorm (bf16), projection rounded to bf16, bias, RoPE of q and k at each token's position.
    const std::vector<float> xn = norm_rows(x, nw, m, k, 1e-6f);
    std::vector<float> q(size_t(m) * n_head * d), kk(size_t(m) * n_kv * d), vv(size_t(m) * n_kv * d);
    for (int t = 0; t < m; t++) {
        for (int i = 0; i < rows; i++) {
            double acc = 0;
            for (int j = 0; j < k; j++) acc += double(xn[size_t(t) * k + j]) * w[size_t(i) * k + j];
            float y = round_bf16(float(acc));
            if (with_bias) y = round_bf16(y + bias[size_t(i)]);
            if (i < n_head * d) q[size_t(t) * n_head * d + i] = y;
            else if (i < (n_head + n_kv) * d) kk[size_t(t) * n_kv * d + i - n_head * d] = y;
            else vv[size_t(t) * n_kv * d + i - (n_head + n_kv) * d] = y;
        }
        std::vector<float> cs(static_cast<size_t>(d)), sn(static_cast<size_t>(d));
        rope_cos_sin(f, positions[size_t(t)], cs.data(), sn.data());
        cpu::rope(q.data() + size_t(t) * n_head * d, 1, n_head, d, cs.data(), sn.data());
        cpu::rope(kk.data() + size_t(t) * n_kv * d, 1, n_kv, d, cs.data(), sn.data());
    }
    const std::string what = "d " + std::to_string(d) + " m " + std::to_string(m) + (with_bias ? " bias" : "");
    EXPECT_LT(rel_err(download_bf16(dq, q.size()), q), 1e-2) << what;
    const std::vector<float> kc = download_bf16(dk, cache_elems), vc = download_bf16(dv, cache_elems);
    std::vector<float> got_k, got_v;
    for (int t = 0; t < m; t++) {
        const int p = positions[size_t(t)];
        for (int h = 0; h < n_kv; h++) {
            const size_t base = ((size_t(tables[size_t(t) * stride + p / bs]) * n_kv + h) * bs + p % bs) * d;
            got_k.insert(got_k.end(), kc.begin() + long(base), kc.begin() + long(base + d));
            got_v.insert(got_v.end(), vc.begin() + long(base), vc.begin() + long(base + d));
        }
    }
    EXPECT_LT(rel_err(got_k, kk), 1e-2) << what;
    EXPECT_LT(rel_err(got_v, vv), 1e-2) << what;
}

TEST(CudaOps, GemvQkvRope) {
    REQUIRE_GPU();
    for (int d : {64, 128}) {
        for (int m : {1, 3}) {
            for (bool with_bias : {true, false}) check_qkv_rope(d, m, with_bias);
        }
    }
}

TEST(CudaOps, ArgmaxAdvanceAndGatherRows) {
    REQUIRE_GPU();
    for (int n : {1, 1000, 151936}) {
        std::vector<float> logits = randn(size_t(n) + 5);
        const int best = int(std::max_element(logits.begin(), logits.begin() + n) - logits.begin());
        logits[size_t(n)] = 1e9f;  // past n_valid: never chosen
        DeviceBuffer dl = upload(logits), ds = upload(std::vector<int>{0, 10, 2, 11}), dout = upload(std::vector<int>(4, -1));
        DeviceBuffer scratch(cuda::k_argmax_scratch * sizeof(float), "test");
        cuda::argmax_advance(dl.as<float>(), n, scratch.as<float>(), ds.as<int>(), dout.as<int>(), nullptr);
        std::vector<int> s(4), out(4);
        cudaDeviceSynchronize();
        cudaMemcpy(s.data(), ds.get(), 16, cudaMemcpyDeviceToHost);
        cudaMemcpy(out.data(), dout.get(), 16, cudaMemcpyDeviceToHost);
        EXPECT_EQ(s[0], best);
        EXPECT_EQ(s[1], 11);
        EXPECT_EQ(s[2], 3);
        EXPECT_EQ(s[3], 12);
        EXPECT_EQ(out[2], best);
    }
    // gather_rows against the CPU.
    const int rows = 9, h = 40, m = 4;
    std::vector<float> in = randn(size_t(rows) * h);
    std::vector<int> idx = {8, 0, 3, 5};
    DeviceBuffer din = upload_bf16(in), di = upload(idx);
    DeviceBuffer dg = poisoned(size_t(m) * h * 2);
    cuda::gather_rows(din.as<bf16>(), di.as<int>(), m, h, dg.as<bf16>(), nullptr);
    std::vector<float> want_g;
    for (int r : idx) want_g.insert(want_g.end(), in.begin() + r * h, in.begin() + (r + 1) * h);
    EXPECT_EQ(rel_err(download_bf16(dg, want_g.size()), want_g), 0.0);
}

// A static batch in one paged cache: sequence b (length lens[b]) owns blocks drawn from a shuffled pool, its table at
// row b of an int [batch, stride] array; K/V fp32 [len, n_kv, d] per sequence (bf16-exact).
struct BatchCache {
    int block_size = 16, n_kv, d, stride = 0;
    int64_t rows = 0;  // of the K (or V) array
    std::vector<int> lens, tables;
    std::vector<std::vector<float>> k, v;
    DeviceBuffer dk, dv, dt;
    BatchCache(std::vector<int> lens_, int n_kv_, int d_) : n_kv(n_kv_), d(d_), lens(std::move(lens_)) {
        int total = 0;
        for (int len : lens) {
            stride = std::max(stride, (len + block_size) / block_size);
            total += (len + block_size) / block_size;
        }
        std::vector<int> pool(size_t(total) + 2);
        std::iota(pool.begin(), pool.end(), 0);
        std::shuffle(pool.begin(), pool.end(), rng());
        tables.assign(lens.size() * size_t(stride), -1);
        std::vector<uint16_t> kc(pool.size() * n_kv * block_size * d, 0xffff), vc = kc;
        rows = int64_t(pool.size()) * n_kv * block_size;
        size_t next = 0;
        for (size_t b = 0; b < lens.size(); b++) {
            const int len = lens[b];
            for (int i = 0; i < (len + block_size) / block_size; i++) tables[b * size_t(stride) + size_t(i)] = pool[next++];
            k.push_back(randn(size_t(len) * n_kv * d));
            v.push_back(randn(size_t(len) * n_kv * d));
            for (int t = 0; t < len; t++) {
                for (int h = 0; h < n_kv; h++) {
                    const size_t blk = size_t(tables[b * size_t(stride) + size_t(t / block_size)]);
                    for (int i = 0; i < d; i++) {
                        const size_t dst = ((blk * n_kv + h) * block_size + t % block_size) * d + i;
                        kc[dst] = f32_to_bf16(k[b][(size_t(t) * n_kv + h) * d + i]);
                        vc[dst] = f32_to_bf16(v[b][(size_t(t) * n_kv + h) * d + i]);
                    }
                }
            }
        }
        dk = upload(kc);
        dv = upload(vc);
        dt = upload(tables);
    }
    cuda::KVLayer layer() const { return {dk.as<bf16>(), dv.as<bf16>(), dt.as<int>(), block_size, stride, {}, rows}; }
};

// Batched decode attention: each sequence of the batch, at its own length, equals the CPU reference alone. Splits as
// a graph of this batch takes them, and one split where every length is within a split's most keys (the tensor-core
// kernels then write out themselves, no combine), as large batches of short sequences run.
TEST(CudaOps, AttentionDecodeBatch) {
    REQUIRE_GPU();
    for (int d : {64, 128}) {
        for (int n_rep : {1, 7, 16}) {
            for (bool one_split : {false, true}) {
                const int n_kv = 2, n_head = n_kv * n_rep;
                BatchCache cache(one_split ? std::vector<int>{1, 257, 70, k_decode_max_split_keys, 17} : std::vector<int>{1, 257, 70, 4097, 17}, n_kv, d);
                const int B = int(cache.lens.size());
                std::vector<float> q = randn(size_t(B) * n_head * d, 2.0f), want(q.size());
                for (int b = 0; b < B; b++) {
                    auto k_row = [&](int j) { return cache.k[size_t(b)].data() + size_t(j) * n_kv * d; };
                    auto v_row = [&](int j) { return cache.v[size_t(b)].data() + size_t(j) * n_kv * d; };
                    const size_t off = size_t(b) * n_head * d;
                    cpu::attention(q.data() + off, 1, cache.lens[size_t(b)] - 1, n_head, n_kv, d, k_row, v_row, want.data() + off);
                }
                DeviceBuffer dq = upload_bf16(q), dout = poisoned(size_t(B) * n_head * d * 2), dlen = upload(cache.lens);
                const int splits = one_split ? 1 : cuda::decode_splits(4097, n_kv, d, B);
                DeviceBuffer po(size_t(B) * n_head * splits * d * 4, "test"), pml(size_t(B) * n_head * splits * 2 * 4, "test");
                cuda::DecodeScratch scratch{po.as<float>(), pml.as<float>(), splits};
                for (const DecodeCase & c : decode_cases(d, cache.layer(), n_rep)) {
                    cudaMemset(dout.get(), 0xff, dout.bytes());
                    c.run([&] { cuda::attention_decode(dq.as<bf16>(), cache.layer(), dlen.as<int>(), n_head, n_kv, d, scratch, dout.as<bf16>(), nullptr, B, c.kernel); });
                    const std::vector<float> got = download_bf16(dout, q.size());
                    for (int b = 0; b < B; b++) {
                        const long off = long(b) * n_head * d;
                        const std::vector<float> got_b(got.begin() + off, got.begin() + off + n_head * d), want_b(want.begin() + off, want.begin() + off + n_head * d);
                        EXPECT_LT(rel_err(got_b, want_b), 2e-2) << "sequence " << b << " len " << cache.lens[size_t(b)] << " d " << d << " rep " << n_rep
                                                                << " kernel " << int(c.kernel) << " early " << c.early_kv << " splits " << splits;
                    }
                }
            }
        }
    }
}

// The cache write of a batch's decode tokens: token t goes to sequence t at its own position, through its own table;
// packed (tokens of several prompts in one pass), token t goes to sequence row_seq[t] (here the batch reversed).
TEST(CudaOps, QkvRopeCacheBatch) {
    REQUIRE_GPU();
    const int n_head = 4, n_kv = 2, d = 64, width = (n_head + 2 * n_kv) * d;
    for (bool packed : {false, true}) {
        SCOPED_TRACE(packed ? "packed" : "batch");
        BatchCache cache({1, 40, 17}, n_kv, d);  // the new token of sequence b lands at position lens[b] - 1
        const int B = int(cache.lens.size());
        std::vector<int> seq_of(static_cast<size_t>(B)), pos;
        for (int t = 0; t < B; t++) seq_of[size_t(t)] = packed ? B - 1 - t : t;
        for (int t = 0; t < B; t++) pos.push_back(cache.lens[size_t(seq_of[size_t(t)])] - 1);
        std::vector<float> qkv = randn(size_t(B) * width);
        ModelConfig c;
        c.head_dim = d;
        c.rope_theta = 1e6;
        RopeFreqs f = compute_rope_freqs(c, 0);
        DeviceBuffer dqkv = upload_bf16(qkv), dinv = upload(f.inv_freq), dq = poisoned(size_t(B) * n_head * d * 2), dpos = upload(pos);
        DeviceBuffer drow = upload(seq_of);
        cuda::QkvRopeArgs a;
        a.qkv = dqkv.as<bf16>();
        a.inv_freq = dinv.as<float>();
        a.n = B;
        a.n_head = n_head;
        a.n_kv = n_kv;
        a.head_dim = d;
        a.pos_dev = dpos.as<int>();
        a.row_seq = packed ? drow.as<int>() : nullptr;
        a.cache = cache.layer();
        a.q_out = dq.as<bf16>();
        cuda::qkv_rope_cache(a, nullptr);
        std::vector<float> q(size_t(B) * n_head * d), k(size_t(B) * n_kv * d), cs(size_t(B) * d), sn(size_t(B) * d);
        for (int t = 0; t < B; t++) {
            std::copy_n(qkv.begin() + t * width, n_head * d, q.begin() + t * n_head * d);
            std::copy_n(qkv.begin() + t * width + n_head * d, n_kv * d, k.begin() + t * n_kv * d);
            rope_cos_sin(f, pos[size_t(t)], cs.data() + t * d, sn.data() + t * d);
        }
        cpu::rope(q.data(), B, n_head, d, cs.data(), sn.data());
        cpu::rope(k.data(), B, n_kv, d, cs.data(), sn.data());
        EXPECT_LT(rel_err(download_bf16(dq, q.size()), q), 1e-2);
        std::vector<float> kc = download_bf16(cache.dk, cache.dk.bytes() / 2), vc = download_bf16(cache.dv, cache.dv.bytes() / 2);
        std::vector<float> got_k, want_v, got_v;
        for (int t = 0; t < B; t++) {
            const int p = pos[size_t(t)];
            const size_t blk = size_t(cache.tables[size_t(seq_of[size_t(t)]) * cache.stride + size_t(p / 16)]);
            for (int h = 0; h < n_kv; h++) {
                const size_t base = ((blk * n_kv + h) * 16 + p % 16) * d;
                got_k.insert(got_k.end(), kc.begin() + long(base), kc.begin() + long(base + d));
                got_v.insert(got_v.end(), vc.begin() + long(base), vc.begin() + long(base + d));
                const auto vsrc = qkv.begin() + t * width + (n_head + n_kv + h) * d;
                want_v.insert(want_v.end(), vsrc, vsrc + d);
            }
        }
        EXPECT_LT(rel_err(got_k, k), 1e-2);
        EXPECT_EQ(rel_err(got_v, want_v), 0.0);
    }
}

// The batch argmax splits each row into parts (two passes): rows of a test vocabulary and of Qwen's, with the row's
// largest value twice (the lower id wins), NaNs (never chosen) and values past n_valid (never read).
TEST(CudaOps, ArgmaxRowsAdvance) {
    REQUIRE_GPU();
    for (const auto & [rows, vocab, n_valid] : {std::tuple{5, 1003, 1000}, std::tuple{3, 152064, 151665}, std::tuple{70, 4099, 4097}}) {
        std::vector<float> logits = randn(size_t(rows) * vocab);
        std::vector<int> best;
        for (int r = 0; r < rows; r++) {
            float * row = logits.data() + size_t(r) * vocab;
            row[n_valid + 1] = 1e9f;  // past n_valid: never chosen
            row[(r * 7919) % n_valid] = std::nanf("");
            if (r % 2 == 1) {  // a tie across parts: the lower id
                row[n_valid / 3 + r] = 50.0f;
                row[n_valid - 2 - r] = 50.0f;
            }
            int b = -1;
            for (int i = 0; i < n_valid; i++) {
                if (!std::isnan(row[i]) && (b < 0 || row[i] > row[b])) b = i;
            }
            best.push_back(b);
        }
        // State: tokens [rows], positions [rows], step, lengths [rows].
        std::vector<int> state(3 * rows + 1, 0);
        for (int r = 0; r < rows; r++) {
            state[size_t(rows + r)] = 10 * r;
            state[size_t(2 * rows + 1 + r)] = 10 * r + 1;
        }
        state[size_t(2 * rows)] = 2;
        DeviceBuffer dl = upload(logits), ds = upload(state), dout = upload(std::vector<int>(size_t(4 * rows), -1));
        DeviceBuffer scratch(cuda::argmax_rows_scratch(rows) * sizeof(float), "test");
        int * s = ds.as<int>();
        cuda::argmax_rows_advance(dl.as<float>(), rows, vocab, n_valid, scratch.as<float>(), s, s + rows, s + 2 * rows, s + 2 * rows + 1,
                                  dout.as<int>(), nullptr);
        std::vector<int> got(state.size()), out(size_t(4 * rows));
        cudaDeviceSynchronize();
        cudaMemcpy(got.data(), ds.get(), got.size() * 4, cudaMemcpyDeviceToHost);
        cudaMemcpy(out.data(), dout.get(), out.size() * 4, cudaMemcpyDeviceToHost);
        for (int r = 0; r < rows; r++) {
            EXPECT_EQ(got[size_t(r)], best[size_t(r)]) << "rows " << rows << " vocab " << vocab << " row " << r;
            EXPECT_EQ(got[size_t(rows + r)], 10 * r + 1);
            EXPECT_EQ(got[size_t(2 * rows + 1 + r)], 10 * r + 2);
            EXPECT_EQ(out[size_t(2 * rows + r)], best[size_t(r)]);
        }
        EXPECT_EQ(got[size_t(2 * rows)], 3);
    }
}
