// execute.hpp: abstract execution of a Graph in virtual time, shared by the verifier (all
// costs zero: can every rank reach the end?) and the simulator (costs from a hardware
// profile: when does each action start and end?).
//
// Semantics, which the runtime follows too: a rank runs its list in order on one compute
// stream. A send does not block: the message arrives `transfer` seconds after it is posted. A
// receive blocks until its message has arrived. A gradient reduction is entered without
// blocking and runs on the rank's communication stream once every member of the data-parallel
// group has entered it; the optimizer step waits for the rank's reductions to finish.
#pragma once

#include "actors/plan/graph.hpp"

#include <functional>
#include <vector>

namespace dist::plan {

struct ExecCosts {
    /// Seconds of a compute action (F, B, I, W, or STEP) on a rank.
    std::function<double(const PlanRank&, const PlanAction&)> compute;
    /// Seconds from posting a send on rank `from` to its arrival on rank `to`.
    std::function<double(const PlanRank& from, const PlanRank& to, const PlanAction& send)>
        transfer;
    /// Seconds of a gradient reduction over the data-parallel group of `rank`.
    std::function<double(const PlanRank& rank, const PlanAction& reduce)> reduction;
};

/// Zero for everything: the verifier's execution.
ExecCosts zero_costs();

struct ExecTimes {
    std::vector<std::vector<double>> start, end; // per rank, per action
    std::vector<size_t> stopped_at;              // per rank: actions completed
    bool complete = false;                       // every rank reached the end of its list
    /// When not complete: for each rank that is blocked, the ranks it waits for.
    std::vector<std::vector<int32_t>> waits_for;
};

ExecTimes execute(const Graph& g, const ExecCosts& costs);

} // namespace dist::plan
