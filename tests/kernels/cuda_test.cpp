// cuda_test.cpp: every CUDA op against the CPU op of the same name, forward and backward, on
// the same inputs (backward gradients start nonzero on both sides, since backward adds).
// Skips, with a message, where no GPU is visible.
#include "kernels/cpu/ops.hpp"
#include "kernels/cuda/ops.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
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

// |a - b| <= tol for every element (for bf16 results, whose error does not scale with |b|).
void expect_within(const std::vector<float>& a, const std::vector<float>& b, float tol,
                   const char* what) {
    ASSERT_EQ(a.size(), b.size()) << what;
    for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], tol) << what << " [" << i << "]";
}

// bf16 on the host, rounded to nearest even as the device's __float2bfloat16_rn (no NaNs here).
uint16_t bf16_bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof(u));
    u += 0x7fffu + ((u >> 16) & 1u);
    return static_cast<uint16_t>(u >> 16);
}

float bf16_value(uint16_t b) {
    uint32_t u = static_cast<uint32_t>(b) << 16;
    float f;
    std::memcpy(&f, &u, sizeof(f));
    return f;
}

std::vector<float> rounded_to_bf16(const std::vector<float>& x) {
    std::vector<float> r(x.size());
    for (size_t i = 0; i < x.size(); ++i) r[i] = bf16_value(bf16_bits(x[i]));
    return r;
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
        ASSERT_EQ(gpu::adamw_step(ggrad.ptr, n, 1e-2f, 0.9, 0.95, 1e-8f, 0.1f, step, gp.ptr, gm.ptr,
                                  gv.ptr),
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

TEST_F(Cuda, RmsNormMatchesCpu) {
    const int64_t N = 19, C = 300;
    auto x = random_floats(N * C, 17), w = random_floats(C, 18), dy = random_floats(N * C, 19);
    // Backward adds: start the gradients from nonzero values on both sides.
    auto dx = random_floats(N * C, 20), dw = random_floats(C, 21);
    std::vector<float> y(N * C), rstd(N);
    Device<float> gx(x), gw(w), gdy(dy), gy(zeros(N * C)), gr(zeros(N)), gdx(dx), gdw(dw);
    cpu::rmsnorm_forward(x.data(), w.data(), N, C, 1e-5, y.data(), rstd.data());
    cpu::rmsnorm_backward_input(dy.data(), x.data(), w.data(), rstd.data(), N, C, dx.data());
    cpu::rmsnorm_backward_weight(dy.data(), x.data(), rstd.data(), N, C, dw.data());
    ASSERT_EQ(gpu::rmsnorm_forward(gx.ptr, gw.ptr, N, C, 1e-5f, gy.ptr, gr.ptr), "");
    ASSERT_EQ(gpu::rmsnorm_backward_input(gdy.ptr, gx.ptr, gw.ptr, gr.ptr, N, C, gdx.ptr), "");
    ASSERT_EQ(gpu::rmsnorm_backward_weight(gdy.ptr, gx.ptr, gr.ptr, N, C, gdw.ptr), "");
    ASSERT_EQ(gpu::synchronize(), "");
    expect_close(gy.host(), y, 1e-5f, "out");
    expect_close(gr.host(), rstd, 1e-5f, "rstd");
    expect_close(gdx.host(), dx, 1e-4f, "dinp");
    expect_close(gdw.host(), dw, 1e-4f, "dweight");
}

TEST_F(Cuda, SwiGluMatchesCpu) {
    const int64_t N = 7, H = 45;
    auto x = random_floats(N * 2 * H, 22), dy = random_floats(N * H, 23);
    auto dx = random_floats(N * 2 * H, 24);
    std::vector<float> y(N * H);
    Device<float> gx(x), gdy(dy), gy(zeros(N * H)), gdx(dx);
    cpu::swiglu_forward(x.data(), N, H, y.data());
    cpu::swiglu_backward(x.data(), dy.data(), N, H, dx.data());
    ASSERT_EQ(gpu::swiglu_forward(gx.ptr, N, H, gy.ptr), "");
    ASSERT_EQ(gpu::swiglu_backward(gx.ptr, gdy.ptr, N, H, gdx.ptr), "");
    ASSERT_EQ(gpu::synchronize(), "");
    expect_close(gy.host(), y, 1e-5f, "out");
    expect_close(gdx.host(), dx, 1e-5f, "dinp [gate | up]");
}

TEST_F(Cuda, RopeMatchesCpuInPlaceAndAtLargePositions) {
    const int64_t B = 2, T = 37, H = 3, D = 16;
    for (int64_t pos0 : {int64_t(0), int64_t(5), int64_t(3000)}) {
        SCOPED_TRACE("pos0 " + std::to_string(pos0));
        auto x = random_floats(B * T * H * D, 25), dy = random_floats(B * T * H * D, 26);
        auto dx = random_floats(B * T * H * D, 27);
        std::vector<float> y(x.size());
        Device<float> gx(x), gdy(dy), gy(zeros(B * T * H * D)), gdx(dx);
        cpu::rope_forward(x.data(), B, T, H, D, 10000.0, pos0, y.data());
        cpu::rope_backward(dy.data(), B, T, H, D, 10000.0, pos0, dx.data());
        ASSERT_EQ(gpu::rope_forward(gx.ptr, B, T, H, D, 10000.0, pos0, gy.ptr), "");
        ASSERT_EQ(gpu::rope_backward(gdy.ptr, B, T, H, D, 10000.0, pos0, gdx.ptr), "");
        // In place, as the CPU op allows: out aliases inp.
        ASSERT_EQ(gpu::rope_forward(gx.ptr, B, T, H, D, 10000.0, pos0, gx.ptr), "");
        ASSERT_EQ(gpu::synchronize(), "");
        expect_close(gy.host(), y, 1e-5f, "out");
        expect_close(gx.host(), y, 1e-5f, "out, in place");
        expect_close(gdx.host(), dx, 1e-5f, "dinp");
    }
}

TEST_F(Cuda, PositionsMatchCpu) {
    const int64_t B = 3, T = 11, C = 20;
    auto wpe = random_floats(T * C, 28), out = random_floats(B * T * C, 29);
    auto dy = random_floats(B * T * C, 30), dwpe = random_floats(T * C, 31);
    Device<float> gwpe(wpe), gout(out), gdy(dy), gdwpe(dwpe);
    cpu::positions_forward(wpe.data(), B, T, C, out.data());
    cpu::positions_backward(dy.data(), B, T, C, dwpe.data());
    ASSERT_EQ(gpu::positions_forward(gwpe.ptr, B, T, C, gout.ptr), "");
    ASSERT_EQ(gpu::positions_backward(gdy.ptr, B, T, C, gdwpe.ptr), "");
    ASSERT_EQ(gpu::synchronize(), "");
    expect_close(gout.host(), out, 1e-6f, "out");
    expect_close(gdwpe.host(), dwpe, 1e-5f, "dwpe");
}

struct AttentionShape {
    int64_t B, T, H, KV, D;
};

class CudaAttention : public Cuda, public testing::WithParamInterface<AttentionShape> {};

// Shapes chosen to cross the kernels' edges: T not a multiple of the 8-row blocks or the
// 32-row tiles, grouped heads (H > KV), D below, at and above a warp's 32 lanes and not a
// multiple of them, and D = 256, whose shared memory passes the default 48 KiB.
INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaAttention,
    testing::Values(AttentionShape{2, 37, 4, 2, 16}, AttentionShape{1, 70, 2, 1, 64},
                    AttentionShape{2, 9, 3, 3, 40}, AttentionShape{1, 33, 6, 2, 128},
                    AttentionShape{1, 20, 2, 1, 256}, AttentionShape{1, 1, 1, 1, 8}));

TEST_P(CudaAttention, ForwardAndBackwardMatchCpu) {
    const auto [B, T, H, KV, D] = GetParam();
    auto q = random_floats(B * T * H * D, 32), k = random_floats(B * T * KV * D, 33),
         v = random_floats(B * T * KV * D, 34), dy = random_floats(B * T * H * D, 35);
    auto dq = random_floats(B * T * H * D, 36), dk = random_floats(B * T * KV * D, 37),
         dv = random_floats(B * T * KV * D, 38);
    std::vector<float> out(B * T * H * D), lse(B * H * T);
    Device<float> gq(q), gk(k), gv(v), gdy(dy), gout(zeros(B * T * H * D)), glse(zeros(B * H * T)),
        gdq(dq), gdk(dk), gdv(dv);
    cpu::attention_forward(q.data(), k.data(), v.data(), B, T, H, KV, D, out.data(), lse.data());
    cpu::attention_backward(dy.data(), q.data(), k.data(), v.data(), out.data(), lse.data(), B, T,
                            H, KV, D, dq.data(), dk.data(), dv.data());
    ASSERT_EQ(gpu::attention_forward(gq.ptr, gk.ptr, gv.ptr, B, T, H, KV, D, gout.ptr, glse.ptr),
              "");
    ASSERT_EQ(gpu::synchronize(), "");
    expect_close(gout.host(), out, 1e-4f, "out");
    expect_close(glse.host(), lse, 1e-5f, "lse");
    // Backward from the CPU's forward results, so that only the backward is compared.
    Device<float> cout_(out), clse(lse);
    ASSERT_EQ(gpu::attention_backward(gdy.ptr, gq.ptr, gk.ptr, gv.ptr, cout_.ptr, clse.ptr, B, T, H,
                                      KV, D, gdq.ptr, gdk.ptr, gdv.ptr),
              "");
    ASSERT_EQ(gpu::synchronize(), "");
    expect_close(gdq.host(), dq, 2e-4f, "dq");
    expect_close(gdk.host(), dk, 2e-4f, "dk");
    expect_close(gdv.host(), dv, 2e-4f, "dv");
}

// Needs no GPU: the shape is checked before anything reaches the device.
TEST(CudaAttentionShapes, RefusedBeforeLaunch) {
    std::string e =
        gpu::attention_forward(nullptr, nullptr, nullptr, 1, 4, 3, 2, 16, nullptr, nullptr);
    EXPECT_NE(e.find("multiple"), std::string::npos) << e;
    e = gpu::attention_forward(nullptr, nullptr, nullptr, 1, 4, 2, 2, 512, nullptr, nullptr);
    EXPECT_NE(e.find("head dimension 512"), std::string::npos) << e;
}

TEST_F(Cuda, GradNormHelpersMatchCpu) {
    auto a = random_floats(100000, 39), b = random_floats(777, 40);
    Device<float> ga(a), gb(b);
    Device<double> sum(std::vector<double>{0.0});
    ASSERT_EQ(gpu::sum_squares(ga.ptr, static_cast<int64_t>(a.size()), sum.ptr), "");
    ASSERT_EQ(gpu::sum_squares(gb.ptr, static_cast<int64_t>(b.size()), sum.ptr), "");
    double want = cpu::sum_squares(a.data(), static_cast<int64_t>(a.size())) +
                  cpu::sum_squares(b.data(), static_cast<int64_t>(b.size()));
    double got = sum.host()[0];
    EXPECT_NEAR(got, want, 1e-10 * want);

    ASSERT_EQ(gpu::scale(gb.ptr, static_cast<int64_t>(b.size()), 0.37), "");
    auto scaled = b;
    cpu::scale(scaled.data(), static_cast<int64_t>(scaled.size()), 0.37);
    expect_close(gb.host(), scaled, 0.0f, "scale");

    // Clipping on the device: the norm is about 317, so max 10 scales, max 1000 does not.
    const double norm = std::sqrt(got);
    ASSERT_EQ(gpu::clip_by_norm(sum.ptr, 1000.0, static_cast<int64_t>(a.size()), ga.ptr), "");
    expect_close(ga.host(), a, 0.0f, "not clipped");
    ASSERT_EQ(gpu::clip_by_norm(sum.ptr, 10.0, static_cast<int64_t>(a.size()), ga.ptr), "");
    cpu::scale(a.data(), static_cast<int64_t>(a.size()), 10.0 / norm);
    expect_close(ga.host(), a, 1e-6f, "clipped");
}

// bf16 operands: against the CPU's float matmul of the same rounded operands (tight: the
// products are exact in float, only the summation order differs), and of the unrounded ones
// (loose: each operand carries bf16's relative error of 2^-9).
void check_matmul_bf16(int64_t N, int64_t C, int64_t OC) {
    auto x = random_floats(N * C, 41), w = random_floats(OC * C, 42), bias = random_floats(OC, 43),
         dy = random_floats(N * OC, 44);
    auto dx0 = random_floats(N * C, 45), dw0 = random_floats(OC * C, 46),
         db0 = random_floats(OC, 47);
    auto xr = rounded_to_bf16(x), wr = rounded_to_bf16(w), dyr = rounded_to_bf16(dy);

    Device<float> gx(x), gw(w), gdy(dy), gbias(bias);
    Device<uint16_t> hx(std::vector<uint16_t>(x.size())), hw(std::vector<uint16_t>(w.size())),
        hdy(std::vector<uint16_t>(dy.size()));
    ASSERT_EQ(gpu::to_bf16(gx.ptr, N * C, hx.ptr), "");
    ASSERT_EQ(gpu::to_bf16(gw.ptr, OC * C, hw.ptr), "");
    ASSERT_EQ(gpu::to_bf16(gdy.ptr, N * OC, hdy.ptr), "");
    auto bits = hx.host();
    for (size_t i = 0; i < bits.size(); ++i)
        ASSERT_EQ(bits[i], bf16_bits(x[i])) << "to_bf16 [" << i << "] of " << x[i];
    Device<float> back(zeros(N * C));
    ASSERT_EQ(gpu::from_bf16(hx.ptr, N * C, back.ptr), "");
    expect_close(back.host(), xr, 0.0f, "from_bf16");

    Device<float> gy(zeros(N * OC)), gdx(dx0), gdw(dw0), gdb(db0);
    ASSERT_EQ(gpu::matmul_forward_bf16(hx.ptr, hw.ptr, gbias.ptr, N, C, OC, gy.ptr), "");
    ASSERT_EQ(gpu::matmul_backward_input_bf16(hdy.ptr, hw.ptr, N, C, OC, gdx.ptr), "");
    ASSERT_EQ(gpu::matmul_backward_weight_bf16(hdy.ptr, hx.ptr, N, C, OC, gdw.ptr, gdb.ptr), "");
    ASSERT_EQ(gpu::synchronize(), "");
    auto y = gy.host(), dx = gdx.host(), dw = gdw.host(), db = gdb.host();

    std::vector<float> ry(N * OC), rdx = dx0, rdw = dw0, rdb = db0;
    cpu::matmul_forward(xr.data(), wr.data(), bias.data(), N, C, OC, ry.data());
    cpu::matmul_backward_input(dyr.data(), wr.data(), N, C, OC, rdx.data());
    cpu::matmul_backward_weight(dyr.data(), xr.data(), N, C, OC, rdw.data(), rdb.data());
    expect_close(y, ry, 1e-4f, "out vs rounded operands");
    expect_close(dx, rdx, 1e-4f, "dinp vs rounded operands");
    expect_close(dw, rdw, 1e-4f, "dweight vs rounded operands");
    expect_close(db, rdb, 1e-4f, "dbias vs rounded dout");

    std::vector<float> fy(N * OC), fdx = dx0, fdw = dw0, fdb = db0;
    cpu::matmul_forward(x.data(), w.data(), bias.data(), N, C, OC, fy.data());
    cpu::matmul_backward_input(dy.data(), w.data(), N, C, OC, fdx.data());
    cpu::matmul_backward_weight(dy.data(), x.data(), N, C, OC, fdw.data(), fdb.data());
    // Sums of K unit-variance products, each off by ~2^-9 relative: ~0.002 sqrt(K) typical.
    auto tol = [](int64_t K) { return 0.02f * std::sqrt(static_cast<float>(K)); };
    expect_within(y, fy, tol(C), "out vs float");
    expect_within(dx, fdx, tol(OC), "dinp vs float");
    expect_within(dw, fdw, tol(N), "dweight vs float");
    expect_within(db, fdb, tol(N), "dbias vs float");
}

TEST_F(Cuda, MatmulBf16MatchesCpu) {
    check_matmul_bf16(64, 96, 80);
}

// Odd sizes: leading dimensions that break cuBLASLt's 16-byte vector loads.
TEST_F(Cuda, MatmulBf16HandlesOddShapes) {
    check_matmul_bf16(37, 45, 29);
}

TEST(CudaDevices, CountingNeverFails) {
    int n = gpu::device_count();
    EXPECT_GE(n, 0);
    if (n == 0) {
        // The failed probe must not leave an error for the next CUDA call to trip over.
        EXPECT_EQ(gpu::device_count(), 0);
    }
}
