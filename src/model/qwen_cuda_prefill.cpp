// Prefill of the CUDA engine (class in model/qwen_cuda.h): a prompt in passes of prefill_chunk() tokens, each layer's
// projections through cuBLASLt (quantized weights dequantized once per pass), the cache written by the QKV/RoPE
// kernel and FlashAttention-style attention over it (over a quantized cache, on its bf16 dequantization).
#include "model/qwen_cuda.h"

#include <cstdlib>
#include <cstring>

#include "core/env.h"

namespace qinfer::cuda_engine {

// Prefill attention over a quantized cache runs on its bf16 dequantization (kv_dequantize_blocks) rather than on the
// kernels that read codes: on an H100 the bf16 ping-pong kernel took a 1024-query chunk at 3073 keys (d 128, 14/2
// heads) in 0.071 ms against 0.205 (int8) and 0.192 (fp8) for the quantized wgmma kernel, and Qwen2.5-7B YaRN with
// GPTQ-Int4 weights and an int8 cache at 129024 went from 21.68 to 9.69 s to first token, 67.81 -> 112.70 tok/s
// (bf16 cache: 103.09), for 0.26 GB more (bench/results/2026-11-27-h100-kv-prefill).
// With a quantized cache: prefill_k_ / prefill_v_ large enough for a sequence of `tokens` (whole blocks); returns
// whether the cache is quantized.
bool CudaQwenEngine::ensure_prefill_kv(int tokens) {
    const ModelConfig & c = model_->config;
    if (kv_kind_ == cuda::KVKind::BF16) return false;
    const size_t rows = size_t((tokens + block_size_ - 1) / block_size_) * c.num_key_value_heads * block_size_;
    prefill_k_.ensure(rows * c.head_dim * sizeof(bf16), "prefill KV (bf16)");
    prefill_v_.ensure(rows * c.head_dim * sizeof(bf16), "prefill KV (bf16)");
    return true;
}

int CudaQwenEngine::max_quantized_k() const {
    int max_k = 0;
    for (const auto & L : layers_) {
        for (const DevLinear * l : {&L.qkv, &L.o, &L.mlp.gate_up, &L.mlp.down}) {
            if (l->quantized) max_k = std::max(max_k, l->q.k_padded);
        }
        for (const DevMlp & e : L.experts) max_k = std::max({max_k, e.gate_up.quantized ? e.gate_up.q.k_padded : 0, e.down.quantized ? e.down.q.k_padded : 0});
        if (L.has_shared) max_k = std::max({max_k, L.shared.gate_up.quantized ? L.shared.gate_up.q.k_padded : 0, L.shared.down.quantized ? L.shared.down.q.k_padded : 0});
    }
    return max_k;
}

// Tokens per prefill pass: prefill_chunk_for_cache (model/prefill_chunk.h; quantized weights are dequantized once per
// pass), or QINFER_PREFILL_CHUNK (a multiple of 128, for timing others).
int CudaQwenEngine::prefill_chunk() const {
    const int forced = env().prefill_chunk;
    return forced ? forced : prefill_chunk_for_cache(kv_tokens_, max_quantized_k() > 0, prefill_bytes_per_token(model_->config));
}

void CudaQwenEngine::forward(int seq, const std::vector<int> & tokens, bool all_logits, std::vector<float> & logits) {
    const ModelConfig & cfg = model_->config;
    const int n = int(tokens.size());
    QINFER_CHECK(n > 0) << "forward needs at least one token";
    const int pos_start = table_->length(seq);
    if (pos_start + n > int(table_->blocks(seq).size()) * block_size_) {
        QINFER_FAIL() << "sequence " << seq << " outgrew the KV cache reserved for it (" << table_->blocks(seq).size() * block_size_ << " tokens)";
    }
    for (int t : tokens) {
        if (t < 0 || t >= cfg.vocab_size) QINFER_FAIL() << "token id " << t << " is outside the vocabulary [0, " << cfg.vocab_size << ")";
    }
    if (cfg.rope_scaling.type == RopeType::Dynamic) {
        rope_ = compute_rope_freqs(cfg, pos_start + n);
        CUDA_CHECK(cudaMemcpy(inv_freq_.get(), rope_.inv_freq.data(), rope_.inv_freq.size() * sizeof(float), cudaMemcpyHostToDevice));
    }
    if (ids_host_.bytes() < size_t(n) * sizeof(int)) ids_host_ = cuda::HostMappedBuffer(size_t(n) * sizeof(int), "prompt ids");
    std::memcpy(ids_host_.host(), tokens.data(), size_t(n) * sizeof(int));  // the last forward ended with a sync
    logits.resize(size_t(all_logits ? n : 1) * cfg.vocab_size);
    prefill(block_tables_.at(seq).as<int>(), pos_start, 0, n, all_logits, logits.data());
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    table_->set_length(seq, pos_start + n);
}

// n tokens (ids_host_ from `ids_offset`, pinned) appended at pos_start.. of the sequence whose block table is `table`
// (device int [blocks]), in passes of prefill_chunk() tokens; the logits of every position (all_logits) or of the
// last go to `logits_out` (host, fp32 [rows, vocab]; null: none computed). Queued on the stream, not waited for.
void CudaQwenEngine::prefill(const int * table, int pos_start, size_t ids_offset, int n, bool all_logits, float * logits_out) {
    const ModelConfig & cfg = model_->config;
    const int H = cfg.hidden_size, V = cfg.vocab_size;
    const float eps = float(cfg.rms_norm_eps);
    const int chunk = std::min(n, prefill_chunk());
    ensure_workspace(chunk);
    // Over a quantized cache, each pass's attention runs the bf16 kernels on the cache dequantized so far
    // (ensure_prefill_kv); the buffers hold the whole prompt's blocks.
    const bool via_bf16 = ensure_prefill_kv(pos_start + n);
    if (all_logits) logits_.ensure(size_t(std::min(n, chunk)) * V * sizeof(float), "logits");
    else logits_.ensure(size_t(V) * sizeof(float), "logits");
    const int * ids_host = static_cast<const int *>(ids_host_.host()) + ids_offset;
    const bool profile = env().profile;
    profile_decode_ = profile;
    if (profile && n > 1) prof_.begin(stream_);
    for (int off = 0; off < n; off += chunk) {
        const int c = std::min(chunk, n - off);
        const int pos0 = pos_start + off;
        CUDA_CHECK(cudaMemcpyAsync(ids_.get(), ids_host + off, size_t(c) * sizeof(int), cudaMemcpyHostToDevice, stream_));
        float * x = x_.as<float>();
        bf16 * xn = xn_.as<bf16>();
        cuda::embedding(embed_table_, ids_.as<int>(), c, H, x, stream_);
        prof_.mark("embedding");
        bool pending = false;  // tmp_ holds an MLP output not yet added to x
        for (int l = 0; l < cfg.num_hidden_layers; l++) {
            const DevLayer & L = layers_[size_t(l)];
            if (pending) {
                cuda::add_rms_norm(x, tmp_.as<bf16>(), L.input_norm.as<bf16>(), eps, c, H, xn, stream_);
            } else {
                cuda::rms_norm(x, L.input_norm.as<bf16>(), eps, c, H, xn, stream_);
            }
            prof_.mark("add/rms_norm");
            linear(xn, c, L.qkv, qkv_.as<bf16>());
            prof_.mark("qkv gemm");
            cuda::QkvRopeArgs r = rope_args(l, kv_layer(l, table), c);
            r.pos0 = pos0;
            if (kv_kind_ == cuda::KVKind::FP8 && !fp8_ready_[size_t(l)]) {
                // The layer's first values set its fp8 scales (amax / 448), as in the CPU cache.
                CUDA_CHECK(cudaMemsetAsync(fp8_amax_.get(), 0, 2 * sizeof(float), stream_));
                r.fp8_amax = fp8_amax_.as<float>();
                cuda::qkv_rope_cache(r, stream_);
                r.fp8_amax = nullptr;
                cuda::fp8_scales_from_amax(fp8_amax_.as<float>(), r.cache.quant.fp8_scale, stream_);
                fp8_ready_[size_t(l)] = true;
            }
            cuda::qkv_rope_cache(r, stream_);
            prof_.mark("bias/norm/rope/cache");
            cuda::KVLayer attn_cache = r.cache;
            if (via_bf16) {
                const int n_blocks = (pos0 + c + block_size_ - 1) / block_size_;
                cuda::kv_dequantize_blocks(r.cache, n_blocks, cfg.num_key_value_heads, cfg.head_dim, prefill_k_.as<bf16>(), prefill_v_.as<bf16>(), stream_);
                attn_cache = cuda::KVLayer{prefill_k_.as<bf16>(), prefill_v_.as<bf16>(), prefill_table_.as<int>(), block_size_, 0, {},
                                           int64_t(n_blocks) * cfg.num_key_value_heads * block_size_};
            }
            cuda::attention_prefill(q_.as<bf16>(), attn_cache, c, pos0, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim,
                                    attn_.as<bf16>(), stream_);
            prof_.mark("attention");
            linear(attn_.as<bf16>(), c, L.o, tmp_.as<bf16>());
            prof_.mark("o_proj gemm");
            cuda::add_rms_norm(x, tmp_.as<bf16>(), L.post_norm.as<bf16>(), eps, c, H, xn, stream_);
            prof_.mark("add/rms_norm");
            if (L.moe) {
                moe(L, c, xn, x);
                pending = false;
            } else {
                mlp(L.mlp, xn, c, gu_.as<bf16>(), act_.as<bf16>(), tmp_.as<bf16>());
                pending = true;
            }
        }
        if (pending) cuda::add_residual(x, tmp_.as<bf16>(), int64_t(c) * H, stream_);
        prof_.mark("add/rms_norm");
        // Logits: every position of the chunk, or only the sequence's last one.
        const bool last_chunk = off + c == n;
        if ((!all_logits && !last_chunk) || !logits_out) continue;
        const int rows = all_logits ? c : 1;
        const float * x_rows = x + size_t(c - rows) * H;
        cuda::rms_norm(x_rows, final_norm_.as<bf16>(), eps, rows, H, xn, stream_);
        if (rows <= k_gemv_max_m) {
            cuda::GemvArgs a;
            a.w = lm_head_;
            a.n = V;
            a.k = H;
            a.x = xn;
            a.m = rows;
            a.y = logits_.get();
            cuda::gemv(a, cuda::GemvIn::Bf16, cuda::GemvOut::F32, stream_);
        } else {
            cuda::gemm(xn, lm_head_, rows, V, H, logits_.get(), true, stream_);
        }
        prof_.mark("final norm, lm_head");
        float * dst = logits_out + (all_logits ? size_t(off) * V : 0);
        CUDA_CHECK(cudaMemcpyAsync(dst, logits_.get(), size_t(rows) * V * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    }
    if (profile && n > 1) {
        prof_.mark("logits copy");
        prof_.report("prefill (" + std::to_string(n) + " tokens, passes of " + std::to_string(chunk) + ")");
    }
}

}  // namespace qinfer::cuda_engine
