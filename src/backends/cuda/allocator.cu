#include "backends/cuda/allocator.h"

#include <algorithm>
#include <sstream>

#include "backends/cuda/common.cuh"

namespace qinfer::cuda {

int current_device() {
    int d = 0;
    CUDA_CHECK(cudaGetDevice(&d));
    return d;
}

DeviceAllocator & DeviceAllocator::of_device(int device) {
    static DeviceAllocator a[k_max_devices];
    QINFER_CHECK(device >= 0 && device < k_max_devices) << "CUDA device " << device << " beyond the " << k_max_devices << " qinfer handles";
    return a[device];
}

DeviceAllocator & DeviceAllocator::instance() { return of_device(current_device()); }

void * DeviceAllocator::alloc(size_t bytes, const char * what) {
    if (bytes == 0) return nullptr;
    void * p = nullptr;
    cudaError_t err = cudaMalloc(&p, bytes);
    if (err != cudaSuccess && err != cudaErrorMemoryAllocation) {
        // A sticky error of an earlier kernel (an illegal address) fails every allocation after it: not out of memory.
        QINFER_FAIL() << "CUDA error " << cudaGetErrorName(err) << " allocating " << double(bytes) / 1e9 << " GB for " << what << ": "
                      << cudaGetErrorString(err);
    }
    if (err != cudaSuccess) {
        cudaGetLastError();
        size_t free_b = 0, total_b = 0;
        cudaMemGetInfo(&free_b, &total_b);
        std::ostringstream msg;
        msg << "out of GPU memory allocating " << double(bytes) / 1e9 << " GB for " << what << " (" << double(free_b) / 1e9 << " GB free of "
            << double(total_b) / 1e9 << ")";
        throw OutOfMemory(msg.str());
    }
    in_use_ += bytes;
    if (in_use_ > peak_) peak_ = in_use_;
    return p;
}

void DeviceAllocator::free(void * p, size_t bytes) {
    if (!p) return;
    cudaFree(p);
    in_use_ -= bytes;
}

DeviceBuffer::DeviceBuffer(size_t bytes, const char * what)
    : device_(current_device()) {
    ptr_ = DeviceAllocator::of_device(device_).alloc(bytes, what);
    bytes_ = bytes;
}

DeviceBuffer::~DeviceBuffer() {
    if (ptr_) DeviceAllocator::of_device(device_).free(ptr_, bytes_);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer && o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_), device_(o.device_) {
    o.ptr_ = nullptr;
    o.bytes_ = 0;
}

DeviceBuffer & DeviceBuffer::operator=(DeviceBuffer && o) noexcept {
    if (this != &o) {
        if (ptr_) DeviceAllocator::of_device(device_).free(ptr_, bytes_);
        ptr_ = o.ptr_;
        bytes_ = o.bytes_;
        device_ = o.device_;
        o.ptr_ = nullptr;
        o.bytes_ = 0;
    }
    return *this;
}

HostMappedBuffer::HostMappedBuffer(size_t bytes, const char * what) : bytes_(bytes) {
    if (bytes == 0) return;
    if (cudaHostAlloc(&host_, bytes, cudaHostAllocMapped) != cudaSuccess) {
        cudaGetLastError();
        host_ = nullptr;
        std::ostringstream msg;
        msg << "out of pinned host memory allocating " << double(bytes) / 1e9 << " GB for " << what;
        throw OutOfMemory(msg.str());
    }
    CUDA_CHECK(cudaHostGetDevicePointer(&device_, host_, 0));
}

HostMappedBuffer::~HostMappedBuffer() {
    if (host_) cudaFreeHost(host_);
}

HostMappedBuffer::HostMappedBuffer(HostMappedBuffer && o) noexcept : host_(o.host_), device_(o.device_), bytes_(o.bytes_) {
    o.host_ = o.device_ = nullptr;
    o.bytes_ = 0;
}

HostMappedBuffer & HostMappedBuffer::operator=(HostMappedBuffer && o) noexcept {
    if (this != &o) {
        if (host_) cudaFreeHost(host_);
        host_ = o.host_;
        device_ = o.device_;
        bytes_ = o.bytes_;
        o.host_ = o.device_ = nullptr;
        o.bytes_ = 0;
    }
    return *this;
}

HostStaging::HostStaging() {
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    for (int i = 0; i < 2; i++) {
        if (cudaHostAlloc(reinterpret_cast<void **>(&chunk_[i]), k_chunk_bytes, cudaHostAllocDefault) != cudaSuccess) {
            cudaGetLastError();
            chunk_[i] = nullptr;
            throw OutOfMemory("out of pinned host memory allocating the weights' staging buffers");
        }
        CUDA_CHECK(cudaEventCreateWithFlags(&drained_[i], cudaEventDisableTiming));
        CUDA_CHECK(cudaEventRecord(drained_[i], stream_));
    }
}

HostStaging::~HostStaging() {
    if (stream_) cudaStreamSynchronize(stream_);
    for (int i = 0; i < 2; i++) {
        if (chunk_[i]) cudaFreeHost(chunk_[i]);
        if (drained_[i]) cudaEventDestroy(drained_[i]);
    }
    if (stream_) cudaStreamDestroy(stream_);
}

void HostStaging::copy(void * dst, size_t bytes, const std::function<void(uint8_t *, size_t, size_t)> & fill) {
    for (size_t off = 0, i = 0; off < bytes; off += k_chunk_bytes, i ^= 1) {
        const size_t n = std::min(k_chunk_bytes, bytes - off);
        CUDA_CHECK(cudaEventSynchronize(drained_[i]));  // the DMA that read this chunk two steps ago is done
        fill(chunk_[i], off, n);
        CUDA_CHECK(cudaMemcpyAsync(static_cast<uint8_t *>(dst) + off, chunk_[i], n, cudaMemcpyDefault, stream_));
        CUDA_CHECK(cudaEventRecord(drained_[i], stream_));
    }
    CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void DeviceBuffer::ensure(size_t bytes, const char * what) {
    if (bytes <= bytes_) return;
    *this = DeviceBuffer(bytes, what);
}

}  // namespace qinfer::cuda
