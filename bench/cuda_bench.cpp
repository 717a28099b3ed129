// cuda_bench.cpp: the CUDA kernels on one GPU, in TFLOP/s: the matmuls of a GPT-2 124M block in
// float (cuBLAS, no TF32) and in bf16 (cuBLASLt, float accumulation), and causal attention at
// GPT-2's head shape. Each iteration ends with a device synchronisation, so the times are the
// kernels' own plus one launch latency. Prints a line and exits where no GPU is visible.
#include "kernels/cuda/ops.hpp"

#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

namespace gpu = dist::kernels::cuda;

namespace {

constexpr int64_t N = 8 * 1024; // B*T rows for the matmuls

// A device buffer of n elements of T, filled with normal(0, 1) values (floats) or zeros.
template <typename T> struct Buffer {
    T* ptr = nullptr;
    std::string error;
    explicit Buffer(int64_t n) {
        void* p = nullptr;
        error = gpu::malloc_device(static_cast<size_t>(n) * sizeof(T), &p);
        ptr = static_cast<T*>(p);
        if (!error.empty()) return;
        std::vector<T> host(static_cast<size_t>(n));
        if constexpr (std::is_same_v<T, float>) {
            std::mt19937 rng(1);
            std::normal_distribution<float> d(0.0f, 1.0f);
            for (auto& x : host) x = d(rng);
        }
        error = gpu::copy_to_device(host.data(), host.size() * sizeof(T), ptr);
    }
    ~Buffer() { gpu::free_device(ptr); }
};

// Stops the benchmark with the op's error; true when there was one.
bool failed(benchmark::State& state, const std::string& e) {
    if (e.empty()) return false;
    state.SkipWithError(e.c_str());
    return true;
}

void tflops(benchmark::State& state, double per_iteration) {
    state.counters["TFLOP/s"] =
        benchmark::Counter(per_iteration * 1e-12, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_cuda_matmul_f32(benchmark::State& state) {
    int64_t C = state.range(0), OC = state.range(1);
    Buffer<float> x(N * C), w(OC * C), b(OC), y(N * OC);
    if (failed(state, x.error + w.error + b.error + y.error)) return;
    for (auto _ : state)
        if (failed(state,
                   gpu::matmul_forward(x.ptr, w.ptr, b.ptr, N, C, OC, y.ptr) + gpu::synchronize()))
            return;
    tflops(state, 2.0 * N * C * OC);
}

void BM_cuda_matmul_bf16(benchmark::State& state) {
    int64_t C = state.range(0), OC = state.range(1);
    Buffer<uint16_t> x(N * C), w(OC * C);
    Buffer<float> b(OC), y(N * OC);
    if (failed(state, x.error + w.error + b.error + y.error)) return;
    for (auto _ : state)
        if (failed(state, gpu::matmul_forward_bf16(x.ptr, w.ptr, b.ptr, N, C, OC, y.ptr) +
                              gpu::synchronize()))
            return;
    tflops(state, 2.0 * N * C * OC);
}

void BM_cuda_matmul_bf16_backward(benchmark::State& state) {
    int64_t C = state.range(0), OC = state.range(1);
    Buffer<uint16_t> x(N * C), w(OC * C), dy(N * OC);
    Buffer<float> dx(N * C), dw(OC * C), db(OC);
    if (failed(state, x.error + w.error + dy.error + dx.error + dw.error + db.error)) return;
    for (auto _ : state)
        if (failed(state,
                   gpu::matmul_backward_input_bf16(dy.ptr, w.ptr, N, C, OC, dx.ptr) +
                       gpu::matmul_backward_weight_bf16(dy.ptr, x.ptr, N, C, OC, dw.ptr, db.ptr) +
                       gpu::synchronize()))
            return;
    tflops(state, 4.0 * N * C * OC);
}

// GPT-2 124M attention: B=8, T=1024, 12 heads of 64. Causal: half the (T,T) scores count.
constexpr int64_t AB = 8, AT = 1024, AH = 12, AD = 64;
constexpr double attention_flops = 4.0 * AB * AH * AT * AT * AD / 2; // QK^T and PV

void BM_cuda_attention_forward(benchmark::State& state) {
    Buffer<float> q(AB * AT * AH * AD), k(AB * AT * AH * AD), v(AB * AT * AH * AD),
        out(AB * AT * AH * AD), lse(AB * AH * AT);
    if (failed(state, q.error + k.error + v.error + out.error + lse.error)) return;
    for (auto _ : state)
        if (failed(state, gpu::attention_forward(q.ptr, k.ptr, v.ptr, AB, AT, AH, AH, AD, out.ptr,
                                                 lse.ptr) +
                              gpu::synchronize()))
            return;
    tflops(state, attention_flops);
}

void BM_cuda_attention_backward(benchmark::State& state) {
    const int64_t n = AB * AT * AH * AD;
    Buffer<float> q(n), k(n), v(n), out(n), lse(AB * AH * AT), dy(n), dq(n), dk(n), dv(n);
    if (failed(state, q.error + k.error + v.error + out.error + lse.error + dy.error + dq.error +
                          dk.error + dv.error))
        return;
    if (failed(state,
               gpu::attention_forward(q.ptr, k.ptr, v.ptr, AB, AT, AH, AH, AD, out.ptr, lse.ptr)))
        return;
    for (auto _ : state)
        if (failed(state, gpu::attention_backward(dy.ptr, q.ptr, k.ptr, v.ptr, out.ptr, lse.ptr, AB,
                                                  AT, AH, AH, AD, dq.ptr, dk.ptr, dv.ptr) +
                              gpu::synchronize()))
            return;
    tflops(state, 2.5 * attention_flops); // recomputed scores, dP, dQ, dK, dV
}

// The matmul shapes of a GPT-2 124M block: qkv, MLP up, MLP down.
void shapes(benchmark::internal::Benchmark* b) {
    b->Args({768, 2304})->Args({768, 3072})->Args({3072, 768});
    b->Unit(benchmark::kMillisecond)->UseRealTime();
}

} // namespace

BENCHMARK(BM_cuda_matmul_f32)->Apply(shapes);
BENCHMARK(BM_cuda_matmul_bf16)->Apply(shapes);
BENCHMARK(BM_cuda_matmul_bf16_backward)->Apply(shapes);
BENCHMARK(BM_cuda_attention_forward)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_cuda_attention_backward)->Unit(benchmark::kMillisecond)->UseRealTime();

int main(int argc, char** argv) {
    if (gpu::device_count() == 0) {
        std::puts("cuda_bench: no GPU visible, nothing measured");
        return 0;
    }
    benchmark::Initialize(&argc, argv);
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}
