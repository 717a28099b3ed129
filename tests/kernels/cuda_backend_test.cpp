// cuda_backend_test.cpp: a CUDA device's Backend against the CPU's, op by op, on the same
// inputs: the ops layers call through kernels::Backend that ops.hpp's tests do not cover (the
// residual sum, bias rows, column blocks, GELU (erf), ReLU, the vocabulary-split embedding and
// loss, the reductions), the optimizer and the
// gradient norm through the backend, and the contracts the backend adds (GELU's backward writes its
// output; every call works from a thread whose current device is another). Skips without a GPU.
#include "kernels/cuda/backend.hpp"
#include "kernels/cuda/ops.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <thread>
#include <vector>

namespace {

using dist::kernels::Backend;
using dist::kernels::DType;
using dist::kernels::Tensor;

class CudaBackend : public ::testing::Test {
  protected:
    void SetUp() override {
        if (dist::kernels::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device visible";
        gpu_ = &dist::kernels::cuda::backend(0);
    }

    // A host tensor of normal values, and its copy on the GPU.
    Tensor host(std::vector<int64_t> shape, uint32_t seed) {
        Tensor t(std::move(shape));
        std::mt19937 rng(seed);
        std::normal_distribution<float> d(0.0f, 1.0f);
        for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = d(rng);
        return t;
    }
    Tensor tokens(int64_t n, int32_t vocab, uint32_t seed) {
        Tensor t({n}, DType::i32);
        std::mt19937 rng(seed);
        for (int64_t i = 0; i < n; ++i)
            t.data<int32_t>()[i] = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
        return t;
    }
    Tensor dev(const Tensor& t) { return t.to(gpu_->allocator()); }

    static void expect_close(const Tensor& gpu, const Tensor& cpu, float tol, const char* what) {
        Tensor g = gpu.on_host();
        ASSERT_EQ(g.numel(), cpu.numel()) << what;
        for (int64_t i = 0; i < g.numel(); ++i)
            ASSERT_NEAR(g.data<float>()[i], cpu.data<float>()[i],
                        tol * (1.0f + std::abs(cpu.data<float>()[i])))
                << what << " [" << i << "]";
    }

    Backend& cpu_ = dist::kernels::cpu_backend();
    Backend* gpu_ = nullptr;
};

TEST_F(CudaBackend, ElementwiseOpsMatchTheCpu) {
    const int64_t N = 37, C = 129, n = N * C;
    Tensor a = host({N, C}, 1), b = host({N, C}, 2), bias = host({C}, 3);
    Tensor da = dev(a), db = dev(b), dbias = dev(bias);

    Tensor sum = a.clone(), gsum = da.clone();
    cpu_.add(a.data<float>(), b.data<float>(), n, sum.data<float>());
    gpu_->add(da.data<float>(), db.data<float>(), n, gsum.data<float>());
    expect_close(gsum, sum, 1e-6f, "add");

    cpu_.add_rows(bias.data<float>(), N, C, sum.data<float>());
    gpu_->add_rows(dbias.data<float>(), N, C, gsum.data<float>());
    expect_close(gsum, sum, 1e-6f, "add_rows");

    Tensor filled = a.clone(), gfilled = da.clone();
    cpu_.fill(filled.data<float>(), n, 0.25f);
    gpu_->fill(gfilled.data<float>(), n, 0.25f);
    expect_close(gfilled, filled, 0.0f, "fill");

    // Columns [5, 5 + 40) of a's rows into columns [3, 43) of b's.
    Tensor block = b.clone(), gblock = db.clone();
    cpu_.copy_block(a.data<float>() + 5, C, block.data<float>() + 3, C, N, 40);
    gpu_->copy_block(da.data<float>() + 5, C, gblock.data<float>() + 3, C, N, 40);
    expect_close(gblock, block, 0.0f, "copy_block");

    using Forward = void (Backend::*)(const float*, int64_t, float*);
    using Backward = void (Backend::*)(const float*, const float*, int64_t, float*);
    struct Activation {
        const char* name;
        Forward forward;
        Backward backward;
    };
    for (Activation act :
         {Activation{"gelu_erf", &Backend::gelu_erf_forward, &Backend::gelu_erf_backward},
          Activation{"relu", &Backend::relu_forward, &Backend::relu_backward}}) {
        Tensor y = a.clone(), gy = da.clone();
        (cpu_.*act.forward)(a.data<float>(), n, y.data<float>());
        (gpu_->*act.forward)(da.data<float>(), n, gy.data<float>());
        expect_close(gy, y, 1e-5f, act.name);
        // Backward adds: both start from b.
        Tensor dx = b.clone(), gdx = db.clone();
        (cpu_.*act.backward)(a.data<float>(), b.data<float>(), n, dx.data<float>());
        (gpu_->*act.backward)(da.data<float>(), db.data<float>(), n, gdx.data<float>());
        expect_close(gdx, dx, 1e-5f, act.name);
    }

    // GELU (tanh) from its kept values: the backward writes its output, whatever was there.
    Tensor y = a.clone(), th = a.clone(), gy = da.clone(), gth = da.clone();
    cpu_.gelu_forward_keeping(a.data<float>(), n, y.data<float>(), th.data<float>());
    gpu_->gelu_forward_keeping(da.data<float>(), n, gy.data<float>(), gth.data<float>());
    expect_close(gy, y, 1e-5f, "gelu_forward_keeping");
    expect_close(gth, th, 1e-5f, "gelu_forward_keeping (kept tanh)");
    Tensor dx = b.clone(), gdx = dev(host({N, C}, 9));
    cpu_.gelu_backward_kept(a.data<float>(), th.data<float>(), b.data<float>(), n,
                            dx.data<float>());
    gpu_->gelu_backward_kept(da.data<float>(), gth.data<float>(), db.data<float>(), n,
                             gdx.data<float>());
    expect_close(gdx, dx, 1e-5f, "gelu_backward_kept");

    EXPECT_NEAR(gpu_->sum(da.data<float>(), n), cpu_.sum(a.data<float>(), n), 1e-3);
    EXPECT_NEAR(gpu_->sum_squares(da.data<float>(), n) / cpu_.sum_squares(a.data<float>(), n), 1.0,
                1e-9);
}

// Mixed precision's rounding and conversions give the CPU's bits exactly.
TEST_F(CudaBackend, Bf16RoundingIsTheCpusBitForBit) {
    const int64_t n = 4099;
    Tensor a = host({n}, 11);
    a.data<float>()[0] = std::numeric_limits<float>::quiet_NaN();
    a.data<float>()[1] = -std::numeric_limits<float>::infinity();
    a.data<float>()[2] = 1.0f + std::ldexp(1.0f, -8); // a tie
    Tensor da = dev(a);
    Tensor r = a.clone(), gr = da.clone();
    cpu_.round_bf16(r.data<float>(), n);
    gpu_->round_bf16(gr.data<float>(), n);
    Tensor g = gr.on_host();
    EXPECT_EQ(std::memcmp(g.raw(), r.raw(), r.bytes()), 0);
    Tensor h({n}, DType::bf16), gh({n}, DType::bf16, gpu_->allocator());
    cpu_.to_bf16(a.data<float>(), n, h.data<uint16_t>());
    gpu_->to_bf16(da.data<float>(), n, gh.data<uint16_t>());
    EXPECT_EQ(std::memcmp(gh.on_host().raw(), h.raw(), h.bytes()), 0);
    Tensor back = gr.clone();
    gpu_->from_bf16(gh.data<uint16_t>(), n, back.data<float>());
    EXPECT_EQ(std::memcmp(back.on_host().raw(), r.raw(), r.bytes()), 0);
}

TEST_F(CudaBackend, VocabularySplitEmbeddingAndLossMatchTheCpu) {
    // This rank holds vocabulary rows / logit columns [40, 40 + 24) of 100.
    const int64_t N = 50, C = 16, V = 24, begin = 40, vocab = 100;
    Tensor tok = tokens(N, static_cast<int32_t>(vocab), 4), table = host({V, C}, 5);
    Tensor dtok = dev(tok), dtable = dev(table);

    Tensor out({N, C}), gout = gpu_->empty({N, C});
    cpu_.embedding_forward_part(tok.data<int32_t>(), table.data<float>(), N, C, begin, V,
                                out.data<float>());
    gpu_->embedding_forward_part(dtok.data<int32_t>(), dtable.data<float>(), N, C, begin, V,
                                 gout.data<float>());
    expect_close(gout, out, 0.0f, "embedding_forward_part");

    Tensor dy = host({N, C}, 6), grad = host({V, C}, 7);
    Tensor gdy = dev(dy), ggrad = dev(grad);
    cpu_.embedding_backward_part(tok.data<int32_t>(), dy.data<float>(), N, C, begin, V,
                                 grad.data<float>());
    gpu_->embedding_backward_part(dtok.data<int32_t>(), gdy.data<float>(), N, C, begin, V,
                                  ggrad.data<float>());
    expect_close(ggrad, grad, 1e-5f, "embedding_backward_part");

    // The loss's three steps, with no group (this rank's sums are the totals).
    Tensor logits = host({N, V}, 8), glogits = dev(logits);
    Tensor mx({N}), gmx = gpu_->empty({N});
    cpu_.row_max(logits.data<float>(), N, V, mx.data<float>());
    gpu_->row_max(glogits.data<float>(), N, V, gmx.data<float>());
    expect_close(gmx, mx, 0.0f, "row_max");
    Tensor sums({2 * N}), gsums = gpu_->empty({2 * N});
    cpu_.cross_entropy_part_sums(logits.data<float>(), tok.data<int32_t>(), mx.data<float>(), N, V,
                                 begin, sums.data<float>());
    gpu_->cross_entropy_part_sums(glogits.data<float>(), dtok.data<int32_t>(), gmx.data<float>(), N,
                                  V, begin, gsums.data<float>());
    expect_close(gsums, sums, 1e-5f, "cross_entropy_part_sums");
    Tensor lse({N}), losses({N}), glse = gpu_->empty({N}), glosses = gpu_->empty({N});
    cpu_.cross_entropy_part_finish(mx.data<float>(), sums.data<float>(), N, lse.data<float>(),
                                   losses.data<float>());
    gpu_->cross_entropy_part_finish(gmx.data<float>(), gsums.data<float>(), N, glse.data<float>(),
                                    glosses.data<float>());
    expect_close(glosses, losses, 1e-5f, "cross_entropy_part_finish");
    Tensor dl = host({N}, 10), gdl = dev(dl);
    Tensor d({N, V}), gd = gpu_->empty({N, V});
    cpu_.cross_entropy_part_backward(logits.data<float>(), tok.data<int32_t>(), lse.data<float>(),
                                     dl.data<float>(), N, V, begin, d.data<float>());
    gpu_->cross_entropy_part_backward(glogits.data<float>(), dtok.data<int32_t>(),
                                      glse.data<float>(), gdl.data<float>(), N, V, begin,
                                      gd.data<float>());
    expect_close(gd, d, 1e-5f, "cross_entropy_part_backward");
}

TEST_F(CudaBackend, OptimizerAndNormMatchTheCpu) {
    const int64_t n = 1000;
    Tensor p = Tensor::zeros({n}), g = host({n}, 21), m = Tensor::zeros({n}),
           v = Tensor::zeros({n});
    Tensor gp = dev(p), gg = dev(g), gm = dev(m), gv = dev(v);
    // One step from zero moves every parameter by lr times about one. beta2 = 0.999: its bias
    // correction is 1e-3, which is off by 1.3e-5 of itself when beta is rounded to float before
    // the power, and moves the step by 6.5e-6 of itself: compared relative to the step, not to 1.
    cpu_.adamw_step(g.data<float>(), n, 1e-2, 0.9, 0.999, 1e-8, 0.1, 1, p.data<float>(),
                    m.data<float>(), v.data<float>());
    gpu_->adamw_step(gg.data<float>(), n, 1e-2, 0.9, 0.999, 1e-8, 0.1, 1, gp.data<float>(),
                     gm.data<float>(), gv.data<float>());
    Tensor moved = gp.on_host();
    for (int64_t i = 0; i < n; ++i)
        ASSERT_NEAR(moved.data<float>()[i], p.data<float>()[i], 1e-6 * std::abs(p.data<float>()[i]))
            << "adamw_step [" << i << "]";
    expect_close(gv, v, 1e-6f, "adamw_step second moment");

    // The norm of several tensors in one wait equals the sum of their sums of squares.
    Tensor a = host({n}, 22), b = host({37}, 23), ga = dev(a), gb = dev(b);
    const double want =
        cpu_.sum_squares(a.data<float>(), n) + cpu_.sum_squares(b.data<float>(), 37);
    EXPECT_NEAR(gpu_->sum_squares_of({{ga.data<float>(), n}, {gb.data<float>(), 37}}) / want, 1.0,
                1e-9);
    EXPECT_EQ(gpu_->sum_squares_of({}), 0.0);

    // add with its output aliasing an input, as residual sums call it.
    Tensor s = a.clone();
    cpu_.add(s.data<float>(), a.data<float>(), n, s.data<float>());
    gpu_->add(ga.data<float>(), ga.data<float>(), n, ga.data<float>());
    expect_close(ga, s, 0.0f, "add in place");
}

TEST_F(CudaBackend, EmptyInputsAreNoOps) {
    // A microbatch of no rows is no error on the CPU (its loops run zero times); kernels that
    // launch a block per row must not launch a grid of none.
    Tensor w = dev(host({8}, 30)), b = dev(host({8}, 31)), out = gpu_->empty({1});
    float* o = out.data<float>();
    EXPECT_NO_THROW(
        gpu_->layernorm_forward(o, w.data<float>(), b.data<float>(), 0, 8, 1e-5f, o, o, o));
    EXPECT_NO_THROW(gpu_->layernorm_backward_input(o, o, w.data<float>(), o, o, 0, 8, o));
    EXPECT_NO_THROW(gpu_->cross_entropy_forward(o, nullptr, 0, 8, o, o));
    EXPECT_NO_THROW(gpu_->cross_entropy_backward(o, nullptr, o, o, 0, 8, o));
}

TEST_F(CudaBackend, CallsFromAnotherThreadRunOnTheBackendsDevice) {
    // A fresh thread's current device is 0 too on a one-GPU machine; what this checks is that
    // a thread that never touched CUDA can call every kind of op (set_device, cuBLAS handle).
    Tensor x = host({8, 32}, 11), w = host({16, 32}, 12);
    Tensor y({8, 16});
    cpu_.matmul_forward(x.data<float>(), w.data<float>(), nullptr, 8, 32, 16, y.data<float>());
    Tensor gy;
    std::thread t([&] {
        Tensor gx = dev(x), gw = dev(w);
        gy = gpu_->empty({8, 16});
        gpu_->matmul_forward(gx.data<float>(), gw.data<float>(), nullptr, 8, 32, 16,
                             gy.data<float>());
        gy = gy.on_host();
    });
    t.join();
    expect_close(gy, y, 1e-5f, "matmul_forward");
}

} // namespace
