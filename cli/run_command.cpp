// run_command.cpp: `dist run`: the checked program planned, then trained by a training session
// (actors/runtime/session.hpp) on its mesh, in this process or as one of a job's processes; a
// progress line, and after the run the measured bubble beside the simulated, a trace of the
// last step and a sample.
#include "cli/pace.hpp"
#include "cli/planned.hpp"

#include "actors/plan/stages.hpp"
#include "actors/runtime/job.hpp"
#include "actors/runtime/measured.hpp"
#include "actors/runtime/session.hpp"
#include "actors/runtime/steal.hpp"
#include "actors/sim/simulate.hpp"
#include "kernels/devices.hpp"
#include "kernels/tensor.hpp"
#include "models/atomic_file.hpp"
#include "models/trainer.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <ostream>
#include <unistd.h>

namespace dist::cli {

namespace {

// The busiest expert's token copies over the mean that routing by chance alone gives in one
// step: every token of the batch picks top_k experts uniformly at random in each moe layer, and
// the loads are summed over the layers, as the step's metrics sum them (the layers of a model
// share one expert count and top_k in std/moe.dist; the first one's are taken). 0 when a
// capacity caps the loads, which the figure would not know.
double expert_load_by_chance(const Program& p) {
    const LayerSpec* moe = nullptr;
    int64_t layers = 0;
    for (const BlockSpec& b : p.model.blocks)
        for (const ModelItemSpec& it : b.items)
            for (const LayerSpec& l : it.layers)
                if (l.kind == LayerKind::moe) {
                    ++layers;
                    if (!moe) moe = &l;
                }
    if (!moe || moe->capacity > 0) return 0.0; // a capacity caps the loads: no figure
    const double E = static_cast<double>(moe->experts), k = static_cast<double>(moe->top_k);
    const double choices = static_cast<double>(p.train.batch * p.model.context * layers);
    return plan::busiest_over_mean(moe->experts, choices * k / E, choices * (k / E) * (1 - k / E));
}

std::string model_label(const Program& p) {
    return p.model.preset.empty() ? p.model.template_name : p.model.preset;
}

std::string mesh_label(const Program& p, const plan::Graph& g) {
    if (p.mesh.devices == 1) return "one " + p.mesh.profile.name + " device";
    return std::to_string(p.mesh.devices) + " " + p.mesh.profile.name + " ranks (" +
           plan::axes_text(g) + ", " + to_string(g.schedule) + ")";
}

// The trace with each rank's transfers to and from other processes in the step, as an instant
// event at the end of the rank's step (its args: the same figures as the metrics' `p2p`).
std::string with_transfers(const std::string& trace, const runtime::SessionStep& step) {
    const std::string end = "\n]}\n";
    if (trace.size() < end.size() || trace.compare(trace.size() - end.size(), end.size(), end) != 0)
        return trace;
    nlohmann::json ranks = nlohmann::json::parse(runtime::traffic_json(step.traffic))["by_rank"];
    std::string events;
    const std::vector<double> origin = runtime::timing_origins(step.timings);
    for (size_t r = 0; r < step.timings.size() && r < ranks.size(); ++r) {
        double last = 0;
        for (const auto& t : step.timings[r]) last = std::max(last, t.end_s - origin[r]);
        nlohmann::json e = {{"name", "transfers between processes"},
                            {"ph", "i"},
                            {"s", "t"},
                            {"pid", 0},
                            {"tid", r},
                            {"ts", last * 1e6},
                            {"args", ranks[r]}};
        events += ",\n" + e.dump();
    }
    return trace.substr(0, trace.size() - end.size()) + events + end;
}

// What names the job: the script's bytes and the overrides (every process must agree).
std::string identity_of(const CommonOptions& o) {
    std::ifstream script(o.file, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(script)), std::istreambuf_iterator<char>());
    for (const auto& s : o.overrides) bytes += "\n--set " + s;
    return bytes;
}

// The GPU whose allocator peaked highest over the run beside what the simulator says its ranks
// hold: "memory: measured 3512.4 MB at the peak of cuda:0 (1 rank), predicted 3380.2 MB
// (0.96x)". Ranks sharing a GPU: the most they hold at once where all share one, else the sum
// of their peaks.
std::string gpu_memory_line(const std::vector<kernels::Device>& placed, const sim::Timeline& t) {
    std::map<int, std::vector<size_t>> on; // GPU -> its ranks
    for (size_t r = 0; r < placed.size(); ++r)
        if (placed[r].kind == kernels::Device::Kind::cuda) on[placed[r].index].push_back(r);
    int busiest = -1;
    size_t most = 0;
    for (const auto& [gpu, ranks] : on) {
        size_t peak = kernels::backend_for({kernels::Device::Kind::cuda, gpu})
                          .allocator()
                          .peak_bytes_in_use();
        if (busiest < 0 || peak > most) busiest = gpu, most = peak;
    }
    if (busiest < 0) return "";
    const std::vector<size_t>& ranks = on[busiest];
    double predicted = 0;
    if (on.size() == 1)
        predicted = static_cast<double>(t.shared_peak_bytes);
    else
        for (const sim::RankReport& rr : t.ranks)
            if (std::find(ranks.begin(), ranks.end(), static_cast<size_t>(rr.rank)) != ranks.end())
                predicted += static_cast<double>(rr.peak_memory_bytes);
    char line[256];
    std::snprintf(line, sizeof line,
                  "memory: measured %.1f MB at the peak of cuda:%d (%zu rank%s), predicted %.1f MB "
                  "(%.2fx)",
                  static_cast<double>(most) / 1e6, busiest, ranks.size(),
                  ranks.size() == 1 ? "" : "s", predicted / 1e6,
                  most > 0 ? predicted / static_cast<double>(most) : 0.0);
    return line;
}

} // namespace

int run_procs(const CommonOptions& o, int procs, const std::vector<std::string>& args,
              std::ostream& out, std::ostream& err) {
    // What one process would refuse before training, refused once here, before any starts.
    std::optional<Planned> plan = planned(o, err);
    if (!plan || !procs_fit(procs, plan->graph, err) || !runs_here(plan->program, err, true))
        return 1;
    std::optional<PaceCheck> pace;
    if (plan->program.mesh.profile.cpu()) pace.emplace(plan->program.mesh.profile);
    return launch_local(procs, args, out, err, pace ? &*pace : nullptr);
}

int run_train(const CommonOptions& o, const RunOptions& r, std::ostream& out, std::ostream& err) {
    std::optional<Planned> plan = planned(o, err);
    if (!plan) return 1;
    const Program& p = plan->program;
    const plan::Graph& graph = plan->graph;
    if (!runs_here(p, err, true)) return 1;
    const bool tty = r.progress && ::isatty(STDERR_FILENO);
    double elapsed = 0.0;
    int64_t first = 0, last = 0;
    runtime::SessionOptions so;
    so.resume = r.resume;
    so.load = r.load;
    so.save_dir = r.save;
    so.metrics_path = r.metrics;
    so.identity = identity_of(o);
    so.keep_weights = r.sample_tokens > 0;
    so.log = [](const std::string& line) { std::cerr << "dist: " << line << "\n" << std::flush; };
    so.abandon = [](const std::string& why) {
        std::cerr << "error: " << why << "\n(ranks of this process were still waiting on their "
                  << "peers; ending it)\n"
                  << std::flush;
        std::_Exit(1);
    };
    runtime::StepTally tally;
    so.on_step = [&](const runtime::SessionStep& s) {
        const models::StepMetrics& m = s.metrics;
        elapsed += m.step_time_s;
        tally.add(m.step_time_s, s.bubble);
        double eta =
            elapsed / static_cast<double>(m.step - first) * static_cast<double>(last - m.step);
        std::string line = runtime::progress_line(m, last, eta);
        if (!s.nonfinite.empty()) line += "  (skipped: non-finite " + s.nonfinite + ")";
        if (s.eval_loss) line += "  eval " + std::to_string(*s.eval_loss).substr(0, 6);
        if (tty)
            err << "\r" << line << "\x1b[K" << std::flush;
        else if (r.progress && (m.step == first + 1 || m.step % 10 == 0 || m.step == last ||
                                !s.nonfinite.empty() || s.eval_loss))
            err << line << "\n";
        return true;
    };
    runtime::Session session(p, graph, so);
    runtime::SessionError e = session.open();
    if (!e.message.empty()) {
        err << (e.located ? "" : "error: ") << e.message << (e.located ? "" : "\n");
        return e.usage ? 2 : 1;
    }
    first = session.first_step();
    last = session.last_step();
    if (session.lead())
        out << "training " << model_label(p) << " (" << p.model.parameters << " parameters) on "
            << (first > 0 ? "steps " + std::to_string(first + 1) + " to " : "steps 1 to ") << last
            << ", " << p.train.batch << " x " << p.model.context << " tokens each, "
            << (p.train.precision == Precision::bf16 ? "in bf16, " : "") << "on "
            << mesh_label(p, graph)
            << (session.processes() > 1
                    ? ", in " + std::to_string(session.processes()) + " processes"
                    : "")
            << "\n"
            << std::flush;
    // From here the host allocator's peak is the training's (the parameters and their state are
    // in place already).
    kernels::Allocator::cpu().reset_peak();
    // Ranks on GPUs (one process): each GPU's allocator, likewise from here.
    std::vector<kernels::Device> placed;
    if (!p.mesh.profile.cpu() && session.processes() == 1 && kernels::gpu_count() > 0) {
        placed = runtime::place_in_one_process(p, graph);
        for (const kernels::Device& d : placed) kernels::backend_for(d).allocator().reset_peak();
    }
    // One process on a calibrated CPU: the profile's matmul timed before the run and after it,
    // to say whether the machine ran as calibrated (pace.hpp). Another process's ranks would be
    // waiting on this one's, or still running, while it is timed: with `--procs` the launcher
    // times it (run_procs).
    std::optional<PaceCheck> pace;
    if (p.mesh.profile.cpu() && session.processes() == 1 && session.lead()) {
        pace.emplace(p.mesh.profile);
        pace->before();
    }
    const runtime::CpuTicks ticks_before = runtime::read_cpu_ticks();
    // What other programs used of the cores over the run (in one process: with --procs the
    // others would be this run's own).
    const runtime::OtherLoad others;
    e = session.run();
    const double stolen = runtime::stolen_share(ticks_before, runtime::read_cpu_ticks());
    const double others_used = session.processes() == 1 ? others.share() : 0.0;
    const std::string pace_line = pace && e.message.empty() ? pace->after() : "";
    const size_t measured_peak = kernels::Allocator::cpu().peak_bytes_in_use();
    if (tty && session.lead()) err << "\n";
    if (!e.message.empty()) {
        err << "error: " << e.message << "\n";
        return 1;
    }
    if (!session.lead()) return 0;
    if (!session.saved_dir().empty()) out << "saved " << session.saved_dir() << "\n";
    const runtime::SessionStep* last_step = session.last();
    if (last_step && !last_step->timings.empty()) {
        sim::Timeline measured = runtime::measured_timeline(graph, last_step->timings);
        sim::SimOptions so;
        so.processes = session.processes();
        // Ranks on this machine's GPUs, in turn: those that outnumber the GPUs share them.
        so.shared_gpus = runtime::gpus_in_use(placed);
        sim::SimResult predicted = sim::simulate(graph, p, so);
        // The medians of the steps after the first (which warms up), beside the prediction.
        if (predicted.ok()) {
            out << sim::comparison_line(tally.median_step_s(), tally.median_bubble(),
                                        *predicted.timeline, p.mesh.profile.name,
                                        tally.middle_half_s())
                << "\n";
            if (std::string hint = sim::calibration_hint(p.mesh.profile); !hint.empty())
                out << hint << "\n";
            if (std::string note = runtime::stolen_note(stolen); !note.empty()) out << note << "\n";
            if (std::string note = runtime::others_note(others_used); !note.empty())
                out << note << "\n";
            if (!pace_line.empty()) out << pace_line << "\n";
        }
        if (predicted.ok() && p.mesh.profile.cpu() && session.processes() == 1) {
            // Every rank lives in this process, on the host allocator: its peak against the most
            // the simulated ranks hold at once.
            const auto sum = static_cast<double>(predicted.timeline->shared_peak_bytes);
            char line[256];
            std::snprintf(line, sizeof line,
                          "memory: measured %.1f MB at the peak of the tensors of %zu rank%s, "
                          "predicted %.1f MB (%.2fx)",
                          static_cast<double>(measured_peak) / 1e6,
                          predicted.timeline->ranks.size(),
                          predicted.timeline->ranks.size() == 1 ? "" : "s", sum / 1e6,
                          measured_peak > 0 ? sum / static_cast<double>(measured_peak) : 0.0);
            out << line << "\n";
        }
        if (predicted.ok() && !placed.empty())
            out << gpu_memory_line(placed, *predicted.timeline) << "\n";
        if (const models::ExpertStats& x = last_step->metrics.experts; !x.empty()) {
            // The routers of the last step: the busiest expert against the mean, beside what
            // routing by chance alone would give for the same copies (the imbalance the
            // simulator prices; a router's own skew comes on top of it).
            int64_t total = 0, most = 0;
            for (int64_t l : x.load) {
                total += l;
                most = std::max(most, l);
            }
            const double chance = expert_load_by_chance(p);
            char by_chance[64] = "";
            if (chance > 0)
                std::snprintf(by_chance, sizeof by_chance, " (routing by chance alone: %.2fx)",
                              chance);
            char line[320];
            std::snprintf(
                line, sizeof line,
                "experts: the busiest took %.2fx the mean of the last step's token copies%s; "
                "%lld of %lld copies dropped",
                total > 0 ? static_cast<double>(most) * static_cast<double>(x.load.size()) /
                                static_cast<double>(total)
                          : 0.0,
                by_chance, static_cast<long long>(x.dropped), static_cast<long long>(x.routed));
            out << line << "\n";
        }
        const std::string kind = to_string(graph.schedule);
        const std::string measured_name = "measured: dist run (" + kind + ", last step)";
        const std::string predicted_name =
            "predicted: dist sim (" + kind + ", the " + p.mesh.profile.name + " profile)";
        std::vector<std::pair<std::string, const sim::Timeline*>> both = {
            {measured_name, &measured}};
        if (predicted.ok()) both.push_back({predicted_name, &*predicted.timeline});
        auto write = [&](const std::string& path, const std::string& text, const char* what) {
            std::string we = models::write_file_atomically(path, {text});
            if (!we.empty()) {
                err << "error: " << we << "\n";
                return false;
            }
            out << what << path << "\n";
            return true;
        };
        if (!r.trace.empty()) {
            std::string trace = sim::chrome_trace(both);
            if (session.processes() > 1) trace = with_transfers(trace, *last_step);
            if (!write(r.trace, trace, "trace of the last step, measured and predicted: "))
                return 1;
        }
        if (!r.svg.empty() &&
            !write(r.svg, sim::svg(both), "timelines of the last step, measured and predicted: "))
            return 1;
    }
    if (r.sample_tokens > 0 && session.weights()) {
        GenerateSpec gen = p.generate;
        gen.max_tokens = r.sample_tokens;
        std::vector<int32_t> tokens = {'\n'};
        models::sample(*session.weights(), gen, static_cast<uint64_t>(p.train.seed), tokens);
        std::string text(tokens.begin() + 1, tokens.end());
        for (char& c : text)
            if ((c < 32 && c != '\n' && c != '\t') || c == 127) c = '?';
        out << "sample (" << r.sample_tokens << " tokens, temperature " << gen.temperature
            << ", top-k " << gen.top_k << "):\n"
            << text << "\n";
    }
    return 0;
}

} // namespace dist::cli
