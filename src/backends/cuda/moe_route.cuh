// One token's routing by one warp (moe.cu, moe_decode.cu): softmax over the router's logits, top-k, optional
// renormalisation.
#pragma once

#include <climits>

#include "backends/cuda/common.cuh"
#include "backends/cuda/ops.h"

namespace qinfer::cuda {

constexpr int k_route_per_lane = k_moe_max_experts / 32;

// Token t's routing by one warp: p = softmax(logits) in fp32; top-k by repeated arg-max (largest first, ties to the
// lower expert: torch.topk's order, as the CPU path's stable sort); weights p, or p / sum of the chosen p
// (norm_topk_prob).
__device__ __forceinline__ void route_token(const float * lt, int E, int k, bool renormalise, int * ids, float * weights) {
    const int lane = threadIdx.x % 32;
    float p[k_route_per_lane];
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < k_route_per_lane; i++) {
        const int e = lane + 32 * i;
        p[i] = e < E ? lt[e] : -INFINITY;
        mx = fmaxf(mx, p[i]);
    }
    mx = warp_max(mx);
    float sum = 0;
#pragma unroll
    for (int i = 0; i < k_route_per_lane; i++) {
        p[i] = lane + 32 * i < E ? expf(p[i] - mx) : 0.0f;
        sum += p[i];
    }
    sum = warp_sum(sum);
#pragma unroll
    for (int i = 0; i < k_route_per_lane; i++) p[i] = lane + 32 * i < E ? p[i] / sum : -1.0f;  // -1: never chosen
    float chosen = 0, top = 0;
    for (int j = 0; j < k; j++) {
        // The lane's best as a key that orders as the probability (non-negative floats order as their bits; + 1
        // leaves 0 for "none"), then the warp's largest key and, among the lanes holding it, the lowest expert: two
        // warp reductions instead of ten shuffles a pick.
        unsigned key = 0;
        int best_e = INT_MAX;
#pragma unroll
        for (int i = 0; i < k_route_per_lane; i++) {
            const unsigned ki = p[i] >= 0.0f ? __float_as_uint(p[i]) + 1u : 0u;
            if (ki > key) {  // strict: this lane's experts rise with i, so ties keep the lower one
                key = ki;
                best_e = lane + 32 * i;
            }
        }
        const unsigned best_key = __reduce_max_sync(0xffffffffu, key);
        best_e = int(__reduce_min_sync(0xffffffffu, key == best_key ? unsigned(best_e) : 0xffffffffu));
        const float best = __uint_as_float(best_key - 1u);
#pragma unroll
        for (int i = 0; i < k_route_per_lane; i++) {
            if (lane + 32 * i == best_e) p[i] = -1.0f;
        }
        top += best;
        if (lane == j) chosen = best;
        if (lane == 0) ids[j] = best_e;
    }
    if (lane < k) weights[lane] = renormalise ? chosen / top : chosen;
}

__device__ __forceinline__ int load_acquire(const int * p) {
    int v;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// One token's routing handed from its gate/up launch to the down launch's blocks before their pdl_wait (MoeDecode::
// ids_ready, two ints zero between launches): the down blocks, resident while the gate/up launch still streams its
// weights, then request theirs at once. publish_ids: by every thread of the block that wrote ids (after the writes);
// ready[0] = 1. take_id: the down block's expert (every thread calls); it waits for ready[0], reads ids[p] and counts
// itself in on ready[1]; the launch's last block puts both back to zero (every block has read by then, and the next
// gate/up launch runs after this launch ends).
__device__ __forceinline__ void publish_ids(int * ready) {
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(ready), "r"(1) : "memory");
}
__device__ __forceinline__ int take_id(int * ready, const int * ids, int p) {
    __shared__ int s_id;
    if (threadIdx.x == 0) {
        while (load_acquire(ready) == 0) __nanosleep(32);
        s_id = __ldcg(ids + p);
        if (atomicAdd(ready + 1, 1) == int(gridDim.x * gridDim.y) - 1) {
            ready[1] = 0;
            ready[0] = 0;
        }
    }
    __syncthreads();
    return s_id;
}

}  // namespace qinfer::cuda
