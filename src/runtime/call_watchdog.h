// A watchdog over calls that wait on other processes or devices (tensor parallel's NCCL collectives): while a call is
// in flight it asks `probe` every few milliseconds for an error (NCCL's asynchronous error of a node that went away)
// and times the call; the first error or the first call past its limit fires once: `on_fire(reason)` runs on the
// watchdog's thread (it must not block: the GPU engine aborts its communicators on a thread of their own). A call
// still in flight `grace_s` after the fire is stuck for good (kernels queued behind the aborted collectives waiting on
// a peer that is gone): `on_stuck(reason)` runs, by default printing the reason and ending the process with status 1,
// as PyTorch's NCCL watchdog does. Tested on the CPU (tests/unit/test_call_watchdog.cpp).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace qinfer {

class CallWatchdog {
public:
    using Probe = std::function<std::string()>;
    using Action = std::function<void(const std::string &)>;
    CallWatchdog(double grace_s, Probe probe, Action on_fire, Action on_stuck = exit_with);
    ~CallWatchdog();
    CallWatchdog(const CallWatchdog &) = delete;
    CallWatchdog & operator=(const CallWatchdog &) = delete;

    // A call begins, named `what` in the reason ("a call of the ranks"), allowed `timeout_s`, with `setting` naming
    // the variable that sets it ("" for none); end() when it returns.
    void begin(const std::string & what, double timeout_s, const std::string & setting = "");
    void end();
    // Whether it fired, and why (empty before).
    bool fired() const { return fired_; }
    std::string reason() const;

    static void exit_with(const std::string & reason);

private:
    void loop();

    const double grace_s_;
    Probe probe_;
    Action on_fire_, on_stuck_;
    mutable std::mutex mu_;  // the call's description, reason_, stop_
    std::condition_variable cv_;
    bool stop_ = false;
    std::string what_, setting_, reason_;
    double timeout_s_ = 0;
    std::atomic<int64_t> start_ns_{0};  // the call in flight (0: none)
    std::atomic<bool> fired_{false};
    int64_t fired_ns_ = 0;
    bool stuck_reported_ = false;
    std::thread thread_;
};

}  // namespace qinfer
