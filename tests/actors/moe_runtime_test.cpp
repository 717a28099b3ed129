// moe_runtime_test.cpp: mixtures of experts trained for real.
//
// The layer's gradients (router, auxiliary loss, experts, shared experts, dropped copies) against
// central finite differences of the objective it defines; then expert parallelism against its
// absence: with a capacity that drops no copy, the per-step losses and gradient norms of ep 2
// and ep 4 equal those of ep 1 on the same mesh (each rank routes its own tokens, so the
// objective is the same), alone and with tensor and pipeline parallelism; and the metrics of a
// step count every routed copy.
#include "actors/plan/lower.hpp"
#include "actors/runtime/job.hpp"
#include "models/checkpoint.hpp"
#include "models/model.hpp"
#include "models/safetensors.hpp"
#include "models/trainer.hpp"

#include "tests/common/checked_script.hpp"
#include "tests/common/job_curve.hpp"
#include "tests/common/tiny_scripts.hpp"

#include <gtest/gtest.h>

#include <algorithm>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <numeric>
#include <unistd.h>

using namespace dist;

namespace {

// A block of attention and a mixture of experts, with the router and expert arguments given.
std::string moe_script(const std::string& moe_args, int layers = 2) {
    return R"(
model tiny_moe(layers) {
    embed_tokens: embedding(32, 16) shard vocab
    rotary_emb: rotary_embedding(8, theta: 10000.0)
    layers: repeat layers {
        residual {
            input_layernorm: rms_norm(16)
            self_attn: attention(16, heads: 4, kv_heads: 2) shard heads
        }
        residual {
            post_attention_layernorm: rms_norm(16)
            moe: moe(16, )" +
           moe_args + R"() shard hidden
        }
    }
    norm: rms_norm(16)
    lm_head: lm_head(16, 32) shard vocab
    loss: cross_entropy() shard vocab
}
model = tiny_moe(layers: )" +
           std::to_string(layers) + R"()
mesh {
    devices: cpu
}
train {
    data: synthetic()
    batch: 8
    steps: 3
    seed: 5
    optimizer {
        lr: 1e-2
        weight_decay: 0.1
    }
    clip: 1.0
}
)";
}

const std::string mixtral_args = "experts: 4, top_k: 2, hidden: 16, aux_loss: 0.05";

// Two mixtures of experts in one residual group and a third outside any group, which full
// recomputation does not run again.
std::string grouped_and_bare_script() {
    const std::string moe = "moe(16, experts: 4, top_k: 2, hidden: 16) shard hidden";
    std::string text = moe_script(mixtral_args);
    const std::string group =
        "            moe: moe(16, " + mixtral_args + ") shard hidden\n        }\n";
    const size_t at = text.find(group);
    if (at == std::string::npos) return "";
    text.replace(at, group.size(),
                 "            first: " + moe + "\n            second: " + moe +
                     "\n        }\n        bare: " + moe + "\n");
    return text;
}
const std::string deepseek_args = "experts: 8, top_k: 3, hidden: 8, shared: 2, normalize: false, "
                                  "aux_loss: 0.05";

// ----- the layer's gradients against finite differences ---------------------------------------

struct Objective {
    double value = 0.0;
    models::ExpertStats stats;
};

// The objective the layer defines for one microbatch: the mean cross-entropy plus every
// layer's auxiliary loss (as backward differentiates it with a loss weight of 1).
Objective objective(models::Model& m, const kernels::Tensor& tok, const kernels::Tensor& tgt) {
    Objective o;
    o.value = m.forward(0, tok, tgt, 1.0);
    o.stats = m.take_expert_stats();
    o.value += o.stats.aux_loss;
    m.backward(0, 1.0); // frees the microbatch's state (the gradients are not read)
    return o;
}

void expect_gradients_match(const std::string& args, const std::vector<std::string>& names) {
    Program p = tests::checked_script(moe_script(args, 1), {});
    models::Model m(p.model, 3);
    const int64_t B = 2, T = 8;
    kernels::Tensor tok({B, T}, kernels::DType::i32), tgt({B, T}, kernels::DType::i32);
    for (int64_t i = 0; i < B * T; ++i) {
        tok.data<int32_t>()[i] = static_cast<int32_t>((i * 7 + 3) % 32);
        tgt.data<int32_t>()[i] = static_cast<int32_t>((i * 11 + 5) % 32);
    }
    m.params().zero_grads();
    m.forward(0, tok, tgt, 1.0);
    models::ExpertStats routed = m.take_expert_stats();
    m.backward(0, 1.0);
    // Every gradient before any difference is taken (each evaluation's backward adds more).
    std::map<std::string, std::vector<float>> grads;
    for (const std::string& name : names) {
        models::Parameter* param = m.params().find(name);
        ASSERT_NE(param, nullptr) << name;
        grads[name].assign(param->grad.data<float>(),
                           param->grad.data<float>() + param->grad.numel());
    }
    for (const std::string& name : names) {
        models::Parameter* param = m.params().find(name);
        const std::vector<float>& analytic = grads[name];
        // The elements with the largest gradients, where a difference is well above rounding.
        std::vector<int64_t> order(analytic.size());
        std::iota(order.begin(), order.end(), 0);
        std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
            return std::fabs(analytic[static_cast<size_t>(a)]) >
                   std::fabs(analytic[static_cast<size_t>(b)]);
        });
        int checked = 0;
        for (size_t k = 0; k < 8 && k < order.size(); ++k) {
            const int64_t i = order[k];
            float* w = param->value.data<float>() + i;
            const float keep = *w;
            const double eps = 1e-3;
            *w = static_cast<float>(keep + eps);
            Objective plus = objective(m, tok, tgt);
            *w = static_cast<float>(keep - eps);
            Objective minus = objective(m, tok, tgt);
            *w = keep;
            // A step that moved a copy to another expert is no derivative: skip it.
            if (plus.stats.load != routed.load || minus.stats.load != routed.load) continue;
            const double fd = (plus.value - minus.value) / (2 * eps);
            const double a = analytic[static_cast<size_t>(i)];
            EXPECT_NEAR(fd, a, 2e-2 * std::fabs(a) + 2e-4) << name << "[" << i << "]";
            ++checked;
        }
        EXPECT_GE(checked, 6) << name << ": too many steps changed the routing";
    }
}

TEST(ExpertGradients, SoftmaxTopKRenormalisedWithTheAuxiliaryLoss) {
    expect_gradients_match(mixtral_args,
                           {"layers.0.moe.router.weight", "layers.0.moe.experts.1.fc.weight",
                            "layers.0.moe.experts.2.proj.weight", "layers.0.self_attn.qkv.weight"});
}

TEST(ExpertGradients, SharedExpertsAndWeightsAsScored) {
    expect_gradients_match(deepseek_args,
                           {"layers.0.moe.router.weight", "layers.0.moe.shared.fc.weight",
                            "layers.0.moe.experts.5.fc.weight"});
}

TEST(ExpertGradients, SigmoidScoresAndDroppedCopies) {
    // Capacity 0.5: each expert admits half of an even share; the rest is dropped.
    expect_gradients_match("experts: 4, top_k: 2, hidden: 16, router: sigmoid, capacity: 0.5, "
                           "aux_loss: 0.1",
                           {"layers.0.moe.router.weight", "layers.0.moe.experts.0.fc.weight"});
}

TEST(ExpertGradients, CapacityDropsTheCopiesBeyondItInTokenOrder) {
    Program p =
        tests::checked_script(moe_script("experts: 4, top_k: 2, hidden: 16, capacity: 0.5", 1), {});
    models::Model m(p.model, 3);
    kernels::Tensor tok({2, 8}, kernels::DType::i32), tgt({2, 8}, kernels::DType::i32);
    for (int64_t i = 0; i < 16; ++i) tok.data<int32_t>()[i] = tgt.data<int32_t>()[i] = 1;
    m.forward(0, tok, tgt, 1.0);
    models::ExpertStats s = m.take_expert_stats();
    m.backward(0, 1.0);
    // 16 identical tokens pick the same two experts; each admits ceil(0.5 x 16 x 2 / 4) = 4.
    ASSERT_EQ(s.load.size(), 4u);
    std::vector<int64_t> load = s.load;
    std::sort(load.begin(), load.end());
    EXPECT_EQ(load, (std::vector<int64_t>{0, 0, 4, 4}));
    EXPECT_EQ(s.routed, 32);
    EXPECT_EQ(s.dropped, 24);
}

// ----- expert parallelism against ep 1 --------------------------------------------------------

tests::JobCurve train(const std::string& text, const std::vector<std::string>& overrides) {
    Program p = tests::checked_script(text, overrides);
    plan::PlanResult planned = plan::lower(p);
    EXPECT_TRUE(planned.ok()) << plan::render_errors("t.dist", planned.errors);
    if (!planned.ok()) return {};
    models::TokenData data;
    EXPECT_EQ(models::load_data(p.train.data, p.model, data), "");
    runtime::Job job(p, *planned.graph, data);
    return tests::run_job(job, p.train.steps, std::chrono::seconds(30));
}

struct EpCase {
    std::string name;
    std::string args;
    std::vector<std::string> mesh; // overrides besides mesh.ep
    int ep;
};

void PrintTo(const EpCase& c, std::ostream* os) {
    *os << c.name;
}

class ExpertParallel : public ::testing::TestWithParam<EpCase> {};

TEST_P(ExpertParallel, GivesTheLossesAndNormsOfEp1) {
    const EpCase& c = GetParam();
    const std::string text = moe_script(c.args);
    std::vector<std::string> one = c.mesh, split = c.mesh;
    one.push_back("mesh.ep=1");
    split.push_back("mesh.ep=" + std::to_string(c.ep));
    tests::JobCurve ref = train(text, one);
    tests::JobCurve got = train(text, split);
    const models::ExpertStats& stats = got.experts;
    ASSERT_EQ(ref.error, "");
    ASSERT_EQ(got.error, "");
    ASSERT_EQ(got.losses.size(), 3u);
    ASSERT_EQ(ref.losses.size(), 3u);
    for (size_t i = 0; i < got.losses.size(); ++i) {
        EXPECT_NEAR(got.losses[i], ref.losses[i], 1e-5 * ref.losses[i]) << "step " << i + 1;
        EXPECT_NEAR(got.norms[i], ref.norms[i], 1e-4 * ref.norms[i]) << "step " << i + 1;
    }
    // Every copy of every token of the step, in each layer, was routed and counted once.
    const int64_t layers = 2, batch = 8, context = 8;
    const int64_t top_k = c.args.find("top_k: 3") != std::string::npos ? 3 : 2;
    EXPECT_EQ(stats.routed, layers * batch * context * top_k);
    EXPECT_EQ(std::accumulate(stats.load.begin(), stats.load.end(), int64_t{0}) + stats.dropped,
              stats.routed);
    EXPECT_EQ(stats.dropped, 0);
}

INSTANTIATE_TEST_SUITE_P(
    Meshes, ExpertParallel,
    ::testing::Values(
        EpCase{"dp2_ep2", mixtral_args, {"mesh.dp=2"}, 2},
        EpCase{"dp4_ep4", mixtral_args, {"mesh.dp=4"}, 4},
        EpCase{"dp4_ep2", mixtral_args, {"mesh.dp=4"}, 2},
        EpCase{"dp2_tp2_ep2", mixtral_args, {"mesh.dp=2", "mesh.tp=2"}, 2},
        EpCase{
            "dp2_pp2_ep2", mixtral_args, {"mesh.dp=2", "mesh.pp=2", "schedule.microbatches=2"}, 2},
        EpCase{"shared_dp4_ep4", deepseek_args, {"mesh.dp=4"}, 4},
        // ZeRO beside ep (the reference is ZeRO over dp with ep 1): the experts'
        // state shared by their two holders, and by their one holder.
        EpCase{"dp4_ep2_zero1", mixtral_args, {"mesh.dp=4", "mesh.zero=1"}, 2},
        EpCase{"dp4_ep2_zero2", mixtral_args, {"mesh.dp=4", "mesh.zero=2"}, 2},
        EpCase{"dp2_ep2_zero2", mixtral_args, {"mesh.dp=2", "mesh.zero=2"}, 2},
        // ZeRO 3: the experts' weights gathered from their two holders, and kept
        // whole by their one holder, the rest from the replicas.
        EpCase{"dp4_ep2_zero3", mixtral_args, {"mesh.dp=4", "mesh.zero=3"}, 2},
        EpCase{"dp2_ep2_zero3", mixtral_args, {"mesh.dp=2", "mesh.zero=3"}, 2},
        // The backward redoes the forward's all-to-alls, as the plan lists them;
        // a split backward exchanges in I and not in W.
        EpCase{"dp2_ep2_recompute", mixtral_args, {"mesh.dp=2", "schedule.recompute=full"}, 2},
        EpCase{"dp2_pp2_ep2_zbh1",
               mixtral_args,
               {"mesh.dp=2", "mesh.pp=2", "schedule.kind=zb_h1", "schedule.microbatches=2"},
               2}),
    [](const ::testing::TestParamInfo<EpCase>& i) { return i.param.name; });

// The plan's all-to-alls are the ones the model runs: a plan that lists none where the model
// exchanges tokens fails the step with a reason, rather than running unlike its timeline.
TEST(ExpertRuntime, AnAllToAllThePlanDoesNotListFailsTheStep) {
    Program p = tests::checked_script(moe_script(mixtral_args), {"mesh.dp=2", "mesh.ep=2"});
    plan::PlanResult planned = plan::lower(p);
    ASSERT_TRUE(planned.ok());
    plan::Graph g = *planned.graph;
    for (plan::PlanRank& r : g.ranks)
        r.actions.erase(
            std::remove_if(r.actions.begin(), r.actions.end(),
                           [](const plan::PlanAction& a) { return plan::is_exchange(a.kind); }),
            r.actions.end());
    models::TokenData data;
    ASSERT_EQ(models::load_data(p.train.data, p.model, data), "");
    runtime::Job job(p, g, data);
    tests::JobCurve got = tests::run_job(job, 1, std::chrono::seconds(30));
    EXPECT_NE(got.error.find("all-to-all(s) ran that the plan does not list before `0B0`"),
              std::string::npos)
        << got.error;
}

// Full recomputation runs a residual group's forward again, its all-to-alls with it, before the
// group's backward; a layer outside any group keeps what it needs and exchanges only its
// gradients. The plan lists exactly what the runtime runs (a count that differs fails the step),
// and the losses are ep 1's.
TEST(ExpertRuntime, RecomputationRedoesOnlyTheResidualGroupsAllToAlls) {
    const std::string text = grouped_and_bare_script();
    ASSERT_FALSE(text.empty());
    Program p = tests::checked_script(text, {"mesh.dp=2", "mesh.ep=2", "schedule.recompute=full"});
    plan::PlanResult planned = plan::lower(p);
    ASSERT_TRUE(planned.ok()) << plan::render_errors("t.dist", planned.errors);
    const auto& list = planned.graph->ranks[0].actions;
    size_t b = 0;
    while (b < list.size() && plan::to_string(list[b]) != "0B0") ++b;
    std::vector<std::string> got;
    for (size_t i = b + 1; i < list.size() && plan::is_exchange(list[i].kind); ++i)
        got.push_back(plan::to_string(list[i]));
    const std::vector<std::string> block1 = {
        "0COMBINE_B0@1",  "0DISPATCH_B0@1",                                    // bare
        "0DISPATCH_F0@1", "0COMBINE_F0@1",  "0DISPATCH_F0@1", "0COMBINE_F0@1", // group again
        "0COMBINE_B0@1",  "0DISPATCH_B0@1", "0COMBINE_B0@1",  "0DISPATCH_B0@1"};
    std::vector<std::string> want = block1;
    for (const std::string& w : block1) want.push_back(w.substr(0, w.size() - 1) + "0");
    EXPECT_EQ(got, want);
    tests::JobCurve ref = train(text, {"mesh.dp=2", "mesh.ep=1", "schedule.recompute=full"});
    tests::JobCurve split = train(text, {"mesh.dp=2", "mesh.ep=2", "schedule.recompute=full"});
    ASSERT_EQ(ref.error, "");
    ASSERT_EQ(split.error, "");
    ASSERT_EQ(split.losses.size(), ref.losses.size());
    for (size_t i = 0; i < ref.losses.size(); ++i)
        EXPECT_NEAR(split.losses[i], ref.losses[i], 1e-5 * ref.losses[i]) << "step " << i + 1;
}

TEST(ExpertRuntime, OneRankTrainsAsOneDevice) {
    // The executor and the one-device trainer weigh the auxiliary loss alike.
    const std::string text = moe_script(mixtral_args);
    Program p = tests::checked_script(text, {});
    models::TokenData data;
    ASSERT_EQ(models::load_data(p.train.data, p.model, data), "");
    models::Model model(p.model, static_cast<uint64_t>(p.train.seed));
    std::vector<double> losses, norms;
    ASSERT_EQ(models::train(p, model, data, 0,
                            [&](const models::StepMetrics& m) {
                                losses.push_back(m.loss);
                                norms.push_back(m.grad_norm);
                                return true;
                            }),
              "");
    tests::JobCurve got = train(text, {});
    ASSERT_EQ(got.error, "");
    ASSERT_EQ(got.losses.size(), losses.size());
    for (size_t i = 0; i < losses.size(); ++i) {
        EXPECT_NEAR(got.losses[i], losses[i], 1e-5 * losses[i]) << "step " << i + 1;
        EXPECT_NEAR(got.norms[i], norms[i], 1e-4 * norms[i]) << "step " << i + 1;
    }
}

} // namespace

// ----- checkpoints ----------------------------------------------------------------------------

namespace {

// Runs the script's job to its last step and gathers its weights into `whole`.
void train_and_gather(const std::string& text, const std::vector<std::string>& overrides,
                      models::Model& whole) {
    Program p = tests::checked_script(text, overrides);
    plan::PlanResult planned = plan::lower(p);
    ASSERT_TRUE(planned.ok()) << plan::render_errors("t.dist", planned.errors);
    models::TokenData data;
    ASSERT_EQ(models::load_data(p.train.data, p.model, data), "");
    runtime::Job job(p, *planned.graph, data);
    runtime::JobOptions o;
    o.end_step = p.train.steps;
    o.watchdog = std::chrono::seconds(30);
    ASSERT_EQ(job.run(o), "");
    job.gather(whole);
}

} // namespace

// Under ZeRO each holder of an expert keeps a share of its AdamW moments: gathered, the weights
// and moments are those of ep 1 without ZeRO.
// Under ZeRO 3 they keep a share of the weights too.
class ExpertZeroCheckpoints : public ::testing::TestWithParam<const char*> {};

TEST_P(ExpertZeroCheckpoints, ZeroSharesOfTheExpertsComeBackWhole) {
    const std::string text = tests::tiny_moe_script(3);
    Program p = tests::checked_script(text, {});
    models::Model sharded(p.model, 0), alone(p.model, 0);
    train_and_gather(text, {"mesh.dp=4", "mesh.ep=2", GetParam()}, sharded);
    train_and_gather(text, {"mesh.dp=4", "mesh.ep=1"}, alone);
    int64_t experts = 0;
    for (const auto& q : alone.params().all()) {
        const models::Parameter* s = sharded.params().find(q.name);
        ASSERT_NE(s, nullptr) << q.name;
        experts += q.name.find(".experts.") != std::string::npos;
        for (int64_t i = 0; i < q.value.numel(); ++i)
            ASSERT_NEAR(s->value.data<float>()[i], q.value.data<float>()[i], 1e-4)
                << q.name << "[" << i << "]";
        ASSERT_EQ(s->m.numel(), q.m.numel()) << q.name;
        for (int64_t i = 0; i < q.m.numel(); ++i) {
            // Sums in another order: the first moment near zero differs in its last digits.
            ASSERT_NEAR(s->m.data<float>()[i], q.m.data<float>()[i],
                        1e-3 * std::abs(q.m.data<float>()[i]) + 1e-9)
                << q.name << ".m[" << i << "]";
            ASSERT_NEAR(s->v.data<float>()[i], q.v.data<float>()[i],
                        1e-3 * std::abs(q.v.data<float>()[i]) + 1e-15)
                << q.name << ".v[" << i << "]";
        }
    }
    EXPECT_GT(experts, 0);
}

INSTANTIATE_TEST_SUITE_P(Zero, ExpertZeroCheckpoints,
                         ::testing::Values("mesh.zero=2", "mesh.zero=3"),
                         [](const ::testing::TestParamInfo<const char*>& i) {
                             return std::string(i.param).substr(5, 4) + i.param[10];
                         });

TEST(ExpertCheckpoints, AreConsolidatedInMixtralsLayoutFromAnyEp) {
    namespace fs = std::filesystem;
    const std::string text = tests::tiny_moe_script(3);
    Program p = tests::checked_script(text, {});
    models::Model split(p.model, 0), alone(p.model, 0), loaded(p.model, 0);
    train_and_gather(text, {"mesh.dp=4", "mesh.ep=4"}, split);
    train_and_gather(text, {"mesh.dp=4", "mesh.ep=1"}, alone);
    // Every expert came back from the rank that held it: the weights of ep 1's run.
    for (const auto& q : alone.params().all()) {
        const models::Parameter* s = split.params().find(q.name);
        ASSERT_NE(s, nullptr) << q.name;
        for (int64_t i = 0; i < q.value.numel(); ++i)
            ASSERT_NEAR(s->value.data<float>()[i], q.value.data<float>()[i], 1e-4)
                << q.name << "[" << i << "]";
    }
    fs::path dir = fs::temp_directory_path() / ("dist_moe_ck_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    ASSERT_EQ(models::save_checkpoint(dir.string(), split, 3, 13), "");
    // Hugging Face's Mixtral names and shapes: the router (experts x width), w1 and w3 (the
    // SwiGLU gate and up projections, hidden x width) and w2 (down, width x hidden).
    models::SafetensorsFile file;
    ASSERT_EQ(models::read_safetensors((dir / "model.safetensors").string(), file), "");
    const std::string layer = "model.layers.1.block_sparse_moe.";
    auto shape = [&](const std::string& name) {
        const models::TensorRecord* r = file.find(name);
        return r ? r->shape : std::vector<int64_t>{};
    };
    EXPECT_EQ(shape(layer + "gate.weight"), (std::vector<int64_t>{4, 16}));
    for (int e = 0; e < 4; ++e) {
        const std::string ex = layer + "experts." + std::to_string(e) + ".";
        EXPECT_EQ(shape(ex + "w1.weight"), (std::vector<int64_t>{16, 16})) << ex;
        EXPECT_EQ(shape(ex + "w3.weight"), (std::vector<int64_t>{16, 16})) << ex;
        EXPECT_EQ(shape(ex + "w2.weight"), (std::vector<int64_t>{16, 16})) << ex;
    }
    // w1 is the gate: the first half of the fused first linear.
    const models::Parameter* fc =
        split.params().find("layers.1.block_sparse_moe.experts.2.fc.weight");
    ASSERT_NE(fc, nullptr);
    const models::TensorRecord* w1 = file.find(layer + "experts.2.w1.weight");
    const models::TensorRecord* w3 = file.find(layer + "experts.2.w3.weight");
    ASSERT_TRUE(w1 && w3);
    float first_gate = 0, first_up = 0;
    std::memcpy(&first_gate, w1->bytes.data(), sizeof(float));
    std::memcpy(&first_up, w3->bytes.data(), sizeof(float));
    EXPECT_EQ(first_gate, fc->value.data<float>()[0]);
    EXPECT_EQ(first_up, fc->value.data<float>()[16 * 16]);
    // Loaded back into a whole model: the weights that were saved.
    ASSERT_EQ(models::load_weights(dir.string(), loaded), "");
    for (const auto& q : split.params().all()) {
        const models::Parameter* l = loaded.params().find(q.name);
        ASSERT_NE(l, nullptr) << q.name;
        for (int64_t i = 0; i < q.value.numel(); ++i)
            ASSERT_EQ(l->value.data<float>()[i], q.value.data<float>()[i]) << q.name;
    }
    fs::remove_all(dir);
}
