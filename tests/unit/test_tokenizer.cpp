// The tokenizer against ids from the reference (the node port of Hugging Face's tokenizer that ships Qwen3's
// files), on hard cases; decoding back to the NFC form of the input; streaming; invalid input; chat formatting.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/check.h"
#include "io/chat.h"
#include "io/tokenizer.h"
#include "test_helpers.h"
#include "tools/args.h"

using namespace qinfer;
namespace fs = std::filesystem;

namespace {

const fs::path k_data = fs::path(QINFER_TEST_DATA) / "tokenizer";
const fs::path k_assets = fs::path(QINFER_TEST_DATA) / ".." / ".." / "assets" / "tokenizers";

std::vector<std::string> split_records(const std::string & s) {
    std::vector<std::string> out;
    size_t start = 0;
    while (true) {
        size_t p = s.find("\n\x1e\n", start);
        out.push_back(s.substr(start, p == std::string::npos ? std::string::npos : p - start));
        if (p == std::string::npos) break;
        start = p + 3;
    }
    return out;
}

std::string slurp(const fs::path & p) {
    std::ifstream in(p, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

const Tokenizer & qwen3() {
    static auto t = Tokenizer::load_dir((k_assets / "qwen3-tokenizer").string());
    return *t;
}
const Tokenizer & qwen25() {
    static auto t = Tokenizer::load_dir((k_assets / "qwen2.5-tokenizer").string());
    return *t;
}

}  // namespace

TEST(Tokenizer, HardCasesEqualReference) {
    const auto texts = split_records(slurp(k_data / "hard_cases.txt"));
    const auto nfc = split_records(slurp(k_data / "hard_cases.nfc.txt"));
    std::istringstream ids_in(slurp(k_data / "hard_cases.qwen3.ids"));
    std::string line;
    ASSERT_EQ(texts.size(), nfc.size());
    for (size_t i = 0; i < texts.size(); i++) {
        std::getline(ids_in, line);
        const std::vector<int> want = parse_int_list(line, "ids");
        EXPECT_EQ(qwen3().encode(texts[i]), want) << "case " << i;
        // Qwen2.5 shares the vocabulary; only Qwen3's four added tokens differ.
        if (texts[i].find("think>") == std::string::npos && texts[i].find("tool_response>") == std::string::npos) {
            EXPECT_EQ(qwen25().encode(texts[i]), want) << "qwen2.5, case " << i;
        }
        EXPECT_EQ(qwen3().decode(want), nfc[i]) << "decode, case " << i;
    }
}

TEST(Tokenizer, VocabAndMergesFilesEqualTokenizerJson) {
    const std::string dir = test::temp_dir("tok-vm");
    for (const char * f : {"vocab.json", "merges.txt", "tokenizer_config.json"}) {
        fs::copy_file(k_assets / "qwen2.5-tokenizer" / f, fs::path(dir) / f);
    }
    auto t = Tokenizer::load_dir(dir);
    EXPECT_EQ(t->size(), qwen25().size());
    for (const auto & text : split_records(slurp(k_data / "hard_cases.txt"))) EXPECT_EQ(t->encode(text), qwen25().encode(text));
}

TEST(Tokenizer, SizesAndSpecials) {
    EXPECT_EQ(qwen25().size(), 151665);
    EXPECT_EQ(qwen3().size(), 151669);
    EXPECT_EQ(qwen3().token_id("<|im_end|>"), 151645);
    EXPECT_TRUE(qwen3().is_special(151645));
    EXPECT_FALSE(qwen3().is_special(151667));  // <think> is not special: kept by skip_special_tokens
    std::vector<int> ids = qwen3().encode("<|im_start|>user\nhi<|im_end|><think>x</think>");
    EXPECT_EQ(qwen3().decode(ids, true), "user\nhi<think>x</think>");
}

TEST(Tokenizer, StreamingNeverSplitsCharacters) {
    const std::string text = "emoji 👨‍👩‍👧‍👦 中文 Ελληνικά e\u0301";
    std::vector<int> ids = qwen3().encode(text);
    Tokenizer::Stream stream(qwen3(), false);
    std::string joined;
    for (int id : ids) {
        std::string chunk = stream.push(id);
        EXPECT_EQ(utf8_replace_invalid(chunk), chunk) << "chunk is not valid UTF-8";
        joined += chunk;
    }
    joined += stream.flush();
    EXPECT_EQ(joined, qwen3().decode(ids));
}

TEST(Tokenizer, InvalidUtf8) {
    const std::string bad = std::string("ok ") + char(0xff) + " then " + char(0xe4) + char(0xb8);
    try {
        qwen3().encode(bad);
        FAIL() << "expected an error";
    } catch (const Error & e) {
        EXPECT_NE(std::string(e.what()).find("not valid UTF-8 (first bad byte at offset 3)"), std::string::npos) << e.what();
    }
    EXPECT_EQ(qwen3().encode(bad, Tokenizer::Invalid::Replace), qwen3().encode("ok \xef\xbf\xbd then \xef\xbf\xbd"));
    // Ids whose bytes are not UTF-8 on their own decode with U+FFFD.
    std::vector<int> ids = qwen3().encode("中");
    ASSERT_GE(ids.size(), 1u);
    EXPECT_THROW(qwen3().decode({-1}), Error);
    EXPECT_THROW(qwen3().decode({qwen3().size()}), Error);
}

TEST(Chat, FallbackAndDetection) {
    bool ok = false;
    EXPECT_EQ(detect_chat_style(qwen3().chat_template(), &ok), ChatStyle::Qwen3);
    EXPECT_TRUE(ok);
    EXPECT_EQ(detect_chat_style("", &ok), ChatStyle::Qwen25);
    EXPECT_EQ(detect_chat_style("{{ bos_token }}{% for m in messages %}[INST]{% endfor %}", &ok), ChatStyle::ChatML);
    EXPECT_FALSE(ok);
    std::vector<ChatMessage> m = {{"user", "hi", "", nlohmann::ordered_json::array()}};
    EXPECT_EQ(apply_chat_template(ChatStyle::Qwen25, m, {}),
              "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
    ChatOptions no_think;
    no_think.enable_thinking = false;
    EXPECT_EQ(apply_chat_template(ChatStyle::Qwen3, m, no_think), "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
    EXPECT_EQ(python_json(nlohmann::ordered_json::parse(R"({"b": [1, "x\n"], "a": {"é": null}})")), "{\"b\": [1, \"x\\n\"], \"a\": {\"é\": null}}");
    m[0].role = "robot";
    EXPECT_THROW(apply_chat_template(ChatStyle::Qwen3, m, {}), Error);
}

// Renderings of the published Jinja templates by transformers (scripts/make_chat_goldens.py).
TEST(Chat, MatchesTransformersRendering) {
    const fs::path path = k_data / "chat_goldens.json";
    ASSERT_TRUE(fs::exists(path)) << "run scripts/make_chat_goldens.py where transformers is installed";
    auto cases = nlohmann::ordered_json::parse(slurp(path));
    for (const auto & c : cases) {
        std::vector<ChatMessage> msgs;
        for (const auto & m : c["messages"]) {
            ChatMessage cm;
            cm.role = m["role"];
            cm.content = m.value("content", "");
            cm.reasoning_content = m.value("reasoning_content", "");
            if (m.contains("tool_calls")) cm.tool_calls = m["tool_calls"];
            msgs.push_back(cm);
        }
        ChatOptions o;
        o.add_generation_prompt = c["add_generation_prompt"];
        o.enable_thinking = c.value("enable_thinking", true);
        if (c.contains("tools")) o.tools = c["tools"];
        const ChatStyle style = c["style"] == "qwen3" ? ChatStyle::Qwen3 : ChatStyle::Qwen25;
        EXPECT_EQ(apply_chat_template(style, msgs, o), c["expected"].get<std::string>()) << c["name"];
    }
}

TEST(Tokenizer, BinaryCacheRoundTripsAndSurvivesCorruption) {
    const std::string cache = test::temp_dir("tok-cache");
    setenv("QINFER_CACHE", cache.c_str(), 1);
    const std::string dir = (k_assets / "qwen3-tokenizer").string();
    auto cold = Tokenizer::load_dir(dir);  // parses the JSON, writes the cache
    auto warm = Tokenizer::load_dir(dir);  // reads the cache
    const std::string text = slurp(k_data / "hard_cases.txt");
    EXPECT_EQ(warm->encode(text), cold->encode(text));
    EXPECT_EQ(warm->chat_template(), cold->chat_template());
    EXPECT_EQ(warm->size(), cold->size());
    // A truncated or foreign cache file is ignored.
    for (const auto & e : fs::recursive_directory_iterator(cache)) {
        if (e.is_regular_file()) fs::resize_file(e.path(), fs::file_size(e.path()) / 2);
    }
    auto again = Tokenizer::load_dir(dir);
    EXPECT_EQ(again->encode(text), cold->encode(text));
    unsetenv("QINFER_CACHE");
}
