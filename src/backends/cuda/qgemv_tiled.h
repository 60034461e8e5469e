// The decode GEMV and the dequantization for 4-bit affine weights in the tensor-core tile layout (qgemv_tiled.cu),
// called by qgemv() and dequantize().
#pragma once

#include "backends/cuda/ops.h"

namespace qinfer::cuda {

// out = the dequantized weight, bf16 [rows, k] in input-channel order.
void dequantize_tiled(const QuantMatrix & w, bf16 * out, cudaStream_t stream);
void qgemv_tiled(const QuantMatrix & w, const GemvArgs & a, GemvIn in, GemvOut out, const QgemvScratch & scratch, cudaStream_t stream);

}  // namespace qinfer::cuda
