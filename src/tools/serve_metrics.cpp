#include "tools/serve_metrics.h"

#include <cstdio>

namespace qinfer {

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double v) {
    size_t b = 0;
    while (b < bounds_.size() && v > bounds_[b]) b++;
    std::lock_guard<std::mutex> lock(mu_);
    counts_[b]++;
    sum_ += v;
    n_++;
}

uint64_t Histogram::count() const {
    std::lock_guard<std::mutex> lock(mu_);
    return n_;
}

namespace {
std::string num(double v) {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.9g", v);
    return buf;
}
void metric(std::string & out, const std::string & name, const char * type, const std::string & help, double value) {
    out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n" + name + " " + num(value) + "\n";
}
}  // namespace

std::string Histogram::text(const std::string & name, const std::string & help) const {
    std::lock_guard<std::mutex> lock(mu_);
    std::string out = "# HELP " + name + " " + help + "\n# TYPE " + name + " histogram\n";
    uint64_t cum = 0;
    for (size_t b = 0; b < counts_.size(); b++) {
        cum += counts_[b];
        out += name + "_bucket{le=\"" + (b < bounds_.size() ? num(bounds_[b]) : std::string("+Inf")) + "\"} " + std::to_string(cum) + "\n";
    }
    out += name + "_sum " + num(sum_) + "\n" + name + "_count " + std::to_string(n_) + "\n";
    return out;
}

std::string metrics_text(const SchedulerStats & st, ServeMetrics & m, double now_s) {
    std::string out;
    metric(out, "qinfer_requests_running", "gauge", "Requests whose sequences are in the running batch.", st.running);
    metric(out, "qinfer_requests_waiting", "gauge", "Requests waiting for rows or KV blocks.", st.waiting);
    metric(out, "qinfer_kv_blocks_used", "gauge", "KV cache blocks referenced by sequences.", st.blocks_used);
    metric(out, "qinfer_kv_blocks_total", "gauge", "KV cache blocks in the pool.", st.blocks_total);
    metric(out, "qinfer_kv_blocks_cached", "gauge", "Full blocks in the prefix index (in use or evictable).", st.blocks_cached);
    metric(out, "qinfer_prefix_cache_hit_rate", "gauge", "Admitted prompt tokens found in the prefix cache, over all admitted prompt tokens.",
           st.prompt_tokens ? double(st.prefix_hit_tokens) / double(st.prompt_tokens) : 0.0);
    metric(out, "qinfer_prompt_tokens_total", "counter", "Prompt tokens of admitted requests.", double(st.prompt_tokens));
    metric(out, "qinfer_prefix_cache_hit_tokens_total", "counter", "Prompt tokens found in the prefix cache.", double(st.prefix_hit_tokens));
    metric(out, "qinfer_generation_tokens_total", "counter", "Generated tokens.", double(st.generated_tokens));
    metric(out, "qinfer_requests_finished_total", "counter", "Requests that finished (any reason).", double(st.finished));
    metric(out, "qinfer_preemptions_total", "counter", "Sequences preempted for want of KV blocks.", double(st.preemptions));
    metric(out, "qinfer_scheduler_steps_total", "counter", "Scheduler steps run.", double(st.steps));
    metric(out, "qinfer_scheduler_busy_seconds_total", "counter", "Time inside scheduler steps.", st.busy_seconds);
    metric(out, "qinfer_scheduler_device_wait_seconds_total", "counter", "Of the steps' time, the host blocked on the device.", st.wait_seconds);
    double rate = 0;
    {
        std::lock_guard<std::mutex> lock(m.mu);
        metric(out, "qinfer_requests_rejected_total", "counter", "Requests refused because the queue was full (HTTP 503).", double(m.rejected));
        metric(out, "qinfer_requests_timed_out_total", "counter", "Requests cancelled at the request timeout.", double(m.timed_out));
        metric(out, "qinfer_requests_client_cancelled_total", "counter", "Streamed requests cancelled because the client left.",
               double(m.client_cancelled));
        if (m.last_scrape_s >= 0 && now_s > m.last_scrape_s) rate = double(st.generated_tokens - m.last_generated) / (now_s - m.last_scrape_s);
        m.last_scrape_s = now_s;
        m.last_generated = st.generated_tokens;
    }
    metric(out, "qinfer_generation_tokens_per_second", "gauge", "Generated tokens per second since the previous scrape.", rate);
    out += m.ttft.text("qinfer_time_to_first_token_seconds", "From the request's arrival to its first token.");
    out += m.itl.text("qinfer_inter_token_latency_seconds", "Between consecutive tokens of a sequence.");
    out += m.e2e.text("qinfer_e2e_request_latency_seconds", "From the request's arrival to its last token.");
    out += m.queue.text("qinfer_request_queue_time_seconds", "From the request's arrival to its admission.");
    return out;
}

}  // namespace qinfer
