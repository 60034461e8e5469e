// qinfer: one binary, several subcommands.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>

#include "core/check.h"
#include "core/process_exit.h"
#include "tools/commands.h"

namespace {

const char * k_usage =
    "usage: qinfer COMMAND [options]\n"
    "\n"
    "commands:\n"
    "  bench    speed table (tokens/s incl. prefill, TTFT, decode tokens/s, peak memory, bandwidth share)\n"
    "  run      generate from a text prompt or token ids\n"
    "  chat     interactive chat with the checkpoint's chat template\n"
    "  serve    OpenAI-style HTTP server (completions, chat completions, streaming)\n"
    "  tokenize / detokenize   text to ids and back (standard input to standard output)\n"
    "  logits   fp32 logits of one forward pass, as .npy\n"
    "  info     architecture, parameters, quantization, bytes by dtype, memory at a context\n"
    "  dequant  write a quantized checkpoint back in fp32 (the CPU reference's weights)\n"
    "  plot     PNG chart of bench JSON: speed or memory against input length or batch\n"
    "  memory-table  the seed's KV-cache memory tables (batch / length scaling, bf16 vs quantized cache) from bench JSON\n"
    "  plan     which weight formats, KV dtypes, contexts and batches fit a card (memory model)\n"
    "  kv-fidelity  KL divergence and top-1 agreement of a quantized KV cache against bf16 (CPU)\n"
    "  synth    write a random-weight checkpoint in the published layout\n"
    "\n"
    "`qinfer COMMAND --help` lists a command's options.\n";

int run_command(int argc, char ** argv);

}  // namespace

// A command's status, except where a part of the process asked to skip teardown (core/process_exit.h): then the
// process ends at once with that status, its output flushed.
int main(int argc, char ** argv) {
    const int rc = run_command(argc, argv);
    if (qinfer::exit_without_teardown_requested()) {
        std::fflush(nullptr);
        std::_Exit(rc);
    }
    return rc;
}

namespace {

int run_command(int argc, char ** argv) {
    if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
        std::fputs(k_usage, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    std::string cmd = argv[1];
    try {
        if (cmd == "synth") return qinfer::cmd_synth(argc, argv);
        if (cmd == "run") return qinfer::cmd_run(argc, argv);
        if (cmd == "logits") return qinfer::cmd_logits(argc, argv);
        if (cmd == "info") return qinfer::cmd_info(argc, argv);
        if (cmd == "dequant") return qinfer::cmd_dequant(argc, argv);
        if (cmd == "kv-fidelity") return qinfer::cmd_kv_fidelity(argc, argv);
        if (cmd == "plan") return qinfer::cmd_plan(argc, argv);
        if (cmd == "bench") return qinfer::cmd_bench(argc, argv);
        if (cmd == "plot") return qinfer::cmd_plot(argc, argv);
        if (cmd == "memory-table") return qinfer::cmd_memory_table(argc, argv);
        if (cmd == "tokenize") return qinfer::cmd_tokenize(argc, argv);
        if (cmd == "detokenize") return qinfer::cmd_detokenize(argc, argv);
        if (cmd == "chat") return qinfer::cmd_chat(argc, argv);
        if (cmd == "serve") return qinfer::cmd_serve(argc, argv);
        std::fprintf(stderr, "qinfer: unknown command '%s'\n%s", cmd.c_str(), k_usage);
        return 2;
    } catch (const qinfer::Error & e) {
        std::fprintf(stderr, "qinfer %s: error: %s\n", cmd.c_str(), e.what());
        return 1;
    } catch (const std::bad_alloc &) {
        std::fprintf(stderr, "qinfer %s: error: out of memory\n", cmd.c_str());
        return 1;
    } catch (const std::exception & e) {
        std::fprintf(stderr, "qinfer %s: error: %s\n", cmd.c_str(), e.what());
        return 1;
    }
}

}  // namespace
