// common.cuh: what every CUDA kernel file shares, and nothing that host code sees: the check
// macros that turn a failed CUDA / cuBLAS call into the "file:line: call: cause" string of the
// ops.hpp API, the launch-size helper, and block-wide reductions.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <string>

namespace dist::kernels::cuda::detail {

inline std::string where(const char* file, int line) {
    return std::string(file) + ":" + std::to_string(line) + ": ";
}

// Each returns from the calling function with "file:line: call: cause" when the call fails.
#define DIST_CUDA(call)                                                                            \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess)                                                                     \
            return ::dist::kernels::cuda::detail::where(__FILE__, __LINE__) + #call + ": " +       \
                   cudaGetErrorString(e_);                                                         \
    } while (0)

#define DIST_CUBLAS(call)                                                                          \
    do {                                                                                           \
        cublasStatus_t s_ = (call);                                                                \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                                           \
            return ::dist::kernels::cuda::detail::where(__FILE__, __LINE__) + #call + ": " +       \
                   cublasGetStatusString(s_);                                                      \
    } while (0)

/// After a kernel launch: a bad configuration (too many threads, too much shared memory)
/// shows up here, at the launch's line, not at the next synchronisation.
#define DIST_LAUNCHED() DIST_CUDA(cudaGetLastError())

/// Blocks for a grid-stride loop over n elements (capped: the loop covers the rest).
inline int blocks_for(int64_t n, int threads) {
    int64_t b = (n + threads - 1) / threads;
    if (b < 1) b = 1;
    return static_cast<int>(b < 65535 * 8 ? b : 65535 * 8);
}

/// Sum of v over the block (blockDim.x a multiple of 32, at most 1024); every thread gets it.
/// Ends with a barrier, so it can be called again straight away.
template <typename T> __device__ T block_sum(T v) {
    __shared__ T shared[32];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    int warps = (blockDim.x + 31) / 32;
    v = threadIdx.x < warps ? shared[threadIdx.x] : T(0);
    if (warp == 0)
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    __syncthreads();
    if (threadIdx.x == 0) shared[0] = v;
    __syncthreads();
    T r = shared[0];
    __syncthreads();
    return r;
}

/// Maximum of v over the block, as block_sum.
__device__ inline float block_max(float v) {
    __shared__ float shared[32];
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, o));
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    int warps = (blockDim.x + 31) / 32;
    v = threadIdx.x < warps ? shared[threadIdx.x] : -INFINITY;
    if (warp == 0)
        for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, o));
    __syncthreads();
    if (threadIdx.x == 0) shared[0] = v;
    __syncthreads();
    float r = shared[0];
    __syncthreads();
    return r;
}

/// Sum of v over the 32 lanes of a warp; every lane gets it.
__device__ inline float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    return v;
}

/// Maximum of v over the 32 lanes of a warp; every lane gets it.
__device__ inline float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, o));
    return v;
}

} // namespace dist::kernels::cuda::detail
