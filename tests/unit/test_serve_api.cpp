// The HTTP API's request parsing, stop strings and response JSON (tools/serve_api.h), without a socket.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tools/serve_api.h"

using namespace qinfer;
using json = nlohmann::json;

namespace {

api::Limits limits() {
    api::Limits l;
    l.vocab = 1000;
    return l;
}

api::Request parse(const std::string & body, bool chat = false) { return api::parse_request(body, chat, SamplingParams{}, limits()); }

// The status and message of the ApiError that parsing `body` throws (0 when it parses).
std::pair<int, std::string> rejection(const std::string & body, bool chat = false) {
    try {
        parse(body, chat);
    } catch (const api::ApiError & e) {
        return {e.status, e.what()};
    }
    return {0, ""};
}

}  // namespace

TEST(ServeApi, ParsesCompletionFields) {
    const api::Request r = parse(R"({"model": "m", "prompt": "Hello", "max_tokens": 7, "temperature": 0.5, "top_p": 0.9,
        "top_k": 20, "seed": 3, "stop": ["\n", "END"], "stream": true, "presence_penalty": 0.5, "user": "ignored"})");
    EXPECT_EQ(r.prompt, "Hello");
    EXPECT_FALSE(r.prompt_is_tokens);
    EXPECT_EQ(r.max_tokens, 7);
    EXPECT_FLOAT_EQ(r.sampling.temperature, 0.5f);
    EXPECT_FLOAT_EQ(r.sampling.top_p, 0.9f);
    EXPECT_EQ(r.sampling.top_k, 20);
    EXPECT_EQ(r.sampling.seed, 3u);
    EXPECT_FLOAT_EQ(r.sampling.presence_penalty, 0.5f);
    EXPECT_EQ(r.stop, (std::vector<std::string>{"\n", "END"}));
    EXPECT_TRUE(r.stream);
    EXPECT_EQ(r.model, "m");

    const api::Request t = parse(R"({"prompt": [1, 2, 999], "top_k": -1})");
    EXPECT_TRUE(t.prompt_is_tokens);
    EXPECT_EQ(t.prompt_tokens, (std::vector<int>{1, 2, 999}));
    EXPECT_EQ(t.sampling.top_k, 0);
    EXPECT_EQ(t.max_tokens, 0);
}

TEST(ServeApi, ParsesChatMessages) {
    const api::Request r = parse(R"({"messages": [{"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]}],
        "max_completion_tokens": 5})", true);
    ASSERT_EQ(r.messages.size(), 2u);
    EXPECT_EQ(r.messages[0].role, "system");
    EXPECT_EQ(r.messages[1].content, "Hi there");
    EXPECT_EQ(r.max_tokens, 5);
}

TEST(ServeApi, RejectsBadRequestsWithOneLine) {
    const std::vector<std::pair<std::string, std::string>> cases = {
        {"", "not valid JSON"},
        {"{\"prompt\": ", "not valid JSON"},
        {"[1, 2]", "JSON object"},
        {"{}", "'prompt' is required"},
        {R"({"prompt": 5})", "'prompt' must be"},
        {R"({"prompt": ""})", "'prompt' is empty"},
        {R"({"prompt": [1, 1000]})", "outside the vocabulary"},
        {R"({"prompt": [-1]})", "outside the vocabulary"},
        {R"({"prompt": [18446744073709551615]})", "outside the vocabulary"},
        {R"({"prompt": ["a", "b"]})", "several prompts"},
        {R"({"prompt": "x", "max_tokens": 0})", "'max_tokens' must lie in"},
        {R"({"prompt": "x", "max_tokens": 2.5})", "'max_tokens' must be an integer"},
        {R"({"prompt": "x", "max_tokens": 99999999999999999999})", "'max_tokens'"},
        {R"({"prompt": "x", "temperature": "hot"})", "'temperature' must be a number"},
        {R"({"prompt": "x", "temperature": 3})", "'temperature' must lie in [0, 2]"},
        {R"({"prompt": "x", "top_p": 0})", "'top_p' must be above 0"},
        {R"({"prompt": "x", "n": 0})", "'n' must lie in [1, 16]"},
        {R"({"prompt": "x", "n": 2, "best_of": 3})", "'best_of' other than n"},
        {R"({"prompt": "x", "logprobs": 21})", "'logprobs' is too large"},
        {R"({"prompt": "x", "logprobs": -1})", "'logprobs' must lie in [0, 20]"},
        {R"({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]})", "at most 4"},
        {R"({"prompt": "x", "stop": [""]})", "must not be empty"},
        {R"({"prompt": "x", "stream": "yes"})", "'stream' must be true or false"},
        {R"({"prompt": "x", "seed": "s"})", "'seed' must be an integer"},
        {R"({"prompt": "x", "model": 3})", "'model' must be a string"},
        {R"({"prompt": "x", "stream_options": true})", "'stream_options' must be an object"},
        {R"({"prompt": "x", "stream_options": {"include_usage": 1}})", "'include_usage' must be true or false"},
    };
    for (const auto & [body, want] : cases) {
        const auto [status, message] = rejection(body);
        EXPECT_EQ(status, 400) << body;
        EXPECT_NE(message.find(want), std::string::npos) << body << " -> " << message;
        EXPECT_EQ(message.find('\n'), std::string::npos) << body;
    }
    const std::vector<std::pair<std::string, std::string>> chat_cases = {
        {R"({"prompt": "x"})", "'messages' is required"},
        {R"({"messages": []})", "non-empty array"},
        {R"({"messages": [{"content": "x"}]})", "messages[0].role must be a string"},
        {R"({"messages": [{"role": "robot", "content": "x"}]})", "is not system, user, assistant or tool"},
        {R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})", "not {\"type\": \"text\""},
        // A part whose "type" is not a string (found by fuzz_serve_request, 2026-11-30: it escaped as a JSON type error).
        {R"({"messages": [{"role": "user", "content": [{"type": [1], "text": "Hi"}]}]})", "not {\"type\": \"text\""},
        {R"({"messages": [{"role": "user", "content": 5}]})", "must be a string or an array"},
    };
    for (const auto & [body, want] : chat_cases) {
        const auto [status, message] = rejection(body, true);
        EXPECT_EQ(status, 400) << body;
        EXPECT_NE(message.find(want), std::string::npos) << body << " -> " << message;
    }
}

TEST(ServeApi, StopStringsHoldBackAndCut) {
    api::StopMatcher m({"END", "\n\n"});
    std::string out;
    for (const char * piece : {"Hel", "lo E", "N", "x", " wor", "ld E", "ND more"}) out += m.push(piece);
    EXPECT_TRUE(m.stopped());
    out += m.flush();
    EXPECT_EQ(out, "Hello ENx world ");
    api::StopMatcher none({});
    EXPECT_EQ(none.push("abc"), "abc");
    api::StopMatcher tail({"xyz"});
    std::string held = tail.push("ab");
    held += tail.push("cx");
    held += tail.flush();
    EXPECT_EQ(held, "abcx");
    EXPECT_FALSE(tail.stopped());
}

TEST(ServeApi, ResponseJson) {
    api::Request r = parse(R"({"model": "m", "prompt": "x"})");
    const json c = json::parse(api::completion_json(r, "cmpl-1", 7, {{"text", "length", {}}}, {3, 4}));
    EXPECT_EQ(c["object"], "text_completion");
    EXPECT_EQ(c["choices"][0]["text"], "text");
    EXPECT_EQ(c["choices"][0]["finish_reason"], "length");
    EXPECT_EQ(c["usage"]["total_tokens"], 7);
    r.chat = true;
    const json chunk = json::parse(api::chunk_json(r, "chatcmpl-1", 7, 0, "He", "", true));
    EXPECT_EQ(chunk["object"], "chat.completion.chunk");
    EXPECT_EQ(chunk["choices"][0]["delta"]["role"], "assistant");
    EXPECT_EQ(chunk["choices"][0]["delta"]["content"], "He");
    EXPECT_TRUE(chunk["choices"][0]["finish_reason"].is_null());
    const json cut = json::parse(api::completion_json(r, "chatcmpl-2", 7, {{std::string("a\xE4", 2), "length", {}}}, {1, 1}));
    EXPECT_EQ(cut["choices"][0]["message"]["content"], "a\xEF\xBF\xBD");  // an incomplete character as U+FFFD
    EXPECT_EQ(json::parse(api::error_json(404, "no route"))["error"]["message"], "no route");
    const api::Request s = parse(R"({"prompt": "x", "stream": true, "stream_options": {"include_usage": true}})");
    EXPECT_TRUE(s.include_usage);
    const json u = json::parse(api::usage_chunk_json(s, "cmpl-3", 7, {2, 5}));
    EXPECT_TRUE(u["choices"].empty());
    EXPECT_EQ(u["usage"]["completion_tokens"], 5);
}

TEST(ServeApi, ChoicesAndLogprobs) {
    api::Request r = parse(R"({"prompt": "x", "n": 2, "logprobs": 2})");
    EXPECT_EQ(r.n, 2);
    EXPECT_EQ(r.logprobs, 2);
    EXPECT_EQ(parse(R"({"prompt": "x"})").logprobs, -1);
    const std::vector<api::TokenLogprob> lps = {{"He", -0.1f, {{"He", -0.1f}, {"Ha", -2.5f}}}, {"llo", -0.2f, {{"llo", -0.2f}}}};
    const json c = json::parse(api::completion_json(r, "cmpl-1", 7, {{"Hello", "length", lps}, {"Hi", "stop", {}}}, {1, 3}));
    ASSERT_EQ(c["choices"].size(), 2u);
    EXPECT_EQ(c["choices"][1]["index"], 1);
    EXPECT_EQ(c["choices"][1]["finish_reason"], "stop");
    const json & lp = c["choices"][0]["logprobs"];
    EXPECT_EQ(lp["tokens"], json({"He", "llo"}));
    EXPECT_FLOAT_EQ(lp["token_logprobs"][1].get<float>(), -0.2f);
    EXPECT_FLOAT_EQ(lp["top_logprobs"][0]["Ha"].get<float>(), -2.5f);
    EXPECT_EQ(lp["text_offset"], json({0, 2}));
    api::Request chat = parse(R"({"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 1})", true);
    EXPECT_EQ(chat.logprobs, 1);
    const json chunk = json::parse(api::chunk_json(chat, "chatcmpl-1", 7, 1, "He", "", false, &lps));
    EXPECT_EQ(chunk["choices"][0]["index"], 1);
    EXPECT_EQ(chunk["choices"][0]["logprobs"]["content"][0]["token"], "He");
    EXPECT_EQ(chunk["choices"][0]["logprobs"]["content"][0]["bytes"], json({72, 101}));
    EXPECT_EQ(chunk["choices"][0]["logprobs"]["content"][0]["top_logprobs"][1]["token"], "Ha");
    EXPECT_THROW(parse(R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 1})", true), api::ApiError);
}
