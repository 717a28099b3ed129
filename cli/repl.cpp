// repl.cpp: the REPL's state and its simple commands: loading the script, checking and
// evaluating it with the values set, `show`, `save`, `help`, and the dispatch of one command
// line to the other files' commands (`set` and `unset` are in repl_set.cpp).
#include "cli/repl.hpp"
#include "cli/repl_format.hpp"

#include "actors/plan/lower.hpp"
#include "lang/check.hpp"
#include "lang/diagnostics.hpp"
#include "lang/program_json.hpp"
#include "models/atomic_file.hpp"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <ostream>
#include <sstream>

namespace dist::cli {

namespace {

// The example `dist repl` starts from without a FILE: the tiny GPT of examples/gpt_tiny.dist on
// a two-stage pipeline, with synthetic data so that `run` works on any machine.
const char* const builtin_script =
    R"(# The built-in example of `dist repl`: a tiny GPT-2 on a two-stage pipeline of CPU ranks.
import "std/gpt.dist"

model = gpt(vocab: 256, context: 64, layers: 4, heads: 4, width: 128)

mesh {
    devices: cpu
    dp: 1
    tp: 1
    pp: 2
}

schedule {
    kind: 1f1b
    microbatches: 4
}

train {
    data: synthetic()
    batch: 16
    steps: 300
    seed: 1337
    optimizer {
        lr: 3e-3
        weight_decay: 0.1
    }
    clip: 1.0
}
)";

const char* const builtin_name = "<built-in example>";

// The fields of the top-level blocks, as the checker reads them (lang/check_*.cpp).
const std::vector<std::string> block_keys = {
    "mesh.devices",
    "mesh.hosts",
    "mesh.dp",
    "mesh.tp",
    "mesh.pp",
    "mesh.cp",
    "mesh.zero",
    "mesh.sp",
    "mesh.memory",
    "schedule.kind",
    "schedule.microbatches",
    "schedule.virtual_stages",
    "schedule.recompute",
    "train.batch",
    "train.steps",
    "train.stop_after",
    "train.seed",
    "train.precision",
    "train.clip",
    "train.data",
    "train.optimizer.lr",
    "train.optimizer.betas",
    "train.optimizer.eps",
    "train.optimizer.weight_decay",
    "train.lr_schedule.kind",
    "train.lr_schedule.warmup",
    "train.lr_schedule.min_lr",
    "train.checkpoint.every",
    "train.checkpoint.dir",
    "generate.temperature",
    "generate.top_k",
    "generate.max_tokens",
};

} // namespace

ReplSession::ReplSession(std::ostream& out, std::ostream& err) : out_(out), err_(err) {}

const std::vector<std::string>& ReplSession::commands() {
    static const std::vector<std::string> names = {
        "set",   "unset", "show", "plan",   "sim", "compare", "explain", "memory",
        "trace", "svg",   "run",  "search", "use", "save",    "help",    "quit"};
    return names;
}

const std::vector<std::string>& ReplSession::schedule_kinds() {
    static const std::vector<std::string> kinds = {
        "gpipe", "1f1b", "interleaved_1f1b", "looped_bfs", "zb_h1", "zb_h2", "zbv", "dualpipev"};
    return kinds;
}

std::vector<std::string> ReplSession::keys() const {
    std::vector<std::string> out = block_keys;
    if (program_)
        for (const auto& [name, value] : program_->model.arguments) out.push_back("model." + name);
    return out;
}

std::vector<std::string> ReplSession::override_texts(const std::vector<ReplOverride>& extra) const {
    std::vector<std::string> texts;
    for (const ReplOverride& o : overrides_) {
        bool replaced = std::any_of(extra.begin(), extra.end(),
                                    [&](const ReplOverride& e) { return e.key == o.key; });
        if (!replaced) texts.push_back(o.text());
    }
    for (const ReplOverride& e : extra) texts.push_back(e.text());
    return texts;
}

lang::CheckResult ReplSession::check(const std::vector<std::string>& overrides) const {
    lang::FrontendOptions fo;
    fo.search_roots = lang::default_search_roots();
    fo.overrides = overrides;
    return file_.empty() ? lang::check_text(builtin_name, text_, fo) : lang::check_file(file_, fo);
}

ReplEvaluation ReplSession::evaluate(const std::vector<std::string>& overrides,
                                     bool simulate) const {
    ReplEvaluation ev;
    ev.checked = check(overrides);
    if (!ev.checked->ok()) {
        ev.error = ev.checked->report();
        return ev;
    }
    finish(ev, simulate);
    return ev;
}

void ReplSession::finish(ReplEvaluation& ev, bool simulate) const {
    const Program& p = *ev.checked->program;
    plan::PlanResult planned = plan::lower(p);
    if (!planned.ok()) {
        for (const plan::PlanError& e : planned.errors) {
            if (e.loc.valid())
                ev.error +=
                    lang::render_diagnostic(*ev.checked->sources, {e.loc, e.message, e.hint});
            else
                ev.error += plan::render_errors(name_, {e});
        }
        return;
    }
    ev.graph = std::move(*planned.graph);
    if (!simulate) return;
    sim::SimResult r = sim::simulate(*ev.graph, p);
    if (!r.ok()) {
        ev.error = plan::render_errors(name_, r.errors);
        return;
    }
    ev.timeline = std::move(*r.timeline);
}

const ReplEvaluation& ReplSession::current(bool simulate) {
    if (!planned_ || (simulate && !simulated_)) {
        current_ = evaluate(override_texts(), simulate);
        planned_ = true;
        simulated_ = simulate;
    }
    return current_;
}

const plan::Graph* ReplSession::current_graph() {
    const ReplEvaluation& ev = current(false);
    if (ev.graph) return &*ev.graph;
    out_.flush();
    err_ << ev.error;
    return nullptr;
}

const sim::Timeline* ReplSession::current_timeline() {
    const ReplEvaluation& ev = current(true);
    if (ev.timeline) return &*ev.timeline;
    out_.flush();
    err_ << ev.error;
    return nullptr;
}

void ReplSession::error(const std::string& message, const std::string& hint) {
    out_.flush();
    err_ << "error: " << message << "\n";
    if (!hint.empty()) err_ << "hint: " << hint << "\n";
    err_.flush();
}

std::string ReplSession::mesh_line(const Program& p) const {
    std::ostringstream s;
    s << p.mesh.devices << " " << p.mesh.profile.name << (p.mesh.devices == 1 ? " rank" : " ranks")
      << " (" << lang::axes_text(p.mesh) << "), " << to_string(p.schedule.kind) << ", "
      << p.schedule.microbatches
      << (p.schedule.microbatches == 1 ? " microbatch" : " microbatches");
    if (p.schedule.virtual_stages > 1) s << ", " << p.schedule.virtual_stages << " virtual stages";
    return s.str();
}

bool ReplSession::load(const std::string& file) {
    file_ = file;
    name_ = file.empty() ? builtin_name : file;
    if (file.empty()) text_ = builtin_script;
    lang::CheckResult r = check({});
    if (!r.ok()) {
        err_ << r.report();
        return false;
    }
    program_ = std::move(*r.program);
    if (file.empty())
        out_ << "no FILE given: starting from the built-in example (a tiny GPT on two CPU "
                "pipeline ranks; `save FILE` writes it out)\n";
    out_ << name_ << ": " << mesh_line(*program_) << "\n"
         << "type `help` for the commands, `quit` to leave\n";
    return true;
}

void ReplSession::cmd_show() {
    std::string problem;
    std::string text = script_with_overrides(problem);
    if (text.empty()) {
        error(problem);
        return;
    }
    out_ << "# " << name_;
    if (overrides_.empty()) {
        out_ << ", as written\n";
    } else {
        out_ << " with";
        for (const ReplOverride& o : overrides_) out_ << " " << o.text();
        out_ << "\n";
    }
    out_ << text;
}

void ReplSession::cmd_save(const std::string& path) {
    if (path.empty()) {
        error("`save` takes a file name", "for example `save my_plan.dist`");
        return;
    }
    std::string problem;
    std::string text = script_with_overrides(problem);
    if (text.empty()) {
        error(problem);
        return;
    }
    if (std::string e = models::write_file_atomically(path, {text}); !e.empty()) {
        error(e);
        return;
    }
    // The saved file must give the same program: check it as `dist check` would.
    lang::FrontendOptions fo;
    fo.search_roots = lang::default_search_roots();
    lang::CheckResult saved = lang::check_file(path, fo);
    if (!saved.ok()) {
        out_.flush();
        err_ << saved.report();
        error("`" + path + "` was written but does not check",
              "relative imports and data paths resolve from the file's folder; save it beside "
              "the original script");
        return;
    }
    nlohmann::json a = lang::to_json(*saved.program), b = lang::to_json(*program_);
    a.erase("file");
    b.erase("file");
    if (a != b) {
        error("`" + path + "` was written but gives another program than this session's",
              "relative paths resolve from the file's folder; save it beside the original script");
        return;
    }
    out_ << "saved " << path << " (" << overrides_.size()
         << (overrides_.size() == 1 ? " value" : " values") << " written into the script)\n";
}

bool ReplSession::execute(const std::string& raw) {
    std::string line = trim(raw);
    if (line.empty() || line[0] == '#') return true;
    size_t space = line.find_first_of(" \t");
    std::string cmd = line.substr(0, space);
    std::string args = space == std::string::npos ? "" : trim(line.substr(space));
    if (cmd == "quit" || cmd == "exit") return false;
    if (cmd == "set")
        cmd_set(args);
    else if (cmd == "unset")
        cmd_unset(args);
    else if (cmd == "show")
        cmd_show();
    else if (cmd == "plan")
        cmd_plan();
    else if (cmd == "sim")
        cmd_sim();
    else if (cmd == "compare")
        cmd_compare(args);
    else if (cmd == "explain")
        cmd_explain();
    else if (cmd == "memory")
        cmd_memory();
    else if (cmd == "trace" || cmd == "svg")
        cmd_write(cmd, args);
    else if (cmd == "run")
        cmd_run(args);
    else if (cmd == "search")
        cmd_search(args);
    else if (cmd == "use")
        cmd_use(args);
    else if (cmd == "save")
        cmd_save(args);
    else if (cmd == "help" || cmd == "?")
        cmd_help(args);
    else {
        std::string best = lang::closest_name(cmd, commands());
        error("unknown command `" + cmd + "`",
              (best.empty() ? std::string() : "did you mean `" + best + "`? ") +
                  "`help` lists the commands");
    }
    out_.flush();
    return true;
}

void ReplSession::cmd_help(const std::string& topic) {
    if (topic == "set") {
        out_ << "set KEY VALUE   change a value of the script, as `--set KEY=VALUE` would; the "
                "keys:\n";
        for (const std::string& k : keys()) out_ << "  " << k << "\n";
        out_ << "schedule kinds: " << lang::join_names(schedule_kinds(), ", ") << "\n";
        return;
    }
    out_ << "commands:\n"
            "  set KEY VALUE      change a value (mesh.pp, schedule.kind, model.layers, ...);\n"
            "                     the program is checked at once (`help set` lists the keys)\n"
            "  unset KEY          back to the script's value\n"
            "  show               the script with the values set\n"
            "  plan               the actor graph: ranks, stages, every rank's actions\n"
            "  sim                one simulated step: timeline, step time, bubble, memory, MFU\n"
            "  compare KIND...    those figures for several schedule kinds\n"
            "  compare KEY=A,B,.. those figures for several values of one key\n"
            "  explain            the critical path of the step, and why each rank idles\n"
            "  memory             memory per rank, and whether it fits\n"
            "  trace FILE         write the simulated step as a Chrome trace (Perfetto)\n"
            "  svg FILE           write the simulated step as a Gantt chart\n"
            "  run N              train N real steps on this machine, measured against simulated\n"
            "  search [--top K] [--devices NAME x COUNT,...]\n"
            "                     the fastest layouts of this model on these devices\n"
            "  use N              adopt row N of the last search as the current layout\n"
            "  save FILE          write the script with the values set\n"
            "  help [set]         this text, or the keys\n"
            "  quit               leave (or end of input)\n";
}

} // namespace dist::cli
