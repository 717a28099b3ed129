// ops.cpp: the CPU kernels. Matmuls go to OpenBLAS with the right transposes; everything else
// is plain loops over contiguous rows that the compiler vectorises, parallel over rows with
// OpenMP. Reductions accumulate in double where rows are long (norm statistics, losses).
#include "kernels/cpu/ops.hpp"

#include "kernels/cpu/math.hpp"

#include "kernels/bf16_bits.hpp"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <vector>

namespace dist::kernels::cpu {

namespace {

// One thread pool for the process: OpenBLAS runs single-threaded inside OpenMP's threads, each
// computing a band of rows of C. Two pools that both spin on two cores (OpenBLAS's own and
// OpenMP's) cost about two thirds of the speed.
void single_threaded_blas() {
    static std::once_flag once;
    std::call_once(once, [] { openblas_set_num_threads(1); });
}

void blas(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, float alpha, const float* a,
          int lda, const float* b, int ldb, float beta, float* c, int ldc) {
    cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void blas(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, double alpha,
          const double* a, int lda, const double* b, int ldb, double beta, double* c, int ldc) {
    cblas_dgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// The smallest element count a parameter's update, sum of squares or scaling is split over the
// threads from: below it a parallel region's fork and join (1-4 us in a rank's team) cost more
// than the second thread saves. A model's norms and biases (a few hundred elements each) are
// most of its parameters by count. `kernels_bench --benchmark_filter='adamw|sum_squares'`, two
// threads against one: AdamW 1.12x slower at 1,024 elements, 0.91x at 4,096 and 0.69x at
// 16,384; the sum of squares 1.28x slower at 16,384 and 0.72x at 65,536.
constexpr int64_t parallel_from = int64_t{1} << 14;

// C (m,n) = alpha op(A) (m,k) op(B) (k,n) + beta C, row-major.
template <typename T>
void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t m, int64_t n, int64_t k, T alpha,
          const T* a, int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
    single_threaded_blas();
    int parts = omp_in_parallel() ? 1 : omp_get_max_threads();
    if (m < 64) parts = 1;
#pragma omp parallel for schedule(static) num_threads(parts) if (parts > 1)
    for (int p = 0; p < parts; ++p) {
        int64_t r0 = m * p / parts, r1 = m * (p + 1) / parts;
        // Rows r0..r1 of C come from rows of A (or columns, when A is transposed).
        const T* ap = ta == CblasNoTrans ? a + r0 * lda : a + r0;
        blas(ta, tb, static_cast<int>(r1 - r0), static_cast<int>(n), static_cast<int>(k), alpha, ap,
             static_cast<int>(lda), b, static_cast<int>(ldb), beta, c + r0 * ldc,
             static_cast<int>(ldc));
    }
}

constexpr double gelu_scale = 0.7978845608028654; // sqrt(2 / pi)

} // namespace

// ----- matmul -------------------------------------------------------------------------------

template <typename T>
void matmul_forward(const T* inp, const T* weight, const T* bias, int64_t N, int64_t C, int64_t OC,
                    T* out) {
    // out (N,OC) = inp (N,C) @ weight^T (C,OC) + bias. The bias is written first and the
    // product added to it (beta 1): BLAS would otherwise clear out (beta 0) and the bias be
    // added after, two passes over out where one does.
    if (bias) {
#pragma omp parallel for schedule(static)
        for (int64_t n = 0; n < N; ++n) std::copy(bias, bias + OC, out + n * OC);
    }
    gemm(CblasNoTrans, CblasTrans, N, OC, C, T(1), inp, C, weight, C, T(bias ? 1 : 0), out, OC);
}

template <typename T>
void matmul_backward_input(const T* dout, const T* weight, int64_t N, int64_t C, int64_t OC,
                           T* dinp) {
    // dinp (N,C) += dout (N,OC) @ weight (OC,C)
    gemm(CblasNoTrans, CblasNoTrans, N, C, OC, T(1), dout, OC, weight, C, T(1), dinp, C);
}

template <typename T>
void matmul_backward_weight(const T* dout, const T* inp, int64_t N, int64_t C, int64_t OC,
                            T* dweight, T* dbias) {
    // dweight (OC,C) += dout^T (OC,N) @ inp (N,C)
    gemm(CblasTrans, CblasNoTrans, OC, C, N, T(1), dout, OC, inp, C, T(1), dweight, C);
    if (!dbias) return;
        // Column sums, walking dout row by row (contiguous) over blocks of columns.
#pragma omp parallel for schedule(static)
    for (int64_t o0 = 0; o0 < OC; o0 += 256) {
        int64_t o1 = std::min(OC, o0 + 256);
        for (int64_t n = 0; n < N; ++n) {
            const T* row = dout + n * OC;
            for (int64_t o = o0; o < o1; ++o) dbias[o] += row[o];
        }
    }
}

// ----- layer norm ---------------------------------------------------------------------------

template <typename T>
void layernorm_forward(const T* inp, const T* weight, const T* bias, int64_t N, int64_t C,
                       double eps, T* out, T* mean, T* rstd) {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
        const T* x = inp + n * C;
        double sum = 0.0;
#pragma omp simd reduction(+ : sum)
        for (int64_t i = 0; i < C; ++i) sum += x[i];
        double m = sum / static_cast<double>(C);
        double var = 0.0;
#pragma omp simd reduction(+ : var)
        for (int64_t i = 0; i < C; ++i) var += (x[i] - m) * (x[i] - m);
        double s = 1.0 / std::sqrt(var / static_cast<double>(C) + eps);
        T* y = out + n * C;
        T tm = static_cast<T>(m), ts = static_cast<T>(s);
        for (int64_t i = 0; i < C; ++i)
            y[i] = (x[i] - tm) * ts * weight[i] + (bias ? bias[i] : T(0));
        mean[n] = tm;
        rstd[n] = ts;
    }
}

template <typename T>
void layernorm_backward_input(const T* dout, const T* inp, const T* weight, const T* mean,
                              const T* rstd, int64_t N, int64_t C, T* dinp) {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
        const T* dy = dout + n * C;
        const T* x = inp + n * C;
        T m = mean[n], s = rstd[n];
        // dx = s * (g - mean(g) - xhat * mean(g * xhat)), g = dy * weight
        double sum_g = 0.0, sum_gx = 0.0;
#pragma omp simd reduction(+ : sum_g, sum_gx)
        for (int64_t i = 0; i < C; ++i) {
            T g = dy[i] * weight[i];
            sum_g += g;
            sum_gx += g * (x[i] - m) * s;
        }
        T mg = static_cast<T>(sum_g / static_cast<double>(C));
        T mgx = static_cast<T>(sum_gx / static_cast<double>(C));
        T* dx = dinp + n * C;
        for (int64_t i = 0; i < C; ++i) {
            T xhat = (x[i] - m) * s;
            dx[i] += s * (dy[i] * weight[i] - mg - xhat * mgx);
        }
    }
}

template <typename T>
void layernorm_backward_weight(const T* dout, const T* inp, const T* mean, const T* rstd, int64_t N,
                               int64_t C, T* dweight, T* dbias) {
    // Columns are independent: parallel over blocks of columns, rows in order (deterministic).
#pragma omp parallel for schedule(static)
    for (int64_t c0 = 0; c0 < C; c0 += 64) {
        int64_t c1 = std::min(C, c0 + 64);
        for (int64_t n = 0; n < N; ++n) {
            const T* dy = dout + n * C;
            const T* x = inp + n * C;
            T m = mean[n], s = rstd[n];
            for (int64_t i = c0; i < c1; ++i) {
                dweight[i] += dy[i] * (x[i] - m) * s;
                if (dbias) dbias[i] += dy[i];
            }
        }
    }
}

// ----- RMS norm -----------------------------------------------------------------------------

template <typename T>
void rmsnorm_forward(const T* inp, const T* weight, int64_t N, int64_t C, double eps, T* out,
                     T* rstd) {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
        const T* x = inp + n * C;
        double ss = 0.0;
#pragma omp simd reduction(+ : ss)
        for (int64_t i = 0; i < C; ++i) ss += static_cast<double>(x[i]) * x[i];
        T s = static_cast<T>(1.0 / std::sqrt(ss / static_cast<double>(C) + eps));
        T* y = out + n * C;
        for (int64_t i = 0; i < C; ++i) y[i] = x[i] * s * weight[i];
        rstd[n] = s;
    }
}

template <typename T>
void rmsnorm_backward_input(const T* dout, const T* inp, const T* weight, const T* rstd, int64_t N,
                            int64_t C, T* dinp) {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
        const T* dy = dout + n * C;
        const T* x = inp + n * C;
        T s = rstd[n];
        // dx = s * (g - xhat * mean(g * xhat)), g = dy * weight, xhat = x * s
        double sum = 0.0;
#pragma omp simd reduction(+ : sum)
        for (int64_t i = 0; i < C; ++i) sum += dy[i] * weight[i] * x[i] * s;
        T mgx = static_cast<T>(sum / static_cast<double>(C));
        T* dx = dinp + n * C;
        for (int64_t i = 0; i < C; ++i) dx[i] += s * (dy[i] * weight[i] - x[i] * s * mgx);
    }
}

template <typename T>
void rmsnorm_backward_weight(const T* dout, const T* inp, const T* rstd, int64_t N, int64_t C,
                             T* dweight) {
#pragma omp parallel for schedule(static)
    for (int64_t c0 = 0; c0 < C; c0 += 64) {
        int64_t c1 = std::min(C, c0 + 64);
        for (int64_t n = 0; n < N; ++n) {
            const T* dy = dout + n * C;
            const T* x = inp + n * C;
            for (int64_t i = c0; i < c1; ++i) dweight[i] += dy[i] * x[i] * rstd[n];
        }
    }
}

// ----- activations --------------------------------------------------------------------------

template <typename T> void gelu_forward(const T* inp, int64_t n, T* out) {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) {
        T x = inp[i];
        T cube = T(0.044715) * x * x * x;
        out[i] = T(0.5) * x * (T(1) + vtanh(T(gelu_scale) * (x + cube)));
    }
}

template <typename T> void gelu_backward(const T* inp, const T* dout, int64_t n, T* dinp) {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) {
        T x = inp[i];
        T u = T(gelu_scale) * (x + T(0.044715) * x * x * x);
        T th = vtanh(u);
        T sech2 = T(1) - th * th;
        T du = T(gelu_scale) * (T(1) + T(3 * 0.044715) * x * x);
        dinp[i] += dout[i] * (T(0.5) * (T(1) + th) + T(0.5) * x * sech2 * du);
    }
}

template <typename T> void gelu_forward_keeping(const T* inp, int64_t n, T* out, T* th) {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) {
        T x = inp[i];
        T t = vtanh(T(gelu_scale) * (x + T(0.044715) * x * x * x));
        th[i] = t;
        out[i] = T(0.5) * x * (T(1) + t);
    }
}

template <typename T>
void gelu_backward_kept(const T* inp, const T* th, const T* dout, int64_t n, T* dinp) {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) {
        T x = inp[i], t = th[i];
        T du = T(gelu_scale) * (T(1) + T(3 * 0.044715) * x * x);
        dinp[i] = dout[i] * (T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * du);
    }
}

template <typename T> void swiglu_forward(const T* inp, int64_t N, int64_t H, T* out) {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
        const T* gate = inp + n * 2 * H;
        const T* up = gate + H;
        T* y = out + n * H;
        for (int64_t i = 0; i < H; ++i) {
            T g = gate[i];
            y[i] = g / (T(1) + vexp(-g)) * up[i];
        }
    }
}

template <typename T>
void swiglu_backward(const T* inp, const T* dout, int64_t N, int64_t H, T* dinp) {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
        const T* gate = inp + n * 2 * H;
        const T* up = gate + H;
        const T* dy = dout + n * H;
        T* dgate = dinp + n * 2 * H;
        T* dup = dgate + H;
        for (int64_t i = 0; i < H; ++i) {
            T g = gate[i];
            T sig = T(1) / (T(1) + vexp(-g));
            T silu = g * sig;
            dup[i] += dy[i] * silu;
            dgate[i] += dy[i] * up[i] * sig * (T(1) + g * (T(1) - sig));
        }
    }
}

// ----- positions ----------------------------------------------------------------------------

namespace {

// Rotates pairs (i, i + D/2) of every head vector by angle (pos * theta^(-2i/D)) * sign.
template <typename T>
void rope_apply(const T* inp, int64_t B, int64_t T_, int64_t H, int64_t D, double theta,
                int64_t pos0, double sign, bool accumulate, T* out) {
    int64_t half = D / 2;
    std::vector<double> inv_freq(static_cast<size_t>(half));
    for (int64_t i = 0; i < half; ++i)
        inv_freq[static_cast<size_t>(i)] =
            std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(D));
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < T_; ++t) {
        std::vector<T> c(static_cast<size_t>(half)), s(static_cast<size_t>(half));
        for (int64_t i = 0; i < half; ++i) {
            double a = static_cast<double>(pos0 + t) * inv_freq[static_cast<size_t>(i)];
            c[static_cast<size_t>(i)] = static_cast<T>(std::cos(a));
            s[static_cast<size_t>(i)] = static_cast<T>(sign * std::sin(a));
        }
        for (int64_t b = 0; b < B; ++b) {
            for (int64_t h = 0; h < H; ++h) {
                const T* x = inp + ((b * T_ + t) * H + h) * D;
                T* y = out + ((b * T_ + t) * H + h) * D;
                for (int64_t i = 0; i < half; ++i) {
                    T x1 = x[i], x2 = x[i + half];
                    T r1 = x1 * c[static_cast<size_t>(i)] - x2 * s[static_cast<size_t>(i)];
                    T r2 = x2 * c[static_cast<size_t>(i)] + x1 * s[static_cast<size_t>(i)];
                    if (accumulate) {
                        y[i] += r1;
                        y[i + half] += r2;
                    } else {
                        y[i] = r1;
                        y[i + half] = r2;
                    }
                }
            }
        }
    }
}

} // namespace

template <typename T>
void rope_forward(const T* inp, int64_t B, int64_t T_, int64_t H, int64_t D, double theta,
                  int64_t pos0, T* out) {
    rope_apply(inp, B, T_, H, D, theta, pos0, 1.0, false, out);
}

template <typename T>
void rope_backward(const T* dout, int64_t B, int64_t T_, int64_t H, int64_t D, double theta,
                   int64_t pos0, T* dinp) {
    rope_apply(dout, B, T_, H, D, theta, pos0, -1.0, true, dinp);
}

template <typename T>
void embedding_forward(const int32_t* tokens, const T* table, int64_t N, int64_t C, T* out) {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n) std::copy_n(table + tokens[n] * C, C, out + n * C);
}

template <typename T>
void embedding_backward(const int32_t* tokens, const T* dout, int64_t N, int64_t C, T* dtable) {
    // Rows of equal tokens collide: split the columns instead of the rows.
#pragma omp parallel for schedule(static)
    for (int64_t c0 = 0; c0 < C; c0 += 64) {
        int64_t c1 = std::min(C, c0 + 64);
        for (int64_t n = 0; n < N; ++n) {
            T* row = dtable + tokens[n] * C;
            const T* g = dout + n * C;
            for (int64_t i = c0; i < c1; ++i) row[i] += g[i];
        }
    }
}

template <typename T>
void positions_forward(const T* wpe, int64_t B, int64_t T_, int64_t C, T* out) {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < B * T_; ++n) {
        const T* p = wpe + (n % T_) * C;
        T* y = out + n * C;
        for (int64_t i = 0; i < C; ++i) y[i] += p[i];
    }
}

template <typename T>
void positions_backward(const T* dout, int64_t B, int64_t T_, int64_t C, T* dwpe) {
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < T_; ++t) {
        T* row = dwpe + t * C;
        for (int64_t b = 0; b < B; ++b) {
            const T* g = dout + (b * T_ + t) * C;
            for (int64_t i = 0; i < C; ++i) row[i] += g[i];
        }
    }
}

// ----- attention ----------------------------------------------------------------------------

// Attention in blocks of query rows: for each (batch, head) and each block of `block` rows, the
// scores against the keys up to the block's last row (causal) are one BLAS call, the softmax
// runs over those rows, and the weighted values another BLAS call. Scores live only for one
// block: O(T) memory per row, never (T,T). Rows of q, k and v are strided views into the
// (B,T,heads,D) tensors.
constexpr int64_t attention_block = 64;

template <typename T>
void attention_forward(const T* q, const T* k, const T* v, int64_t B, int64_t T_, int64_t H,
                       int64_t KV, int64_t D, T* out, T* lse) {
    const int64_t group = H / KV;
    const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(D)));
#pragma omp parallel for collapse(2) schedule(dynamic)
    for (int64_t b = 0; b < B; ++b) {
        for (int64_t h = 0; h < H; ++h) {
            const int64_t kvh = h / group;
            const T* kb = k + (b * T_ * KV + kvh) * D;
            const T* vb = v + (b * T_ * KV + kvh) * D;
            std::vector<T> scores(static_cast<size_t>(attention_block * T_));
            for (int64_t t0 = 0; t0 < T_; t0 += attention_block) {
                const int64_t rows = std::min(attention_block, T_ - t0), keys = t0 + rows;
                const T* qb = q + ((b * T_ + t0) * H + h) * D;
                T* ob = out + ((b * T_ + t0) * H + h) * D;
                // scores (rows, keys) = q_block k^T
                gemm(CblasNoTrans, CblasTrans, rows, keys, D, scale, qb, H * D, kb, KV * D, T(0),
                     scores.data(), keys);
                for (int64_t r = 0; r < rows; ++r) {
                    T* row = scores.data() + r * keys;
                    const int64_t visible = t0 + r + 1; // causal: keys 0..t0+r
                    T mx = *std::max_element(row, row + visible);
                    double sum = 0.0;
#pragma omp simd reduction(+ : sum)
                    for (int64_t j = 0; j < visible; ++j) {
                        row[j] = vexp(row[j] - mx);
                        sum += row[j];
                    }
                    T inv = static_cast<T>(1.0 / sum);
                    for (int64_t j = 0; j < visible; ++j) row[j] *= inv;
                    std::fill(row + visible, row + keys, T(0));
                    lse[(b * H + h) * T_ + t0 + r] = mx + static_cast<T>(std::log(sum));
                }
                // out_block (rows, D) = p (rows, keys) v (keys, D)
                gemm(CblasNoTrans, CblasNoTrans, rows, D, keys, T(1), scores.data(), keys, vb,
                     KV * D, T(0), ob, H * D);
            }
        }
    }
}

template <typename T>
void attention_backward(const T* dout, const T* q, const T* k, const T* v, const T* out,
                        const T* lse, int64_t B, int64_t T_, int64_t H, int64_t KV, int64_t D,
                        T* dq, T* dk, T* dv) {
    const int64_t group = H / KV;
    const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(D)));
    // The query heads of one group write the same dk and dv rows: one task per (b, kv head).
#pragma omp parallel for collapse(2) schedule(dynamic)
    for (int64_t b = 0; b < B; ++b) {
        for (int64_t kvh = 0; kvh < KV; ++kvh) {
            const T* kb = k + (b * T_ * KV + kvh) * D;
            const T* vb = v + (b * T_ * KV + kvh) * D;
            T* dkb = dk + (b * T_ * KV + kvh) * D;
            T* dvb = dv + (b * T_ * KV + kvh) * D;
            std::vector<T> p(static_cast<size_t>(attention_block * T_));
            std::vector<T> dp(static_cast<size_t>(attention_block * T_));
            for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
                for (int64_t t0 = 0; t0 < T_; t0 += attention_block) {
                    const int64_t rows = std::min(attention_block, T_ - t0), keys = t0 + rows;
                    const int64_t at = ((b * T_ + t0) * H + h) * D;
                    // p: the block's probabilities again, from the saved log-sum-exp.
                    gemm(CblasNoTrans, CblasTrans, rows, keys, D, scale, q + at, H * D, kb, KV * D,
                         T(0), p.data(), keys);
                    // dp (rows, keys) = dout_block v^T
                    gemm(CblasNoTrans, CblasTrans, rows, keys, D, T(1), dout + at, H * D, vb,
                         KV * D, T(0), dp.data(), keys);
                    for (int64_t r = 0; r < rows; ++r) {
                        T* pr = p.data() + r * keys;
                        T* dr = dp.data() + r * keys;
                        const int64_t visible = t0 + r + 1;
                        const T row_lse = lse[(b * H + h) * T_ + t0 + r];
                        const T* go = dout + at + r * H * D;
                        const T* o = out + at + r * H * D;
                        T delta = 0; // sum_j p_j dp_j = dout . out
#pragma omp simd reduction(+ : delta)
                        for (int64_t i = 0; i < D; ++i) delta += go[i] * o[i];
                        for (int64_t j = 0; j < visible; ++j) {
                            pr[j] = vexp(pr[j] - row_lse);
                            dr[j] = pr[j] * (dr[j] - delta) * scale; // the score gradient
                        }
                        std::fill(pr + visible, pr + keys, T(0));
                        std::fill(dr + visible, dr + keys, T(0));
                    }
                    // dv (keys, D) += p^T dout_block; dq_block += ds k; dk (keys, D) += ds^T q
                    gemm(CblasTrans, CblasNoTrans, keys, D, rows, T(1), p.data(), keys, dout + at,
                         H * D, T(1), dvb, KV * D);
                    gemm(CblasNoTrans, CblasNoTrans, rows, D, keys, T(1), dp.data(), keys, kb,
                         KV * D, T(1), dq + at, H * D);
                    gemm(CblasTrans, CblasNoTrans, keys, D, rows, T(1), dp.data(), keys, q + at,
                         H * D, T(1), dkb, KV * D);
                }
            }
        }
    }
}

// ----- loss ---------------------------------------------------------------------------------

template <typename T>
void cross_entropy_forward(const T* logits, const int32_t* targets, int64_t N, int64_t V, T* losses,
                           T* lse) {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
        const T* z = logits + n * V;
        T mx = *std::max_element(z, z + V);
        double sum = 0.0;
        // The exponentials in float (vectorised), their sum in double.
#pragma omp simd reduction(+ : sum)
        for (int64_t i = 0; i < V; ++i) sum += vexp(z[i] - mx);
        T l = static_cast<T>(static_cast<double>(mx) + std::log(sum));
        lse[n] = l;
        losses[n] = l - z[targets[n]];
    }
}

template <typename T>
void cross_entropy_backward(const T* logits, const int32_t* targets, const T* lse, const T* dlosses,
                            int64_t N, int64_t V, T* dlogits) {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
        const T* z = logits + n * V;
        T* dz = dlogits + n * V;
        T g = dlosses[n], l = lse[n];
        for (int64_t i = 0; i < V; ++i) dz[i] = vexp(z[i] - l) * g;
        dz[targets[n]] -= g;
    }
}

// ----- optimizer ----------------------------------------------------------------------------

template <typename T>
void adamw_step(const T* grads, int64_t n, const AdamWConfig& c, int64_t step, T* params, T* m,
                T* v) {
    const T b1 = static_cast<T>(c.beta1), b2 = static_cast<T>(c.beta2);
    const T lr = static_cast<T>(c.lr), eps = static_cast<T>(c.eps);
    const T wd = static_cast<T>(c.weight_decay);
    const T corr1 = static_cast<T>(1.0 - std::pow(c.beta1, static_cast<double>(step)));
    const T corr2 = static_cast<T>(1.0 - std::pow(c.beta2, static_cast<double>(step)));
#pragma omp parallel for simd schedule(static) if (parallel : n >= parallel_from)
    for (int64_t i = 0; i < n; ++i) {
        T g = grads[i];
        T mi = b1 * m[i] + (T(1) - b1) * g;
        T vi = b2 * v[i] + (T(1) - b2) * g * g;
        m[i] = mi;
        v[i] = vi;
        T mhat = mi / corr1, vhat = vi / corr2;
        params[i] -= lr * (mhat / (std::sqrt(vhat) + eps) + wd * params[i]);
    }
}

template <typename T> double sum_squares(const T* x, int64_t n) {
    double s = 0.0;
#pragma omp parallel for simd reduction(+ : s) schedule(static) if (parallel : n >= parallel_from)
    for (int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
    return s;
}

template <typename T> void scale(T* x, int64_t n, double s) {
    T ts = static_cast<T>(s);
#pragma omp parallel for simd schedule(static) if (parallel : n >= parallel_from)
    for (int64_t i = 0; i < n; ++i) x[i] *= ts;
}

template <typename T> void copy_scaled(const T* src, int64_t n, double s, T* dst) {
    T ts = static_cast<T>(s);
#pragma omp parallel for simd schedule(static) if (parallel : n >= parallel_from)
    for (int64_t i = 0; i < n; ++i) dst[i] = src[i] * ts;
}

// ----- bf16 ---------------------------------------------------------------------------------

void round_bf16(float* x, int64_t n) {
    uint32_t* bits = reinterpret_cast<uint32_t*>(x);
#pragma omp parallel for simd schedule(static) if (parallel : n > 65536)
    for (int64_t i = 0; i < n; ++i) bits[i] = bf16_bits(bits[i]);
}

void to_bf16(const float* x, int64_t n, uint16_t* out) {
    const uint32_t* bits = reinterpret_cast<const uint32_t*>(x);
#pragma omp parallel for simd schedule(static) if (parallel : n > 65536)
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<uint16_t>(bf16_bits(bits[i]) >> 16);
}

void from_bf16(const uint16_t* x, int64_t n, float* out) {
    uint32_t* bits = reinterpret_cast<uint32_t*>(out);
#pragma omp parallel for simd schedule(static) if (parallel : n > 65536)
    for (int64_t i = 0; i < n; ++i) bits[i] = static_cast<uint32_t>(x[i]) << 16;
}

// ----- instantiations -----------------------------------------------------------------------

#define DIST_INSTANTIATE(T)                                                                        \
    template void matmul_forward<T>(const T*, const T*, const T*, int64_t, int64_t, int64_t, T*);  \
    template void matmul_backward_input<T>(const T*, const T*, int64_t, int64_t, int64_t, T*);     \
    template void matmul_backward_weight<T>(const T*, const T*, int64_t, int64_t, int64_t, T*,     \
                                            T*);                                                   \
    template void layernorm_forward<T>(const T*, const T*, const T*, int64_t, int64_t, double, T*, \
                                       T*, T*);                                                    \
    template void layernorm_backward_input<T>(const T*, const T*, const T*, const T*, const T*,    \
                                              int64_t, int64_t, T*);                               \
    template void layernorm_backward_weight<T>(const T*, const T*, const T*, const T*, int64_t,    \
                                               int64_t, T*, T*);                                   \
    template void rmsnorm_forward<T>(const T*, const T*, int64_t, int64_t, double, T*, T*);        \
    template void rmsnorm_backward_input<T>(const T*, const T*, const T*, const T*, int64_t,       \
                                            int64_t, T*);                                          \
    template void rmsnorm_backward_weight<T>(const T*, const T*, const T*, int64_t, int64_t, T*);  \
    template void gelu_forward<T>(const T*, int64_t, T*);                                          \
    template void gelu_backward<T>(const T*, const T*, int64_t, T*);                               \
    template void gelu_forward_keeping<T>(const T*, int64_t, T*, T*);                              \
    template void gelu_backward_kept<T>(const T*, const T*, const T*, int64_t, T*);                \
    template void swiglu_forward<T>(const T*, int64_t, int64_t, T*);                               \
    template void swiglu_backward<T>(const T*, const T*, int64_t, int64_t, T*);                    \
    template void rope_forward<T>(const T*, int64_t, int64_t, int64_t, int64_t, double, int64_t,   \
                                  T*);                                                             \
    template void rope_backward<T>(const T*, int64_t, int64_t, int64_t, int64_t, double, int64_t,  \
                                   T*);                                                            \
    template void embedding_forward<T>(const int32_t*, const T*, int64_t, int64_t, T*);            \
    template void embedding_backward<T>(const int32_t*, const T*, int64_t, int64_t, T*);           \
    template void positions_forward<T>(const T*, int64_t, int64_t, int64_t, T*);                   \
    template void positions_backward<T>(const T*, int64_t, int64_t, int64_t, T*);                  \
    template void attention_forward<T>(const T*, const T*, const T*, int64_t, int64_t, int64_t,    \
                                       int64_t, int64_t, T*, T*);                                  \
    template void attention_backward<T>(const T*, const T*, const T*, const T*, const T*,          \
                                        const T*, int64_t, int64_t, int64_t, int64_t, int64_t, T*, \
                                        T*, T*);                                                   \
    template void cross_entropy_forward<T>(const T*, const int32_t*, int64_t, int64_t, T*, T*);    \
    template void cross_entropy_backward<T>(const T*, const int32_t*, const T*, const T*, int64_t, \
                                            int64_t, T*);                                          \
    template void adamw_step<T>(const T*, int64_t, const AdamWConfig&, int64_t, T*, T*, T*);       \
    template double sum_squares<T>(const T*, int64_t);                                             \
    template void scale<T>(T*, int64_t, double);                                                   \
    template void copy_scaled<T>(const T*, int64_t, double, T*);

DIST_INSTANTIATE(float)
DIST_INSTANTIATE(double)

} // namespace dist::kernels::cpu
