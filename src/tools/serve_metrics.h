// `qinfer serve`'s GET /metrics: Prometheus's text format (version 0.0.4) for the scheduler's gauges and counters and
// latency histograms (time to first token, inter-token latency, whole request, queue time).
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/scheduler.h"

namespace qinfer {

// A histogram with fixed upper bounds (seconds), safe to observe from any thread.
class Histogram {
public:
    explicit Histogram(std::vector<double> bounds);
    void observe(double v);
    // The histogram's lines: NAME_bucket{le="..."} (cumulative), NAME_sum, NAME_count, after HELP and TYPE.
    std::string text(const std::string & name, const std::string & help) const;
    uint64_t count() const;

private:
    std::vector<double> bounds_;
    mutable std::mutex mu_;
    std::vector<uint64_t> counts_;  // per bucket, not cumulative; the last is +Inf
    double sum_ = 0;
    uint64_t n_ = 0;
};

struct ServeMetrics {
    Histogram ttft{{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60}};
    Histogram itl{{0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1}};
    Histogram e2e{{0.1, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300}};
    Histogram queue{{0.001, 0.01, 0.1, 0.5, 1, 2, 5, 10, 30, 60}};
    std::mutex mu;
    uint64_t rejected = 0, timed_out = 0, client_cancelled = 0, http_requests = 0;
    double last_scrape_s = -1;
    uint64_t last_generated = 0;
};

// The whole exposition: the scheduler's state, the counters and histograms above, and generated tokens/s since the
// previous scrape (now_s: a steady clock in seconds).
std::string metrics_text(const SchedulerStats & st, ServeMetrics & m, double now_s);

}  // namespace qinfer
