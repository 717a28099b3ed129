// measured.hpp: a real step's timings as a sim::Timeline, so that the measured execution is
// reported, drawn and traced exactly as `dist sim` reports the predicted one (same tracks,
// same bubble definition: idle / (ranks x makespan) over the compute actions).
#pragma once

#include "actors/runtime/executor.hpp"
#include "actors/sim/simulate.hpp"

#include <vector>

namespace dist::runtime {

/// `timings[r]`: rank r's actions as they ran in one step, seconds from the rank's start.
sim::Timeline measured_timeline(const plan::Graph& graph,
                                const std::vector<std::vector<ActionTiming>>& timings);

} // namespace dist::runtime
