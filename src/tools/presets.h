// Model presets for `qinfer synth` and `qinfer bench --preset`: the published config.json of each model.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace qinfer {

struct Preset {
    std::string name;
    nlohmann::json config;             // config.json as published
    nlohmann::json generation_config;  // generation_config.json as published
    std::string tokenizer;             // folder under assets/tokenizers, or "" (tiny and Llama presets)
    int default_layers = 0;            // 0: the config's
};

const Preset & find_preset(const std::string & name);  // throws listing the names
std::vector<std::string> preset_names();

}  // namespace qinfer
