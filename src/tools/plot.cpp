#include "tools/plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <vector>

#include "core/check.h"
#include "tools/args.h"
#include "tools/commands.h"

#ifdef QINFER_HAVE_GD
#include <gd.h>
#include <gdfontmb.h>
#include <gdfonts.h>
#endif

namespace qinfer {

#ifdef QINFER_HAVE_GD

namespace {

const char * axis_label(const std::string & field) {
    if (field == "input_len") return "input length (tokens)";
    if (field == "batch") return "batch size";
    if (field == "mb") return "bytes read (MB)";
    if (field == "tb_per_s") return "read bandwidth (TB/s)";
    if (field == "us") return "time (us)";
    if (field == "tok_s") return "tokens/s (generated tokens / whole time, prefill included)";
    if (field == "decode_tok_s") return "decode tokens/s";
    if (field == "ttft_s") return "time to first token (s)";
    if (field == "peak_gb") return "peak GPU memory (GB)";
    return nullptr;
}

struct Series {
    std::string name;
    std::vector<std::pair<double, double>> points;  // (x, y), sorted by x
};

// A row's value of `field` ("mb": its "bytes" in millions), or NaN where it has none.
double field_of(const nlohmann::json & r, const std::string & field) {
    const std::string name = field == "mb" ? "bytes" : field;
    if (!r.contains(name) || !r[name].is_number()) return NAN;
    return r[name].get<double>() / (field == "mb" ? 1e6 : 1.0);
}

// Rows grouped into lines: everything that identifies a configuration except the x field (`bench --bandwidth` rows:
// the probe).
std::vector<Series> series_of(const nlohmann::json & rows, const PlotOptions & opt) {
    std::map<std::string, Series> by_key;
    for (const auto & r : rows) {
        if (!r.is_object() || r.contains("skipped")) continue;
        const double x = field_of(r, opt.x), y = field_of(r, opt.y);
        if (std::isnan(x) || std::isnan(y)) continue;
        std::string key;
        if (r.contains("probe")) {
            key = r.value("probe", "?");
        } else {
            key = r.value("model", "?") + " " + r.value("quant", "?") + ", kv " + r.value("kv_dtype", "?");
            if (opt.x != "batch" && r.value("batch", 1) != 1) key += ", batch " + std::to_string(r.value("batch", 1));
            if (opt.x != "input_len") key += ", input " + std::to_string(r.value("input_len", 0));
        }
        Series & s = by_key[key];
        s.name = key;
        s.points.emplace_back(x, y);
    }
    std::vector<Series> out;
    for (auto & [k, s] : by_key) {
        std::sort(s.points.begin(), s.points.end());
        out.push_back(std::move(s));
    }
    return out;
}

// A step of 1, 2 or 5 times a power of ten giving about `n` intervals over [0, hi].
double nice_step(double hi, int n) {
    const double raw = hi / n, p = std::pow(10.0, std::floor(std::log10(raw)));
    for (double m : {1.0, 2.0, 5.0, 10.0}) {
        if (m * p >= raw) return m * p;
    }
    return 10 * p;
}

std::string short_number(double v) {
    char buf[32];
    if (v >= 1e4 && std::fmod(v, 1024) == 0) std::snprintf(buf, sizeof buf, "%gK", v / 1024);
    else std::snprintf(buf, sizeof buf, "%g", v);
    return buf;
}

}  // namespace

bool plot_available() { return true; }

void plot_rows(const nlohmann::json & rows, const PlotOptions & opt, const std::string & png_path) {
    if (opt.x != "input_len" && opt.x != "batch" && opt.x != "mb") QINFER_FAIL() << "plot: x must be input_len, batch or mb, got '" << opt.x << "'";
    if (!axis_label(opt.y) || opt.y == "input_len" || opt.y == "batch" || opt.y == "mb") {
        QINFER_FAIL() << "plot: y must be tok_s, decode_tok_s, ttft_s, peak_gb, tb_per_s or us, got '" << opt.y << "'";
    }
    if (!rows.is_array()) QINFER_FAIL() << "plot: the benchmark results must be a JSON array of rows";
    const std::vector<Series> series = series_of(rows, opt);
    if (series.empty()) QINFER_FAIL() << "plot: no rows with numeric " << opt.x << " and " << opt.y;

    double x_lo = INFINITY, x_hi = -INFINITY, y_hi = 0;
    std::set<double> xs;
    for (const Series & s : series) {
        for (auto [x, y] : s.points) {
            x_lo = std::min(x_lo, x);
            x_hi = std::max(x_hi, x);
            y_hi = std::max(y_hi, y);
            xs.insert(x);
        }
    }
    // Input lengths span 1 to 128K: a log axis once the range passes 20x.
    const bool log_x = x_lo > 0 && x_hi / x_lo > 20;
    const double fx_lo = log_x ? std::log2(x_lo) : std::min(0.0, x_lo), fx_hi = log_x ? std::log2(x_hi) : x_hi;
    const double y_step = nice_step(y_hi > 0 ? y_hi * 1.05 : 1, 6), y_top = std::ceil((y_hi > 0 ? y_hi * 1.05 : 1) / y_step) * y_step;

    const int W = 960, H = 560, left = 80, right = 300, top = 44, bottom = 64;
    const int pw = W - left - right, ph = H - top - bottom;
    gdImagePtr im = gdImageCreateTrueColor(W, H);
    const int white = gdTrueColor(255, 255, 255), black = gdTrueColor(30, 30, 30), grid = gdTrueColor(225, 225, 225);
    const int palette[] = {gdTrueColor(31, 119, 180), gdTrueColor(214, 39, 40), gdTrueColor(44, 160, 44), gdTrueColor(255, 127, 14),
                           gdTrueColor(148, 103, 189), gdTrueColor(140, 86, 75), gdTrueColor(227, 119, 194), gdTrueColor(23, 190, 207)};
    gdImageFilledRectangle(im, 0, 0, W - 1, H - 1, white);
    gdFontPtr small = gdFontGetSmall(), bold = gdFontGetMediumBold();
    auto text = [&](gdFontPtr f, int x, int y, const std::string & s, int color) {
        gdImageString(im, f, x, y, reinterpret_cast<unsigned char *>(const_cast<char *>(s.c_str())), color);
    };
    auto px = [&](double x) {
        const double f = log_x ? std::log2(x) : x;
        return left + int(std::lround(fx_hi > fx_lo ? (f - fx_lo) / (fx_hi - fx_lo) * pw : pw / 2.0));
    };
    auto py = [&](double y) { return top + ph - int(std::lround(y / y_top * ph)); };

    for (double y = 0; y <= y_top * 1.0001; y += y_step) {
        gdImageLine(im, left, py(y), left + pw, py(y), grid);
        const std::string s = short_number(y);
        text(small, left - 8 - int(s.size()) * small->w, py(y) - small->h / 2, s, black);
    }
    // x ticks at the measured values when there are few, else at powers of two or even steps.
    std::vector<double> ticks(xs.begin(), xs.end());
    if (ticks.size() > 12) {
        ticks.clear();
        if (log_x) {
            for (double t = std::exp2(std::ceil(std::log2(x_lo))); t <= x_hi; t *= 4) ticks.push_back(t);
        } else {
            const double st = nice_step(x_hi, 8);
            for (double t = 0; t <= x_hi; t += st) ticks.push_back(t);
        }
    }
    int last_label_end = -1000;
    for (double t : ticks) {
        gdImageLine(im, px(t), top, px(t), top + ph, grid);
        const std::string s = short_number(t);
        const int x0 = px(t) - int(s.size()) * small->w / 2;
        if (x0 > last_label_end + 4) {
            text(small, x0, top + ph + 6, s, black);
            last_label_end = x0 + int(s.size()) * small->w;
        }
    }
    gdImageRectangle(im, left, top, left + pw, top + ph, black);
    const std::string xl = std::string(axis_label(opt.x)) + (log_x ? " (log scale)" : "");
    text(small, left + pw / 2 - int(xl.size()) * small->w / 2, top + ph + 28, xl, black);
    const std::string yl = axis_label(opt.y);
    gdImageStringUp(im, small, 12, top + ph / 2 + int(yl.size()) * small->w / 2, reinterpret_cast<unsigned char *>(const_cast<char *>(yl.c_str())),
                    black);
    const std::string title = opt.title.empty() ? "qinfer bench" : opt.title;
    text(bold, left, 14, title, black);

    gdImageSetThickness(im, 2);
    for (size_t i = 0; i < series.size(); i++) {
        const int color = palette[i % (sizeof palette / sizeof palette[0])];
        const auto & pts = series[i].points;
        for (size_t j = 0; j < pts.size(); j++) {
            const int x = px(pts[j].first), y = py(pts[j].second);
            gdImageFilledRectangle(im, x - 3, y - 3, x + 3, y + 3, color);
            if (j > 0) gdImageLine(im, px(pts[j - 1].first), py(pts[j - 1].second), x, y, color);
        }
        const int ly = top + 8 + int(i) * 18;
        gdImageLine(im, left + pw + 14, ly + small->h / 2, left + pw + 34, ly + small->h / 2, color);
        std::string name = series[i].name;
        const size_t max_chars = size_t((right - 44) / small->w);
        if (name.size() > max_chars) name = name.substr(0, max_chars - 2) + "..";
        text(small, left + pw + 40, ly, name, black);
    }
    gdImageSetThickness(im, 1);

    FILE * f = std::fopen(png_path.c_str(), "wb");
    if (!f) {
        gdImageDestroy(im);
        QINFER_FAIL() << "plot: cannot write " << png_path;
    }
    gdImagePng(im, f);
    const bool failed = std::ferror(f) != 0;
    std::fclose(f);
    gdImageDestroy(im);
    if (failed) QINFER_FAIL() << "plot: writing " << png_path << " failed";
}

#else

bool plot_available() { return false; }

void plot_rows(const nlohmann::json &, const PlotOptions &, const std::string & png_path) {
    QINFER_FAIL() << "plot: this qinfer was built without libgd (apt-get install libgd-dev, then rebuild) and cannot write " << png_path;
}

#endif

nlohmann::json read_bench_rows(const std::string & paths, const std::string & option) {
    nlohmann::json rows = nlohmann::json::array();
    for (std::string rest = paths; !rest.empty();) {
        const size_t comma = rest.find(',');
        const std::string path = rest.substr(0, comma);
        rest = comma == std::string::npos ? "" : rest.substr(comma + 1);
        std::ifstream in(path);
        if (!in) QINFER_FAIL() << option << " " << path << ": cannot open";
        nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
        if (j.is_object() && j.contains("rows")) j = j["rows"];  // bench --kernels / --bandwidth: rows under a header
        if (j.is_discarded() || !j.is_array()) QINFER_FAIL() << option << " " << path << ": not a JSON array of bench rows";
        for (auto & r : j) rows.push_back(std::move(r));
    }
    return rows;
}

int cmd_plot(int argc, char ** argv) {
    for (int i = 2; i < argc; i++) {
        if (!std::strcmp(argv[i], "--help")) {
            std::printf(
                "usage: qinfer plot --json FILE[,FILE...] --out FILE.png [--x input_len|batch|mb] [--y tok_s|decode_tok_s|ttft_s|peak_gb|tb_per_s|us]\n"
                "                   [--title TEXT]\n"
                "draws the rows of `qinfer bench --json` files: one line per model, quantization, KV cache and batch (or input\n"
                "length); `bench --bandwidth --json` files one line per probe (--x mb --y tb_per_s); the x axis turns\n"
                "logarithmic when its values span more than 20x\n");
            return 0;
        }
    }
    Args a(argc, argv, 2, {});
    PlotOptions opt;
    opt.x = a.str("x", "input_len");
    opt.y = a.str("y", "tok_s");
    opt.title = a.str("title");
    const std::string files = a.required("json"), out = a.required("out");
    a.check_unused();
    plot_rows(read_bench_rows(files, "--json"), opt, out);
    std::fprintf(stderr, "plot: %s\n", out.c_str());
    return 0;
}

}  // namespace qinfer
