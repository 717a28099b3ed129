// measured.hpp: a real step's timings as a sim::Timeline, so that the measured execution is
// reported, drawn and traced exactly as `dist sim` reports the predicted one (same tracks,
// same bubble definition: idle / (ranks x makespan) over the compute actions and the step).
#pragma once

#include "actors/runtime/executor.hpp"
#include "actors/sim/simulate.hpp"

#include <vector>

namespace dist::runtime {

/// `timings[r]`: rank r's actions as they ran in one step, seconds on the host's monotonic
/// clock. The timeline starts at the earliest action of any rank; ranks whose clocks are
/// plainly not the same (other hosts) each start at their own first action.
sim::Timeline measured_timeline(const plan::Graph& graph,
                                const std::vector<std::vector<ActionTiming>>& timings);
/// The time each rank's timings are taken from to start at zero (as measured_timeline does).
std::vector<double> timing_origins(const std::vector<std::vector<ActionTiming>>& timings);

} // namespace dist::runtime
