// retakes_test.cpp: `dist calibrate` takes a timing again where its host stole from it, with a
// stand-in for /proc/stat whose steal each test sets try by try.
#include "cli/calibrate_parts.hpp"

#include <gtest/gtest.h>

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

} // namespace
} // namespace dist::cli::calibration
