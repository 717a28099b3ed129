// verify_test.cpp: the verifier rejects planted faults, each with a message that names the
// ranks and actions at fault and, for custom tables, the cell in the script.
#include "actors/plan/lower.hpp"
#include "actors/plan/verify.hpp"
#include "lang/check.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

using namespace dist;
using namespace dist::plan;

namespace {

// A two-rank custom schedule; `row0` and `row1` are the rows of the table (lines 9 and 10).
std::string script(const std::string& row0, const std::string& row1) {
    return "import \"std/gpt.dist\"\n"
           "model = gpt(vocab: 256, context: 16, layers: 2, heads: 2, width: 32)\n"
           "mesh {\n    devices: cpu\n    pp: 2\n}\n"
           "schedule {\n    kind: custom\n    microbatches: 2\n    actions {\n"
           "        rank 0: " +
           row0 + "\n        rank 1: " + row1 +
           "\n    }\n}\n"
           "train {\n    data: synthetic()\n    batch: 2\n    steps: 1\n}\n";
}

PlanResult plan_text(const std::string& text) {
    lang::FrontendOptions o;
    o.search_roots = {std::filesystem::path(DIST_SOURCE_DIR) / "stdlib"};
    lang::CheckResult r = lang::check_text("t.dist", text, o);
    EXPECT_TRUE(r.ok()) << r.report();
    if (!r.ok()) return {};
    return lower(*r.program);
}

std::string all(const std::vector<PlanError>& e) {
    return render_errors("t.dist", e);
}

} // namespace

TEST(Verify, AcceptsTheCustomExampleAsWritten) {
    PlanResult r = plan_text(script("0F0 0F1 0B0 0B1", "1F0 1B0 1F1 1B1"));
    EXPECT_TRUE(r.ok()) << all(r.errors);
}

TEST(Verify, BackwardBeforeItsForwardPointsAtTheCell) {
    PlanResult r = plan_text(script("0F0 0F1 0B0 0B1", "1B0 1F0 1F1 1B1"));
    ASSERT_FALSE(r.ok());
    ASSERT_FALSE(r.errors.empty());
    const PlanError& e = r.errors[0];
    EXPECT_NE(e.message.find("rank 1 runs `1B0` before its forward `1F0`"), std::string::npos)
        << all(r.errors);
    EXPECT_EQ(e.loc.line, 12u); // the row of rank 1
    EXPECT_EQ(e.loc.col, 17u);  // the cell `1B0`
}

TEST(Verify, TwoRanksWaitingForEachOtherIsADeadlockCycle) {
    // Rank 0 waits for the gradient of microbatch 0 before it forwards microbatch 1; rank 1
    // waits for microbatch 1's activation before it starts microbatch 0.
    PlanResult r = plan_text(script("0F0 0B0 0F1 0B1", "1F1 1B1 1F0 1B0"));
    ASSERT_FALSE(r.ok());
    ASSERT_EQ(r.errors.size(), 1u) << all(r.errors);
    const PlanError& e = r.errors[0];
    EXPECT_EQ(e.message, "deadlock: rank 0 waits at `0RECV_B0<r1` for rank 1, which waits at "
                         "`1RECV_F1<r0` for rank 0");
    EXPECT_EQ(e.loc.line, 11u); // rank 0's row, at the backward the receive feeds
    EXPECT_EQ(e.loc.col, 21u);
}

TEST(Verify, AMissingReceiveIsReported) {
    PlanResult r = schedule_graph(ScheduleKind::one_f_one_b, 2, 2, 1);
    ASSERT_TRUE(r.ok());
    Graph g = *r.graph;
    auto& acts = g.ranks[1].actions;
    auto it = std::find_if(acts.begin(), acts.end(),
                           [](const PlanAction& a) { return a.kind == ActionKind::recv_forward; });
    ASSERT_NE(it, acts.end());
    acts.erase(it);
    std::vector<PlanError> e = verify(g);
    ASSERT_FALSE(e.empty());
    EXPECT_EQ(e[0].message, "rank 0's `0SEND_F0>r1` has no matching receive: rank 1 never "
                            "receives the activation of microbatch 0 from rank 0 to rank 1");
}

TEST(Verify, CollectivesInDifferentOrdersAreReported) {
    // dp = 2, interleaved p = 2, v = 2: each rank reduces the buckets of its two stages.
    ScheduleOrder o = compile_schedule(ScheduleKind::interleaved_1f1b, 2, 2, 2);
    std::vector<PlanStage> stages(4);
    for (int32_t s = 0; s < 4; ++s) {
        stages[static_cast<size_t>(s)].index = s;
        stages[static_cast<size_t>(s)].pp = s % 2;
        stages[static_cast<size_t>(s)].buckets = {1000};
    }
    Graph g = assemble(o, stages, ScheduleKind::interleaved_1f1b, 2, 1, 2, 8);
    ASSERT_TRUE(verify(g).empty()) << all(verify(g));
    // Rank 2 (dp 1, pp 0) swaps its two reductions.
    auto& acts = g.ranks[2].actions;
    std::vector<size_t> at;
    for (size_t i = 0; i < acts.size(); ++i)
        if (acts[i].kind == ActionKind::reduce_grad) at.push_back(i);
    ASSERT_EQ(at.size(), 2u);
    std::swap(acts[at[0]], acts[at[1]]);
    std::vector<PlanError> e = verify(g);
    ASSERT_EQ(e.size(), 1u);
    EXPECT_EQ(e[0].message, "ranks 0 and 2 enter their data-parallel collectives in different "
                            "orders: collective 1 is `2REDUCE_GRAD0` on rank 0 but "
                            "`0REDUCE_GRAD0` on rank 2");
}

TEST(Verify, AWeightGradientBeforeItsInputGradientIsReported) {
    PlanResult r = plan_text(script("0F0 0F1 0I0 0W0 0I1 0W1", "1F0 1W0 1I0 1F1 1I1 1W1"));
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.errors[0].message.find("runs `1W0` before its input gradient `1I0`"),
              std::string::npos)
        << all(r.errors);
}

TEST(Verify, AComputeBeforeItsReceiveOrASendBeforeItsComputeIsReported) {
    PlanResult r = schedule_graph(ScheduleKind::one_f_one_b, 2, 2, 1);
    ASSERT_TRUE(r.ok());
    // Rank 1 starts with `1RECV_F0<r0 1F0`: swap them.
    Graph g = *r.graph;
    std::swap(g.ranks[1].actions[0], g.ranks[1].actions[1]);
    std::vector<PlanError> e = verify(g);
    ASSERT_FALSE(e.empty());
    EXPECT_EQ(e[0].message, "rank 1 runs `1F0` before its input is received (`1RECV_F0`)");
    // Rank 0 starts with `0F0 0SEND_F0>r1`: swap them.
    g = *r.graph;
    std::swap(g.ranks[0].actions[0], g.ranks[0].actions[1]);
    e = verify(g);
    ASSERT_FALSE(e.empty());
    EXPECT_EQ(e[0].message, "rank 0 runs `0SEND_F0>r1` before its forward `0F0`");
}
