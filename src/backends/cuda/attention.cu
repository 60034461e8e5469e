// Attention over the paged KV cache.
//   prefill: FlashAttention-2 on tensor cores (mma.sync m16n8k16 bf16): a block of 4 warps owns 64 queries of one
//            head; K/V tiles of 64 keys go through shared memory; online softmax in fp32 registers; no n^2 memory.
//   decode:  flash-decoding: the keys of one KV head are spread over a fixed grid of splits, each block reads its
//            keys once for all query heads sharing that KV head (GQA), and a second kernel combines the partial results.
// The launchers here also dispatch to the pipelined prefill kernel (attention_prefill_pipelined.cu) and the
// tensor-core decode kernel (attention_decode_tc.cu), which share this file's combine kernel and argument structs.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <type_traits>

#include "backends/cuda/attention_common.cuh"
#include "backends/cuda/common.cuh"
#include "backends/cuda/kv_quant.cuh"
#include "backends/cuda/ops.h"

namespace qinfer::cuda {

namespace {

// ---------------------------------------------------------------- prefill
constexpr int k_br = 64;  // queries per block (16 per warp)
constexpr int k_bc = 64;  // keys per tile

// D: head_dim padded to a multiple of 16 (32, 64, 128); the real head_dim a.d is a multiple of 8. K: the cache's
// kind; quantized tiles are dequantized to bf16 on their way into shared memory.
template <int D, KVKind K> __global__ void __launch_bounds__(128) attention_prefill_kernel(PrefillArgs a) {
    constexpr int ld_k = D + 8;  // padded rows (16 bytes): conflict-free fragment loads and ldmatrix
    __shared__ __align__(16) bf16 ks[k_bc * ld_k];  // K tile [key][dim]
    __shared__ __align__(16) bf16 vs[k_bc * ld_k];  // V tile [key][dim]

    // Heads vary fastest across the grid so the query heads sharing a KV head read its tiles from L2 together;
    // query tiles run last-first, the causal ones with the most keys before the light ones.
    const int head = blockIdx.x, kvh = head / (a.n_head / a.n_kv);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, tq = lane % 4;
    const int q_tile = (gridDim.y - 1 - blockIdx.y) * k_br;
    const int row0 = q_tile + warp * 16 + g, row1 = row0 + 8;  // query rows of this thread (relative to the chunk)

    // Q fragments (A operand), zero past n or past d.
    uint32_t qf[D / 16][4];
#pragma unroll
    for (int kc = 0; kc < D / 16; kc++) {
        const int c0 = kc * 16 + 2 * tq, c1 = c0 + 8;
        auto ld = [&](int row, int col) -> uint32_t {
            if (row >= a.n || col >= a.d) return 0u;
            return load_pair(a.q + (int64_t(row) * a.n_head + head) * a.d + col);
        };
        qf[kc][0] = ld(row0, c0);
        qf[kc][1] = ld(row1, c0);
        qf[kc][2] = ld(row0, c1);
        qf[kc][3] = ld(row1, c1);
    }

    float o[D / 8][4] = {};
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0, l1 = 0;
    const int last_row = min(q_tile + k_br, a.n) - 1;
    const int n_keys = a.pos0 + last_row + 1;  // causal: keys this block needs
    const int bs = a.cache.block_size;

    for (int k0 = 0; k0 < n_keys; k0 += k_bc) {
        __syncthreads();
        // K tile and transposed V tile, 8 elements (16 bytes) at a time.
        for (int c = threadIdx.x; c < k_bc * (D / 8); c += blockDim.x) {
            const int key = c / (D / 8), col = (c % (D / 8)) * 8, j = k0 + key;
            uint4 kv = make_uint4(0, 0, 0, 0), vv = make_uint4(0, 0, 0, 0);
            if (j < n_keys && col < a.d) {
                const int blk = a.cache.block_table[j / bs];
                const int64_t row = (int64_t(blk) * a.n_kv + kvh) * bs + j % bs;
                if constexpr (K == KVKind::BF16) {
                    kv = *reinterpret_cast<const uint4 *>(a.cache.k + row * a.d + col);
                    vv = *reinterpret_cast<const uint4 *>(a.cache.v + row * a.d + col);
                } else {
                    kv = dequant8_bf16<K>(a.cache.quant, false, row, a.d, col);
                    vv = dequant8_bf16<K>(a.cache.quant, true, row, a.d, col);
                }
            }
            *reinterpret_cast<uint4 *>(&ks[key * ld_k + col]) = kv;
            *reinterpret_cast<uint4 *>(&vs[key * ld_k + col]) = vv;
        }
        __syncthreads();

        // S = Q K^T: 16 rows x 64 keys per warp, as 8 n-tiles of 8 keys.
        float s[k_bc / 8][4];
#pragma unroll
        for (int nt = 0; nt < k_bc / 8; nt++) {
            s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0;
#pragma unroll
            for (int kc = 0; kc < D / 16; kc++) {
                const bf16 * kr = &ks[(nt * 8 + g) * ld_k + kc * 16 + 2 * tq];
                mma_16816(s[nt], qf[kc], load_pair(kr), load_pair(kr + 8));
            }
        }
        // Scale into the log2 domain and mask (causal, and keys/rows past the end).
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < k_bc / 8; nt++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int key = k0 + nt * 8 + 2 * tq + (e & 1);
                const int row = e < 2 ? row0 : row1;
                const bool ok = row < a.n && key <= a.pos0 + row;
                s[nt][e] = ok ? s[nt][e] * a.scale_log2 : -INFINITY;
            }
            mx0 = fmaxf(mx0, fmaxf(s[nt][0], s[nt][1]));
            mx1 = fmaxf(mx1, fmaxf(s[nt][2], s[nt][3]));
        }
        const SoftmaxStep st = online_softmax_step(mx0, mx1, m0, m1);
        const float ref0 = st.ref.x, ref1 = st.ref.y, alpha0 = st.alpha.x, alpha1 = st.alpha.y;
        l0 *= alpha0;
        l1 *= alpha1;
#pragma unroll
        for (int dt = 0; dt < D / 8; dt++) {
            o[dt][0] *= alpha0;
            o[dt][1] *= alpha0;
            o[dt][2] *= alpha1;
            o[dt][3] *= alpha1;
        }
        // P = exp2(S - m), accumulated into l, and packed as bf16 A fragments (16 keys per fragment).
        uint32_t pf[k_bc / 16][4];
#pragma unroll
        for (int nt = 0; nt < k_bc / 8; nt++) {
            const float p0 = exp2f(s[nt][0] - ref0), p1 = exp2f(s[nt][1] - ref0);
            const float p2 = exp2f(s[nt][2] - ref1), p3 = exp2f(s[nt][3] - ref1);
            l0 += p0 + p1;
            l1 += p2 + p3;
            pf[nt / 2][(nt % 2) * 2 + 0] = pack_bf16(p0, p1);
            pf[nt / 2][(nt % 2) * 2 + 1] = pack_bf16(p2, p3);
        }
        // O += P V; the B fragments (V[key][dim] read down a column) come from ldmatrix.trans: lanes 0-15 give the
        // addresses of the 16 key rows of the chunk.
#pragma unroll
        for (int dt = 0; dt < D / 8; dt++) {
#pragma unroll
            for (int kc = 0; kc < k_bc / 16; kc++) {
                const bf16 * row = &vs[(kc * 16 + (lane % 16)) * ld_k + dt * 8];
                uint32_t b0, b1;
                const uint32_t addr = uint32_t(__cvta_generic_to_shared(row));
                asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n" : "=r"(b0), "=r"(b1) : "r"(addr));
                mma_16816(o[dt], pf[kc], b0, b1);
            }
        }
    }
    store_prefill_rows<D / 8, false>(&o[0][0], l0, l1, row0, row1, a, head);
}

// ---------------------------------------------------------------- decode
// grid (max_splits, n_kv, batch): block (s, h, b) reads, for sequence b of the batch, each key and value of its split once for all n_rep query heads of
// KV head h (GQA packing). A key is handled by LPK lanes that hold EPL consecutive dims each, so a warp takes
// 32 / LPK keys per step with coalesced row reads; every lane group keeps an online softmax (m, l, o) per head,
// merged across lane groups by shuffles and across warps through shared memory into the split's partial result.
// K: the cache's kind; quantized codes are dequantized in registers.
template <int D, KVKind K> __global__ void __launch_bounds__(k_decode_threads) attention_decode_kernel(DecodeArgs a) {
    pdl_wait();
    constexpr int LPK = D >= 128 ? 16 : D >= 64 ? 8 : 4;  // lanes per key
    constexpr int EPL = (D + LPK - 1) / LPK;              // dims per lane
    constexpr int KPW = 32 / LPK;                         // keys per warp step
    static_assert(EPL % 2 == 0, "dims per lane must be even");
    static_assert(K == KVKind::BF16 || EPL % 4 == 0, "quantized caches: whole 32-bit words of codes per lane");
    constexpr int RW = K == KVKind::BF16 ? EPL / 2 : EPL / 4;  // raw 32-bit words per lane, for K and for V
    const int split_id = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;
    const int len = a.len_dev[b];
    const int split = decode_split_size(len, a.scratch.max_splits, a.min_split);
    const int begin = split_id * split;
    if (begin >= len) return;
    const int end = min(len, begin + split);
    const int n_rep = a.n_head / a.n_kv;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, sub = lane / LPK, sl = lane % LPK;
    const int d0 = sl * EPL;  // first dim of this lane
    const bool lane_dims = d0 < D;

    float q[k_max_rep][EPL];
#pragma unroll
    for (int r = 0; r < k_max_rep; r++) {
#pragma unroll
        for (int e = 0; e < EPL; e++) {
            const int c = d0 + e;
            q[r][e] = (r < n_rep && c < D) ? __bfloat162float(a.q[((int64_t(b) * a.n_head) + kvh * n_rep + r) * D + c]) * a.scale : 0.f;
        }
    }
    float m[k_max_rep], l[k_max_rep], o[k_max_rep][EPL];
#pragma unroll
    for (int r = 0; r < k_max_rep; r++) {
        m[r] = -INFINITY;
        l[r] = 0;
#pragma unroll
        for (int e = 0; e < EPL; e++) o[r][e] = 0;
    }
    // The split's block-table entries, fetched once (a split spans at most k_decode_max_split_keys / 16 + 1 blocks).
    const int bs = a.cache.block_size;
    __shared__ int blocks[k_decode_max_split_keys / 16 + 2];
    const int first_block = begin / bs;
    const int * table = a.cache.block_table + int64_t(b) * a.cache.table_stride;
    for (int i = threadIdx.x; i <= (end - 1) / bs - first_block; i += k_decode_threads) blocks[i] = table[first_block + i];
    __syncthreads();
    // K/V of the lane's key as raw words (bf16 pairs or codes, with the rows' scale and zero); the next step's are
    // loaded before this step's arithmetic.
    struct Raw {
        uint32_t k[RW], v[RW];
        float2 k_sz, v_sz;
    };
    const KVQuant & kq = a.cache.quant;
    float fp8_k = 0.f, fp8_v = 0.f;
    if constexpr (K == KVKind::FP8) {
        fp8_k = kq.fp8_scale[0];
        fp8_v = kq.fp8_scale[1];
    }
    auto load = [&](int j, Raw & r) {
        r.k_sz = r.v_sz = make_float2(0.f, 0.f);
        if (j < end && lane_dims) {
            const int64_t row = (int64_t(blocks[j / bs - first_block]) * a.n_kv + kvh) * bs + j % bs;
            if constexpr (K == KVKind::BF16) {
#pragma unroll
                for (int e = 0; e < RW; e++) {
                    r.k[e] = __ldg(reinterpret_cast<const unsigned int *>(a.cache.k + row * D + d0) + e);
                    r.v[e] = __ldg(reinterpret_cast<const unsigned int *>(a.cache.v + row * D + d0) + e);
                }
            } else {
                kv_load_codes<K, EPL>(kq, false, row, D, d0, r.k);
                kv_load_codes<K, EPL>(kq, true, row, D, d0, r.v);
                if constexpr (K == KVKind::INT8 || K == KVKind::INT4) {
                    r.k_sz = kq.k_sz[row];
                    r.v_sz = kq.v_sz[row];
                }
            }
        } else {
#pragma unroll
            for (int e = 0; e < RW; e++) r.k[e] = r.v[e] = 0;
        }
    };
    constexpr int step = k_decode_warps * KPW;
    Raw cur, next;
    int j = begin + warp * KPW + sub;
    load(j, cur);
    for (int j0 = begin + warp * KPW; j0 < end; j0 += step, j += step) {
        load(j + step, next);
        const bool valid = j < end;
        float kf[EPL], vf[EPL];
        if constexpr (K == KVKind::BF16) {
#pragma unroll
            for (int e = 0; e < EPL / 2; e++) {
                const float2 kk = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&cur.k[e]));
                const float2 vv = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&cur.v[e]));
                kf[2 * e] = kk.x;
                kf[2 * e + 1] = kk.y;
                vf[2 * e] = vv.x;
                vf[2 * e + 1] = vv.y;
            }
        } else {
            kv_dequant<K, EPL>(cur.k, d0 >= D / 2, cur.k_sz, fp8_k, kf);
            kv_dequant<K, EPL>(cur.v, d0 >= D / 2, cur.v_sz, fp8_v, vf);
        }
#pragma unroll
        for (int r = 0; r < k_max_rep; r++) {
            if (r >= n_rep) continue;
            float sc = 0;
#pragma unroll
            for (int e = 0; e < EPL; e++) sc += q[r][e] * kf[e];
#pragma unroll
            for (int off = 1; off < LPK; off <<= 1) sc += __shfl_xor_sync(0xffffffffu, sc, off);
            if (!valid) continue;
            const float m_new = fmaxf(m[r], sc);
            const float corr = __expf(m[r] - m_new), p = __expf(sc - m_new);
            l[r] = l[r] * corr + p;
#pragma unroll
            for (int e = 0; e < EPL; e++) o[r][e] = o[r][e] * corr + p * vf[e];
            m[r] = m_new;
        }
        cur = next;
    }
    // Merge the lane groups of the warp (different keys, same dims).
#pragma unroll
    for (int off = LPK; off < 32; off <<= 1) {
#pragma unroll
        for (int r = 0; r < k_max_rep; r++) {
            const float mo = __shfl_xor_sync(0xffffffffu, m[r], off), lo = __shfl_xor_sync(0xffffffffu, l[r], off);
            const float mn = fmaxf(m[r], mo);
            const float c0 = mn == -INFINITY ? 0.f : __expf(m[r] - mn), c1 = mn == -INFINITY ? 0.f : __expf(mo - mn);
            l[r] = l[r] * c0 + lo * c1;
#pragma unroll
            for (int e = 0; e < EPL; e++) o[r][e] = o[r][e] * c0 + __shfl_xor_sync(0xffffffffu, o[r][e], off) * c1;
            m[r] = mn;
        }
    }
    // Merge the warps.
    __shared__ float wm[k_decode_warps][k_max_rep], wl[k_decode_warps][k_max_rep];
    __shared__ float wo[k_decode_warps][k_max_rep][D];
    if (lane == 0) {
#pragma unroll
        for (int r = 0; r < k_max_rep; r++) {
            wm[warp][r] = m[r];
            wl[warp][r] = l[r];
        }
    }
    if (sub == 0 && lane_dims) {
#pragma unroll
        for (int r = 0; r < k_max_rep; r++) {
#pragma unroll
            for (int e = 0; e < EPL; e++) {
                if (d0 + e < D) wo[warp][r][d0 + e] = o[r][e];
            }
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < n_rep * D; i += k_decode_threads) {
        const int r = i / D, c = i % D;
        float mx = -INFINITY;
#pragma unroll
        for (int w = 0; w < k_decode_warps; w++) mx = fmaxf(mx, wm[w][r]);
        float lsum = 0, osum = 0;
#pragma unroll
        for (int w = 0; w < k_decode_warps; w++) {
            const float cw = wm[w][r] == -INFINITY ? 0.f : __expf(wm[w][r] - mx);
            lsum += wl[w][r] * cw;
            osum += wo[w][r][c] * cw;
        }
        const int64_t row = (int64_t(b) * a.n_head + kvh * n_rep + r) * a.scratch.max_splits + split_id;
        a.scratch.partial_out[row * D + c] = osum;
        if (c == 0) {
            a.scratch.partial_ml[row * 2] = mx;
            a.scratch.partial_ml[row * 2 + 1] = lsum;
        }
    }
}

// grid (n_head, batch): out[b, h] = sum_s e^(m_s - M) o_s / sum_s e^(m_s - M) l_s over the active splits. 256 threads
// in (split lane r, float4 column c): lane r takes splits r, r + R, ... (R = 256 / (D / 4)), requesting
// k_combine_batch of them before it merges any, and keeps its own running maximum, rescaling its sums as it goes (the
// online softmax's merge), so a split's (m, l) and O rows are requested together and up to 8 R splits cost one L2
// round trip; the lanes meet in a fixed order at the end. Against a first pass for M over all splits (a round trip
// and a block barrier more), H100, alternated: 0.5B BF16 1349.9 -> 1359.2 tok/s, 1.5B 642.3 -> 651.5
// (bench/results/2026-11-27-h100-combine). A warp per split row, 4 warps (the kernel before both), took 1.4 us more
// per layer at 30720 keys (perf-log, 63c7ee9).
constexpr int k_combine_threads = 256;
// Splits a lane requests before merging them. Against `#pragma unroll 4` over the merge loop (H100, alternated): 0.5B
// at 30720 +2.1% (twelve splits a lane), 7B +0.2-0.3% (its combine 6.8 -> 6.3 us a layer at 30720 keys, still far
// above the 2.6 at 65 keys: not the loads in flight), input 1 level (bench/results/2026-11-28-h100-trace).
constexpr int k_combine_batch = 8;
template <int D>
__global__ void __launch_bounds__(k_combine_threads) attention_combine_kernel(DecodeScratch s, const int * len_dev, int min_split, bf16 * out) {
    pdl_wait();
    static_assert(D % 4 == 0, "whole float4 columns");
    constexpr int cols = D / 4, lanes = k_combine_threads / cols;
    __shared__ float4 part[lanes][cols];
    __shared__ float part_l[lanes], part_m[lanes];
    __shared__ float lane_w[lanes];  // lane j's weight e^(m_j - M); lanes without splits weigh 0
    const int h = blockIdx.y * gridDim.x + blockIdx.x;  // row of [batch, n_head]
    const int len = len_dev[blockIdx.y];
    const int split = decode_split_size(len, s.max_splits, min_split);
    const int splits = (len + split - 1) / split;
    const float2 * ml = reinterpret_cast<const float2 *>(s.partial_ml) + int64_t(h) * s.max_splits;  // (m, l) per split

    const int r = threadIdx.x / cols, c = threadIdx.x % cols;
    if (r < lanes) {
        const float4 * po = reinterpret_cast<const float4 *>(s.partial_out + int64_t(h) * s.max_splits * D) + c;
        float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
        float lsum = 0, mx = -INFINITY;
        for (int i0 = r; i0 < splits; i0 += lanes * k_combine_batch) {
            float2 mlv[k_combine_batch];  // (m, l) of splits i0, i0 + lanes, ...
            float4 ov[k_combine_batch];   // their O rows' column c
#pragma unroll
            for (int u = 0; u < k_combine_batch; u++) {
                const int i = i0 + u * lanes;
                mlv[u] = i < splits ? ml[i] : make_float2(-INFINITY, 0.f);
                ov[u] = i < splits ? po[int64_t(i) * cols] : make_float4(0.f, 0.f, 0.f, 0.f);
            }
#pragma unroll
            for (int u = 0; u < k_combine_batch; u++) {
                if (i0 + u * lanes >= splits) break;
                const float m_new = fmaxf(mx, mlv[u].x);
                const float rescale = __expf(mx - m_new);  // 0 at the lane's first split (mx = -inf)
                const float w = __expf(mlv[u].x - m_new);
                acc.x *= rescale;
                acc.y *= rescale;
                acc.z *= rescale;
                acc.w *= rescale;
                lsum *= rescale;
                mx = m_new;
                acc.x += w * ov[u].x;
                acc.y += w * ov[u].y;
                acc.z += w * ov[u].z;
                acc.w += w * ov[u].w;
                lsum += w * mlv[u].y;
            }
        }
        part[r][c] = acc;
        if (c == 0) {
            part_l[r] = lsum;
            part_m[r] = mx;
        }
    }
    __syncthreads();
    if (threadIdx.x < lanes) {
        float top = -INFINITY;
        for (int j = 0; j < lanes; j++) top = fmaxf(top, part_m[j]);
        lane_w[threadIdx.x] = __expf(part_m[threadIdx.x] - top);
    }
    __syncthreads();
    for (int e = threadIdx.x; e < D; e += k_combine_threads) {
        float t = 0, l = 0;
#pragma unroll
        for (int j = 0; j < lanes; j++) {
            const float w = lane_w[j];
            t += w * reinterpret_cast<const float *>(part[j])[e];
            l += w * part_l[j];
        }
        out[int64_t(h) * D + e] = __float2bfloat16(t / l);
    }
}

template <int D> void launch_combine(const DecodeScratch & scratch, const int * len_dev, int min_split, bf16 * out, int n_head, int batch,
                                     bool short_context, cudaStream_t stream) {
    ScopedNoPdl no_pdl(!short_context);
    launch_kernel(attention_combine_kernel<D>, dim3(n_head, batch), k_combine_threads, 0, stream, scratch, len_dev, min_split, out);
}

}  // namespace

const char * prefill_kernel_name(PrefillKernel kernel) {
    switch (kernel) {
    case PrefillKernel::Auto: return "auto";
    case PrefillKernel::Tiled: return "tiled";
    case PrefillKernel::Pipelined: return "pipelined";
    case PrefillKernel::Wgmma: return "wgmma";
    case PrefillKernel::Tma: return "tma";
    case PrefillKernel::TmaPingpong: return "tma-pingpong";
    }
    return "?";
}

void attention_prefill(const bf16 * q, const KVLayer & cache, int n, int pos0, int n_head, int n_kv, int head_dim, bf16 * out,
                       cudaStream_t stream, PrefillKernel kernel) {
    if (n == 0) return;
    if (head_dim % 8 != 0) QINFER_FAIL() << "attention_prefill: head_dim " << head_dim << " must be a multiple of 8";
    PrefillArgs a{q, cache, out, n, pos0, n_head, n_kv, head_dim, float(1.0 / std::sqrt(double(head_dim)) * M_LOG2E)};
    if (cache.quant.kind == KVKind::INT4 && head_dim % 16 != 0) QINFER_FAIL() << "attention_prefill: an int4 cache needs head_dim % 16 == 0";
    if (kernel == PrefillKernel::Auto) {
        if (head_dim != 64 && head_dim != 128) kernel = PrefillKernel::Tiled;
        else if (!prefill_wgmma_available(head_dim)) kernel = PrefillKernel::Pipelined;
        else kernel = PrefillKernel::TmaPingpong;
    }
    if (kernel == PrefillKernel::Tma || kernel == PrefillKernel::TmaPingpong) {
        if (launch_attention_prefill_tma(a, kernel == PrefillKernel::TmaPingpong, stream)) return;
        kernel = PrefillKernel::Wgmma;
    }
    if (kernel == PrefillKernel::Wgmma) {
        if (launch_attention_prefill_wgmma(a, stream)) return;
        QINFER_FAIL() << "attention_prefill: the wgmma kernel needs an sm_90a build on a compute capability 9.0 GPU and head_dim 64 or 128 (got "
                      << head_dim << ")";
    }
    if (kernel == PrefillKernel::Pipelined) {
        if (launch_attention_prefill_pipelined(a, stream)) return;
        QINFER_FAIL() << "attention_prefill: the pipelined kernel takes head_dim 64 or 128 (got " << head_dim << ")";
    }
    dim3 grid(n_head, (n + k_br - 1) / k_br);
    auto run = [&](auto d_const) {
        constexpr int D = decltype(d_const)::value;
        for_kv_kind(cache.quant.kind, [&](auto kind) { attention_prefill_kernel<D, decltype(kind)::value><<<grid, 128, 0, stream>>>(a); });
        CUDA_CHECK(cudaGetLastError());
    };
    if (head_dim <= 32) return run(std::integral_constant<int, 32>{});
    if (head_dim <= 64) return run(std::integral_constant<int, 64>{});
    if (head_dim <= 128) return run(std::integral_constant<int, 128>{});
    QINFER_FAIL() << "attention_prefill: head_dim " << head_dim << " > 128 is not supported";
}

void attention_prefill_pieces(const PrefillPiece * pieces, int count, const KVLayer & cache, int n_head, int n_kv, int head_dim, cudaStream_t stream,
                              const PrefillSplitScratch * split) {
    if (count <= 0) return;
    const PrefillArgs a{nullptr, cache, nullptr, 0, 0, n_head, n_kv, head_dim, float(1.0 / std::sqrt(double(head_dim)) * M_LOG2E)};
    int done = 0;
    while (done < count) {
        PrefillPieceList list;
        list.count = std::min(count - done, k_prefill_pieces);
        std::copy(pieces + done, pieces + done + list.count, list.piece);
        if (!launch_attention_prefill_tma_pieces(a, list, true, count == 1 ? split : nullptr, stream)) break;  // not where the kernel applies: one each below
        done += list.count;
    }
    for (; done < count; done++) {
        KVLayer c = cache;
        c.block_table = pieces[done].block_table;
        attention_prefill(pieces[done].q, c, pieces[done].n, pieces[done].pos0, n_head, n_kv, head_dim, pieces[done].out, stream);
    }
}

// K/V tiles the tensor-core decode kernel keeps resident: 3 (two loading while one is used) at head_dim 128, where
// its 104 KB of shared memory leave room for two blocks per SM, else 2.
// 7B's shapes (28/4 heads, caches of several layers in turn, H100), against 2 stages at 3 blocks per SM, same call:
// 36.5 -> 35.4 us per layer at 30720 keys, 116.3 -> 113.3 at 129024, 11.1 -> 10.9-11.3 at 2048; at head_dim 64
// (0.5B) 3 stages were not faster at 4097 keys (perf-log, 63c7ee9).
int decode_tc_stages(int head_dim) { return head_dim == 128 ? 3 : 2; }

// Blocks per SM the splits aim for: as many as the tensor-core kernel holds (2 with three stages, else 3).
// Fewer, longer splits pay the per-block start (block table,
// Q fragments, first tile) less often: the two-stage kernel at 129024 keys (d 128, 14/2 heads, H100) took 91 us at 8
// blocks per SM, 65 at 3, 64 at 2, 78 at 4; at 4097 keys 12.9 / 11.9 / 12.1 / 12.0 us (perf-log). tools/plan.cpp's
// memory model sizes the scratch for 3 x 132 blocks, the most.
static int decode_blocks_per_sm(int head_dim) { return decode_tc_stages(head_dim) == 3 ? 2 : 3; }

// On by default (H100, alternated: 0.5B BF16 +2.1%, 1.5B +1.0%, 7B +0.3%, 0.5B GPTQ-Int4 +2.6%;
// bench/results/2026-11-27-h100-early-kv); set_decode_early_kv(false) turns it off (tests).
static std::atomic<bool> decode_early_kv_on{true};

void set_decode_early_kv(bool on) { decode_early_kv_on = on; }
void reset_decode_early_kv() { decode_early_kv_on = true; }

int decode_splits(int max_len, int n_kv, int head_dim, int batch) {
    return decode_splits_for(max_len, n_kv, batch, decode_blocks_per_sm(head_dim) * sm_count());
}

void attention_decode(const bf16 * q, const KVLayer & cache, const int * len_dev, int n_head, int n_kv, int head_dim,
                      const DecodeScratch & scratch, bf16 * out, cudaStream_t stream, int batch, DecodeKernel kernel,
                      bool short_context) {
    if (batch < 1 || batch > 65535) QINFER_FAIL() << "attention_decode: batch " << batch;
    const int n_rep = n_head / n_kv;
    if (n_rep > k_max_rep_tc) QINFER_FAIL() << "attention_decode: " << n_rep << " query heads per KV head (max " << k_max_rep_tc << ")";
    if (scratch.max_splits > 1024) QINFER_FAIL() << "attention_decode: more than 1024 splits";
    DecodeArgs a{q, cache, len_dev, n_head, n_kv, float(1.0 / std::sqrt(double(head_dim))), scratch, 16};
    dim3 grid(scratch.max_splits, n_kv, batch);
    if (kernel == DecodeKernel::Auto) {
        kernel = head_dim == 64 || head_dim == 128 ? DecodeKernel::TensorCore : DecodeKernel::Simt;
        if (kernel == DecodeKernel::TensorCore && decode_tma_applies(cache, head_dim, n_rep)) kernel = DecodeKernel::TensorCoreTma;
    }
    if (kernel == DecodeKernel::Simt && n_rep > k_max_rep) {
        QINFER_FAIL() << "attention_decode: " << n_rep << " query heads per KV head need the tensor-core kernel (head_dim 64 or 128; the SIMT one takes "
                      << k_max_rep << ")";
    }
    if (kernel == DecodeKernel::TensorCore || kernel == DecodeKernel::TensorCoreTma) {
        a.early_kv = decode_early_kv_on;
        // One split (large batches): the kernel normalizes and writes out itself. At 256 rows of 7B (H200) the
        // combine's 7168 blocks had cost 22 us a layer after a 51 us split kernel.
        if (scratch.max_splits == 1) a.out = out;
        const bool launched = kernel == DecodeKernel::TensorCoreTma ? launch_attention_decode_tma(a, head_dim, grid, stream)
                                                                    : launch_attention_decode_tc(a, head_dim, grid, stream);
        if (!launched) {
            QINFER_FAIL() << "attention_decode: the " << (kernel == DecodeKernel::TensorCoreTma ? "tensor-copy" : "tensor-core")
                          << " kernel does not take this cache (head_dim " << head_dim << ", block size " << cache.block_size << ")";
        }
        if (a.out) return;
        a.min_split = 64;
        auto combine = [&](auto d_const) {
            constexpr int D = decltype(d_const)::value;
            launch_combine<D>(scratch, len_dev, a.min_split, out, n_head, batch, short_context, stream);
        };
        if (head_dim == 64) combine(std::integral_constant<int, 64>{});
        else combine(std::integral_constant<int, 128>{});
        CUDA_CHECK(cudaGetLastError());
        return;
    }
    const KVKind kind = cache.quant.kind;
    if (kind != KVKind::BF16 && head_dim == 24) QINFER_FAIL() << "attention_decode: quantized caches need head_dim 16, 32, 64 or 128";
    if (kind == KVKind::INT4 && head_dim % 16 != 0) QINFER_FAIL() << "attention_decode: an int4 cache needs head_dim % 16 == 0";
    auto run = [&](auto d_const) {
        constexpr int D = decltype(d_const)::value;
        if constexpr (D == 24) {
            launch_kernel(attention_decode_kernel<D, KVKind::BF16>, grid, k_decode_threads, 0, stream, a);
        } else {
            for_kv_kind(kind, [&](auto k) { launch_kernel(attention_decode_kernel<D, decltype(k)::value>, grid, k_decode_threads, 0, stream, a); });
        }
        CUDA_CHECK(cudaGetLastError());
        launch_combine<D>(scratch, len_dev, a.min_split, out, n_head, batch, short_context, stream);
    };
    switch (head_dim) {
    case 16: return run(std::integral_constant<int, 16>{});
    case 24: return run(std::integral_constant<int, 24>{});
    case 32: return run(std::integral_constant<int, 32>{});
    case 64: return run(std::integral_constant<int, 64>{});
    case 128: return run(std::integral_constant<int, 128>{});
    default: QINFER_FAIL() << "attention_decode: head_dim " << head_dim << " is not supported (16, 24, 32, 64, 128)";
    }
}

}  // namespace qinfer::cuda
