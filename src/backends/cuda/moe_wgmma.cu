// The routed experts' grouped GEMM on Hopper (sm_90a; moe_wgmma.h): where experts get many rows, each block multiplies
// one row tile of one expert (k_moe_wgmma_rows = 128 sorted rows, the MMAs' N) by 256 of its weight rows, K in steps of
// 64 through k_stages stages of shared memory guarded by mbarriers; both operands come by the tensor copy engine, so
// the sorted rows must be contiguous: moe_experts gathers each sorted row's token first.
//
//   producer (one warp, one lane): per K block, four tensor copies of 64 weight rows each (the A segments; for SwiGLU
//     gate rows f0..f0+127 and the matching up rows) and one of the row tile's 128 x 64 inputs (the B operand),
//     128-byte swizzle (wgmma.cuh's layout). Rows past the expert's (the next expert's, or past the tensor: zeros)
//     are multiplied and never stored.
//   consumers (two warpgroups): warpgroup w multiplies segments w and w + 2 (SwiGLU: gate and up of the same 64
//     features) by the row tile: per K block eight wgmma.m64n128k16 from shared memory into two fp32 accumulators of
//     64 x 128, one commit group per stage, the stage released when the next one's MMAs are issued.
//   epilogue: accumulators (SwiGLU: silu(bf16(gate)) * bf16(up), the unfused path's rounding) to shared memory as
//     [rows][features] fp32, then out as bf16 in 16-byte chunks of y's rows (rows past the expert's and features past n
//     are not written).
// The mma.sync kernel of moe.cu (64 x 128 tiles of four warps, cp.async ring) stays for the smaller tiles and for
// devices without wgmma.
#include <cuda.h>

#include "backends/cuda/common.cuh"
#include "backends/cuda/moe_tiles.cuh"
#include "backends/cuda/moe_wgmma.h"
#include "backends/cuda/tensor_map.h"
#include "backends/cuda/wgmma.cuh"

namespace qinfer::cuda {
namespace {

constexpr int k_bn = k_moe_wgmma_rows;  // sorted rows per block
constexpr int k_seg_rows = 64;          // weight rows per A segment (one warpgroup MMA's M)
constexpr int k_segs = 4;               // 256 weight rows a block
constexpr int k_stages = 4;
constexpr int k_consumer_threads = 256;
constexpr int k_threads = k_consumer_threads + 32;  // + the producer warp
constexpr int k_seg_bytes = k_seg_rows * 128;       // 64 rows x 64 bf16
constexpr int k_a_bytes = k_segs * k_seg_bytes;
constexpr int k_b_bytes = k_bn * 128;
constexpr int k_stage_bytes = k_a_bytes + k_b_bytes;  // 48 KB
constexpr size_t k_bar_offset = size_t(k_stages) * k_stage_bytes;
constexpr size_t k_smem_bytes = k_bar_offset + 2 * k_stages * sizeof(uint64_t) + 1024;  // + the base's alignment
static_assert(k_stage_bytes % 1024 == 0, "stages keep the swizzle's 1024-byte alignment");
static_assert(size_t(k_bn) * (k_segs * k_seg_rows + 4) * sizeof(float) <= k_bar_offset, "the staged output fits the stages");
static_assert(k_smem_bytes <= 227 * 1024, "within a block's shared memory");

struct Args {
    int n, k, n_experts, w_rows;
    const int * offsets, * tiles;
    bf16 * y;
};

template <bool SWIGLU>
__global__ void __launch_bounds__(k_threads, 1)
    moe_gemm_wgmma_kernel(Args a, const __grid_constant__ CUtensorMap w_map, const __grid_constant__ CUtensorMap x_map) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ unsigned char smem_raw[];
    unsigned char * smem = smem_raw + ((1024 - sm90::smem_addr(smem_raw) % 1024) % 1024);
    uint64_t * full = reinterpret_cast<uint64_t *>(smem + k_bar_offset), * empty = full + k_stages;
    const int warp_idx = __shfl_sync(0xffffffffu, int(threadIdx.x) / 32, 0);  // uniform for ptxas
    const int lane = threadIdx.x % 32;
    if (warp_idx == 8 && lane == 0) {
        sm90::prefetch_tensor_map(&w_map);
        sm90::prefetch_tensor_map(&x_map);
    }
    pdl_wait();
    MoeTile tile;
    if (!moe_tile_of(a.tiles, a.offsets, a.n_experts, int(blockIdx.y), k_bn, tile)) return;
    const int e = tile.expert, row0 = tile.row0, rows = tile.rows;
    constexpr int cols = SWIGLU ? k_segs / 2 * k_seg_rows : k_segs * k_seg_rows;  // outputs per row of the tile
    const int f0 = blockIdx.x * cols;
    const int nk = (a.k + 63) / 64;

    sm90::init_stage_barriers(full, empty, k_stages, k_consumer_threads);

    if (warp_idx == 8) {  // the producer
        if (lane == 0) {
            const int wbase = e * a.w_rows;
            for (int i = 0; i < nk; i++) {
                const int s = i % k_stages;
                if (i >= k_stages) sm90::mbar_wait(&empty[s], (i / k_stages - 1) & 1);
                unsigned char * st = smem + s * k_stage_bytes;
                sm90::mbar_arrive_expect_tx(&full[s], uint32_t(k_stage_bytes));
#pragma unroll
                for (int seg = 0; seg < k_segs; seg++) {
                    // SwiGLU: segments 0, 1 gate rows f0.., f0 + 64..; 2, 3 the same features' up rows.
                    const int r = SWIGLU ? f0 + (seg % 2) * k_seg_rows + (seg / 2) * a.n : f0 + seg * k_seg_rows;
                    sm90::tma_load_2d(st + seg * k_seg_bytes, &w_map, &full[s], i * 64, wbase + r);
                }
                sm90::tma_load_2d(st + k_a_bytes, &x_map, &full[s], i * 64, row0);
            }
        }
        return;
    }

    const int wg = warp_idx / 4;
    float d0[k_bn / 2], d1[k_bn / 2];
#pragma unroll
    for (int i = 0; i < k_bn / 2; i++) d0[i] = d1[i] = 0.0f;
    for (int i = 0; i < nk; i++) {
        const int s = i % k_stages;
        sm90::mbar_wait(&full[s], (i / k_stages) & 1);
        const uint32_t st = sm90::smem_addr(smem + s * k_stage_bytes);
        const uint32_t a0 = st + wg * k_seg_bytes, a1 = st + (wg + 2) * k_seg_bytes, b = st + k_a_bytes;
        sm90::wgmma_fence();
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const uint64_t bd = sm90::desc128(b + j * 32, 16, 1024);
            sm90::wgmma_m64n128k16_ss(d0, sm90::desc128(a0 + j * 32, 16, 1024), bd, 1);
            sm90::wgmma_m64n128k16_ss(d1, sm90::desc128(a1 + j * 32, 16, 1024), bd, 1);
        }
        sm90::wgmma_commit();
        sm90::wgmma_wait<1>();  // the previous stage's MMAs are done: it goes back to the producer
        if (i > 0) sm90::mbar_arrive(&empty[(i - 1) % k_stages]);
    }
    sm90::wgmma_wait<0>();
    sm90::fence_operands(d0);
    sm90::fence_operands(d1);

    // Epilogue: both warpgroups past their last wait, every stage consumed: the stages hold the output tile.
    sm90::named_barrier(1, k_consumer_threads);
    constexpr int ld = cols + 4;  // a warp's 4 row columns x 8 features fall in distinct banks
    float * so = reinterpret_cast<float *>(smem);
    const int gq = lane / 4, t = lane % 4, feat = 16 * (warp_idx % 4) + gq;
#pragma unroll
    for (int j = 0; j < k_bn / 8; j++) {
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const int r = 8 * j + 2 * t + (q & 1), f = feat + (q >= 2 ? 8 : 0);
            if constexpr (SWIGLU) {
                const float gate = __bfloat162float(__float2bfloat16(d0[4 * j + q]));
                const float up = __bfloat162float(__float2bfloat16(d1[4 * j + q]));
                so[r * ld + wg * k_seg_rows + f] = silu(gate) * up;
            } else {
                so[r * ld + wg * k_seg_rows + f] = d0[4 * j + q];
                so[r * ld + (wg + 2) * k_seg_rows + f] = d1[4 * j + q];
            }
        }
    }
    sm90::named_barrier(1, k_consumer_threads);
    auto pack_rn = [](float lo_v, float hi_v) {
        const __nv_bfloat162 r = __floats2bfloat162_rn(lo_v, hi_v);
        return *reinterpret_cast<const uint32_t *>(&r);
    };
    for (int c = threadIdx.x; c < k_bn * (cols / 8); c += k_consumer_threads) {
        const int r = c / (cols / 8), col = (c % (cols / 8)) * 8;
        if (r >= rows || f0 + col >= a.n) continue;  // n % 8 == 0: a chunk is whole or out
        const float4 lo4 = *reinterpret_cast<const float4 *>(so + r * ld + col), hi4 = *reinterpret_cast<const float4 *>(so + r * ld + col + 4);
        *reinterpret_cast<uint4 *>(a.y + int64_t(row0 + r) * a.n + f0 + col) =
            make_uint4(pack_rn(lo4.x, lo4.y), pack_rn(lo4.z, lo4.w), pack_rn(hi4.x, hi4.y), pack_rn(hi4.z, hi4.w));
    }
#else
    __trap();  // launched only on sm90a_device()
#endif
}

template <bool SWIGLU> void launch(const MoeWgmmaGemm & g, cudaStream_t stream) {
    CUtensorMap w_map, x_map;
    if (!cache_tensor_map(&w_map, g.w, int64_t(g.n_experts) * g.w_rows, g.k, k_seg_rows)) {
        QINFER_FAIL() << "MoE grouped GEMM: the tensor map of the experts' weights [" << g.n_experts << " x " << g.w_rows << ", " << g.k << "] was refused";
    }
    if (!cache_tensor_map(&x_map, g.x, g.x_rows, g.k, k_bn)) {
        QINFER_FAIL() << "MoE grouped GEMM: the tensor map of the sorted rows [" << g.x_rows << ", " << g.k << "] was refused";
    }
    static PerDevice<size_t> configured;
    allow_dynamic_smem(moe_gemm_wgmma_kernel<SWIGLU>, k_smem_bytes, configured);
    constexpr int cols = SWIGLU ? k_segs / 2 * k_seg_rows : k_segs * k_seg_rows;
    const Args a{g.n, g.k, g.n_experts, g.w_rows, g.offsets, g.tiles, g.y};
    // Feature tiles fastest: the blocks of one row tile run together and share its inputs in L2.
    launch_kernel(moe_gemm_wgmma_kernel<SWIGLU>, dim3((g.n + cols - 1) / cols, g.max_tiles), dim3(k_threads), k_smem_bytes, stream, a,
                  w_map, x_map);
}

}  // namespace

void moe_gemm_wgmma(const MoeWgmmaGemm & g, cudaStream_t stream) {
    QINFER_CHECK(sm90a_device()) << "MoE grouped GEMM: the wgmma kernel needs an sm_90a build on a compute capability 9.0 device";
    QINFER_CHECK(g.k % 8 == 0 && g.n % 8 == 0) << "MoE grouped GEMM: n " << g.n << " and k " << g.k << " must be multiples of 8";
    if (g.max_tiles <= 0 || g.x_rows <= 0) return;
    if (g.swiglu) launch<true>(g, stream);
    else launch<false>(g, stream);
}

}  // namespace qinfer::cuda
