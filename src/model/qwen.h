// The decoder of the Qwen family (qwen2 = Qwen1.5/2/2.5, qwen3, qwen2_moe, qwen3_moe) and Llama-3, which share
// one architecture and differ only in flags the config carries: q/k/v biases, Qwen3's per-head q/k RMSNorm,
// MoE MLPs with an optional shared expert, and the rope scaling. One forward pass serves them all; a copy per
// architecture would only repeat it.
#pragma once

#include <memory>
#include <vector>

#include "model/rope.h"
#include "model/weights.h"
#include "runtime/engine.h"
#include "runtime/kv_cache.h"

namespace qinfer {

// Tensor parallel on the CPU (model/qwen_tp.h): how a rank's engine meets the other ranks. all_reduce leaves the sum
// over ranks in x on every rank (added in rank order, so every rank holds the same bits); all_gather_cols assembles a
// [rows, total] matrix on every rank from each rank's columns [col0, col0 + cols).
class TpLink {
public:
    virtual ~TpLink() = default;
    virtual void all_reduce(float * x, size_t n) = 0;
    virtual void all_gather_cols(const float * mine, int rows, int col0, int cols, int total, float * out) = 0;
};

class CpuQwenEngine : public Engine {
public:
    CpuQwenEngine(std::unique_ptr<Model> model, const EngineOptions & opt);
    const ModelConfig & config() const override { return model_->config; }
    std::string backend_name() const override { return "cpu"; }
    int new_sequence(int max_tokens) override;
    void free_sequence(int seq) override;
    void forward(int seq, const std::vector<int> & tokens, bool all_logits, std::vector<float> & logits) override;
    void forward_batch(const std::vector<int> & seqs, const std::vector<int> & tokens, std::vector<float> & logits) override;
    PoolInfo make_pool(const PoolOptions & opt) override;
    void step(const std::vector<StepSegment> & segs, const std::vector<int> & tokens, StepOutput & out) override;
    const Model & model() const { return *model_; }
    // Makes this engine one rank of a tensor-parallel group: its model holds the rank's heads and intermediate
    // columns (partial sums after o_proj and down_proj, reduced through `link`) and rows [vocab0, vocab0 + n_vocab)
    // of the embedding and lm_head (config().vocab_size stays the whole vocabulary).
    void join_tensor_parallel(TpLink * link, int vocab0, int n_vocab);
    const CpuKVCache & kv_cache() const { return kv_; }

private:
    struct Segment {
        int seq;                                  // rows appended to this sequence of kv_.table() (-1: `blocks`)
        const std::vector<int> * blocks;          // the scheduler's block table (seq -1)
        int pos0, n;                              // at positions pos0..pos0+n-1
    };
    void run(const std::vector<Segment> & segs, const std::vector<int> & tokens, bool all_logits, std::vector<float> & logits);
    void attention(int layer, const std::vector<int> & blocks, int n, int pos0, const float * q, float * out) const;
    void mlp(const MlpWeights & w, int n, const float * x, float * out) const;
    void moe(const MoeWeights & w, int n, const float * x, float * out) const;
    void embed(const std::vector<int> & tokens, float * x) const;

    std::unique_ptr<Model> model_;
    CpuKVCache kv_;
    bool pooled_ = false;  // make_pool was called: the scheduler owns the blocks
    RopeFreqs rope_;  // static scalings; dynamic NTK recomputes per call
    TpLink * tp_ = nullptr;  // tensor parallel: the other ranks (null: the whole model is here)
    int vocab0_ = 0, n_vocab_ = 0;
};

}  // namespace qinfer
