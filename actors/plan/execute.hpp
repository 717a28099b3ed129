// execute.hpp: abstract execution of a Graph in virtual time, shared by the verifier (all
// costs zero: can every rank reach the end?) and the simulator (costs from a hardware
// profile: when does each action start and end?).
//
// Semantics, which the runtime follows too: a rank runs its list in order on one compute
// stream. A send does not block: the message arrives `transfer` seconds after it is posted. A
// receive blocks until its message has arrived. An all-to-all of the expert-parallel group
// blocks the compute stream from when the last member comes to it until it is over. A gradient
// reduction is entered without blocking and runs on the rank's communication stream once every
// member of the data-parallel group has entered it; the optimizer step waits for the rank's
// reductions to finish.
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
    /// Where a host's cores are shared: seconds a reduction's members wait off their cores
    /// beyond `reduction` when the other threads busy on their host fill its cores (between
    /// processes, each step of a collective wakes a thread that then waits for a core). Not
    /// stretched by the threads beside it. Unset: none.
    std::function<double(const PlanRank& rank, const PlanAction& reduce)> reduction_wait;
    /// Seconds of one all-to-all of the expert-parallel group of `rank` (DISPATCH_F ...);
    /// unset: none. It starts once every member has come to it; the compute action it runs
    /// inside is cut into equal pieces around its all-to-alls.
    std::function<double(const PlanRank& rank, const PlanAction& exchange)> exchange;
    /// Cores shared between the ranks of a host (a CPU): the threads a compute action of a rank
    /// keeps busy, and each busy thread's speed (relative to one alone) when `threads` are busy
    /// on the host at once. When set, `compute` gives an action's seconds alone on the host, and
    /// actions that overlap there stretch (processor sharing); unset, each rank has a device.
    std::function<double(const PlanRank& rank)> threads;
    std::function<double(double threads)> speed;
    /// The host's cores and the OS scheduler's time slice. When single-threaded ranks outnumber
    /// a host's cores, the busy ones queue for them and take turns of `slice` seconds (0: share
    /// them equally); see CoreQueues in execute.cpp. 0 cores: every busy thread slowed alike,
    /// by `speed`.
    double cores = 0;
    double slice = 0;
    /// Where cores are shared: seconds a rank blocked at a receive takes to run again once the
    /// message has arrived (its core's wake-up), and a tensor-parallel group's members at a
    /// meeting (`meets`) but the last to come, once it is in. A message in before the rank comes
    /// to the receive costs none. 0: none.
    double wake = 0;
    /// STEP computes the global gradient norm first, as the runtime does: an all-reduce over
    /// the ranks of a model replica (over every rank under ZeRO), so a rank's STEP starts when
    /// the rank gets there and its update once all of them have. Off for the verifier.
    bool step_barrier = false;
    /// Seconds a rank works after its reductions and before the gradient norm's barrier (the
    /// tied embedding's two copies summed between the first and the last stage, as the runtime
    /// does before the norm): idle time, not part of STEP's span, which is the update alone.
    /// Unset: none.
    std::function<double(const PlanRank& rank)> step_before;
    /// Of a compute action's seconds, those its thread waits for others inside it, off its
    /// core (the hand-overs of tensor-parallel collectives): with shared cores they neither
    /// stretch nor take a share of a core; they end the action. Unset: none.
    std::function<double(const PlanRank& rank, const PlanAction& a)> compute_wait;
    /// Times a compute action's thread meets the other members of its tensor-parallel group
    /// inside it (its all-reduces). Where ranks queue for a host's cores (`cores`), the action
    /// runs as that many pieces and one more, of equal seconds: after each piece but the last
    /// its thread leaves its core until every member has finished the same piece, then waits
    /// its share of compute_wait (the hand-over) off the core, and queues again for the next.
    /// Unset or 0: one piece, with compute_wait at its end.
    std::function<int32_t(const PlanRank& rank, const PlanAction& a)> meets;
    /// Where each rank has a device: how much slower its compute runs while its communication
    /// stream runs a collective beside it (0.19: at 1 / 1.19 of its speed for that time). Unset
    /// or 0: not slowed.
    std::function<double(const PlanRank& rank)> overlap_slowdown;
};

/// Zero for everything: the verifier's execution.
ExecCosts zero_costs();

struct ExecTimes {
    std::vector<std::vector<double>> start, end; // per rank, per action
    /// Per rank, per action: the seconds a compute action's thread waited for a core before
    /// its start (ranks beyond a host's cores, ExecCosts::cores); 0 elsewhere.
    std::vector<std::vector<double>> core_wait;
    /// Per rank, per action: the seconds of a compute action's span its thread ran on a core
    /// (ranks sharing a host's cores, ExecCosts::threads: the rest it waited for a core or for
    /// its tensor-parallel group); negative where not known (a rank on its own device).
    std::vector<std::vector<double>> on_core;
    /// Per rank, in the order it entered them: the data-parallel collectives' runs on the
    /// rank's communication stream, from when the last member has entered one and the stream
    /// is free to its end, each with the action it belongs to (REDUCE_GRAD, REDUCE_SCATTER,
    /// GATHER_F, GATHER_B). Under ZeRO 2 and 3 an action has two: the rest of its units, which
    /// the compute action that needs or writes them queued, and its own unit. (start/end hold
    /// the moment the rank queued the action.)
    struct CollectiveRun {
        size_t action = 0;
        double start = 0, end = 0;
    };
    std::vector<std::vector<CollectiveRun>> collectives;
    std::vector<size_t> stopped_at; // per rank: actions completed
    bool complete = false;          // every rank reached the end of its list
    /// When not complete: for each rank that is blocked, the ranks it waits for.
    std::vector<std::vector<int32_t>> waits_for;
};

ExecTimes execute(const Graph& g, const ExecCosts& costs);

} // namespace dist::plan
