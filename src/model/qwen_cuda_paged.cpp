// Continuous batching on the CUDA engine (class in model/qwen_cuda.h): the cache becomes one pool of blocks whose
// tables the scheduler (runtime/scheduler.h) owns. A step with prompt chunks runs them and its decoding sequences'
// tokens together in prefill passes (one read of the weights); a step of decoding sequences alone is one batched
// decode step, captured in a CUDA graph per bucket of rows (padding rows write to a block of their own). Each row
// picks its token on the device by its own settings where it can.
#include "model/qwen_cuda.h"

#include <chrono>
#include <cstring>

#include "core/env.h"

namespace qinfer::cuda_engine {

// Decode rows are padded up to a bucket so that a few graphs serve every batch: exact up to the fused GEMVs' 4 rows,
// then 8, 16, steps of 16 to 128, of 32 to 256, of 64 beyond.
int rows_bucket(int b) {
    if (b <= 4) return b;
    if (b <= 8) return 8;
    if (b <= 128) return (b + 15) / 16 * 16;
    if (b <= 256) return (b + 31) / 32 * 32;
    return (b + 63) / 64 * 64;
}

int CudaQwenEngine::pool_decode_splits(int max_len, int rows) const {
    const ModelConfig & cfg = model_->config;
    int pow2 = 1;
    while (pow2 < max_len) pow2 *= 2;
    return cuda::decode_splits(std::min(pow2, pool_stride_ * block_size_), cfg.num_key_value_heads, cfg.head_dim, rows);
}

namespace {

// Whether a row's token can be picked on the device: greedy or top-k within the kernel's k, penalties with the
// history to apply them over; log-probabilities and full-vocabulary sampling (top_k 0) go to the host.
bool penalised(const SamplingParams & p) { return p.repetition_penalty != 1.0f || p.presence_penalty != 0 || p.frequency_penalty != 0; }

bool device_pick(const StepSegment & s) {
    if (s.need_logits || !s.sampling) return false;
    const SamplingParams & p = *s.sampling;
    if (penalised(p) && (!s.prompt || !s.output)) return false;
    return p.temperature == 0 || (p.top_k >= 1 && p.top_k <= cuda::k_sample_max_k);
}

}  // namespace

void CudaQwenEngine::drop_pool_graphs() {
    for (auto & [key, g] : pool_graphs_) cudaGraphExecDestroy(g);
    pool_graphs_.clear();
}

PoolInfo CudaQwenEngine::make_pool(const PoolOptions & opt) {
    const ModelConfig & c = model_->config;
    if (!block_tables_.empty()) QINFER_FAIL() << "CUDA backend: make_pool while " << block_tables_.size() << " sequences are alive";
    if (c.rope_scaling.type == RopeType::Dynamic) {
        QINFER_FAIL() << "CUDA backend: continuous batching does not take dynamic NTK rope scaling (its frequencies follow each sequence's "
                         "length); the CPU backend does";
    }
    if (opt.max_rows < 1 || opt.max_step_tokens < 1) QINFER_FAIL() << "make_pool: max_rows and max_step_tokens must be >= 1";
    if (!(opt.memory_fraction > 0 && opt.memory_fraction <= 1)) QINFER_FAIL() << "--gpu-memory-utilization must lie in (0, 1]";
    PoolInfo info;
    info.block_size = block_size_;
    info.max_seq_tokens = opt.max_seq_tokens > 0 ? std::min(opt.max_seq_tokens, c.max_context()) : c.max_context();
    const int stride = (info.max_seq_tokens + block_size_ - 1) / block_size_;

    // Everything a single request or static batch held goes; the pool's buffers are sized once, here.
    reset_cache(1, block_size_);
    if (graph_) cudaGraphExecDestroy(graph_);
    graph_ = nullptr;
    drop_pool_graphs();
    for (DeviceBuffer * b : {&k_cache_, &v_cache_, &k_sz_, &v_sz_}) *b = DeviceBuffer();
    kv_seqs_ = kv_tokens_ = kv_blocks_ = 0;
    pool_opt_ = opt;
    pool_rows_ = rows_bucket(opt.max_rows);
    pool_stride_ = stride;
    kv_tokens_ = stride * block_size_;  // what prefill_chunk() sizes passes for

    // A pass holds a step's decode rows and its prompt tokens, at most prefill_chunk() of them.
    const int step_tokens = std::max(pool_rows_, std::min(opt.max_step_tokens + pool_rows_, prefill_chunk()));
    ensure_workspace(step_tokens);
    const size_t V = size_t(c.vocab_size);
    logits_ = DeviceBuffer(size_t(pool_rows_) * V * sizeof(float), "logits");
    sample_work_ = DeviceBuffer(size_t(pool_rows_) * V * sizeof(float), "sampling");
    row_picks_ = DeviceBuffer(2 * size_t(pool_rows_) * sizeof(cuda::RowPick), "sampling");
    slot_tokens_ = DeviceBuffer(2 * size_t(pool_rows_) * sizeof(int), "sampling");
    // Penalties: every row's history fits (a sequence holds at most max_seq_tokens), and the counts start at zero.
    pick_history_ = DeviceBuffer(size_t(pool_rows_) * info.max_seq_tokens * sizeof(int), "sampling");
    history_host_ = cuda::HostMappedBuffer(size_t(pool_rows_) * info.max_seq_tokens * sizeof(int), "sampling");
    sample_counts_ = DeviceBuffer(size_t(pool_rows_) * V * sizeof(int), "sampling");
    CUDA_CHECK(cudaMemset(sample_counts_.get(), 0, sample_counts_.bytes()));
    state_ = DeviceBuffer((3 * size_t(pool_rows_) + 1) * sizeof(int), "decode state");
    tokens_out_ = DeviceBuffer(size_t(pool_rows_) * sizeof(int), "decode tokens");
    batch_tables_ = DeviceBuffer(2 * size_t(pool_rows_) * stride * sizeof(int), "block table");
    batch_stride_ = stride;
    size_t split_rows = 0;  // the most (rows x splits) of any bucket
    for (int b = 1; b <= pool_rows_; b = rows_bucket(b + 1)) {
        split_rows = std::max(split_rows, size_t(b) * cuda::decode_splits(info.max_seq_tokens, c.num_key_value_heads, c.head_dim, b));
    }
    split_out_ = DeviceBuffer(split_rows * c.num_attention_heads * c.head_dim * sizeof(float), "attention splits");
    split_ml_ = DeviceBuffer(split_rows * c.num_attention_heads * 2 * sizeof(float), "attention splits");
    ensure_quant_scratch(step_tokens);
    std::vector<int> identity(static_cast<size_t>(stride));
    std::iota(identity.begin(), identity.end(), 0);
    prefill_table_ = upload_vector(identity, "block table");
    ensure_prefill_kv(info.max_seq_tokens);
    ensure_attn_split(info.max_seq_tokens);  // before the cache takes what is left
    ids_host_ = cuda::HostMappedBuffer((size_t(std::max(opt.max_step_tokens, 1)) + pool_rows_) * sizeof(int), "prompt ids");
    const size_t staged = 2 * size_t(pool_rows_) * stride + (3 * size_t(pool_rows_) + 1) + 2 * size_t(pool_rows_) + 4;  // + alignment
    step_host_ = cuda::HostMappedBuffer(staged * sizeof(int) + 2 * size_t(pool_rows_) * sizeof(cuda::RowPick), "step staging");

    // The cache takes what the memory fraction leaves, keeping 0.5 GB for cuBLASLt's plans, the graphs and the
    // runtime's own allocations.
    size_t free_b = 0, total_b = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    const size_t per_token_row = kv_row_bytes_ + (k_sz_needed() ? sizeof(float2) : 0);
    const size_t block_bytes = 2 * size_t(c.num_hidden_layers) * c.num_key_value_heads * block_size_ * per_token_row;
    int n_blocks = opt.n_blocks;
    if (n_blocks <= 0) {
        const double limit = opt.memory_fraction * double(total_b), in_use = double(total_b - free_b), margin = 0.5e9;
        const double room = limit - in_use - margin;
        if (room < double(block_bytes)) {
            QINFER_FAIL() << "CUDA backend: no memory left for the KV cache (" << in_use / 1e9 << " GB in use of " << limit / 1e9
                          << " GB allowed by --gpu-memory-utilization " << opt.memory_fraction << ")";
        }
        n_blocks = int(std::min(room / double(block_bytes), 4.0e6));
    }
    const size_t rows = size_t(c.num_hidden_layers) * size_t(n_blocks + 1) * c.num_key_value_heads * block_size_;
    k_cache_ = DeviceBuffer(rows * kv_row_bytes_, "KV cache");
    v_cache_ = DeviceBuffer(rows * kv_row_bytes_, "KV cache");
    if (k_sz_needed()) {
        k_sz_ = DeviceBuffer(rows * sizeof(float2), "KV cache");
        v_sz_ = DeviceBuffer(rows * sizeof(float2), "KV cache");
    }
    kv_blocks_ = n_blocks + 1;
    kv_seqs_ = pool_rows_;
    scratch_block_ = n_blocks;
    table_ = std::make_unique<BlockTable>(0, block_size_);
    pooled_ = true;
    info.n_blocks = n_blocks;
    cuda::DeviceAllocator::instance().reset_peak();
    return info;
}

void CudaQwenEngine::step(const std::vector<StepSegment> & segs, const std::vector<int> & tokens, StepOutput & out) {
    if (!pooled_) QINFER_FAIL() << "CUDA backend: step() before make_pool()";
    const ModelConfig & cfg = model_->config;
    const int V = cfg.vocab_size, stride = pool_stride_;
    size_t rows = 0;
    for (const StepSegment & s : segs) {
        if (!s.blocks || s.n < 1 || s.pos0 < 0) QINFER_FAIL() << "step: a segment needs its blocks and at least one token";
        if (size_t(s.pos0 + s.n) > s.blocks->size() * size_t(block_size_) || int(s.blocks->size()) > stride) {
            QINFER_FAIL() << "step: a segment of " << s.pos0 + s.n << " tokens outgrew its " << s.blocks->size() << " blocks (tables hold " << stride << ")";
        }
        for (int b : *s.blocks) {
            if (b < 0 || b >= scratch_block_) QINFER_FAIL() << "step: block " << b << " outside the pool of " << scratch_block_;
        }
        rows += size_t(s.n);
    }
    if (rows != tokens.size()) QINFER_FAIL() << "step: " << tokens.size() << " tokens for segments of " << rows << " rows";
    for (int t : tokens) {
        if (t < 0 || t >= V) QINFER_FAIL() << "token id " << t << " is outside the vocabulary [0, " << V << ")";
    }
    bool fp8_ready = true;
    for (bool r : fp8_ready_) fp8_ready = fp8_ready && r;
    // Decode rows: one token each, once the fp8 scales exist (the prefill path sets them); everything else is a prompt
    // chunk through the prefill passes.
    std::vector<size_t> decode, chunks;
    std::vector<size_t> first_row(segs.size());
    for (size_t i = 0, row = 0; i < segs.size(); row += size_t(segs[i].n), i++) {
        first_row[i] = row;
        ((segs[i].n == 1 && (kv_kind_ != cuda::KVKind::FP8 || fp8_ready) && int(decode.size()) < pool_rows_) ? decode : chunks).push_back(i);
    }
    if (chunks.size() > size_t(pool_rows_)) QINFER_FAIL() << "step: more than " << pool_rows_ << " prompt chunks in one step";
    const int B = int(decode.size());
    // Until an fp8 cache has its scales, each chunk runs alone, so that the first chunk's values set them, as in the
    // CPU cache. Otherwise the chunks share passes, and the decode rows ride in them (one read of the weights for the
    // step); a step of decode rows alone is the captured decode step, padded to its bucket.
    const bool pack = kv_kind_ != cuda::KVKind::FP8 || fp8_ready;
    const bool merged = B > 0 && !chunks.empty() && pack;
    const int bucket = B == 0 ? 0 : merged ? B : std::min(rows_bucket(B), pool_rows_);

    // Staging (pinned): block tables, prompt ids, decode state, picked tokens (decode rows from 0, chunks from
    // pool_rows_) and the rows' pick settings (likewise).
    int * tables = static_cast<int *>(step_host_.host());
    int * state = tables + 2 * size_t(pool_rows_) * stride;  // tokens [bucket], pos [bucket], step, len [bucket]
    int * picked = state + 3 * size_t(pool_rows_) + 1;
    const uintptr_t picks_at = (reinterpret_cast<uintptr_t>(picked + 2 * size_t(pool_rows_)) + 15) & ~uintptr_t(15);
    auto * picks = reinterpret_cast<cuda::RowPick *>(picks_at);
    auto put_table = [&](size_t row, const std::vector<int> & blocks) { std::copy(blocks.begin(), blocks.end(), tables + row * stride); };
    for (int r = 0; r < B; r++) put_table(size_t(r), *segs[decode[size_t(r)]].blocks);
    for (int r = B; r < bucket; r++) tables[size_t(r) * stride] = scratch_block_;  // padding rows: position 0 of their own block
    for (size_t j = 0; j < chunks.size(); j++) put_table(size_t(pool_rows_) + j, *segs[chunks[j]].blocks);
    // Only the columns in use go over (a row's kernels read no entry past its length): at 1024 rows of 2048-entry
    // tables the whole rows had been 8 MB a step.
    size_t cols = 1;
    for (const StepSegment & s : segs) cols = std::max(cols, s.blocks->size());
    const size_t pitch = size_t(stride) * sizeof(int);
    if (bucket > 0) {
        CUDA_CHECK(cudaMemcpy2DAsync(batch_tables_.get(), pitch, tables, pitch, cols * sizeof(int), size_t(bucket), cudaMemcpyHostToDevice, stream_));
    }
    if (!chunks.empty()) {
        CUDA_CHECK(cudaMemcpy2DAsync(batch_tables_.as<int>() + size_t(pool_rows_) * stride, pitch, tables + size_t(pool_rows_) * stride, pitch,
                                     cols * sizeof(int), chunks.size(), cudaMemcpyHostToDevice, stream_));
    }
    size_t n_ids = merged ? size_t(B) : 0;
    for (size_t i : chunks) n_ids += size_t(segs[i].n);
    if (ids_host_.bytes() < n_ids * sizeof(int)) {
        CUDA_CHECK(cudaStreamSynchronize(stream_));  // the old buffer may still be read by queued copies
        ids_host_ = cuda::HostMappedBuffer(n_ids * sizeof(int), "prompt ids");
    }

    // Which rows the host picks (their logits come back): log-probabilities and full-vocabulary sampling. Penalties
    // are applied on the device over the staged history (prompt and output), for prompt ends as for decode rows: on
    // the host each penalised prompt end had cost 0.62 ms after its step (7B, H200, `serve --step-log`).
    out.tokens.assign(segs.size(), -1);
    out.logits_row.assign(segs.size(), -1);
    int n_logit_rows = 0;
    std::vector<bool> chunk_on_device(chunks.size());
    for (size_t j = 0; j < chunks.size(); j++) {
        const StepSegment & s = segs[chunks[j]];
        chunk_on_device[j] = s.pick && device_pick(s);
        if (s.pick && !chunk_on_device[j]) out.logits_row[chunks[j]] = n_logit_rows++;
    }
    std::vector<int> host_pick;  // decode rows whose logits the host needs
    for (int r = 0; r < B; r++) {
        const StepSegment & s = segs[decode[size_t(r)]];
        if (s.pick && !device_pick(s)) {
            out.logits_row[decode[size_t(r)]] = n_logit_rows++;
            host_pick.push_back(r);
        }
    }
    out.logits.resize(size_t(n_logit_rows) * V);
    auto host_logits = [&](size_t i) { return out.logits_row[i] >= 0 ? out.logits.data() + size_t(out.logits_row[i]) * V : nullptr; };

    // Pick settings: each decode row (padding rows greedy), each prompt end picked on the device.
    size_t n_hist = 0;
    auto fill_pick = [&](const StepSegment * s, int pos) {
        cuda::RowPick p;
        p.n_valid = s && s->n_valid > 0 ? std::min(s->n_valid, V) : V;
        p.pos = pos;
        if (!s || !s->pick || !device_pick(*s)) return p;
        const SamplingParams & sp = *s->sampling;
        p.temperature = sp.temperature;
        p.top_k = sp.top_k;
        p.top_p = sp.top_p;
        p.min_p = sp.min_p;
        p.seed = sp.seed;
        p.repetition_penalty = sp.repetition_penalty;
        p.presence_penalty = sp.presence_penalty;
        p.frequency_penalty = sp.frequency_penalty;
        if (penalised(sp)) {
            // The history, packed after the rows before it (their sum stays within the buffer: each row's history is
            // shorter than its sequence, which its table bounds).
            int * hist = static_cast<int *>(history_host_.host());
            p.hist_off = int(n_hist);
            p.n_prompt = int(s->prompt->size());
            p.n_output = int(s->output->size());
            std::copy(s->prompt->begin(), s->prompt->end(), hist + n_hist);
            std::copy(s->output->begin(), s->output->end(), hist + n_hist + s->prompt->size());
            n_hist += s->prompt->size() + s->output->size();
        }
        return p;
    };
    int max_len = 1;
    bool short_ctx = true;
    for (int r = 0; r < bucket; r++) {
        const bool real = r < B;
        const StepSegment * s = real ? &segs[decode[size_t(r)]] : nullptr;
        const int pos = real ? s->pos0 : 0;
        state[r] = real ? tokens[first_row[decode[size_t(r)]]] : 0;
        state[bucket + r] = pos;
        state[2 * bucket + 1 + r] = pos + 1;
        max_len = std::max(max_len, pos + 1);
        short_ctx = short_ctx && pos + 1 <= cuda::k_short_decode_keys;
        picks[r] = fill_pick(s, pos);
    }
    state[2 * bucket] = 0;
    cuda::RowPick * chunk_picks = picks + pool_rows_;
    for (size_t j = 0; j < chunks.size(); j++) {
        const StepSegment & s = segs[chunks[j]];
        chunk_picks[j] = fill_pick(chunk_on_device[j] ? &s : nullptr, s.pos0 + s.n - 1);
    }
    if (bucket > 0) {
        CUDA_CHECK(cudaMemcpyAsync(state_.get(), state, (3 * size_t(bucket) + 1) * sizeof(int), cudaMemcpyHostToDevice, stream_));
        CUDA_CHECK(cudaMemcpyAsync(row_picks_.get(), picks, size_t(bucket) * sizeof(cuda::RowPick), cudaMemcpyHostToDevice, stream_));
    }
    if (!chunks.empty()) {
        CUDA_CHECK(cudaMemcpyAsync(row_picks_.as<cuda::RowPick>() + pool_rows_, chunk_picks, chunks.size() * sizeof(cuda::RowPick),
                                   cudaMemcpyHostToDevice, stream_));
    }
    if (n_hist > 0) {
        CUDA_CHECK(cudaMemcpyAsync(pick_history_.get(), history_host_.host(), n_hist * sizeof(int), cudaMemcpyHostToDevice, stream_));
    }

    // The passes: decode rows (merged) then prompt chunks, their ids one after another.
    std::vector<PrefillSegment> passes;
    int * ids = static_cast<int *>(ids_host_.host());
    size_t ids_at = 0;
    if (merged) {
        for (int r = 0; r < B; r++) {
            const size_t i = decode[size_t(r)];
            PrefillSegment p;
            p.table_row = r;
            p.table = batch_tables_.as<int>() + size_t(r) * stride;
            p.pos0 = segs[i].pos0;
            p.n = 1;
            p.decode = true;
            p.pick_slot = segs[i].pick && out.logits_row[i] < 0 ? r : -1;
            p.logits = host_logits(i);
            passes.push_back(p);
            ids[ids_at++] = tokens[first_row[i]];
        }
    }
    for (size_t j = 0; j < chunks.size(); j++) {
        const StepSegment & s = segs[chunks[j]];
        std::copy(tokens.begin() + long(first_row[chunks[j]]), tokens.begin() + long(first_row[chunks[j]] + size_t(s.n)), ids + ids_at);
        PrefillSegment p;
        p.table_row = pool_rows_ + int(j);
        p.table = batch_tables_.as<int>() + size_t(p.table_row) * stride;
        p.pos0 = s.pos0;
        p.n = s.n;
        p.pick_slot = chunk_on_device[j] ? pool_rows_ + int(j) : -1;
        p.logits = host_logits(chunks[j]);
        if (pack) {
            passes.push_back(p);
        } else {
            // Each prefill call stages its pass in pack_host_ from the start: the call before must have copied its
            // staging out first (without this sync a GPU running behind, as under another process's load, read the
            // next chunk's pick slots: wrong tokens in Scheduling.PreemptionEqualsAlone over fp8, H200).
            if (j > 0) CUDA_CHECK(cudaStreamSynchronize(stream_));
            prefill({p}, ids_at, false);
        }
        ids_at += size_t(s.n);
    }
    if (merged) {
        const DecodeRows rows{state_.as<int>() + 2 * bucket + 1, max_len, short_ctx};
        prefill(passes, 0, false, &rows);
    } else if (!passes.empty()) {
        prefill(passes, 0, false);
    }
    profile_decode_ = false;

    if (B > 0 && !merged) {
        // The decode rows alone, padded to their bucket, in one captured step.
        max_splits_ = pool_decode_splits(max_len, bucket);
        decode_short_ = short_ctx;
        if (experts_on_host(bucket)) {
            decode_step(bucket, StepEnd::Pick);  // quantized experts counted on the host: no graph
        } else {
            const auto key = std::make_tuple(bucket, max_splits_, decode_short_);
            auto it = pool_graphs_.find(key);
            if (it == pool_graphs_.end()) {
                // One eager step first, so that cuBLASLt's plans exist before capture (it writes this step's K/V,
                // which the replay writes again).
                decode_step(bucket, StepEnd::Logits);
                cudaGraph_t g;
                cudaGraphExec_t exec;
                CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
                decode_step(bucket, StepEnd::Pick);
                CUDA_CHECK(cudaStreamEndCapture(stream_, &g));
                CUDA_CHECK(cudaGraphInstantiate(&exec, g, 0));
                CUDA_CHECK(cudaGraphDestroy(g));
                it = pool_graphs_.emplace(key, exec).first;
            }
            const auto launch0 = std::chrono::steady_clock::now();
            CUDA_CHECK(cudaGraphLaunch(it->second, stream_));
            out.launch_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - launch0).count();
        }
        CUDA_CHECK(cudaMemcpyAsync(picked, tokens_out_.get(), size_t(B) * sizeof(int), cudaMemcpyDeviceToHost, stream_));
        for (int r : host_pick) {
            CUDA_CHECK(cudaMemcpyAsync(host_logits(decode[size_t(r)]), logits_.as<float>() + size_t(r) * V, size_t(V) * sizeof(float),
                                       cudaMemcpyDeviceToHost, stream_));
        }
    }
    if (merged) CUDA_CHECK(cudaMemcpyAsync(picked, slot_tokens_.get(), size_t(B) * sizeof(int), cudaMemcpyDeviceToHost, stream_));
    if (!chunks.empty()) {
        CUDA_CHECK(cudaMemcpyAsync(picked + pool_rows_, slot_tokens_.as<int>() + pool_rows_, chunks.size() * sizeof(int), cudaMemcpyDeviceToHost,
                                   stream_));
    }
    const auto wait0 = std::chrono::steady_clock::now();
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    out.wait_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - wait0).count();
    for (int r = 0; r < B; r++) {
        const size_t i = decode[size_t(r)];
        if (segs[i].pick && out.logits_row[i] < 0) out.tokens[i] = picked[r];
    }
    for (size_t j = 0; j < chunks.size(); j++) {
        if (chunk_on_device[j]) out.tokens[chunks[j]] = picked[pool_rows_ + int(j)];
    }
}

}  // namespace qinfer::cuda_engine
