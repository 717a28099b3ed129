// session.hpp: a training session: the one piece of code that turns a checked, planned program
// into a running job. `dist run`, the REPL's `run` and the embedding API's Script::train are
// thin clients of it, so every training option means the same thing behind each of them.
//
// A session reads the training data, joins a job of several processes when the launch
// environment says so (DIST_RANK / DIST_WORLD_SIZE, Slurm, mpirun), starts from `--load`'s
// weights or continues a `--resume` checkpoint, runs the steps through the actor runtime,
// applies the non-finite policy (train.on_nonfinite), evaluates (train.eval), writes the
// metrics (JSON lines), saves
// consolidated checkpoints every train.checkpoint.every steps, at the end and when the caller
// stops the run, and can keep the final weights. Only process 0 of a job writes anything.
// Errors come back as values; nothing here prints or exits (the caller's abandon callback
// decides what ends a process whose ranks are stuck).
#pragma once

#include "actors/plan/graph.hpp"
#include "actors/runtime/executor.hpp"
#include "actors/runtime/local_comms.hpp"
#include "lang/program.hpp"
#include "models/model.hpp"
#include "models/trainer.hpp"

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace dist::runtime {

/// One finished step, as the session's callback sees it.
struct SessionStep {
    models::StepMetrics metrics;
    /// The value that was not finite at this step ("loss", "gradient norm"), or "" when the
    /// weights took the update; and how many steps were skipped so far (on_nonfinite: skip).
    std::string nonfinite;
    int64_t skipped_steps = 0;
    /// The evaluation after this step (train.eval, every `every` steps): the mean loss over the
    /// first `batches` x batch windows of the eval data, and the tokens predicted.
    std::optional<double> eval_loss;
    int64_t eval_tokens = 0;
    /// Per rank: when each action ran, and its traffic with other processes.
    std::vector<std::vector<ActionTiming>> timings;
    /// This step's measured bubble from those timings (idle / (ranks x step), as `dist sim`
    /// defines it); 0 without them.
    double bubble = 0;
    std::vector<RankTraffic> traffic;
};

struct SessionOptions {
    /// Continue the run saved in this checkpoint folder; or start from these weights.
    std::string resume;
    std::string load;
    /// Checkpoints go here; "" takes the script's train.checkpoint.dir.
    std::string save_dir;
    /// One JSON object per step (appended when resuming); "" for none.
    std::string metrics_path;
    /// What names this job's script and overrides (the script's text and `--set`s): every
    /// process of a job must run the same plan of the same script.
    std::string identity;
    /// Join a job of several processes when the launch environment describes one.
    bool join_launch = true;
    /// Keep the final weights (weights()), gathered from every process at the last step.
    bool keep_weights = false;
    /// Each rank's compute threads; 0: the cores divided between the process's ranks.
    int threads = 0;
    /// After every step (process 0 only), before its checkpoint; false stops the run after
    /// this step (a checkpoint is saved then too). What it throws ends the run.
    std::function<bool(const SessionStep&)> on_step;
    /// Refused peers and other news of the control plane (process 0).
    std::function<void(const std::string&)> log;
    /// Called in a process other than 0 whose ranks are still stuck in a failed step (waiting in
    /// Gloo for peers that are gone); `dist run` ends the process. Unset: they wait for Gloo's
    /// timeout.
    std::function<void(const std::string&)> abandon;
};

/// Why a session could not start or did not finish.
struct SessionError {
    std::string message;
    bool usage = false;   // the caller's options or environment, not the script (exit 2)
    bool located = false; // rendered as the checker renders errors (file:line:col: error: ...)
};

class Session {
  public:
    Session(const Program& program, const plan::Graph& graph, SessionOptions options);
    ~Session();
    Session(const Session&) = delete;
    Session& operator=(const Session&) = delete;

    /// Reads the data, the launch environment and the weights to start from, checks that the
    /// checkpoint folder can be written, and forms the job (joining the other processes).
    /// Empty message on success.
    SessionError open();
    /// Runs the steps; empty message on success (also when on_step stopped the run).
    SessionError run();

    /// Process 0 (or the only one): writes metrics and checkpoints, sees on_step.
    bool lead() const;
    /// Processes of the job (1 when it runs alone).
    int32_t processes() const;
    /// 0-based first step to run, and the step the run ends at (exclusive).
    int64_t first_step() const;
    int64_t last_step() const;
    /// Where checkpoints went; "" when none was saved.
    const std::string& saved_dir() const;
    /// Whether on_step stopped the run before its last step.
    bool stopped() const;
    /// The last finished step (timings for a trace, the final loss).
    const SessionStep* last() const;
    /// The final weights (keep_weights, process 0); null before run() or without them.
    models::Model* weights();
    /// The final weights, handed over (null without them).
    std::unique_ptr<models::Model> take_weights();

  private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

/// The line `dist run` prints as training goes: step, loss, lr, norm, tokens/s, time left.
std::string progress_line(const models::StepMetrics& m, int64_t last, double eta_s);

/// Traffic of a step as JSON (per rank, per peer): the metrics' "p2p" object.
std::string traffic_json(const std::vector<RankTraffic>& traffic);

} // namespace dist::runtime
