#include "runtime/call_watchdog.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>

namespace qinfer {

namespace {
int64_t now_ns() { return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
constexpr auto k_period = std::chrono::milliseconds(2);
}  // namespace

CallWatchdog::CallWatchdog(double grace_s, Probe probe, Action on_fire, Action on_stuck)
    : grace_s_(grace_s), probe_(std::move(probe)), on_fire_(std::move(on_fire)), on_stuck_(std::move(on_stuck)) {
    thread_ = std::thread([this] { loop(); });
}

CallWatchdog::~CallWatchdog() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
}

void CallWatchdog::begin(const std::string & what, double timeout_s, const std::string & setting) {
    {
        std::lock_guard<std::mutex> lock(mu_);
        what_ = what;
        setting_ = setting;
        timeout_s_ = timeout_s;
    }
    start_ns_ = now_ns();
}

void CallWatchdog::end() { start_ns_ = 0; }

std::string CallWatchdog::reason() const {
    std::lock_guard<std::mutex> lock(mu_);
    return reason_;
}

void CallWatchdog::exit_with(const std::string & reason) {
    std::fprintf(stderr, "qinfer: error: %s\n", reason.c_str());
    std::fflush(stderr);
    std::_Exit(1);
}

void CallWatchdog::loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!cv_.wait_for(lock, k_period, [&] { return stop_; })) {
        const int64_t start = start_ns_;
        if (start == 0) continue;
        if (fired_) {
            if (!stuck_reported_ && double(now_ns() - std::max(fired_ns_, start)) * 1e-9 > grace_s_) {
                stuck_reported_ = true;
                char text[96];
                std::snprintf(text, sizeof text, "; the call did not return %g s after", grace_s_);
                const std::string why = reason_ + text;
                lock.unlock();
                on_stuck_(why);
                lock.lock();
            }
            continue;
        }
        const double timeout = timeout_s_;
        const std::string what = what_, setting = setting_;
        lock.unlock();
        std::string why = probe_ ? probe_() : std::string();
        if (why.empty() && double(now_ns() - start) * 1e-9 > timeout) {
            char text[64];
            std::snprintf(text, sizeof text, " took longer than %g s", timeout);
            why = what + text + (setting.empty() ? std::string() : " (" + setting + ")");
        }
        lock.lock();
        if (why.empty() || start_ns_ != start) continue;  // no error, or the call returned meanwhile
        reason_ = why;
        fired_ns_ = now_ns();
        fired_ = true;
        lock.unlock();
        on_fire_(why);
        lock.lock();
    }
}

}  // namespace qinfer
