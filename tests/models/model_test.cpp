// model_test.cpp: models built from checked programs: gradients against finite differences,
// split backward against full backward, deterministic initialisation, parameter counts.
#include "model_fixtures.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

using namespace dist;
using namespace dist::models;
using namespace dist::models::fixtures;

namespace {

const char* tiny_gpt = "gpt(vocab: 11, context: 6, layers: 2, heads: 2, width: 8)";
const char* tiny_llama =
    "llama(vocab: 13, context: 6, layers: 2, heads: 4, kv_heads: 2, width: 8, hidden: 12)";

// Central differences of the loss against the backward pass, on the coordinates with the
// largest gradients of every parameter (float arithmetic: a loose but telling tolerance).
void expect_model_gradients(const std::string& model_line) {
    ModelSpec spec = spec_of(model_line);
    Model model(spec, 42);
    Data d = data(2, 5, static_cast<int32_t>(spec.vocab), 1);
    model.params().zero_grads();
    model.forward(0, d.tokens, d.targets);
    model.backward(0, 1.0);
    int checked = 0;
    for (auto& p : model.params().all()) {
        const float* g = p.grad.data<float>();
        int64_t best = 0;
        for (int64_t i = 1; i < p.value.numel(); ++i)
            if (std::abs(g[i]) > std::abs(g[best])) best = i;
        float* x = p.value.data<float>();
        const float h = 1e-2f;
        float keep = x[best];
        x[best] = keep + h;
        double up = model.forward(1, d.tokens, d.targets);
        x[best] = keep - h;
        double down = model.forward(2, d.tokens, d.targets);
        x[best] = keep;
        model.backward(1, 0.0); // release the saved state of the probes
        model.backward(2, 0.0);
        double numeric = (up - down) / (2.0 * h);
        EXPECT_NEAR(g[best], numeric, 2e-3 + 0.05 * std::abs(numeric))
            << p.name << "[" << best << "]";
        ++checked;
    }
    EXPECT_GT(checked, 10);
}

} // namespace

TEST(Model, GptGradientsMatchFiniteDifferences) {
    expect_model_gradients(tiny_gpt);
}

TEST(Model, LlamaGradientsMatchFiniteDifferences) {
    expect_model_gradients(tiny_llama);
}

TEST(Model, BuiltParametersMatchTheCheckersCount) {
    for (const char* m : {tiny_gpt, tiny_llama}) {
        ModelSpec spec = spec_of(m);
        Model model(spec, 1);
        EXPECT_EQ(model.params().count(), spec.parameters) << m;
    }
}

TEST(Model, SplitBackwardInAnyOrderEqualsFullBackward) {
    ModelSpec spec = spec_of(tiny_gpt);
    Data a = data(2, 4, 11, 3), b = data(2, 4, 11, 4);
    Model full(spec, 7), split(spec, 7);
    full.params().zero_grads();
    split.params().zero_grads();
    // F0 B0 F1 B1 against F0 F1 I1 I0 W0 W1: per-microbatch state must not mix.
    full.forward(0, a.tokens, a.targets);
    full.backward(0, 0.5);
    full.forward(1, b.tokens, b.targets);
    full.backward(1, 0.5);
    split.forward(0, a.tokens, a.targets);
    split.forward(1, b.tokens, b.targets);
    split.backward_input(1, 0.5);
    split.backward_input(0, 0.5);
    split.backward_weight(0);
    split.backward_weight(1);
    for (size_t i = 0; i < full.params().all().size(); ++i) {
        const auto& p = full.params().all()[i];
        const auto& q = split.params().all()[i];
        for (int64_t j = 0; j < p.grad.numel(); ++j)
            ASSERT_NEAR(p.grad.data<float>()[j], q.grad.data<float>()[j], 1e-6) << p.name;
    }
}

TEST(Model, InitialisationDependsOnSeedNameAndIndexOnly) {
    ModelSpec spec = spec_of("gpt(vocab: 64, context: 16, layers: 4, heads: 4, width: 64)");
    Model a(spec, 5), b(spec, 5), c(spec, 6);
    Parameter* wa = a.params().find("wte.weight");
    ASSERT_NE(wa, nullptr);
    EXPECT_EQ(0, std::memcmp(wa->value.raw(), b.params().find("wte.weight")->value.raw(),
                             wa->value.bytes()));
    EXPECT_NE(0, std::memcmp(wa->value.raw(), c.params().find("wte.weight")->value.raw(),
                             wa->value.bytes()));
    // Element i of a parameter is the same whichever shard asks for it.
    EXPECT_EQ(wa->value.data<float>()[1234], initial_value(5, "wte.weight", 1234, wa->init));
    auto std_of = [](const Parameter& p) {
        double s = 0;
        for (int64_t i = 0; i < p.value.numel(); ++i)
            s += static_cast<double>(p.value.data<float>()[i]) * p.value.data<float>()[i];
        return std::sqrt(s / static_cast<double>(p.value.numel()));
    };
    EXPECT_NEAR(std_of(*wa), 0.02, 0.002);
    // GPT-2 scales residual projections by 1 / sqrt(2 x layers).
    EXPECT_NEAR(std_of(*a.params().find("h.0.mlp.proj.weight")), 0.02 / std::sqrt(8.0), 0.001);
    EXPECT_EQ(a.params().find("h.0.ln_1.weight")->value.data<float>()[3], 1.0f);
    EXPECT_EQ(a.params().find("h.0.attn.qkv.bias")->value.data<float>()[3], 0.0f);
}

// The initial weights are independent normal draws: their moments, the share within one
// standard deviation and the correlation of neighbours (the two halves of one Box-Muller pair,
// and the last of one pair with the first of the next) are those of N(0, std^2). Bounds are
// five standard errors of each statistic over n = 2^20 draws; a whole parameter filled a pair
// at a time holds what each element's own function gives, odd lengths included.
TEST(Model, InitialWeightsAreIndependentNormalDraws) {
    const double sd = 0.05;
    ParameterStore store;
    const Parameter& p = store.add("w", {1024, 1024}, Init::normal(sd), true, 11);
    const float* x = p.value.data<float>();
    const int64_t n = p.value.numel();
    double sum = 0, sq = 0, fourth = 0, within = 0, pair = 0, across = 0;
    for (int64_t i = 0; i < n; ++i) {
        const double z = x[i] / sd;
        sum += z;
        sq += z * z;
        fourth += z * z * z * z;
        within += std::abs(z) < 1.0 ? 1.0 : 0.0;
        if (i + 1 < n) (i % 2 == 0 ? pair : across) += z * (x[i + 1] / sd);
    }
    const double N = static_cast<double>(n), se = 1.0 / std::sqrt(N);
    EXPECT_NEAR(sum / N, 0.0, 5 * se);
    EXPECT_NEAR(sq / N, 1.0, 5 * std::sqrt(2.0) * se);         // var(z^2) = 2
    EXPECT_NEAR(fourth / N, 3.0, 5 * std::sqrt(96.0) * se);    // var(z^4) = 105 - 9
    EXPECT_NEAR(within / N, 0.682689, 5 * 0.466 * se);         // sqrt(p (1 - p))
    EXPECT_NEAR(pair / (N / 2), 0.0, 5 * std::sqrt(2.0) * se); // var(z z') = 1, n/2 terms
    EXPECT_NEAR(across / (N / 2), 0.0, 5 * std::sqrt(2.0) * se);
    for (int64_t i : {int64_t{0}, int64_t{1}, int64_t{2}, int64_t{77}, n - 2, n - 1})
        EXPECT_EQ(x[i], initial_value(11, "w", i, p.init)) << i;
    const Parameter& odd = store.add("b", {7}, Init::normal(sd), false, 11);
    for (int64_t i = 0; i < 7; ++i)
        EXPECT_EQ(odd.value.data<float>()[i], initial_value(11, "b", i, odd.init)) << i;
    // A shard evaluates each element on its own: the same values at the same global indices.
    const Parameter& cols =
        store.add("w_cols", {4, 9}, Init::normal(sd), true, 11, Shard::range(1, 3, 8));
    ParameterStore whole;
    const Parameter& all = whole.add("w_cols", {4, 9}, Init::normal(sd), true, 11);
    for (int64_t i = 0; i < cols.value.numel(); ++i)
        EXPECT_EQ(cols.value.data<float>()[i],
                  all.value.data<float>()[cols.shard.global_index({4, 9}, i)])
            << i;
}

TEST(Model, InitialLossIsNearTheUniformOne) {
    // With small random weights the predictions are nearly uniform: loss ~ ln(vocab).
    ModelSpec spec = spec_of("gpt(vocab: 64, context: 16, layers: 2, heads: 2, width: 32)");
    Model m(spec, 1);
    Data d = data(4, 16, 64, 9);
    double loss = m.forward(0, d.tokens, d.targets);
    EXPECT_NEAR(loss, std::log(64.0), 0.1);
}

TEST(Model, BadTokensAreErrorsNotCrashes) {
    ModelSpec spec = spec_of(tiny_gpt);
    Model m(spec, 1);
    Data d = data(1, 4, 11, 1);
    d.tokens.data<int32_t>()[2] = 11;
    EXPECT_THROW(m.forward(0, d.tokens, d.targets), std::out_of_range);
    Data long_seq = data(1, 7, 11, 1); // context is 6
    EXPECT_THROW(m.forward(1, long_seq.tokens, long_seq.targets), std::out_of_range);
}

TEST(Model, FullRecomputationGivesTheSameGradientsWithLessSavedState) {
    ModelSpec spec = spec_of("gpt(vocab: 64, context: 16, layers: 3, heads: 2, width: 32)");
    Data d = data(4, 16, 64, 5);
    Model plain(spec, 2), recomputed(spec, 2, Recompute::full);
    auto& alloc = kernels::Allocator::cpu();
    plain.params().zero_grads();
    recomputed.params().zero_grads();
    size_t base = alloc.bytes_in_use();
    double a = plain.forward(0, d.tokens, d.targets);
    size_t kept_plain = alloc.bytes_in_use() - base;
    base = alloc.bytes_in_use();
    double b = recomputed.forward(0, d.tokens, d.targets);
    size_t kept_recomputed = alloc.bytes_in_use() - base;
    EXPECT_EQ(a, b);
    EXPECT_LT(kept_recomputed * 2, kept_plain) << kept_recomputed << " vs " << kept_plain;
    plain.backward(0, 1.0);
    recomputed.backward(0, 1.0);
    for (size_t i = 0; i < plain.params().all().size(); ++i) {
        const auto& p = plain.params().all()[i];
        const auto& q = recomputed.params().all()[i];
        EXPECT_EQ(0, std::memcmp(p.grad.raw(), q.grad.raw(), p.grad.bytes())) << p.name;
    }
}
