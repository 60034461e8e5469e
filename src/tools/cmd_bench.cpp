// qinfer bench: the Qwen speed table (batch 1, fixed generated length, speed incl. prefill), plus time to first
// token, decode-only tokens/s and the share of the memory-bandwidth limit; JSON and CSV for scripts.
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <vector>

#ifdef QINFER_CUDA
#include "backends/cuda/kernel_trace.h"
#endif
#include "core/check.h"
#include "core/env.h"
#include "core/parallel.h"
#include "core/progress.h"
#include "core/rng.h"
#include "model/random_weights.h"
#include "model/weights.h"
#include "runtime/engine.h"
#include "runtime/generate.h"
#include "runtime/kv_cache.h"
#include "tools/args.h"
#include "tools/commands.h"
#include "tools/plan.h"
#include "tools/plot.h"
#include "tools/synth.h"
#include "tools/sysinfo.h"

namespace qinfer {

using json = nlohmann::json;

namespace {

struct Row {
    std::string model, quant = "BF16", kv_dtype;
    int batch = 1, input_len = 0, gen_len = 0;
    double tok_s = 0, decode_tok_s = 0, ttft_s = 0, peak_gb = 0, bw_frac = 0;
    double tok_s_std = 0;  // over --repeat runs
    std::string note;
};

// Prompt `which` of a batch: random regular tokens, different for every sequence.
// --max-batch: for each input length, the largest static batch whose every device buffer the card can hold
// (Engine::reserve_batch: allocated, not computed), found by doubling then bisection, beside the memory model's
// estimate for that batch. A table, and JSON rows when asked.
void max_batch_table(Engine & engine, const std::string & model_name, const std::string & quant, const std::string & kv_dtype,
                     const std::vector<int> & lens, int gen, const std::string & json_path, bool embedding_on_gpu) {
    const ModelConfig & c = engine.config();
    const SystemInfo sys = system_info(true);
    json out = json::array();
    std::printf("| Model | Quantization | KV cache | Input Length | Generated | Largest batch | GPU Memory(GB) at it | memory model(GB) |\n");
    std::printf("|---|---|---|---|---|---|---|---|\n");
    for (int len : lens) {
        const int tokens = len + gen;
        if (tokens > c.max_context()) {
            std::printf("| %s | %s | %s | %d | %d | - | - | exceeds the model's context of %d |\n", model_name.c_str(), quant.c_str(),
                        kv_dtype.c_str(), len, gen, c.max_context());
            continue;
        }
        auto fits = [&](int b) {
            try {
                engine.reserve_batch(b, tokens, len);
                return true;
            } catch (const OutOfMemory &) {
                return false;
            }
        };
        constexpr int k_cap = 65535;  // the decode grid's limit
        int lo = 0, hi = 1;  // lo fits (0 trivially); hi is the next size to try
        while (hi <= k_cap && fits(hi)) {
            lo = hi;
            hi *= 2;
        }
        hi = std::min(hi, k_cap + 1);
        while (hi - lo > 1) {
            const int mid = lo + (hi - lo) / 2;
            if (fits(mid)) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        const double gb = lo > 0 ? double(engine.reserve_batch(lo, tokens, len)) / 1e9 : 0;
        const double model_gb = lo > 0 ? estimate_cuda_memory(c, parse_kv_dtype(kv_dtype), lo, len, tokens, embedding_on_gpu).total() / 1e9 : 0;
        std::printf("| %s | %s | %s | %d | %d | %d | %.2f | %.2f |\n", model_name.c_str(), quant.c_str(), kv_dtype.c_str(), len, gen, lo, gb,
                    model_gb);
        out.push_back({{"model", model_name}, {"quant", quant}, {"kv_dtype", kv_dtype}, {"input_len", len}, {"gen_len", gen},
                       {"max_batch", lo}, {"allocated_gb", gb}, {"model_gb", model_gb}, {"card", sys.card}, {"commit", git_commit()}});
    }
    std::printf("card: %s | %s | largest batch = every buffer of the batch allocated on the card (nothing computed)\n", sys.card.c_str(),
                sys.software.c_str());
    if (!json_path.empty()) std::ofstream(json_path) << out.dump(2) << "\n";
}

std::vector<int> bench_prompt(int n, int vocab, int which) {
    std::vector<int> p(static_cast<size_t>(n));
    const int limit = std::min(vocab, 151643);  // regular tokens only
    for (int i = 0; i < n; i++) p[size_t(i)] = int(splitmix64(uint64_t(i) * 7919 + 17 + uint64_t(which) * 1000003) % uint64_t(limit));
    return p;
}

}  // namespace

void check_writable(const char * flag, const std::string & path) {
    if (path.empty()) return;
    std::ofstream probe(path, std::ios::app);
    if (!probe) QINFER_FAIL() << "--" << flag << ": cannot write " << path;
}

void write_json_output(const std::string & path, const nlohmann::json & j) {
    if (path.empty()) return;
    std::ofstream f(path);
    if (!f) QINFER_FAIL() << "--json: cannot write " << path;
    f << j.dump(1) << "\n";
}

// --trace: CUPTI's kernel records (backends/cuda/kernel_trace.h); a build without CUDA never gets here (--trace needs
// the CUDA backend).
void start_kernel_trace() {
#ifdef QINFER_CUDA
    std::string why;
    if (!cuda::kernel_trace_start(why)) QINFER_FAIL() << "--trace: " << why;
#endif
}
void discard_kernel_trace() {
#ifdef QINFER_CUDA
    cuda::kernel_trace_discard();
#endif
}
size_t write_kernel_trace(const std::string & path) {
#ifdef QINFER_CUDA
    return cuda::kernel_trace_write(path);
#else
    (void)path;
    return 0;
#endif
}

int gpu_bench_mode(int argc, char ** argv, const char * name, const char * usage, int (*run)(const Args &)) {
    for (int i = 2; i < argc; i++) {
        if (!std::strcmp(argv[i], "--help")) {
            std::fputs(usage, stdout);
            return 0;
        }
    }
    Args a(argc, argv, 2, {name});
    a.flag(name);
    if (!run) QINFER_FAIL() << "bench --" << name << " runs on a GPU: this qinfer was built without the CUDA backend";
    if (!cuda_available()) QINFER_FAIL() << "bench --" << name << " runs on a GPU: no GPU was found";
    return run(a);
}

int cmd_bench(int argc, char ** argv) {
    for (int i = 2; i < argc; i++) {
        if (!std::strcmp(argv[i], "--throughput")) return cmd_bench_throughput(argc, argv);
        if (!std::strcmp(argv[i], "--serve")) return cmd_bench_serve(argc, argv);
        if (!std::strcmp(argv[i], "--kernels")) return cmd_bench_kernels(argc, argv);
        if (!std::strcmp(argv[i], "--bandwidth")) return cmd_bench_bandwidth(argc, argv);
        if (!std::strcmp(argv[i], "--allreduce")) {
#if defined(QINFER_CUDA) && defined(QINFER_HAVE_NCCL)
            return cmd_bench_allreduce(argc, argv);
#else
            QINFER_FAIL() << "bench --allreduce: this qinfer was built without CUDA and NCCL";
#endif
        }
    }
    for (int i = 2; i < argc; i++) {
        if (!std::strcmp(argv[i], "--help")) {
            std::printf(
                "usage: qinfer bench [--model DIR [--name NAME] | --preset NAME] [--layers N] [--input-lens 1,6144,...] [--gen N]\n"
                "                    [--batch 1,4,16,...] [--repeat N] [--backend auto|cpu|cuda] [--threads N] [--json FILE] [--csv FILE]\n"
                "                    [--kv-dtype fp32|bf16|fp8|int8|int4] [--plot FILE.png] [--embedding-on-gpu] [--trace FILE.csv] [--tp N]\n"
                "                    [--nnodes N --node-rank R --master-addr HOST:PORT]\n"
                "                    [--past-context] [--load-format auto|dummy]\n"
                "--load-format dummy: random weights built in memory from config.json alone (vLLM's name), for models larger\n"
                "         than the disk; with --preset only the preset's config folder is written. Rows say load_format\n"
                "--past-context: let input + generated run past the model's max_position_embeddings (plain RoPE only), as\n"
                "         transformers does: the seeds' Qwen1.5-MoE-A2.7B rows go to 30720 on a model of 8192 positions\n"
                "--trace: every GPU kernel's start and end (kernels inside the decode step's CUDA graph included, overlaps\n"
                "         kept), recorded by CUPTI from before the model loads, one CSV row each; scripts/trace_step.py\n"
                "         sums a decode step per kernel. Rows timed with it carry CUPTI's overhead: take speeds from runs without it\n"
                "--embedding-on-gpu: keep the token embedding in GPU memory also when lm_head is a separate matrix (by default\n"
                "         it stays in pinned host memory, one row read per token, and is not in the GPU memory column)\n"
                "--batch: static batches of that many sequences of the same input length, all decoding together; speed is then\n"
                "         the batch's generated tokens / whole time, and GPU memory the peak for the whole batch\n"
                "--max-batch: instead of timing, the largest batch of each input length (+ --gen) whose buffers fit the card\n"
                "--throughput: many requests under continuous batching, vLLM's benchmark_throughput (bench --throughput --help)\n"
                "--serve URL: a load generator against a running `qinfer serve` (bench --serve URL --help)\n"
                "--kernels: the quantized projection kernels against bf16 on Qwen2.5's shapes (bench --kernels --help)\n"
                "--bandwidth: how fast one kernel reads regions of GPU memory of each size (bench --bandwidth --help)\n"
                "--allreduce: one NCCL all-reduce over --tp GPUs, eager and in a CUDA graph (bench --allreduce --help)\n"
                "                    [--baseline hf.json,...]  (rows from scripts/hf_bench.py: prints qinfer's ratio to each)\n"
                "                    %s  (synthetic weights of that format)\n"
                "default: --preset qwen2.5-0.5b (synthetic weights, cached under ~/.cache/qinfer); on a GPU the seeds'\n"
                "input lengths 1,6144,14336,30720 with 2048 generated; on the CPU shorter: 1,256 with 32 generated\n"
                "one untimed warm-up request (the longest input length, at most 2048 tokens on a GPU and 16 on the CPU, 4\n"
                "generated) runs first, as scripts/hf_bench.py warms up transformers: first-use costs (kernel loading,\n"
                "cuBLASLt set-up and algorithm lookup, graph capture; the CPU's first touch of the weights) are not in the rows\n"
                "quant kinds: %s\n",
                k_synth_quant_usage, synth_quant_kinds());
            return 0;
        }
    }
    Args a(argc, argv, 2, {"desc-act", "asym", "double-quant", "max-batch", "embedding-on-gpu", "past-context"});
    std::string backend = a.str("backend", "auto");
    const bool gpu = backend == "cuda" || (backend == "auto" && cuda_available());
    std::string model_dir = a.str("model");
    std::string preset = a.str("preset", model_dir.empty() ? "qwen2.5-0.5b" : "");
    const std::string name_opt = a.str("name");
    int layers = int(a.integer("layers", 0));
    std::vector<int> lens = a.has("input-lens") ? a.int_list("input-lens") : (gpu ? std::vector<int>{1, 6144, 14336, 30720}
                                                                                  : std::vector<int>{1, 256});
    int gen = int(a.integer("gen", gpu ? 2048 : 32));
    std::vector<int> batches = a.has("batch") ? a.int_list("batch") : std::vector<int>{1};
    int repeat = int(a.integer("repeat", 1));
    std::string json_path = a.str("json"), csv_path = a.str("csv"), plot_path = a.str("plot"), trace_path = a.str("trace");
    const std::string baseline_paths = a.str("baseline");
    EngineOptions eo;
    eo.backend = backend;
    eo.threads = int(a.integer("threads", 0));
    eo.kv_dtype = a.str("kv-dtype", "auto");
    if (eo.kv_dtype != "auto") parse_kv_dtype(eo.kv_dtype);
    eo.embedding_on_gpu = a.flag("embedding-on-gpu");
    eo.past_context = a.flag("past-context");
    parallel_from_args(a, eo);
    const int gpu_num = gpu ? eo.tp : 0;  // the seed tables' "GPU Num"
    eo.dummy_weights = load_format_dummy(a);
    const SynthQuant quant = synth_quant_from_args(a);
    const bool max_batch = a.flag("max-batch");
    a.check_unused();
    // Baseline files are read before any work, so a wrong path fails at once.
    const json baseline_rows = baseline_paths.empty() ? json::array() : read_bench_rows(baseline_paths, "--baseline");
    if (max_batch && !gpu) QINFER_FAIL() << "--max-batch measures the GPU's memory: it needs the CUDA backend";
    if (max_batch && a.has("batch")) QINFER_FAIL() << "--max-batch searches the batch size itself: leave out --batch";
    if (!quant.kind.empty() && !model_dir.empty()) QINFER_FAIL() << "--quant synthesizes a preset; with --model the checkpoint's own format is used";
    if (!trace_path.empty() && !gpu) QINFER_FAIL() << "--trace records GPU kernels: it needs the CUDA backend";
    if (lens.empty()) QINFER_FAIL() << "--input-lens is empty";
    check_writable("json", json_path);
    check_writable("csv", csv_path);
    check_writable("trace", trace_path);
    if (!plot_path.empty() && !plot_available()) QINFER_FAIL() << "--plot: this qinfer was built without libgd (apt-get install libgd-dev, rebuild)";
    check_writable("plot", plot_path);
    for (int l : lens) {
        if (l < 1) QINFER_FAIL() << "--input-lens entries must be >= 1, got " << l;
    }
    if (gen < 1 || repeat < 1) QINFER_FAIL() << "--gen and --repeat must be >= 1";
    if (batches.empty()) QINFER_FAIL() << "--batch is empty";
    for (int b : batches) {
        if (b < 1 || b > 4096) QINFER_FAIL() << "--batch entries must be in 1..4096, got " << b;
    }
    if (!gpu && !a.has("input-lens")) {
        std::fprintf(stderr, "bench: no GPU found; running on the CPU with short inputs (%d..%d tokens, %d generated)\n",
                     lens.front(), lens.back(), gen);
    }
    if (model_dir.empty()) {
        std::fprintf(stderr, "bench: synthetic %s%s%s\n", preset.c_str(), layers ? (" (" + std::to_string(layers) + " layers)").c_str() : "",
                     quant.kind.empty() ? "" : (", " + quant.kind).c_str());
        model_dir = ensure_synth(preset, layers, DType::BF16, quant, eo.dummy_weights);
    }
    const std::string load_format = eo.dummy_weights ? "dummy" : "safetensors";
    std::string model_name = !name_opt.empty() ? name_opt : preset.empty() ? model_dir : preset;

    if (!trace_path.empty()) start_kernel_trace();  // before any graph is captured
    const int max_len = *std::max_element(lens.begin(), lens.end());
    eo.max_context = max_len + gen;
    eo.max_sequences = *std::max_element(batches.begin(), batches.end());
    const auto load_start = std::chrono::steady_clock::now();
    auto engine = make_engine(model_dir, eo);
    const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();
    const ModelConfig & c = engine->config();
    double weight_bytes = 0;  // what a decode step reads: the tensors' shapes and dtypes, mapped again (not read)
    if (eo.dummy_weights) {
        Model layout;
        layout.config = c;
        dummy_weights(layout.config, layout.weights, false);
        weight_bytes = double(decode_weight_bytes(layout));
    } else {
        weight_bytes = double(decode_weight_bytes(*load_model(model_dir)));
    }
    const bool on_gpu = engine->backend_name().rfind("cuda", 0) == 0;  // "cuda", or "cuda-tpN" over several GPUs
    SystemInfo sys = system_info(on_gpu);
    const bool kv_bf16 = on_gpu;
    std::fprintf(stderr, "bench: %s on %s, memory bandwidth %.1f GB/s (%s)\n", model_name.c_str(), sys.card.c_str(),
                 sys.bandwidth / 1e9, sys.bandwidth_source.c_str());
    const std::string quant_label =
        c.quant.quantized() ? c.quant.label : c.torch_dtype == DType::BF16 ? "BF16" : c.torch_dtype == DType::F16 ? "FP16" : "FP32";
    if (max_batch) {
        max_batch_table(*engine, model_name, quant_label, eo.kv_dtype != "auto" ? eo.kv_dtype : "bf16", lens, gen, json_path,
                        eo.embedding_on_gpu);
        return 0;
    }

    std::vector<Row> rows;
    Progress bar("bench", int64_t(lens.size() * batches.size()) * repeat);
    int done = 0;
    // One request (or static batch) of `batch` prompts of `len` tokens: {tokens/s incl. prefill, decode tokens/s, TTFT}.
    auto run_once = [&](int batch, int len) {
        GenerateOptions g;
        g.max_new_tokens = gen;
        g.ignore_eos = true;
        g.prefill_chunk = on_gpu ? 0 : 512;
        g.on_prefill_progress = [&](int d, int t) { bar.update(done, "prefill " + std::to_string(d) + "/" + std::to_string(t)); };
        g.on_token = [&](int) { return true; };
        double prefill_s = 0, decode_s = 0;
        if (batch == 1) {
            GenerateResult res = generate(*engine, bench_prompt(len, c.vocab_size, 0), g);
            prefill_s = res.prefill_seconds;
            decode_s = res.decode_seconds;
        } else {
            std::vector<std::vector<int>> prompts;
            for (int i = 0; i < batch; i++) prompts.push_back(bench_prompt(len, c.vocab_size, i));
            BatchGenerateResult res = generate_batch(*engine, prompts, g);
            prefill_s = res.prefill_seconds;
            decode_s = res.decode_seconds;
        }
        return std::array<double, 3>{double(batch) * gen / (prefill_s + decode_s), gen > 1 ? double(batch) * (gen - 1) / decode_s : 0,
                                     prefill_s};
    };
    {
        GenerateOptions g;
        g.max_new_tokens = 4;
        g.ignore_eos = true;
        g.on_token = [&](int) { return true; };
        try {
            // On a GPU the longest input length (at most 2048 tokens): a prompt of one token would leave the prefill
            // GEMMs cold. On the CPU the first use is the weights' first touch (page faults of the mapped file), which
            // any request pays in full: at most 16 tokens.
            const int cap = on_gpu ? 2048 : 16;
            const int longest = *std::max_element(lens.begin(), lens.end());
            generate(*engine, bench_prompt(std::clamp(longest, 1, std::max(1, std::min(cap, c.max_context() - 4))), c.vocab_size, 1), g);
        } catch (const OutOfMemory &) {
            // The rows below say which lengths do not fit.
        }
    }
    for (int batch : batches) {
        for (int len : lens) {
            Row r;
            r.batch = batch;
            r.model = model_name;
            r.quant = quant_label;
            r.kv_dtype = eo.kv_dtype != "auto" ? eo.kv_dtype : kv_bf16 ? "bf16" : "fp32";
            r.input_len = len;
            r.gen_len = gen;
            const int row_end = done + repeat;
            if (int64_t(len) + gen > c.max_context()) {
                r.note = "exceeds the model's context of " + std::to_string(c.max_context());
                rows.push_back(r);
                done = row_end;
                continue;
            }
            std::vector<double> speeds, decodes, ttfts;
            try {
                for (int rep = 0; rep < repeat; rep++) {
                    const auto [speed, decode, ttft] = run_once(batch, len);
                    speeds.push_back(speed);
                    decodes.push_back(decode);
                    ttfts.push_back(ttft);
                    bar.update(++done);
                }
            } catch (const OutOfMemory & e) {
                // The row does not fit the card: say so and go on with the others.
                r.note = std::string("does not fit in GPU memory: ") + e.what();
                rows.push_back(r);
                done = row_end;
                continue;
            }
            auto mean = [](const std::vector<double> & v) { return std::accumulate(v.begin(), v.end(), 0.0) / double(v.size()); };
            r.tok_s = mean(speeds);
            for (double v : speeds) r.tok_s_std += (v - r.tok_s) * (v - r.tok_s);
            r.tok_s_std = speeds.size() > 1 ? std::sqrt(r.tok_s_std / double(speeds.size() - 1)) : 0.0;
            r.decode_tok_s = mean(decodes);
            r.ttft_s = mean(ttfts);
            r.peak_gb = double(engine->peak_memory_bytes()) / 1e9;
            // Bytes one decode step must read: the weights once plus every sequence's KV cache at the mean context.
            double ctx = len + gen / 2.0;
            const KVDType kv = parse_kv_dtype(r.kv_dtype);
            double kv_token = double(c.kv_bytes_per_token(1)) * kv_dtype_bytes_per_element(kv);
            if (kv == KVDType::INT8 || kv == KVDType::INT4) kv_token += 2.0 * c.num_hidden_layers * c.num_key_value_heads * 8;  // scale, zero
            double step_bytes = weight_bytes + kv_token * ctx * batch;
            // Tensor parallel: the GPUs read their shares side by side, so the limit is their bandwidth together.
            r.bw_frac = r.decode_tok_s / batch * step_bytes / (sys.bandwidth * std::max(1, gpu_num));
            rows.push_back(r);
        }
    }
    bar.finish();
    if (!trace_path.empty()) {
        std::fprintf(stderr, "bench: %zu kernels traced to %s\n", write_kernel_trace(trace_path), trace_path.c_str());
    }

    // Baselines (scripts/hf_bench.py rows): same model and input length, tokens/s incl. prefill.
    struct Base {
        std::string engine;
        int input_len, gen_len;
        double tok_s, peak_gb;
    };
    std::vector<Base> bases;
    for (const auto & r : baseline_rows) {
        if (r.value("model", "") != model_name) continue;
        bases.push_back({r.value("engine", "?"), r.value("input_len", 0), r.value("gen_len", 0), r.value("tok_s", 0.0), r.value("peak_gb", 0.0)});
    }
    const std::string commit = git_commit();
    std::printf("| Model | Input Length | Quantization | GPU Num | Speed(tokens/s) | GPU Memory(GB) | TTFT(s) | Decode(tokens/s) | BW share "
                "| Batch | KV cache |\n");
    std::printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (const Row & r : rows) {
        if (!r.note.empty()) {
            std::printf("| %s | %d | %s | %d | - | - | - | - | %s | %d | %s |\n", r.model.c_str(), r.input_len, r.quant.c_str(), gpu_num,
                        r.note.c_str(), r.batch, r.kv_dtype.c_str());
            continue;
        }
        char speed[64];
        if (repeat > 1) {
            std::snprintf(speed, sizeof speed, "%.2f ± %.2f", r.tok_s, r.tok_s_std);
        } else {
            std::snprintf(speed, sizeof speed, "%.2f", r.tok_s);
        }
        std::printf("| %s | %d | %s | %d | %s | %s | %.3f | %.2f | %.0f%% | %d | %s |\n", r.model.c_str(), r.input_len, r.quant.c_str(),
                    gpu_num, speed, gpu ? std::to_string(r.peak_gb).substr(0, 5).c_str() : "-", r.ttft_s, r.decode_tok_s,
                    100 * r.bw_frac, r.batch, r.kv_dtype.c_str());
    }
    std::printf("card: %s | %s | backend %s | commit %s | bandwidth %.1f GB/s (%s) | weights %s, loaded in %.1f s\n", sys.card.c_str(),
                sys.software.c_str(), engine->backend_name().c_str(), commit.c_str(), sys.bandwidth / 1e9, sys.bandwidth_source.c_str(),
                eo.dummy_weights ? "--load-format dummy (random, built in memory)" : "read from safetensors", load_s);
    if (!bases.empty()) {
        std::printf("\n| Model | Input Length | engine | its tokens generated | its Speed(tokens/s) | its GPU Memory(GB) | qinfer / it |\n");
        std::printf("|---|---|---|---|---|---|---|\n");
        for (const Base & b : bases) {
            for (const Row & r : rows) {
                if (r.input_len != b.input_len || r.batch != 1 || !r.note.empty()) continue;
                std::printf("| %s | %d | %s | %d | %.2f | %.2f | %.2fx |\n", model_name.c_str(), b.input_len, b.engine.c_str(), b.gen_len,
                            b.tok_s, b.peak_gb, r.tok_s / b.tok_s);
            }
        }
    }

    json out = json::array();
    for (const Row & r : rows) {
        json j = {{"model", r.model}, {"quant", r.quant}, {"kv_dtype", r.kv_dtype}, {"batch", r.batch},
                  {"input_len", r.input_len}, {"gen_len", r.gen_len}, {"card", sys.card}, {"driver", sys.driver},
                  {"cuda", sys.cuda}, {"commit", commit}, {"backend", engine->backend_name()},
                  {"bandwidth_gbs", sys.bandwidth / 1e9}, {"gpus", gpu_num}, {"load_format", load_format}, {"load_s", load_s}, {"env", json::parse(env_knobs_json())}};
        if (r.note.empty()) {
            j.update(json{{"tok_s", r.tok_s}, {"tok_s_std", r.tok_s_std}, {"repeat", repeat}, {"decode_tok_s", r.decode_tok_s}, {"ttft_s", r.ttft_s}, {"peak_gb", r.peak_gb},
                          {"bw_frac", r.bw_frac}});
        } else {
            j["skipped"] = r.note;
        }
        out.push_back(j);
    }
    if (!json_path.empty()) std::ofstream(json_path) << out.dump(2) << "\n";
    if (!plot_path.empty()) {
        PlotOptions po;
        po.x = lens.size() == 1 && batches.size() > 1 ? "batch" : "input_len";
        po.title = model_name + " on " + sys.card + ", " + std::to_string(gen) + " generated, commit " + commit;
        plot_rows(out, po, plot_path);
    }
    if (!csv_path.empty()) {
        std::ofstream f(csv_path);
        f << "model,quant,kv_dtype,batch,input_len,gen_len,tok_s,decode_tok_s,ttft_s,peak_gb,bw_frac,card,driver,cuda,commit\n";
        for (const Row & r : rows) {
            f << r.model << "," << r.quant << "," << r.kv_dtype << "," << r.batch << "," << r.input_len << "," << r.gen_len << ","
              << r.tok_s << "," << r.decode_tok_s << "," << r.ttft_s << "," << r.peak_gb << "," << r.bw_frac << ",\"" << sys.card
              << "\"," << sys.driver << "," << sys.cuda << "," << commit << "\n";
        }
    }
    return 0;
}

}  // namespace qinfer
