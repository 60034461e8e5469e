// Quantized linears in memory for tests: a random dense weight quantized by `qinfer synth`'s writer into the
// format's stored tensors, with the Linear's slots pointing at them.
#pragma once

#include <cmath>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/rng.h"
#include "io/quant_config.h"
#include "model/weights.h"
#include "model/random_weights.h"
#include "tools/synth_quant.h"

namespace qinfer::test {

struct OwnedLinear {
    Linear l;
    std::map<std::string, std::vector<uint8_t>> bytes;
};

// scheme examples: gptq_scheme(4, 32, true, QuantPacking::GptqV1)
inline QuantScheme gptq_scheme(int bits, int group, bool sym, QuantPacking packing, bool desc_act = false) {
    QuantScheme s;
    s.method = packing == QuantPacking::AwqGemm || packing == QuantPacking::AwqGemv ? QuantMethod::Awq : QuantMethod::Gptq;
    s.packing = packing;
    s.bits = bits;
    s.group_size = group;
    s.sym = sym;
    s.desc_act = desc_act;
    return s;
}
inline QuantScheme bnb_scheme(QuantPacking packing, bool double_quant) {
    QuantScheme s;
    s.method = QuantMethod::Bnb4;
    s.packing = packing;
    s.bits = 4;
    s.double_quant = double_quant;
    return s;
}

inline std::unique_ptr<OwnedLinear> make_quant_linear(const QuantScheme & s, int n, int k, uint64_t seed, uint64_t perm_seed = 7) {
    auto o = std::make_unique<OwnedLinear>();
    Linear & l = o->l;
    l.in_features = k;
    l.out_features = n;
    l.scheme = s;
    std::vector<float> w(size_t(n) * k);
    for (size_t i = 0; i < w.size(); i++) w[i] = normal_at(seed, i) / std::sqrt(float(k));
    o->bytes = quantize_linear(l, w, perm_seed, "bfloat16");
    auto slot = [&](const std::string & suffix, Weight & dst, DType t) {
        auto it = o->bytes.find(suffix);
        if (it == o->bytes.end()) return;
        dst.data = it->second.data();
        dst.dtype = t;
        dst.shape = {int64_t(it->second.size() / dtype_size(t))};
        dst.name = "test" + suffix;
    };
    slot(".qweight", l.qweight, DType::I32);
    slot(".qzeros", l.qzeros, DType::I32);
    slot(".scales", l.scales, DType::F16);
    slot(".g_idx", l.g_idx, DType::I32);
    slot(".weight", l.weight, DType::U8);
    slot(".weight.absmax", l.absmax, s.double_quant ? DType::U8 : DType::F32);
    slot(".weight.quant_map", l.quant_map, DType::F32);
    slot(".weight.nested_absmax", l.nested_absmax, DType::F32);
    slot(".weight.nested_quant_map", l.nested_quant_map, DType::F32);
    for (const auto & [suffix, b] : o->bytes) {
        if (suffix.find("quant_state") == std::string::npos) continue;
        auto j = nlohmann::json::parse(std::string(b.begin(), b.end()));
        if (j.contains("nested_offset")) l.nested_offset = j["nested_offset"].get<float>();
    }
    return o;
}

}  // namespace qinfer::test
