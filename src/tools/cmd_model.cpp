// qinfer synth | run | logits | dequant | info
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "backends/cpu/ops.h"
#include "io/npy.h"
#include "io/safetensors.h"
#include "io/tokenizer.h"
#include "model/quant.h"
#include "model/weights.h"
#include "runtime/engine.h"
#include "runtime/generate.h"
#include "runtime/kv_cache.h"
#include "tools/args.h"
#include "tools/commands.h"
#include "tools/presets.h"
#include "tools/synth.h"

namespace qinfer {

namespace {

bool wants_help(int argc, char ** argv) {
    for (int i = 2; i < argc; i++) {
        if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h")) return true;
    }
    return false;
}

EngineOptions engine_options(const Args & a) {
    EngineOptions o;
    o.backend = a.str("backend", "auto");
    o.threads = int(a.integer("threads", 0));
    o.max_context = int(a.integer("context", 0));
    o.kv_dtype = a.str("kv-dtype", "auto");
    if (o.kv_dtype != "auto") parse_kv_dtype(o.kv_dtype);
    o.embedding_on_gpu = a.flag("embedding-on-gpu");
    parallel_from_args(a, o);
    o.dummy_weights = load_format_dummy(a);
    return o;
}

}  // namespace

SamplingParams sampling_from_args(const Args & a, const GenerationConfig & gc) {
    SamplingParams s;
    if (gc.do_sample && !a.flag("greedy")) {
        s.temperature = gc.temperature;
        s.top_k = gc.top_k;
        s.top_p = gc.top_p;
        s.min_p = gc.min_p;
        s.repetition_penalty = gc.repetition_penalty;
    }
    if (a.flag("greedy")) s.temperature = 0;
    s.temperature = float(a.number("temperature", s.temperature));
    s.top_k = int(a.integer("top-k", s.top_k));
    s.top_p = float(a.number("top-p", s.top_p));
    s.min_p = float(a.number("min-p", s.min_p));
    s.repetition_penalty = float(a.number("repetition-penalty", s.repetition_penalty));
    s.presence_penalty = float(a.number("presence-penalty", 0));
    s.frequency_penalty = float(a.number("frequency-penalty", 0));
    s.seed = uint64_t(a.integer("seed", 0));
    return s;
}

int cmd_synth(int argc, char ** argv) {
    if (wants_help(argc, argv)) {
        std::printf("usage: qinfer synth --preset NAME --out DIR [--layers N] [--seed S] [--dtype bf16|fp16|fp32]\n"
                    "                    [--shard-size BYTES] [--kv-scale S] [--config-only] %s\n"
                    "--kv-scale: also store fp8 KV-cache scales (self_attn.k_scale / v_scale = S, as vLLM exports do)\n"
                    "--config-only: config.json, generation_config.json and tokenizer without weights, for --load-format dummy\n"
                    "quant kinds: %s\npresets:",
                    k_synth_quant_usage, synth_quant_kinds());
        for (const auto & n : preset_names()) std::printf(" %s", n.c_str());
        std::printf("\n");
        return 0;
    }
    Args a(argc, argv, 2, {"desc-act", "asym", "double-quant", "config-only"});
    SynthOptions o;
    o.preset = a.required("preset");
    o.quant = synth_quant_from_args(a);
    o.out_dir = a.required("out");
    o.layers = int(a.integer("layers", 0));
    o.seed = uint64_t(a.integer("seed", 0));
    if (a.has("dtype")) {
        std::string d = a.str("dtype");
        std::map<std::string, DType> m = {{"bf16", DType::BF16}, {"fp16", DType::F16}, {"fp32", DType::F32}};
        if (!m.count(d)) QINFER_FAIL() << "--dtype must be bf16, fp16 or fp32, got '" << d << "'";
        o.dtype = m[d];
        o.dtype_given = true;
    }
    o.shard_bytes = uint64_t(a.integer("shard-size", int64_t(o.shard_bytes)));
    o.kv_scale = float(a.number("kv-scale", 0));
    o.config_only = a.flag("config-only");
    if (a.has("kv-scale") && !(o.kv_scale > 0)) QINFER_FAIL() << "--kv-scale must be positive";
    if (o.layers < 0) QINFER_FAIL() << "--layers must be positive";
    a.check_unused();
    uint64_t bytes = synthesize(o);
    if (o.config_only) {
        std::printf("wrote %s: config and tokenizer of %s, no weights (run it with --load-format dummy)\n", o.out_dir.c_str(), o.preset.c_str());
    } else {
        std::printf("wrote %s: %.3f GB of weights (%s)\n", o.out_dir.c_str(), double(bytes) / 1e9, o.preset.c_str());
    }
    return 0;
}

int cmd_logits(int argc, char ** argv) {
    if (wants_help(argc, argv)) {
        std::printf("usage: qinfer logits --model DIR --tokens 1,2,3 --out FILE.npy [--backend cpu|cuda] [--threads N]\n"
                    "                     [--kv-dtype fp32|bf16|fp8|int8|int4] [--embedding-on-gpu] [--tp N (GPUs 0..N-1, or CPU ranks)]\n"
                    "                     [--nnodes N --node-rank R --master-addr HOST:PORT (--tp over hosts)]\n"
                    "                     [--load-format auto|dummy]\n"
                    "writes fp32 logits [n_tokens, vocab] of one forward pass over the tokens\n");
        return 0;
    }
    Args a(argc, argv, 2, {"embedding-on-gpu"});
    std::string dir = a.required("model"), out = a.required("out");
    std::vector<int> tokens = a.int_list("tokens");
    EngineOptions eo = engine_options(a);
    a.check_unused();
    if (tokens.empty()) QINFER_FAIL() << "--tokens is empty";
    eo.max_context = std::max<int>(eo.max_context, int(tokens.size()));
    auto engine = make_engine(dir, eo);
    const int vocab = engine->config().vocab_size;
    for (int t : tokens) {
        if (t < 0 || t >= vocab) QINFER_FAIL() << "token id " << t << " is outside the vocabulary [0, " << vocab << ")";
    }
    if (int64_t(tokens.size()) > engine->config().max_context()) {
        QINFER_FAIL() << tokens.size() << " tokens exceed the model's context of " << engine->config().max_context();
    }
    int seq = engine->new_sequence(int(tokens.size()));
    std::vector<float> logits;
    engine->forward(seq, tokens, true, logits);
    write_npy_f32(out, logits.data(), {int64_t(tokens.size()), int64_t(vocab)});
    return 0;
}

int cmd_run(int argc, char ** argv) {
    if (wants_help(argc, argv)) {
        std::printf("usage: qinfer run --model DIR (--prompt TEXT | --tokens IDS) [-n N | --max-tokens N] [--greedy] [--temperature T]\n"
                    "                  [--top-k K] [--top-p P] [--min-p P] [--repetition-penalty R] [--presence-penalty P]\n"
                    "                  [--frequency-penalty F] [--seed S] [--ignore-eos] [--backend cpu|cuda] [--threads N]\n"
                    "                  [--kv-dtype fp32|bf16|fp8|int8|int4] [--embedding-on-gpu] [--tp N (GPUs 0..N-1, or CPU ranks)]\n"
                    "                  [--nnodes N --node-rank R --master-addr HOST:PORT (--tp over hosts)]\n"
                    "                  [--load-format auto|dummy (random weights from config.json alone)]\n"
                    "sampling defaults come from the checkpoint's generation_config.json; --greedy overrides them\n");
        return 0;
    }
    // -n is the one short option.
    std::vector<char *> args(argv, argv + argc);
    for (auto & s : args) {
        if (!std::strcmp(s, "-n")) s = const_cast<char *>("--max-tokens");
    }
    Args a(int(args.size()), args.data(), 2, {"greedy", "ignore-eos", "embedding-on-gpu"});
    std::string dir = a.required("model");
    std::vector<int> prompt = a.int_list("tokens");
    std::unique_ptr<Tokenizer> tok;
    if (a.has("prompt")) {
        if (a.has("tokens")) QINFER_FAIL() << "give --prompt or --tokens, not both";
        tok = Tokenizer::load_dir(dir);
        prompt = tok->encode(a.str("prompt"));
    } else if (!a.has("tokens")) {
        QINFER_FAIL() << "missing option --prompt TEXT or --tokens IDS";
    }
    GenerateOptions g;
    g.max_new_tokens = int(a.integer("max-tokens", 32));
    EngineOptions eo = engine_options(a);
    GenerationConfig gc = load_generation_config(dir, load_model_config(dir));
    g.sampling = sampling_from_args(a, gc);
    g.ignore_eos = a.flag("ignore-eos");
    g.eos_token_ids = gc.eos_token_ids;
    a.check_unused();
    eo.max_context = std::max<int>(eo.max_context, int(prompt.size()) + g.max_new_tokens);
    auto engine = make_engine(dir, eo);
    std::unique_ptr<Tokenizer::Stream> stream;
    if (tok) {
        g.n_valid_tokens = tok->size();
        stream = std::make_unique<Tokenizer::Stream>(*tok);
        g.on_token = [&](int t) {
            const std::string text = stream->push(t);
            std::fwrite(text.data(), 1, text.size(), stdout);
            std::fflush(stdout);
            return true;
        };
    }
    GenerateResult r = generate(*engine, prompt, g);
    if (tok) {
        const std::string rest = stream->flush();
        std::fwrite(rest.data(), 1, rest.size(), stdout);
    } else {
        for (size_t i = 0; i < r.tokens.size(); i++) std::printf("%s%d", i ? " " : "", r.tokens[i]);
    }
    std::printf("\n");
    std::fprintf(stderr, "%zu tokens, stop: %s, prefill %.3f s, decode %.2f tokens/s (%s)\n", r.tokens.size(), r.stop_reason,
                 r.prefill_seconds, r.tokens.size() > 1 ? double(r.tokens.size() - 1) / r.decode_seconds : 0.0,
                 engine->backend_name().c_str());
    return 0;
}

int cmd_dequant(int argc, char ** argv) {
    if (wants_help(argc, argv)) {
        std::printf("usage: qinfer dequant --model DIR --out DIR\n"
                    "writes the checkpoint with every tensor in fp32, quantized linears dequantized by their format's formula\n"
                    "(the CPU reference's weights; scripts/quant_ref.py checks them against its own implementation)\n");
        return 0;
    }
    Args a(argc, argv, 2, {});
    const std::string dir = a.required("model"), out = a.required("out");
    a.check_unused();
    auto m = load_model(dir);
    ModelConfig dense = m->config;
    dense.quant = QuantConfig{};
    std::map<std::string, const Weight *> tensors;
    std::map<std::string, const Linear *> linears;
    ModelWeights loaded = m->weights;
    visit_weights(m->config, loaded, [&](const std::string & name, const std::vector<int64_t> &, WeightRole, Weight & slot) {
        tensors[name] = &slot;
    });
    for_each_linear(loaded, [&](Linear & l) {
        if (!l.quantized()) return;
        const std::string & n = l.scheme.method == QuantMethod::Bnb4 ? l.weight.name : l.qweight.name;
        linears[n.substr(0, n.rfind(l.scheme.method == QuantMethod::Bnb4 ? ".weight" : ".qweight")) + ".weight"] = &l;
    });
    std::vector<std::string> names;
    SafetensorsWriter writer;
    ModelWeights w;
    visit_weights(dense, w, [&](const std::string & name, const std::vector<int64_t> & shape, WeightRole role, Weight &) {
        if (role == WeightRole::KvScale) {
            // Optional fp8 cache scales: kept when the checkpoint has them.
            if (!tensors.at(name)->present()) return;
            writer.add(name, DType::F32, tensors.at(name)->shape);
        } else {
            writer.add(name, DType::F32, shape);
        }
        names.push_back(name);
    });
    std::filesystem::create_directories(out);
    writer.write((std::filesystem::path(out) / "model.safetensors").string(), {{"format", "pt"}}, [&](size_t i, uint8_t * dst, size_t nbytes) {
        float * f = reinterpret_cast<float *>(dst);
        if (linears.count(names[i])) {
            std::vector<float> v = dequantize(*linears.at(names[i]));
            std::memcpy(f, v.data(), nbytes);
        } else {
            const Weight & src = *tensors.at(names[i]);
            for (int64_t j = 0; j < src.numel(); j++) f[j] = cpu::weight_at(src, j);
        }
    });
    auto cfg = nlohmann::json::parse(read_text_file((std::filesystem::path(dir) / "config.json").string()));
    cfg.erase("quantization_config");
    cfg["torch_dtype"] = "float32";
    std::ofstream((std::filesystem::path(out) / "config.json").string()) << cfg.dump(2) << "\n";
    std::printf("wrote %s: %zu tensors in fp32\n", out.c_str(), names.size());
    return 0;
}

int cmd_info(int argc, char ** argv) {
    if (wants_help(argc, argv)) {
        std::printf("usage: qinfer info --model DIR [--context N]\n");
        return 0;
    }
    Args a(argc, argv, 2, {});
    std::string dir = a.required("model");
    int64_t context = a.integer("context", 0);
    a.check_unused();
    auto m = load_model(dir);
    const ModelConfig & c = m->config;
    if (context <= 0) context = c.max_context();
    std::printf("model            %s\n", dir.c_str());
    std::printf("architecture     %s%s\n", arch_model_type(c.arch), c.num_experts ? " (mixture of experts)" : "");
    std::printf("layers           %d\n", c.num_hidden_layers);
    std::printf("hidden           %d (intermediate %d)\n", c.hidden_size, c.intermediate_size);
    std::printf("heads            %d query, %d kv, head_dim %d\n", c.num_attention_heads, c.num_key_value_heads, c.head_dim);
    if (c.num_experts) {
        std::printf("experts          %d, top-%d, moe_intermediate %d, shared expert %d, norm_topk_prob %s\n", c.num_experts,
                    c.num_experts_per_tok, c.moe_intermediate_size, c.shared_expert_intermediate_size,
                    c.norm_topk_prob ? "true" : "false");
    }
    if (c.quant.quantized()) std::printf("quantization     %s: %s\n", c.quant.label.c_str(), c.quant.base.describe().c_str());
    std::printf("vocab            %d%s\n", c.vocab_size, c.tie_word_embeddings ? " (tied embeddings)" : "");
    std::printf("context          %d, rope_theta %g, rope scaling %s", c.max_context(), c.rope_theta,
                rope_type_name(c.rope_scaling.type));
    if (c.rope_scaling.type != RopeType::Default) std::printf(" (factor %g)", c.rope_scaling.factor);
    std::printf("\n");
    const double params = double(parameter_count(c));
    std::printf("parameters       %.3f %s\n", params >= 1e9 ? params / 1e9 : params / 1e6, params >= 1e9 ? "B" : "M");
    std::map<std::string, uint64_t> by_dtype;
    for (const auto & name : m->checkpoint->names()) {
        TensorView t = m->checkpoint->get(name);
        by_dtype[dtype_name(t.dtype())] += t.nbytes();
    }
    for (const auto & [d, b] : by_dtype) std::printf("bytes %-10s %.3f GB\n", d.c_str(), double(b) / 1e9);
    uint64_t weights = m->checkpoint->total_bytes();
    uint64_t kv = c.kv_bytes_per_token(2) * uint64_t(context);
    std::printf("kv cache (bf16)  %.1f KB per token, %.3f GB at %lld tokens\n", double(c.kv_bytes_per_token(2)) / 1e3,
                double(kv) / 1e9, (long long)context);
    std::printf("memory needed    %.3f GB (weights + bf16 KV cache at %lld tokens)\n", double(weights + kv) / 1e9,
                (long long)context);
    std::printf("decode reads     %.3f GB per token of weights\n", double(decode_weight_bytes(*m)) / 1e9);
    return 0;
}

}  // namespace qinfer
