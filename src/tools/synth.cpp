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
#include "model/random_weights.h"
#include "model/weights.h"
#include "tools/presets.h"

#ifndef QINFER_ASSETS_DIR
#define QINFER_ASSETS_DIR "assets"
#endif

namespace qinfer {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

void write_json(const fs::path & p, const json & j) {
    std::ofstream out(p);
    if (!out) QINFER_FAIL() << p.string() << ": cannot open for writing";
    out << j.dump(2) << "\n";
}

// config.json (with its quantization_config), generation_config.json and the preset's tokenizer files.
void write_metadata(const fs::path & dir, const Preset & preset, const json & cfg, bool quantized, const ModelConfig & c) {
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
    cfg["torch_dtype"] = torch_dtype_name(dtype);
    if (quantized) cfg["quantization_config"] = synth_quant_config(opt.quant);
    ModelConfig c = parse_model_config(cfg.dump(), "preset " + opt.preset);
    if (quantized) c.quant = parse_quant_config(cfg["quantization_config"].dump(), "synth --quant " + opt.quant.kind);

    fs::create_directories(opt.out_dir);
    const fs::path dir(opt.out_dir);
    if (opt.config_only) {
        write_metadata(dir, preset, cfg, quantized, c);
        return 0;
    }
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
        return stored_dtype(role, dtype, role == WeightRole::BnbAbsmax ? linears.at(prefix_of(name))->scheme : QuantScheme{});
    };
    for (Spec & sp : specs) {
        if (sp.role == WeightRole::BnbQuantState) {
            sp.shape = {int64_t(bnb_quant_state_json(*linears.at(prefix_of(sp.name)), torch_dtype_name(dtype), 0).size())};
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
        auto it = pending.find(prefix);
        if (it == pending.end()) {
            Pending p;
            p.tensors = random_quantized_linear(*linears.at(prefix), prefix, c.num_hidden_layers, hash_string(prefix + ".weight", seed_stream),
                                                hash_string(act_order_key(prefix), seed_stream), dtype);
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
                fill_random(hash_string(sp.name, seed_stream), random_init(sp.name, sp.shape, sp.role, c.num_hidden_layers), dtype, out,
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
    write_metadata(dir, preset, cfg, quantized, c);
    return total;
}

std::string synth_cache_dir(const std::string & preset, int layers, DType dtype, const SynthQuant & quant, bool config_only) {
    const fs::path base = read_env().cache_dir;
    std::string name = preset + "-" + dtype_name(dtype) + (layers > 0 ? "-l" + std::to_string(layers) : "");
    if (!quant.kind.empty()) {
        name += "-" + quant.kind + "-g" + std::to_string(quant.group_size) + (quant.desc_act ? "-act" : "") + "-" + quant.gptq_format +
                (quant.sym == 0 ? "-asym" : "") + (quant.double_quant ? "-dq" : "");
    }
    if (config_only) name += "-config";
    return (base / "synth" / name).string();
}

std::string ensure_synth(const std::string & preset, int layers, DType dtype, const SynthQuant & quant, bool config_only) {
    std::string dir = synth_cache_dir(preset, layers, dtype, quant, config_only);
    fs::path done = fs::path(dir) / ".complete";
    if (fs::exists(done)) return dir;
    SynthOptions o;
    o.preset = preset;
    o.out_dir = dir;
    o.layers = layers;
    o.dtype = dtype;
    o.dtype_given = quant.kind.empty();
    o.quant = quant;
    o.config_only = config_only;
    synthesize(o);
    std::ofstream(done) << "ok\n";
    return dir;
}

}  // namespace qinfer
