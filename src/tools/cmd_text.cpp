// qinfer tokenize | detokenize | chat, and the text side of run --prompt.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <iterator>
#include <sstream>

#include "core/check.h"
#include "io/chat.h"
#include "io/tokenizer.h"
#include "runtime/engine.h"
#include "runtime/generate.h"
#include "tools/args.h"
#include "tools/commands.h"

namespace qinfer {

namespace {

std::string read_stdin() {
    std::ios::sync_with_stdio(false);
    return std::string(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
}

std::unique_ptr<Tokenizer> tokenizer_from(const Args & a) {
    if (a.has("tokenizer")) return Tokenizer::load_file(a.str("tokenizer"));
    if (a.has("model")) return Tokenizer::load_dir(a.str("model"));
    QINFER_FAIL() << "give --model DIR or --tokenizer FILE";
}

bool help(int argc, char ** argv, const char * usage) {
    for (int i = 2; i < argc; i++) {
        if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h")) {
            std::fputs(usage, stdout);
            return true;
        }
    }
    return false;
}

}  // namespace

int cmd_tokenize(int argc, char ** argv) {
    if (help(argc, argv,
             "usage: qinfer tokenize (--model DIR | --tokenizer FILE) [--pieces] [--replace-invalid] [--time]  < text\n"
             "prints the ids of all of standard input (one text) on one line, separated by single spaces\n")) {
        return 0;
    }
    Args a(argc, argv, 2, {"pieces", "replace-invalid", "time"});
    const auto t0 = std::chrono::steady_clock::now();
    auto tok = tokenizer_from(a);
    const auto t1 = std::chrono::steady_clock::now();
    const bool pieces = a.flag("pieces"), replace = a.flag("replace-invalid"), timed = a.flag("time");
    a.check_unused();
    const std::string text = read_stdin();
    const auto t2 = std::chrono::steady_clock::now();
    std::string out;
    if (pieces) {
        for (const auto & p : tok->pieces(text)) {
            if (!out.empty()) out += ' ';
            out += p;
        }
    } else {
        for (int id : tok->encode(text, replace ? Tokenizer::Invalid::Replace : Tokenizer::Invalid::Error)) {
            if (!out.empty()) out += ' ';
            out += std::to_string(id);
        }
    }
    if (timed) {
        const double load = std::chrono::duration<double>(t1 - t0).count();
        const double enc = std::chrono::duration<double>(std::chrono::steady_clock::now() - t2).count();
        std::fprintf(stderr, "{\"engine\": \"qinfer\", \"load_s\": %.4f, \"mb\": %.6f, \"secs\": %.4f, \"mb_per_s\": %.2f}\n", load,
                     double(text.size()) / 1e6, enc, double(text.size()) / 1e6 / enc);
    }
    std::fwrite(out.data(), 1, out.size(), stdout);
    std::fputc('\n', stdout);
    return 0;
}

int cmd_detokenize(int argc, char ** argv) {
    if (help(argc, argv,
             "usage: qinfer detokenize (--model DIR | --tokenizer FILE) [--skip-special]  < ids\n"
             "reads ids separated by whitespace and writes the text\n")) {
        return 0;
    }
    Args a(argc, argv, 2, {"skip-special"});
    auto tok = tokenizer_from(a);
    const bool skip = a.flag("skip-special");
    a.check_unused();
    std::vector<int> ids = parse_int_list(read_stdin(), "standard input");
    const std::string text = tok->decode(ids, skip);
    std::fwrite(text.data(), 1, text.size(), stdout);
    return 0;
}

int cmd_chat(int argc, char ** argv) {
    if (help(argc, argv,
             "usage: qinfer chat --model DIR [--system TEXT] [--max-tokens N] [--no-think] [sampling flags as for run]\n"
             "                   [--embedding-on-gpu]\n"
             "reads one user message per line from standard input; the reply streams to standard output\n")) {
        return 0;
    }
    Args a(argc, argv, 2, {"greedy", "no-think", "embedding-on-gpu"});
    const std::string dir = a.required("model");
    auto tok = Tokenizer::load_dir(dir);
    GenerationConfig gc = load_generation_config(dir, load_model_config(dir));
    GenerateOptions g;
    g.sampling = sampling_from_args(a, gc);
    g.max_new_tokens = int(a.integer("max-tokens", 512));
    g.eos_token_ids = gc.eos_token_ids;
    g.n_valid_tokens = tok->size();
    ChatOptions co;
    co.enable_thinking = !a.flag("no-think");
    std::vector<ChatMessage> messages;
    if (a.has("system")) messages.push_back({"system", a.str("system"), "", nlohmann::ordered_json::array()});
    EngineOptions eo;
    eo.backend = a.str("backend", "auto");
    eo.threads = int(a.integer("threads", 0));
    eo.max_context = int(a.integer("context", 0));
    eo.embedding_on_gpu = a.flag("embedding-on-gpu");
    a.check_unused();
    bool recognised = true;
    const ChatStyle style = detect_chat_style(tok->chat_template(), &recognised);
    if (!recognised) std::fprintf(stderr, "chat: unrecognised chat template; using plain ChatML\n");
    auto engine = make_engine(dir, eo);
    const bool tty = isatty(0);
    std::string line;
    while (true) {
        if (tty) std::fputs("> ", stderr);
        if (!std::getline(std::cin, line)) break;
        if (line.empty()) continue;
        messages.push_back({"user", line, "", nlohmann::ordered_json::array()});
        std::vector<int> prompt = tok->encode(apply_chat_template(style, messages, co));
        Tokenizer::Stream stream(*tok);
        std::string reply;
        g.on_token = [&](int t) {
            const std::string text = stream.push(t);
            reply += text;
            std::fwrite(text.data(), 1, text.size(), stdout);
            std::fflush(stdout);
            return true;
        };
        generate(*engine, prompt, g);
        const std::string rest = stream.flush();
        reply += rest;
        std::fwrite(rest.data(), 1, rest.size(), stdout);
        std::fputc('\n', stdout);
        messages.push_back({"assistant", reply, "", nlohmann::ordered_json::array()});
    }
    return 0;
}

}  // namespace qinfer
