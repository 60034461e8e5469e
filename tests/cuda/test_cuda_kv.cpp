// Quantized KV caches on the GPU (fp8, int8, int4) against the CPU cache's formulas (runtime/kv_cache.h): the cache
// write of qkv_rope_cache, and prefill and decode attention reading codes, on odd lengths, head dims and GQA ratios.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "backends/cpu/ops.h"
#include "backends/cuda/allocator.h"
#include "backends/cuda/ops.h"
#include "cuda/helpers.h"
#include "model/rope.h"
#include "runtime/kv_cache.h"

using namespace qinfer;
using namespace qinfer::test;
using cuda::bf16;
using cuda::DeviceBuffer;

namespace {

cuda::KVKind kind_of(KVDType t) {
    switch (t) {
    case KVDType::FP8: return cuda::KVKind::FP8;
    case KVDType::INT8: return cuda::KVKind::INT8;
    case KVDType::INT4: return cuda::KVKind::INT4;
    default: return cuda::KVKind::BF16;
    }
}

int row_bytes(KVDType t, int d) { return t == KVDType::INT4 ? d / 2 : d; }

// One sequence's K/V [len, n_kv, d] quantized on the host by the CPU cache's row functions into the GPU layout
// (codes [block][kv_head][slot][row bytes], scale/zero [block][kv_head][slot]) under a shuffled block table; kd/vd
// hold the dequantized values the attention must see.
struct QuantCache {
    KVDType t;
    int n_kv, d, len, block_size = 16;
    std::vector<int> table;
    std::vector<float> kd, vd;
    float fp8_k = 1, fp8_v = 1;
    DeviceBuffer k, v, ksz, vsz, scales, bt;
    QuantCache(KVDType t_, int len_, int n_kv_, int d_) : t(t_), n_kv(n_kv_), d(d_), len(len_) {
        std::vector<float> kh = randn(size_t(len) * n_kv * d), vh = randn(size_t(len) * n_kv * d, 0.5f);
        for (size_t i = 0; i < kh.size(); i += 7) kh[i] *= 3;  // uneven ranges across rows
        if (t == KVDType::FP8) {
            float ak = 0, av = 0;
            for (float x : kh) ak = std::max(ak, std::fabs(x));
            for (float x : vh) av = std::max(av, std::fabs(x));
            fp8_k = ak / 448;
            fp8_v = av / 448;
        }
        const int blocks = (len + block_size - 1) / block_size + 3;
        table.resize(size_t(blocks));
        std::iota(table.begin(), table.end(), 0);
        std::shuffle(table.begin(), table.end(), rng());
        const size_t rows = size_t(blocks) * n_kv * block_size, rb = size_t(row_bytes(t, d));
        std::vector<uint8_t> kc(rows * rb, 0x77), vc(rows * rb, 0x77);
        std::vector<float> ks(rows * 2, NAN), vs(rows * 2, NAN);
        kd.resize(kh.size());
        vd.resize(vh.size());
        for (int tok = 0; tok < len; tok++) {
            for (int h = 0; h < n_kv; h++) {
                const size_t src = (size_t(tok) * n_kv + h) * d;
                const size_t row = (size_t(table[size_t(tok / block_size)]) * n_kv + h) * block_size + tok % block_size;
                kv_quantize_row(t, &kh[src], d, fp8_k, &kc[row * rb], &ks[row * 2]);
                kv_quantize_row(t, &vh[src], d, fp8_v, &vc[row * rb], &vs[row * 2]);
                kv_dequantize_row(t, &kc[row * rb], &ks[row * 2], d, fp8_k, &kd[src]);
                kv_dequantize_row(t, &vc[row * rb], &vs[row * 2], d, fp8_v, &vd[src]);
            }
        }
        k = upload(kc);
        v = upload(vc);
        ksz = upload(ks);
        vsz = upload(vs);
        scales = upload(std::vector<float>{fp8_k, fp8_v});
        bt = upload(table);
    }
    cuda::KVLayer layer() const {
        cuda::KVLayer l;
        l.block_table = bt.as<int>();
        l.block_size = block_size;
        l.quant.kind = kind_of(t);
        l.quant.k = k.as<uint8_t>();
        l.quant.v = v.as<uint8_t>();
        l.quant.k_sz = ksz.as<float2>();
        l.quant.v_sz = vsz.as<float2>();
        l.quant.fp8_scale = scales.as<float>();
        l.rows = int64_t(table.size()) * n_kv * block_size;
        return l;
    }
};

class QuantAttention : public ::testing::TestWithParam<std::tuple<KVDType, int, int, int>> {};

TEST_P(QuantAttention, PrefillAndDecodeMatchCpu) {
    REQUIRE_GPU();
    const auto [t, len, d, n_rep] = GetParam();
    const int n_kv = 2, n_head = n_kv * n_rep;
    QuantCache cache(t, len, n_kv, d);
    auto k_row = [&](int j) { return cache.kd.data() + size_t(j) * n_kv * d; };
    auto v_row = [&](int j) { return cache.vd.data() + size_t(j) * n_kv * d; };
    // The tensor-core kernels round the dequantized K/V to bf16 on their way to the MMAs: their reference does too, so
    // what remains is the probabilities' bf16 rounding. (Against the fp32 values, K's rounding moved logits of this
    // cache, whose rows reach +-13, by a few hundredths: 0.026-0.037 relative error in 1 of ~180 runs.)
    std::vector<float> kd16 = cache.kd, vd16 = cache.vd;
    for (float & x : kd16) x = round_bf16(x);
    for (float & x : vd16) x = round_bf16(x);
    auto k_row16 = [&](int j) { return kd16.data() + size_t(j) * n_kv * d; };
    auto v_row16 = [&](int j) { return vd16.data() + size_t(j) * n_kv * d; };
    const char * name = kv_dtype_name(t);

    // Decode: one query at position len - 1, bf16 on both sides. The SIMT kernel dequantizes to the same fp32 values
    // as the host.
    std::vector<float> q = randn(size_t(n_head) * d, 2.0f);
    for (float & x : q) x = round_bf16(x);
    DeviceBuffer dq = upload_bf16(q), dout = poisoned(size_t(n_head) * d * 2), dlen = upload(std::vector<int>{len});
    const int splits = cuda::decode_splits(len, n_kv, d);
    DeviceBuffer po(size_t(n_head) * splits * d * 4, "test"), pml(size_t(n_head) * splits * 2 * 4, "test");
    cuda::DecodeScratch scratch{po.as<float>(), pml.as<float>(), splits};
    std::vector<float> want(size_t(n_head) * d), want16(size_t(n_head) * d);
    cpu::attention(q.data(), 1, len - 1, n_head, n_kv, d, k_row, v_row, want.data());
    cpu::attention(q.data(), 1, len - 1, n_head, n_kv, d, k_row16, v_row16, want16.data());
    for (const DecodeCase & c : decode_cases(d, cache.layer(), n_rep)) {
        cudaMemset(dout.get(), 0xff, dout.bytes());
        c.run([&] { cuda::attention_decode(dq.as<bf16>(), cache.layer(), dlen.as<int>(), n_head, n_kv, d, scratch, dout.as<bf16>(), nullptr, 1, c.kernel); });
        // The tensor-copy kernel of int8 and fp8 caches (attention_decode_q8.cu) multiplies the codes as they are (exact
        // in fp16) and applies the scales in fp32: no bf16 rounding of K/V, so its reference is the fp32 one. (Against
        // the bf16-rounded one it was 0.0236 off in one fp8 run at 129024 keys, H100, 07ce35f.)
        const bool raw_codes = c.kernel == cuda::DecodeKernel::TensorCoreTma && t != KVDType::BF16;
        const std::vector<float> & ref = c.kernel == cuda::DecodeKernel::Simt || raw_codes ? want : want16;
        EXPECT_LT(rel_err(download_bf16(dout, ref.size()), ref), 2e-2)
            << name << " decode len " << len << " d " << d << " rep " << n_rep << " kernel " << int(c.kernel) << " early " << c.early_kv;
        if (c.kernel == cuda::DecodeKernel::Simt || len > k_decode_max_split_keys) continue;
        // One split, as large batches of short sequences take: the tensor-core kernels normalize and write out
        // themselves.
        cudaMemset(dout.get(), 0xff, dout.bytes());
        const cuda::DecodeScratch one{po.as<float>(), pml.as<float>(), 1};
        c.run([&] { cuda::attention_decode(dq.as<bf16>(), cache.layer(), dlen.as<int>(), n_head, n_kv, d, one, dout.as<bf16>(), nullptr, 1, c.kernel); });
        EXPECT_LT(rel_err(download_bf16(dout, ref.size()), ref), 2e-2)
            << name << " decode len " << len << " d " << d << " rep " << n_rep << " kernel " << int(c.kernel) << " one split";
    }

    // Prefill of the last n queries; tiles are rounded to bf16 on their way to the tensor cores.
    const int n = std::min(len, 37), pos0 = len - n;
    std::vector<float> qp = randn(size_t(n) * n_head * d, 2.0f);
    for (float & x : qp) x = round_bf16(x);
    DeviceBuffer dqp = upload_bf16(qp), dop(size_t(n) * n_head * d * 2, "test");
    std::vector<float> wp(qp.size());
    for (int i = 0; i < n; i++) {
        cpu::attention(qp.data() + size_t(i) * n_head * d, 1, pos0 + i, n_head, n_kv, d, k_row16, v_row16, wp.data() + size_t(i) * n_head * d);
    }
    for (cuda::PrefillKernel kernel : prefill_kernels(d)) {
        cudaMemset(dop.get(), 0xff, dop.bytes());
        cuda::attention_prefill(dqp.as<bf16>(), cache.layer(), n, pos0, n_head, n_kv, d, dop.as<bf16>(), nullptr, kernel);
        EXPECT_LT(rel_err(download_bf16(dop, wp.size()), wp), 2e-2)
            << name << " prefill len " << len << " d " << d << " rep " << n_rep << " kernel " << int(kernel);
    }

    // Prefill as the engine runs it over a quantized cache (CudaQwenEngine::ensure_prefill_kv): the sequence's blocks
    // dequantized to bf16 in table order, each value the CPU's rounded to bf16 (within one bf16 step), then the bf16
    // kernel through an identity table; the slots past the end keep the codes' values (NaN where the scales are NaN).
    if (d % 16 == 0) {
        const int n_blocks = (len + cache.block_size - 1) / cache.block_size;
        const size_t rows = size_t(n_blocks) * n_kv * cache.block_size;
        DeviceBuffer kb = poisoned(rows * d * 2), vb = poisoned(rows * d * 2);
        std::vector<int> identity(static_cast<size_t>(n_blocks));
        std::iota(identity.begin(), identity.end(), 0);
        DeviceBuffer ib = upload(identity);
        cuda::kv_dequantize_blocks(cache.layer(), n_blocks, n_kv, d, kb.as<bf16>(), vb.as<bf16>(), nullptr);
        const std::vector<float> kg = download_bf16(kb, rows * d), vg = download_bf16(vb, rows * d);
        size_t off_by_more = 0;
        auto differ = [](float got, float want) { return !(std::fabs(got - want) <= std::fabs(want) * 0x1p-7f); };
        for (int j = 0; j < len; j++) {
            for (int h = 0; h < n_kv; h++) {
                for (int e = 0; e < d; e++) {
                    const size_t src = (size_t(j) * n_kv + h) * d + e;
                    const size_t dst = ((size_t(j / cache.block_size) * n_kv + h) * cache.block_size + j % cache.block_size) * d + e;
                    off_by_more += differ(kg[dst], kd16[src]) + differ(vg[dst], vd16[src]);
                }
            }
        }
        EXPECT_EQ(off_by_more, 0u) << name << " dequantized blocks len " << len << " d " << d;
        const cuda::KVLayer bf{kb.as<bf16>(), vb.as<bf16>(), ib.as<int>(), cache.block_size, 0, {}, int64_t(rows)};
        for (cuda::PrefillKernel kernel : prefill_kernels(d)) {
            cudaMemset(dop.get(), 0xff, dop.bytes());
            cuda::attention_prefill(dqp.as<bf16>(), bf, n, pos0, n_head, n_kv, d, dop.as<bf16>(), nullptr, kernel);
            EXPECT_LT(rel_err(download_bf16(dop, wp.size()), wp), 2e-2)
                << name << " prefill on the bf16 dequantization, len " << len << " d " << d << " rep " << n_rep << " kernel " << int(kernel);
        }
    }

    if ((len == 4097 || len == 129024) && n_rep == 7) {
        // Timings for the perf log (not assertions): decode with each kernel, and one 1024-query prefill chunk at the
        // end of the cache (what the engine runs per chunk of a long prompt).
        const double kv_bytes = 2.0 * len * n_kv * (row_bytes(t, d) + (t == KVDType::FP8 ? 0 : 8));
        for (cuda::DecodeKernel kernel : decode_kernels(d, cache.layer())) {
            const double ms = time_ms(50, [&] {
                cuda::attention_decode(dq.as<bf16>(), cache.layer(), dlen.as<int>(), n_head, n_kv, d, scratch, dout.as<bf16>(), nullptr, 1, kernel);
            });
            std::printf("[ kernel ] attention_decode (%s) %s len %d d %d heads %d/%d: %.1f us, %.0f GB/s of KV\n",
                        decode_kernel_name(kernel), name, len, d, n_head, n_kv, ms * 1e3,
                        kv_bytes / (ms * 1e-3) / 1e9);
        }
        const int nc = std::min(len, 1024);
        std::vector<float> qc = randn(size_t(nc) * n_head * d);
        DeviceBuffer dqc = upload_bf16(qc), doc(size_t(nc) * n_head * d * 2, "test");
        for (cuda::PrefillKernel kernel : prefill_kernels(d)) {
            const double ms = time_ms(5, [&] {
                cuda::attention_prefill(dqc.as<bf16>(), cache.layer(), nc, len - nc, n_head, n_kv, d, doc.as<bf16>(), nullptr, kernel);
            });
            const double flops = 4.0 * nc * (len - nc / 2.0) * d * n_head;
            std::printf("[ kernel ] attention_prefill (%s) %s chunk %d at %d d %d heads %d/%d: %.3f ms, %.1f TFLOP/s\n",
                        cuda::prefill_kernel_name(kernel), name, nc, len - nc, d, n_head, n_kv, ms,
                        flops / (ms * 1e-3) / 1e12);
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Kinds, QuantAttention,
                         ::testing::Combine(::testing::Values(KVDType::FP8, KVDType::INT8, KVDType::INT4), ::testing::Values(1, 17, 4097),
                                            ::testing::Values(64, 128), ::testing::Values(1, 7)));
INSTANTIATE_TEST_SUITE_P(LongContext, QuantAttention,
                         ::testing::Combine(::testing::Values(KVDType::FP8, KVDType::INT8, KVDType::INT4), ::testing::Values(129024),
                                            ::testing::Values(128), ::testing::Values(7)));
// 16 query heads a KV head: the tensor-core kernel (cp.async, codes dequantized in shared memory) with both rows.
INSTANTIATE_TEST_SUITE_P(WideGroups, QuantAttention,
                         ::testing::Combine(::testing::Values(KVDType::FP8, KVDType::INT8, KVDType::INT4), ::testing::Values(17, 4097),
                                            ::testing::Values(128), ::testing::Values(16)));
INSTANTIATE_TEST_SUITE_P(TinyHeads, QuantAttention,
                         ::testing::Combine(::testing::Values(KVDType::FP8, KVDType::INT8, KVDType::INT4), ::testing::Values(70),
                                            ::testing::Values(16, 32), ::testing::Values(3)));

// The cache write: K after RoPE and V, quantized by the GPU, read back through the CPU's row functions, against the
// CPU's K and V within the format's step; fp8 scales from the range pass equal amax / 448.
TEST(CudaKv, QkvRopeCacheQuantized) {
    REQUIRE_GPU();
    // head_dim 64 (a warp a head, eight heads a block) and 128 (two warps a head).
    for (int d : {64, 128}) {
        for (KVDType t : {KVDType::FP8, KVDType::INT8, KVDType::INT4}) {
            const int n = 9, n_head = 4, n_kv = 2, pos0 = 3, width = (n_head + 2 * n_kv) * d;
            const int blocks = 2, rows = blocks * n_kv * 16, rb = row_bytes(t, d);
            std::vector<float> qkv = randn(size_t(n) * width);
            ModelConfig c;
            c.head_dim = d;
            c.rope_theta = 1e6;
            RopeFreqs f = compute_rope_freqs(c, 0);
            std::vector<int> table = {1, 0};
            DeviceBuffer dqkv = upload_bf16(qkv), dinv = upload(f.inv_freq), dq = poisoned(size_t(n) * n_head * d * 2), dbt = upload(table);
            DeviceBuffer kc = poisoned(size_t(rows) * rb), vc = poisoned(size_t(rows) * rb);
            DeviceBuffer ksz = poisoned(size_t(rows) * 8), vsz = poisoned(size_t(rows) * 8), scales = poisoned(8), amax(8, "test");
            cuda::QkvRopeArgs a;
            a.qkv = dqkv.as<bf16>();
            a.inv_freq = dinv.as<float>();
            a.n = n;
            a.n_head = n_head;
            a.n_kv = n_kv;
            a.head_dim = d;
            a.pos0 = pos0;
            a.cache.block_table = dbt.as<int>();
            a.cache.quant = {kind_of(t), kc.as<uint8_t>(), vc.as<uint8_t>(), ksz.as<float2>(), vsz.as<float2>(), scales.as<float>()};
            a.q_out = dq.as<bf16>();
            if (t == KVDType::FP8) {
                cudaMemset(amax.get(), 0, 8);
                a.fp8_amax = amax.as<float>();
                cuda::qkv_rope_cache(a, nullptr);
                a.fp8_amax = nullptr;
                cuda::fp8_scales_from_amax(amax.as<float>(), scales.as<float>(), nullptr);
            }
            cuda::qkv_rope_cache(a, nullptr);
            // CPU: K with RoPE, V as is.
            std::vector<float> k(size_t(n) * n_kv * d), v(size_t(n) * n_kv * d), cs(size_t(n) * d), sn(size_t(n) * d);
            for (int i = 0; i < n; i++) {
                std::copy_n(qkv.begin() + i * width + n_head * d, n_kv * d, k.begin() + i * n_kv * d);
                std::copy_n(qkv.begin() + i * width + (n_head + n_kv) * d, n_kv * d, v.begin() + i * n_kv * d);
                rope_cos_sin(f, pos0 + i, cs.data() + i * d, sn.data() + i * d);
            }
            cpu::rope(k.data(), n, n_kv, d, cs.data(), sn.data());
            std::vector<float> sc = download_f32(scales, 2);
            if (t == KVDType::FP8) {
                float ak = 0, av = 0;
                for (float x : k) ak = std::max(ak, std::fabs(x));
                for (float x : v) av = std::max(av, std::fabs(x));
                EXPECT_NEAR(sc[0], ak / 448, 1e-2 * ak / 448);
                EXPECT_NEAR(sc[1], av / 448, 1e-2 * av / 448);
            }
            std::vector<uint8_t> kh(size_t(rows) * rb), vh(size_t(rows) * rb);
            cudaMemcpy(kh.data(), kc.get(), kh.size(), cudaMemcpyDeviceToHost);
            cudaMemcpy(vh.data(), vc.get(), vh.size(), cudaMemcpyDeviceToHost);
            std::vector<float> kszh = download_f32(ksz, size_t(rows) * 2), vszh = download_f32(vsz, size_t(rows) * 2);
            std::vector<float> got_k(k.size()), got_v(v.size());
            for (int i = 0; i < n; i++) {
                const int p = pos0 + i;
                for (int h = 0; h < n_kv; h++) {
                    const size_t row = (size_t(table[size_t(p / 16)]) * n_kv + h) * 16 + p % 16, dst = (size_t(i) * n_kv + h) * d;
                    kv_dequantize_row(t, &kh[row * rb], &kszh[row * 2], d, sc[0], &got_k[dst]);
                    kv_dequantize_row(t, &vh[row * rb], &vszh[row * 2], d, sc[1], &got_v[dst]);
                }
            }
            // Within half a step of each row's range (int8 1/510, int4 1/30) or e4m3's relative precision (1/16), plus bf16.
            const double tol = t == KVDType::INT8 ? 1.5e-2 : t == KVDType::INT4 ? 8e-2 : 7e-2;
            EXPECT_LT(rel_err(got_k, k), tol) << kv_dtype_name(t) << " d " << d;
            EXPECT_LT(rel_err(got_v, v), tol) << kv_dtype_name(t) << " d " << d;
        }
    }
}

}  // namespace
