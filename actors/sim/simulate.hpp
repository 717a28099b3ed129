// simulate.hpp: a Graph executed in virtual time, the output type of actors/sim (Timeline).
//
// Costs come from the hardware profile (compute: FLOPs at peak x efficiency plus elementwise
// bytes at memory bandwidth; point-to-point: latency + bytes / bandwidth of the link between the
// two ranks' hosts; collectives: ring all-reduce) or are the unit costs of DESIGN.md (F = 1,
// B = 2, I = W = 1, communication 0). The library call behind `dist sim`, the REPL and the
// runtime's predicted timeline.
#pragma once

#include "actors/plan/graph.hpp"
#include "actors/plan/lower.hpp"

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace dist::sim {

enum class CostModel { profile, unit };

struct SimOptions {
    CostModel cost = CostModel::profile;
    /// Fraction of peak FLOPs that matmuls reach when the profile does not say (a datasheet
    /// profile's `compute.matmul_efficiency`); a calibrated profile prices kernels by shape.
    double efficiency = 0.5;
    /// The graph comes from plan::lower, which verified it: not verified again.
    bool verified = false;
    /// The processes the job runs in (`dist run --procs N`), each holding a contiguous block
    /// of ranks (plan::process_of_rank). With a calibrated CPU profile, what passes between
    /// two processes of one host goes as the runtime sends it: collectives through Gloo,
    /// activations through UCX over shared memory.
    int32_t processes = 1;
    /// With a calibrated GPU profile: the run's ranks share this many GPUs of one host, in one
    /// process (`dist run` on a machine with fewer GPUs than ranks, which gives them the GPUs
    /// in turn). Ranks on one GPU run their kernels in turn, each at its share of the device.
    /// 0: every rank has a device of its own, on the hosts the profile gives.
    int32_t shared_gpus = 0;
};

/// One action as it ran.
struct Span {
    size_t action = 0; // index into the rank's list
    double start = 0, end = 0;
    /// Seconds its thread waited for a core just before `start` (ranks that outnumber a host's
    /// cores): idle time, not part of the span.
    double core_wait = 0;
    /// Seconds of the span its thread ran on a core (ranks sharing a host's cores: the rest it
    /// waited for a core inside the action, or for its tensor-parallel group); negative: not
    /// known (a rank on its own device).
    double on_core = -1;
};

struct RankReport {
    int32_t rank = 0;
    double busy = 0; // compute time
    double idle = 0; // makespan - busy
    double first_start = 0, last_end = 0;
    int32_t peak_inflight_microbatches = 0;
    int64_t parameters_bytes = 0, gradients_bytes = 0, optimizer_bytes = 0;
    int64_t activations_bytes = 0; // peak
    int64_t communication_bytes = 0;
    int64_t peak_memory_bytes = 0;
    std::vector<Span> spans; // compute actions only, in order
    /// The expert-parallel all-to-alls (DISPATCH_F ...), each inside its compute action's span.
    std::vector<Span> exchanges;
    /// The data-parallel collectives (REDUCE_GRAD, REDUCE_SCATTER, GATHER_F, GATHER_B) on the
    /// rank's communication thread, in the order they ran. Predicted: one span per action, from
    /// when every member has entered it and the thread is free, and under ZeRO 2 and 3 one more
    /// for the rest of its units, queued by the compute action that needs or writes them.
    /// Measured: a span per collective the thread ran for the action (ZeRO's gathers and
    /// reduce-scatters run unit by unit).
    std::vector<Span> collectives;
    /// The rank's activations as they rise and fall: from each time on, the bytes it holds (at a
    /// compute span's start, what it holds during the span; at its end, what it keeps).
    std::vector<std::pair<double, int64_t>> activation_steps;
};

struct Timeline {
    plan::Graph graph;
    CostModel cost = CostModel::profile;
    double makespan = 0;        // seconds (unit costs: units)
    double bubble_fraction = 0; // idle / (ranks x makespan)
    double step_time_s = 0;
    double tokens_per_s = 0;
    double mfu = 0;
    int64_t memory_limit_bytes = 0;
    bool fits = true;
    bool shared_memory = false; // the ranks share one machine's memory (a CPU mesh)
    /// The most all ranks hold at once: what ranks sharing one machine's memory need together
    /// (no more than the sum of their peaks, which come at different times).
    int64_t shared_peak_bytes = 0;
    /// The draws of the cores' paces whose mean the timeline is (sim::core_paces), and the
    /// spread they were drawn with: 1 and 0 where every rank ran at the cores' mean pace.
    int32_t pace_draws = 1;
    double core_spread = 0;
    std::vector<RankReport> ranks;
};

struct SimResult {
    std::optional<Timeline> timeline;
    std::vector<plan::PlanError> errors;
    bool ok() const { return timeline.has_value(); }
};

/// The most all ranks hold at once: every rank's weights, gradients, optimizer state and
/// buffers, with their activations (RankReport::activation_steps) summed as they rise and fall
/// together over the step. Timeline::shared_peak_bytes.
int64_t shared_peak(const Timeline& t);

/// Verifies, then simulates one training step. `p` gives the hardware profile and memory
/// figures; with unit costs it may be a default Program.
SimResult simulate(const plan::Graph& g, const Program& p, const SimOptions& o = {});

/// Bounds on the step of a program's plan that cost far less than simulating it, for searching
/// layouts. Both never exceed the simulated step: `busy` is the ranks' average compute (and
/// optimizer) time; `pipeline` is one replica's pipeline ranks executed alone, with every
/// link as fast as the mesh's fastest and no data-parallel traffic. Computing the pipeline
/// bound also gives the fullest rank's memory, exactly as the simulation counts it (except on
/// CPU meshes, whose ranks share one memory). A calibrated profile has no cheap bound (0).
struct StepBounds {
    double busy = 0, pipeline = 0;
    /// The fullest rank's weights, gradients, optimizer state, buffers and one microbatch's
    /// activations (`busy_bound`), and with all its activations (`pipeline_bound`); 0 on a CPU
    /// mesh.
    int64_t floor_bytes = 0, peak_bytes = 0;
    bool memory_known = false;
    /// Whether every rank's floor (busy_bound), then its peak (pipeline_bound), fits in its own
    /// kind's memory (true on a CPU mesh, which waits for the simulation).
    bool fits = true;
    std::string error; // the plan cannot be made (the schedule refuses these sizes)
};
StepBounds busy_bound(const Program& p);
/// busy_bound for each ZeRO stage of `zeros` (the rest of the program as it is): one pricing
/// of the stages for all.
std::vector<StepBounds> busy_bounds(const Program& p, const std::vector<int64_t>& zeros);
/// Adds the pipeline bound and the memory to `b`.
void pipeline_bound(const Program& p, StepBounds& b);

/// Which published formulas the memory figures follow, when the mesh shards state or
/// activations (ZeRO, sp, cp): one line in parentheses; "" otherwise.
std::string memory_model_text(const plan::Graph& g);

/// `dist sim`: the figures and a timeline of one glyph per time slot, `width` columns wide.
std::string text_report(const Timeline& t, int width = 80);
nlohmann::json to_json(const Timeline& t);
/// A Gantt chart: one row per rank, colours by microbatch, idle time shaded, a legend.
std::string svg(const Timeline& t);
/// Several timelines of one plan one above the other on one time scale (measured above
/// predicted), each titled with its label.
std::string svg(const std::vector<std::pair<std::string, const Timeline*>>& panels);
/// Chrome's trace-event JSON: one process, one track (thread) per rank.
/// `process_name` names the trace ("dist sim: KIND" when empty).
std::string chrome_trace(const Timeline& t, const std::string& process_name = "");
/// One process per timeline, named by its label (a run's "measured ..." and "predicted ...").
std::string chrome_trace(const std::vector<std::pair<std::string, const Timeline*>>& processes);

/// A run's measured step beside the prediction: "step time: measured 88.5 ms, predicted
/// 87.9 ms (0.99x); bubble: measured 28.9%, predicted 27.6% (`dist sim` with the P profile)",
/// and where `middle_half_s` is given (the steps' 25th and 75th percentiles), after the
/// measured step "(the middle half of the steps 81.0-94.2 ms)".
std::string comparison_line(double measured_step_s, double measured_bubble,
                            const Timeline& predicted, const std::string& profile,
                            std::pair<double, double> middle_half_s = {0.0, 0.0});
/// Beside a run's comparison on a datasheet profile, which knows nothing of the machine (the
/// `cpu` one) or prices published kernels rather than Dist's (a GPU's): how to calibrate this
/// one ("" for a calibrated profile).
std::string calibration_hint(const HardwareProfile& profile);
/// Where a measured step and the prediction of the same plan disagree: each kind of action's
/// time summed over the ranks (the communication threads' collectives apart, as "KIND (comm)"),
/// under each kind its threads' time on a core where both know it, the idle time, and the rank
/// and kind with the largest gap.
std::string disagreement_text(const Timeline& measured, const Timeline& predicted);

} // namespace dist::sim
