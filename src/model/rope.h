// Rotary position embedding frequencies, as transformers' modeling_rope_utils computes them.
#pragma once

#include <vector>

#include "io/model_config.h"

namespace qinfer {

struct RopeFreqs {
    std::vector<float> inv_freq;  // fp32 [head_dim / 2]
    float attention_scaling = 1.0f;  // multiplies cos and sin (YaRN)
};

// `seq_len` matters only for dynamic NTK scaling: the longest position + 1 seen by the forward call.
RopeFreqs compute_rope_freqs(const ModelConfig & c, int seq_len);

// cos/sin of one position: cos_out/sin_out fp32 [head_dim], laid out as concat(freqs, freqs) like transformers.
void rope_cos_sin(const RopeFreqs & f, int pos, float * cos_out, float * sin_out);

}  // namespace qinfer
