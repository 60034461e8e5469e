// qinfer kv-fidelity: how far a quantized KV cache moves the next-token distributions from a reference cache on the
// same weights. The reference engine generates `positions` greedy tokens after a fixed prompt; then the reference and
// each quantized-cache engine run that sequence teacher-forced, chunk by chunk in lockstep, and every generated
// position's distributions are compared: KL(reference || quantized) in nats and top-1 agreement.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "core/progress.h"
#include "core/rng.h"
#include "runtime/engine.h"
#include "runtime/generate.h"
#include "runtime/kv_cache.h"
#include "tools/args.h"
#include "tools/commands.h"
#include "tools/synth.h"

namespace qinfer {

namespace {

struct Fidelity {
    std::string dtype;
    int positions = 0;
    double mean_kl = 0, max_kl = 0, top1 = 0;
};

// log-softmax of one row, in double.
void log_softmax(const float * x, int n, std::vector<double> & out) {
    out.resize(size_t(n));
    const double mx = *std::max_element(x, x + n);
    double sum = 0;
    for (int i = 0; i < n; i++) sum += std::exp(double(x[i]) - mx);
    const double lse = mx + std::log(sum);
    for (int i = 0; i < n; i++) out[size_t(i)] = double(x[i]) - lse;
}

}  // namespace

int cmd_kv_fidelity(int argc, char ** argv) {
    for (int i = 2; i < argc; i++) {
        if (!std::strcmp(argv[i], "--help")) {
            std::printf("usage: qinfer kv-fidelity (--model DIR | --preset NAME [--layers N]) [--kv-dtypes fp8,int8,int4]\n"
                        "                          [--reference bf16] [--positions 1024] [--prompt-len 64] [--threads N] [--json FILE]\n"
                        "runs on the CPU backend (the reference for every cache dtype)\n");
            return 0;
        }
    }
    Args a(argc, argv, 2, {});
    std::string dir = a.str("model");
    const std::string preset = a.str("preset");
    const int layers = int(a.integer("layers", 0));
    std::vector<std::string> dtypes;
    for (std::string s = a.str("kv-dtypes", "fp8,int8,int4"); !s.empty();) {
        const size_t comma = s.find(',');
        dtypes.push_back(s.substr(0, comma));
        s = comma == std::string::npos ? "" : s.substr(comma + 1);
    }
    const std::string reference = a.str("reference", "bf16");
    const int positions = int(a.integer("positions", 1024));
    const int prompt_len = int(a.integer("prompt-len", 64));
    const std::string json_path = a.str("json");
    EngineOptions eo;
    eo.backend = "cpu";
    eo.threads = int(a.integer("threads", 0));
    a.check_unused();
    if (dir.empty() == preset.empty()) QINFER_FAIL() << "give --model DIR or --preset NAME";
    if (positions < 1 || prompt_len < 1) QINFER_FAIL() << "--positions and --prompt-len must be >= 1";
    parse_kv_dtype(reference);
    for (const auto & d : dtypes) parse_kv_dtype(d);
    if (dir.empty()) dir = ensure_synth(preset, layers, DType::BF16);
    eo.max_context = prompt_len + positions;

    eo.kv_dtype = reference;
    auto ref = make_engine(dir, eo);
    const ModelConfig & c = ref->config();
    if (prompt_len + positions > c.max_context()) QINFER_FAIL() << prompt_len + positions << " tokens exceed the model's context of " << c.max_context();
    const int V = c.vocab_size;
    std::vector<int> prompt(static_cast<size_t>(prompt_len));
    for (int i = 0; i < prompt_len; i++) prompt[size_t(i)] = int(splitmix64(uint64_t(i) * 7919 + 17) % uint64_t(std::min(V, 151643)));
    GenerateOptions g;
    g.max_new_tokens = positions;
    g.ignore_eos = true;
    std::fprintf(stderr, "kv-fidelity: %d greedy tokens with the %s cache\n", positions, reference.c_str());
    const GenerateResult gen = generate(*ref, prompt, g);
    // Teacher-forced sequence: the prompt and every generated token but the last; rows prompt_len - 1 .. end are the
    // `positions` generated positions.
    std::vector<int> seq = prompt;
    seq.insert(seq.end(), gen.tokens.begin(), gen.tokens.end() - 1);

    std::vector<std::unique_ptr<Engine>> engines;
    for (const auto & d : dtypes) {
        eo.kv_dtype = d;
        engines.push_back(make_engine(dir, eo));
    }
    std::vector<Fidelity> out(dtypes.size());
    std::vector<int> ids(dtypes.size() + 1);
    ids[0] = ref->new_sequence(int(seq.size()));
    for (size_t e = 0; e < engines.size(); e++) ids[e + 1] = engines[e]->new_sequence(int(seq.size()));
    constexpr int k_chunk = 128;
    Progress bar("kv-fidelity", int64_t(seq.size()));
    std::vector<float> lr, lq;
    std::vector<double> pr, pq;
    // The reference distributions' mean entropy says what the numbers can show: near 0 (one-hot, as random tied
    // embeddings give) every cache agrees; near ln(V) (flat) the top-1 token is a coin toss among near-ties.
    double entropy_sum = 0;
    int entropy_n = 0;
    for (size_t off = 0; off < seq.size(); off += k_chunk) {
        const std::vector<int> chunk(seq.begin() + long(off), seq.begin() + long(std::min(seq.size(), off + k_chunk)));
        ref->forward(ids[0], chunk, true, lr);
        for (size_t e = 0; e < engines.size(); e++) {
            engines[e]->forward(ids[e + 1], chunk, true, lq);
            for (size_t t = 0; t < chunk.size(); t++) {
                if (off + t + 1 < size_t(prompt_len)) continue;  // prompt positions
                const float * r = lr.data() + t * size_t(V);
                const float * q = lq.data() + t * size_t(V);
                log_softmax(r, V, pr);
                log_softmax(q, V, pq);
                double kl = 0;
                for (int i = 0; i < V; i++) kl += std::exp(pr[size_t(i)]) * (pr[size_t(i)] - pq[size_t(i)]);
                kl = std::max(kl, 0.0);  // >= 0 in exact arithmetic; one-hot rows can round below
                if (e == 0) {
                    double h = 0;
                    for (int i = 0; i < V; i++) h -= std::exp(pr[size_t(i)]) * pr[size_t(i)];
                    entropy_sum += h;
                    entropy_n++;
                }
                Fidelity & f = out[e];
                f.positions++;
                f.mean_kl += kl;
                f.max_kl = std::max(f.max_kl, kl);
                f.top1 += (std::max_element(r, r + V) - r) == (std::max_element(q, q + V) - q) ? 1 : 0;
            }
        }
        bar.update(int64_t(off + chunk.size()));
    }
    bar.finish();
    std::printf("| KV cache | reference | positions | mean KL (nats) | max KL | top-1 agreement |\n|---|---|---|---|---|---|\n");
    nlohmann::json rows = nlohmann::json::array();
    for (size_t e = 0; e < out.size(); e++) {
        Fidelity & f = out[e];
        f.dtype = dtypes[e];
        f.mean_kl /= std::max(1, f.positions);
        f.top1 /= std::max(1, f.positions);
        std::printf("| %s | %s | %d | %.3e | %.3e | %.2f%% |\n", f.dtype.c_str(), reference.c_str(), f.positions, f.mean_kl, f.max_kl,
                    100 * f.top1);
        rows.push_back({{"kv_dtype", f.dtype}, {"reference", reference}, {"positions", f.positions}, {"mean_kl", f.mean_kl},
                        {"max_kl", f.max_kl}, {"top1_agreement", f.top1}, {"model", preset.empty() ? dir : preset},
                        {"prompt_len", prompt_len}});
    }
    const double entropy = entropy_sum / std::max(1, entropy_n);
    std::printf("reference distributions: mean entropy %.3f nats (flat over the vocabulary: %.3f)\n", entropy, std::log(double(V)));
    for (auto & row : rows) row["reference_entropy"] = entropy;
    if (!json_path.empty()) {
        std::ofstream f(json_path);
        if (!f) QINFER_FAIL() << json_path << ": cannot open for writing";
        f << rows.dump(1) << "\n";
    }
    return 0;
}

}  // namespace qinfer
