// Line charts of benchmark rows as PNG (libgd): speed or memory against input length or batch size, one line per
// (model, quantization, KV cache, batch or input length) series.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace qinfer {

struct PlotOptions {
    std::string x = "input_len";  // input_len | batch | mb (bench --bandwidth rows)
    std::string y = "tok_s";      // tok_s | decode_tok_s | ttft_s | peak_gb | tb_per_s | us
    std::string title;
};

// rows: bench JSON rows (qinfer bench --json, or several concatenated); skipped rows are left out. Throws when
// nothing can be drawn, the fields are unknown, or this qinfer was built without libgd.
void plot_rows(const nlohmann::json & rows, const PlotOptions & opt, const std::string & png_path);

bool plot_available();

// The rows of bench JSON files ("a.json,b.json": each a JSON array), concatenated; `option` names the flag in errors.
nlohmann::json read_bench_rows(const std::string & paths, const std::string & option);

}  // namespace qinfer
