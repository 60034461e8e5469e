// The ring GEMV with the bf16 input staged in shared memory (qgemv_ring_launch.cuh).
#include "backends/cuda/qgemv_ring_launch.cuh"

namespace qinfer::cuda {

void qgemv_ring_stage_bf16(const QuantMatrix & w, const GemvArgs & a, GemvOut out, cudaStream_t s) {
    ring_launch::launch_ring_codes<ring4::XSrc::StageBf16>(w, nullptr, 0, a, out, s);
}

}  // namespace qinfer::cuda
