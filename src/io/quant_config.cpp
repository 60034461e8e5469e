#include "io/quant_config.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <nlohmann/json.hpp>
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "core/check.h"
#include "io/json_reader.h"
#include "io/model_config.h"

namespace qinfer {

using json = nlohmann::json;
namespace fs = std::filesystem;

const char * quant_packing_name(QuantPacking p) {
    switch (p) {
    case QuantPacking::GptqV1: return "gptq";
    case QuantPacking::GptqV2: return "gptq_v2";
    case QuantPacking::AwqGemm: return "awq-gemm";
    case QuantPacking::AwqGemv: return "awq-gemv";
    case QuantPacking::Nf4: return "nf4";
    case QuantPacking::Fp4: return "fp4";
    }
    return "?";
}

int64_t awq_gemv_zeros_width(int64_t k, int group) {
    const int multiple = group >= 128 ? 1 : group == 64 ? 2 : group == 32 ? 4 : 0;
    if (multiple == 0) QINFER_FAIL() << "AWQ GEMV layout: group size " << group << " has no zeros layout (32, 64 or >= 128)";
    const int64_t words = (k / group + 7) / 8;
    return (words + multiple - 1) / multiple * multiple;
}

std::string QuantScheme::describe() const {
    if (!quantized()) return "unquantized";
    if (method == QuantMethod::Bnb4) {
        return std::string("bitsandbytes ") + quant_packing_name(packing) + (double_quant ? " double-quant" : "");
    }
    std::string s = method == QuantMethod::Awq ? "awq" : "gptq";
    s += " int" + std::to_string(bits) + " g" + std::to_string(group_size) + (sym ? " sym" : " asym");
    if (desc_act) s += " act-order";
    s += std::string(" (") + quant_packing_name(packing) + ")";
    return s;
}

namespace {

// A pattern from the file, shown in errors only when it is short and printable (errors are one line).
std::string shown(const std::string & pattern) {
    const bool printable = std::all_of(pattern.begin(), pattern.end(), [](char ch) { return ch >= 0x20 && ch < 0x7f; });
    if (printable && pattern.size() <= 80) return "'" + pattern + "'";
    std::string bytes = "(";  // appended, not "(" + temporary: GCC 12 warned (-Wrestrict) on that form
    bytes += std::to_string(pattern.size());
    bytes += " bytes)";
    return bytes;
}


std::string lower(std::string s) {
    std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return char(std::tolower(c)); });
    return s;
}


void check_int_scheme(const QuantScheme & s, const std::string & what, const std::string & module) {
    const std::string where = module.empty() ? what : what + " (" + module + ")";
    if (s.method == QuantMethod::Awq && s.bits != 4) QINFER_FAIL() << where << ": AWQ checkpoints are 4-bit, not " << s.bits << "-bit";
    if (s.bits != 2 && s.bits != 3 && s.bits != 4 && s.bits != 8) {
        QINFER_FAIL() << where << ": " << s.bits << "-bit GPTQ is not supported (2, 3, 4, 8)";
    }
    if (s.group_size != -1 && (s.group_size <= 0 || s.group_size > (1 << 20))) {
        QINFER_FAIL() << where << ": group_size " << s.group_size << " is not supported (-1 or a positive size)";
    }
}

// Fields of an override object (GPTQModel dynamic, AutoRound extra_config).
QuantConfig::Override parse_override(const std::string & pattern, const json & v, const std::string & what) {
    QuantConfig::Override o;
    if (pattern.size() > 1024) QINFER_FAIL() << what << ": override pattern of " << pattern.size() << " characters (1024 at most)";
    o.pattern = pattern;
    if (!v.is_object()) QINFER_FAIL() << what << ": the override for " << shown(pattern) << " must be an object";
    JsonReader rd{v, what};
    o.bits = rd.get_signed_int_or("bits", 0);
    if (o.bits >= 16) o.skip = true;  // AutoRound writes bits 16 for layers it left in full precision
    o.group_size = rd.get_signed_int_or("group_size", 0);
    if (rd.has("sym")) o.sym = rd.get_bool_or("sym", true) ? 1 : 0;
    if (rd.has("desc_act")) o.desc_act = rd.get_bool_or("desc_act", false) ? 1 : 0;
    return o;
}

}  // namespace

namespace {

// Python's re.match: the pattern must match at the start of the name. PCRE2, with match limits, because the
// pattern comes from the checkpoint (std::regex has undefined behaviour on hostile patterns).
bool matches_at_start(const std::string & pattern, const std::string & name, const std::string & what) {
    int err = 0;
    PCRE2_SIZE offset = 0;
    pcre2_code * re = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_ANCHORED, &err, &offset, nullptr);
    if (!re) QINFER_FAIL() << what << ": override pattern " << shown(pattern) << " is not a valid regular expression";
    pcre2_match_data * md = pcre2_match_data_create_from_pattern(re, nullptr);
    pcre2_match_context * mc = pcre2_match_context_create(nullptr);
    pcre2_set_match_limit(mc, 100000);
    pcre2_set_depth_limit(mc, 1000);
    const int rc = pcre2_match(re, reinterpret_cast<PCRE2_SPTR>(name.data()), name.size(), 0, 0, md, mc);
    pcre2_match_context_free(mc);
    pcre2_match_data_free(md);
    pcre2_code_free(re);
    if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) QINFER_FAIL() << what << ": override pattern " << shown(pattern) << " cannot be matched (" << rc << ")";
    return rc >= 0;
}

}  // namespace

QuantScheme QuantConfig::scheme_for(const std::string & module) const {
    QuantScheme none;
    if (!quantized()) return none;
    for (const auto & s : skip_modules) {
        if (!s.empty() && module.find(s) != std::string::npos) return none;
    }
    QuantScheme s = base;
    for (const auto & o : overrides) {
        if (o.pattern != module && !matches_at_start(o.pattern, module, source)) continue;
        if (o.skip) return none;
        if (o.bits) s.bits = o.bits;
        if (o.group_size) s.group_size = o.group_size;
        if (o.sym >= 0) s.sym = o.sym == 1;
        if (o.desc_act >= 0) s.desc_act = o.desc_act == 1;
        check_int_scheme(s, source, module);
        break;
    }
    return s;
}

QuantConfig parse_quant_config(const std::string & text, const std::string & what) {
    json j = json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object()) QINFER_FAIL() << what << ": quantization config is not a JSON object";
    JsonReader rd{j, what};
    QuantConfig q;
    q.source = what;
    QuantScheme & s = q.base;
    std::string method = lower(rd.get_str_or("quant_method", ""));
    // AutoGPTQ's quantize_config.json has no quant_method; AutoAWQ's quant_config.json has w_bit.
    if (method.empty()) method = rd.has("w_bit") || rd.has("zero_point") ? "awq" : "gptq";
    s.bits = rd.get_signed_int_or("bits", rd.get_signed_int_or("w_bit", 4));
    s.group_size = rd.get_signed_int_or("group_size", rd.get_signed_int_or("q_group_size", 128));
    s.sym = rd.get_bool_or("sym", true);
    s.desc_act = rd.get_bool_or("desc_act", false);

    if (method == "gptq") {
        s.method = QuantMethod::Gptq;
        if (rd.get_bool_or("is_marlin_format", false)) QINFER_FAIL() << what << ": Marlin-format GPTQ checkpoints are not supported";
        std::string fmt = lower(rd.get_str_or("checkpoint_format", "gptq"));
        if (fmt == "gptq") {
            s.packing = QuantPacking::GptqV1;
        } else if (fmt == "gptq_v2") {
            s.packing = QuantPacking::GptqV2;
        } else {
            QINFER_FAIL() << what << ": GPTQ checkpoint_format '" << fmt << "' is not supported (gptq, gptq_v2)";
        }
        q.lm_head = rd.get_bool_or("lm_head", false);
        if (rd.has("dynamic")) {
            if (!j["dynamic"].is_object()) QINFER_FAIL() << what << ": 'dynamic' must be an object";
            for (const auto & [key, v] : j["dynamic"].items()) {
                std::string pattern = key;
                bool skip = false;
                if (pattern.rfind("-:", 0) == 0) {
                    skip = true;
                    pattern = pattern.substr(2);
                } else if (pattern.rfind("+:", 0) == 0) {
                    pattern = pattern.substr(2);
                }
                QuantConfig::Override o = parse_override(pattern, v.is_object() ? v : json::object(), what);
                o.skip = o.skip || skip;
                q.overrides.push_back(o);
            }
        }
        q.skip_modules = rd.get_strs("modules_to_not_convert");
    } else if (method == "awq") {
        s.method = QuantMethod::Awq;
        std::string version = lower(rd.get_str_or("version", "gemm"));
        if (version == "gemm") {
            s.packing = QuantPacking::AwqGemm;
        } else if (version == "gemv") {
            s.packing = QuantPacking::AwqGemv;
        } else {
            QINFER_FAIL() << what << ": AWQ version '" << version << "' is not supported (gemm, gemv)";
        }
        if (!rd.get_bool_or("zero_point", true)) QINFER_FAIL() << what << ": AWQ without zero points is not supported";
        s.sym = false;
        q.skip_modules = rd.get_strs("modules_to_not_convert");
    } else if (method == "auto-round" || method == "intel/auto-round") {
        std::string packing = lower(rd.get_str_or("packing_format", rd.get_str_or("backend", "auto_round")));
        if (packing == "auto_round:auto_gptq" || packing == "auto_gptq" || packing == "auto_round:gptq") {
            s.method = QuantMethod::Gptq;
            s.packing = QuantPacking::GptqV1;
        } else if (packing == "auto_round:auto_awq" || packing == "auto_awq" || packing == "auto_round:awq") {
            s.method = QuantMethod::Awq;
            s.packing = QuantPacking::AwqGemm;
        } else if (packing == "auto_round") {
            s.method = QuantMethod::Gptq;
            s.packing = QuantPacking::GptqV2;
        } else {
            QINFER_FAIL() << what << ": AutoRound packing_format '" << packing
                          << "' is not supported (auto_round, auto_round:auto_gptq, auto_round:auto_awq)";
        }
        std::string data_type = lower(rd.get_str_or("data_type", "int"));
        if (data_type != "int") QINFER_FAIL() << what << ": AutoRound data_type '" << data_type << "' is not supported (int)";
        if (rd.has("extra_config")) {
            if (!j["extra_config"].is_object()) QINFER_FAIL() << what << ": 'extra_config' must be an object";
            for (const auto & [key, v] : j["extra_config"].items()) q.overrides.push_back(parse_override(key, v, what));
        }
        q.skip_modules = rd.get_strs("modules_to_not_convert");
    } else if (method == "bitsandbytes") {
        if (rd.get_bool_or("load_in_8bit", false)) QINFER_FAIL() << what << ": bitsandbytes 8-bit (LLM.int8) checkpoints are not supported";
        if (!rd.get_bool_or("load_in_4bit", false)) QINFER_FAIL() << what << ": bitsandbytes config without load_in_4bit";
        s = QuantScheme{};
        s.method = QuantMethod::Bnb4;
        s.bits = 4;
        std::string type = lower(rd.get_str_or("bnb_4bit_quant_type", "fp4"));
        if (type == "nf4") {
            s.packing = QuantPacking::Nf4;
        } else if (type == "fp4") {
            s.packing = QuantPacking::Fp4;
        } else {
            QINFER_FAIL() << what << ": bnb_4bit_quant_type '" << type << "' is not supported (nf4, fp4)";
        }
        s.double_quant = rd.get_bool_or("bnb_4bit_use_double_quant", false);
        std::string storage = lower(rd.get_str_or("bnb_4bit_quant_storage", "uint8"));
        if (storage != "uint8") QINFER_FAIL() << what << ": bnb_4bit_quant_storage '" << storage << "' is not supported (uint8)";
        q.skip_modules = rd.get_strs("llm_int8_skip_modules");
        q.label = s.packing == QuantPacking::Nf4 ? "NF4" : "FP4";
        return q;
    } else {
        QINFER_FAIL() << what << ": quant_method '" << method << "' is not supported (gptq, awq, auto-round, bitsandbytes)";
    }
    check_int_scheme(s, what, "");
    const std::string bits = std::to_string(s.bits);
    q.label = method == "awq" ? "AWQ" : method == "gptq" ? "GPTQ-Int" + bits : "AutoRound-Int" + bits;
    if (q.lm_head) QINFER_FAIL() << what << ": a quantized lm_head (lm_head: true) is not supported";
    return q;
}

QuantConfig load_quant_config(const std::string & dir, const std::string & config_json_text) {
    json j = json::parse(config_json_text, nullptr, false);
    if (j.is_object() && j.contains("quantization_config") && !j["quantization_config"].is_null()) {
        return parse_quant_config(j["quantization_config"].dump(), (fs::path(dir) / "config.json").string() + " quantization_config");
    }
    for (const char * name : {"quantize_config.json", "quant_config.json"}) {
        fs::path p = fs::path(dir) / name;
        if (fs::exists(p)) return parse_quant_config(read_text_file(p.string()), p.string());
    }
    return QuantConfig{};
}

}  // namespace qinfer
