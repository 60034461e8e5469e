// The threads of tensor-parallel ranks in one process (model/qwen_tp.cpp on the CPU, model/qwen_cuda_tp.cpp on the
// GPUs): rank 0 runs on the calling thread, ranks 1.. on threads started once and woken for each call (a new thread a
// call also built each rank a new OpenMP team), and every rank's OpenMP team takes an equal share of the cores (tp
// teams of all the cores each oversubscribed them: on 2 cores, 0.5B (4 layers) at --tp 2 ran 62.6 tok/s against
// 105.9 at --tp 1). A GPU rank's thread drives its GPU alone.
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "core/parallel.h"

namespace qinfer {

class RankWorkers {
public:
    RankWorkers(int ranks, int threads_each) : threads_each_(threads_each) {
        for (int r = 1; r < ranks; r++) threads_.emplace_back([this, r] { loop(size_t(r)); });
    }
    ~RankWorkers() {
        {
            std::lock_guard<std::mutex> lock(mu_);
            stop_ = true;
        }
        start_.notify_all();
        for (auto & t : threads_) t.join();
    }
    RankWorkers(const RankWorkers &) = delete;
    RankWorkers & operator=(const RankWorkers &) = delete;

    // fn(r) for every rank at once, rank 0 on this thread. When a rank throws, on_failure() runs at once (so that
    // ranks waiting on it stop waiting), and once every rank has returned the first failure in rank order is rethrown
    // (the others typically say that another rank failed).
    void run_all(const std::function<void(size_t)> & fn, const std::function<void()> & on_failure) {
        std::vector<std::exception_ptr> errors(threads_.size() + 1);
        std::mutex failing;
        const std::function<void(size_t)> guarded = [&](size_t r) {
            try {
                fn(r);
            } catch (...) {
                errors[r] = std::current_exception();
                std::lock_guard<std::mutex> lock(failing);
                on_failure();
            }
        };
        run(guarded);
        for (auto & e : errors) {
            if (e) std::rethrow_exception(e);
        }
    }

private:
    // fn(r) for every rank; fn must not throw.
    void run(const std::function<void(size_t)> & fn) {
        {
            std::lock_guard<std::mutex> lock(mu_);
            job_ = &fn;
            busy_ = int(threads_.size());
            generation_++;
        }
        start_.notify_all();
        const int saved = max_threads();
        set_threads(threads_each_);
        fn(0);
        set_threads(saved);
        std::unique_lock<std::mutex> lock(mu_);
        done_.wait(lock, [&] { return busy_ == 0; });
    }

    void loop(size_t rank) {
        set_threads(threads_each_);
        uint64_t seen = 0;
        for (;;) {
            const std::function<void(size_t)> * job = nullptr;
            {
                std::unique_lock<std::mutex> lock(mu_);
                start_.wait(lock, [&] { return stop_ || generation_ != seen; });
                if (stop_) return;
                seen = generation_;
                job = job_;
            }
            (*job)(rank);
            std::lock_guard<std::mutex> lock(mu_);
            if (--busy_ == 0) done_.notify_one();
        }
    }

    const int threads_each_;
    std::mutex mu_;
    std::condition_variable start_, done_;
    const std::function<void(size_t)> * job_ = nullptr;
    uint64_t generation_ = 0;
    int busy_ = 0;
    bool stop_ = false;
    std::vector<std::thread> threads_;
};

}  // namespace qinfer
