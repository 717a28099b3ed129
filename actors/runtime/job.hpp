// job.hpp: a training run on a mesh, executed by CAF actors in this process.
//
// A coordinator actor and one detached worker actor per rank. Each worker owns its rank's
// RankExecutor (its stages, shard of the parameters and optimizer state) and runs the plan's
// action list when the coordinator asks for a step. The coordinator starts every step, gathers
// the losses and statistics, hands the step's report to the caller (metrics, progress,
// checkpoints), and supervises: a failing worker's reply ends the step on every rank (the
// communication is aborted, so no rank stays blocked) and the run, with the rank, the action
// and the cause; a watchdog that sees no action complete for a while reports what every rank
// is waiting for and ends the run the same way. Nothing calls exit(); errors are returned.
#pragma once

#include "actors/plan/graph.hpp"
#include "actors/runtime/executor.hpp"
#include "actors/runtime/local_comms.hpp"
#include "lang/program.hpp"
#include "models/data.hpp"
#include "models/model.hpp"
#include "models/trainer.hpp"

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace dist::runtime {

struct StepReport {
    models::StepMetrics metrics;
    /// Per rank: when each action ran, relative to the start of the rank's step.
    std::vector<std::vector<ActionTiming>> timings;
};

struct JobOptions {
    int64_t first_step = 0; // 0-based: the first step to run
    int64_t end_step = 0;   // exclusive
    /// No action completed on any rank for this long ends the run.
    std::chrono::milliseconds watchdog = std::chrono::minutes(2);
    /// After every step; returning false stops the run (after that step).
    std::function<bool(const StepReport&)> on_step;
};

class Job {
  public:
    /// Builds every rank's executor (and parameters) and the communication among them.
    Job(const Program& program, const plan::Graph& graph, const models::TokenData& data,
        CollectivesBackend backend = CollectivesBackend::inprocess);
    ~Job();

    /// Runs steps [first_step, end_step). "" on success (also when on_step stopped the run),
    /// else the failure: "rank R in ACTION: cause".
    std::string run(const JobOptions& options);

    /// The rank's executor (tests plant faults through its action hook).
    RankExecutor& executor(int32_t rank) { return *executors_.at(static_cast<size_t>(rank)); }

    /// Copies every rank's part of the parameters, gradients' optimizer moments included, into
    /// `whole` (a model of the full shapes): a consolidated checkpoint of any mesh.
    void gather(models::Model& whole);
    /// The inverse: every rank takes its part of `whole`'s values and optimizer moments.
    void scatter(models::Model& whole);

  private:
    const Program& program_;
    const models::TokenData& data_;
    std::unique_ptr<LocalComms> comms_;
    std::vector<std::unique_ptr<RankExecutor>> executors_;
};

} // namespace dist::runtime
