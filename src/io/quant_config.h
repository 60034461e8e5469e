// Quantization of a checkpoint: config.json's quantization_config or quantize_config.json (AutoGPTQ/GPTQModel),
// resolved per module (GPTQModel `dynamic`, AutoRound `extra_config`, AWQ modules_to_not_convert, bitsandbytes
// llm_int8_skip_modules). Formats: ../shared/docs/FORMATS.md sections 3-6.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace qinfer {

enum class QuantMethod { None, Gptq, Awq, Bnb4 };

// How a quantized linear's tensors are laid out on disk.
enum class QuantPacking {
    GptqV1,   // qweight [K*bits/32, N] packed along K, qzeros [groups, N*bits/32] storing zero-1, scales, g_idx
    GptqV2,   // the same with zeros stored as they are (gptq_v2, AutoRound's native packing)
    AwqGemm,  // qweight [K, N/8] packed along N in the order 0,2,4,6,1,3,5,7; qzeros [groups, N/8]; scales
    AwqGemv,  // qweight [N, K/8] packed along K in natural order; qzeros [N, W] (8 zeros per word along the groups);
              // scales [N, 8 W], the first `groups` columns used; W = awq_gemv_zeros_width(K, group)
    Nf4,      // bitsandbytes: uint8 codes (two per byte, high nibble first), absmax per block, quant_map
    Fp4,
};
const char * quant_packing_name(QuantPacking p);

// AutoAWQ's GEMV layout: int32 words of zeros per row, ceil(groups / 8) rounded up to a multiple of 1, 2 or 4 for
// groups of >= 128, 64 or 32 (other group sizes have no GEMV layout: throws).
int64_t awq_gemv_zeros_width(int64_t k, int group);

struct QuantScheme {
    QuantMethod method = QuantMethod::None;  // None: this module is stored unquantized
    QuantPacking packing = QuantPacking::GptqV1;
    int bits = 16;
    int group_size = -1;  // -1: one group over all of K
    bool sym = true;
    bool desc_act = false;
    bool double_quant = false;  // bitsandbytes: absmax itself 8-bit quantized
    int block_size = 64;        // bitsandbytes block of the flattened weight
    bool quantized() const { return method != QuantMethod::None; }
    // Group size for a layer with k inputs (-1 resolved to k).
    int group(int k) const { return group_size > 0 ? group_size : k; }
    std::string describe() const;  // "gptq int4 g128 sym (v1)"
};

struct QuantConfig {
    QuantScheme base;  // method None: an unquantized checkpoint
    std::string source;  // which file it came from, for errors
    std::string label;   // for tables: "GPTQ-Int4", "AWQ", "AutoRound-Int4", "NF4"
    bool lm_head = false;
    std::vector<std::string> skip_modules;  // substrings: modules stored unquantized
    struct Override {
        std::string pattern;  // regex matched at the start of the module name, or an exact module name
        bool skip = false;    // the module is not quantized
        int bits = 0, group_size = 0;  // 0: inherit
        int sym = -1, desc_act = -1;   // -1: inherit
    };
    std::vector<Override> overrides;  // in file order; the first match wins

    bool quantized() const { return base.quantized(); }
    // The scheme of a module ("model.layers.0.mlp.down_proj").
    QuantScheme scheme_for(const std::string & module) const;
};

// Parses a quantization_config object (JSON text); `what` names the file in errors. Throws qinfer::Error on an
// unknown method or an unsupported bits/group/format combination.
QuantConfig parse_quant_config(const std::string & text, const std::string & what);
// config.json's quantization_config, else quantize_config.json / quant_config.json in `dir`; none: unquantized.
QuantConfig load_quant_config(const std::string & dir, const std::string & config_json_text);

}  // namespace qinfer
