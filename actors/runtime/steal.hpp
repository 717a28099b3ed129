// steal.hpp: how much of this machine's CPU time its host gave to others. On a virtual machine
// the hypervisor runs other guests in a virtual CPU's turns; Linux counts that time as `steal`
// in /proc/stat. A step timed then is slower than the machine is: `dist calibrate` takes such a
// timing again, and `dist run` says how much was stolen beside its measured step. Likewise the
// time other processes of this machine used (OtherLoad): `/proc/stat`'s busy time beyond this
// process's own.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dist::runtime {

/// Ticks of CPU time from /proc/stat: every state's (user to steal), the steal's, and the idle
/// ones' (idle and iowait).
struct CpuTicks {
    int64_t all = 0, steal = 0, idle = 0;
};

/// The ticks of `cpus` (the machine's total line where empty) in `stat`, the text of
/// /proc/stat; a CPU without a well-formed line counts nothing.
CpuTicks cpu_ticks(std::string_view stat, const std::vector<int>& cpus = {});
/// The same, read now ({0, 0} where /proc/stat cannot be read: not Linux).
CpuTicks read_cpu_ticks(const std::vector<int>& cpus = {});
/// The share of the CPUs' time between two readings that the host took: 0 where none passed.
double stolen_share(const CpuTicks& before, const CpuTicks& after);

/// The CPUs this process may run on (its affinity); empty where that cannot be read.
std::vector<int> allowed_cpus();
/// The CPU time this process's threads have used, user and system, in seconds; with
/// `with_children`, and that of its children that have ended and been waited for.
double process_cpu_seconds(bool with_children = false);
/// The share of the CPUs' time between two readings that other processes of this machine used:
/// the time neither idle nor stolen, less `own_s` seconds of this process's own (/proc/stat
/// counts in ticks of `tick_s` seconds); 0 where no time passed.
double others_share(const CpuTicks& before, const CpuTicks& after, double own_s, double tick_s);
/// How much of its CPUs' time other processes used since construction: the CPUs this process
/// may run on, read from /proc/stat (0 where it cannot be read), against this process's own
/// (and, with `with_children`, its children's: a launcher reads it once it has waited for them).
class OtherLoad {
  public:
    explicit OtherLoad(bool with_children = false);
    double share() const;

  private:
    bool with_children_;
    std::vector<int> cpus_;
    CpuTicks start_;
    double own_s_;
};
/// A share of the CPUs' time that other processes may use before a run or a calibration says
/// its timings are slower than this machine is: a quiet machine's daemons use a percent or two.
constexpr double kOthersShare = 0.10;
/// For a run's report: where other processes used more than kOthersShare of the CPUs' time
/// over the run, a line that says so; else "".
std::string others_note(double share);

/// A share of the time stolen beyond which a timing says less of the machine than of its host:
/// on a quiet host a few ticks in ten thousand are stolen.
constexpr double kStolenShare = 0.05;
/// For a run's report: where the host took more than kStolenShare of this machine's time over
/// the run (`share`), a line that says so; else "".
std::string stolen_note(double share);

} // namespace dist::runtime
