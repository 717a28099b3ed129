// steal.cpp: reading the host's steal, and other processes' busy time, from /proc/stat.
#include "actors/runtime/steal.hpp"

#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>

namespace dist::runtime {

namespace {

// The ticks of one line's fields after its label: user, nice, system, idle, iowait, irq,
// softirq, steal (the guest fields that follow are counted in user already); false where it
// has fewer than eight numbers.
bool line_ticks(std::string_view fields, CpuTicks& out) {
    CpuTicks t;
    size_t at = 0;
    for (int k = 0; k < 8; ++k) {
        while (at < fields.size() && fields[at] == ' ') ++at;
        int64_t v = 0;
        const char* first = fields.data() + at;
        const auto [end, ec] = std::from_chars(first, fields.data() + fields.size(), v);
        if (ec != std::errc() || end == first || v < 0) return false;
        at += static_cast<size_t>(end - first);
        t.all += v;
        if (k == 3 || k == 4) t.idle += v;
        if (k == 7) t.steal = v;
    }
    out = t;
    return true;
}

} // namespace

CpuTicks cpu_ticks(std::string_view stat, const std::vector<int>& cpus) {
    CpuTicks sum;
    while (!stat.empty()) {
        const size_t eol = std::min(stat.find('\n'), stat.size());
        std::string_view line = stat.substr(0, eol);
        stat.remove_prefix(std::min(eol + 1, stat.size()));
        if (line.substr(0, 3) != "cpu") continue;
        const size_t space = line.find(' ');
        if (space == std::string_view::npos) continue;
        const std::string_view label = line.substr(3, space - 3);
        bool wanted = false;
        if (cpus.empty()) {
            wanted = label.empty();
        } else if (!label.empty()) {
            int n = -1;
            const auto [end, ec] = std::from_chars(label.data(), label.data() + label.size(), n);
            wanted = ec == std::errc() && end == label.data() + label.size() &&
                     std::find(cpus.begin(), cpus.end(), n) != cpus.end();
        }
        CpuTicks t;
        if (wanted && line_ticks(line.substr(space), t)) {
            sum.all += t.all;
            sum.steal += t.steal;
            sum.idle += t.idle;
        }
    }
    return sum;
}

CpuTicks read_cpu_ticks(const std::vector<int>& cpus) {
    std::ifstream in("/proc/stat");
    if (!in) return {};
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    return cpu_ticks(text, cpus);
}

double stolen_share(const CpuTicks& before, const CpuTicks& after) {
    const int64_t all = after.all - before.all;
    const int64_t steal = after.steal - before.steal;
    if (all <= 0 || steal <= 0) return 0.0;
    return std::min(1.0, static_cast<double>(steal) / static_cast<double>(all));
}

std::vector<int> allowed_cpus() {
    cpu_set_t mask;
    CPU_ZERO(&mask);
    std::vector<int> cpus;
    if (sched_getaffinity(0, sizeof mask, &mask) != 0) return cpus;
    for (int c = 0; c < CPU_SETSIZE; ++c)
        if (CPU_ISSET(c, &mask)) cpus.push_back(c);
    return cpus;
}

namespace {

// User and system seconds of getrusage's `who` (RUSAGE_SELF, RUSAGE_CHILDREN); 0 unread.
double rusage_seconds(int who) {
    rusage u{};
    if (getrusage(who, &u) != 0) return 0.0;
    auto of = [](const timeval& t) {
        return static_cast<double>(t.tv_sec) + 1e-6 * static_cast<double>(t.tv_usec);
    };
    return of(u.ru_utime) + of(u.ru_stime);
}

} // namespace

double process_cpu_seconds(bool with_children) {
    return rusage_seconds(RUSAGE_SELF) + (with_children ? rusage_seconds(RUSAGE_CHILDREN) : 0.0);
}

double others_share(const CpuTicks& before, const CpuTicks& after, double own_s, double tick_s) {
    const int64_t all = after.all - before.all;
    if (all <= 0 || !(tick_s > 0)) return 0.0;
    const int64_t busy = all - (after.idle - before.idle) - (after.steal - before.steal);
    const double others = static_cast<double>(busy) - std::max(0.0, own_s) / tick_s;
    return std::clamp(others / static_cast<double>(all), 0.0, 1.0);
}

OtherLoad::OtherLoad(bool with_children)
    : with_children_(with_children), cpus_(allowed_cpus()), start_(read_cpu_ticks(cpus_)),
      own_s_(process_cpu_seconds(with_children)) {}

double OtherLoad::share() const {
    const long hz = ::sysconf(_SC_CLK_TCK);
    return others_share(start_, read_cpu_ticks(cpus_), process_cpu_seconds(with_children_) - own_s_,
                        hz > 0 ? 1.0 / static_cast<double>(hz) : 0.0);
}

namespace {

// A run's line where `share` of the cores' time, beyond `limit`, went elsewhere: `who` took it
// ("the host took"), of `what` ("this machine's time during the run").
std::string slower_note(double share, double limit, const char* who, const char* what) {
    if (!(share > limit)) return "";
    char buf[200];
    std::snprintf(buf, sizeof buf,
                  "(%s %.1f%% of %s: the measured steps are slower than the machine is)", who,
                  100 * share, what);
    return buf;
}

} // namespace

std::string others_note(double share) {
    return slower_note(share, kOthersShare, "other processes on this machine used",
                       "its cores' time during the run");
}

std::string stolen_note(double share) {
    return slower_note(share, kStolenShare, "the host took",
                       "this machine's time during the run, steal in /proc/stat");
}

} // namespace dist::runtime
