// Read-bandwidth probes (`qinfer bench --bandwidth`): how fast one kernel can stream a region of global memory of a
// given size, in the two ways the engine's kernels read their bytes, so that a kernel's TB/s can be set against what
// the card does, not only against its datasheet.
//   loads: each thread keeps `unroll` 16-byte non-caching loads in flight (the GEMVs' way), block b reading the
//     b-th contiguous share of the region.
//   copies (sm_90a): one lane of a fifth warp issues bulk copies of `chunk` bytes into a ring of `stages` stages in
//     shared memory, four warps wait for each stage and release it (the decode attention's way). With `heads` > 1
//     the region is pages of `heads` chunks and block (split, head) reads chunk `head` of its split's pages: the
//     layout of a paged KV cache, one KV head a block.
// Every word read goes into an XOR per block (out[block]); the XOR of all of them is the region's, which the tests
// check against the CPU.
#include "backends/cuda/common.cuh"
#include "core/check.h"
#include "backends/cuda/ops.h"
#include "backends/cuda/wgmma.cuh"

namespace qinfer::cuda {

namespace {

constexpr int k_probe_threads = 256;
constexpr int k_copy_consumers = 4;  // warps that read the stages

// The XOR of every thread's `acc` into out[blockIdx.x].
__device__ __forceinline__ void block_xor(uint32_t acc, uint32_t * out) {
    __shared__ uint32_t warp_acc[32];
    for (int o = 16; o > 0; o >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
    if (threadIdx.x % 32 == 0) warp_acc[threadIdx.x / 32] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        uint32_t total = 0;
        for (int w = 0; w < int(blockDim.x / 32); w++) total ^= warp_acc[w];
        out[blockIdx.x] = total;
    }
}

template <int UNROLL> __global__ void __launch_bounds__(k_probe_threads) probe_loads_kernel(const uint4 * p, int64_t per_block, uint32_t * out) {
    const uint4 * q = p + blockIdx.x * per_block;
    uint32_t acc = 0;
    for (int64_t i0 = threadIdx.x; i0 < per_block; i0 += int64_t(UNROLL) * k_probe_threads) {
        uint4 v[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const int64_t i = i0 + int64_t(u) * k_probe_threads;
            v[u] = i < per_block ? load_stream_pinned(q + i) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < UNROLL; u++) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    block_xor(acc, out);
}

// Block (split, head) = (blockIdx.x / heads, blockIdx.x % heads) reads chunk `head` of pages [split * pages_per_block,
// + pages_per_block): `per_stage` chunks a stage.
__global__ void __launch_bounds__((k_copy_consumers + 1) * 32)
    probe_copies_kernel(const unsigned char * p, int chunk, int heads, int pages_per_block, int per_stage, int stages, uint32_t * out) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ __align__(128) unsigned char smem[];
    const int stage_bytes = chunk * per_stage;
    uint64_t * full = reinterpret_cast<uint64_t *>(smem + size_t(stages) * stage_bytes), * empty = full + stages;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int split = blockIdx.x / heads, head = blockIdx.x % heads;
    if (threadIdx.x == 0) {
        for (int s = 0; s < stages; s++) {
            sm90::mbar_init(&full[s], 1);
            sm90::mbar_init(&empty[s], k_copy_consumers);
        }
        sm90::fence_mbar_init();
    }
    __syncthreads();
    const int n_tiles = pages_per_block / per_stage;
    uint32_t acc = 0;
    if (warp == k_copy_consumers) {
        for (int t = 0; t < n_tiles; t++) {
            const int s = t % stages;
            if (t >= stages) sm90::mbar_wait(&empty[s], (t / stages - 1) & 1);
            if (lane == 0) sm90::mbar_arrive_expect_tx(&full[s], uint32_t(stage_bytes));
            __syncwarp();
            for (int c = lane; c < per_stage; c += 32) {
                const int64_t page = int64_t(split) * pages_per_block + int64_t(t) * per_stage + c;
                sm90::bulk_load(smem + size_t(s) * stage_bytes + size_t(c) * chunk, p + (page * heads + head) * chunk, uint32_t(chunk), &full[s]);
            }
        }
    } else {
        for (int t = 0; t < n_tiles; t++) {
            const int s = t % stages;
            sm90::mbar_wait(&full[s], (t / stages) & 1);
            const uint4 * st = reinterpret_cast<const uint4 *>(smem + size_t(s) * stage_bytes);
            for (int i = threadIdx.x; i < stage_bytes / 16; i += k_copy_consumers * 32) {
                const uint4 v = st[i];
                acc ^= v.x ^ v.y ^ v.z ^ v.w;
            }
            __syncwarp();
            if (lane == 0) sm90::mbar_arrive(&empty[s]);
        }
    }
    block_xor(acc, out);
#endif
}

}  // namespace

int64_t probe_bytes(const BandwidthProbe & pr, int64_t region_bytes) {
    if (pr.copies) {
        const int64_t page_bytes = int64_t(pr.chunk) * pr.heads, tile_pages = pr.per_stage;
        const int64_t pages_per_block = region_bytes / page_bytes / pr.splits / tile_pages * tile_pages;
        return pages_per_block * page_bytes * pr.splits;
    }
    return region_bytes / 16 / pr.blocks * 16 * pr.blocks;
}

size_t probe_smem_bytes(const BandwidthProbe & pr) {
    return pr.copies ? size_t(pr.chunk) * pr.per_stage * pr.stages + 2 * sizeof(uint64_t) * pr.stages : 0;
}

int probe_grid(const BandwidthProbe & pr) { return pr.copies ? pr.splits * pr.heads : pr.blocks; }

bool probe_runs_here(const BandwidthProbe & pr) { return !pr.copies || sm90a_device(); }

void bandwidth_probe(const BandwidthProbe & pr, const void * region, int64_t region_bytes, uint32_t * out, cudaStream_t stream) {
    const int64_t bytes = probe_bytes(pr, region_bytes);
    if (bytes <= 0) QINFER_FAIL() << "bandwidth probe: a region of " << region_bytes << " bytes is too small for this probe";
    if (!pr.copies) {
        const int64_t per_block = bytes / 16 / pr.blocks;
        const uint4 * p = static_cast<const uint4 *>(region);
        switch (pr.unroll) {
            case 4: probe_loads_kernel<4><<<pr.blocks, k_probe_threads, 0, stream>>>(p, per_block, out); break;
            case 8: probe_loads_kernel<8><<<pr.blocks, k_probe_threads, 0, stream>>>(p, per_block, out); break;
            case 16: probe_loads_kernel<16><<<pr.blocks, k_probe_threads, 0, stream>>>(p, per_block, out); break;
            default: QINFER_FAIL() << "bandwidth probe: unroll must be 4, 8 or 16, got " << pr.unroll;
        }
    } else {
        if (!sm90a_device()) QINFER_FAIL() << "bandwidth probe: bulk copies need an sm_90a build on a Hopper GPU";
        if (pr.chunk % 16 != 0 || pr.per_stage < 1 || pr.stages < 1) QINFER_FAIL() << "bandwidth probe: chunks of 16-byte multiples, at least one a stage and one stage";
        const int pages_per_block = int(bytes / (int64_t(pr.chunk) * pr.heads) / pr.splits);
        const size_t smem = probe_smem_bytes(pr);
        static PerDevice<size_t> configured;
        allow_dynamic_smem(probe_copies_kernel, smem, configured);
        probe_copies_kernel<<<probe_grid(pr), (k_copy_consumers + 1) * 32, smem, stream>>>(
            static_cast<const unsigned char *>(region), pr.chunk, pr.heads, pages_per_block, pr.per_stage, pr.stages, out);
    }
    CUDA_CHECK(cudaGetLastError());
}

}  // namespace qinfer::cuda
