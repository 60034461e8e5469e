// Launching the stream-K GEMV of qgemv_streamk.cuh: one full wave of warps over the flat (row block, K block) work,
// inputs staged in the kernel's shared memory when they need it and fit, else once by a small kernel into scratch.
#include <algorithm>
#include <map>
#include <mutex>
#include <utility>

#include "backends/cuda/common.cuh"
#include "backends/cuda/ops.h"
#include "backends/cuda/qgemv_mma.cuh"
#include "backends/cuda/qgemv_ring.cuh"
#include "backends/cuda/qgemv_streamk.cuh"
#include "backends/cuda/qgemv_tiled.h"
#include "core/env.h"

namespace qinfer::cuda {

namespace {

template <GemvOut OUT> constexpr int mats_of() { return OUT == GemvOut::SiluMulBf16 ? 2 : 1; }

constexpr size_t k_max_smem = 227 * 1024 - 256;  // the opt-in limit less the kernel's static shared memory

// Blocks of `kernel` one SM holds with `smem` bytes of dynamic shared memory (cached per kernel and size).
int resident_blocks(const void * kernel, size_t smem) {
    static std::mutex mu;
    static std::map<std::pair<const void *, size_t>, int> cache;
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find({kernel, smem});
    if (it != cache.end()) return it->second;
    int blocks = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, streamk4::k_threads, smem));
    cache[{kernel, smem}] = blocks;
    return blocks;
}

size_t streamk_smem(const QuantMatrix & w, int m, bool staged, int mats, int rbs_per_block) {
    return streamk4::k_ring_bytes + (staged ? size_t(m) * w.k_padded * sizeof(bf16) : 0) +
           streamk4::param_words(rbs_per_block, mats, w.groups) * sizeof(uint32_t) + streamk4::piece_floats(mats, m) * sizeof(float);
}

template <GemvOut OUT, streamk4::XSrc XS>
void launch_streamk(const QuantMatrix & w, const bf16 * x, int ldx, const GemvArgs & a, const QgemvScratch & scratch, cudaStream_t s) {
    constexpr int MATS = mats_of<OUT>();
    auto kernel = streamk4::qgemv_streamk_kernel<OUT, XS>;
    constexpr bool staged = XS != streamk4::XSrc::Global;
    streamk4::Work wk;
    wk.n_rb = (a.n + 15) / 16;
    wk.nkb = w.k_padded / 64;
    wk.rb_len = MATS * wk.nkb;
    const int64_t total = int64_t(wk.n_rb) * wk.rb_len;
    if (total >= (int64_t(1) << 30)) QINFER_FAIL() << "qgemv: a " << a.n << " x " << a.k << " weight is too large for one stream-K GEMV";
    wk.total = int(total);
    // A full wave of blocks (fewer for small matrices: at least k_min_blocks_per_warp K blocks per warp). Fewer blocks
    // stage more row blocks each, so the shared memory is sized again until the residency holds.
    int blocks = int(std::clamp<int64_t>(total / (streamk4::k_warps * streamk4::k_min_blocks_per_warp), 1,
                                         int64_t(sm_count()) * streamk4::k_blocks_per_sm));
    size_t smem = 0;
    for (int pass = 0; pass < 4; pass++) {
        const int span = (wk.total + blocks - 1) / blocks;  // longest block range
        wk.rbs_per_block = std::min(wk.n_rb, (span + wk.rb_len - 2) / wk.rb_len + 1);
        smem = streamk_smem(w, a.m, staged, MATS, wk.rbs_per_block);
        if (smem > k_max_smem) {
            QINFER_FAIL() << "qgemv: " << w.groups << " quantization groups per row do not fit in shared memory";
        }
        static size_t configured = 48 * 1024;
        if (smem > configured) {
            CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
            configured = smem;
        }
        const int resident = sm_count() * resident_blocks(reinterpret_cast<const void *>(kernel), smem);
        if (resident < 1) QINFER_FAIL() << "qgemv: the stream-K kernel does not fit on an SM with " << smem << " bytes of shared memory";
        if (blocks <= resident) break;
        blocks = resident;
    }
    wk.base = wk.total / blocks;
    wk.rem = wk.total % blocks;
    launch_kernel(kernel, blocks, streamk4::k_threads, smem, s, w, x, ldx, a, scratch, wk);
}

template <streamk4::XSrc XS>
void launch_streamk_out(const QuantMatrix & w, const bf16 * x, int ldx, const GemvArgs & a, GemvOut out, const QgemvScratch & sc,
                        cudaStream_t s) {
    switch (out) {
    case GemvOut::Bf16: return launch_streamk<GemvOut::Bf16, XS>(w, x, ldx, a, sc, s);
    case GemvOut::F32: return launch_streamk<GemvOut::F32, XS>(w, x, ldx, a, sc, s);
    case GemvOut::AddF32: return launch_streamk<GemvOut::AddF32, XS>(w, x, ldx, a, sc, s);
    case GemvOut::SiluMulBf16: return launch_streamk<GemvOut::SiluMulBf16, XS>(w, x, ldx, a, sc, s);
    }
}


size_t ring_smem_bytes(const QuantMatrix & w, int m, bool staged, int rows_blocks) {
    return (staged ? size_t(m) * w.k_padded * sizeof(bf16) : 0) + size_t(rows_blocks) * 16 * ring4::group_stride(w.groups) * 4;
}

template <GemvOut OUT, int KS, ring4::XSrc XS>
void launch_ring(const QuantMatrix & w, const bf16 * x, int ldx, const GemvArgs & a, size_t smem, cudaStream_t s) {
    constexpr int RBB = ring4::k_warps / (mats_of<OUT>() * KS);
    auto kernel = ring4::qgemv_ring_kernel<OUT, KS, XS>;
    static size_t configured = 48 * 1024;
    if (smem > configured) {
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
        configured = smem;
    }
    const int n_rb = (a.n + 15) / 16;
    launch_kernel(kernel, (n_rb + RBB - 1) / RBB, ring4::k_threads, smem, s, w, x, ldx, a);
}

constexpr size_t k_ring_max_smem = 160 * 1024;

// K parts per row block: the fewest that give the grid two fifths of the GPU's resident warps (a block's 8 warps
// split as row blocks x matrices x parts), with at least one 64-wide K block per part; more where the block's group
// parameters (rows x groups) would not fit in shared memory. 0: no split fits.
template <GemvOut OUT> int ring_parts(const QuantMatrix & w, int n, int m, bool staged) {
    constexpr int MATS = mats_of<OUT>();
    const int n_rb = (n + 15) / 16, nkb = w.k_padded / 64, max_ks = ring4::k_warps / MATS;
    const int slots = sm_count() * ring4::k_blocks_per_sm * ring4::k_warps;
    int ks = 1;
    while (ks < max_ks && 5 * n_rb * MATS * ks < 2 * slots && 2 * ks <= nkb) ks *= 2;
    while (ks < max_ks && ring_smem_bytes(w, m, staged, ring4::k_warps / ks) > k_ring_max_smem) ks *= 2;
    return ring_smem_bytes(w, m, staged, ring4::k_warps / ks) <= k_ring_max_smem ? ks : 0;
}

template <GemvOut OUT, ring4::XSrc XS>
void launch_ring_ks(const QuantMatrix & w, const bf16 * x, int ldx, const GemvArgs & a, cudaStream_t s) {
    constexpr int MATS = mats_of<OUT>();
    const int ks = ring_parts<OUT>(w, a.n, a.m, XS != ring4::XSrc::Global);
    if (ks == 0) QINFER_FAIL() << "qgemv: " << w.groups << " quantization groups per row do not fit in shared memory";
    const size_t smem = ring_smem_bytes(w, a.m, XS != ring4::XSrc::Global, ring4::k_warps / ks);
    switch (ks) {
    case 1: return launch_ring<OUT, 1, XS>(w, x, ldx, a, smem, s);
    case 2: return launch_ring<OUT, 2, XS>(w, x, ldx, a, smem, s);
    case 4: return launch_ring<OUT, 4, XS>(w, x, ldx, a, smem, s);
    default:
        if constexpr (MATS == 1) return launch_ring<OUT, 8, XS>(w, x, ldx, a, smem, s);
        return launch_ring<OUT, 4, XS>(w, x, ldx, a, smem, s);
    }
}

template <ring4::XSrc XS>
void launch_ring_out(const QuantMatrix & w, const bf16 * x, int ldx, const GemvArgs & a, GemvOut out, cudaStream_t s) {
    switch (out) {
    case GemvOut::Bf16: return launch_ring_ks<GemvOut::Bf16, XS>(w, x, ldx, a, s);
    case GemvOut::F32: return launch_ring_ks<GemvOut::F32, XS>(w, x, ldx, a, s);
    case GemvOut::AddF32: return launch_ring_ks<GemvOut::AddF32, XS>(w, x, ldx, a, s);
    case GemvOut::SiluMulBf16: return launch_ring_ks<GemvOut::SiluMulBf16, XS>(w, x, ldx, a, s);
    }
}

// Inputs that need RMSNorm, an act-order gather or zero padding up to k_padded are staged: in the kernel's shared
// memory when they fit, else once by a small kernel into scratch.stage.
void stage_to_scratch(const QuantMatrix & w, const GemvArgs & a, GemvIn in, bf16 * stage, cudaStream_t s) {
    if (!stage) QINFER_FAIL() << "qgemv: the tiled layout needs a staging buffer here";
    if (in == GemvIn::NormF32) {
        launch_kernel(mma4::stage_inputs_kernel<GemvIn::NormF32>, a.m, mma4::k_threads, 0, s, w, a, stage);
    } else {
        launch_kernel(mma4::stage_inputs_kernel<GemvIn::Bf16>, a.m, mma4::k_threads, 0, s, w, a, stage);
    }
}

// QINFER_QGEMV=ring: the previous kernel (qgemv_ring.cuh), for timing it against stream-K in one run.
bool use_ring() {
    static const bool ring = env_is("QINFER_QGEMV", "ring");
    return ring;
}

}  // namespace

QgemvScratchSize qgemv_scratch_size(const QuantMatrix & w, int m) {
    QgemvScratchSize z;
    if (!w.tiled) return z;
    const int row_blocks = w.rows_padded / 16;  // of the stacked weight: at least the output's
    const int64_t max_blocks = int64_t(sm_count()) * streamk4::k_blocks_per_sm;
    z.stage = size_t(m) * w.k_padded * sizeof(bf16);
    z.partial = size_t(row_blocks + max_blocks) * 2 * m * 16 * sizeof(float);  // piece row block + block, <= 2 matrices
    z.counters = size_t(row_blocks) * sizeof(int);
    return z;
}

void dequantize_tiled(const QuantMatrix & w, bf16 * out, cudaStream_t stream) {
    const int threads = 256;
    const int64_t words = int64_t(w.rows_padded) * w.k_padded / 8;
    mma4::dequantize_tiled_kernel<<<unsigned((words + threads - 1) / threads), threads, 0, stream>>>(w, out);
    CUDA_CHECK(cudaGetLastError());
}

void qgemv_tiled(const QuantMatrix & w, const GemvArgs & a, GemvIn in, GemvOut out, const QgemvScratch & scratch, cudaStream_t s) {
    if (!use_ring() && (!scratch.partial || !scratch.counters)) QINFER_FAIL() << "qgemv: the tiled layout needs partial-sum scratch";
    const bool needs_stage = in == GemvIn::NormF32 || w.perm || a.k != w.k_padded;
    const bool stage_in_smem = size_t(a.m) * w.k_padded * sizeof(bf16) <= streamk4::k_max_stage_bytes;
    if (needs_stage && stage_in_smem) {
        if (use_ring()) {
            if (in == GemvIn::NormF32) return launch_ring_out<ring4::XSrc::StageNorm>(w, nullptr, 0, a, out, s);
            return launch_ring_out<ring4::XSrc::StageBf16>(w, nullptr, 0, a, out, s);
        }
        if (in == GemvIn::NormF32) return launch_streamk_out<streamk4::XSrc::StageNorm>(w, nullptr, 0, a, out, scratch, s);
        return launch_streamk_out<streamk4::XSrc::StageBf16>(w, nullptr, 0, a, out, scratch, s);
    }
    const bf16 * x = static_cast<const bf16 *>(a.x);
    int ldx = a.k;
    if (needs_stage) {
        stage_to_scratch(w, a, in, scratch.stage, s);
        x = scratch.stage;
        ldx = w.k_padded;
    }
    if (use_ring()) return launch_ring_out<ring4::XSrc::Global>(w, x, ldx, a, out, s);
    launch_streamk_out<streamk4::XSrc::Global>(w, x, ldx, a, out, scratch, s);
}

}  // namespace qinfer::cuda
