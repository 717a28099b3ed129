// executor.hpp: one rank's part of a training step, executed from its action list.
//
// The state machine of a worker, kept free of CAF so that a test can drive it: the worker actor
// (worker.hpp) calls run_step once per step. The executor owns the rank's stages (one per
// virtual stage it runs, each holding its tensor-parallel shard of the parameters), its
// optimizer state and its action list, and follows the plan's semantics (actors/plan/
// execute.hpp): actions in order on one compute thread; sends do not block; a receive waits for
// its message; gradient reductions run on a communication thread, overlapping the rest of the
// backward, and the optimizer step waits for them.
#pragma once

#include "actors/plan/graph.hpp"
#include "lang/program.hpp"
#include "models/data.hpp"
#include "models/stage.hpp"
#include "transport/collectives.hpp"
#include "transport/p2p.hpp"

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace dist::runtime {

/// The groups a rank communicates in; a null group has one member.
struct RankComms {
    transport::PointToPoint* p2p = nullptr;
    transport::Collectives* tp = nullptr;    // ranks with the same (dp, pp, cp)
    transport::Collectives* dp = nullptr;    // ranks with the same (pp, tp): a replica's dp x cp
    transport::Collectives* model = nullptr; // ranks with the same (dp, cp) (the gradient norm)
    transport::Collectives* cp = nullptr;    // ranks with the same (dp, pp, tp)
    /// The two pipeline ranks, with the same (dp, tp), that hold the token embedding and the
    /// tied head, when they differ.
    transport::Collectives* tied = nullptr;
    /// Expert parallelism (mesh ep > 1): the ep ranks of a (pp, tp) position's dp x cp that
    /// share a mixture of experts' experts, and the ranks that hold the same experts.
    transport::Collectives* ep = nullptr;
    transport::Collectives* edp = nullptr;
};

/// The ranks that share a parameter's state under ZeRO: the data-parallel group, or for a
/// routed expert under expert parallelism the expert-data-parallel one (null comms: a group of
/// one).
struct StateGroup {
    transport::Collectives* comms = nullptr;
    int members = 1, me = 0;
};

/// When one action ran, relative to the start of the step (for the trace and the measured
/// bubble).

struct ActionTiming {
    size_t action = 0;
    double start_s = 0, end_s = 0;
    /// A data-parallel collective the rank's communication thread ran for `action` (its
    /// REDUCE_GRAD, or a unit's gather or reduce-scatter of its GATHER_F, GATHER_B or
    /// REDUCE_SCATTER), listed after the actions; false: the action itself.
    bool collective = false;
    /// Seconds the rank's thread ran on a core during it (its thread's CPU clock): where ranks
    /// outnumber the cores, the rest of the span is waiting for one, or blocked. CPU ranks'
    /// own actions only; negative: not measured.
    double cpu_s = -1;
};

struct RankStepResult {
    /// Sum over this rank's microbatches of their mean loss, and how many (last stage, tp 0).
    double loss_sum = 0;
    int64_t loss_microbatches = 0;
    double grad_norm = 0;
    double lr = 0;
    double step_time_s = 0;
    std::vector<ActionTiming> timings;
    /// "" when the optimizer updated the weights; else the value that was not finite ("loss"
    /// or "gradient norm"), and no weight of the rank was touched this step.
    std::string nonfinite;
    /// What this rank's mixtures of experts saw (tp rank 0 only; empty without experts).
    models::ExpertStats experts;
};

/// What went wrong on a rank: its number, the action it was running, and the cause.
struct RankFailure {
    int32_t rank = -1;
    std::string action;
    std::string cause;
    std::string str() const;
};

class RankExecutor {
  public:
    /// Builds the rank's stages (materialising exactly its parameters) from `program.train.seed`,
    /// on `device` (null: the CPU). Tensors received from other ranks are moved there.
    RankExecutor(const Program& program, const plan::Graph& graph, int32_t rank, RankComms comms,
                 kernels::Backend* device = nullptr);
    ~RankExecutor();
    RankExecutor(const RankExecutor&) = delete;
    RankExecutor& operator=(const RankExecutor&) = delete;

    /// Runs step `step` (0-based) on `data`. Throws the failure's exception after recording it
    /// in failure(); the rank's other threads are stopped first.
    RankStepResult run_step(int64_t step, const models::TokenData& data);

    /// The action running now ("1B3"), or "" between steps: what the watchdog reports.
    std::string current_action() const;
    /// Actions completed since construction: the watchdog's measure of progress.
    uint64_t progress() const { return progress_.load(); }

    /// Called before every action with (step, action); what it throws fails the step as the
    /// action itself would. For tests that plant a fault in the middle of a step.
    void set_action_hook(std::function<void(int64_t, const plan::PlanAction&)> hook) {
        hook_ = std::move(hook);
    }

    int32_t rank() const { return rank_; }
    kernels::Backend& device() const { return *device_; }
    const plan::PlanRank& plan_rank() const { return me_; }
    /// The stages this rank runs, by global stage index.
    std::map<int32_t, models::Stage*> stages();

  private:
    struct StageState;
    class Reducer;
    class WeightGatherer;
    class GradientScatterer;
    class ExchangeClock;

    void execute(const plan::PlanAction& a, int64_t step, RankStepResult& result);
    void finish_step(int64_t step, RankStepResult& result);
    void sum_tied_gradients();
    void sum_sequence_partial_gradients();
    double gradient_norm(bool& loss_nonfinite, double loss_sum);
    /// ZeRO: after each member has updated its share, every member gets the whole weights.
    void gather_weights();
    /// `chunk`: the longest member's share of `params`, to which each member's is padded.
    void gather_shares(const std::vector<models::Parameter*>& params, const StateGroup& group,
                       int64_t chunk);

    const Program& program_;
    const plan::Graph& graph_;
    int32_t rank_;
    plan::PlanRank me_;
    RankComms comms_;
    kernels::Backend* device_;
    std::string tied_name_; // the embedding a tied head shares, or ""
    /// Expert parallelism: the ep group as the stages see it, timing each all-to-all, so that
    /// the plan's DISPATCH / COMBINE actions get the times of the ones their compute ran.
    std::unique_ptr<ExchangeClock> exchange_clock_;
    std::vector<std::pair<double, double>> exchanges_ran_; // not yet matched to an action
    int zero_ = 0; // the ZeRO stage over the data-parallel group (0 when alone)
    std::map<int32_t, std::unique_ptr<StageState>> stages_;
    // ZeRO 3, by stage. Before the reducer, which goes first: its thread may be running one of
    // their gathers.
    std::map<int32_t, std::unique_ptr<WeightGatherer>> gatherers_;
    // ZeRO 2 and 3, by stage: the hooks that reduce-scatter each unit's gradients.
    std::map<int32_t, std::unique_ptr<GradientScatterer>> scatterers_;
    std::unique_ptr<Reducer> reducer_;
    size_t action_index_ = 0;          // the action `execute` runs: where in the rank's list
    kernels::Tensor tokens_, targets_; // this dp rank's rows of the step's batch
    int64_t microbatch_rows_ = 0;
    std::function<void(int64_t, const plan::PlanAction&)> hook_;
    std::atomic<uint64_t> progress_{0};
    /// When the optimizer step began its update (after the gradient norm): STEP's timing.
    std::chrono::steady_clock::time_point update_began_;
    double update_began_cpu_ = 0; // the thread's CPU clock then (thread_cpu_seconds)
    mutable std::mutex current_mutex_;
    std::string current_;
};

} // namespace dist::runtime
