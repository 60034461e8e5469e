// The row GEMV kernels for bf16 inputs (gemv_rows.cuh).
#include "backends/cuda/gemv_rows.cuh"

namespace qinfer::cuda {

void gemv_rows_bf16(const GemvArgs & a, GemvOut out, cudaStream_t stream) { gemv_rows::dispatch<GemvIn::Bf16>(a, out, stream); }

}  // namespace qinfer::cuda
