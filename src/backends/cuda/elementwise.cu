// Small kernels: embedding gather, RMSNorm (with the residual add fused), SwiGLU, row gather/scatter for MoE,
// q/k/v bias + q/k norm + RoPE + KV-cache write (quantizing for quantized caches).
#include <algorithm>

#include "backends/cuda/common.cuh"
#include "backends/cuda/kv_quant.cuh"
#include "backends/cuda/ops.h"
#include "backends/cuda/rope_common.cuh"

namespace qinfer::cuda {

namespace {

constexpr int k_norm_threads = 256;

// One block per token. Rows of whole 16-byte chunks (vec: hidden % 8 == 0, an aligned table) are copied a chunk per
// load, each thread's loads all issued before its first store, so a row up to 8192 values costs one round trip after
// the id's. 7B's table stays in pinned host memory (an untied embedding), where one value per load had cost its
// 3584-value row 14 dependent PCIe round trips a thread: 20 us of a 5.3 ms decode step, now 3.5 (H100, in-graph
// kernel trace, bench/results/2026-11-28-h100-trace).
constexpr int k_embed_threads = 256;
constexpr int k_embed_loads = 4;  // 16-byte loads in flight per thread
__global__ void embedding_kernel(const bf16 * __restrict__ table, const int * ids, int hidden, bool vec, float * __restrict__ x) {
    pdl_wait();
    const int t = blockIdx.x;
    const bf16 * row = table + int64_t(ids[t]) * hidden;  // bf16 [hidden]
    float * out = x + int64_t(t) * hidden;                // fp32 [hidden]
    if (!vec) {
        for (int i = threadIdx.x; i < hidden; i += blockDim.x) out[i] = __bfloat162float(row[i]);
        return;
    }
    const int chunks = hidden / 8;
    for (int c0 = threadIdx.x; c0 < chunks; c0 += k_embed_threads * k_embed_loads) {
        uint4 v[k_embed_loads];
#pragma unroll
        for (int u = 0; u < k_embed_loads; u++) {
            const int c = c0 + u * k_embed_threads;
            if (c < chunks) v[u] = reinterpret_cast<const uint4 *>(row)[c];
        }
#pragma unroll
        for (int u = 0; u < k_embed_loads; u++) {
            const int c = c0 + u * k_embed_threads;
            if (c >= chunks) break;
            const bf16 * h = reinterpret_cast<const bf16 *>(&v[u]);
            float4 * o = reinterpret_cast<float4 *>(out + int64_t(c) * 8);
            o[0] = make_float4(__bfloat162float(h[0]), __bfloat162float(h[1]), __bfloat162float(h[2]), __bfloat162float(h[3]));
            o[1] = make_float4(__bfloat162float(h[4]), __bfloat162float(h[5]), __bfloat162float(h[6]), __bfloat162float(h[7]));
        }
    }
}

// One block per row. Optional residual add first (x += delta), then y = w * (x * rsqrt(mean(x^2) + eps)).
// VECS > 0 (hidden % 4 == 0, hidden <= 4 * VECS * k_norm_threads): each thread keeps its float4 columns in registers,
// every load of the row issued before the reduction; VECS 0: any hidden, one value a load and the row read twice.
// At 256 rows of hidden 3584 (7B decode under continuous batching, H200) the scalar form took 10 us a call.
template <int VECS>
__global__ void __launch_bounds__(k_norm_threads) rms_norm_kernel(float * x, const bf16 * delta, const bf16 * w, float eps,
                                                                 int hidden, bf16 * y) {
    // The register forms read their norm weights before waiting for the kernel ahead (they are not its output): one
    // L2 round trip off the chain, 7B batch 16 +1.0% (BF16) / +1.8% (GPTQ-Int4) on an H200
    // (bench/results/2026-12-01-h200-norm-ahead).
    uint2 wv[VECS > 0 ? VECS : 1];
    if constexpr (VECS > 0) {
#pragma unroll
        for (int u = 0; u < VECS; u++) {
            const int i = threadIdx.x + u * k_norm_threads;
            if (i < hidden / 4) wv[u] = reinterpret_cast<const uint2 *>(w)[i];
        }
    }
    pdl_wait();
    __shared__ float red[k_norm_threads / 32];
    const int64_t row = int64_t(blockIdx.x) * hidden;
    float * xr = x + row;
    float ss = 0;
    if constexpr (VECS == 0) {
        for (int i = threadIdx.x; i < hidden; i += k_norm_threads) {
            float v = xr[i];
            if (delta) {
                v += __bfloat162float(delta[row + i]);
                xr[i] = v;
            }
            ss += v * v;
        }
        const float inv = rsqrtf(block_sum<k_norm_threads / 32>(ss, red) / hidden + eps);
        for (int i = threadIdx.x; i < hidden; i += k_norm_threads) y[row + i] = __float2bfloat16(__bfloat162float(w[i]) * (xr[i] * inv));
    } else {
        const int n4 = hidden / 4;
        float4 v[VECS];
#pragma unroll
        for (int u = 0; u < VECS; u++) {
            const int i = threadIdx.x + u * k_norm_threads;
            if (i < n4) v[u] = reinterpret_cast<const float4 *>(xr)[i];
        }
#pragma unroll
        for (int u = 0; u < VECS; u++) {
            const int i = threadIdx.x + u * k_norm_threads;
            if (i >= n4) break;
            if (delta) {
                const uint2 d = reinterpret_cast<const uint2 *>(delta + row)[i];  // 4 bf16
                const bf16 * dh = reinterpret_cast<const bf16 *>(&d);
                v[u].x += __bfloat162float(dh[0]);
                v[u].y += __bfloat162float(dh[1]);
                v[u].z += __bfloat162float(dh[2]);
                v[u].w += __bfloat162float(dh[3]);
                reinterpret_cast<float4 *>(xr)[i] = v[u];
            }
            ss += v[u].x * v[u].x + v[u].y * v[u].y + v[u].z * v[u].z + v[u].w * v[u].w;
        }
        const float inv = rsqrtf(block_sum<k_norm_threads / 32>(ss, red) / hidden + eps);
#pragma unroll
        for (int u = 0; u < VECS; u++) {
            const int i = threadIdx.x + u * k_norm_threads;
            if (i >= n4) break;
            const bf16 * wh = reinterpret_cast<const bf16 *>(&wv[u]);
            uint2 o;
            bf16 * oh = reinterpret_cast<bf16 *>(&o);
            oh[0] = __float2bfloat16(__bfloat162float(wh[0]) * (v[u].x * inv));
            oh[1] = __float2bfloat16(__bfloat162float(wh[1]) * (v[u].y * inv));
            oh[2] = __float2bfloat16(__bfloat162float(wh[2]) * (v[u].z * inv));
            oh[3] = __float2bfloat16(__bfloat162float(wh[3]) * (v[u].w * inv));
            reinterpret_cast<uint2 *>(y + row)[i] = o;
        }
    }
}

// rms_norm_kernel's widest-enough register form for this row (0: the scalar form), and its launch.
void launch_rms_norm(float * x, const bf16 * delta, const bf16 * w, float eps, int n, int hidden, bf16 * y, cudaStream_t stream) {
    if (n == 0) return;
    const bool aligned = hidden % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(w) % 8 == 0 &&
                         reinterpret_cast<uintptr_t>(y) % 8 == 0 && reinterpret_cast<uintptr_t>(delta) % 8 == 0;
    const int n4 = hidden / 4;
    auto run = [&](auto kernel) { launch_kernel(kernel, n, k_norm_threads, 0, stream, x, delta, w, eps, hidden, y); };
    if (!aligned || n4 > 8 * k_norm_threads) run(rms_norm_kernel<0>);
    else if (n4 <= k_norm_threads) run(rms_norm_kernel<1>);
    else if (n4 <= 2 * k_norm_threads) run(rms_norm_kernel<2>);
    else if (n4 <= 4 * k_norm_threads) run(rms_norm_kernel<4>);
    else run(rms_norm_kernel<8>);
}

__global__ void add_residual_kernel(float * x, const bf16 * delta, int64_t count) {
    pdl_wait();
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
        x[i] += __bfloat162float(delta[i]);
    }
}

// vec: eight values a thread in 16-byte loads and stores (inter % 8 == 0, which every Qwen size meets, aligned rows); at 256 rows of
// 7B's 18944 one value a thread took 24 us a call (H200).
__global__ void silu_mul_kernel(const bf16 * gate_up, int inter, bool vec, bf16 * out) {
    pdl_wait();
    const int t = blockIdx.y;
    const bf16 * g_row = gate_up + int64_t(t) * 2 * inter;
    const bf16 * u_row = g_row + inter;
    bf16 * o_row = out + int64_t(t) * inter;
    if (vec) {
        for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < inter / 8; c += gridDim.x * blockDim.x) {
            const uint4 gv = reinterpret_cast<const uint4 *>(g_row)[c], uv = reinterpret_cast<const uint4 *>(u_row)[c];
            const bf16 * gh = reinterpret_cast<const bf16 *>(&gv);
            const bf16 * uh = reinterpret_cast<const bf16 *>(&uv);
            uint4 ov;
            bf16 * oh = reinterpret_cast<bf16 *>(&ov);
#pragma unroll
            for (int e = 0; e < 8; e++) oh[e] = __float2bfloat16(silu(__bfloat162float(gh[e])) * __bfloat162float(uh[e]));
            reinterpret_cast<uint4 *>(o_row)[c] = ov;
        }
        return;
    }
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < inter; i += gridDim.x * blockDim.x) {
        o_row[i] = __float2bfloat16(silu(__bfloat162float(g_row[i])) * __bfloat162float(u_row[i]));
    }
}

// out[i] = in[rows[i]]: a block per row, 16-byte chunks where rows are whole chunks (vec).
__global__ void gather_rows_kernel(const bf16 * in, const int * rows, int hidden, bool vec, bf16 * out) {
    pdl_wait();
    const int i = blockIdx.x;
    const bf16 * src = in + int64_t(rows[i]) * hidden;
    bf16 * dst = out + int64_t(i) * hidden;
    if (vec) {
        for (int j = threadIdx.x; j < hidden / 8; j += blockDim.x) reinterpret_cast<uint4 *>(dst)[j] = reinterpret_cast<const uint4 *>(src)[j];
        return;
    }
    for (int j = threadIdx.x; j < hidden; j += blockDim.x) dst[j] = src[j];
}

// One block per token and group of `hpb` heads of q, k and v together (head = blockIdx.y * hpb + the thread's group;
// q heads first, then k heads, then v heads): each head has blockDim.x / hpb threads, whole warps, and thread j < d/2
// of a head owns its RoPE pair (j, j + d/2). K and V rows of a quantized cache are quantized here (kv_quant.cuh): the
// row's min and max (int8/int4) come from a reduction over the head's warps. Every barrier is reached by every thread
// (the conditions around them are the same for the whole block). At 256 tokens of 7B, a head a block (9216 blocks of
// 64 threads) took 12 us a call (H200).
__global__ void qkv_rope_cache_kernel(QkvRopeArgs a, int hpb) {
    pdl_wait();
    __shared__ float ss_red[32], min_red[32], max_red[32];
    const int per_head = blockDim.x / hpb, warps_per_head = per_head / 32, group = threadIdx.x / per_head;
    const int t = blockIdx.x, head = blockIdx.y * hpb + group, j = threadIdx.x % per_head, half = a.head_dim / 2;
    const int warp = threadIdx.x / 32, first_warp = group * warps_per_head;
    const int d = a.head_dim;
    const int row = (a.n_head + 2 * a.n_kv) * d;
    const int col = head * d;
    const bool is_q = head < a.n_head, is_v = head >= a.n_head + a.n_kv;
    // The fp8 range pass looks at K and V only; spare heads of the last group do nothing.
    const bool active = head < a.n_head + 2 * a.n_kv && !(a.fp8_amax && is_q);
    const bool valid = active && j < half;
    float x0 = 0, x1 = 0;
    if (valid) {
        x0 = __bfloat162float(a.qkv[int64_t(t) * row + col + j]);
        x1 = __bfloat162float(a.qkv[int64_t(t) * row + col + j + half]);
        rope::add_bias(a, col, j, x0, x1);
    }
    const int pos = rope::position(a, t);
    if (a.q_norm || a.k_norm) {
        // Per-head RMSNorm over head_dim (Qwen3), before RoPE: the sum of squares over the head's warps.
        const float ss = warp_sum(x0 * x0 + x1 * x1);
        if (threadIdx.x % 32 == 0) ss_red[warp] = ss;
        __syncthreads();
        float total = 0;
        for (int w = 0; w < warps_per_head; w++) total += ss_red[first_warp + w];
        const bf16 * norm = is_q ? a.q_norm : a.k_norm;
        if (valid && !is_v && norm) {
            const float inv = rsqrtf(total / d + a.eps);
            x0 = __bfloat162float(__float2bfloat16(__bfloat162float(norm[j]) * (x0 * inv)));
            x1 = __bfloat162float(__float2bfloat16(__bfloat162float(norm[j + half]) * (x1 * inv)));
        }
    }
    if (valid && !is_v) rope::rotate(a, pos, j, x0, x1);
    const KVQuant & kq = a.cache.quant;
    const bool affine = kq.kind == KVKind::INT8 || kq.kind == KVKind::INT4;
    float mn = 0, mx = 0;
    if (affine || a.fp8_amax) {
        mn = warp_min(valid && !is_q ? fminf(x0, x1) : INFINITY);
        mx = warp_max(valid && !is_q ? fmaxf(x0, x1) : -INFINITY);
        if (threadIdx.x % 32 == 0) {
            min_red[warp] = mn;
            max_red[warp] = mx;
        }
        __syncthreads();
        for (int w = 0; w < warps_per_head; w++) {
            mn = fminf(mn, min_red[first_warp + w]);
            mx = fmaxf(mx, max_red[first_warp + w]);
        }
        if (a.fp8_amax) {
            // Non-negative floats order like their bit patterns.
            if (active && j == 0) atomicMax(reinterpret_cast<int *>(a.fp8_amax) + (is_v ? 1 : 0), __float_as_int(fmaxf(fabsf(mn), fabsf(mx))));
            return;
        }
    }
    if (!valid) return;
    if (is_q) {
        bf16 * q = a.q_out + (int64_t(t) * a.n_head + head) * d;
        q[j] = __float2bfloat16(x0);
        q[j + half] = __float2bfloat16(x1);
        return;
    }
    const int kvh = is_v ? head - a.n_head - a.n_kv : head - a.n_head;
    const int64_t cache_row = rope::cache_row(a, t, pos, kvh);
    if (kq.kind == KVKind::BF16) {
        bf16 * dst = (is_v ? a.cache.v : a.cache.k) + cache_row * d;
        dst[j] = __float2bfloat16(x0);
        dst[j + half] = __float2bfloat16(x1);
        return;
    }
    uint8_t * codes = (is_v ? kq.v : kq.k) + cache_row * kv_row_bytes(kq.kind, d);
    if (kq.kind == KVKind::FP8) {
        const float scale = kq.fp8_scale[is_v ? 1 : 0];
        codes[j] = float_to_e4m3(__fdiv_rn(x0, scale));
        codes[j + half] = float_to_e4m3(__fdiv_rn(x1, scale));
        return;
    }
    // int8 / int4: a constant row is stored exactly (scale 1, zero -min, every code 0).
    const float qmax = kq.kind == KVKind::INT8 ? 255.0f : 15.0f;
    const float scale = mx > mn ? __fdiv_rn(mx - mn, qmax) : 1.0f;
    const float zero = __fdiv_rn(-mn, scale);
    const uint32_t q0 = quantize_affine(x0, scale, zero, qmax), q1 = quantize_affine(x1, scale, zero, qmax);
    if (kq.kind == KVKind::INT8) {
        codes[j] = uint8_t(q0);
        codes[j + half] = uint8_t(q1);
    } else {
        codes[j] = uint8_t(q0 | (q1 << 4));
    }
    if (j == 0) (is_v ? kq.v_sz : kq.k_sz)[cache_row] = make_float2(scale, zero);
}

__global__ void fp8_scales_kernel(const float * amax, float * scale) {
    const int i = threadIdx.x;
    if (i < 2 && !(scale[i] > 0)) scale[i] = amax[i] > 0 ? __fdiv_rn(amax[i], 448.0f) : 1.0f;  // a checkpoint's scale stays
}

__global__ void sleep_kernel(int64_t ns) {
    const int64_t start = clock64();
    // clock64 counts SM cycles; __nanosleep yields while waiting.
    while (true) {
        __nanosleep(1000);
        if ((clock64() - start) > ns) break;
    }
}

int grid_for(int64_t n, int threads) { return int(std::min<int64_t>((n + threads - 1) / threads, int64_t(sm_count()) * 8)); }

}  // namespace

void embedding(const bf16 * table, const int * ids, int n, int hidden, float * x, cudaStream_t stream) {
    const bool vec = hidden % 8 == 0 && reinterpret_cast<uintptr_t>(table) % 16 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
    launch_kernel(embedding_kernel, n, k_embed_threads, 0, stream, table, ids, hidden, vec, x);
}

void rms_norm(const float * x, const bf16 * w, float eps, int n, int hidden, bf16 * y, cudaStream_t stream) {
    launch_rms_norm(const_cast<float *>(x), nullptr, w, eps, n, hidden, y, stream);
}

void add_rms_norm(float * x, const bf16 * delta, const bf16 * w, float eps, int n, int hidden, bf16 * y, cudaStream_t stream) {
    launch_rms_norm(x, delta, w, eps, n, hidden, y, stream);
}

void add_residual(float * x, const bf16 * delta, int64_t count, cudaStream_t stream) {
    launch_kernel(add_residual_kernel, grid_for(count, 256), 256, 0, stream, x, delta, count);
}

void silu_mul(const bf16 * gate_up, int n, int inter, bf16 * out, cudaStream_t stream) {
    if (n == 0) return;
    const bool vec = inter % 8 == 0 && reinterpret_cast<uintptr_t>(gate_up) % 16 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0;
    dim3 grid(vec ? (inter / 8 + 255) / 256 : (inter + 255) / 256, n);
    launch_kernel(silu_mul_kernel, grid, 256, 0, stream, gate_up, inter, vec, out);
}

void gather_rows(const bf16 * in, const int * rows, int m, int hidden, bf16 * out, cudaStream_t stream) {
    if (m == 0) return;
    const bool vec = hidden % 8 == 0 && reinterpret_cast<uintptr_t>(in) % 16 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0;
    launch_kernel(gather_rows_kernel, dim3(m), dim3(256), 0, stream, in, rows, hidden, vec, out);
}

void fp8_scales_from_amax(const float * amax, float * scale, cudaStream_t stream) {
    fp8_scales_kernel<<<1, 32, 0, stream>>>(amax, scale);
    CUDA_CHECK(cudaGetLastError());
}

void qkv_rope_cache(const QkvRopeArgs & a, cudaStream_t stream) {
    if (a.head_dim % 2 != 0 || a.head_dim > 2048) QINFER_FAIL() << "qkv_rope_cache: head_dim " << a.head_dim;
    if (a.fp8_amax && a.cache.quant.kind != KVKind::FP8) QINFER_FAIL() << "qkv_rope_cache: an fp8 range pass on a cache that is not fp8";
    if (a.n == 0) return;
    const int per_head = (a.head_dim / 2 + 31) / 32 * 32, hpb = std::max(1, 256 / per_head), heads = a.n_head + 2 * a.n_kv;
    dim3 grid(a.n, (heads + hpb - 1) / hpb);
    launch_kernel(qkv_rope_cache_kernel, grid, per_head * hpb, 0, stream, a, hpb);
}

void gpu_sleep(int microseconds, cudaStream_t stream) {
    int clock_khz = 1500000;
    cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0);
    sleep_kernel<<<1, 1, 0, stream>>>(int64_t(microseconds) * clock_khz / 1000);
    CUDA_CHECK(cudaGetLastError());
}


}  // namespace qinfer::cuda
