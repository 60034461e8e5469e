// Balanced decode GEMV: y = epilogue(W x) for W bf16 [n, k] (SiluMulBf16: [2n, k]), same math as gemv.cu's row
// kernels, different split of the work. Those give each row a warp, so where the rows do not fill whole waves of
// resident blocks the last wave runs part-empty: 7B's qkv (576 blocks of 8 rows) and o_proj / down (448) on an H100
// holding two such blocks per SM are 2.2 and 1.7 waves. Here the grid is exactly one wave: block b owns rows
// [b n / G, (b + 1) n / G) and its 256 threads walk the block's (row, 16-byte chunk) space flattened, 256 chunks
// apart, so every thread issues the same number of loads (within one) whatever k is, eight in flight: as batches
// (eight requested, waited for, multiplied) or, for one row where each block streams two batches or more, as a ring
// (each slot requested again as soon as it is multiplied, so the loads never drain; launch()). A thread's
// partial sum of a row goes to its own column of a shared table [token][row][thread]; after one barrier each warp
// adds its rows' 256 columns in a fixed order, so the result does not depend on timing.
// The QKV projection's bias, RoPE and cache store once ran in this kernel's epilogue (rows paired as RoPE pairs). On
// an H200 the plain GEMV and qkv_rope_cache after it were faster (one round, same call; bench/results/
// 2026-12-04-h200-moe-early-ids, call 4): Qwen1.5-MoE-A2.7B BF16 591.39 -> 603.25 tok/s, Qwen2.5-7B BF16 254.45 ->
// 255.56; the epilogue was removed.
#include <algorithm>
#include <atomic>

#include "backends/cuda/gemv_common.cuh"
#include "backends/cuda/qstage.cuh"

namespace qinfer::cuda {

namespace {

constexpr int k_threads = 256;
constexpr int k_table_rows = 32;  // table rows per block (tokens x rows x matrices): 32 KB of shared memory
constexpr int k_batch = 8;        // loads in flight per thread

// RING (one row only, launch()): the ring form, at three blocks per SM for bf16 inputs (at most 85 registers) as the
// batch form fits them.
template <int M, GemvIn IN, GemvOut OUT, bool RING>
__global__ void __launch_bounds__(k_threads, RING && IN == GemvIn::Bf16 ? 3 : 0) gemv_balanced_kernel(GemvArgs a, int table_rows) {
    extern __shared__ float4 smem_raw4[];
    float * table = reinterpret_cast<float *>(smem_raw4);                              // fp32 [M, table_rows, 256]
    bf16 * xs = reinterpret_cast<bf16 *>(table + size_t(M) * table_rows * k_threads);  // bf16 [M, k] (NormF32)
    __shared__ float norm_red[k_threads / 32];
    constexpr int n_mats = OUT == GemvOut::SiluMulBf16 ? 2 : 1;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int k = a.k, chunks = k / 8;
    const int row0 = int(int64_t(blockIdx.x) * a.n / gridDim.x), row1 = int(int64_t(blockIdx.x + 1) * a.n / gridDim.x);
    // Virtual row v of the block: row row0 + v / n_mats of matrix v % n_mats (gate and up of a row side by side).
    const int vrows = (row1 - row0) * n_mats;
    auto row_ptr = [&](int vr) {
        const int row = row0 + vr / n_mats, mat = vr % n_mats;
        return reinterpret_cast<const uint4 *>(a.w + (int64_t(row) + int64_t(mat) * a.n) * k);
    };

    // This thread's next chunk: (v, c), flat index v * chunks + c = tid + 256 i.
    int v = tid / chunks, c = tid % chunks;
    const uint4 * p = v < vrows ? row_ptr(v) : nullptr;
    uint4 wv[k_batch];
    int wrow[k_batch], wchunk[k_batch];
    // Slot u takes the thread's next chunk.
    auto next_load = [&](int u) {
        wrow[u] = v;
        wchunk[u] = c;
        if constexpr (RING) {
            wv[u] = v < vrows ? load_stream_pinned(p + c) : make_uint4(0, 0, 0, 0);
        } else {
            wv[u] = v < vrows ? load_stream(p + c) : make_uint4(0, 0, 0, 0);
        }
        c += k_threads;
        if (c >= chunks) {
            while (c >= chunks) {
                c -= chunks;
                v++;
            }
            p = v < vrows ? row_ptr(v) : nullptr;
        }
    };
    auto fetch = [&]() {
#pragma unroll
        for (int u = 0; u < k_batch; u++) next_load(u);
    };

    // The first batch is requested before pdl_wait() and the norm, as in gemv.cu.
    bool have_batch = true;
    fetch();
    pdl_wait();
    for (int m = 0; m < M; m++) {
        for (int r = 0; r < vrows; r++) table[(size_t(m) * table_rows + r) * k_threads + tid] = 0;
    }
    if constexpr (IN == GemvIn::NormF32) {
        qstage::stage_norm_rows(a, M, xs, norm_red);
        __syncthreads();
    }
    const bf16 * xsrc = IN == GemvIn::NormF32 ? xs : static_cast<const bf16 *>(a.x);

    // Rows arrive in increasing order, so each (row, thread) cell is written once, when the thread leaves the row.
    int cur = tid / chunks;
    float acc[M] = {};
    auto flush = [&]() {
        if (cur >= vrows) return;
#pragma unroll
        for (int m = 0; m < M; m++) table[(size_t(m) * table_rows + cur) * k_threads + tid] = acc[m];
    };
    auto consume = [&](int u) {
        if (wrow[u] != cur) {
            flush();
            cur = wrow[u];
#pragma unroll
            for (int m = 0; m < M; m++) acc[m] = 0;
        }
#pragma unroll
        for (int m = 0; m < M; m++) acc[m] += dot8(wv[u], reinterpret_cast<const uint4 *>(xsrc + int64_t(m) * k)[wchunk[u]]);
    };
    if constexpr (RING) {
        // Each slot is refilled as soon as it is multiplied, so the thread's loads never drain between batches. Slots
        // are taken and multiplied in turn, so the chunks are multiplied in the same order as below.
        while (wrow[0] < vrows) {
#pragma unroll
            for (int u = 0; u < k_batch; u++) {
                if (wrow[u] >= vrows) break;  // the slots after it are past the end too
                consume(u);
                next_load(u);
            }
        }
    } else {
        while (have_batch || v < vrows) {
            if (!have_batch) fetch();
            have_batch = false;
#pragma unroll
            for (int u = 0; u < k_batch; u++) {
                if (wrow[u] >= vrows) continue;
                consume(u);
            }
        }
    }
    flush();
    __syncthreads();

    // Each warp finishes rows warp, warp + 8, ...: lane l adds columns l, l + 32, ..., then the warp adds its lanes.
    for (int r = warp; r < row1 - row0; r += k_threads / 32) {
#pragma unroll
        for (int m = 0; m < M; m++) {
            float s[n_mats];
#pragma unroll
            for (int mat = 0; mat < n_mats; mat++) {
                const float * col = table + (size_t(m) * table_rows + r * n_mats + mat) * k_threads;
                float t = 0;
#pragma unroll
                for (int j = 0; j < k_threads / 32; j++) t += col[lane + 32 * j];
                s[mat] = warp_sum(t);
            }
            if (lane == 0) gemv_store<OUT>(a, m, row0 + r, s[0], s[n_mats - 1]);
        }
    }
}

template <int M, GemvIn IN, GemvOut OUT> bool launch(const GemvArgs & a, cudaStream_t stream) {
    constexpr int n_mats = OUT == GemvOut::SiluMulBf16 ? 2 : 1;
    auto kernel = gemv_balanced_kernel<M, IN, OUT, false>;
    const size_t xs_bytes = IN == GemvIn::NormF32 ? size_t(M) * a.k * sizeof(bf16) : 0;
    const size_t table_max_bytes = size_t(k_table_rows) * k_threads * sizeof(float);
    static PerDevice<size_t> configured, configured_ring;
    static PerDevice<Occupancy> occupancy;
    allow_dynamic_smem(kernel, table_max_bytes + xs_bytes, configured);
    // One wave at the largest table: a smaller table can only let more blocks in.
    const int per_sm = resident_blocks(kernel, k_threads, table_max_bytes + xs_bytes, occupancy);
    if (per_sm < 1) return false;
    const int grid = std::min(per_sm * sm_count(), a.n);
    const int table_rows = (a.n + grid - 1) / grid * n_mats;
    if (M * table_rows > k_table_rows) return false;
    const size_t smem = size_t(M) * table_rows * k_threads * sizeof(float) + xs_bytes;
    if constexpr (M == 1) {
        // The ring where each block streams at least two batches of weights (its launch bounds keep the batch
        // form's blocks per SM, so the grid stands). On an H200 (bench/results/2026-12-02-h200-router-in-launch, calls
        // 2-3, alternated twice): 7B BF16 249.21 / 249.09 -> 254.70 / 254.72 tok/s (qkv ~3.8 batches a block, down
        // ~10.5), 1.5B 810.92 / 811.21 -> 830.36 / 830.75 (down ~2.2), A2.7B 590.76 / 590.81 -> 589.17 / 589.73 (qkv
        // ~2.9); the ring everywhere lost where blocks stream a batch or less (0.5B 1,535 -> 1,499, A2.7B -1.6%).
        const int64_t batch_bytes = int64_t(k_batch) * k_threads * 16, block_bytes = int64_t(a.n) * n_mats * a.k * 2 / grid;
        if (block_bytes >= 2 * batch_bytes) {
            auto ring_kernel = gemv_balanced_kernel<M, IN, OUT, true>;
            allow_dynamic_smem(ring_kernel, table_max_bytes + xs_bytes, configured_ring);
            launch_kernel(ring_kernel, grid, k_threads, smem, stream, a, table_rows);
            return true;
        }
    }
    launch_kernel(kernel, grid, k_threads, smem, stream, a, table_rows);
    return true;
}

template <int M> bool dispatch(const GemvArgs & a, GemvIn in, GemvOut out, cudaStream_t s) {
    if (in == GemvIn::Bf16) {
        switch (out) {
        case GemvOut::Bf16: return launch<M, GemvIn::Bf16, GemvOut::Bf16>(a, s);
        case GemvOut::F32: return launch<M, GemvIn::Bf16, GemvOut::F32>(a, s);
        case GemvOut::AddF32: return launch<M, GemvIn::Bf16, GemvOut::AddF32>(a, s);
        case GemvOut::SiluMulBf16: return launch<M, GemvIn::Bf16, GemvOut::SiluMulBf16>(a, s);
        }
    } else {
        switch (out) {
        case GemvOut::Bf16: return launch<M, GemvIn::NormF32, GemvOut::Bf16>(a, s);
        case GemvOut::F32: return launch<M, GemvIn::NormF32, GemvOut::F32>(a, s);
        case GemvOut::AddF32: return launch<M, GemvIn::NormF32, GemvOut::AddF32>(a, s);
        case GemvOut::SiluMulBf16: return launch<M, GemvIn::NormF32, GemvOut::SiluMulBf16>(a, s);
        }
    }
    return false;
}

}  // namespace

static std::atomic<bool> balanced_on{true};

void set_gemv_balanced(bool on) { balanced_on = on; }

bool gemv_balanced(const GemvArgs & a, GemvIn in, GemvOut out, cudaStream_t stream) {
    if (!balanced_on) return false;
    switch (a.m) {
    case 1: return dispatch<1>(a, in, out, stream);
    case 2: return dispatch<2>(a, in, out, stream);
    case 3: return dispatch<3>(a, in, out, stream);
    case 4: return dispatch<4>(a, in, out, stream);
    default: return false;
    }
}

}  // namespace qinfer::cuda
