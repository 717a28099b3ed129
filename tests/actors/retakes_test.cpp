// retakes_test.cpp: `dist calibrate` takes a timing again where its host stole from it, with a
// stand-in for /proc/stat whose steal each test sets try by try; and says how far the machine's
// pace moved between the passes of its probes.
#include "cli/calibrate_parts.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

namespace dist::cli::calibration {
namespace {

// The CPUs' ticks as a test moves them: each try runs 1000 ticks of which `stolen` the host's.
struct FakeHost {
    runtime::CpuTicks now{5000, 100};
    std::vector<int> read_last{-1}; // the CPUs the last reading was of
    void run(int64_t stolen) {
        now.all += 1000;
        now.steal += stolen;
    }
    Retakes::Reader reader() {
        return [this](const std::vector<int>& cpus) {
            read_last = cpus;
            return now;
        };
    }
};

// Takes one timing whose tries are stolen from as `steal` says, try by try; the tries made and
// the one kept (its index).
struct Taken {
    std::string error;
    int tries = 0, kept = -1, keeps = 0;
};
Taken take(Retakes& r, FakeHost& host, const std::vector<int64_t>& steal, int fails_at = -1) {
    Taken t;
    int tried = -1;
    t.error = r.take(
        {0},
        [&]() -> std::string {
            tried = t.tries++;
            if (tried == fails_at) return "the probe failed";
            host.run(steal.at(static_cast<size_t>(tried)));
            return "";
        },
        [&] {
            t.kept = tried;
            ++t.keeps;
        });
    return t;
}

// The tries a timing took and the one kept, and the tally of retakes so far.
void expect_taken(const Taken& t, const Retakes& r, int tries, int kept, int retaken, int stolen) {
    EXPECT_EQ(t.tries, tries);
    EXPECT_EQ(t.kept, kept);
    EXPECT_EQ(r.retaken(), retaken);
    EXPECT_EQ(r.stolen(), stolen);
}

// A host and a calibration's retakes with a minute to spend.
class RetakesOnAHost : public ::testing::Test {
  protected:
    FakeHost host;
    Retakes r{60, host.reader()};
};

TEST_F(RetakesOnAHost, AQuietTimingIsTakenOnce) {
    expect_taken(take(r, host, {0}), r, 1, 0, 0, 0);
    EXPECT_EQ(host.read_last, std::vector<int>{0}); // the CPU the timing was held to, alone
    EXPECT_DOUBLE_EQ(r.share(), 0.0);
}

TEST_F(RetakesOnAHost, ATimingOnNoCpuInParticularReadsTheProcesssCpus) {
    EXPECT_EQ(r.take(
                  {}, [] { return std::string(); }, [] {}),
              "");
    EXPECT_EQ(host.read_last, allowed_cpus());
}

TEST_F(RetakesOnAHost, AStolenTimingIsTakenAgainUntilQuiet) {
    expect_taken(take(r, host, {200, 0}), r, 2, 1, 1, 0);
    EXPECT_DOUBLE_EQ(r.worst(), 0.0);
    EXPECT_DOUBLE_EQ(r.share(), 200.0 / 2000.0); // the host's share of everything since
}

TEST_F(RetakesOnAHost, AtMostThreeTriesAndTheLeastStolenKept) {
    const Taken t = take(r, host, {300, 100, 200});
    expect_taken(t, r, 3, 1, 2, 1); // kept the 10%, not the last try's 20%
    EXPECT_EQ(t.keeps, 2);          // the first, then the second, each less stolen than before
    EXPECT_DOUBLE_EQ(r.worst(), 0.1);
}

TEST_F(RetakesOnAHost, ASteadyLowStealIsNoReason) {
    // 5% is at the bound, not beyond it.
    EXPECT_EQ(take(r, host, {50}).tries, 1);
    EXPECT_EQ(r.retaken(), 0);
}

TEST(Retakes, OneTickOfAShortTimingIsNotSteal) {
    runtime::CpuTicks now{5000, 100};
    Retakes r(60, [&](const std::vector<int>&) { return now; });
    int tries = 0;
    const std::string e = r.take(
        {0},
        [&]() -> std::string {
            ++tries;
            now.all += 10; // 10% of ten ticks
            now.steal += 1;
            return "";
        },
        [] {});
    EXPECT_EQ(e, "");
    EXPECT_EQ(tries, 1);
    EXPECT_EQ(r.stolen(), 0);
}

TEST_F(RetakesOnAHost, NoRetakesOnceTheBudgetIsSpent) {
    Retakes spent(0, host.reader());
    expect_taken(take(spent, host, {300, 0}), spent, 1, 0, 0, 1);
    EXPECT_DOUBLE_EQ(spent.worst(), 0.3);
}

TEST_F(RetakesOnAHost, AnErrorEndsTheTries) {
    const Taken t = take(r, host, {300, 0}, 1);
    EXPECT_EQ(t.error, "the probe failed");
    EXPECT_EQ(t.tries, 2);
}

TEST_F(RetakesOnAHost, TheProfileSaysWhatWasStolenAndAWarningOnlyWhereSomeWasKept) {
    take(r, host, {300, 0});
    std::ostringstream quiet;
    warn_if_stolen(r, quiet);
    EXPECT_EQ(quiet.str(), ""); // taken again, and the retake was quiet
    const std::string lines = steal_lines(r);
    EXPECT_NE(lines.find("took 15.0% of these cores' time"), std::string::npos) << lines;
    EXPECT_NE(lines.find("taken again: 1."), std::string::npos) << lines;
    EXPECT_EQ(lines.find("kept so even then"), std::string::npos) << lines;
    for (size_t at = 0; at < lines.size(); at = lines.find('\n', at) + 1)
        EXPECT_EQ(lines[at], '#') << lines; // comments: the profile's numbers are unchanged

    Retakes spent(0, host.reader());
    take(spent, host, {250});
    std::ostringstream warned;
    warn_if_stolen(spent, warned);
    EXPECT_NE(warned.str().find("over 5.0% of the time of 1 timings kept"), std::string::npos)
        << warned.str();
    EXPECT_NE(steal_lines(spent).find("kept so even then: 1 (the most 25.0%)"), std::string::npos)
        << steal_lines(spent);
}

// A host that steals a fifth of the first try of the first timing and nothing after: each
// reading moves the ticks on by 1000, the first try's second reading with 200 of them stolen.
Retakes::Reader steals_first_try() {
    auto reads = std::make_shared<int>(0);
    auto now = std::make_shared<runtime::CpuTicks>(runtime::CpuTicks{5000, 100});
    return [reads, now](const std::vector<int>&) {
        now->all += 1000;
        if (++*reads == 3) now->steal += 200; // the construction's, then the try's two
        return *now;
    };
}

TEST(Sweeps, AStolenSweepIsTakenAgainAndOnlyTheKeptTrysRowsAdded) {
    Retakes r(60, steals_first_try());
    std::ostringstream err;
    Progress progress(err, 10);
    progress.tick("before");
    std::vector<int> out = {-1};
    int tries = 0;
    const std::string e = sweep_under<int>(r, progress, out, [&](std::vector<int>& rows) {
        ++tries;
        for (int i = 0; i < 3; ++i) {
            rows.push_back(10 * tries + i);
            progress.tick("rows");
        }
        return std::string();
    });
    EXPECT_EQ(e, "");
    EXPECT_EQ(tries, 2);
    EXPECT_EQ(r.retaken(), 1);
    EXPECT_EQ(out, (std::vector<int>{-1, 20, 21, 22})); // the quiet second try's, once
    EXPECT_EQ(progress.done(), 4); // the retake redrew its three steps, not added to them
}

TEST(Sweeps, EachTransportsMessagesOnceWhenTheirSweepIsTakenAgain) {
    Retakes r(60, steals_first_try());
    std::ostringstream err;
    const std::vector<int64_t> message = {256, 4096};
    Progress progress(err, 3 * static_cast<int>(message.size()));
    std::vector<std::string> skipped;
    const std::vector<TransferSample> got = measure_transfers(message, progress, r, skipped);
    EXPECT_EQ(r.retaken(), 1); // the in-process fabric's sweep, the first
    std::map<std::string, std::vector<int64_t>> sizes;
    for (const TransferSample& t : got) {
        EXPECT_GT(t.seconds, 0) << t.transport << " " << t.bytes;
        sizes[t.transport].push_back(t.bytes);
    }
    EXPECT_EQ(sizes["inprocess"], message);
    for (const char* ucx : {"ucx-sm", "ucx-tcp"}) {
        const bool named = std::any_of(skipped.begin(), skipped.end(),
                                       [&](const std::string& s) { return s.rfind(ucx, 0) == 0; });
        if (!named) {
            EXPECT_EQ(sizes[ucx], message) << ucx;
        }
    }
    EXPECT_EQ(progress.done(), static_cast<int>(got.size()));
}

// The pace moved by the slowest pass over the fastest, in whichever set of passes moved more;
// one pass alone is no movement.
TEST(OtherLoad, TheProfileSaysWhatOtherProcessesUsedAndWarnsBeyondATenth) {
    const std::string lines = others_lines(0.234);
    EXPECT_NE(lines.find("used 23.4% of these cores' time while this ran"), std::string::npos)
        << lines;
    for (size_t at = 0; at < lines.size(); at = lines.find('\n', at) + 1)
        EXPECT_EQ(lines[at], '#') << lines; // comments only
    std::ostringstream quiet, busy;
    warn_if_others(0.10, "while this ran", quiet);
    EXPECT_EQ(quiet.str(), "");
    warn_if_others(0.4, "over the last half second", busy);
    EXPECT_NE(busy.str().find("used 40.0% of its cores' time over the last half second"),
              std::string::npos)
        << busy.str();
}

TEST(PaceMoved, TheSlowestPassOverTheFastestInEitherSet) {
    EXPECT_NEAR(pace_moved({1.0, 1.1, 0.95}, {1.0, 1.02}), 1.1 / 0.95 - 1, 1e-12);
    EXPECT_NEAR(pace_moved({1.0, 1.02}, {0.9, 1.08}), 0.2, 1e-12);
    EXPECT_DOUBLE_EQ(pace_moved({1.3}, {}), 0.0);
    EXPECT_DOUBLE_EQ(pace_moved({}, {}), 0.0);
}

TEST(PaceMoved, TheProfileListsEachPassAndWarnsOnlyBeyondATenth) {
    const std::string steady = pace_lines({1.0, 1.05}, {0.99, 1.01});
    EXPECT_NE(steady.find("on all the cores 1.0, 1.05\n# on one thread 0.99, 1.01\n"),
              std::string::npos)
        << steady;
    EXPECT_NE(steady.find("took 5.0% longer than the fastest."), std::string::npos) << steady;
    for (size_t at = 0; at < steady.size(); at = steady.find('\n', at) + 1)
        EXPECT_EQ(steady[at], '#') << steady; // comments: the profile's numbers are unchanged
    std::ostringstream quiet;
    warn_if_moved({1.0, 1.08}, {}, quiet); // within a tenth
    EXPECT_EQ(quiet.str(), "");

    const std::string moved = pace_lines({1.0, 0.8, 1.0}, {});
    EXPECT_NE(moved.find("took 25.0% longer than the fastest (over 10.0%"), std::string::npos)
        << moved;
    std::ostringstream warned;
    warn_if_moved({1.0, 0.8, 1.0}, {}, warned);
    EXPECT_NE(warned.str().find("took 25.0% longer than the fastest"), std::string::npos)
        << warned.str();
    EXPECT_EQ(pace_lines({1.2}, {}), ""); // one pass: nothing to say
}

// The pipelines beyond the cores whose passes ran apart: always in the profile, on stderr from
// half of them on.
TEST(PaceMoved, PipelinesWhosePassesRanApartWarnFromHalfOfThem) {
    EXPECT_NE(apart_lines(1, 8).find("(each timed a third time, the median kept): 1 of 8.\n"),
              std::string::npos)
        << apart_lines(1, 8);
    EXPECT_EQ(apart_lines(0, 0), ""); // one core: no pipelines beyond it
    std::ostringstream few, half, none;
    warn_if_apart(3, 8, few);
    EXPECT_EQ(few.str(), "");
    warn_if_apart(4, 8, half);
    EXPECT_NE(half.str().find("4 of 8 pipelines beyond the cores ran their two passes over 10.0%"),
              std::string::npos)
        << half.str();
    warn_if_apart(0, 0, none);
    EXPECT_EQ(none.str(), "");
}

} // namespace
} // namespace dist::cli::calibration
