// Shared CUDA helpers: error checks, bf16 conversions, warp reductions.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "backends/cuda/allocator.h"
#include "backends/cuda/cuda_check.h"
#include "core/check.h"

namespace qinfer::cuda {

// Programmatic dependent launch (Hopper): launch_kernel may let a kernel start before the kernel ahead of it in the
// stream has finished. On when the engine asks for it (set_pdl_default: every checkpoint, see model/qwen_cuda.cpp).
// Every kernel it launches calls pdl_wait() first: griddepcontrol.wait returns once the kernel ahead has completed
// and its writes are visible (at once when launched normally, and a no-op below sm_90), and launch_dependents lets
// the next kernel's blocks be scheduled meanwhile. (Triggering after the main loops instead was slower: 0.5B
// 1286.6 -> 1184.9 tok/s on an H100, docs/perf-log.md 11-27.)
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// 16 bytes global -> shared without registers; valid false zero-fills them (sm_80 and up). The destination as a
// shared-memory address (where a kernel keeps its addresses that way) or as a pointer.
__device__ __forceinline__ void cp_async16(uint32_t smem_addr, const void * gmem, bool valid) {
    const int bytes = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr), "l"(gmem), "r"(bytes));
}
__device__ __forceinline__ void cp_async16(void * smem, const void * gmem, bool valid) {
    cp_async16(uint32_t(__cvta_generic_to_shared(smem)), gmem, valid);
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

bool pdl_enabled();

// The decode attention's combine goes without programmatic dependent launch unless the launch's sequences stay within
// k_short_decode_keys keys (attention.cu, launch_combine). Launched early, its blocks waited beside the whole split
// kernel; with it launched normally, PDL on, H100 decode tok/s went 7B BF16 187.2 -> 187.1 / 161.0 -> 182.6 / 149.4 -> 166.1 at input 1 / 6144 / 30720, 1.5B
// 636.5 -> 633.3 / 502.6 -> 514.9 at 1 / 30720, 0.5B and 7B GPTQ-Int4 within 1% (bench/results/2026-11-27-h100-pdl-matrix);
// launched early within k_short_decode_keys keys (combine-long against combine, alternated twice at 96c45a3): 0.5B
// 1380.5 -> 1394.4 tok/s at input 1, 0.5B GPTQ-Int4 1662.7 -> 1685.7, 1.5B 661.4 -> 665.1, 7B 188.9 -> 189.1 at 1,
// 182.0 both at 6144 (bench/results/2026-11-28-h100-combine-pdl-short).
extern thread_local bool pdl_suspended;
// While alive (and `on`), launch_kernel launches without PDL.
struct ScopedNoPdl {
    bool prev;
    explicit ScopedNoPdl(bool on) : prev(pdl_suspended) { pdl_suspended = prev || on; }
    ~ScopedNoPdl() { pdl_suspended = prev; }
    ScopedNoPdl(const ScopedNoPdl &) = delete;
    ScopedNoPdl & operator=(const ScopedNoPdl &) = delete;
};

// A value per GPU of the process (tensor parallel runs one rank a GPU, each on its own thread): settings such as a
// kernel's shared-memory limit hold for the device that was current when they were made.
template <class T> struct PerDevice {
    T v[k_max_devices];
    explicit PerDevice(T init = T{}) {
        for (T & x : v) x = init;
    }
    T & here() { return v[current_device()]; }
};

// Lets `kernel` take `bytes` of dynamic shared memory. Beyond 48 KB per block, static shared memory included, a kernel
// must opt in, so the limit is raised on each device at its first launch there and whenever a launch needs more;
// `configured` is the caller's record for this kernel (start at 0).
template <class... KernelArgs> void allow_dynamic_smem(void (*kernel)(KernelArgs...), size_t bytes, PerDevice<size_t> & configured) {
    size_t & done = configured.here();
    if (bytes <= done) return;
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
    done = bytes;
}

// kernel<<<grid, block, smem, stream>>>(args...), with the programmatic-serialization attribute when pdl_enabled().
template <class... KernelArgs, class... Args>
void launch_kernel(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, Args &&... args) {
    if (!pdl_enabled()) {
        kernel<<<grid, block, smem, stream>>>(std::forward<Args>(args)...);
    } else {
        cudaLaunchConfig_t config = {};
        config.gridDim = grid;
        config.blockDim = block;
        config.dynamicSmemBytes = smem;
        config.stream = stream;
        cudaLaunchAttribute attribute[1];
        attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attribute[0].val.programmaticStreamSerializationAllowed = 1;
        config.attrs = attribute;
        config.numAttrs = 1;
        CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
    }
    CUDA_CHECK(cudaGetLastError());
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ float warp_min(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fminf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over a block of `n_warps` warps; `shared` holds n_warps floats. Every thread gets the total.
template <int n_warps> __device__ __forceinline__ float block_sum(float v, float * shared) {
    v = warp_sum(v);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    float total = 0;
#pragma unroll
    for (int i = 0; i < n_warps; i++) total += shared[i];
    __syncthreads();
    return total;
}

// A 16-byte load of weights that are read exactly once: bypasses L1 so that shared inputs stay there.
__device__ __forceinline__ uint4 load_stream(const uint4 * p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

// load_stream as a volatile asm: the load stays where it is written (requested ahead of its use: before pdl_wait(),
// or a ring of loads ahead) instead of being moved next to its use.
__device__ __forceinline__ uint4 load_stream_pinned(const uint4 * p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

// Dot product of eight bf16 pairs (16 bytes each) in fp32, in order.
__device__ __forceinline__ float dot8(const uint4 & w, const uint4 & x) {
    const __nv_bfloat162 * wp = reinterpret_cast<const __nv_bfloat162 *>(&w);
    const __nv_bfloat162 * xp = reinterpret_cast<const __nv_bfloat162 *>(&x);
    float s = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 a = __bfloat1622float2(wp[i]), b = __bfloat1622float2(xp[i]);
        s = fmaf(a.x, b.x, s);
        s = fmaf(a.y, b.y, s);
    }
    return s;
}

__device__ __forceinline__ float silu(float x) { return x / (1.0f + __expf(-x)); }

// SwiGLU of fp32 gate and up sums as transformers computes it after its two projections: both rounded to bf16 first
// (the unfused path's silu_mul reads them so), then silu(gate) * up in fp32.
__device__ __forceinline__ float silu_mul_rounded(float gate, float up) {
    return silu(__bfloat162float(__float2bfloat16(gate))) * __bfloat162float(__float2bfloat16(up));
}

}  // namespace qinfer::cuda
