// sim_test.cpp: the Graph's JSON round trip, the simulator's reports under the hardware
// profile, and that the SVG and the Chrome trace are well-formed.
#include "actors/plan/graph_json.hpp"
#include "actors/plan/lower.hpp"
#include "actors/plan/stages.hpp"
#include "actors/plan/verify.hpp"
#include "actors/sim/simulate.hpp"
#include "lang/check.hpp"
#include "tests/common/checked_script.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <initializer_list>
#include <regex>

using namespace dist;
using namespace dist::plan;

namespace {

using tests::planned_graph;

Program checked(const std::string& example, std::vector<std::string> overrides = {}) {
    return tests::checked_example(example, std::move(overrides));
}

Graph planned(const Program& p) {
    return planned_graph(p);
}

// A small XML well-formedness check: every tag closes in order, attributes are quoted.
bool well_formed(const std::string& xml, std::string& why) {
    std::vector<std::string> open;
    std::regex tag(R"(<(/?)([A-Za-z][\w:-]*)((?:\s+[\w:-]+="[^"<]*")*)\s*(/?)>)");
    size_t at = 0;
    while ((at = xml.find('<', at)) != std::string::npos) {
        std::smatch m;
        std::string rest = xml.substr(at, xml.find('>', at) - at + 1);
        if (!std::regex_match(rest, m, tag)) {
            why = "bad tag: " + rest;
            return false;
        }
        if (m[1] == "/") {
            if (open.empty() || open.back() != m[2]) {
                why = "unbalanced </" + m[2].str() + ">";
                return false;
            }
            open.pop_back();
        } else if (m[4] != "/") {
            open.push_back(m[2]);
        }
        at += rest.size();
    }
    why = open.empty() ? "" : "unclosed <" + open.back() + ">";
    return open.empty();
}

/// GPipe over `stages` ranks, one microbatch, every stage's F, I and W 1e12 FLOPs.
Graph hand_made(int32_t stages) {
    PlanResult r = schedule_graph(ScheduleKind::gpipe, stages, 1, 1);
    EXPECT_TRUE(r.ok());
    Graph g = *r.graph;
    for (PlanStage& s : g.stages) s.flops_forward = s.flops_input_grad = s.flops_weight_grad = 1e12;
    return g;
}

/// A device of 1e12 FLOP/s and 1e12 bytes/s of memory, links of `intra` and `inter` bytes/s.
Program hand_device(double intra = 1e9, double inter = 1e9) {
    Program p;
    p.mesh.profile.peak_flops_f32 = 1e12;
    p.mesh.profile.memory_bandwidth = 1e12;
    p.mesh.profile.intra_host = {intra, 0.0};
    p.mesh.profile.inter_host = {inter, 0.0};
    return p;
}

// Actions of these kinds, each of stage 0 and microbatch 0.
std::vector<plan::PlanAction> first_actions(std::initializer_list<ActionKind> kinds) {
    std::vector<plan::PlanAction> out;
    for (ActionKind k : kinds) {
        plan::PlanAction a;
        a.kind = k;
        a.stage = 0;
        a.microbatch = 0;
        out.push_back(a);
    }
    return out;
}

// A timeline of one rank running `actions`, with no spans yet: a run's and its prediction's.
sim::Timeline one_rank(const std::vector<plan::PlanAction>& actions) {
    sim::Timeline t;
    t.graph.ranks.resize(1);
    t.graph.ranks[0].actions = actions;
    t.ranks.resize(1);
    return t;
}

} // namespace

TEST(GraphJson, RoundTripGivesAnEqualGraph) {
    std::vector<Graph> graphs = {planned(checked("gpt2_124m_8xh200.dist")),
                                 planned(checked("llama3_8b_64xh100.dist")),
                                 planned(checked("custom_schedule.dist")),
                                 *schedule_graph(ScheduleKind::dualpipev, 3, 7, 2).graph};
    for (const Graph& g : graphs) {
        std::string text = to_json(g).dump();
        Graph back;
        std::string error;
        ASSERT_TRUE(from_json(nlohmann::json::parse(text), back, error)) << error;
        EXPECT_TRUE(back == g) << to_string(g.schedule);
        EXPECT_EQ(to_json(back).dump(), text);
    }
    // DualPipeV's overlapped pairs survive as pairs.
    Graph d = graphs.back();
    bool pair = false;
    for (const PlanRank& r : d.ranks)
        for (const PlanAction& a : r.actions) pair = pair || a.overlap_next;
    EXPECT_TRUE(pair);
}

TEST(GraphJson, ReadingRefusesBadActions) {
    nlohmann::json j = to_json(*schedule_graph(ScheduleKind::gpipe, 2, 2, 1).graph);
    j["ranks"][1]["actions"][0] = "1X0";
    Graph g;
    std::string error;
    EXPECT_FALSE(from_json(j, g, error));
    EXPECT_EQ(error, "rank 1: `1X0` is not an action");
    for (const char* good : {"12F3", "0SEND_F1>r3", "1RECV_B0<r5", "1REDUCE_GRAD2", "STEP"})
        EXPECT_EQ(to_string(*parse_action(good)), good);
    for (const char* bad : {"F0", "0F", "0SEND_F1", "0F1>r2", "0Q1", "0F1x"})
        EXPECT_FALSE(parse_action(bad).has_value()) << bad;
}

// Attention's input gradient: its weights' products once, and the scores' gradient, two products
// each way where the forward has two (4 b T^2 heads head_dim FLOPs); a flash kernel first
// computes q k^T again (five products in all, FlashAttention-2's backward), a materialized one
// under selective recomputation its whole core forward (Korthikanti et al. 2022).
TEST(CostModel, AttentionBackwardRedoesWhatItDoesNotKeep) {
    auto attention = [](std::vector<std::string> sets) {
        sets.push_back("train.batch=4");
        Program p = checked("gpt_tiny.dist", sets);
        for (const ModelItemSpec& it : p.model.blocks.front().items)
            for (const LayerSpec& l : it.layers)
                if (l.kind == LayerKind::attention)
                    return std::make_pair(p, cost_of_items(p, {it}));
        ADD_FAILURE() << "no attention";
        return std::make_pair(p, PartCost{});
    };
    auto [p, flash] = attention({});
    const double b = static_cast<double>(p.train.microbatch_size);
    const double T = static_cast<double>(p.model.context), C = static_cast<double>(p.model.width);
    const double scores = 4 * b * T * T * C; // heads x head_dim = width
    const double weights = flash.flops_weight_grad;
    EXPECT_NEAR(flash.flops_forward, weights + scores, 1e-9 * scores);
    EXPECT_NEAR(flash.flops_input_grad, weights + 2.5 * scores, 1e-9 * scores);
    // A flash kernel's products over the square are marked: the simulator runs the causal half.
    EXPECT_NEAR(flash.flash_forward, scores, 1e-9 * scores);
    EXPECT_NEAR(flash.flash_input_grad, 2.5 * scores, 1e-9 * scores);
    const std::string kept = "model.attention_kernel=\"materialized\"";
    EXPECT_EQ(attention({kept}).second.flash_forward, 0.0);
    EXPECT_NEAR(attention({kept}).second.flops_input_grad, weights + 2 * scores, 1e-9 * scores);
    EXPECT_NEAR(attention({kept, "schedule.recompute=selective"}).second.flops_input_grad,
                weights + 3 * scores, 1e-9 * scores);
}

TEST(Simulate, ProfileReportAddsUp) {
    Program p = checked("gpt2_124m_8xh200.dist");
    Graph g = planned(p);
    sim::SimResult r = sim::simulate(g, p);
    ASSERT_TRUE(r.ok());
    const sim::Timeline& t = *r.timeline;
    EXPECT_GT(t.makespan, 0);
    EXPECT_GT(t.bubble_fraction, 0);
    EXPECT_LT(t.bubble_fraction, 1);
    EXPECT_GT(t.mfu, 0);
    EXPECT_LE(t.mfu, 0.5); // at most the efficiency factor
    // Tokens: 8 microbatches of 8 sequences of 1024 tokens on each of 2 data-parallel ranks.
    EXPECT_NEAR(t.tokens_per_s * t.step_time_s, 8.0 * 8 * 1024 * 2, 1e-6);
    EXPECT_TRUE(t.fits);
    for (const sim::RankReport& rr : t.ranks) {
        const PlanRank& rank = g.ranks[static_cast<size_t>(rr.rank)];
        int64_t params = 0;
        for (const PlanStage& s : g.stages)
            if (s.pp == rank.pp) params += s.parameters;
        // bf16 as the runtime keeps it: 4 bytes of weight (the f32 master, cast where it is
        // used), 4 of f32 gradient, 8 of AdamW moments.
        EXPECT_EQ(rr.parameters_bytes, 4 * params);
        EXPECT_EQ(rr.gradients_bytes, 4 * params);
        EXPECT_EQ(rr.optimizer_bytes, 8 * params);
        EXPECT_EQ(rr.peak_memory_bytes, rr.parameters_bytes + rr.gradients_bytes +
                                            rr.optimizer_bytes + rr.activations_bytes +
                                            rr.communication_bytes);
        EXPECT_NEAR(rr.idle, t.makespan - rr.busy, 1e-12);
    }
}

TEST(Simulate, UnitCostsOfAScriptMatchTheFormula) {
    // gpt_tiny on pp = 4 with 1F1B and 8 microbatches: bubble (p-1)/(m+p-1) = 3/11.
    Program p =
        checked("gpt_tiny.dist", {"mesh.pp=4", "schedule.microbatches=8", "train.batch=32"});
    sim::SimOptions o;
    o.cost = sim::CostModel::unit;
    sim::SimResult r = sim::simulate(planned(p), p, o);
    ASSERT_TRUE(r.ok());
    EXPECT_NEAR(r.timeline->bubble_fraction, 3.0 / 11.0, 1e-12);
    EXPECT_DOUBLE_EQ(r.timeline->makespan, 33.0);
}

TEST(Simulate, DataParallelReductionsOverlapTheRemainingBackward) {
    // Interleaved on pp = 2: stage 2's buckets are final before stage 0's last backwards, so
    // its all-reduce runs while rank 0 still computes; the step waits only for the last.
    Program p = checked("gpt2_124m_8xh200.dist");
    Graph g = planned(p);
    const PlanRank& r0 = g.ranks[0];
    size_t first_reduce = 0, last_backward = 0;
    for (size_t i = 0; i < r0.actions.size(); ++i) {
        if (r0.actions[i].kind == ActionKind::reduce_grad && first_reduce == 0) first_reduce = i;
        if (r0.actions[i].kind == ActionKind::backward) last_backward = i;
    }
    EXPECT_LT(first_reduce, last_backward);
    EXPECT_EQ(r0.actions.back().kind, ActionKind::step);
}

TEST(Render, SvgAndTraceParse) {
    Program p = checked("gpt2_124m_8xh200.dist");
    sim::SimResult r = sim::simulate(planned(p), p);
    ASSERT_TRUE(r.ok());
    std::string svg = sim::svg(*r.timeline), why;
    EXPECT_TRUE(well_formed(svg, why)) << why;
    EXPECT_EQ(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0), 0u);
    EXPECT_NE(svg.find("F forward"), std::string::npos);  // the legend
    EXPECT_NE(svg.find("url(#idle)"), std::string::npos); // the shaded bubble
    nlohmann::json trace = nlohmann::json::parse(sim::chrome_trace(*r.timeline));
    size_t spans = 0, tracks = 0;
    for (const auto& e : trace["traceEvents"]) {
        if (e["ph"] == "X") {
            ++spans;
            EXPECT_GE(e["dur"].get<double>(), 0.0);
            EXPECT_FALSE(e["args"].contains("on_core")); // a GPU each: no cores shared
        }
        if (e["ph"] == "M" && e["name"] == "thread_name") ++tracks;
    }
    // A track per rank, and one for its communication thread where it runs collectives.
    size_t expected = 0, expected_tracks = 0;
    for (const sim::RankReport& rr : r.timeline->ranks) {
        expected += rr.spans.size() + rr.collectives.size();
        expected_tracks += rr.collectives.empty() ? 1 : 2;
    }
    EXPECT_EQ(spans, expected);
    EXPECT_EQ(tracks, expected_tracks);
    // The picture draws each collective as a thin bar along its rank's row.
    size_t bars = 0, collectives = 0;
    for (size_t at = 0; (at = svg.find("height=\"3\"", at)) != std::string::npos; ++at) ++bars;
    for (const sim::RankReport& rr : r.timeline->ranks) collectives += rr.collectives.size();
    EXPECT_GT(collectives, 0u);
    EXPECT_EQ(bars, collectives);
    // A span whose thread's time on a core is known carries it, in the trace's unit (us).
    sim::Timeline shared = one_rank(first_actions({ActionKind::forward, ActionKind::backward}));
    shared.ranks[0].spans = {{0, 0.000, 0.010, 0.0, 0.004}, {1, 0.010, 0.030}};
    std::vector<nlohmann::json> events;
    const nlohmann::json parsed = nlohmann::json::parse(sim::chrome_trace(shared));
    for (const auto& e : parsed["traceEvents"])
        if (e["ph"] == "X") events.push_back(e);
    ASSERT_EQ(events.size(), 2u);
    EXPECT_DOUBLE_EQ(events[0]["args"]["on_core"].get<double>(), 4000.0);
    EXPECT_FALSE(events[1]["args"].contains("on_core"));
    std::string text = sim::text_report(*r.timeline);
    size_t start = 0;
    for (size_t end; (end = text.find('\n', start)) != std::string::npos; start = end + 1)
        EXPECT_LE(end - start, 80u) << text.substr(start, end - start);
}

TEST(Lower, TensorShardsAndTheTiedEmbedding) {
    Program p = checked("gpt2_124m_8xh200.dist");
    Graph g = planned(p);
    // Megatron-LM's split over tp = 2: the vocabulary of the embedding, the heads of every
    // attention, the hidden size of every MLP.
    ASSERT_FALSE(g.stages[0].shards.empty());
    EXPECT_EQ(g.stages[0].shards[0], (PlanShard{"wte", ShardDim::vocab, 50304}));
    int attention = 0;
    for (const PlanStage& s : g.stages)
        for (const PlanShard& sh : s.shards)
            if (sh.dim == ShardDim::heads) {
                EXPECT_EQ(sh.size, 12);
                ++attention;
            }
    EXPECT_EQ(attention, 12); // one per block
    // GPT-2 ties the head to the embedding; they sit on pipeline ranks 0 and 1, so the head's
    // stage holds its own copy (vocab x width / tp parameters) whose gradient STEP sums.
    EXPECT_EQ(g.tied_bytes, 50304LL * 768 / 2 * 2); // bf16
    int64_t blocks_and_head = 0;
    for (const PlanStage& s : g.stages)
        if (s.head) blocks_and_head = s.parameters;
    Graph untied =
        planned(checked("gpt2_124m_8xh200.dist", {"schedule.kind=zbv", "schedule.microbatches=4"}));
    // In a V the first and the last stage share rank 0: one copy, nothing to sum across ranks.
    EXPECT_EQ(untied.tied_bytes, 0);
    EXPECT_GT(blocks_and_head, 50304LL * 768 / 2);
}

TEST(Lower, PartitionFromTheScriptOrBalancedByCost) {
    // Given in the script: kept as written.
    Program given = checked("gpt_tiny.dist", {"mesh.pp=2", "schedule.partition=[1, 3]"});
    Graph g = planned(given);
    ASSERT_EQ(g.stages.size(), 2u);
    EXPECT_EQ(g.stages[0].blocks, 1);
    EXPECT_EQ(g.stages[1].blocks, 3);
    EXPECT_TRUE(g.partition_given);
    // Balanced: GPT-2 124M's head (2 N C V FLOPs with V = 50304) outweighs its embedding (a
    // lookup), so on two stages the head's stage gets fewer of the 12 blocks.
    Graph b = planned(
        checked("gpt2_124m_8xh200.dist", {"schedule.kind=1f1b", "schedule.virtual_stages=1"}));
    ASSERT_EQ(b.stages.size(), 2u);
    EXPECT_FALSE(b.partition_given);
    EXPECT_EQ(b.stages[0].blocks + b.stages[1].blocks, 12);
    EXPECT_LT(b.stages[1].blocks, b.stages[0].blocks);
}

TEST(Simulate, ProfileCostsOfAHandMadeGraph) {
    // GPipe, p = 2, m = 1. Each stage: 1e12 FLOPs forward, as many for I and for W; 1 GB sent
    // across. The device: 1e12 FLOP/s at efficiency 0.5, links of 1 GB/s without latency.
    // F = 2 s, B = I + W = 4 s, a transfer 1 s: F0 + send + F1 + B1 + send + B0 = 14 s.
    Graph g = hand_made(2);
    for (PlanStage& s : g.stages) s.boundary_bytes = 1000000000;
    Program p = hand_device(1e9, 1e8);
    sim::SimResult s = sim::simulate(g, p);
    ASSERT_TRUE(s.ok());
    EXPECT_NEAR(s.timeline->makespan, 14.0, 1e-9);
    // Each rank computes 6 s of the 14: the bubble is 8/14.
    EXPECT_NEAR(s.timeline->bubble_fraction, 8.0 / 14.0, 1e-9);
    // On two hosts the link is ten times slower: 2 transfers of 10 s instead of 1 s.
    for (PlanRank& rank : g.ranks) rank.host = rank.rank;
    s = sim::simulate(g, p);
    ASSERT_TRUE(s.ok());
    EXPECT_NEAR(s.timeline->makespan, 32.0, 1e-9);
}

TEST(Simulate, CausalFlashRunsTheTilesOnAndBelowTheDiagonal) {
    // One rank, one microbatch: F then B. F: 1e12 FLOPs, 0.8e12 of them a causal flash kernel's
    // over a sequence of 1024; I and W 1e12 each, no flash. 1e12 FLOP/s, matmuls at 0.5,
    // attention at 0.25 in tiles of 128 rows: the kernel runs 1/2 + 128/2048 of its square,
    // F = 0.2 / 0.5 + 0.8 x 0.5625 / 0.25 = 2.2 s, B = 2 / 0.5 = 4 s.
    Graph g = hand_made(1);
    for (PlanStage& s : g.stages) {
        s.flash_forward = 0.8e12;
        s.flash_sequence = 1024;
    }
    Program p = hand_device();
    p.mesh.profile.matmul_efficiency = 0.5;
    p.mesh.profile.attention_efficiency = 0.25;
    sim::SimResult s = sim::simulate(g, p);
    ASSERT_TRUE(s.ok());
    EXPECT_NEAR(s.timeline->makespan, 6.2, 1e-9);
    // Tiles as long as the sequence: the whole square runs, F = 0.4 + 0.8 / 0.25 = 3.6 s.
    p.mesh.profile.attention_block = 1024;
    s = sim::simulate(g, p);
    ASSERT_TRUE(s.ok());
    EXPECT_NEAR(s.timeline->makespan, 7.6, 1e-9);
    // MFU counts the whole square either way: 3 x 1e12 in 7.6 s at 1e12 FLOP/s.
    EXPECT_NEAR(s.timeline->mfu, 3.0 / 7.6, 1e-9);
}

TEST(Simulate, EfficiencyCurveIsReadAtTheTensorParallelShardsWidth) {
    // Points (256, 0.25) and (1024, 1.0), linear in log(width): a 1024-wide model over tp 2 has
    // shards 512 wide, efficiency 0.625; one F, I and W of 1e12 FLOPs each at 1e12 FLOP/s.
    Graph g = hand_made(1);
    Program p = hand_device();
    p.mesh.profile.matmul_efficiency_by_width = {{256, 0.25}, {1024, 1.0}};
    p.model.width = 1024;
    p.mesh.tp = 2;
    sim::SimResult s = sim::simulate(g, p);
    ASSERT_TRUE(s.ok());
    EXPECT_NEAR(s.timeline->makespan, 3.0 / 0.625, 1e-9);
    p.mesh.tp = 1;
    s = sim::simulate(g, p);
    ASSERT_TRUE(s.ok());
    EXPECT_NEAR(s.timeline->makespan, 3.0, 1e-9);
}

TEST(Render, TextTimelineOfASmallCaseDrawnByHand) {
    // 1F1B, p = 2, m = 2 at unit costs, one column per unit (width 8 + 9):
    // rank 1 runs F0 at 1, B0 at 2-4, F1 at 4, B1 at 5-7; rank 0 waits for each B.
    PlanResult r = schedule_graph(ScheduleKind::one_f_one_b, 2, 2, 1);
    ASSERT_TRUE(r.ok());
    sim::SimOptions o;
    o.cost = sim::CostModel::unit;
    sim::SimResult s = sim::simulate(*r.graph, Program{}, o);
    ASSERT_TRUE(s.ok());
    std::string text = sim::text_report(*s.timeline, 17);
    EXPECT_NE(text.find("rank 0  01..AA.BB\n"), std::string::npos) << text;
    EXPECT_NE(text.find("rank 1  .0AA1BB..\n"), std::string::npos) << text;
}

// Ranks sharing one memory: the activations they hold at each instant, summed. A span of no
// length still holds its working memory for that instant (the rank's own peak counts it), and
// two ranks that free and take at the same instant are not counted twice.
TEST(Simulate, SharedPeakCountsAMomentarySpikeAndNoHandOverTwice) {
    sim::Timeline t;
    t.ranks.resize(2);
    auto rank = [](sim::RankReport& r, int64_t fixed,
                   std::vector<std::pair<double, int64_t>> steps) {
        r.activation_steps = std::move(steps);
        for (const auto& s : r.activation_steps)
            r.activations_bytes = std::max(r.activations_bytes, s.second);
        r.peak_memory_bytes = fixed + r.activations_bytes;
    };
    // Rank 0 keeps 60 from t=0, spikes to 500 for an instant at t=2, frees all at t=5.
    rank(t.ranks[0], 1000, {{0, 60}, {1, 60}, {2, 500}, {2, 60}, {5, 0}});
    // Rank 1 holds 50 from t=0 to t=3, then takes 300 at t=5 as rank 0 frees.
    rank(t.ranks[1], 2000, {{0, 50}, {3, 0}, {5, 300}, {6, 0}});
    EXPECT_EQ(sim::shared_peak(t), 1000 + 2000 + 500 + 50);
    // Alone, a rank's shared peak is its own.
    sim::Timeline one;
    one.ranks = {t.ranks[0]};
    EXPECT_EQ(sim::shared_peak(one), one.ranks[0].peak_memory_bytes);
}

// `explain` after a run of a mixture of experts: the all-to-alls inside the compute actions get
// a row of their own, measured (with the waits for the group) beside predicted.
TEST(Simulate, TheDisagreementShowsTheAllToAllsInsideTheComputeApart) {
    std::vector<plan::PlanAction> actions =
        first_actions({ActionKind::forward, ActionKind::dispatch_forward});
    actions[1].block = 0;
    sim::Timeline measured = one_rank(actions), predicted = one_rank(actions);
    measured.ranks[0].spans = {{0, 0.000, 0.010}};
    measured.ranks[0].exchanges = {{1, 0.002, 0.006}};
    predicted.ranks[0].spans = {{0, 0.000, 0.008}};
    predicted.ranks[0].exchanges = {{1, 0.002, 0.004}};
    std::string text = sim::disagreement_text(measured, predicted);
    EXPECT_NE(
        text.find("  F                       measured    10.0 ms, predicted     8.0 ms (-20%)"),
        std::string::npos)
        << text;
    EXPECT_NE(
        text.find("  all-to-all (in F, B, I) measured     4.0 ms, predicted     2.0 ms (-50%)"),
        std::string::npos)
        << text;
    // Without all-to-alls there is no such row.
    measured.ranks[0].exchanges.clear();
    predicted.ranks[0].exchanges.clear();
    EXPECT_EQ(sim::disagreement_text(measured, predicted).find("all-to-all"), std::string::npos);
}

// Under a kind of action, where both timelines know it, the time its threads had a core; not
// where one of them does not (a span of unknown time on a core).
TEST(Simulate, TheDisagreementShowsTheTimeOnACoreWhereBothKnowIt) {
    const std::vector<plan::PlanAction> actions =
        first_actions({ActionKind::forward, ActionKind::backward});
    sim::Timeline measured = one_rank(actions), predicted = one_rank(actions);
    measured.ranks[0].spans = {{0, 0.000, 0.010, 0.0, 0.004}, {1, 0.010, 0.030, 0.0, 0.012}};
    predicted.ranks[0].spans = {{0, 0.000, 0.008, 0.0, 0.006}, {1, 0.008, 0.020}};
    std::string text = sim::disagreement_text(measured, predicted);
    const size_t f =
        text.find("  F                       measured    10.0 ms, predicted     8.0 ms");
    ASSERT_NE(f, std::string::npos) << text;
    EXPECT_EQ(
        text.find("    of it on a core       measured     4.0 ms, predicted     6.0 ms (+50%)"),
        text.find('\n', f) + 1)
        << text;
    EXPECT_EQ(text.find("of it on a core"), text.rfind("of it on a core")) << text; // not B's
}

// `explain` after a run with ZeRO 3: the communication thread's gathers get a row of their own,
// measured (unit by unit) beside predicted, and when they are the largest gap it says so.
TEST(Simulate, TheDisagreementShowsTheCommunicationThreadsCollectives) {
    const std::vector<plan::PlanAction> actions =
        first_actions({ActionKind::gather_forward, ActionKind::forward});
    sim::Timeline measured = one_rank(actions), predicted = one_rank(actions);
    measured.ranks[0].spans = {{1, 0.000, 0.010}};
    measured.ranks[0].collectives = {{0, 0.000, 0.003}, {0, 0.004, 0.009}};
    predicted.ranks[0].spans = {{1, 0.000, 0.009}};
    predicted.ranks[0].collectives = {{0, 0.000, 0.002}};
    std::string text = sim::disagreement_text(measured, predicted);
    EXPECT_NE(
        text.find("  GATHER_F (comm)         measured     8.0 ms, predicted     2.0 ms (-75%)"),
        std::string::npos)
        << text;
    EXPECT_NE(text.find("the largest gap: GATHER_F (comm) on rank 0"), std::string::npos) << text;
}

// A run's comparison says how to calibrate where its profile is a datasheet's: the cpu one
// (a guess about any machine) and a GPU's (published kernels, not Dist's), and nothing for a
// profile `dist calibrate` wrote.
TEST(Simulate, CalibrationHintForDatasheetProfilesOnly) {
    HardwareProfile gpu = checked("gpt2_124m_8xh200.dist").mesh.profile;
    EXPECT_NE(sim::calibration_hint(gpu).find("`dist calibrate --device cuda"), std::string::npos);
    HardwareProfile cpu = checked("gpt_tiny.dist").mesh.profile;
    EXPECT_NE(sim::calibration_hint(cpu).find("`dist calibrate --device cpu"), std::string::npos);
    for (HardwareProfile* p : {&gpu, &cpu}) {
        p->calibration.cores = 16;
        EXPECT_EQ(sim::calibration_hint(*p), "") << p->name;
    }
}
