// runtime/call_watchdog.h: calls within their limit never fire; a call past its limit or a probe's error fires once
// with a reason that names the call and the setting; a call still in flight after the grace is reported as stuck;
// calls that return before the grace are not.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>

#include "runtime/call_watchdog.h"

using namespace qinfer;

namespace {

struct Seen {
    std::mutex mu;
    std::string fired, stuck;
    std::atomic<int> fires{0}, stucks{0};
};

CallWatchdog::Action record(Seen & s, bool stuck) {
    return [&s, stuck](const std::string & why) {
        std::lock_guard<std::mutex> lock(s.mu);
        (stuck ? s.stuck : s.fired) = why;
        (stuck ? s.stucks : s.fires)++;
    };
}

// Waits up to 5 s for `cond`.
template <class F> bool eventually(F cond) {
    for (int i = 0; i < 500; i++) {
        if (cond()) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return cond();
}

}  // namespace

TEST(CallWatchdog, CallsWithinTheirLimitDoNotFire) {
    Seen s;
    CallWatchdog w(10, nullptr, record(s, false), record(s, true));
    for (int i = 0; i < 20; i++) {
        w.begin("a call", 5.0, "QINFER_TP_TIMEOUT");
        std::this_thread::sleep_for(std::chrono::milliseconds(3));
        w.end();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_FALSE(w.fired());
    EXPECT_EQ(s.fires, 0);
}

TEST(CallWatchdog, ACallPastItsLimitFiresOnceAndIsReportedStuck) {
    Seen s;
    CallWatchdog w(0.1, nullptr, record(s, false), record(s, true));
    w.begin("a call of the ranks", 0.02, "QINFER_TP_TIMEOUT");
    ASSERT_TRUE(eventually([&] { return s.stucks.load() > 0; }));
    EXPECT_TRUE(w.fired());
    EXPECT_EQ(s.fires, 1);
    EXPECT_EQ(s.stucks, 1);
    std::lock_guard<std::mutex> lock(s.mu);
    EXPECT_NE(s.fired.find("a call of the ranks took longer than 0.02 s (QINFER_TP_TIMEOUT)"), std::string::npos) << s.fired;
    EXPECT_NE(s.stuck.find("did not return 0.1 s after"), std::string::npos) << s.stuck;
    EXPECT_EQ(w.reason(), s.fired);
}

TEST(CallWatchdog, AProbeErrorFiresAtOnceAndAReturningCallIsNotStuck) {
    Seen s;
    std::atomic<bool> broken{false};
    CallWatchdog w(1.0, [&] { return broken ? std::string("rank 1: NCCL reported remote process exited") : std::string(); }, record(s, false),
                   record(s, true));
    w.begin("a call", 1000.0);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_FALSE(w.fired());
    broken = true;
    ASSERT_TRUE(eventually([&] { return w.fired(); }));
    w.end();  // the aborted call returns
    std::this_thread::sleep_for(std::chrono::milliseconds(1300));
    EXPECT_EQ(s.fires, 1);
    EXPECT_EQ(s.stucks, 0);
    EXPECT_EQ(w.reason(), "rank 1: NCCL reported remote process exited");
}

TEST(CallWatchdog, IdleTimeIsNotTimed) {
    Seen s;
    CallWatchdog w(10, nullptr, record(s, false), record(s, true));
    w.begin("a call", 0.5);
    w.end();
    std::this_thread::sleep_for(std::chrono::milliseconds(700));  // idle past the limit
    w.begin("a call", 0.5);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    w.end();
    EXPECT_FALSE(w.fired());
}
