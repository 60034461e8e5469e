// qinfer bench --serve URL: a load generator against a running OpenAI-style server, like `vllm bench serve`. Each
// request streams a completion of token-id prompts (random, with an optional shared prefix, or a JSONL dataset) with
// end of sequence ignored; per concurrency level (--max-concurrency 16,64,...) it reports request throughput, output
// tokens/s, time to first token, time per output token, inter-token latency (p50 / p90 / p99), failures and the
// slowest /health answer seen meanwhile. Loopback or any host; every loop is bounded by --num-prompts and --timeout.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "core/check.h"
#include "core/rng.h"
#include "tools/args.h"
#include "tools/commands.h"
#include "tools/sysinfo.h"

#ifdef QINFER_HAVE_HTTPLIB
#include <httplib.h>
#endif

namespace qinfer {

using json = nlohmann::json;

#ifndef QINFER_HAVE_HTTPLIB
int cmd_bench_serve(int, char **) {
    QINFER_FAIL() << "this qinfer was built without cpp-httplib (Debian: apt-get install libcpp-httplib-dev, then rebuild)";
}
#else

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct Work {
    std::vector<int> prompt;
    int output_len = 0;
};

struct Outcome {
    bool ok = false, rejected = false;
    std::string error;
    double ttft = 0, e2e = 0;
    int tokens = 0;
    std::vector<double> itl;
};

double percentile(std::vector<double> v, double q) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    const double at = q * double(v.size() - 1);
    const size_t lo = size_t(at);
    const size_t hi = std::min(lo + 1, v.size() - 1);
    return v[lo] + (v[hi] - v[lo]) * (at - double(lo));
}

// One streamed request: the times of its first event and the gaps between events, the usage's token count.
Outcome run_request(httplib::Client & cli, const std::string & body, const std::string & api_key) {
    Outcome o;
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = body;
    req.set_header("Content-Type", "application/json");
    if (!api_key.empty()) req.set_header("Authorization", "Bearer " + api_key);
    const auto t0 = Clock::now();
    double last = -1;
    std::string buf;
    bool done = false;
    int status = 0;
    req.response_handler = [&](const httplib::Response & r) {
        status = r.status;
        return true;
    };
    req.content_receiver = [&](const char * data, size_t len, uint64_t, uint64_t) {
        buf.append(data, len);
        for (size_t end; (end = buf.find("\n\n")) != std::string::npos; buf.erase(0, end + 2)) {
            if (buf.compare(0, 6, "data: ") != 0) continue;
            const std::string payload = buf.substr(6, end - 6);
            if (payload == "[DONE]") {
                done = true;
                continue;
            }
            const json j = json::parse(payload, nullptr, false);
            if (j.is_discarded() || j.contains("error")) {
                o.error = j.is_discarded() ? "an event that is not JSON" : j["error"].value("message", "error event");
                continue;
            }
            if (j.contains("usage") && j["usage"].is_object()) o.tokens = j["usage"].value("completion_tokens", 0);
            if (!j.contains("choices") || j["choices"].empty() || !j["choices"][0]["finish_reason"].is_null()) continue;
            const double now = since(t0);
            if (last < 0) o.ttft = now;
            else o.itl.push_back(now - last);
            last = now;
        }
        return true;
    };
    httplib::Response res;
    httplib::Error err = httplib::Error::Success;
    const bool sent = cli.send(req, res, err);
    o.e2e = since(t0);
    if (status == 0) status = res.status;
    if (status == 503 || status == 429) {
        o.rejected = true;
        return o;
    }
    if (!sent || status != 200) {
        o.error = !sent ? "transport: " + httplib::to_string(err) : "HTTP " + std::to_string(status) + " " + res.body.substr(0, 200);
        return o;
    }
    o.ok = done && o.error.empty();
    if (!done && o.error.empty()) o.error = "the stream ended without [DONE]";
    return o;
}

}  // namespace

int cmd_bench_serve(int argc, char ** argv) {
    for (int i = 2; i < argc; i++) {
        if (!std::strcmp(argv[i], "--help")) {
            std::printf(
                "usage: qinfer bench --serve http://HOST:PORT [--num-prompts 512] [--input-len 1000] [--output-len 256]\n"
                "                    [--max-concurrency 64[,256,...]] [--request-rate R] [--prefix-len N] [--dataset FILE.jsonl]\n"
                "                    [--vocab 151643] [--timeout 900] [--duration S] [--api-key KEY] [--seed S] [--label TEXT]\n"
                "                    [--json FILE]\n"
                "Streams --num-prompts completions (token-id prompts, end of sequence ignored) at each concurrency: request\n"
                "throughput, output tokens/s, TTFT, TPOT, ITL (p50/p90/p99), failures (503/429 counted apart as rejected),\n"
                "and the slowest GET /health seen during the run. --request-rate: Poisson arrivals at that rate (default: as\n"
                "fast as the concurrency allows). --prefix-len: every prompt starts with the same N random tokens. --duration S:\n"
                "a soak: the prompts again and again for S seconds (the table then counts every request sent).\n");
            return 0;
        }
    }
    Args a(argc, argv, 2, {});
    const std::string url = a.required("serve");
    const int num_prompts = int(a.integer("num-prompts", 512));
    const int input_len = int(a.integer("input-len", 1000));
    const int output_len = int(a.integer("output-len", 256));
    const std::vector<int> levels = a.has("max-concurrency") ? a.int_list("max-concurrency") : std::vector<int>{64};
    const double rate = a.number("request-rate", 0);
    const int prefix_len = int(a.integer("prefix-len", 0));
    const std::string dataset = a.str("dataset");
    const int vocab = int(a.integer("vocab", 151643));
    const double timeout = a.number("timeout", 900);
    const double duration = a.number("duration", 0);
    const std::string api_key = a.str("api-key");
    const uint64_t seed = uint64_t(a.integer("seed", 0));
    const std::string label = a.str("label");
    const std::string json_path = a.str("json");
    a.check_unused();
    if (num_prompts < 1 || input_len < 1 || output_len < 1 || vocab < 2 || !(timeout > 0) || prefix_len < 0) {
        QINFER_FAIL() << "--num-prompts, --input-len, --output-len must be >= 1, --vocab >= 2, --timeout > 0, --prefix-len >= 0";
    }
    for (int c : levels) {
        if (c < 1 || c > 4096) QINFER_FAIL() << "--max-concurrency entries must lie in [1, 4096]";
    }
    if (url.rfind("http://", 0) != 0) QINFER_FAIL() << "--serve takes http://HOST:PORT";
    const std::string host_port = url.substr(7, url.find('/', 7) == std::string::npos ? std::string::npos : url.find('/', 7) - 7);
    const size_t colon = host_port.rfind(':');
    const std::string host = colon == std::string::npos ? host_port : host_port.substr(0, colon);
    const int port = colon == std::string::npos ? 80 : std::atoi(host_port.c_str() + colon + 1);

    std::vector<Work> work;
    if (!dataset.empty()) {
        std::ifstream f(dataset);
        if (!f) QINFER_FAIL() << "--dataset: cannot read " << dataset;
        std::string line;
        for (int n = 1; std::getline(f, line) && int(work.size()) < num_prompts; n++) {
            const json j = json::parse(line, nullptr, false);
            if (j.is_discarded() || !j.contains("prompt_token_ids")) QINFER_FAIL() << dataset << ":" << n << ": needs \"prompt_token_ids\"";
            work.push_back({j["prompt_token_ids"].get<std::vector<int>>(), j.value("output_len", output_len)});
        }
    } else {
        std::vector<int> prefix;
        for (int t = 0; t < prefix_len; t++) prefix.push_back(int(splitmix64(seed * 7 + 99991 + uint64_t(t)) % uint64_t(vocab)));
        for (int i = 0; i < num_prompts; i++) {
            Work w{prefix, output_len};
            for (int t = 0; t < input_len; t++) w.prompt.push_back(int(splitmix64(seed * 1000003 + uint64_t(i) * 7919 + uint64_t(t) + 17) % uint64_t(vocab)));
            work.push_back(std::move(w));
        }
    }
    std::vector<std::string> bodies;
    for (const Work & w : work) {
        bodies.push_back(json{{"prompt", w.prompt}, {"max_tokens", w.output_len}, {"ignore_eos", true}, {"temperature", 0}, {"stream", true},
                              {"stream_options", {{"include_usage", true}}}}
                             .dump());
    }
    {
        httplib::Client probe(host, port);
        probe.set_connection_timeout(5, 0);
        auto h = probe.Get("/health");
        if (!h || h->status != 200) QINFER_FAIL() << "--serve: no answer from " << url << "/health";
    }

    json out = json::array();
    std::printf("| label | concurrency | requests | ok | rejected | failed | seconds | req/s | output tok/s | TTFT p50 / p90 / p99 ms | "
                "TPOT p50 / p90 / p99 ms | ITL p50 / p90 / p99 ms | E2E p50 / p99 s | /health max ms |\n");
    std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (int conc : levels) {
        std::mutex results_mu;
        std::vector<Outcome> results(duration > 0 ? 0 : work.size());
        std::atomic<size_t> next{0};
        std::atomic<bool> stop{false};
        const auto t0 = Clock::now();
        // Arrival times: all at once, or a Poisson process at --request-rate.
        std::vector<double> arrive(work.size(), 0.0);
        if (rate > 0) {
            std::mt19937_64 rng(seed + 5);
            std::exponential_distribution<double> gap(rate);
            double t = 0;
            for (double & x : arrive) x = (t += gap(rng));
        }
        double health_max = 0;
        std::thread health([&] {
            httplib::Client cli(host, port);
            cli.set_tcp_nodelay(true);
            cli.set_read_timeout(30, 0);
            while (!stop) {
                const auto h0 = Clock::now();
                auto r = cli.Get("/health");
                if (r && r->status == 200) health_max = std::max(health_max, since(h0));
                std::this_thread::sleep_for(std::chrono::milliseconds(100));
            }
        });
        std::vector<std::thread> workers;
        for (int c = 0; c < conc; c++) {
            workers.emplace_back([&] {
                httplib::Client cli(host, port);
                // The request goes out as headers, then body: with Nagle's algorithm the body waited for the
                // server's delayed ACK of the headers, ~50 ms of every TTFT on loopback (a Python client read 33 ms
                // where this one read 89, same server).
                cli.set_tcp_nodelay(true);
                cli.set_keep_alive(true);
                cli.set_connection_timeout(30, 0);
                cli.set_read_timeout(int(timeout), 0);
                if (duration > 0) {
                    // Soak: the prompts round and round until the duration has passed.
                    while (since(t0) < std::min(duration, timeout)) {
                        Outcome o = run_request(cli, bodies[next++ % bodies.size()], api_key);
                        std::lock_guard<std::mutex> lock(results_mu);
                        results.push_back(std::move(o));
                    }
                    return;
                }
                for (size_t i; (i = next++) < work.size();) {
                    const double wait = arrive[i] - since(t0);
                    if (wait > 0) std::this_thread::sleep_for(std::chrono::duration<double>(wait));
                    if (since(t0) > timeout) {
                        results[i].error = "not sent: --timeout passed";
                        continue;
                    }
                    results[i] = run_request(cli, bodies[i], api_key);
                }
            });
        }
        for (auto & w : workers) w.join();
        const double secs = since(t0);
        stop = true;
        health.join();
        int ok = 0, rejected = 0, failed = 0;
        long tokens = 0;
        std::vector<double> ttft, tpot, itl, e2e;
        std::string first_error;
        for (const Outcome & o : results) {
            if (o.rejected) {
                rejected++;
                continue;
            }
            if (!o.ok) {
                failed++;
                if (first_error.empty()) first_error = o.error;
                continue;
            }
            ok++;
            tokens += o.tokens;
            ttft.push_back(o.ttft * 1e3);
            if (o.tokens > 1) tpot.push_back((o.e2e - o.ttft) / (o.tokens - 1) * 1e3);
            itl.insert(itl.end(), o.itl.begin(), o.itl.end());
            e2e.push_back(o.e2e);
        }
        for (double & v : itl) v *= 1e3;
        auto p3 = [](const std::vector<double> & v) {
            char b[64];
            std::snprintf(b, sizeof b, "%.1f / %.1f / %.1f", percentile(v, 0.5), percentile(v, 0.9), percentile(v, 0.99));
            return std::string(b);
        };
        std::printf("| %s | %d | %zu | %d | %d | %d | %.1f | %.2f | %.1f | %s | %s | %s | %.2f / %.2f | %.1f |\n", label.c_str(), conc, results.size(), ok,
                    rejected, failed, secs, ok / secs, double(tokens) / secs, p3(ttft).c_str(), p3(tpot).c_str(), p3(itl).c_str(), percentile(e2e, 0.5),
                    percentile(e2e, 0.99), health_max * 1e3);
        if (!first_error.empty()) std::printf("first failure: %s\n", first_error.c_str());
        std::fflush(stdout);
        out.push_back({{"benchmark", "serve"}, {"label", label}, {"url", url}, {"concurrency", conc}, {"requests", results.size()}, {"duration_s", duration},
                       {"input_len", dataset.empty() ? input_len + prefix_len : -1}, {"prefix_len", prefix_len}, {"output_len", output_len},
                       {"request_rate", rate}, {"ok", ok}, {"rejected", rejected}, {"failed", failed}, {"seconds", secs}, {"requests_s", ok / secs},
                       {"output_tok_s", double(tokens) / secs}, {"ttft_ms_p50", percentile(ttft, 0.5)}, {"ttft_ms_p90", percentile(ttft, 0.9)},
                       {"ttft_ms_p99", percentile(ttft, 0.99)}, {"tpot_ms_p50", percentile(tpot, 0.5)}, {"tpot_ms_p90", percentile(tpot, 0.9)},
                       {"tpot_ms_p99", percentile(tpot, 0.99)}, {"itl_ms_p50", percentile(itl, 0.5)}, {"itl_ms_p90", percentile(itl, 0.9)},
                       {"itl_ms_p99", percentile(itl, 0.99)}, {"e2e_s_p50", percentile(e2e, 0.5)}, {"e2e_s_p99", percentile(e2e, 0.99)},
                       {"health_ms_max", health_max * 1e3}, {"first_failure", first_error}, {"commit", git_commit()}});
        if (!json_path.empty()) std::ofstream(json_path) << out.dump(2) << "\n";
    }
    return 0;
}

#endif

}  // namespace qinfer
