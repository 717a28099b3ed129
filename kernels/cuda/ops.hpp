// ops.hpp: the CUDA kernels, mirroring kernels/cpu/ops.hpp op for op (same shapes, same
// "backward adds into its outputs" rule), for float tensors in device memory.
//
// Host code sees only this header: no CUDA type crosses it (bf16 values travel as their raw
// uint16_t bits). Every function returns "" or the failing CUDA / cuBLAS call with its file,
// line and error string. Kernels are launched on the default stream, asynchronously: a fault
// inside one surfaces at the next synchronising call. Float matmuls go through cuBLAS (TF32
// off: results compare with the CPU ops at float tolerance), bf16 ones through cuBLASLt with
// float accumulation; the rest are our kernels (ops.cu, ops_llama.cu, attention.cu).
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

/// inp (N,C), weight (C) -> out (N,C), rstd (N), written.
std::string rmsnorm_forward(const float* inp, const float* weight, int64_t N, int64_t C, float eps,
                            float* out, float* rstd);
/// dout (N,C), inp (N,C), weight (C), rstd (N) -> dinp (N,C) +=.
std::string rmsnorm_backward_input(const float* dout, const float* inp, const float* weight,
                                   const float* rstd, int64_t N, int64_t C, float* dinp);
/// dout (N,C), inp (N,C), rstd (N) -> dweight (C) +=.
std::string rmsnorm_backward_weight(const float* dout, const float* inp, const float* rstd,
                                    int64_t N, int64_t C, float* dweight);

std::string gelu_forward(const float* inp, int64_t n, float* out);
std::string gelu_backward(const float* inp, const float* dout, int64_t n, float* dinp);

/// SwiGLU: inp (N,2H) holds [gate | up] per row -> out (N,H) = silu(gate) * up, written.
std::string swiglu_forward(const float* inp, int64_t N, int64_t H, float* out);
/// inp (N,2H), dout (N,H) -> dinp (N,2H) +=.
std::string swiglu_backward(const float* inp, const float* dout, int64_t N, int64_t H, float* dinp);

/// Rotary embedding, rotate-half convention (dimension i pairs with i + D/2), positions from
/// pos0. inp (B,T,H,D) -> out (B,T,H,D), written (may alias inp).
std::string rope_forward(const float* inp, int64_t B, int64_t T, int64_t H, int64_t D, double theta,
                         int64_t pos0, float* out);
/// dout (B,T,H,D) -> dinp (B,T,H,D) += (the rotation's transpose).
std::string rope_backward(const float* dout, int64_t B, int64_t T, int64_t H, int64_t D,
                          double theta, int64_t pos0, float* dinp);

std::string embedding_forward(const int32_t* tokens, const float* table, int64_t N, int64_t C,
                              float* out);
std::string embedding_backward(const int32_t* tokens, const float* dout, int64_t N, int64_t C,
                               float* dtable);

/// Learned positions: wpe (T,C) -> out (B,T,C) += wpe[t].
std::string positions_forward(const float* wpe, int64_t B, int64_t T, int64_t C, float* out);
/// dout (B,T,C) -> dwpe (T,C) +=.
std::string positions_backward(const float* dout, int64_t B, int64_t T, int64_t C, float* dwpe);

/// Causal self-attention with grouped-query heads, as the CPU op: softmax(q k^T / sqrt(D)) v.
/// q (B,T,H,D), k (B,T,KV,D), v (B,T,KV,D), H a multiple of KV, D <= 256 ->
/// out (B,T,H,D) and lse (B,H,T) (each row's log-sum-exp, kept for backward), written.
/// No (T,T) matrix: scores live in registers and shared memory one tile of keys at a time.
std::string attention_forward(const float* q, const float* k, const float* v, int64_t B, int64_t T,
                              int64_t H, int64_t KV, int64_t D, float* out, float* lse);
/// dout, q, k, v, out, lse as above -> dq (B,T,H,D), dk, dv (B,T,KV,D) +=.
/// Recomputes the probabilities from lse; deterministic (no atomics).
std::string attention_backward(const float* dout, const float* q, const float* k, const float* v,
                               const float* out, const float* lse, int64_t B, int64_t T, int64_t H,
                               int64_t KV, int64_t D, float* dq, float* dk, float* dv);

std::string cross_entropy_forward(const float* logits, const int32_t* targets, int64_t N, int64_t V,
                                  float* losses, float* lse);
std::string cross_entropy_backward(const float* logits, const int32_t* targets, const float* lse,
                                   const float* dlosses, int64_t N, int64_t V, float* dlogits);

/// The bias corrections 1 - beta^step are computed in double and rounded once, as the CPU's.
std::string adamw_step(const float* grads, int64_t n, float lr, double beta1, double beta2,
                       float eps, float weight_decay, int64_t step, float* params, float* m,
                       float* v);

/// Gradient norm: sum (one double in device memory) += sum of x[i]^2, accumulated in double.
/// Call it once per tensor into the same accumulator, zeroed first (copy_to_device).
std::string sum_squares(const float* x, int64_t n, double* sum);
/// x (n) *= s.
std::string scale(float* x, int64_t n, double s);
/// Clipping without a trip to the host: x (n) *= max_norm / sqrt(*sum_sq) when that norm is
/// above max_norm; sum_sq is the device accumulator of sum_squares.
std::string clip_by_norm(const double* sum_sq, double max_norm, int64_t n, float* x);

// ----- bf16 matmul (cuBLASLt): bf16 operands, float accumulation, float outputs ------------
// Same products as the float matmuls above. The outputs stay float because they feed float
// ops (norms, residual adds, optimizer); only the operands are narrowed, once, by to_bf16.

/// x (n) float -> out (n) bf16 bits, rounded to nearest even.
std::string to_bf16(const float* x, int64_t n, uint16_t* out);
/// x (n) bf16 bits -> out (n) float (exact).
std::string from_bf16(const uint16_t* x, int64_t n, float* out);
/// x (n) float rounded to the nearest bf16 in place (kept as float).
std::string round_bf16(float* x, int64_t n);

/// inp (N,C), weight (OC,C) in bf16, bias (OC) float or null -> out (N,OC) float, written.
std::string matmul_forward_bf16(const uint16_t* inp, const uint16_t* weight, const float* bias,
                                int64_t N, int64_t C, int64_t OC, float* out);
/// dout (N,OC), weight (OC,C) in bf16 -> dinp (N,C) float +=.
std::string matmul_backward_input_bf16(const uint16_t* dout, const uint16_t* weight, int64_t N,
                                       int64_t C, int64_t OC, float* dinp);
/// dout (N,OC), inp (N,C) in bf16 -> dweight (OC,C) float +=, dbias (OC) float += (when not
/// null; summed from the bf16 dout).
std::string matmul_backward_weight_bf16(const uint16_t* dout, const uint16_t* inp, int64_t N,
                                        int64_t C, int64_t OC, float* dweight, float* dbias);

// ----- what layers need besides the ops above (ops_layers.cu) ------------------------------
// The same contracts as kernels::Backend's functions of these names (kernels/backend.hpp).

std::string add(const float* a, const float* b, int64_t n, float* out);
std::string fill(float* x, int64_t n, float value);
std::string add_rows(const float* bias, int64_t N, int64_t C, float* out);
std::string copy_block(const float* src, int64_t src_stride, float* dst, int64_t dst_stride,
                       int64_t rows, int64_t width);
std::string gelu_erf_forward(const float* inp, int64_t n, float* out);
std::string gelu_erf_backward(const float* inp, const float* dout, int64_t n, float* dinp);
/// GPT-2's GELU keeping each element's tanh in th (n); its backward from them WRITES dinp.
std::string gelu_forward_keeping(const float* inp, int64_t n, float* out, float* th);
std::string gelu_backward_kept(const float* inp, const float* th, const float* dout, int64_t n,
                               float* dinp);
std::string relu_forward(const float* inp, int64_t n, float* out);
std::string relu_backward(const float* inp, const float* dout, int64_t n, float* dinp);
std::string embedding_forward_part(const int32_t* tokens, const float* table, int64_t N, int64_t C,
                                   int64_t begin, int64_t rows, float* out);
std::string embedding_backward_part(const int32_t* tokens, const float* dout, int64_t N, int64_t C,
                                    int64_t begin, int64_t rows, float* dtable);
/// total (one double in device memory) += sum of x, accumulated in double.
std::string sum(const float* x, int64_t n, double* total);
std::string row_max(const float* logits, int64_t N, int64_t V, float* out);
std::string cross_entropy_part_sums(const float* logits, const int32_t* targets,
                                    const float* row_max, int64_t N, int64_t V, int64_t begin,
                                    float* sums);
std::string cross_entropy_part_finish(const float* row_max, const float* sums, int64_t N,
                                      float* lse, float* losses);
std::string cross_entropy_part_backward(const float* logits, const int32_t* targets,
                                        const float* lse, const float* dlosses, int64_t N,
                                        int64_t V, int64_t begin, float* dlogits);

/// The PCI bus id of device `index` ("0000:19:00.0"), the same in every process of the host.
std::string pci_bus_id(int index, std::string& out);
/// Device `index`'s name ("NVIDIA H200") and its global memory in bytes.
std::string device_model(int index, std::string& name, int64_t& bytes);
/// Makes `index` the calling thread's current device (kernels launch on the current device).
std::string set_device(int index);
/// Waits for the kernels queued on the current device's default stream (where the ops above
/// run), and for nothing else: not for the communication streams of other threads, which may
/// be waiting for this thread's next move.
std::string synchronize_default_stream();

} // namespace dist::kernels::cuda
