// steal.hpp: how much of this machine's CPU time its host gave to others. On a virtual machine
// the hypervisor runs other guests in a virtual CPU's turns; Linux counts that time as `steal`
// in /proc/stat. A step timed then is slower than the machine is: `dist calibrate` takes such a
// timing again, and `dist run` says how much was stolen beside its measured step.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dist::runtime {

/// Ticks of CPU time from /proc/stat: every state's (user to steal) and the steal's.
struct CpuTicks {
    int64_t all = 0, steal = 0;
};

/// The ticks of `cpus` (the machine's total line where empty) in `stat`, the text of
/// /proc/stat; a CPU without a well-formed line counts nothing.
CpuTicks cpu_ticks(std::string_view stat, const std::vector<int>& cpus = {});
/// The same, read now ({0, 0} where /proc/stat cannot be read: not Linux).
CpuTicks read_cpu_ticks(const std::vector<int>& cpus = {});
/// The share of the CPUs' time between two readings that the host took: 0 where none passed.
double stolen_share(const CpuTicks& before, const CpuTicks& after);

/// A share of the time stolen beyond which a timing says less of the machine than of its host:
/// on a quiet host a few ticks in ten thousand are stolen.
constexpr double kStolenShare = 0.05;
/// For a run's report: where the host took more than kStolenShare of this machine's time over
/// the run (`share`), a line that says so; else "".
std::string stolen_note(double share);

} // namespace dist::runtime
