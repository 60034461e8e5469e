// Tensor parallel within one process (model/qwen_cuda_tp.cpp): the ranks' partial sums added into every rank's
// residual by one small kernel that reads each rank's buffer through peer access (NVLink), the one-shot all-reduce
// of vLLM's and TensorRT-LLM's custom all-reduce, in place of an NCCL all-reduce for the decode step's messages
// (a few rows of the hidden size, fp32).
//
// Every rank writes its partial sum [n] fp32 into its own buffer `which` (0 or 1), then calls peer_add_partials:
//   x[i] = (((x[i] + part_0[i]) + part_1[i]) + ...)   (in rank order: every rank computes the same bits)
// Each block of the kernel first meets the same block of every other rank (a flag stored into each peer's memory with
// release semantics, each peer's flag awaited with acquire), so every rank's buffer is complete before it is read.
// The two buffers alternate between consecutive calls (the decode step's o_proj then down / the experts): a rank
// writes buffer w again only two calls later, and it cannot pass the call in between before every rank has arrived
// there, which each does only after it has finished reading buffer w. A block's flags count its calls (an epoch per
// block, kept on the device), so the kernel can be replayed from CUDA graphs and issued eagerly in any mix, as long
// as every rank makes the same calls in the same order (tensor parallel's steps do). A peer that never arrives ends
// the kernel with a trap after k_peer_wait_s seconds instead of a hang.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "backends/cuda/allocator.h"

namespace qinfer::cuda {

constexpr int k_peer_max_ranks = 8;
constexpr int k_peer_max_blocks = 64;  // blocks of the kernel at most (flags and epochs per block)
constexpr double k_peer_wait_s = 60;   // a block waits this long for a peer's flag, then traps

// One rank's view of every rank's buffers (device addresses; peers' through peer access). Passed to the kernel by value.
struct PeerRanks {
    int rank = 0, ranks = 0;
    size_t capacity = 0;                       // floats in each partial-sum buffer
    float * parts[2][k_peer_max_ranks] = {};   // [which][rank]
    uint32_t * flags[k_peer_max_ranks] = {};   // rank r's arrival flags [k_peer_max_blocks][k_peer_max_ranks]: [b][q] written by rank q
    uint32_t * epochs = nullptr;               // this rank's calls so far, per block [k_peer_max_blocks]
};

// A rank's own buffers, allocated on the current device (zeroed).
struct PeerBuffers {
    DeviceBuffer parts[2];
    DeviceBuffer flags, epochs;
    size_t capacity = 0;
    explicit PeerBuffers(size_t capacity_floats);
};

// Every rank's view of every rank's buffers (all[r]: rank r's; the result's [r]: rank r's view).
std::vector<PeerRanks> link_peer_ranks(const std::vector<std::unique_ptr<PeerBuffers>> & all);

// Devices 0..n-1 given access to each other's memory (each pair both ways); false, with nothing changed that matters,
// where some pair cannot. Leaves the current device as it was.
bool enable_peer_access(int n);

// x [n] fp32 += every rank's parts[which] [n], in rank order (the header's comment). n a multiple of 4, at most
// p.capacity; x 16-byte aligned.
void peer_add_partials(float * x, const PeerRanks & p, int which, size_t n, cudaStream_t stream);

}  // namespace qinfer::cuda
