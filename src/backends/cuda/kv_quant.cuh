// Reading and writing quantized KV caches on the device (layout: ops.h KVQuant). The formulas are those of the CPU
// cache (runtime/kv_cache.cpp), which is the specification:
//   fp8:  code = e4m3(x / scale), x = e4m3 * scale, one scale per layer for K and one for V;
//   int8/int4, per row (token and KV head): scale = (max - min) / qmax (1 when max == min), zero = -min / scale,
//         q = clamp(trunc(x / scale + zero + 0.5), 0, qmax), x = (q - zero) * scale.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "backends/cuda/ops.h"

namespace qinfer::cuda {

__device__ __forceinline__ float e4m3_to_float(uint32_t byte) {
    const __half_raw h = __nv_cvt_fp8_to_halfraw(__nv_fp8_storage_t(byte & 0xffu), __NV_E4M3);
    return __half2float(__half(h));
}

// Round to nearest even, saturating to +-448; NaN stays NaN (the CPU's f32_to_e4m3).
__device__ __forceinline__ uint8_t float_to_e4m3(float x) { return uint8_t(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3)); }

__device__ __forceinline__ uint32_t quantize_affine(float x, float scale, float zero, float qmax) {
    return uint32_t(fminf(fmaxf(truncf(__fdiv_rn(x, scale) + zero + 0.5f), 0.0f), qmax));
}

// Bytes of one cache row (a token's head) for a quantized kind.
__device__ __host__ __forceinline__ int kv_row_bytes(KVKind kind, int head_dim) { return kind == KVKind::INT4 ? head_dim / 2 : head_dim; }

// Codes of dims [col, col + N) of K (or V) row `row` (= (block * n_kv + kv_head) * block_size + slot) as N / 4 raw
// 32-bit words: one byte per dim (fp8, int8) or, for int4, the N bytes whose low (col < head_dim / 2) or high nibbles
// hold those dims. N is 4 or 8 and [col, col + N) never straddles head_dim / 2.
template <KVKind K, int N>
__device__ __forceinline__ void kv_load_codes(const KVQuant & q, bool value, int64_t row, int head_dim, int col, uint32_t (&w)[N / 4]) {
    static_assert(K != KVKind::BF16 && N % 4 == 0, "quantized kinds, whole words");
    const int half = head_dim / 2;
    const int64_t byte = row * kv_row_bytes(K, head_dim) + (K == KVKind::INT4 && col >= half ? col - half : col);
    const uint32_t * p = reinterpret_cast<const uint32_t *>((value ? q.v : q.k) + byte);
#pragma unroll
    for (int i = 0; i < N / 4; i++) w[i] = __ldg(p + i);
}

// A code (0..255) as an exact float without an int-to-float conversion (a quarter-rate instruction on sm_90): its
// bits OR-ed into the mantissa of 2^23, minus 2^23.
__device__ __forceinline__ float code_to_float(uint32_t code) { return __uint_as_float(0x4B000000u | code) - 8388608.0f; }

// The N dims of kv_load_codes as fp32: sz = the row's (scale, zero) for int8/int4, fp8_scale the layer's for fp8.
template <KVKind K, int N>
__device__ __forceinline__ void kv_dequant(const uint32_t (&w)[N / 4], bool high_nibble, float2 sz, float fp8_scale, float * out) {
#pragma unroll
    for (int i = 0; i < N; i++) {
        const uint32_t byte = (w[i / 4] >> (8 * (i % 4))) & 0xffu;
        if constexpr (K == KVKind::FP8) {
            out[i] = e4m3_to_float(byte) * fp8_scale;
        } else {
            const uint32_t code = K == KVKind::INT4 ? (high_nibble ? byte >> 4 : byte & 15u) : byte;
            out[i] = (code_to_float(code) - sz.y) * sz.x;
        }
    }
}

}  // namespace qinfer::cuda
