// Decode steps of the CUDA engine (class in model/qwen_cuda.h): one sequence or a static batch per step, fused
// GEMVs for a few rows and cuBLASLt beyond, the next token picked on the device (argmax or sampling) and the whole
// step captured in a CUDA graph.
#include <algorithm>

#include "model/qwen_cuda.h"

namespace qinfer::cuda_engine {

// Makes `seqs` the decoding batch: their block tables side by side on the device, tokens/positions/lengths in the
// decode state. false when a sequence has no cache room for n_steps more tokens.
bool CudaQwenEngine::prepare_batch(const std::vector<int> & seqs, const std::vector<int> & tokens, int n_steps) {
    check_batch(seqs, tokens);
    if (int(seqs.size()) > kv_seqs_) return false;
    for (int s : seqs) {
        if (table_->length(s) + n_steps > int(table_->blocks(s).size()) * block_size_) return false;
    }
    const int B = int(seqs.size());
    decode_short_ = true;
    for (int s : seqs) decode_short_ = decode_short_ && table_->length(s) + n_steps <= cuda::k_short_decode_keys;
    if (seqs != batch_seqs_) {
        batch_stride_ = kv_tokens_ / block_size_;
        std::vector<int> tables(size_t(B) * batch_stride_, 0);
        for (int b = 0; b < B; b++) {
            const std::vector<int> & bl = table_->blocks(seqs[size_t(b)]);
            std::copy(bl.begin(), bl.end(), tables.begin() + long(b) * batch_stride_);
        }
        CUDA_CHECK(cudaMemcpyAsync(batch_tables_.get(), tables.data(), tables.size() * sizeof(int), cudaMemcpyHostToDevice, stream_));
        batch_seqs_ = seqs;
    }
    std::vector<int> state(3 * size_t(B) + 1);  // tokens [B], positions [B], step, lengths [B]
    for (int b = 0; b < B; b++) {
        const int pos = table_->length(seqs[size_t(b)]);
        state[size_t(b)] = tokens[size_t(b)];
        state[size_t(B + b)] = pos;
        state[size_t(2 * B + 1 + b)] = pos + 1;
    }
    CUDA_CHECK(cudaMemcpyAsync(state_.get(), state.data(), state.size() * sizeof(int), cudaMemcpyHostToDevice, stream_));
    // The host vector must outlive the copy.
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    ensure_workspace(B);
    logits_.ensure(size_t(B) * model_->config.vocab_size * sizeof(float), "logits");
    // The quantized projections' scratch at B rows (K splits' partial sums, gathered inputs), here, outside the
    // captured step, as the continuous-batching pool sizes it (qwen_cuda_paged.cpp). Without it qgemm_mma ran 7B's
    // qkv, o_proj and down unsplit on 28-36 blocks: GPTQ-Int4 static batch 16 at 0.88x of BF16 on an H200.
    ensure_quant_scratch(B);
    return true;
}

// One decode step of the prepared batch (B tokens, one per sequence), entirely on the device, so it can be captured
// into a graph. Up to k_gemv_max_m rows the projections are GEMVs with RMSNorm and their epilogues fused (the batch-1
// path); larger batches run the prefill ops (RMSNorm, cuBLASLt, SiLU-mul) on all rows. `end`: the logits are left in
// logits_ (fp32 [B, vocab]), or the argmax or a sampled token advances the decode state.
void CudaQwenEngine::decode_step(int B, StepEnd end) {
    const ModelConfig & cfg = model_->config;
    const int H = cfg.hidden_size;
    const float eps = float(cfg.rms_norm_eps);
    int * tokens = state_.as<int>();
    int * pos = tokens + B;
    int * step = tokens + 2 * B;
    int * len = step + 1;
    float * x = x_.as<float>();
    bf16 * xn = xn_.as<bf16>();
    // Fused GEMVs up to k_gemv_max_m rows where the projections are quantized (or MoE layers route), one row for bf16.
    const bool fused = B <= (layers_[0].qkv.quantized || cfg.num_experts > 0 ? k_gemv_max_m : k_dense_gemv_max_m);
    cuda::embedding(embed_table_, tokens, B, H, x, stream_);
    prof_.mark("embedding");
    cuda::DecodeScratch scratch{split_out_.as<float>(), split_ml_.as<float>(), max_splits_};
    bool pending = false;  // unfused: tmp_ holds an MLP output not yet added to x
    for (int l = 0; l < cfg.num_hidden_layers; l++) {
        const DevLayer & L = layers_[size_t(l)];
        cuda::QkvRopeArgs r = rope_args(l, kv_layer_batch(l), B);
        r.pos_dev = pos;
        if (fused) {
            cuda::GemvArgs a;
            a.n = L.qkv.n;
            a.k = H;
            a.x = x;
            a.m = B;
            a.norm_w = L.input_norm.as<bf16>();
            a.eps = eps;
            a.y = qkv_.get();
            project(L.qkv, a, cuda::GemvIn::NormF32, cuda::GemvOut::Bf16);
        } else {
            if (pending) cuda::add_rms_norm(x, tmp_.as<bf16>(), L.input_norm.as<bf16>(), eps, B, H, xn, stream_);
            else cuda::rms_norm(x, L.input_norm.as<bf16>(), eps, B, H, xn, stream_);
            pending = false;
            linear(xn, B, L.qkv, qkv_.as<bf16>());
        }
        prof_.mark("qkv gemv");
        cuda::qkv_rope_cache(r, stream_);
        prof_.mark("bias/norm/rope/cache");
        cuda::attention_decode(q_.as<bf16>(), r.cache, len, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, scratch,
                               attn_.as<bf16>(), stream_, B, cuda::DecodeKernel::Auto, decode_short_);
        prof_.mark("attention");
        // MoE decode steps the block's launches take normalise x themselves (no RMSNorm kernel on the chain).
        cuda::MoeNormIn moe_norm;
        if (fused && L.moe_normalises(B, cfg.num_experts_per_tok)) moe_norm = cuda::MoeNormIn{x, L.post_norm.as<bf16>(), eps};
        if (fused) {
            cuda::GemvArgs a;
            a.n = L.o.n;
            a.k = L.o.k;
            a.x = o_input(L, B);
            a.m = B;
            float * part = peer_partial(0, size_t(B) * H);
            a.y = part ? part : x;
            project(L.o, a, cuda::GemvIn::Bf16, part || (partial_only() && !L.o_whole) ? cuda::GemvOut::F32 : cuda::GemvOut::AddF32);
            if (part) add_partials(x, 0, size_t(B) * H);
            else if (!L.o_whole) reduce(x, size_t(B) * H);
            if (L.moe && !moe_norm.x) cuda::rms_norm(x, L.post_norm.as<bf16>(), eps, B, H, xn, stream_);
        } else {
            linear(o_input(L, B), B, L.o, tmp_.as<bf16>());
            if (!L.o_whole) reduce(tmp_.as<bf16>(), size_t(B) * H);
            cuda::add_rms_norm(x, tmp_.as<bf16>(), L.post_norm.as<bf16>(), eps, B, H, xn, stream_);
        }
        prof_.mark("o_proj gemv");
        if (L.moe) {
            moe(L, B, xn, x, /*decode=*/true, moe_norm);
        } else if (fused) {
            cuda::GemvArgs a;
            a.n = L.mlp.down.k;
            a.k = H;
            a.x = x;
            a.m = B;
            a.norm_w = L.post_norm.as<bf16>();
            a.eps = eps;
            a.y = act_.get();
            // The activations between the two quantized GEMVs in the order down's B fragments read them.
            const bool pair_io = L.mlp.gate_up.quantized && L.mlp.down.quantized && cuda::qgemv_pair_io_ok(L.mlp.gate_up.q, L.mlp.down.q);
            a.pair_io = pair_io;
            project(L.mlp.gate_up, a, cuda::GemvIn::NormF32, cuda::GemvOut::SiluMulBf16);
            prof_.mark("gate_up gemv");
            a = cuda::GemvArgs{};
            a.n = H;
            a.k = L.mlp.down.k;
            a.x = act_.get();
            a.m = B;
            a.pair_io = pair_io;
            float * part = peer_partial(1, size_t(B) * H);
            a.y = part ? part : x;
            project(L.mlp.down, a, cuda::GemvIn::Bf16, part || partial_only() ? cuda::GemvOut::F32 : cuda::GemvOut::AddF32);
            prof_.mark("down gemv");
            if (part) add_partials(x, 1, size_t(B) * H);
            else reduce(x, size_t(B) * H);
        } else {
            mlp(L.mlp, xn, B, gu_.as<bf16>(), act_.as<bf16>(), tmp_.as<bf16>());
            reduce(tmp_.as<bf16>(), size_t(B) * H);
            pending = true;
        }
    }
    if (pending) cuda::add_residual(x, tmp_.as<bf16>(), int64_t(B) * H, stream_);
    decode_logits(B, fused, x, xn);
    if (end == StepEnd::Logits) return;
    if (end == StepEnd::Pick) {
        cuda::pick_rows_advance(logits_.as<float>(), B, cfg.vocab_size, row_picks_.as<cuda::RowPick>(), pick_history_.as<int>(),
                                sample_work_.as<float>(), sample_counts_.as<int>(), tokens, pos, step, len, tokens_out_.as<int>(), stream_);
    } else if (end == StepEnd::Sample) {
        cuda::sample_rows_advance(logits_.as<float>(), B, cfg.vocab_size, graph_valid_, sample_params_, sample_seen_.as<uint8_t>(),
                                  sample_counts_.as<int>(), sample_work_.as<float>(), tokens, pos, step, len, tokens_out_.as<int>(), stream_);
    } else if (B == 1) {
        cuda::argmax_advance(logits_.as<float>(), graph_valid_, argmax_scratch_.as<float>(), tokens, tokens_out_.as<int>(), stream_);
    } else {
        cuda::argmax_rows_advance(logits_.as<float>(), B, cfg.vocab_size, graph_valid_, argmax_scratch_.as<float>(), tokens, pos, step, len,
                                  tokens_out_.as<int>(), stream_);
    }
    prof_.mark("argmax");
}

void CudaQwenEngine::decode_logits(int B, bool fused, const float * x, bf16 * xn) {
    const ModelConfig & cfg = model_->config;
    const int H = cfg.hidden_size;
    const bool split = split_logits(B);
    const int V = split ? cfg.vocab_size / place_.ranks : cfg.vocab_size;  // this rank's rows of lm_head
    const bf16 * w = lm_head_ + (split ? size_t(place_.rank) * V * H : 0);
    // Split: this rank's logits [B, V] land in its chunk of the gather buffer ([ranks, B, V]); one row gathers in place.
    float * y = !split ? logits_.as<float>() : (B == 1 ? logits_.as<float>() : logits_gather_.as<float>()) + size_t(place_.rank) * B * V;
    if (fused && B <= k_dense_gemv_max_m) {
        cuda::GemvArgs a;
        a.w = w;
        a.n = V;
        a.k = H;
        a.x = x;
        a.m = B;
        a.norm_w = final_norm_.as<bf16>();
        a.eps = float(cfg.rms_norm_eps);
        a.y = y;
        cuda::gemv(a, cuda::GemvIn::NormF32, cuda::GemvOut::F32, stream_);
    } else {
        cuda::rms_norm(x, final_norm_.as<bf16>(), float(cfg.rms_norm_eps), B, H, xn, stream_);
        cuda::gemm(xn, w, B, V, H, y, true, stream_);
    }
    prof_.mark("lm_head gemv");
    if (!split) return;
    gather_col_blocks(y, B, size_t(V), true, logits_gather_.get(), logits_.get());
    prof_.mark("logits all-gather");
}

void CudaQwenEngine::forward_batch(const std::vector<int> & seqs, const std::vector<int> & tokens, std::vector<float> & logits) {
    const ModelConfig & cfg = model_->config;
    check_batch(seqs, tokens);
    for (int t : tokens) {
        if (t < 0 || t >= cfg.vocab_size) QINFER_FAIL() << "token id " << t << " is outside the vocabulary [0, " << cfg.vocab_size << ")";
    }
    // Dynamic NTK frequencies depend on each sequence's length: one sequence at a time.
    if (cfg.rope_scaling.type == RopeType::Dynamic) return Engine::forward_batch(seqs, tokens, logits);
    if (!prepare_batch(seqs, tokens, 1)) QINFER_FAIL() << "CUDA backend: a sequence of the batch outgrew the KV cache reserved for it";
    const int B = int(seqs.size());
    decode_step(B, StepEnd::Logits);
    logits.resize(size_t(B) * cfg.vocab_size);
    CUDA_CHECK(cudaMemcpyAsync(logits.data(), logits_.get(), logits.size() * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    for (int s : seqs) table_->set_length(s, table_->length(s) + 1);
}

bool CudaQwenEngine::decode_greedy(int seq, int token, int n_steps, int n_valid, std::vector<int> & out) {
    return decode_greedy_batch({seq}, {token}, n_steps, n_valid, out);
}

bool CudaQwenEngine::decode_greedy_batch(const std::vector<int> & seqs, const std::vector<int> & tokens, int n_steps, int n_valid,
                                         std::vector<int> & out) {
    return run_decode_graph(seqs, tokens, n_steps, n_valid, StepEnd::Argmax, out);
}

// Sampling needs top_k in 1..64 and temperature > 0 (else the host samples); penalties start from the sequence so far.
bool CudaQwenEngine::decode_sampled(const std::vector<int> & seqs, const std::vector<int> & tokens, int n_steps, int n_valid,
                                    const SamplingParams & p, const std::vector<History> & history, std::vector<int> & out) {
    if (!(p.temperature > 0) || p.top_k < 1 || p.top_k > cuda::k_sample_max_k) return false;
    if (history.size() != seqs.size()) QINFER_FAIL() << "decode_sampled: " << history.size() << " histories for " << seqs.size() << " sequences";
    const size_t V = size_t(model_->config.vocab_size), B = seqs.size();
    // Per row: ids seen in the prompt or the output (repetition penalty), counts in the output (presence/frequency).
    std::vector<uint8_t> seen(B * V, 0);
    std::vector<int> counts(B * V, 0);
    for (size_t b = 0; b < B; b++) {
        for (int t : *history[b].prompt) {
            if (t >= 0 && size_t(t) < V) seen[b * V + size_t(t)] = 1;
        }
        for (int t : *history[b].output) {
            if (t < 0 || size_t(t) >= V) continue;
            seen[b * V + size_t(t)] = 1;
            counts[b * V + size_t(t)]++;
        }
    }
    void * before[3] = {sample_seen_.get(), sample_counts_.get(), sample_work_.get()};
    sample_seen_.ensure(seen.size(), "sampling");
    sample_counts_.ensure(counts.size() * sizeof(int), "sampling");
    sample_work_.ensure(B * V * sizeof(float), "sampling");
    if (before[0] != sample_seen_.get() || before[1] != sample_counts_.get() || before[2] != sample_work_.get()) graph_seqs_.clear();
    CUDA_CHECK(cudaMemcpy(sample_seen_.get(), seen.data(), seen.size(), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(sample_counts_.get(), counts.data(), counts.size() * sizeof(int), cudaMemcpyHostToDevice));
    sample_params_ = {p.temperature, p.top_p, p.min_p, p.repetition_penalty, p.presence_penalty, p.frequency_penalty, p.top_k, p.seed};
    return run_decode_graph(seqs, tokens, n_steps, n_valid, StepEnd::Sample, out);
}

// Decoding a batch on the device: the step is captured once per batch (and way of picking tokens) into a CUDA graph
// and replayed.
bool CudaQwenEngine::run_decode_graph(const std::vector<int> & seqs, const std::vector<int> & tokens, int n_steps, int n_valid,
                                      StepEnd end, std::vector<int> & out) {
    const ModelConfig & cfg = model_->config;
    const int B = int(seqs.size());
    if (experts_on_host(B)) return false;  // quantized experts counted on the host: the per-token path
    if (cfg.rope_scaling.type == RopeType::Dynamic) return false;
    if (!prepare_batch(seqs, tokens, n_steps)) return false;
    argmax_scratch_.ensure(std::max<size_t>(cuda::k_argmax_scratch, cuda::argmax_rows_scratch(B)) * sizeof(float), "argmax scratch");
    const cuda::SampleParams & a = graph_sample_, & b = sample_params_;
    const bool same_sampling = end != StepEnd::Sample ||
                               (a.temperature == b.temperature && a.top_p == b.top_p && a.min_p == b.min_p && a.repetition_penalty == b.repetition_penalty &&
                                a.presence_penalty == b.presence_penalty && a.frequency_penalty == b.frequency_penalty && a.top_k == b.top_k && a.seed == b.seed);
    if (!graph_ || graph_seqs_ != seqs || graph_valid_ != n_valid || graph_logits_ != logits_.get() ||
        graph_scratch_ != dequant_.get() || graph_argmax_ != argmax_scratch_.get() || graph_end_ != end || !same_sampling ||
        graph_short_ != decode_short_) {
        if (graph_) cudaGraphExecDestroy(graph_);
        graph_ = nullptr;
        graph_valid_ = n_valid;
        graph_short_ = decode_short_;
        graph_end_ = end;
        graph_sample_ = sample_params_;
        // One eager step first, so that cuBLASLt's handle, plans and workspace and the dequantization buffer exist
        // before capture (no allocation inside it). It writes this step's K/V, which the first replay writes again.
        decode_step(B, StepEnd::Logits);
        graph_logits_ = logits_.get();
        graph_scratch_ = dequant_.get();
        graph_argmax_ = argmax_scratch_.get();
        cudaGraph_t g;
        CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
        decode_step(B, end);
        CUDA_CHECK(cudaStreamEndCapture(stream_, &g));
        CUDA_CHECK(cudaGraphInstantiate(&graph_, g, 0));
        CUDA_CHECK(cudaGraphDestroy(g));
        graph_seqs_ = seqs;
    }
    int first = 0;
    if (profile_decode_) {
        profile_decode_ = false;
        prof_.begin(stream_);
        decode_step(B, end);
        prof_.report("decode step (one step)");
        first = 1;
    }
    for (int i = first; i < n_steps; i++) CUDA_CHECK(cudaGraphLaunch(graph_, stream_));
    out.resize(size_t(n_steps) * B);
    CUDA_CHECK(cudaMemcpyAsync(out.data(), tokens_out_.get(), out.size() * sizeof(int), cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    for (int s : seqs) table_->set_length(s, table_->length(s) + n_steps);
    return true;
}

}  // namespace qinfer::cuda_engine
