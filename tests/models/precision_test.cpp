// precision_test.cpp: train.precision bf16 on the CPU. The units compute with bf16 values
// (weights cast where they are used, activations and their gradients rounded, float
// accumulation), keep what their backward needs in 2 bytes an element, and give losses and
// gradients close to f32's but not the same.
#include "model_fixtures.hpp"

#include <gtest/gtest.h>

#include <cmath>

using namespace dist;
using namespace dist::models;
using namespace dist::models::fixtures;

namespace {

const char* gpt = "gpt(vocab: 64, context: 16, layers: 2, heads: 2, width: 32)";
const char* llama =
    "llama(vocab: 64, context: 16, layers: 2, heads: 4, kv_heads: 2, width: 32, hidden: 64)";
const char* mixtral = "mixtral(vocab: 64, context: 16, layers: 2, heads: 4, kv_heads: 2, width: "
                      "32, experts: 4, top_k: 2, hidden: 32)";

Model make(const std::string& line, Precision precision) {
    return Model(spec_of(line), 5, Recompute::none, nullptr, precision);
}

/// Every parameter's values rounded to bf16 on the host.
void round_weights(Model& m) {
    for (Parameter& p : m.params().all()) {
        float* v = p.value.data<float>();
        for (int64_t i = 0; i < p.value.numel(); ++i)
            v[i] = kernels::bf16_to_f32(kernels::f32_to_bf16(v[i]));
    }
}

double loss_of(Model& m, const Data& d) {
    return m.loss(d.tokens, d.targets);
}

} // namespace

class Bf16 : public ::testing::TestWithParam<const char*> {};

// A bf16 model computes with its weights rounded to bf16: giving it weights that are bf16
// already changes nothing, where the same change moves an f32 model's loss.
TEST_P(Bf16, WeightsAreRoundedToBf16WhereTheyAreUsed) {
    ModelSpec spec = spec_of(GetParam());
    Data d = data(2, 16, static_cast<int32_t>(spec.vocab), 1);
    Model a = make(GetParam(), Precision::bf16), b = make(GetParam(), Precision::bf16);
    Model c = make(GetParam(), Precision::f32), e = make(GetParam(), Precision::f32);
    round_weights(b);
    round_weights(e);
    const double la = loss_of(a, d), lb = loss_of(b, d), lc = loss_of(c, d), le = loss_of(e, d);
    EXPECT_EQ(la, lb);
    EXPECT_NE(lc, le);
    // The rounding is real, and small: bf16 keeps 8 bits of mantissa.
    EXPECT_NE(la, lc);
    EXPECT_NEAR(la, lc, 0.01 * lc);
}

// The gradients of a bf16 backward point where f32's do, within bf16's precision.
TEST_P(Bf16, GradientsFollowF32s) {
    ModelSpec spec = spec_of(GetParam());
    Data d = data(2, 16, static_cast<int32_t>(spec.vocab), 2);
    Model a = make(GetParam(), Precision::bf16), c = make(GetParam(), Precision::f32);
    for (Model* m : {&a, &c}) {
        m->params().zero_grads();
        m->forward(0, d.tokens, d.targets);
        m->backward(0, 1.0);
    }
    auto& pa = a.params().all();
    auto& pc = c.params().all();
    ASSERT_EQ(pa.size(), pc.size());
    bool differ = false;
    for (size_t i = 0; i < pa.size(); ++i) {
        const float* ga = pa[i].grad.data<float>();
        const float* gc = pc[i].grad.data<float>();
        double dot = 0, na = 0, nc = 0;
        for (int64_t j = 0; j < pa[i].grad.numel(); ++j) {
            dot += static_cast<double>(ga[j]) * gc[j];
            na += static_cast<double>(ga[j]) * ga[j];
            nc += static_cast<double>(gc[j]) * gc[j];
            differ = differ || ga[j] != gc[j];
        }
        if (nc == 0) continue;
        EXPECT_GT(dot / std::sqrt(na * nc), 0.99) << pa[i].name;
        EXPECT_NEAR(std::sqrt(na / nc), 1.0, 0.05) << pa[i].name;
    }
    EXPECT_TRUE(differ);
}

// What a forward keeps for its backward is held in bf16: half the bytes of f32 or a little more
// (the norms' statistics and attention's log-sum-exp stay float, a row's worth each), and less
// for GPT-2's MLP, which in bf16 computes its GELU's tanh again rather than keeping it.
TEST_P(Bf16, KeepsItsActivationsInHalfTheBytes) {
    ModelSpec spec = spec_of(GetParam());
    Data d = data(4, 16, static_cast<int32_t>(spec.vocab), 3);
    auto& cpu = kernels::Allocator::cpu();
    int64_t kept[2];
    for (Precision pr : {Precision::f32, Precision::bf16}) {
        Model m = make(GetParam(), pr);
        const size_t before = cpu.bytes_in_use();
        m.forward(0, d.tokens, d.targets);
        kept[pr == Precision::bf16] = static_cast<int64_t>(cpu.bytes_in_use() - before);
    }
    double ratio = static_cast<double>(kept[1]) / static_cast<double>(kept[0]);
    EXPECT_GT(ratio, 0.35) << kept[1] << " of " << kept[0] << " bytes";
    EXPECT_LT(ratio, 0.55) << kept[1] << " of " << kept[0] << " bytes";
}

INSTANTIATE_TEST_SUITE_P(Models, Bf16, ::testing::Values(gpt, llama, mixtral));
