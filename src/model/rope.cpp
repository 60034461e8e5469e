#include "model/rope.h"

#include <algorithm>
#include <cmath>

namespace qinfer {

namespace {

// inv_freq[j] = base^(-2j/d), computed as transformers does: the exponent in fp32, pow in fp32.
std::vector<float> default_inv_freq(double base, int dim) {
    std::vector<float> inv(dim / 2);
    for (int j = 0; j < dim / 2; j++) {
        float e = float(2 * j) / float(dim);
        inv[j] = 1.0f / std::pow(float(base), e);
    }
    return inv;
}

double yarn_get_mscale(double scale, double mscale) {
    if (scale <= 1.0) return 1.0;
    return 0.1 * mscale * std::log(scale) + 1.0;
}

}  // namespace

RopeFreqs compute_rope_freqs(const ModelConfig & c, int seq_len) {
    const RopeScaling & s = c.rope_scaling;
    const int dim = c.head_dim;
    RopeFreqs f;
    switch (s.type) {
    case RopeType::Default:
        f.inv_freq = default_inv_freq(c.rope_theta, dim);
        break;
    case RopeType::Linear:
        f.inv_freq = default_inv_freq(c.rope_theta, dim);
        for (float & v : f.inv_freq) v = float(v / s.factor);
        break;
    case RopeType::Dynamic: {
        // transformers: base grows once the sequence passes the original context.
        int max_pos = s.original_max_position_embeddings > 0 ? s.original_max_position_embeddings : c.max_position_embeddings;
        double base = c.rope_theta;
        int len = std::max(seq_len, max_pos);
        if (len > max_pos) base = base * std::pow(s.factor * len / max_pos - (s.factor - 1.0), double(dim) / (dim - 2));
        f.inv_freq = default_inv_freq(base, dim);
        break;
    }
    case RopeType::Yarn: {
        // transformers 5.17 takes the factor as written, also when max_position_embeddings was left at the
        // original context (Qwen2.5's published advice); the golden tiny-qwen2-yarn-same-max pins this.
        const double factor = s.factor;
        const int original = s.original_max_position_embeddings > 0 ? s.original_max_position_embeddings : c.max_position_embeddings;
        double attention_factor = s.attention_factor;
        if (attention_factor <= 0) {
            if (s.mscale > 0 && s.mscale_all_dim > 0) {
                attention_factor = yarn_get_mscale(factor, s.mscale) / yarn_get_mscale(factor, s.mscale_all_dim);
            } else {
                attention_factor = yarn_get_mscale(factor, 1.0);
            }
        }
        const double base = c.rope_theta;
        auto corr_dim = [&](double rot) { return dim * std::log(original / (rot * 2 * M_PI)) / (2 * std::log(base)); };
        double low = corr_dim(s.beta_fast), high = corr_dim(s.beta_slow);
        if (s.truncate) {
            low = std::floor(low);
            high = std::ceil(high);
        }
        low = std::max(low, 0.0);
        high = std::min(high, double(dim - 1));
        if (low == high) high += 0.001;
        std::vector<float> pos_freqs(dim / 2);
        f.inv_freq.resize(dim / 2);
        for (int j = 0; j < dim / 2; j++) {
            float pf = std::pow(float(base), float(2 * j) / float(dim));
            float extrapolation = 1.0f / pf;
            float interpolation = 1.0f / float(factor * pf);
            float ramp = float(std::clamp((j - low) / (high - low), 0.0, 1.0));
            float extrap_w = 1.0f - ramp;
            f.inv_freq[j] = interpolation * (1.0f - extrap_w) + extrapolation * extrap_w;
        }
        f.attention_scaling = float(attention_factor);
        break;
    }
    case RopeType::Llama3: {
        std::vector<float> inv = default_inv_freq(c.rope_theta, dim);
        const double old_len = s.original_max_position_embeddings;
        const double low_wavelen = old_len / s.low_freq_factor;
        const double high_wavelen = old_len / s.high_freq_factor;
        f.inv_freq.resize(inv.size());
        for (size_t j = 0; j < inv.size(); j++) {
            double wavelen = 2 * M_PI / inv[j];
            double v = wavelen > low_wavelen ? inv[j] / s.factor : inv[j];
            bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
            if (medium) {
                double smooth = (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
                v = (1 - smooth) * v / s.factor + smooth * v;
            }
            f.inv_freq[j] = float(v);
        }
        break;
    }
    }
    return f;
}

void rope_cos_sin(const RopeFreqs & f, int pos, float * cos_out, float * sin_out) {
    const int half = int(f.inv_freq.size());
    for (int j = 0; j < half; j++) {
        float angle = float(pos) * f.inv_freq[j];
        float c = std::cos(angle) * f.attention_scaling;
        float s = std::sin(angle) * f.attention_scaling;
        cos_out[j] = cos_out[j + half] = c;
        sin_out[j] = sin_out[j + half] = s;
    }
}

}  // namespace qinfer
