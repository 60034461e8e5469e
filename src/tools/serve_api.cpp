#include "tools/serve_api.h"

#include <algorithm>
#include <cstdio>
#include <limits>

#include <nlohmann/json.hpp>

namespace qinfer::api {

namespace {

using json = nlohmann::json;

[[noreturn]] void bad(const std::string & message) { throw ApiError(400, message); }

std::string fmt(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", v);
    return buf;
}

// A number field within [lo, hi] (or absent: `value` unchanged).
void read_number(const json & j, const char * key, double lo, double hi, float & value) {
    if (!j.contains(key) || j[key].is_null()) return;
    if (!j[key].is_number()) bad(std::string("'") + key + "' must be a number");
    const double v = j[key].get<double>();
    if (!(v >= lo && v <= hi)) bad(std::string("'") + key + "' must lie in [" + fmt(lo) + ", " + fmt(hi) + "]");
    value = float(v);
}

int64_t read_integer(const json & j, const char * key, int64_t lo, int64_t hi, int64_t fallback) {
    if (!j.contains(key) || j[key].is_null()) return fallback;
    if (!j[key].is_number_integer()) bad(std::string("'") + key + "' must be an integer");
    // Unsigned values above int64's range read as negative through get<int64_t>: compare as unsigned first.
    if (j[key].is_number_unsigned() && j[key].get<uint64_t>() > uint64_t(hi)) bad(std::string("'") + key + "' is too large");
    const int64_t v = j[key].get<int64_t>();
    if (v < lo || v > hi) bad(std::string("'") + key + "' must lie in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    return v;
}

bool read_bool(const json & j, const char * key, bool fallback) {
    if (!j.contains(key) || j[key].is_null()) return fallback;
    if (!j[key].is_boolean()) bad(std::string("'") + key + "' must be true or false");
    return j[key].get<bool>();
}

// OpenAI's content: a string, or an array of {"type": "text", "text": ...} parts.
std::string read_content(const json & c, size_t i) {
    const std::string where = "messages[" + std::to_string(i) + "].content";
    if (c.is_null()) return "";
    if (c.is_string()) return c.get<std::string>();
    if (!c.is_array()) bad("'" + where + "' must be a string or an array of text parts");
    std::string text;
    for (const json & part : c) {
        // Every member's type checked before it is read: json::value() throws on a "type" that is not a string.
        const bool text_part = part.is_object() && part.contains("type") && part["type"].is_string() && part["type"].get<std::string>() == "text";
        if (!text_part || !part.contains("text") || !part["text"].is_string()) {
            bad("'" + where + "' holds a part that is not {\"type\": \"text\", \"text\": string}");
        }
        text += part["text"].get<std::string>();
    }
    return text;
}

void read_messages(const json & j, Request & r) {
    if (!j.contains("messages")) bad("'messages' is required");
    const json & m = j["messages"];
    if (!m.is_array() || m.empty()) bad("'messages' must be a non-empty array");
    for (size_t i = 0; i < m.size(); i++) {
        const json & msg = m[i];
        if (!msg.is_object()) bad("messages[" + std::to_string(i) + "] must be an object");
        if (!msg.contains("role") || !msg["role"].is_string()) bad("messages[" + std::to_string(i) + "].role must be a string");
        const std::string role = msg["role"].get<std::string>();
        if (role != "system" && role != "user" && role != "assistant" && role != "tool") {
            bad("messages[" + std::to_string(i) + "].role '" + role + "' is not system, user, assistant or tool");
        }
        r.messages.push_back({role, read_content(msg.contains("content") ? msg["content"] : json(nullptr), i), "",
                              nlohmann::ordered_json::array()});
    }
}

void read_prompt(const json & j, const Limits & limits, Request & r) {
    if (!j.contains("prompt")) bad("'prompt' is required");
    const json & p = j["prompt"];
    if (p.is_string()) {
        r.prompt = p.get<std::string>();
    } else if (p.is_array() && p.size() == 1 && p[0].is_string()) {
        r.prompt = p[0].get<std::string>();
    } else if (p.is_array() && !p.empty() && std::all_of(p.begin(), p.end(), [](const json & v) { return v.is_number_integer(); })) {
        r.prompt_is_tokens = true;
        for (const json & v : p) {
            const int64_t id = v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()) ? -1 : v.get<int64_t>();
            if (id < 0 || id >= limits.vocab) bad("prompt token " + v.dump() + " is outside the vocabulary [0, " + std::to_string(limits.vocab) + ")");
            r.prompt_tokens.push_back(int(id));
        }
    } else if (p.is_array() && p.size() > 1 && p[0].is_string()) {
        bad("several prompts in one request are not supported: send one request per prompt");
    } else {
        bad("'prompt' must be a string or a non-empty array of token ids");
    }
    if (!r.prompt_is_tokens && r.prompt.empty()) bad("'prompt' is empty");
}

void read_stop(const json & j, Request & r) {
    if (!j.contains("stop") || j["stop"].is_null()) return;
    const json & s = j["stop"];
    if (s.is_string()) {
        r.stop.push_back(s.get<std::string>());
    } else if (s.is_array() && s.size() <= 4 && std::all_of(s.begin(), s.end(), [](const json & v) { return v.is_string(); })) {
        for (const json & v : s) r.stop.push_back(v.get<std::string>());
    } else {
        bad("'stop' must be a string or an array of at most 4 strings");
    }
    for (const std::string & t : r.stop) {
        if (t.empty()) bad("'stop' strings must not be empty");
    }
}

}  // namespace

Request parse_request(const std::string & body, bool chat, const SamplingParams & defaults, const Limits & limits) {
    json j;
    try {
        j = json::parse(body);
    } catch (const json::exception & e) {
        bad(std::string("the body is not valid JSON: ") + e.what());
    }
    if (!j.is_object()) bad("the body must be a JSON object");
    Request r;
    r.chat = chat;
    r.sampling = defaults;
    if (j.contains("model") && !j["model"].is_null()) {
        if (!j["model"].is_string()) bad("'model' must be a string");
        r.model = j["model"].get<std::string>();
    }
    if (chat) read_messages(j, r);
    else read_prompt(j, limits, r);
    const char * max_key = chat && j.contains("max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
    r.max_tokens = int(read_integer(j, max_key, 1, std::numeric_limits<int>::max(), 0));
    r.n = int(read_integer(j, "n", 1, k_max_choices, 1));
    if (j.contains("best_of") && !j["best_of"].is_null() && j["best_of"] != r.n) bad("'best_of' other than n is not supported");
    if (chat) {
        if (read_bool(j, "logprobs", false)) r.logprobs = int(read_integer(j, "top_logprobs", 0, k_max_logprobs, 0));
        else if (j.contains("top_logprobs") && !j["top_logprobs"].is_null()) bad("'top_logprobs' needs 'logprobs': true");
    } else if (j.contains("logprobs") && !j["logprobs"].is_null() && j["logprobs"] != false) {
        r.logprobs = int(read_integer(j, "logprobs", 0, k_max_logprobs, 0));
    }
    SamplingParams & s = r.sampling;
    read_number(j, "temperature", 0, 2, s.temperature);
    read_number(j, "top_p", 0, 1, s.top_p);
    if (s.top_p <= 0.0f) bad("'top_p' must be above 0");
    read_number(j, "min_p", 0, 1, s.min_p);
    read_number(j, "presence_penalty", -2, 2, s.presence_penalty);
    read_number(j, "frequency_penalty", -2, 2, s.frequency_penalty);
    read_number(j, "repetition_penalty", 0.01, 100, s.repetition_penalty);
    const int64_t top_k = read_integer(j, "top_k", -1, std::numeric_limits<int>::max(), s.top_k);
    s.top_k = top_k < 0 ? 0 : int(top_k);  // vLLM: -1 is off
    if (j.contains("seed") && !j["seed"].is_null()) {
        if (!j["seed"].is_number_integer()) bad("'seed' must be an integer");
        s.seed = j["seed"].is_number_unsigned() ? j["seed"].get<uint64_t>() : uint64_t(j["seed"].get<int64_t>());
    }
    read_stop(j, r);
    r.stream = read_bool(j, "stream", false);
    if (j.contains("stream_options") && !j["stream_options"].is_null()) {
        if (!j["stream_options"].is_object()) bad("'stream_options' must be an object");
        r.include_usage = read_bool(j["stream_options"], "include_usage", false);
    }
    r.ignore_eos = read_bool(j, "ignore_eos", false);
    return r;
}

StopMatcher::StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
    for (const std::string & s : stops_) hold_ = std::max(hold_, s.size() - 1);
}

std::string StopMatcher::push(const std::string & text) {
    if (stopped_) return "";
    pending_ += text;
    size_t first = std::string::npos;
    for (const std::string & s : stops_) first = std::min(first, pending_.find(s));
    if (first != std::string::npos) {
        stopped_ = true;
        std::string out = pending_.substr(0, first);
        pending_.clear();
        return out;
    }
    if (pending_.size() <= hold_) return "";
    std::string out = pending_.substr(0, pending_.size() - hold_);
    pending_.erase(0, pending_.size() - hold_);
    return out;
}

std::string StopMatcher::flush() {
    std::string out = stopped_ ? "" : pending_;
    pending_.clear();
    return out;
}

namespace {

// A choice's logprobs in the completions API's form (text_offset counts bytes from the start of the choice's text).
json completion_logprobs(const std::vector<TokenLogprob> & lps, size_t offset) {
    json tokens = json::array(), values = json::array(), tops = json::array(), offsets = json::array();
    for (const TokenLogprob & t : lps) {
        tokens.push_back(t.token);
        values.push_back(t.logprob);
        json top = json::object();
        for (const auto & [text, lp] : t.top) {
            if (!top.contains(text)) top[text] = lp;
        }
        tops.push_back(top);
        offsets.push_back(offset);
        offset += t.token.size();
    }
    return {{"tokens", tokens}, {"token_logprobs", values}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

json bytes_of(const std::string & s) {
    json b = json::array();
    for (unsigned char c : s) b.push_back(int(c));
    return b;
}

// ... and in the chat API's form.
json chat_logprobs(const std::vector<TokenLogprob> & lps) {
    json content = json::array();
    for (const TokenLogprob & t : lps) {
        json top = json::array();
        for (const auto & [text, lp] : t.top) top.push_back({{"token", text}, {"logprob", lp}, {"bytes", bytes_of(text)}});
        content.push_back({{"token", t.token}, {"logprob", t.logprob}, {"bytes", bytes_of(t.token)}, {"top_logprobs", top}});
    }
    return {{"content", content}};
}

json choice_body(const Request & r, int index, const std::string & text, bool delta, bool first, const std::vector<TokenLogprob> * lps,
                 size_t offset) {
    json c = {{"index", index}};
    const bool with_lp = r.logprobs >= 0 && lps;
    if (!r.chat) {
        c["text"] = text;
        c["logprobs"] = with_lp ? completion_logprobs(*lps, offset) : json(nullptr);
        return c;
    }
    if (delta) {
        json d = json::object();
        if (first) d["role"] = "assistant";
        if (!text.empty() || !first) d["content"] = text;
        c["delta"] = d;
    } else {
        c["message"] = {{"role", "assistant"}, {"content", text}};
    }
    c["logprobs"] = with_lp ? chat_logprobs(*lps) : json(nullptr);
    return c;
}

json envelope(const Request & r, const std::string & id, int64_t created, bool chunk) {
    const char * object = r.chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion";
    return {{"id", id}, {"object", object}, {"created", created}, {"model", r.model}};
}

json usage_body(const Usage & u) {
    return {{"prompt_tokens", u.prompt_tokens}, {"completion_tokens", u.completion_tokens}, {"total_tokens", u.prompt_tokens + u.completion_tokens}};
}

}  // namespace

std::string completion_json(const Request & r, const std::string & id, int64_t created, const std::vector<Choice> & choices,
                            const Usage & usage) {
    json j = envelope(r, id, created, false);
    json list = json::array();
    for (size_t i = 0; i < choices.size(); i++) {
        json c = choice_body(r, int(i), choices[i].text, false, false, &choices[i].logprobs, 0);
        c["finish_reason"] = choices[i].finish_reason;
        list.push_back(c);
    }
    j["choices"] = list;
    j["usage"] = usage_body(usage);
    // Generated text may end inside a multi-byte character (max_tokens): replace invalid bytes rather than throw.
    return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string chunk_json(const Request & r, const std::string & id, int64_t created, int index, const std::string & text,
                       const std::string & finish_reason, bool first, const std::vector<TokenLogprob> * logprobs) {
    json j = envelope(r, id, created, true);
    json c = choice_body(r, index, text, true, first, logprobs, 0);
    c["finish_reason"] = finish_reason.empty() ? json(nullptr) : json(finish_reason);
    j["choices"] = json::array({c});
    return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string usage_chunk_json(const Request & r, const std::string & id, int64_t created, const Usage & usage) {
    json j = envelope(r, id, created, true);
    j["choices"] = json::array();
    j["usage"] = usage_body(usage);
    return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string error_json(int status, const std::string & message) {
    const char * type = status >= 500 ? "server_error" : "invalid_request_error";
    return json{{"error", {{"message", message}, {"type", type}, {"code", status}}}}.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace qinfer::api
