// libFuzzer target: config.json, generation_config.json and quantization config parsing (with the per-module
// resolution of `dynamic` / `extra_config` patterns), then the rope tables derived from an accepted config. Any input
// must parse or throw qinfer::Error.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/check.h"
#include "io/model_config.h"
#include "io/quant_config.h"
#include "model/rope.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    std::string text(reinterpret_cast<const char *>(data), size);
    try {
        qinfer::ModelConfig c = qinfer::parse_model_config(text, "fuzz");
        qinfer::compute_rope_freqs(c, 1 << 20);
        (void)c.max_context();
    } catch (const qinfer::Error &) {
    }
    try {
        qinfer::parse_generation_config(text, "fuzz");
    } catch (const qinfer::Error &) {
    }
    try {
        qinfer::QuantConfig q = qinfer::parse_quant_config(text, "fuzz");
        for (const char * m : {"model.layers.0.self_attn.q_proj", "model.layers.17.mlp.down_proj", "lm_head"}) (void)q.scheme_for(m);
    } catch (const qinfer::Error &) {
    }
    return 0;
}
