// ops.hpp: the CPU kernels, each a forward and its backward.
//
// Kernels take raw pointers and sizes; shapes are given as (B,T,C) comments, row-major, inputs
// first and outputs last. Backward kernels ADD into their gradient outputs (gradients of a
// parameter accumulate over microbatches), except where a comment says they write. Backward is
// split into `_backward_input` (gradient of the layer's input) and `_backward_weight`
// (gradients of its parameters) wherever a layer has parameters, because zero-bubble pipeline
// schedules run the two at different times. Every kernel is instantiated for float (training)
// and double (the finite-difference tests).
#pragma once

#include <cstdint>

namespace dist::kernels::cpu {

// ----- matmul: out = inp @ weight^T + bias (through BLAS) ---------------------------------

/// inp (N,C), weight (OC,C), bias (OC) or null -> out (N,OC), written.
template <typename T>
void matmul_forward(const T* inp, const T* weight, const T* bias, int64_t N, int64_t C, int64_t OC,
                    T* out);
/// dout (N,OC), weight (OC,C) -> dinp (N,C) +=.
template <typename T>
void matmul_backward_input(const T* dout, const T* weight, int64_t N, int64_t C, int64_t OC,
                           T* dinp);
/// dout (N,OC), inp (N,C) -> dweight (OC,C) +=, dbias (OC) += (when not null).
template <typename T>
void matmul_backward_weight(const T* dout, const T* inp, int64_t N, int64_t C, int64_t OC,
                            T* dweight, T* dbias);

// ----- normalisation ------------------------------------------------------------------------

/// inp (N,C), weight (C), bias (C) or null -> out (N,C), mean (N), rstd (N), written.
template <typename T>
void layernorm_forward(const T* inp, const T* weight, const T* bias, int64_t N, int64_t C,
                       double eps, T* out, T* mean, T* rstd);
/// dout (N,C), inp (N,C), weight (C), mean (N), rstd (N) -> dinp (N,C) +=.
template <typename T>
void layernorm_backward_input(const T* dout, const T* inp, const T* weight, const T* mean,
                              const T* rstd, int64_t N, int64_t C, T* dinp);
/// dout (N,C), inp (N,C), mean (N), rstd (N) -> dweight (C) +=, dbias (C) += (when not null).
template <typename T>
void layernorm_backward_weight(const T* dout, const T* inp, const T* mean, const T* rstd, int64_t N,
                               int64_t C, T* dweight, T* dbias);

/// inp (N,C), weight (C) -> out (N,C), rstd (N), written.
template <typename T>
void rmsnorm_forward(const T* inp, const T* weight, int64_t N, int64_t C, double eps, T* out,
                     T* rstd);
/// dout (N,C), inp (N,C), weight (C), rstd (N) -> dinp (N,C) +=.
template <typename T>
void rmsnorm_backward_input(const T* dout, const T* inp, const T* weight, const T* rstd, int64_t N,
                            int64_t C, T* dinp);
/// dout (N,C), inp (N,C), rstd (N) -> dweight (C) +=.
template <typename T>
void rmsnorm_backward_weight(const T* dout, const T* inp, const T* rstd, int64_t N, int64_t C,
                             T* dweight);

// ----- activations --------------------------------------------------------------------------

/// GELU, tanh approximation (GPT-2). inp (n) -> out (n), written.
template <typename T> void gelu_forward(const T* inp, int64_t n, T* out);
/// inp (n), dout (n) -> dinp (n) +=.
template <typename T> void gelu_backward(const T* inp, const T* dout, int64_t n, T* dinp);
/// gelu_forward that also keeps each element's tanh(sqrt(2/pi) (x + 0.044715 x^3)) in `th` (n),
/// so that the backward need not evaluate it again.
template <typename T> void gelu_forward_keeping(const T* inp, int64_t n, T* out, T* th);
/// The backward from the kept tanh values: inp (n), th (n), dout (n) -> dinp (n), written (a
/// fresh buffer needs no zeroing).
template <typename T>
void gelu_backward_kept(const T* inp, const T* th, const T* dout, int64_t n, T* dinp);

/// SwiGLU: inp (N,2H) holds [gate | up] per row -> out (N,H) = silu(gate) * up, written.
template <typename T> void swiglu_forward(const T* inp, int64_t N, int64_t H, T* out);
/// inp (N,2H), dout (N,H) -> dinp (N,2H) +=.
template <typename T>
void swiglu_backward(const T* inp, const T* dout, int64_t N, int64_t H, T* dinp);

// ----- positions ----------------------------------------------------------------------------

/// Rotary embedding in the rotate-half convention of Hugging Face's Llama: dimension i pairs
/// with i + D/2. inp (B,T,H,D), positions start at `pos0` -> out (B,T,H,D), written (may alias
/// inp).
template <typename T>
void rope_forward(const T* inp, int64_t B, int64_t T_, int64_t H, int64_t D, double theta,
                  int64_t pos0, T* out);
/// dout (B,T,H,D) -> dinp (B,T,H,D) += (the rotation's transpose).
template <typename T>
void rope_backward(const T* dout, int64_t B, int64_t T_, int64_t H, int64_t D, double theta,
                   int64_t pos0, T* dinp);

/// tokens (N), table (V,C) -> out (N,C), written. Tokens must be in [0, V).
template <typename T>
void embedding_forward(const int32_t* tokens, const T* table, int64_t N, int64_t C, T* out);
/// tokens (N), dout (N,C) -> dtable (V,C) +=.
template <typename T>
void embedding_backward(const int32_t* tokens, const T* dout, int64_t N, int64_t C, T* dtable);

/// Learned positions: wpe (T,C) -> out (B,T,C) += wpe[t].
template <typename T>
void positions_forward(const T* wpe, int64_t B, int64_t T_, int64_t C, T* out);
/// dout (B,T,C) -> dwpe (T,C) +=.
template <typename T>
void positions_backward(const T* dout, int64_t B, int64_t T_, int64_t C, T* dwpe);

// ----- attention ----------------------------------------------------------------------------

/// Causal self-attention with grouped-query heads, softmax(q k^T / sqrt(D)) v, computed one
/// query row at a time with an online softmax: memory O(D) per row, no (T,T) matrix.
/// q (B,T,H,D), k (B,T,KV,D), v (B,T,KV,D), H a multiple of KV ->
/// out (B,T,H,D) and lse (B,H,T) (log-sum-exp of each row's scores, kept for backward), written.
template <typename T>
void attention_forward(const T* q, const T* k, const T* v, int64_t B, int64_t T_, int64_t H,
                       int64_t KV, int64_t D, T* out, T* lse);
/// dout, q, k, v, out, lse as above -> dq (B,T,H,D), dk, dv (B,T,KV,D) +=.
/// Recomputes each row's probabilities from lse instead of storing them.
template <typename T>
void attention_backward(const T* dout, const T* q, const T* k, const T* v, const T* out,
                        const T* lse, int64_t B, int64_t T_, int64_t H, int64_t KV, int64_t D,
                        T* dq, T* dk, T* dv);

// ----- loss ---------------------------------------------------------------------------------

/// Fused softmax + cross-entropy. logits (N,V), targets (N) in [0, V) ->
/// losses (N) = lse - logits[target], lse (N), written. Probabilities are never stored.
template <typename T>
void cross_entropy_forward(const T* logits, const int32_t* targets, int64_t N, int64_t V, T* losses,
                           T* lse);
/// dlosses (N) -> dlogits (N,V) = (softmax - onehot) * dlosses, WRITTEN (not added).
template <typename T>
void cross_entropy_backward(const T* logits, const int32_t* targets, const T* lse, const T* dlosses,
                            int64_t N, int64_t V, T* dlogits);

// ----- optimizer ----------------------------------------------------------------------------

struct AdamWConfig {
    double lr = 3e-4;
    double beta1 = 0.9;
    double beta2 = 0.95;
    double eps = 1e-8;
    double weight_decay = 0.0;
};

/// One AdamW step (decoupled weight decay, bias-corrected moments). `step` counts from 1.
/// grads (n) -> params (n), m (n), v (n) updated in place.
template <typename T>
void adamw_step(const T* grads, int64_t n, const AdamWConfig& config, int64_t step, T* params, T* m,
                T* v);

/// Sum of squares, accumulated in double (for the global gradient norm).
template <typename T> double sum_squares(const T* x, int64_t n);
/// x (n) *= s.
template <typename T> void scale(T* x, int64_t n, double s);
/// dst (n) = src (n) * s: a copy and scale() in one pass.
template <typename T> void copy_scaled(const T* src, int64_t n, double s, T* dst);

/// bf16 (mixed precision), round to nearest even with NaN kept a NaN, as f32_to_bf16 in
/// kernels/tensor.hpp but vectorised and threaded: x (n) rounded in place and kept as float;
/// x (n) -> out (n) bf16 bits; bf16 bits -> float (exact).
void round_bf16(float* x, int64_t n);
void to_bf16(const float* x, int64_t n, uint16_t* out);
void from_bf16(const uint16_t* x, int64_t n, float* out);

} // namespace dist::kernels::cpu
