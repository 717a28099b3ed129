// measured.hpp: a real step's timings as a sim::Timeline, so that the measured execution is
// reported, drawn and traced exactly as `dist sim` reports the predicted one (same tracks,
// same bubble definition: idle / (ranks x makespan) over the compute actions and the step).
#pragma once

#include "actors/runtime/executor.hpp"
#include "actors/sim/simulate.hpp"

#include <utility>
#include <vector>

namespace dist::runtime {

/// `timings[r]`: rank r's actions as they ran in one step, seconds on the host's monotonic
/// clock. The timeline starts at the earliest action of any rank; ranks whose clocks are
/// plainly not the same (other hosts) each start at their own first action.
sim::Timeline measured_timeline(const plan::Graph& graph,
                                const std::vector<std::vector<ActionTiming>>& timings);
/// One step's bubble as measured_timeline reports it, without copying the graph.
double measured_bubble(const plan::Graph& graph,
                       const std::vector<std::vector<ActionTiming>>& timings);
/// The time each rank's timings are taken from to start at zero (as measured_timeline does).
std::vector<double> timing_origins(const std::vector<std::vector<ActionTiming>>& timings);

/// A run's steps as it sets them beside the prediction: the median step time and the median
/// bubble over the steps after the first (which warms up). One step's bubble moves with the
/// order in which the operating system happened to run the ranks (pp 4 on two cores: 41-58%
/// over the steps of one run), as its time does; the medians are what a run is said to take.
class StepTally {
  public:
    void add(double step_time_s, double bubble);
    double median_step_s() const { return median_of(steps_); }
    double median_bubble() const { return median_of(bubbles_); }
    /// The 25th and 75th percentiles of the step times after the first (linear between the
    /// nearest two), the middle half of the steps: how far a shared machine's pace moved the
    /// steps the median is taken from (pp 2 on two cores here: one run's steps took 65-91 ms).
    /// {0, 0} under kMiddleHalfSteps steps after the first, too few to say.
    std::pair<double, double> middle_half_s() const;
    static constexpr size_t kMiddleHalfSteps = 4;

  private:
    static double median_of(std::vector<double> v);
    std::vector<double> steps_, bubbles_;
};

} // namespace dist::runtime
