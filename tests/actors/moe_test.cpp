// moe_test.cpp: mixtures of experts and expert parallelism in the checker, the plan and the
// simulator.
//
// Parameter counts are written out here from each model's published architecture (its Hugging
// Face config) and held against the totals its authors state: Mixtral 8x7B 46.7B with 12.9B
// active per token (Mistral AI's release), DeepSeekMoE 16B 16.4B with 2.8B active (Dai et al.
// 2024, arXiv 2401.06066, section 5). Plan figures follow from the layer's definition: a rank
// holds 1/ep of the routed experts, each of its N tokens sends top_k copies of its activation
// out and gets them back.
#include "actors/plan/execute.hpp"
#include "actors/plan/graph_json.hpp"
#include "actors/plan/lower.hpp"
#include "actors/plan/stages.hpp"
#include "actors/plan/verify.hpp"
#include "actors/sim/simulate.hpp"
#include "lang/check.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numeric>
#include <random>

using namespace dist;
using namespace dist::plan;

namespace {

lang::FrontendOptions opts(std::vector<std::string> overrides = {}) {
    lang::FrontendOptions o;
    o.search_roots = {std::filesystem::path(DIST_SOURCE_DIR) / "stdlib"};
    o.overrides = std::move(overrides);
    o.check_files = false;
    return o;
}

lang::CheckResult check(const std::string& text, std::vector<std::string> overrides = {}) {
    return lang::check_text("t.dist", text, opts(std::move(overrides)));
}

// A small Mixtral-shaped model on a CPU mesh of dp replicas.
std::string tiny(const std::string& mesh = "dp: 4\n    ep: 2",
                 const std::string& moe_args = "experts: 4, top_k: 2, hidden: 128") {
    return "import \"std/moe.dist\"\n"
           "model = mixtral(vocab: 256, context: 64, layers: 2, heads: 4, kv_heads: 2, width: "
           "64, " +
           moe_args +
           ")\n"
           "mesh {\n    devices: cpu\n    " +
           mesh +
           "\n}\n"
           "train {\n    data: synthetic()\n    batch: 8\n    steps: 5\n}\n";
}

Program checked(const std::string& text, std::vector<std::string> overrides = {}) {
    lang::CheckResult r = check(text, std::move(overrides));
    EXPECT_TRUE(r.ok()) << r.report();
    return r.ok() ? *r.program : Program{};
}

Graph lowered(const Program& p) {
    PlanResult r = lower(p);
    EXPECT_TRUE(r.ok()) << render_errors(p.file, r.errors);
    return r.ok() ? *r.graph : Graph{};
}

const LayerSpec* first_moe(const Program& p) {
    for (const BlockSpec& b : p.model.blocks)
        for (const ModelItemSpec& it : b.items)
            for (const LayerSpec& l : it.layers)
                if (l.kind == LayerKind::moe) return &l;
    return nullptr;
}

} // namespace

TEST(MixtureOfExperts, MixtralCountsEqualThePublishedOnes) {
    Program p = checked("import \"std/moe.dist\"\nmodel = mixtral_8x7b()\nmesh {\n    devices: "
                        "h100 x 64\n    tp: 8\n    pp: 8\n}\n"
                        "train {\n    batch: 8\n    steps: 1\n}\n");
    // 32 blocks of grouped-query attention (32 query heads, 8 key/value heads of 128), two
    // RMSNorms and 8 SwiGLU experts of 14336 behind a router; untied embedding and head.
    const int64_t C = 4096, attention = C * C + 2 * C * 1024 + C * C;
    const int64_t experts = 8 * 3 * C * 14336, router = 8 * C;
    const int64_t block = attention + 2 * C + experts + router;
    const int64_t total = 32 * block + 2 * int64_t{32000} * C + C;
    EXPECT_EQ(p.model.parameters, total);
    const int64_t active = total - 32 * (6 * 3 * C * 14336);
    EXPECT_EQ(p.model.active_parameters, active);
    EXPECT_NEAR(static_cast<double>(p.model.parameters), 46.7e9, 0.05e9);
    EXPECT_NEAR(static_cast<double>(p.model.active_parameters), 12.9e9, 0.05e9);
    const LayerSpec* moe = first_moe(p);
    ASSERT_NE(moe, nullptr);
    EXPECT_EQ(moe->name, "layers.0.block_sparse_moe");
    EXPECT_EQ(moe->router, RouterScore::softmax);
    EXPECT_TRUE(moe->normalize);
    EXPECT_EQ(moe->capacity, 0.0); // dropless
}

TEST(MixtureOfExperts, DeepSeekCountsEqualThePublishedOnesWithADenseFirstBlock) {
    Program p = checked("import \"std/moe.dist\"\nmodel = deepseek_moe_16b()\nmesh {\n    devices: "
                        "h100 x 32\n    tp: 8\n    pp: 4\n}\n"
                        "train {\n    batch: 8\n    steps: 1\n}\n");
    // 28 blocks of multi-head attention; the first with a dense SwiGLU MLP of 10944, the other
    // 27 with 64 routed experts of 1408 (6 per token) and 2 shared ones, behind a router.
    const int64_t C = 2048, attention = 4 * C * C, expert = 3 * C * 1408;
    const int64_t dense = attention + 2 * C + 3 * C * 10944;
    const int64_t moe = attention + 2 * C + 64 * expert + 2 * expert + 64 * C;
    const int64_t total = dense + 27 * moe + 2 * int64_t{102400} * C + C;
    EXPECT_EQ(p.model.parameters, total);
    EXPECT_EQ(p.model.active_parameters, total - 27 * 58 * expert);
    EXPECT_NEAR(static_cast<double>(p.model.parameters), 16.4e9, 0.05e9);
    EXPECT_NEAR(static_cast<double>(p.model.active_parameters), 2.8e9, 0.05e9);
    // Two `repeat`s under one label number their blocks on: layers.0 dense, layers.1 ... routed.
    ASSERT_EQ(p.model.blocks.size(), 28u);
    EXPECT_EQ(p.model.blocks[0].name, "layers.0");
    EXPECT_EQ(p.model.blocks[1].name, "layers.1");
    EXPECT_EQ(p.model.blocks[27].name, "layers.27");
    EXPECT_EQ(p.model.blocks[0].items[1].layers[1].kind, LayerKind::mlp);
    EXPECT_EQ(p.model.blocks[1].items[1].layers[1].kind, LayerKind::moe);
    EXPECT_EQ(p.model.blocks[1].items[1].layers[1].name, "layers.1.mlp");
    const LayerSpec* m = first_moe(p);
    ASSERT_NE(m, nullptr);
    EXPECT_FALSE(m->normalize);
    EXPECT_EQ(m->shared_experts, 2);
    EXPECT_EQ(m->shared_hidden, 1408);
}

TEST(MixtureOfExperts, ExpertParallelismIsCheckedWithLocatedReasons) {
    auto report = [](const std::string& text) { return check(text).report(); };
    // ep divides dp x cp, and every layer's experts.
    std::string r = report(tiny("dp: 2\n    ep: 4"));
    EXPECT_NE(r.find("t.dist:6:5: error: ep = 4 does not divide the 2 data-parallel ranks"),
              std::string::npos)
        << r;
    r = report(tiny("dp: 6\n    ep: 3"));
    EXPECT_NE(r.find("ep = 3 does not divide the 4 experts of `layers.0.block_sparse_moe`"),
              std::string::npos)
        << r;
    // ep without experts.
    std::string dense = tiny("dp: 2\n    ep: 2");
    dense.replace(dense.find("import \"std/moe.dist\""), 21, "import \"std/llama.dist\"");
    dense.replace(dense.find("model = mixtral"), 15, "model = llama");
    dense.replace(dense.find("experts: 4, top_k: 2, hidden: 128"), 33, "hidden: 128");
    r = report(dense);
    EXPECT_NE(r.find("and the model has none"), std::string::npos) << r;
    // Every ZeRO stage combines with expert parallelism.
    for (const char* zero : {"zero: 1", "zero: 2", "zero: 3"}) {
        r = report(tiny(std::string("dp: 4\n    ep: 2\n    ") + zero));
        EXPECT_EQ(r.find("error"), std::string::npos) << zero << ": " << r;
    }
    // The layer's own arguments.
    r = report(tiny("dp: 1", "experts: 4, top_k: 5, hidden: 128"));
    EXPECT_NE(r.find("top_k 5 is more than the 4 experts"), std::string::npos) << r;
    // tp splits each expert's hidden size.
    r = report(tiny("dp: 1\n    tp: 3", "experts: 4, top_k: 2, hidden: 128"));
    EXPECT_NE(r.find("hidden size 128 (`layers.0.block_sparse_moe`)"), std::string::npos) << r;
}

TEST(MixtureOfExperts, TheLayerRefusesBadArgumentsWhereTheyAre) {
    const std::string head = "model m(v) {\n    e: embedding(v, 64)\n    p: position_embedding(64, "
                             "64)\n    h: repeat 2 {\n        x: ";
    const std::string tail = "\n    }\n    l: lm_head(64, v)\n    c: cross_entropy()\n}\n"
                             "model = m(v: 256)\nmesh {\n    devices: cpu\n}\ntrain {\n"
                             "    batch: 8\n    steps: 1\n}\n";
    auto report = [&](const std::string& layer) { return check(head + layer + tail).report(); };
    // Located at the value: line 5, after the 8 spaces and `x: ` before the layer.
    const std::string bad = "moe(64, experts: 4, top_k: 1, hidden: 32, router: sigmoi)";
    std::string r = report(bad);
    const std::string at = "t.dist:5:" + std::to_string(8 + 3 + bad.find("sigmoi") + 1) + ":";
    EXPECT_NE(r.find(at + " error: unknown router `sigmoi`"), std::string::npos) << r;
    r = report("moe(64, experts: 4, top_k: 1, hidden: 32, capacity: -1.0)");
    EXPECT_NE(r.find("`capacity` must be 0 or more"), std::string::npos) << r;
    r = report("moe(64, experts: 4, top_k: 1, hidden: 32, shared_hidden: 16)");
    EXPECT_NE(r.find("`shared_hidden` without `shared` experts"), std::string::npos) << r;
    EXPECT_TRUE(check(head +
                      "moe(64, experts: 4, top_k: 1, hidden: 32, router: sigmoid, capacity: 1.25, "
                      "aux_loss: 0.01, shared: 1, shared_hidden: 16)" +
                      tail)
                    .ok());
    // Outside the blocks, and a `repeat` after the head.
    std::string outside = head + "moe(64, experts: 4, top_k: 1, hidden: 32)" + tail;
    outside.replace(outside.find("l: lm_head"), 0,
                    "z: moe(64, experts: 4, top_k: 1, hidden: 32)\n    ");
    r = check(outside).report();
    EXPECT_NE(r.find("a mixture of experts sits in the repeated blocks"), std::string::npos) << r;
    std::string late = head + "mlp(64, hidden: 32)" + tail;
    late.replace(late.find("    c: cross_entropy()"), 0,
                 "    g: repeat 1 {\n        y: mlp(64, hidden: 32)\n    }\n");
    r = check(late).report();
    EXPECT_NE(r.find("a model's `repeat`s of blocks come one after another"), std::string::npos)
        << r;
}

TEST(MixtureOfExperts, TrainsOnCpuMeshesAndIsRefusedAtTheLayerOnGpus) {
    EXPECT_EQ(checked(tiny()).train.training_refusal, "");
    Program p = checked(tiny(), {"mesh.devices=h100"});
    EXPECT_NE(p.train.training_refusal.find("std/moe.dist:"), std::string::npos)
        << p.train.training_refusal;
    EXPECT_NE(p.train.training_refusal.find("a mixture of experts trains on `cpu` devices"),
              std::string::npos)
        << p.train.training_refusal;
}

TEST(MixtureOfExperts, ARankHoldsItsShareOfTheExpertsAndSendsTopKCopies) {
    // dp 4, ep 2: each rank holds 2 of the 4 experts of every block; the experts' gradients are
    // reduced over the dp / ep = 2 ranks that hold the same ones.
    Program p = checked(tiny());
    Program whole = checked(tiny("dp: 4"));
    Graph g = lowered(p), one = lowered(whole);
    ASSERT_EQ(g.stages.size(), 1u);
    const LayerSpec& moe = *first_moe(p);
    const int64_t expert = 3 * 64 * 128; // SwiGLU: three matrices
    EXPECT_EQ(one.stages[0].parameters - g.stages[0].parameters, 2 /* blocks */ * 2 * expert);
    EXPECT_EQ(one.stages[0].parameters, p.model.parameters);
    // A dispatch and a combine per block; each rank's N tokens send top_k copies of C floats,
    // and the busiest of the two ranks receives more than that by the imbalance of routing by
    // chance (checked against sampled routings below).
    const int64_t N = p.train.microbatch_size * 64;
    EXPECT_EQ(g.stages[0].all_to_alls, 2 * 2);
    const double busiest = expert_rank_imbalance(moe, 2, static_cast<double>(N));
    EXPECT_GT(busiest, 1.0);
    EXPECT_EQ(g.stages[0].all_to_all_bytes,
              static_cast<int64_t>(static_cast<double>(N * moe.top_k) * busiest * 64 * 4));
    EXPECT_EQ(one.stages[0].all_to_alls, 0);
    int64_t expert_bytes = 0;
    const size_t dense =
        g.stages[0].buckets.size() - static_cast<size_t>(g.stages[0].expert_buckets);
    for (size_t i = dense; i < g.stages[0].buckets.size(); ++i)
        expert_bytes += g.stages[0].buckets[i];
    EXPECT_EQ(expert_bytes, 2 * 2 * expert * 4);
    // ep = dp: every replica holds different experts, and nothing reduces their gradients.
    Graph all = lowered(checked(tiny("dp: 4\n    ep: 4")));
    EXPECT_EQ(all.stages[0].expert_buckets, 0);
    EXPECT_EQ(all.stages[0].parameters, p.model.parameters - 2 * 3 * expert);
}

// The kernels a calibrated profile prices a stage by are the ones the layer runs: each of the
// rank's experts its own pair of products on its share of the copies, and together the FLOPs
// the plan counts for the stage; the dispatch and combine loops run on one thread.
TEST(MixtureOfExperts, TheStagesKernelsAreTheExpertsTheRankHoldsWithTheStagesFlops) {
    for (const char* mesh : {"dp: 4", "dp: 4\n    ep: 2", "dp: 4\n    ep: 4"}) {
        SCOPED_TRACE(mesh);
        Program p = checked(tiny(mesh, "experts: 4, top_k: 2, hidden: 96"));
        Graph g = lowered(p);
        ASSERT_EQ(g.stages.size(), 1u);
        const int64_t ep = p.mesh.ep;
        double flops = 0;
        int64_t experts_up = 0, serial = 0;
        for (const KernelCall& k : stage_kernels(p, g.stages[0])) {
            const double m = static_cast<double>(k.m), n = static_cast<double>(k.n);
            const double kk = static_cast<double>(k.k);
            if (k.kind == KernelCall::Kind::matmul) flops += 2 * m * n * kk;
            if (k.kind == KernelCall::Kind::attention)
                flops += 4 * m * n * n * static_cast<double>(k.heads) * kk * k.share;
            if (k.kind == KernelCall::Kind::matmul && k.k == 64 && k.n == 2 * 96) ++experts_up;
            serial += k.serial ? 1 : 0;
        }
        // Two blocks, each with 4 / ep experts on the rank and, per expert, a copy in and a
        // copy out, beside the dispatch and the combine.
        EXPECT_EQ(experts_up, 2 * 4 / ep);
        EXPECT_EQ(serial, 2 * (2 + 2 * 4 / ep));
        // Up to a row of each expert's share, rounded up to whole rows.
        const double row = 2.0 * 64 * (2 * 96) + 2.0 * 96 * 64;
        EXPECT_NEAR(flops, g.stages[0].flops_forward, 2.0 * (4.0 / ep) * row);
    }
}

TEST(MixtureOfExperts, TheExpectedMaximumOfNormalsHasItsClosedForms) {
    // E[max] of two and of three standard normals: 1 / sqrt(pi) and 3 / (2 sqrt(pi)).
    const double pi = 3.14159265358979323846;
    EXPECT_NEAR(expected_max_normal(2), 1 / std::sqrt(pi), 1e-6);
    EXPECT_NEAR(expected_max_normal(3), 3 / (2 * std::sqrt(pi)), 1e-6);
    EXPECT_EQ(expected_max_normal(1), 0.0);
    EXPECT_GT(expected_max_normal(8), expected_max_normal(4));
}

namespace {

// The busiest of ep ranks' token copies over the mean, averaged over sampled steps in which
// every token of the ep ranks picks top_k distinct experts uniformly, E / ep experts a rank.
double sampled_busiest(const LayerSpec& l, int64_t ep, int64_t tokens, int64_t trials) {
    std::mt19937 rng(11);
    double sum = 0;
    std::vector<int> experts(static_cast<size_t>(l.experts));
    for (int64_t t = 0; t < trials; ++t) {
        std::vector<int64_t> load(static_cast<size_t>(ep), 0);
        for (int64_t i = 0; i < ep * tokens; ++i) {
            std::iota(experts.begin(), experts.end(), 0);
            for (int64_t j = 0; j < l.top_k; ++j) {
                std::uniform_int_distribution<size_t> pick(static_cast<size_t>(j),
                                                           experts.size() - 1);
                std::swap(experts[static_cast<size_t>(j)], experts[pick(rng)]);
                ++load[static_cast<size_t>(experts[static_cast<size_t>(j)] / (l.experts / ep))];
            }
        }
        sum += static_cast<double>(*std::max_element(load.begin(), load.end())) /
               static_cast<double>(tokens * l.top_k);
    }
    return sum / static_cast<double>(trials);
}

} // namespace

TEST(MixtureOfExperts, TheBusiestRankByChanceMatchesSampledRoutings) {
    // The normal approximation the simulator prices against 4,000 sampled steps: its excess
    // over 1 within 4% (the samples' standard error is about 1%; leaving out the finite
    // population's (E - k) / (E - 1) would be 8% off in the first case and 18% in the second).
    LayerSpec l;
    l.kind = LayerKind::moe;
    l.experts = 8;
    l.top_k = 2;
    const double predicted = expert_rank_imbalance(l, 4, 256) - 1;
    EXPECT_GT(predicted, 0.02); // about 4% here: worth pricing
    EXPECT_NEAR(sampled_busiest(l, 4, 256, 4000) - 1, predicted, 0.04 * predicted);
    l.experts = 4;
    const double two = expert_rank_imbalance(l, 2, 256) - 1;
    EXPECT_NEAR(sampled_busiest(l, 2, 256, 4000) - 1, two, 0.04 * two);
    // None with one rank, and none with a capacity (every expert padded to it).
    EXPECT_EQ(expert_rank_imbalance(l, 1, 256), 1.0);
    l.capacity = 1.25;
    EXPECT_EQ(expert_rank_imbalance(l, 4, 256), 1.0);
}

TEST(MixtureOfExperts, ZeroSharesTheExpertsStateAmongTheirHolders) {
    // dp 4, ep 2, ZeRO 2: the replicated parameters' gradients and AdamW moments are split over
    // the 4 replicas, the routed experts' over the 2 ranks that hold the same experts.
    Program p = checked(tiny("dp: 4\n    ep: 2\n    zero: 2"));
    Graph g = lowered(p);
    ASSERT_EQ(g.stages.size(), 1u);
    const int64_t expert = 3 * 64 * 128;
    const int64_t experts = 2 /* blocks */ * 2 /* on the rank */ * expert;
    EXPECT_EQ(g.stages[0].expert_parameters, experts);
    const int64_t dense = g.stages[0].parameters - experts;
    sim::SimResult s = sim::simulate(g, p);
    ASSERT_TRUE(s.ok());
    const sim::RankReport& r = s.timeline->ranks[0];
    EXPECT_EQ(r.parameters_bytes, g.stages[0].parameters * 4);
    // Beside the shares, whole gradients of the two largest units (the one computing its
    // weight gradient and the one being reduce-scattered): the two mixtures' residual groups
    // (an RMS norm's 64, the router's 64 x 4, the rank's two experts), each larger than an
    // attention group, the token embedding or the head (256 x 64).
    const int64_t mixture = 64 + 64 * 4 + 2 * expert;
    EXPECT_EQ(g.stages[0].two_largest_units_parameters, 2 * mixture);
    EXPECT_EQ(r.gradients_bytes, dense * 4 / 4 + experts * 4 / 2 + 2 * mixture * 4);
    EXPECT_EQ(r.optimizer_bytes, dense * 8 / 4 + experts * 8 / 2);
    // The checker's floor counts the same state (weights whole, the rest shared).
    EXPECT_EQ(p.memory.bytes_per_device,
              static_cast<int64_t>(static_cast<double>(g.stages[0].parameters) * 4 +
                                   static_cast<double>(dense) * 12 / 4 +
                                   static_cast<double>(experts) * 12 / 2));
    // ZeRO 3 shares the weights the same way, beside the two units it gathers at a time.
    Program p3 = checked(tiny("dp: 4\n    ep: 2\n    zero: 3"));
    Graph g3 = lowered(p3);
    sim::SimResult s3 = sim::simulate(g3, p3);
    ASSERT_TRUE(s3.ok());
    const int64_t unit = g3.stages[0].largest_unit_parameters;
    EXPECT_EQ(s3.timeline->ranks[0].parameters_bytes,
              dense * 4 / 4 + experts * 4 / 2 + std::min(g3.stages[0].parameters, 2 * unit) * 4);
    EXPECT_EQ(p3.memory.bytes_per_device,
              static_cast<int64_t>(static_cast<double>(dense) * 16 / 4 +
                                   static_cast<double>(experts) * 16 / 2));
}

namespace {

// The words of rank r's actions from the one at `from` on, `n` of them.
std::vector<std::string> words(const Graph& g, int32_t r, size_t from, size_t n) {
    std::vector<std::string> out;
    const auto& list = g.ranks[static_cast<size_t>(r)].actions;
    for (size_t i = from; i < from + n && i < list.size(); ++i) out.push_back(to_string(list[i]));
    return out;
}

size_t index_of(const Graph& g, int32_t r, const std::string& word) {
    const auto& list = g.ranks[static_cast<size_t>(r)].actions;
    for (size_t i = 0; i < list.size(); ++i)
        if (to_string(list[i]) == word) return i;
    return list.size();
}

Graph without_exchanges(Graph g) {
    for (PlanRank& r : g.ranks)
        r.actions.erase(std::remove_if(r.actions.begin(), r.actions.end(),
                                       [](const PlanAction& a) { return is_exchange(a.kind); }),
                        r.actions.end());
    for (PlanStage& s : g.stages) s.exchange_layers.clear();
    return g;
}

} // namespace

// The model's order (models/units_moe.cpp): a forward dispatches each block's token copies to
// their experts and combines the outputs back, block after block; a backward sends the
// outputs' gradients to the experts and the inputs' gradients back, from the last block, and
// under full recomputation redoes each block's forward exchanges first.
TEST(MixtureOfExperts, ThePlanListsEveryAllToAllInTheOrderTheModelRunsThem) {
    Graph g = lowered(checked(tiny("dp: 2\n    ep: 2")));
    ASSERT_EQ(g.stages.size(), 1u);
    // Each block's experts sit in its second residual group.
    EXPECT_EQ(g.stages[0].exchange_layers, (std::vector<PlanExchange>{{0, 1}, {1, 1}}));
    for (int32_t r = 0; r < 2; ++r) {
        size_t f = index_of(g, r, "0F0"), b = index_of(g, r, "0B0");
        EXPECT_EQ(words(g, r, f + 1, 4),
                  (std::vector<std::string>{"0DISPATCH_F0@0", "0COMBINE_F0@0", "0DISPATCH_F0@1",
                                            "0COMBINE_F0@1"}));
        EXPECT_EQ(words(g, r, b + 1, 4),
                  (std::vector<std::string>{"0COMBINE_B0@1", "0DISPATCH_B0@1", "0COMBINE_B0@0",
                                            "0DISPATCH_B0@0"}));
    }
    Graph full = lowered(checked(tiny("dp: 2\n    ep: 2"), {"schedule.recompute=full"}));
    size_t b = index_of(full, 0, "0B0");
    EXPECT_EQ(words(full, 0, b + 1, 8),
              (std::vector<std::string>{"0DISPATCH_F0@1", "0COMBINE_F0@1", "0COMBINE_B0@1",
                                        "0DISPATCH_B0@1", "0DISPATCH_F0@0", "0COMBINE_F0@0",
                                        "0COMBINE_B0@0", "0DISPATCH_B0@0"}));
    // Split backwards: I exchanges, W (the weights' gradients alone) does not.
    Graph zb = lowered(checked(tiny("dp: 2\n    ep: 2\n    pp: 2"),
                               {"schedule.kind=zb_h1", "schedule.microbatches=4"}));
    for (const PlanRank& r : zb.ranks)
        for (size_t i = 0; i + 1 < r.actions.size(); ++i)
            if (r.actions[i].kind == ActionKind::backward_weight) {
                EXPECT_FALSE(is_exchange(r.actions[i + 1].kind)) << to_string(r.actions[i]);
            }
    EXPECT_NE(index_of(zb, 0, "0COMBINE_B0@0"), zb.ranks[0].actions.size());
    // Without ep nothing is exchanged; and the JSON form keeps every all-to-all.
    Graph alone = lowered(checked(tiny("dp: 2\n    ep: 1")));
    for (const PlanRank& r : alone.ranks)
        for (const PlanAction& a : r.actions) EXPECT_FALSE(is_exchange(a.kind)) << to_string(a);
    Graph back;
    std::string error;
    ASSERT_TRUE(from_json(to_json(full), back, error)) << error;
    back.file = full.file;
    EXPECT_EQ(back, full);
}

TEST(MixtureOfExperts, TheVerifierHoldsTheAllToAllsToTheirComputeAndTheirGroup) {
    Graph g = lowered(checked(tiny("dp: 2\n    ep: 2")));
    ASSERT_TRUE(verify(g).empty());
    auto first_error = [](const Graph& x) {
        std::vector<PlanError> e = verify(x);
        return e.empty() ? std::string("no error") : e.front().message;
    };
    // One missing on rank 1.
    Graph missing = g;
    auto& list = missing.ranks[1].actions;
    list.erase(list.begin() + static_cast<std::ptrdiff_t>(index_of(g, 1, "0COMBINE_F0@1")));
    EXPECT_NE(first_error(missing).find("rank 1: `0F0` runs the all-to-alls"), std::string::npos)
        << first_error(missing);
    // Two swapped: the backward's order is the model's, not any order.
    Graph swapped = g;
    auto& l2 = swapped.ranks[1].actions;
    size_t at = index_of(g, 1, "0COMBINE_B0@1");
    std::swap(l2[at], l2[at + 1]);
    EXPECT_NE(first_error(swapped).find("`0B0` runs the all-to-alls"), std::string::npos)
        << first_error(swapped);
    // One standing after a send, far from its compute.
    Graph stray = g;
    PlanAction x = *parse_action("0DISPATCH_F0@0");
    stray.ranks[0].actions.insert(stray.ranks[0].actions.end() - 1, x);
    EXPECT_NE(first_error(stray).find("after no compute action"), std::string::npos)
        << first_error(stray);
    // Each rank consistent, the group not: rank 1 runs its microbatches' forwards in the
    // other order, so its first all-to-all is another microbatch's.
    Program p2 =
        checked(tiny("dp: 2\n    ep: 2"), {"schedule.microbatches=2", "schedule.kind=gpipe"});
    Graph two = lowered(p2);
    auto& l3 = two.ranks[1].actions;
    size_t f0 = index_of(two, 1, "0F0"), f1 = index_of(two, 1, "0F1");
    ASSERT_LT(f0, f1);
    // [F0 x4] [F1 x4] -> [F1 x4] [F0 x4] when they are adjacent.
    ASSERT_EQ(f1, f0 + 5);
    std::rotate(l3.begin() + static_cast<std::ptrdiff_t>(f0),
                l3.begin() + static_cast<std::ptrdiff_t>(f1),
                l3.begin() + static_cast<std::ptrdiff_t>(f1 + 5));
    EXPECT_NE(first_error(two).find("ranks 0 and 1 enter their expert-parallel collectives in "
                                    "different orders"),
              std::string::npos)
        << first_error(two);
}

// An all-to-all starts when the last member of its group comes to it: the faster rank waits
// inside its forward, which the all-to-alls cut into equal pieces.
TEST(MixtureOfExperts, AnAllToAllWaitsForTheSlowestMemberOfItsGroup) {
    Graph g = lowered(checked(tiny("dp: 2\n    ep: 2")));
    ExecCosts c = zero_costs();
    c.compute = [](const PlanRank& r, const PlanAction& a) {
        return a.kind == ActionKind::forward ? (r.rank == 0 ? 1.0 : 3.0) : 0.0;
    };
    c.exchange = [](const PlanRank&, const PlanAction&) { return 0.5; };
    ExecTimes t = execute(g, c);
    ASSERT_TRUE(t.complete);
    const size_t f = index_of(g, 0, "0F0");
    ASSERT_EQ(f, index_of(g, 1, "0F0"));
    // Four all-to-alls cut rank 0's forward into pieces of 0.2 and rank 1's into 0.6: each
    // starts when rank 1 gets there, 0.6 after the last one ended; rank 0 came 0.4 earlier and
    // waited (its span holds the wait, as the runtime measures it).
    for (size_t k = 0; k < 4; ++k) {
        const double start = 0.6 + 1.1 * static_cast<double>(k);
        EXPECT_NEAR(t.start[1][f + 1 + k], start, 1e-12) << "all-to-all " << k;
        EXPECT_NEAR(t.start[0][f + 1 + k], start - 0.4, 1e-12) << "all-to-all " << k;
        for (size_t r = 0; r < 2; ++r) EXPECT_NEAR(t.end[r][f + 1 + k], start + 0.5, 1e-12);
    }
    EXPECT_NEAR(t.end[0][f], 4.4 + 0.2, 1e-12);
    EXPECT_NEAR(t.end[1][f], 4.4 + 0.6, 1e-12);
    // A member that never comes holds the other up: the abstract execution stops there.
    Graph stuck = g;
    auto& l = stuck.ranks[1].actions;
    l.erase(l.begin() + static_cast<std::ptrdiff_t>(f) + 1);
    ExecTimes s = execute(stuck, zero_costs());
    EXPECT_FALSE(s.complete);
}

TEST(MixtureOfExperts, TheSimulatorPricesTheAllToAllsOnTheGroupsLinks) {
    // Two hosts of two devices: ep 2 within a host (dp 2 x tp 1 ... replicas 0 and 1 share
    // host 0) against the same mesh with the all-to-alls removed from the graph.
    const std::string text = tiny("dp: 2\n    ep: 2");
    Program p = checked(text);
    Graph g = lowered(p);
    sim::SimResult with = sim::simulate(g, p);
    Graph bare = without_exchanges(g);
    sim::SimResult without = sim::simulate(bare, p);
    ASSERT_TRUE(with.ok() && without.ok());
    auto forward = [](const sim::Timeline& t) {
        const sim::RankReport& r = t.ranks[0];
        for (const sim::Span& s : r.spans)
            if (t.graph.ranks[0].actions[s.action].kind == ActionKind::forward)
                return s.end - s.start;
        return 0.0;
    };
    const LinkSpec link = p.mesh.profile.intra_host;
    const double bytes = static_cast<double>(g.stages[0].all_to_all_bytes);
    const double one = link.latency + bytes / 2 / link.bandwidth; // n - 1 = 1 message of half
    EXPECT_NEAR(forward(*with.timeline) - forward(*without.timeline), 4 * one, 1e-12);
    EXPECT_GT(with.timeline->step_time_s, without.timeline->step_time_s);
    // Each all-to-all is a span of its own inside its forward's.
    const sim::RankReport& r0 = with.timeline->ranks[0];
    ASSERT_FALSE(r0.exchanges.empty());
    for (const sim::Span& x : r0.exchanges) {
        EXPECT_NEAR(x.end - x.start, one, 1e-12);
        bool inside = false;
        for (const sim::Span& s : r0.spans)
            inside = inside || (s.start <= x.start && x.end <= s.end);
        EXPECT_TRUE(inside) << to_string(g.ranks[0].actions[x.action]);
    }
}

TEST(MixtureOfExperts, ThePlanningExampleFitsOnlyWithExpertParallelism) {
    const auto file =
        std::filesystem::path(DIST_SOURCE_DIR) / "examples" / "mixtral_8x7b_64xh100.dist";
    lang::CheckResult ok = lang::check_file(file, opts());
    ASSERT_TRUE(ok.ok()) << ok.report();
    Graph g = lowered(*ok.program);
    sim::SimResult s = sim::simulate(g, *ok.program);
    ASSERT_TRUE(s.ok());
    EXPECT_TRUE(s.timeline->fits);
    lang::CheckResult one = lang::check_file(file, opts({"mesh.ep=1"}));
    EXPECT_NE(one.report().find("the model does not fit"), std::string::npos) << one.report();
}
