// `qinfer serve` end to end on the CPU: a tiny synthetic checkpoint with a byte-level tokenizer (ids = bytes, no
// merges), the server on a free port, requests through cpp-httplib's client; answers equal generate() called directly.
#ifdef QINFER_HAVE_HTTPLIB

#include <httplib.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "io/tokenizer.h"
#include "runtime/generate.h"
#include "tools/serve.h"
#include "tools/synth.h"
#include "unit/test_helpers.h"

using namespace qinfer;
using json = nlohmann::json;

namespace {

// GPT-2's byte-to-character map, with byte b as token b.
std::string byte_level_tokenizer_json() {
    std::vector<int> printable;
    for (int b = '!'; b <= '~'; b++) printable.push_back(b);
    for (int b = 0xA1; b <= 0xAC; b++) printable.push_back(b);
    for (int b = 0xAE; b <= 0xFF; b++) printable.push_back(b);
    json vocab = json::object();
    int extra = 0;
    for (int b = 0; b < 256; b++) {
        const bool direct = std::find(printable.begin(), printable.end(), b) != printable.end();
        const int cp = direct ? b : 256 + extra++;
        std::string ch;
        if (cp < 0x80) ch = std::string(1, char(cp));
        else ch = {char(0xC0 | (cp >> 6)), char(0x80 | (cp & 0x3F))};
        vocab[ch] = b;
    }
    const json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
    return json{{"version", "1.0"},
                {"added_tokens", json::array()},
                {"normalizer", {{"type", "NFC"}}},
                {"pre_tokenizer",
                 {{"type", "Sequence"},
                  {"pretokenizers",
                   {{{"type", "Split"},
                     {"pattern", {{"Regex", "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}}},
                     {"behavior", "Isolated"},
                     {"invert", false}},
                    byte_level}}}},
                {"decoder", byte_level},
                {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}}}}
        .dump();
}

class Serve : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        dir_ = test::temp_dir("serve");
        SynthOptions o;
        o.preset = "tiny-qwen2";
        o.out_dir = dir_;
        o.seed = 5;
        o.quiet = true;
        synthesize(o);
        test::write_text(dir_ + "/tokenizer.json", byte_level_tokenizer_json());
        ServeOptions so;
        so.model_dir = dir_;
        so.name = "tiny";
        so.port = 0;
        so.context = 256;
        so.default_max_tokens = 8;
        so.max_body_bytes = 4096;
        so.engine.backend = "cpu";
        so.engine.threads = 1;
        server_ = new HttpServer(so);
        port_ = server_->bind();
        thread_ = new std::thread([] { server_->run(); });
    }
    static void TearDownTestSuite() {
        server_->stop();
        thread_->join();
        delete thread_;
        delete server_;
        std::filesystem::remove_all(dir_);
    }
    static httplib::Client client() { return httplib::Client("127.0.0.1", port_); }
    // What generate() gives for these ids, greedy, as the server runs it.
    static std::vector<int> direct(const std::vector<int> & prompt, int n) {
        EngineOptions eo;
        eo.backend = "cpu";
        eo.threads = 1;
        eo.max_context = 256;
        auto engine = make_engine(dir_, eo);
        GenerateOptions g;
        g.max_new_tokens = n;
        g.eos_token_ids = {2};
        g.n_valid_tokens = 256;
        return generate(*engine, prompt, g).tokens;
    }
    static std::string dir_;
    static int port_;
    static HttpServer * server_;
    static std::thread * thread_;
};
std::string Serve::dir_;
int Serve::port_ = 0;
HttpServer * Serve::server_ = nullptr;
std::thread * Serve::thread_ = nullptr;

}  // namespace

TEST_F(Serve, CompletionEqualsGenerate) {
    const std::vector<int> prompt = {72, 101, 108, 108, 111};  // "Hello"
    const std::vector<int> want = direct(prompt, 6);
    auto cli = client();
    auto res = cli.Post("/v1/completions", R"({"prompt": [72, 101, 108, 108, 111], "max_tokens": 6, "temperature": 0})", "application/json");
    ASSERT_TRUE(res);
    ASSERT_EQ(res->status, 200) << res->body;
    const json j = json::parse(res->body);
    auto tok = Tokenizer::load_dir(dir_);
    Tokenizer::Stream stream(*tok);
    std::string want_text;
    for (int t : want) want_text += stream.push(t);
    want_text += stream.flush();
    EXPECT_EQ(j["choices"][0]["text"], want_text);
    EXPECT_EQ(j["usage"]["prompt_tokens"], 5);
    EXPECT_EQ(j["usage"]["completion_tokens"], int(want.size()));
    EXPECT_EQ(j["model"], "tiny");
    // The text prompt "Hello" is the same five ids; streamed, the deltas add up to the same text.
    auto streamed = cli.Post("/v1/completions",
                             R"({"prompt": "Hello", "max_tokens": 6, "temperature": 0, "stream": true, "stream_options": {"include_usage": true}})",
                             "application/json");
    ASSERT_TRUE(streamed);
    ASSERT_EQ(streamed->status, 200);
    std::string text, body = streamed->body;
    int finishes = 0, usage_tokens = -1;
    for (size_t at = 0; (at = body.find("data: ", at)) != std::string::npos;) {
        const size_t end = body.find("\n\n", at);
        const std::string data = body.substr(at + 6, end - at - 6);
        at = end;
        if (data == "[DONE]") break;
        const json c = json::parse(data);
        if (c["choices"].empty()) {  // the usage chunk, last
            usage_tokens = c["usage"]["completion_tokens"];
            continue;
        }
        text += c["choices"][0]["text"].get<std::string>();
        finishes += !c["choices"][0]["finish_reason"].is_null();
    }
    EXPECT_EQ(text, j["choices"][0]["text"].get<std::string>());
    EXPECT_EQ(finishes, 1);
    EXPECT_EQ(usage_tokens, int(want.size()));
    EXPECT_NE(body.find("data: [DONE]"), std::string::npos);
}

TEST_F(Serve, ChatAndModels) {
    auto cli = client();
    auto res = cli.Post("/v1/chat/completions", R"({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "temperature": 0})",
                        "application/json");
    ASSERT_TRUE(res);
    ASSERT_EQ(res->status, 200) << res->body;
    const json j = json::parse(res->body);
    EXPECT_EQ(j["object"], "chat.completion");
    EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
    EXPECT_LE(j["usage"]["completion_tokens"].get<int>(), 3);
    auto models = cli.Get("/v1/models");
    ASSERT_TRUE(models);
    EXPECT_EQ(json::parse(models->body)["data"][0]["id"], "tiny");
    EXPECT_EQ(cli.Get("/health")->status, 200);
}

TEST_F(Serve, BadRequestsGet4xxAndTheServerLives) {
    auto cli = client();
    struct Case {
        const char * path;
        std::string body;
        int status;
        const char * says;
    };
    const std::vector<Case> cases = {
        {"/v1/completions", "{not json", 400, "not valid JSON"},
        {"/v1/completions", R"({"prompt": [300]})", 400, "outside the vocabulary"},
        {"/v1/completions", R"({"prompt": "x", "max_tokens": 300})", 400, "exceed the server's context of 256"},
        {"/v1/completions", R"({"prompt": ")" + std::string(300, 'a') + R"("})", 400, "the server's context holds 256"},
        {"/v1/completions", R"({"prompt": ")" + std::string(5000, 'a') + R"("})", 413, "too large"},
        {"/v1/chat/completions", R"({"messages": "hi"})", 400, "non-empty array"},
        {"/v1/nothing", "{}", 404, "no route for POST /v1/nothing"},
    };
    for (const Case & c : cases) {
        auto res = cli.Post(c.path, c.body, "application/json");
        ASSERT_TRUE(res) << c.path;
        EXPECT_EQ(res->status, c.status) << c.body.substr(0, 60);
        const json j = json::parse(res->body, nullptr, false);
        ASSERT_TRUE(j.is_object()) << res->body;
        EXPECT_NE(j["error"]["message"].get<std::string>().find(c.says), std::string::npos) << res->body;
    }
    auto ok = cli.Post("/v1/completions", R"({"prompt": "ok", "max_tokens": 2})", "application/json");
    ASSERT_TRUE(ok);
    EXPECT_EQ(ok->status, 200);
}

TEST_F(Serve, ApiKey) {
    ServeOptions so;
    so.model_dir = dir_;
    so.port = 0;
    so.context = 64;
    so.api_key = "sesame";
    so.engine.backend = "cpu";
    so.engine.threads = 1;
    HttpServer keyed(so);
    const int port = keyed.bind();
    std::thread t([&] { keyed.run(); });
    httplib::Client cli("127.0.0.1", port);
    const std::string body = R"({"prompt": "Hi", "max_tokens": 2})";
    auto none = cli.Post("/v1/completions", body, "application/json");
    ASSERT_TRUE(none);
    EXPECT_EQ(none->status, 401);
    EXPECT_NE(json::parse(none->body)["error"]["message"].get<std::string>().find("API key"), std::string::npos);
    auto wrong = cli.Post("/v1/completions", {{"Authorization", "Bearer open"}}, body, "application/json");
    ASSERT_TRUE(wrong);
    EXPECT_EQ(wrong->status, 401);
    auto right = cli.Post("/v1/completions", {{"Authorization", "Bearer sesame"}}, body, "application/json");
    ASSERT_TRUE(right);
    EXPECT_EQ(right->status, 200);
    EXPECT_EQ(cli.Get("/health")->status, 200);  // outside /v1/
    keyed.stop();
    t.join();
}

TEST_F(Serve, StopStringEndsTheText) {
    auto cli = client();
    auto full = cli.Post("/v1/completions", R"({"prompt": "Hello", "max_tokens": 8, "temperature": 0, "ignore_eos": true})", "application/json");
    ASSERT_TRUE(full);
    const std::string text = json::parse(full->body)["choices"][0]["text"];
    // A printable ASCII character past the first of the (random) greedy text as the stop string.
    size_t at = 1;
    while (at < text.size() && !(text[at] >= 0x20 && text[at] < 0x7F)) at++;
    if (at >= text.size()) GTEST_SKIP() << "no ASCII character in the greedy text";
    const std::string stop = text.substr(at, 1);
    const json req = {{"prompt", "Hello"}, {"max_tokens", 8}, {"temperature", 0}, {"ignore_eos", true}, {"stop", stop}};
    auto cut = cli.Post("/v1/completions", req.dump(), "application/json");
    ASSERT_TRUE(cut);
    const json j = json::parse(cut->body);
    EXPECT_EQ(j["choices"][0]["text"], text.substr(0, text.find(stop)));
    EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
}

// Many streaming clients at once (bounded: 16 clients, 3 requests each, 60 s): every answer equals the greedy
// continuation of its prompt alone, and the pool is empty afterwards.
TEST_F(Serve, ConcurrentStreamingClientsEqualAlone) {
    constexpr int k_clients = 16, k_each = 3;
    std::vector<std::vector<int>> prompts;
    for (int i = 0; i < k_clients * k_each; i++) prompts.push_back({65 + i % 26, 97 + (i * 7) % 26, 32, 97 + (i * 3) % 26});
    std::vector<std::string> got(prompts.size());
    std::vector<std::thread> clients;
    for (int c = 0; c < k_clients; c++) {
        clients.emplace_back([&, c] {
            httplib::Client cli("127.0.0.1", port_);
            cli.set_read_timeout(60, 0);
            for (int r = 0; r < k_each; r++) {
                const size_t i = size_t(c * k_each + r);
                const json req = {{"prompt", prompts[i]}, {"max_tokens", 5}, {"temperature", 0}, {"ignore_eos", true}, {"stream", true}};
                auto res = cli.Post("/v1/completions", req.dump(), "application/json");
                if (!res || res->status != 200) {
                    ADD_FAILURE() << "request " << i << ": " << (res ? std::to_string(res->status) + " " + res->body : httplib::to_string(res.error()));
                    continue;
                }
                const std::string & body = res->body;
                for (size_t at = 0; (at = body.find("data: ", at)) != std::string::npos;) {
                    const size_t end = body.find("\n\n", at);
                    const std::string data = body.substr(at + 6, end - at - 6);
                    at = end;
                    if (data == "[DONE]") break;
                    got[i] += json::parse(data)["choices"][0]["text"].get<std::string>();
                }
            }
        });
    }
    for (auto & t : clients) t.join();
    auto tok = Tokenizer::load_dir(dir_);
    EngineOptions eo;
    eo.backend = "cpu";
    eo.threads = 1;
    eo.max_context = 256;
    auto engine = make_engine(dir_, eo);
    for (size_t i = 0; i < prompts.size(); i++) {
        GenerateOptions g;
        g.max_new_tokens = 5;
        g.ignore_eos = true;
        g.n_valid_tokens = 256;
        Tokenizer::Stream stream(*tok);
        std::string want;
        for (int t : generate(*engine, prompts[i], g).tokens) want += stream.push(t);
        want += stream.flush();
        EXPECT_EQ(got[i], want) << "request " << i;
    }
    const std::string metrics = client().Get("/metrics")->body;
    EXPECT_NE(metrics.find("qinfer_kv_blocks_used 0\n"), std::string::npos) << metrics.substr(0, 400);
    EXPECT_NE(metrics.find("qinfer_time_to_first_token_seconds_count"), std::string::npos);
}

// n choices with log-probabilities: greedy choices are equal, each token's log-probability is its top alternative's.
TEST_F(Serve, ChoicesAndLogprobs) {
    auto res = client().Post("/v1/completions", R"({"prompt": "Hello", "max_tokens": 4, "temperature": 0, "n": 3, "logprobs": 2, "ignore_eos": true})",
                             "application/json");
    ASSERT_TRUE(res);
    ASSERT_EQ(res->status, 200) << res->body;
    const json j = json::parse(res->body);
    ASSERT_EQ(j["choices"].size(), 3u);
    for (int c = 0; c < 3; c++) {
        EXPECT_EQ(j["choices"][c]["index"], c);
        EXPECT_EQ(j["choices"][c]["text"], j["choices"][0]["text"]);
        const json & lp = j["choices"][c]["logprobs"];
        ASSERT_EQ(lp["tokens"].size(), 4u);
        for (size_t t = 0; t < 4; t++) {
            EXPECT_LE(lp["token_logprobs"][t].get<double>(), 0.0);
            EXPECT_LE(lp["top_logprobs"][t].size(), 2u);
        }
    }
    EXPECT_EQ(j["usage"]["completion_tokens"], 12);
    auto chat = client().Post("/v1/chat/completions",
                              R"({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "logprobs": true, "top_logprobs": 1, "ignore_eos": true})",
                              "application/json");
    ASSERT_TRUE(chat);
    ASSERT_EQ(chat->status, 200) << chat->body;
    EXPECT_EQ(json::parse(chat->body)["choices"][0]["logprobs"]["content"].size(), 2u);
}

// A streaming client that leaves cancels its request: the server goes on, and its blocks come back.
TEST_F(Serve, DisconnectCancels) {
    {
        // A raw socket: send the request, read the first bytes of the stream, close.
        const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
        ASSERT_GE(fd, 0);
        sockaddr_in addr{};
        addr.sin_family = AF_INET;
        addr.sin_port = htons(uint16_t(port_));
        addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr *>(&addr), sizeof addr), 0);
        const std::string body = R"({"prompt": "Hello", "max_tokens": 200, "ignore_eos": true, "stream": true})";
        const std::string req = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: " +
                                std::to_string(body.size()) + "\r\n\r\n" + body;
        ASSERT_EQ(::send(fd, req.data(), req.size(), 0), ssize_t(req.size()));
        char buf[256];
        ASSERT_GT(::recv(fd, buf, sizeof buf, 0), 0);
        ::close(fd);
    }
    // The server notices within a step or two (the next write fails); allow a few seconds, bounded.
    std::string metrics;
    for (int i = 0; i < 50; i++) {
        metrics = client().Get("/metrics")->body;
        if (metrics.find("qinfer_requests_running 0\n") != std::string::npos && metrics.find("qinfer_kv_blocks_used 0\n") != std::string::npos) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    EXPECT_NE(metrics.find("qinfer_kv_blocks_used 0\n"), std::string::npos);
    auto ok = client().Post("/v1/completions", R"({"prompt": "ok", "max_tokens": 2})", "application/json");
    ASSERT_TRUE(ok);
    EXPECT_EQ(ok->status, 200);
}

// Overload: a server with room for 2 running and 2 waiting requests refuses the rest at once (503, Retry-After);
// every accepted request completes, and /health answers meanwhile.
TEST_F(Serve, OverloadGets503AndAcceptedComplete) {
    ServeOptions so;
    so.model_dir = dir_;
    so.port = 0;
    so.context = 128;
    so.engine.backend = "cpu";
    so.engine.threads = 1;
    so.scheduler.pool.max_rows = 2;
    so.scheduler.max_waiting = 2;
    so.http_threads = 64;
    HttpServer small(so);
    const int port = small.bind();
    std::thread t([&] { small.run(); });
    std::atomic<int> ok{0}, busy{0}, other{0};
    std::vector<std::thread> clients;
    for (int c = 0; c < 24; c++) {
        clients.emplace_back([&] {
            httplib::Client cli("127.0.0.1", port);
            cli.set_read_timeout(60, 0);
            auto res = cli.Post("/v1/completions", R"({"prompt": "Hello there", "max_tokens": 40, "ignore_eos": true})", "application/json");
            if (res && res->status == 200) ok++;
            else if (res && res->status == 503 && res->get_header_value("Retry-After") == "1") busy++;
            else other++;
        });
    }
    httplib::Client probe("127.0.0.1", port);
    for (int i = 0; i < 5; i++) {
        auto h = probe.Get("/health");
        ASSERT_TRUE(h);
        EXPECT_EQ(h->status, 200);
    }
    for (auto & c : clients) c.join();
    EXPECT_EQ(other.load(), 0);
    EXPECT_EQ(ok + busy, 24);
    EXPECT_GE(ok.load(), 2);  // at least the first two; how many more depends on when the loop admits them
    EXPECT_GT(busy.load(), 0);
    small.stop();
    t.join();
}

#endif
