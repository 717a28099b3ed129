// pace.hpp: how fast this machine runs now against the profile it was calibrated into. A shared
// machine runs the same work 20-30% slower in one spell than in another, minutes apart, with
// little or no steal to show for it (other guests on the host's cores, their caches and their
// memory): a run in a slow spell is slower than its prediction whatever the model. `dist run`
// and the REPL's `run` time one of the profile's own matmuls again before and after the run and
// set its rate beside the calibrated one.
#pragma once

#include "lang/program.hpp"

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace dist::cli {

/// The profile's row to time again: its `calibration.pace` where it has one (that row at the
/// probes' pace, pace_at_kept); else of the forward ("nt") matmuls a CPU calibration measured
/// with their weight used again (`warm`: no arena of weights to fill), those on the most
/// threads, and of them the squarest up to 512 x 512 x 512 (a few milliseconds a call); none in
/// a profile without such rows (a datasheet's, a GPU's).
std::optional<MatmulRate> pace_reference(const Calibration& c);

/// The row's rate now (FLOP/s), the fastest of batches on its threads: after calls for
/// kPaceWarmUp_s, kPaceBatches batches of at least `min_s` seconds each, kPaceGap apart. A run's
/// check and `dist calibrate` (beside its whole-action probes) time it alike.
double pace_flops(const MatmulRate& ref, double min_s = 0.01);

/// The row's rate now over its calibrated one (`warm`): pace_flops over it.
double pace_now(const MatmulRate& ref, double min_s = 0.01);

/// The row's rate at the pace `dist calibrate`'s whole-action probes kept, from its timings
/// before and after each of their passes (`before[p]`, `after[p]`, FLOP/s) and each pass's pace
/// (its probes' times over the times kept, `pass_pace[p]`): for each pass the geometric mean of
/// the two timings times the pass's pace, and the median over the passes. The probes set the
/// level of every prediction; the kernels, timed minutes later as the fastest of batches, only
/// the shapes beside each other, and a calibration whose probes met a slow spell carries it in
/// their scales, where a kernel timed later does not see it. 0 without a pass timed both ways.
double pace_at_kept(const std::vector<double>& before, const std::vector<double>& after,
                    const std::vector<double>& pass_pace);
inline constexpr double kPaceWarmUp_s = 0.02;
inline constexpr int kPaceBatches = 5;
inline constexpr std::chrono::milliseconds kPaceGap{20};
/// How long a run's check waits before it times the row: the threads of a session just opened
/// or just ended still held the cores for some milliseconds (timed at once, the row ran at a
/// fifth of its rate after half the runs of a pipeline at width 512 here; after 50 ms, in none).
inline constexpr std::chrono::milliseconds kPaceSettle{50};

/// The rate's move over the run (the geometric mean of before and after) beyond which a run says
/// the machine is not the one calibrated: the simulator's goal of a tenth.
inline constexpr double kPaceOff = 0.10;

/// The run's line on the pace: the row timed, its rate over the calibrated one before the run
/// and after it, and what their geometric mean beyond kPaceOff means for the measured step
/// against the predicted one.
std::string pace_note(const MatmulRate& ref, double before, double after,
                      const std::string& calibrated_on);

/// Times `ref` before a run and again after it, for the run's line: nothing without a row to
/// time (pace_reference).
class PaceCheck {
  public:
    explicit PaceCheck(const HardwareProfile& profile);
    void before();
    /// The run's line, after timing the row again; "" without a row.
    std::string after();

  private:
    std::optional<MatmulRate> ref_;
    std::string date_;
    double before_ = 0;
};

} // namespace dist::cli
