// ops.hpp: the CUDA kernels, mirroring kernels/cpu/ops.hpp op for op (same shapes, same
// "backward adds into its outputs" rule), for float tensors in device memory.
//
// Host code sees only this header: no CUDA type crosses it. Every function returns "" or the
// failing CUDA / cuBLAS call with its file, line and error string. Matmuls go through cuBLAS
// (TF32 off: results compare with the CPU ops at float tolerance); the rest are our kernels.
#pragma once

#include <cstdint>
#include <string>

namespace dist::kernels::cuda {

/// Devices visible to this process; 0 when there is no driver or no GPU (never an error).
int device_count();

/// Device memory: allocate / free / copy (bytes).
std::string malloc_device(size_t bytes, void** ptr);
void free_device(void* ptr);
std::string copy_to_device(const void* host, size_t bytes, void* device);
std::string copy_to_host(const void* device, size_t bytes, void* host);
std::string synchronize();

std::string matmul_forward(const float* inp, const float* weight, const float* bias, int64_t N,
                           int64_t C, int64_t OC, float* out);
std::string matmul_backward_input(const float* dout, const float* weight, int64_t N, int64_t C,
                                  int64_t OC, float* dinp);
std::string matmul_backward_weight(const float* dout, const float* inp, int64_t N, int64_t C,
                                   int64_t OC, float* dweight, float* dbias);

std::string layernorm_forward(const float* inp, const float* weight, const float* bias, int64_t N,
                              int64_t C, float eps, float* out, float* mean, float* rstd);
std::string layernorm_backward_input(const float* dout, const float* inp, const float* weight,
                                     const float* mean, const float* rstd, int64_t N, int64_t C,
                                     float* dinp);
std::string layernorm_backward_weight(const float* dout, const float* inp, const float* mean,
                                      const float* rstd, int64_t N, int64_t C, float* dweight,
                                      float* dbias);

std::string gelu_forward(const float* inp, int64_t n, float* out);
std::string gelu_backward(const float* inp, const float* dout, int64_t n, float* dinp);

std::string embedding_forward(const int32_t* tokens, const float* table, int64_t N, int64_t C,
                              float* out);
std::string embedding_backward(const int32_t* tokens, const float* dout, int64_t N, int64_t C,
                               float* dtable);

std::string cross_entropy_forward(const float* logits, const int32_t* targets, int64_t N, int64_t V,
                                  float* losses, float* lse);
std::string cross_entropy_backward(const float* logits, const int32_t* targets, const float* lse,
                                   const float* dlosses, int64_t N, int64_t V, float* dlogits);

std::string adamw_step(const float* grads, int64_t n, float lr, float beta1, float beta2, float eps,
                       float weight_decay, int64_t step, float* params, float* m, float* v);

} // namespace dist::kernels::cuda
