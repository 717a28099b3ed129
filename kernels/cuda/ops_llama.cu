// ops_llama.cu: the CUDA versions of the ops Llama adds to GPT-2: RMS norm, SwiGLU and rotary
// embedding. Same shapes and conventions as kernels/cpu/ops.cpp; backward kernels add.
#include "kernels/cuda/ops.hpp"

#include "kernels/cuda/common.cuh"

#include <cuda_runtime.h>

#include <cmath>
#include <string>

namespace dist::kernels::cuda {

namespace {

using detail::block_sum;
using detail::blocks_for;

// ----- RMS norm: one block per row ----------------------------------------------------------

__global__ void rmsnorm_forward_kernel(const float* inp, const float* w, int64_t C, float eps,
                                       float* out, float* rstd) {
    const float* x = inp + blockIdx.x * C;
    float ss = 0.0f;
    for (int64_t i = threadIdx.x; i < C; i += blockDim.x) ss += x[i] * x[i];
    float r = rsqrtf(block_sum(ss) / static_cast<float>(C) + eps);
    float* y = out + blockIdx.x * C;
    for (int64_t i = threadIdx.x; i < C; i += blockDim.x) y[i] = x[i] * r * w[i];
    if (threadIdx.x == 0) rstd[blockIdx.x] = r;
}

// dx = s * (g - xhat * mean(g * xhat)), g = dy * w, xhat = x * s.
__global__ void rmsnorm_backward_input_kernel(const float* dout, const float* inp, const float* w,
                                              const float* rstd, int64_t C, float* dinp) {
    const float* dy = dout + blockIdx.x * C;
    const float* x = inp + blockIdx.x * C;
    float s = rstd[blockIdx.x];
    float sum = 0.0f;
    for (int64_t i = threadIdx.x; i < C; i += blockDim.x) sum += dy[i] * w[i] * x[i] * s;
    float mgx = block_sum(sum) / static_cast<float>(C);
    float* dx = dinp + blockIdx.x * C;
    for (int64_t i = threadIdx.x; i < C; i += blockDim.x)
        dx[i] += s * (dy[i] * w[i] - x[i] * s * mgx);
}

// Column sums over the rows: a block owns 32 columns (threadIdx.x) and splits the rows over
// threadIdx.y, then sums the 8 partial sums in shared memory. No atomics: deterministic.
constexpr int weight_rows = 8;

__global__ void rmsnorm_backward_weight_kernel(const float* dout, const float* inp,
                                               const float* rstd, int64_t N, int64_t C, float* dw) {
    __shared__ float partial[weight_rows][33];
    int64_t c = blockIdx.x * int64_t(32) + threadIdx.x;
    float s = 0.0f;
    if (c < C)
        for (int64_t n = threadIdx.y; n < N; n += weight_rows)
            s += dout[n * C + c] * inp[n * C + c] * rstd[n];
    partial[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float t = 0.0f;
        for (int r = 0; r < weight_rows; ++r) t += partial[r][threadIdx.x];
        dw[c] += t;
    }
}

// ----- SwiGLU: element-wise over (N,H), gate and up from the two halves of a (N,2H) row -------

__global__ void swiglu_forward_kernel(const float* inp, int64_t N, int64_t H, float* out) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < N * H;
         i += int64_t(gridDim.x) * blockDim.x) {
        int64_t n = i / H, j = i % H;
        float g = inp[n * 2 * H + j], u = inp[n * 2 * H + H + j];
        out[i] = g / (1.0f + expf(-g)) * u;
    }
}

__global__ void swiglu_backward_kernel(const float* inp, const float* dout, int64_t N, int64_t H,
                                       float* dinp) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < N * H;
         i += int64_t(gridDim.x) * blockDim.x) {
        int64_t n = i / H, j = i % H;
        float g = inp[n * 2 * H + j], u = inp[n * 2 * H + H + j];
        float sig = 1.0f / (1.0f + expf(-g));
        float dy = dout[i];
        dinp[n * 2 * H + H + j] += dy * g * sig;
        dinp[n * 2 * H + j] += dy * u * sig * (1.0f + g * (1.0f - sig));
    }
}

// ----- rotary embedding ----------------------------------------------------------------------

// One thread per pair (i, i + D/2) of one head vector: it reads both before writing both, so
// out may alias inp. The angle (pos * theta^(-2i/D)) is computed in double, as on the CPU:
// positions reach thousands of radians, where a float angle would be off by ~1e-4.
__global__ void rope_kernel(const float* inp, int64_t B, int64_t T, int64_t H, int64_t D,
                            double theta, int64_t pos0, double sign, bool accumulate, float* out) {
    const int64_t half = D / 2;
    for (int64_t p = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; p < B * T * H * half;
         p += int64_t(gridDim.x) * blockDim.x) {
        int64_t i = p % half, row = p / half; // row = (b * T + t) * H + h
        int64_t t = (row / H) % T;
        double a = static_cast<double>(pos0 + t) *
                   pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(D));
        double sn, cs;
        sincos(a, &sn, &cs);
        float c = static_cast<float>(cs), s = static_cast<float>(sign * sn);
        const float* x = inp + row * D;
        float* y = out + row * D;
        float x1 = x[i], x2 = x[i + half];
        float r1 = x1 * c - x2 * s, r2 = x2 * c + x1 * s;
        if (accumulate) {
            y[i] += r1;
            y[i + half] += r2;
        } else {
            y[i] = r1;
            y[i + half] = r2;
        }
    }
}

} // namespace

std::string rmsnorm_forward(const float* inp, const float* weight, int64_t N, int64_t C, float eps,
                            float* out, float* rstd) {
    if (N == 0) return {};
    rmsnorm_forward_kernel<<<static_cast<unsigned>(N), 256>>>(inp, weight, C, eps, out, rstd);
    DIST_LAUNCHED();
    return {};
}

std::string rmsnorm_backward_input(const float* dout, const float* inp, const float* weight,
                                   const float* rstd, int64_t N, int64_t C, float* dinp) {
    if (N == 0) return {};
    rmsnorm_backward_input_kernel<<<static_cast<unsigned>(N), 256>>>(dout, inp, weight, rstd, C,
                                                                     dinp);
    DIST_LAUNCHED();
    return {};
}

std::string rmsnorm_backward_weight(const float* dout, const float* inp, const float* rstd,
                                    int64_t N, int64_t C, float* dweight) {
    if (C == 0) return {};
    dim3 block(32, weight_rows);
    rmsnorm_backward_weight_kernel<<<static_cast<unsigned>((C + 31) / 32), block>>>(dout, inp, rstd,
                                                                                    N, C, dweight);
    DIST_LAUNCHED();
    return {};
}

std::string swiglu_forward(const float* inp, int64_t N, int64_t H, float* out) {
    swiglu_forward_kernel<<<blocks_for(N * H, 256), 256>>>(inp, N, H, out);
    DIST_LAUNCHED();
    return {};
}

std::string swiglu_backward(const float* inp, const float* dout, int64_t N, int64_t H,
                            float* dinp) {
    swiglu_backward_kernel<<<blocks_for(N * H, 256), 256>>>(inp, dout, N, H, dinp);
    DIST_LAUNCHED();
    return {};
}

std::string rope_forward(const float* inp, int64_t B, int64_t T, int64_t H, int64_t D, double theta,
                         int64_t pos0, float* out) {
    rope_kernel<<<blocks_for(B * T * H * (D / 2), 256), 256>>>(inp, B, T, H, D, theta, pos0, 1.0,
                                                               false, out);
    DIST_LAUNCHED();
    return {};
}

std::string rope_backward(const float* dout, int64_t B, int64_t T, int64_t H, int64_t D,
                          double theta, int64_t pos0, float* dinp) {
    rope_kernel<<<blocks_for(B * T * H * (D / 2), 256), 256>>>(dout, B, T, H, D, theta, pos0, -1.0,
                                                               true, dinp);
    DIST_LAUNCHED();
    return {};
}

} // namespace dist::kernels::cuda
