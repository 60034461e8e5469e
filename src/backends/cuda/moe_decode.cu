// The MoE block of a decode step with bf16 experts in two launches (ops.h, moe_decode), instead of the router's
// routing and grouping kernel, the routed experts' two GEMVs, the shared expert's two GEMVs on a second stream and the
// combine (moe.cu): seven kernels a layer, each a few microseconds of launch and tail for a few megabytes of weights.
//   1. gate/up: a block per (token, slot, 16 intermediate features). A slot is one of the token's top_k experts or one
//      slice of `inter` rows of the shared expert; blocks of routed slots route their token first (one warp, the
//      routing of moe.cu's kernels), so no kernel runs between the router and the experts.
//   2. down + combine: a block per (token, 8 output features); each warp reads its two features' rows of every slot's
//      down projection (top_k + slices loads in flight per lane and row), and adds the weighted sum into the residual
//      in moe_combine's order, so no grouping, no sorted rows and no combine kernel.
#include <algorithm>

#include "backends/cuda/common.cuh"
#include "backends/cuda/moe_route.cuh"
#include "backends/cuda/ops.h"

namespace qinfer::cuda {
namespace {

constexpr int k_gu_warps = 8;
constexpr int k_gu_out = 2;  // intermediate features a warp: its two gate rows and the matching two up rows
constexpr int k_dn_warps = 4;
constexpr int k_dn_out = 2;  // output features a warp

struct DecodeArgs {
    MoeDecode m;
    const bf16 * xn = nullptr;  // [c, hidden]
    int slices = 0;             // the shared expert's slices of inter rows (0: none)
    bf16 * act = nullptr;       // [c, slots, inter]
    float * x = nullptr;        // [c, hidden]
    bool accumulate = false;
};

__global__ void __launch_bounds__(k_gu_warps * 32) gate_up_kernel(DecodeArgs a) {
    pdl_wait();
    const MoeDecode & m = a.m;
    const int H = m.experts.hidden, I = m.experts.inter, k = m.top_k, slots = k + a.slices;
    const int t = blockIdx.y / slots, s = blockIdx.y % slots;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const bf16 * gate;  // row 0 of the slot's gate rows (its up rows follow `up_off` rows later), [., H]
    int64_t up_off;
    if (s < k) {
        __shared__ int ids[k_moe_max_topk];
        __shared__ float weights[k_moe_max_topk];
        if (warp == 0) route_token(m.logits + size_t(t) * m.stride, m.experts.n_experts, k, m.renormalise, ids, weights);
        __syncthreads();
        if (blockIdx.x == 0 && s == 0 && threadIdx.x < k) {
            m.ids[size_t(t) * k + threadIdx.x] = ids[threadIdx.x];
            m.weights[size_t(t) * k + threadIdx.x] = weights[threadIdx.x];
        }
        gate = m.experts.gate_up + int64_t(ids[s]) * 2 * I * H;
        up_off = I;
    } else {
        gate = m.shared_gate_up + int64_t(s - k) * I * H;
        up_off = m.shared_inter;
    }
    const int f0 = (blockIdx.x * k_gu_warps + warp) * k_gu_out;
    if (f0 >= I) return;
    constexpr int R = 2 * k_gu_out;
    const uint4 * wr[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        const int row = min(f0 + r % k_gu_out, I - 1);  // rows past I read a valid row, and are not written
        wr[r] = reinterpret_cast<const uint4 *>(gate + (row + (r >= k_gu_out ? up_off : 0)) * H);
    }
    const uint4 * xv = reinterpret_cast<const uint4 *>(a.xn + size_t(t) * H);
    const int chunks = H / 8;
    float acc[R] = {};
#pragma unroll 4
    for (int c = lane; c < chunks; c += 32) {
        const uint4 x = xv[c];
#pragma unroll
        for (int r = 0; r < R; r++) acc[r] += dot8(load_stream(wr[r] + c), x);
    }
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = warp_sum(acc[r]);
#pragma unroll
    for (int r = 0; r < k_gu_out; r++) {
        if (lane != r || f0 + r >= I) continue;
        // As transformers rounds: gate and up to bf16 (the projection's output), then silu(gate) * up.
        const float v = silu(__bfloat162float(__float2bfloat16(acc[r]))) * __bfloat162float(__float2bfloat16(acc[k_gu_out + r]));
        a.act[(size_t(t) * slots + s) * I + f0 + r] = __float2bfloat16(v);
    }
}

// MAX_SLOTS: the kernel's bound on top_k + slices (registers: MAX_SLOTS x k_dn_out sums a lane).
template <int MAX_SLOTS> __global__ void __launch_bounds__(k_dn_warps * 32) down_combine_kernel(DecodeArgs a) {
    pdl_wait();
    const MoeDecode & m = a.m;
    const int H = m.experts.hidden, I = m.experts.inter, k = m.top_k, slots = k + a.slices;
    const int t = blockIdx.y, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int f0 = (blockIdx.x * k_dn_warps + warp) * k_dn_out;
    if (f0 >= H) return;
    // Slot s's row of feature f0 and the distance to the next feature's row, in 16-byte chunks.
    const uint4 * wr[MAX_SLOTS];
    int ld[MAX_SLOTS];
#pragma unroll
    for (int s = 0; s < MAX_SLOTS; s++) {
        if (s >= slots) break;
        if (s < k) {
            wr[s] = reinterpret_cast<const uint4 *>(m.experts.down + (int64_t(m.ids[size_t(t) * k + s]) * H + f0) * I);
            ld[s] = I / 8;
        } else {
            wr[s] = reinterpret_cast<const uint4 *>(m.shared_down + int64_t(f0) * m.shared_inter + int64_t(s - k) * I);
            ld[s] = m.shared_inter / 8;
        }
    }
    const int second = f0 + 1 < H ? 1 : 0;  // the second feature's row (past H: the first's again, not written)
    const uint4 * act = reinterpret_cast<const uint4 *>(a.act + size_t(t) * slots * I);
    const int chunks = I / 8;
    float acc[MAX_SLOTS][k_dn_out] = {};
    for (int c = lane; c < chunks; c += 32) {
#pragma unroll
        for (int s = 0; s < MAX_SLOTS; s++) {
            if (s >= slots) break;
            const uint4 xv = act[s * chunks + c];
            acc[s][0] += dot8(load_stream(wr[s] + c), xv);
            acc[s][1] += dot8(load_stream(wr[s] + second * ld[s] + c), xv);
        }
    }
#pragma unroll
    for (int s = 0; s < MAX_SLOTS; s++) {
        if (s >= slots) break;
        acc[s][0] = warp_sum(acc[s][0]);
        acc[s][1] = warp_sum(acc[s][1]);
    }
#pragma unroll
    for (int r = 0; r < k_dn_out; r++) {
        if (lane != r || f0 + r >= H) continue;
        float * xp = a.x + size_t(t) * H + f0 + r;
        float v = a.accumulate ? *xp : 0.0f;
#pragma unroll
        for (int j = 0; j < MAX_SLOTS; j++) {
            if (j >= k) break;
            v += m.weights[size_t(t) * k + j] * __bfloat162float(__float2bfloat16(acc[j][r]));
        }
        if (a.slices > 0) {
            float shared = 0;
#pragma unroll
            for (int s = 0; s < MAX_SLOTS; s++) {
                if (s >= slots) break;
                if (s >= k) shared += acc[s][r];
            }
            const float gate = m.logits[size_t(t) * m.stride + m.experts.n_experts];
            v += 1.0f / (1.0f + expf(-gate)) * __bfloat162float(__float2bfloat16(shared));
        }
        *xp = v;
    }
}

}  // namespace

bool moe_decode_applies(int n_experts, int top_k, int hidden, int inter, int shared_inter) {
    if (n_experts < 1 || n_experts > k_moe_max_experts || top_k < 1 || top_k > std::min(k_moe_max_topk, n_experts)) return false;
    if (hidden % 8 != 0 || inter % 8 != 0 || inter <= 0 || shared_inter < 0 || shared_inter % inter != 0) return false;
    return top_k + shared_inter / inter <= k_moe_decode_max_slots;
}

size_t moe_decode_act_elems(int c, int top_k, int inter, int shared_inter) { return size_t(c) * (size_t(top_k) * inter + shared_inter); }

void moe_decode(const bf16 * xn, int c, const MoeDecode & m, bf16 * act, float * x, bool accumulate, cudaStream_t stream) {
    const MoeExperts & w = m.experts;
    const int shared_inter = m.shared_gate_up ? m.shared_inter : 0;
    QINFER_CHECK(moe_decode_applies(w.n_experts, m.top_k, w.hidden, w.inter, shared_inter))
        << "MoE decode: " << w.n_experts << " experts, top-" << m.top_k << ", hidden " << w.hidden << ", intermediate " << w.inter
        << ", shared " << shared_inter;
    QINFER_CHECK(c >= 1 && c <= k_moe_gemv_max_tokens) << "MoE decode: " << c << " tokens (at most " << k_moe_gemv_max_tokens << ")";
    DecodeArgs a;
    a.m = m;
    a.m.shared_inter = shared_inter;
    a.xn = xn;
    a.slices = shared_inter / w.inter;
    a.act = act;
    a.x = x;
    a.accumulate = accumulate;
    const int slots = m.top_k + a.slices;
    constexpr int gu_per_block = k_gu_warps * k_gu_out, dn_per_block = k_dn_warps * k_dn_out;
    launch_kernel(gate_up_kernel, dim3((w.inter + gu_per_block - 1) / gu_per_block, c * slots), dim3(k_gu_warps * 32), 0, stream, a);
    const dim3 grid((w.hidden + dn_per_block - 1) / dn_per_block, c);
    if (slots <= 8) launch_kernel(down_combine_kernel<8>, grid, dim3(k_dn_warps * 32), 0, stream, a);
    else launch_kernel(down_combine_kernel<k_moe_decode_max_slots>, grid, dim3(k_dn_warps * 32), 0, stream, a);
}

}  // namespace qinfer::cuda
