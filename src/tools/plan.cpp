#include "tools/plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <numeric>

#include "core/check.h"
#include "model/decode_splits.h"
#include "model/prefill_chunk.h"
#include "model/prefill_splits.h"
#include "model/quant_repack.h"
#include "model/qwen_tp.h"
#include "model/tp_plan.h"
#include "model/weights.h"
#include "tools/args.h"
#include "tools/commands.h"
#include "tools/presets.h"
#include "tools/synth_quant.h"

namespace qinfer {

namespace {

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// Device bytes of one projection as the CUDA engine stores it (model/quant_repack.h).
double linear_bytes(const Linear & l) {
    const double N = l.out_features, K = l.in_features;
    const QuantScheme & s = l.scheme;
    switch (s.method) {
    case QuantMethod::None: return N * K * 2;
    case QuantMethod::Bnb4: return N * K / 2 + N * K / 64 * 4 + 64;
    default: break;
    }
    const double groups = std::ceil(K / s.group(l.in_features));
    double codes = N * K * s.bits / 8;
    if (quant_tiles(s, l.in_features)) codes = double(round_up(l.out_features, 16)) * double(round_up(l.in_features, 64)) * s.bits / 8;
    const double zeros = s.sym ? 0 : N * groups;  // symmetric zeros are one constant
    return codes + N * groups * 2 + zeros + (s.desc_act ? K * 4 : 0);
}

}  // namespace

MemoryEstimate estimate_cuda_memory(const ModelConfig & c, KVDType kv, int batch, int prompt, int context, bool embedding_on_gpu) {
    MemoryEstimate m;
    ModelWeights w;
    double largest_quant = 0;  // bf16 bytes of the largest stacked projection (prefill dequantizes into it)
    int max_k = 0;
    visit_weights(c, w, [&](const std::string &, const std::vector<int64_t> & shape, WeightRole role, Weight &) {
        if (role == WeightRole::Embedding && !c.tie_word_embeddings && !embedding_on_gpu) return;  // in host memory
        if (role == WeightRole::Norm || role == WeightRole::Bias || role == WeightRole::Embedding || role == WeightRole::Router) {
            double n = 1;
            for (auto d : shape) n *= double(d);
            m.weights += n * 2;
        }
    });
    for_each_linear(w, [&](Linear & l) {
        m.weights += linear_bytes(l);
        if (l.quantized()) max_k = std::max(max_k, int(round_up(l.in_features, 64)));
    });
    if (!c.tie_word_embeddings) m.weights += double(c.vocab_size) * c.hidden_size * 2;
    for (const LayerWeights & L : w.layers) {
        if (L.is_moe || !L.mlp.gate_proj.quantized()) continue;
        largest_quant = std::max(largest_quant, 2.0 * L.mlp.gate_proj.out_features * L.mlp.gate_proj.in_features * 2);
        largest_quant = std::max(largest_quant, double(L.mlp.down_proj.out_features) * L.mlp.down_proj.in_features * 2);
        largest_quant = std::max(largest_quant, double(c.q_dim() + 2 * c.kv_dim()) * c.hidden_size * 2);
    }

    const double tokens = double(round_up(context, 16));
    double per_token = double(c.kv_bytes_per_token(1)) * kv_dtype_bytes_per_element(kv);
    if (kv == KVDType::INT8 || kv == KVDType::INT4) per_token += 2.0 * c.num_hidden_layers * c.num_key_value_heads * 8;
    m.kv = per_token * tokens * batch;

    // Workspaces for the larger of one prefill chunk (prefill_chunk_for_cache tokens of one sequence: a batch's prompts
    // are prefilled one after another) and one decode step of the batch; decode scratch and buffers
    // (model/qwen_cuda.cpp).
    const double per_token_bytes = prefill_bytes_per_token(c);
    const int chunk = prefill_chunk_for_cache(int(tokens), max_k > 0, per_token_bytes, c.num_experts > 0);
    const double ch = double(std::max(std::min(prompt, chunk), batch));
    m.workspace = ch * per_token_bytes;
    m.workspace += 4.0 * c.vocab_size * batch + 4.0 * (tokens + 1) * batch;
    // 396 blocks a wave: 3 per SM (backends/cuda/attention.cu) on an H100's 132 SMs.
    const double splits = decode_splits_for(int(tokens), c.num_key_value_heads, int(batch), 396);
    m.workspace += double(batch) * c.num_attention_heads * splits * (c.head_dim + 2) * 4;
    m.workspace += double(batch) * (tokens / 16) * 4;  // the batch's block tables
    // A quantized cache's prompt, dequantized to bf16 K and V for the prefill attention (CudaQwenEngine::ensure_prefill_kv).
    if (kv != KVDType::BF16) m.workspace += double(round_up(std::min(prompt, context), 16)) * c.num_key_value_heads * c.head_dim * 2 * 2;
    // The prefill attention's key splits over a bf16 cache (CudaQwenEngine::prefill), for 132 SMs.
    else if (prefill_split_may_apply(std::min(prompt, context))) m.workspace += double(prefill_split_scratch_bytes(c.head_dim, 132));
    if (prompt > 4 || batch > 4) m.workspace += largest_quant;  // (the tiled GEMV takes up to 8 rows: an upper bound)
    m.workspace += double(max_k) * 8 * 2;  // the quantized GEMV's staged inputs, up to 8 rows
    return m;
}

// The intermediate dimension's multiple as the GPUs' tensor parallel cuts it (model/qwen_tp.h tp_inter_align).
static int gpu_tp_align(const ModelConfig & c) {
    const QuantScheme down = c.quant.quantized() ? c.quant.scheme_for("model.layers.0.mlp.down_proj") : QuantScheme{};
    return std::lcm(k_tp_gpu_inter_align, tp_quant_align(down));
}

std::vector<MemoryEstimate> estimate_cuda_tp_memory(const ModelConfig & c, int tp, KVDType kv, int batch, int prompt, int context) {
    const int align = gpu_tp_align(c);
    const QuantScheme o_scheme = c.quant.quantized() ? c.quant.scheme_for("model.layers.0.self_attn.o_proj") : QuantScheme{};
    const bool o_whole = o_scheme.quantized() && o_scheme.desc_act;  // model/qwen_cuda_tp.cpp keep_act_order_o_proj_whole
    std::vector<MemoryEstimate> out;
    for (const TpShard & s : plan_tensor_parallel(c, tp, align)) {
        const ModelConfig rc = shard_config(c, s, tp, align);
        MemoryEstimate m = estimate_cuda_memory(rc, kv, batch, prompt, context);
        if (o_whole) {
            Linear whole, mine;
            whole.scheme = mine.scheme = o_scheme;
            whole.out_features = mine.out_features = c.hidden_size;
            whole.in_features = c.q_dim();
            mine.in_features = rc.q_dim();
            m.weights += double(c.num_hidden_layers) * (linear_bytes(whole) - linear_bytes(mine));
        }
        out.push_back(m);
    }
    return out;
}

// --tp N: how a tensor-parallel run on the GPUs splits the model over N ranks (model/tp_plan.h), a row a rank, with
// each GPU's weights and peak memory for one sequence of `context` tokens (estimate_cuda_tp_memory).
static int print_tp_plan(const ModelConfig & c, int tp, int context) {
    const QuantScheme down = c.quant.quantized() ? c.quant.scheme_for("model.layers.0.mlp.down_proj") : QuantScheme{};
    const std::vector<TpShard> plan = plan_tensor_parallel(c, tp, gpu_tp_align(c));
    const std::vector<MemoryEstimate> mem = estimate_cuda_tp_memory(c, tp, KVDType::BF16, 1, context, context);
    const bool moe = c.num_experts > 0;
    std::printf("| rank | query heads | KV heads | %s columns | vocabulary rows | weights GB | peak GB at %d tokens |\n"
                "|---|---|---|---|---|---|---|\n", moe ? "expert intermediate" : "intermediate", context);
    for (const TpShard & s : plan) {
        const MemoryEstimate & m = mem[size_t(s.rank)];
        std::printf("| %d | %d..%d (%d) | %d..%d (%d) | %d..%d (%d) | %d..%d (%d) | %.2f | %.2f |\n", s.rank, s.q_head0, s.q_head0 + s.n_q_heads - 1,
                    s.n_q_heads, s.kv_head0, s.kv_head0 + s.n_kv_heads - 1, s.n_kv_heads, s.inter0, s.inter0 + s.n_inter - 1, s.n_inter, s.vocab0,
                    s.vocab0 + s.n_vocab - 1, s.n_vocab, m.weights / 1e9, m.total() / 1e9);
    }
    std::printf("heads go as whole GQA groups (%d query heads a KV head)%s; q/k/v and gate/up split by output, o_proj and down by\n"
                "input (one all-reduce after each); embedding and lm_head by vocabulary rows on the CPU backend, whole on every GPU\n"
                "(decode steps of up to %d rows compute each rank's vocabulary rows and gather the logits)\n",
                c.num_attention_heads / c.num_key_value_heads,
                tp > c.num_key_value_heads ? ", each KV head held by the ranks that split its group" : "", k_tp_split_logits_rows);
    if (down.quantized() && down.desc_act) {
        std::printf("act-order GPTQ: each rank's intermediate columns are the channels of its whole quantization groups (down_proj's\n"
                    "g_idx), and on the GPUs o_proj stays whole on every rank over the gathered heads (an all-gather, no all-reduce)\n");
    }
    return 0;
}

int cmd_plan(int argc, char ** argv) {
    for (int i = 2; i < argc; i++) {
        if (!std::strcmp(argv[i], "--help")) {
            std::printf("usage: qinfer plan --gpu-mem 24GB (--model DIR | --preset NAME) [--context 8192] [--prompt N]\n"
                        "       qinfer plan --tp N (--model DIR | --preset NAME) [--context 8192]   (how tensor parallel splits the\n"
                        "                   model, and each GPU's weights and peak memory for one sequence of --context tokens)\n"
                        "                   [--reserve 1GB] [--batches 1,4,16,...] [--json FILE] [--embedding-on-gpu]\n"
                        "for each weight format and KV dtype: weights, the longest context at batch 1 and the largest batch at\n"
                        "--context, from qinfer's memory model of the CUDA engine (1 GB = 1e9 bytes; --reserve: CUDA context etc.)\n"
                        "--batches: also the estimated peak at --context for each of those batch sizes (the seed's batch table;\n"
                        "e.g. --context 1025 --prompt 1 for 1024 generated tokens)\n");
            return 0;
        }
    }
    Args a(argc, argv, 2, {"embedding-on-gpu"});
    if (a.has("tp")) {
        const int tp = int(a.integer("tp", 1)), context = int(a.integer("context", 8192));
        const std::string dir = a.str("model"), preset = a.str("preset");
        if (context < 1) QINFER_FAIL() << "--context must be at least 1";
        a.check_unused();
        if (dir.empty() == preset.empty()) QINFER_FAIL() << "give --model DIR or --preset NAME";
        return print_tp_plan(dir.empty() ? parse_model_config(find_preset(preset).config.dump(), "preset " + preset) : load_model_config(dir), tp,
                             context);
    }
    auto bytes_of = [](const std::string & s, const char * what) {
        char * end = nullptr;
        const double v = std::strtod(s.c_str(), &end);
        std::string unit = end ? end : "";
        for (char & ch : unit) ch = char(std::toupper(static_cast<unsigned char>(ch)));
        const double mul = unit == "GB" || unit == "G" ? 1e9 : unit == "GIB" ? 1073741824.0 : unit == "MB" ? 1e6 : unit.empty() ? 1.0 : -1;
        if (!(v > 0) || mul < 0) QINFER_FAIL() << what << " '" << s << "' is not a size (e.g. 24GB, 80GiB)";
        return v * mul;
    };
    const double card = bytes_of(a.required("gpu-mem"), "--gpu-mem");
    const double reserve = bytes_of(a.str("reserve", "1GB"), "--reserve");
    const std::string dir = a.str("model"), preset = a.str("preset");
    const int context = int(a.integer("context", 8192));
    const std::string json_path = a.str("json");
    int prompt_opt = int(a.integer("prompt", 0));
    const std::vector<int> batches = a.has("batches") ? a.int_list("batches") : std::vector<int>{};
    const bool emb_gpu = a.flag("embedding-on-gpu");
    a.check_unused();
    for (int b : batches) {
        if (b < 1) QINFER_FAIL() << "--batches entries must be >= 1, got " << b;
    }
    if (dir.empty() == preset.empty()) QINFER_FAIL() << "give --model DIR or --preset NAME";
    if (context < 1) QINFER_FAIL() << "--context must be >= 1";
    ModelConfig base = dir.empty() ? parse_model_config(find_preset(preset).config.dump(), "preset " + preset) : load_model_config(dir);
    const int prompt = prompt_opt > 0 ? prompt_opt : context;
    const double budget = card - reserve;

    struct Format {
        std::string name;
        ModelConfig c;
    };
    std::vector<Format> formats;
    if (!dir.empty() && base.quant.quantized()) {
        formats.push_back({base.quant.label + " (the checkpoint's)", base});
    } else {
        formats.push_back({"BF16", base});
        for (const char * kind : {"gptq-int8", "gptq-int4", "awq", "nf4"}) {
            SynthQuant q;
            q.kind = kind;
            ModelConfig c = base;
            c.quant = parse_quant_config(synth_quant_config(q).dump(), kind);
            formats.push_back({c.quant.label, c});
        }
    }
    const std::vector<KVDType> kvs = {KVDType::BF16, KVDType::FP8, KVDType::INT8, KVDType::INT4};
    std::printf("card %.1f GB, %.1f GB reserved; model %s, max context %d; batch column at context %d\n", card / 1e9, reserve / 1e9,
                dir.empty() ? preset.c_str() : dir.c_str(), base.max_context(), context);
    std::printf("| weights | weights GB | KV cache | max context, batch 1 | max batch at %d |\n|---|---|---|---|---|\n", context);
    nlohmann::json rows = nlohmann::json::array();
    for (const Format & f : formats) {
        for (KVDType kv : kvs) {
            const MemoryEstimate one = estimate_cuda_memory(f.c, kv, 1, 1, 1, emb_gpu);
            int max_ctx = 0;
            for (int lo = 0, hi = base.max_context(); lo <= hi;) {  // longest context that fits (prompt = context)
                const int mid = lo + (hi - lo) / 2;
                if (mid > 0 && estimate_cuda_memory(f.c, kv, 1, mid, mid, emb_gpu).total() <= budget) {
                    max_ctx = mid;
                    lo = mid + 1;
                } else if (mid == 0) {
                    lo = 1;
                } else {
                    hi = mid - 1;
                }
            }
            int max_batch = 0;
            while (max_batch < 4096 && estimate_cuda_memory(f.c, kv, max_batch + 1, std::min(prompt, context), context, emb_gpu).total() <= budget) max_batch++;
            std::printf("| %s | %.2f | %s | %s | %d |\n", f.name.c_str(), one.weights / 1e9, kv_dtype_name(kv),
                        max_ctx > 0 ? std::to_string(max_ctx).c_str() : "does not fit", max_batch);
            rows.push_back({{"weights", f.name}, {"weights_gb", one.weights / 1e9}, {"kv_dtype", kv_dtype_name(kv)}, {"max_context_batch1", max_ctx},
                            {"max_batch", max_batch}, {"context", context}, {"card_gb", card / 1e9}, {"reserve_gb", reserve / 1e9}});
        }
    }
    if (!batches.empty()) {
        std::printf("\nestimated peak GPU memory (GB) at context %d (prompt %d):\n| weights | KV cache |", context, std::min(prompt, context));
        for (int b : batches) std::printf(" batch %d |", b);
        std::printf("\n|---|---|");
        for (size_t i = 0; i < batches.size(); i++) std::printf("---|");
        std::printf("\n");
        for (const Format & f : formats) {
            for (KVDType kv : kvs) {
                std::printf("| %s | %s |", f.name.c_str(), kv_dtype_name(kv));
                nlohmann::json peaks = nlohmann::json::object();
                for (int b : batches) {
                    const double gb = estimate_cuda_memory(f.c, kv, b, std::min(prompt, context), context, emb_gpu).total() / 1e9;
                    std::printf(gb <= budget / 1e9 ? " %.2f |" : " %.2f (over) |", gb);
                    peaks[std::to_string(b)] = gb;
                }
                std::printf("\n");
                rows.push_back({{"weights", f.name}, {"kv_dtype", kv_dtype_name(kv)}, {"context", context}, {"estimated_peak_gb_by_batch", peaks}});
            }
        }
    }
    std::printf("batch peaks and quantized-cache peaks of the CUDA engine are not yet checked against measurements\n");
    if (!json_path.empty()) {
        std::FILE * fp = std::fopen(json_path.c_str(), "w");
        if (!fp) QINFER_FAIL() << json_path << ": cannot open for writing";
        std::fputs(rows.dump(1).c_str(), fp);
        std::fclose(fp);
    }
    return 0;
}

}  // namespace qinfer
