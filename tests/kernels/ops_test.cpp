// ops_test.cpp: every CPU op against a naive reference and every backward against central
// finite differences. The finite-difference checks run the double instantiation of the kernels,
// so they can be tight; float runs are compared with double ones.
#include "kernels/cpu/math.hpp"
#include "kernels/cpu/ops.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <vector>

using namespace dist::kernels::cpu;
using Vec = std::vector<double>;

namespace {

Vec random_vec(size_t n, uint32_t seed, double scale = 1.0) {
    std::mt19937 rng(seed);
    std::normal_distribution<double> dist(0.0, scale);
    Vec v(n);
    for (auto& x : v) x = dist(rng);
    return v;
}

std::vector<float> to_float(const Vec& v) {
    return std::vector<float>(v.begin(), v.end());
}

double dot(const Vec& a, const Vec& b) {
    double s = 0;
    for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
    return s;
}

// Checks the gradient of L(x) = <forward(x), r> with respect to x: `analytic` must equal the
// central difference of L in every coordinate.
void expect_gradient(Vec x, const std::function<Vec(const Vec&)>& forward, const Vec& r,
                     const Vec& analytic, double tol = 1e-6, const char* what = "") {
    ASSERT_EQ(x.size(), analytic.size());
    const double h = 1e-5;
    for (size_t i = 0; i < x.size(); ++i) {
        double keep = x[i];
        x[i] = keep + h;
        double up = dot(forward(x), r);
        x[i] = keep - h;
        double down = dot(forward(x), r);
        x[i] = keep;
        double numeric = (up - down) / (2 * h);
        EXPECT_NEAR(analytic[i], numeric, tol * (1.0 + std::abs(numeric)))
            << what << " coordinate " << i;
    }
}

} // namespace

TEST(Matmul, ForwardMatchesNaiveLoops) {
    const int64_t N = 5, C = 7, OC = 3;
    Vec inp = random_vec(N * C, 1), w = random_vec(OC * C, 2), b = random_vec(OC, 3);
    Vec out(N * OC);
    matmul_forward(inp.data(), w.data(), b.data(), N, C, OC, out.data());
    for (int64_t n = 0; n < N; ++n)
        for (int64_t o = 0; o < OC; ++o) {
            double s = b[o];
            for (int64_t c = 0; c < C; ++c) s += inp[n * C + c] * w[o * C + c];
            EXPECT_NEAR(out[n * OC + o], s, 1e-12);
        }
    // The float path agrees with the double one.
    auto fi = to_float(inp), fw = to_float(w), fb = to_float(b);
    std::vector<float> fo(N * OC);
    matmul_forward(fi.data(), fw.data(), fb.data(), N, C, OC, fo.data());
    for (size_t i = 0; i < fo.size(); ++i) EXPECT_NEAR(fo[i], out[i], 1e-5);
}

TEST(Matmul, BackwardMatchesFiniteDifferences) {
    const int64_t N = 4, C = 5, OC = 3;
    Vec inp = random_vec(N * C, 4), w = random_vec(OC * C, 5), b = random_vec(OC, 6);
    Vec r = random_vec(N * OC, 7);
    auto fwd = [&](const Vec& i, const Vec& ww, const Vec& bb) {
        Vec out(N * OC);
        matmul_forward(i.data(), ww.data(), bb.data(), N, C, OC, out.data());
        return out;
    };
    Vec dinp(N * C, 0.0), dw(OC * C, 0.0), db(OC, 0.0);
    matmul_backward_input(r.data(), w.data(), N, C, OC, dinp.data());
    matmul_backward_weight(r.data(), inp.data(), N, C, OC, dw.data(), db.data());
    expect_gradient(
        inp, [&](const Vec& x) { return fwd(x, w, b); }, r, dinp, 1e-6, "inp");
    expect_gradient(
        w, [&](const Vec& x) { return fwd(inp, x, b); }, r, dw, 1e-6, "weight");
    expect_gradient(
        b, [&](const Vec& x) { return fwd(inp, w, x); }, r, db, 1e-6, "bias");
    // Gradients accumulate: a second backward doubles them.
    matmul_backward_input(r.data(), w.data(), N, C, OC, dinp.data());
    Vec once(N * C, 0.0);
    matmul_backward_input(r.data(), w.data(), N, C, OC, once.data());
    for (size_t i = 0; i < once.size(); ++i) EXPECT_NEAR(dinp[i], 2 * once[i], 1e-12);
}

TEST(LayerNorm, NormalisesAndItsBackwardMatchesFiniteDifferences) {
    const int64_t N = 3, C = 8;
    Vec inp = random_vec(N * C, 8, 2.0), w = random_vec(C, 9), b = random_vec(C, 10);
    Vec ones(C, 1.0), zeros(C, 0.0), out(N * C), mean(N), rstd(N);
    layernorm_forward(inp.data(), ones.data(), zeros.data(), N, C, 1e-5, out.data(), mean.data(),
                      rstd.data());
    for (int64_t n = 0; n < N; ++n) {
        double m = 0, v = 0;
        for (int64_t c = 0; c < C; ++c) m += out[n * C + c] / C;
        for (int64_t c = 0; c < C; ++c) v += (out[n * C + c] - m) * (out[n * C + c] - m) / C;
        EXPECT_NEAR(m, 0.0, 1e-12);
        EXPECT_NEAR(v, 1.0, 1e-4); // eps keeps it just under 1
    }
    Vec r = random_vec(N * C, 11);
    auto fwd = [&](const Vec& x, const Vec& ww, const Vec& bb) {
        Vec o(N * C), m(N), s(N);
        layernorm_forward(x.data(), ww.data(), bb.data(), N, C, 1e-5, o.data(), m.data(), s.data());
        return o;
    };
    layernorm_forward(inp.data(), w.data(), b.data(), N, C, 1e-5, out.data(), mean.data(),
                      rstd.data());
    Vec dinp(N * C, 0.0), dw(C, 0.0), db(C, 0.0);
    layernorm_backward_input(r.data(), inp.data(), w.data(), mean.data(), rstd.data(), N, C,
                             dinp.data());
    layernorm_backward_weight(r.data(), inp.data(), mean.data(), rstd.data(), N, C, dw.data(),
                              db.data());
    expect_gradient(
        inp, [&](const Vec& x) { return fwd(x, w, b); }, r, dinp, 1e-6, "inp");
    expect_gradient(
        w, [&](const Vec& x) { return fwd(inp, x, b); }, r, dw, 1e-6, "weight");
    expect_gradient(
        b, [&](const Vec& x) { return fwd(inp, w, x); }, r, db, 1e-6, "bias");
}

TEST(RmsNorm, BackwardMatchesFiniteDifferences) {
    const int64_t N = 3, C = 6;
    Vec inp = random_vec(N * C, 12), w = random_vec(C, 13), r = random_vec(N * C, 14);
    auto fwd = [&](const Vec& x, const Vec& ww) {
        Vec o(N * C), s(N);
        rmsnorm_forward(x.data(), ww.data(), N, C, 1e-6, o.data(), s.data());
        return o;
    };
    Vec out(N * C), rstd(N);
    rmsnorm_forward(inp.data(), w.data(), N, C, 1e-6, out.data(), rstd.data());
    // Independent check of the statistic: rstd = 1 / sqrt(mean(x^2) + eps).
    double ms = 0;
    for (int64_t c = 0; c < C; ++c) ms += inp[c] * inp[c] / C;
    EXPECT_NEAR(rstd[0], 1.0 / std::sqrt(ms + 1e-6), 1e-12);
    Vec dinp(N * C, 0.0), dw(C, 0.0);
    rmsnorm_backward_input(r.data(), inp.data(), w.data(), rstd.data(), N, C, dinp.data());
    rmsnorm_backward_weight(r.data(), inp.data(), rstd.data(), N, C, dw.data());
    expect_gradient(
        inp, [&](const Vec& x) { return fwd(x, w); }, r, dinp, 1e-6, "inp");
    expect_gradient(
        w, [&](const Vec& x) { return fwd(inp, x); }, r, dw, 1e-6, "weight");
}

TEST(Gelu, MatchesTheTanhFormulaAndItsDerivative) {
    // GELU(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), evaluated here directly.
    Vec x = {-3.0, -1.0, -0.1, 0.0, 0.5, 1.0, 2.5};
    Vec out(x.size());
    gelu_forward(x.data(), static_cast<int64_t>(x.size()), out.data());
    for (size_t i = 0; i < x.size(); ++i) {
        double u = std::sqrt(2.0 / M_PI) * (x[i] + 0.044715 * x[i] * x[i] * x[i]);
        EXPECT_NEAR(out[i], 0.5 * x[i] * (1.0 + std::tanh(u)), 1e-12);
    }
    Vec r = random_vec(x.size(), 15), dx(x.size(), 0.0);
    gelu_backward(x.data(), r.data(), static_cast<int64_t>(x.size()), dx.data());
    expect_gradient(
        x,
        [&](const Vec& v) {
            Vec o(v.size());
            gelu_forward(v.data(), static_cast<int64_t>(v.size()), o.data());
            return o;
        },
        r, dx);
    // The pair that keeps tanh: the same output, and the same gradient written into a buffer
    // of garbage.
    Vec kept(x.size()), th(x.size()), dk(x.size(), 1e30);
    gelu_forward_keeping(x.data(), static_cast<int64_t>(x.size()), kept.data(), th.data());
    gelu_backward_kept(x.data(), th.data(), r.data(), static_cast<int64_t>(x.size()), dk.data());
    for (size_t i = 0; i < x.size(); ++i) {
        EXPECT_EQ(kept[i], out[i]) << i;
        EXPECT_NEAR(dk[i], dx[i], 1e-12) << i;
    }
}

TEST(SwiGlu, ForwardAndBackward) {
    const int64_t N = 3, H = 4;
    Vec inp = random_vec(N * 2 * H, 16), out(N * H);
    swiglu_forward(inp.data(), N, H, out.data());
    double g = inp[0], u = inp[H];
    EXPECT_NEAR(out[0], g / (1 + std::exp(-g)) * u, 1e-12);
    Vec r = random_vec(N * H, 17), dinp(N * 2 * H, 0.0);
    swiglu_backward(inp.data(), r.data(), N, H, dinp.data());
    expect_gradient(
        inp,
        [&](const Vec& x) {
            Vec o(N * H);
            swiglu_forward(x.data(), N, H, o.data());
            return o;
        },
        r, dinp);
}

TEST(Rope, RotatesPairsSoScoresDependOnRelativePosition) {
    const int64_t D = 8;
    Vec q = random_vec(D, 18), k = random_vec(D, 19);
    auto rotated = [&](const Vec& x, int64_t pos) {
        Vec o(D);
        rope_forward(x.data(), 1, 1, 1, D, 10000.0, pos, o.data());
        return o;
    };
    // Position 0 is the identity; rotation keeps the norm.
    Vec q0 = rotated(q, 0);
    for (int64_t i = 0; i < D; ++i) EXPECT_NEAR(q0[i], q[i], 1e-12);
    EXPECT_NEAR(dot(rotated(q, 7), rotated(q, 7)), dot(q, q), 1e-10);
    // <R(m) q, R(n) k> depends only on m - n: what makes rotary embeddings relative.
    EXPECT_NEAR(dot(rotated(q, 5), rotated(k, 2)), dot(rotated(q, 13), rotated(k, 10)), 1e-10);
    EXPECT_GT(std::abs(dot(rotated(q, 5), rotated(k, 2)) - dot(rotated(q, 5), rotated(k, 4))),
              1e-6);
}

TEST(Rope, BackwardIsTheTransposedRotation) {
    const int64_t B = 2, T = 3, H = 2, D = 4;
    Vec x = random_vec(B * T * H * D, 20), r = random_vec(B * T * H * D, 21);
    Vec dx(x.size(), 0.0);
    rope_backward(r.data(), B, T, H, D, 500000.0, 3, dx.data());
    expect_gradient(
        x,
        [&](const Vec& v) {
            Vec o(v.size());
            rope_forward(v.data(), B, T, H, D, 500000.0, 3, o.data());
            return o;
        },
        r, dx);
}

TEST(Embedding, GathersRowsAndScattersGradients) {
    const int64_t V = 5, C = 3, N = 4;
    std::vector<int32_t> tokens = {3, 1, 3, 0};
    Vec table = random_vec(V * C, 22), out(N * C);
    embedding_forward(tokens.data(), table.data(), N, C, out.data());
    for (int64_t c = 0; c < C; ++c) EXPECT_EQ(out[2 * C + c], table[3 * C + c]);
    Vec r = random_vec(N * C, 23), dtable(V * C, 0.0);
    embedding_backward(tokens.data(), r.data(), N, C, dtable.data());
    expect_gradient(
        table,
        [&](const Vec& t) {
            Vec o(N * C);
            embedding_forward(tokens.data(), t.data(), N, C, o.data());
            return o;
        },
        r, dtable);
    const int64_t B = 2, T = 2;
    Vec wpe = random_vec(T * C, 24), dwpe(T * C, 0.0);
    positions_backward(r.data(), B, T, C, dwpe.data());
    expect_gradient(
        wpe,
        [&](const Vec& p) {
            Vec o(B * T * C, 0.0);
            positions_forward(p.data(), B, T, C, o.data());
            return o;
        },
        r, dwpe);
}

namespace {

// Attention with the (T,T) score matrix written out, in double: the reference.
Vec naive_attention(const Vec& q, const Vec& k, const Vec& v, int64_t B, int64_t T, int64_t H,
                    int64_t KV, int64_t D) {
    Vec out(B * T * H * D, 0.0);
    for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < H; ++h) {
            int64_t kh = h / (H / KV);
            for (int64_t t = 0; t < T; ++t) {
                std::vector<double> s(t + 1);
                double mx = -1e300;
                for (int64_t t2 = 0; t2 <= t; ++t2) {
                    double d = 0;
                    for (int64_t i = 0; i < D; ++i)
                        d += q[((b * T + t) * H + h) * D + i] * k[((b * T + t2) * KV + kh) * D + i];
                    s[t2] = d / std::sqrt(static_cast<double>(D));
                    mx = std::max(mx, s[t2]);
                }
                double z = 0;
                for (auto& x : s) z += (x = std::exp(x - mx));
                for (int64_t t2 = 0; t2 <= t; ++t2)
                    for (int64_t i = 0; i < D; ++i)
                        out[((b * T + t) * H + h) * D + i] +=
                            s[t2] / z * v[((b * T + t2) * KV + kh) * D + i];
            }
        }
    return out;
}

} // namespace

TEST(Attention, ForwardMatchesTheMaterialisedSoftmax) {
    const int64_t B = 2, T = 5, H = 4, KV = 2, D = 3;
    Vec q = random_vec(B * T * H * D, 25, 2.0), k = random_vec(B * T * KV * D, 26, 2.0),
        v = random_vec(B * T * KV * D, 27);
    Vec out(B * T * H * D), lse(B * H * T);
    attention_forward(q.data(), k.data(), v.data(), B, T, H, KV, D, out.data(), lse.data());
    Vec ref = naive_attention(q, k, v, B, T, H, KV, D);
    for (size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(out[i], ref[i], 1e-12);
    // The first position attends only to itself.
    for (int64_t i = 0; i < D; ++i) EXPECT_NEAR(out[i], v[i], 1e-12);
    // Float agrees with double.
    auto fq = to_float(q), fk = to_float(k), fv = to_float(v);
    std::vector<float> fo(out.size()), fl(lse.size());
    attention_forward(fq.data(), fk.data(), fv.data(), B, T, H, KV, D, fo.data(), fl.data());
    for (size_t i = 0; i < fo.size(); ++i) EXPECT_NEAR(fo[i], out[i], 1e-5);
}

TEST(Attention, BackwardMatchesFiniteDifferences) {
    const int64_t B = 1, T = 4, H = 4, KV = 2, D = 3;
    Vec q = random_vec(B * T * H * D, 28), k = random_vec(B * T * KV * D, 29),
        v = random_vec(B * T * KV * D, 30), r = random_vec(B * T * H * D, 31);
    auto fwd = [&](const Vec& qq, const Vec& kk, const Vec& vv) {
        Vec o(B * T * H * D), l(B * H * T);
        attention_forward(qq.data(), kk.data(), vv.data(), B, T, H, KV, D, o.data(), l.data());
        return o;
    };
    Vec out(B * T * H * D), lse(B * H * T);
    attention_forward(q.data(), k.data(), v.data(), B, T, H, KV, D, out.data(), lse.data());
    Vec dq(q.size(), 0.0), dk(k.size(), 0.0), dv(v.size(), 0.0);
    attention_backward(r.data(), q.data(), k.data(), v.data(), out.data(), lse.data(), B, T, H, KV,
                       D, dq.data(), dk.data(), dv.data());
    expect_gradient(
        q, [&](const Vec& x) { return fwd(x, k, v); }, r, dq, 1e-6, "q");
    expect_gradient(
        k, [&](const Vec& x) { return fwd(q, x, v); }, r, dk, 1e-6, "k");
    expect_gradient(
        v, [&](const Vec& x) { return fwd(q, k, x); }, r, dv, 1e-6, "v");
}

TEST(CrossEntropy, IsTheNegativeLogSoftmaxOfTheTarget) {
    const int64_t N = 3, V = 6;
    Vec logits = random_vec(N * V, 32, 3.0);
    logits[4] = 500.0; // large logits stay finite (the max is subtracted first)
    std::vector<int32_t> targets = {4, 0, 5};
    Vec losses(N), lse(N);
    cross_entropy_forward(logits.data(), targets.data(), N, V, losses.data(), lse.data());
    for (int64_t n = 0; n < N; ++n) {
        double mx = *std::max_element(logits.begin() + n * V, logits.begin() + (n + 1) * V);
        double z = 0;
        for (int64_t i = 0; i < V; ++i) z += std::exp(logits[n * V + i] - mx);
        EXPECT_NEAR(losses[n], mx + std::log(z) - logits[n * V + targets[n]], 1e-10);
        EXPECT_TRUE(std::isfinite(losses[n]));
    }
    Vec dl = random_vec(N, 33), dlogits(N * V, 0.0);
    cross_entropy_backward(logits.data(), targets.data(), lse.data(), dl.data(), N, V,
                           dlogits.data());
    for (int64_t n = 0; n < N; ++n) {
        double row = 0;
        for (int64_t i = 0; i < V; ++i) row += dlogits[n * V + i];
        EXPECT_NEAR(row, 0.0, 1e-10); // softmax sums to one, the target takes one away
    }
    logits[4] = 1.5;
    cross_entropy_forward(logits.data(), targets.data(), N, V, losses.data(), lse.data());
    cross_entropy_backward(logits.data(), targets.data(), lse.data(), dl.data(), N, V,
                           dlogits.data());
    expect_gradient(
        logits,
        [&](const Vec& z) {
            Vec l(N), s(N);
            cross_entropy_forward(z.data(), targets.data(), N, V, l.data(), s.data());
            return l;
        },
        dl, dlogits);
}

TEST(AdamW, FirstStepMovesEachWeightByTheLearningRate) {
    // After one step the bias-corrected moments are g and g^2, so the update is
    // lr * (g / (|g| + eps) + weight_decay * p): about lr in the direction of the gradient.
    Vec p = {1.0, -2.0, 0.5}, g = {0.3, -4.0, 1e-3}, m(3, 0.0), v(3, 0.0);
    AdamWConfig c;
    c.lr = 0.1;
    c.weight_decay = 0.01;
    Vec before = p;
    adamw_step(g.data(), 3, c, 1, p.data(), m.data(), v.data());
    for (int i = 0; i < 3; ++i) {
        double expected =
            before[i] - c.lr * (g[i] / (std::abs(g[i]) + c.eps) + c.weight_decay * before[i]);
        EXPECT_NEAR(p[i], expected, 1e-12);
        EXPECT_NEAR(m[i], (1 - c.beta1) * g[i], 1e-15);
        EXPECT_NEAR(v[i], (1 - c.beta2) * g[i] * g[i], 1e-15);
    }
}

TEST(GradNorm, SumOfSquaresAndScale) {
    Vec x = {3.0, 4.0};
    EXPECT_DOUBLE_EQ(sum_squares(x.data(), 2), 25.0);
    scale(x.data(), 2, 0.2);
    EXPECT_DOUBLE_EQ(x[0], 0.6000000000000001);
    std::vector<float> big(1 << 20, 1.0f);
    EXPECT_DOUBLE_EQ(sum_squares(big.data(), static_cast<int64_t>(big.size())), 1048576.0);
}

// The reducer's copy back of an averaged bucket: one pass that leaves what a copy and scale()
// would, bit for bit (the gradients must not depend on which of the two ran).
TEST(GradNorm, CopyScaledIsACopyThenScale) {
    std::vector<float> src = to_float(random_vec(1000, 7)), two(src.size()), one(src.size());
    two = src;
    scale(two.data(), static_cast<int64_t>(two.size()), 1.0 / 3.0);
    copy_scaled(src.data(), static_cast<int64_t>(src.size()), 1.0 / 3.0, one.data());
    for (size_t i = 0; i < src.size(); ++i) ASSERT_EQ(one[i], two[i]) << i;
}

TEST(Attention, LongSequencesSpanSeveralBlocks) {
    // Rows are processed in blocks of 64: 130 positions take three, the last one partial.
    const int64_t B = 1, T = 130, H = 2, KV = 1, D = 3;
    Vec q = random_vec(B * T * H * D, 34), k = random_vec(B * T * KV * D, 35),
        v = random_vec(B * T * KV * D, 36), r = random_vec(B * T * H * D, 37);
    Vec out(B * T * H * D), lse(B * H * T);
    attention_forward(q.data(), k.data(), v.data(), B, T, H, KV, D, out.data(), lse.data());
    Vec ref = naive_attention(q, k, v, B, T, H, KV, D);
    for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], ref[i], 1e-12) << i;
    Vec dq(q.size(), 0.0), dk(k.size(), 0.0), dv(v.size(), 0.0);
    attention_backward(r.data(), q.data(), k.data(), v.data(), out.data(), lse.data(), B, T, H, KV,
                       D, dq.data(), dk.data(), dv.data());
    auto fwd = [&](const Vec& qq, const Vec& kk, const Vec& vv) {
        Vec o(B * T * H * D), l(B * H * T);
        attention_forward(qq.data(), kk.data(), vv.data(), B, T, H, KV, D, o.data(), l.data());
        return o;
    };
    expect_gradient(
        k, [&](const Vec& x) { return fwd(q, x, v); }, r, dk, 1e-6, "k");
    expect_gradient(
        v, [&](const Vec& x) { return fwd(q, k, x); }, r, dv, 1e-6, "v");
    // q: a sample of coordinates from every block.
    for (int64_t t : {0, 63, 64, 100, 129}) {
        for (int64_t i = 0; i < H * D; ++i) {
            size_t at = static_cast<size_t>(t * H * D + i);
            Vec up = q, down = q;
            up[at] += 1e-5;
            down[at] -= 1e-5;
            double numeric = (dot(fwd(up, k, v), r) - dot(fwd(down, k, v), r)) / 2e-5;
            EXPECT_NEAR(dq[at], numeric, 1e-6 * (1 + std::abs(numeric))) << "q " << at;
        }
    }
}

TEST(VectorMath, ExpAndTanhAreAccurateInFloat) {
    double worst_exp = 0, worst_tanh = 0;
    for (float x = -80.0f; x <= 80.0f; x += 0.0137f) {
        double e = std::exp(static_cast<double>(x));
        worst_exp = std::max(worst_exp, std::abs(vexp(x) - e) / e);
    }
    for (float x = -12.0f; x <= 12.0f; x += 0.0011f)
        worst_tanh = std::max(worst_tanh, std::abs(vtanh(x) - std::tanh(static_cast<double>(x))));
    EXPECT_LT(worst_exp, 5e-7);
    EXPECT_LT(worst_tanh, 1e-6);
    EXPECT_EQ(vtanh(50.0f), 1.0f);
    EXPECT_EQ(vtanh(-50.0f), -1.0f);
    EXPECT_GT(vexp(-1000.0f), 0.0f); // clamped: tiny, never a denormal trap or NaN
    EXPECT_TRUE(std::isfinite(vexp(1000.0f)));
}
