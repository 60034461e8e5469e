// Every QINFER_* environment variable qinfer reads, in one place (docs/tuning.md lists them with their defaults).
// Kernel selection is not among them: each concluded A/B kept one path, with its evidence in bench/results and git
// history. What is left: settings a user needs (QINFER_CACHE, QINFER_ASSETS, QINFER_API_KEY, QINFER_COMMIT, QINFER_TP_TIMEOUT) and the
// few knobs a kernel developer still times (QINFER_PROFILE, QINFER_QKS, QINFER_PREFILL_CHUNK).
#pragma once

#include <string>

namespace qinfer {

struct EnvSettings {
    std::string cache_dir;   // QINFER_CACHE: synthetic checkpoints and tokenizer caches (default ~/.cache/qinfer)
    std::string assets_dir;  // QINFER_ASSETS: the tokenizer files `synth` copies (default: the source tree's assets/)
    std::string api_key;     // QINFER_API_KEY: `serve`'s bearer key when --api-key is not given
    std::string commit;      // QINFER_COMMIT: the commit bench rows name where the tree travels without .git
    bool profile = false;    // QINFER_PROFILE: per-op GPU times of each prefill and the first decode step after it
    int qgemv_k_parts = 0;   // QINFER_QKS=1|2|4|8: warps per row group of the quantized GEMVs (0: the launch rule)
    int prefill_chunk = 0;   // QINFER_PREFILL_CHUNK: tokens per CUDA prefill pass, a multiple of 128 (0: the rule)
    double tp_timeout_s = 600;  // QINFER_TP_TIMEOUT: seconds a tensor-parallel call of the GPUs may take before its
                                // collectives are aborted (a rank or node that stopped answering)
};

// The variables as they are now (tests set QINFER_CACHE while running).
EnvSettings read_env();
// The variables as they were at first use: what kernels and launch rules read.
const EnvSettings & env();
// The kernel knobs as a JSON object's text ({"QINFER_QKS": 0, ...}), recorded in each bench row.
std::string env_knobs_json();

}  // namespace qinfer
