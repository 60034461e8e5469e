// `qinfer serve`: an OpenAI-style HTTP server (POST /v1/completions, /v1/chat/completions, streamed as server-sent
// events when asked; GET /v1/models, /health, /metrics) over one engine and its continuous-batching scheduler
// (runtime/scheduler.h), whose loop runs in its own thread. Bad requests get a 4xx with {"error": {"message": ...}}
// before any work; a full queue a 503 with Retry-After.
#pragma once

#include <memory>
#include <string>

#include "runtime/engine.h"
#include "runtime/sampler.h"
#include "runtime/scheduler.h"

namespace qinfer {

struct ServeOptions {
    std::string model_dir;
    std::string name;               // the model's name in responses and /v1/models (default: the folder's name)
    std::string host = "127.0.0.1";
    int port = 8080;                // 0: any free port (HttpServer::bind returns it)
    int context = 0;                // tokens a request may hold, prompt and output (0: min(model's, 32768))
    int default_max_tokens = 512;   // output tokens when a request gives no max_tokens (capped by the context)
    size_t max_body_bytes = 4 << 20;
    std::string api_key;            // non-empty: /v1/ requests must send "Authorization: Bearer <api_key>" (else 401)
    SamplingParams sampling;        // defaults for fields a request leaves out
    EngineOptions engine;
    SchedulerOptions scheduler;     // rows and tokens a step, memory, queue limit, prefix cache (max_seq_tokens: context)
    double request_timeout_s = 600; // a request not finished by then is cancelled (HTTP 503, or an error event)
    int http_threads = 256;         // connections served at once (each streaming client holds one)
};

class HttpServer {
public:
    explicit HttpServer(const ServeOptions & opt);  // loads the tokenizer and the model
    ~HttpServer();
    int bind();   // binds opt.host:opt.port and returns the port; throws when it cannot
    void run();   // serves until stop()
    void stop();

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace qinfer
