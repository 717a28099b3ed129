// memory.hpp: the allocators of CUDA devices, so that Tensors can live in GPU memory.
//
// Tensor and Allocator (kernels/tensor.hpp) know a device only through its MemoryOps; this
// header gives the CUDA ones. Like every CUDA entry point, it names no CUDA type.
#pragma once

#include "kernels/tensor.hpp"

namespace dist::kernels::cuda {

/// The buffer-reusing allocator of device `index` (cudaMalloc / cudaFree, created on first
/// use). Throws std::invalid_argument for a device that does not exist.
Allocator& allocator(int index);

/// cudaMalloc, cudaFree, cudaMemset and cudaMemcpy on a given device, throwing
/// std::runtime_error with the call, the device and CUDA's error string.
MemoryOps memory_ops();

} // namespace dist::kernels::cuda
