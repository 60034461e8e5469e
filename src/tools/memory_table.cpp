// qinfer memory-table: the seed's KV-cache memory tables (Qwen's "KV Cache Quantization Impact": batch-size scaling
// and sequence-length scaling, without and with a quantized cache) from `qinfer bench --json` rows.
#include <cstdio>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "core/check.h"
#include "tools/args.h"
#include "tools/commands.h"
#include "tools/plot.h"

namespace qinfer {

using json = nlohmann::json;

int cmd_memory_table(int argc, char ** argv) {
    for (int i = 2; i < argc; i++) {
        if (!std::strcmp(argv[i], "--help")) {
            std::printf(
                "usage: qinfer memory-table --json FILE[,FILE...] [--by batch|input_len] [--kv int8]\n"
                "peak GPU memory of bench rows in the seed's form: one table per model and weight format, a row per batch size\n"
                "(or input length), the bf16 cache against the --kv cache (default int8), the saving, and with --by batch the\n"
                "largest batch measured with each (rows of `qinfer bench --batch ... --kv-dtype ...`)\n");
            return 0;
        }
    }
    Args a(argc, argv, 2, {});
    const std::string files = a.required("json"), by = a.str("by", "batch"), kv = a.str("kv", "int8");
    a.check_unused();
    if (by != "batch" && by != "input_len") QINFER_FAIL() << "--by must be batch or input_len, got '" << by << "'";
    // (model, quant) -> x -> kv dtype -> peak GB
    std::map<std::pair<std::string, std::string>, std::map<int, std::map<std::string, double>>> peaks;
    std::map<std::pair<std::string, std::string>, std::set<std::string>> fixed;  // the other axis's values, to name them
    for (const auto & r : read_bench_rows(files, "--json")) {
        if (!r.is_object() || !r.contains("peak_gb") || !r["peak_gb"].is_number() || !r.contains(by) || !r[by].is_number_integer()) continue;
        const auto key = std::make_pair(r.value("model", "?"), r.value("quant", "?"));
        peaks[key][r[by].get<int>()][r.value("kv_dtype", "?")] = r["peak_gb"].get<double>();
        const std::string gen = std::to_string(r.value("gen_len", 0)) + " generated";
        fixed[key].insert(by == "batch" ? "input " + std::to_string(r.value("input_len", 0)) + ", " + gen
                                        : "batch " + std::to_string(r.value("batch", 1)) + ", " + gen);
    }
    if (peaks.empty()) QINFER_FAIL() << "no bench rows with peak_gb and " << by << " in " << files;
    for (const auto & [key, by_x] : peaks) {
        std::string others;
        for (const auto & o : fixed[key]) others += (others.empty() ? "" : "; ") + o;
        std::printf("\n%s, %s weights (%s):\n", key.first.c_str(), key.second.c_str(), others.c_str());
        std::printf("| %s | bf16 KV cache (GB) | %s KV cache (GB) | saving (GB) | saving %% |\n|---|---|---|---|---|\n",
                    by == "batch" ? "Batch Size" : "Input Length", kv.c_str());
        int largest_bf16 = 0, largest_q = 0;
        for (const auto & [x, m] : by_x) {
            const auto b = m.find("bf16"), q = m.find(kv);
            auto fmt = [](const char * f, double v) {
                char buf[32];
                std::snprintf(buf, sizeof buf, f, v);
                return std::string(buf);
            };
            auto cell = [&](std::map<std::string, double>::const_iterator it) { return it == m.end() ? std::string("-") : fmt("%.2f", it->second); };
            std::string saving = "-", pct = "-";
            if (b != m.end() && q != m.end()) {
                saving = fmt("%.2f", b->second - q->second);
                pct = fmt("%.0f%%", 100 * (b->second - q->second) / b->second);
            }
            if (b != m.end()) largest_bf16 = x;
            if (q != m.end()) largest_q = x;
            std::printf("| %d | %s | %s | %s | %s |\n", x, cell(b).c_str(), cell(q).c_str(), saving.c_str(), pct.c_str());
        }
        if (by == "batch") std::printf("largest batch measured: %d with the bf16 cache, %d with %s\n", largest_bf16, largest_q, kv.c_str());
    }
    return 0;
}

}  // namespace qinfer
