// calibrate_steal.cpp: `dist calibrate`'s timings taken again where the host stole from them,
// and how far the machine's pace moved while it was measured.
#include "cli/calibrate_parts.hpp"

#include <algorithm>
#include <cstdio>
#include <ostream>
#include <string>
#include <utility>

namespace dist::cli::calibration {

Retakes::Retakes(double budget_s, Reader read)
    : budget_s_(budget_s), read_(std::move(read)), cpus_(allowed_cpus()), start_(read_(cpus_)) {}

std::string Retakes::take(const std::vector<int>& cpus, const std::function<std::string()>& once,
                          const std::function<void()>& keep) {
    const std::vector<int>& on = cpus.empty() ? cpus_ : cpus;
    double least = 2;
    for (int tries = 0;; ++tries) {
        const auto t0 = Clock::now();
        const runtime::CpuTicks before = read_(on);
        if (std::string e = once(); !e.empty()) return e;
        const runtime::CpuTicks after = read_(on);
        if (tries > 0) {
            spent_s_ += since(t0);
            ++retaken_;
        }
        // A tick or two of steal in a short timing is a large share of nothing much.
        const double share =
            after.steal - before.steal >= 2 ? runtime::stolen_share(before, after) : 0.0;
        if (share < least) {
            least = share;
            keep();
        }
        if (least <= kStolen || tries == 2 || spent_s_ >= budget_s_) break;
    }
    worst_ = std::max(worst_, least);
    if (least > kStolen) ++stolen_;
    return "";
}

double Retakes::share() const {
    return runtime::stolen_share(start_, read_(cpus_));
}

namespace {

std::string percent(double share) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f%%", 100 * share);
    return buf;
}

} // namespace

std::string steal_lines(const Retakes& r) {
    std::string s = "# The host took " + percent(r.share()) +
                    " of these cores' time while this ran (steal in /proc/stat: its\n# other "
                    "guests' turns). Timings it took over " +
                    percent(Retakes::kStolen) + " of, taken again: " + std::to_string(r.retaken());
    if (r.stolen() > 0)
        s += "; kept so even then: " + std::to_string(r.stolen()) + " (the most " +
             percent(r.worst()) + "),\n# their rates slow";
    return s + ".\n";
}

void warn_if_stolen(const Retakes& r, std::ostream& err) {
    if (r.stolen() == 0) return;
    err << "calibrate: warning: the host took " << percent(r.share())
        << " of these cores' time while this ran (steal in /proc/stat), and over "
        << percent(Retakes::kStolen) << " of the time of " << r.stolen()
        << " timings kept even after taking them again (the most " << percent(r.worst())
        << "): what they measured is slower than this machine; calibrate again when its host is "
           "quieter\n";
}

std::string others_lines(double share) {
    return "# Other processes on this machine used " + percent(share) +
           " of these cores' time while this ran (in /proc/stat,\n# neither idle nor stolen nor "
           "this process's own).\n";
}

void warn_if_others(double share, const std::string& when, std::ostream& err) {
    if (!(share > runtime::kOthersShare)) return;
    err << "calibrate: warning: other processes on this machine used " << percent(share)
        << " of its cores' time " << when
        << ": what is measured beside them is slower than this machine alone; calibrate when it "
           "is idle\n";
}

namespace {

// The slowest pass over the fastest, less 1; 0 for fewer than two passes.
double moved(const std::vector<double>& pace) {
    if (pace.size() < 2) return 0.0;
    const auto [least, most] = std::minmax_element(pace.begin(), pace.end());
    return *least > 0 ? *most / *least - 1 : 0.0;
}

std::string paces(const std::vector<double>& pace) {
    std::string s;
    for (double p : pace) s += (s.empty() ? "" : ", ") + number(p);
    return s;
}

} // namespace

double pace_moved(const std::vector<double>& all, const std::vector<double>& one) {
    return std::max(moved(all), moved(one));
}

std::string pace_lines(const std::vector<double>& all, const std::vector<double>& one) {
    if (all.size() < 2 && one.size() < 2) return "";
    const double m = pace_moved(all, one);
    std::string s = "# The whole-action probes' pace in each pass (its time over the times "
                    "kept):\n";
    if (!all.empty()) s += "# on all the cores " + paces(all) + "\n";
    if (!one.empty()) s += "# on one thread " + paces(one) + "\n";
    s += "# The slowest pass took " + percent(m) + " longer than the fastest";
    if (m > kPaceMoved)
        s += " (over " + percent(kPaceMoved) +
             ": other\n# load on the host, steal or not, slowed some passes, and the rates are "
             "less sure\n# than that)";
    return s + ".\n";
}

std::string pace_row_lines(const MatmulRate& row, double flops, const std::vector<double>& before,
                           const std::vector<double>& after) {
    if (!(flops > 0)) return "";
    std::string s = "# The matmul `dist run` times again around a run, to tell whether the machine "
                    "runs at\n# this profile's pace: timed as a run times it, right before and "
                    "after each pass of\n# the whole-action probes (FLOP/s):\n";
    for (size_t p = 0; p < before.size() && p < after.size(); ++p)
        s += "#   pass " + std::to_string(p + 1) + ": " + number(before[p]) + " and " +
             number(after[p]) + "\n";
    s += "# each pass's geometric mean times that pass's pace, the median over the passes: "
         "the\n# row's rate at the pace the probes kept, which sets the level of every "
         "prediction.\n";
    char buf[200];
    std::snprintf(buf, sizeof buf,
                  "pace = { kernel = \"%s\", m = %lld, n = %lld, k = %lld, threads = %d, flops = ",
                  row.kernel.c_str(), static_cast<long long>(row.m), static_cast<long long>(row.n),
                  static_cast<long long>(row.k), row.threads);
    return s + buf + number(flops) + " }\n";
}

void warn_if_moved(const std::vector<double>& all, const std::vector<double>& one,
                   std::ostream& err) {
    const double m = pace_moved(all, one);
    if (m <= kPaceMoved) return;
    err << "calibrate: warning: this machine's pace moved while it was measured: the slowest pass "
           "of the whole-action probes took "
        << percent(m)
        << " longer than the fastest (other load on the host slows its cores through their "
           "caches and memory, steal or not); predictions from this profile are no surer than "
           "that: calibrate again when the machine is quieter\n";
}

std::string apart_lines(int apart, int pipelines) {
    if (pipelines <= 0) return "";
    return "# Pipelines beyond the cores whose two passes ran over " + percent(kPassesApart) +
           " apart at the\n# probes' pace (each timed a third time, the median kept): " +
           std::to_string(apart) + " of " + std::to_string(pipelines) + ".\n";
}

void warn_if_apart(int apart, int pipelines, std::ostream& err) {
    if (pipelines <= 0 || 2 * apart < pipelines) return;
    err << "calibrate: warning: " << apart << " of " << pipelines
        << " pipelines beyond the cores ran their two passes over " << percent(kPassesApart)
        << " apart at the probes' pace (each timed a third time): other load on the host moved "
           "this machine's pace while it was measured, and predictions from this profile are "
           "less sure: calibrate again when the machine is quieter\n";
}

} // namespace dist::cli::calibration
