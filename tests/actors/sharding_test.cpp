// sharding_test.cpp: ZeRO, sequence and context parallelism in the checker, the plan, the
// verifier and the simulator's memory and communication.
//
// Expected figures come from the published formulas, evaluated here from the model's shape:
// ZeRO's (2 + 2 + K) psi / N_d per stage (Rajbhandari et al. 2020) and Korthikanti et al.
// 2022's activation bytes per block, sbh (10 + 24 / t + 5 a s / (h t)) with tensor parallelism
// and sbh (34 / t + 5 a s / (h t)) with sequence parallelism too.
#include "actors/plan/lower.hpp"
#include "actors/plan/stages.hpp"
#include "actors/plan/verify.hpp"
#include "actors/sim/simulate.hpp"
#include "lang/check.hpp"

#include <gtest/gtest.h>

#include <filesystem>

using namespace dist;
using namespace dist::plan;

namespace {

lang::CheckResult check(const std::string& file, std::vector<std::string> overrides = {}) {
    lang::FrontendOptions o;
    o.search_roots = {std::filesystem::path(DIST_SOURCE_DIR) / "stdlib"};
    o.overrides = std::move(overrides);
    o.check_files = false;
    return lang::check_file(std::filesystem::path(DIST_SOURCE_DIR) / "examples" / file, o);
}

Program checked(const std::string& file, std::vector<std::string> overrides = {}) {
    lang::CheckResult r = check(file, std::move(overrides));
    EXPECT_TRUE(r.ok()) << r.report();
    return r.ok() ? *r.program : Program{};
}

sim::Timeline simulated(const Program& p) {
    PlanResult planned = lower(p);
    EXPECT_TRUE(planned.ok()) << render_errors(p.file, planned.errors);
    sim::SimResult s = sim::simulate(*planned.graph, p);
    EXPECT_TRUE(s.ok());
    return s.ok() ? *s.timeline : sim::Timeline{};
}

int count(const Graph& g, int32_t rank, ActionKind kind) {
    int n = 0;
    for (const PlanAction& a : g.ranks[static_cast<size_t>(rank)].actions) n += a.kind == kind;
    return n;
}

const char* fsdp = "llama3_8b_fsdp_64xa100.dist";

} // namespace

TEST(Zero, TheFitCheckDividesTheStateAsTheStageSays) {
    // Llama 3 8B on 64 A100s: a whole replica's 16 bytes per parameter do not fit 80 GB.
    lang::CheckResult plain = check(fsdp, {"mesh.zero=0"});
    ASSERT_FALSE(plain.ok());
    EXPECT_NE(plain.report().find("119.7 GiB of weights, gradients and AdamW state, but one "
                                  "a100-80g has 74.5 GiB"),
              std::string::npos)
        << plain.report();
    EXPECT_NE(plain.report().find("(`zero: 3` in mesh)"), std::string::npos) << plain.report();
    // bf16 keeps what f32 keeps: 4 + 4 bytes of weights (the f32 master, cast where it is
    // used) and gradients and K = 8 of moments; stage z divides the last 3 - z + 1 parts over
    // the 64 ranks.
    const double per_param[] = {0, 4 + 4 + 8.0 / 64, 4 + 12.0 / 64, 16.0 / 64};
    for (int z = 1; z <= 3; ++z) {
        lang::CheckResult r = check(fsdp, {"mesh.zero=" + std::to_string(z)});
        ASSERT_TRUE(r.ok()) << "zero " << z << ": " << r.report();
        const double psi = static_cast<double>(r.program->model.parameters);
        EXPECT_NEAR(static_cast<double>(r.program->memory.bytes_per_device), psi * per_param[z],
                    16.0);
    }
    // The shared-memory CPU mesh counts every rank's share.
    lang::CheckResult cpu = check("gpt_tiny.dist", {"mesh.dp=4", "mesh.zero=1"});
    ASSERT_TRUE(cpu.ok()) << cpu.report();
    EXPECT_NEAR(static_cast<double>(cpu.program->memory.bytes_per_device),
                static_cast<double>(cpu.program->model.parameters) * (4 + 4 + 8.0 / 4), 16.0);
}

TEST(Zero, StagesTwoAndThreeScatterGradientsAndThreeGathersWeightsAhead) {
    const std::vector<std::string> small = {"mesh.dp=2", "mesh.zero=2", "train.batch=8"};
    Graph two = *lower(checked("gpt_tiny.dist", small)).graph;
    EXPECT_EQ(count(two, 0, ActionKind::reduce_grad), 0);
    EXPECT_GT(count(two, 0, ActionKind::reduce_scatter), 0);
    EXPECT_EQ(count(two, 0, ActionKind::gather_forward), 0);
    std::vector<std::string> three = small;
    three[1] = "mesh.zero=3";
    three.push_back("schedule.microbatches=2");
    Graph g = *lower(checked("gpt_tiny.dist", three)).graph;
    // One gather before every F and every B, each issued before the compute action ahead of
    // the one that needs it.
    const auto& acts = g.ranks[0].actions;
    EXPECT_EQ(count(g, 0, ActionKind::gather_forward), 2);
    EXPECT_EQ(count(g, 0, ActionKind::gather_backward), 2);
    std::vector<std::string> words;
    for (const PlanAction& a : acts) words.push_back(to_string(a));
    ASSERT_GE(words.size(), 5u);
    // One stage under 1F1B runs F0 B0 F1 B1.
    EXPECT_EQ(words[0], "0GATHER_F0");
    EXPECT_EQ(words[1], "0GATHER_B0"); // prefetched before 0F0 runs
    EXPECT_EQ(words[2], "0F0");
    EXPECT_EQ(words[3], "0GATHER_F1");
    EXPECT_EQ(words[4], "0B0");
    // A member that skips a gather is caught by the verifier.
    Graph broken = g;
    auto& r1 = broken.ranks[1].actions;
    r1.erase(std::find_if(r1.begin(), r1.end(), [](const PlanAction& a) {
        return a.kind == ActionKind::gather_backward;
    }));
    std::string all;
    for (const PlanError& e : verify(broken)) all += e.message + "\n";
    EXPECT_NE(all.find("ranks 0 and 1 enter their data-parallel collectives in different orders"),
              std::string::npos)
        << all;
}

TEST(Zero, SimulatedMemoryFollowsTheFormulaPerStage) {
    // Stage 0 does not pass the fit check here; the simulator still accounts for it.
    Program p = checked(fsdp);
    std::vector<sim::RankReport> at;
    for (int z = 0; z <= 3; ++z) {
        p.mesh.zero = z;
        at.push_back(simulated(p).ranks[0]);
    }
    const int64_t nd = 64;
    EXPECT_NEAR(at[1].optimizer_bytes, at[0].optimizer_bytes / nd, 1);
    EXPECT_EQ(at[1].gradients_bytes, at[0].gradients_bytes);
    // Stage 2 keeps 1/64 of the gradients, and whole ones of the two largest units between
    // their weight gradients and their reduce-scatters: the head and the token embedding
    // (128256 x 4096 each), in f32.
    const int64_t unit = 128256LL * 4096 * 4;
    EXPECT_NEAR(at[2].gradients_bytes, at[0].gradients_bytes / nd + 2 * unit, 1);
    EXPECT_EQ(at[2].parameters_bytes, at[0].parameters_bytes);
    // Stage 3 keeps 1/64 of the weights and the two largest units it gathers: twice the
    // largest, the head.
    EXPECT_NEAR(at[3].parameters_bytes, at[0].parameters_bytes / nd + 2 * unit, 1);
    EXPECT_EQ(at[3].activations_bytes, at[0].activations_bytes);
    EXPECT_LT(at[3].peak_memory_bytes, at[2].peak_memory_bytes);
}

TEST(Zero, StageThreeHidesItsGathersBehindComputeWhenTheLinksAllow) {
    sim::Timeline two = simulated(checked(fsdp, {"mesh.zero=2"}));
    Program p = checked(fsdp, {"mesh.zero=3"});
    sim::Timeline three = simulated(p);
    // Two gathers of the 16 GB of bf16 weights a step, a block ahead of the compute: over
    // the profile's InfiniBand they cost little beside ZeRO 2's all-gather after the step.
    EXPECT_LT(three.makespan, 1.25 * two.makespan);
    // On links 100 times slower they cannot hide: the step grows by about their time.
    p.mesh.profile.inter_host.bandwidth /= 100;
    sim::Timeline slow = simulated(p);
    const double gather = 63.0 * (2.0 * static_cast<double>(p.model.parameters) / 64) /
                          p.mesh.profile.inter_host.bandwidth;
    EXPECT_GT(slow.makespan, three.makespan + 1.5 * gather);
}

TEST(SequenceParallel, DividesTheActivationsTensorParallelismLeavesWhole) {
    const std::vector<std::string> base = {"mesh.dp=1",    "mesh.zero=0",
                                           "mesh.tp=8",    "mesh.devices=a100 x 8",
                                           "mesh.hosts=1", "train.batch=1"};
    Program tp = checked(fsdp, base);
    std::vector<std::string> with_sp = base;
    with_sp.push_back("mesh.sp=true");
    Program sp = checked(fsdp, with_sp);
    const BlockSpec& block = tp.model.blocks.front();
    // Llama 3 8B in bf16 (2 bytes), 8192 tokens, t = 8: what Dist's units keep per block, from
    // models/units_block.cpp. The two norms, attention and the MLP each keep their input (h per
    // token; the rank's 1 / t of the tokens with sp); attention keeps q and its output (32 / t
    // heads of 128 each), k and v (8 / t heads) and an f32 log-sum-exp per head; the SwiGLU MLP
    // its two products (2 x 14336 / t) and their product (14336 / t); each norm an f32 mean and
    // reciprocal deviation per token (8 bytes).
    const double s = 8192, h = 4096, t = 8;
    const double rank_part = 2 * (32 / t) * 128 + 2 * (8 / t) * 128 + (32 / t) * 2 + 3 * 14336 / t;
    EXPECT_NEAR(block_activation_bytes(tp, block), 2 * s * (4 * h + rank_part) + 2 * 8 * s, 1.0);
    EXPECT_NEAR(block_activation_bytes(sp, block), 2 * s * (4 * h / t + rank_part) + 2 * 8 * s / t,
                1.0);
    // Without recomputation a flash kernel still keeps no scores (Llama's attention is flash):
    // selective recomputation has nothing to drop.
    std::vector<std::string> none = base;
    none.push_back("schedule.recompute=none");
    Program flash = checked(fsdp, none);
    EXPECT_EQ(block_activation_bytes(flash, block), block_activation_bytes(tp, block));
    // Full recomputation keeps each residual group's input (two per block), the float stream
    // tensor even in bf16 (models/units.cpp).
    std::vector<std::string> full = base;
    full.push_back("schedule.recompute=full");
    EXPECT_NEAR(block_activation_bytes(checked(fsdp, full), block), 2 * 4 * s * h, 1.0);
    // A materialized kernel is Megatron-LM's layer: Korthikanti et al.'s s b h (10 + 24 / t)
    // with the scores' 5 a s / (h t) (GPT 13B shapes), and the layer above with a flash one.
    std::vector<std::string> gpt = {"model.layers=4",
                                    "model.heads=40",
                                    "model.width=5120",
                                    "model.context=2048",
                                    "mesh.devices=a100 x 8",
                                    "mesh.dp=1",
                                    "mesh.tp=8",
                                    "mesh.pp=1",
                                    "train.batch=1",
                                    "schedule.microbatches=1",
                                    "schedule.recompute=none",
                                    "train.precision=bf16"};
    Program flash_gpt = checked("gpt_tiny.dist", gpt);
    gpt.push_back("model.attention_kernel=\"materialized\"");
    Program kept = checked("gpt_tiny.dist", gpt);
    const double a = 40, s2 = 2048, h2 = 5120;
    // GPT's MLP: the GELU's input and output (4 h / t each; bf16 keeps no tanh).
    const double gpt_rank = 4 * (h2 / t) + (a / t) * 2 + 2 * 4 * h2 / t;
    EXPECT_NEAR(block_activation_bytes(flash_gpt, flash_gpt.model.blocks.front()),
                2 * s2 * (4 * h2 + gpt_rank) + 2 * 8 * s2, 1.0);
    EXPECT_NEAR(block_activation_bytes(kept, kept.model.blocks.front()),
                s2 * h2 * (10 + 24 / t + 5 * a * s2 / (h2 * t)), 1.0);
    // Its time: four passes over the rank's b (a / t) s^2 scores in place of a flash kernel's
    // over q, k, v and the output (4 s (a / t) 128 values each), at 2 bytes, in every block.
    const Graph g_flash = *lower(flash_gpt).graph, g_kept = *lower(kept).graph;
    const double scores = 4 * (a / t) * s2 * s2 * 2, qkvo = 4 * s2 * 3 * (a / t) * 128 * 2;
    EXPECT_NEAR(g_kept.stages[0].bytes_elementwise - g_flash.stages[0].bytes_elementwise,
                4 * (scores - qkvo), 1e-6 * scores);
    // It is planned and simulated, and training refuses it at the attention layer.
    EXPECT_TRUE(flash_gpt.train.training_refusal.empty());
    EXPECT_NE(kept.train.training_refusal.find("attention with `kernel: materialized` is planned "
                                               "and simulated, not trained"),
              std::string::npos)
        << kept.train.training_refusal;
    // sp is refused without tp; with it, training takes it (runtime_test.cpp).
    lang::CheckResult alone = check("gpt_tiny.dist", {"mesh.sp=true"});
    ASSERT_FALSE(alone.ok());
    EXPECT_NE(alone.report().find("error: sequence parallelism splits what tensor "
                                  "parallelism replicates; with tp = 1 there is nothing to split"),
              std::string::npos)
        << alone.report();
    EXPECT_EQ(sp.train.training_refusal.find("sequence parallelism"), std::string::npos);
}

TEST(ContextParallel, SplitsEachSequenceAndPassesKeysAndValuesAroundTheRing) {
    Program one = checked("long_context.dist", {"mesh.cp=1", "mesh.devices=h100 x 32"});
    Program two = checked("long_context.dist");
    EXPECT_EQ(two.mesh.devices, 4 * 2 * 4 * 2);
    Graph g1 = *lower(one).graph, g2 = *lower(two).graph;
    ASSERT_EQ(g1.stages.size(), g2.stages.size());
    // Every rank has half of each sequence: half the FLOPs, and a ring exchange of the other
    // rank's key/value blocks (8 key/value heads of 128 over tp 4, 16k tokens, bf16).
    EXPECT_NEAR(g2.stages[1].flops_forward, g1.stages[1].flops_forward / 2,
                1e-9 * g1.stages[1].flops_forward);
    EXPECT_EQ(g1.stages[1].cp_ring_bytes, 0);
    const int64_t per_layer = 1 * 2 * 16384LL * (8 / 4) * 128 * 2;
    EXPECT_EQ(g2.stages[1].cp_ring_bytes, g2.stages[1].blocks * per_layer);
    // Rank layout: tp fastest, then cp; the cp pair of rank 0 is rank 4, on the same host.
    EXPECT_EQ(g2.rank_of(0, 0, 0, 1), 4);
    EXPECT_EQ(g2.ranks[4].cp, 1);
    EXPECT_EQ(g2.ranks[4].host, g2.ranks[0].host);
    // Gradients are reduced over dp x cp: the replica group of rank 0 has 8 members.
    EXPECT_EQ(g2.replica_group(g2.ranks[0]).size(), 8u);
    // cp must cut the context into 2 cp equal chunks.
    lang::CheckResult bad = check("gpt_tiny.dist", {"mesh.cp=3"});
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.report().find("cp = 3 cannot split the context of"), std::string::npos)
        << bad.report();
    lang::CheckResult count = check("gpt_tiny.dist", {"mesh.cp=2", "mesh.devices=cpu x 4"});
    EXPECT_NE(count.report().find("the mesh has dp x cp x tp x pp = 1 x 2 x 1 x 1 = 2 ranks, but "
                                  "4 devices"),
              std::string::npos)
        << count.report();
    EXPECT_NE(count.report().find("set `dp: 2`"), std::string::npos) << count.report();
    // Training takes cp, with sp too (runtime_test.cpp), and the example's bf16.
    EXPECT_EQ(two.train.training_refusal, "");
}

TEST(Examples, TheNewScalesPlanAndSimulate) {
    for (const char* file : {fsdp, "long_context.dist"}) {
        sim::Timeline t = simulated(checked(file));
        EXPECT_TRUE(t.fits) << file;
        EXPECT_GT(t.mfu, 0.1) << file;
        // The report says which formulas its memory figures follow.
        EXPECT_NE(sim::text_report(t).find("(memory model: "), std::string::npos) << file;
    }
    EXPECT_NE(sim::text_report(simulated(checked(fsdp)))
                  .find("ZeRO stage 3's (4 + 4 + 8) psi / N_d over N_d = 64"),
              std::string::npos);
}
