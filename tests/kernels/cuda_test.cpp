// cuda_test.cpp: every CUDA op against the CPU op of the same name, forward and backward, on
// the same inputs. Skips, with a message, where no GPU is visible.
#include "kernels/cpu/ops.hpp"
#include "kernels/cuda/ops.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace cpu = dist::kernels::cpu;
namespace gpu = dist::kernels::cuda;

namespace {

std::vector<float> random_floats(size_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.0f, 1.0f);
    std::vector<float> v(n);
    for (auto& x : v) x = d(rng);
    return v;
}

// A device copy of a host vector, freed at the end of the test.
template <typename T> struct Device {
    T* ptr = nullptr;
    size_t n = 0;
    explicit Device(const std::vector<T>& host) : n(host.size()) {
        void* p = nullptr;
        EXPECT_EQ(gpu::malloc_device(n * sizeof(T), &p), "");
        ptr = static_cast<T*>(p);
        EXPECT_EQ(gpu::copy_to_device(host.data(), n * sizeof(T), ptr), "");
    }
    ~Device() { gpu::free_device(ptr); }
    std::vector<T> host() const {
        std::vector<T> out(n);
        EXPECT_EQ(gpu::copy_to_host(ptr, n * sizeof(T), out.data()), "");
        return out;
    }
};

std::vector<float> zeros(int64_t n) {
    return std::vector<float>(static_cast<size_t>(n), 0.0f);
}

void expect_close(const std::vector<float>& a, const std::vector<float>& b, float tol,
                  const char* what) {
    ASSERT_EQ(a.size(), b.size()) << what;
    for (size_t i = 0; i < a.size(); ++i)
        ASSERT_NEAR(a[i], b[i], tol * (1.0f + std::abs(b[i]))) << what << " [" << i << "]";
}

class Cuda : public testing::Test {
  protected:
    void SetUp() override {
        if (gpu::device_count() == 0) GTEST_SKIP() << "no GPU visible: CUDA ops not run";
    }
};

} // namespace

TEST_F(Cuda, MatmulMatchesCpu) {
    const int64_t N = 37, C = 48, OC = 29;
    auto x = random_floats(N * C, 1), w = random_floats(OC * C, 2), b = random_floats(OC, 3),
         dy = random_floats(N * OC, 4);
    std::vector<float> y(N * OC), dx(N * C, 0.0f), dw(OC * C, 0.0f), db(OC, 0.0f);
    cpu::matmul_forward(x.data(), w.data(), b.data(), N, C, OC, y.data());
    cpu::matmul_backward_input(dy.data(), w.data(), N, C, OC, dx.data());
    cpu::matmul_backward_weight(dy.data(), x.data(), N, C, OC, dw.data(), db.data());
    Device<float> gx(x), gw(w), gb(b), gdy(dy), gy(zeros(N * OC)), gdx(zeros(N * C)),
        gdw(zeros(OC * C)), gdb(zeros(OC));
    ASSERT_EQ(gpu::matmul_forward(gx.ptr, gw.ptr, gb.ptr, N, C, OC, gy.ptr), "");
    ASSERT_EQ(gpu::matmul_backward_input(gdy.ptr, gw.ptr, N, C, OC, gdx.ptr), "");
    ASSERT_EQ(gpu::matmul_backward_weight(gdy.ptr, gx.ptr, N, C, OC, gdw.ptr, gdb.ptr), "");
    ASSERT_EQ(gpu::synchronize(), "");
    expect_close(gy.host(), y, 1e-4f, "out");
    expect_close(gdx.host(), dx, 1e-4f, "dinp");
    expect_close(gdw.host(), dw, 1e-4f, "dweight");
    expect_close(gdb.host(), db, 1e-4f, "dbias");
}

TEST_F(Cuda, LayerNormMatchesCpu) {
    const int64_t N = 19, C = 300;
    auto x = random_floats(N * C, 5), w = random_floats(C, 6), b = random_floats(C, 7),
         dy = random_floats(N * C, 8);
    std::vector<float> y(N * C), mean(N), rstd(N), dx(N * C, 0.0f), dw(C, 0.0f), db(C, 0.0f);
    cpu::layernorm_forward(x.data(), w.data(), b.data(), N, C, 1e-5, y.data(), mean.data(),
                           rstd.data());
    cpu::layernorm_backward_input(dy.data(), x.data(), w.data(), mean.data(), rstd.data(), N, C,
                                  dx.data());
    cpu::layernorm_backward_weight(dy.data(), x.data(), mean.data(), rstd.data(), N, C, dw.data(),
                                   db.data());
    Device<float> gx(x), gw(w), gb(b), gdy(dy), gy(zeros(N * C)), gm(zeros(N)), gr(zeros(N)),
        gdx(zeros(N * C)), gdw(zeros(C)), gdb(zeros(C));
    ASSERT_EQ(gpu::layernorm_forward(gx.ptr, gw.ptr, gb.ptr, N, C, 1e-5f, gy.ptr, gm.ptr, gr.ptr),
              "");
    ASSERT_EQ(gpu::layernorm_backward_input(gdy.ptr, gx.ptr, gw.ptr, gm.ptr, gr.ptr, N, C, gdx.ptr),
              "");
    ASSERT_EQ(
        gpu::layernorm_backward_weight(gdy.ptr, gx.ptr, gm.ptr, gr.ptr, N, C, gdw.ptr, gdb.ptr),
        "");
    ASSERT_EQ(gpu::synchronize(), "");
    expect_close(gy.host(), y, 1e-4f, "out");
    expect_close(gdx.host(), dx, 1e-4f, "dinp");
    expect_close(gdw.host(), dw, 1e-4f, "dweight");
    expect_close(gdb.host(), db, 1e-4f, "dbias");
}

TEST_F(Cuda, GeluEmbeddingAndAdamWMatchCpu) {
    const int64_t n = 1000;
    auto x = random_floats(n, 9), dy = random_floats(n, 10);
    std::vector<float> y(n), dx(n, 0.0f);
    cpu::gelu_forward(x.data(), n, y.data());
    cpu::gelu_backward(x.data(), dy.data(), n, dx.data());
    Device<float> gx(x), gdy(dy), gy(zeros(n)), gdx(zeros(n));
    ASSERT_EQ(gpu::gelu_forward(gx.ptr, n, gy.ptr), "");
    ASSERT_EQ(gpu::gelu_backward(gx.ptr, gdy.ptr, n, gdx.ptr), "");
    expect_close(gy.host(), y, 1e-5f, "gelu");
    expect_close(gdx.host(), dx, 1e-5f, "gelu backward");

    const int64_t V = 11, C = 7, N = 9;
    std::vector<int32_t> tok = {3, 1, 3, 0, 10, 3, 5, 5, 2};
    auto table = random_floats(V * C, 11), g = random_floats(N * C, 12);
    std::vector<float> e(N * C), dt(V * C, 0.0f);
    cpu::embedding_forward(tok.data(), table.data(), N, C, e.data());
    cpu::embedding_backward(tok.data(), g.data(), N, C, dt.data());
    Device<int32_t> gtok(tok);
    Device<float> gtable(table), gg(g), ge(zeros(N * C)), gdt(zeros(V * C));
    ASSERT_EQ(gpu::embedding_forward(gtok.ptr, gtable.ptr, N, C, ge.ptr), "");
    ASSERT_EQ(gpu::embedding_backward(gtok.ptr, gg.ptr, N, C, gdt.ptr), "");
    expect_close(ge.host(), e, 0.0f, "embedding");
    expect_close(gdt.host(), dt, 1e-6f, "embedding backward");

    auto p = random_floats(n, 13), grad = random_floats(n, 14);
    std::vector<float> m(n, 0.0f), v(n, 0.0f);
    Device<float> gp(p), ggrad(grad), gm(m), gv(v);
    cpu::AdamWConfig c{1e-2, 0.9, 0.95, 1e-8, 0.1};
    for (int64_t step = 1; step <= 3; ++step) {
        cpu::adamw_step(grad.data(), n, c, step, p.data(), m.data(), v.data());
        ASSERT_EQ(gpu::adamw_step(ggrad.ptr, n, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, step, gp.ptr,
                                  gm.ptr, gv.ptr),
                  "");
    }
    expect_close(gp.host(), p, 1e-5f, "adamw params");
}

TEST_F(Cuda, CrossEntropyMatchesCpu) {
    const int64_t N = 13, V = 1000;
    auto z = random_floats(N * V, 15), dl = random_floats(N, 16);
    std::vector<int32_t> t(N);
    for (int64_t i = 0; i < N; ++i) t[i] = static_cast<int32_t>((i * 97) % V);
    std::vector<float> loss(N), lse(N), dz(N * V);
    cpu::cross_entropy_forward(z.data(), t.data(), N, V, loss.data(), lse.data());
    cpu::cross_entropy_backward(z.data(), t.data(), lse.data(), dl.data(), N, V, dz.data());
    Device<float> gz(z), gdl(dl), gloss(zeros(N)), glse(zeros(N)), gdz(zeros(N * V));
    Device<int32_t> gt(t);
    ASSERT_EQ(gpu::cross_entropy_forward(gz.ptr, gt.ptr, N, V, gloss.ptr, glse.ptr), "");
    ASSERT_EQ(gpu::cross_entropy_backward(gz.ptr, gt.ptr, glse.ptr, gdl.ptr, N, V, gdz.ptr), "");
    expect_close(gloss.host(), loss, 1e-5f, "losses");
    expect_close(gdz.host(), dz, 1e-5f, "dlogits");
}

TEST(CudaDevices, CountingNeverFails) {
    int n = gpu::device_count();
    EXPECT_GE(n, 0);
    if (n == 0) {
        // The failed probe must not leave an error for the next CUDA call to trip over.
        EXPECT_EQ(gpu::device_count(), 0);
    }
}
