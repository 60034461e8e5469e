// Tensor maps (the descriptors of Hopper's tensor copy engine, cp.async.bulk.tensor) over the paged KV cache and the
// codes of tiled quantized weights.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "backends/cuda/ops.h"

namespace qinfer::cuda {

// The map of one cache array, rows of d bf16 ([rows, d]), copied in boxes of 64 columns x box_rows rows with the
// 128-byte swizzle (wgmma.cuh's panel layout). False where the driver has no encoder or the shape is refused.
bool cache_tensor_map(CUtensorMap * map, const bf16 * base, int64_t rows, int d, int box_rows);
// The same for a quantized cache's codes: rows of row_bytes bytes (at most 128), boxes of whole rows x box_rows,
// 128-byte swizzle when a row is 128 bytes, none otherwise.
bool code_tensor_map(CUtensorMap * map, const uint8_t * base, int64_t rows, int row_bytes, int box_rows);

// The map of a tiled quantized weight's codes (QuantMatrix: [row block][K block][plane][512 bytes]): one box is
// box_row_blocks row blocks' codes of one K block, all planes, landing as [row block][plane][512 bytes] (row blocks
// past the weight as zeros).
bool weight_code_tensor_map(CUtensorMap * map, const void * codes, int64_t row_blocks, int k_blocks, int planes, int box_row_blocks);

}  // namespace qinfer::cuda
