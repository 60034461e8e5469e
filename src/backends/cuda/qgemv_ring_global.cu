// The ring GEMV with the input read from global memory (qgemv_ring_launch.cuh).
#include "backends/cuda/qgemv_ring_launch.cuh"

namespace qinfer::cuda {

void qgemv_ring_global(const QuantMatrix & w, const bf16 * x, int ldx, const GemvArgs & a, GemvOut out, cudaStream_t s) {
    ring_launch::launch_ring_codes<ring4::XSrc::Global>(w, x, ldx, a, out, s);
}

}  // namespace qinfer::cuda
