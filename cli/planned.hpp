// planned.hpp: the step every computing command starts with: the script checked and lowered to
// its actor graph, with every diagnostic printed (planning errors located in the script like
// the checker's, with the source line and a caret).
#pragma once

#include "actors/plan/graph.hpp"
#include "cli/commands.hpp"
#include "lang/check.hpp"
#include "lang/program.hpp"

#include <iosfwd>
#include <optional>

namespace dist::cli {

struct Planned {
    Program program;
    plan::Graph graph;
};

/// The script of `o` checked, with its `--set` values and the default search roots.
lang::CheckResult check_script(const CommonOptions& o);

/// The program of `o` and its graph, or nothing after printing why to `err`.
std::optional<Planned> planned(const CommonOptions& o, std::ostream& err);

/// Whether `procs` processes (`--procs`) each get at least one of the graph's ranks; if not,
/// prints why.
bool procs_fit(int procs, const plan::Graph& graph, std::ostream& err);

/// Whether this build can execute the program's mesh on this machine: a mesh of `cpu` devices
/// always (ranks on the cores); a mesh of GPUs when `gpus` allows it (training) and the build
/// and the machine have CUDA devices. If not, prints why and what to do instead.
bool runs_here(const Program& p, std::ostream& err, bool gpus = false);

} // namespace dist::cli
