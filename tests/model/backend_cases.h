// What the backend-parametrised model tests share: a case (preset, backend, KV dtype), its gtest name, and the tiny
// fp32 synthetic checkpoint of a preset, written once per test binary and tag.
#pragma once

#include <gtest/gtest.h>

#include <cctype>
#include <map>
#include <ostream>
#include <string>

#include "tools/synth.h"
#include "unit/test_helpers.h"

namespace qinfer::test {

struct BackendCase {
    std::string preset, backend, kv_dtype;
};
inline void PrintTo(const BackendCase & c, std::ostream * os) { *os << c.preset << "/" << c.backend << "/kv " << c.kv_dtype; }

inline std::string backend_case_name(const ::testing::TestParamInfo<BackendCase> & info) {
    std::string n = info.param.preset + "_" + info.param.backend + "_" + info.param.kv_dtype;
    for (char & ch : n) {
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
    }
    return n;
}

inline std::string synth_once(const std::string & tag, const std::string & preset, uint64_t seed) {
    static std::map<std::string, std::string> dirs;
    const std::string key = tag + "-" + preset;
    auto it = dirs.find(key);
    if (it != dirs.end()) return it->second;
    SynthOptions o;
    o.preset = preset;
    o.out_dir = temp_dir(key);
    o.seed = seed;
    o.dtype = DType::F32;
    o.dtype_given = true;
    o.quiet = true;
    synthesize(o);
    return dirs[key] = o.out_dir;
}

// A quantized synthetic checkpoint of `preset` in its own folder temp_dir(name): `kind` (gptq-int4, gptq-int8, awq,
// ...) with groups of `group`, act-order where `desc_act`.
inline std::string synth_quant(const std::string & name, const std::string & preset, const std::string & kind, int group, bool desc_act,
                               uint64_t seed) {
    SynthOptions o;
    o.preset = preset;
    o.out_dir = temp_dir(name);
    o.seed = seed;
    o.quiet = true;
    o.quant.kind = kind;
    o.quant.group_size = group;
    o.quant.desc_act = desc_act;
    synthesize(o);
    return o.out_dir;
}

}  // namespace qinfer::test
