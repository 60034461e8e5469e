// Pieces shared by the attention kernels: tensor-core fragments (mma.sync m16n8k16, bf16 or fp16 inputs) and the
// decode split arguments.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "backends/cuda/common.cuh"
#include "backends/cuda/kv_quant.cuh"
#include "backends/cuda/ops.h"
#include "backends/cuda/wgmma.cuh"

namespace qinfer::cuda {

// d[16 x 8] += a[16 x 16] b[16 x 8] with fp32 accumulators; inputs bf16 (T = bf16) or fp16 (T = __half).
template <class T = bf16> __device__ __forceinline__ void mma_16816(float * c, const uint32_t * a, uint32_t b0, uint32_t b1) {
    static_assert(std::is_same_v<T, bf16> || std::is_same_v<T, __half>, "bf16 or fp16 inputs");
    if constexpr (std::is_same_v<T, bf16>) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
}

// Max over the four lanes of an m16n8 fragment's quad (they hold one row).
__device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

__device__ __forceinline__ uint32_t load_pair(const bf16 * p) { return *reinterpret_cast<const uint32_t *>(p); }

struct PrefillArgs {
    const bf16 * q;  // [n, n_head, d]
    KVLayer cache;
    bf16 * out;  // [n, n_head, d]
    int n, pos0, n_head, n_kv, d;
    float scale_log2;  // head_dim^-0.5 * log2(e)
};

// The end of a prefill kernel's online softmax for a warp's rows row0 and row1 = row0 + 8 (lane quads share a row):
// sums l over the quad, divides, and stores the DT m16n8 accumulator fragments o (o[4 dt + e]: row0 for e < 2, row1
// else, column 8 dt + 2 (lane % 4) + e % 2) as bf16 to out [n, n_head, d]. EXACT: d == 8 DT (a compile-time stride);
// else columns at or past d are skipped.
template <int DT, bool EXACT>
__device__ __forceinline__ void store_prefill_rows(const float * o, float l0, float l1, int row0, int row1, const PrefillArgs & a, int head) {
    const int d = EXACT ? 8 * DT : a.d;
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    const float inv0 = l0 > 0 ? 1.0f / l0 : 0.f, inv1 = l1 > 0 ? 1.0f / l1 : 0.f;
#pragma unroll
    for (int dt = 0; dt < DT; dt++) {
        const int col = dt * 8 + 2 * (threadIdx.x % 4);
        if (!EXACT && col >= d) continue;
        if (row0 < a.n) {
            *reinterpret_cast<__nv_bfloat162 *>(a.out + (int64_t(row0) * a.n_head + head) * d + col) =
                __floats2bfloat162_rn(o[dt * 4 + 0] * inv0, o[dt * 4 + 1] * inv0);
        }
        if (row1 < a.n) {
            *reinterpret_cast<__nv_bfloat162 *>(a.out + (int64_t(row1) * a.n_head + head) * d + col) =
                __floats2bfloat162_rn(o[dt * 4 + 2] * inv1, o[dt * 4 + 3] * inv1);
        }
    }
}

// launch(std::integral_constant<KVKind, K>{}) for the cache's kind: one kernel instantiation per kind.
template <class Launch> void for_kv_kind(KVKind kind, Launch && launch) {
    switch (kind) {
    case KVKind::BF16: return launch(std::integral_constant<KVKind, KVKind::BF16>{});
    case KVKind::FP8: return launch(std::integral_constant<KVKind, KVKind::FP8>{});
    case KVKind::INT8: return launch(std::integral_constant<KVKind, KVKind::INT8>{});
    case KVKind::INT4: return launch(std::integral_constant<KVKind, KVKind::INT4>{});
    }
}

// The pipelined prefill kernel (attention_prefill_pipelined.cu) for head_dim 64 and 128; false for others.
bool launch_attention_prefill_pipelined(const PrefillArgs & a, cudaStream_t stream);
// The warpgroup-MMA prefill kernel (attention_prefill_wgmma.cu): false where prefill_wgmma_available is.
bool launch_attention_prefill_wgmma(const PrefillArgs & a, cudaStream_t stream);
// The warp-specialised form (attention_prefill_tma.cu), its consumers taking turns to issue MMAs where `pingpong`:
// false where it does not apply (see PrefillKernel::Tma).
bool launch_attention_prefill_tma(const PrefillArgs & a, bool pingpong, cudaStream_t stream);
// The same kernel over several pieces (attention_prefill_pieces): a's q, out, n, pos0 and block table come from each
// piece; a.cache gives the layer's arrays. 1 <= count <= k_prefill_pieces.
struct PrefillPieceList {
    int count = 0;
    PrefillPiece piece[k_prefill_pieces];
};
// With scratch (one piece), the launch's last-wave pairs may run in key splits (model/prefill_splits.h).
bool launch_attention_prefill_tma_pieces(const PrefillArgs & a, const PrefillPieceList & pieces, bool pingpong, const PrefillSplitScratch * scratch,
                                         cudaStream_t stream);

// Dims [col, col + 8) of a quantized cache row as 8 bf16 (one 16-byte shared-memory store).
template <KVKind K> __device__ __forceinline__ uint4 dequant8_bf16(const KVQuant & q, bool value, int64_t row, int d, int col) {
    uint32_t w[2];
    kv_load_codes<K, 8>(q, value, row, d, col, w);
    float2 sz = make_float2(0.f, 0.f);
    float fp8_scale = 0.f;
    if constexpr (K == KVKind::FP8) fp8_scale = q.fp8_scale[value ? 1 : 0];
    else sz = (value ? q.v_sz : q.k_sz)[row];
    float x[8];
    kv_dequant<K, 8>(w, col >= d / 2, sz, fp8_scale, x);
    return make_uint4(pack_bf16(x[0], x[1]), pack_bf16(x[2], x[3]), pack_bf16(x[4], x[5]), pack_bf16(x[6], x[7]));
}

// 8 bytes global -> shared (cp.async.ca; the .cg form takes only 16); valid false zero-fills them.
__device__ __forceinline__ void cp_async8(void * smem, const void * gmem, bool valid) {
    const uint32_t dst = uint32_t(__cvta_generic_to_shared(smem));
    const int bytes = valid ? 8 : 0;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst), "l"(gmem), "r"(bytes));
}

// K/V tiles of KEYS keys of one KV head streaming through shared memory with the next tile in flight (cp.async).
// A bf16 cache is copied into two bf16 tile stages. A quantized cache's codes and per-row (scale, zero) are copied
// raw into two code stages and dequantized into one bf16 tile when that tile is used, so its global loads stay
// asynchronous too (dequantizing on the way in through registers made the int8 cache slower than bf16).
// Shared memory (smem_bytes): bf16 [2 stages][K, V][KEYS][ld]; quantized [K, V][KEYS][ld] bf16 and then
// [2 stages][K codes, V codes][KEYS][row_bytes] + [K, V][KEYS] float2 (int8/int4). Keys at or past `end` are zero.
// Use: load(0); per tile t: load(t + 1) if any, ready(t, t + 1 < n_tiles), compute, __syncthreads(). With three
// stages two tiles may be ahead: load(0), load(1); per tile t: load(t + 2) if any, ready(t, tiles loaded past t), ...
// SWIZZLE: the bf16 tiles in wgmma's 128-byte-swizzled panels (wgmma.cuh; the smem base 1024-byte aligned) instead
// of padded rows, and ready() makes them visible to the async proxy. STAGES (bf16 caches): tiles resident at once
// (3: a tile stays readable while the next is used and the one after is loaded).
template <int D, KVKind K, int THREADS, int KEYS, bool SWIZZLE = false, int STAGES = 2> struct KVTilePipe {
    static constexpr int ld = SWIZZLE ? D : D + 8;  // padded bf16 rows (16 bytes): conflict-free fragments and ldmatrix
    static constexpr int tile_elems = KEYS * ld;
    static constexpr bool quantized = K != KVKind::BF16;
    static constexpr bool has_sz = K == KVKind::INT8 || K == KVKind::INT4;
    static constexpr int row_bytes = K == KVKind::INT4 ? D / 2 : D;
    static constexpr int code_bytes = 2 * KEYS * row_bytes;
    static constexpr int stage_bytes = quantized ? code_bytes + (has_sz ? 2 * KEYS * 8 : 0) : 2 * tile_elems * 2;
    static constexpr int tiles_bytes = quantized ? 2 * tile_elems * 2 : 0;
    static constexpr size_t smem_bytes = size_t(tiles_bytes) + STAGES * size_t(stage_bytes);
    static_assert(STAGES >= 2 && STAGES <= 3, "two or three stages");
    static_assert(!quantized || row_bytes % 16 == 0, "whole 16-byte chunks per row");
    static_assert(!SWIZZLE || (D % 64 == 0 && KEYS % 8 == 0), "whole 64-column panels and 8-row swizzle groups");

    // Element offset in a tile of the 8 bf16 at row `key`, columns [8 * chunk, 8 * chunk + 8).
    __device__ __forceinline__ static int chunk_at(int key, int chunk) {
        if constexpr (SWIZZLE) return sm90::swizzle128_offset(key, chunk, KEYS) / 2;
        else return key * ld + chunk * 8;
    }
    // After this thread's last shared-memory write of a tile, before the barrier that publishes it.
    __device__ __forceinline__ static void publish() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
        if constexpr (SWIZZLE) sm90::fence_proxy_async_smem();
#endif
    }

    // Tile t, keys [k0, k0 + KEYS): one cp.async group. row_of(j) is the cache row of key j:
    // (block * n_kv + kv_head) * block_size + slot.
    template <class RowOf>
    __device__ __forceinline__ static void load(unsigned char * smem, const KVLayer & cache, int t, int k0, int end, RowOf row_of) {
        unsigned char * st = smem + tiles_bytes + (t % STAGES) * stage_bytes;
        if constexpr (!quantized) {
            bf16 * ks = reinterpret_cast<bf16 *>(st), * vs = ks + tile_elems;
            for (int c = threadIdx.x; c < KEYS * (D / 8); c += THREADS) {
                const int key = c / (D / 8), col = (c % (D / 8)) * 8, j = k0 + key;
                const bool valid = j < end;
                const int64_t row = valid ? row_of(j) : 0;
                cp_async16(&ks[chunk_at(key, col / 8)], cache.k + row * D + col, valid);
                cp_async16(&vs[chunk_at(key, col / 8)], cache.v + row * D + col, valid);
            }
        } else {
            constexpr int chunks = row_bytes / 16;
            for (int c = threadIdx.x; c < 2 * KEYS * chunks; c += THREADS) {
                const int value = c / (KEYS * chunks), key = (c / chunks) % KEYS, ch = c % chunks, j = k0 + key;
                const bool valid = j < end;
                const int64_t row = valid ? row_of(j) : 0;
                const uint8_t * src = (value ? cache.quant.v : cache.quant.k) + row * row_bytes + ch * 16;
                cp_async16(st + (value * KEYS + key) * row_bytes + ch * 16, src, valid);
            }
            if constexpr (has_sz) {
                for (int c = threadIdx.x; c < 2 * KEYS; c += THREADS) {
                    const int value = c / KEYS, key = c % KEYS, j = k0 + key;
                    const bool valid = j < end;
                    const int64_t row = valid ? row_of(j) : 0;
                    cp_async8(st + code_bytes + c * 8, (value ? cache.quant.v_sz : cache.quant.k_sz) + row, valid);
                }
            }
        }
        cp_async_commit();
    }

    // Tile t's K (V at + tile_elems) of a bf16 cache, once ready(t) has returned.
    __device__ __forceinline__ static const bf16 * tile(const unsigned char * smem, int t) {
        static_assert(!quantized, "a quantized cache has one dequantized tile, returned by ready()");
        return reinterpret_cast<const bf16 *>(smem + (t % STAGES) * stage_bytes);
    }

    // Waits for tile t (the `pending` tiles loaded after it, at most STAGES - 1, may stay in flight) and returns its K
    // tile ([KEYS][ld] bf16; V follows at + tile_elems). Ends with a barrier: every thread may read the whole tile.
    __device__ __forceinline__ static const bf16 * ready(unsigned char * smem, const KVLayer & cache, int t, int pending) {
        if (STAGES > 2 && pending >= 2) cp_async_wait<STAGES - 1>();
        else if (pending >= 1) cp_async_wait<1>();
        else cp_async_wait<0>();
        if constexpr (!quantized) publish();
        __syncthreads();
        const unsigned char * st = smem + tiles_bytes + (t % STAGES) * stage_bytes;
        if constexpr (!quantized) {
            return reinterpret_cast<const bf16 *>(st);
        } else {
            bf16 * tiles = reinterpret_cast<bf16 *>(smem);
            float fp8_scale[2] = {0.f, 0.f};
            if constexpr (K == KVKind::FP8) {
                fp8_scale[0] = cache.quant.fp8_scale[0];
                fp8_scale[1] = cache.quant.fp8_scale[1];
            }
            for (int c = threadIdx.x; c < 2 * KEYS * (D / 8); c += THREADS) {
                const int value = c / (KEYS * (D / 8)), key = (c / (D / 8)) % KEYS, col = (c % (D / 8)) * 8;
                const bool high = K == KVKind::INT4 && col >= D / 2;
                const uint2 raw = *reinterpret_cast<const uint2 *>(st + (value * KEYS + key) * row_bytes + (high ? col - D / 2 : col));
                const uint32_t w[2] = {raw.x, raw.y};
                float2 sz = make_float2(0.f, 0.f);
                if constexpr (has_sz) sz = reinterpret_cast<const float2 *>(st + code_bytes)[value * KEYS + key];
                float x[8];
                kv_dequant<K, 8>(w, high, sz, fp8_scale[value], x);
                *reinterpret_cast<uint4 *>(&tiles[value * tile_elems + chunk_at(key, col / 8)]) =
                    make_uint4(pack_bf16(x[0], x[1]), pack_bf16(x[2], x[3]), pack_bf16(x[4], x[5]), pack_bf16(x[6], x[7]));
            }
            publish();
            __syncthreads();
            return tiles;
        }
    }
};

constexpr int k_decode_threads = 128;
constexpr int k_decode_warps = k_decode_threads / 32;
constexpr int k_max_rep = 8;      // query heads per KV head, SIMT kernel (7 for Qwen2.5-7B, 8 for 3B/72B and Qwen3-30B-A3B)
constexpr int k_max_rep_tc = 16;  // the tensor-core kernels: the 16 rows of an mma tile (16 for Qwen3-235B-A22B)

struct DecodeArgs {
    const bf16 * q;  // [batch, n_head, d]
    KVLayer cache;
    const int * len_dev;  // [batch]
    int n_head, n_kv;
    float scale;
    DecodeScratch scratch;
    int min_split;  // fewest keys a split takes (the kernel's tile)
    bool early_kv = false;  // tensor-core kernel: keys before the new one requested before pdl_wait (set_decode_early_kv)
    // Tensor-core kernels with one split (max_splits 1): O / l goes straight to out (bf16 [batch, n_head, d]) and no
    // combine runs; null: partial results for the combine.
    bf16 * out = nullptr;
};

// Keys per split for the current length: the fixed grid (captured in the graph) spreads any length over all of
// its blocks, in multiples of 16 and at least min_split; decode_splits keeps it at most k_decode_max_split_keys.
__device__ __forceinline__ int decode_split_size(int len, int max_splits, int min_split) {
    const int per = (len + max_splits - 1) / max_splits;
    return max(min_split, (per + 15) / 16 * 16);
}

// The tensor-core decode kernel (attention_decode_tc.cu) for head_dim 64 and 128: launches the split kernel over
// `grid` with a.min_split = 64; false for other head dims.
bool launch_attention_decode_tc(const DecodeArgs & a, int head_dim, dim3 grid, cudaStream_t stream);
// The same kernel with its tiles brought by tensor copies (bf16 caches on sm_90a, see decode_tma_applies); false
// where it does not apply.
bool launch_attention_decode_tma(const DecodeArgs & a, int head_dim, dim3 grid, cudaStream_t stream);
// Its int8 / fp8 cache form at head_dim 128 (attention_decode_q8.cu), called by launch_attention_decode_tma.
bool launch_attention_decode_q8(const DecodeArgs & a, dim3 grid, cudaStream_t stream);
// Tiles the tensor-core decode kernel keeps resident at this head_dim (2 or 3; attention.cu).
int decode_tc_stages(int head_dim);

// One online-softmax step for the two rows a thread holds in an m16n8 fragment (g and g + 8): mx0 / mx1 are the
// thread's maxima of this tile's scores in the log2 domain (scaled), reduced here over the quad (the four lanes of a
// row); m0 / m1, the running maxima, move to the new maxima. alpha = exp2(old - new) rescales l and O; ref is what
// this tile's exp2 subtracts: the new maximum, or 0 for a row still fully masked (so exp2 never sees (-inf) - (-inf)).
struct SoftmaxStep {
    float2 alpha, ref;
};
__device__ __forceinline__ SoftmaxStep online_softmax_step(float mx0, float mx1, float & m0, float & m1) {
    mx0 = quad_max(mx0);
    mx1 = quad_max(mx1);
    const float new_m0 = fmaxf(m0, mx0), new_m1 = fmaxf(m1, mx1);
    const float ref0 = new_m0 == -INFINITY ? 0.f : new_m0, ref1 = new_m1 == -INFINITY ? 0.f : new_m1;
    const SoftmaxStep st{make_float2(exp2f(m0 - ref0), exp2f(m1 - ref1)), make_float2(ref0, ref1)};
    m0 = new_m0;
    m1 = new_m1;
    return st;
}

}  // namespace qinfer::cuda
