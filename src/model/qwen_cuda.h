// The CUDA engine's class and device-side weight structs, shared by its three source files: qwen_cuda.cpp (loading,
// the KV cache and workspaces, the linear/MLP/MoE layers), qwen_cuda_prefill.cpp (prompts in passes) and
// qwen_cuda_decode.cpp (decode steps of one sequence or a static batch, and their CUDA graphs). See qwen_cuda.cpp for
// what the engine does.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <tuple>
#include <numeric>

#include "backends/cuda/allocator.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/ops.h"
#include "core/check.h"
#include "core/progress.h"
#include "model/prefill_chunk.h"
#include "model/prefill_splits.h"
#include "model/quant_repack.h"
#include "model/rope.h"
#include "model/tp_plan.h"
#include "model/weights.h"
#include "runtime/engine.h"
#include "runtime/kv_cache.h"
#include "tools/sysinfo.h"


namespace qinfer::cuda_engine {

using cuda::bf16;
using cuda::DeviceBuffer;
using cuda::HostMappedBuffer;

constexpr int k_gemv_max_m = 4;  // up to this many tokens go through the GEMV kernels (quantized: cuda::quant_path)
// Steps of up to this many tokens (decode batches) run a MoE block's shared expert on the second stream beside the
// router and the routed experts; longer ones (prefill) run it first.
constexpr int k_moe_beside_max_rows = 256;
// bf16 weights only one row: on an H200 the bf16 GEMV took 7B's gate_up 87.7 us at m 2 and 152.8 at 4 against 67.6
// for cuBLASLt at m 8 (qkv 27.2 at 4 against 11.4; bench/results/2026-11-29-h200-qgemm-mma, `bench --kernels`).
constexpr int k_dense_gemv_max_m = 1;

// Per-op GPU time of each prefill of more than one token and of the first decode step after it (QINFER_PROFILE=1):
// events between ops, summed by op name. The work is queued behind a 50 ms sleep so the events time the GPU, not the
// launch rate; a profiled run's own speed is not a measurement.
class StepProfiler {
public:
    void begin(cudaStream_t s) {
        stream_ = s;
        on_ = true;
        marks_.clear();
        cuda::gpu_sleep(50000, s);
        add("start");
    }
    void mark(const char * what) {
        if (on_) add(what);
    }
    void report(const std::string & title) {
        if (!on_) return;
        on_ = false;
        CUDA_CHECK(cudaStreamSynchronize(stream_));
        std::map<std::string, std::pair<float, int>> by_name;
        float total = 0;
        for (size_t i = 1; i < marks_.size(); i++) {
            float ms = 0;
            cudaEventElapsedTime(&ms, marks_[i - 1].second, marks_[i].second);
            by_name[marks_[i].first].first += ms;
            by_name[marks_[i].first].second++;
            total += ms;
        }
        std::fprintf(stderr, "%s profile (queued behind a sleep, %.3f ms of GPU time):\n", title.c_str(), total);
        for (const auto & [name, v] : by_name) {
            std::fprintf(stderr, "  %-22s %8.1f us %5.1f%%  (%d launches)\n", name.c_str(), v.first * 1e3, 100 * v.first / total, v.second);
        }
        for (auto & m : marks_) cudaEventDestroy(m.second);
        marks_.clear();
    }

private:
    void add(const char * what) {
        cudaEvent_t e;
        CUDA_CHECK(cudaEventCreate(&e));
        CUDA_CHECK(cudaEventRecord(e, stream_));
        marks_.emplace_back(what, e);
    }
    cudaStream_t stream_ = nullptr;
    bool on_ = false;
    std::vector<std::pair<std::string, cudaEvent_t>> marks_;
};

struct DevLinear {
    DeviceBuffer w;  // bf16 [n, k] (dense)
    int n = 0, k = 0;
    // Quantized: the kernels' layout (model/quant_repack.h) and its view.
    bool quantized = false;
    DeviceBuffer codes, scales, zeros, absmax, table, perm;
    cuda::QuantMatrix q;
    const bf16 * ptr() const { return w.as<bf16>(); }
};

template <class T> DeviceBuffer upload_vector(const std::vector<T> & v, const char * what) {
    if (v.empty()) return DeviceBuffer();
    DeviceBuffer b(v.size() * sizeof(T), what);
    CUDA_CHECK(cudaMemcpy(b.get(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
    return b;
}

// A repacked quantized weight on the device (model/quant_repack.h) and the kernels' view of it.
DevLinear upload_repacked(const RepackedQuant & r);

struct DevMlp {
    DevLinear gate_up;  // bf16 [2 inter, hidden]: gate rows, then up rows
    DevLinear down;     // bf16 [hidden, inter]
};

struct DevLayer {
    DeviceBuffer input_norm, post_norm, q_norm, k_norm;  // bf16 [hidden] / [head_dim]
    DevLinear qkv;                                       // bf16 [(n_head + 2 n_kv) d, hidden]
    DeviceBuffer qkv_bias;                               // bf16 [(n_head + 2 n_kv) d] or empty
    DevLinear o;                                         // bf16 [hidden, n_head d]
    // Tensor parallel: o_proj whole on every rank (act-order GPTQ, whose groups span the heads): the ranks' attention
    // rows are gathered first (o_input) and its output is complete (no all-reduce).
    bool o_whole = false;
    bool moe = false;
    DevMlp mlp;
    DevLinear router;  // bf16 [n_experts (+ 1: the shared expert's gate row, when it has one), hidden]
    // Routed experts: bf16 stacked for the grouped GEMMs (cuda::MoeExperts), or quantized. Quantized experts whose
    // schemes and act-order agree are stacked in one repacked matrix per projection (expert_q) and `experts` views each
    // one's rows; steps of few rows per expert run them all in one launch per projection (cuda::moe_qexperts), others
    // (prefill) in one grouped GEMM launch per projection on Hopper (cuda::moe_qgemm), elsewhere one by one through
    // linear(), their rows counted on the host (a wait per layer, no graph). Experts that cannot be stacked are
    // uploaded one by one and always take that path.
    DeviceBuffer expert_gate_up, expert_down;  // bf16 [n_experts, 2 inter, hidden], [n_experts, hidden, inter]
    bool experts_decode = false;               // bf16 experts that cuda::moe_decode takes (decode steps)
    DevMlp expert_q;                           // quantized, stacked: gate_up [n_experts (gate inter | up inter), hidden], down [n_experts hidden, inter]
    bool expert_q_kernel = false;              // cuda::moe_qexperts_apply(expert_q)
    bool expert_q_gemm = false;                // cuda::moe_qgemm_apply(expert_q)
    bool expert_q_route = false;               // cuda::moe_qexperts_route_in_launch(expert_q): batch-1 steps route in the launch
    std::vector<DevMlp> experts;               // quantized experts (views of expert_q where stacked)
    bool has_shared = false;
    DevMlp shared;
    // Whether c tokens give the quantized experts more than the decode kernel's tile of rows each on average (its
    // codes are read once per tile): then they take the grouped GEMM where it applies.
    bool beyond_qtile(int c, int top_k) const { return int64_t(c) * top_k > int64_t(cuda::k_moe_qtile_rows) * int64_t(experts.size()); }
    bool experts_grouped(int c, int top_k) const { return moe && !experts.empty() && expert_q_gemm && beyond_qtile(c, top_k); }
    // Whether they run one by one (counted on the host): where neither device kernel takes them.
    bool experts_on_host(int c, int top_k) const {
        if (!moe || experts.empty()) return false;
        return !expert_q_kernel || (beyond_qtile(c, top_k) && !expert_q_gemm);
    }
    // Whether a decode step of c tokens normalises the MoE block's input inside the block's own launches (the router
    // and shared expert GEMVs, the routed experts' gate/up: cuda::MoeNormIn), with no RMSNorm kernel ahead of them.
    // On one H200 (same call, bench/results/2026-11-30-h200-moe-parts, call 3) that took Qwen1.5-MoE-A2.7B BF16 from
    // 560.71 / 561.50 to 593.28 / 593.52 tok/s (its shared expert now starts beside the router at once), A2.7B
    // GPTQ-Int4 723.89 -> 741.37, Qwen2-57B-A14B GPTQ-Int4 271.48 -> 281.24, Qwen3-235B-A22B GPTQ-Int4 128.53 -> 129.48;
    // but Qwen3-30B-A3B BF16 369.21 / 368.87 -> 367.50 / 367.49 (no shared expert, and each of its 384 bf16 gate/up
    // blocks waited for its two-pass norm before its first weight load). With the staging one round trip
    // (qstage::stage_norm_vec) it pays there too at one token, the router's rows in the same launch (same call,
    // alternated twice; bench/results/2026-12-04-h200-moe-early-ids, call 2): 379.03 / 379.41 -> 382.42 / 382.58.
    // Bf16 experts without a shared expert at 2-8 tokens (a router kernel ahead, unmeasured) keep the RMSNorm kernel.
    bool moe_normalises(int c, int top_k) const {
        if (!moe || c > k_gemv_max_m) return false;
        if (experts.empty()) return (has_shared ? c <= cuda::k_moe_gemv_max_tokens : c == 1) && experts_decode;
        return expert_q_kernel && !experts_grouped(c, top_k) && !experts_on_host(c, top_k);
    }
};

// The decode rows' bucket: the rows a captured decode step is padded to (qwen_cuda_paged.cpp).
int rows_bucket(int rows);

// Tensor parallel (model/qwen_cuda_tp.cpp): the sum of every rank's partial result, in place, queued on the rank's
// stream (NCCL; captured into the decode graphs like any launch).
class DeviceCollective {
public:
    virtual ~DeviceCollective() = default;
    virtual void all_reduce(void * buf, size_t count, bool f32, cudaStream_t stream) = 0;
    // Every rank's `count` values at `send` gathered into recv [ranks, count] (fp32 or bf16); send may be
    // recv + rank * count (in place).
    virtual void all_gather(const void * send, void * recv, size_t count, bool f32, cudaStream_t stream) = 0;
    // The decode step's sums over peer memory (backends/cuda/peer_sum.h), where the link has them: the buffer `which`
    // (0 or 1, alternating from one call to the next) this rank writes its partial sum of n fp32 values into, or null
    // (no such path for n values: all_reduce instead). add_partials: x [n] += every rank's partial, in rank order.
    virtual float * partial_buffer(int which, size_t n) { return nullptr; }
    virtual void add_partials(float * x, int which, size_t n, cudaStream_t stream) = 0;
};
// Where an engine runs: its GPU and, under tensor parallel, its rank and the link to the other ranks.
struct RankPlace {
    int device = 0;
    int rank = 0;
    int ranks = 1;
    DeviceCollective * link = nullptr;  // null: the whole model on one GPU
};

class CudaQwenEngine : public Engine {
public:
    CudaQwenEngine(std::unique_ptr<Model> model, const EngineOptions & opt, RankPlace place = {});
    ~CudaQwenEngine() override;
    const ModelConfig & config() const override { return model_->config; }
    std::string backend_name() const override { return "cuda"; }
    int new_sequence(int max_tokens) override;
    void free_sequence(int seq) override;
    void plan_batch(int n_sequences, int max_tokens) override;
    uint64_t reserve_batch(int n_sequences, int max_tokens, int prompt_tokens) override;
    void forward(int seq, const std::vector<int> & tokens, bool all_logits, std::vector<float> & logits) override;
    bool decode_greedy(int seq, int token, int n_steps, int n_valid, std::vector<int> & out) override;
    void forward_batch(const std::vector<int> & seqs, const std::vector<int> & tokens, std::vector<float> & logits) override;
    bool decode_greedy_batch(const std::vector<int> & seqs, const std::vector<int> & tokens, int n_steps, int n_valid,
                             std::vector<int> & out) override;
    bool decode_sampled(const std::vector<int> & seqs, const std::vector<int> & tokens, int n_steps, int n_valid, const SamplingParams & p,
                        const std::vector<History> & history, std::vector<int> & out) override;
    uint64_t peak_memory_bytes() const override { return cuda::DeviceAllocator::of_device(place_.device).peak(); }
    PoolInfo make_pool(const PoolOptions & opt) override;
    void step(const std::vector<StepSegment> & segs, const std::vector<int> & tokens, StepOutput & out) override;

private:
    void upload_weights();
    // The parts as bf16, one after another at dst (device memory or mapped host memory), through staging_.
    void copy_bf16(const std::vector<const Weight *> & parts, void * dst, uint64_t * done, Progress & bar);
    DeviceBuffer upload(const std::vector<const Weight *> & parts, const char * what, uint64_t * done, Progress & bar);
    DevLinear upload_dense(const std::vector<const Weight *> & parts, uint64_t * done, Progress & bar);
    DevLinear upload_linear(const std::vector<const Linear *> & parts, uint64_t * done, Progress & bar);
    DevLinear upload_stacked(const std::vector<const Linear *> & parts, bool tile, uint64_t * done, Progress & bar);
    // While loading dummy weights: each distinct stack of quantized parts repacked once (by the parts' tensor addresses).
    std::map<std::vector<const void *>, RepackedQuant> repack_memo_;
    DevMlp upload_mlp(const MlpWeights & m, uint64_t * done, Progress & bar);
    void upload_quant_experts(const MoeWeights & m, DevLayer & D, uint64_t * done, Progress & bar);
    void reset_cache(int n_sequences, int tokens_per_sequence);
    void ensure_workspace(int c);
    bool k_sz_needed() const { return kv_kind_ == cuda::KVKind::INT8 || kv_kind_ == cuda::KVKind::INT4; }  // (scale, zero) per row
    int max_quantized_k() const;           // largest padded k of a quantized projection (0: none)
    size_t dequant_bytes(int rows) const;  // the scratch quantized projections of up to `rows` rows need
    mutable std::map<int, size_t> dequant_bytes_at_;  // dequant_bytes' answers by rows (a pure function of them)
    // Grows dequant_ to dequant_bytes(rows), outside any captured step; true where it moved (graphs that hold it are stale).
    bool ensure_quant_scratch(int rows);
    int prefill_chunk() const;    // tokens per prefill pass (bounds activation memory at any length)
    bool ensure_prefill_kv(int tokens);
    // The prefill attention's key-split scratch (attn_split_) where a sequence of `tokens` over a bf16 cache may split
    // (model/prefill_splits.h), zeroed when made; returns whether it exists.
    bool ensure_attn_split(int tokens);
    // n prompt tokens of one sequence, appended at pos0.. (qwen_cuda_prefill.cpp).
    struct PrefillSegment {
        const int * table = nullptr;  // the sequence's block table, device int [blocks]
        int table_row = -1;           // that table's row of batch_tables_ (needed when segments share a pass)
        int pos0 = 0, n = 0;
        float * logits = nullptr;  // host fp32 [vocab]: the last position's logits (all_logits: [n, vocab]); null: none
        int pick_slot = -1;        // >= 0 (continuous batching): the last position's token picked on the device by
                                   // row_picks_[slot] into slot_tokens_[slot]
        bool decode = false;       // a decoding sequence's one token riding in the pass (DecodeRows)
    };
    // Decode rows in a pass: the first segments (one token each, table row r = their index), their attention by the
    // decode kernel over context lengths len_dev (device int [rows]).
    struct DecodeRows {
        const int * len_dev = nullptr;
        int max_len = 1;
        bool short_ctx = false;
    };
    void prefill(const std::vector<PrefillSegment> & segs, size_t ids_offset, bool all_logits, const DecodeRows * decode = nullptr);
    cuda::KVLayer kv_layer(int layer, const int * block_table, int stride = 0) const;
    cuda::KVLayer kv_layer_batch(int layer) const;
    cuda::QkvRopeArgs rope_args(int layer, const cuda::KVLayer & cache, int n) const;
    bool prepare_batch(const std::vector<int> & seqs, const std::vector<int> & tokens, int n_steps);
    void linear(const bf16 * x, int m, const DevLinear & l, bf16 * y);
    // SwiGLU MLP of m rows through linear(): gate_up into gu [m, 2I], silu(gate) * up into act [m, I], down into out.
    void mlp(const DevMlp & w, const bf16 * x, int m, bf16 * gu, bf16 * act, bf16 * out);
    void project(const DevLinear & l, cuda::GemvArgs a, cuda::GemvIn in, cuda::GemvOut out);
    // decode: the routed sum may go through peer_partial (decode steps only; prefill's sums stay with NCCL).
    // norm.x set (decode steps where L.moe_normalises): xn is not computed, every launch of the block normalises x.
    void moe(const DevLayer & L, int c, const bf16 * xn, float * x, bool decode = false, const cuda::MoeNormIn & norm = {});
    void router(const DevLayer & L, int c, const bf16 * xn, const cuda::MoeNormIn & norm = {});
    // Tensor parallel: o_proj, down and the experts of a rank hold partial sums over its heads and intermediate
    // columns; reduce() sums them over the ranks (a no-op on one GPU). The residual is added once: ranks after the
    // first leave it out of the sums they reduce (partial_only()).
    bool partial_only() const { return place_.rank > 0; }
    void reduce(float * x, size_t n);
    void reduce(bf16 * y, size_t n);
    // In decode steps, a projection's partial sum of n fp32 values goes to the link's peer buffer `which` (o_proj 0,
    // down or the experts 1: they alternate) where it has one, and add_partials adds every rank's into x; null: into
    // x itself, then reduce(). Not where an o_proj stays whole (its reduce is skipped, which would break the alternation).
    float * peer_partial(int which, size_t n) const { return place_.link && !any_o_whole_ ? place_.link->partial_buffer(which, n) : nullptr; }
    void add_partials(float * x, int which, size_t n);
    // Logits of B decode rows into logits_ (fp32 [B, vocab]) from the final-normed rows (fused: from x, normed in the
    // GEMV); under tensor parallel at up to k_tp_split_logits_rows rows, each rank's vocabulary share, all-gathered.
    void decode_logits(int B, bool fused, const float * x, bf16 * xn);
    // o_proj's input for `rows` rows: this rank's attention output, or under L.o_whole every rank's gathered into
    // heads_ (bf16 [rows, L.o.k]; rank r's heads are its r-th column block).
    const bf16 * o_input(const DevLayer & L, int rows);
    // Tensor parallel: every rank's `mine` ([rows, cols], fp32 or bf16) as the r-th column block of out
    // [rows, ranks cols], through scratch [ranks, rows, cols] for more than one row (mine may lie in its block of it).
    void gather_col_blocks(const void * mine, int rows, size_t cols, bool f32, void * scratch, void * out);
    bool split_logits(int B) const {
        return place_.link && B <= k_tp_split_logits_rows && model_->config.vocab_size % place_.ranks == 0;
    }
    // How a decode step ends: logits left in logits_, or the next token picked on the device (state advanced).
    // Pick: each row by its own settings (row_picks_; continuous batching).
    enum class StepEnd { Logits, Argmax, Sample, Pick };
    void decode_step(int batch, StepEnd end);
    bool run_decode_graph(const std::vector<int> & seqs, const std::vector<int> & tokens, int n_steps, int n_valid, StepEnd end,
                          std::vector<int> & out);

    std::unique_ptr<Model> model_;
    EngineOptions opt_;
    RankPlace place_;
    bool any_o_whole_ = false;  // some layer's o_proj whole on every rank (DevLayer::o_whole)
    cudaStream_t stream_ = nullptr;
    // MoE with a shared expert: its kernels run on side_stream_ beside the routed experts (moe()), forked and joined
    // by these events.
    cudaStream_t side_stream_ = nullptr;
    cudaEvent_t moe_fork_ = nullptr, moe_join_ = nullptr;
    DeviceBuffer embed_, final_norm_, lm_head_storage_;
    HostMappedBuffer embed_host_;      // the token embedding in pinned host memory (EngineOptions::embedding_on_gpu)
    const bf16 * embed_table_ = nullptr;  // [vocab, hidden]: embed_ or embed_host_, as the device addresses it
    const bf16 * lm_head_ = nullptr;
    std::vector<DevLayer> layers_;
    RopeFreqs rope_;
    DeviceBuffer inv_freq_;

    // KV cache: bf16 [layer][block][kv_head][block_size][head_dim], sized for kv_seqs_ sequences of kv_tokens_
    // tokens: one request at a time unless plan_batch asked for a batch.
    int block_size_ = 16;
    int kv_seqs_ = 0, kv_tokens_ = 0, kv_blocks_ = 0;
    bool planned_ = false;
    std::unique_ptr<BlockTable> table_;
    cuda::KVKind kv_kind_ = cuda::KVKind::BF16;
    size_t kv_row_bytes_ = 0;            // bytes of one token's head: bf16 values or codes
    DeviceBuffer k_cache_, v_cache_;     // [layer][block][kv_head][slot][kv_row_bytes_]
    DeviceBuffer k_sz_, v_sz_;           // int8/int4: float2 (scale, zero) [layer][block][kv_head][slot]
    // fp8: {K, V} scales per layer, set from the first forward's values (amax / 448) and kept for the engine's life,
    // like the CPU cache; fp8_amax_ is the range pass's scratch.
    DeviceBuffer fp8_scale_, fp8_amax_;
    std::vector<bool> fp8_ready_;
    std::map<int, DeviceBuffer> block_tables_;  // per sequence: int [blocks] on the device
    // The decoding batch: its sequences, their block tables side by side (int [batch, stride]).
    std::vector<int> batch_seqs_;
    DeviceBuffer batch_tables_;
    int batch_stride_ = 0;
    // Every sequence of the decoding batch stays within cuda::k_short_decode_keys keys for the steps prepare_batch
    // made room for (the combine may then start early under PDL; cuda::attention_decode).
    bool decode_short_ = false;

    // Workspaces for `ws_tokens_` tokens at a time.
    int ws_tokens_ = 0;
    DeviceBuffer ids_, x_, xn_, qkv_, q_, attn_, tmp_, gu_, act_, logits_;
    DeviceBuffer logits_gather_;  // tensor parallel: fp32 [ranks, k_tp_split_logits_rows, vocab / ranks] (split_logits)
    DeviceBuffer heads_gather_, heads_;  // tensor parallel, o_whole layers: bf16 [ranks, c, q_dim], [c, ranks q_dim]
    // The prompt's token ids in pinned memory, so each pass's copy to ids_ is asynchronous: from pageable memory
    // cudaMemcpyAsync waited for the stream, and the GPU idled while the host queued every pass (forward()).
    cuda::HostMappedBuffer ids_host_;
    // Passes packing several prompts: each token's position and batch-table row, the rows whose logits are wanted.
    DeviceBuffer pack_;
    cuda::HostMappedBuffer pack_host_;
    DeviceBuffer dequant_;  // the quantized projections' scratch: a dequantized weight, gathered inputs, K splits' sums
    // Prefill over a quantized cache: the sequence's cache so far as bf16 [blocks, n_kv, block_size, head_dim] (K and V,
    // one layer at a time) read through an identity block table [blocks per sequence] by the bf16 attention kernels.
    DeviceBuffer prefill_k_, prefill_v_, prefill_table_;
    // The prefill attention's key splits (cuda::PrefillSplitScratch): partial results and counters, zero when made.
    DeviceBuffer attn_split_;
    DeviceBuffer qscratch_;  // staged GEMV inputs of the quantized kernels: bf16 [cuda::k_qgemv_max_m, largest padded k]
    // MoE layers (moe()): router logits fp32 [c, n_experts (+ 1)], the routing (cuda::MoeRouting: ints, weights), the
    // routed experts' SwiGLU products bf16 [c top_k, inter] (the shared expert's [c, shared inter] share it) and
    // outputs bf16 [c top_k, hidden], the shared expert's output [c, hidden] and gate_up [c, 2 inter] (also the quantized
    // experts'), their gathered inputs [c, hidden], the routing's offsets on the host.
    DeviceBuffer router_logits_, moe_idx_, moe_w_, moe_act_, moe_out_, moe_shared_, moe_gu_, moe_in_;
    DeviceBuffer moe_shared_act_;  // bf16 [min(c, k_moe_beside_max_rows), shared inter]: its SwiGLU products when beside
    DeviceBuffer moe_arrivals_;  // int, zeros between launches: cuda::moe_decode's combine counters
    cuda::HostMappedBuffer moe_offsets_host_;
    cuda::MoeRouting moe_routing() const;
    bool experts_on_host(int c) const;  // some MoE layer's quantized experts run one by one for c tokens (DevLayer::experts_on_host)
    // Decode state of a batch of B on the device: int tokens [B], positions [B], step, context lengths [B] (for B = 1
    // the layout argmax_advance expects); tokens_out_ int [steps, B] produced by the graph.
    DeviceBuffer state_, tokens_out_, split_out_, split_ml_, argmax_scratch_;
    int max_splits_ = 0;
    cudaGraphExec_t graph_ = nullptr;
    std::vector<int> graph_seqs_;  // the batch the graph was captured for (empty: none)
    const void * graph_logits_ = nullptr;  // logits_ when captured (forward() may have grown it since)
    const void * graph_scratch_ = nullptr;  // dequant_ when captured (a prefill may have grown it since)
    const void * graph_argmax_ = nullptr;   // argmax_scratch_ when captured (an eager step of more rows may have grown it)
    int graph_valid_ = 0;
    StepEnd graph_end_ = StepEnd::Argmax;
    bool graph_short_ = false;  // the graph's decode_short_
    cuda::SampleParams graph_sample_;  // the sampling parameters captured (StepEnd::Sample)
    // Sampling state of the decoding sequence: ids seen (prompt and output), output counts, penalised logits.
    cuda::SampleParams sample_params_;
    DeviceBuffer sample_seen_, sample_counts_, sample_work_;
    // Continuous batching (qwen_cuda_paged.cpp): the cache is a pool of kv_blocks_ - 1 blocks plus one that padding
    // rows write to; a step's block tables sit in batch_tables_ as rows of pool_stride_ (decode rows first, then
    // the step's prompt chunks from row pool_rows_); one decode graph per (rows bucket, splits, short context).
    bool pooled_ = false;
    PoolOptions pool_opt_;
    int pool_rows_ = 0, pool_stride_ = 0, scratch_block_ = 0;
    // Decode-attention splits for `rows` pool rows whose longest sequence holds max_len keys: sized for the power of
    // two at or above max_len (fewer distinct graphs), at most a block table's reach.
    int pool_decode_splits(int max_len, int rows) const;
    DeviceBuffer row_picks_;            // cuda::RowPick [2 * pool_rows_]: decode rows from 0, prompt chunks from pool_rows_
    DeviceBuffer slot_tokens_;          // int [2 * pool_rows_]: tokens picked in prefill passes (PrefillSegment::pick_slot)
    DeviceBuffer pick_history_;         // int: the step's penalised rows' prompts and outputs, one after another
    std::unique_ptr<cuda::HostStaging> staging_;  // while the weights load (upload_weights)
    cuda::HostMappedBuffer history_host_;  // their pinned staging
    cuda::HostMappedBuffer step_host_;  // pinned staging of a step: tables, decode state, picks, picked tokens
    std::map<std::tuple<int, int, bool>, cudaGraphExec_t> pool_graphs_;
    void drop_pool_graphs();
    StepProfiler prof_;
    bool profile_decode_ = false;  // QINFER_PROFILE: the next decode step runs eagerly, profiled
};

}  // namespace qinfer::cuda_engine
