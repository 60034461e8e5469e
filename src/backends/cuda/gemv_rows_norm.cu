// The row GEMV kernels for fp32 residual inputs normalised in the kernel (RMSNorm) (gemv_rows.cuh).
#include "backends/cuda/gemv_rows.cuh"

namespace qinfer::cuda {

void gemv_rows_norm(const GemvArgs & a, GemvOut out, cudaStream_t stream) { gemv_rows::dispatch<GemvIn::NormF32>(a, out, stream); }

}  // namespace qinfer::cuda
