// Decode attention over an int8 or fp8 cache on Hopper (head_dim 128): the split kernel of attention_decode_tc.cu
// with the codes multiplied as they are, no dequantization pass.
//
// A cache row is x = (c - z) s (kv_quant.cuh). The scores and the output split into a product with the raw codes and
// a per-key correction:
//   S_key = s_key (sum_d q_d c_key,d - z_key sum_d q_d)
//   O_d   = sum_key p'_key c_key,d - sum_key p'_key z_key,   p'_key = p_key s_key (V's scale)
// so the MMAs take the codes straight from shared memory, as fp16 (a byte OR-ed into the mantissa of 1024 is 1024 + c
// exactly: one PRMT per register; the 1024 is folded into the zero, z' = z + 1024), with Q and P' in fp16 and fp32
// accumulators. Each lane reads its codes in 16-byte loads: the reduction dimension of Q K^T is permuted so that lane
// tq's dims are 32 tq .. 32 tq + 31 (A and B fragments permuted alike), and the output columns of P V so that lane g
// supplies dims 16 g .. 16 g + 15 (o[dt][e] of lane (g, tq) is dim 16 (2 tq + e) + dt). Keys past the split's end
// get P' = 0 from a select, so never-written rows (codes are finite bytes; their scales may be NaN) add nothing.
//
// fp8 (e4m3, one scale per layer for K and one for V): codes become fp16 pairs by cvt, S = s_K (Q.E), O = s_V (P E).
// A byte pattern past the end may be an e4m3 NaN, so there the last tile's V rows are zeroed in shared memory.
//
// Tiles arrive as in the bf16 tensor-copy kernel: lanes of the copy warp issue, per 16 keys, one 2-D copy of the K
// codes and one of the V codes (128-byte rows, 128-byte swizzle) and, for int8, one bulk copy each of the 16 rows' K
// and V (scale, zero). Each V word-column is paired across rows with one byte permute per two rows, then each byte
// pair widened to fp16 with one more (12 PRMT per word-column, 16 before; with Q K^T in two chains of four MMAs
// instead of one of eight, the kernel at 129024 keys was 1.7% faster on an H200,
// bench/results/2026-12-01-h200-decode-copy-warp).
#include <cmath>

#include "backends/cuda/attention_common.cuh"
#include "backends/cuda/attention_decode_tc.cuh"
#include "backends/cuda/common.cuh"
#include "backends/cuda/tensor_map.h"
#include "backends/cuda/wgmma.cuh"

namespace qinfer::cuda {

namespace {

using namespace decode_tc;

constexpr int D = 128;

#if !defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL)  // the kernel's body is sm_90a only
__device__ __forceinline__ uint32_t pack_f16(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t *>(&h);
}
__device__ __forceinline__ float2 unpack_f16(uint32_t bits) { return __half22float2(*reinterpret_cast<const __half2 *>(&bits)); }
// The two e4m3 codes in the low 16 bits of `bits` as an fp16 pair (low byte in the low half).
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t bits) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(bits & 0xffffu), __NV_E4M3);
    return uint32_t(h.x) | uint32_t(h.y) << 16;
}
#endif

template <KVKind K, int STAGES> struct Q8Smem {
    static constexpr int codes_bytes = k_tile * D;  // K or V codes: [k_tile][128] bytes, 128-byte swizzle
    static constexpr int sz_bytes = K == KVKind::INT8 ? k_tile * 8 : 0;  // K or V (scale, zero): [k_tile] float2
    static constexpr int stage_bytes = 2 * codes_bytes + 2 * sz_bytes;
    static constexpr size_t bar_offset = size_t(STAGES) * stage_bytes;
    static constexpr size_t bytes = bar_offset + 2 * STAGES * sizeof(uint64_t) + 1024;  // full, empty; + the base's alignment
    static_assert(stage_bytes % 1024 == 0, "stages keep the swizzle's 1024-byte alignment");
    static_assert(bar_offset >= k_merge_bytes(D), "the warp merge fits the tiles' memory");
};

#if !defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL)
// Byte offset of 16-byte chunk `chunk` of code row `row` in a swizzled tile.
__device__ __forceinline__ int code_at(int row, int chunk) { return row * 128 + ((chunk ^ (row % 8)) * 16); }
#endif

template <KVKind K, int STAGES>
__global__ void __launch_bounds__(k_decode_threads + 32)
    attention_decode_q8_kernel(DecodeArgs a, const __grid_constant__ CUtensorMap k_map, const __grid_constant__ CUtensorMap v_map) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    if (!a.early_kv) pdl_wait();
    constexpr uint32_t k_magic = 0x64646464u;  // fp16 1024 in each half once a code byte fills the low mantissa byte
    constexpr bool int8 = K == KVKind::INT8;
    static_assert(int8 || K == KVKind::FP8, "int8 or fp8 codes");
    using Layout = Q8Smem<K, STAGES>;
    extern __shared__ unsigned char smem_raw[];
    unsigned char * smem = smem_raw + ((1024 - sm90::smem_addr(smem_raw) % 1024) % 1024);
    uint64_t * full = reinterpret_cast<uint64_t *>(smem + Layout::bar_offset), * empty = full + STAGES;
    __shared__ int blocks[k_decode_max_split_keys / 16 + 2];

    const int split_id = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;
    const DecodeSplit sp = decode_split(a);
    if (sp.begin >= sp.len) return;
    const int begin = sp.begin, end = sp.end, first_block = sp.first_block;
    const int bs = a.cache.block_size, warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, tq = lane % 4;
    const int n_rep = a.n_head / a.n_kv, kw = warp * 16;

    start_tma_split<STAGES>(sp, bs, blocks, full, empty, &k_map, &v_map);

    // Tile t into stage t % STAGES by the copy warp: lane i takes 16-key group i / parts and part i % parts (K codes,
    // V codes, and for int8 K (scale, zero), V (scale, zero)). Groups wholly past `end` are not copied.
    constexpr int parts = int8 ? 4 : 2;
    constexpr uint32_t group_bytes = 2 * k_copy_rows * D + (int8 ? 2 * k_copy_rows * 8 : 0);
    auto load_tile = [&](int t) {
        const int k0 = begin + t * k_tile, s = t % STAGES;
        const int groups = (min(end - k0, k_tile) + k_copy_rows - 1) / k_copy_rows;
        if (lane == 0) sm90::mbar_arrive_expect_tx(&full[s], uint32_t(groups) * group_bytes);
        __syncwarp();
        if (lane < groups * parts) {
            const int group = lane / parts, part = lane % parts, key = k0 + group * k_copy_rows;
            const int row = (blocks[key / bs - first_block] * a.n_kv + kvh) * bs + key % bs;
            unsigned char * st = smem + s * Layout::stage_bytes;
            if (part < 2) {
                sm90::tma_load_2d(st + part * Layout::codes_bytes + group * k_copy_rows * D, part ? &v_map : &k_map, &full[s], 0, row);
            } else {
                const float2 * sz = (part == 3 ? a.cache.quant.v_sz : a.cache.quant.k_sz) + row;
                sm90::bulk_load(st + 2 * Layout::codes_bytes + (part - 2) * Layout::sz_bytes + group * k_copy_rows * 8, sz, k_copy_rows * 8, &full[s]);
            }
        }
    };
    const int n_tiles = (end - begin + k_tile - 1) / k_tile;
    if (warp == k_decode_warps) {
        copy_split_tiles<STAGES>(a, sp, n_tiles, empty, load_tile);
        return;
    }
    if (a.early_kv) pdl_wait();

    // Q (A operand, fp16, in the log2 domain): in k-slice kc, positions 2 tq, 2 tq + 1 are dims 32 tq + 4 kc + {0, 1}
    // and positions 2 tq + 8, 2 tq + 9 dims 32 tq + 4 kc + {2, 3}; rows n_rep..15 zero. q_sum: row g's sum of the
    // fp16 values over all dims (the zero's term).
    float k_scale = 1.f, v_scale = 1.f;  // fp8: the layer's scales
    if constexpr (!int8) {
        k_scale = a.cache.quant.fp8_scale[0];
        v_scale = a.cache.quant.fp8_scale[1];
    }
    uint32_t qf[D / 16][4];
    float q_sum = 0;
    {
        const float q_scale = a.scale * float(M_LOG2E);
        const bf16 * q = a.q + (int64_t(b) * a.n_head + int64_t(kvh) * n_rep + g) * D + 32 * tq;
#pragma unroll
        for (int kc = 0; kc < D / 16; kc++) {
            qf[kc][1] = qf[kc][3] = 0u;
            qf[kc][0] = qf[kc][2] = 0u;
            if (g < n_rep) {
                const uint2 raw = *reinterpret_cast<const uint2 *>(q + 4 * kc);
                const float2 x01 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&raw.x));
                const float2 x23 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&raw.y));
                qf[kc][0] = pack_f16(x01.x * q_scale, x01.y * q_scale);
                qf[kc][2] = pack_f16(x23.x * q_scale, x23.y * q_scale);
                const float2 h01 = unpack_f16(qf[kc][0]), h23 = unpack_f16(qf[kc][2]);
                q_sum += (h01.x + h01.y) + (h23.x + h23.y);
            }
        }
        q_sum += __shfl_xor_sync(0xffffffffu, q_sum, 1);
        q_sum += __shfl_xor_sync(0xffffffffu, q_sum, 2);
    }

    float o[D / 8][4] = {};
    float m0 = -INFINITY, l0 = 0, z_sum = 0;  // row g; z_sum: sum of P' z' (this lane's keys)
    for (int t = 0; t < n_tiles; t++) {
        const int s = t % STAGES, tile0 = begin + t * k_tile, key0 = tile0 + kw;  // this warp's first key
        unsigned char * kc_tile = smem + s * Layout::stage_bytes, * vc_tile = kc_tile + Layout::codes_bytes;
        const float2 * k_sz = reinterpret_cast<const float2 *>(vc_tile + Layout::codes_bytes), * v_sz = k_sz + k_tile;
        sm90::mbar_wait(&full[s], (t / STAGES) & 1);
        if (!int8 && end - tile0 < k_tile) {
            // fp8's last tile: V rows past the end become +0 (an e4m3 NaN there would meet P = 0 in P V).
            for (int i = threadIdx.x; i < (k_tile - (end - tile0)) * 8; i += k_decode_threads) {
                *reinterpret_cast<uint4 *>(vc_tile + (end - tile0 + i / 8) * 128 + (i % 8) * 16) = make_uint4(0, 0, 0, 0);
            }
            computing_warps_sync();  // the last tile: never refilled, read by plain loads only (no proxy fence)
        }

        // S = Q C^T over the warp's 16 keys (two n-tiles of 8), then each key's scale and zero.
        float sc[2][4];
#pragma unroll
        for (int nt = 0; nt < 2; nt++) {
            const int row = kw + nt * 8 + g;
            const uint4 c0 = *reinterpret_cast<const uint4 *>(kc_tile + code_at(row, 2 * tq));
            const uint4 c1 = *reinterpret_cast<const uint4 *>(kc_tile + code_at(row, 2 * tq + 1));
            const uint32_t w[8] = {c0.x, c0.y, c0.z, c0.w, c1.x, c1.y, c1.z, c1.w};  // w[i]: dims 32 tq + 4 i .. + 3
            float acc[2][4] = {};  // even and odd k-slices: two chains of four MMAs instead of one of eight
#pragma unroll
            for (int kc = 0; kc < D / 16; kc++) {
                float (&c)[4] = acc[kc & 1];
                if constexpr (int8) mma_16816<__half>(c, qf[kc], __byte_perm(w[kc], k_magic, 0x4140), __byte_perm(w[kc], k_magic, 0x4342));
                else mma_16816<__half>(c, qf[kc], e4m3x2_to_f16x2(w[kc]), e4m3x2_to_f16x2(w[kc] >> 16));
            }
#pragma unroll
            for (int e = 0; e < 4; e++) sc[nt][e] = acc[0][e] + acc[1][e];
        }
        float sk[2][2];  // scores in the log2 domain, -inf past the end
        float mx = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < 2; nt++) {
            float4 sz = make_float4(k_scale, 0.f, k_scale, 0.f);  // (s, z) of keys 2 tq, 2 tq + 1
            if constexpr (int8) sz = *reinterpret_cast<const float4 *>(k_sz + kw + nt * 8 + 2 * tq);
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const float scale = e ? sz.z : sz.x, zero = int8 ? (e ? sz.w : sz.y) + 1024.f : 0.f;
                const int key = key0 + nt * 8 + 2 * tq + e;
                sk[nt][e] = key < end ? scale * (sc[nt][e] - zero * q_sum) : -INFINITY;
                mx = fmaxf(mx, sk[nt][e]);
            }
        }
        mx = quad_max(mx);
        const float new_m = fmaxf(m0, mx);
        const float ref = new_m == -INFINITY ? 0.f : new_m;
        if (__any_sync(0xffffffffu, new_m != m0)) {  // else alpha is exactly 1
            const float alpha = exp2f(m0 - ref);
            l0 *= alpha;
            z_sum *= alpha;
#pragma unroll
            for (int dt = 0; dt < D / 8; dt++) {
                o[dt][0] *= alpha;
                o[dt][1] *= alpha;
            }
        }
        m0 = new_m;
        // int8: P' = P times V's scale, rounded to fp16 once; z_sum takes the rounded values, so the zero's 1024 cancels.
        // fp8: P' = P (V's scale is applied to O at the end).
        uint32_t pf[4] = {0u, 0u, 0u, 0u};
#pragma unroll
        for (int nt = 0; nt < 2; nt++) {
            float4 sz = make_float4(1.f, 0.f, 1.f, 0.f);
            if constexpr (int8) sz = *reinterpret_cast<const float4 *>(v_sz + kw + nt * 8 + 2 * tq);
            const float p0 = exp2f(sk[nt][0] - ref), p1 = exp2f(sk[nt][1] - ref);
            l0 += p0 + p1;
            const bool in0 = key0 + nt * 8 + 2 * tq < end, in1 = key0 + nt * 8 + 2 * tq + 1 < end;
            pf[2 * nt] = pack_f16(in0 ? p0 * sz.x : 0.f, in1 ? p1 * sz.z : 0.f);
            if constexpr (int8) {
                const float2 pr = unpack_f16(pf[2 * nt]);
                z_sum += (in0 ? pr.x * (sz.y + 1024.f) : 0.f) + (in1 ? pr.y * (sz.w + 1024.f) : 0.f);
            }
        }
        // O += P' C: lane (g, tq) supplies dims 16 g .. 16 g + 15 of keys 2 tq, 2 tq + 1 (b0) and 2 tq + 8, 2 tq + 9
        // (b1); column g of n-tile dt is dim 16 g + dt.
        uint32_t v[4][4];  // rows kw + 2 tq + {0, 1, 8, 9}, chunk g
#pragma unroll
        for (int r = 0; r < 4; r++) {
            const int row = kw + 2 * tq + (r & 1) + (r >> 1) * 8;
            const uint4 c = *reinterpret_cast<const uint4 *>(vc_tile + code_at(row, g));
            v[r][0] = c.x;
            v[r][1] = c.y;
            v[r][2] = c.z;
            v[r][3] = c.w;
        }
#pragma unroll
        for (int i = 0; i < 4 && !int8; i++) {
            // fp8: n-tile 4 i + j takes byte j of word i of rows (2 tq, 2 tq + 1) and (2 tq + 8, 2 tq + 9).
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const uint32_t sel = uint32_t(j) | uint32_t(4 + j) << 4;
                mma_16816<__half>(o[4 * i + j], pf, e4m3x2_to_f16x2(__byte_perm(v[0][i], v[1][i], sel)), e4m3x2_to_f16x2(__byte_perm(v[2][i], v[3][i], sel)));
            }
        }
#pragma unroll
        for (int i = 0; i < 4 && int8; i++) {
            // Rows (2 tq, 2 tq + 1) and (2 tq + 8, 2 tq + 9) interleaved byte by byte (dims 4 i, 4 i + 1 in t01, u01;
            // 4 i + 2, 4 i + 3 in t23, u23), then each byte pair as an fp16 pair (1024 + code): b0 from t, b1 from u.
            const uint32_t t01 = __byte_perm(v[0][i], v[1][i], 0x5140), t23 = __byte_perm(v[0][i], v[1][i], 0x7362);
            const uint32_t u01 = __byte_perm(v[2][i], v[3][i], 0x5140), u23 = __byte_perm(v[2][i], v[3][i], 0x7362);
            mma_16816<__half>(o[4 * i + 0], pf, __byte_perm(t01, k_magic, 0x4140), __byte_perm(u01, k_magic, 0x4140));
            mma_16816<__half>(o[4 * i + 1], pf, __byte_perm(t01, k_magic, 0x4342), __byte_perm(u01, k_magic, 0x4342));
            mma_16816<__half>(o[4 * i + 2], pf, __byte_perm(t23, k_magic, 0x4140), __byte_perm(u23, k_magic, 0x4140));
            mma_16816<__half>(o[4 * i + 3], pf, __byte_perm(t23, k_magic, 0x4342), __byte_perm(u23, k_magic, 0x4342));
        }
        __syncwarp();  // the copy warp refills the stage once every warp has released it
        if (lane == 0) sm90::mbar_arrive(&empty[s]);
    }
    computing_warps_sync();  // every warp past its last tile: the merge reuses the stages
    z_sum += __shfl_xor_sync(0xffffffffu, z_sum, 1);
    z_sum += __shfl_xor_sync(0xffffffffu, z_sum, 2);
#pragma unroll
    for (int dt = 0; dt < D / 8; dt++) {
        o[dt][0] = (o[dt][0] - z_sum) * v_scale;  // int8: z_sum; fp8: v_scale (the other is 0 / 1)
        o[dt][1] = (o[dt][1] - z_sum) * v_scale;
    }
    // o[dt][e] of lane (g, tq) is dim 16 (2 tq + e) + dt.
    merge_warps<D>(smem, a, b, kvh, split_id, o, m0, l0, -INFINITY, 0.f, [](int dt, int e) { return 16 * (2 * int(threadIdx.x % 4) + e) + dt; });
#else
    __trap();  // launched only where decode_tma_applies (an sm_90a build on a compute capability 9.0 device)
#endif
}

template <KVKind K, int STAGES> bool launch_q8(DecodeArgs a, dim3 grid, cudaStream_t stream) {
    CUtensorMap k_map, v_map;
    if (!code_tensor_map(&k_map, a.cache.quant.k, a.cache.rows, D, k_copy_rows) || !code_tensor_map(&v_map, a.cache.quant.v, a.cache.rows, D, k_copy_rows)) {
        return false;
    }
    constexpr size_t smem = Q8Smem<K, STAGES>::bytes;
    static PerDevice<size_t> configured;
    allow_dynamic_smem(attention_decode_q8_kernel<K, STAGES>, smem, configured);
    a.min_split = k_tile;
    launch_kernel(attention_decode_q8_kernel<K, STAGES>, grid, k_decode_threads + 32, smem, stream, a, k_map, v_map);
    return true;
}

// Stages of codes in flight: 6 (104 KB of shared memory with int8's scales, two blocks per SM). Alone the kernel is
// ~3% slower with 6 than with 3 (7B layer at 129024 keys: 64.5 vs 62.3 us), but the model's decode step is faster
// (7B YaRN GPTQ-Int4 with an int8 cache at 129024: 242.6 -> 253.3 decode tokens/s,
// bench/results/2026-11-27-h100-q8-stages), most likely because the first STAGES - 1 tiles are requested before
// pdl_wait() and overlap the kernel ahead: 5 tiles instead of 2 (not profiled).
constexpr int k_q8_stages = 6;

}  // namespace

bool launch_attention_decode_q8(const DecodeArgs & a, dim3 grid, cudaStream_t stream) {
    if (a.cache.quant.kind == KVKind::FP8) return launch_q8<KVKind::FP8, k_q8_stages>(a, grid, stream);
    return a.cache.quant.kind == KVKind::INT8 && launch_q8<KVKind::INT8, k_q8_stages>(a, grid, stream);
}

}  // namespace qinfer::cuda
