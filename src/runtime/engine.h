// What the generation loop, the CLI and the benchmark need from a backend.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "io/model_config.h"
#include "runtime/sampler.h"

namespace qinfer {

// Continuous batching (runtime/scheduler.h): the scheduler owns a pool of KV blocks and every sequence's block table,
// and asks the engine for one step at a time over many sequences.
struct PoolOptions {
    int max_rows = 256;             // sequences in one step, at most
    int max_step_tokens = 2048;     // tokens in one step (one per decoding sequence, plus prompt chunks), at most
    int max_seq_tokens = 0;         // longest sequence (prompt + output) a block table holds (0: the model's context)
    double memory_fraction = 0.90;  // CUDA: the share of the card's memory the engine may hold, weights included
    int n_blocks = 0;               // a fixed number of blocks instead (0: as many as memory allows)
};
struct PoolInfo {
    int n_blocks = 0;
    int block_size = 16;
    int max_seq_tokens = 0;
};

// One sequence's part of a step: rows n (consecutive in the step's token list) appended at positions pos0..pos0+n-1 of
// the sequence whose cache is `blocks` (position order, covering pos0 + n tokens).
struct StepSegment {
    const std::vector<int> * blocks = nullptr;
    int pos0 = 0;
    int n = 0;
    // After the last row: pick the next token (sampling: the request's settings) or leave nothing (a prompt chunk
    // that does not end the sequence's known tokens). need_logits asks for the row's logits (host sampling with
    // penalties, log-probabilities) instead of a token picked on the device.
    bool pick = false;
    const SamplingParams * sampling = nullptr;
    bool need_logits = false;
    // The sequence's prompt and generated tokens so far, for penalties applied on the device.
    const std::vector<int> * prompt = nullptr;
    const std::vector<int> * output = nullptr;
    int n_valid = 0;  // ids a pick may return: below this (the tokenizer's size; 0: the whole vocabulary)
};
struct StepOutput {
    std::vector<int> tokens;      // per segment: the token picked on the device, or -1 (logits_row says where the logits are)
    std::vector<int> logits_row;  // per segment: its row of `logits`, or -1
    std::vector<float> logits;    // fp32 [rows, vocab]
    double wait_seconds = 0;      // the host's time blocked on the device in this step (CUDA: its synchronisation)
    double launch_seconds = 0;    // the host's time in launching a captured step (CUDA: cudaGraphLaunch)
};

class Engine {
public:
    virtual ~Engine() = default;
    virtual const ModelConfig & config() const = 0;
    virtual std::string backend_name() const = 0;
    // Announces a static batch: n sequences of up to max_tokens each are about to be created (no sequence alive).
    // Backends that size their cache per request size it here; the CPU's is sized by EngineOptions.
    virtual void plan_batch(int n_sequences, int max_tokens) {}
    // Allocates, without computing, everything a static batch of n sequences of max_tokens (prompts of prompt_tokens)
    // will hold on the device, and returns the device bytes then in use; throws OutOfMemory when the card cannot.
    // Backends without device memory throw qinfer::Error.
    virtual uint64_t reserve_batch(int n_sequences, int max_tokens, int prompt_tokens);
    // A new sequence with KV cache room for `max_tokens`; throws when the cache cannot hold it.
    virtual int new_sequence(int max_tokens) = 0;
    virtual void free_sequence(int seq) = 0;
    // Appends `tokens` to the sequence (positions continue from its length) and returns fp32 logits
    // [n_out, vocab]: every position when `all_logits`, else only the last one.
    virtual void forward(int seq, const std::vector<int> & tokens, bool all_logits, std::vector<float> & logits) = 0;
    // Greedy decoding on the device: feeds `token` (sampled, not yet in the cache) and runs `n_steps` steps, each
    // taking the argmax over ids below `n_valid`; returns the n_steps new tokens. Backends without it return false.
    virtual bool decode_greedy(int seq, int token, int n_steps, int n_valid, std::vector<int> & out) { return false; }
    // Sampled decoding on the device, decode_greedy_batch's generalisation: tokens[i] feeds seqs[i]; the host
    // Sampler's rules (runtime/sampler.h) with penalties over each sequence's prompt and output so far (`token` last),
    // and the device's own random numbers, so tokens differ from the host Sampler's for the same seed. out: n_steps x n,
    // step-major. Backends (or parameters, e.g. top_k 0) without it return false.
    struct History {
        const std::vector<int> * prompt;
        const std::vector<int> * output;
    };
    virtual bool decode_sampled(const std::vector<int> & seqs, const std::vector<int> & tokens, int n_steps, int n_valid,
                                const SamplingParams & p, const std::vector<History> & history, std::vector<int> & out) {
        return false;
    }
    // One decode step of a static batch: tokens[i] is appended to seqs[i] (distinct sequences); returns fp32 logits
    // [n, vocab], row i for seqs[i]. The default runs the sequences one after another.
    virtual void forward_batch(const std::vector<int> & seqs, const std::vector<int> & tokens, std::vector<float> & logits);
    // decode_greedy for a batch: tokens[i] feeds seqs[i]; out holds n_steps x n tokens, step-major. Backends without
    // it return false.
    virtual bool decode_greedy_batch(const std::vector<int> & seqs, const std::vector<int> & tokens, int n_steps, int n_valid,
                                     std::vector<int> & out) {
        return false;
    }
    // Peak device memory since the current sequence was created (0 on the CPU).
    virtual uint64_t peak_memory_bytes() const { return 0; }
    // Continuous batching. make_pool sizes the cache as a pool of blocks for steps of up to opt.max_rows sequences
    // (no sequence of the calls above may be alive, and none is afterwards); step() runs one step: the segments'
    // tokens are written to the cache and attended to, and each picking segment gets its next token or its logits
    // (StepOutput). Backends without it throw.
    virtual PoolInfo make_pool(const PoolOptions & opt);
    virtual void step(const std::vector<StepSegment> & segs, const std::vector<int> & tokens, StepOutput & out);
};

// Throws unless seqs and tokens have the same non-zero length and the sequences are distinct.
void check_batch(const std::vector<int> & seqs, const std::vector<int> & tokens);

struct EngineOptions {
    std::string backend = "auto";  // auto | cpu | cuda
    int max_context = 0;           // KV cache capacity in tokens for one sequence (0: a default)
    int max_sequences = 1;         // sequences alive at once (a static batch); the cache holds max_context for each
    int threads = 0;               // CPU threads (0: all)
    std::string kv_dtype = "auto"; // auto (CPU fp32, CUDA bf16) | fp32 | bf16 | fp8 | int8 | int4 (runtime/kv_cache.h)
    // CUDA: where the token embedding lives when lm_head is a separate matrix (it is read one row per token): pinned
    // host memory mapped into the GPU's address space (false, as llama.cpp keeps token_embd on the CPU), or the GPU.
    // A tied table is lm_head too and always stays on the GPU.
    bool embedding_on_gpu = false;
    // Tensor-parallel ranks: the model split over this many ranks of one process, threads on the CPU
    // (model/qwen_tp.h) or GPUs 0..tp-1 joined by NCCL (model/qwen_cuda_tp.cpp).
    int tp = 1;
    // Tensor parallel over several hosts (the GPUs' only): tp ranks in all, tp / nnodes GPUs on each node; every node
    // runs the same command, node 0 listening at master_addr ("host:port") for the TCP rendezvous (runtime/rendezvous.h).
    int nnodes = 1;
    int node_rank = 0;
    std::string master_addr;
    // Let max_context exceed the model's max_position_embeddings (plain RoPE only; load_model's past_context).
    bool past_context = false;
    // --load-format dummy: random weights from config.json alone (model/weights.h LoadOptions).
    bool dummy_weights = false;
};

// How the engines load their model (model/weights.h): past_context and dummy_weights as LoadOptions.
struct LoadOptions;
LoadOptions load_options(const EngineOptions & opt);

std::unique_ptr<Engine> make_cpu_engine(const std::string & model_dir, const EngineOptions & opt);
std::unique_ptr<Engine> make_cpu_tp_engine(const std::string & model_dir, const EngineOptions & opt);  // model/qwen_tp.h
std::unique_ptr<Engine> make_engine(const std::string & model_dir, const EngineOptions & opt);
bool cuda_available();

}  // namespace qinfer
