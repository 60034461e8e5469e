// qinfer serve: the HTTP side of tools/serve.h (cpp-httplib), the API's parsing and JSON in tools/serve_api.cpp.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>

#include "core/check.h"
#include "io/chat.h"
#include "io/tokenizer.h"
#include "runtime/generate.h"
#include "core/env.h"
#include "tools/commands.h"
#include "tools/serve.h"
#include "tools/serve_api.h"

#ifdef QINFER_HAVE_HTTPLIB
#include <httplib.h>
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

void send_error(httplib::Response & res, int status, const std::string & message) {
    res.status = status;
    res.set_content(api::error_json(status, message), "application/json");
}

}  // namespace

struct HttpServer::Impl {
    ServeOptions opt;
    std::unique_ptr<Tokenizer> tok;
    std::unique_ptr<Engine> engine;
    GenerationConfig gc;
    ChatStyle style = ChatStyle::ChatML;
    int context = 0;
    std::mutex engine_mu;  // one generation at a time
    std::atomic<uint64_t> next_id{1};
    httplib::Server http;

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
        if (n >= context) {
            throw api::ApiError(400, "the prompt has " + std::to_string(n) + " tokens; the server's context holds " + std::to_string(context) +
                                         " (prompt and output)");
        }
        if (job.req.max_tokens > 0 && int64_t(n) + job.req.max_tokens > context) {
            throw api::ApiError(400, "prompt of " + std::to_string(n) + " tokens + max_tokens " + std::to_string(job.req.max_tokens) +
                                         " exceed the server's context of " + std::to_string(context) + " tokens");
        }
        job.max_tokens = job.req.max_tokens > 0 ? job.req.max_tokens : std::min(opt.default_max_tokens, context - n);
        job.id = std::string(chat ? "chatcmpl-" : "cmpl-") + std::to_string(next_id++);
        job.created = unix_seconds();
        return job;
    }

    // Runs a job under the engine lock; `emit` receives text as it becomes final and returns false to stop (a client
    // gone). Returns the finish reason ("stop" or "length") and the usage.
    template <class Emit> std::string run_job(const Job & job, Emit emit, api::Usage & usage) {
        GenerateOptions g;
        g.max_new_tokens = job.max_tokens;
        g.sampling = job.req.sampling;
        g.eos_token_ids = gc.eos_token_ids;
        g.ignore_eos = job.req.ignore_eos;
        g.n_valid_tokens = tok->size();
        Tokenizer::Stream stream(*tok);
        api::StopMatcher stops(job.req.stop);
        bool client_gone = false;
        g.on_token = [&](int t) {
            const std::string text = stops.push(stream.push(t));
            if (!text.empty() && !emit(text)) client_gone = true;
            return !stops.stopped() && !client_gone;
        };
        std::lock_guard<std::mutex> lock(engine_mu);
        const GenerateResult r = generate(*engine, job.prompt, g);
        if (!client_gone) {
            std::string rest = stops.push(stream.flush());
            rest += stops.flush();
            if (!rest.empty()) emit(rest);
        }
        usage.prompt_tokens = int(job.prompt.size());
        usage.completion_tokens = int(r.tokens.size());
        return stops.stopped() || std::strcmp(r.stop_reason, "eos") == 0 ? "stop" : "length";
    }

    void complete(const httplib::Request & hreq, httplib::Response & res, bool chat) {
        auto job = std::make_shared<Job>(prepare(hreq.body, chat));
        if (!job->req.stream) {
            std::string text;
            api::Usage usage;
            const std::string finish = run_job(*job, [&](const std::string & t) {
                text += t;
                return true;
            }, usage);
            res.set_content(api::completion_json(job->req, job->id, job->created, text, finish, usage), "application/json");
            return;
        }
        res.set_header("Cache-Control", "no-cache");
        res.set_chunked_content_provider("text/event-stream", [this, job](size_t, httplib::DataSink & sink) {
            auto event = [&](const std::string & json) {
                const std::string line = "data: " + json + "\n\n";
                return sink.write(line.data(), line.size());
            };
            bool first = true;
            api::Usage usage;
            try {
                const std::string finish = run_job(*job, [&](const std::string & t) {
                    const bool ok = event(api::chunk_json(job->req, job->id, job->created, t, "", first));
                    first = false;
                    return ok;
                }, usage);
                event(api::chunk_json(job->req, job->id, job->created, "", finish, first));
                if (job->req.include_usage) event(api::usage_chunk_json(job->req, job->id, job->created, usage));
            } catch (const std::exception & e) {
                event(api::error_json(500, e.what()));
            }
            const std::string done = "data: [DONE]\n\n";
            sink.write(done.data(), done.size());
            sink.done();
            return true;
        });
    }

    void routes() {
        http.set_payload_max_length(opt.max_body_bytes);
        if (!opt.api_key.empty()) {
            http.set_pre_routing_handler([this](const httplib::Request & req, httplib::Response & res) {
                if (req.path.rfind("/v1/", 0) != 0 || req.get_header_value("Authorization") == "Bearer " + opt.api_key) {
                    return httplib::Server::HandlerResponse::Unhandled;
                }
                send_error(res, 401, "missing or wrong API key: send 'Authorization: Bearer <key>'");
                return httplib::Server::HandlerResponse::Handled;
            });
        }
        http.Get("/health", [](const httplib::Request &, httplib::Response & res) { res.set_content("{\"status\": \"ok\"}", "application/json"); });
        http.Get("/v1/models", [this](const httplib::Request &, httplib::Response & res) {
            nlohmann::json m = {{"object", "list"},
                                {"data", nlohmann::json::array({{{"id", opt.name}, {"object", "model"}, {"owned_by", "qinfer"}, {"max_model_len", context}}})}};
            res.set_content(m.dump(), "application/json");
        });
        for (const bool chat : {false, true}) {
            http.Post(chat ? "/v1/chat/completions" : "/v1/completions", [this, chat](const httplib::Request & req, httplib::Response & res) {
                try {
                    complete(req, res, chat);
                } catch (const api::ApiError & e) {
                    send_error(res, e.status, e.what());
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
    s.context = opt.context > 0 ? opt.context : int(std::min<int64_t>(config.max_context(), 32768));
    if (s.context > config.max_context()) {
        QINFER_FAIL() << "--context " << s.context << " exceeds the model's context of " << config.max_context() << " tokens";
    }
    bool recognised = true;
    s.style = detect_chat_style(s.tok->chat_template(), &recognised);
    if (!recognised) std::fprintf(stderr, "serve: unrecognised chat template; chat requests use plain ChatML\n");
    EngineOptions eo = opt.engine;
    eo.max_context = s.context;
    s.engine = make_engine(opt.model_dir, eo);
    s.routes();
}

HttpServer::~HttpServer() = default;

int HttpServer::bind() {
    Impl & s = *impl_;
    const int port = s.opt.port == 0 ? s.http.bind_to_any_port(s.opt.host) : (s.http.bind_to_port(s.opt.host, s.opt.port) ? s.opt.port : -1);
    if (port <= 0) QINFER_FAIL() << "cannot listen on " << s.opt.host << ":" << s.opt.port;
    return port;
}

void HttpServer::run() { impl_->http.listen_after_bind(); }
void HttpServer::stop() { impl_->http.stop(); }

#endif

int cmd_serve(int argc, char ** argv) {
    for (int i = 2; i < argc; i++) {
        if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h")) {
            std::fputs("usage: qinfer serve --model DIR [--host 127.0.0.1] [--port 8080] [--name NAME] [--context N] [--max-tokens N]\n"
                       "                    [--api-key KEY]\n"
                       "                    [--backend auto|cpu|cuda] [--threads N] [--kv-dtype D] [--embedding-on-gpu]\n"
                       "                    [sampling defaults as for run: --greedy, --temperature T, --top-p P, ...]\n"
                       "OpenAI-style API: POST /v1/completions, POST /v1/chat/completions (\"stream\": true for server-sent events),\n"
                       "GET /v1/models, GET /health. One generation at a time; --context bounds prompt + output (default\n"
                       "min(model's, 32768)); --max-tokens is the output when a request gives none (default 512); --api-key KEY\n"
                       "(or QINFER_API_KEY): /v1/ requests must send 'Authorization: Bearer KEY'.\n",
                       stdout);
            return 0;
        }
    }
    Args a(argc, argv, 2, {"greedy", "embedding-on-gpu"});
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
    a.check_unused();
    HttpServer server(o);
    const int port = server.bind();
    std::fprintf(stderr, "serve: %s on http://%s:%d (POST /v1/completions, /v1/chat/completions)\n", o.model_dir.c_str(), o.host.c_str(), port);
    server.run();
    return 0;
}

}  // namespace qinfer
