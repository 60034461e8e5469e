#include "tools/synth_quant.h"

#include "core/check.h"
#include "tools/args.h"

namespace qinfer {

using json = nlohmann::json;

const char * synth_quant_kinds() { return "gptq-int2, gptq-int3, gptq-int4, gptq-int8, awq, awq-gemv, autoround-sym, autoround-asym, nf4, fp4"; }

SynthQuant synth_quant_from_args(const Args & a) {
    SynthQuant q;
    q.kind = a.str("quant");
    q.group_size = int(a.integer("group-size", 128));
    q.desc_act = a.flag("desc-act");
    q.gptq_format = a.str("gptq-format", "v1");
    if (a.flag("asym")) q.sym = 0;
    q.double_quant = a.flag("double-quant");
    if (q.kind.empty() && (a.has("group-size") || q.desc_act || a.has("gptq-format") || q.sym == 0 || q.double_quant)) {
        QINFER_FAIL() << "--group-size, --desc-act, --gptq-format, --asym and --double-quant need --quant";
    }
    if (q.kind == "bf16") q.kind.clear();
    if (!q.kind.empty()) synth_quant_config(q);  // validates
    return q;
}

json synth_quant_config(const SynthQuant & q) {
    if (q.group_size != -1 && q.group_size <= 0) QINFER_FAIL() << "--group-size must be -1 or positive, got " << q.group_size;
    if (q.gptq_format != "v1" && q.gptq_format != "v2") QINFER_FAIL() << "--gptq-format must be v1 or v2, got '" << q.gptq_format << "'";
    const bool gptq = q.kind.rfind("gptq-int", 0) == 0;
    if (q.desc_act && !gptq) QINFER_FAIL() << "--desc-act applies to GPTQ checkpoints only";
    if (gptq) {
        const std::string b = q.kind.substr(8);
        if (b != "2" && b != "3" && b != "4" && b != "8") QINFER_FAIL() << "unknown --quant '" << q.kind << "' (" << synth_quant_kinds() << ")";
        json c = {{"quant_method", "gptq"}, {"bits", std::stoi(b)}, {"group_size", q.group_size}, {"desc_act", q.desc_act},
                  {"sym", q.sym != 0}, {"damp_percent", 0.01}, {"static_groups", false}, {"true_sequential", true}};
        if (q.gptq_format == "v2") {
            c["checkpoint_format"] = "gptq_v2";
            c["pack_dtype"] = "int32";
            c["meta"] = {{"quantizer", {"gptqmodel (qinfer synth, round-to-nearest)"}}};
        } else {
            c["checkpoint_format"] = "gptq";
            c["use_exllama"] = true;
            c["exllama_config"] = {{"version", 1}};
        }
        return c;
    }
    if (q.kind == "awq" || q.kind == "awq-gemv") {
        return {{"quant_method", "awq"}, {"bits", 4}, {"group_size", q.group_size}, {"zero_point", true},
                {"version", q.kind == "awq" ? "gemm" : "gemv"}, {"modules_to_not_convert", nullptr}};
    }
    if (q.kind == "autoround-sym" || q.kind == "autoround-asym") {
        const bool sym = q.kind == "autoround-sym";
        return {{"quant_method", "auto-round"}, {"packing_format", sym ? "auto_round:auto_gptq" : "auto_round:auto_awq"},
                {"bits", 4}, {"group_size", q.group_size}, {"sym", sym}, {"data_type", "int"}, {"iters", 0},
                {"autoround_version", "qinfer synth (round-to-nearest)"}};
    }
    if (q.kind == "nf4" || q.kind == "fp4") {
        return {{"quant_method", "bitsandbytes"}, {"load_in_4bit", true}, {"load_in_8bit", false}, {"bnb_4bit_quant_type", q.kind},
                {"bnb_4bit_use_double_quant", q.double_quant}, {"bnb_4bit_compute_dtype", "bfloat16"},
                {"bnb_4bit_quant_storage", "uint8"}, {"llm_int8_skip_modules", nullptr}};
    }
    QINFER_FAIL() << "unknown --quant '" << q.kind << "' (" << synth_quant_kinds() << ")";
}

}  // namespace qinfer
