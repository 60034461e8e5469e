// Device memory from one allocator per GPU that records its peak (weights, KV cache and workspaces alike), so the
// benchmark reports what a request really used. Tensor parallel runs a rank per GPU on its own thread: each thread
// allocates on its current device, and a buffer is returned to the allocator of the device it came from.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace qinfer::cuda {

// The GPUs a process drives (tensor parallel: a rank each) and the calling thread's current one.
constexpr int k_max_devices = 16;
int current_device();

class DeviceAllocator {
public:
    static DeviceAllocator & instance();           // the current device's
    static DeviceAllocator & of_device(int device);
    void * alloc(size_t bytes, const char * what);
    void free(void * p, size_t bytes);
    uint64_t in_use() const { return in_use_; }
    uint64_t peak() const { return peak_; }
    void reset_peak() { peak_ = in_use_; }

private:
    uint64_t in_use_ = 0;
    uint64_t peak_ = 0;
};

// An owning device allocation.
class DeviceBuffer {
public:
    DeviceBuffer() = default;
    DeviceBuffer(size_t bytes, const char * what);
    ~DeviceBuffer();
    DeviceBuffer(DeviceBuffer && o) noexcept;
    DeviceBuffer & operator=(DeviceBuffer && o) noexcept;
    DeviceBuffer(const DeviceBuffer &) = delete;
    DeviceBuffer & operator=(const DeviceBuffer &) = delete;
    void * get() const { return ptr_; }
    template <typename T> T * as() const { return static_cast<T *>(ptr_); }
    size_t bytes() const { return bytes_; }
    // Grows (never shrinks) to at least `bytes`; contents are not kept.
    void ensure(size_t bytes, const char * what);

private:
    void * ptr_ = nullptr;
    size_t bytes_ = 0;
    int device_ = 0;
};

// Pinned host memory mapped into the device's address space: kernels read it over PCIe. For tables read a row at a
// time, such as the token embedding of a checkpoint whose lm_head is a separate matrix. Not device memory (not
// counted by DeviceAllocator).
class HostMappedBuffer {
public:
    HostMappedBuffer() = default;
    HostMappedBuffer(size_t bytes, const char * what);
    ~HostMappedBuffer();
    HostMappedBuffer(HostMappedBuffer && o) noexcept;
    HostMappedBuffer & operator=(HostMappedBuffer && o) noexcept;
    HostMappedBuffer(const HostMappedBuffer &) = delete;
    HostMappedBuffer & operator=(const HostMappedBuffer &) = delete;
    void * host() const { return host_; }
    void * device() const { return device_; }
    size_t bytes() const { return bytes_; }

private:
    void * host_ = nullptr;
    void * device_ = nullptr;
    size_t bytes_ = 0;
};

// Host data to device (or mapped host) memory through two pinned buffers on a stream of its own: producing one chunk
// into pinned memory (a copy, or a dtype conversion) overlaps the DMA of the chunk before, and no host copy of a whole
// tensor is made. Loading weights uses one per GPU (on the thread that drives it).
class HostStaging {
public:
    HostStaging();  // on the current device
    ~HostStaging();
    HostStaging(const HostStaging &) = delete;
    HostStaging & operator=(const HostStaging &) = delete;
    // `bytes` bytes to dst: fill(chunk, offset, n) writes bytes [offset, offset + n) of the data into chunk (offset a
    // multiple of k_chunk_bytes). Returns once dst holds them.
    void copy(void * dst, size_t bytes, const std::function<void(uint8_t * chunk, size_t offset, size_t n)> & fill);

    static constexpr size_t k_chunk_bytes = size_t(32) << 20;

private:
    uint8_t * chunk_[2] = {};
    cudaEvent_t drained_[2] = {};  // chunk i's DMA done
    cudaStream_t stream_ = nullptr;
};

}  // namespace qinfer::cuda
