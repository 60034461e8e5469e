// Quantized synthetic checkpoints: the dense synthetic weights, quantized by round-to-nearest and written in the
// exact hub layouts of GPTQ (v1/v2), AWQ GEMM, AutoRound and bitsandbytes NF4/FP4 (FORMATS.md sections 3-6).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "io/quant_config.h"

namespace qinfer {

struct SynthQuant {
    std::string kind;     // gptq-int2|gptq-int3|gptq-int4|gptq-int8|awq|autoround-sym|autoround-asym|nf4|fp4; empty: dense
    int group_size = 128;
    bool desc_act = false;
    std::string gptq_format = "v1";  // v1 (AutoGPTQ: zeros stored minus one) or v2 (GPTQModel)
    int sym = -1;                    // -1: the kind's default
    bool double_quant = false;       // bitsandbytes
};
const char * synth_quant_kinds();  // for usage text
class Args;
// --quant KIND [--group-size G] [--desc-act] [--gptq-format v1|v2] [--asym] [--double-quant]
SynthQuant synth_quant_from_args(const Args & a);
constexpr const char * k_synth_quant_usage =
    "[--quant KIND [--group-size G] [--desc-act] [--gptq-format v1|v2] [--asym] [--double-quant]]";

// The quantization_config object a checkpoint of this kind carries in config.json.
nlohmann::json synth_quant_config(const SynthQuant & q);

}  // namespace qinfer
