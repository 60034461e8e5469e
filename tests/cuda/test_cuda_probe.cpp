// The read-bandwidth probes of `qinfer bench --bandwidth` (backends/cuda/bandwidth_probe.cu) read every byte they
// claim to, once: the XOR of their blocks' XORs equals the CPU's XOR of the region's words, for loads and for bulk
// copies, contiguous and in pages of several heads, on odd grids and sizes.
#include <cstdint>
#include <vector>

#include "core/rng.h"
#include "cuda/helpers.h"

namespace qinfer::test {
namespace {

uint32_t xor_words(const std::vector<uint32_t> & w, size_t n) {
    uint32_t x = 0;
    for (size_t i = 0; i < n; i++) x ^= w[i];
    return x;
}

TEST(CudaBandwidthProbe, ReadsEveryWordOnce) {
    REQUIRE_GPU();
    const int64_t region = (int64_t(3) << 20) + 4096 * 7 + 48;  // odd: every probe rounds down to its blocks' shares
    std::vector<uint32_t> words(size_t(region / 4));
    for (size_t i = 0; i < words.size(); i++) words[i] = uint32_t(splitmix64(i * 7919 + 1));
    DeviceBuffer d = upload(words);
    std::vector<cuda::BandwidthProbe> probes;
    for (int blocks : {1, 7, 133}) {
        for (int unroll : {4, 8, 16}) {
            cuda::BandwidthProbe p;
            p.blocks = blocks;
            p.unroll = unroll;
            probes.push_back(p);
        }
    }
    for (int heads : {1, 3, 4, 16}) {
        for (int chunk : {2048, 8192}) {
            cuda::BandwidthProbe p;
            p.copies = true;
            p.chunk = chunk;
            p.heads = heads;
            p.splits = 5;
            p.per_stage = chunk == 2048 ? 3 : 1;
            p.stages = 4;
            probes.push_back(p);
        }
    }
    for (const cuda::BandwidthProbe & p : probes) {
        if (!cuda::probe_runs_here(p)) continue;
        const int64_t bytes = cuda::probe_bytes(p, region);
        ASSERT_GT(bytes, region / 2) << "a probe reads most of the region";
        DeviceBuffer out(size_t(cuda::probe_grid(p)) * 4, "test");
        cuda::bandwidth_probe(p, d.get(), region, out.as<uint32_t>(), nullptr);
        std::vector<uint32_t> per_block(size_t(cuda::probe_grid(p)));
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        ASSERT_EQ(cudaMemcpy(per_block.data(), out.get(), per_block.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
        uint32_t got = 0;
        for (uint32_t v : per_block) got ^= v;
        EXPECT_EQ(got, xor_words(words, size_t(bytes / 4))) << (p.copies ? "copies" : "loads") << " blocks " << p.blocks << " unroll " << p.unroll
                                                           << " heads " << p.heads << " chunk " << p.chunk;
    }
}

TEST(CudaBandwidthProbe, RegionTooSmallIsAnError) {
    REQUIRE_GPU();
    DeviceBuffer d(4096, "test"), out(4096, "test");
    cuda::BandwidthProbe p;
    p.copies = true;
    p.splits = 4;
    p.heads = 4;
    if (!cuda::probe_runs_here(p)) GTEST_SKIP() << "bulk copies need sm_90a";
    EXPECT_THROW(cuda::bandwidth_probe(p, d.get(), 4096, out.as<uint32_t>(), nullptr), std::exception);
}

}  // namespace
}  // namespace qinfer::test
