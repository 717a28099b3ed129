// dist.hpp: Dist as a C++ library, for applications that embed it.
//
// A Script is a .dist program (from a file or a string) with `--set`-style overrides. From it:
// check (diagnostics as values), plan (ranks and their actions), simulate (the figures of
// `dist sim`), train on this machine's CPU cores (or as one process of a job of several) with a
// callback after every step, evaluate,
// and generate. The weights a Script trained stay with it for evaluate and generate; saved
// checkpoints can be given instead. Only standard types and this API's own structs appear here:
// the actor runtime, the transports and the parser stay inside the library. Errors come back
// as Status or Result<T>; nothing prints, exits or throws out of the library.
#pragma once

#include "dist/export.hpp"
#include "dist/result.hpp"

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace dist {

/// The library's version, "MAJOR.MINOR.PATCH".
DIST_API std::string version();

/// Where scripts' `import "std/..."` and hardware profiles are looked up.
struct Options {
    /// The folder holding `std/` and `hardware/` (an installed `share/dist/stdlib`); empty: found
    /// by default_search_roots().
    std::string stdlib_dir;
    /// More folders searched before the stdlib, after the importing script's own folder.
    std::vector<std::string> search_roots;
};

/// The folders searched when Options leaves stdlib_dir empty, in order: DIST_PATH's entries,
/// `../share/dist/stdlib` beside the installed library, the install prefix the library was
/// built for, `../share/dist/stdlib` beside the running executable, and the source tree it was
/// built from. Only folders that exist are listed.
DIST_API std::vector<std::string> default_search_roots();

/// The first folder that scripts loaded with `options` take `std/` from; "" when none has it.
DIST_API std::string find_stdlib(const Options& options = {});

/// One located message of the checker. Line and column are 1-based; 0 when nothing in a file
/// is to blame (an unreadable file, say).
struct Diagnostic {
    std::string file; // as given, or `--set` for an override
    int line = 0;
    int column = 0;
    std::string message;
    std::string hint;  // "" when there is none
    bool note = false; // context for a nearby error, not an error itself
};

struct CheckReport {
    bool ok = false;
    std::vector<Diagnostic> diagnostics;
    /// `file:line:col: error: ...`, the source line and a caret, as `dist check` prints them.
    std::string text;
};

/// One rank of a plan and the actions it executes every step, as `dist plan` writes them.
struct PlanRank {
    int rank = 0;
    int dp = 0, pp = 0, tp = 0;
    int host = 0;
    std::vector<std::string> actions; // e.g. "2F0", "0SEND_F1>r3", "1REDUCE_GRAD0", "STEP"
};

struct PlanSummary {
    std::string schedule; // e.g. "1f1b"
    int dp = 1, tp = 1, pp = 1;
    int stages = 1;
    int microbatches = 1;
    std::vector<PlanRank> ranks;
    /// The whole plan, printed as `dist plan` does.
    std::string text;
};

/// One simulated training step on the script's hardware profile.
struct SimFigures {
    double step_time_s = 0;
    double bubble_fraction = 0; // idle time / (ranks x step time)
    double mfu = 0;             // model FLOPs utilisation, 0..1
    double tokens_per_s = 0;
    std::vector<int64_t> peak_memory_bytes; // per rank
    int64_t memory_limit_bytes = 0;         // of one device
    bool fits = true;                       // every rank's peak within the limit
    /// The report and timeline `dist sim` prints.
    std::string text;
};

/// What the training callback sees after every step.
struct StepInfo {
    int64_t step = 0; // 1-based: the step just finished
    /// Whether this step's update was skipped because its loss or gradient norm was not finite
    /// (`train.on_nonfinite: skip`), and how many were skipped so far.
    bool skipped = false;
    int64_t skipped_steps = 0;
    /// Whether the script's `train.eval` evaluated after this step, and the loss it found.
    bool evaluated = false;
    double eval_loss = 0;
    double loss = 0;
    double lr = 0;
    double grad_norm = 0; // before clipping
    int64_t tokens = 0;   // in this step's batch
    double tokens_per_s = 0;
    double step_time_s = 0;
    /// The ranks' idle time over ranks x step time, measured this step (as `dist sim` predicts
    /// it).
    double bubble = 0;
};

struct TrainOptions {
    /// Called after every step, one call at a time, on the thread that called train(); return
    /// false to stop the run after that step (a checkpoint is saved then, when checkpoints are
    /// on). An exception it throws ends the run and becomes train()'s error. Keep it short: the
    /// ranks wait for it. In a job of several processes it is called in process 0 only.
    std::function<bool(const StepInfo&)> on_step;
    /// Save a checkpoint here at the end (and every `train.checkpoint.every` steps); empty: the
    /// script's `train.checkpoint.dir`, if any.
    std::string checkpoint_dir;
    /// Continue the run saved in this checkpoint folder (weights, optimizer state and step).
    std::string resume_from;
    /// Start from these weights (a Dist checkpoint or a Hugging Face model folder), as
    /// `dist run --load`; not with resume_from.
    std::string load_from;
    /// One JSON object per step here, as `dist run --metrics` writes them; empty: none.
    std::string metrics_path;
    /// Join a job of several processes when the environment describes one (DIST_RANK /
    /// DIST_WORLD_SIZE / DIST_COORDINATOR / DIST_JOB_TOKEN, Slurm's or mpirun's variables), as
    /// `dist run` does: every process of the job calls train() on the same script. false: train
    /// every rank in this process whatever the environment says.
    bool join_launch = true;
};

struct TrainSummary {
    int64_t first_step = 0; // 1-based: the first step run
    int64_t last_step = 0;  // the last step finished
    bool stopped = false;   // the callback ended the run early
    double final_loss = 0;
    std::string checkpoint_dir; // where the last checkpoint went; "" when none was saved
};

struct EvalFigures {
    double loss = 0; // mean next-token loss
    double perplexity = 0;
    int64_t tokens = 0; // tokens predicted
};

struct GenerateOptions {
    /// A checkpoint folder (Dist's or a Hugging Face model folder); empty: the weights this
    /// Script last trained.
    std::string weights;
    /// Negative: the script's `generate` block decides.
    double temperature = -1;
    int64_t top_k = -1;
    int64_t max_tokens = -1;
    /// Called with (prompt index, text) as each token is chosen.
    std::function<void(size_t, const std::string&)> on_text;
};

/// A .dist program with its overrides, and the weights it trained. Move-only.
class DIST_API Script {
  public:
    /// Reads a script; errors when the file cannot be read. Checking is separate (check()).
    static Result<Script> load(const std::string& path, const Options& options = {});
    /// A script from text; `name` is its file name in messages, and its folder anchors imports.
    static Result<Script> from_text(const std::string& name, const std::string& text,
                                    const Options& options = {});

    Script(Script&&) noexcept;
    Script& operator=(Script&&) noexcept;
    ~Script();

    /// Overrides a value, as `--set KEY=VALUE` does (`mesh.pp`, `train.stop_after`,
    /// `model.layers`, ...; VALUE in the script's syntax). A bad key or value is an error and
    /// the override is not kept. A later set of the same key replaces the earlier one.
    Status set(const std::string& key, const std::string& value);
    /// The overrides in force, as `KEY=VALUE`.
    std::vector<std::string> overrides() const;
    /// Drops every override.
    void clear_overrides();

    /// The script's name or path.
    const std::string& path() const;

    /// Checks the script with its overrides.
    CheckReport check() const;
    /// The ranks and actions of one training step; an error when the check or planning fails.
    Result<PlanSummary> plan() const;
    /// One step in virtual time on the script's hardware profile.
    Result<SimFigures> simulate() const;
    /// Trains on this machine (every rank of the mesh a worker of this process), or as one
    /// process of a job that the environment describes (TrainOptions::join_launch), from step 1
    /// or the resumed step to `train.stop_after` (or `train.steps`). The final weights stay with
    /// the Script (in process 0) for evaluate() and generate().
    Result<TrainSummary> train(const TrainOptions& options = {});
    /// Mean loss on a data file (text, or llm.c's `.bin` tokens) with `weights` (a checkpoint
    /// folder; empty: the weights this Script last trained).
    Result<EvalFigures> evaluate(const std::string& data_file, const std::string& weights = {});
    /// Continues each prompt (bytes; the model's vocabulary must be 256) and returns the new
    /// text of each.
    Result<std::vector<std::string>> generate(const std::vector<std::string>& prompts,
                                              const GenerateOptions& options = {});

  private:
    struct Impl;
    explicit Script(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
};

} // namespace dist
