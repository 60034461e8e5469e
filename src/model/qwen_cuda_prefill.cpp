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

bool CudaQwenEngine::ensure_attn_split(int tokens) {
    if (kv_kind_ != cuda::KVKind::BF16 || !prefill_split_may_apply(tokens)) return false;
    const size_t bytes = prefill_split_scratch_bytes(model_->config.head_dim, cuda::sm_count());
    if (attn_split_.bytes() < bytes) {
        attn_split_.ensure(bytes, "prefill attention splits");
        CUDA_CHECK(cudaMemsetAsync(attn_split_.get(), 0, bytes, stream_));
    }
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
    const ModelConfig & c = model_->config;
    return forced ? forced : prefill_chunk_for_cache(kv_tokens_, max_quantized_k() > 0, prefill_bytes_per_token(c), c.num_experts > 0);
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
    PrefillSegment seg;
    seg.table = block_tables_.at(seq).as<int>();
    seg.pos0 = pos_start;
    seg.n = n;
    seg.logits = logits.data();
    prefill({seg}, 0, all_logits);
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    table_->set_length(seq, pos_start + n);
}

namespace {

// A pass's share of one segment: its tokens first .. first + n - 1 of the pass, from token `from` of segment `seg`.
struct PassPiece {
    size_t seg;
    int first, from, n;
};

}  // namespace

// The segments' tokens (their ids one after another in ids_host_ from `ids_offset`, pinned) appended to their
// sequences, packed into passes of prefill_chunk() tokens: a pass runs its projections once over every token it holds,
// whichever sequence they belong to, and its attention a launch per prompt piece (each over its own sequence's cache)
// and one decode launch over the decode rows it holds (`decode`: the first segments, one token each). A segment's
// last position picks its token on the device (pick_slot), or its logits (the last position's, or every position's
// with all_logits: one segment only) go to its host buffer. Queued on the stream, not waited for.
void CudaQwenEngine::prefill(const std::vector<PrefillSegment> & segs, size_t ids_offset, bool all_logits, const DecodeRows * decode) {
    const ModelConfig & cfg = model_->config;
    const int H = cfg.hidden_size, V = cfg.vocab_size, QD = cfg.q_dim();
    const float eps = float(cfg.rms_norm_eps);
    QINFER_CHECK(!all_logits || segs.size() == 1) << "prefill: every position's logits for one segment only";
    size_t total = 0, n_decode = 0;
    int longest = 0;
    bool slots = false;
    for (size_t i = 0; i < segs.size(); i++) {
        const PrefillSegment & s = segs[i];
        QINFER_CHECK(s.n > 0 && s.table) << "prefill: a segment needs tokens and a block table";
        QINFER_CHECK(segs.size() == 1 || s.table_row >= 0) << "prefill: packed segments need their row of the batch tables";
        QINFER_CHECK(!s.decode || (decode && s.n == 1 && n_decode == i && s.table_row == int(i))) << "prefill: decode rows come first, one token each, in table row order";
        QINFER_CHECK(s.pick_slot < 0 || pooled_) << "prefill: device picks need the pool's buffers";
        n_decode += s.decode;
        slots = slots || s.pick_slot >= 0;
        total += size_t(s.n);
        longest = std::max(longest, s.pos0 + s.n);
    }
    if (total == 0) return;
    const int chunk = int(std::min<size_t>(total, size_t(prefill_chunk())));
    ensure_workspace(chunk);
    // The quantized projections' scratch at a pass's rows (K splits' sums, gathered inputs), as prepare_batch sizes it
    // for static batches: without it qgemm_mma ran short prompts' qkv, o_proj and down unsplit. (reserve_batch and
    // make_pool size it ahead, for every pass they allow.)
    if (ensure_quant_scratch(chunk) && pooled_) drop_pool_graphs();  // captured with the old scratch
    // Over a quantized cache, each piece's attention runs the bf16 kernels on its sequence's cache dequantized so far
    // (ensure_prefill_kv); the buffers hold the longest sequence's blocks.
    const bool via_bf16 = ensure_prefill_kv(longest);
    // Key splits of the attention's last wave (model/prefill_splits.h).
    cuda::PrefillSplitScratch split;
    if (ensure_attn_split(longest)) split = {attn_split_.get(), attn_split_.bytes(), 0};
    // Logits rows at a time: the pool's buffers hold pool_rows_ (and the picks' scratch as many).
    const int logit_rows = pooled_ ? pool_rows_ : int(all_logits ? chunk : std::min<size_t>(segs.size(), size_t(chunk)));
    logits_.ensure(size_t(logit_rows) * V * sizeof(float), "logits");
    // Packed passes: per token its position and its row of the batch tables, the rows whose logits are wanted and
    // their pick slots, staged per pass (int [4 * chunk] on the device, [4 * total] pinned: a pass's staging is not
    // reused in a call).
    const bool staged_passes = segs.size() > 1 || slots;
    if (staged_passes) {
        pack_.ensure(4 * size_t(chunk) * sizeof(int), "workspace");
        if (pack_host_.bytes() < 4 * total * sizeof(int)) {
            CUDA_CHECK(cudaStreamSynchronize(stream_));  // the old buffer may still be read by queued copies
            pack_host_ = cuda::HostMappedBuffer(4 * total * sizeof(int), "prompt positions");
        }
    }
    const int * ids_host = static_cast<const int *>(ids_host_.host()) + ids_offset;
    const bool profile = env().profile;
    profile_decode_ = profile;
    if (profile && total > 1) prof_.begin(stream_);
    size_t seg_i = 0;
    int seg_from = 0;
    for (size_t off = 0; off < total; off += size_t(chunk)) {
        const int c = int(std::min<size_t>(size_t(chunk), total - off));
        std::vector<PassPiece> pieces;
        for (int t = 0; t < c;) {
            const int take = std::min(c - t, segs[seg_i].n - seg_from);
            pieces.push_back({seg_i, t, seg_from, take});
            t += take;
            seg_from += take;
            if (seg_from == segs[seg_i].n) {
                seg_i++;
                seg_from = 0;
            }
        }
        const bool packed = pieces.size() > 1;
        // The prompt chunks' attention pieces (over a bf16 cache: over a quantized one each runs on its own dequantization).
        std::vector<cuda::PrefillPiece> attn_pieces;
        for (const PassPiece & pc : pieces) {
            const PrefillSegment & s = segs[pc.seg];
            if (s.decode || via_bf16) continue;
            cuda::PrefillPiece a;
            a.q = q_.as<bf16>() + size_t(pc.first) * QD;
            a.out = attn_.as<bf16>() + size_t(pc.first) * QD;
            a.block_table = s.table;
            a.n = pc.n;
            a.pos0 = s.pos0 + pc.from;
            attn_pieces.push_back(a);
        }
        // Rows whose logits are wanted: each piece that ends its segment, if the segment asks for them or its token.
        std::vector<size_t> want;
        size_t pass_decode = 0;  // the pass's decode rows: its first pieces
        for (size_t p = 0; p < pieces.size(); p++) {
            const PrefillSegment & s = segs[pieces[p].seg];
            pass_decode += s.decode;
            if ((s.logits || s.pick_slot >= 0) && pieces[p].from + pieces[p].n == s.n) want.push_back(p);
        }
        int * pos_dev = pack_.as<int>(), * row_dev = pos_dev + chunk, * want_dev = row_dev + chunk, * slot_dev = want_dev + chunk;
        if (staged_passes) {
            // positions [c], rows [c], wanted rows [want], their slots [want]
            int * staged = static_cast<int *>(pack_host_.host()) + 4 * off;
            for (const PassPiece & pc : pieces) {
                const PrefillSegment & s = segs[pc.seg];
                for (int i = 0; i < pc.n; i++) {
                    staged[pc.first + i] = s.pos0 + pc.from + i;
                    staged[c + pc.first + i] = s.table_row;
                }
            }
            for (size_t w = 0; w < want.size(); w++) {
                staged[2 * c + int(w)] = pieces[want[w]].first + pieces[want[w]].n - 1;
                staged[3 * c + int(w)] = segs[pieces[want[w]].seg].pick_slot;
            }
            if (packed) {
                CUDA_CHECK(cudaMemcpyAsync(pos_dev, staged, size_t(c) * sizeof(int), cudaMemcpyHostToDevice, stream_));
                CUDA_CHECK(cudaMemcpyAsync(row_dev, staged + c, size_t(c) * sizeof(int), cudaMemcpyHostToDevice, stream_));
                CUDA_CHECK(cudaMemcpyAsync(want_dev, staged + 2 * c, want.size() * sizeof(int), cudaMemcpyHostToDevice, stream_));
            }
            CUDA_CHECK(cudaMemcpyAsync(slot_dev, staged + 3 * c, want.size() * sizeof(int), cudaMemcpyHostToDevice, stream_));
        }
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
            cuda::QkvRopeArgs r;
            if (packed) {
                r = rope_args(l, kv_layer(l, batch_tables_.as<int>(), batch_stride_), c);
                r.pos_dev = pos_dev;
                r.row_seq = row_dev;
            } else {
                r = rope_args(l, kv_layer(l, segs[pieces[0].seg].table), c);
                r.pos0 = segs[pieces[0].seg].pos0 + pieces[0].from;
            }
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
            if (pass_decode > 0) {
                // The decode rows of this pass (tokens 0.. of it): rows d0.. of the batch tables and of len_dev.
                const int d0 = int(pieces[0].seg), rows = int(pass_decode);
                const int splits = pool_decode_splits(decode->max_len, rows_bucket(rows));
                const cuda::DecodeScratch scratch{split_out_.as<float>(), split_ml_.as<float>(), splits};
                cuda::attention_decode(q_.as<bf16>(), kv_layer(l, batch_tables_.as<int>() + size_t(d0) * batch_stride_, batch_stride_),
                                       decode->len_dev + d0, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, scratch,
                                       attn_.as<bf16>(), stream_, rows, cuda::DecodeKernel::Auto, decode->short_ctx);
            }
            // The chunks' attention together (one launch where the kernel takes pieces); over a quantized cache each
            // chunk on its sequence's cache dequantized so far.
            cuda::attention_prefill_pieces(attn_pieces.data(), int(attn_pieces.size()), kv_layer(l, nullptr), cfg.num_attention_heads,
                                           cfg.num_key_value_heads, cfg.head_dim, stream_, &split);
            for (const PassPiece & pc : pieces) {
                const PrefillSegment & s = segs[pc.seg];
                if (s.decode || !via_bf16) continue;
                const int pos0 = s.pos0 + pc.from;
                const int n_blocks = (pos0 + pc.n + block_size_ - 1) / block_size_;
                cuda::kv_dequantize_blocks(kv_layer(l, s.table), n_blocks, cfg.num_key_value_heads, cfg.head_dim, prefill_k_.as<bf16>(),
                                           prefill_v_.as<bf16>(), stream_);
                const cuda::KVLayer attn_cache{prefill_k_.as<bf16>(), prefill_v_.as<bf16>(), prefill_table_.as<int>(), block_size_, 0, {},
                                               int64_t(n_blocks) * cfg.num_key_value_heads * block_size_};
                cuda::attention_prefill(q_.as<bf16>() + size_t(pc.first) * QD, attn_cache, pc.n, pos0, cfg.num_attention_heads,
                                        cfg.num_key_value_heads, cfg.head_dim, attn_.as<bf16>() + size_t(pc.first) * QD, stream_);
            }
            prof_.mark("attention");
            linear(o_input(L, c), c, L.o, tmp_.as<bf16>());
            prof_.mark("o_proj gemm");
            if (!L.o_whole) reduce(tmp_.as<bf16>(), size_t(c) * H);
            cuda::add_rms_norm(x, tmp_.as<bf16>(), L.post_norm.as<bf16>(), eps, c, H, xn, stream_);
            prof_.mark("add/rms_norm");
            if (L.moe) {
                moe(L, c, xn, x);
                pending = false;
            } else {
                mlp(L.mlp, xn, c, gu_.as<bf16>(), act_.as<bf16>(), tmp_.as<bf16>());
                reduce(tmp_.as<bf16>(), size_t(c) * H);
                pending = true;
            }
        }
        if (pending) cuda::add_residual(x, tmp_.as<bf16>(), int64_t(c) * H, stream_);
        prof_.mark("add/rms_norm");
        // Logits: every position of the pass (all_logits), or the last position of each segment that ends here.
        if (all_logits ? !segs[0].logits : want.empty()) continue;
        const int rows = all_logits ? c : int(want.size());
        const bf16 * rows_in = xn;
        if (all_logits || !packed) {
            const float * x_rows = x + size_t(all_logits ? 0 : c - 1) * H;
            cuda::rms_norm(x_rows, final_norm_.as<bf16>(), eps, rows, H, xn, stream_);
        } else {
            cuda::rms_norm(x, final_norm_.as<bf16>(), eps, c, H, xn, stream_);
            cuda::gather_rows(xn, want_dev, rows, H, tmp_.as<bf16>(), stream_);  // tmp_ is free after the residual add
            rows_in = tmp_.as<bf16>();
        }
        for (int r0 = 0; r0 < rows; r0 += logit_rows) {
            const int m = std::min(logit_rows, rows - r0);
            if (m <= k_dense_gemv_max_m) {
                cuda::GemvArgs a;
                a.w = lm_head_;
                a.n = V;
                a.k = H;
                a.x = rows_in + size_t(r0) * H;
                a.m = m;
                a.y = logits_.get();
                cuda::gemv(a, cuda::GemvIn::Bf16, cuda::GemvOut::F32, stream_);
            } else {
                cuda::gemm(rows_in + size_t(r0) * H, lm_head_, m, V, H, logits_.get(), true, stream_);
            }
            prof_.mark("final norm, lm_head");
            if (all_logits) {
                CUDA_CHECK(cudaMemcpyAsync(segs[0].logits + (off + size_t(r0)) * V, logits_.get(), size_t(m) * V * sizeof(float),
                                           cudaMemcpyDeviceToHost, stream_));
                continue;
            }
            if (slots) {
                cuda::pick_slots(logits_.as<float>(), m, V, slot_dev + r0, row_picks_.as<cuda::RowPick>(), pick_history_.as<int>(),
                                 sample_work_.as<float>(), sample_counts_.as<int>(), slot_tokens_.as<int>(), stream_);
            }
            for (int w = r0; w < r0 + m; w++) {
                const PrefillSegment & s = segs[pieces[want[size_t(w)]].seg];
                if (s.pick_slot >= 0) continue;
                CUDA_CHECK(cudaMemcpyAsync(s.logits, logits_.as<float>() + size_t(w - r0) * V, size_t(V) * sizeof(float), cudaMemcpyDeviceToHost,
                                           stream_));
            }
        }
    }
    if (profile && total > 1) {
        prof_.mark("logits copy");
        prof_.report("prefill (" + std::to_string(total) + " tokens, passes of " + std::to_string(chunk) + ")");
    }
}

}  // namespace qinfer::cuda_engine
