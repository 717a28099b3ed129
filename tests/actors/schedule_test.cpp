// schedule_test.cpp: the schedule compilers against published facts, at the unit costs of the
// zero-bubble paper (F = 1, B = 2, I = W = 1, communication 0), and small orders derived by
// hand from the papers' figures.
#include "actors/plan/lower.hpp"
#include "actors/sim/simulate.hpp"

#include <gtest/gtest.h>

#include <sstream>

using namespace dist;
using namespace dist::plan;

namespace {

sim::Timeline unit(ScheduleKind kind, int32_t p, int32_t m, int32_t v = 1) {
    PlanResult r = schedule_graph(kind, p, m, v);
    EXPECT_TRUE(r.ok()) << to_string(kind) << " p=" << p << " m=" << m << " v=" << v << ": "
                        << render_errors("", r.errors);
    if (!r.ok()) return {};
    sim::SimOptions o;
    o.cost = sim::CostModel::unit;
    sim::SimResult s = sim::simulate(*r.graph, Program{}, o);
    EXPECT_TRUE(s.ok());
    return s.ok() ? *s.timeline : sim::Timeline{};
}

// The compute actions of pipeline rank r, joined by spaces.
std::string order(ScheduleKind kind, int32_t p, int32_t m, int32_t r, int32_t v = 1) {
    ScheduleOrder o = compile_schedule(kind, p, m, v);
    if (!o.error.empty()) return "error: " + o.error;
    std::string out;
    for (const PlanAction& a : o.ranks[static_cast<size_t>(r)]) {
        if (!out.empty()) out += ' ';
        out += to_string(a);
        if (a.overlap_next) out += '+';
    }
    return out;
}

} // namespace

// GPipe and 1F1B: the bubble is (p-1)/(m+p-1) of the step (Huang et al.; Narayanan et al.).
TEST(Schedules, GpipeAnd1f1bBubbleIsPMinusOneOverMPlusPMinusOne) {
    for (ScheduleKind k : {ScheduleKind::gpipe, ScheduleKind::one_f_one_b}) {
        for (int32_t p : {1, 2, 3, 4, 8}) {
            for (int32_t m : {1, 2, 3, 4, 8, 16}) {
                sim::Timeline t = unit(k, p, m);
                double expected = static_cast<double>(p - 1) / (m + p - 1);
                EXPECT_NEAR(t.bubble_fraction, expected, 1e-12)
                    << to_string(k) << " p=" << p << " m=" << m;
                EXPECT_DOUBLE_EQ(t.makespan, 3.0 * (m + p - 1));
            }
        }
    }
}

// Interleaved 1F1B: idle / busy on each rank is (p-1)/(v m) (Narayanan et al. 2021, sec. 2.2).
TEST(Schedules, InterleavedIdleOverBusyIsPMinusOneOverVM) {
    for (int32_t p : {2, 4}) {
        for (int32_t v : {2, 3}) {
            for (int32_t m : {p, 2 * p, 4 * p}) {
                sim::Timeline t = unit(ScheduleKind::interleaved_1f1b, p, m, v);
                for (const sim::RankReport& r : t.ranks) {
                    EXPECT_NEAR(r.idle / r.busy, static_cast<double>(p - 1) / (v * m), 1e-12)
                        << "p=" << p << " v=" << v << " m=" << m << " rank " << r.rank;
                }
            }
        }
    }
}

// ZB-H1: every rank idles (p-1)(T_F + T_B - T_W) (Qi et al. 2024), where the paper's B is the
// input gradient (our I): (p-1)(1 + 1 - 1) = p-1 at unit costs, a third of 1F1B's 3(p-1).
TEST(Schedules, ZbH1IdleIsPMinusOneTimesFPlusBMinusW) {
    for (int32_t p : {2, 3, 4, 6}) {
        for (int32_t m : {p, p + 1, 2 * p, 3 * p}) {
            sim::Timeline t = unit(ScheduleKind::zb_h1, p, m);
            for (const sim::RankReport& r : t.ranks)
                EXPECT_DOUBLE_EQ(r.idle, 1.0 * (p - 1))
                    << "p=" << p << " m=" << m << " rank " << r.rank;
        }
    }
}

// ZB-H2 and ZBV: no bubble inside any rank's span at unit costs.
TEST(Schedules, ZbH2AndZbvAreBubbleFreeInsideEachRanksSpan) {
    for (ScheduleKind k : {ScheduleKind::zb_h2, ScheduleKind::zbv}) {
        int32_t v = k == ScheduleKind::zbv ? 2 : 1;
        for (int32_t p : {2, 3, 4, 6}) {
            for (int32_t m : {2 * p - 1, 2 * p, 3 * p, 4 * p + 1}) {
                sim::Timeline t = unit(k, p, m, v);
                for (const sim::RankReport& r : t.ranks) {
                    EXPECT_DOUBLE_EQ(r.last_end - r.first_start, r.busy)
                        << to_string(k) << " p=" << p << " m=" << m << " rank " << r.rank;
                    EXPECT_DOUBLE_EQ(r.busy, 3.0 * m * v);
                }
            }
        }
    }
}

// Activations in flight: p - r on rank r for 1F1B, m for GPipe, 2p - 1 at most for ZB-H2.
TEST(Schedules, PeakInflightMicrobatches) {
    for (int32_t p : {2, 3, 4}) {
        for (int32_t m : {2 * p - 1, 3 * p}) {
            sim::Timeline f = unit(ScheduleKind::one_f_one_b, p, m);
            sim::Timeline g = unit(ScheduleKind::gpipe, p, m);
            sim::Timeline z = unit(ScheduleKind::zb_h2, p, m);
            int32_t zmax = 0;
            for (int32_t r = 0; r < p; ++r) {
                EXPECT_EQ(f.ranks[static_cast<size_t>(r)].peak_inflight_microbatches, p - r);
                EXPECT_EQ(g.ranks[static_cast<size_t>(r)].peak_inflight_microbatches, m);
                zmax = std::max(zmax, z.ranks[static_cast<size_t>(r)].peak_inflight_microbatches);
            }
            EXPECT_EQ(zmax, 2 * p - 1) << "p=" << p << " m=" << m;
            EXPECT_EQ(z.ranks[0].peak_inflight_microbatches, 2 * p - 1);
        }
    }
}

// ZB-H1 keeps 1F1B's peak memory (Qi et al. 2024): no rank holds more than the p microbatches
// that 1F1B's first rank holds; the W passes a later rank holds back make up its shorter warm-up.
TEST(Schedules, ZbH1PeakMemoryIsThatOf1f1b) {
    for (int32_t p : {2, 3, 4, 6}) {
        for (int32_t m : {p, 2 * p, 3 * p}) {
            sim::Timeline z = unit(ScheduleKind::zb_h1, p, m);
            for (const sim::RankReport& r : z.ranks)
                EXPECT_EQ(r.peak_inflight_microbatches, p) << "p=" << p << " m=" << m;
        }
    }
}

// Orders derived by hand from the papers' figures.
TEST(Schedules, SmallOrdersByHand) {
    EXPECT_EQ(order(ScheduleKind::gpipe, 2, 3, 1), "1F0 1F1 1F2 1B0 1B1 1B2");
    // 1F1B, p = 2, m = 3: rank 0 warms up with one forward, rank 1 alternates from the start.
    EXPECT_EQ(order(ScheduleKind::one_f_one_b, 2, 3, 0), "0F0 0F1 0B0 0F2 0B1 0B2");
    EXPECT_EQ(order(ScheduleKind::one_f_one_b, 2, 3, 1), "1F0 1B0 1F1 1B1 1F2 1B2");
    // 1F1B, p = 4, m = 4, rank 1: two warm-up forwards.
    EXPECT_EQ(order(ScheduleKind::one_f_one_b, 4, 4, 1), "1F0 1F1 1F2 1B0 1F3 1B1 1B2 1B3");
    // Interleaved, p = 2, v = 2, m = 4, rank 0: stages 0 and 2; forwards in groups of p = 2
    // microbatches per stage, warm-up (v-1)p + 2(p-1-r) = 4, backwards from the last stage.
    EXPECT_EQ(order(ScheduleKind::interleaved_1f1b, 2, 4, 0, 2),
              "0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 2B2 2B3 0B2 0B3");
    // Looped BFS, p = 2, v = 2, m = 2, rank 1: stage 1 then stage 3 forward; backwards reversed.
    EXPECT_EQ(order(ScheduleKind::looped_bfs, 2, 2, 1, 2), "1F0 1F1 3F0 3F1 3B1 3B0 1B1 1B0");
    // ZB-H1, p = 2, m = 2: rank 1 holds back one W to fill the cool-down; rank 0 does not.
    EXPECT_EQ(order(ScheduleKind::zb_h1, 2, 2, 0), "0F0 0F1 0I0 0W0 0I1 0W1");
    EXPECT_EQ(order(ScheduleKind::zb_h1, 2, 2, 1), "1F0 1I0 1F1 1I1 1W0 1W1");
    // ZB-H2, p = 2, m = 3: rank 0 fills the wait for its first I with 2p-1 = 3 forwards;
    // rank 1 banks its W passes for the end (the parallelogram).
    EXPECT_EQ(order(ScheduleKind::zb_h2, 2, 3, 0), "0F0 0F1 0F2 0I0 0W0 0I1 0W1 0I2 0W2");
    EXPECT_EQ(order(ScheduleKind::zb_h2, 2, 3, 1), "1F0 1I0 1F1 1I1 1F2 1I2 1W0 1W1 1W2");
    // ZBV, p = 2: rank 1 owns stages 1 and 2, the bottom of the V: 2(p-r)-1 = 1 forward of
    // stage 1, r = 1 pair of forwards (2F0 1F1), then p-r = 1 triple F, I, W on stage 2.
    std::string v1 = order(ScheduleKind::zbv, 2, 3, 1, 2);
    EXPECT_EQ(v1.substr(0, 23), "1F0 2F0 1F1 2F1 2I0 2W0");
}

TEST(Schedules, EveryKindIsSoundOverARangeOfShapes) {
    for (int k = 0; k < static_cast<int>(ScheduleKind::custom); ++k) {
        ScheduleKind kind = static_cast<ScheduleKind>(k);
        for (int32_t p : {1, 2, 3, 4, 5}) {
            for (int32_t m : {1, 2, 3, 4, 5, 8, 9, 10, 16}) {
                for (int32_t v : {1, 2, 3}) {
                    if (!compile_schedule(kind, p, m, v).error.empty())
                        continue; // refused up front (RefusalsSayWhatWouldWork)
                    PlanResult r = schedule_graph(kind, p, m, v);
                    EXPECT_TRUE(r.ok()) << to_string(kind) << " p=" << p << " m=" << m << " v=" << v
                                        << ": " << render_errors("", r.errors);
                }
            }
        }
    }
}

TEST(Schedules, RefusalsSayWhatWouldWork) {
    PlanResult r = schedule_graph(ScheduleKind::zbv, 4, 3, 2);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.errors[0].hint.find("use 4 or more microbatches"), std::string::npos);
    r = schedule_graph(ScheduleKind::dualpipev, 3, 5, 2);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.errors[0].hint.find("use 6 or more"), std::string::npos);
    r = schedule_graph(ScheduleKind::interleaved_1f1b, 4, 6, 2);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.errors[0].hint.find("use 8 microbatches"), std::string::npos);
}
