// ops_layers.cu: the elementwise and vocabulary-split kernels a model's layers need besides the
// ops of ops.cu (residual sums, bias rows, column blocks, GELU (erf) and ReLU, the embedding
// and the loss split by vocabulary). Each mirrors the CPU backend's loop (kernels/cpu/backend.cpp).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.hpp"

#include <algorithm>

namespace dist::kernels::cuda {

using namespace detail;

namespace {

#define DIST_GRID_STRIDE(i, n)                                                                     \
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < (n);                      \
         i += int64_t(gridDim.x) * blockDim.x)

__global__ void add_kernel(const float* a, const float* b, int64_t n, float* out) {
    DIST_GRID_STRIDE(i, n) out[i] = a[i] + b[i];
}

__global__ void fill_kernel(float* x, int64_t n, float value) {
    DIST_GRID_STRIDE(i, n) x[i] = value;
}

__global__ void add_rows_kernel(const float* bias, int64_t N, int64_t C, float* out) {
    DIST_GRID_STRIDE(i, N * C) out[i] += bias[i % C];
}

__global__ void gelu_erf_forward_kernel(const float* in, int64_t n, float* out) {
    DIST_GRID_STRIDE(i, n) out[i] = 0.5f * in[i] * (1.0f + erff(in[i] * 0.70710678f));
}

__global__ void gelu_erf_backward_kernel(const float* x, const float* g, int64_t n, float* d) {
    DIST_GRID_STRIDE(i, n) {
        float cdf = 0.5f * (1.0f + erff(x[i] * 0.70710678f));
        float pdf = 0.39894228f * expf(-0.5f * x[i] * x[i]);
        d[i] += g[i] * (cdf + x[i] * pdf);
    }
}

// GPT-2's GELU keeping tanh(sqrt(2/pi) (x + 0.044715 x^3)) for the backward, as the CPU op.
constexpr float gelu_scale = 0.7978845608028654f;

__global__ void gelu_forward_keeping_kernel(const float* in, int64_t n, float* out, float* th) {
    DIST_GRID_STRIDE(i, n) {
        float x = in[i];
        float t = tanhf(gelu_scale * (x + 0.044715f * x * x * x));
        th[i] = t;
        out[i] = 0.5f * x * (1.0f + t);
    }
}

__global__ void gelu_backward_kept_kernel(const float* in, const float* th, const float* dout,
                                          int64_t n, float* dinp) {
    DIST_GRID_STRIDE(i, n) {
        float x = in[i], t = th[i];
        float du = gelu_scale * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] = dout[i] * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du);
    }
}

__global__ void relu_forward_kernel(const float* in, int64_t n, float* out) {
    DIST_GRID_STRIDE(i, n) out[i] = in[i] > 0 ? in[i] : 0.0f;
}

__global__ void relu_backward_kernel(const float* x, const float* g, int64_t n, float* d) {
    DIST_GRID_STRIDE(i, n) d[i] += x[i] > 0 ? g[i] : 0.0f;
}

__global__ void embedding_forward_part_kernel(const int32_t* tok, const float* table, int64_t N,
                                              int64_t C, int64_t begin, int64_t rows, float* out) {
    DIST_GRID_STRIDE(i, N * C) {
        int64_t row = tok[i / C] - begin;
        out[i] = row >= 0 && row < rows ? table[row * C + i % C] : 0.0f;
    }
}

__global__ void embedding_backward_part_kernel(const int32_t* tok, const float* dout, int64_t N,
                                               int64_t C, int64_t begin, int64_t rows,
                                               float* dtable) {
    DIST_GRID_STRIDE(i, N * C) {
        int64_t row = tok[i / C] - begin;
        if (row >= 0 && row < rows) atomicAdd(dtable + row * C + i % C, dout[i]);
    }
}

__global__ void sum_kernel(const float* x, int64_t n, double* sum) {
    double s = 0.0;
    DIST_GRID_STRIDE(i, n) s += x[i];
    s = block_sum(s);
    if (threadIdx.x == 0) atomicAdd(sum, s);
}

// One block per row.
__global__ void row_max_kernel(const float* x, int64_t V, float* out) {
    const float* row = x + blockIdx.x * V;
    float m = -INFINITY;
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) m = fmaxf(m, row[j]);
    m = block_max(m);
    if (threadIdx.x == 0) out[blockIdx.x] = m;
}

__global__ void cross_entropy_part_sums_kernel(const float* x, const int32_t* tgt, const float* mx,
                                               int64_t N, int64_t V, int64_t begin, float* s) {
    const int64_t n = blockIdx.x;
    const float* row = x + n * V;
    float e = 0.0f;
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) e += expf(row[j] - mx[n]);
    e = block_sum(e);
    if (threadIdx.x == 0) {
        s[n] = e;
        int64_t t = tgt[n] - begin;
        s[N + n] = t >= 0 && t < V ? row[t] : 0.0f;
    }
}

__global__ void cross_entropy_part_finish_kernel(const float* mx, const float* s, int64_t N,
                                                 float* lse, float* losses) {
    DIST_GRID_STRIDE(n, N) {
        lse[n] = mx[n] + logf(s[n]);
        losses[n] = lse[n] - s[N + n];
    }
}

__global__ void cross_entropy_part_backward_kernel(const float* x, const int32_t* tgt,
                                                   const float* lse, const float* dl, int64_t N,
                                                   int64_t V, int64_t begin, float* d) {
    DIST_GRID_STRIDE(i, N * V) {
        int64_t n = i / V, j = i % V;
        float g = dl[n] * expf(x[i] - lse[n]);
        if (j == tgt[n] - begin) g -= dl[n];
        d[i] = g;
    }
}

} // namespace

std::string add(const float* a, const float* b, int64_t n, float* out) {
    add_kernel<<<blocks_for(n, 256), 256>>>(a, b, n, out);
    DIST_LAUNCHED();
    return {};
}

std::string fill(float* x, int64_t n, float value) {
    fill_kernel<<<blocks_for(n, 256), 256>>>(x, n, value);
    DIST_LAUNCHED();
    return {};
}

std::string add_rows(const float* bias, int64_t N, int64_t C, float* out) {
    add_rows_kernel<<<blocks_for(N * C, 256), 256>>>(bias, N, C, out);
    DIST_LAUNCHED();
    return {};
}

std::string copy_block(const float* src, int64_t src_stride, float* dst, int64_t dst_stride,
                       int64_t rows, int64_t width) {
    if (rows == 0 || width == 0) return {};
    if (rows == 1 || (src_stride == width && dst_stride == width)) {
        // One run of memory: a plain copy (a 2D copy's pitch is limited to 2^31 bytes).
        DIST_CUDA(cudaMemcpyAsync(dst, src, static_cast<size_t>(rows * width) * sizeof(float),
                                  cudaMemcpyDeviceToDevice, 0));
        return {};
    }
    DIST_CUDA(cudaMemcpy2DAsync(dst, static_cast<size_t>(dst_stride) * sizeof(float), src,
                                static_cast<size_t>(src_stride) * sizeof(float),
                                static_cast<size_t>(width) * sizeof(float),
                                static_cast<size_t>(rows), cudaMemcpyDeviceToDevice, 0));
    return {};
}

std::string gelu_erf_forward(const float* inp, int64_t n, float* out) {
    gelu_erf_forward_kernel<<<blocks_for(n, 256), 256>>>(inp, n, out);
    DIST_LAUNCHED();
    return {};
}

std::string gelu_erf_backward(const float* inp, const float* dout, int64_t n, float* dinp) {
    gelu_erf_backward_kernel<<<blocks_for(n, 256), 256>>>(inp, dout, n, dinp);
    DIST_LAUNCHED();
    return {};
}

std::string gelu_forward_keeping(const float* inp, int64_t n, float* out, float* th) {
    gelu_forward_keeping_kernel<<<blocks_for(n, 256), 256>>>(inp, n, out, th);
    DIST_LAUNCHED();
    return {};
}

std::string gelu_backward_kept(const float* inp, const float* th, const float* dout, int64_t n,
                               float* dinp) {
    gelu_backward_kept_kernel<<<blocks_for(n, 256), 256>>>(inp, th, dout, n, dinp);
    DIST_LAUNCHED();
    return {};
}

std::string relu_forward(const float* inp, int64_t n, float* out) {
    relu_forward_kernel<<<blocks_for(n, 256), 256>>>(inp, n, out);
    DIST_LAUNCHED();
    return {};
}

std::string relu_backward(const float* inp, const float* dout, int64_t n, float* dinp) {
    relu_backward_kernel<<<blocks_for(n, 256), 256>>>(inp, dout, n, dinp);
    DIST_LAUNCHED();
    return {};
}

std::string embedding_forward_part(const int32_t* tokens, const float* table, int64_t N, int64_t C,
                                   int64_t begin, int64_t rows, float* out) {
    embedding_forward_part_kernel<<<blocks_for(N * C, 256), 256>>>(tokens, table, N, C, begin, rows,
                                                                   out);
    DIST_LAUNCHED();
    return {};
}

std::string embedding_backward_part(const int32_t* tokens, const float* dout, int64_t N, int64_t C,
                                    int64_t begin, int64_t rows, float* dtable) {
    embedding_backward_part_kernel<<<blocks_for(N * C, 256), 256>>>(tokens, dout, N, C, begin, rows,
                                                                    dtable);
    DIST_LAUNCHED();
    return {};
}

std::string sum(const float* x, int64_t n, double* total) {
    const int blocks = std::min(blocks_for(n, 256), 1024);
    sum_kernel<<<blocks, 256>>>(x, n, total);
    DIST_LAUNCHED();
    return {};
}

std::string row_max(const float* logits, int64_t N, int64_t V, float* out) {
    if (N == 0) return {};
    row_max_kernel<<<int(N), 256>>>(logits, V, out);
    DIST_LAUNCHED();
    return {};
}

std::string cross_entropy_part_sums(const float* logits, const int32_t* targets,
                                    const float* row_max, int64_t N, int64_t V, int64_t begin,
                                    float* sums) {
    if (N == 0) return {};
    cross_entropy_part_sums_kernel<<<int(N), 256>>>(logits, targets, row_max, N, V, begin, sums);
    DIST_LAUNCHED();
    return {};
}

std::string cross_entropy_part_finish(const float* row_max, const float* sums, int64_t N,
                                      float* lse, float* losses) {
    cross_entropy_part_finish_kernel<<<blocks_for(N, 256), 256>>>(row_max, sums, N, lse, losses);
    DIST_LAUNCHED();
    return {};
}

std::string cross_entropy_part_backward(const float* logits, const int32_t* targets,
                                        const float* lse, const float* dlosses, int64_t N,
                                        int64_t V, int64_t begin, float* dlogits) {
    cross_entropy_part_backward_kernel<<<blocks_for(N * V, 256), 256>>>(
        logits, targets, lse, dlosses, N, V, begin, dlogits);
    DIST_LAUNCHED();
    return {};
}

} // namespace dist::kernels::cuda
