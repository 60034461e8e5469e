#include "runtime/scheduler.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/check.h"

namespace qinfer {

namespace {
using Clock = std::chrono::steady_clock;
double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }
}  // namespace

struct Scheduler::Seq {
    Seq(uint64_t id_, RequestOptions r, RequestCallbacks c, int n_valid)
        : id(id_), req(std::move(r)), cb(std::move(c)), tokens(req.prompt), sampler(req.sampling, n_valid), t_submit(Clock::now()) {}
    uint64_t id;
    RequestOptions req;
    RequestCallbacks cb;
    std::vector<int> tokens;          // the prompt, then every generated token: what the cache must come to hold
    std::vector<int> output;          // generated tokens (the sampler's history)
    int computed = 0;                 // leading tokens whose K/V are in `blocks`
    std::vector<int> blocks;          // the block table
    std::vector<uint64_t> hashes;     // chain hash of each leading full block entered into (or found in) the prefix index
    Sampler sampler;
    bool admitted = false, cancelled = false;
    int cached_prompt_tokens = 0, preemptions = 0;
    Clock::time_point t_submit, t_admit, t_first;
    int remaining() const { return int(tokens.size()) - computed; }
};

Scheduler::Scheduler(Engine & engine, const SchedulerOptions & opt) : engine_(engine), opt_(opt) {
    QINFER_CHECK(opt.pool.max_rows >= 1 && opt.pool.max_step_tokens >= 1) << "scheduler: max_rows and max_step_tokens must be >= 1";
    pool_info_ = engine_.make_pool(opt.pool);
    pool_ = std::make_unique<BlockPool>(pool_info_.n_blocks, pool_info_.block_size);
    vocab_ = engine_.config().vocab_size;
    stats_.blocks_total = pool_info_.n_blocks;
    t_begin_ = Clock::now();
    if (!opt_.step_log.empty()) {
        log_ = std::fopen(opt_.step_log.c_str(), "w");
        if (!log_) QINFER_FAIL() << "cannot write the step log " << opt_.step_log;
        std::fputs("# step,t_start_ms,ms,device_wait_ms,decode_rows,chunks,chunk_tokens,admitted,finished,running,waiting\n"
                   "# req,id,t_submit_ms,t_admit_ms,t_first_token_ms,t_finish_ms,prompt_tokens,cached_tokens,output_tokens,stop_reason\n",
                   log_);
    }
}

double Scheduler::log_ms(Clock::time_point t) const { return std::chrono::duration<double, std::milli>(t - t_begin_).count(); }

Scheduler::~Scheduler() {
    std::vector<std::unique_ptr<Seq>> left;
    {
        std::lock_guard<std::mutex> lock(mu_);
        for (auto & s : inbox_) left.push_back(std::move(s));
        inbox_.clear();
    }
    for (auto & s : waiting_) left.push_back(std::move(s));
    for (auto & s : running_) left.push_back(std::move(s));
    waiting_.clear();
    running_.clear();
    for (auto & s : left) finish(*s, "cancelled");
    if (log_) std::fclose(log_);
}

int Scheduler::max_request_tokens() const { return std::min(pool_info_.max_seq_tokens, pool_info_.n_blocks * pool_info_.block_size); }

uint64_t Scheduler::submit(RequestOptions req, RequestCallbacks cb) {
    if (req.prompt.empty()) QINFER_FAIL() << "the prompt is empty: give at least one token";
    if (req.max_new_tokens < 1) QINFER_FAIL() << "max_new_tokens must be >= 1 (got " << req.max_new_tokens << ")";
    for (int id : req.prompt) {
        if (id < 0 || id >= vocab_) QINFER_FAIL() << "token id " << id << " is outside the vocabulary [0, " << vocab_ << ")";
    }
    if (req.logprobs > 20) QINFER_FAIL() << "logprobs must be at most 20 (got " << req.logprobs << ")";
    const int64_t total = int64_t(req.prompt.size()) + req.max_new_tokens;
    if (total > max_request_tokens()) {
        QINFER_FAIL() << "prompt of " << req.prompt.size() << " tokens + " << req.max_new_tokens << " new tokens does not fit: one request may hold "
                      << max_request_tokens() << " tokens here";
    }
    const int n_valid = req.n_valid_tokens > 0 ? std::min(req.n_valid_tokens, vocab_) : vocab_;
    std::lock_guard<std::mutex> lock(mu_);
    if (opt_.max_waiting > 0 && stats_.waiting + int(inbox_.size()) >= opt_.max_waiting) {
        throw QueueFull(std::to_string(opt_.max_waiting) + " requests are waiting already");
    }
    const uint64_t id = next_id_++;
    inbox_.push_back(std::make_unique<Seq>(id, std::move(req), std::move(cb), n_valid));
    wake_.notify_one();
    return id;
}

void Scheduler::cancel(uint64_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    cancels_.push_back(id);
    wake_.notify_one();
}

void Scheduler::stop() {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    wake_.notify_all();
}

SchedulerStats Scheduler::stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
}

void Scheduler::drain_inbox() {
    std::vector<uint64_t> cancels;
    {
        std::lock_guard<std::mutex> lock(mu_);
        for (auto & s : inbox_) waiting_.push_back(std::move(s));
        inbox_.clear();
        cancels.swap(cancels_);
    }
    if (cancels.empty()) return;
    auto cancelled = [&](const std::unique_ptr<Seq> & s) { return std::find(cancels.begin(), cancels.end(), s->id) != cancels.end(); };
    for (auto * list : {&waiting_}) {
        for (auto it = list->begin(); it != list->end();) {
            if (cancelled(*it)) {
                finish(**it, "cancelled");
                it = list->erase(it);
            } else {
                ++it;
            }
        }
    }
    for (auto it = running_.begin(); it != running_.end();) {
        if (cancelled(*it)) {
            finish(**it, "cancelled");
            it = running_.erase(it);
        } else {
            ++it;
        }
    }
}

void Scheduler::finish(Seq & s, const char * reason, const std::string & error) {
    pool_->release(s.blocks);
    s.blocks.clear();
    s.hashes.clear();
    RequestOutcome o;
    o.tokens = std::move(s.output);
    o.stop_reason = reason;
    o.error = error;
    o.cached_prompt_tokens = s.cached_prompt_tokens;
    o.preemptions = s.preemptions;
    const auto now = Clock::now();
    o.queue_seconds = s.admitted ? seconds(s.t_submit, s.t_admit) : seconds(s.t_submit, now);
    o.ttft_seconds = o.tokens.empty() ? 0 : seconds(s.t_submit, s.t_first);
    o.total_seconds = seconds(s.t_submit, now);
    {
        std::lock_guard<std::mutex> lock(mu_);
        stats_.finished++;
    }
    if (log_) {
        std::fprintf(log_, "req,%llu,%.3f,%.3f,%.3f,%.3f,%zu,%d,%zu,%s\n", static_cast<unsigned long long>(s.id), log_ms(s.t_submit),
                     s.admitted ? log_ms(s.t_admit) : -1.0, o.tokens.empty() ? -1.0 : log_ms(s.t_first), log_ms(now), s.req.prompt.size(),
                     s.cached_prompt_tokens, o.tokens.size(), reason);
    }
    if (s.cb.on_finish) s.cb.on_finish(o);
}

// The longest run of the prompt's full blocks found in the prefix index, taken by reference. At least one token is
// left to compute, so that the last one's logits exist.
void Scheduler::admit_prefix(Seq & s) {
    const int bs = pool_info_.block_size;
    if (opt_.prefix_cache) {
        const int limit = (int(s.tokens.size()) - 1) / bs;
        uint64_t parent = 0;
        for (int b = 0; b < limit; b++) {
            const int * t = s.tokens.data() + size_t(b) * bs;
            const uint64_t h = BlockPool::chain_hash(parent, t, bs);
            const int block = pool_->lookup(h, parent, t);
            if (block < 0) break;
            s.blocks.push_back(block);
            s.hashes.push_back(h);
            parent = h;
        }
    }
    s.computed = int(s.blocks.size()) * bs;
}

bool Scheduler::ensure_blocks(Seq & s, int n_tokens) {
    const int bs = pool_info_.block_size;
    const int need = (n_tokens + bs - 1) / bs - int(s.blocks.size());
    return need <= 0 || pool_->allocate(need, s.blocks);
}

// Frees a running sequence's blocks and sends it to the front of the queue: it is computed again from its prompt and
// output so far when blocks are free (its full blocks, left in the prefix index, usually come back as hits).
void Scheduler::preempt(Seq & s) {
    pool_->release(s.blocks);
    s.blocks.clear();
    s.hashes.clear();
    s.computed = 0;
    s.preemptions++;
    {
        std::lock_guard<std::mutex> lock(mu_);
        stats_.preemptions++;
    }
    for (auto it = running_.begin(); it != running_.end(); ++it) {
        if (it->get() == &s) {
            waiting_.push_front(std::move(*it));
            running_.erase(it);
            return;
        }
    }
}

void Scheduler::publish_full_blocks(Seq & s) {
    if (!opt_.prefix_cache) return;
    const int bs = pool_info_.block_size;
    const int full = s.computed / bs;
    for (int b = int(s.hashes.size()); b < full; b++) {
        const uint64_t parent = b > 0 ? s.hashes[size_t(b - 1)] : 0;
        const int * t = s.tokens.data() + size_t(b) * bs;
        const uint64_t h = BlockPool::chain_hash(parent, t, bs);
        pool_->publish(s.blocks[size_t(b)], h, parent, t);
        s.hashes.push_back(h);
    }
}

// A new token for a sequence: its log-probabilities when asked for (from the raw logits), the callback, the stop
// conditions. false when the sequence is done.
bool Scheduler::emit(Seq & s, int token, const float * logits) {
    TokenEvent ev;
    ev.token = token;
    if (s.req.logprobs >= 0 && logits) {
        const int n_valid = s.req.n_valid_tokens > 0 ? std::min(s.req.n_valid_tokens, vocab_) : vocab_;
        const float mx = *std::max_element(logits, logits + n_valid);
        double sum = 0;
        for (int i = 0; i < n_valid; i++) sum += std::exp(double(logits[i]) - mx);
        const double lse = mx + std::log(sum);
        ev.logprob = float(logits[token] - lse);
        std::vector<int> ids(static_cast<size_t>(n_valid));
        for (int i = 0; i < n_valid; i++) ids[size_t(i)] = i;
        const int k = std::min(s.req.logprobs, n_valid);
        std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [&](int a, int b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
        for (int j = 0; j < k; j++) ev.top.emplace_back(ids[size_t(j)], float(logits[ids[size_t(j)]] - lse));
    }
    if (s.output.empty()) s.t_first = Clock::now();
    s.output.push_back(token);
    s.tokens.push_back(token);
    {
        std::lock_guard<std::mutex> lock(mu_);
        stats_.generated_tokens++;
    }
    if (s.cb.on_token && !s.cb.on_token(ev)) {
        finish(s, "callback");
        return false;
    }
    if (!s.req.ignore_eos && std::find(s.req.eos_token_ids.begin(), s.req.eos_token_ids.end(), token) != s.req.eos_token_ids.end()) {
        finish(s, "eos");
        return false;
    }
    if (int(s.output.size()) >= s.req.max_new_tokens) {
        finish(s, "length");
        return false;
    }
    return true;
}

bool Scheduler::step() {
    const auto t0 = Clock::now();
    drain_inbox();
    if (running_.empty() && waiting_.empty()) {
        update_stats(0);
        return false;
    }
    const int max_rows = opt_.pool.max_rows;
    int budget = opt_.pool.max_step_tokens;
    std::vector<Seq *> owners;
    std::vector<StepSegment> segs;
    std::vector<int> tokens;
    int admitted = 0;
    auto add = [&](Seq & s, int n) {
        StepSegment g;
        g.blocks = &s.blocks;
        g.pos0 = s.computed;
        g.n = n;
        g.pick = s.computed + n == int(s.tokens.size());
        g.sampling = &s.req.sampling;
        g.need_logits = s.req.logprobs >= 0;
        g.prompt = &s.req.prompt;
        g.output = &s.output;
        g.n_valid = s.req.n_valid_tokens;
        segs.push_back(g);
        tokens.insert(tokens.end(), s.tokens.begin() + s.computed, s.tokens.begin() + s.computed + n);
        owners.push_back(&s);
        budget -= n;
    };
    // Decoding sequences first (one token each), oldest first; where the pool is out of blocks the newest running
    // sequence is preempted, which may be this one.
    for (size_t i = 0; i < running_.size() && int(segs.size()) < max_rows && budget > 0;) {
        Seq & s = *running_[i];
        if (s.remaining() != 1) {
            i++;
            continue;
        }
        bool fits = ensure_blocks(s, s.computed + 1);
        while (!fits && running_.back().get() != &s) {
            preempt(*running_.back());
            fits = ensure_blocks(s, s.computed + 1);
        }
        if (!fits) {
            preempt(s);
            break;
        }
        add(s, 1);
        i++;
    }
    const int decode_rows = int(segs.size());
    // Prompts being prefilled, then waiting requests: chunks within the budget and the free blocks.
    auto chunk_for = [&](Seq & s) {
        const int bs = pool_info_.block_size;
        const int room = (int(s.blocks.size()) + pool_->available()) * bs - s.computed;
        return std::min({s.remaining(), budget, room});
    };
    for (auto & p : running_) {
        Seq & s = *p;
        if (int(segs.size()) >= max_rows || budget <= 0) break;
        if (s.remaining() <= 1 || std::find(owners.begin(), owners.end(), &s) != owners.end()) continue;
        const int n = chunk_for(s);
        if (n <= 0 || !ensure_blocks(s, s.computed + n)) continue;
        add(s, n);
    }
    while (!waiting_.empty() && int(running_.size()) < max_rows && int(segs.size()) < max_rows && budget > 0) {
        Seq & s = *waiting_.front();
        admit_prefix(s);
        const int n = chunk_for(s);
        if (n <= 0 || !ensure_blocks(s, s.computed + n)) {
            pool_->release(s.blocks);  // back to waiting as it was; its prefix is matched again next time
            s.blocks.clear();
            s.hashes.clear();
            s.computed = 0;
            break;
        }
        if (!s.admitted) {  // the first admission (not a preempted sequence's return): queue time and prefix hits
            s.admitted = true;
            s.t_admit = Clock::now();
            s.cached_prompt_tokens = s.computed;
            std::lock_guard<std::mutex> lock(mu_);
            stats_.prompt_tokens += s.req.prompt.size();
            stats_.prefix_hit_tokens += uint64_t(s.computed);
        }
        running_.push_back(std::move(waiting_.front()));
        waiting_.pop_front();
        add(s, n);
        admitted++;
    }
    if (segs.empty() && !running_.empty()) {
        // Every running sequence is a prompt that found no free block: the newest gives its blocks back.
        preempt(*running_.back());
    }
    double wait = 0, launch = 0;
    if (!segs.empty()) {
        StepOutput out;
        try {
            engine_.step(segs, tokens, out);
        } catch (const std::exception & e) {
            // The step's requests cannot go on (the engine said why); the others are untouched.
            for (Seq * s : owners) {
                finish(*s, "error", e.what());
                running_.erase(std::find_if(running_.begin(), running_.end(), [&](const auto & p) { return p.get() == s; }));
            }
            update_stats(seconds(t0, Clock::now()));
            return true;
        }
        std::vector<Seq *> done;
        for (size_t i = 0; i < segs.size(); i++) {
            Seq & s = *owners[i];
            s.computed += segs[i].n;
            publish_full_blocks(s);
            if (!segs[i].pick) continue;
            float * row = out.logits_row[i] >= 0 ? out.logits.data() + size_t(out.logits_row[i]) * size_t(vocab_) : nullptr;
            int token = out.tokens[i];
            std::vector<float> raw;
            if (token < 0) {
                QINFER_CHECK(row) << "engine step: neither a token nor logits for a picking segment";
                if (s.req.logprobs >= 0) raw.assign(row, row + vocab_);  // the sampler changes the row in place
                token = s.sampler.sample(row, vocab_, s.req.prompt, s.output);
            }
            if (!emit(s, token, raw.empty() ? row : raw.data())) done.push_back(&s);
        }
        for (Seq * s : done) running_.erase(std::find_if(running_.begin(), running_.end(), [&](const auto & p) { return p.get() == s; }));
        wait = out.wait_seconds;
        launch = out.launch_seconds;
        if (log_) {
            const int chunk_tokens = int(tokens.size()) - decode_rows;
            std::fprintf(log_, "step,%.3f,%.3f,%.3f,%d,%d,%d,%d,%zu,%zu,%zu\n", log_ms(t0), seconds(t0, Clock::now()) * 1e3, wait * 1e3, decode_rows,
                         int(segs.size()) - decode_rows, chunk_tokens, admitted, done.size(), running_.size(), waiting_.size());
        }
    }
    update_stats(seconds(t0, Clock::now()), wait, launch);
    return true;
}

void Scheduler::update_stats(double step_seconds, double wait_seconds, double launch_seconds) {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.steps += step_seconds > 0;
    stats_.running = int(running_.size());
    stats_.waiting = int(waiting_.size());
    stats_.blocks_used = pool_->used();
    stats_.blocks_cached = pool_->cached();
    stats_.busy_seconds += step_seconds;
    stats_.wait_seconds += wait_seconds;
    stats_.launch_seconds += launch_seconds;
}

void Scheduler::run_until_idle() {
    while (step()) {
    }
}

void Scheduler::serve_loop() {
    for (;;) {
        {
            std::unique_lock<std::mutex> lock(mu_);
            if (log_ && !stop_ && inbox_.empty() && cancels_.empty() && running_.empty() && waiting_.empty()) std::fflush(log_);  // idle
            wake_.wait(lock, [&] { return stop_ || !inbox_.empty() || !cancels_.empty() || !running_.empty() || !waiting_.empty(); });
            if (stop_) return;
        }
        step();
    }
}

}  // namespace qinfer
