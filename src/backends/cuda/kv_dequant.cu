// A sequence's quantized cache dequantized into a bf16 cache, so that prefill over an int8, int4 or fp8 cache runs the
// bf16 attention kernels (the tensor-copy ping-pong kernel on sm_90a: ~3x the quantized wgmma kernel's throughput on a
// 1024-query chunk, H100). The values are the quantized kernels' own (kv_dequant, then rounded to bf16 on the way to
// the tensor cores), so the attention is the same computation.
#include "backends/cuda/common.cuh"
#include "backends/cuda/kv_quant.cuh"

namespace qinfer::cuda {

namespace {

// Block (blockIdx.x = j, the sequence's j-th block; blockIdx.y = KV head h): each thread turns 8 dims of one K or V
// row into 8 bf16 (one 16-byte store). Output row (j n_kv + h) block_size + slot, input row the same with the block
// table's entry for j.
template <KVKind K> __global__ void kv_dequantize_kernel(KVLayer src, int n_kv, int head_dim, bf16 * k_out, bf16 * v_out) {
    pdl_wait();
    const int j = blockIdx.x, h = blockIdx.y, bs = src.block_size, chunks = head_dim / 8;
    const int64_t block = src.block_table[j];
    float fp8_scale[2] = {1.f, 1.f};
    if constexpr (K == KVKind::FP8) {
        fp8_scale[0] = src.quant.fp8_scale[0];
        fp8_scale[1] = src.quant.fp8_scale[1];
    }
    for (int i = threadIdx.x; i < 2 * bs * chunks; i += blockDim.x) {
        const bool value = i >= bs * chunks;
        const int slot = (i % (bs * chunks)) / chunks, col = (i % chunks) * 8;
        const int64_t row = (block * n_kv + h) * bs + slot, out_row = (int64_t(j) * n_kv + h) * bs + slot;
        uint32_t w[2];
        kv_load_codes<K, 8>(src.quant, value, row, head_dim, col, w);
        float2 sz{1.f, 0.f};
        if constexpr (K != KVKind::FP8) sz = (value ? src.quant.v_sz : src.quant.k_sz)[row];
        float x[8];
        kv_dequant<K, 8>(w, K == KVKind::INT4 && col >= head_dim / 2, sz, fp8_scale[value], x);
        __nv_bfloat162 o[4];
#pragma unroll
        for (int e = 0; e < 4; e++) o[e] = __floats2bfloat162_rn(x[2 * e], x[2 * e + 1]);
        *reinterpret_cast<uint4 *>((value ? v_out : k_out) + out_row * head_dim + col) = *reinterpret_cast<const uint4 *>(o);
    }
}

}  // namespace

void kv_dequantize_blocks(const KVLayer & cache, int n_blocks, int n_kv, int head_dim, bf16 * k_out, bf16 * v_out, cudaStream_t stream) {
    if (n_blocks <= 0) return;
    if (head_dim % 16 != 0) QINFER_FAIL() << "kv_dequantize_blocks: head_dim " << head_dim << " is not a multiple of 16";
    if (n_kv > 65535) QINFER_FAIL() << "kv_dequantize_blocks: " << n_kv << " KV heads";
    const dim3 grid(n_blocks, n_kv);
    switch (cache.quant.kind) {
    case KVKind::FP8: launch_kernel(kv_dequantize_kernel<KVKind::FP8>, grid, 128, 0, stream, cache, n_kv, head_dim, k_out, v_out); break;
    case KVKind::INT8: launch_kernel(kv_dequantize_kernel<KVKind::INT8>, grid, 128, 0, stream, cache, n_kv, head_dim, k_out, v_out); break;
    case KVKind::INT4: launch_kernel(kv_dequantize_kernel<KVKind::INT4>, grid, 128, 0, stream, cache, n_kv, head_dim, k_out, v_out); break;
    default: QINFER_FAIL() << "kv_dequantize_blocks: the cache is not quantized";
    }
}

}  // namespace qinfer::cuda
