// ops.cu: CUDA versions of the CPU ops of GPT-2 and of training: matmul in float (cuBLAS),
// layer norm, GELU, embeddings, cross-entropy, AdamW and the gradient-norm helpers. One thread
// block per row for the row-wise ops (norms, cross-entropy), a grid-stride loop for element-wise
// ones. Llama's ops are in ops_llama.cu, attention in attention.cu, bf16 matmul in
// matmul_bf16.cu.
#include "kernels/cuda/ops.hpp"

#include "kernels/cuda/common.cuh"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <string>

namespace dist::kernels::cuda {

namespace {

using detail::block_max;
using detail::block_sum;
using detail::blocks_for;

// The cuBLAS handle of the calling thread's current device (a handle belongs to the device
// that was current when it was made), created on first use.
std::string handle(cublasHandle_t* out) {
    static std::mutex mutex;
    static std::map<int, cublasHandle_t> handles;
    int device = 0;
    DIST_CUDA(cudaGetDevice(&device));
    std::lock_guard lock(mutex);
    cublasHandle_t& h = handles[device];
    if (!h) {
        if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) {
            h = nullptr;
            return "cannot create a cuBLAS handle on cuda:" + std::to_string(device);
        }
        cublasSetMathMode(h, CUBLAS_DEFAULT_MATH); // no TF32: float results
    }
    *out = h;
    return {};
}

__global__ void add_bias(float* out, const float* bias, int64_t N, int64_t OC) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < N * OC;
         i += int64_t(gridDim.x) * blockDim.x)
        out[i] += bias[i % OC];
}

__global__ void bias_grad(const float* dout, int64_t N, int64_t OC, float* dbias) {
    for (int64_t o = blockIdx.x; o < OC; o += gridDim.x) {
        float s = 0.0f;
        for (int64_t n = threadIdx.x; n < N; n += blockDim.x) s += dout[n * OC + o];
        s = block_sum(s);
        if (threadIdx.x == 0) dbias[o] += s;
    }
}

__global__ void layernorm_forward_kernel(const float* inp, const float* w, const float* b,
                                         int64_t C, float eps, float* out, float* mean,
                                         float* rstd) {
    const float* x = inp + blockIdx.x * C;
    float s = 0.0f;
    for (int64_t i = threadIdx.x; i < C; i += blockDim.x) s += x[i];
    float m = block_sum(s) / C;
    float v = 0.0f;
    for (int64_t i = threadIdx.x; i < C; i += blockDim.x) v += (x[i] - m) * (x[i] - m);
    float r = rsqrtf(block_sum(v) / C + eps);
    float* y = out + blockIdx.x * C;
    for (int64_t i = threadIdx.x; i < C; i += blockDim.x)
        y[i] = (x[i] - m) * r * w[i] + (b ? b[i] : 0.0f);
    if (threadIdx.x == 0) {
        mean[blockIdx.x] = m;
        rstd[blockIdx.x] = r;
    }
}

__global__ void layernorm_backward_input_kernel(const float* dout, const float* inp, const float* w,
                                                const float* mean, const float* rstd, int64_t C,
                                                float* dinp) {
    const float* dy = dout + blockIdx.x * C;
    const float* x = inp + blockIdx.x * C;
    float m = mean[blockIdx.x], r = rstd[blockIdx.x];
    float sg = 0.0f, sgx = 0.0f;
    for (int64_t i = threadIdx.x; i < C; i += blockDim.x) {
        float g = dy[i] * w[i];
        sg += g;
        sgx += g * (x[i] - m) * r;
    }
    float mg = block_sum(sg) / C, mgx = block_sum(sgx) / C;
    float* dx = dinp + blockIdx.x * C;
    for (int64_t i = threadIdx.x; i < C; i += blockDim.x)
        dx[i] += r * (dy[i] * w[i] - mg - (x[i] - m) * r * mgx);
}

__global__ void layernorm_backward_weight_kernel(const float* dout, const float* inp,
                                                 const float* mean, const float* rstd, int64_t N,
                                                 int64_t C, float* dw, float* db) {
    for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < C;
         c += int64_t(gridDim.x) * blockDim.x) {
        float sw = 0.0f, sb = 0.0f;
        for (int64_t n = 0; n < N; ++n) {
            float g = dout[n * C + c];
            sw += g * (inp[n * C + c] - mean[n]) * rstd[n];
            sb += g;
        }
        dw[c] += sw;
        if (db) db[c] += sb;
    }
}

constexpr float gelu_scale = 0.7978845608028654f;

__global__ void gelu_forward_kernel(const float* x, int64_t n, float* y) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
         i += int64_t(gridDim.x) * blockDim.x) {
        float v = x[i];
        y[i] = 0.5f * v * (1.0f + tanhf(gelu_scale * (v + 0.044715f * v * v * v)));
    }
}

__global__ void gelu_backward_kernel(const float* x, const float* dy, int64_t n, float* dx) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
         i += int64_t(gridDim.x) * blockDim.x) {
        float v = x[i];
        float th = tanhf(gelu_scale * (v + 0.044715f * v * v * v));
        float du = gelu_scale * (1.0f + 3.0f * 0.044715f * v * v);
        dx[i] += dy[i] * (0.5f * (1.0f + th) + 0.5f * v * (1.0f - th * th) * du);
    }
}

__global__ void embedding_forward_kernel(const int32_t* tok, const float* table, int64_t N,
                                         int64_t C, float* out) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < N * C;
         i += int64_t(gridDim.x) * blockDim.x)
        out[i] = table[tok[i / C] * C + i % C];
}

__global__ void embedding_backward_kernel(const int32_t* tok, const float* dout, int64_t N,
                                          int64_t C, float* dtable) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < N * C;
         i += int64_t(gridDim.x) * blockDim.x)
        atomicAdd(dtable + tok[i / C] * C + i % C, dout[i]);
}

__global__ void positions_forward_kernel(const float* wpe, int64_t B, int64_t T, int64_t C,
                                         float* out) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < B * T * C;
         i += int64_t(gridDim.x) * blockDim.x)
        out[i] += wpe[i % (T * C)];
}

// One thread per (t, c): it sums the B rows itself, so no two threads write one element.
__global__ void positions_backward_kernel(const float* dout, int64_t B, int64_t T, int64_t C,
                                          float* dwpe) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < T * C;
         i += int64_t(gridDim.x) * blockDim.x) {
        float s = 0.0f;
        for (int64_t b = 0; b < B; ++b) s += dout[b * T * C + i];
        dwpe[i] += s;
    }
}

__global__ void cross_entropy_forward_kernel(const float* logits, const int32_t* targets, int64_t V,
                                             float* losses, float* lse) {
    const float* z = logits + blockIdx.x * V;
    float mx = -INFINITY;
    for (int64_t i = threadIdx.x; i < V; i += blockDim.x) mx = fmaxf(mx, z[i]);
    mx = block_max(mx);
    float s = 0.0f;
    for (int64_t i = threadIdx.x; i < V; i += blockDim.x) s += expf(z[i] - mx);
    s = block_sum(s);
    if (threadIdx.x == 0) {
        float l = mx + logf(s);
        lse[blockIdx.x] = l;
        losses[blockIdx.x] = l - z[targets[blockIdx.x]];
    }
}

__global__ void cross_entropy_backward_kernel(const float* logits, const int32_t* targets,
                                              const float* lse, const float* dlosses, int64_t V,
                                              float* dlogits) {
    const float* z = logits + blockIdx.x * V;
    float* dz = dlogits + blockIdx.x * V;
    float g = dlosses[blockIdx.x], l = lse[blockIdx.x];
    int32_t t = targets[blockIdx.x];
    for (int64_t i = threadIdx.x; i < V; i += blockDim.x)
        dz[i] = (expf(z[i] - l) - (i == t ? 1.0f : 0.0f)) * g;
}

__global__ void adamw_kernel(const float* g, int64_t n, float lr, float b1, float b2, float eps,
                             float wd, float corr1, float corr2, float* p, float* m, float* v) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
         i += int64_t(gridDim.x) * blockDim.x) {
        float mi = b1 * m[i] + (1.0f - b1) * g[i];
        float vi = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
        m[i] = mi;
        v[i] = vi;
        p[i] -= lr * ((mi / corr1) / (sqrtf(vi / corr2) + eps) + wd * p[i]);
    }
}

// Squares summed in double per thread and per block; one atomic add per block into the
// caller's accumulator (the order of those adds varies: the last bits of the double may too).
__global__ void sum_squares_kernel(const float* x, int64_t n, double* sum) {
    double s = 0.0;
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
         i += int64_t(gridDim.x) * blockDim.x)
        s += static_cast<double>(x[i]) * x[i];
    s = block_sum(s);
    if (threadIdx.x == 0) atomicAdd(sum, s);
}

__global__ void scale_kernel(float* x, int64_t n, float s) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
         i += int64_t(gridDim.x) * blockDim.x)
        x[i] *= s;
}

// The factor is computed in double and rounded once, as the CPU trainer's max_norm / norm.
__global__ void clip_kernel(const double* sum_sq, double max_norm, int64_t n, float* x) {
    double norm = sqrt(*sum_sq);
    if (!(norm > max_norm)) return;
    float s = static_cast<float>(max_norm / norm);
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
         i += int64_t(gridDim.x) * blockDim.x)
        x[i] *= s;
}

} // namespace

int device_count() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); // clear the sticky "no device" error
        return 0;
    }
    return n;
}

std::string malloc_device(size_t bytes, void** ptr) {
    DIST_CUDA(cudaMalloc(ptr, bytes));
    return {};
}
void free_device(void* ptr) {
    cudaFree(ptr);
}
std::string copy_to_device(const void* host, size_t bytes, void* device) {
    DIST_CUDA(cudaMemcpy(device, host, bytes, cudaMemcpyHostToDevice));
    return {};
}
std::string copy_to_host(const void* device, size_t bytes, void* host) {
    DIST_CUDA(cudaMemcpy(host, device, bytes, cudaMemcpyDeviceToHost));
    return {};
}
std::string pci_bus_id(int index, std::string& out) {
    char id[64] = {};
    DIST_CUDA(cudaDeviceGetPCIBusId(id, sizeof id, index));
    out = id;
    return {};
}

std::string device_model(int index, std::string& name, int64_t& bytes) {
    cudaDeviceProp prop{};
    DIST_CUDA(cudaGetDeviceProperties(&prop, index));
    name = prop.name;
    bytes = static_cast<int64_t>(prop.totalGlobalMem);
    return {};
}

std::string set_device(int index) {
    DIST_CUDA(cudaSetDevice(index));
    return {};
}

std::string synchronize_default_stream() {
    DIST_CUDA(cudaStreamSynchronize(cudaStreamLegacy));
    return {};
}

std::string synchronize() {
    DIST_CUDA(cudaDeviceSynchronize());
    return {};
}

// cuBLAS is column-major: a row-major (r, c) matrix is a column-major (c, r) one, so each
// row-major product below is computed as its transpose.
std::string matmul_forward(const float* inp, const float* weight, const float* bias, int64_t N,
                           int64_t C, int64_t OC, float* out) {
    cublasHandle_t h;
    if (std::string e = handle(&h); !e.empty()) return e;
    const float one = 1.0f, zero = 0.0f;
    // out^T (OC,N) = weight (OC,C) . inp^T (C,N)
    DIST_CUBLAS(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, int(OC), int(N), int(C), &one, weight,
                            int(C), inp, int(C), &zero, out, int(OC)));
    if (bias) {
        add_bias<<<blocks_for(N * OC, 256), 256>>>(out, bias, N, OC);
        DIST_LAUNCHED();
    }
    return {};
}

std::string matmul_backward_input(const float* dout, const float* weight, int64_t N, int64_t C,
                                  int64_t OC, float* dinp) {
    cublasHandle_t h;
    if (std::string e = handle(&h); !e.empty()) return e;
    const float one = 1.0f;
    // dinp^T (C,N) += weight^T (C,OC) . dout^T (OC,N)
    DIST_CUBLAS(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, int(C), int(N), int(OC), &one, weight,
                            int(C), dout, int(OC), &one, dinp, int(C)));
    return {};
}

std::string matmul_backward_weight(const float* dout, const float* inp, int64_t N, int64_t C,
                                   int64_t OC, float* dweight, float* dbias) {
    cublasHandle_t h;
    if (std::string e = handle(&h); !e.empty()) return e;
    const float one = 1.0f;
    // dweight^T (C,OC) += inp^T (C,N) . dout (N,OC)
    DIST_CUBLAS(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, int(C), int(OC), int(N), &one, inp, int(C),
                            dout, int(OC), &one, dweight, int(C)));
    if (dbias && OC > 0) {
        bias_grad<<<static_cast<int>(OC < 4096 ? OC : 4096), 256>>>(dout, N, OC, dbias);
        DIST_LAUNCHED();
    }
    return {};
}

std::string layernorm_forward(const float* inp, const float* weight, const float* bias, int64_t N,
                              int64_t C, float eps, float* out, float* mean, float* rstd) {
    if (N == 0) return {}; // one block a row: a grid of none is an error
    layernorm_forward_kernel<<<int(N), 256>>>(inp, weight, bias, C, eps, out, mean, rstd);
    DIST_LAUNCHED();
    return {};
}

std::string layernorm_backward_input(const float* dout, const float* inp, const float* weight,
                                     const float* mean, const float* rstd, int64_t N, int64_t C,
                                     float* dinp) {
    if (N == 0) return {};
    layernorm_backward_input_kernel<<<int(N), 256>>>(dout, inp, weight, mean, rstd, C, dinp);
    DIST_LAUNCHED();
    return {};
}

std::string layernorm_backward_weight(const float* dout, const float* inp, const float* mean,
                                      const float* rstd, int64_t N, int64_t C, float* dweight,
                                      float* dbias) {
    layernorm_backward_weight_kernel<<<blocks_for(C, 256), 256>>>(dout, inp, mean, rstd, N, C,
                                                                  dweight, dbias);
    DIST_LAUNCHED();
    return {};
}

std::string gelu_forward(const float* inp, int64_t n, float* out) {
    gelu_forward_kernel<<<blocks_for(n, 256), 256>>>(inp, n, out);
    DIST_LAUNCHED();
    return {};
}

std::string gelu_backward(const float* inp, const float* dout, int64_t n, float* dinp) {
    gelu_backward_kernel<<<blocks_for(n, 256), 256>>>(inp, dout, n, dinp);
    DIST_LAUNCHED();
    return {};
}

std::string embedding_forward(const int32_t* tokens, const float* table, int64_t N, int64_t C,
                              float* out) {
    embedding_forward_kernel<<<blocks_for(N * C, 256), 256>>>(tokens, table, N, C, out);
    DIST_LAUNCHED();
    return {};
}

std::string embedding_backward(const int32_t* tokens, const float* dout, int64_t N, int64_t C,
                               float* dtable) {
    embedding_backward_kernel<<<blocks_for(N * C, 256), 256>>>(tokens, dout, N, C, dtable);
    DIST_LAUNCHED();
    return {};
}

std::string positions_forward(const float* wpe, int64_t B, int64_t T, int64_t C, float* out) {
    positions_forward_kernel<<<blocks_for(B * T * C, 256), 256>>>(wpe, B, T, C, out);
    DIST_LAUNCHED();
    return {};
}

std::string positions_backward(const float* dout, int64_t B, int64_t T, int64_t C, float* dwpe) {
    positions_backward_kernel<<<blocks_for(T * C, 256), 256>>>(dout, B, T, C, dwpe);
    DIST_LAUNCHED();
    return {};
}

std::string cross_entropy_forward(const float* logits, const int32_t* targets, int64_t N, int64_t V,
                                  float* losses, float* lse) {
    if (N == 0) return {};
    cross_entropy_forward_kernel<<<int(N), 256>>>(logits, targets, V, losses, lse);
    DIST_LAUNCHED();
    return {};
}

std::string cross_entropy_backward(const float* logits, const int32_t* targets, const float* lse,
                                   const float* dlosses, int64_t N, int64_t V, float* dlogits) {
    if (N == 0) return {};
    cross_entropy_backward_kernel<<<int(N), 256>>>(logits, targets, lse, dlosses, V, dlogits);
    DIST_LAUNCHED();
    return {};
}

std::string adamw_step(const float* grads, int64_t n, float lr, double beta1, double beta2,
                       float eps, float weight_decay, int64_t step, float* params, float* m,
                       float* v) {
    if (n == 0) return {};
    const auto corr1 = static_cast<float>(1.0 - std::pow(beta1, static_cast<double>(step)));
    const auto corr2 = static_cast<float>(1.0 - std::pow(beta2, static_cast<double>(step)));
    adamw_kernel<<<blocks_for(n, 256), 256>>>(grads, n, lr, static_cast<float>(beta1),
                                              static_cast<float>(beta2), eps, weight_decay, corr1,
                                              corr2, params, m, v);
    DIST_LAUNCHED();
    return {};
}

std::string sum_squares(const float* x, int64_t n, double* sum) {
    const int blocks = std::min(blocks_for(n, 256), 1024); // few atomics, enough to fill the GPU
    sum_squares_kernel<<<blocks, 256>>>(x, n, sum);
    DIST_LAUNCHED();
    return {};
}

std::string scale(float* x, int64_t n, double s) {
    scale_kernel<<<blocks_for(n, 256), 256>>>(x, n, static_cast<float>(s));
    DIST_LAUNCHED();
    return {};
}

std::string clip_by_norm(const double* sum_sq, double max_norm, int64_t n, float* x) {
    clip_kernel<<<blocks_for(n, 256), 256>>>(sum_sq, max_norm, n, x);
    DIST_LAUNCHED();
    return {};
}

} // namespace dist::kernels::cuda
