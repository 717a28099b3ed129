// calibrated_test.cpp: the simulator on a calibrated machine. The event-driven execution of
// ranks that share cores (it must agree with the fixpoint when nothing is shared, and stretch
// overlapping work by the measured sharing), the interpolation of measured rates, and
// `dist calibrate` end to end: the profile it writes loads, is complete, and prices plans.
#include "actors/plan/execute.hpp"
#include "actors/plan/lower.hpp"
#include "actors/sim/calibrated.hpp"
#include "actors/sim/simulate.hpp"
#include "cli/calibrate_parts.hpp"
#include "cli/commands.hpp"
#include "kernels/devices.hpp"
#include "lang/check.hpp"
#include "lang/hardware.hpp"
#include "models/stage.hpp"
#include "tests/common/checked_script.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <pthread.h>
#include <random>
#include <regex>
#include <sched.h>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>
#include <unistd.h>

using namespace dist;
using namespace dist::plan;
namespace fs = std::filesystem;

namespace {

using tests::planned_graph;

Program checked(const std::string& example, std::vector<std::string> overrides = {}) {
    return tests::checked_example(example, std::move(overrides));
}

Graph planned(const Program& p) {
    return planned_graph(p);
}

// Distinct durations for every action, so that an engine that orders anything wrongly shows.
ExecCosts distinct_costs() {
    ExecCosts c;
    c.compute = [](const PlanRank& r, const PlanAction& a) {
        double base = 1.0 + 0.1 * a.stage + 0.013 * a.microbatch + 0.007 * r.rank;
        switch (a.kind) {
        case ActionKind::forward: return base;
        case ActionKind::backward: return 2 * base;
        case ActionKind::backward_input: return 1.1 * base;
        case ActionKind::backward_weight: return 0.9 * base;
        case ActionKind::step: return 0.3;
        default: return 0.0;
        }
    };
    c.transfer = [](const PlanRank& from, const PlanRank& to, const PlanAction&) {
        return 0.05 + 0.01 * std::abs(from.rank - to.rank);
    };
    c.reduction = [](const PlanRank&, const PlanAction& a) { return 0.2 + 0.01 * a.stage; };
    return c;
}

// F 1 s and B 2 s, nothing else: the costs the hand-worked tests below use.
double forward_one_backward_two(const PlanRank&, const PlanAction& a) {
    return a.kind == ActionKind::forward ? 1.0 : a.kind == ActionKind::backward ? 2.0 : 0.0;
}

// Where rank r's `kind` of `microbatch` is in its actions (0, and a failure, where it has none).
size_t position_of(const Graph& g, size_t r, ActionKind kind, int32_t microbatch) {
    const auto& actions = g.ranks[r].actions;
    for (size_t i = 0; i < actions.size(); ++i)
        if (actions[i].kind == kind && actions[i].microbatch == microbatch) return i;
    ADD_FAILURE() << "rank " << r << " has no " << plan::op_name(kind) << microbatch;
    return 0;
}

// Single-threaded ranks on `cores` cores, each as fast whatever runs beside it, F 1 s and B 2 s,
// reductions free.
ExecCosts single_threaded_on(double cores) {
    ExecCosts c = distinct_costs();
    c.compute = forward_one_backward_two;
    c.reduction = [](const PlanRank&, const PlanAction&) { return 0.0; };
    c.threads = [](const PlanRank&) { return 1.0; };
    c.speed = [](double) { return 1.0; };
    c.cores = cores;
    return c;
}

struct TempDir {
    fs::path path;
    explicit TempDir(const std::string& tag)
        : path(fs::temp_directory_path() /
               ("dist_calibrated_" + tag + "_" + std::to_string(::getpid()))) {
        fs::remove_all(path);
        fs::create_directories(path);
    }
    ~TempDir() { fs::remove_all(path); }
};

struct Result {
    int status = 0;
    std::string out;
};

Result run(const std::string& command) {
    Result r;
    FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
    if (!pipe) return {-1, "popen failed"};
    std::array<char, 4096> buf{};
    size_t n;
    while ((n = std::fread(buf.data(), 1, buf.size(), pipe)) > 0) r.out.append(buf.data(), n);
    int status = ::pclose(pipe);
    r.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return r;
}

} // namespace

// With every thread at full speed, sharing nothing, the time-ordered engine must reproduce the
// fixpoint's times exactly: every schedule, with data parallelism, split backward passes and
// ZeRO 2 and 3's collectives unit by unit.
TEST(SharedCores, AtFullSpeedTheEventEngineMatchesTheFixpoint) {
    const std::vector<std::vector<std::string>> meshes = {
        {"mesh.pp=1"},
        {"mesh.pp=2", "schedule.microbatches=4"},
        {"mesh.pp=4", "schedule.microbatches=8"},
        {"mesh.pp=2", "mesh.dp=2", "schedule.microbatches=4"},
        {"mesh.pp=2", "mesh.dp=2", "mesh.zero=3", "schedule.microbatches=4"},
        {"mesh.pp=2", "mesh.dp=2", "mesh.zero=2", "schedule.kind=zb_h1", "schedule.microbatches=4"},
        {"mesh.pp=2", "mesh.dp=2", "mesh.zero=3", "schedule.kind=zbv", "schedule.virtual_stages=2",
         "schedule.microbatches=4"},
        {"mesh.pp=2", "schedule.kind=gpipe", "schedule.microbatches=4"},
        {"mesh.pp=2", "schedule.kind=zb_h1", "schedule.microbatches=4"},
        {"mesh.pp=2", "schedule.kind=interleaved_1f1b", "schedule.virtual_stages=2",
         "schedule.microbatches=4"},
        {"mesh.pp=2", "schedule.kind=dualpipev", "schedule.virtual_stages=2",
         "schedule.microbatches=4"},
        {"mesh.pp=2", "schedule.kind=zb_h2", "schedule.microbatches=4"},
        {"mesh.pp=2", "schedule.kind=zbv", "schedule.virtual_stages=2", "schedule.microbatches=4"},
    };
    for (const auto& mesh : meshes) {
        std::vector<std::string> o = mesh;
        o.push_back("model.layers=8");
        Graph g = planned(checked("gpt_tiny.dist", o));
        ExecCosts fixed = distinct_costs(), shared = distinct_costs();
        shared.threads = [](const PlanRank&) { return 1.0; };
        shared.speed = [](double) { return 1.0; };
        // The optimizer steps wait for every rank of the replica (the gradient norm), whichever
        // rank comes last.
        fixed.step_barrier = shared.step_barrier = true;
        ExecTimes a = execute(g, fixed), b = execute(g, shared);
        ASSERT_TRUE(a.complete);
        ASSERT_TRUE(b.complete) << mesh.front();
        for (size_t r = 0; r < g.ranks.size(); ++r)
            for (size_t i = 0; i < g.ranks[r].actions.size(); ++i) {
                ASSERT_NEAR(a.start[r][i], b.start[r][i], 1e-9)
                    << mesh.back() << " rank " << r << " " << to_string(g.ranks[r].actions[i]);
                ASSERT_NEAR(a.end[r][i], b.end[r][i], 1e-9)
                    << mesh.back() << " rank " << r << " " << to_string(g.ranks[r].actions[i]);
            }
    }
}

// ZeRO 2 and 3 unit by unit, as the runtime's WeightGatherer and GradientScatterer run them:
// GATHER_F / GATHER_B gather a stage's first unit; the compute action gathers the others once
// it starts (one unit ahead of it, on the rank's one communication stream); a backward
// reduce-scatters each unit once it is done and REDUCE_SCATTER the last. dp 2, one stage of n
// units, one microbatch; a stage's gather takes n g, its reduce-scatter n s, F 1 and B 2.
TEST(ZeroUnits, AComputeActionGathersAndReduceScattersItsUnitsAsItRuns) {
    struct Times {
        double f_start, f_end, b_start, b_end, step_start;
        std::map<ActionKind, std::vector<std::pair<double, double>>> runs;
    };
    auto simulate = [](const std::string& zero, double g, double s, int32_t& n) {
        Graph graph =
            planned(checked("gpt_tiny.dist", {"mesh.dp=2", "mesh.zero=" + zero, "train.batch=8",
                                              "schedule.microbatches=1"}));
        n = graph.stages[0].units;
        ExecCosts c;
        c.compute = [](const PlanRank&, const PlanAction& a) {
            return a.kind == ActionKind::forward ? 1.0 : a.kind == ActionKind::backward ? 2.0 : 0.0;
        };
        c.transfer = [](const PlanRank&, const PlanRank&, const PlanAction&) { return 0.0; };
        c.reduction = [&](const PlanRank&, const PlanAction& a) {
            return (a.kind == ActionKind::reduce_scatter ? s : g) * graph.stages[0].units;
        };
        ExecTimes t = execute(graph, c);
        EXPECT_TRUE(t.complete);
        Times out{};
        const PlanRank& rank = graph.ranks[0];
        for (size_t i = 0; i < rank.actions.size(); ++i) {
            const ActionKind k = rank.actions[i].kind;
            if (k == ActionKind::forward)
                std::tie(out.f_start, out.f_end) = {t.start[0][i], t.end[0][i]};
            if (k == ActionKind::backward)
                std::tie(out.b_start, out.b_end) = {t.start[0][i], t.end[0][i]};
            if (k == ActionKind::step) out.step_start = t.start[0][i];
        }
        for (const ExecTimes::CollectiveRun& run : t.collectives[0])
            out.runs[rank.actions[run.action].kind].push_back({run.start, run.end});
        return out;
    };
    const double g = 0.1, s = 0.05, eps = 1e-9;
    int32_t n = 0;
    Times t = simulate("3", g, s, n);
    ASSERT_GT(n, 2);
    // The forward starts once its first unit is in; its other gathers queue behind the
    // backward's first (GATHER_B, listed before it), and it computes its last unit after them.
    EXPECT_NEAR(t.f_start, g, eps);
    EXPECT_NEAR(t.f_end, (n + 1) * g + 1.0 / n, eps);
    ASSERT_EQ(t.runs[ActionKind::gather_forward].size(), 2u);
    EXPECT_NEAR(t.runs[ActionKind::gather_forward][0].second, g, eps);
    EXPECT_NEAR(t.runs[ActionKind::gather_forward][1].first, 2 * g, eps);
    EXPECT_NEAR(t.runs[ActionKind::gather_forward][1].second, (n + 1) * g, eps);
    // The backward's gathers and reduce-scatters, (n - 1) (g + s), hide behind its 2 seconds;
    // they start with it, and REDUCE_SCATTER's last unit follows it, before the step.
    EXPECT_NEAR(t.b_start, t.f_end, eps);
    EXPECT_NEAR(t.b_end, t.b_start + 2.0, eps);
    ASSERT_EQ(t.runs[ActionKind::gather_backward].size(), 2u);
    EXPECT_NEAR(t.runs[ActionKind::gather_backward][1].first, t.b_start, eps);
    ASSERT_EQ(t.runs[ActionKind::reduce_scatter].size(), 2u);
    EXPECT_NEAR(t.runs[ActionKind::reduce_scatter][0].second, t.b_start + (n - 1) * (g + s), eps);
    EXPECT_NEAR(t.runs[ActionKind::reduce_scatter][1].first, t.b_end, eps);
    EXPECT_NEAR(t.runs[ActionKind::reduce_scatter][1].second, t.b_end + s, eps);
    EXPECT_NEAR(t.step_start, t.b_end + s, eps);

    // Reduce-scatters slower than the compute hold the backward up: it ends with the one before
    // its last unit (its last unit computed beside it, 2 / n < s).
    t = simulate("3", g, 0.5, n);
    EXPECT_NEAR(t.b_end, t.b_start + (n - 1) * (g + 0.5), eps);
    // ZeRO 2 gathers nothing: the forward runs alone, and the backward's reduce-scatters start
    // once its first unit is computed.
    t = simulate("2", g, 0.5, n);
    EXPECT_NEAR(t.f_start, 0.0, eps);
    EXPECT_NEAR(t.f_end, 1.0, eps);
    EXPECT_TRUE(t.runs[ActionKind::gather_forward].empty());
    EXPECT_NEAR(t.b_end, t.b_start + (n - 1) * 0.5 + 2.0 / n, eps);
}

// Where each rank has a device, compute that runs beside the rank's collectives runs at
// 1 / (1 + slow) of its speed for that time. Worked by hand for ZeRO 3 over one stage of n units,
// one microbatch: the forward starts with its first unit in (at g) while the stream runs the
// backward's first unit and the forward's n - 1 others, n g in all, and the backward starts with
// (n - 1) (g + s) of its own gathers and reduce-scatters; both shorter than the compute beside
// them, which the forward's last unit and the backward's tail leave no say.
TEST(ZeroUnits, ComputeBesideTheRanksCollectivesRunsSlowerForThatTime) {
    Graph graph = planned(checked(
        "gpt_tiny.dist", {"mesh.dp=2", "mesh.zero=3", "train.batch=8", "schedule.microbatches=1"}));
    const double n = graph.stages[0].units, g = 0.01, s = 0.005, eps = 1e-9;
    ASSERT_GT(n, 2);
    ASSERT_LT(n, 30); // the collectives stay shorter than the compute beside them
    auto run = [&](double slow) {
        ExecCosts c;
        c.compute = [](const PlanRank&, const PlanAction& a) {
            return a.kind == ActionKind::forward ? 1.0 : a.kind == ActionKind::backward ? 2.0 : 0.0;
        };
        c.transfer = [](const PlanRank&, const PlanRank&, const PlanAction&) { return 0.0; };
        c.reduction = [&](const PlanRank&, const PlanAction& a) {
            return (a.kind == ActionKind::reduce_scatter ? s : g) * n;
        };
        if (slow > 0) c.overlap_slowdown = [slow](const PlanRank&) { return slow; };
        ExecTimes t = execute(graph, c);
        EXPECT_TRUE(t.complete);
        std::map<ActionKind, std::pair<double, double>> out;
        const PlanRank& rank = graph.ranks[0];
        for (size_t i = 0; i < rank.actions.size(); ++i)
            out[rank.actions[i].kind] = {t.start[0][i], t.end[0][i]};
        return out;
    };
    auto alone = run(0), slowed = run(0.5);
    const auto f = slowed[ActionKind::forward], b = slowed[ActionKind::backward];
    EXPECT_NEAR(alone[ActionKind::forward].second - alone[ActionKind::forward].first, 1.0, eps);
    EXPECT_NEAR(f.first, g, eps);
    // n g beside the stream, done at 1 / 1.5 of the speed: 0.5 n g / 1.5 more.
    EXPECT_NEAR(f.second, f.first + 1.0 + 0.5 * n * g / 1.5, eps);
    EXPECT_NEAR(b.first, f.second, eps);
    EXPECT_NEAR(b.second, b.first + 2.0 + 0.5 * (n - 1) * (g + s) / 1.5, eps);
}

// Two data-parallel ranks on one core: their forwards and backwards overlap throughout, so each
// takes twice as long as alone, and so does the step.
TEST(SharedCores, TwoRanksOnOneCoreTakeTwiceAsLong) {
    Graph g = planned(checked("gpt_tiny.dist", {"mesh.dp=2", "schedule.microbatches=2"}));
    ExecCosts alone = distinct_costs();
    alone.compute = forward_one_backward_two;
    alone.reduction = [](const PlanRank&, const PlanAction&) { return 0.0; };
    ExecCosts one_core = alone;
    one_core.threads = [](const PlanRank&) { return 1.0; };
    one_core.speed = [](double threads) { return 1.0 / std::max(1.0, threads); };
    ExecTimes a = execute(g, alone), b = execute(g, one_core);
    ASSERT_TRUE(a.complete && b.complete);
    double ea = 0, eb = 0;
    for (size_t r = 0; r < g.ranks.size(); ++r) {
        ea = std::max(ea, a.end[r].back());
        eb = std::max(eb, b.end[r].back());
    }
    EXPECT_NEAR(ea, 6.0, 1e-9); // two microbatches of F (1) and B (2)
    EXPECT_NEAR(eb, 2 * ea, 1e-9);
}

// A tensor-parallel collective's hand-over is a wait off the core: the rank that waits leaves
// the core to the others. Two ranks on one core, rank 0's forward 2 s of which 1 s waiting,
// rank 1's 3 s of work. Worked by hand: both run at half speed until rank 0's one second of
// work is done at 2; it waits until 3 while rank 1 has the core alone and ends at 4. Were the
// wait work on the core, rank 0 would end at 4 and rank 1 at 5.
TEST(SharedCores, AWaitInsideAnActionLeavesTheCoreToTheOthers) {
    Graph g = planned(checked("gpt_tiny.dist", {"mesh.dp=2", "schedule.microbatches=1"}));
    ExecCosts c = distinct_costs();
    c.compute = [](const PlanRank& r, const PlanAction& a) {
        if (a.kind != ActionKind::forward) return 0.0;
        return r.rank == 0 ? 2.0 : 3.0;
    };
    c.reduction = [](const PlanRank&, const PlanAction&) { return 0.0; };
    c.threads = [](const PlanRank&) { return 1.0; };
    c.speed = [](double threads) { return 1.0 / std::max(1.0, threads); };
    auto forward_end = [&](const ExecTimes& t, size_t r) {
        const auto& acts = g.ranks[r].actions;
        for (size_t i = 0; i < acts.size(); ++i)
            if (acts[i].kind == ActionKind::forward) return t.end[r][i];
        return -1.0;
    };
    ExecTimes worked = execute(g, c);
    ASSERT_TRUE(worked.complete);
    EXPECT_NEAR(forward_end(worked, 0), 4.0, 1e-9);
    EXPECT_NEAR(forward_end(worked, 1), 5.0, 1e-9);
    c.compute_wait = [](const PlanRank& r, const PlanAction& a) {
        return r.rank == 0 && a.kind == ActionKind::forward ? 1.0 : 0.0;
    };
    ExecTimes waited = execute(g, c);
    ASSERT_TRUE(waited.complete);
    EXPECT_NEAR(forward_end(waited, 0), 3.0, 1e-9);
    EXPECT_NEAR(forward_end(waited, 1), 4.0, 1e-9);
}

// A stage whose neighbour idles runs alone at full speed: with pp 2 on one core, the first
// forward (only rank 0 busy) takes its time alone, the overlapped middle is stretched.
TEST(SharedCores, OnlyOverlappingWorkIsStretched) {
    Graph g = planned(checked("gpt_tiny.dist", {"mesh.pp=2", "schedule.microbatches=2"}));
    ExecCosts c = distinct_costs();
    c.compute = forward_one_backward_two;
    c.transfer = [](const PlanRank&, const PlanRank&, const PlanAction&) { return 0.0; };
    c.threads = [](const PlanRank&) { return 1.0; };
    c.speed = [](double threads) { return 1.0 / std::max(1.0, threads); };
    ExecTimes t = execute(g, c);
    ASSERT_TRUE(t.complete);
    const auto& r0 = g.ranks[0].actions;
    size_t first_forward = 0;
    while (r0[first_forward].kind != ActionKind::forward) ++first_forward;
    EXPECT_NEAR(t.end[0][first_forward] - t.start[0][first_forward], 1.0, 1e-9);
    // Total work is 2 ranks x 2 microbatches x 3 = 12 on one core: the step takes at least 12.
    double end = std::max(t.end[0].back(), t.end[1].back());
    EXPECT_GE(end, 12.0 - 1e-9);
}

// A rank blocked at a receive runs once its thread is woken (ExecCosts::wake), after the message
// is in; one that comes to the receive after its message pays nothing. pp 2 (1F1B), two
// microbatches, F 1 and B 2, messages of 0.5, a wake-up of 0.1, a core each. Worked by hand:
// rank 0 runs F0 0-1 and F1 1-2; rank 1, waiting since 0, has F0 in at 1.5 and runs it at 1.6,
// B0 to 4.6 (its gradient in at 5.1); F1 was in at 2.5, before rank 1 came to it: 4.6-5.6, B1
// to 7.6 (in at 8.1). Rank 0, waiting since 2, runs B0 at 5.2 to 7.2 and B1 at 8.2 to 10.2.
TEST(SharedCores, ABlockedRankRunsOnceWoken) {
    Graph g = planned(checked("gpt_tiny.dist", {"mesh.pp=2", "schedule.microbatches=2"}));
    ExecCosts c = single_threaded_on(2);
    c.transfer = [](const PlanRank&, const PlanRank&, const PlanAction&) { return 0.5; };
    c.wake = 0.1;
    ExecTimes t = execute(g, c);
    ASSERT_TRUE(t.complete);
    auto span = [&](size_t r, ActionKind kind, int32_t microbatch) {
        const size_t i = position_of(g, r, kind, microbatch);
        return std::pair{t.start[r][i], t.end[r][i]};
    };
    using K = ActionKind;
    const std::vector<std::tuple<size_t, K, int32_t, double, double>> expect = {
        {0, K::forward, 0, 0.0, 1.0},  {0, K::forward, 1, 1.0, 2.0},  {1, K::forward, 0, 1.6, 2.6},
        {1, K::backward, 0, 2.6, 4.6}, {1, K::forward, 1, 4.6, 5.6},  {1, K::backward, 1, 5.6, 7.6},
        {0, K::backward, 0, 5.2, 7.2}, {0, K::backward, 1, 8.2, 10.2}};
    for (const auto& [r, kind, mb, from, to] : expect) {
        auto [s, e] = span(r, kind, mb);
        EXPECT_NEAR(s, from, 1e-9) << "rank " << r << " " << plan::op_name(kind) << mb;
        EXPECT_NEAR(e, to, 1e-9) << "rank " << r << " " << plan::op_name(kind) << mb;
    }
    // Without the wake-up every blocked start is 0.1 sooner per wait before it.
    c.wake = 0;
    t = execute(g, c);
    ASSERT_TRUE(t.complete);
    EXPECT_NEAR(span(1, K::forward, 0).first, 1.5, 1e-9);
    EXPECT_NEAR(span(0, K::backward, 1).second, 10.0, 1e-9);
}

// Three single-threaded ranks on two cores, as the OS runs them: a queue a core, turns of one
// slice (0.25) where a thread waits. Worked by hand, F 1 and B 2 each: rank 0 takes idle core 0,
// rank 1 idle core 1, rank 2 finds no idle core and queues at core 0 (as few threads as core 1,
// the first). Rank 1 runs alone: F 0-1, B 1-3. Ranks 0 and 2 take turns on core 0, rank 2's
// first at 0.25: rank 0's F has its fourth slice at 1.5-1.75, rank 2's at 1.75-2, and each
// goes on to its B without waiting. At 3 rank 1 is done and core 1, idle, pulls the thread
// waiting at core 0 (rank 0); each of ranks 0 and 2 has had two slices of its B and runs the
// other 1.5 s alone: both end at 4.5. A span begins when its thread first has a core: rank 2's
// F at 0.25, not at 0.
TEST(SharedCores, RanksBeyondTheCoresQueueForThemAndTakeTurnsOfASlice) {
    Graph g = planned(
        checked("gpt_tiny.dist", {"mesh.dp=3", "train.batch=18", "schedule.microbatches=1"}));
    ExecCosts c = single_threaded_on(2);
    c.slice = 0.25;
    ExecTimes t = execute(g, c);
    ASSERT_TRUE(t.complete);
    auto span = [&](size_t r, ActionKind kind) {
        const auto& actions = g.ranks[r].actions;
        for (size_t i = 0; i < actions.size(); ++i)
            if (actions[i].kind == kind) return std::pair{t.start[r][i], t.end[r][i]};
        ADD_FAILURE() << "rank " << r << " has no " << plan::op_name(kind);
        return std::pair{-1.0, -1.0};
    };
    const std::vector<std::array<double, 4>> expect = {
        {0.0, 1.75, 1.75, 4.5}, {0.0, 1.0, 1.0, 3.0}, {0.25, 2.0, 2.0, 4.5}};
    for (size_t r = 0; r < 3; ++r) {
        auto [fs, fe] = span(r, ActionKind::forward);
        auto [bs, be] = span(r, ActionKind::backward);
        EXPECT_NEAR(fs, expect[r][0], 1e-9) << "rank " << r;
        EXPECT_NEAR(fe, expect[r][1], 1e-9) << "rank " << r;
        EXPECT_NEAR(bs, expect[r][2], 1e-9) << "rank " << r;
        EXPECT_NEAR(be, expect[r][3], 1e-9) << "rank " << r;
    }
    // The wait for a core is kept beside the span: rank 2's F waited one slice.
    for (size_t i = 0; i < g.ranks[2].actions.size(); ++i) {
        if (g.ranks[2].actions[i].kind == ActionKind::forward) {
            EXPECT_NEAR(t.core_wait[2][i], 0.25, 1e-9);
        }
    }
    for (size_t i = 0; i < g.ranks[0].actions.size(); ++i)
        EXPECT_EQ(t.core_wait[0][i], 0.0) << to_string(g.ranks[0].actions[i]);
    // And its time on a core inside the span: its work (F 1, B 2) whatever the turns around it
    // (rank 0's F spans 0-1.75 and rank 2's 0.25-2, each on core 0 for four slices of 0.25).
    auto on_core = [&](const ExecTimes& x, size_t r, ActionKind kind) {
        for (size_t i = 0; i < g.ranks[r].actions.size(); ++i)
            if (g.ranks[r].actions[i].kind == kind) return x.on_core[r][i];
        return -1.0;
    };
    for (size_t r = 0; r < 3; ++r) {
        EXPECT_NEAR(on_core(t, r, ActionKind::forward), 1.0, 1e-9) << "rank " << r;
        EXPECT_NEAR(on_core(t, r, ActionKind::backward), 2.0, 1e-9) << "rank " << r;
    }
    // Without a slice the three share the two cores evenly, each at two thirds of one: every
    // F ends at 1.5 and every B at 4.5.
    c.slice = 0;
    ExecTimes even = execute(g, c);
    ASSERT_TRUE(even.complete);
    t = even;
    for (size_t r = 0; r < 3; ++r) {
        EXPECT_NEAR(span(r, ActionKind::forward).second, 1.5, 1e-9) << "rank " << r;
        EXPECT_NEAR(span(r, ActionKind::backward).second, 4.5, 1e-9) << "rank " << r;
        // Two thirds of a core for 1.5 and for 3: the same work on a core.
        EXPECT_NEAR(on_core(even, r, ActionKind::forward), 1.0, 1e-9) << "rank " << r;
        EXPECT_NEAR(on_core(even, r, ActionKind::backward), 2.0, 1e-9) << "rank " << r;
    }
    // What taking turns costs is priced once, in the actions' own seconds (the calibrated
    // `oversubscribed` work): where three single-threaded workers on the two cores measured
    // each at 0.6 of one alone (together 0.9 of the two cores), the ranks still run at their
    // share of the cores, and every F ends at 1.5 as before, not at 1 / 0.6.
    ExecCosts turns = c;
    turns.speed = [](double n) { return n <= 2 ? 1.0 : 0.9 * 2 / n; };
    ExecTimes costly = execute(g, turns);
    ASSERT_TRUE(costly.complete);
    t = costly;
    for (size_t r = 0; r < 3; ++r)
        EXPECT_NEAR(span(r, ActionKind::forward).second, 1.5, 1e-9) << "rank " << r;
    // Within the cores the workers' sharing still applies: two workers at 0.8 of one alone each
    // (the memory they share), two ranks on the two cores: every F ends at 1 / 0.8.
    Graph two = planned(
        checked("gpt_tiny.dist", {"mesh.dp=2", "train.batch=12", "schedule.microbatches=1"}));
    ExecCosts within = c;
    within.speed = [](double n) { return n <= 1 ? 1.0 : 0.8; };
    ExecTimes paired = execute(two, within);
    ASSERT_TRUE(paired.complete);
    for (size_t r = 0; r < 2; ++r)
        for (size_t i = 0; i < two.ranks[r].actions.size(); ++i)
            if (two.ranks[r].actions[i].kind == ActionKind::forward) {
                EXPECT_NEAR(paired.end[r][i] - paired.start[r][i], 1 / 0.8, 1e-9) << "rank " << r;
            }
    t = even;
    // Sharing evenly, rank 2's F runs from the start beside rank 0's: its span begins at 0 and
    // it waits for no core.
    EXPECT_NEAR(span(2, ActionKind::forward).first, 0.0, 1e-9);
    for (size_t r = 0; r < 3; ++r)
        for (size_t i = 0; i < g.ranks[r].actions.size(); ++i)
            EXPECT_EQ(even.core_wait[r][i], 0.0)
                << "rank " << r << " " << to_string(g.ranks[r].actions[i]);
}

// Two single-threaded ranks of a pipeline (pp 2, two microbatches, 1F1B) on one core, messages
// instant, a slice longer than the step, F 1 and B 2. A thread woken by a message while no core
// idles takes its sender's core at once, the sender waiting first. Worked by hand: rank 0 runs
// F0 0-1 and sends; rank 1, woken, takes the core, and rank 0, which would go on to F1, waits:
// rank 1 runs F0 1-2 and B0 2-4, then blocks for F1's activation. Rank 0 has the core again at
// 4 and its F1 begins then (it waited 3 for the core); at 5 it sends and rank 1 takes the core
// again (F1 5-6, B1 6-8) before rank 0's B0 8-10 and B1 10-12. With a core each nobody waits:
// rank 1's F0 runs 1-2 beside rank 0's F1.
TEST(SharedCores, ARankWokenByAMessageTakesItsSendersCoreWhereNoneIdles) {
    Graph g = planned(checked("gpt_tiny.dist", {"mesh.pp=2", "schedule.microbatches=2"}));
    ExecCosts c = single_threaded_on(1);
    c.transfer = [](const PlanRank&, const PlanRank&, const PlanAction&) { return 0.0; };
    c.slice = 100;
    ExecTimes t = execute(g, c);
    ASSERT_TRUE(t.complete);
    auto at = [&](size_t r, ActionKind kind, int32_t microbatch) {
        return position_of(g, r, kind, microbatch);
    };
    using K = ActionKind;
    const std::vector<std::tuple<size_t, K, int32_t, double, double>> expect = {
        {0, K::forward, 0, 0, 1},   {1, K::forward, 0, 1, 2},   {1, K::backward, 0, 2, 4},
        {0, K::forward, 1, 4, 5},   {1, K::forward, 1, 5, 6},   {1, K::backward, 1, 6, 8},
        {0, K::backward, 0, 8, 10}, {0, K::backward, 1, 10, 12}};
    for (const auto& [r, kind, mb, from, to] : expect) {
        const size_t i = at(r, kind, mb);
        EXPECT_NEAR(t.start[r][i], from, 1e-9) << "rank " << r << " " << plan::op_name(kind) << mb;
        EXPECT_NEAR(t.end[r][i], to, 1e-9) << "rank " << r << " " << plan::op_name(kind) << mb;
    }
    EXPECT_NEAR(t.core_wait[0][at(0, K::forward, 1)], 3.0, 1e-9);
    EXPECT_NEAR(t.core_wait[1][at(1, K::forward, 0)], 0.0, 1e-9);
    // Messages 0.1 in flight: rank 0 has run 0.1 of F1 when rank 1's message wakes it at 1.1.
    // Rank 1 runs F0 1.1-2.1 and B0 2.1-4.1; rank 0's F1 spans 4.1-5.0, on a core 0.9 of it
    // (what it ran before its span is not counted, so its time on a core never exceeds the
    // span); again at 5.1 for B0, which spans 8.1-10.0 with 1.9 on a core.
    ExecCosts late = c;
    late.transfer = [](const PlanRank&, const PlanRank&, const PlanAction&) { return 0.1; };
    ExecTimes l = execute(g, late);
    ASSERT_TRUE(l.complete);
    const size_t f1 = at(0, K::forward, 1), b0 = at(0, K::backward, 0);
    EXPECT_NEAR(l.start[1][at(1, K::forward, 0)], 1.1, 1e-9);
    EXPECT_NEAR(l.start[0][f1], 4.1, 1e-9);
    EXPECT_NEAR(l.end[0][f1], 5.0, 1e-9);
    EXPECT_NEAR(l.on_core[0][f1], 0.9, 1e-9);
    EXPECT_NEAR(l.start[0][b0], 8.1, 1e-9);
    EXPECT_NEAR(l.end[0][b0], 10.0, 1e-9);
    EXPECT_NEAR(l.on_core[0][b0], 1.9, 1e-9);
    // A core each: no queue, and rank 1's F0 beside rank 0's F1.
    ExecCosts two = c;
    two.cores = 2;
    t = execute(g, two);
    ASSERT_TRUE(t.complete);
    EXPECT_NEAR(t.start[1][at(1, K::forward, 0)], 1.0, 1e-9);
    EXPECT_NEAR(t.start[0][at(0, K::forward, 1)], 1.0, 1e-9);
}

// The two members of a tensor-parallel group queued on one core meet inside their forward
// (one all-reduce): each runs its first piece, leaves the core while it waits for the other,
// and queues again after the hand-over. F 2.5 s of which 0.5 s the hand-over, so two pieces of
// 1 s; a slice longer than the step. Worked by hand: rank 0's first piece runs 0-1, rank 1's
// 1-2 (its span begins when it first has the core, at 1); both have met at 2, wait off the
// core to 2.5, and run their second pieces in turn: rank 0 to 3.5, rank 1 to 4.5. Unmet, rank 0
// runs its 2 s whole and waits to 2.5; rank 1 runs 2-4 and waits to 4.5.
TEST(SharedCores, ATensorParallelGroupMeetsInsideItsActions) {
    Graph g = planned(checked("gpt_tiny.dist", {"mesh.tp=2", "schedule.microbatches=1"}));
    ExecCosts c = distinct_costs();
    c.compute = [](const PlanRank&, const PlanAction& a) {
        return a.kind == ActionKind::forward ? 2.5 : 0.0;
    };
    c.compute_wait = [](const PlanRank&, const PlanAction& a) {
        return a.kind == ActionKind::forward ? 0.5 : 0.0;
    };
    c.reduction = [](const PlanRank&, const PlanAction&) { return 0.0; };
    c.threads = [](const PlanRank&) { return 1.0; };
    c.speed = [](double) { return 1.0; };
    c.cores = 1;
    c.slice = 10;
    auto forward = [&](const ExecTimes& t, size_t r) {
        const auto& actions = g.ranks[r].actions;
        for (size_t i = 0; i < actions.size(); ++i)
            if (actions[i].kind == ActionKind::forward)
                return std::array{t.start[r][i], t.end[r][i], t.core_wait[r][i]};
        ADD_FAILURE() << "rank " << r << " has no forward";
        return std::array{-1.0, -1.0, -1.0};
    };
    ExecTimes unmet = execute(g, c);
    ASSERT_TRUE(unmet.complete);
    EXPECT_NEAR(forward(unmet, 0)[1], 2.5, 1e-9);
    EXPECT_NEAR(forward(unmet, 1)[0], 2.0, 1e-9);
    EXPECT_NEAR(forward(unmet, 1)[1], 4.5, 1e-9);
    c.meets = [](const PlanRank&, const PlanAction& a) {
        return a.kind == ActionKind::forward ? 1 : 0;
    };
    ExecTimes met = execute(g, c);
    ASSERT_TRUE(met.complete);
    const std::array<double, 3> rank0 = forward(met, 0), rank1 = forward(met, 1);
    EXPECT_NEAR(rank0[0], 0.0, 1e-9);
    EXPECT_NEAR(rank0[1], 3.5, 1e-9);
    EXPECT_NEAR(rank1[0], 1.0, 1e-9);
    EXPECT_NEAR(rank1[1], 4.5, 1e-9);
    EXPECT_NEAR(rank1[2], 1.0, 1e-9); // its wait for the core before its first piece only
    EXPECT_EQ(rank0[2], 0.0);
    // Rank 0 came to the meeting first and blocked there: it goes on a wake-up (0.25 s) after
    // the hand-over, at 2.75, and rank 1, the last to come, takes the core first: 2.5-3.5, then
    // rank 0 3.5-4.5.
    c.wake = 0.25;
    ExecTimes woken = execute(g, c);
    ASSERT_TRUE(woken.complete);
    EXPECT_NEAR(forward(woken, 0)[1], 4.5, 1e-9);
    EXPECT_NEAR(forward(woken, 1)[1], 3.5, 1e-9);
}

// A data-parallel reduction runs on communication threads that share the cores with the
// compute. dp 2 x tp 2 on one core, F 1 for every rank, B 2 for the tp-0 ranks and 4 for the
// tp-1 ranks, a reduction 1 alone (its two members busy). Worked by hand: four threads run the
// F's to 4; the tp-0 B's end at 12, the tp-1 ones have done 2 of 4. The tp-0 group's reduction
// starts beside the two tp-1 B's: four threads, each at a quarter of the core where its members
// alone had half, so it takes 2 and ends at 14. The tp-1 B's run at a quarter until 14 and a half
// after it: they end at 17, and their group's reduction, alone, at 18.
TEST(SharedCores, AReductionsThreadsShareTheCoresWithTheCompute) {
    Graph g = planned(checked(
        "gpt_tiny.dist", {"mesh.dp=2", "mesh.tp=2", "train.batch=8", "schedule.microbatches=1"}));
    ExecCosts c = distinct_costs();
    c.compute = [](const PlanRank& r, const PlanAction& a) {
        if (a.kind == ActionKind::forward) return 1.0;
        if (a.kind == ActionKind::backward) return r.tp == 0 ? 2.0 : 4.0;
        return 0.0;
    };
    c.reduction = [](const PlanRank&, const PlanAction&) { return 1.0; };
    c.threads = [](const PlanRank&) { return 1.0; };
    c.speed = [](double threads) { return 1.0 / std::max(1.0, threads); };
    ExecTimes t = execute(g, c);
    ASSERT_TRUE(t.complete);
    for (const PlanRank& r : g.ranks) {
        const auto& actions = r.actions;
        const auto i = static_cast<size_t>(r.rank);
        for (size_t k = 0; k < actions.size(); ++k) {
            const ActionKind kind = actions[k].kind;
            if (kind == ActionKind::backward) {
                EXPECT_NEAR(t.end[i][k], r.tp == 0 ? 12.0 : 17.0, 1e-9) << "rank " << r.rank;
            }
            if (kind == ActionKind::step) {
                EXPECT_NEAR(t.start[i][k], r.tp == 0 ? 14.0 : 18.0, 1e-9) << "rank " << r.rank;
            }
        }
    }
}

// A collective whose members wait for cores that other threads fill (Gloo between processes:
// ExecCosts::reduction_wait) takes its time and that wait, not stretched; started when the
// others leave the cores free, its time alone. dp 2 x pp 2, one microbatch, on two cores: the
// last stage's ranks reduce from t = 4 while the first stage's two backwards run (4 to 6), and
// the first stage's ranks from their end, when nothing else runs. Each rank's STEP starts once
// its one bucket is reduced.
TEST(SharedCores, ACollectiveWaitingForBusyCoresTakesItsWaitUnstretched) {
    Graph g = planned(checked(
        "gpt_tiny.dist", {"mesh.dp=2", "mesh.pp=2", "train.batch=8", "schedule.microbatches=1"}));
    ExecCosts c = distinct_costs();
    c.compute = [](const PlanRank&, const PlanAction& a) {
        if (a.kind == ActionKind::forward) return 1.0;
        if (a.kind == ActionKind::backward) return 2.0;
        return 0.0;
    };
    c.transfer = [](const PlanRank&, const PlanRank&, const PlanAction&) { return 0.0; };
    const double R = 0.25, W = 1.0;
    c.reduction = [&](const PlanRank&, const PlanAction&) { return R; };
    c.threads = [](const PlanRank&) { return 1.0; };
    c.speed = [](double threads) { return std::min(1.0, 2.0 / std::max(1.0, threads)); };
    c.cores = 2;
    ExecCosts waiting = c;
    waiting.reduction_wait = [&](const PlanRank&, const PlanAction&) { return W; };
    ExecTimes stretched = execute(g, c), waited = execute(g, waiting);
    ASSERT_TRUE(stretched.complete);
    ASSERT_TRUE(waited.complete);
    for (const PlanRank& r : g.ranks) {
        const auto i = static_cast<size_t>(r.rank);
        int buckets = 0;
        size_t step = 0;
        for (size_t k = 0; k < r.actions.size(); ++k) {
            buckets += r.actions[k].kind == ActionKind::reduce_grad;
            if (r.actions[k].kind == ActionKind::step) step = k;
        }
        double backward_end = 0;
        for (size_t k = 0; k < r.actions.size(); ++k)
            if (r.actions[k].kind == ActionKind::backward) backward_end = waited.end[i][k];
        ASSERT_EQ(buckets, 1);
        if (r.pp == 1) {
            // Beside the first stage's two backwards: its wait, unstretched; without one, its
            // time stretched by the two busy threads beside its two.
            EXPECT_NEAR(backward_end, 4.0, 1e-9);
            EXPECT_NEAR(waited.start[i][step], 4.0 + R + W, 1e-9) << "rank " << r.rank;
            EXPECT_NEAR(stretched.start[i][step], 4.0 + 2 * R, 1e-9) << "rank " << r.rank;
        } else {
            // After everything else: its time alone.
            EXPECT_GT(backward_end, 4.0 + R + W);
            EXPECT_NEAR(waited.start[i][step], backward_end + R, 1e-9) << "rank " << r.rank;
        }
    }
}

// The expected largest, second largest ... of n standard normal draws, as tabulated (Harter
// 1961, table 1): 1/sqrt(pi) for the larger of two; each set sums to zero.
TEST(SharedCores, NormalOrderStatisticsAreTheTabulatedOnes) {
    const std::map<int32_t, std::vector<double>> table = {
        {2, {0.56419}},
        {3, {0.84628, 0.0}},
        {4, {1.02938, 0.29701}},
        {5, {1.16296, 0.49502, 0.0}},
        {10, {1.53875, 1.00136, 0.65606, 0.37576, 0.12267}}};
    for (const auto& [n, largest] : table) {
        double sum = 0;
        for (int32_t i = 1; i <= n; ++i) {
            const double e = sim::normal_order_statistic(i, n);
            sum += e;
            const size_t from_top = static_cast<size_t>(std::min(i, n + 1 - i) - 1);
            EXPECT_NEAR(std::abs(e), largest[from_top], 2e-5) << i << " of " << n;
            if (2 * i != n + 1) {
                EXPECT_EQ(e > 0, 2 * i < n + 1) << i << " of " << n; // largest first
            }
        }
        EXPECT_NEAR(sum, 0.0, 1e-6) << n;
    }
    EXPECT_EQ(sim::normal_order_statistic(1, 1), 0.0);
}

// Ranks that hold cores of their own run at those cores' paces, the expected paces of as many
// draws, slowest first, given in turn from each rank: the simulation averages the draws. Ranks
// that take turns on the cores run at 1.
TEST(SharedCores, RanksOnCoresOfTheirOwnRunAtTheCoresPaces) {
    constexpr double spread = 0.1, two = 0.56419 * spread;
    using Draws = std::vector<std::vector<double>>;
    auto paces = [](std::vector<std::string> overrides, int32_t cores, double s) {
        return sim::core_paces(planned(checked("gpt_tiny.dist", std::move(overrides))), cores, s);
    };
    auto near = [](const Draws& got, const Draws& want) {
        if (got.size() != want.size()) return false;
        for (size_t d = 0; d < got.size(); ++d) {
            if (got[d].size() != want[d].size()) return false;
            for (size_t i = 0; i < got[d].size(); ++i)
                if (std::abs(got[d][i] - want[d][i]) > 1e-5) return false;
        }
        return true;
    };
    // Two replicas or two pipeline stages on two cores: the slower core to one, then to the
    // other.
    for (const char* mesh : {"mesh.dp=2", "mesh.pp=2"})
        EXPECT_TRUE(near(paces({mesh}, 2, spread), {{1 + two, 1 - two}, {1 - two, 1 + two}}))
            << mesh;
    // Two tensor-parallel shards meet inside every layer: both at the slower core's pace.
    EXPECT_TRUE(near(paces({"mesh.tp=2"}, 2, spread), {{1 + two, 1 + two}}));
    EXPECT_TRUE(near(paces({"mesh.pp=2"}, 2, 0.0), {{1, 1}}));
    // Two threads a rank: their cores' spread sqrt(2) times less.
    const double two_threads = two / std::sqrt(2.0);
    EXPECT_TRUE(near(paces({"mesh.dp=2"}, 4, spread),
                     {{1 + two_threads, 1 - two_threads}, {1 - two_threads, 1 + two_threads}}));
    // dp 2 x pp 2 on four cores: the four expected paces in four turns, each rank each once.
    std::vector<double> four;
    for (int32_t i = 1; i <= 4; ++i) four.push_back(1 + spread * sim::normal_order_statistic(i, 4));
    Draws turns;
    for (size_t d = 0; d < 4; ++d) {
        turns.emplace_back();
        for (size_t r = 0; r < 4; ++r) turns.back().push_back(four[(r + d) % 4]);
    }
    EXPECT_TRUE(near(paces({"mesh.dp=2", "mesh.pp=2"}, 4, spread), turns));
    // dp 2 x tp 2 on four cores: each replica's shards (ranks 0 and 1, 2 and 3) at the slower
    // of their two.
    for (std::vector<double>& d : turns) {
        d[0] = d[1] = std::max(d[0], d[1]);
        d[2] = d[3] = std::max(d[2], d[3]);
    }
    EXPECT_TRUE(near(paces({"mesh.dp=2", "mesh.tp=2"}, 4, spread), turns));
    // Sixteen ranks on sixteen cores: eight draws, every other turn.
    const Draws sixteen =
        paces({"mesh.dp=16", "train.batch=16", "schedule.microbatches=1"}, 16, spread);
    ASSERT_EQ(sixteen.size(), sim::kMostPaceDraws);
    for (size_t d = 0; d < sixteen.size(); ++d)
        EXPECT_NEAR(sixteen[d][0],
                    1 + spread * sim::normal_order_statistic(static_cast<int32_t>(2 * d + 1), 16),
                    1e-9);
    // Four ranks on two cores take turns on them.
    EXPECT_TRUE(near(paces({"mesh.dp=4"}, 2, spread), {{1, 1, 1, 1}}));
}

TEST(Rates, InterpolateBetweenMeasuredShapesAndClampOutside) {
    Calibration c;
    c.cores = 2;
    for (int64_t m : {64, 256})
        for (int64_t n : {64, 256})
            for (int64_t k : {64, 256})
                c.matmul.push_back(
                    {"nt", m, n, k, 1, m == 256 && n == 256 && k == 256 ? 8e10 : 4e10});
    c.sharing = {{2, 0.9}, {4, 0.45}};
    sim::Rates r(c);
    EXPECT_NEAR(r.matmul("nt", 256, 256, 256, 1), 8e10, 1e-3);
    EXPECT_NEAR(r.matmul("nt", 64, 64, 64, 1), 4e10, 1e-3);
    double mid = r.matmul("nt", 128, 128, 128, 1);
    EXPECT_GT(mid, 4e10);
    EXPECT_LT(mid, 8e10);
    EXPECT_NEAR(r.matmul("nt", 4096, 4096, 4096, 1), 8e10, 1e-3); // clamped
    EXPECT_NEAR(r.matmul("nt", 8, 8, 8, 1), 4e10, 1e-3);
    EXPECT_DOUBLE_EQ(r.sharing(1), 1.0);
    EXPECT_DOUBLE_EQ(r.sharing(2), 0.9);
    EXPECT_NEAR(r.sharing(3), 0.675, 1e-12);
    EXPECT_NEAR(r.sharing(8), 0.45 * 4 / 8, 1e-12); // beyond the measured: the cores divided

    // A second working set, 16 times the default's: a rank's between the two is priced
    // between them, in log bytes; beyond either, as the nearest.
    const double big = 16 * sharing_default_bytes;
    c.sharing.push_back({2, 0.8, big});
    c.sharing.push_back({4, 0.35, big});
    EXPECT_DOUBLE_EQ(r.sharing(2), 0.9); // no working set: the smallest measured
    EXPECT_DOUBLE_EQ(r.sharing(2, sharing_default_bytes / 2), 0.9);
    EXPECT_DOUBLE_EQ(r.sharing(2, 2 * big), 0.8);
    EXPECT_NEAR(r.sharing(4, 4 * sharing_default_bytes), 0.5 * 0.45 + 0.5 * 0.35, 1e-12);
    EXPECT_NEAR(r.sharing(3, big), (0.8 + 0.35) / 2, 1e-12);
}

namespace {

// The first 17 lines of a calibrated CPU profile named `name`, up to `[calibration]`'s cores.
std::string calibrated_head(const std::string& name) {
    return "name = \"" + name + "\"\n" +
           std::string("[compute]\npeak_flops_f32 = 1e11\npeak_flops_bf16 = 1e11\n"
                       "[memory]\nbytes = 1000000000\nbandwidth = 1e10\n"
                       "[links.intra_host]\nbandwidth = 1e10\nlatency = 1e-6\n"
                       "[links.inter_host]\nbandwidth = 1e9\nlatency = 1e-5\n"
                       "[calibration]\ncommand = \"x\"\ndate = \"y\"\ncores = 2\n");
}

// What loading a profile that must be refused reports.
std::string refusal(const fs::path& file) {
    lang::SourceManager sources;
    lang::Diagnostics diags;
    EXPECT_FALSE(lang::load_profile(file, sources, diags).has_value()) << file;
    return diags.render(sources);
}

// A calibration of one matmul and one sharing row, then `array` = [ `rows` ] (TOML lines, the
// first at line 21), written as `name`.toml in `dir`.
fs::path one_rate_profile(const TempDir& dir, const std::string& name, const std::string& array,
                          const std::string& rows) {
    fs::path file = dir.path / (name + ".toml");
    std::ofstream(file) << calibrated_head(name)
                        << "matmul = [ { kernel = \"nt\", m = 32, n = 32, k = 32, threads = 1, "
                           "flops = 1e10 } ]\n"
                           "sharing = [ { threads = 2, speed = 0.9 } ]\n"
                        << array << " = [\n"
                        << rows << "]\n";
    return file;
}

// Such a profile whose `array` rows are `rows`, loaded (empty where it does not load, the
// report in the failure).
std::optional<Calibration> with_rows(const std::string& name, const std::string& array,
                                     const std::string& rows) {
    TempDir dir(name);
    const fs::path file = one_rate_profile(dir, name, array, rows);
    lang::SourceManager sources;
    lang::Diagnostics diags;
    auto p = lang::load_profile(file, sources, diags);
    EXPECT_TRUE(p.has_value()) << diags.render(sources);
    if (!p) return std::nullopt;
    return p->calibration;
}

std::optional<Calibration> with_oversubscribed(const std::string& name, const std::string& rows) {
    return with_rows(name, "oversubscribed", rows);
}

// Such a profile of the one `row` in `array` (line 21): refused, the report holding `expected`.
void expect_row_refused(const std::string& name, const std::string& array, const std::string& row,
                        const std::string& expected) {
    TempDir dir(name);
    const std::string report = refusal(one_rate_profile(dir, name, array, "  " + row + ",\n"));
    EXPECT_NE(report.find(expected), std::string::npos) << report;
}

} // namespace

// A key that nothing reads is a setting left out without a word (a misspelt `cache_bytes`
// would price every stage as if the cache were unknown): it is refused where it is written, in
// the profile's tables and in its rows. The keys a calibration writes all load (the quick
// calibration's test loads one).
TEST(Rates, AKeyNothingReadsIsRefusedWhereItIs) {
    TempDir dir("typo");
    expect_row_refused("unread", "oversubscribed", "{ width = 128, work = 1.2, wrok = 1.3 }",
                       "unread.toml:21:30: error: `wrok` is not a key of a "
                       "`calibration.oversubscribed` row");
    fs::path file = dir.path / "typo.toml";
    std::ofstream(file) << calibrated_head("typo")
                        << "cache_byts = 2097152\n"
                           "matmul = [ { kernel = \"nt\", m = 32, n = 32, k = 32, threads = 1, "
                           "flops = 1e10 } ]\n"
                           "sharing = [ { threads = 2, speed = 0.9 } ]\n"
                           "[links.extra]\nbandwidth = 1e9\n";
    const std::string report = refusal(file);
    EXPECT_NE(report.find("typo.toml:18:1: error: `calibration.cache_byts` is not a key of a "
                          "hardware profile"),
              std::string::npos)
        << report;
    EXPECT_NE(report.find("typo.toml:21:8: error: `links.extra` is not a key of a hardware "
                          "profile"),
              std::string::npos)
        << report;
    // Without them it loads; `seconds`, the calibration's own time, is read.
    std::ofstream(file) << calibrated_head("typo")
                        << "seconds = 12.5\n"
                           "matmul = [ { kernel = \"nt\", m = 32, n = 32, k = 32, threads = 1, "
                           "flops = 1e10 } ]\n"
                           "sharing = [ { threads = 2, speed = 0.9 } ]\n";
    lang::SourceManager sources;
    lang::Diagnostics diags;
    const std::optional<HardwareProfile> loaded = lang::load_profile(file, sources, diags);
    ASSERT_TRUE(loaded.has_value()) << diags.render(sources);
    EXPECT_DOUBLE_EQ(loaded->calibration.took_s, 12.5);
    EXPECT_FALSE(loaded->calibration.pace); // a profile written before the row was timed so

    // With the matmul a run times again, that row at its rate.
    std::ofstream(file) << calibrated_head("typo")
                        << "pace = { kernel = \"nt\", m = 512, n = 256, k = 128, threads = 2, "
                           "flops = 1.5e11 }\n"
                           "matmul = [ { kernel = \"nt\", m = 32, n = 32, k = 32, threads = 1, "
                           "flops = 1e10 } ]\n"
                           "sharing = [ { threads = 2, speed = 0.9 } ]\n";
    lang::SourceManager more_sources;
    const std::optional<HardwareProfile> paced = lang::load_profile(file, more_sources, diags);
    ASSERT_TRUE(paced.has_value()) << diags.render(more_sources);
    ASSERT_TRUE(paced->calibration.pace);
    const MatmulRate& r = *paced->calibration.pace;
    EXPECT_EQ(std::make_tuple(r.kernel, r.m, r.n, r.k, r.threads),
              std::make_tuple(std::string("nt"), 512, 256, 128, 2));
    EXPECT_DOUBLE_EQ(r.warm, 1.5e11);
}

TEST(Rates, AProfileWithABadCalibrationRowIsRefusedWhereItIs) {
    TempDir dir("bad");
    fs::path file = dir.path / "bad.toml";
    std::ofstream(file)
        << calibrated_head("bad")
        << "matmul = [\n"
           "  { kernel = \"nt\", m = 32, n = 32, k = 32, threads = 1, flops = -1.0 },\n"
           "]\n"
           "sharing = [ { threads = 2, speed = 0.9 } ]\n";
    std::string report = refusal(file);
    EXPECT_NE(report.find("bad.toml:19:65:"), std::string::npos) << report;
    EXPECT_NE(report.find("`flops` must be a positive number"), std::string::npos) << report;

    // A calibration names what it measured; a GPU's is of a host of devices.
    auto refused = [&](const std::string& calibration, const std::string& why) {
        std::ofstream(file) << calibrated_head("bad") << calibration
                            << "\nmatmul = [ { kernel = \"nt\", m = 32, n = 32, k = 32, "
                               "threads = 1, flops = 1e10 } ]\n";
        const std::string report = refusal(file);
        EXPECT_NE(report.find(why), std::string::npos) << calibration << "\n" << report;
    };
    refused("device = \"tpu\"",
            "bad.toml:18:10: error: `calibration.device` is \"cpu\" or \"cuda\"");
    refused("device = \"cuda\"", "a calibration of a GPU needs `[host] devices`");
    refused("", "a calibration of a CPU needs its `matmul` and `sharing` rows");
    // The matmul a run times again: a forward, of the sides a calibration's grid has, its
    // rate and every side given, no other key.
    auto pace = [](const std::string& fields) {
        return "pace = { " + fields + " }\nsharing = [ { threads = 2, speed = 0.9 } ]";
    };
    refused(pace("kernel = \"nn\", m = 512, n = 512, k = 512, threads = 2, flops = 1e11"),
            "bad.toml:18:19: error: `calibration.pace.kernel` is \"nt\" (a forward), not \"nn\"");
    refused(pace("kernel = \"nt\", m = 8192, n = 512, k = 512, threads = 2, flops = 1e11"),
            "bad.toml:18:8: error: `calibration.pace` times a matmul of sides up to 4096");
    refused(pace("kernel = \"nt\", m = 512, n = 512, k = 512, threads = 2"),
            "hardware profile has no `calibration.pace.flops`");
    refused(pace("kernel = \"nt\", m = 512, n = 512, k = 512, threads = 2, flops = -1"),
            "`calibration.pace.flops` must be a positive number");
    refused(pace("kernel = \"nt\", m = 512, n = 512, k = 512, threads = 2, flops = 1e11, "
                 "flop = 1e11"),
            "`calibration.pace.flop` is not a key of");
    refused("core_spread = 0.7\nsharing = [ { threads = 2, speed = 0.9 } ]",
            "bad.toml:18:15: error: `calibration.core_spread` is a fraction of a core's pace");
    refused("core_spread = -0.1\nsharing = [ { threads = 2, speed = 0.9 } ]",
            "bad.toml:18:15: error: `calibration.core_spread` must be a positive number");
    // Compute slowed beside a device's own collectives is a GPU's figure: a CPU's calibration
    // prices the threads of its collectives on the cores, and refuses it where it is written.
    std::string head = calibrated_head("bad");
    head.insert(head.find("[memory]"), "overlap_slowdown = 0.19\n");
    std::ofstream(file) << head << "sharing = [ { threads = 2, speed = 0.9 } ]\n"
                        << "matmul = [ { kernel = \"nt\", m = 32, n = 32, k = 32, threads = 1, "
                           "flops = 1e10 } ]\n";
    report = refusal(file);
    EXPECT_NE(report.find("bad.toml:5:20: error: a CPU's calibration prices"), std::string::npos)
        << report;
}

// bf16 runs with float arithmetic (models/unit_common.hpp's Bf16): a calibrated stage costs the
// passes f32 does not make, each at its own measured rate. Counted here by hand for one GPT
// block of N tokens and width C: four products (C -> 3C, C -> C, C -> 4C, 4C -> C), whose
// inputs, outputs and weights sum to 7NC, 9NC and 12C^2 elements; kept beside them the two
// norms' inputs, q, k and v, and the activation's input (9NC); two residual sums of NC each.
// A product rounds its input, output and a copy of its weights forward and keeps its input;
// its input gradient rounds the same three, widens and keeps its input again and keeps the
// output's gradient; the weight gradient widens both. A kept tensor is widened and its
// gradient rounded backward; a sum rounds the body's output and itself forward, the body's
// gradient backward.
TEST(Rates, Bf16PricesItsConversionPassesAtTheirOwnRates) {
    Calibration c;
    c.cores = 1;
    for (const char* k : {"nt", "nn", "tn"}) c.matmul.push_back({k, 64, 64, 64, 1, 1e10});
    c.attention.push_back({64, 64, 1, 1e10, 1e10});
    const double copy = 1e9, round = 2e9, keep = 4e9, widen = 8e9;
    c.elementwise.push_back({"copy", 1024, 1, copy, copy});
    const Calibration before = c; // Rates reads the calibration it is given where it lies
    sim::Rates without(before);
    c.elementwise.push_back({"bf16_round", 1024, 1, round, round});
    c.elementwise.push_back({"bf16_keep", 1024, 1, keep, widen});
    sim::Rates rates(c);

    Program f32 = checked("gpt_tiny.dist", {"train.precision=f32"});
    Program bf16 = checked("gpt_tiny.dist", {"train.precision=bf16"});
    PlanStage blocks = lower(f32).graph->stages[0];
    blocks.embedding = blocks.head = false;
    const double n = static_cast<double>(f32.train.microbatch_size * f32.model.context);
    const double C = static_cast<double>(f32.model.width), L = blocks.blocks;
    ASSERT_GT(L, 0);

    sim::StageSeconds a = sim::stage_seconds(f32, blocks, rates, 1, false);
    sim::StageSeconds b = sim::stage_seconds(bf16, blocks, rates, 1, false);
    // f32 makes none of these passes: the new rows change nothing.
    sim::StageSeconds old = sim::stage_seconds(f32, blocks, without, 1, false);
    EXPECT_DOUBLE_EQ(a.forward, old.forward);
    EXPECT_DOUBLE_EQ(a.input, old.input);
    EXPECT_DOUBLE_EQ(a.weight, old.weight);

    const double NC = n * C, CC = C * C;
    const double forward =
        (16 * NC + 12 * CC + 4 * NC) / round + (7 * NC + 9 * NC) / keep + 12 * CC / copy;
    const double input = (16 * NC + 12 * CC + 9 * NC + 2 * NC) / round + 12 * CC / copy +
                         (7 * NC + 9 * NC) / widen + (7 * NC + 9 * NC) / keep;
    const double weight = (7 * NC + 9 * NC) / widen;
    EXPECT_NEAR(b.forward - a.forward, L * forward, 1e-9 * L * forward);
    EXPECT_NEAR(b.input - a.input, L * input, 1e-9 * L * input);
    EXPECT_NEAR(b.weight - a.weight, L * weight, 1e-9 * L * weight);

    // A calibration from before these rows prices them as copies.
    sim::StageSeconds as_copies = sim::stage_seconds(bf16, blocks, without, 1, false);
    EXPECT_GT(as_copies.forward, a.forward);
    EXPECT_GT(as_copies.forward - a.forward, b.forward - a.forward);
}

// A rank whose weights (f32) fit in the caches of the cores it computes on runs its matmuls at
// the rates measured with the weight used again; a larger one at those measured with weights
// streamed in. Without `cache_bytes` every rank streams; a row without `warm` has one rate.
TEST(Rates, ARankWhoseWeightsFitItsCachesRunsItsMatmulsWarm) {
    Calibration c;
    c.cores = 2;
    for (int32_t t : {1, 2})
        for (const char* k : {"nt", "nn", "tn"}) c.matmul.push_back({k, 64, 64, 64, t, 1e10, 4e10});
    c.attention.push_back({64, 64, 1, 1e10, 1e10});
    c.elementwise.push_back({"copy", 1024, 1, 1e9, 1e9});
    Program p = checked("gpt_tiny.dist");
    const PlanStage s = lower(p).graph->stages[0];
    const int64_t weights = 4 * s.parameters;
    auto priced = [&](int64_t cache, double threads) {
        c.cache_bytes = cache;
        sim::Rates rates(c);
        return sim::stage_seconds(p, s, rates, threads, false);
    };
    const sim::StageSeconds cold = priced(0, 1);
    const sim::StageSeconds fits = priced(weights, 1);
    const sim::StageSeconds beyond = priced(weights - 1, 1);
    EXPECT_LT(fits.forward, cold.forward);
    EXPECT_LT(fits.input, cold.input);
    EXPECT_LT(fits.weight, cold.weight);
    EXPECT_DOUBLE_EQ(beyond.forward, cold.forward);
    EXPECT_DOUBLE_EQ(beyond.weight, cold.weight);
    // The caches of two cores hold twice as much.
    EXPECT_LT(priced(weights / 2, 2).forward, priced(0, 2).forward);
    // Four times the rate, a quarter of the matmuls' time (which halves at twice the rate).
    for (MatmulRate& m : c.matmul) m.flops = 2e10;
    const double matmuls = 2 * (cold.weight - priced(0, 1).weight);
    EXPECT_NEAR(fits.weight, cold.weight - 0.75 * matmuls, 1e-9 * cold.weight);
    for (MatmulRate& m : c.matmul) m.flops = 1e10;
    for (MatmulRate& m : c.matmul) m.warm = 0;
    EXPECT_DOUBLE_EQ(priced(weights, 1).forward, cold.forward);
}

// Whole actions are fitted for a rank on all the cores and for ranks of fewer threads; a rank
// gets the fit of its thread count, between two measured counts the mean weighted by log threads
// (a rank of 2 threads on 4 cores lies halfway between 1 and 4), outside them the nearest.
TEST(Rates, WholeActionsFollowTheRanksThreads) {
    Calibration c;
    c.cores = 4;
    c.actions.scales = {2, 2, 3, 3};
    c.actions.block_overhead_s = {0.004, 0.008};
    c.fewer_threads.push_back({1, {1, 1, 1, 1}, {0.001, 0.002}});
    auto at = [&](double threads) { return c.whole_actions(threads); };
    EXPECT_EQ(at(1).scales, c.fewer_threads[0].scales);
    EXPECT_EQ(at(1).block_overhead_s, c.fewer_threads[0].block_overhead_s);
    EXPECT_EQ(at(0.5).scales, c.fewer_threads[0].scales);
    EXPECT_EQ(at(4).scales, c.actions.scales);
    EXPECT_EQ(at(16).block_overhead_s, c.actions.block_overhead_s);
    WholeActions two = at(2);
    EXPECT_NEAR(two.scales[0], 1.5, 1e-12);
    EXPECT_NEAR(two.scales[3], 2.0, 1e-12);
    EXPECT_NEAR(two.block_overhead_s[0], 0.0025, 1e-15);
    EXPECT_NEAR(two.block_overhead_s[1], 0.005, 1e-15);
    // Without rows for fewer threads, every rank has the one fit.
    c.fewer_threads.clear();
    EXPECT_EQ(at(1).scales, c.actions.scales);

    // A row of the profile that is not a fit is refused where it is written.
    expect_row_refused("fewer", "fewer_threads",
                       "{ threads = 1, scales = [1.0, 1.0, 1.0], block_overhead = [0, 0] }",
                       "fewer.toml:21:27: error: `scales` must be four positive numbers");
}

// Small widths cost more beyond their kernels than one line over all widths gives them: with
// fits for the probes of each width, a rank gets those of its thread count at the width of its
// matmuls (a tensor-parallel shard's: model width / tp), between two probed widths the mean
// weighted by log width, outside them the nearest; then between thread counts as before.
TEST(Rates, WholeActionsFollowTheWidthOfTheMatmuls) {
    Calibration c;
    c.cores = 2;
    c.actions.scales = {5, 5, 5, 5};
    c.actions.block_overhead_s = {0.001, 0.002};
    c.by_width = {{2, {1, 1, 1, 1}, {0, 0}, 128},
                  {2, {2, 2, 4, 4}, {0, 0}, 512},
                  {1, {3, 3, 3, 3}, {0, 0}, 128}};
    auto scale = [&](double threads, double width, size_t k = 0) {
        return c.whole_actions(threads, width).scales[k];
    };
    EXPECT_DOUBLE_EQ(scale(2, 128), 1);
    EXPECT_DOUBLE_EQ(scale(2, 64), 1);
    EXPECT_NEAR(scale(2, 256), 1.5, 1e-12);
    EXPECT_NEAR(scale(2, 256, 2), 2.5, 1e-12);
    EXPECT_DOUBLE_EQ(scale(2, 1024), 2);
    EXPECT_DOUBLE_EQ(scale(1, 512), 3); // one width probed on one thread: the nearest
    EXPECT_NEAR(scale(std::sqrt(2.0), 128), 2, 1e-12);
    EXPECT_EQ(c.whole_actions(2, 128).block_overhead_s, (std::array<double, 2>{0, 0}));
    // Without a width (or without the rows) the one line over all widths.
    EXPECT_DOUBLE_EQ(scale(2, 0), 5);
    EXPECT_EQ(c.whole_actions(2, 0).block_overhead_s, c.actions.block_overhead_s);

    // A stage is priced at its matmuls' width: width 256 on tp 2 as the 128 fit, on tp 1
    // halfway to the 512 one.
    for (int32_t t : {1, 2})
        for (const char* k : {"nt", "nn", "tn"}) c.matmul.push_back({k, 64, 64, 64, t, 1e10});
    c.attention.push_back({64, 64, 1, 1e10, 1e10});
    c.elementwise.push_back({"copy", 1024, 1, 1e9, 1e9});
    sim::Rates rates(c);
    for (int32_t tp : {1, 2}) {
        Program p = checked("gpt_tiny.dist", {"model.width=256", "mesh.tp=" + std::to_string(tp)});
        PlanStage s = lower(p).graph->stages[0];
        s.embedding = s.head = false; // the blocks alone
        const sim::StageSeconds kernels = sim::stage_seconds(p, s, rates, 2, false);
        const sim::StageSeconds whole = sim::stage_seconds(p, s, rates, 2, true);
        const double forward = tp == 2 ? 1.0 : 1.5, backward = tp == 2 ? 1.0 : 2.5;
        EXPECT_NEAR(whole.forward, forward * kernels.forward, 1e-12 * kernels.forward) << tp;
        EXPECT_NEAR(whole.input, backward * kernels.input, 1e-12 * kernels.input) << tp;
        EXPECT_NEAR(whole.weight, backward * kernels.weight, 1e-12 * kernels.weight) << tp;
    }

    // A row of them that is not a fit is refused where it is written.
    expect_row_refused("by_width", "by_width",
                       "{ threads = 1, width = 128.5, scales = [1.0, 1.0, 1.0, 1.0] }",
                       "by_width.toml:21:26: error: `width` must be a whole number");
    expect_row_refused("by_width", "by_width",
                       "{ threads = 1, width = 128, tokens = 0.5, scales = [1.0, 1.0, 1.0, 1.0] }",
                       "by_width.toml:21:40: error: `tokens` must be a whole number");
    expect_row_refused("by_width", "by_width",
                       "{ threads = 1, width = 128, blocks = 1.5, scales = [1.0, 1.0, 1.0, 1.0] }",
                       "by_width.toml:21:40: error: `blocks` must be a whole number");
}

// A stage holds one end of the model or the other: the first (the embeddings) at its own scale
// where the profile has it, else the ends' one, the last (final norm, head, loss) at the ends'.
// What a stage costs is linear in each: raising the first end's scale adds exactly that many
// of its kernels' seconds to the first stage and nothing to the last. The embeddings' backward
// is their tables' gradient, in the weight gradient's action.
TEST(Rates, TheFirstEndHasAScaleOfItsOwn) {
    Calibration c;
    c.cores = 2;
    c.by_width = {{2, {1.5, 2, 1.25, 3}, {0, 0}, 128}};
    for (int32_t t : {1, 2})
        for (const char* k : {"nt", "nn", "tn"}) c.matmul.push_back({k, 64, 64, 64, t, 1e10});
    c.attention.push_back({64, 64, 1, 1e10, 1e10});
    c.elementwise.push_back({"copy", 1024, 1, 1e9, 1e9});
    c.elementwise.push_back({"embedding", 1024, 1, 1e9, 5e8});
    Program p = checked("gpt_tiny.dist", {"mesh.pp=2"});
    const std::vector<PlanStage> stages = lower(p).graph->stages;
    ASSERT_EQ(stages.size(), 2u);
    ASSERT_TRUE(stages[0].embedding && !stages[0].head);
    ASSERT_TRUE(stages[1].head && !stages[1].embedding);
    PlanStage first = stages[0];
    first.blocks = 0;
    auto priced = [&](const PlanStage& s) {
        sim::Rates rates(c);
        return sim::stage_seconds(p, s, rates, 2, true);
    };
    sim::Rates rates(c);
    const sim::StageSeconds kf = sim::stage_seconds(p, first, rates, 2, false);
    EXPECT_GT(kf.forward, 0);
    EXPECT_EQ(kf.input, 0); // f32: nothing flows back into the tokens
    EXPECT_GT(kf.weight, 0);
    // Without a first end's scale: the ends' for both.
    const sim::StageSeconds before0 = priced(stages[0]), before1 = priced(stages[1]);
    EXPECT_NEAR(priced(first).forward, 2 * kf.forward, 1e-12 * kf.forward);
    EXPECT_NEAR(priced(first).weight, 3 * kf.weight, 1e-12 * kf.weight);
    c.by_width[0].first_end = {6, 4};
    const sim::StageSeconds after0 = priced(stages[0]), after1 = priced(stages[1]);
    EXPECT_NEAR(after0.forward - before0.forward, (6 - 2) * kf.forward, 1e-9 * after0.forward);
    EXPECT_NEAR(after0.weight - before0.weight, (4 - 3) * kf.weight, 1e-9 * after0.weight);
    EXPECT_EQ(after0.input, before0.input);
    EXPECT_EQ(after1.forward, before1.forward);
    EXPECT_EQ(after1.input, before1.input);
    EXPECT_EQ(after1.weight, before1.weight);

    // Read from a profile's row; between two rows by log width, as the scales are.
    c.by_width = {{2, {1, 1, 1, 1}, {0, 0}, 128, 0, {2, 4}},
                  {2, {1, 1, 1, 1}, {0, 0}, 512, 0, {4, 8}}};
    EXPECT_NEAR(c.whole_actions(2, 256).first_end[0], 3, 1e-12);
    EXPECT_NEAR(c.whole_actions(2, 256).first_end[1], 6, 1e-12);
    expect_row_refused(
        "by_width", "by_width",
        "{ threads = 1, width = 128, scales = [1.0, 1.0, 1.0, 1.0], first_end = [0.0, 1.0] }",
        "by_width.toml:21:74: error: `first_end` must be two positive numbers");
}

// Ranks beyond the cores cost their actions a factor more, by the width of their matmuls:
// between two measured widths by log width, outside them the nearest; 1 without rows. A row
// that is not one is refused where it is written.
TEST(Rates, OversubscribedWorkFollowsTheWidth) {
    Calibration c;
    EXPECT_EQ(c.oversubscribed_work(128), 1.0);
    c.oversubscribed = {{2, 128, 1.4}, {2, 512, 1.1}};
    EXPECT_DOUBLE_EQ(c.oversubscribed_work(64), 1.4);
    EXPECT_DOUBLE_EQ(c.oversubscribed_work(128), 1.4);
    EXPECT_NEAR(c.oversubscribed_work(256), 1.25, 1e-12);
    EXPECT_DOUBLE_EQ(c.oversubscribed_work(1024), 1.1);
    // One count of ranks a core measured: every count has its rows.
    EXPECT_NEAR(c.oversubscribed_work(256, 8), 1.25, 1e-12);
    expect_row_refused("over", "oversubscribed", "{ width = 128, work = 0 }",
                       "over.toml:21:25: error: `work` must be a positive number");
    expect_row_refused("over", "oversubscribed", "{ ranks_per_core = -4, width = 128, work = 1 }",
                       "over.toml:21:22: error: `ranks_per_core` must be a positive number");
}

// More ranks a core cost more: each count's rows by width, then between the counts by log
// count (half-way in log between 2 and 4 a core: 2.83), outside them the nearest count. A
// profile's rows without a count are of two ranks a core, as its pipeline was.
TEST(Rates, OversubscribedWorkFollowsTheRanksACore) {
    Calibration c;
    c.oversubscribed = {{2, 128, 1.2}, {2, 512, 1.0}, {4, 128, 1.4}, {4, 512, 1.1}};
    EXPECT_DOUBLE_EQ(c.oversubscribed_work(128, 1.5), 1.2);
    EXPECT_DOUBLE_EQ(c.oversubscribed_work(128, 2), 1.2);
    EXPECT_NEAR(c.oversubscribed_work(128, 2 * std::sqrt(2.0)), 1.3, 1e-12);
    EXPECT_DOUBLE_EQ(c.oversubscribed_work(128, 4), 1.4);
    EXPECT_DOUBLE_EQ(c.oversubscribed_work(128, 16), 1.4);
    EXPECT_NEAR(c.oversubscribed_work(256, 4), 1.25, 1e-12);
    EXPECT_NEAR(c.oversubscribed_work(256, 2 * std::sqrt(2.0)), (1.1 + 1.25) / 2, 1e-12);
    // A profile's rows, with and without the count.
    const std::optional<Calibration> loaded =
        with_oversubscribed("percore", "  { width = 128, work = 1.2 },\n"
                                       "  { ranks_per_core = 4, width = 128, work = 1.5 },\n");
    ASSERT_TRUE(loaded.has_value());
    ASSERT_EQ(loaded->oversubscribed.size(), 2u);
    EXPECT_DOUBLE_EQ(loaded->oversubscribed_work(128, 2), 1.2);
    EXPECT_DOUBLE_EQ(loaded->oversubscribed_work(128, 4), 1.5);
}

// A stash's cost grows with how far back it was last touched: from none at 0 to the first
// row, linear in distance; between rows linear in log distance (2 MB, half-way in log from 1 to
// 4, costs half-way); beyond the last its cost. A rank of another thread count takes the rows
// of the nearest count measured; a row without `forward` costs a forward nothing.
TEST(Rates, ReuseCostFollowsTheDistanceAndTheThreads) {
    Calibration c;
    EXPECT_EQ(c.reuse_cost(1, 1e6, true), 0.0);
    c.reuse = {{1, 1e6, 0.5e-10, 1e-10}, {1, 4e6, 1e-10, 2e-10}, {2, 1e6, 0, 0.25e-10}};
    EXPECT_EQ(c.reuse_cost(1, 0, true), 0.0);
    EXPECT_NEAR(c.reuse_cost(1, 0.5e6, true), 0.5e-10, 1e-22);
    EXPECT_NEAR(c.reuse_cost(1, 1e6, true), 1e-10, 1e-22);
    EXPECT_NEAR(c.reuse_cost(1, 2e6, true), 1.5e-10, 1e-22);
    EXPECT_NEAR(c.reuse_cost(1, 2e6, false), 0.75e-10, 1e-22);
    EXPECT_NEAR(c.reuse_cost(1, 64e6, true), 2e-10, 1e-22);
    EXPECT_NEAR(c.reuse_cost(1.2, 1e6, true), 1e-10, 1e-22);
    EXPECT_NEAR(c.reuse_cost(2, 8e6, true), 0.25e-10, 1e-22);
    EXPECT_EQ(c.reuse_cost(4, 8e6, false), 0.0);

    const std::optional<Calibration> p =
        with_rows("reuse", "reuse",
                  "  { threads = 1, distance = 4000000, backward = 2e-10, forward = 1e-10 },\n"
                  "  { threads = 1, distance = 1000000, backward = 1e-10 },\n");
    ASSERT_TRUE(p.has_value());
    ASSERT_EQ(p->reuse.size(), 2u);
    EXPECT_EQ(p->reuse.front().distance, 1e6); // ordered by distance
    EXPECT_EQ(p->reuse.front().forward, 0.0);
    EXPECT_NEAR(p->reuse_cost(1, 2e6, true), 1.5e-10, 1e-22);
    expect_row_refused("reusebad", "reuse", "{ threads = 1, distance = 0, backward = 1e-10 }",
                       "reusebad.toml:21:29: error: `distance` must be a positive number");
    expect_row_refused("reusebad", "reuse", "{ threads = 1, distance = 1e6, backward = -1e-10 }",
                       "reusebad.toml:21:45: error: `backward` must be a positive number");
}

// How far back a rank's stashes were last touched, worked by hand (A: a stage's activations a
// microbatch). 1F1B on one stage, each B right after its F and each F taking what the B before
// it freed: none. GPipe over four: every B reads a stash three others were written after;
// F0 takes what the last B freed (0), F1 the one freed before it (the one after it touched
// since, A), F2 2A, F3 3A. 1F1B's first stage of two: F0 F1 B0 F2 B1 F3 B2 B3, two stashes
// in turn: each B one stash from its F, F1 (which takes B2's, B3's touched since) too; its
// last stage, like one stage alone, none.
TEST(Reuse, DistancesFollowTheScheduleOrder) {
    auto distances = [](const Graph& g, int32_t rank, ActionKind kind) {
        const PlanRank& r = g.ranks[static_cast<size_t>(rank)];
        const std::vector<double> d = sim::reuse_distances(g, r);
        EXPECT_EQ(d.size(), r.actions.size());
        std::vector<double> out;
        for (size_t i = 0; i < r.actions.size(); ++i) {
            const ActionKind k = r.actions[i].kind;
            if (k == kind) out.push_back(d[i]);
            if (k != ActionKind::forward && k != ActionKind::backward &&
                k != ActionKind::backward_input && k != ActionKind::backward_weight) {
                EXPECT_EQ(d[i], -1.0);
            }
        }
        return out;
    };
    const Graph one = planned(checked("gpt_tiny.dist", {"schedule.microbatches=4"}));
    EXPECT_EQ(distances(one, 0, ActionKind::forward), std::vector<double>(4, 0.0));
    EXPECT_EQ(distances(one, 0, ActionKind::backward), std::vector<double>(4, 0.0));

    const Graph gpipe =
        planned(checked("gpt_tiny.dist", {"schedule.microbatches=4", "schedule.kind=gpipe"}));
    const double a = static_cast<double>(gpipe.stages[0].activation_bytes);
    ASSERT_GT(a, 0);
    EXPECT_EQ(distances(gpipe, 0, ActionKind::forward), (std::vector<double>{0, a, 2 * a, 3 * a}));
    EXPECT_EQ(distances(gpipe, 0, ActionKind::backward), std::vector<double>(4, 3 * a));

    const Graph two = planned(checked("gpt_tiny.dist", {"mesh.pp=2", "schedule.microbatches=4"}));
    const double first = static_cast<double>(two.stages[0].activation_bytes);
    EXPECT_EQ(distances(two, 0, ActionKind::forward), (std::vector<double>{0, first, 0, 0}));
    EXPECT_EQ(distances(two, 0, ActionKind::backward), std::vector<double>(4, first));
    EXPECT_EQ(distances(two, 1, ActionKind::forward), std::vector<double>(4, 0.0));
    EXPECT_EQ(distances(two, 1, ActionKind::backward), std::vector<double>(4, 0.0));

    // ZB-H1's last stage, F0 I0 F1 I1 W0 F2 I2 W1 F3 I3 W2 W3: each I reads its stash at once
    // and leaves it to its W, which reads it after another microbatch's I and frees it; so F1
    // takes the memory W0 freed after I0 and F0 touched another stash.
    const Graph zb = planned(
        checked("gpt_tiny.dist", {"mesh.pp=2", "schedule.microbatches=4", "schedule.kind=zb_h1"}));
    const double last = static_cast<double>(zb.stages[1].activation_bytes);
    EXPECT_EQ(distances(zb, 1, ActionKind::forward), (std::vector<double>{0, last, 0, 0}));
    EXPECT_EQ(distances(zb, 1, ActionKind::backward_input), std::vector<double>(4, 0.0));
    EXPECT_EQ(distances(zb, 1, ActionKind::backward_weight), std::vector<double>(4, last));
}

namespace {

// The simulated step of `p` on two cores at rates of one size (64^3 products, one copy rate),
// with `rows` as the calibration's `oversubscribed` rows and `reuse` as its `reuse` rows.
// The calibration of those rates, with those rows.
Calibration two_cores(const std::vector<OversubscribedRow>& rows,
                      const std::vector<ReuseRow>& reuse) {
    Calibration c;
    c.cores = 2;
    for (int32_t t : {1, 2})
        for (const char* k : {"nt", "nn", "tn"}) c.matmul.push_back({k, 64, 64, 64, t, 1e10});
    c.attention.push_back({64, 64, 1, 1e10, 1e10});
    c.elementwise.push_back({"copy", 1024, 1, 1e9, 1e9});
    c.oversubscribed = rows;
    c.reuse = reuse;
    return c;
}

// The simulated timeline of `p` on that calibration (empty where it failed).
std::optional<sim::Timeline> beyond_the_cores(Program p, const std::vector<OversubscribedRow>& rows,
                                              const std::vector<ReuseRow>& reuse = {}) {
    p.mesh.profile.calibration = two_cores(rows, reuse);
    sim::SimResult r = sim::simulate(planned(p), p);
    EXPECT_TRUE(r.ok());
    if (!r.ok()) return std::nullopt;
    return *r.timeline;
}

double step_beyond_the_cores(const Program& p, const std::vector<OversubscribedRow>& rows,
                             const std::vector<ReuseRow>& reuse = {}) {
    const std::optional<sim::Timeline> t = beyond_the_cores(p, rows, reuse);
    return t ? t->step_time_s : 0.0;
}

} // namespace

// Ranks in tensor-parallel groups take the rows measured with such groups, the rest the
// pipelines'; a profile with no such rows prices both with the pipelines'. A row's `tp` is
// read from the profile, and a plan of tp 2 x pp 2 on two cores costs its actions the tp row's
// factor, not the pipeline's.
TEST(Rates, TensorParallelRanksBeyondTheCoresTakeTheirOwnRows) {
    Calibration c;
    c.oversubscribed = {{2, 128, 1.3}, {4, 128, 1.4}};
    EXPECT_DOUBLE_EQ(c.oversubscribed_work(128, 4, true), 1.4);
    c.oversubscribed = {{2, 128, 1.3}, {4, 128, 1.4}, {2, 128, 1.2, 2}, {4, 128, 1.1, 2}};
    EXPECT_DOUBLE_EQ(c.oversubscribed_work(128, 2), 1.3);
    EXPECT_DOUBLE_EQ(c.oversubscribed_work(128, 4), 1.4);
    EXPECT_DOUBLE_EQ(c.oversubscribed_work(128, 2, true), 1.2);
    EXPECT_DOUBLE_EQ(c.oversubscribed_work(128, 4, true), 1.1);
    const std::optional<Calibration> loaded = with_oversubscribed(
        "tprows", "  { width = 128, work = 1.2 },\n  { width = 128, tp = 2, work = 1.05 },\n");
    ASSERT_TRUE(loaded.has_value());
    EXPECT_DOUBLE_EQ(loaded->oversubscribed_work(128, 2), 1.2);
    EXPECT_DOUBLE_EQ(loaded->oversubscribed_work(128, 2, true), 1.05);
    expect_row_refused("tpbad", "oversubscribed", "{ width = 128, tp = 1.5, work = 1 }",
                       "tpbad.toml:21:23: error: `tp` must be a whole number");

    const Program tp =
        checked("gpt_tiny.dist", {"mesh.tp=2", "mesh.pp=2", "schedule.microbatches=4"});
    auto step = [&](const std::vector<OversubscribedRow>& rows) {
        return step_beyond_the_cores(tp, rows);
    };
    const double own = step({{2, 128, 1.0}, {2, 128, 1.5, 2}});
    EXPECT_NEAR(own, step({{2, 128, 1.5}}), 1e-9 * own);
    EXPECT_GT(own, 1.3 * step({{2, 128, 1.0}}));
}

// Stashes touched far from their writes cost their bytes at the calibrated rate, on top of
// the kernels: GPipe over four microbatches on one rank of both cores, one row at one
// microbatch's activations A (beyond it the same), costs 4 B at 3A and F at A, 2A and 3A more:
// A x (4 b + 3 f). 1F1B on one stage, whose stashes are used at once, costs nothing more; on
// two stages GPipe's more than 1F1B's, which the kernels alone price alike.
TEST(Reuse, StashesTouchedFarFromTheirWritesCostMore) {
    const Program gpipe =
        checked("gpt_tiny.dist", {"schedule.microbatches=4", "schedule.kind=gpipe"});
    const double a = static_cast<double>(planned(gpipe).stages[0].activation_bytes);
    const double b = 1e-10, f = 0.5e-10;
    const std::vector<ReuseRow> rows{{2, a, f, b}};
    const double alone = step_beyond_the_cores(gpipe, {});
    EXPECT_NEAR(step_beyond_the_cores(gpipe, {}, rows) - alone, a * (4 * b + 3 * f), 1e-9 * alone);
    const Program ofob = checked("gpt_tiny.dist", {"schedule.microbatches=4"});
    const double plain = step_beyond_the_cores(ofob, {});
    EXPECT_NEAR(step_beyond_the_cores(ofob, {}, rows), plain, 1e-12 * plain);

    // Two stages, a rank a core: rows of one thread.
    const std::vector<ReuseRow> one{{1, a / 2, f, b}};
    const Program gpipe2 =
        checked("gpt_tiny.dist", {"mesh.pp=2", "schedule.microbatches=4", "schedule.kind=gpipe"});
    const Program ofob2 = checked("gpt_tiny.dist", {"mesh.pp=2", "schedule.microbatches=4"});
    EXPECT_NEAR(step_beyond_the_cores(gpipe2, {}), step_beyond_the_cores(ofob2, {}), 1e-9 * plain);
    EXPECT_GT(step_beyond_the_cores(gpipe2, {}, one), step_beyond_the_cores(ofob2, {}, one));
    EXPECT_GT(step_beyond_the_cores(ofob2, {}, one), step_beyond_the_cores(ofob2, {}));

    // A split backward: on one rank ZB-H1 runs each W right after its I and costs nothing
    // more. On its last stage of two (F0 I0 F1 I1 W0 F2 I2 W1 ...) each I reads its stash at
    // once and each W one stash's bytes later: every W costs its share of the stash (the
    // stage's weight gradient's part of its backward) at that distance, every I nothing.
    const Program zb = checked("gpt_tiny.dist", {"schedule.microbatches=4", "schedule.kind=zb_h1"});
    const double zb_plain = step_beyond_the_cores(zb, {});
    EXPECT_NEAR(step_beyond_the_cores(zb, {}, rows), zb_plain, 1e-12 * zb_plain);
    const Program zb2 =
        checked("gpt_tiny.dist", {"mesh.pp=2", "schedule.microbatches=4", "schedule.kind=zb_h1"});
    const Graph g = planned(zb2);
    const double last = static_cast<double>(g.stages[1].activation_bytes);
    const std::optional<sim::Timeline> split = beyond_the_cores(zb2, {}, {{1, last, 0, b}});
    const std::optional<sim::Timeline> plain_split = beyond_the_cores(zb2, {});
    ASSERT_TRUE(split && plain_split);
    const Calibration priced = two_cores({}, {});
    const sim::Rates rates(priced);
    const sim::StageSeconds t = sim::stage_seconds(zb2, g.stages[1], rates, 1);
    const double w_part = t.weight / (t.input + t.weight);
    const std::vector<sim::Span>& with = split->ranks[1].spans;
    const std::vector<sim::Span>& without = plain_split->ranks[1].spans;
    ASSERT_EQ(with.size(), without.size());
    int ws = 0;
    for (size_t i = 0; i < with.size(); ++i) {
        const ActionKind k = g.ranks[1].actions[with[i].action].kind;
        const double more = (with[i].end - with[i].start) - (without[i].end - without[i].start);
        if (k == ActionKind::backward_weight) {
            EXPECT_NEAR(more, w_part * last * b, 1e-9 * last * b) << i;
            ++ws;
        } else {
            EXPECT_NEAR(more, 0, 1e-12) << i;
        }
    }
    EXPECT_EQ(ws, 4);
}

// A split backward's factors: a count measured its own, between two counts in log threads,
// outside them the nearest; none without rows. A profile's rows load in thread order; a
// factor must be positive, and a thread count has one row.
TEST(Split, FactorsFollowTheThreads) {
    Calibration c;
    EXPECT_EQ(c.split_factors(2), (std::pair{1.0, 1.0}));
    c.split_backward = {{1, 1.2, 1.0}, {4, 1.0, 0.8}};
    EXPECT_EQ(c.split_factors(1), (std::pair{1.2, 1.0}));
    EXPECT_EQ(c.split_factors(4), (std::pair{1.0, 0.8}));
    EXPECT_NEAR(c.split_factors(2).first, 1.1, 1e-12);
    EXPECT_NEAR(c.split_factors(2).second, 0.9, 1e-12);
    EXPECT_EQ(c.split_factors(16), (std::pair{1.0, 0.8}));

    const std::optional<Calibration> p =
        with_rows("split", "split_backward",
                  "  { threads = 2, input = 1.05, weight = 0.95 },\n"
                  "  { threads = 1, input = 1.1, weight = 1.02 },\n");
    ASSERT_TRUE(p.has_value());
    EXPECT_EQ(p->split_backward, (std::vector<SplitRow>{{1, 1.1, 1.02}, {2, 1.05, 0.95}}));
    expect_row_refused("splitbad", "split_backward", "{ threads = 1, input = 0, weight = 1 }",
                       "splitbad.toml:21:26: error: `input` must be a positive number");
    TempDir dir("splittwice");
    const std::string twice =
        refusal(one_rate_profile(dir, "splittwice", "split_backward",
                                 "  { threads = 2, input = 1.05, weight = 0.95 },\n"
                                 "  { threads = 2, input = 1.1, weight = 1.02 },\n"));
    EXPECT_NE(twice.find("splittwice.toml:22:15: error: `split_backward` has two rows of 2 "
                         "threads"),
              std::string::npos)
        << twice;
}

// The simulator costs each I and W of a split backward its factor, on the threads of the
// rank: ZB-H1 on one rank of both cores, rows of 1 and 2 threads, every I 1.2 and every W 0.9
// of what it costs without rows, its forwards alike; 1F1B's whole backwards take no factor.
TEST(Split, ASplitBackwardsIAndWCostTheirFactors) {
    auto timeline = [](const Program& p, const std::vector<SplitRow>& rows) {
        Program q = p;
        q.mesh.profile.calibration = two_cores({}, {});
        q.mesh.profile.calibration.split_backward = rows;
        sim::SimResult r = sim::simulate(planned(q), q);
        EXPECT_TRUE(r.ok());
        return r.ok() ? *r.timeline : sim::Timeline{};
    };
    const std::vector<SplitRow> rows{{1, 1.5, 1.5}, {2, 1.2, 0.9}};
    const Program zb = checked("gpt_tiny.dist", {"schedule.microbatches=4", "schedule.kind=zb_h1"});
    const Graph g = planned(zb);
    const sim::Timeline with = timeline(zb, rows), without = timeline(zb, {});
    ASSERT_EQ(with.ranks.size(), 1u);
    ASSERT_EQ(with.ranks[0].spans.size(), without.ranks[0].spans.size());
    std::map<ActionKind, int> seen;
    for (size_t i = 0; i < with.ranks[0].spans.size(); ++i) {
        const sim::Span& a = with.ranks[0].spans[i];
        const sim::Span& b = without.ranks[0].spans[i];
        const ActionKind k = g.ranks[0].actions[a.action].kind;
        const double factor = k == ActionKind::backward_input    ? 1.2
                              : k == ActionKind::backward_weight ? 0.9
                                                                 : 1.0;
        EXPECT_GT(b.end - b.start, 0) << i;
        EXPECT_NEAR(a.end - a.start, factor * (b.end - b.start), 1e-12) << i;
        ++seen[k];
    }
    EXPECT_EQ(seen[ActionKind::backward_input], 4);
    EXPECT_EQ(seen[ActionKind::backward_weight], 4);
    const Program ofob = checked("gpt_tiny.dist", {"schedule.microbatches=4"});
    EXPECT_DOUBLE_EQ(timeline(ofob, rows).step_time_s, timeline(ofob, {}).step_time_s);
}

// A tensor-parallel stage beyond the cores pays the factor of the model's width, not its
// shard's: tp 2 x pp 2 at width 512 on two cores (four single-threaded ranks, two a core) is
// priced alike with a factor of 1.5 at 512 and 1 at 128 (a shard 256 wide would take 1.25
// between them) as with 1.5 at every width, and above the same plan at 1.
TEST(Rates, RanksBeyondTheCoresPayTheFactorAtTheModelsWidth) {
    const Program p = checked(
        "gpt_tiny.dist", {"model.width=512", "mesh.tp=2", "mesh.pp=2", "schedule.microbatches=4"});
    auto step = [&](const std::vector<OversubscribedRow>& rows) {
        return step_beyond_the_cores(p, rows);
    };
    const double by_width = step({{2, 128, 1.0}, {2, 512, 1.5}});
    EXPECT_NEAR(by_width, step({{2, 512, 1.5}}), 1e-9 * by_width);
    EXPECT_GT(by_width, 1.3 * step({{2, 512, 1.0}}));
}

// The members of a tensor-parallel group reach each all-reduce apart: the first blocks and goes
// on once its core has woken. tp 2 on two cores, each rank its own: every all-reduce of a
// rank's step (its stage's forward, loss and backward ones, for each microbatch) lengthens the
// step by the calibrated wake-up.
TEST(Rates, ATensorParallelMeetingWaitsForTheWakeUp) {
    Calibration c;
    c.cores = 2;
    for (const char* k : {"nt", "nn", "tn"}) c.matmul.push_back({k, 64, 64, 64, 1, 1e10});
    c.attention.push_back({64, 64, 1, 1e10, 1e10});
    c.elementwise.push_back({"copy", 1024, 1, 1e9, 1e9});
    for (int64_t bytes : {256, 1 << 20})
        c.collectives.push_back({"inprocess", "all_reduce", 2, bytes, 1e-5});
    Program p = checked("gpt_tiny.dist", {"mesh.tp=2", "schedule.microbatches=2"});
    const Graph g = planned(p);
    ASSERT_EQ(g.stages.size(), 1u);
    const PlanStage& s = g.stages[0];
    const int32_t meetings = s.tp_reductions + s.tp_loss_reductions + s.tp_backward_reductions;
    ASSERT_GT(meetings, 0);
    auto step = [&](double wake) {
        c.wake_s = wake;
        p.mesh.profile.calibration = c;
        sim::SimResult r = sim::simulate(g, p);
        EXPECT_TRUE(r.ok());
        return r.ok() ? r.timeline->step_time_s : 0.0;
    };
    EXPECT_NEAR(step(1e-3) - step(0), 2 * meetings * 1e-3, 1e-9);
}

// The whole-action probes of one width and token count differ only in their blocks: the blocks'
// scale of each is told apart from the ends' (one for all widths). Probes made to cost exactly
// known scales give those scales back; where the ends' share is the same in every probe of a
// group, or the best ends' scale is not positive, each group gets its mean ratio for both.
TEST(Calibrate, ProbesTellTheBlocksScaleFromTheEnds) {
    using cli::calibration::ActionPoint;
    const std::array<double, 3> blocks_scale{1.1, 1.25, 1.05};
    const double ends_scale = 2.4;
    std::vector<std::vector<ActionPoint>> groups;
    for (size_t g = 0; g < 3; ++g) {
        groups.emplace_back();
        const double block = 0.001 * (1.0 + static_cast<double>(g)), ends = 0.0004 * (3.0 - g);
        for (double blocks : {1.0, 4.0})
            groups.back().push_back(
                {blocks * block, ends, blocks_scale[g] * blocks * block + ends_scale * ends});
    }
    std::vector<double> s = cli::calibration::blocks_and_ends_scales(groups);
    ASSERT_EQ(s.size(), 4u);
    for (size_t g = 0; g < 3; ++g) EXPECT_NEAR(s[g], blocks_scale[g], 1e-9);
    EXPECT_NEAR(s[3], ends_scale, 1e-9);

    // One block count in a group: nothing tells its blocks from its ends.
    std::vector<std::vector<ActionPoint>> same = {{{0.002, 0.001, 0.0036}, {0.002, 0.001, 0.0033}}};
    s = cli::calibration::blocks_and_ends_scales(same);
    ASSERT_EQ(s.size(), 2u);
    EXPECT_NEAR(s[0], (1.2 + 1.1) / 2, 1e-12);
    EXPECT_EQ(s[1], 0.0);

    // Ends that would cost less than nothing: the mean ratios.
    std::vector<std::vector<ActionPoint>> cheap = {
        {{0.001, 0.001, 0.0011}, {0.004, 0.001, 0.0060}}};
    s = cli::calibration::blocks_and_ends_scales(cheap);
    EXPECT_NEAR(s[0], (0.55 + 1.2) / 2, 1e-12);
    EXPECT_EQ(s[1], 0.0);
}

// The cores' spread from replicas' compute drawn about their mean with a known deviation:
// each step's sample variance, their median at a normal sample variance's median.
TEST(Calibrate, TheCoresSpreadIsTheDeviationOfTheirPaces) {
    EXPECT_DOUBLE_EQ(cli::calibration::relative_variance({1.0, 3.0}), 0.5); // (0.5^2 + 0.5^2) / 1
    EXPECT_EQ(cli::calibration::relative_variance({2.0}), 0.0);
    EXPECT_EQ(cli::calibration::spread_of(std::vector<double>{}, 2), 0.0);
    std::mt19937 gen(7);
    std::normal_distribution<double> normal;
    for (int32_t ranks : {2, 3, 4, 8}) {
        const double sigma = 0.06;
        std::vector<double> variances;
        for (int step = 0; step < 4001; ++step) {
            std::vector<double> compute;
            for (int32_t r = 0; r < ranks; ++r) compute.push_back(0.04 * (1 + sigma * normal(gen)));
            variances.push_back(cli::calibration::relative_variance(compute));
        }
        EXPECT_NEAR(cli::calibration::spread_of(variances, ranks), sigma, 0.05 * sigma) << ranks;
    }
    // The run's passes: the median of each one's (a pass with no steps counts for none), so
    // that one pass in a spell of other load does not set the level.
    cli::calibration::SpreadRun run;
    auto pass_of = [](double spread) { // one step's variance whose spread is `spread`
        return std::vector<double>{0.4549364 * spread * spread};
    };
    run.passes = {pass_of(0.01), {}, pass_of(0.2), pass_of(0.03)};
    EXPECT_NEAR(cli::calibration::spread_of(run, 2, 2), 0.2, 1e-9);
    EXPECT_EQ(cli::calibration::spread_of(run, 2, 1), 0.0);
    EXPECT_EQ(cli::calibration::spread_of(run, 2, 9), 0.0);
    EXPECT_NEAR(cli::calibration::spread_of(run, 2), 0.03, 1e-9);
    run.passes.push_back(pass_of(0.02));
    EXPECT_NEAR(cli::calibration::spread_of(run, 2), 0.025, 1e-9); // the middle two's mean
}

namespace {

// Two probes that kept a forward and backward of 3 ms (width 128) and of 30 ms (width 512).
std::pair<cli::calibration::Probe, cli::calibration::Probe> kept_probes() {
    cli::calibration::Probe small{128, 2, 1, {}, {}}, large{512, 4, 2, {}, {}};
    small.forward = 1e-3;
    small.backward = 2e-3;
    large.forward = 10e-3;
    large.backward = 20e-3;
    return {small, large};
}

} // namespace

// A pass's pace is how its probes ran against the times they keep: a pass where every probe
// took 10% longer ran at 1.1, whatever the probes' sizes; where they disagree, their geometric
// mean (one probe twice as slow and one twice as fast: the kept pace).
TEST(Calibrate, APassesPaceIsItsProbesAgainstTheTimesTheyKeep) {
    auto [small, large] = kept_probes();
    small.passes = {3.3e-3, 3e-3, 1.5e-3};
    large.passes = {33e-3, 30e-3, 60e-3};
    const std::vector<double> pace = cli::calibration::pass_pace({small, large});
    ASSERT_EQ(pace.size(), 3u);
    EXPECT_NEAR(pace[0], 1.1, 1e-12);
    EXPECT_NEAR(pace[1], 1.0, 1e-12);
    EXPECT_NEAR(pace[2], 1.0, 1e-12);
    EXPECT_TRUE(cli::calibration::pass_pace({}).empty());
}

// A pipeline beyond the cores timed in two passes is timed a third time where the two ran more
// than a tenth apart at the probes' pace in each: a pass the probes ran 10% slow too says the
// machine was slow then, not the pipeline.
TEST(Calibrate, TwoPassesOfAPipelineMoreThanATenthApartAtThePacesAreTakenAThirdTime) {
    using cli::calibration::at_pace;
    using cli::calibration::passes_apart;
    const std::vector<double> pace = {1.0, 1.0, 0.98, 1.1};
    EXPECT_DOUBLE_EQ(at_pace(pace, 3), 1.1);
    EXPECT_DOUBLE_EQ(at_pace(pace, 4), 1.0); // beyond the probes' passes: the kept pace
    EXPECT_DOUBLE_EQ(at_pace(pace, -1), 1.0);
    EXPECT_DOUBLE_EQ(at_pace({0.0}, 0), 1.0);
    EXPECT_TRUE(passes_apart({{1, 0.100}, {2, 0.115}}, pace));  // 0.100 and 0.117
    EXPECT_FALSE(passes_apart({{1, 0.100}, {3, 0.115}}, pace)); // 0.100 and 0.105
    EXPECT_TRUE(passes_apart({{1, 0.130}, {3, 0.115}}, pace));  // 0.130 and 0.105
    EXPECT_FALSE(passes_apart({{1, 0.100}, {2, 0.107}}, pace));
    EXPECT_FALSE(passes_apart({{1, 0.100}}, pace)); // one pass: nothing to set it against
    EXPECT_FALSE(passes_apart({{1, 0.100}, {2, 0.2}, {4, 0.1}}, pace)); // three: their median
}

// A row timed in two passes keeps their mean: the upper of the two middle values would take the
// slower pass every time (a pipeline's row of two passes 120 and 131 ms at the probes' pace came
// out at 131). The probes keep the middle pass, or the mean of the two middle ones by their sum,
// forward and backward each.
TEST(Calibrate, AnEvenCountsMedianIsTheMeanOfItsTwoMiddleValues) {
    using cli::calibration::median_of;
    using cli::calibration::median_pass;
    EXPECT_EQ(median_of({}), 0.0);
    EXPECT_EQ(median_of({131.0, 120.0}), 125.5);
    EXPECT_EQ(median_of({4.0, 1.0, 3.0}), 3.0);
    EXPECT_EQ(median_of({4.0, 1.0, 3.0, 2.0}), 2.5);
    using Pass = std::pair<double, double>;
    EXPECT_EQ(median_pass({{1.0, 2.0}, {3.0, 1.0}, {2.0, 4.0}}), Pass(3.0, 1.0)); // sums 3, 4, 6
    // Sums 3, 4, 6 and 10: the mean of (3, 1) and (2, 4).
    EXPECT_EQ(median_pass({{5.0, 5.0}, {1.0, 2.0}, {3.0, 1.0}, {2.0, 4.0}}), Pass(2.5, 2.5));
    EXPECT_EQ(median_pass({}), Pass(0.0, 0.0));
}

// A core is priced at the cores' mean pace: a one-thread probe is held to one core, and the
// threads a session starts inherit the hold. Held to a core, a thread started meanwhile runs
// on it alone; afterwards the caller may use every core again.
TEST(Calibrate, AThreadHeldToACoreStartsThreadsOnIt) {
    const std::vector<int> cpus = cli::calibration::allowed_cpus();
    ASSERT_FALSE(cpus.empty());
    if (cpus.size() < 2) GTEST_SKIP() << "one CPU: nothing to hold a thread to";
    for (int cpu : {cpus[0], cpus.back()}) {
        int ran_on = -1, allowed = 0;
        {
            cli::calibration::OnCpu on(cpu);
            ASSERT_TRUE(on.held());
            std::thread([&] {
                cpu_set_t mask;
                CPU_ZERO(&mask);
                pthread_getaffinity_np(pthread_self(), sizeof mask, &mask);
                allowed = CPU_COUNT(&mask);
                ran_on = sched_getcpu();
            }).join();
        }
        EXPECT_EQ(allowed, 1) << cpu;
        EXPECT_EQ(ran_on, cpu);
        EXPECT_EQ(cli::calibration::allowed_cpus(), cpus);
    }
    cli::calibration::OnCpu none(-1);
    EXPECT_FALSE(none.held());
    EXPECT_EQ(cli::calibration::allowed_cpus(), cpus);
}

// Each CPU's pace over the cores' mean: probes whose runs on one CPU took 10% longer than on
// the other, whatever their sizes, give the two paces sqrt(1.1) apart either side of 1.
TEST(Calibrate, ACoresPaceIsItsHeldRunsAgainstTheCoresMean) {
    auto [small, large] = kept_probes();
    small.held = {{0, 3e-3}, {1, 3.3e-3}, {0, 3e-3}, {1, 3.3e-3}};
    large.held = {{0, 30e-3}, {1, 33e-3}};
    const std::vector<std::pair<int, double>> paces = cli::calibration::cpu_paces({small, large});
    ASSERT_EQ(paces.size(), 2u);
    EXPECT_EQ(paces[0].first, 0);
    EXPECT_EQ(paces[1].first, 1);
    EXPECT_NEAR(paces[1].second / paces[0].second, 1.1, 1e-12);
    EXPECT_NEAR(paces[0].second * paces[1].second, 1.0, 1e-12);
    // Runs on one CPU, or none held: nothing to set apart.
    small.held = large.held = {{0, 3e-3}};
    EXPECT_TRUE(cli::calibration::cpu_paces({small, large}).empty());
    small.held = large.held = {};
    EXPECT_TRUE(cli::calibration::cpu_paces({small, large}).empty());
}

// The heavier work that follows the probes' passes (pipelines beyond the cores, activations
// beyond the caches) runs after every other pass and the last, as many times as side_passes
// says: twice in a calibration's four passes, once in a quick one's one.
TEST(Calibrate, SideWorkFollowsEveryOtherProbePassAndTheLast) {
    for (int passes = 1; passes <= 8; ++passes) {
        int n = 0;
        for (int pass = 0; pass < passes; ++pass)
            n += cli::calibration::after_probe_pass(pass, passes);
        EXPECT_EQ(n, cli::calibration::side_passes(passes)) << passes << " passes";
        EXPECT_TRUE(cli::calibration::after_probe_pass(passes - 1, passes));
        EXPECT_EQ(cli::calibration::after_probe_pass(0, passes), passes == 1);
    }
    EXPECT_EQ(cli::calibration::side_passes(4), 2);
    EXPECT_EQ(cli::calibration::side_passes(6), 3);
    EXPECT_EQ(cli::calibration::side_passes(3), 2);
    EXPECT_EQ(cli::calibration::side_passes(1), 1);
}

// The probes of one thread beside those of every core: in each pass each one-thread probe runs
// on two cores, held to each in turn, and the pass keeps their mean; the probes of every core
// are not held. Each probe runs on both thread counts before the next one starts, and
// `after_pass` follows every pass.
TEST(Calibrate, OneThreadProbesRunOnEachCoreInTurn) {
    const std::vector<int> cpus = cli::calibration::allowed_cpus();
    if (cpus.size() < 2) GTEST_SKIP() << "one CPU: no turns to take";
    using cli::calibration::Probe;
    std::ostringstream err;
    cli::calibration::Progress progress(err, 12);
    std::vector<std::string> skipped;
    const std::vector<Probe> shapes = {{64, 1, 1, {}, {}}, {64, 1, 2, {}, {}}};
    const size_t passes = 3;
    std::vector<int> after;
    cli::calibration::Retakes retakes(10);
    const auto both =
        cli::calibration::run_probes(shapes, passes, true, "cpu", {2, 1}, progress, retakes,
                                     skipped, [&](int pass) { after.push_back(pass); });
    ASSERT_TRUE(skipped.empty()) << skipped[0];
    EXPECT_EQ(after, (std::vector<int>{0, 1, 2})); // every pass; after_probe_pass says for what
    ASSERT_EQ(both.size(), 2u);
    for (const Probe& pr : both[0]) {
        EXPECT_TRUE(pr.held.empty());
        EXPECT_EQ(pr.passes.size(), passes);
        ASSERT_EQ(pr.started.size(), passes);
    }
    ASSERT_EQ(both[1].size(), 2u);
    std::vector<double> order; // when each run began, pass by pass, probe by probe, all cores first
    for (size_t pass = 0; pass < passes; ++pass)
        for (size_t i = 0; i < shapes.size(); ++i)
            for (size_t t = 0; t < 2; ++t) {
                ASSERT_EQ(both[t][i].started.size(), passes);
                order.push_back(both[t][i].started[pass]);
            }
    EXPECT_TRUE(std::is_sorted(order.begin(), order.end()));
    EXPECT_EQ(std::adjacent_find(order.begin(), order.end()), order.end());
    for (const Probe& pr : both[1]) {
        ASSERT_EQ(pr.held.size(), 2 * passes);
        ASSERT_EQ(pr.passes.size(), passes);
        for (size_t pass = 0; pass < passes; ++pass) {
            const auto& a = pr.held[2 * pass];
            const auto& b = pr.held[2 * pass + 1];
            EXPECT_EQ(a.first, cpus[(2 * pass) % cpus.size()]);
            EXPECT_EQ(b.first, cpus[(2 * pass + 1) % cpus.size()]);
            EXPECT_NEAR(pr.passes[pass], (a.second + b.second) / 2, 1e-12 * pr.passes[pass]);
        }
        EXPECT_GT(pr.forward, 0);
        EXPECT_GT(pr.backward, 0);
    }
}

// With each probe's ends' share measured (timed unit by unit), the ends' scale is their
// measured seconds over their kernels', and each group's blocks fit the rest: known scales come
// back even where a group has one block count (nothing for a pair to tell apart), and a
// difference that would throw a pair's fit far off moves only its group's blocks.
TEST(Calibrate, MeasuredEndsSharesGiveTheEndsScale) {
    using cli::calibration::ActionPoint;
    const std::array<double, 2> blocks_scale{1.1, 1.3};
    const double ends_scale = 1.6;
    auto point = [&](size_t g, double blocks, double ends) {
        const double b = blocks_scale[g] * blocks, e = ends_scale * ends;
        return ActionPoint{blocks, ends, b + e, e / (b + e)};
    };
    std::vector<std::vector<ActionPoint>> groups = {{point(0, 0.004, 0.001)},
                                                    {point(1, 0.002, 0.0004)}};
    std::vector<double> s = cli::calibration::blocks_and_ends_scales(groups);
    ASSERT_EQ(s.size(), 3u);
    EXPECT_NEAR(s[0], blocks_scale[0], 1e-9);
    EXPECT_NEAR(s[1], blocks_scale[1], 1e-9);
    EXPECT_NEAR(s[2], ends_scale, 1e-9);

    // A pair whose one-block probe ran 5% slow: from the pair alone the ends' scale comes out
    // far from 1.6; with the shares it stays near, and the blocks take the difference.
    std::vector<std::vector<ActionPoint>> pair = {
        {point(0, 0.001, 0.0002), point(0, 0.004, 0.0002)}};
    pair[0][0].measured *= 1.05;
    std::vector<std::vector<ActionPoint>> unshared = pair;
    for (ActionPoint& q : unshared[0]) q.share = -1;
    const double fitted = cli::calibration::blocks_and_ends_scales(unshared)[1];
    s = cli::calibration::blocks_and_ends_scales(pair);
    EXPECT_GT(std::abs(fitted - ends_scale), 0.3);
    EXPECT_LT(std::abs(s[1] - ends_scale), 0.1);
    EXPECT_NEAR(s[0], blocks_scale[0], 0.05);
}

// A probe's model timed unit by unit: its ends (embedding before the blocks; final norm, head
// and loss after them) are the same units whatever its blocks, the blocks the rest of the
// whole model's units, as many for each block; the ends' share of a step is a part of it.
TEST(Calibrate, TheEndsShareOfAProbeIsTimedByItsUnits) {
    std::array<std::pair<size_t, size_t>, 2> ends;
    std::array<size_t, 2> units{};
    const std::array<int, 2> layers{1, 4};
    for (size_t k = 0; k < 2; ++k) {
        Program program;
        plan::Graph graph;
        cli::calibration::GptScript g;
        g.width = 64;
        g.layers = layers[k];
        ASSERT_EQ(cli::calibration::plan_script(cli::calibration::gpt_script(g), program, graph),
                  "");
        ends[k] = cli::calibration::end_units(program.model);
        units[k] = models::Stage(program.model, models::StageSpan::whole(program.model), 1)
                       .unit_parameters()
                       .size();
        const cli::calibration::EndsShare share = cli::calibration::ends_share(program, 2, 1);
        EXPECT_GT(share.forward, 0) << k;
        EXPECT_LT(share.forward, 1) << k;
        EXPECT_GT(share.backward, 0) << k;
        EXPECT_LT(share.backward, 1) << k;
        // The embeddings are a part of the ends, the head and loss the rest.
        EXPECT_GT(share.first_forward, 0) << k;
        EXPECT_LT(share.first_forward, share.forward) << k;
        EXPECT_GT(share.first_backward, 0) << k;
        EXPECT_LT(share.first_backward, share.backward) << k;
    }
    EXPECT_EQ(ends[0], ends[1]);
    EXPECT_GE(ends[0].first, 1u);  // the embedding
    EXPECT_GE(ends[0].second, 2u); // at least the head and the loss
    const size_t per_block = units[0] - ends[0].first - ends[0].second;
    EXPECT_GE(per_block, 1u);
    EXPECT_EQ(units[1], ends[1].first + ends[1].second + 4 * per_block);
}

// A block costs more beside others in its stage than alone (the stage's activations further
// from the caches): a width and token count probed at two counts of blocks is priced at a
// stage's blocks between them by log blocks, beyond them at the nearest; without blocks, at
// the most probed. Tokens and width come after: each token count at the blocks, then between.
TEST(Rates, WholeActionsFollowTheBlocksOfAStage) {
    Calibration c;
    c.cores = 2;
    c.by_width = {{2, {1, 1, 1, 1}, {0, 0}, 128, 512, {0, 0}, 1},
                  {2, {2, 2, 2, 2}, {0, 0}, 128, 512, {0, 0}, 4},
                  {2, {3, 3, 3, 3}, {0, 0}, 128, 128, {0, 0}, 1},
                  {2, {5, 5, 5, 5}, {0, 0}, 128, 128, {0, 0}, 4}};
    auto scale = [&](double tokens, double blocks) {
        return c.whole_actions(2, 128, tokens, blocks).scales[0];
    };
    EXPECT_DOUBLE_EQ(scale(512, 1), 1);
    EXPECT_DOUBLE_EQ(scale(512, 4), 2);
    EXPECT_NEAR(scale(512, 2), 1.5, 1e-12);
    EXPECT_DOUBLE_EQ(scale(512, 8), 2);
    EXPECT_DOUBLE_EQ(scale(512, 0), 2);
    EXPECT_DOUBLE_EQ(scale(128, 1), 3);
    // 256 tokens, 2 blocks: 1.5 at 512 tokens, 4 at 128, halfway in log tokens.
    EXPECT_NEAR(scale(256, 2), 2.75, 1e-12);
    // A row without blocks (a profile before them) serves every count.
    c.by_width = {{2, {1, 1, 1, 1}, {0, 0}, 128, 512}};
    EXPECT_DOUBLE_EQ(scale(512, 1), 1);
    EXPECT_DOUBLE_EQ(scale(512, 4), 1);
    // A stage is priced at its own blocks: two probes of one block and of four, at scales 1 and
    // 2, price a stage of four blocks' blocks at twice their kernels, and one of one at once.
    c.by_width = {{2, {1, 1, 1, 1}, {0, 0}, 128, 128, {0, 0}, 1},
                  {2, {2, 1, 2, 1}, {0, 0}, 128, 128, {0, 0}, 4}};
    for (int32_t t : {1, 2})
        for (const char* k : {"nt", "nn", "tn"}) c.matmul.push_back({k, 64, 64, 64, t, 1e10});
    c.attention.push_back({64, 64, 1, 1e10, 1e10});
    c.elementwise.push_back({"copy", 1024, 1, 1e9, 1e9});
    sim::Rates rates(c);
    for (int32_t blocks : {1, 4}) {
        Program p = checked("gpt_tiny.dist", {"model.layers=" + std::to_string(blocks),
                                              "train.batch=4", "schedule.microbatches=2"});
        PlanStage s = lower(p).graph->stages[0];
        const double whole = sim::stage_seconds(p, s, rates, 2).forward;
        s.embedding = s.head = false;
        const double kernels = sim::stage_seconds(p, s, rates, 2, false).forward;
        PlanStage ends = lower(p).graph->stages[0];
        ends.blocks = 0;
        const double ends_kernels = sim::stage_seconds(p, ends, rates, 2, false).forward;
        EXPECT_NEAR(whole, (blocks == 4 ? 2 : 1) * kernels + ends_kernels, 1e-9 * whole) << blocks;
    }
}

// Small microbatches cost less beyond their kernels than large ones (their activations stay
// nearer the cores): a width probed at two token counts is priced at a microbatch's tokens
// between them by log tokens, outside them at the nearest; without tokens, at the most probed.
// The width comes after: each width at the tokens, then between the widths.
TEST(Rates, WholeActionsFollowTheTokensOfAMicrobatch) {
    Calibration c;
    c.cores = 2;
    c.by_width = {{2, {1, 1, 1, 1}, {0, 0}, 128, 512},
                  {2, {2, 2, 2, 2}, {0, 0}, 128, 128},
                  {2, {4, 4, 4, 4}, {0, 0}, 512, 256}};
    auto scale = [&](double width, double tokens) {
        return c.whole_actions(2, width, tokens).scales[0];
    };
    EXPECT_DOUBLE_EQ(scale(128, 512), 1);
    EXPECT_DOUBLE_EQ(scale(128, 128), 2);
    EXPECT_NEAR(scale(128, 256), 1.5, 1e-12);
    EXPECT_DOUBLE_EQ(scale(128, 4096), 1);
    EXPECT_DOUBLE_EQ(scale(128, 64), 2);
    EXPECT_DOUBLE_EQ(scale(128, 0), 1);
    // Width 256 at 256 tokens: 1.5 at width 128, 4 at 512 (one token count), halfway.
    EXPECT_NEAR(scale(256, 256), 2.75, 1e-12);
    // A stage's microbatch: gpt_tiny's 64-token sequences, 16 of them in 4 microbatches on 2
    // data-parallel ranks, so 2 sequences (128 tokens) each.
    c.by_width.pop_back();
    for (int32_t t : {1, 2})
        for (const char* k : {"nt", "nn", "tn"}) c.matmul.push_back({k, 64, 64, 64, t, 1e10});
    c.attention.push_back({64, 64, 1, 1e10, 1e10});
    c.elementwise.push_back({"copy", 1024, 1, 1e9, 1e9});
    sim::Rates rates(c);
    Program p =
        checked("gpt_tiny.dist", {"mesh.dp=2", "train.batch=16", "schedule.microbatches=4"});
    EXPECT_DOUBLE_EQ(sim::microbatch_tokens(p), 128);
    PlanStage s = lower(p).graph->stages[0];
    const sim::StageSeconds kernels = sim::stage_seconds(p, s, rates, 2, false);
    const sim::StageSeconds whole = sim::stage_seconds(p, s, rates, 2, true);
    EXPECT_NEAR(whole.forward, 2 * kernels.forward, 1e-12 * kernels.forward);
}

// A count or a size that is not whole is refused where it is written, not truncated: a
// 64.5-row attention block would otherwise price as 64; 8e10 bytes is whole and loads.
TEST(Rates, AProfileWithAFractionalCountIsRefusedWhereItIs) {
    TempDir dir("fraction");
    auto write = [&](const std::string& name, const std::string& block) {
        fs::path file = dir.path / (name + ".toml");
        std::ofstream(file) << "name = \"" << name << "\"\n"
                            << "[compute]\npeak_flops_f32 = 1e11\npeak_flops_bf16 = 1e11\n"
                            << block
                            << "\n[memory]\nbytes = 8e10\nbandwidth = 1e10\n"
                               "[links.intra_host]\nbandwidth = 1e10\nlatency = 1e-6\n"
                               "[links.inter_host]\nbandwidth = 1e9\nlatency = 1e-5\n";
        return file;
    };
    lang::SourceManager sources;
    lang::Diagnostics diags;
    auto good = lang::load_profile(write("whole", "attention_block = 64.0"), sources, diags);
    ASSERT_TRUE(good.has_value()) << diags.render(sources);
    EXPECT_EQ(good->attention_block, 64);
    EXPECT_EQ(good->memory_bytes, 80'000'000'000);
    EXPECT_FALSE(lang::load_profile(write("half", "attention_block = 64.5"), sources, diags));
    std::string report = diags.render(sources);
    EXPECT_NE(report.find("half.toml:5:19:"), std::string::npos) << report;
    EXPECT_NE(report.find("`compute.attention_block` must be a whole number"), std::string::npos)
        << report;
    // A calibration's core cache is a size in bytes too.
    fs::path cache = dir.path / "cache.toml";
    std::ofstream(cache) << calibrated_head("cache") << "cache_bytes = 2097152.5\n"
                         << "matmul = [ { kernel = \"nt\", m = 32, n = 32, k = 32, threads = 1, "
                            "flops = 1e10, warm = 2e10 } ]\n"
                            "sharing = [ { threads = 2, speed = 0.9 } ]\n";
    report = refusal(cache);
    EXPECT_NE(report.find("`calibration.cache_bytes` must be a whole number"), std::string::npos)
        << report;
}

// The reuse rows from the runs' times: each GPipe's backwards beyond 1F1B's in the same turn
// (a turn's pace moves both alike), per byte of a microbatch's activations A, at the distance
// of its backwards (one, three and seven microbatches' activations); a nearer distance's cost
// where a farther one came out lower (the second run here); the forwards' cost a factor of the
// backwards' that the runs' forwards, made at that factor, give back. A thread count whose
// GPipes were no slower has no rows.
TEST(Calibrate, ReuseRowsFromTheRunsTimes) {
    using namespace cli::calibration;
    std::vector<std::string> skipped;
    ReuseRuns runs = reuse_runs({2, 1}, false, skipped);
    ASSERT_EQ(runs.runs.size(), 4u) << (skipped.empty() ? "" : skipped.front());
    EXPECT_EQ(runs.runs[0].schedule, "1f1b");
    const double a = static_cast<double>(runs.runs[1].graph.stages[0].activation_bytes);
    ASSERT_GT(a, 0);
    const std::vector<ReuseRow> expected{
        {2, a, 0, 1e-10}, {2, 3 * a, 0, 1e-10}, {2, 7 * a, 0, 2e-10}};
    const double beyond[] = {1e-10, 0.8e-10, 2e-10}; // each GPipe's backward, per byte
    const double phi = 0.5;
    Calibration curve;
    curve.reuse = expected;
    for (size_t i = 0; i < runs.runs.size(); ++i) {
        ReuseRun& run = runs.runs[i];
        double forward = 0;
        if (i > 0) { // the mean over its forwards of their cost at phi
            const std::vector<double> d = sim::reuse_distances(run.graph, run.graph.ranks[0]);
            int n = 0;
            for (size_t k = 0; k < d.size(); ++k)
                if (run.graph.ranks[0].actions[k].kind == ActionKind::forward)
                    forward += phi * a * curve.reuse_cost(2, d[k], true), ++n;
            forward /= n;
        }
        for (double turn : {0.0, 1e-4, -2e-4}) {
            run.passes[0].push_back(
                {1e-3 + turn + forward, 2e-3 + turn + (i > 0 ? a * beyond[i - 1] : 0.0)});
            run.passes[1].push_back({1e-3 + turn, 2e-3 + turn - (i > 0 ? 1e-5 : 0.0)});
        }
    }
    std::vector<std::string> notes;
    const std::vector<ReuseRow> rows = fit_reuse(runs, Calibration{}, notes); // no copies: unbound
    ASSERT_EQ(rows.size(), 3u);
    ASSERT_EQ(notes.size(), 7u); // the shape, then each GPipe on each thread count
    EXPECT_EQ(notes[0], "a GPT of 4 blocks, width 128, 256 tokens a microbatch:");
    EXPECT_EQ(notes[1].rfind("2 threads, gpipe over 2 microbatches: ", 0), 0u) << notes[1];
    EXPECT_EQ(notes[4].rfind("1 thread, gpipe over 2 microbatches: ", 0), 0u) << notes[4];
    for (size_t i = 0; i < rows.size(); ++i) {
        EXPECT_EQ(rows[i].threads, 2);
        EXPECT_DOUBLE_EQ(rows[i].distance, expected[i].distance);
        EXPECT_NEAR(rows[i].backward, expected[i].backward, 1e-9 * expected[i].backward);
        EXPECT_NEAR(rows[i].forward, phi * expected[i].backward, 1e-6 * expected[i].backward);
    }
}

// A GPipe's backward beyond 1F1B's is a difference of two timings: beside other load it can
// be milliseconds on a microbatch of a few hundred kilobytes. Each row's cost a byte is then
// at most twice a copy's at the largest copy measured on its threads (its stash read twice,
// from memory at worst), and a note says so; a cost below that stays as measured.
TEST(Calibrate, ReuseRowsAreBoundedByCopyingTheirBytes) {
    using namespace cli::calibration;
    std::vector<std::string> skipped;
    ReuseRuns runs = reuse_runs({2, 1}, true, skipped);
    ASSERT_EQ(runs.runs.size(), 2u) << (skipped.empty() ? "" : skipped.front());
    const double a = static_cast<double>(runs.runs[1].graph.stages[0].activation_bytes);
    ASSERT_GT(a, 0);
    // Copies of 1e9 elements a second on one thread and 2e9 on two at their largest (a smaller
    // copy, faster, is not the one that bounds): a byte copied in 0.25 and 0.125 ns.
    Calibration rates;
    for (int32_t t : {1, 2}) {
        rates.elementwise.push_back({"copy", 1024, t, 8e9, 8e9});
        rates.elementwise.push_back({"copy", 1 << 22, t, 1e9 * t, 1e9 * t});
    }
    const double twice_a_copy[] = {2 * 0.125e-9, 2 * 0.25e-9}; // threads 2, 1
    // Two threads: 5 ms beyond on a bytes (far beyond the bound); one: 0.1 ns a byte (within).
    const double beyond[] = {5e-3, 0.1e-9 * a};
    for (size_t i = 0; i < runs.runs.size(); ++i)
        for (size_t t = 0; t < 2; ++t)
            runs.runs[i].passes[t].push_back({1e-3, 2e-3 + (i > 0 ? beyond[t] : 0.0)});
    std::vector<std::string> notes;
    const std::vector<ReuseRow> rows = fit_reuse(runs, rates, notes);
    ASSERT_EQ(rows.size(), 2u);
    EXPECT_EQ(rows[0].threads, 2);
    EXPECT_NEAR(rows[0].backward, twice_a_copy[0], 1e-9 * twice_a_copy[0]);
    EXPECT_EQ(rows[1].threads, 1);
    EXPECT_NEAR(rows[1].backward, 0.1e-9, 1e-6 * 0.1e-9);
    EXPECT_LT(rows[1].backward, twice_a_copy[1]);
    size_t bounded = 0;
    for (const std::string& n : notes)
        if (n.find("bounded at twice a copy's: ") != std::string::npos) {
            ++bounded;
            EXPECT_EQ(n.rfind("2 threads: ", 0), 0u) << n;
        }
    EXPECT_EQ(bounded, 1u);
    // Priced in a profile, a backward of a stash a hundred times larger costs at most twice
    // copying it.
    Calibration c = rates;
    c.reuse = rows;
    EXPECT_LE(100 * a * c.reuse_cost(2, 100 * a, true), 100 * a * twice_a_copy[0] * (1 + 1e-9));
}

// The split rows from the runs' times: the zb_h1 run trains each microbatch's F, I and W in
// turn on its one rank. Its I at 0.6 and W at 0.45 of the reference's whole backward in every
// turn (the turns at different paces) make a row whose factors, in the simulator, price the
// run's I and W at 0.6 and 0.45 of the reference's priced backward. A thread count whose split
// run has no I timed has no row.
TEST(Calibrate, SplitRowsFromTheRunsTimes) {
    using namespace cli::calibration;
    std::vector<std::string> skipped;
    ReuseRuns runs = reuse_runs({2, 1}, false, skipped);
    ASSERT_TRUE(runs.split.has_value()) << (skipped.empty() ? "" : skipped.front());
    EXPECT_EQ(runs.split->schedule, "zb_h1");
    const PlanRank& rank = runs.split->graph.ranks[0];
    std::vector<ActionKind> kinds;
    for (const plan::PlanAction& a : rank.actions)
        if (a.kind != ActionKind::step) kinds.push_back(a.kind);
    ASSERT_EQ(kinds.size(), 12u);
    for (size_t i = 0; i < kinds.size(); ++i)
        EXPECT_EQ(kinds[i], (std::array{ActionKind::forward, ActionKind::backward_input,
                                        ActionKind::backward_weight})[i % 3])
            << i;
    for (double pace : {1.0, 1.1, 0.8}) {
        const double whole = 2e-3 * pace;
        runs.runs[0].passes[0].push_back({1e-3 * pace, whole});
        runs.runs[0].passes[1].push_back({1e-3 * pace, whole});
        runs.split->passes[0].push_back({1e-3 * pace, 1.05 * whole});
        runs.split->inputs[0].push_back(0.6 * whole);
        runs.split->passes[1].push_back({1e-3 * pace, 1.05 * whole});
        runs.split->inputs[1].push_back(-1);
    }
    const Calibration cal = two_cores({}, {});
    std::vector<std::string> notes;
    const std::vector<SplitRow> rows = fit_split(runs, cal, notes);
    ASSERT_EQ(rows.size(), 1u);
    EXPECT_EQ(rows[0].threads, 2);
    ASSERT_EQ(notes.size(), 1u);
    EXPECT_EQ(notes[0].rfind("2 threads: I 0.6 and W 0.45 of the whole backward, whose kernels "
                             "give I ",
                             0),
              0u)
        << notes[0];
    auto spans = [&](const ReuseRun& run, ActionKind kind) {
        Program q = run.program;
        q.mesh.profile.calibration = cal;
        q.mesh.profile.calibration.split_backward = rows;
        sim::SimResult r = sim::simulate(run.graph, q);
        EXPECT_TRUE(r.ok());
        std::vector<double> out;
        if (!r.ok()) return out;
        for (const sim::Span& s : r.timeline->ranks[0].spans)
            if (run.graph.ranks[0].actions[s.action].kind == kind) out.push_back(s.end - s.start);
        return out;
    };
    const std::vector<double> whole = spans(runs.runs[0], ActionKind::backward);
    const std::vector<double> input = spans(*runs.split, ActionKind::backward_input);
    const std::vector<double> weight = spans(*runs.split, ActionKind::backward_weight);
    ASSERT_EQ(whole.size(), 4u);
    ASSERT_EQ(input.size(), 4u);
    ASSERT_EQ(weight.size(), 4u);
    for (size_t i = 0; i < 4; ++i) {
        EXPECT_NEAR(input[i], 0.6 * whole[i], 1e-9 * whole[i]) << i;
        EXPECT_NEAR(weight[i], 0.45 * whole[i], 1e-9 * whole[i]) << i;
    }
}

// `dist calibrate --quick` measures this machine, writes a profile that loads with every number
// positive and every grid complete, and `devices: NAME` then finds it and prices plans by it.
TEST(Calibrate, WritesAProfileThatLoadsAndPricesPlans) {
    TempDir dir("quick");
    fs::create_directories(dir.path / "hardware");
    fs::path file = dir.path / "hardware" / "quick.toml";
    Result r =
        run(std::string(DIST_BINARY) + " calibrate --quick --device cpu --out " + file.string());
    ASSERT_EQ(r.status, 0) << r.out;
    EXPECT_NE(r.out.find("calibrate: matmuls"), std::string::npos) << r.out; // progress
    EXPECT_NE(r.out.find("`devices: quick` finds it"), std::string::npos) << r.out;
    lang::SourceManager sources;
    lang::Diagnostics diags;
    auto p = lang::load_profile(file, sources, diags);
    ASSERT_TRUE(p.has_value()) << diags.render(sources);
    const Calibration& c = p->calibration;
    EXPECT_GE(c.cores, 1);
    EXPECT_NE(c.command.find("dist calibrate --out "), std::string::npos);
    EXPECT_FALSE(c.date.empty());
    // Every kernel at every point of the grid for every thread count.
    std::map<std::pair<std::string, int32_t>, std::set<std::array<int64_t, 3>>> grid;
    for (const MatmulRate& m : c.matmul) {
        grid[{m.kernel, m.threads}].insert({m.m, m.n, m.k});
        EXPECT_GT(m.warm, 0) << m.kernel << " " << m.m << " " << m.n << " " << m.k; // both ways
    }
    ASSERT_EQ(grid.size() % 3, 0u);
    for (const auto& [key, shapes] : grid) EXPECT_EQ(shapes.size(), 8u) << key.first;
    std::set<std::string> ops;
    for (const StreamRate& e : c.elementwise) ops.insert(e.op);
    for (const char* op : {"layernorm", "gelu", "cross_entropy", "copy", "adamw", "embedding"})
        EXPECT_TRUE(ops.count(op)) << op;
    EXPECT_FALSE(c.attention.empty());
    // Two working sets, each from 2 workers to twice the cores, then three and four times.
    ASSERT_EQ(c.sharing.size(), static_cast<size_t>(2 * (2 * c.cores + 1)));
    std::map<double, std::vector<int32_t>> sets;
    for (const SharingPoint& s : c.sharing) {
        EXPECT_GT(s.speed, 0);
        sets[s.bytes].push_back(s.threads);
    }
    ASSERT_EQ(sets.size(), 2u);
    EXPECT_DOUBLE_EQ(sets.begin()->first, sharing_default_bytes);
    EXPECT_GT(sets.rbegin()->first, 4 * sets.begin()->first);
    EXPECT_EQ(sets.begin()->second, sets.rbegin()->second);
    EXPECT_EQ(sets.begin()->second.back(), 4 * c.cores);
    // Two threads held to one core took turns: the scheduler's slice, milliseconds long.
    EXPECT_GT(c.slice_s, 0);
    EXPECT_LT(c.slice_s, 0.5);
    // A blocked thread woke: a wake-up was measured, in seconds (a fraction of one, however
    // busy the machine).
    EXPECT_GT(c.wake_s, 0);
    EXPECT_LT(c.wake_s, 0.5);
    std::set<std::string> transports;
    for (const TransferSample& t : c.transfers) transports.insert(t.transport);
    EXPECT_TRUE(transports.count("inprocess"));
    // A message of fewer bytes never takes longer than one of more of its kind.
    std::map<std::string, std::map<int64_t, double>> sent;
    for (const TransferSample& t : c.transfers) sent[t.transport][t.bytes] = t.seconds;
    std::map<std::tuple<std::string, std::string, int32_t>, std::map<int64_t, double>> reduced;
    for (const CollectiveSample& s : c.collectives)
        reduced[{s.backend, s.op, s.ranks}][s.bytes] = s.seconds;
    auto ordered = [](const std::map<int64_t, double>& by_bytes) {
        double last = 0;
        for (const auto& [bytes, seconds] : by_bytes) {
            if (!(seconds > 0) || seconds < last) return false;
            last = seconds;
        }
        return true;
    };
    for (const auto& [transport, rows] : sent) EXPECT_TRUE(ordered(rows)) << transport;
    for (const auto& [kind, rows] : reduced)
        EXPECT_TRUE(ordered(rows)) << std::get<0>(kind) << " " << std::get<1>(kind);
    // Between processes a collective's steps wait for a core beside busy threads: measured,
    // and shorter than a second.
    EXPECT_GT(c.collective_wait_s, 0);
    EXPECT_LT(c.collective_wait_s, 1.0);
    // Every collective the runtime runs, the mixture of experts' all-to-all too, on each backend
    // measured, at every size.
    std::map<std::string, std::map<std::string, std::set<int64_t>>> collectives;
    for (const CollectiveSample& s : c.collectives) collectives[s.backend][s.op].insert(s.bytes);
    EXPECT_TRUE(collectives.count("inprocess"));
    for (const auto& [backend, ops] : collectives) {
        EXPECT_EQ(ops.size(), 4u) << backend;
        for (const char* op : {"all_reduce", "reduce_scatter", "all_gather", "all_to_all"})
            EXPECT_EQ(ops.count(op) ? ops.at(op) : std::set<int64_t>{},
                      collectives.at("inprocess").at("all_reduce"))
                << backend << " " << op;
    }
    // The datasheet fields come from the measurements.
    EXPECT_GT(p->peak_flops_f32, 0);
    EXPECT_GT(p->memory_bandwidth, 0);
    // The probes trained on all the cores and, where there are several, on one thread.
    ASSERT_EQ(c.fewer_threads.size(), c.cores > 1 ? 1u : 0u);
    for (const WholeActions& a : c.fewer_threads) {
        EXPECT_EQ(a.threads, 1);
        for (double s : a.scales) EXPECT_GT(s, 0);
        for (double o : a.block_overhead_s) EXPECT_GE(o, 0);
    }
    // Each pipeline of ranks beyond the cores (and each of them in tensor-parallel groups) says
    // what share of its step it idled, measured and simulated at its fitted work, and what share
    // of the cores' time its threads ran on them (their CPU clocks; the simulator's turns): some,
    // and no more than all of it.
    std::ifstream written(file);
    const std::regex row(R"(^  \{ ranks_per_core = [0-9]+, width = [0-9]+(?:, tp = 2)?, )"
                         R"(work = [^ ]+ \}, # )"
                         R"(step .* bubble ([^ ]+)% measured, ([^ ]+)% simulated; )"
                         R"(cores busy ([^ ]+)% measured, ([^ ]+)% simulated; passes )");
    size_t rows = 0;
    for (std::string line; std::getline(written, line);)
        if (std::smatch m; std::regex_search(line, m, row)) {
            ++rows;
            for (size_t k : {1, 2}) {
                EXPECT_GE(std::stod(m[k].str()), 0) << line;
                EXPECT_LT(std::stod(m[k].str()), 100) << line;
            }
            for (size_t k : {3, 4}) {
                EXPECT_GT(std::stod(m[k].str()), 0) << line;
                EXPECT_LE(std::stod(m[k].str()), 100.5) << line;
            }
        }
    EXPECT_EQ(rows, c.oversubscribed.size());
    EXPECT_EQ(rows, c.cores > 1 ? 4u : 0u);
    // The probes' one width probed twice, of one block and of two, on each thread count: a row
    // for each probe, its blocks at their own scale beside the ends' (or, where the ends' scale
    // came out negative on a busy machine, one row for the pair), which prices a rank of that
    // count at that width and that many blocks.
    std::map<int32_t, std::set<int32_t>> rows_blocks; // thread count: its rows' blocks
    for (const WholeActions& a : c.by_width) {
        EXPECT_EQ(a.width, 64);
        EXPECT_TRUE(a.threads == c.cores || a.threads == 1) << a.threads;
        rows_blocks[a.threads].insert(a.blocks);
        for (double s : a.scales) EXPECT_GT(s, 0);
        // The embeddings' scales, timed apart: both or neither.
        EXPECT_EQ(a.first_end[0] > 0, a.first_end[1] > 0);
        EXPECT_EQ(c.whole_actions(a.threads, 64, 64, a.blocks).scales, a.scales);
        EXPECT_EQ(c.whole_actions(a.threads, 64, 64, a.blocks).first_end, a.first_end);
    }
    ASSERT_EQ(rows_blocks.size(), c.cores > 1 ? 2u : 1u);
    for (const auto& [threads, blocks] : rows_blocks)
        EXPECT_TRUE(blocks == std::set<int32_t>({1, 2}) || blocks == std::set<int32_t>({0}))
            << threads;
    // Each probe's own row prices its stage, on its threads with the profile's rates (warm
    // where its weights fit the cores' caches, as the fit priced it), at what it measured
    // (written to the microsecond, its scales to four digits: within a few microseconds, or a
    // thousandth where a loaded machine made the probe's actions hundreds of milliseconds).
    {
        std::ifstream notes(file);
        const std::regex probe(R"(^#   (1 thread, )?width 64, 64 tokens, ([0-9]+) blocks: )"
                               R"(F ([0-9.]+) ms \(kernels [0-9.]+\), B ([0-9.]+) ms)");
        sim::Rates rates(c);
        size_t priced = 0;
        for (std::string line; std::getline(notes, line);) {
            std::smatch m;
            if (!std::regex_search(line, m, probe)) continue;
            const int32_t threads = m[1].matched ? 1 : c.cores;
            if (!rows_blocks[threads].count(std::stoi(m[2].str()))) continue; // one row a pair
            Program q = checked("gpt_tiny.dist", {"model.width=64", "model.layers=" + m[2].str(),
                                                  "train.batch=2", "schedule.microbatches=2"});
            const sim::StageSeconds t =
                sim::stage_seconds(q, lower(q).graph->stages[0], rates, threads);
            const double f = std::stod(m[3].str()), b = std::stod(m[4].str());
            EXPECT_NEAR(1e3 * t.forward, f, std::max(3e-3, 1e-3 * f)) << line;
            EXPECT_NEAR(1e3 * (t.input + t.weight), b, std::max(3e-3, 1e-3 * b)) << line;
            ++priced;
        }
        EXPECT_GT(priced, 0u);
    }
    // Activations beyond the caches: a row for each thread count where GPipe's backwards came
    // out slower than 1F1B's (a quick calibration times it once), at a distance of one
    // microbatch's activations, the forwards' cost within twice the backwards' (each written to
    // four digits).
    for (const ReuseRow& row : c.reuse) {
        EXPECT_TRUE(row.threads == c.cores || row.threads == 1) << row.threads;
        EXPECT_GT(row.distance, 0);
        EXPECT_GT(row.backward, 0);
        // At most twice a byte's copy at the largest copy measured (to four digits).
        const double copy = sim::Rates(c).elementwise("copy", 1e18, row.threads, false);
        EXPECT_LE(row.backward, 2.0 / (4 * copy) * (1 + 2e-3)) << row.threads;
        EXPECT_GE(row.forward, 0);
        EXPECT_LE(row.forward, 2 * row.backward * (1 + 2e-3));
    }

    // Backwards split: a row for each thread count, whose factors are its note's I and W
    // shares of the whole backward over the kernels' (each written to four digits).
    {
        ASSERT_EQ(c.split_backward.size(), c.cores > 1 ? 2u : 1u);
        std::ifstream notes(file);
        const std::regex note(R"(^#   ([0-9]+) threads?: I ([0-9.e-]+) and W ([0-9.e-]+) of the )"
                              R"(whole backward, whose kernels give I ([0-9.e-]+) of it$)");
        size_t said = 0;
        for (std::string line; std::getline(notes, line);) {
            std::smatch m;
            if (!std::regex_search(line, m, note)) continue;
            const int32_t threads = std::stoi(m[1].str());
            const double input = std::stod(m[2].str()), weight = std::stod(m[3].str()),
                         share = std::stod(m[4].str());
            const auto row = std::find_if(c.split_backward.begin(), c.split_backward.end(),
                                          [&](const SplitRow& r) { return r.threads == threads; });
            ASSERT_NE(row, c.split_backward.end()) << line;
            EXPECT_NEAR(row->input, input / share, 2e-3 * row->input) << line;
            EXPECT_NEAR(row->weight, weight / (1 - share), 2e-3 * row->weight) << line;
            ++said;
        }
        EXPECT_EQ(said, c.split_backward.size());
    }

    // Found by name through DIST_PATH; a deeper model takes longer, on the same rates.
    std::string sim = "DIST_PATH=" + dir.path.string() + " " + DIST_BINARY + " sim " +
                      DIST_SOURCE_DIR + "/examples/gpt_tiny.dist --json --set mesh.devices=quick";
    Result four = run(sim), eight = run(sim + " --set model.layers=8");
    ASSERT_EQ(four.status, 0) << four.out;
    ASSERT_EQ(eight.status, 0) << eight.out;
    double t4 = nlohmann::json::parse(four.out)["step_time_s"].get<double>();
    double t8 = nlohmann::json::parse(eight.out)["step_time_s"].get<double>();
    EXPECT_GT(t4, 0);
    EXPECT_GT(t8, 1.5 * t4);
    // `dist run` on it times one of its matmuls again around the run, the squarest forward of
    // the quick grid (32 and 256, one thread), and says how it ran against its calibrated rate.
    auto run_on_quick = [&](const std::string& more) {
        return run("DIST_PATH=" + dir.path.string() + " " + DIST_BINARY + " run " +
                   DIST_SOURCE_DIR +
                   "/examples/gpt_tiny.dist --quiet --set mesh.devices=quick --set "
                   "model.width=32 --set train.batch=4 --set 'train.data=synthetic()' --set "
                   "train.stop_after=2" +
                   more);
    };
    Result ran = run_on_quick("");
    ASSERT_EQ(ran.status, 0) << ran.out;
    const size_t pace = ran.out.find("\npace: the profile's nt matmul 256 x 256 x 256 on 1 thread "
                                     "ran at ");
    ASSERT_NE(pace, std::string::npos) << ran.out;
    EXPECT_NE(ran.out.find("its calibrated rate (" + c.date.substr(0, 10) +
                               ") before and after the run; ",
                           pace),
              std::string::npos)
        << ran.out;
    // The profile names that row, timed as a run times it before and after the probes' pass
    // (a quick calibration's one: its pace is the times kept), at their geometric mean.
    {
        ASSERT_TRUE(c.pace);
        EXPECT_EQ(std::make_tuple(c.pace->kernel, c.pace->m, c.pace->n, c.pace->k, c.pace->threads),
                  std::make_tuple(std::string("nt"), 256, 256, 256, 1));
        std::ifstream notes(file);
        const std::regex timings(R"(^#   pass 1: ([0-9.e+]+) and ([0-9.e+]+)$)");
        size_t said = 0;
        for (std::string line; std::getline(notes, line);)
            if (std::smatch m; std::regex_search(line, m, timings)) {
                ++said;
                const double mean = std::sqrt(std::stod(m[1].str()) * std::stod(m[2].str()));
                EXPECT_NEAR(c.pace->warm, mean, 2e-3 * mean) << line;
            }
        EXPECT_EQ(said, 1u);
    }
    // In two processes the launcher times it, before they start and after they have ended:
    // one line, its own, not a process's.
    Result apart_run = run_on_quick(" --procs 2 --set mesh.pp=2");
    ASSERT_EQ(apart_run.status, 0) << apart_run.out;
    const size_t launcher_pace =
        apart_run.out.find("\npace: the profile's nt matmul 256 x 256 x 256 on 1 thread ran at ");
    ASSERT_NE(launcher_pace, std::string::npos) << apart_run.out;
    EXPECT_EQ(apart_run.out.find("pace:", launcher_pace + 6), std::string::npos) << apart_run.out;
    EXPECT_EQ(apart_run.out.find("] pace:"), std::string::npos) << apart_run.out;

    // Ranks beyond the cores: rows of 2 and 4 ranks a core at the probes' width where there are
    // several cores, of pipelines and of tensor-parallel groups of 2 along them. A plan of that
    // many single-threaded ranks a core (of the row's groups) costs its actions the row's factor
    // more than with the row taken out; one with a rank per core is priced alike either way.
    ASSERT_EQ(c.oversubscribed.size(), c.cores > 1 ? 4u : 0u);
    EXPECT_EQ(std::count_if(c.oversubscribed.begin(), c.oversubscribed.end(),
                            [](const OversubscribedRow& row) { return row.tp == 2; }),
              c.cores > 1 ? 2 : 0);
    // The simulated step of `ranks` single-threaded ranks (a pipeline, or tensor-parallel
    // groups of `tp` along one; two blocks a stage, width 64) with the profile's
    // `oversubscribed` rows replaced by `rows`.
    auto priced_with = [&](int32_t ranks, const std::vector<OversubscribedRow>& rows,
                           int32_t tp = 1) {
        const int32_t pp = std::max(1, ranks / tp);
        Program q = checked("gpt_tiny.dist",
                            {"model.layers=" + std::to_string(2 * pp), "model.width=64",
                             "mesh.pp=" + std::to_string(pp), "mesh.tp=" + std::to_string(tp),
                             "schedule.microbatches=" + std::to_string(2 * pp),
                             "train.batch=" + std::to_string(4 * pp)});
        q.mesh.profile = *p;
        q.mesh.profile.calibration.oversubscribed = rows;
        sim::SimResult r = sim::simulate(*lower(q).graph, q);
        return r.ok() ? r.timeline->step_time_s : -1.0;
    };
    for (const OversubscribedRow& row : c.oversubscribed) {
        EXPECT_EQ(row.width, 64);
        EXPECT_GT(row.work, 0);
        auto step = [&](int32_t ranks, bool with) {
            return priced_with(ranks,
                               with ? std::vector<OversubscribedRow>{row}
                                    : std::vector<OversubscribedRow>{},
                               row.tp);
        };
        const int32_t pp = static_cast<int32_t>(row.ranks_per_core) * c.cores;
        const double beyond = step(pp, true), alone = step(pp, false);
        ASSERT_GT(alone, 0);
        if (row.work > 1.01) {
            EXPECT_GT(beyond, alone);
        } else if (row.work < 0.99) {
            EXPECT_LT(beyond, alone);
        }
        if (c.cores >= row.tp) {
            EXPECT_EQ(step(c.cores, true), step(c.cores, false));
        }
    }
    // With rows of both counts, a plan takes those of its host's ranks a core: one of four a
    // core costs more where that row's factor is larger; one of two a core does not move.
    if (c.cores > 1) {
        auto priced = [&](int32_t pp, double four) {
            return priced_with(pp, {{2, 64, 1.0}, {4, 64, four}});
        };
        ASSERT_GT(priced(4 * c.cores, 1.0), 0);
        EXPECT_GT(priced(4 * c.cores, 2.0), 1.2 * priced(4 * c.cores, 1.0));
        EXPECT_EQ(priced(2 * c.cores, 2.0), priced(2 * c.cores, 1.0));
    }

    // The cores' spread, where there are several: a fraction of a core's pace. Replicas a core
    // each meet at their reduction, where the slowest sets the time: their step is longer than
    // at the mean pace. (A spread beyond what a profile holds is said, not written.)
    std::stringstream text;
    text << std::ifstream(file).rdbuf();
    const bool said = text.str().find("# not measured: the cores' spread") != std::string::npos;
    EXPECT_EQ(c.core_spread > 0 || said, c.cores > 1);
    EXPECT_LT(c.core_spread, 0.5);
    if (c.core_spread > 0) {
        auto priced = [&](std::vector<std::string> mesh, double spread) {
            Program q = checked("gpt_tiny.dist", std::move(mesh));
            q.mesh.profile = *p;
            q.mesh.profile.calibration.core_spread = spread;
            return sim::simulate(*lower(q).graph, q);
        };
        const std::string each = std::to_string(c.cores);
        auto step_of = [&](double spread) {
            sim::SimResult r = priced({"mesh.dp=" + each}, spread);
            return r.ok() ? r.timeline->step_time_s : -1.0;
        };
        const double mean = step_of(0.0), spread = step_of(c.core_spread);
        ASSERT_GT(mean, 0);
        EXPECT_GT(spread, mean);
        // The mean of the draws, in which each replica drew each pace once: alike. The report
        // says how many draws and at what spread.
        if (sim::SimResult r = priced({"mesh.dp=" + each}, c.core_spread); r.ok()) {
            EXPECT_EQ(r.timeline->pace_draws,
                      std::min<int32_t>(c.cores, static_cast<int32_t>(sim::kMostPaceDraws)));
            EXPECT_EQ(r.timeline->core_spread, c.core_spread);
            EXPECT_NE(sim::text_report(*r.timeline)
                          .find("the mean of " + std::to_string(r.timeline->pace_draws) + " draws"),
                      std::string::npos);
            for (const sim::RankReport& rank : r.timeline->ranks)
                EXPECT_NEAR(rank.busy, r.timeline->ranks[0].busy, 1e-9 * rank.busy);
        }
        // A pipeline's stages a core each: whichever drew the slower core, the other waits for
        // it, in every draw (ZBV, whose ranks hand each other work both ways). The step is the
        // longest path through the actions, convex in their durations, and each rank's mean
        // pace over the draws is 1: the draws' mean step is above the step at the mean pace.
        // (Not the bubble: rank 0 holds both ends, and a slower rank 1 evens them out.) At a
        // spread of 0.2, whatever the quick calibration measured, so that it shows.
        auto step_at = [&](double spread) {
            sim::SimResult r =
                priced({"mesh.pp=" + each, "model.layers=" + std::to_string(2 * c.cores),
                        "schedule.kind=zbv", "schedule.virtual_stages=2",
                        "schedule.microbatches=" + std::to_string(2 * c.cores)},
                       spread);
            return r.ok() ? r.timeline->step_time_s : -1.0;
        };
        ASSERT_GT(step_at(0.0), 0);
        EXPECT_GT(step_at(0.2), step_at(0.0));
    }

    // On two data-parallel ranks the gradient buckets are reduced after the last backward, on
    // the reducer's one thread: each costs its collective and the reducer's two passes over it
    // (pack, and copy back scaled), so the step's update cannot start before the last
    // backward's end plus the buckets' measured all-reduces and those passes, each at the
    // profile's one-thread copy rate or, the two members copying at once, at half what two
    // threads copy together, the slower.
    Program two = checked("gpt_tiny.dist", {"mesh.dp=2"});
    two.mesh.profile = *p;
    Graph g = *lower(two).graph;
    sim::SimResult res = sim::simulate(g, two);
    ASSERT_TRUE(res.ok());
    const sim::RankReport& rank = res.timeline->ranks[0];
    const auto& acts = g.ranks[0].actions;
    double last_backward = 0, update = -1;
    for (const sim::Span& sp : rank.spans) {
        if (acts[sp.action].kind == ActionKind::backward) last_backward = sp.end;
        if (acts[sp.action].kind == ActionKind::step) update = sp.start;
    }
    ASSERT_GT(update, 0);
    sim::Rates rates(c);
    double passes = 0, reductions = 0;
    for (int64_t b : g.stages[0].buckets) {
        const double n = static_cast<double>(b) / 4;
        const double alone = rates.elementwise("copy", n, 1.0, false),
                     shared = rates.elementwise("copy", 2 * n, 2.0, false) / 2;
        passes += 2 * n / std::min(alone, shared);
        reductions += rates.collective("inprocess", "all_reduce", 2, static_cast<double>(b));
    }
    ASSERT_GT(passes, 0);
    ASSERT_GT(reductions, 0);
    // Then the gradient norm's pass over the rank's gradients, before the norm's barrier; the
    // update's span is the optimizer's pass without it, as the runtime counts it.
    const double params = static_cast<double>(g.stages[0].parameters);
    const double threads = sim::rank_threads(g, c.cores);
    const double norm = params / rates.elementwise("sum_squares", params, threads, false);
    EXPECT_GE(update - last_backward, (reductions + passes + norm) * (1 - 1e-9));
    {
        // One rank alone on the host (no other thread to share the cores with): its update's
        // span is the optimizer's pass less the norm's, each at the rank's threads.
        Program one = checked("gpt_tiny.dist", {});
        one.mesh.profile = *p;
        Graph g1 = *lower(one).graph;
        sim::SimResult alone = sim::simulate(g1, one);
        ASSERT_TRUE(alone.ok());
        const double n1 = static_cast<double>(g1.stages[0].parameters);
        const double t1 = sim::rank_threads(g1, c.cores);
        const double norm1 = n1 / rates.elementwise("sum_squares", n1, t1, false);
        int spans = 0;
        for (const sim::Span& sp : alone.timeline->ranks[0].spans)
            if (g1.ranks[0].actions[sp.action].kind == ActionKind::step) {
                EXPECT_NEAR(sp.end - sp.start, sim::step_seconds(n1, rates, t1) - norm1, 1e-9);
                ++spans;
            }
        EXPECT_EQ(spans, 1);
    }

    // The two members pack and copy back at once: where two threads copy no faster together
    // than one alone (the memory's bandwidth), each pass takes twice as long as where they
    // copy twice as fast, and the update starts that much later.
    auto update_with = [&](double two_threads) {
        Program q = two;
        auto& rows = q.mesh.profile.calibration.elementwise;
        std::erase_if(rows, [](const StreamRate& e) { return e.op == "copy"; });
        for (int64_t n : {int64_t{1} << 10, int64_t{1} << 26}) {
            rows.push_back({"copy", n, 1, 1e9, 1e9});
            rows.push_back({"copy", n, 2, two_threads, two_threads});
        }
        sim::SimResult run = sim::simulate(g, q);
        EXPECT_TRUE(run.ok());
        double back = 0, at = -1;
        for (const sim::Span& sp : run.timeline->ranks[0].spans) {
            if (acts[sp.action].kind == ActionKind::backward) back = sp.end;
            if (acts[sp.action].kind == ActionKind::step) at = sp.start;
        }
        return at - back;
    };
    double one_pass = 0; // each bucket's two passes at 1e9 elements a second
    for (int64_t b : g.stages[0].buckets) one_pass += 2 * (static_cast<double>(b) / 4) / 1e9;
    EXPECT_NEAR(update_with(1e9) - update_with(2e9), one_pass, 1e-9 + 1e-6 * one_pass);

    // In two processes (`dist run --procs 2`), each rank in its own, the same buckets go
    // through Gloo between the processes, at Gloo's measured times.
    sim::SimOptions two_processes;
    two_processes.processes = 2;
    sim::SimResult apart = sim::simulate(g, two, two_processes);
    ASSERT_TRUE(apart.ok());
    double apart_backward = 0, apart_update = -1, gloo = 0;
    for (const sim::Span& sp : apart.timeline->ranks[0].spans) {
        if (acts[sp.action].kind == ActionKind::backward) apart_backward = sp.end;
        if (acts[sp.action].kind == ActionKind::step) apart_update = sp.start;
    }
    for (int64_t b : g.stages[0].buckets)
        gloo += rates.collective("gloo", "all_reduce", 2, static_cast<double>(b));
    ASSERT_GT(gloo, 0);
    EXPECT_GE(apart_update - apart_backward, (gloo + passes) * (1 - 1e-9))
        << "in one process " << update - last_backward << " s, in-process reductions " << reductions
        << " s, Gloo's " << gloo << " s, passes " << passes << " s";

    // Two pipeline stages on two cores are ranks of one thread: they are priced with the
    // one-thread fits (larger scales there lengthen their forwards and backwards), one rank on
    // both cores with the others (its step does not move). Longer, not by how much: a quick
    // calibration beside other work (ctest -j 2) has priced them at 13 s, nearly all of it in
    // terms the scales do not multiply.
    if (c.cores == 2) {
        // The step, and the seconds of every rank's forwards and backwards.
        auto priced = [&](const HardwareProfile& hw, int32_t pp) {
            Program q = checked("gpt_tiny.dist", {"mesh.pp=" + std::to_string(pp)});
            q.mesh.profile = hw;
            plan::Graph g = *lower(q).graph;
            sim::SimResult res = sim::simulate(g, q);
            EXPECT_TRUE(res.ok());
            if (!res.ok()) return std::pair{0.0, 0.0};
            double compute = 0;
            for (size_t r = 0; r < res.timeline->ranks.size(); ++r)
                for (const sim::Span& sp : res.timeline->ranks[r].spans) {
                    const ActionKind k = g.ranks[r].actions[sp.action].kind;
                    if (k == ActionKind::forward || k == ActionKind::backward)
                        compute += sp.end - sp.start;
                }
            return std::pair{res.timeline->makespan, compute};
        };
        HardwareProfile slower = *p;
        for (WholeActions& a : slower.calibration.by_width)
            if (a.threads == 1)
                for (double& scale : a.scales) scale *= 1.5;
        EXPECT_GT(priced(slower, 2).second, priced(*p, 2).second * 1.001)
            << "steps " << priced(slower, 2).first << " and " << priced(*p, 2).first << " s";
        EXPECT_DOUBLE_EQ(priced(slower, 1).first, priced(*p, 1).first);
    }

    // Ranks that outnumber the cores share them at the speed measured for their working set:
    // with the larger set's workers twice as slow, a width-512 model (its largest matmul's
    // operands beyond the larger set) takes longer, and a width-32 one of 64-token microbatches
    // (its head's 106 KB, within the smaller set) no longer.
    {
        auto step = [&](const HardwareProfile& hw, int64_t width, int64_t sequences) {
            Program q = checked("gpt_tiny.dist",
                                {"mesh.dp=" + std::to_string(c.cores), "mesh.pp=2",
                                 "schedule.microbatches=2", "model.width=" + std::to_string(width),
                                 "train.batch=" + std::to_string(2 * sequences * c.cores)});
            q.mesh.profile = hw;
            sim::SimResult res = sim::simulate(*lower(q).graph, q);
            EXPECT_TRUE(res.ok());
            return res.ok() ? res.timeline->makespan : 0.0;
        };
        HardwareProfile slower = *p;
        for (SharingPoint& s : slower.calibration.sharing)
            if (s.bytes > sharing_default_bytes) s.speed /= 2;
        EXPECT_GT(step(slower, 512, 8), step(*p, 512, 8) * 1.05);
        EXPECT_DOUBLE_EQ(step(slower, 32, 1), step(*p, 32, 1));
    }
}

// `dist calibrate --device cuda` measures a GPU through its Backend; here the CPU's stands in
// for GPU 0 (no GPU on the machines that run every test). The profile it writes is a GPU's: a
// host of devices, kernels at one rank per device, NCCL's collectives named as not measured on
// one GPU; and the simulator gives each rank its device, so a rank's forward takes as long
// beside a second rank as alone, where ranks sharing a CPU's cores would slow each other.
TEST(Calibrate, AGpuCalibrationIsAProfileOfDevicesThatPricesEachRankAlone) {
    TempDir dir("gpu");
    fs::create_directories(dir.path / "hardware");
    fs::path file = dir.path / "hardware" / "stand.toml";
    kernels::set_backend_for({kernels::Device::Kind::cuda, 0}, &kernels::cpu_backend());
    cli::CalibrateOptions o;
    o.out = file.string();
    o.quick = true;
    o.device = "cuda";
    std::ostringstream out, err;
    const int status = cli::run_calibrate(o, out, err);
    kernels::set_backend_for({kernels::Device::Kind::cuda, 0}, nullptr);
    ASSERT_EQ(status, 0) << out.str() << err.str();
    EXPECT_NE(err.str().find("calibrate: matmuls"), std::string::npos) << err.str();
    lang::SourceManager sources;
    lang::Diagnostics diags;
    auto p = lang::load_profile(file, sources, diags);
    ASSERT_TRUE(p.has_value()) << diags.render(sources);
    const Calibration& c = p->calibration;
    EXPECT_TRUE(c.gpu());
    EXPECT_FALSE(p->cpu()); // `devices: stand` places ranks on GPUs
    EXPECT_EQ(p->devices_per_host, 1);
    EXPECT_GT(p->memory_bytes, 0);
    EXPECT_GT(p->peak_flops_f32, 0);
    EXPECT_GT(p->memory_bandwidth, 0);
    EXPECT_TRUE(c.sharing.empty());
    EXPECT_TRUE(c.collectives.empty());
    std::map<std::string, std::set<std::array<int64_t, 3>>> grid;
    for (const MatmulRate& m : c.matmul) {
        EXPECT_EQ(m.threads, 1);
        EXPECT_GT(m.flops, 0);
        grid[m.kernel].insert({m.m, m.n, m.k});
    }
    ASSERT_EQ(grid.size(), 3u);
    for (const auto& [kernel, shapes] : grid) EXPECT_EQ(shapes.size(), 8u) << kernel;
    std::set<std::string> ops;
    for (const StreamRate& e : c.elementwise) ops.insert(e.op);
    // Every op the simulator prices, bf16's passes and the gradient norm's among them.
    for (const char* op : {"layernorm", "gelu", "cross_entropy", "copy", "adamw", "embedding",
                           "bf16_round", "bf16_keep", "sum_squares"})
        EXPECT_TRUE(ops.count(op)) << op;
    std::ifstream in(file);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_NE(text.find("# not measured: collectives: one GPU"), std::string::npos) << text;
    // Compute beside NCCL's kernels: the published average, not measured with one GPU.
    EXPECT_NEAR(p->overlap_slowdown, 0.19, 1e-12);

    // One rank per device: two data-parallel ranks, each with the microbatch one rank had
    // alone, take as long for their forward as the one rank did. Sharing one GPU (`dist run`
    // with one GPU for both), each forward runs at half the device and takes twice as long.
    auto forward = [&](int64_t dp, int32_t shared_gpus = 0) {
        Program q = checked("gpt_tiny.dist",
                            {"mesh.dp=" + std::to_string(dp),
                             "train.batch=" + std::to_string(8 * dp), "schedule.microbatches=1"});
        q.mesh.profile = *p;
        Graph g = *lower(q).graph;
        sim::SimOptions so;
        so.shared_gpus = shared_gpus;
        sim::SimResult res = sim::simulate(g, q, so);
        EXPECT_TRUE(res.ok());
        if (!res.ok()) return -1.0;
        for (const sim::Span& sp : res.timeline->ranks[0].spans)
            if (g.ranks[0].actions[sp.action].kind == ActionKind::forward) return sp.end - sp.start;
        return -1.0;
    };
    const double one = forward(1), two = forward(2);
    EXPECT_GT(one, 0);
    EXPECT_NEAR(two, one, 1e-12 + 1e-9 * one);
    EXPECT_NEAR(forward(2, 1), 2 * one, 1e-9 * one);
    EXPECT_NEAR(forward(2, 2), one, 1e-9 * one); // as many GPUs as ranks: each its own
    EXPECT_NEAR(forward(1, 1), one, 1e-9 * one);
}

TEST(Calibrate, RefusesAnOutputThatIsNotAProfile) {
    Result r = run(std::string(DIST_BINARY) + " calibrate --quick --out /tmp/profile.txt");
    EXPECT_EQ(r.status, 2);
    EXPECT_NE(r.out.find("a hardware profile is a .toml file"), std::string::npos) << r.out;
    r = run(std::string(DIST_BINARY) + " calibrate --quick --out /nonexistent/dir/x.toml");
    EXPECT_EQ(r.status, 1);
    EXPECT_NE(r.out.find("no folder"), std::string::npos) << r.out;
    // A GPU's calibration has no cores to choose; without a GPU it says so and writes nothing.
    TempDir dir("nogpu");
    const fs::path file = dir.path / "g.toml";
    r = run(std::string(DIST_BINARY) + " calibrate --device cuda --cores 2 --out " + file.string());
    EXPECT_EQ(r.status, 2);
    EXPECT_NE(r.out.find("a GPU's calibration has no cores to choose"), std::string::npos) << r.out;
    // More cores than the process may run on: refused before anything is measured.
    r = run(std::string(DIST_BINARY) + " calibrate --quick --device cpu --cores 4096 --out " +
            file.string());
    EXPECT_EQ(r.status, 2);
    EXPECT_NE(r.out.find("--cores 4096: this process may run on"), std::string::npos) << r.out;
    if (kernels::gpu_count() == 0) {
        r = run(std::string(DIST_BINARY) + " calibrate --quick --device cuda --out " +
                file.string());
        EXPECT_EQ(r.status, 1);
        EXPECT_NE(r.out.find("error: --device cuda: "), std::string::npos) << r.out;
    }
    EXPECT_FALSE(fs::exists(file));
}

// A datasheet profile may give its matmul efficiency by model width; the points must be
// [width, efficiency] pairs with widths ascending, and a wider model then runs nearer peak.
TEST(Rates, ADatasheetEfficiencyByWidthLoadsAndIsChecked) {
    TempDir dir("curve");
    fs::create_directories(dir.path / "hardware");
    const std::string head = "name = \"curve\"\n"
                             "[compute]\npeak_flops_f32 = 1e12\npeak_flops_bf16 = 1e12\n";
    const std::string rest = "[memory]\nbytes = 80000000000\nbandwidth = 1e12\n"
                             "[host]\ndevices = 8\n"
                             "[links.intra_host]\nbandwidth = 1e11\nlatency = 1e-6\n"
                             "[links.inter_host]\nbandwidth = 1e10\nlatency = 1e-5\n";
    fs::path good = dir.path / "hardware" / "curve.toml";
    std::ofstream(good) << head << "matmul_efficiency = [[256, 0.3], [1024, 0.6]]\n" << rest;
    lang::SourceManager sources;
    lang::Diagnostics diags;
    auto p = lang::load_profile(good, sources, diags);
    ASSERT_TRUE(p.has_value()) << diags.render(sources);
    ASSERT_EQ(p->matmul_efficiency_by_width.size(), 2u);
    std::string sim = "DIST_PATH=" + dir.path.string() + " " + DIST_BINARY + " sim " +
                      DIST_SOURCE_DIR +
                      "/examples/gpt_tiny.dist --json --set mesh.devices=curve --set mesh.dp=1";
    Result narrow = run(sim + " --set model.width=256"),
           wide = run(sim + " --set model.width=1024");
    ASSERT_EQ(narrow.status, 0) << narrow.out;
    ASSERT_EQ(wide.status, 0) << wide.out;
    double mfu_narrow = nlohmann::json::parse(narrow.out)["mfu"].get<double>();
    double mfu_wide = nlohmann::json::parse(wide.out)["mfu"].get<double>();
    EXPECT_LE(mfu_narrow, 0.3 + 1e-9);
    EXPECT_GT(mfu_wide, 1.5 * mfu_narrow);
    fs::path bad = dir.path / "bad.toml";
    std::ofstream(bad) << head << "matmul_efficiency = [[1024, 0.6], [256, 0.3]]\n" << rest;
    lang::Diagnostics bad_diags;
    EXPECT_FALSE(lang::load_profile(bad, sources, bad_diags).has_value());
    std::string report = bad_diags.render(sources);
    EXPECT_NE(report.find("bad.toml:5:35:"), std::string::npos) << report;
    EXPECT_NE(report.find("widths ascending"), std::string::npos) << report;
    // Flash attention's own efficiency and tile rows load; an efficiency above 1 is refused
    // where it is written.
    fs::path att = dir.path / "att.toml";
    std::ofstream(att) << head << "attention_efficiency = 0.6\nattention_block = 64\n" << rest;
    lang::Diagnostics att_diags;
    auto q = lang::load_profile(att, sources, att_diags);
    ASSERT_TRUE(q.has_value()) << att_diags.render(sources);
    EXPECT_DOUBLE_EQ(q->attention_efficiency, 0.6);
    EXPECT_EQ(q->attention_block, 64);
    fs::path over = dir.path / "over.toml";
    std::ofstream(over) << head << "attention_efficiency = 1.5\n" << rest;
    lang::Diagnostics over_diags;
    EXPECT_FALSE(lang::load_profile(over, sources, over_diags).has_value());
    report = over_diags.render(sources);
    EXPECT_NE(report.find("over.toml:5:"), std::string::npos) << report;
    EXPECT_NE(report.find("at most 1"), std::string::npos) << report;
}
