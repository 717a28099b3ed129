// matmul_bf16.cu: the three matmuls of a linear layer with bf16 operands and float
// accumulation, through cuBLASLt (CUBLAS_COMPUTE_32F, tensor cores on sm_80 and later), plus the
// float <-> bf16 conversions that produce the operands.
//
// Outputs are float (C and D of cuBLASLt in CUDA_R_32F): the forward's output feeds float ops,
// and the backward's gradients add into float accumulators across microbatches, which bf16
// would round away. As in ops.cu, each row-major product is computed as its column-major
// transpose. One cuBLASLt handle and one 32 MiB workspace for the process, made on first use
// on the device current then. Where cuBLASLt's heuristic offers no kernel (odd shapes), the
// product goes through cublasGemmEx with the same types instead.
#include "kernels/cuda/ops.hpp"

#include "kernels/bf16_bits.hpp"
#include "kernels/cuda/common.cuh"

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <mutex>
#include <string>

namespace dist::kernels::cuda {

namespace {

using detail::blocks_for;

struct LtState {
    cublasLtHandle_t handle = nullptr;
    cublasHandle_t fallback = nullptr; // cublasGemmEx, for shapes cuBLASLt finds no kernel for
    void* workspace = nullptr;
    size_t workspace_bytes = size_t(32) << 20;
    std::string error;
};

std::string lt_state(LtState** out) {
    static LtState state;
    static std::once_flag once;
    std::call_once(once, [] {
        state.error = [&]() -> std::string {
            DIST_CUBLAS(cublasLtCreate(&state.handle));
            DIST_CUBLAS(cublasCreate(&state.fallback));
            DIST_CUDA(cudaMalloc(&state.workspace, state.workspace_bytes));
            return {};
        }();
    });
    *out = &state;
    return state.error;
}

// Descriptors freed on every path out of lt_gemm, errors included.
struct MatmulDesc {
    cublasLtMatmulDesc_t d = nullptr;
    ~MatmulDesc() {
        if (d) cublasLtMatmulDescDestroy(d);
    }
};
struct Layout {
    cublasLtMatrixLayout_t d = nullptr;
    ~Layout() {
        if (d) cublasLtMatrixLayoutDestroy(d);
    }
};
struct Preference {
    cublasLtMatmulPreference_t d = nullptr;
    ~Preference() {
        if (d) cublasLtMatmulPreferenceDestroy(d);
    }
};

// The largest power of two (at most 256) dividing the address: cuBLASLt assumes 256-byte
// aligned buffers unless told otherwise, and a view into a larger tensor may not be.
uint32_t alignment(const void* p) {
    auto a = reinterpret_cast<uintptr_t>(p);
    uint32_t align = 256;
    while (align > 1 && a % align != 0) align /= 2;
    return align;
}

// Column-major d (m,n) = op(a) (m,k) . op(b) (k,n) + beta * d; a, b bf16, d float.
std::string lt_gemm(cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k,
                    const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, float beta,
                    float* d, int64_t ldd) {
    if (m == 0 || n == 0) return {};
    if (k == 0) { // an empty sum: d = beta * d, and beta is 0 or 1 here
        if (beta == 0.0f) DIST_CUDA(cudaMemset2D(d, ldd * sizeof(float), 0, m * sizeof(float), n));
        return {};
    }
    LtState* lt = nullptr;
    if (std::string e = lt_state(&lt); !e.empty()) return e;

    MatmulDesc op;
    DIST_CUBLAS(cublasLtMatmulDescCreate(&op.d, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    DIST_CUBLAS(cublasLtMatmulDescSetAttribute(op.d, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    DIST_CUBLAS(cublasLtMatmulDescSetAttribute(op.d, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    // Layouts describe the matrices as stored: op(a) is (m,k), so a stored transposed is (k,m).
    Layout la, lb, ld;
    const bool na = ta == CUBLAS_OP_N, nb = tb == CUBLAS_OP_N;
    DIST_CUBLAS(cublasLtMatrixLayoutCreate(&la.d, CUDA_R_16BF, na ? m : k, na ? k : m, lda));
    DIST_CUBLAS(cublasLtMatrixLayoutCreate(&lb.d, CUDA_R_16BF, nb ? k : n, nb ? n : k, ldb));
    DIST_CUBLAS(cublasLtMatrixLayoutCreate(&ld.d, CUDA_R_32F, m, n, ldd));

    Preference pref;
    DIST_CUBLAS(cublasLtMatmulPreferenceCreate(&pref.d));
    const uint64_t ws = lt->workspace_bytes;
    DIST_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
        pref.d, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    const uint32_t align_a = alignment(a), align_b = alignment(b), align_d = alignment(d);
    DIST_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
        pref.d, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof(align_a)));
    DIST_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
        pref.d, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof(align_b)));
    DIST_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
        pref.d, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_d, sizeof(align_d)));
    DIST_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
        pref.d, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d, sizeof(align_d)));

    cublasLtMatmulHeuristicResult_t result = {};
    int found = 0;
    const cublasStatus_t heuristic = cublasLtMatmulAlgoGetHeuristic(
        lt->handle, op.d, la.d, lb.d, ld.d, ld.d, pref.d, 1, &result, &found);
    if (heuristic == CUBLAS_STATUS_NOT_SUPPORTED)
        found = 0; // no kernel: the fallback below
    else if (heuristic != CUBLAS_STATUS_SUCCESS)
        return detail::where(__FILE__, __LINE__) +
               "cublasLtMatmulAlgoGetHeuristic: " + cublasGetStatusString(heuristic);
    const float alpha = 1.0f;
    if (found == 0 || result.state != CUBLAS_STATUS_SUCCESS) {
        // No cuBLASLt kernel for these sizes or alignments (odd leading dimensions defeat the
        // vector loads): cublasGemmEx computes the same product, bf16 in, float accumulation.
        DIST_CUBLAS(cublasGemmEx(lt->fallback, ta, tb, static_cast<int>(m), static_cast<int>(n),
                                 static_cast<int>(k), &alpha, a, CUDA_R_16BF, static_cast<int>(lda),
                                 b, CUDA_R_16BF, static_cast<int>(ldb), &beta, d, CUDA_R_32F,
                                 static_cast<int>(ldd), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        return {};
    }
    DIST_CUBLAS(cublasLtMatmul(lt->handle, op.d, &alpha, a, la.d, b, lb.d, &beta, d, ld.d, d, ld.d,
                               &result.algo, lt->workspace, lt->workspace_bytes, nullptr));
    return {};
}

__global__ void to_bf16_kernel(const float* x, int64_t n, uint16_t* out) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
         i += int64_t(gridDim.x) * blockDim.x)
        out[i] = static_cast<uint16_t>(bf16_bits(__float_as_uint(x[i])) >> 16);
}

__global__ void from_bf16_kernel(const uint16_t* x, int64_t n, float* out) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
         i += int64_t(gridDim.x) * blockDim.x)
        out[i] = __bfloat162float(__ushort_as_bfloat16(x[i]));
}

__global__ void round_bf16_kernel(float* x, int64_t n) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
         i += int64_t(gridDim.x) * blockDim.x)
        x[i] = __uint_as_float(bf16_bits(__float_as_uint(x[i])));
}

__global__ void add_bias_kernel(float* out, const float* bias, int64_t N, int64_t OC) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < N * OC;
         i += int64_t(gridDim.x) * blockDim.x)
        out[i] += bias[i % OC];
}

// Column sums of dout (N,OC): a block owns 32 columns (threadIdx.x, coalesced reads) and
// splits the rows over threadIdx.y; the 8 partial sums meet in shared memory (no atomics).
constexpr int bias_rows = 8;

__global__ void bias_grad_kernel(const uint16_t* dout, int64_t N, int64_t OC, float* dbias) {
    __shared__ float partial[bias_rows][33];
    int64_t o = blockIdx.x * int64_t(32) + threadIdx.x;
    float s = 0.0f;
    if (o < OC)
        for (int64_t n = threadIdx.y; n < N; n += bias_rows)
            s += __bfloat162float(__ushort_as_bfloat16(dout[n * OC + o]));
    partial[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && o < OC) {
        float t = 0.0f;
        for (int r = 0; r < bias_rows; ++r) t += partial[r][threadIdx.x];
        dbias[o] += t;
    }
}

} // namespace

std::string to_bf16(const float* x, int64_t n, uint16_t* out) {
    to_bf16_kernel<<<blocks_for(n, 256), 256>>>(x, n, out);
    DIST_LAUNCHED();
    return {};
}

std::string from_bf16(const uint16_t* x, int64_t n, float* out) {
    from_bf16_kernel<<<blocks_for(n, 256), 256>>>(x, n, out);
    DIST_LAUNCHED();
    return {};
}

std::string round_bf16(float* x, int64_t n) {
    round_bf16_kernel<<<blocks_for(n, 256), 256>>>(x, n);
    DIST_LAUNCHED();
    return {};
}

std::string matmul_forward_bf16(const uint16_t* inp, const uint16_t* weight, const float* bias,
                                int64_t N, int64_t C, int64_t OC, float* out) {
    // out^T (OC,N) = weight (OC,C) . inp^T (C,N)
    if (std::string e =
            lt_gemm(CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, weight, C, inp, C, 0.0f, out, OC);
        !e.empty())
        return e;
    if (bias && N * OC > 0) {
        add_bias_kernel<<<blocks_for(N * OC, 256), 256>>>(out, bias, N, OC);
        DIST_LAUNCHED();
    }
    return {};
}

std::string matmul_backward_input_bf16(const uint16_t* dout, const uint16_t* weight, int64_t N,
                                       int64_t C, int64_t OC, float* dinp) {
    // dinp^T (C,N) += weight^T (C,OC) . dout^T (OC,N)
    return lt_gemm(CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, weight, C, dout, OC, 1.0f, dinp, C);
}

std::string matmul_backward_weight_bf16(const uint16_t* dout, const uint16_t* inp, int64_t N,
                                        int64_t C, int64_t OC, float* dweight, float* dbias) {
    // dweight^T (C,OC) += inp^T (C,N) . dout (N,OC)
    if (std::string e =
            lt_gemm(CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, inp, C, dout, OC, 1.0f, dweight, C);
        !e.empty())
        return e;
    if (dbias && OC > 0) {
        dim3 block(32, bias_rows);
        bias_grad_kernel<<<static_cast<unsigned>((OC + 31) / 32), block>>>(dout, N, OC, dbias);
        DIST_LAUNCHED();
    }
    return {};
}

} // namespace dist::kernels::cuda
