// backend.hpp: the ops of one device behind one interface, so that a model's layers run on
// whichever device holds their tensors.
//
// A Backend is the op set of one device: the CPU's (kernels/cpu, always there) or one GPU's
// (kernels/cuda, where the build has CUDA). Its functions take float pointers into that
// device's memory, with the shapes and the "backward adds into its outputs" rule of
// kernels/cpu/ops.hpp; they throw std::runtime_error when the device fails. Tensors a layer
// creates come from the backend's allocator, so they live beside the parameters. A few ops
// exist only here, where a layer used to loop over host memory itself (residual sums, bias
// rows, the column blocks of a fused q/k/v, the vocabulary-split embedding and loss).
//
// Device work is queued in order on the device (CUDA's default stream): a tensor handed to a
// transport is copied out by the transport's own synchronising copy. Functions that return a
// value to the host (sum, sum_squares) wait for the device.
#pragma once

#include "kernels/tensor.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace dist::kernels {

class Backend {
  public:
    virtual ~Backend() = default;

    virtual Device device() const = 0;
    virtual Allocator& allocator() = 0;
    /// Whether NCCL can reduce this device's memory (a CUDA device's, not a stand-in's).
    virtual bool nccl_memory() const { return false; }
    /// What tells this device from the others of its host, however the process numbers them
    /// (a GPU's PCI bus id; CUDA_VISIBLE_DEVICES renumbers GPUs per process).
    virtual std::string identity() const { return device().str(); }
    /// The device's model and memory, as `dist calibrate` writes them into a profile.
    struct Description {
        std::string model;
        int64_t memory_bytes = 0;
    };
    virtual Description describe() const;

    /// A tensor on this device, uninitialised or zeroed.
    Tensor empty(std::vector<int64_t> shape, DType dtype = DType::f32) {
        return Tensor(std::move(shape), dtype, allocator());
    }
    Tensor zeros(std::vector<int64_t> shape, DType dtype = DType::f32) {
        return Tensor::zeros(std::move(shape), dtype, allocator());
    }
    /// `t` if it is on this device already, else a copy on it.
    Tensor here(const Tensor& t) { return t.device() == device() ? t : t.to(allocator()); }

    // ----- the ops of kernels/cpu/ops.hpp, float ----------------------------------------
    virtual void matmul_forward(const float* inp, const float* weight, const float* bias, int64_t N,
                                int64_t C, int64_t OC, float* out) = 0;
    virtual void matmul_backward_input(const float* dout, const float* weight, int64_t N, int64_t C,
                                       int64_t OC, float* dinp) = 0;
    virtual void matmul_backward_weight(const float* dout, const float* inp, int64_t N, int64_t C,
                                        int64_t OC, float* dweight, float* dbias) = 0;
    virtual void layernorm_forward(const float* inp, const float* weight, const float* bias,
                                   int64_t N, int64_t C, double eps, float* out, float* mean,
                                   float* rstd) = 0;
    virtual void layernorm_backward_input(const float* dout, const float* inp, const float* weight,
                                          const float* mean, const float* rstd, int64_t N,
                                          int64_t C, float* dinp) = 0;
    virtual void layernorm_backward_weight(const float* dout, const float* inp, const float* mean,
                                           const float* rstd, int64_t N, int64_t C, float* dweight,
                                           float* dbias) = 0;
    virtual void rmsnorm_forward(const float* inp, const float* weight, int64_t N, int64_t C,
                                 double eps, float* out, float* rstd) = 0;
    virtual void rmsnorm_backward_input(const float* dout, const float* inp, const float* weight,
                                        const float* rstd, int64_t N, int64_t C, float* dinp) = 0;
    virtual void rmsnorm_backward_weight(const float* dout, const float* inp, const float* rstd,
                                         int64_t N, int64_t C, float* dweight) = 0;
    virtual void gelu_forward(const float* inp, int64_t n, float* out) = 0;
    virtual void gelu_forward_keeping(const float* inp, int64_t n, float* out, float* th) = 0;
    virtual void gelu_backward_kept(const float* inp, const float* th, const float* dout, int64_t n,
                                    float* dinp) = 0;
    virtual void swiglu_forward(const float* inp, int64_t N, int64_t H, float* out) = 0;
    virtual void swiglu_backward(const float* inp, const float* dout, int64_t N, int64_t H,
                                 float* dinp) = 0;
    virtual void rope_forward(const float* inp, int64_t B, int64_t T, int64_t H, int64_t D,
                              double theta, int64_t pos0, float* out) = 0;
    virtual void rope_backward(const float* dout, int64_t B, int64_t T, int64_t H, int64_t D,
                               double theta, int64_t pos0, float* dinp) = 0;
    virtual void embedding_forward(const int32_t* tokens, const float* table, int64_t N, int64_t C,
                                   float* out) = 0;
    virtual void embedding_backward(const int32_t* tokens, const float* dout, int64_t N, int64_t C,
                                    float* dtable) = 0;
    virtual void positions_forward(const float* wpe, int64_t B, int64_t T, int64_t C,
                                   float* out) = 0;
    virtual void positions_backward(const float* dout, int64_t B, int64_t T, int64_t C,
                                    float* dwpe) = 0;
    virtual void attention_forward(const float* q, const float* k, const float* v, int64_t B,
                                   int64_t T, int64_t H, int64_t KV, int64_t D, float* out,
                                   float* lse) = 0;
    virtual void attention_backward(const float* dout, const float* q, const float* k,
                                    const float* v, const float* out, const float* lse, int64_t B,
                                    int64_t T, int64_t H, int64_t KV, int64_t D, float* dq,
                                    float* dk, float* dv) = 0;
    virtual void cross_entropy_forward(const float* logits, const int32_t* targets, int64_t N,
                                       int64_t V, float* losses, float* lse) = 0;
    virtual void cross_entropy_backward(const float* logits, const int32_t* targets,
                                        const float* lse, const float* dlosses, int64_t N,
                                        int64_t V, float* dlogits) = 0;

    /// One AdamW step (kernels/cpu/ops.hpp's AdamWConfig fields, `step` counting from 1).
    virtual void adamw_step(const float* grads, int64_t n, double lr, double beta1, double beta2,
                            double eps, double weight_decay, int64_t step, float* params, float* m,
                            float* v) = 0;
    /// Sum of squares and plain sum, accumulated in double; they wait for the device.
    virtual double sum_squares(const float* x, int64_t n) = 0;
    virtual double sum(const float* x, int64_t n) = 0;
    /// The sum of squares of several arrays together (a gradient norm): one wait for the
    /// device in all, where a GPU backend overrides it; the default adds sum_squares of each.
    struct Part {
        const float* data;
        int64_t n;
    };
    virtual double sum_squares_of(const std::vector<Part>& parts) {
        double total = 0.0;
        for (const Part& p : parts) total += sum_squares(p.data, p.n);
        return total;
    }
    /// x (n) *= s.
    virtual void scale(float* x, int64_t n, double s) = 0;
    /// dst (n) = src (n) * s, as a copy and then scale() would leave it, in one pass where the
    /// device has one.
    virtual void copy_scaled(const float* src, int64_t n, double s, float* dst) {
        copy_block(src, n, dst, n, 1, n);
        scale(dst, n, s);
    }
    /// Waits until the ops queued on the device have run (the CPU runs each op at its call).
    /// Only the ops: a collective another thread has under way on the device is not waited for.
    virtual void synchronize() {}

    // ----- what layers used to do over host memory ---------------------------------------
    /// out (n) = a + b (out may alias either).
    virtual void add(const float* a, const float* b, int64_t n, float* out) = 0;
    /// x (n) = value.
    virtual void fill(float* x, int64_t n, float value) = 0;
    /// Mixed precision (train.precision bf16): x (n) rounded to the nearest bf16 in place (ties
    /// to even, NaN kept), still held as float; and the conversions to and from bf16 storage
    /// (uint16_t bits), the second exact.
    virtual void round_bf16(float* x, int64_t n) = 0;
    virtual void to_bf16(const float* x, int64_t n, uint16_t* out) = 0;
    virtual void from_bf16(const uint16_t* x, int64_t n, float* out) = 0;
    /// out (N,C) += bias (C) on every row.
    virtual void add_rows(const float* bias, int64_t N, int64_t C, float* out) = 0;
    /// rows x width floats: dst[r * dst_stride + c] = src[r * src_stride + c].
    virtual void copy_block(const float* src, int64_t src_stride, float* dst, int64_t dst_stride,
                            int64_t rows, int64_t width) = 0;
    /// GELU (erf) and ReLU: inp (n) -> out (n), written; backward dinp (n) +=.
    virtual void gelu_erf_forward(const float* inp, int64_t n, float* out) = 0;
    virtual void gelu_erf_backward(const float* inp, const float* dout, int64_t n, float* dinp) = 0;
    virtual void relu_forward(const float* inp, int64_t n, float* out) = 0;
    virtual void relu_backward(const float* inp, const float* dout, int64_t n, float* dinp) = 0;

    /// An embedding split by vocabulary: this rank holds rows [begin, begin + rows) of the
    /// table. tokens (N), table (rows,C) -> out (N,C), written: a token's row, or zeros for a
    /// token held elsewhere.
    virtual void embedding_forward_part(const int32_t* tokens, const float* table, int64_t N,
                                        int64_t C, int64_t begin, int64_t rows, float* out) = 0;
    /// tokens (N), dout (N,C) -> dtable (rows,C) += for the tokens this rank holds.
    virtual void embedding_backward_part(const int32_t* tokens, const float* dout, int64_t N,
                                         int64_t C, int64_t begin, int64_t rows, float* dtable) = 0;

    /// Softmax cross-entropy over logits split by vocabulary (columns [begin, begin + V) of
    /// the full vocabulary on this rank), in three steps around the group's reductions:
    /// logits (N,V) -> row_max (N), written.
    virtual void row_max(const float* logits, int64_t N, int64_t V, float* out) = 0;
    /// logits (N,V), targets (N), row_max (N) -> sums (2N), written: sums[n] the sum of
    /// exp(logit - row_max), sums[N + n] the target's logit when this rank holds it, else 0.
    virtual void cross_entropy_part_sums(const float* logits, const int32_t* targets,
                                         const float* row_max, int64_t N, int64_t V, int64_t begin,
                                         float* sums) = 0;
    /// row_max (N), summed sums (2N) -> lse (N), losses (N), written.
    virtual void cross_entropy_part_finish(const float* row_max, const float* sums, int64_t N,
                                           float* lse, float* losses) = 0;
    /// dlogits (N,V) = dlosses[n] (exp(logit - lse[n]) - [column is the target]), written.
    virtual void cross_entropy_part_backward(const float* logits, const int32_t* targets,
                                             const float* lse, const float* dlosses, int64_t N,
                                             int64_t V, int64_t begin, float* dlogits) = 0;
};

/// The CPU's backend (process-wide).
Backend& cpu_backend();

} // namespace dist::kernels
