// backend.cpp: the CPU's Backend: kernels/cpu/ops.hpp, plus the loops layers used to run over
// host memory themselves.
#include "kernels/backend.hpp"

#include "kernels/cpu/ops.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <string>

namespace dist::kernels {

namespace {

class CpuBackend final : public Backend {
  public:
    Device device() const override { return Device::cpu(); }
    Allocator& allocator() override { return Allocator::cpu(); }

    void matmul_forward(const float* inp, const float* weight, const float* bias, int64_t N,
                        int64_t C, int64_t OC, float* out) override {
        cpu::matmul_forward(inp, weight, bias, N, C, OC, out);
    }
    void matmul_backward_input(const float* dout, const float* weight, int64_t N, int64_t C,
                               int64_t OC, float* dinp) override {
        cpu::matmul_backward_input(dout, weight, N, C, OC, dinp);
    }
    void matmul_backward_weight(const float* dout, const float* inp, int64_t N, int64_t C,
                                int64_t OC, float* dweight, float* dbias) override {
        cpu::matmul_backward_weight(dout, inp, N, C, OC, dweight, dbias);
    }
    void layernorm_forward(const float* inp, const float* weight, const float* bias, int64_t N,
                           int64_t C, double eps, float* out, float* mean, float* rstd) override {
        cpu::layernorm_forward(inp, weight, bias, N, C, eps, out, mean, rstd);
    }
    void layernorm_backward_input(const float* dout, const float* inp, const float* weight,
                                  const float* mean, const float* rstd, int64_t N, int64_t C,
                                  float* dinp) override {
        cpu::layernorm_backward_input(dout, inp, weight, mean, rstd, N, C, dinp);
    }
    void layernorm_backward_weight(const float* dout, const float* inp, const float* mean,
                                   const float* rstd, int64_t N, int64_t C, float* dweight,
                                   float* dbias) override {
        cpu::layernorm_backward_weight(dout, inp, mean, rstd, N, C, dweight, dbias);
    }
    void rmsnorm_forward(const float* inp, const float* weight, int64_t N, int64_t C, double eps,
                         float* out, float* rstd) override {
        cpu::rmsnorm_forward(inp, weight, N, C, eps, out, rstd);
    }
    void rmsnorm_backward_input(const float* dout, const float* inp, const float* weight,
                                const float* rstd, int64_t N, int64_t C, float* dinp) override {
        cpu::rmsnorm_backward_input(dout, inp, weight, rstd, N, C, dinp);
    }
    void rmsnorm_backward_weight(const float* dout, const float* inp, const float* rstd, int64_t N,
                                 int64_t C, float* dweight) override {
        cpu::rmsnorm_backward_weight(dout, inp, rstd, N, C, dweight);
    }
    void gelu_forward(const float* inp, int64_t n, float* out) override {
        cpu::gelu_forward(inp, n, out);
    }
    void gelu_forward_keeping(const float* inp, int64_t n, float* out, float* th) override {
        cpu::gelu_forward_keeping(inp, n, out, th);
    }
    void gelu_backward_kept(const float* inp, const float* th, const float* dout, int64_t n,
                            float* dinp) override {
        cpu::gelu_backward_kept(inp, th, dout, n, dinp);
    }
    void swiglu_forward(const float* inp, int64_t N, int64_t H, float* out) override {
        cpu::swiglu_forward(inp, N, H, out);
    }
    void swiglu_backward(const float* inp, const float* dout, int64_t N, int64_t H,
                         float* dinp) override {
        cpu::swiglu_backward(inp, dout, N, H, dinp);
    }
    void rope_forward(const float* inp, int64_t B, int64_t T, int64_t H, int64_t D, double theta,
                      int64_t pos0, float* out) override {
        cpu::rope_forward(inp, B, T, H, D, theta, pos0, out);
    }
    void rope_backward(const float* dout, int64_t B, int64_t T, int64_t H, int64_t D, double theta,
                       int64_t pos0, float* dinp) override {
        cpu::rope_backward(dout, B, T, H, D, theta, pos0, dinp);
    }
    void embedding_forward(const int32_t* tokens, const float* table, int64_t N, int64_t C,
                           float* out) override {
        cpu::embedding_forward(tokens, table, N, C, out);
    }
    void embedding_backward(const int32_t* tokens, const float* dout, int64_t N, int64_t C,
                            float* dtable) override {
        cpu::embedding_backward(tokens, dout, N, C, dtable);
    }
    void positions_forward(const float* wpe, int64_t B, int64_t T, int64_t C, float* out) override {
        cpu::positions_forward(wpe, B, T, C, out);
    }
    void positions_backward(const float* dout, int64_t B, int64_t T, int64_t C,
                            float* dwpe) override {
        cpu::positions_backward(dout, B, T, C, dwpe);
    }
    void attention_forward(const float* q, const float* k, const float* v, int64_t B, int64_t T,
                           int64_t H, int64_t KV, int64_t D, float* out, float* lse) override {
        cpu::attention_forward(q, k, v, B, T, H, KV, D, out, lse);
    }
    void attention_backward(const float* dout, const float* q, const float* k, const float* v,
                            const float* out, const float* lse, int64_t B, int64_t T, int64_t H,
                            int64_t KV, int64_t D, float* dq, float* dk, float* dv) override {
        cpu::attention_backward(dout, q, k, v, out, lse, B, T, H, KV, D, dq, dk, dv);
    }
    void cross_entropy_forward(const float* logits, const int32_t* targets, int64_t N, int64_t V,
                               float* losses, float* lse) override {
        cpu::cross_entropy_forward(logits, targets, N, V, losses, lse);
    }
    void cross_entropy_backward(const float* logits, const int32_t* targets, const float* lse,
                                const float* dlosses, int64_t N, int64_t V,
                                float* dlogits) override {
        cpu::cross_entropy_backward(logits, targets, lse, dlosses, N, V, dlogits);
    }
    void adamw_step(const float* grads, int64_t n, double lr, double beta1, double beta2,
                    double eps, double weight_decay, int64_t step, float* params, float* m,
                    float* v) override {
        cpu::adamw_step(grads, n, cpu::AdamWConfig{lr, beta1, beta2, eps, weight_decay}, step,
                        params, m, v);
    }
    double sum_squares(const float* x, int64_t n) override { return cpu::sum_squares(x, n); }
    double sum(const float* x, int64_t n) override {
        double s = 0.0;
        for (int64_t i = 0; i < n; ++i) s += x[i];
        return s;
    }
    void scale(float* x, int64_t n, double s) override { cpu::scale(x, n, s); }
    void copy_scaled(const float* src, int64_t n, double s, float* dst) override {
        cpu::copy_scaled(src, n, s, dst);
    }

    void add(const float* a, const float* b, int64_t n, float* out) override {
        for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
    }
    void fill(float* x, int64_t n, float value) override { std::fill(x, x + n, value); }
    void round_bf16(float* x, int64_t n) override { cpu::round_bf16(x, n); }
    void to_bf16(const float* x, int64_t n, uint16_t* out) override { cpu::to_bf16(x, n, out); }
    void from_bf16(const uint16_t* x, int64_t n, float* out) override { cpu::from_bf16(x, n, out); }
    void add_rows(const float* bias, int64_t N, int64_t C, float* out) override {
        for (int64_t r = 0; r < N; ++r)
            for (int64_t c = 0; c < C; ++c) out[r * C + c] += bias[c];
    }
    void copy_block(const float* src, int64_t src_stride, float* dst, int64_t dst_stride,
                    int64_t rows, int64_t width) override {
        for (int64_t r = 0; r < rows; ++r)
            std::memcpy(dst + r * dst_stride, src + r * src_stride,
                        static_cast<size_t>(width) * sizeof(float));
    }
    void gelu_erf_forward(const float* in, int64_t n, float* out) override {
        for (int64_t i = 0; i < n; ++i)
            out[i] = 0.5f * in[i] * (1.0f + std::erf(in[i] * 0.70710678f));
    }
    void gelu_erf_backward(const float* x, const float* g, int64_t n, float* d) override {
        for (int64_t i = 0; i < n; ++i) {
            float cdf = 0.5f * (1.0f + std::erf(x[i] * 0.70710678f));
            float pdf = 0.39894228f * std::exp(-0.5f * x[i] * x[i]);
            d[i] += g[i] * (cdf + x[i] * pdf);
        }
    }
    void relu_forward(const float* in, int64_t n, float* out) override {
        for (int64_t i = 0; i < n; ++i) out[i] = in[i] > 0 ? in[i] : 0.0f;
    }
    void relu_backward(const float* x, const float* g, int64_t n, float* d) override {
        for (int64_t i = 0; i < n; ++i) d[i] += x[i] > 0 ? g[i] : 0.0f;
    }

    void embedding_forward_part(const int32_t* tok, const float* table, int64_t N, int64_t C,
                                int64_t begin, int64_t rows, float* out) override {
        for (int64_t i = 0; i < N; ++i) {
            int64_t row = tok[i] - begin;
            if (row >= 0 && row < rows)
                std::memcpy(out + i * C, table + row * C, static_cast<size_t>(C) * sizeof(float));
            else
                std::memset(out + i * C, 0, static_cast<size_t>(C) * sizeof(float));
        }
    }
    void embedding_backward_part(const int32_t* tok, const float* dy, int64_t N, int64_t C,
                                 int64_t begin, int64_t rows, float* grad) override {
        for (int64_t i = 0; i < N; ++i) {
            int64_t row = tok[i] - begin;
            if (row < 0 || row >= rows) continue;
            for (int64_t c = 0; c < C; ++c) grad[row * C + c] += dy[i * C + c];
        }
    }

    void row_max(const float* x, int64_t N, int64_t V, float* mx) override {
        for (int64_t n = 0; n < N; ++n) mx[n] = *std::max_element(x + n * V, x + (n + 1) * V);
    }
    void cross_entropy_part_sums(const float* x, const int32_t* tgt, const float* mx, int64_t N,
                                 int64_t V, int64_t begin, float* s) override {
        for (int64_t n = 0; n < N; ++n) {
            float e = 0.0f;
            for (int64_t j = 0; j < V; ++j) e += std::exp(x[n * V + j] - mx[n]);
            s[n] = e;
            int64_t t = tgt[n] - begin;
            s[N + n] = t >= 0 && t < V ? x[n * V + t] : 0.0f;
        }
    }
    void cross_entropy_part_finish(const float* mx, const float* s, int64_t N, float* lse,
                                   float* losses) override {
        for (int64_t n = 0; n < N; ++n) {
            lse[n] = mx[n] + std::log(s[n]);
            losses[n] = lse[n] - s[N + n];
        }
    }
    void cross_entropy_part_backward(const float* x, const int32_t* tgt, const float* lse,
                                     const float* dl, int64_t N, int64_t V, int64_t begin,
                                     float* d) override {
        for (int64_t n = 0; n < N; ++n) {
            for (int64_t j = 0; j < V; ++j) d[n * V + j] = dl[n] * std::exp(x[n * V + j] - lse[n]);
            int64_t t = tgt[n] - begin;
            if (t >= 0 && t < V) d[n * V + t] -= dl[n];
        }
    }
};

} // namespace

Backend& cpu_backend() {
    static CpuBackend backend;
    return backend;
}

// The host: its processor's model name and its memory.
Backend::Description Backend::describe() const {
    Description d{"an unknown CPU", static_cast<int64_t>(::sysconf(_SC_PHYS_PAGES)) *
                                        static_cast<int64_t>(::sysconf(_SC_PAGE_SIZE))};
    std::ifstream in("/proc/cpuinfo");
    std::string line;
    while (std::getline(in, line))
        if (line.rfind("model name", 0) == 0) {
            auto colon = line.find(':');
            if (colon == std::string::npos) continue;
            std::string s = line.substr(colon + 1);
            s.erase(0, s.find_first_not_of(' '));
            d.model = s;
            break;
        }
    return d;
}

} // namespace dist::kernels
