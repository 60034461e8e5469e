// Synthetic checkpoints: random weights in the exact published layout (config.json, generation_config.json,
// safetensors sharded as on the hub, tokenizer files).
#pragma once

#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "tools/synth_quant.h"

namespace qinfer {

struct SynthOptions {
    std::string preset;
    std::string out_dir;
    int layers = 0;  // 0: the preset's
    uint64_t seed = 0;
    DType dtype = DType::BF16;
    bool dtype_given = false;  // else the preset's torch_dtype
    uint64_t shard_bytes = 4000000000ull;  // the hub's Qwen2.5 shards are about 4 GB
    bool quiet = false;
    SynthQuant quant;  // kind empty: dense
    bool config_only = false;  // config.json, generation_config.json and tokenizer: a folder for --load-format dummy
    float kv_scale = 0;  // > 0: every layer also stores fp8 KV-cache scales k_scale = v_scale = kv_scale (fp32 scalars)
};

// Writes the folder; returns the total tensor bytes written.
uint64_t synthesize(const SynthOptions & opt);

// A cache folder for a preset's synthetic checkpoint (bench uses it): $QINFER_CACHE or ~/.cache/qinfer.
// config_only: the folder without weights, for --load-format dummy.
std::string synth_cache_dir(const std::string & preset, int layers, DType dtype, const SynthQuant & quant = {}, bool config_only = false);
// Synthesizes into the cache unless a complete copy is there; returns the folder.
std::string ensure_synth(const std::string & preset, int layers, DType dtype, const SynthQuant & quant = {}, bool config_only = false);

}  // namespace qinfer
