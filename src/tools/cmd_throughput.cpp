// qinfer bench --throughput: vLLM's benchmark_throughput.py on the continuous-batching scheduler. Every prompt is
// submitted at once (random token prompts of --input-len, or a JSONL dataset), generation ignores end of sequence and
// stops at each request's output length; the summary is vLLM's line (requests/s, total tokens/s, output tokens/s).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "core/env.h"
#include "core/progress.h"
#include "core/rng.h"
#include "io/tokenizer.h"
#include "runtime/engine.h"
#include "runtime/kv_cache.h"
#include "runtime/scheduler.h"
#include "tools/args.h"
#include "tools/commands.h"
#include "tools/synth.h"
#include "tools/synth_quant.h"
#include "tools/sysinfo.h"

namespace qinfer {

using json = nlohmann::json;

namespace {

struct Prompt {
    std::vector<int> tokens;
    int output_len = 0;
};

// Random regular tokens, different for every prompt (no shared prefix), as vLLM's random dataset.
std::vector<Prompt> random_prompts(int n, int input_len, int output_len, int vocab, uint64_t seed) {
    std::vector<Prompt> out(static_cast<size_t>(n));
    const int limit = std::min(vocab, 151643);
    for (int i = 0; i < n; i++) {
        out[size_t(i)].output_len = output_len;
        for (int t = 0; t < input_len; t++) {
            out[size_t(i)].tokens.push_back(int(splitmix64(seed * 1000003 + uint64_t(i) * 7919 + uint64_t(t)) % uint64_t(limit)));
        }
    }
    return out;
}

// One JSON object a line: "prompt" (text, tokenized with the checkpoint's tokenizer) or "prompt_token_ids", and
// "output_len" (or "max_tokens"; default --output-len).
std::vector<Prompt> dataset_prompts(const std::string & path, const std::string & model_dir, int default_output, int limit) {
    std::ifstream f(path);
    if (!f) QINFER_FAIL() << "--dataset: cannot read " << path;
    std::unique_ptr<Tokenizer> tok;
    std::vector<Prompt> out;
    std::string line;
    for (int lineno = 1; std::getline(f, line) && (limit <= 0 || int(out.size()) < limit); lineno++) {
        if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
        json j;
        try {
            j = json::parse(line);
        } catch (const json::exception & e) {
            QINFER_FAIL() << path << ":" << lineno << ": not JSON (" << e.what() << ")";
        }
        Prompt p;
        if (j.contains("prompt_token_ids")) {
            p.tokens = j["prompt_token_ids"].get<std::vector<int>>();
        } else if (j.contains("prompt") && j["prompt"].is_string()) {
            if (!tok) tok = Tokenizer::load_dir(model_dir);
            p.tokens = tok->encode(j["prompt"].get<std::string>());
        } else {
            QINFER_FAIL() << path << ":" << lineno << ": needs \"prompt\" (text) or \"prompt_token_ids\"";
        }
        p.output_len = j.value("output_len", j.value("max_tokens", default_output));
        if (p.tokens.empty() || p.output_len < 1) QINFER_FAIL() << path << ":" << lineno << ": empty prompt or output_len < 1";
        out.push_back(std::move(p));
    }
    if (out.empty()) QINFER_FAIL() << "--dataset: " << path << " holds no prompts";
    return out;
}

}  // namespace

int cmd_bench_throughput(int argc, char ** argv) {
    for (int i = 2; i < argc; i++) {
        if (!std::strcmp(argv[i], "--help")) {
            std::printf(
                "usage: qinfer bench --throughput [--model DIR | --preset NAME [--quant KIND]] [--num-prompts 1000] [--input-len 100]\n"
                "                    [--output-len 250] [--dataset FILE.jsonl] [--max-num-seqs 1024] [--max-batch-tokens 8192]\n"
                "                    [--max-model-len N] [--gpu-memory-utilization 0.9] [--kv-dtype D] [--no-prefix-cache]\n"
                "                    [--backend auto|cpu|cuda] [--threads N] [--tp N] [--seed S] [--json FILE] [--csv FILE]\n"
                "                    [--trace FILE.csv] [--step-log FILE.csv] [--load-format auto|dummy]\n"
                "vLLM's benchmark_throughput.py: every prompt submitted at once to the continuous-batching scheduler, greedy,\n"
                "end of sequence ignored, each request stopping at its output length. --dataset: one JSON object a line with\n"
                "\"prompt\" (text) or \"prompt_token_ids\", and \"output_len\". A warm-up of min(--max-num-seqs, --num-prompts)\n"
                "requests of 8 tokens runs first (graph capture, cuBLASLt plans), untimed. --trace: every GPU kernel of the timed\n"
                "part (CUPTI; scripts/trace_totals.py sums it up).\n");
            return 0;
        }
    }
    Args a(argc, argv, 2, {"throughput", "no-prefix-cache", "desc-act", "asym", "double-quant"});
    a.flag("throughput");
    const std::string backend = a.str("backend", "auto");
    std::string model_dir = a.str("model");
    const std::string preset = a.str("preset", model_dir.empty() ? "qwen2.5-0.5b" : "");
    const int layers = int(a.integer("layers", 0));
    const int num_prompts = int(a.integer("num-prompts", 1000));
    const int input_len = int(a.integer("input-len", 100));
    const int output_len = int(a.integer("output-len", 250));
    const std::string dataset = a.str("dataset");
    SchedulerOptions so;
    // 1024 rows a step by default: on an H200, 7B BF16 with 1000 prompts of input 100 / output 250 ran 23,568 output
    // tok/s against 23,133 at 512 and 21,586 at 256 (bench/results/2026-11-28-h200-packed-prefill); serve keeps 256.
    so.pool.max_rows = int(a.integer("max-num-seqs", 1024));
    // 8192 tokens a step by default: on an H200, 7B BF16 with 1000 prompts of input 1000 / output 100 ran 32.58
    // requests/s against 30.45 at 2048 (bench/results/2026-11-28-h200-serving); serve keeps 2048, for shorter steps.
    so.pool.max_step_tokens = int(a.integer("max-batch-tokens", 8192));
    so.pool.max_seq_tokens = int(a.integer("max-model-len", 0));
    so.pool.memory_fraction = a.number("gpu-memory-utilization", 0.9);
    so.prefix_cache = !a.flag("no-prefix-cache");
    so.step_log = a.str("step-log", "");
    EngineOptions eo;
    eo.backend = backend;
    eo.threads = int(a.integer("threads", 0));
    eo.kv_dtype = a.str("kv-dtype", "auto");
    if (eo.kv_dtype != "auto") parse_kv_dtype(eo.kv_dtype);
    parallel_from_args(a, eo);
    eo.dummy_weights = load_format_dummy(a);
    const uint64_t seed = uint64_t(a.integer("seed", 0));
    const std::string json_path = a.str("json"), csv_path = a.str("csv"), trace_path = a.str("trace");
    const SynthQuant quant = synth_quant_from_args(a);
    a.check_unused();
    if (num_prompts < 1 || input_len < 1 || output_len < 1) QINFER_FAIL() << "--num-prompts, --input-len and --output-len must be >= 1";
    if (so.pool.max_rows < 1 || so.pool.max_step_tokens < 1) QINFER_FAIL() << "--max-num-seqs and --max-batch-tokens must be >= 1";
    for (const std::string & p : {json_path, csv_path, trace_path}) {
        if (!p.empty() && !std::ofstream(p, std::ios::app)) QINFER_FAIL() << "cannot write " << p;
    }
    if (!quant.kind.empty() && !model_dir.empty()) QINFER_FAIL() << "--quant synthesizes a preset; with --model the checkpoint's own format is used";
    if (model_dir.empty()) {
        std::fprintf(stderr, "bench: synthetic %s%s\n", preset.c_str(), quant.kind.empty() ? "" : (", " + quant.kind).c_str());
        model_dir = ensure_synth(preset, layers, DType::BF16, quant, eo.dummy_weights);
    }
    const std::string model_name = preset.empty() ? model_dir : preset;
    if (!trace_path.empty()) start_kernel_trace();  // before any graph is captured
    auto engine = make_engine(model_dir, eo);
    const ModelConfig & c = engine->config();
    const bool gpu = engine->backend_name().rfind("cuda", 0) == 0;  // "cuda" or "cuda-tpN"
    if (!trace_path.empty() && !gpu) QINFER_FAIL() << "--trace records GPU kernels: it needs the CUDA backend";
    std::vector<Prompt> prompts = dataset.empty() ? random_prompts(num_prompts, input_len, output_len, c.vocab_size, seed)
                                                  : dataset_prompts(dataset, model_dir, output_len, a.has("num-prompts") ? num_prompts : 0);
    Scheduler sched(*engine, so);
    const SystemInfo sys = system_info(gpu);
    for (const Prompt & p : prompts) {
        if (int(p.tokens.size()) + p.output_len > sched.max_request_tokens()) {
            QINFER_FAIL() << "a prompt of " << p.tokens.size() << " tokens + " << p.output_len << " does not fit: one request may hold "
                          << sched.max_request_tokens() << " tokens here (--max-model-len, --gpu-memory-utilization)";
        }
    }
    std::fprintf(stderr, "bench: %s on %s, %d KV blocks of %d tokens (%d tokens a request at most), %d rows and %d tokens a step\n",
                 model_name.c_str(), sys.card.c_str(), sched.pool().n_blocks, sched.pool().block_size, sched.max_request_tokens(),
                 so.pool.max_rows, so.pool.max_step_tokens);
    auto submit = [&](const Prompt & p, int max_new, RequestCallbacks cb) {
        RequestOptions r;
        r.prompt = p.tokens;
        r.max_new_tokens = max_new;
        r.ignore_eos = true;
        return sched.submit(std::move(r), std::move(cb));
    };
    // Warm-up: the decode graphs of the row counts a full batch passes through, cuBLASLt's plans. Prompts of the same
    // lengths with every token moved by one, so that none of the measured prompts finds its blocks in the prefix index.
    const int warm = std::min<int>(so.pool.max_rows, int(prompts.size()));
    for (int i = 0; i < warm; i++) {
        Prompt p = prompts[size_t(i)];
        for (int & t : p.tokens) t = (t + 1) % std::min(c.vocab_size, 151643);
        submit(p, std::min(8, p.output_len), {});
    }
    sched.run_until_idle();
    const SchedulerStats before = sched.stats();
    if (!trace_path.empty()) discard_kernel_trace();  // the warm-up's kernels

    Progress bar("throughput", int64_t(prompts.size()));
    int finished = 0, failed = 0;
    uint64_t prompt_tokens = 0, output_tokens = 0;
    double ttft_sum = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (const Prompt & p : prompts) {
        prompt_tokens += p.tokens.size();
        submit(p, p.output_len, {nullptr, [&](const RequestOutcome & o) {
                                     finished++;
                                     failed += o.stop_reason != "length";
                                     output_tokens += o.tokens.size();
                                     ttft_sum += o.ttft_seconds;
                                     bar.update(finished);
                                 }});
    }
    sched.run_until_idle();
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    bar.finish();
    if (!trace_path.empty()) std::fprintf(stderr, "bench: %zu kernels traced to %s\n", write_kernel_trace(trace_path), trace_path.c_str());
    const SchedulerStats st = sched.stats();
    const double req_s = finished / secs, total_s = double(prompt_tokens + output_tokens) / secs, out_s = double(output_tokens) / secs;
    const double hit = st.prompt_tokens > before.prompt_tokens
                           ? double(st.prefix_hit_tokens - before.prefix_hit_tokens) / double(st.prompt_tokens - before.prompt_tokens)
                           : 0;
    const double peak_gb = double(engine->peak_memory_bytes()) / 1e9;
    std::printf("Throughput: %.2f requests/s, %.2f total tokens/s, %.2f output tokens/s\n", req_s, total_s, out_s);
    std::printf("| model | backend | prompts | input | output | max seqs | max batch tokens | KV | requests/s | total tok/s | output tok/s | "
                "mean TTFT s | prefix hit | preemptions | steps | peak GB | failed |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    const std::string kv = eo.kv_dtype != "auto" ? eo.kv_dtype : gpu ? "bf16" : "fp32";
    std::printf("| %s | %s | %zu | %s | %s | %d | %d | %s | %.2f | %.1f | %.1f | %.3f | %.1f%% | %llu | %llu | %.2f | %d |\n", model_name.c_str(),
                engine->backend_name().c_str(), prompts.size(), dataset.empty() ? std::to_string(input_len).c_str() : "dataset",
                dataset.empty() ? std::to_string(output_len).c_str() : "dataset", so.pool.max_rows, so.pool.max_step_tokens, kv.c_str(), req_s,
                total_s, out_s, finished ? ttft_sum / finished : 0.0, 100 * hit, (unsigned long long)(st.preemptions - before.preemptions),
                (unsigned long long)(st.steps - before.steps), peak_gb, failed);
    const std::string commit = git_commit();
    std::printf("card: %s | %s | commit %s | %d KV blocks | weights %s\n", sys.card.c_str(), sys.software.c_str(), commit.c_str(),
                sched.pool().n_blocks, eo.dummy_weights ? "--load-format dummy (random, built in memory)" : "read from safetensors");
    // The host's share: a step's time outside its wait on the device (scheduling, staging, launches, callbacks),
    // during which the device may idle.
    const uint64_t steps = st.steps - before.steps;
    const double host_s = (st.busy_seconds - before.busy_seconds) - (st.wait_seconds - before.wait_seconds);
    const double host_us = steps ? 1e6 * host_s / double(steps) : 0;
    const double launch_us = steps ? 1e6 * (st.launch_seconds - before.launch_seconds) / double(steps) : 0;
    if (gpu) {
        std::printf("host: %.0f us a step outside the wait on the device (%.1f%% of the run; the device works through what was queued "
                    "meanwhile), of it %.0f us launching captured steps\n",
                    host_us, secs > 0 ? 100 * host_s / secs : 0.0, launch_us);
    }
    json row = {{"benchmark", "throughput"}, {"model", model_name}, {"backend", engine->backend_name()}, {"quant", c.quant.quantized() ? c.quant.label : "BF16"},
                {"kv_dtype", kv}, {"num_prompts", prompts.size()}, {"input_len", dataset.empty() ? input_len : -1},
                {"output_len", dataset.empty() ? output_len : -1}, {"dataset", dataset}, {"max_num_seqs", so.pool.max_rows},
                {"max_batch_tokens", so.pool.max_step_tokens}, {"prefix_cache", so.prefix_cache}, {"gpu_memory_utilization", so.pool.memory_fraction},
                {"kv_blocks", sched.pool().n_blocks}, {"requests_s", req_s}, {"total_tok_s", total_s}, {"output_tok_s", out_s},
                {"prompt_tokens", prompt_tokens}, {"output_tokens", output_tokens}, {"seconds", secs},
                {"mean_ttft_s", finished ? ttft_sum / finished : 0.0}, {"prefix_hit_rate", hit}, {"preemptions", st.preemptions - before.preemptions},
                {"steps", steps}, {"host_us_per_step", host_us}, {"graph_launch_us_per_step", launch_us}, {"peak_gb", peak_gb}, {"failed", failed}, {"card", sys.card}, {"driver", sys.driver},
                {"cuda", sys.cuda}, {"commit", commit}, {"load_format", eo.dummy_weights ? "dummy" : "safetensors"},
                {"env", json::parse(env_knobs_json())}};
    if (!json_path.empty()) std::ofstream(json_path) << json::array({row}).dump(2) << "\n";
    if (!csv_path.empty()) {
        std::ofstream f(csv_path);
        f << "model,backend,num_prompts,input_len,output_len,max_num_seqs,max_batch_tokens,kv_dtype,requests_s,total_tok_s,output_tok_s,"
             "mean_ttft_s,prefix_hit_rate,preemptions,peak_gb,card,commit\n";
        f << model_name << "," << engine->backend_name() << "," << prompts.size() << "," << row["input_len"] << "," << row["output_len"] << ","
          << so.pool.max_rows << "," << so.pool.max_step_tokens << "," << kv << "," << req_s << "," << total_s << "," << out_s << ","
          << row["mean_ttft_s"] << "," << hit << "," << row["preemptions"] << "," << peak_gb << ",\"" << sys.card << "\"," << commit << "\n";
    }
    return failed ? 1 : 0;
}

}  // namespace qinfer
