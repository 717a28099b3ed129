// runtime_test.cpp: the actor runtime against one device.
//
// The central test of the runtime: for every schedule kind and for meshes that use each axis
// alone and together, training a tiny model for a few steps gives the per-step losses of the
// single-device run of the same seed (1e-5 relative) and the same final weights (1e-4), with
// the checkpoint gathered from the ranks as the one-device model. Then failures: a rank that
// throws mid-step ends the run with its rank, action and cause, and nothing hangs.
#include "actors/plan/lower.hpp"
#include "actors/runtime/job.hpp"
#include "actors/runtime/measured.hpp"
#include "lang/check.hpp"
#include "models/checkpoint.hpp"
#include "models/trainer.hpp"

#include "tests/common/checked_script.hpp"
#include "tests/common/job_curve.hpp"
#include "tests/common/tiny_scripts.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <future>
#include <string>
#include <thread>
#include <tuple>
#include <unistd.h>
#include <utility>

using namespace dist;

namespace {

const std::string gpt_script = dist::tests::tiny_gpt_script(3);
const std::string llama_script = dist::tests::tiny_llama_script(3);

struct Reference {
    std::vector<double> losses, norms;
    std::unique_ptr<models::Model> model;
};

Reference one_device(const std::string& text, Precision precision = Precision::f32) {
    Program p = tests::checked_script(
        text, {precision == Precision::bf16 ? "train.precision=bf16" : "train.precision=f32"});
    models::TokenData data;
    EXPECT_EQ(models::load_data(p.train.data, p.model, data), "");
    Reference ref;
    ref.model = std::make_unique<models::Model>(p.model, static_cast<uint64_t>(p.train.seed),
                                                Recompute::none, nullptr, precision);
    std::string err = models::train(p, *ref.model, data, 0, [&](const models::StepMetrics& m) {
        ref.losses.push_back(m.loss);
        ref.norms.push_back(m.grad_norm);
        return true;
    });
    EXPECT_EQ(err, "");
    return ref;
}

struct Case {
    std::string name;
    std::string model; // "gpt" or "llama"
    std::vector<std::string> overrides;
};

void PrintTo(const Case& c, std::ostream* os) {
    *os << c.name;
}

class Equivalence : public ::testing::TestWithParam<Case> {};

TEST_P(Equivalence, LossesAndWeightsMatchOneDevice) {
    const Case& c = GetParam();
    const std::string text = c.model == "gpt" ? gpt_script : llama_script;
    Program p = tests::checked_script(text, c.overrides);
    Reference ref = one_device(text, p.train.precision);
    // bf16 rounds each layer's output: a sum taken in another order (a tensor-parallel
    // reduction) may round to the neighbouring bf16 value, and training carries that on.
    const double loose = p.train.precision == Precision::bf16 ? 100 : 1;
    plan::PlanResult planned = plan::lower(p);
    ASSERT_TRUE(planned.ok()) << plan::render_errors("t.dist", planned.errors);
    models::TokenData data;
    ASSERT_EQ(models::load_data(p.train.data, p.model, data), "");

    runtime::Job job(p, *planned.graph, data);
    auto [losses, norms, error, experts] =
        tests::run_job(job, p.train.steps, std::chrono::seconds(30));
    ASSERT_EQ(error, "");
    ASSERT_EQ(losses.size(), ref.losses.size());
    for (size_t i = 0; i < losses.size(); ++i)
        EXPECT_NEAR(losses[i], ref.losses[i], loose * 1e-5 * std::abs(ref.losses[i]))
            << "step " << i + 1;
    if (loose > 1) {
        // And it is bf16 the runtime ran: its losses are nearer one bf16 device's than one f32
        // device's.
        Reference f32 = one_device(text, Precision::f32);
        double to_bf16 = 0, to_f32 = 0;
        for (size_t i = 0; i < losses.size(); ++i) {
            to_bf16 += std::abs(losses[i] - ref.losses[i]);
            to_f32 += std::abs(losses[i] - f32.losses[i]);
        }
        EXPECT_LT(to_bf16, to_f32);
    }
    // Adam and clipping hide a wrongly scaled gradient from the losses; the norm shows it.
    for (size_t i = 0; i < norms.size(); ++i)
        EXPECT_NEAR(norms[i], ref.norms[i], loose * 1e-4 * ref.norms[i]) << "step " << i + 1;

    models::Model whole(p.model, 0); // other initial values: every element must be overwritten
    job.gather(whole);
    double diff = 0, norm = 0;
    for (const auto& w : ref.model->params().all()) {
        const models::Parameter* g = whole.params().find(w.name);
        ASSERT_NE(g, nullptr) << w.name;
        const float* a = g->value.data<float>();
        const float* b = w.value.data<float>();
        for (int64_t i = 0; i < w.value.numel(); ++i) {
            diff += (a[i] - b[i]) * static_cast<double>(a[i] - b[i]);
            norm += b[i] * static_cast<double>(b[i]);
            if (loose == 1) {
                ASSERT_NEAR(a[i], b[i], 1e-4) << w.name << " " << i << " of " << w.value.numel();
            }
        }
    }
    // Adam turns a gradient element near zero into a step of about the learning rate whatever
    // its sign, so under bf16 single elements can part: the weights as a whole stay together.
    EXPECT_LT(std::sqrt(diff), 0.02 * std::sqrt(norm));
}

using tests::mesh_overrides;
std::vector<std::string> mesh(int dp, int tp, int pp, const std::string& kind, int m, int v = 0) {
    return mesh_overrides(dp, tp, pp, kind, m, v);
}
// The same mesh with each sequence split over `ranks` context-parallel ranks.
std::vector<std::string> cp(int ranks, std::vector<std::string> overrides) {
    overrides.push_back("mesh.cp=" + std::to_string(ranks));
    return overrides;
}
// The same mesh with sequence parallelism over its tensor-parallel ranks.
std::vector<std::string> sp(std::vector<std::string> overrides) {
    overrides.push_back("mesh.sp=true");
    return overrides;
}
// The same mesh in bf16.
std::vector<std::string> bf16(std::vector<std::string> overrides) {
    overrides.push_back("train.precision=bf16");
    return overrides;
}
// The same mesh with ZeRO stage `zero` over its data-parallel ranks.
std::vector<std::string> zero(int stage, std::vector<std::string> overrides) {
    overrides.push_back("mesh.zero=" + std::to_string(stage));
    return overrides;
}

INSTANTIATE_TEST_SUITE_P(
    Meshes, Equivalence,
    ::testing::Values(
        Case{"dp2", "gpt", mesh(2, 1, 1, "1f1b", 2)}, Case{"tp2", "gpt", mesh(1, 2, 1, "1f1b", 1)},
        Case{"tp4", "gpt", mesh(1, 4, 1, "1f1b", 2)},
        Case{"pp2_gpipe", "gpt", mesh(1, 1, 2, "gpipe", 4)},
        Case{"pp2_1f1b", "gpt", mesh(1, 1, 2, "1f1b", 4)},
        Case{"pp4_1f1b", "gpt", mesh(1, 1, 4, "1f1b", 4)},
        Case{"pp2_interleaved_v2", "gpt", mesh(1, 1, 2, "interleaved_1f1b", 4, 2)},
        Case{"pp2_looped_bfs_v2", "gpt", mesh(1, 1, 2, "looped_bfs", 4, 2)},
        Case{"pp2_zb_h1", "gpt", mesh(1, 1, 2, "zb_h1", 4)},
        Case{"pp2_zb_h2", "gpt", mesh(1, 1, 2, "zb_h2", 4)},
        Case{"pp2_zbv", "gpt", mesh(1, 1, 2, "zbv", 4, 2)},
        Case{"pp2_dualpipev", "gpt", mesh(1, 1, 2, "dualpipev", 4, 2)},
        Case{"dp2_tp2_pp2", "gpt", mesh(2, 2, 2, "1f1b", 2)},
        Case{"llama_tp2_pp2", "llama", mesh(1, 2, 2, "1f1b", 2)},
        Case{"llama_dp2_zb_h1", "llama", mesh(2, 1, 2, "zb_h1", 2)},
        // ZeRO: sharded optimizer state (1), and gradients (2), whose shares of
        // odd-sized parameters differ in length between members (dp 4).
        Case{"dp2_zero1", "gpt", zero(1, mesh(2, 1, 1, "1f1b", 2))},
        Case{"dp2_zero2", "gpt", zero(2, mesh(2, 1, 1, "1f1b", 2))},
        Case{"dp4_zero2", "gpt", zero(2, mesh(4, 1, 1, "1f1b", 1))},
        Case{"dp2_pp2_zero1", "gpt", zero(1, mesh(2, 1, 2, "1f1b", 2))},
        Case{"dp2_tp2_pp2_zero2", "gpt", zero(2, mesh(2, 2, 2, "1f1b", 2))},
        Case{"llama_dp2_zb_h1_zero2", "llama", zero(2, mesh(2, 1, 2, "zb_h1", 2))},
        // ZeRO 2 keeps reduced shares only: the tied embedding's two copies summed
        // on one rank (a V), the norms' partial gradients summed over tp (sp),
        // and the hooks of a forward and a backward run as one pair (DualPipeV).
        Case{"dp2_pp2_zbv_zero2", "gpt", zero(2, mesh(2, 1, 2, "zbv", 4, 2))},
        Case{"dp2_tp2_sp_zero2", "gpt", sp(zero(2, mesh(2, 2, 1, "1f1b", 2)))},
        Case{"dp2_pp2_dualpipev_zero2", "gpt", zero(2, mesh(2, 1, 2, "dualpipev", 4, 2))},
        // ZeRO 3: weights gathered unit by unit, with tensor parallelism, a
        // pipeline, and the split backward of a zero-bubble schedule.
        Case{"dp2_zero3", "gpt", zero(3, mesh(2, 1, 1, "1f1b", 2))},
        Case{"dp4_zero3", "gpt", zero(3, mesh(4, 1, 1, "1f1b", 1))},
        Case{"dp2_tp2_zero3", "gpt", zero(3, mesh(2, 2, 1, "1f1b", 2))},
        Case{"dp2_pp2_zb_h1_zero3", "gpt", zero(3, mesh(2, 1, 2, "zb_h1", 2))},
        Case{"llama_dp2_tp2_zero3", "llama", zero(3, mesh(2, 2, 1, "1f1b", 2))},
        // Sequence parallelism: activations on 1/tp of the tokens between the
        // tensor-parallel layers, alone, with a pipeline, with ZeRO, on Llama.
        Case{"tp2_sp", "gpt", sp(mesh(1, 2, 1, "1f1b", 2))},
        Case{"tp4_sp", "gpt", sp(mesh(1, 4, 1, "1f1b", 1))},
        Case{"tp2_sp_pp2", "gpt", sp(mesh(1, 2, 2, "1f1b", 2))},
        Case{"dp2_tp2_sp_zero3", "gpt", sp(zero(3, mesh(2, 2, 1, "1f1b", 2)))},
        Case{"llama_tp2_sp_pp2_zb_h1", "llama", sp(mesh(1, 2, 2, "zb_h1", 2))},
        // Context parallelism: two chunks of every sequence per rank, attention
        // over every rank's keys and values; with tp, dp, pp, ZeRO, and Llama's
        // rotary positions and grouped-query attention.
        Case{"cp2", "gpt", cp(2, mesh(1, 1, 1, "1f1b", 2))},
        Case{"cp4", "gpt", cp(4, mesh(1, 1, 1, "1f1b", 1))},
        Case{"cp2_tp2_dp2", "gpt", cp(2, mesh(2, 2, 1, "1f1b", 2))},
        Case{"cp2_pp2_zb_h1_zero2", "gpt", cp(2, zero(2, mesh(1, 1, 2, "zb_h1", 2)))},
        Case{"llama_cp2_tp2", "llama", cp(2, mesh(1, 2, 1, "1f1b", 2))},
        Case{"llama_cp2_dp2_zero3", "llama", cp(2, zero(3, mesh(2, 1, 1, "1f1b", 2)))},
        // Both: sp shards each rank's two chunks over the tp group.
        Case{"cp2_tp2_sp", "gpt", cp(2, sp(mesh(1, 2, 1, "1f1b", 2)))},
        Case{"llama_cp2_tp2_sp_pp2", "llama", cp(2, sp(mesh(1, 2, 2, "1f1b", 2)))},
        // bf16: activations and gradients cross stages in bf16, every layout
        // rounds where one device does.
        Case{"bf16_pp2_zb_h1", "gpt", bf16(mesh(1, 1, 2, "zb_h1", 4))},
        Case{"bf16_dp2_zero1", "gpt", bf16(zero(1, mesh(2, 1, 1, "1f1b", 2)))},
        Case{"bf16_tp2_sp", "gpt", bf16(sp(mesh(1, 2, 1, "1f1b", 2)))},
        Case{"llama_bf16_cp2_pp2", "llama", bf16(cp(2, mesh(1, 1, 2, "1f1b", 2)))}),
    [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

} // namespace

namespace {

struct PlannedJob {
    Program program;
    plan::Graph graph;
    models::TokenData data;
};

std::unique_ptr<PlannedJob> plan_job(const std::vector<std::string>& overrides) {
    auto j = std::make_unique<PlannedJob>();
    j->program = tests::checked_script(gpt_script, overrides);
    plan::PlanResult planned = plan::lower(j->program);
    EXPECT_TRUE(planned.ok()) << plan::render_errors("t.dist", planned.errors);
    j->graph = *planned.graph;
    EXPECT_EQ(models::load_data(j->program.train.data, j->program.model, j->data), "");
    return j;
}

} // namespace

TEST(Failure, ARankThatThrowsMidStepEndsTheRunWithItsRankActionAndCause) {
    auto j = plan_job(mesh(2, 1, 2, "1f1b", 2));
    runtime::Job job(j->program, j->graph, j->data);
    // Rank 3 (dp 1, pp 1) fails in the backward of microbatch 1 of the second step, while the
    // others wait on it in receives and in the data-parallel reduction.
    job.executor(3).set_action_hook([](int64_t step, const plan::PlanAction& a) {
        if (step == 1 && a.kind == plan::ActionKind::backward && a.microbatch == 1)
            throw std::runtime_error("planted fault");
    });
    runtime::JobOptions o;
    o.end_step = 3;
    int steps = 0;
    o.on_step = [&](const runtime::StepReport&) { return ++steps, true; };
    // No rank may stay blocked on the failed one: run() returning at all is the point (a hang
    // would end at the test's ctest timeout).
    std::string result = job.run(o);
    EXPECT_EQ(result, "rank 3 in 1B1: planted fault");
    EXPECT_EQ(steps, 1); // the first step completed and was reported; the second was not
}

TEST(Failure, TheWatchdogReportsWhatEveryRankIsWaitingFor) {
    auto j = plan_job(mesh(1, 1, 2, "1f1b", 2));
    runtime::Job job(j->program, j->graph, j->data);
    // Rank 0 stalls before its first forward; rank 1 waits for the activation.
    job.executor(0).set_action_hook([](int64_t, const plan::PlanAction& a) {
        if (a.kind == plan::ActionKind::forward && a.microbatch == 0)
            std::this_thread::sleep_for(std::chrono::seconds(2));
    });
    runtime::JobOptions o;
    o.end_step = 1;
    o.watchdog = std::chrono::milliseconds(300);
    std::string result = job.run(o);
    EXPECT_NE(result.find("watchdog: no action completed on any rank"), std::string::npos)
        << result;
    EXPECT_NE(result.find("rank 0 in 0F0"), std::string::npos) << result;
    EXPECT_NE(result.find("rank 1 in 1RECV_F0<r0"), std::string::npos) << result;
}

// The executors and their communication without the actors: every rank's step on a plain
// thread. The concurrent code that is Dist's own (executors, the gradient reducer's thread,
// in-process groups and fabric) runs here as under the actors, in a form ThreadSanitizer can
// check (CAF's scheduler is an uninstrumented library). `make tsan` runs this test.
TEST(Executors, OnPlainThreadsGiveTheLossesOfOneDevice) {
    auto j = plan_job(mesh(2, 2, 2, "1f1b", 2));
    Reference ref = one_device(gpt_script);
    runtime::LocalComms comms(j->graph);
    std::vector<std::unique_ptr<runtime::RankExecutor>> ranks;
    for (const auto& r : j->graph.ranks)
        ranks.push_back(std::make_unique<runtime::RankExecutor>(j->program, j->graph, r.rank,
                                                                comms.for_rank(r.rank)));
    for (int64_t step = 0; step < 2; ++step) {
        std::vector<std::future<runtime::RankStepResult>> running;
        for (auto& ex : ranks)
            running.push_back(std::async(std::launch::async,
                                         [&, e = ex.get()] { return e->run_step(step, j->data); }));
        double loss = 0;
        int64_t n = 0;
        for (auto& f : running) {
            runtime::RankStepResult r = f.get();
            loss += r.loss_sum;
            n += r.loss_microbatches;
        }
        double expect = ref.losses[static_cast<size_t>(step)];
        EXPECT_NEAR(loss / static_cast<double>(n), expect, 1e-5 * expect) << "step " << step + 1;
    }
}

TEST(Failure, TheLastCheckpointIsIntactAfterARankFails) {
    namespace fs = std::filesystem;
    auto j = plan_job(mesh(1, 2, 2, "1f1b", 2));
    fs::path dir = fs::temp_directory_path() / ("dist_failure_ck_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    runtime::Job job(j->program, j->graph, j->data);
    models::Model whole(j->program.model, 0), saved(j->program.model, 0);
    job.executor(2).set_action_hook([](int64_t step, const plan::PlanAction& a) {
        if (step == 2 && a.kind == plan::ActionKind::forward && a.microbatch == 1)
            throw std::runtime_error("out of memory");
    });
    runtime::JobOptions o;
    o.end_step = 3;
    o.on_step = [&](const runtime::StepReport& r) {
        job.gather(whole);
        return models::save_checkpoint(dir.string(), whole, r.metrics.step, 7).empty();
    };
    EXPECT_EQ(job.run(o), "rank 2 in 1F1: out of memory");
    // The checkpoint of step 2 loads, whole, with the weights the ranks had after step 2.
    int64_t step = 0;
    ASSERT_EQ(models::load_training_state(dir.string(), saved, step), "");
    EXPECT_EQ(step, 2);
    for (const auto& w : whole.params().all()) {
        const models::Parameter* s = saved.params().find(w.name);
        ASSERT_NE(s, nullptr);
        for (int64_t i = 0; i < w.value.numel(); ++i)
            ASSERT_EQ(s->value.data<float>()[i], w.value.data<float>()[i]) << w.name;
    }
    fs::remove_all(dir);
}

// A step's measured bubble: the ranks' idle time over ranks x step, where the compute actions
// and the optimizer's update are busy and a message, a wait or the communication thread's
// collective is not (docs/simulator.md). Rank 0's busy actions take 1 ms each from 0; rank 1's
// from 3 ms; each message 5 ms (idle), and a collective spans the whole step.
TEST(Measured, TheBubbleIsTheIdleTimeOverRanksTimesTheStep) {
    auto j = plan_job(mesh(1, 1, 2, "1f1b", 2));
    std::vector<std::vector<runtime::ActionTiming>> timings(2);
    std::vector<double> busy_ms(2, 0), end_ms(2, 0);
    for (size_t r = 0; r < 2; ++r) {
        double t = r == 0 ? 0.0 : 3.0;
        const auto& actions = j->graph.ranks[r].actions;
        for (size_t i = 0; i < actions.size(); ++i) {
            const bool busy =
                plan::is_compute(actions[i].kind) || actions[i].kind == plan::ActionKind::step;
            double d = busy ? 1.0 : 5.0;
            timings[r].push_back({i, (1000 + t) / 1e3, (1000 + t + d) / 1e3, false});
            t += d;
            if (busy) busy_ms[r] += d;
        }
        end_ms[r] = t;
        timings[r].push_back({0, 1.0, (1000 + t) / 1e3, true});
    }
    ASSERT_GT(busy_ms[0], 0);
    ASSERT_GT(busy_ms[1], 0);
    const double makespan = std::max(end_ms[0], end_ms[1]);
    const double expected = (2 * makespan - busy_ms[0] - busy_ms[1]) / (2 * makespan);
    EXPECT_NEAR(runtime::measured_bubble(j->graph, timings), expected, 1e-9);
    sim::Timeline t = runtime::measured_timeline(j->graph, timings);
    EXPECT_NEAR(t.bubble_fraction, expected, 1e-9);
    EXPECT_NEAR(t.step_time_s, makespan / 1e3, 1e-9);
}

// An action's time on a core is its thread's CPU clock: never more than its span, and where the
// thread sleeps inside it (the first stage of replica 0 sleeps 60 ms in its first forward; the
// second stage blocks in the receive of that forward's activation meanwhile) the span holds the
// sleep and the time on a core does not. The communication thread's collectives (the gradients'
// reduction between the replicas) are not measured so. The measured timeline keeps it.
TEST(Measured, AnActionsTimeOnACoreIsItsThreadsCpuTimeNotItsSleep) {
    auto j = plan_job(mesh(2, 1, 2, "1f1b", 2));
    auto rank_at = [&](int32_t pp) {
        for (const plan::PlanRank& r : j->graph.ranks)
            if (r.dp == 0 && r.tp == 0 && r.pp == pp) return static_cast<size_t>(r.rank);
        ADD_FAILURE() << "no rank at pp " << pp;
        return size_t{0};
    };
    const size_t first = rank_at(0), second = rank_at(1);
    runtime::Job job(j->program, j->graph, j->data);
    static constexpr double sleep_s = 0.06;
    job.executor(static_cast<int32_t>(first))
        .set_action_hook([](int64_t, const plan::PlanAction& a) {
            if (a.kind == plan::ActionKind::forward && a.microbatch == 0)
                std::this_thread::sleep_for(std::chrono::duration<double>(sleep_s));
        });
    runtime::JobOptions o;
    o.end_step = 1;
    std::vector<std::vector<runtime::ActionTiming>> timings;
    o.on_step = [&](const runtime::StepReport& r) { return timings = r.timings, true; };
    ASSERT_EQ(job.run(o), "");
    ASSERT_EQ(timings.size(), j->graph.ranks.size());
    bool slept = false, blocked = false, reduced = false;
    for (size_t r = 0; r < timings.size(); ++r) {
        for (const runtime::ActionTiming& t : timings[r]) {
            const plan::PlanAction& a = j->graph.ranks[r].actions[t.action];
            const double span = t.end_s - t.start_s;
            if (t.collective) {
                reduced = true;
                EXPECT_LT(t.cpu_s, 0) << plan::to_string(a);
                continue;
            }
            EXPECT_GE(t.cpu_s, 0) << plan::to_string(a);
            EXPECT_LE(t.cpu_s, span + 1e-4) << plan::to_string(a);
            if (r == first && a.kind == plan::ActionKind::forward && a.microbatch == 0) {
                slept = true;
                EXPECT_GE(span, sleep_s);
                EXPECT_LT(t.cpu_s, span - 0.8 * sleep_s);
            }
            if (r == second && a.kind == plan::ActionKind::recv_forward && a.microbatch == 0) {
                blocked = true;
                EXPECT_GE(span, 0.8 * sleep_s);
                EXPECT_LT(t.cpu_s, span - 0.6 * sleep_s);
            }
        }
    }
    EXPECT_TRUE(slept);
    EXPECT_TRUE(blocked);
    EXPECT_TRUE(reduced);
    const sim::Timeline t = runtime::measured_timeline(j->graph, timings);
    for (const sim::RankReport& r : t.ranks)
        for (const sim::Span& s : r.spans) {
            EXPECT_GE(s.on_core, 0);
            EXPECT_LE(s.on_core, s.end - s.start + 1e-4);
        }
}

// What a run sets beside the prediction: the medians of the steps after the first.
TEST(Measured, ARunsStepAndBubbleAreTheMediansAfterTheFirstStep) {
    runtime::StepTally tally;
    tally.add(0.5, 0.9);                          // the first step warms up
    EXPECT_DOUBLE_EQ(tally.median_step_s(), 0.5); // alone, it is all there is
    tally.add(0.1, 0.30);
    tally.add(0.3, 0.10);
    tally.add(0.2, 0.20);
    EXPECT_DOUBLE_EQ(tally.median_step_s(), 0.2);
    EXPECT_DOUBLE_EQ(tally.median_bubble(), 0.20);
    // Three steps after the first: too few for a middle half.
    EXPECT_EQ(tally.middle_half_s(), std::make_pair(0.0, 0.0));
}

// Beside the median, the middle half of the steps after the first: their 25th and 75th
// percentiles, linear between neighbours (as numpy's default and R's type 7 take them).
TEST(Measured, ARunsMiddleHalfIsItsStepsQuartilesAfterTheFirst) {
    runtime::StepTally tally;
    tally.add(9.0, 0.5); // the first step, far slower: not counted
    for (double s : {0.08, 0.01, 0.05, 0.03}) tally.add(s, 0.1);
    // Four steps 0.01, 0.03, 0.05, 0.08: positions 0.75 and 2.25.
    auto [low, high] = tally.middle_half_s();
    EXPECT_NEAR(low, 0.01 + 0.75 * 0.02, 1e-12);
    EXPECT_NEAR(high, 0.05 + 0.25 * 0.03, 1e-12);
    for (double s : {0.02, 0.04, 0.06, 0.07}) tally.add(s, 0.1);
    // 0.01 to 0.08 by 0.01: positions 1.75 and 5.25.
    std::tie(low, high) = tally.middle_half_s();
    EXPECT_NEAR(low, 0.0275, 1e-12);
    EXPECT_NEAR(high, 0.0625, 1e-12);
    EXPECT_LE(low, tally.median_step_s());
    EXPECT_GE(high, tally.median_step_s());

    // The run's line carries it after the measured step, and leaves it out without one.
    sim::Timeline predicted;
    predicted.step_time_s = 0.05;
    predicted.bubble_fraction = 0.2;
    const std::string with =
        sim::comparison_line(0.05, 0.25, predicted, "here", tally.middle_half_s());
    EXPECT_EQ(with, "step time: measured 50.0 ms (the middle half of the steps 27.5-62.5 ms), "
                    "predicted 50.0 ms (1.00x); bubble: measured 25.0%, predicted 20.0% (`dist "
                    "sim` with the here profile)");
    EXPECT_EQ(sim::comparison_line(0.05, 0.25, predicted, "here"),
              "step time: measured 50.0 ms, predicted 50.0 ms (1.00x); bubble: measured 25.0%, "
              "predicted 20.0% (`dist sim` with the here profile)");
}
