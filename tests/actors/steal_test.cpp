// steal_test.cpp: reading the host's steal from /proc/stat's text.
#include "actors/runtime/steal.hpp"

#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

namespace dist::runtime {
namespace {

// Two CPUs' lines as Linux writes them: user nice system idle iowait irq softirq steal guest
// guest_nice; the total line is their sum.
constexpr const char* kStat = "cpu  300 0 40 1000 10 0 5 45 7 0\n"
                              "cpu0 100 0 20 500 5 0 5 40 7 0\n"
                              "cpu1 200 0 20 500 5 0 0 5 0 0\n"
                              "intr 12345 0 0\n"
                              "ctxt 999\n"
                              "btime 1700000000\n";

TEST(Steal, TheTotalLineCountsUserThroughSteal) {
    const CpuTicks t = cpu_ticks(kStat);
    EXPECT_EQ(t.all, 300 + 40 + 1000 + 10 + 5 + 45); // the guest fields are in user already
    EXPECT_EQ(t.steal, 45);
}

TEST(Steal, NamedCpusCountOnlyTheirOwnLines) {
    EXPECT_EQ(cpu_ticks(kStat, {0}).steal, 40);
    EXPECT_EQ(cpu_ticks(kStat, {0}).all, 100 + 20 + 500 + 5 + 5 + 40);
    EXPECT_EQ(cpu_ticks(kStat, {1}).steal, 5);
    const CpuTicks both = cpu_ticks(kStat, {0, 1});
    EXPECT_EQ(both.all, cpu_ticks(kStat).all);
    EXPECT_EQ(both.steal, cpu_ticks(kStat).steal);
    EXPECT_EQ(cpu_ticks(kStat, {7}).all, 0); // no such line
}

TEST(Steal, ALineWithoutItsStealFieldCountsNothing) {
    // Kernels before 2.6.11 wrote seven fields; a torn or garbled line is no better.
    EXPECT_EQ(cpu_ticks("cpu  300 0 40 1000 10 0 5\n").all, 0);
    EXPECT_EQ(cpu_ticks("cpu0 1 2 3 x 5 6 7 8\n", {0}).all, 0);
    EXPECT_EQ(cpu_ticks("cpu0 1 2 3 -4 5 6 7 8\n", {0}).all, 0);
    EXPECT_EQ(cpu_ticks("cpu10 1 1 1 1 1 1 1 1\n", {1}).all, 0); // cpu10 is not cpu1
    EXPECT_EQ(cpu_ticks("").all, 0);
}

TEST(Steal, TheShareIsStealOverAllTheTimeBetweenTwoReadings) {
    EXPECT_DOUBLE_EQ(stolen_share({1000, 50}, {1200, 100}), 0.25);
    EXPECT_DOUBLE_EQ(stolen_share({1000, 50}, {1200, 50}), 0.0);
    EXPECT_DOUBLE_EQ(stolen_share({1000, 50}, {1000, 50}), 0.0); // no time passed
    EXPECT_DOUBLE_EQ(stolen_share({}, {}), 0.0);                 // /proc/stat unread
}

TEST(Steal, ARunSaysSoOnlyWhereTheHostTookMoreThanAQuietOnesShare) {
    EXPECT_EQ(stolen_note(0.0), "");
    EXPECT_EQ(stolen_note(kStolenShare), "");
    const std::string note = stolen_note(0.2);
    EXPECT_NE(note.find("took 20.0% of this machine's time"), std::string::npos) << note;
}

TEST(Steal, ThisMachinesTicksGrowAndItsStealIsAPartOfThem) {
    const CpuTicks before = read_cpu_ticks();
    EXPECT_LE(before.steal, before.all);
    EXPECT_GE(before.steal, 0);
#ifdef __linux__
    // Every CPU's clock ticks at 100 Hz whatever it does (idle is a state too): 50 ms of it is
    // five ticks a CPU.
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const CpuTicks after = read_cpu_ticks();
    EXPECT_GT(after.all, before.all);
    EXPECT_GE(after.steal, before.steal);
#endif
}

TEST(Steal, TheIdleTicksAreIdleAndIowait) {
    EXPECT_EQ(cpu_ticks(kStat).idle, 1000 + 10);
    EXPECT_EQ(cpu_ticks(kStat, {0}).idle, 500 + 5);
}

// Worked by hand: 200 ticks of 10 ms pass, 60 of them idle and 10 stolen; of the 130 busy
// ones this process used 0.9 s, 90 ticks: the other 40 are other processes', a fifth.
TEST(OtherLoad, OthersAreTheBusyTimeBeyondThisProcesssOwn) {
    const CpuTicks before{1000, 0, 500}, after{1200, 10, 560};
    EXPECT_DOUBLE_EQ(others_share(before, after, 0.9, 0.01), 0.2);
    EXPECT_DOUBLE_EQ(others_share(before, after, 1.3, 0.01), 0.0);  // all of it this process's
    EXPECT_DOUBLE_EQ(others_share(before, after, 5.0, 0.01), 0.0);  // no less than none
    EXPECT_DOUBLE_EQ(others_share(before, before, 0.0, 0.01), 0.0); // no time passed
    EXPECT_DOUBLE_EQ(others_share({}, {}, 0.0, 0.01), 0.0);         // /proc/stat unread
}

// Forks a process that spins for 400 ms on one CPU and waits for it; whether it could.
bool spin_in_a_child() {
    const pid_t child = ::fork();
    if (child < 0) return false;
    if (child == 0) {
        const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(400);
        volatile double x = 0;
        while (std::chrono::steady_clock::now() < end) x = x + 1;
        ::_exit(0);
    }
    int status = 0;
    return ::waitpid(child, &status, 0) == child;
}

// Another process that spins while this one waits for it: its time is others', at least its
// one CPU's share of those this process may run on (more where others took the CPUs from it).
TEST(OtherLoad, AnotherProcessSpinningIsOthers) {
    const size_t cpus = allowed_cpus().size();
    ASSERT_GT(cpus, 0u);
    const OtherLoad load;
    ASSERT_TRUE(spin_in_a_child());
    const double share = load.share();
    EXPECT_GT(share, 0.5 / static_cast<double>(cpus));
    EXPECT_LE(share, 1.0);
}

// A launcher counts the children it has waited for as its own: the child's spinning is then
// not others', by at least the same share.
TEST(OtherLoad, ALaunchersChildrenAreItsOwn) {
    const size_t cpus = allowed_cpus().size();
    ASSERT_GT(cpus, 0u);
    const OtherLoad alone, with_children(true);
    ASSERT_TRUE(spin_in_a_child());
    const double without = alone.share(), with = with_children.share();
    EXPECT_GT(without - with, 0.5 / static_cast<double>(cpus)) << without << " " << with;
    EXPECT_GE(with, 0.0);
}

TEST(OtherLoad, ARunSaysSoOnlyBeyondATenth) {
    EXPECT_EQ(others_note(0.0), "");
    EXPECT_EQ(others_note(kOthersShare), "");
    const std::string note = others_note(0.35);
    EXPECT_NE(note.find("other processes on this machine used 35.0% of its cores' time"),
              std::string::npos)
        << note;
}

} // namespace
} // namespace dist::runtime
