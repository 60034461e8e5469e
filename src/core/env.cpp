#include "core/env.h"

#include <cstdlib>

namespace qinfer {

namespace {
std::string str(const char * name) {
    const char * e = std::getenv(name);
    return e ? e : "";
}
int integer(const char * name) {
    const char * e = std::getenv(name);
    return e ? std::atoi(e) : 0;
}
}  // namespace

EnvSettings read_env() {
    EnvSettings s;
    s.cache_dir = str("QINFER_CACHE");
    if (s.cache_dir.empty()) {
        const std::string home = str("HOME");
        s.cache_dir = (home.empty() ? std::string("/tmp") : home) + "/.cache/qinfer";
    }
    s.assets_dir = str("QINFER_ASSETS");
    s.api_key = str("QINFER_API_KEY");
    s.commit = str("QINFER_COMMIT");
    s.profile = std::getenv("QINFER_PROFILE") != nullptr;
    const int ks = integer("QINFER_QKS");
    s.qgemv_k_parts = ks == 1 || ks == 2 || ks == 4 || ks == 8 ? ks : 0;
    const int chunk = integer("QINFER_PREFILL_CHUNK");
    s.prefill_chunk = chunk >= 128 && chunk % 128 == 0 ? chunk : 0;
    if (const char * t = std::getenv("QINFER_TP_TIMEOUT")) {
        const double v = std::atof(t);
        if (v > 0) s.tp_timeout_s = v;
    }
    return s;
}

const EnvSettings & env() {
    static const EnvSettings s = read_env();
    return s;
}

std::string env_knobs_json() {
    const EnvSettings & e = env();
    return "{\"QINFER_PROFILE\": " + std::string(e.profile ? "true" : "false") + ", \"QINFER_QKS\": " + std::to_string(e.qgemv_k_parts) +
           ", \"QINFER_PREFILL_CHUNK\": " + std::to_string(e.prefill_chunk) + "}";
}

}  // namespace qinfer
