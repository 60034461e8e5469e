// Random weights in a checkpoint's exact layout: the values `qinfer synth` writes to disk and `--load-format dummy`
// builds in memory. Dense tensors are normal with a per-role scale (random_init); a quantized linear is a dense random
// weight quantized by round-to-nearest into its format's stored tensors (FORMATS.md sections 3-6).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "model/weights.h"

namespace qinfer {

// Mean and standard deviation of a tensor's values. Linear weights get 1/sqrt(in) so every projection keeps
// unit-variance inputs at unit variance; the residual-writing projections are scaled down by sqrt(2 layers) so the
// residual stream grows slowly over depth (as GPT-2's init does); norm weights scatter around 1.
struct RandomInit {
    float mean, std;
};
RandomInit random_init(const std::string & name, const std::vector<int64_t> & shape, WeightRole role, int n_layers);

// nbytes of values number 0.. of a stream, as bf16, fp16 or fp32; a value depends only on (stream, index).
void fill_random(uint64_t stream, RandomInit init, DType dtype, uint8_t * out, size_t nbytes);

// The dtype a tensor of this role is stored in; `dense` for the unquantized roles. absmax is 8-bit under bitsandbytes'
// double quantization.
DType stored_dtype(WeightRole role, DType dense, const QuantScheme & scheme);

// torch's name of a dtype ("bfloat16"), as config.json and bitsandbytes' JSON write it.
std::string torch_dtype_name(DType t);

// The act-order stream a quantized projection shares with those that read the same input (q/k/v, gate/up), as
// GPTQ's Hessian order is: "model.layers.3.self_attn.qkv" for model.layers.3.self_attn.k_proj.
std::string act_order_key(const std::string & module);

// bitsandbytes' code table (quant_map, 16 values) of NF4 (QuantPacking::Nf4) or else FP4.
const float * bnb_code_table(QuantPacking packing);

// bitsandbytes' per-weight JSON (fixed width, so its length is known before the weights are).
std::string bnb_quant_state_json(const Linear & l, const std::string & dtype, float nested_offset);

// Quantizes the dense weight w (fp32 [N, K]) of `l` (shapes and scheme set) into its stored tensors, keyed by the
// name suffix after the module prefix (".qweight", ".weight.absmax", ...). perm_seed: act-order permutation stream.
std::map<std::string, std::vector<uint8_t>> quantize_linear(const Linear & l, const std::vector<float> & w, uint64_t perm_seed,
                                                            const std::string & dtype);

// A quantized linear's stored tensors from random values: the dense weight of `module` (random_init's Linear init,
// values number 0.. of value_stream) quantized by quantize_linear into the format of `dense` checkpoints.
std::map<std::string, std::vector<uint8_t>> random_quantized_linear(const Linear & l, const std::string & module, int n_layers,
                                                                    uint64_t value_stream, uint64_t perm_seed, DType dense);

// --load-format dummy: fills every slot of `w` (config `c`) with random values without reading a file, and returns
// the memory they live in. Dense tensors of one init view windows of one shared random pool (each at its own offset,
// so no two are equal); the quantized linears of one shape and scheme share one set of stored tensors. Memory: per
// init, its largest tensor plus at most 4M values of offsets, not the model's size. values false: names, shapes and
// dtypes only (data stays null).
std::shared_ptr<const void> dummy_weights(const ModelConfig & c, ModelWeights & w, bool values = true);

}  // namespace qinfer
