// kernels_bench.cpp: the CPU kernels at GPT-2 124M shapes (B=4, T=256, C=768), in GFLOP/s,
// beside the ceiling: one plain OpenBLAS sgemm of the same size with its own threads.
#include "kernels/cpu/ops.hpp"

#include <benchmark/benchmark.h>
#include <cblas.h>

#include <omp.h>

#include <random>
#include <vector>

namespace ops = dist::kernels::cpu;

namespace {

std::vector<float> random_floats(size_t n) {
    std::mt19937 rng(1);
    std::normal_distribution<float> d(0.0f, 1.0f);
    std::vector<float> v(n);
    for (auto& x : v) x = d(rng);
    return v;
}

constexpr int64_t N = 4 * 256; // B*T

void flops(benchmark::State& state, double per_iteration) {
    state.counters["GFLOP/s"] =
        benchmark::Counter(per_iteration * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

// The reference: OpenBLAS as it comes, multi-threaded, no bias.
void BM_blas_ceiling(benchmark::State& state) {
    int64_t C = state.range(0), OC = state.range(1);
    auto x = random_floats(N * C), w = random_floats(OC * C);
    std::vector<float> y(N * OC);
    openblas_set_num_threads(2);
    for (auto _ : state)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, x.data(), C, w.data(),
                    C, 0.0f, y.data(), OC);
    flops(state, 2.0 * N * C * OC);
}

void BM_matmul_forward(benchmark::State& state) {
    int64_t C = state.range(0), OC = state.range(1);
    auto x = random_floats(N * C), w = random_floats(OC * C), b = random_floats(OC);
    std::vector<float> y(N * OC);
    for (auto _ : state) ops::matmul_forward(x.data(), w.data(), b.data(), N, C, OC, y.data());
    flops(state, 2.0 * N * C * OC);
}

void BM_matmul_backward(benchmark::State& state) {
    int64_t C = state.range(0), OC = state.range(1);
    auto x = random_floats(N * C), w = random_floats(OC * C), dy = random_floats(N * OC);
    std::vector<float> dx(N * C), dw(OC * C), db(OC);
    for (auto _ : state) {
        ops::matmul_backward_input(dy.data(), w.data(), N, C, OC, dx.data());
        ops::matmul_backward_weight(dy.data(), x.data(), N, C, OC, dw.data(), db.data());
    }
    flops(state, 4.0 * N * C * OC);
}

void BM_attention_forward(benchmark::State& state) {
    const int64_t B = 4, T = 256, H = 12, D = 64;
    auto q = random_floats(B * T * H * D), k = random_floats(B * T * H * D),
         v = random_floats(B * T * H * D);
    std::vector<float> out(B * T * H * D), lse(B * H * T);
    for (auto _ : state)
        ops::attention_forward(q.data(), k.data(), v.data(), B, T, H, H, D, out.data(), lse.data());
    flops(state, 2.0 * 2.0 * B * H * D * (T * (T + 1) / 2.0)); // q.k and p.v over the causal half
}

void BM_attention_backward(benchmark::State& state) {
    const int64_t B = 4, T = 256, H = 12, D = 64;
    auto q = random_floats(B * T * H * D), k = random_floats(B * T * H * D),
         v = random_floats(B * T * H * D), dout = random_floats(B * T * H * D);
    std::vector<float> out(B * T * H * D), lse(B * H * T), dq(q.size()), dk(q.size()), dv(q.size());
    ops::attention_forward(q.data(), k.data(), v.data(), B, T, H, H, D, out.data(), lse.data());
    for (auto _ : state)
        ops::attention_backward(dout.data(), q.data(), k.data(), v.data(), out.data(), lse.data(),
                                B, T, H, H, D, dq.data(), dk.data(), dv.data());
    flops(state, 4.0 * 2.0 * B * H * D * (T * (T + 1) / 2.0));
}

void BM_layernorm_forward(benchmark::State& state) {
    const int64_t C = 768;
    auto x = random_floats(N * C), w = random_floats(C), b = random_floats(C);
    std::vector<float> y(N * C), mean(N), rstd(N);
    for (auto _ : state)
        ops::layernorm_forward(x.data(), w.data(), b.data(), N, C, 1e-5, y.data(), mean.data(),
                               rstd.data());
    state.counters["GB/s"] =
        benchmark::Counter(2.0 * N * C * 4 * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_cross_entropy(benchmark::State& state) {
    const int64_t V = 50257, rows = 256;
    auto z = random_floats(rows * V);
    std::vector<int32_t> t(rows, 7);
    std::vector<float> loss(rows), lse(rows), dz(rows * V), dl(rows, 1.0f);
    for (auto _ : state) {
        ops::cross_entropy_forward(z.data(), t.data(), rows, V, loss.data(), lse.data());
        ops::cross_entropy_backward(z.data(), t.data(), lse.data(), dl.data(), rows, V, dz.data());
    }
    state.counters["GB/s"] = benchmark::Counter(3.0 * rows * V * 4 * 1e-9,
                                                benchmark::Counter::kIsIterationInvariantRate);
}

// The four matmul shapes of a GPT-2 124M block: qkv, attention out, MLP up, MLP down.
// The optimizer's update and the gradient norm's sum of squares of one parameter, by its
// element count: a model's parameters run from a norm's 128 elements to an embedding's
// millions, one call each per step.
void BM_adamw_step(benchmark::State& state) {
    int64_t n = state.range(0);
    auto g = random_floats(n), p = random_floats(n);
    std::vector<float> m(n), v(n);
    ops::AdamWConfig c;
    int64_t step = 1;
    for (auto _ : state) ops::adamw_step(g.data(), n, c, step++, p.data(), m.data(), v.data());
    state.SetItemsProcessed(state.iterations() * n);
}

void BM_sum_squares(benchmark::State& state) {
    int64_t n = state.range(0);
    auto g = random_floats(n);
    for (auto _ : state) benchmark::DoNotOptimize(ops::sum_squares(g.data(), n));
    state.SetItemsProcessed(state.iterations() * n);
}

// Rounding to bf16 in place (a weight's copy for a bf16 step), by element count.
void BM_round_bf16(benchmark::State& state) {
    int64_t n = state.range(0);
    auto x = random_floats(n);
    for (auto _ : state) {
        ops::round_bf16(x.data(), n);
        benchmark::ClobberMemory();
    }
    state.SetItemsProcessed(state.iterations() * n);
}

// A width-512 block's four products (qkv, attention out, MLP up, MLP down), each kernel
// (forward, input gradient, weight gradient) four times in a row on one thread, for `tokens`
// tokens: on the same weight each time (from the second call on, what fits of it is in the
// core's caches), or on the weights of four blocks in turn (100 MB), each last touched long
// before, as a training step meets them. `dist calibrate` times its shapes both ways.
void BM_block_matmuls(benchmark::State& state) {
    const int64_t T = state.range(0), sets = state.range(1), C = 512, reps = 4;
    const int64_t shape[4][2] = {{C, 3 * C}, {C, C}, {C, 4 * C}, {4 * C, C}}; // (in, out)
    std::vector<std::vector<float>> w, dw;
    for (int64_t s = 0; s < sets; ++s)
        for (const auto& io : shape) {
            w.push_back(random_floats(static_cast<size_t>(io[0] * io[1])));
            dw.emplace_back(static_cast<size_t>(io[0] * io[1]));
        }
    auto x = random_floats(T * 4 * C), dy = random_floats(T * 4 * C);
    std::vector<float> y(T * 4 * C), dx(T * 4 * C);
    const int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    int64_t per_pass = 0;
    for (const auto& io : shape) per_pass += reps * 3 * 2 * T * io[0] * io[1];
    for (auto _ : state)
        for (size_t i = 0; i < 4; ++i) {
            const int64_t in = shape[i][0], out = shape[i][1];
            for (int kind = 0; kind < 3; ++kind)
                for (int64_t r = 0; r < reps; ++r) {
                    const size_t at = static_cast<size_t>(r % sets) * 4 + i;
                    if (kind == 0)
                        ops::matmul_forward<float>(x.data(), w[at].data(), nullptr, T, in, out,
                                                   y.data());
                    else if (kind == 1)
                        ops::matmul_backward_input<float>(dy.data(), w[at].data(), T, in, out,
                                                          dx.data());
                    else
                        ops::matmul_backward_weight<float>(dy.data(), x.data(), T, in, out,
                                                           dw[at].data(), nullptr);
                }
        }
    omp_set_num_threads(threads);
    flops(state, static_cast<double>(per_pass));
}

void shapes(benchmark::internal::Benchmark* b) {
    b->Args({768, 2304})->Args({768, 768})->Args({768, 3072})->Args({3072, 768});
    b->Unit(benchmark::kMillisecond)->UseRealTime();
}

} // namespace

BENCHMARK(BM_blas_ceiling)->Apply(shapes);
BENCHMARK(BM_matmul_forward)->Apply(shapes);
BENCHMARK(BM_matmul_backward)->Apply(shapes);
BENCHMARK(BM_block_matmuls)
    ->ArgsProduct({{64, 128, 256, 512}, {1, 4}})
    ->ArgNames({"tokens", "weight_sets"})
    ->Unit(benchmark::kMillisecond);
// Wall-clock rates: the kernels use every core.
BENCHMARK(BM_attention_forward)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_attention_backward)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_layernorm_forward)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_cross_entropy)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_adamw_step)->RangeMultiplier(4)->Range(128, 1 << 20)->UseRealTime();
BENCHMARK(BM_sum_squares)->RangeMultiplier(4)->Range(128, 1 << 20)->UseRealTime();
BENCHMARK(BM_round_bf16)->RangeMultiplier(8)->Range(1024, 1 << 18)->UseRealTime();
BENCHMARK_MAIN();
