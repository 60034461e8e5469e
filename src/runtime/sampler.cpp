#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <unordered_map>
#include <unordered_set>

#include "core/check.h"

namespace qinfer {

int argmax(const float * x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++) {
        if (x[i] > x[best]) best = i;
    }
    return best;
}

Sampler::Sampler(const SamplingParams & p, int n_valid) : p_(p), n_valid_(n_valid), rng_(p.seed) {
    if (p.temperature < 0) QINFER_FAIL() << "temperature must be >= 0, got " << p.temperature;
    if (p.top_k < 0) QINFER_FAIL() << "top_k must be >= 0, got " << p.top_k;
    if (!(p.top_p > 0 && p.top_p <= 1)) QINFER_FAIL() << "top_p must be in (0, 1], got " << p.top_p;
    if (!(p.min_p >= 0 && p.min_p <= 1)) QINFER_FAIL() << "min_p must be in [0, 1], got " << p.min_p;
    if (!(p.repetition_penalty > 0)) QINFER_FAIL() << "repetition_penalty must be > 0, got " << p.repetition_penalty;
}

int Sampler::sample(float * logits, int vocab, const std::vector<int> & prompt, const std::vector<int> & output) {
    const int n = std::min(vocab, n_valid_);
    if (p_.repetition_penalty != 1.0f) {
        std::unordered_set<int> seen(prompt.begin(), prompt.end());
        seen.insert(output.begin(), output.end());
        for (int id : seen) {
            if (id < 0 || id >= n) continue;
            float & l = logits[id];
            l = l > 0 ? l / p_.repetition_penalty : l * p_.repetition_penalty;
        }
    }
    if (p_.presence_penalty != 0.0f || p_.frequency_penalty != 0.0f) {
        std::unordered_map<int, int> counts;
        for (int id : output) counts[id]++;
        for (auto [id, cnt] : counts) {
            if (id < 0 || id >= n) continue;
            logits[id] -= p_.presence_penalty + p_.frequency_penalty * float(cnt);
        }
    }
    if (p_.temperature == 0.0f) return argmax(logits, n);

    for (int i = 0; i < n; i++) logits[i] /= p_.temperature;
    // Candidates sorted by logit, largest first (ties: lower id first).
    std::vector<int> idx(static_cast<size_t>(n));
    std::iota(idx.begin(), idx.end(), 0);
    int keep = n;
    if (p_.top_k > 0 && p_.top_k < n) keep = p_.top_k;
    std::partial_sort(idx.begin(), idx.begin() + keep, idx.end(), [&](int a, int b) {
        return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    idx.resize(size_t(keep));
    // Softmax over the kept candidates.
    std::vector<double> prob(idx.size());
    double mx = logits[idx[0]], sum = 0;
    for (size_t i = 0; i < idx.size(); i++) sum += (prob[i] = std::exp(double(logits[idx[i]]) - mx));
    for (double & v : prob) v /= sum;
    if (p_.top_p < 1.0f) {
        // transformers keeps the smallest prefix whose mass reaches top_p (at least one token).
        double cum = 0;
        size_t cut = prob.size();
        for (size_t i = 0; i < prob.size(); i++) {
            cum += prob[i];
            if (cum >= p_.top_p) {
                cut = i + 1;
                break;
            }
        }
        prob.resize(cut);
        idx.resize(cut);
    }
    if (p_.min_p > 0.0f) {
        double threshold = p_.min_p * prob[0];
        size_t cut = 1;
        while (cut < prob.size() && prob[cut] >= threshold) cut++;
        prob.resize(cut);
        idx.resize(cut);
    }
    double total = std::accumulate(prob.begin(), prob.end(), 0.0);
    std::uniform_real_distribution<double> uni(0.0, total);
    double r = uni(rng_), acc = 0;
    for (size_t i = 0; i < prob.size(); i++) {
        acc += prob[i];
        if (r < acc) return idx[i];
    }
    return idx.back();
}

}  // namespace qinfer
