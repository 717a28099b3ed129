// repl.cpp: the REPL's state and its simple commands: loading the script, `set` / `unset` (each
// change re-checked at once and refused when it does not check), `show`, `save`, `help`, and
// the dispatch of one command line to the other files' commands.
#include "cli/repl.hpp"

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

std::string trim(const std::string& s) {
    size_t b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
    return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

} // namespace

ReplSession::ReplSession(std::ostream& out, std::ostream& err) : out_(out), err_(err) {}

const std::vector<std::string>& ReplSession::commands() {
    static const std::vector<std::string> names = {"set",     "unset",   "show",   "plan",  "sim",
                                                   "compare", "explain", "memory", "trace", "svg",
                                                   "run",     "save",    "help",   "quit"};
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
        return ev;
    }
    ev.graph = std::move(*planned.graph);
    if (!simulate) return ev;
    sim::SimResult r = sim::simulate(*ev.graph, p);
    if (!r.ok()) {
        ev.error = plan::render_errors(name_, r.errors);
        return ev;
    }
    ev.timeline = std::move(*r.timeline);
    return ev;
}

const ReplEvaluation& ReplSession::current(bool simulate) {
    if (!planned_ || (simulate && !simulated_)) {
        current_ = evaluate(override_texts(), simulate);
        planned_ = true;
        simulated_ = simulate;
    }
    return current_;
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
      << " (dp " << p.mesh.dp << ", tp " << p.mesh.tp << ", pp " << p.mesh.pp << "), "
      << to_string(p.schedule.kind) << ", " << p.schedule.microbatches
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

std::vector<std::vector<ReplOverride>> ReplSession::companions(const ReplOverride& c) const {
    std::vector<std::vector<ReplOverride>> out;
    if (c.key == "schedule.kind") {
        out.push_back({{"schedule.virtual_stages", "2"}});
        out.push_back({{"schedule.virtual_stages", "1"}});
        return out;
    }
    if (!program_ || (c.key != "mesh.dp" && c.key != "mesh.tp" && c.key != "mesh.pp")) return out;
    char* end = nullptr;
    long long v = std::strtoll(c.value.c_str(), &end, 10);
    if (c.value.empty() || *end != '\0' || v < 1 || v > 65536) return out;
    const MeshSpec& m = program_->mesh;
    int64_t dp = c.key == "mesh.dp" ? v : m.dp, tp = c.key == "mesh.tp" ? v : m.tp,
            pp = c.key == "mesh.pp" ? v : m.pp;
    // The same devices, laid out anew: data parallelism takes what the other axes leave.
    if (c.key != "mesh.dp" && m.devices % (tp * pp) == 0)
        out.push_back({{"mesh.dp", std::to_string(m.devices / (tp * pp))}});
    // Or as many devices as the axes make, on as many hosts as they need.
    int64_t n = dp * tp * pp;
    std::string devices = m.device + " x " + std::to_string(n);
    out.push_back({{"mesh.devices", devices}});
    int64_t per_host = m.profile.devices_per_host;
    if (per_host > 0 && n % std::min(per_host, n) == 0)
        out.push_back(
            {{"mesh.devices", devices}, {"mesh.hosts", std::to_string(n / std::min(per_host, n))}});
    return out;
}

namespace {

// `KEY VALUE`, or one or more `KEY=VALUE` separated by spaces (a value may hold spaces:
// `mesh.devices=h100 x 16 mesh.dp=2` is two assignments).
std::vector<ReplOverride> parse_assignments(const std::string& args) {
    std::vector<ReplOverride> out;
    size_t eq = args.find('='), space = args.find_first_of(" \t");
    if (eq == std::string::npos || (space != std::string::npos && space < eq)) {
        if (space == std::string::npos) return {{args, ""}};
        return {{args.substr(0, space), trim(args.substr(space))}};
    }
    // Starts of assignments: a dotted name followed by `=`, at the start or after a space.
    std::vector<size_t> starts;
    for (size_t i = 0; i < args.size(); ++i) {
        if (i > 0 && args[i - 1] != ' ' && args[i - 1] != '\t') continue;
        size_t j = i;
        while (j < args.size() && (std::isalnum(static_cast<unsigned char>(args[j])) ||
                                   args[j] == '_' || args[j] == '.'))
            ++j;
        if (j > i && j < args.size() && args[j] == '=' && args.find('.', i) < j)
            starts.push_back(i);
    }
    if (starts.empty() || starts[0] != 0) starts.insert(starts.begin(), 0);
    for (size_t k = 0; k < starts.size(); ++k) {
        std::string part = args.substr(starts[k], k + 1 < starts.size() ? starts[k + 1] - starts[k]
                                                                        : std::string::npos);
        size_t e = part.find('=');
        if (e == std::string::npos)
            out.push_back({trim(part), ""});
        else
            out.push_back({trim(part.substr(0, e)), trim(part.substr(e + 1))});
    }
    return out;
}

} // namespace

void ReplSession::cmd_set(const std::string& args) {
    std::vector<ReplOverride> changes = parse_assignments(args);
    for (const ReplOverride& c : changes) {
        if (c.key.empty() || c.value.empty()) {
            error("`set` takes a key and a value",
                  "for example `set mesh.pp 4`, or `set mesh.pp=4 schedule.microbatches=8`");
            return;
        }
    }
    lang::CheckResult r = check(override_texts(changes));
    if (!r.ok() && changes.size() == 1) {
        for (const auto& extra : companions(changes[0])) {
            std::vector<ReplOverride> more = changes;
            more.insert(more.end(), extra.begin(), extra.end());
            lang::CheckResult retry = check(override_texts(more));
            if (retry.ok()) {
                r = std::move(retry);
                changes = std::move(more);
                break;
            }
        }
    }
    if (!r.ok()) {
        out_.flush();
        err_ << r.report();
        std::vector<std::string> known = keys();
        bool hinted = r.report().find("did you mean") != std::string::npos;
        for (const ReplOverride& c : changes) {
            if (hinted || std::find(known.begin(), known.end(), c.key) != known.end()) continue;
            std::string best = lang::closest_name(c.key, known);
            err_ << "hint: `" << c.key << "` is not a key `set` knows"
                 << (best.empty() ? "; `help set` lists them" : "; did you mean `" + best + "`?")
                 << "\n";
        }
        err_ << "(nothing changed)\n";
        err_.flush();
        return;
    }
    for (const ReplOverride& c : changes) {
        auto it = std::find_if(overrides_.begin(), overrides_.end(),
                               [&](const ReplOverride& o) { return o.key == c.key; });
        if (it != overrides_.end())
            it->value = c.value;
        else
            overrides_.push_back(c);
    }
    program_ = std::move(*r.program);
    planned_ = simulated_ = false;
    for (size_t i = 0; i < changes.size(); ++i)
        out_ << (i == 0 ? "" : ", ") << changes[i].key << " = " << changes[i].value;
    out_ << ": " << mesh_line(*program_) << "\n";
}

void ReplSession::cmd_unset(const std::string& args) {
    std::string key = trim(args);
    auto it = std::find_if(overrides_.begin(), overrides_.end(),
                           [&](const ReplOverride& o) { return o.key == key; });
    if (it == overrides_.end()) {
        std::vector<std::string> set;
        for (const ReplOverride& o : overrides_) set.push_back(o.key);
        std::string best = lang::closest_name(key, set);
        error("`" + key + "` is not set",
              set.empty() ? "nothing is set"
                          : (best.empty() ? "the keys set are " + lang::join_names(set)
                                          : "did you mean `" + best + "`?"));
        return;
    }
    ReplOverride removed = *it;
    overrides_.erase(it);
    lang::CheckResult r = check(override_texts());
    if (!r.ok()) {
        // Another override depended on this one (mesh.pp=4 with its microbatches).
        overrides_.insert(overrides_.begin(), removed);
        out_.flush();
        err_ << r.report() << "(nothing changed: the other values need `" << removed.text()
             << "`)\n";
        err_.flush();
        return;
    }
    program_ = std::move(*r.program);
    planned_ = simulated_ = false;
    out_ << key << " back to the script's value: " << mesh_line(*program_) << "\n";
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
            "  save FILE          write the script with the values set\n"
            "  help [set]         this text, or the keys\n"
            "  quit               leave (or end of input)\n";
}

} // namespace dist::cli
