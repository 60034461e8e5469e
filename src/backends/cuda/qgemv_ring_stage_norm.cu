// The ring GEMV with the input normalised (RMSNorm) into shared memory (qgemv_ring_launch.cuh).
#include "backends/cuda/qgemv_ring_launch.cuh"

namespace qinfer::cuda {

void qgemv_ring_stage_norm(const QuantMatrix & w, const GemvArgs & a, GemvOut out, cudaStream_t s) {
    ring_launch::launch_ring_codes<ring4::XSrc::StageNorm>(w, nullptr, 0, a, out, s);
}

}  // namespace qinfer::cuda
