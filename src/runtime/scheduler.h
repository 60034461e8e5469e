// Continuous batching: one engine, many requests. Every step the running sequences decode together while waiting
// prompts are prefilled in chunks inside the same step, under a token budget; a sequence that stops leaves at once and
// frees its blocks; new requests join at the next step. KV blocks come from one shared pool (runtime/block_pool.h):
// a request is admitted when blocks are free, full prompt blocks are shared through the prefix index, and when the
// pool runs out mid-generation the newest sequence is preempted (its blocks freed, recomputed later; its own full
// blocks usually come back as prefix hits).
//
// submit() and cancel() may be called from any thread; step() (or serve_loop()) from one thread, which also runs the
// requests' callbacks.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/block_pool.h"
#include "runtime/engine.h"
#include "runtime/sampler.h"

namespace qinfer {

struct SchedulerOptions {
    PoolOptions pool;          // rows and tokens per step, memory, the sequence length the tables hold
    bool prefix_cache = true;  // share full prompt blocks between requests
    int max_waiting = 0;       // submit() refuses beyond this many waiting requests (0: no limit)
    // A CSV line for every step and every finished request, times in ms since the scheduler began (empty: none):
    //   step,t_start,ms,device_wait_ms,decode_rows,chunks,chunk_tokens,admitted,finished,running,waiting
    //   req,id,t_submit,t_admit,t_first_token,t_finish,prompt_tokens,cached_tokens,output_tokens,stop_reason
    std::string step_log;
};

struct RequestOptions {
    std::vector<int> prompt;
    int max_new_tokens = 16;
    SamplingParams sampling;
    std::vector<int> eos_token_ids;
    bool ignore_eos = false;
    int n_valid_tokens = 0;  // 0: the whole vocabulary
    int logprobs = -1;       // the chosen token's log-probability and this many top alternatives (-1: none; <= 20)
};

struct TokenEvent {
    int token = 0;
    float logprob = 0;                          // when asked for (RequestOptions::logprobs >= 0)
    std::vector<std::pair<int, float>> top;     // the most likely ids and their log-probabilities, best first
};

struct RequestOutcome {
    std::vector<int> tokens;            // generated tokens
    std::string stop_reason = "length"; // length | eos | cancelled | callback | error
    std::string error;                  // stop_reason error: why
    int cached_prompt_tokens = 0;       // prompt tokens found in the prefix cache at admission
    int preemptions = 0;
    double queue_seconds = 0;           // submitted -> admitted
    double ttft_seconds = 0;            // submitted -> first token
    double total_seconds = 0;           // submitted -> finished
};

struct RequestCallbacks {
    // Each new token, on the scheduler's thread; false cancels the request (stop_reason "callback").
    std::function<bool(const TokenEvent &)> on_token;
    // Exactly once, on the scheduler's thread (or in the destructor, for requests still queued or running).
    std::function<void(const RequestOutcome &)> on_finish;
};

struct SchedulerStats {
    int running = 0, waiting = 0;
    int blocks_total = 0, blocks_used = 0, blocks_cached = 0;
    uint64_t prompt_tokens = 0, prefix_hit_tokens = 0;  // admitted prompts' tokens, and those found cached
    uint64_t generated_tokens = 0, finished = 0, preemptions = 0, steps = 0;
    double busy_seconds = 0;  // time inside steps
    double wait_seconds = 0;    // of it, the host blocked on the device (the rest: scheduling, staging, launches, callbacks)
    double launch_seconds = 0;  // and launching captured steps
};

class Scheduler {
public:
    Scheduler(Engine & engine, const SchedulerOptions & opt);
    ~Scheduler();
    Scheduler(const Scheduler &) = delete;
    Scheduler & operator=(const Scheduler &) = delete;

    const PoolInfo & pool() const { return pool_info_; }
    // Tokens (prompt + new) one request may hold: the block table's length, and no more than the whole pool.
    int max_request_tokens() const;
    // Queues a request and returns its id. Throws qinfer::Error before queueing when it can never run (empty prompt,
    // ids outside the vocabulary, longer than max_request_tokens(), bad settings), and QueueFull when max_waiting
    // requests are waiting.
    uint64_t submit(RequestOptions req, RequestCallbacks cb);
    struct QueueFull : std::runtime_error {
        using std::runtime_error::runtime_error;
    };
    // Stops a request at the next step (no effect when it has finished).
    void cancel(uint64_t id);
    // One step: admissions, cancellations, one engine step, tokens to their requests. false when there was nothing to do.
    bool step();
    // Steps until no request is left.
    void run_until_idle();
    // Steps while requests exist, sleeps while none do, returns once stop() was called.
    void serve_loop();
    void stop();
    SchedulerStats stats() const;

private:
    struct Seq;
    void drain_inbox();
    void finish(Seq & s, const char * reason, const std::string & error = "");
    void admit_prefix(Seq & s);
    bool ensure_blocks(Seq & s, int n_tokens);
    void preempt(Seq & s);
    void publish_full_blocks(Seq & s);
    bool emit(Seq & s, int token, const float * logits);
    void update_stats(double step_seconds, double wait_seconds = 0, double launch_seconds = 0);

    Engine & engine_;
    SchedulerOptions opt_;
    PoolInfo pool_info_;
    std::unique_ptr<BlockPool> pool_;
    int vocab_ = 0;

    mutable std::mutex mu_;           // guards inbox_, cancels_, stats_, stop_
    std::condition_variable wake_;
    std::vector<std::unique_ptr<Seq>> inbox_;
    std::vector<uint64_t> cancels_;
    bool stop_ = false;
    uint64_t next_id_ = 1;
    SchedulerStats stats_;

    std::FILE * log_ = nullptr;       // opt_.step_log, open
    std::chrono::steady_clock::time_point t_begin_;
    double log_ms(std::chrono::steady_clock::time_point t) const;

    std::deque<std::unique_ptr<Seq>> waiting_;  // FCFS; preempted sequences go to the front
    std::vector<std::unique_ptr<Seq>> running_; // in admission order: the newest last
};

}  // namespace qinfer
