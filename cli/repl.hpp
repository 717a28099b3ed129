// repl.hpp: `dist repl`, the interactive explorer of plans and schedules.
//
// A ReplSession holds a script and the `set` overrides on top of it, and answers one command
// line at a time: it re-checks the program on every change (front end), lowers it to a Graph
// (actors/plan), simulates it (actors/sim) and trains it for a few steps (actors/runtime). It is
// a plain class that reads no terminal, so tests drive it through text; repl_line.cpp puts
// libedit (line editing, history, completion) or a plain stdin reader around it.
//
// Files, by step: repl.cpp (state, show/save/help), repl_set.cpp (set/unset), repl_script.cpp
// (overrides applied to the syntax tree for show and save), repl_figures.cpp (plan, sim,
// compare, memory, trace, svg), repl_explain.cpp (critical path and idle time), repl_run.cpp
// (real steps), repl_search.cpp (search and use), repl_line.cpp (the terminal).
#pragma once

#include "actors/plan/graph.hpp"
#include "actors/sim/simulate.hpp"
#include "lang/check.hpp"
#include "lang/program.hpp"

#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

namespace dist::cli {

/// A `set KEY VALUE`, kept as text: it is checked exactly as `--set KEY=VALUE` would be.
struct ReplOverride {
    std::string key;
    std::string value;
    std::string text() const { return key + "=" + value; }
};

/// What one set of overrides gives: the program, its plan and its simulated step, or the
/// first error on the way (rendered as the front end and the planner render them).
struct ReplEvaluation {
    std::optional<lang::CheckResult> checked;
    std::optional<plan::Graph> graph;
    std::optional<sim::Timeline> timeline;
    std::string error;
    bool ok() const { return timeline.has_value(); }
};

class ReplSession {
  public:
    ReplSession(std::ostream& out, std::ostream& err);

    /// Starts from FILE, or from the built-in example when `file` is empty. False (with the
    /// diagnostics printed) when the script does not check.
    bool load(const std::string& file);

    /// Runs one command line. False when the session ends (`quit`).
    bool execute(const std::string& line);

    /// The command names, for completion and hints.
    static const std::vector<std::string>& commands();
    /// The schedule kinds, as scripts write them.
    static const std::vector<std::string>& schedule_kinds();
    /// Every key `set` knows: the blocks' fields and `model.ARG` for the current model.
    std::vector<std::string> keys() const;

  private:
    // repl.cpp (and repl_set.cpp: companions, cmd_set, cmd_unset)
    std::vector<std::string> override_texts(const std::vector<ReplOverride>& extra = {}) const;
    lang::CheckResult check(const std::vector<std::string>& overrides) const;
    ReplEvaluation evaluate(const std::vector<std::string>& overrides, bool simulate) const;
    /// The planning and simulation half of evaluate(), for a program that checks. Touches no
    /// session state, so that `compare` runs several at once.
    void finish(ReplEvaluation& ev, bool simulate) const;
    /// The current program's plan and timeline, computed on first use after a change.
    const ReplEvaluation& current(bool simulate);
    /// The current plan (or timeline); null after printing why there is none.
    const plan::Graph* current_graph();
    const sim::Timeline* current_timeline();
    /// Other values to try with KEY=VALUE when it does not check alone: for a mesh axis of a
    /// script that writes its device count, the data-parallel size that keeps the device count,
    /// or the device count (and hosts) that the new axes make. Also the virtual stages that a
    /// schedule kind needs. Most wanted first.
    std::vector<std::vector<ReplOverride>> companions(const ReplOverride& change) const;
    void error(const std::string& message, const std::string& hint = "");
    void cmd_set(const std::string& args);
    void cmd_unset(const std::string& args);
    void cmd_show();
    void cmd_save(const std::string& path);
    void cmd_help(const std::string& topic);
    std::string mesh_line(const Program& p) const;

    // repl_script.cpp: the script text with the overrides written into it ("" and `error`
    // when it cannot be built).
    std::string script_with_overrides(std::string& error_out) const;

    // repl_figures.cpp
    void cmd_plan();
    void cmd_sim();
    void cmd_compare(const std::string& args);
    void cmd_memory();
    void cmd_write(const std::string& what, const std::string& path);

    // repl_explain.cpp
    void cmd_explain();

    // repl_run.cpp
    void cmd_run(const std::string& args);

    // repl_search.cpp
    void cmd_search(const std::string& args);
    void cmd_use(const std::string& args);

    std::ostream& out_;
    std::ostream& err_;
    std::string file_; // the script's path; "" for the built-in example
    std::string name_; // how messages name it
    std::string text_; // the built-in example's text (files are read on every check)
    std::vector<ReplOverride> overrides_;
    std::optional<Program> program_; // the current program (always checks)
    ReplEvaluation current_;         // its plan and timeline, when computed
    bool planned_ = false, simulated_ = false;
    /// The last `run`'s last step as it ran: `explain` compares it with the prediction while
    /// the plan stays the same.
    std::optional<sim::Timeline> last_measured_;
    /// The rows of the last `search`, each as the `set` line that adopts it.
    std::vector<std::string> searched_;
};

/// `dist repl [FILE]`: libedit on a terminal, else one command per line of standard input.
/// `overrides` (`KEY=VALUE`) are set first; `echo` prints each command read before its answer
/// (transcripts of scripted sessions). 0 at `quit` or the end of input, 1 when FILE does not
/// check.
int run_repl(const std::string& file, const std::vector<std::string>& overrides, bool echo);

} // namespace dist::cli
