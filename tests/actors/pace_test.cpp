// pace_test.cpp: the profile's matmul that `dist run` and the REPL's `run` time again around a
// run, and the line that says whether the machine ran as calibrated (cli/pace.hpp).
#include "cli/pace.hpp"

#include <gtest/gtest.h>

#include <omp.h>

#include <cmath>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace dist::cli {
namespace {

MatmulRate row(const std::string& kernel, int64_t m, int64_t n, int64_t k, int32_t threads,
               double warm) {
    return {kernel, m, n, k, threads, 1e10, warm};
}

Calibration cpu_calibration() {
    Calibration c;
    c.cores = 2;
    c.date = "2026-12-07T11:18:38Z";
    c.matmul = {
        row("nt", 512, 512, 512, 1, 9e10),    // one thread: fewer than the most measured
        row("nt", 128, 128, 128, 2, 1.2e11),  // smaller than the square one below
        row("nt", 32, 2048, 2048, 2, 1.5e11), // as many FLOPs as 512^3, far from square
        row("nt", 512, 512, 512, 2, 1.8e11),  // the one
        row("nt", 2048, 2048, 2048, 2, 2e11), // beyond 512^3: a tenth of a second a call
        row("nn", 512, 512, 512, 4, 1.8e11),  // not a forward
        row("nt", 512, 512, 512, 4, 0),       // no warm rate (a profile that did not time it)
    };
    return c;
}

TEST(Pace, TheReferenceIsTheSquarestForwardUpTo512CubedOnTheMostThreads) {
    std::optional<MatmulRate> r = pace_reference(cpu_calibration());
    ASSERT_TRUE(r);
    EXPECT_EQ(r->kernel, "nt");
    EXPECT_EQ(std::make_tuple(r->m, r->n, r->k, r->threads), std::make_tuple(512, 512, 512, 2));
    EXPECT_EQ(r->warm, 1.8e11);
}

// A profile that timed the row beside its probes names it: that row at that rate, whatever
// its matmul rows hold.
TEST(Pace, TheProfilesPaceRowIsTheReference) {
    Calibration c = cpu_calibration();
    c.pace = row("nt", 256, 256, 256, 1, 5e10);
    std::optional<MatmulRate> r = pace_reference(c);
    ASSERT_TRUE(r);
    EXPECT_EQ(std::make_tuple(r->m, r->n, r->k, r->threads), std::make_tuple(256, 256, 256, 1));
    EXPECT_EQ(r->warm, 5e10);
    c.device = "cuda";
    EXPECT_FALSE(pace_reference(c));
}

// The row's rate at the probes' kept pace: each pass's timings (the geometric mean of before
// and after) times that pass's pace, the median over the passes.
TEST(Pace, TheRowIsSetAtThePaceTheProbesKept) {
    // Three passes 4-5% slower than the times kept and a fourth 17% faster, the row slowed and
    // sped up alike: every pass says the same rate at the kept pace.
    const double rate = 1.6e11;
    const std::vector<double> pace{1.012, 1.039, 1.052, 0.834};
    std::vector<double> before, after;
    for (double p : pace) {
        before.push_back(rate / p * 0.98);
        after.push_back(rate / p / 0.98);
    }
    EXPECT_NEAR(pace_at_kept(before, after, pace), rate, 1e-6 * rate);
    // (Timed only after the fast last pass, the row would have read 1 / 0.834, 1.2 times it.)
    EXPECT_GT(after.back(), 1.15 * pace_at_kept(before, after, pace));
    // A pass whose timing met a burst of other work (half the rate) leaves the median as it was.
    std::vector<double> burst = after;
    burst[2] /= 2;
    EXPECT_NEAR(pace_at_kept(before, burst, pace), rate, 1e-6 * rate);
    // A pass without both timings, or without a pace, is left out; none left: no rate.
    EXPECT_NEAR(pace_at_kept({before[0], 0.0}, {after[0], after[1]}, pace), rate, 1e-6 * rate);
    EXPECT_NEAR(pace_at_kept(before, after, {pace[0]}), rate, 1e-6 * rate);
    EXPECT_EQ(pace_at_kept({}, {}, pace), 0.0);
    EXPECT_EQ(pace_at_kept(before, after, {}), 0.0);
}

TEST(Pace, NoReferenceWithoutACpuCalibrationsWarmForwards) {
    Calibration datasheet = cpu_calibration();
    datasheet.cores = 0; // a datasheet profile's calibration is empty
    EXPECT_FALSE(pace_reference(datasheet));
    Calibration gpu = cpu_calibration();
    gpu.device = "cuda"; // its rows are a GPU's kernels
    EXPECT_FALSE(pace_reference(gpu));
    Calibration cold = cpu_calibration();
    for (MatmulRate& m : cold.matmul) m.warm = 0;
    EXPECT_FALSE(pace_reference(cold));
    EXPECT_EQ(PaceCheck(HardwareProfile{}).after(), "");
}

TEST(Pace, TheLineSaysWhichWayTheRunsPaceMovedBeyondATenth) {
    const MatmulRate ref = row("nt", 512, 512, 512, 2, 1.8e11);
    const std::string calm = pace_note(ref, 0.95, 1.08, "2026-12-07");
    EXPECT_NE(calm.find("the profile's nt matmul 512 x 512 x 512 on 2 threads ran at 0.95x and "
                        "1.08x its calibrated rate (2026-12-07) before and after the run"),
              std::string::npos)
        << calm;
    EXPECT_NE(calm.find("ran as calibrated"), std::string::npos) << calm;
    // The run's pace is the geometric mean of the two: 0.8 and 1.0 make 0.894, a tenth and
    // more slow; 0.85 and 1.0 make 0.922, and 1.2 and 0.8 0.980, within it.
    const std::string slow = pace_note(ref, 0.8, 1.0, "2026-12-07");
    EXPECT_NE(slow.find("slower than calibrated"), std::string::npos) << slow;
    EXPECT_NE(pace_note(ref, 1.0, 0.8, "d").find("slower than calibrated"), std::string::npos);
    EXPECT_NE(pace_note(ref, 0.85, 1.0, "d").find("ran as calibrated"), std::string::npos);
    EXPECT_NE(pace_note(ref, 1.2, 0.8, "d").find("ran as calibrated"), std::string::npos);
    // 1.1 and 1.15 make 1.125.
    const std::string fast = pace_note(row("nt", 256, 256, 256, 1, 9e10), 1.1, 1.15, "d");
    EXPECT_NE(fast.find("on 1 thread ran"), std::string::npos) << fast;
    EXPECT_NE(fast.find("faster than calibrated"), std::string::npos) << fast;
    EXPECT_NE(pace_note(ref, 1.0, 1.15, "d").find("ran as calibrated"), std::string::npos);
}

// Timed for real: a rate over the row's, and the caller's OpenMP threads as they were.
TEST(Pace, TimingTheRowLeavesTheCallersThreadsAsTheyWere) {
    omp_set_num_threads(3);
    const MatmulRate ref = row("nt", 64, 64, 64, 1, 1e9);
    const double pace = pace_now(ref, 0.001);
    EXPECT_TRUE(std::isfinite(pace));
    EXPECT_GT(pace, 0);
    EXPECT_EQ(omp_get_max_threads(), 3);
}

} // namespace
} // namespace dist::cli
