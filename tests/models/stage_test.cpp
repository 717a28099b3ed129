// stage_test.cpp: a model cut into pipeline stages computes what the whole model computes.
//
// The stages of a partition run in order by hand (forward through every stage, backward in
// reverse), as a pipeline schedule would for one microbatch. Together they must hold exactly
// the whole model's parameters (plus the last stage's copy of a tied embedding), give the same
// loss, and the same gradients once the tied copy's gradient is summed with the original's.
#include "model_fixtures.hpp"
#include "models/stage.hpp"

#include <gtest/gtest.h>

#include <cmath>

using namespace dist;
using namespace dist::models;
using namespace dist::models::fixtures;

namespace {

std::vector<StageSpan> cut(const std::vector<int64_t>& blocks_per_stage) {
    std::vector<StageSpan> spans;
    int64_t b = 0;
    for (size_t s = 0; s < blocks_per_stage.size(); ++s) {
        spans.push_back({b, b + blocks_per_stage[s], s == 0, s + 1 == blocks_per_stage.size()});
        b += blocks_per_stage[s];
    }
    return spans;
}

void expect_stages_match_model(const std::string& model_line,
                               const std::vector<int64_t>& blocks_per_stage) {
    ModelSpec spec = spec_of(model_line);
    Data d = data(2, 5, static_cast<int32_t>(spec.vocab), 4);
    Model whole(spec, 9);
    whole.params().zero_grads();
    double expect = whole.forward(0, d.tokens, d.targets);
    whole.backward(0, 1.0);

    std::vector<std::unique_ptr<Stage>> stages;
    for (const StageSpan& span : cut(blocks_per_stage))
        stages.push_back(std::make_unique<Stage>(spec, span, 9));
    Batch batch{d.tokens, d.targets};
    Tensor x = d.tokens;
    for (auto& s : stages) {
        s->params().zero_grads();
        x = s->forward(0, x, batch);
    }
    double sum = 0;
    for (int64_t i = 0; i < x.numel(); ++i) sum += x.data<float>()[i];
    EXPECT_NEAR(sum / static_cast<double>(x.numel()), expect, 1e-6 * std::abs(expect));
    Tensor g(x.shape());
    for (int64_t i = 0; i < g.numel(); ++i)
        g.data<float>()[i] = 1.0f / static_cast<float>(x.numel());
    for (auto s = stages.rbegin(); s != stages.rend(); ++s) {
        g = (*s)->backward_input(0, g);
        (*s)->backward_weight(0);
    }

    // Every parameter once, except the tied copies.
    int64_t held = 0;
    std::map<std::string, std::vector<float>> grads;
    for (auto& s : stages) {
        for (auto& p : s->params().all()) {
            held += p.value.numel();
            auto& acc = grads[p.name];
            acc.resize(static_cast<size_t>(p.grad.numel()));
            for (int64_t i = 0; i < p.grad.numel(); ++i)
                acc[static_cast<size_t>(i)] += p.grad.data<float>()[i];
            const Parameter* w = whole.params().find(p.name);
            ASSERT_NE(w, nullptr) << p.name;
            for (int64_t i = 0; i < p.value.numel(); ++i)
                ASSERT_EQ(p.value.data<float>()[i], w->value.data<float>()[i]) << p.name;
        }
    }
    int64_t copies = 0;
    for (auto& s : stages)
        for (const auto& name : s->tied_copies()) copies += s->params().find(name)->value.numel();
    EXPECT_EQ(held - copies, whole.params().count());
    EXPECT_EQ(grads.size(), whole.params().all().size());
    for (const Parameter& w : whole.params().all()) {
        const auto& acc = grads.at(w.name);
        for (int64_t i = 0; i < w.grad.numel(); ++i)
            ASSERT_NEAR(acc[static_cast<size_t>(i)], w.grad.data<float>()[i], 1e-6f) << w.name;
    }
}

} // namespace

TEST(Stage, GptInTwoStagesMatchesTheWholeModel) {
    // The head is tied to the embedding: the last stage holds a copy of wte.
    expect_stages_match_model("gpt(vocab: 12, context: 6, layers: 3, heads: 2, width: 8)", {1, 2});
}

TEST(Stage, LlamaInFourStagesWithAnEmptyOneMatchesTheWholeModel) {
    expect_stages_match_model(
        "llama(vocab: 12, context: 6, layers: 3, heads: 4, kv_heads: 2, width: 8, hidden: 12)",
        {1, 0, 1, 1});
}

TEST(Stage, TheTiedCopyStartsEqualToTheEmbedding) {
    ModelSpec spec = spec_of("gpt(vocab: 12, context: 6, layers: 2, heads: 2, width: 8)");
    Stage first(spec, {0, 1, true, false}, 3), last(spec, {1, 2, false, true}, 3);
    EXPECT_TRUE(first.tied_copies().empty());
    ASSERT_EQ(last.tied_copies(), std::vector<std::string>{"wte.weight"});
    const Parameter* a = first.params().find("wte.weight");
    const Parameter* b = last.params().find("wte.weight");
    ASSERT_TRUE(a && b);
    for (int64_t i = 0; i < a->value.numel(); ++i)
        ASSERT_EQ(a->value.data<float>()[i], b->value.data<float>()[i]);
    // Stages hold only their own blocks.
    EXPECT_EQ(first.params().find("h.1.ln_1.weight"), nullptr);
    EXPECT_NE(last.params().find("h.1.ln_1.weight"), nullptr);
    EXPECT_THROW(Stage(spec, {1, 3, false, true}, 3), std::invalid_argument);
}

// A whole backward frees each unit's state right after the unit: it never holds much more than
// the forward kept, and with full recomputation (each residual group keeps only its input) it
// holds a fraction of that. Measured on the host allocator, which counts every live tensor.
TEST(Stage, AWholeBackwardFreesEachUnitsStateAsItGoes) {
    const std::string line = "gpt(vocab: 256, context: 64, layers: 4, heads: 4, width: 128)";
    auto& host = kernels::Allocator::cpu();
    auto peaks = [&](Recompute recompute) {
        ModelSpec spec = spec_of(line);
        Data d = data(16, 64, 256, 3);
        Model m(spec, 1, recompute);
        const size_t base = host.bytes_in_use();
        m.forward(0, d.tokens, d.targets);
        const size_t kept = host.bytes_in_use() - base;
        host.reset_peak();
        m.backward(0, 1.0);
        return std::pair<double, double>(static_cast<double>(kept),
                                         static_cast<double>(host.peak_bytes_in_use() - base));
    };
    auto [kept, backward] = peaks(Recompute::none);
    auto [kept_recomputed, backward_recomputed] = peaks(Recompute::full);
    EXPECT_LT(backward, 1.2 * kept) << "kept " << kept << " bytes, backward peaked at " << backward;
    EXPECT_LT(kept_recomputed, 0.25 * kept);
    EXPECT_LT(backward_recomputed, 0.5 * backward)
        << "recomputed backward peaked at " << backward_recomputed << ", the other at " << backward;
}
