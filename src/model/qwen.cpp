#include "model/qwen.h"

#include <algorithm>
#include <cmath>

#include "backends/cpu/ops.h"
#include "core/check.h"
#include "core/parallel.h"
#include "model/quant_repack.h"

namespace qinfer {

namespace {
KVCacheShape cache_shape(const ModelConfig & c, const EngineOptions & opt) {
    KVCacheShape s;
    s.n_layers = c.num_hidden_layers;
    s.n_kv_heads = c.num_key_value_heads;
    s.head_dim = c.head_dim;
    s.block_size = 16;
    int ctx = opt.max_context > 0 ? opt.max_context : std::min(c.max_context(), 4096);
    s.n_blocks = std::max(1, opt.max_sequences) * ((ctx + s.block_size - 1) / s.block_size);
    // The reference keeps fp32 unless asked: transformers' cache holds the model's dtype, fp32 for the goldens.
    s.dtype = opt.kv_dtype == "auto" ? KVDType::F32 : parse_kv_dtype(opt.kv_dtype);
    return s;
}
}  // namespace

CpuQwenEngine::CpuQwenEngine(std::unique_ptr<Model> model, const EngineOptions & opt)
    : model_(std::move(model)), kv_(cache_shape(model_->config, opt)) {
    set_threads(opt.threads);
    rope_ = compute_rope_freqs(model_->config, 0);
    // fp8 caches take the checkpoint's per-layer scales where it has them (vLLM's k_scale / v_scale).
    if (kv_.shape().dtype == KVDType::FP8) {
        for (int l = 0; l < model_->config.num_hidden_layers; l++) {
            for (bool value : {false, true}) {
                const float s = checkpoint_kv_scale(model_->weights.layers[size_t(l)].self_attn, value);
                if (s > 0) kv_.set_fp8_scale(l, value, s);
            }
        }
    }
    // Quantized projections: rows repacked once (GPTQ stores codes packed down K, column by column), where the
    // layout allows; the values are the format's, exactly (tests/unit/test_quant_repack.cpp).
    for_each_linear(model_->weights, [](Linear & l) {
        if (!l.quantized() || !cuda_quant_unsupported(l).empty()) return;
        try {
            l.cpu_rows = std::make_shared<RepackedQuant>(repack_quant({&l}, false));
        } catch (const Error &) {
            // Irregular act-order groups or scales that are not fp16: the stored layout is read directly.
        }
    });
}

int CpuQwenEngine::new_sequence(int max_tokens) {
    int seq = kv_.table().add_sequence();
    try {
        kv_.table().reserve(seq, max_tokens);
    } catch (...) {
        kv_.table().free_sequence(seq);
        throw;
    }
    return seq;
}

void CpuQwenEngine::free_sequence(int seq) { kv_.table().free_sequence(seq); }

// Attention over the cache as stored: the context's K and V are read (dequantized) once per layer.
void CpuQwenEngine::attention(int layer, const std::vector<int> & blocks, int n, int pos0, const float * q, float * out) const {
    const ModelConfig & c = model_->config;
    const int ctx = pos0 + n;
    const size_t token = size_t(c.num_key_value_heads) * c.head_dim;
    std::vector<float> k(size_t(ctx) * token), v(size_t(ctx) * token);  // fp32 [ctx, n_kv_head, head_dim]
    kv_.read(layer, blocks, ctx, k.data(), v.data());
    cpu::attention(
        q, n, pos0, c.num_attention_heads, c.num_key_value_heads, c.head_dim, [&](int j) { return k.data() + size_t(j) * token; },
        [&](int j) { return v.data() + size_t(j) * token; }, out);
}

// SwiGLU: down(silu(gate(x)) * up(x)). x: fp32 [n, hidden]; out: fp32 [n, hidden].
void CpuQwenEngine::mlp(const MlpWeights & w, int n, const float * x, float * out) const {
    const int inter = w.gate_proj.out_features;
    std::vector<float> gate(size_t(n) * inter), up(size_t(n) * inter);  // fp32 [n, inter]
    cpu::linear(x, n, w.gate_proj, gate.data());
    cpu::linear(x, n, w.up_proj, up.data());
    cpu::silu_mul(gate.data(), up.data(), int64_t(n) * inter, gate.data());
    cpu::linear(gate.data(), n, w.down_proj, out);
}

// Sparse MoE block (Qwen2MoeSparseMoeBlock / Qwen3MoeSparseMoeBlock): softmax over all experts in fp32, top-k,
// optional renormalisation, weighted sum of the chosen experts, plus sigmoid-gated shared expert.
void CpuQwenEngine::moe(const MoeWeights & w, int n, const float * x, float * out) const {
    const ModelConfig & c = model_->config;
    const int H = c.hidden_size, E = c.num_experts, k = c.num_experts_per_tok;
    Linear router;
    router.in_features = H;
    router.out_features = E;
    router.weight = w.gate;
    std::vector<float> logits(size_t(n) * E);  // fp32 [n, E]
    cpu::linear(x, n, router, logits.data());
    std::fill(out, out + int64_t(n) * H, 0.0f);
    std::vector<float> expert_out(static_cast<size_t>(H));
    std::vector<int> ids(static_cast<size_t>(k));
    std::vector<float> weights(static_cast<size_t>(k));
    for (int t = 0; t < n; t++) {
        cpu::moe_route(logits.data() + int64_t(t) * E, E, k, c.norm_topk_prob, ids.data(), weights.data());
        const float * xt = x + int64_t(t) * H;
        float * ot = out + int64_t(t) * H;
        for (int i = 0; i < k; i++) {
            mlp(w.experts[size_t(ids[size_t(i)])], 1, xt, expert_out.data());
            for (int j = 0; j < H; j++) ot[j] += weights[size_t(i)] * expert_out[size_t(j)];
        }
        if (w.has_shared_expert) {
            mlp(w.shared_expert, 1, xt, expert_out.data());
            float g = cpu::dot_row(w.shared_expert_gate, 0, xt, H);
            float s = 1.0f / (1.0f + std::exp(-g));
            for (int j = 0; j < H; j++) ot[j] += s * expert_out[size_t(j)];
        }
    }
}

void CpuQwenEngine::forward(int seq, const std::vector<int> & tokens, bool all_logits, std::vector<float> & logits) {
    QINFER_CHECK(!tokens.empty()) << "forward needs at least one token";
    run({Segment{seq, nullptr, kv_.table().length(seq), int(tokens.size())}}, tokens, all_logits, logits);
}

void CpuQwenEngine::forward_batch(const std::vector<int> & seqs, const std::vector<int> & tokens, std::vector<float> & logits) {
    check_batch(seqs, tokens);
    std::vector<Segment> segs;
    for (int s : seqs) segs.push_back(Segment{s, nullptr, kv_.table().length(s), 1});
    run(segs, tokens, false, logits);
}

// The forward pass over rows of several sequences at once: each segment appends its rows (consecutive in `tokens`)
// to its sequence. Projections and MLPs run on all rows together; RoPE, the cache and attention per segment.
void CpuQwenEngine::run(const std::vector<Segment> & segs, const std::vector<int> & tokens, bool all_logits, std::vector<float> & logits) {
    const ModelConfig & c = model_->config;
    const ModelWeights & W = model_->weights;
    const int n = int(tokens.size());
    const int H = c.hidden_size, d = c.head_dim, n_head = c.num_attention_heads, n_kv = c.num_key_value_heads;
    const float eps = float(c.rms_norm_eps);

    std::vector<float> cos(size_t(n) * d), sin(size_t(n) * d);  // fp32 [n, head_dim]
    std::vector<int> row0(segs.size());                          // first row of each segment
    for (size_t s = 0, row = 0; s < segs.size(); row += size_t(segs[s].n), s++) {
        const Segment & g = segs[s];
        row0[s] = int(row);
        if (g.seq >= 0 && g.pos0 + g.n > int(kv_.table().blocks(g.seq).size()) * kv_.shape().block_size) kv_.table().reserve(g.seq, g.pos0 + g.n);
        RopeFreqs dyn;
        const RopeFreqs * rope = &rope_;
        if (c.rope_scaling.type == RopeType::Dynamic) {
            dyn = compute_rope_freqs(c, g.pos0 + g.n);
            rope = &dyn;
        }
        for (int t = 0; t < g.n; t++) {
            const size_t r = row + size_t(t);
            rope_cos_sin(*rope, g.pos0 + t, cos.data() + r * d, sin.data() + r * d);
        }
    }

    std::vector<float> x(size_t(n) * H);                    // fp32 [n, hidden]: the residual stream
    std::vector<float> xn(size_t(n) * H);                   // fp32 [n, hidden]: normed input of a block
    std::vector<float> q(size_t(n) * n_head * d);           // fp32 [n, n_head, head_dim]
    std::vector<float> k(size_t(n) * n_kv * d);             // fp32 [n, n_kv_head, head_dim]
    std::vector<float> v(size_t(n) * n_kv * d);             // fp32 [n, n_kv_head, head_dim]
    std::vector<float> attn(size_t(n) * n_head * d);        // fp32 [n, n_head, head_dim]
    std::vector<float> block_out(size_t(n) * H);            // fp32 [n, hidden]

    embed(tokens, x.data());
    for (int l = 0; l < c.num_hidden_layers; l++) {
        const LayerWeights & L = W.layers[size_t(l)];
        const AttentionWeights & A = L.self_attn;
        cpu::rms_norm(x.data(), L.input_layernorm, eps, n, H, xn.data());
        cpu::linear(xn.data(), n, A.q_proj, q.data());
        cpu::linear(xn.data(), n, A.k_proj, k.data());
        cpu::linear(xn.data(), n, A.v_proj, v.data());
        if (c.qk_norm) {
            cpu::rms_norm(q.data(), A.q_norm, eps, n * n_head, d, q.data());
            cpu::rms_norm(k.data(), A.k_norm, eps, n * n_kv, d, k.data());
        }
        cpu::rope(q.data(), n, n_head, d, cos.data(), sin.data());
        cpu::rope(k.data(), n, n_kv, d, cos.data(), sin.data());
        for (size_t s = 0; s < segs.size(); s++) {
            const Segment & g = segs[s];
            const size_t r = size_t(row0[s]);
            const std::vector<int> & blocks = g.seq >= 0 ? kv_.table().blocks(g.seq) : *g.blocks;
            kv_.write(l, blocks, g.pos0, g.n, k.data() + r * n_kv * d, v.data() + r * n_kv * d);
            attention(l, blocks, g.n, g.pos0, q.data() + r * n_head * d, attn.data() + r * n_head * d);
        }
        cpu::linear(attn.data(), n, A.o_proj, block_out.data());
        if (tp_) tp_->all_reduce(block_out.data(), size_t(n) * H);
        cpu::add(x.data(), block_out.data(), int64_t(n) * H);

        cpu::rms_norm(x.data(), L.post_attention_layernorm, eps, n, H, xn.data());
        if (L.is_moe) {
            moe(L.moe, n, xn.data(), block_out.data());
        } else {
            mlp(L.mlp, n, xn.data(), block_out.data());
        }
        if (tp_) tp_->all_reduce(block_out.data(), size_t(n) * H);
        cpu::add(x.data(), block_out.data(), int64_t(n) * H);
    }
    for (const Segment & g : segs) {
        if (g.seq >= 0) kv_.table().set_length(g.seq, g.pos0 + g.n);
    }

    // Logits of every row, or of each segment's last row.
    std::vector<float> x_out;  // fp32 [n_out, hidden]
    if (all_logits) {
        x_out = std::move(x);
    } else {
        for (size_t s = 0; s < segs.size(); s++) {
            const float * last = x.data() + size_t(row0[s] + segs[s].n - 1) * H;
            x_out.insert(x_out.end(), last, last + H);
        }
    }
    const int n_out = int(x_out.size() / size_t(H));
    cpu::rms_norm(x_out.data(), W.norm, eps, n_out, H, xn.data());
    Linear lm_head;
    lm_head.in_features = H;
    lm_head.out_features = tp_ ? n_vocab_ : c.vocab_size;
    lm_head.weight = W.lm_head;
    logits.resize(size_t(n_out) * c.vocab_size);
    if (!tp_) {
        cpu::linear(xn.data(), n_out, lm_head, logits.data());
        return;
    }
    std::vector<float> mine(size_t(n_out) * n_vocab_);  // fp32 [n_out, this rank's vocabulary rows]
    cpu::linear(xn.data(), n_out, lm_head, mine.data());
    tp_->all_gather_cols(mine.data(), n_out, vocab0_, n_vocab_, c.vocab_size, logits.data());
}

// The token embedding into x (fp32 [n, hidden]); a tensor-parallel rank looks up the ids among its rows, zeros for the
// others, and the ranks' rows are summed.
void CpuQwenEngine::embed(const std::vector<int> & tokens, float * x) const {
    const ModelConfig & c = model_->config;
    const int n = int(tokens.size()), H = c.hidden_size;
    if (!tp_) {
        cpu::embedding(model_->weights.embed_tokens, tokens.data(), n, x);
        return;
    }
    std::vector<int> local(tokens.size());
    for (size_t i = 0; i < tokens.size(); i++) {
        if (tokens[i] < 0 || tokens[i] >= c.vocab_size) QINFER_FAIL() << "token id " << tokens[i] << " is outside the vocabulary [0, " << c.vocab_size << ")";
        const int id = tokens[i] - vocab0_;
        local[i] = id >= 0 && id < n_vocab_ ? id : 0;
    }
    cpu::embedding(model_->weights.embed_tokens, local.data(), n, x);
    for (size_t i = 0; i < tokens.size(); i++) {
        if (tokens[i] < vocab0_ || tokens[i] >= vocab0_ + n_vocab_) std::fill(x + i * H, x + (i + 1) * H, 0.0f);
    }
    tp_->all_reduce(x, size_t(n) * H);
}

void CpuQwenEngine::join_tensor_parallel(TpLink * link, int vocab0, int n_vocab) {
    QINFER_CHECK(link && vocab0 >= 0 && n_vocab > 0 && vocab0 + n_vocab <= model_->config.vocab_size) << "join_tensor_parallel: bad vocabulary rows";
    tp_ = link;
    vocab0_ = vocab0;
    n_vocab_ = n_vocab;
}

// The pool: opt.n_blocks, or room for every row at the longest sequence within 4 GB of cache (the CPU has no device
// memory to measure), and never less than one longest sequence.
PoolInfo CpuQwenEngine::make_pool(const PoolOptions & opt) {
    const ModelConfig & c = model_->config;
    PoolInfo info;
    info.block_size = kv_.shape().block_size;
    info.max_seq_tokens = opt.max_seq_tokens > 0 ? std::min(opt.max_seq_tokens, c.max_context()) : std::min(c.max_context(), 4096);
    const int per_seq = (info.max_seq_tokens + info.block_size - 1) / info.block_size;
    KVCacheShape shape = kv_.shape();
    const double block_bytes = 2.0 * shape.n_layers * shape.n_kv_heads * shape.head_dim * shape.block_size * kv_dtype_bytes_per_element(shape.dtype);
    const int fits = int(std::min(4e9 / block_bytes, 1e8));
    info.n_blocks = opt.n_blocks > 0 ? opt.n_blocks : std::max(per_seq, std::min(std::max(1, opt.max_rows) * per_seq, fits));
    shape.n_blocks = info.n_blocks;
    CpuKVCache fresh(shape);
    for (int l = 0; l < c.num_hidden_layers; l++) {
        for (bool value : {false, true}) {
            if (shape.dtype == KVDType::FP8 && kv_.fp8_scale(l, value) > 0) fresh.set_fp8_scale(l, value, kv_.fp8_scale(l, value));
        }
    }
    kv_ = std::move(fresh);
    pooled_ = true;
    return info;
}

// One continuous-batching step: every segment's rows through the same forward pass as forward_batch; each picking
// segment's last-row logits go back to the caller, who samples on the host (the specification's Sampler).
void CpuQwenEngine::step(const std::vector<StepSegment> & segs, const std::vector<int> & tokens, StepOutput & out) {
    QINFER_CHECK(pooled_) << "step() before make_pool()";
    std::vector<Segment> run_segs;
    size_t rows = 0;
    for (const StepSegment & s : segs) {
        QINFER_CHECK(s.blocks && s.n > 0 && s.pos0 >= 0) << "step: a segment needs its blocks and at least one token";
        QINFER_CHECK(size_t(s.pos0 + s.n) <= s.blocks->size() * size_t(kv_.shape().block_size)) << "step: a segment outgrew its blocks";
        run_segs.push_back(Segment{-1, s.blocks, s.pos0, s.n});
        rows += size_t(s.n);
    }
    QINFER_CHECK(rows == tokens.size()) << "step: " << tokens.size() << " tokens for segments of " << rows << " rows";
    const int V = model_->config.vocab_size;
    for (int t : tokens) {
        if (t < 0 || t >= V) QINFER_FAIL() << "token id " << t << " is outside the vocabulary [0, " << V << ")";
    }
    std::vector<float> last;  // fp32 [segments, vocab]
    run(run_segs, tokens, false, last);
    out.tokens.assign(segs.size(), -1);
    out.logits_row.assign(segs.size(), -1);
    out.logits.clear();
    int n_rows = 0;
    for (size_t i = 0; i < segs.size(); i++) {
        if (!segs[i].pick) continue;
        out.logits.insert(out.logits.end(), last.begin() + long(i) * V, last.begin() + long(i + 1) * V);
        out.logits_row[i] = n_rows++;
    }
}

std::unique_ptr<Engine> make_cpu_engine(const std::string & model_dir, const EngineOptions & opt) {
    return std::make_unique<CpuQwenEngine>(load_model(model_dir, load_options(opt)), opt);
}

}  // namespace qinfer
