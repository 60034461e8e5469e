#include "model/qwen_tp.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <numeric>

#include "core/check.h"
#include "core/parallel.h"
#include "model/quant.h"
#include "model/qwen.h"
#include "model/rank_workers.h"

namespace qinfer {

namespace {

// Rows [r0, r0 + n) of a tensor whose first dimension is its rows: a view.
Weight rows(const Weight & w, int64_t r0, int64_t n) {
    if (!w.present()) return w;
    QINFER_CHECK(!w.shape.empty() && r0 >= 0 && r0 + n <= w.shape[0]) << "tensor parallel: rows " << r0 << "+" << n << " of " << w.name;
    Weight s = w;
    const size_t row_bytes = w.nbytes() / size_t(w.shape[0]);
    s.data = static_cast<const uint8_t *>(w.data) + size_t(r0) * row_bytes;
    s.shape[0] = n;
    return s;
}

// Columns [c0, c0 + n) of a 2-D tensor: a copy kept in `owned`, made once per source tensor and range.
Weight cols(const Weight & w, int64_t c0, int64_t n, ShardBuffers & owned) {
    QINFER_CHECK(w.shape.size() == 2 && c0 >= 0 && c0 + n <= w.shape[1]) << "tensor parallel: columns " << c0 << "+" << n << " of " << w.name;
    const size_t e = dtype_size(w.dtype), R = size_t(w.shape[0]), C = size_t(w.shape[1]);
    Weight s = w;
    s.shape[1] = n;
    const ShardBuffers::Key key{w.data, int64_t(R), int64_t(C * e), c0 * int64_t(e), n * int64_t(e)};
    if (auto it = owned.cols_memo.find(key); it != owned.cols_memo.end()) {
        s.data = it->second;
        return s;
    }
    uint8_t * buf = owned.uninitialized(R * size_t(n) * e);
    // On the rank's threads: the copy's fresh pages are touched (faulted in) in parallel.
    parallel_for(int64_t(R), [&](int64_t r) {
        std::memcpy(buf + size_t(r) * size_t(n) * e, static_cast<const uint8_t *>(w.data) + (size_t(r) * C + size_t(c0)) * e, size_t(n) * e);
    });
    s.data = buf;
    owned.cols_memo.emplace(key, buf);
    return s;
}

// Quantized projections split in their stored packing: GPTQ (4 and 8 bits: whole fields in each int32 word) and
// AWQ's GEMM layout; the others get a one-line error.
bool gptq(const Linear & l) { return l.scheme.packing == QuantPacking::GptqV1 || l.scheme.packing == QuantPacking::GptqV2; }
void splittable(const Linear & l, int at, int n, int multiple, const char * what) {
    const std::string & name = l.qweight.present() ? l.qweight.name : l.weight.name;
    if (!gptq(l) && l.scheme.packing != QuantPacking::AwqGemm) {
        QINFER_FAIL() << "tensor parallel: " << name << " (" << l.scheme.describe() << ") is not split yet (GPTQ 4/8-bit and AWQ are)";
    }
    if (gptq(l) && l.scheme.bits != 4 && l.scheme.bits != 8) QINFER_FAIL() << "tensor parallel: " << name << ": " << l.scheme.bits << "-bit GPTQ is not split yet";
    if (at % multiple != 0 || n % multiple != 0) {
        QINFER_FAIL() << "tensor parallel: " << name << "'s " << what << " [" << at << ", " << at + n << ") is not on multiples of " << multiple;
    }
}

// Input rows [c0, c0 + n) of a grouped quantized projection must hold whole groups (the last part: what remains).
void check_whole_groups(const Linear & l, int c0, int n) {
    const int K = l.in_features, G = l.scheme.group(K);
    if (c0 % G != 0 || (n % G != 0 && c0 + n != K)) {
        QINFER_FAIL() << "tensor parallel: " << l.qweight.name << "'s input rows [" << c0 << ", " << c0 + n << ") cut its groups of " << G;
    }
}

// Output rows [r0, r0 + n) of a projection (and of its bias): column-parallel. A quantized one takes its columns of
// qweight, qzeros and scales (g_idx, along K, stays whole).
Linear split_out(const Linear & l, int r0, int n, ShardBuffers & owned) {
    Linear s = l;
    s.bias = rows(l.bias, r0, n);
    s.out_features = n;
    if (!l.quantized()) {
        s.weight = rows(l.weight, r0, n);
        return s;
    }
    const int per_word = gptq(l) ? 32 / l.scheme.bits : 8;  // output columns a word of qzeros (and AWQ's qweight) holds
    splittable(l, r0, n, per_word, "output columns");
    s.qweight = gptq(l) ? cols(l.qweight, r0, n, owned) : cols(l.qweight, r0 / 8, n / 8, owned);
    s.qzeros = cols(l.qzeros, r0 / per_word, n / per_word, owned);
    s.scales = cols(l.scales, r0, n, owned);
    return s;
}

// Input columns [c0, c0 + n) of a projection: row-parallel; its bias added by rank 0 alone (the partial sums meet in
// the all-reduce). A quantized one takes its rows of qweight; with g_idx (act-order or not) its slice of g_idx and the
// whole scales and zeros (the channels keep their checkpoint groups), else its groups' rows of them.
Linear split_in(const Linear & l, int c0, int n, int rank, ShardBuffers & owned) {
    Linear s = l;
    if (rank != 0) s.bias = Weight();
    s.in_features = n;
    if (!l.quantized()) {
        s.weight = cols(l.weight, c0, n, owned);
        return s;
    }
    const int K = l.in_features, G = l.scheme.group(K);
    const int per_word = gptq(l) ? 32 / l.scheme.bits : 1;  // input rows a word of qweight holds
    splittable(l, c0, n, per_word, "input rows");
    s.qweight = rows(l.qweight, c0 / per_word, n / per_word);
    // A g_idx that only restates k / group (checkpoints without act-order store one) is dropped, so that the slice's
    // groups are its rows of scales and zeros like any grouped checkpoint's.
    s.g_idx = Weight();
    if (has_act_order(l)) {
        s.g_idx = rows(l.g_idx, c0, n);
    } else if (l.scheme.group_size > 0) {
        check_whole_groups(l, c0, n);
        s.scales = rows(l.scales, c0 / G, (n + G - 1) / G);
        s.qzeros = rows(l.qzeros, c0 / G, (n + G - 1) / G);
    }
    return s;
}

// Act-order GPTQ down_proj (desc_act): a contiguous range of its input channels falls in every quantization group,
// unevenly, which the GPUs' layout (whole groups of consecutive sorted channels) cannot hold. Instead a rank takes the
// channels of whole groups [g0, g1): those whose g_idx falls there, in group order. gate_proj and up_proj give it
// those output rows, down_proj those input rows, so the rank's down slice is an ordinary grouped matrix (its groups in
// order, g_idx dropped) and its intermediate activations line up with it. The rank holds as many channels as a
// contiguous cut would.

// The channels of groups [g0, g1) of an act-order linear, in (group, channel) order; every group must hold its
// group size (the last one: what remains).
std::vector<int> group_channels(const Linear & l, int g0, int g1) {
    const int K = l.in_features, G = l.scheme.group(K);
    const int32_t * g = static_cast<const int32_t *>(l.g_idx.data);
    std::vector<std::vector<int>> by_group(size_t(g1 - g0));
    for (int k = 0; k < K; k++) {
        if (g[k] < 0 || g[k] >= (K + G - 1) / G) QINFER_FAIL() << l.g_idx.name << ": group " << g[k] << " of channel " << k << " is out of range";
        if (g[k] >= g0 && g[k] < g1) by_group[size_t(g[k] - g0)].push_back(k);
    }
    std::vector<int> out;
    for (int i = 0; i < g1 - g0; i++) {
        const int want = std::min(G, K - (g0 + i) * G);
        if (int(by_group[size_t(i)].size()) != want) {
            QINFER_FAIL() << "tensor parallel: " << l.g_idx.name << ": group " << g0 + i << " holds " << by_group[size_t(i)].size()
                          << " channels, not " << want << " (irregular act-order groups cannot be split)";
        }
        out.insert(out.end(), by_group[size_t(i)].begin(), by_group[size_t(i)].end());
    }
    return out;
}

// Output rows `pick` of a projection (and of its bias), in that order: a copy.
Linear select_out(const Linear & l, const std::vector<int> & pick, ShardBuffers & owned) {
    const int n = int(pick.size());
    // Elements `pick` of each row of a 2-D tensor [R, C] (columns), or rows `pick` of it (rows).
    const auto gather = [&](const Weight & w, bool by_rows) {
        if (!w.present()) return w;
        const size_t e = dtype_size(w.dtype), R = size_t(w.shape[0]), C = w.shape.size() > 1 ? size_t(w.shape[1]) : 1;
        const uint8_t * src = static_cast<const uint8_t *>(w.data);
        uint8_t * buf = owned.uninitialized((by_rows ? C : R) * size_t(n) * e);
        for (size_t i = 0; i < size_t(n); i++) {
            if (by_rows) {
                std::memcpy(buf + i * C * e, src + size_t(pick[i]) * C * e, C * e);
            } else {
                for (size_t r = 0; r < R; r++) std::memcpy(buf + (r * size_t(n) + i) * e, src + (r * C + size_t(pick[i])) * e, e);
            }
        }
        Weight s = w;
        s.data = buf;
        s.shape[by_rows ? 0 : 1] = n;
        return s;
    };
    Linear s = l;
    s.out_features = n;
    s.bias = gather(l.bias, true);
    if (!l.quantized()) {
        s.weight = gather(l.weight, true);
        return s;
    }
    if (!gptq(l) || (l.scheme.bits != 4 && l.scheme.bits != 8)) {
        QINFER_FAIL() << "tensor parallel: " << l.qweight.name << " (" << l.scheme.describe() << ") beside an act-order down_proj: only GPTQ 4/8-bit is split so";
    }
    s.qweight = gather(l.qweight, false);  // [K / per_word, N]: a column a word
    s.scales = gather(l.scales, false);
    // qzeros [groups, N / per_word]: fields along N.
    const int bits = l.scheme.bits, per_word = 32 / bits, groups = int(l.qzeros.shape[0]);
    const int64_t words_in = l.qzeros.shape[1];
    uint8_t * buf = owned.zeroed(size_t(groups) * size_t(n / per_word) * 4);
    uint32_t * out = reinterpret_cast<uint32_t *>(buf);
    const uint32_t * z = static_cast<const uint32_t *>(l.qzeros.data);
    for (int g = 0; g < groups; g++) {
        const uint32_t * row = z + size_t(g) * size_t(words_in);
        for (int i = 0; i < n; i++) {
            out[size_t(g) * (n / per_word) + size_t(i / per_word)] |= packed_field(bits, pick[size_t(i)], [&](int64_t w) { return row[w]; })
                                                                     << (bits * (i % per_word));
        }
    }
    s.qzeros = l.qzeros;
    s.qzeros.data = buf;
    s.qzeros.shape[1] = n / per_word;
    return s;
}

// Input rows `pick` of an act-order GPTQ projection, which are the channels of its groups [g0, ...) in group order:
// qweight's fields gathered, the groups' rows of scales and zeros, g_idx dropped (its groups are now in order).
Linear select_in(const Linear & l, const std::vector<int> & pick, int g0, int rank, ShardBuffers & owned) {
    const int n = int(pick.size()), bits = l.scheme.bits, per_word = 32 / bits, G = l.scheme.group(l.in_features);
    Linear s = l;
    if (rank != 0) s.bias = Weight();
    s.in_features = n;
    const int64_t N = l.qweight.shape[1];
    uint8_t * buf = owned.zeroed(size_t(n / per_word) * size_t(N) * 4);
    uint32_t * out = reinterpret_cast<uint32_t *>(buf);
    const uint32_t * q = static_cast<const uint32_t *>(l.qweight.data);
    parallel_for(N, [&](int64_t c) {
        for (int j = 0; j < n; j++) {
            const uint32_t v = packed_field(bits, pick[size_t(j)], [&](int64_t w) { return q[size_t(w) * size_t(N) + size_t(c)]; });
            out[size_t(j / per_word) * size_t(N) + size_t(c)] |= v << (bits * (j % per_word));
        }
    });
    s.qweight.data = buf;
    s.qweight.shape[0] = n / per_word;
    s.g_idx = Weight();
    s.scales = rows(l.scales, g0, (n + G - 1) / G);
    s.qzeros = rows(l.qzeros, g0, (n + G - 1) / G);
    return s;
}

MlpWeights split_mlp(const MlpWeights & m, int i0, int n, int rank, ShardBuffers & owned) {
    MlpWeights s;
    const Linear & down = m.down_proj;
    if (down.quantized() && gptq(down) && has_act_order(down)) {
        const int G = down.scheme.group(down.in_features);
        check_whole_groups(down, i0, n);  // tp_inter_align cuts on whole groups
        const std::vector<int> pick = group_channels(down, i0 / G, (i0 + n + G - 1) / G);
        s.gate_proj = select_out(m.gate_proj, pick, owned);
        s.up_proj = select_out(m.up_proj, pick, owned);
        s.down_proj = select_in(down, pick, i0 / G, rank, owned);
        return s;
    }
    s.gate_proj = split_out(m.gate_proj, i0, n, owned);
    s.up_proj = split_out(m.up_proj, i0, n, owned);
    s.down_proj = split_in(m.down_proj, i0, n, rank, owned);
    return s;
}

// The in-process collective: every rank's engine runs in its own thread and waits for the others at a barrier that
// a failing rank breaks (the others then throw instead of waiting forever).
struct Group {
    explicit Group(int n) : tp(n), bufs(size_t(n)) {}
    const int tp;
    std::mutex mu;
    std::condition_variable cv;
    int arrived = 0;
    uint64_t generation = 0;
    bool broken = false;
    std::vector<const float *> bufs;  // each rank's operand of the collective under way

    void barrier() {
        std::unique_lock<std::mutex> lock(mu);
        if (broken) QINFER_FAIL() << "tensor parallel: another rank failed";
        const uint64_t g = generation;
        if (++arrived == tp) {
            arrived = 0;
            generation++;
            cv.notify_all();
            return;
        }
        cv.wait(lock, [&] { return generation != g || broken; });
        if (broken) QINFER_FAIL() << "tensor parallel: another rank failed";
    }
    void breakdown() {
        std::lock_guard<std::mutex> lock(mu);
        broken = true;
        cv.notify_all();
    }
};

class RankLink : public TpLink {
public:
    RankLink(Group & g, int rank) : g_(g), rank_(rank) {}
    void all_reduce(float * x, size_t n) override {
        g_.bufs[size_t(rank_)] = x;
        g_.barrier();
        sum_.assign(n, 0.0f);
        for (int r = 0; r < g_.tp; r++) {
            const float * b = g_.bufs[size_t(r)];
            for (size_t i = 0; i < n; i++) sum_[i] += b[i];
        }
        g_.barrier();  // every rank has read every operand
        std::copy(sum_.begin(), sum_.end(), x);
    }
    void all_gather_cols(const float * mine, int rows, int col0, int cols, int total, float * out) override {
        g_.bufs[size_t(rank_)] = mine;
        cols_[0] = col0;
        cols_[1] = cols;
        g_.barrier();
        for (int r = 0; r < g_.tp; r++) {
            const int * rc = peers_[size_t(r)]->cols_;
            const float * b = g_.bufs[size_t(r)];
            for (int i = 0; i < rows; i++) std::copy(b + size_t(i) * rc[1], b + size_t(i + 1) * rc[1], out + size_t(i) * total + rc[0]);
        }
        g_.barrier();
    }
    std::vector<RankLink *> peers_;

private:
    Group & g_;
    const int rank_;
    std::vector<float> sum_;
    int cols_[2] = {0, 0};
};

class CpuTpEngine : public Engine {
public:
    CpuTpEngine(std::unique_ptr<Model> full, const EngineOptions & opt)
        : full_(std::move(full)), group_(opt.tp), workers_(opt.tp, std::max(1, (opt.threads > 0 ? opt.threads : max_threads()) / opt.tp)) {
        const ModelConfig & c = full_->config;
        // Dense weights: no quantization group to respect (inter_align 1); vocabulary rows in whole cache lines.
        const std::vector<TpShard> plan = plan_tensor_parallel(c, opt.tp, 1, 16);
        for (int r = 0; r < opt.tp; r++) links_.push_back(std::make_unique<RankLink>(group_, r));
        for (auto & l : links_) {
            for (auto & p : links_) l->peers_.push_back(p.get());
        }
        for (const TpShard & s : plan) {
            ranks_.push_back(std::make_unique<CpuQwenEngine>(shard_model(*full_, s, opt.tp, owned_, tp_inter_align(*full_, 1)), opt));
            ranks_.back()->join_tensor_parallel(links_[size_t(s.rank)].get(), s.vocab0, s.n_vocab);
        }
    }
    const ModelConfig & config() const override { return full_->config; }
    std::string backend_name() const override { return "cpu-tp" + std::to_string(ranks_.size()); }
    int new_sequence(int max_tokens) override {
        int seq = -1;
        for (auto & r : ranks_) {
            const int s = r->new_sequence(max_tokens);
            QINFER_CHECK(seq < 0 || s == seq) << "tensor parallel: the ranks' sequence ids diverged";
            seq = s;
        }
        return seq;
    }
    void free_sequence(int seq) override {
        for (auto & r : ranks_) r->free_sequence(seq);
    }
    void forward(int seq, const std::vector<int> & tokens, bool all_logits, std::vector<float> & logits) override {
        each([&](CpuQwenEngine & e, std::vector<float> & out) { e.forward(seq, tokens, all_logits, out); }, logits);
    }
    void forward_batch(const std::vector<int> & seqs, const std::vector<int> & tokens, std::vector<float> & logits) override {
        each([&](CpuQwenEngine & e, std::vector<float> & out) { e.forward_batch(seqs, tokens, out); }, logits);
    }
    PoolInfo make_pool(const PoolOptions & opt) override {
        // Rank 0 sizes the pool; the others take as many blocks, so that one block table serves every rank.
        const PoolInfo info = ranks_[0]->make_pool(opt);
        PoolOptions same = opt;
        same.n_blocks = info.n_blocks;
        for (size_t r = 1; r < ranks_.size(); r++) ranks_[r]->make_pool(same);
        return info;
    }
    void step(const std::vector<StepSegment> & segs, const std::vector<int> & tokens, StepOutput & out) override {
        std::vector<StepOutput> outs(ranks_.size());
        run_ranks([&](size_t r) { ranks_[r]->step(segs, tokens, outs[r]); });
        out = std::move(outs[0]);
    }

private:
    // fn(rank engine, its logits) on every rank at once; rank 0's logits are the result (every rank holds the same).
    template <typename F> void each(F && fn, std::vector<float> & logits) {
        std::vector<std::vector<float>> outs(ranks_.size());
        run_ranks([&](size_t r) { fn(*ranks_[r], outs[r]); });
        logits = std::move(outs[0]);
    }
    // fn(r) for every rank, rank 0 on this thread; a failing rank breaks the barrier the others may wait at.
    void run_ranks(const std::function<void(size_t)> & fn) {
        workers_.run_all(fn, [&] { group_.breakdown(); });
    }

    std::unique_ptr<Model> full_;
    ShardBuffers owned_;  // column slices of the ranks' weights
    Group group_;
    std::vector<std::unique_ptr<RankLink>> links_;
    std::vector<std::unique_ptr<CpuQwenEngine>> ranks_;
    RankWorkers workers_;
};

}  // namespace

int tp_quant_align(const QuantScheme & q) {
    if (!q.quantized()) return 1;
    const int g = q.group_size > 0 ? q.group_size : 32 / std::max(1, q.bits);
    return std::lcm(g, 8);  // whole groups of down's input, whole words of gate/up's qzeros
}

int tp_inter_align(const Model & full, int least) {
    int align = std::max(1, least);
    for (const LayerWeights & L : full.weights.layers) {
        for (const MlpWeights * m : {&L.mlp, L.moe.experts.empty() ? nullptr : &L.moe.experts[0], L.is_moe && L.moe.has_shared_expert ? &L.moe.shared_expert : nullptr}) {
            if (m) align = std::lcm(align, tp_quant_align(m->down_proj.scheme));
        }
    }
    return align;
}

namespace {

// Rank s's parts [begin, end) of the dense, expert and shared-expert intermediate dimensions.
struct InterParts {
    std::pair<int, int> dense, expert, shared;
};
InterParts inter_parts(const ModelConfig & c, const TpShard & s, int tp, int inter_align) {
    return {tp_part(c.intermediate_size, inter_align, tp, s.rank), tp_part(c.moe_intermediate_size, inter_align, tp, s.rank),
            tp_part(c.shared_expert_intermediate_size, inter_align, tp, s.rank)};
}

}  // namespace

ModelConfig shard_config(const ModelConfig & c, const TpShard & s, int tp, int inter_align) {
    ModelConfig rc = c;
    rc.num_attention_heads = s.n_q_heads;
    rc.num_key_value_heads = s.n_kv_heads;
    const InterParts p = inter_parts(c, s, tp, inter_align);
    rc.intermediate_size = p.dense.second - p.dense.first;
    rc.moe_intermediate_size = p.expert.second - p.expert.first;
    rc.shared_expert_intermediate_size = p.shared.second - p.shared.first;
    return rc;
}

std::unique_ptr<Model> shard_model(const Model & full, const TpShard & s, int tp, ShardBuffers & owned, int inter_align) {
    const ModelConfig & c = full.config;
    auto m = std::make_unique<Model>();
    m->dir = full.dir;
    m->config = shard_config(c, s, tp, inter_align);
    m->dummy = full.dummy;  // the shard's slices may point into the dummy weights
    const auto [dense, expert, shared] = inter_parts(c, s, tp, inter_align);
    const auto [d0, d1] = dense;
    const auto [e0, e1] = expert;
    const auto [h0, h1] = shared;
    const ModelWeights & W = full.weights;
    ModelWeights & R = m->weights;
    const int d = c.head_dim;
    R.embed_tokens = rows(W.embed_tokens, s.vocab0, s.n_vocab);
    R.lm_head = rows(W.lm_head, s.vocab0, s.n_vocab);
    R.norm = W.norm;
    for (const LayerWeights & L : W.layers) {
        LayerWeights & RL = R.layers.emplace_back();
        RL.input_layernorm = L.input_layernorm;
        RL.post_attention_layernorm = L.post_attention_layernorm;
        const AttentionWeights & A = L.self_attn;
        AttentionWeights & RA = RL.self_attn;
        RA = A;  // norms and KV scales as they are
        RA.q_proj = split_out(A.q_proj, s.q_head0 * d, s.n_q_heads * d, owned);
        RA.k_proj = split_out(A.k_proj, s.kv_head0 * d, s.n_kv_heads * d, owned);
        RA.v_proj = split_out(A.v_proj, s.kv_head0 * d, s.n_kv_heads * d, owned);
        RA.o_proj = split_in(A.o_proj, s.q_head0 * d, s.n_q_heads * d, s.rank, owned);
        RL.is_moe = L.is_moe;
        if (!L.is_moe) {
            RL.mlp = split_mlp(L.mlp, d0, d1 - d0, s.rank, owned);
            continue;
        }
        RL.moe.gate = L.moe.gate;  // the router sees the whole hidden state on every rank
        for (const MlpWeights & e : L.moe.experts) RL.moe.experts.push_back(split_mlp(e, e0, e1 - e0, s.rank, owned));
        RL.moe.has_shared_expert = L.moe.has_shared_expert;
        if (L.moe.has_shared_expert) {
            RL.moe.shared_expert = split_mlp(L.moe.shared_expert, h0, h1 - h0, s.rank, owned);
            RL.moe.shared_expert_gate = L.moe.shared_expert_gate;
        }
    }
    return m;
}

std::unique_ptr<Engine> make_cpu_tp_engine(const std::string & model_dir, const EngineOptions & opt) {
    QINFER_CHECK(opt.tp > 1) << "make_cpu_tp_engine: --tp " << opt.tp;
    return std::make_unique<CpuTpEngine>(load_model(model_dir, load_options(opt)), opt);
}

}  // namespace qinfer
