// Hopper warpgroup MMAs (wgmma.mma_async, sm_90a only): shared-memory matrix descriptors for 128-byte-swizzled
// tiles, the fences around them, and the m64nNk16 bf16 -> fp32 shapes the kernels use.
//
// Tiles in shared memory are stored in panels of 64 bf16 columns (one 128-byte line per row); within each 1024-byte
// group of 8 lines, 16-byte chunk c of line r sits at chunk c ^ r (the 128-byte swizzle, CuTe's Swizzle<3,4,3>).
// A tile's base must be 1024-byte aligned. Descriptors (PTX ISA "Matrix Descriptor Format"):
//   K-major (rows of the tile along M or N, the reduction dim contiguous): stride byte offset 1024 (the next 8 rows),
//   leading byte offset unused; a k16 step inside a panel adds 32 bytes to the start address.
//   N-major (rows along the reduction dim, N contiguous): stride byte offset 1024 (the next 8 rows of K), leading byte
//   offset = the panel stride (the next 64 columns of N).
// Register fragments: A of m64nNk16 is, per warp of the warpgroup (16 rows each), mma.sync m16n8k16's A fragment;
// the fp32 accumulator d[N / 2] is, per warp, N / 8 of mma.sync's m16n8 C fragments: d[4 j + e] at row g (e < 2) or
// g + 8 and column 8 j + 2 (lane % 4) + e % 2, g = lane / 4.
#pragma once

#include <cstdint>

namespace qinfer::cuda::sm90 {

// Byte offset of 16-byte chunk `chunk` (8 bf16 at column 8 * chunk) of row `row` in a swizzled tile of `rows` rows.
__host__ __device__ constexpr int swizzle128_offset(int row, int chunk, int rows) {
    return (chunk / 8) * rows * 128 + row * 128 + (((chunk % 8) ^ (row % 8)) * 16);
}

__device__ __forceinline__ uint32_t smem_addr(const void * p) { return uint32_t(__cvta_generic_to_shared(p)); }

// 64-bit descriptor of a 128-byte-swizzled tile starting at shared address `addr`.
__device__ __forceinline__ uint64_t desc128(uint32_t addr, uint32_t leading_bytes, uint32_t stride_bytes) {
    return uint64_t((addr & 0x3FFFFu) >> 4) | uint64_t((leading_bytes & 0x3FFFFu) >> 4) << 16 |
           uint64_t((stride_bytes & 0x3FFFFu) >> 4) << 32 | uint64_t(1) << 62;
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// Shared-memory writes of this thread (st.shared, cp.async) made visible to the async proxy that wgmma reads with;
// each writer fences, then the block synchronises.
__device__ __forceinline__ void fence_proxy_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }

// Keeps the compiler from moving reads or writes of an accumulator (or of A fragments an MMA still reads) across the
// fence / wait around an async MMA.
template <int N> __device__ __forceinline__ void fence_operands(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(d[i])::"memory");
}
template <int N> __device__ __forceinline__ void fence_operands(uint32_t (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+r"(r[i])::"memory");
}

// mbarriers in shared memory (PTX "mbarrier"): a phase completes when `count` arrivals (and, after expect_tx, the
// announced bytes of asynchronous copies) have come; waiters name the phase by its parity (0 for the first).
__device__ __forceinline__ void mbar_init(uint64_t * bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
// After a block's mbarrier.init, before other threads or the async proxy use the barriers (then a block barrier).
__device__ __forceinline__ void fence_mbar_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
__device__ __forceinline__ void mbar_arrive(uint64_t * bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
// One arrival that also announces `bytes` of tensor copies completing on this barrier's current phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t * bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t * bar, uint32_t parity) {
    asm volatile(
        "{\n.reg .pred done;\n"
        "WAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WAIT;\n}\n" ::"r"(smem_addr(bar)),
        "r"(parity)
        : "memory");
}
// A block's pipeline barriers, by thread 0: full[s] (one arrival, plus the stage's copied bytes) and empty[s]
// (`consumers` arrivals) for each of `stages` stages; then the whole block synchronises.
__device__ __forceinline__ void init_stage_barriers(uint64_t * full, uint64_t * empty, int stages, uint32_t consumers) {
    if (threadIdx.x == 0) {
        for (int s = 0; s < stages; s++) {
            mbar_init(&full[s], 1);
            mbar_init(&empty[s], consumers);
        }
        fence_mbar_init();
    }
    __syncthreads();
}
// Named barrier `id` (1..15; 0 is __syncthreads) over `threads` threads, a multiple of 32.
__device__ __forceinline__ void named_barrier(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// Arrives at named barrier `id` without waiting (the other threads of its count wait with named_barrier).
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// The tensor copy engine: box (c0, c1) of the 2-D tensor map `map` (a __grid_constant__ kernel parameter) into shared
// memory at dst, its bytes counted on `bar`.
__device__ __forceinline__ void tma_load_2d(void * dst, const void * map, uint64_t * bar, int c0, int c1) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n" ::"r"(
                     smem_addr(dst)),
                 "l"(map), "r"(smem_addr(bar)), "r"(c0), "r"(c1)
                 : "memory");
}
__device__ __forceinline__ void tma_load_3d(void * dst, const void * map, uint64_t * bar, int c0, int c1, int c2) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];\n" ::"r"(
                     smem_addr(dst)),
                 "l"(map), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2)
                 : "memory");
}
// The bulk copy engine without a map: `bytes` contiguous bytes (a multiple of 16, both addresses 16-byte aligned) from
// global src into shared dst, counted on `bar`.
__device__ __forceinline__ void bulk_load(void * dst, const void * src, uint32_t bytes, uint64_t * bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(smem_addr(dst)), "l"(src),
                 "r"(bytes), "r"(smem_addr(bar))
                 : "memory");
}
// The tensor copy engine the other way: shared memory at src (the map's box layout, swizzle included) to box (c0, c1)
// of `map`; elements outside the tensor are not written. Then a bulk group committed and its reads of src waited for.
__device__ __forceinline__ void tma_store_2d(const void * map, const void * src, int c0, int c1) {
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n" ::"l"(map), "r"(smem_addr(src)), "r"(c0), "r"(c1)
                 : "memory");
}
__device__ __forceinline__ void bulk_commit_and_wait_read() {
    asm volatile("cp.async.bulk.commit_group;\ncp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
// Four 8 x 8 bf16 matrices from their mma fragments (register i: matrix i, a lane's row lane / 4, columns 2 (lane % 4)
// and + 1), each stored transposed: lane 8 i + j gives the address of the 16 bytes of matrix i's column j.
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r0), "r"(r1), "r"(r2), "r"(r3)
                 : "memory");
}
__device__ __forceinline__ void prefetch_tensor_map(const void * map) {
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(map) : "memory");
}

#define QINFER_ACC8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])

// d[64 x 128] (+)= A[64 x 16] B[16 x 128]; A and B from shared memory, both K-major. accumulate 0: d = A B.
__device__ __forceinline__ void wgmma_m64n128k16_ss(float (&d)[64], uint64_t a_desc, uint64_t b_desc, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "
        "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, "
        "%46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "%64, %65, p, 1, 1, 0, 0;\n}\n"
        : QINFER_ACC8(0), QINFER_ACC8(8), QINFER_ACC8(16), QINFER_ACC8(24), QINFER_ACC8(32), QINFER_ACC8(40), QINFER_ACC8(48),
          QINFER_ACC8(56)
        : "l"(a_desc), "l"(b_desc), "r"(accumulate));
}

// d[64 x 128] += A[64 x 16] B[16 x 128]; A from registers, B from shared memory N-major.
__device__ __forceinline__ void wgmma_m64n128k16_rs_nmajor(float (&d)[64], const uint32_t (&a)[4], uint64_t b_desc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "
        "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, "
        "%46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
        : QINFER_ACC8(0), QINFER_ACC8(8), QINFER_ACC8(16), QINFER_ACC8(24), QINFER_ACC8(32), QINFER_ACC8(40), QINFER_ACC8(48),
          QINFER_ACC8(56)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(1));
}

// d[64 x 64] += A[64 x 16] B[16 x 64]; A from registers, B from shared memory N-major.
__device__ __forceinline__ void wgmma_m64n64k16_rs_nmajor(float (&d)[32], const uint32_t (&a)[4], uint64_t b_desc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "
        "%24, %25, %26, %27, %28, %29, %30, %31}, "
        "{%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
        : QINFER_ACC8(0), QINFER_ACC8(8), QINFER_ACC8(16), QINFER_ACC8(24)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(1));
}

// d[64 x N] += A[64 x 16] B[16 x N]; A from registers, B from shared memory K-major (rows of B along N, the
// reduction dim contiguous). N 16, 32, 64 or 128.
template <int N> __device__ __forceinline__ void wgmma_rs_kmajor(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t b_desc);
template <> __device__ __forceinline__ void wgmma_rs_kmajor<16>(float (&d)[8], const uint32_t (&a)[4], uint64_t b_desc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7"
        "}, {%8, %9, %10, %11}, %12, p, 1, 1, 0;\n}\n"
        : QINFER_ACC8(0)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(1));
}

template <> __device__ __forceinline__ void wgmma_rs_kmajor<32>(float (&d)[16], const uint32_t (&a)[4], uint64_t b_desc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
        "}, {%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
        : QINFER_ACC8(0), QINFER_ACC8(8)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(1));
}

template <> __device__ __forceinline__ void wgmma_rs_kmajor<64>(float (&d)[32], const uint32_t (&a)[4], uint64_t b_desc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "
        "%24, %25, %26, %27, %28, %29, %30, %31"
        "}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
        : QINFER_ACC8(0), QINFER_ACC8(8), QINFER_ACC8(16), QINFER_ACC8(24)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(1));
}

template <> __device__ __forceinline__ void wgmma_rs_kmajor<128>(float (&d)[64], const uint32_t (&a)[4], uint64_t b_desc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "
        "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
        "}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
        : QINFER_ACC8(0), QINFER_ACC8(8), QINFER_ACC8(16), QINFER_ACC8(24), QINFER_ACC8(32), QINFER_ACC8(40), QINFER_ACC8(48), QINFER_ACC8(56)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(1));
}

template <> __device__ __forceinline__ void wgmma_rs_kmajor<256>(float (&d)[128], const uint32_t (&a)[4], uint64_t b_desc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "
        "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, "
        "%72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
        "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, "
        "%120, %121, %122, %123, %124, %125, %126, %127"
        "}, {%128, %129, %130, %131}, %132, p, 1, 1, 0;\n}\n"
        : QINFER_ACC8(0), QINFER_ACC8(8), QINFER_ACC8(16), QINFER_ACC8(24), QINFER_ACC8(32), QINFER_ACC8(40), QINFER_ACC8(48), QINFER_ACC8(56),
          QINFER_ACC8(64), QINFER_ACC8(72), QINFER_ACC8(80), QINFER_ACC8(88), QINFER_ACC8(96), QINFER_ACC8(104), QINFER_ACC8(112), QINFER_ACC8(120)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(1));
}


#undef QINFER_ACC8

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

}  // namespace qinfer::cuda::sm90
