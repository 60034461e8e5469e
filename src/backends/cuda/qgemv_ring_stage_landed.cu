// The ring GEMV with 2-8 input rows landed in shared memory at once and normalised (RMSNorm) there
// (qgemv_ring_launch.cuh, qstage::stage_norm_landed).
#include "backends/cuda/qgemv_ring_launch.cuh"

namespace qinfer::cuda {

void qgemv_ring_stage_norm_landed(const QuantMatrix & w, const GemvArgs & a, GemvOut out, cudaStream_t s) {
    ring_launch::launch_ring_codes<ring4::XSrc::StageNormLanded>(w, nullptr, 0, a, out, s);
}

}  // namespace qinfer::cuda
