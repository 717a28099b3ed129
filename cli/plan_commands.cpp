// plan_commands.cpp: `dist plan` and `dist sim`: the checked program lowered to its actor
// graph (actors/plan), and that graph run in virtual time (actors/sim).
#include "cli/planned.hpp"

#include "actors/plan/graph_json.hpp"
#include "actors/plan/lower.hpp"
#include "actors/sim/simulate.hpp"
#include "kernels/devices.hpp"
#include "lang/check.hpp"
#include "lang/program_json.hpp"
#include "models/atomic_file.hpp"

#include <optional>
#include <ostream>
#include <sstream>

namespace dist::cli {

lang::CheckResult check_script(const CommonOptions& o) {
    lang::FrontendOptions fo;
    fo.search_roots = lang::default_search_roots();
    fo.overrides = o.overrides;
    return lang::check_file(o.file, fo);
}

std::optional<Planned> planned(const CommonOptions& o, std::ostream& err) {
    lang::CheckResult r = check_script(o);
    if (!r.ok()) {
        err << r.report();
        return std::nullopt;
    }
    plan::PlanResult p = plan::lower(*r.program);
    if (!p.ok()) {
        for (const plan::PlanError& e : p.errors) {
            if (e.loc.valid())
                err << lang::render_diagnostic(*r.sources, {e.loc, e.message, e.hint});
            else
                err << o.file << ": error: " << e.message << "\n"
                    << (e.hint.empty() ? "" : "hint: " + e.hint + "\n");
        }
        return std::nullopt;
    }
    return Planned{*r.program, *p.graph};
}

bool procs_fit(int procs, const plan::Graph& graph, std::ostream& err) {
    const auto ranks = static_cast<int32_t>(graph.ranks.size());
    if (procs <= ranks) return true;
    err << "error: --procs " << procs << " for " << ranks
        << " ranks: every process needs at least one rank\n";
    return false;
}

bool runs_here(const Program& p, std::ostream& err, bool gpus) {
    if (p.mesh.mixed()) {
        err << p.train.training_refusal;
        return false;
    }
    if (p.mesh.profile.cpu()) return true;
    if (gpus && kernels::gpu_count() > 0) return true;
    err << "error: the mesh is " << p.mesh.devices << " " << p.mesh.profile.name << " device(s); ";
    if (!gpus)
        err << "this command runs meshes of `cpu` devices (ranks on this machine's cores)\n";
    else if (kernels::built_with_cuda())
        err << "this machine has no GPU that CUDA can use\n";
    else
        err << "this build has no CUDA support (nvcc was not found when it was configured)\n";
    err << "hint: `dist sim` predicts this mesh; to run it here, --set 'mesh.devices=cpu' "
           "(and smaller model or mesh values)\n";
    return false;
}

namespace {

int write(const std::string& path, const std::string& text, std::ostream& err) {
    if (std::string e = models::write_file_atomically(path, {text}); !e.empty()) {
        err << "error: " << e << "\n";
        return 1;
    }
    return 0;
}

} // namespace

int run_plan(const CommonOptions& o, bool json, std::ostream& out, std::ostream& err) {
    std::optional<Planned> p = planned(o, err);
    if (!p) return 1;
    if (json) {
        nlohmann::json j = plan::to_json(p->graph);
        j["program"] = lang::to_json(p->program);
        out << j.dump(2) << "\n";
        return 0;
    }
    // The checker's summary, less its schedule line: the plan below shows the real partition.
    std::istringstream summary(lang::summary(p->program));
    for (std::string line; std::getline(summary, line);)
        if (line.rfind("schedule ", 0) != 0) out << line << "\n";
    out << plan::print(p->graph);
    return 0;
}

int run_sim(const CommonOptions& o, const SimOptions& s, std::ostream& out, std::ostream& err) {
    if (s.cost != "unit" && s.cost != "profile") {
        err << "error: --cost is `unit` or `profile`, not `" << s.cost << "`\n";
        return 2;
    }
    std::optional<Planned> p = planned(o, err);
    if (!p) return 1;
    if (!procs_fit(s.procs, p->graph, err)) return 1;
    sim::SimOptions so;
    so.cost = s.cost == "unit" ? sim::CostModel::unit : sim::CostModel::profile;
    so.processes = s.procs;
    sim::SimResult r = sim::simulate(p->graph, p->program, so);
    if (!r.ok()) {
        err << plan::render_errors(o.file, r.errors);
        return 1;
    }
    if (!s.svg.empty() && write(s.svg, sim::svg(*r.timeline), err) != 0) return 1;
    if (!s.trace.empty() && write(s.trace, sim::chrome_trace(*r.timeline), err) != 0) return 1;
    if (s.json)
        out << sim::to_json(*r.timeline).dump(2) << "\n";
    else
        out << sim::text_report(*r.timeline);
    return 0;
}

} // namespace dist::cli
