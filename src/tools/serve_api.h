// The OpenAI-style HTTP API of `qinfer serve`, without the HTTP: request bodies parsed and checked into typed
// requests (every problem an ApiError with its status and a one-line message), stop strings, and the JSON of
// responses and stream chunks. Pure functions, so the unit tests and the fuzz target reach them without a socket.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "io/chat.h"
#include "runtime/sampler.h"

namespace qinfer::api {

// A request the server answers with `status` (4xx) and {"error": {"message": ...}}.
struct ApiError : std::runtime_error {
    int status;
    ApiError(int status_, const std::string & message) : std::runtime_error(message), status(status_) {}
};

struct Limits {
    int vocab = 0;  // token ids in prompts must lie in [0, vocab); the body's size is bounded by the HTTP server
};

// POST /v1/completions (chat = false) or /v1/chat/completions (chat = true).
struct Request {
    bool chat = false;
    std::vector<ChatMessage> messages;  // chat
    std::string prompt;                 // completions, text
    std::vector<int> prompt_tokens;     // completions, token ids (prompt_is_tokens)
    bool prompt_is_tokens = false;
    int max_tokens = 0;                 // 0: not given (the server's default)
    SamplingParams sampling;            // the server's defaults overridden by the request's fields
    std::vector<std::string> stop;      // at most 4, none empty
    bool stream = false;
    bool include_usage = false;         // stream_options.include_usage: a last chunk with the usage
    bool ignore_eos = false;            // vLLM's extension: generate max_tokens whatever the model says
    std::string model;                  // echoed back; any name is accepted
    int n = 1;                          // choices, each its own sequence (seeds seed, seed + 1, ...)
    int logprobs = -1;                  // each token's log-probability and this many alternatives (chat: top_logprobs); -1: none
};
constexpr int k_max_choices = 16, k_max_logprobs = 20;

// Throws ApiError(400) naming the first problem: not JSON, not an object, a missing or mistyped field, a value out of
// range, unsupported options (best_of other than n, several prompts). Unknown fields are ignored, as OpenAI clients
// send extras.
Request parse_request(const std::string & body, bool chat, const SamplingParams & defaults, const Limits & limits);

// Holds back generated text that may be the start of a stop string. push() returns what is safe to send; once a stop
// string appears, everything from it on is dropped and stopped() is true. flush() returns the rest at the end.
class StopMatcher {
public:
    explicit StopMatcher(std::vector<std::string> stops);
    std::string push(const std::string & text);
    std::string flush();
    bool stopped() const { return stopped_; }

private:
    std::vector<std::string> stops_;
    size_t hold_ = 0;  // longest stop string - 1
    std::string pending_;
    bool stopped_ = false;
};

struct Usage {
    int prompt_tokens = 0, completion_tokens = 0;
};

// A generated token's log-probability and the most likely alternatives, each as text (its bytes, which may be part
// of a character).
struct TokenLogprob {
    std::string token;
    float logprob = 0;
    std::vector<std::pair<std::string, float>> top;
};

struct Choice {
    std::string text;
    std::string finish_reason;           // "stop" or "length"
    std::vector<TokenLogprob> logprobs;  // when the request asked for them
};

// Whole responses and stream chunks (finish_reason empty: null), as JSON text; logprobs in the completions API's
// form ({"tokens", "token_logprobs", "top_logprobs", "text_offset"}) or the chat API's ({"content": [...]}).
std::string completion_json(const Request & r, const std::string & id, int64_t created, const std::vector<Choice> & choices,
                            const Usage & usage);
std::string chunk_json(const Request & r, const std::string & id, int64_t created, int index, const std::string & text,
                       const std::string & finish_reason, bool first, const std::vector<TokenLogprob> * logprobs = nullptr);
// The stream's usage chunk (stream_options.include_usage): no choices, the counts.
std::string usage_chunk_json(const Request & r, const std::string & id, int64_t created, const Usage & usage);
std::string error_json(int status, const std::string & message);

}  // namespace qinfer::api
