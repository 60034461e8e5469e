#include "tools/synth.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/env.h"
#include "core/check.h"
#include "core/parallel.h"
#include "core/progress.h"
#include "core/rng.h"
#include "io/model_config.h"
#include "io/safetensors.h"
#include "model/weights.h"
#include "tools/presets.h"

#ifndef QINFER_ASSETS_DIR
#define QINFER_ASSETS_DIR "assets"
#endif

namespace qinfer {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// Standard deviation and mean of a tensor's values. Linear weights get 1/sqrt(in) so every projection keeps
// unit-variance inputs at unit variance; the residual-writing projections are scaled down by sqrt(2 layers) so
// the residual stream grows slowly over depth (as GPT-2's init does); norm weights scatter around 1.
struct Init {
    float mean, std;
};

Init init_for(const std::string & name, const std::vector<int64_t> & shape, WeightRole role, int n_layers) {
    switch (role) {
    case WeightRole::Norm: return {1.0f, 0.1f};
    case WeightRole::Bias: return {0.0f, 0.1f};
    case WeightRole::Embedding: return {0.0f, 1.0f};
    case WeightRole::Router: return {0.0f, 1.0f / std::sqrt(float(shape[1]))};
    case WeightRole::Linear: {
        float s = 1.0f / std::sqrt(float(shape[1]));
        bool writes_residual = name.find("o_proj") != std::string::npos || name.find("down_proj") != std::string::npos;
        if (writes_residual) s /= std::sqrt(2.0f * float(n_layers));
        return {0.0f, s};
    }
    default: return {0.0f, 1.0f};  // quantized tensors are produced from the dense weight
    }
}

void fill_tensor(uint64_t stream, Init init, DType dtype, uint8_t * out, size_t nbytes) {
    const int64_t n = int64_t(nbytes / dtype_size(dtype));
    constexpr int64_t k_chunk = 1 << 16;
    parallel_for((n + k_chunk - 1) / k_chunk, [&](int64_t c) {
        const int64_t i0 = c * k_chunk, i1 = std::min(n, i0 + k_chunk);
        for (int64_t i = i0; i < i1; i++) {
            float v = init.mean + init.std * normal_at(stream, uint64_t(i));
            switch (dtype) {
            case DType::BF16: {
                uint16_t h = f32_to_bf16(v);
                std::memcpy(out + 2 * i, &h, 2);
                break;
            }
            case DType::F16: {
                uint16_t h = f32_to_f16(v);
                std::memcpy(out + 2 * i, &h, 2);
                break;
            }
            default: std::memcpy(out + 4 * i, &v, 4); break;
            }
        }
    });
}

std::string torch_name(DType t) {
    switch (t) {
    case DType::BF16: return "bfloat16";
    case DType::F16: return "float16";
    case DType::F32: return "float32";
    default: QINFER_FAIL() << "synth writes bf16, fp16 or fp32, not " << dtype_name(t);
    }
}

void write_json(const fs::path & p, const json & j) {
    std::ofstream out(p);
    if (!out) QINFER_FAIL() << p.string() << ": cannot open for writing";
    out << j.dump(2) << "\n";
}

}  // namespace

uint64_t synthesize(const SynthOptions & opt) {
    const Preset & preset = find_preset(opt.preset);
    json cfg = preset.config;
    if (opt.layers > 0) {
        cfg["num_hidden_layers"] = opt.layers;
        if (cfg.contains("max_window_layers")) cfg["max_window_layers"] = opt.layers;
        if (cfg.contains("mlp_only_layers")) {
            json kept = json::array();
            for (int l : cfg["mlp_only_layers"]) {
                if (l < opt.layers) kept.push_back(l);
            }
            cfg["mlp_only_layers"] = kept;
        }
    }
    const bool quantized = !opt.quant.kind.empty();
    DType dtype = opt.dtype_given ? opt.dtype : dtype_from_torch_name(cfg["torch_dtype"].get<std::string>());
    // The hub's GPTQ/AWQ exports keep their unquantized tensors in fp16; bitsandbytes keeps the model's dtype.
    if (quantized && !opt.dtype_given && opt.quant.kind != "nf4" && opt.quant.kind != "fp4") dtype = DType::F16;
    cfg["torch_dtype"] = torch_name(dtype);
    if (quantized) cfg["quantization_config"] = synth_quant_config(opt.quant);
    ModelConfig c = parse_model_config(cfg.dump(), "preset " + opt.preset);
    if (quantized) c.quant = parse_quant_config(cfg["quantization_config"].dump(), "synth --quant " + opt.quant.kind);

    fs::create_directories(opt.out_dir);
    const fs::path dir(opt.out_dir);
    // Declare every tensor, then split them into shards in checkpoint order.
    struct Spec {
        std::string name;
        std::vector<int64_t> shape;
        WeightRole role;
    };
    std::vector<Spec> specs;
    ModelWeights w;
    visit_weights(c, w, [&](const std::string & name, const std::vector<int64_t> & shape, WeightRole role, Weight & slot) {
        slot.name = name;
        if (role == WeightRole::KvScale) {
            // Optional: written only on request, as k_scale and v_scale scalars (vLLM's names).
            if (opt.kv_scale <= 0 || name.size() < 9 || name.compare(name.size() - 9, 9, ".kv_scale") == 0) return;
            specs.push_back({name, {}, role});
            return;
        }
        specs.push_back({name, shape, role});
    });
    // Quantized linears by module prefix; their tensors are produced together from the dense weight.
    std::map<std::string, const Linear *> linears;
    for_each_linear(w, [&](Linear & l) {
        if (!l.quantized()) return;
        const std::string & n = l.scheme.method == QuantMethod::Bnb4 ? l.weight.name : l.qweight.name;
        linears[n.substr(0, n.rfind(l.scheme.method == QuantMethod::Bnb4 ? ".weight" : ".qweight"))] = &l;
    });
    auto prefix_of = [&](const std::string & name) {
        for (const char * suffix : {".qweight", ".qzeros", ".scales", ".g_idx", ".weight"}) {
            size_t at = name.rfind(suffix);
            if (at != std::string::npos && linears.count(name.substr(0, at))) return name.substr(0, at);
        }
        QINFER_FAIL() << "synth: no quantized linear owns " << name;
    };
    auto tensor_dtype = [&](WeightRole role, const std::string & name) {
        switch (role) {
        case WeightRole::QWeight:
        case WeightRole::QZeros:
        case WeightRole::QGIdx: return DType::I32;
        case WeightRole::QScales: return DType::F16;
        case WeightRole::BnbCodes:
        case WeightRole::BnbQuantState: return DType::U8;
        case WeightRole::BnbAbsmax: return linears.at(prefix_of(name))->scheme.double_quant ? DType::U8 : DType::F32;
        case WeightRole::BnbQuantMap:
        case WeightRole::BnbNestedAbsmax:
        case WeightRole::BnbNestedQuantMap:
        case WeightRole::KvScale: return DType::F32;
        default: return dtype;
        }
    };
    for (Spec & sp : specs) {
        if (sp.role == WeightRole::BnbQuantState) {
            sp.shape = {int64_t(bnb_quant_state_json(*linears.at(prefix_of(sp.name)), torch_name(dtype), 0).size())};
        }
    }
    struct Pending {
        std::map<std::string, std::vector<uint8_t>> tensors;  // by suffix
        size_t left = 0;
    };
    std::map<std::string, Pending> pending;
    const uint64_t seed_stream = splitmix64(opt.seed);
    // The stored bytes of a quantized linear's tensor: quantize the dense synthetic weight of the same seed.
    auto quant_bytes = [&](const Spec & sp, uint8_t * out, size_t nbytes) {
        const std::string prefix = prefix_of(sp.name);
        const Linear & l = *linears.at(prefix);
        auto it = pending.find(prefix);
        if (it == pending.end()) {
            const std::string wname = prefix + ".weight";
            const std::vector<int64_t> shape = {l.out_features, l.in_features};
            std::vector<float> dense(size_t(l.out_features) * l.in_features);
            fill_tensor(hash_string(wname, seed_stream), init_for(wname, shape, WeightRole::Linear, c.num_hidden_layers), DType::F32,
                        reinterpret_cast<uint8_t *>(dense.data()), dense.size() * 4);
            // Projections that read the same input share GPTQ's act-order (their Hessians are the same).
            std::string key = prefix.substr(0, prefix.rfind('.'));
            const std::string leaf = prefix.substr(prefix.rfind('.') + 1);
            key += leaf == "q_proj" || leaf == "k_proj" || leaf == "v_proj" ? ".qkv" : leaf == "gate_proj" || leaf == "up_proj" ? ".gate_up" : "." + leaf;
            Pending p;
            p.tensors = quantize_linear(l, dense, hash_string(key, seed_stream), torch_name(dtype));
            p.left = p.tensors.size();
            it = pending.emplace(prefix, std::move(p)).first;
        }
        const std::vector<uint8_t> & b = it->second.tensors.at(sp.name.substr(prefix.size()));
        if (b.size() != nbytes) QINFER_FAIL() << "synth: " << sp.name << " has " << b.size() << " bytes, declared " << nbytes;
        std::memcpy(out, b.data(), nbytes);
        if (--it->second.left == 0) pending.erase(it);
    };
    std::vector<SafetensorsWriter> shards(1);
    std::vector<std::vector<size_t>> shard_specs(1);
    for (size_t i = 0; i < specs.size(); i++) {
        int64_t numel = 1;
        for (auto d : specs[i].shape) numel *= d;
        const DType t = tensor_dtype(specs[i].role, specs[i].name);
        uint64_t nbytes = uint64_t(numel) * dtype_size(t);
        if (shards.back().count() > 0 && shards.back().bytes() + nbytes > opt.shard_bytes) {
            shards.emplace_back();
            shard_specs.emplace_back();
        }
        shards.back().add(specs[i].name, t, specs[i].shape);
        shard_specs.back().push_back(i);
    }
    uint64_t total = 0;
    for (const auto & s : shards) total += s.bytes();

    // Remove what an earlier synth of another shape left, so the folder is exactly one checkpoint.
    for (const auto & e : fs::directory_iterator(dir)) {
        std::string n = e.path().filename().string();
        if (e.path().extension() == ".safetensors" || n == "model.safetensors.index.json") fs::remove(e.path());
    }
    Progress bar("synth " + opt.preset, int64_t(total));
    uint64_t done = 0;
    json weight_map = json::object();
    for (size_t s = 0; s < shards.size(); s++) {
        std::string file = shards.size() == 1 ? "model.safetensors"
                                              : "model-" + std::string(5 - std::min<size_t>(5, std::to_string(s + 1).size()), '0') +
                                                    std::to_string(s + 1) + "-of-" +
                                                    std::string(5 - std::min<size_t>(5, std::to_string(shards.size()).size()), '0') +
                                                    std::to_string(shards.size()) + ".safetensors";
        shards[s].write((dir / file).string(), {{"format", "pt"}}, [&](size_t i, uint8_t * out, size_t nbytes) {
            const Spec & sp = specs[shard_specs[s][i]];
            switch (sp.role) {
            case WeightRole::Norm:
            case WeightRole::Linear:
            case WeightRole::Bias:
            case WeightRole::Embedding:
            case WeightRole::Router:
                fill_tensor(hash_string(sp.name, seed_stream), init_for(sp.name, sp.shape, sp.role, c.num_hidden_layers), dtype, out,
                            nbytes);
                break;
            case WeightRole::KvScale: std::memcpy(out, &opt.kv_scale, sizeof(float)); break;
            default: quant_bytes(sp, out, nbytes);
            }
            done += nbytes;
            bar.update(int64_t(done));
        });
        for (const auto & n : shards[s].names()) weight_map[n] = file;
    }
    bar.finish();
    if (shards.size() > 1) {
        write_json(dir / "model.safetensors.index.json", json{{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}});
    }
    write_json(dir / "config.json", cfg);
    if (quantized && c.quant.base.method == QuantMethod::Gptq) write_json(dir / "quantize_config.json", cfg["quantization_config"]);
    write_json(dir / "generation_config.json", preset.generation_config);
    if (!preset.tokenizer.empty()) {
        const std::string assets = read_env().assets_dir;
        fs::path src = fs::path(assets.empty() ? QINFER_ASSETS_DIR : assets) / "tokenizers" / preset.tokenizer;
        if (!fs::exists(src)) QINFER_FAIL() << "tokenizer files not found at " << src.string() << " (set QINFER_ASSETS)";
        for (const auto & e : fs::directory_iterator(src)) {
            fs::copy_file(e.path(), dir / e.path().filename(), fs::copy_options::overwrite_existing);
        }
    }
    return total;
}

std::string synth_cache_dir(const std::string & preset, int layers, DType dtype, const SynthQuant & quant) {
    const fs::path base = read_env().cache_dir;
    std::string name = preset + "-" + dtype_name(dtype) + (layers > 0 ? "-l" + std::to_string(layers) : "");
    if (!quant.kind.empty()) {
        name += "-" + quant.kind + "-g" + std::to_string(quant.group_size) + (quant.desc_act ? "-act" : "") + "-" + quant.gptq_format +
                (quant.sym == 0 ? "-asym" : "") + (quant.double_quant ? "-dq" : "");
    }
    return (base / "synth" / name).string();
}

std::string ensure_synth(const std::string & preset, int layers, DType dtype, const SynthQuant & quant) {
    std::string dir = synth_cache_dir(preset, layers, dtype, quant);
    fs::path done = fs::path(dir) / ".complete";
    if (fs::exists(done)) return dir;
    SynthOptions o;
    o.preset = preset;
    o.out_dir = dir;
    o.layers = layers;
    o.dtype = dtype;
    o.dtype_given = quant.kind.empty();
    o.quant = quant;
    synthesize(o);
    std::ofstream(done) << "ok\n";
    return dir;
}

}  // namespace qinfer
