// memory.cpp: CUDA device memory behind the project's Allocator.
#include "kernels/cuda/memory.hpp"

#include "kernels/cuda/ops.hpp"

#include <cuda_runtime.h>

#include <deque>
#include <mutex>
#include <stdexcept>
#include <string>

namespace dist::kernels::cuda {

namespace {

void check(cudaError_t e, const char* call, int device, size_t bytes) {
    if (e == cudaSuccess) return;
    throw std::runtime_error(std::string(call) + " of " + std::to_string(bytes) +
                             " bytes on cuda:" + std::to_string(device) + ": " +
                             cudaGetErrorString(e));
}

void* device_allocate(size_t bytes, int device) {
    check(cudaSetDevice(device), "cudaSetDevice", device, bytes);
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, bytes);
    // Running out of memory is no sticky error: clear it, or the next kernel's launch check
    // would report it (the allocator retries after giving its free buffers back).
    if (e != cudaSuccess) cudaGetLastError();
    check(e, "cudaMalloc", device, bytes);
    return p;
}
void device_release(void* ptr, int device) {
    // Freeing runs in destructors: report nothing, as cudaFree fails only when the context is
    // already gone (process exit).
    if (cudaSetDevice(device) == cudaSuccess) cudaFree(ptr);
}
void device_zero(void* ptr, size_t bytes, int device) {
    check(cudaSetDevice(device), "cudaSetDevice", device, bytes);
    check(cudaMemset(ptr, 0, bytes), "cudaMemset", device, bytes);
}
void device_copy(void* dst, const void* src, size_t bytes, int device) {
    check(cudaSetDevice(device), "cudaSetDevice", device, bytes);
    check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice), "cudaMemcpy (device)", device,
          bytes);
}
void device_to_host(void* host, const void* src, size_t bytes, int device) {
    check(cudaSetDevice(device), "cudaSetDevice", device, bytes);
    check(cudaMemcpy(host, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy (to host)", device,
          bytes);
}
void device_from_host(void* dst, const void* host, size_t bytes, int device) {
    check(cudaSetDevice(device), "cudaSetDevice", device, bytes);
    check(cudaMemcpy(dst, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy (from host)", device,
          bytes);
}

// GPU to GPU without the host. The source's queued kernels finish first (the copy runs on the
// destination's stream), and the copy is over when this returns, as the other copies are.
// cudaMemcpyPeer would also wait for all work on both GPUs, a collective of another rank
// among it, which may be waiting for this rank: the copy goes on the default stream instead.
void device_from_peer(void* dst, int device, const void* src, int src_device, size_t bytes) {
    check(cudaSetDevice(src_device), "cudaSetDevice", src_device, bytes);
    check(cudaStreamSynchronize(cudaStreamLegacy), "cudaStreamSynchronize", src_device, bytes);
    check(cudaSetDevice(device), "cudaSetDevice", device, bytes);
    check(cudaMemcpyPeerAsync(dst, device, src, src_device, bytes, cudaStreamLegacy),
          "cudaMemcpyPeerAsync", device, bytes);
    check(cudaStreamSynchronize(cudaStreamLegacy), "cudaStreamSynchronize", device, bytes);
}

} // namespace

MemoryOps memory_ops() {
    return {device_allocate, device_release,   device_zero,     device_copy,
            device_to_host,  device_from_host, device_from_peer};
}

Allocator& allocator(int index) {
    static std::mutex mutex;
    static std::deque<Allocator> allocators; // stable addresses as devices are added
    std::lock_guard lock(mutex);
    int count = device_count();
    if (index < 0 || index >= count)
        throw std::invalid_argument("no device cuda:" + std::to_string(index) + " (" +
                                    std::to_string(count) + " visible)");
    while (static_cast<int>(allocators.size()) <= index) {
        Device d{Device::Kind::cuda, static_cast<int>(allocators.size())};
        allocators.emplace_back(d, memory_ops());
    }
    return allocators[static_cast<size_t>(index)];
}

} // namespace dist::kernels::cuda
