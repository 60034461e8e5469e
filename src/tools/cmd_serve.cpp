// qinfer serve: the HTTP side of tools/serve.h (cpp-httplib), the API's parsing and JSON in tools/serve_api.cpp.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <memory>
#include <mutex>
#include <thread>

#include <pthread.h>
#include <signal.h>

#include "core/env.h"
#include "core/check.h"
#include "io/chat.h"
#include "io/tokenizer.h"
#include "runtime/scheduler.h"
#include "tools/commands.h"
#include "tools/serve.h"
#include "tools/serve_api.h"
#include "tools/serve_metrics.h"

#ifdef QINFER_HAVE_HTTPLIB
#include <httplib.h>
#include <sys/socket.h>
#endif

namespace qinfer {

#ifndef QINFER_HAVE_HTTPLIB

struct HttpServer::Impl {};
HttpServer::HttpServer(const ServeOptions &) {
    QINFER_FAIL() << "this qinfer was built without cpp-httplib (Debian: apt-get install libcpp-httplib-dev, then rebuild)";
}
HttpServer::~HttpServer() = default;
int HttpServer::bind() { return 0; }
void HttpServer::run() {}
void HttpServer::stop() {}

#else

namespace {

int64_t unix_seconds() {
    return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

double steady_seconds() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

void send_error(httplib::Response & res, int status, const std::string & message) {
    res.status = status;
    res.set_content(api::error_json(status, message), "application/json");
}

// One HTTP request's tokens and endings, from the scheduler's thread (callbacks) to the HTTP thread that answers.
struct Mailbox {
    struct Event {
        int choice = 0;
        bool finished = false;
        TokenEvent token;
        RequestOutcome outcome;
    };
    std::mutex mu;
    std::condition_variable cv;
    std::deque<Event> events;
    void push(Event e) {
        std::lock_guard<std::mutex> lock(mu);
        events.push_back(std::move(e));
        cv.notify_one();
    }
    // The next event, or false at the deadline.
    bool pop(Event & e, std::chrono::steady_clock::time_point deadline) {
        std::unique_lock<std::mutex> lock(mu);
        if (!cv.wait_until(lock, deadline, [&] { return !events.empty(); })) return false;
        e = std::move(events.front());
        events.pop_front();
        return true;
    }
};

// Carries the scheduler's events to the HTTP threads' mailboxes from a thread of its own, so that the scheduler's
// loop only appends to one queue (one lock, at most one wake-up a step) between its steps. Waking each stream's
// thread itself had cost the loop ~0.5 ms a step at 64 streaming clients (the development machine's 2 cores, a
// stand-in engine: 551 -> 26 us a step), time in which the GPU waits for the next step.
class Courier {
public:
    Courier() : thread_([this] { run(); }) {}
    ~Courier() { stop(); }
    Courier(const Courier &) = delete;
    Courier & operator=(const Courier &) = delete;
    void send(const std::shared_ptr<Mailbox> & box, Mailbox::Event ev) {
        std::lock_guard<std::mutex> lock(mu_);
        queue_.emplace_back(box, std::move(ev));
        cv_.notify_one();
    }
    // Delivers what is queued, then ends the thread.
    void stop() {
        {
            std::lock_guard<std::mutex> lock(mu_);
            stopping_ = true;
            cv_.notify_one();
        }
        if (thread_.joinable()) thread_.join();
    }

private:
    void run() {
        std::vector<std::pair<std::shared_ptr<Mailbox>, Mailbox::Event>> batch;
        for (;;) {
            {
                std::unique_lock<std::mutex> lock(mu_);
                cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
                if (queue_.empty()) return;
                batch.swap(queue_);
            }
            for (auto & [box, ev] : batch) box->push(std::move(ev));
            batch.clear();
        }
    }
    std::mutex mu_;
    std::condition_variable cv_;
    std::vector<std::pair<std::shared_ptr<Mailbox>, Mailbox::Event>> queue_;
    bool stopping_ = false;
    std::thread thread_;  // last: it starts once the members above exist
};

}  // namespace

struct HttpServer::Impl {
    ServeOptions opt;
    std::unique_ptr<Tokenizer> tok;
    std::unique_ptr<Engine> engine;
    std::unique_ptr<Scheduler> sched;
    std::thread loop;
    GenerationConfig gc;
    ChatStyle style = ChatStyle::ChatML;
    int fits = 0;  // tokens (prompt and output) one request may hold
    std::atomic<uint64_t> next_id{1};
    ServeMetrics metrics;
    Courier courier;  // the scheduler's events to the mailboxes
    httplib::Server http;
    int listen_fd = -1;  // the listening socket (set_socket_options), whose backlog bind() raises

    ~Impl() {
        if (sched) sched->stop();
        if (loop.joinable()) loop.join();
        sched.reset();  // requests still queued finish now, while the metrics and mailboxes their callbacks use exist
        courier.stop();
    }

    // A checked request ready to run: its prompt ids and output budget.
    struct Job {
        api::Request req;
        std::vector<int> prompt;
        int max_tokens = 0;
        std::string id;
        int64_t created = 0;
    };

    Job prepare(const std::string & body, bool chat) {
        api::Limits limits;
        limits.vocab = engine->config().vocab_size;
        Job job;
        job.req = api::parse_request(body, chat, opt.sampling, limits);
        if (job.req.model.empty()) job.req.model = opt.name;
        try {
            if (chat) {
                job.prompt = tok->encode(apply_chat_template(style, job.req.messages, ChatOptions{}));
            } else if (job.req.prompt_is_tokens) {
                job.prompt = job.req.prompt_tokens;
            } else {
                job.prompt = tok->encode(job.req.prompt);
            }
        } catch (const Error & e) {
            throw api::ApiError(400, std::string("prompt: ") + e.what());
        }
        const int n = int(job.prompt.size());
        if (n >= fits) {
            throw api::ApiError(400, "the prompt has " + std::to_string(n) + " tokens; the server's context holds " + std::to_string(fits) +
                                         " (prompt and output)");
        }
        if (job.req.max_tokens > 0 && int64_t(n) + job.req.max_tokens > fits) {
            throw api::ApiError(400, "prompt of " + std::to_string(n) + " tokens + max_tokens " + std::to_string(job.req.max_tokens) +
                                         " exceed the server's context of " + std::to_string(fits) + " tokens");
        }
        job.max_tokens = job.req.max_tokens > 0 ? job.req.max_tokens : std::min(opt.default_max_tokens, fits - n);
        job.id = std::string(chat ? "chatcmpl-" : "cmpl-") + std::to_string(next_id++);
        job.created = unix_seconds();
        return job;
    }

    // Each choice of a running job, as the HTTP thread turns its tokens into text.
    struct ChoiceState {
        Tokenizer::Stream stream;
        api::StopMatcher stops;
        api::Choice choice;
        uint64_t request = 0;
        int tokens = 0;
        bool done = false;      // finished, or stopped by a stop string (its request cancelled)
        bool eos = false;
        ChoiceState(const Tokenizer & t, std::vector<std::string> s) : stream(t), stops(std::move(s)) {}
    };

    // Submits the job's n choices to the scheduler; refusals become HTTP errors (503 when the queue is full).
    std::vector<std::unique_ptr<ChoiceState>> submit(const Job & job, const std::shared_ptr<Mailbox> & box) {
        std::vector<std::unique_ptr<ChoiceState>> choices;
        for (int i = 0; i < job.req.n; i++) {
            auto c = std::make_unique<ChoiceState>(*tok, job.req.stop);
            RequestOptions r;
            r.prompt = job.prompt;
            r.max_new_tokens = job.max_tokens;
            r.sampling = job.req.sampling;
            r.sampling.seed += uint64_t(i);
            r.eos_token_ids = gc.eos_token_ids;
            r.ignore_eos = job.req.ignore_eos;
            r.n_valid_tokens = tok->size();
            r.logprobs = job.req.logprobs;
            auto last = std::make_shared<double>(-1.0);  // the previous token's time (scheduler thread only)
            RequestCallbacks cb;
            cb.on_token = [box, i, last, this](const TokenEvent & e) {
                const double now = steady_seconds();
                if (*last >= 0) metrics.itl.observe(now - *last);
                *last = now;
                Mailbox::Event ev;
                ev.choice = i;
                ev.token = e;
                courier.send(box, std::move(ev));
                return true;
            };
            cb.on_finish = [box, i, this](const RequestOutcome & o) {
                if (!o.tokens.empty()) metrics.ttft.observe(o.ttft_seconds);
                metrics.e2e.observe(o.total_seconds);
                metrics.queue.observe(o.queue_seconds);
                Mailbox::Event ev;
                ev.choice = i;
                ev.finished = true;
                ev.outcome = o;
                courier.send(box, std::move(ev));
            };
            try {
                c->request = sched->submit(std::move(r), std::move(cb));
            } catch (const Scheduler::QueueFull & e) {
                for (auto & done : choices) sched->cancel(done->request);
                {
                    std::lock_guard<std::mutex> lock(metrics.mu);
                    metrics.rejected++;
                }
                throw api::ApiError(503, std::string("the server is busy: ") + e.what() + "; retry later");
            } catch (const Error & e) {
                for (auto & done : choices) sched->cancel(done->request);
                throw api::ApiError(400, e.what());
            }
            choices.push_back(std::move(c));
        }
        return choices;
    }

    // One event into its choice's state: the text that became final (after stop strings), or "" .
    std::string take(ChoiceState & c, const Mailbox::Event & ev, int logprobs, std::vector<api::TokenLogprob> * new_lps) {
        if (ev.finished) {
            c.eos = ev.outcome.stop_reason == "eos";
            if (c.done) return "";
            c.done = true;
            std::string rest = c.stops.push(c.stream.flush());
            rest += c.stops.flush();
            return rest;
        }
        if (c.done) return "";
        c.tokens++;
        if (logprobs >= 0) {
            api::TokenLogprob lp;
            lp.token = tok->decode({ev.token.token});
            lp.logprob = ev.token.logprob;
            for (const auto & [id, v] : ev.token.top) lp.top.emplace_back(tok->decode({id}), v);
            c.choice.logprobs.push_back(lp);
            if (new_lps) new_lps->push_back(std::move(lp));
        }
        const std::string text = c.stops.push(c.stream.push(ev.token.token));
        if (c.stops.stopped()) {
            c.done = true;
            sched->cancel(c.request);
        }
        return text;
    }

    static std::string finish_reason(const ChoiceState & c) { return c.stops.stopped() || c.eos ? "stop" : "length"; }

    void complete(const httplib::Request & hreq, httplib::Response & res, bool chat) {
        auto job = std::make_shared<Job>(prepare(hreq.body, chat));
        auto box = std::make_shared<Mailbox>();
        auto choices = std::make_shared<std::vector<std::unique_ptr<ChoiceState>>>(submit(*job, box));
        const auto deadline = std::chrono::steady_clock::now() +
                              std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(opt.request_timeout_s));
        auto cancel_all = [this, choices] {
            for (auto & c : *choices) sched->cancel(c->request);
        };
        if (!job->req.stream) {
            int open = job->req.n;
            Mailbox::Event ev;
            while (open > 0) {
                if (!box->pop(ev, deadline)) {
                    cancel_all();
                    {
                        std::lock_guard<std::mutex> lock(metrics.mu);
                        metrics.timed_out++;
                    }
                    throw api::ApiError(503, "the request did not finish within the server's timeout of " + std::to_string(int(opt.request_timeout_s)) + " s");
                }
                ChoiceState & c = *(*choices)[size_t(ev.choice)];
                if (ev.finished && ev.outcome.stop_reason == "error") {
                    cancel_all();
                    throw std::runtime_error(ev.outcome.error);
                }
                c.choice.text += take(c, ev, job->req.logprobs, nullptr);
                open -= ev.finished;
            }
            std::vector<api::Choice> out;
            api::Usage usage;
            usage.prompt_tokens = int(job->prompt.size());
            for (auto & c : *choices) {
                c->choice.finish_reason = finish_reason(*c);
                usage.completion_tokens += c->tokens;
                out.push_back(std::move(c->choice));
            }
            res.set_content(api::completion_json(job->req, job->id, job->created, out, usage), "application/json");
            return;
        }
        res.set_header("Cache-Control", "no-cache");
        res.set_chunked_content_provider(
            "text/event-stream",
            [this, job, box, choices, deadline, cancel_all](size_t, httplib::DataSink & sink) {
                // Nothing may leave this function by an exception (cpp-httplib's thread would end the process).
                try {
                    return stream_job(*job, *box, *choices, deadline, sink);
                } catch (const std::exception & e) {
                    cancel_all();
                    const std::string line = "data: " + api::error_json(500, e.what()) + "\n\ndata: [DONE]\n\n";
                    sink.write(line.data(), line.size());
                    sink.done();
                    return true;
                }
            },
            [cancel_all](bool success) {
                if (!success) cancel_all();
            });
    }

    // The server-sent events of a streamed job until every choice has finished (false: the client left).
    bool stream_job(const Job & job, Mailbox & box, std::vector<std::unique_ptr<ChoiceState>> & choices,
                    std::chrono::steady_clock::time_point deadline, httplib::DataSink & sink) {
        auto cancel_all = [&] {
            for (auto & c : choices) sched->cancel(c->request);
        };
        auto event = [&](const std::string & json) {
            const std::string line = "data: " + json + "\n\n";
            return sink.write(line.data(), line.size());
        };
        std::vector<bool> first(size_t(job.req.n), true);
        int open = job.req.n;
        bool gone = false;
        Mailbox::Event ev;
        while (open > 0 && !gone) {
            // Wake at least every second to notice a client that left while nothing was generated.
            const auto wait = std::min<std::chrono::steady_clock::time_point>(deadline, std::chrono::steady_clock::now() + std::chrono::seconds(1));
            if (!box.pop(ev, wait)) {
                if (std::chrono::steady_clock::now() >= deadline) {
                    cancel_all();
                    {
                        std::lock_guard<std::mutex> lock(metrics.mu);
                        metrics.timed_out++;
                    }
                    event(api::error_json(503, "the request did not finish within the server's timeout"));
                    break;
                }
                gone = !sink.is_writable();
                continue;
            }
            ChoiceState & c = *choices[size_t(ev.choice)];
            if (ev.finished && ev.outcome.stop_reason == "error") {
                cancel_all();
                event(api::error_json(500, ev.outcome.error));
                break;
            }
            std::vector<api::TokenLogprob> lps;
            const std::string text = take(c, ev, job.req.logprobs, &lps);
            bool ok = true;
            if (!text.empty() || !lps.empty()) {
                ok = event(api::chunk_json(job.req, job.id, job.created, ev.choice, text, "", first[size_t(ev.choice)], &lps));
                first[size_t(ev.choice)] = false;
            }
            if (ev.finished) {
                open--;
                ok = ok && event(api::chunk_json(job.req, job.id, job.created, ev.choice, "", finish_reason(c), first[size_t(ev.choice)]));
            }
            gone = !ok;
        }
        if (gone) {
            // The client left: its requests stop at the next step and free their blocks.
            cancel_all();
            std::lock_guard<std::mutex> lock(metrics.mu);
            metrics.client_cancelled++;
            return false;
        }
        if (open == 0 && job.req.include_usage) {
            api::Usage usage;
            usage.prompt_tokens = int(job.prompt.size());
            for (auto & c : choices) usage.completion_tokens += c->tokens;
            event(api::usage_chunk_json(job.req, job.id, job.created, usage));
        }
        const std::string done = "data: [DONE]\n\n";
        sink.write(done.data(), done.size());
        sink.done();
        return true;
    }

    void routes() {
        http.set_payload_max_length(opt.max_body_bytes);
        // Each streamed token is a small write: without TCP_NODELAY, Nagle's algorithm holds it until the client
        // acknowledges the write before, which a client's delayed ACK can put off by ~40 ms.
        http.set_tcp_nodelay(true);
        http.set_socket_options([this](socket_t fd) {
            int yes = 1;
            ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, reinterpret_cast<const char *>(&yes), sizeof yes);
            listen_fd = int(fd);
        });
        const size_t threads = size_t(std::clamp(opt.http_threads, 8, 4096));
        http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
        if (!opt.api_key.empty()) {
            http.set_pre_routing_handler([this](const httplib::Request & req, httplib::Response & res) {
                if (req.path.rfind("/v1/", 0) != 0 || req.get_header_value("Authorization") == "Bearer " + opt.api_key) {
                    return httplib::Server::HandlerResponse::Unhandled;
                }
                send_error(res, 401, "missing or wrong API key: send 'Authorization: Bearer <key>'");
                return httplib::Server::HandlerResponse::Handled;
            });
        }
        // Never waits for the scheduler: answers under any load.
        http.Get("/health", [](const httplib::Request &, httplib::Response & res) { res.set_content("{\"status\": \"ok\"}", "application/json"); });
        http.Get("/metrics", [this](const httplib::Request &, httplib::Response & res) {
            res.set_content(metrics_text(sched->stats(), metrics, steady_seconds()), "text/plain; version=0.0.4");
        });
        http.Get("/v1/models", [this](const httplib::Request &, httplib::Response & res) {
            nlohmann::json m = {{"object", "list"},
                                {"data", nlohmann::json::array({{{"id", opt.name}, {"object", "model"}, {"owned_by", "qinfer"}, {"max_model_len", fits}}})}};
            res.set_content(m.dump(), "application/json");
        });
        for (const bool chat : {false, true}) {
            http.Post(chat ? "/v1/chat/completions" : "/v1/completions", [this, chat](const httplib::Request & req, httplib::Response & res) {
                try {
                    complete(req, res, chat);
                } catch (const api::ApiError & e) {
                    send_error(res, e.status, e.what());
                    if (e.status == 503) res.set_header("Retry-After", "1");
                } catch (const std::exception & e) {
                    send_error(res, 500, e.what());
                }
            });
        }
        // Unknown routes, 413 (body over max_body_bytes) and the like: a JSON error body for whatever httplib set.
        http.set_error_handler([](const httplib::Request & req, httplib::Response & res) {
            if (!res.body.empty()) return;
            const std::string what = res.status == 404 ? "no route for " + req.method + " " + req.path
                                     : res.status == 413 ? "the request body is too large"
                                                          : "HTTP status " + std::to_string(res.status);
            send_error(res, res.status, what);
        });
        http.set_exception_handler([](const httplib::Request &, httplib::Response & res, std::exception_ptr ep) {
            std::string what = "internal error";
            try {
                std::rethrow_exception(ep);
            } catch (const std::exception & e) {
                what = e.what();
            } catch (...) {
            }
            send_error(res, 500, what);
        });
    }
};

HttpServer::HttpServer(const ServeOptions & opt) : impl_(std::make_unique<Impl>()) {
    Impl & s = *impl_;
    s.opt = opt;
    if (s.opt.name.empty()) s.opt.name = std::filesystem::path(opt.model_dir).filename().string();
    if (s.opt.name.empty()) s.opt.name = std::filesystem::path(opt.model_dir).parent_path().filename().string();
    s.tok = Tokenizer::load_dir(opt.model_dir);
    const ModelConfig config = load_model_config(opt.model_dir);
    s.gc = load_generation_config(opt.model_dir, config);
    const int context = opt.context > 0 ? opt.context : int(std::min<int64_t>(config.max_context(), 32768));
    if (context > config.max_context()) {
        QINFER_FAIL() << "--context " << context << " exceeds the model's context of " << config.max_context() << " tokens";
    }
    bool recognised = true;
    s.style = detect_chat_style(s.tok->chat_template(), &recognised);
    if (!recognised) std::fprintf(stderr, "serve: unrecognised chat template; chat requests use plain ChatML\n");
    s.engine = make_engine(opt.model_dir, opt.engine);
    SchedulerOptions so = opt.scheduler;
    so.pool.max_seq_tokens = context;
    s.sched = std::make_unique<Scheduler>(*s.engine, so);
    s.fits = s.sched->max_request_tokens();
    s.loop = std::thread([&s] { s.sched->serve_loop(); });
    s.routes();
}

HttpServer::~HttpServer() = default;

int HttpServer::bind() {
    Impl & s = *impl_;
    const int port = s.opt.port == 0 ? s.http.bind_to_any_port(s.opt.host) : (s.http.bind_to_port(s.opt.host, s.opt.port) ? s.opt.port : -1);
    if (port <= 0) QINFER_FAIL() << "cannot listen on " << s.opt.host << ":" << s.opt.port;
    // cpp-httplib listens with a backlog of 5 (compiled into Debian's library): many clients connecting at once then
    // overflow the kernel's accept queue and see their connections reset. Listening again raises it.
    if (s.listen_fd >= 0) ::listen(s.listen_fd, 4096);
    return port;
}

void HttpServer::run() { impl_->http.listen_after_bind(); }
void HttpServer::stop() { impl_->http.stop(); }

#endif

int cmd_serve(int argc, char ** argv) {
    for (int i = 2; i < argc; i++) {
        if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h")) {
            std::fputs("usage: qinfer serve --model DIR [--host 127.0.0.1] [--port 8080] [--name NAME] [--context N] [--max-tokens N]\n"
                       "                    [--api-key KEY] [--max-num-seqs 256] [--max-batch-tokens 2048] [--gpu-memory-utilization 0.9]\n"
                       "                    [--max-queue 1024] [--request-timeout 600] [--no-prefix-cache] [--http-threads N]\n"
                       "                    [--backend auto|cpu|cuda] [--threads N] [--kv-dtype D] [--embedding-on-gpu] [--tp N]\n"
                       "                    [--load-format auto|dummy (random weights from config.json alone)] [--step-log FILE.csv]\n"
                       "                    [sampling defaults as for run: --greedy, --temperature T, --top-p P, ...]\n"
                       "OpenAI-style API: POST /v1/completions, POST /v1/chat/completions (\"stream\": true for server-sent events;\n"
                       "n, logprobs), GET /v1/models, GET /health, GET /metrics (Prometheus). Requests run together under continuous\n"
                       "batching (runtime/scheduler.h): up to --max-num-seqs sequences and --max-batch-tokens tokens a step; beyond\n"
                       "--max-queue waiting requests the server answers 503 at once (Retry-After); a request not done after\n"
                       "--request-timeout seconds is cancelled; a streaming client that leaves cancels its request. --context bounds\n"
                       "prompt + output (default min(model's, 32768)); --max-tokens is the output when a request gives none (default\n"
                       "512); --api-key KEY (or QINFER_API_KEY): /v1/ requests must send 'Authorization: Bearer KEY'. --step-log: a CSV\n"
                       "line for every scheduler step and every finished request (runtime/scheduler.h says the columns).\n",
                       stdout);
            return 0;
        }
    }
    Args a(argc, argv, 2, {"greedy", "embedding-on-gpu", "no-prefix-cache"});
    ServeOptions o;
    o.model_dir = a.required("model");
    o.host = a.str("host", "127.0.0.1");
    o.port = int(a.integer("port", 8080));
    if (o.port < 0 || o.port > 65535) QINFER_FAIL() << "--port must lie in [0, 65535]";
    o.name = a.str("name", "");
    o.context = int(a.integer("context", 0));
    o.default_max_tokens = int(a.integer("max-tokens", 512));
    o.api_key = a.str("api-key", read_env().api_key);
    if (o.default_max_tokens < 1) QINFER_FAIL() << "--max-tokens must be at least 1";
    o.sampling = sampling_from_args(a, load_generation_config(o.model_dir, load_model_config(o.model_dir)));
    o.engine.backend = a.str("backend", "auto");
    o.engine.threads = int(a.integer("threads", 0));
    o.engine.kv_dtype = a.str("kv-dtype", "auto");
    o.engine.embedding_on_gpu = a.flag("embedding-on-gpu");
    o.engine.tp = int(a.integer("tp", 1));
    o.engine.dummy_weights = load_format_dummy(a);
    o.scheduler.pool.max_rows = int(a.integer("max-num-seqs", 256));
    o.scheduler.pool.max_step_tokens = int(a.integer("max-batch-tokens", 2048));
    o.scheduler.pool.memory_fraction = a.number("gpu-memory-utilization", 0.9);
    o.scheduler.max_waiting = int(a.integer("max-queue", 1024));
    o.scheduler.prefix_cache = !a.flag("no-prefix-cache");
    o.scheduler.step_log = a.str("step-log", "");
    o.request_timeout_s = a.number("request-timeout", 600);
    o.http_threads = int(a.integer("http-threads", 0));
    if (o.scheduler.pool.max_rows < 1 || o.scheduler.pool.max_step_tokens < 1) QINFER_FAIL() << "--max-num-seqs and --max-batch-tokens must be >= 1";
    if (o.scheduler.max_waiting < 0 || !(o.request_timeout_s > 0)) QINFER_FAIL() << "--max-queue must be >= 0 and --request-timeout > 0";
    // A thread for every request the scheduler may hold (running and queued; each streams from its own thread) and 256
    // more for /health, /metrics and the quick 503s of an overload. With 32 more, 2000 requests at once against
    // --max-queue 512 kept every thread busy and /health took up to 806 ms (H200, d932f67).
    if (o.http_threads <= 0) o.http_threads = std::min(4096, o.scheduler.pool.max_rows + (o.scheduler.max_waiting ? o.scheduler.max_waiting : 1024) + 256);
    a.check_unused();
    // SIGINT / SIGTERM stop the server gracefully: no new connections, running requests finish, the step log is
    // closed. The signals are blocked before any thread starts, so that only the waiting thread below takes them; a
    // second one ends the process at once.
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGINT);
    sigaddset(&stop_signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
    HttpServer server(o);
    const int port = server.bind();
    std::fprintf(stderr, "serve: %s on http://%s:%d (POST /v1/completions, /v1/chat/completions)\n", o.model_dir.c_str(), o.host.c_str(), port);
    std::atomic<bool> returning{false};
    std::thread signals([&] {
        int sig = 0;
        sigwait(&stop_signals, &sig);
        if (returning) return;
        std::fprintf(stderr, "serve: %s: stopping (running requests finish; send it again to end at once)\n", strsignal(sig));
        server.stop();
        sigwait(&stop_signals, &sig);
        if (!returning) std::_Exit(128 + sig);
    });
    server.run();
    returning = true;
    pthread_kill(signals.native_handle(), SIGTERM);
    signals.join();
    return 0;
}

}  // namespace qinfer
