// run_command.cpp: `dist run`: the checked program planned, then trained by the actor runtime
// on its mesh (every rank a worker actor of this process), with metrics, a progress line,
// consolidated checkpoints, a trace of the real execution and its bubble beside the simulated.
#include "cli/planned.hpp"

#include "actors/plan/lower.hpp"
#include "actors/runtime/job.hpp"
#include "actors/runtime/measured.hpp"
#include "actors/sim/simulate.hpp"
#include "lang/check.hpp"
#include "lang/loader.hpp"
#include "models/atomic_file.hpp"
#include "models/checkpoint.hpp"
#include "models/trainer.hpp"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <ostream>
#include <unistd.h>

namespace fs = std::filesystem;

namespace dist::cli {

namespace {

std::string model_label(const Program& p) {
    return p.model.preset.empty() ? p.model.template_name : p.model.preset;
}

std::string mesh_label(const Program& p, const plan::Graph& g) {
    if (p.mesh.devices == 1) return "one " + p.mesh.profile.name + " device";
    return std::to_string(p.mesh.devices) + " " + p.mesh.profile.name + " ranks (dp " +
           std::to_string(g.dp) + ", tp " + std::to_string(g.tp) + ", pp " + std::to_string(g.pp) +
           ", " + to_string(g.schedule) + ")";
}

// The progress line: step, loss, tokens/s and the time left.
std::string progress_line(const models::StepMetrics& m, int64_t last, double eta) {
    char line[256];
    std::snprintf(line, sizeof line,
                  "step %5lld/%lld  loss %.4f  lr %.2e  norm %.3f  %.0f tok/s  eta %.0fs",
                  static_cast<long long>(m.step), static_cast<long long>(last), m.loss, m.lr,
                  m.grad_norm, m.tokens_per_s, eta);
    return line;
}

} // namespace

int run_train(const CommonOptions& o, const RunOptions& r, std::ostream& out, std::ostream& err) {
    if (!r.resume.empty() && !r.load.empty()) {
        err << "error: --resume continues a run and --load starts one from weights; give one\n";
        return 2;
    }
    std::optional<Planned> plan = planned(o, err);
    if (!plan) return 1;
    const Program& p = plan->program;
    const plan::Graph& graph = plan->graph;
    if (!runs_here(p, err)) return 1;
    models::TokenData data;
    std::string error = models::load_data(p.train.data, p.model, data);
    if (!error.empty()) {
        err << "error: " << error << "\n";
        return 1;
    }
    const uint64_t seed = static_cast<uint64_t>(p.train.seed);
    // The whole model: what checkpoints are read into and consolidated from, made only when a
    // checkpoint or a sample needs it (it doubles the parameters' memory).
    std::optional<models::Model> whole_model;
    auto whole = [&]() -> models::Model& {
        if (!whole_model) whole_model.emplace(p.model, seed, p.schedule.recompute);
        return *whole_model;
    };
    int64_t first = 0;
    if (!r.resume.empty()) error = models::load_training_state(r.resume, whole(), first);
    if (!r.load.empty()) error = models::load_weights(r.load, whole());
    if (!error.empty()) {
        err << "error: " << error << "\n";
        return 1;
    }
    const int64_t last = p.train.stop_after > 0 ? p.train.stop_after : p.train.steps;
    if (first >= last) {
        err << "error: `" << r.resume << "` is at step " << first << "; the script stops at step "
            << last << "\n";
        return 1;
    }
    std::ofstream metrics;
    if (!r.metrics.empty()) {
        metrics.open(r.metrics, first > 0 ? std::ios::app : std::ios::trunc);
        if (!metrics) {
            err << "error: cannot write `" << r.metrics << "`: " << std::strerror(errno) << "\n";
            return 1;
        }
    }
    const std::string save_dir = !r.save.empty() ? r.save : p.train.checkpoint.dir;
    if (!save_dir.empty()) {
        // Find out now, not after hours of training, that the folder cannot be written.
        std::error_code ec;
        fs::create_directories(save_dir, ec);
        if (ec || ::access(save_dir.c_str(), W_OK) != 0) {
            err << "error: cannot save checkpoints into `" << save_dir
                << "`: " << (ec ? ec.message() : std::strerror(errno)) << "\n";
            return 1;
        }
    }

    runtime::Job job(p, graph, data);
    if (!r.resume.empty() || !r.load.empty()) job.scatter(whole());
    bool tty = r.progress && ::isatty(STDERR_FILENO);
    double elapsed = 0.0;
    out << "training " << model_label(p) << " (" << p.model.parameters << " parameters) on "
        << (first > 0 ? "steps " + std::to_string(first + 1) + " to " : "steps 1 to ") << last
        << ", " << p.train.batch << " x " << p.model.context << " tokens each, on "
        << mesh_label(p, graph) << "\n"
        << std::flush;
    std::string step_error;
    runtime::StepReport last_report;
    runtime::JobOptions jo;
    jo.first_step = first;
    jo.end_step = last;
    jo.on_step = [&](const runtime::StepReport& rep) {
        const models::StepMetrics& m = rep.metrics;
        last_report = rep;
        if (!std::isfinite(m.loss)) {
            step_error = "the loss became " + std::to_string(m.loss) + " at step " +
                         std::to_string(m.step) + "; lower train.optimizer.lr or set train.clip";
            return false;
        }
        elapsed += m.step_time_s;
        if (metrics) metrics << models::metrics_json(m) << "\n" << std::flush;
        double eta =
            elapsed / static_cast<double>(m.step - first) * static_cast<double>(last - m.step);
        std::string line = progress_line(m, last, eta);
        if (tty)
            err << "\r" << line << "\x1b[K" << std::flush;
        else if (r.progress && (m.step == first + 1 || m.step % 10 == 0 || m.step == last))
            err << line << "\n";
        bool periodic = p.train.checkpoint.every > 0 && m.step % p.train.checkpoint.every == 0;
        if (!save_dir.empty() && (periodic || m.step == last)) {
            job.gather(whole());
            step_error = models::save_checkpoint(save_dir, whole(), m.step, seed);
            if (!step_error.empty()) return false;
        }
        return true;
    };
    error = job.run(jo);
    if (tty) err << "\n";
    if (error.empty()) error = step_error;
    if (!error.empty()) {
        err << "error: " << error << "\n";
        return 1;
    }
    if (!save_dir.empty()) out << "saved " << save_dir << "\n";
    if (!last_report.timings.empty()) {
        sim::Timeline measured = runtime::measured_timeline(graph, last_report.timings);
        if (graph.pp > 1) {
            sim::SimResult predicted = sim::simulate(graph, p);
            char line[160];
            std::snprintf(line, sizeof line, "pipeline bubble of the last step: measured %.1f%%",
                          100.0 * measured.bubble_fraction);
            out << line;
            if (predicted.ok())
                out << ", simulated "
                    << std::to_string(100.0 * predicted.timeline->bubble_fraction).substr(0, 4)
                    << "% (`dist sim` with the " << p.mesh.profile.name << " profile)";
            out << "\n";
        }
        if (!r.trace.empty()) {
            std::string e = models::write_file_atomically(
                r.trace,
                {sim::chrome_trace(measured, "dist run: " + std::string(to_string(graph.schedule)) +
                                                 " (measured)")});
            if (!e.empty()) {
                err << "error: " << e << "\n";
                return 1;
            }
            out << "trace of the last step: " << r.trace << "\n";
        }
    }
    if (r.sample_tokens > 0) {
        job.gather(whole());
        GenerateSpec gen = p.generate;
        gen.max_tokens = r.sample_tokens;
        std::vector<int32_t> tokens = {'\n'};
        models::sample(whole(), gen, seed, tokens);
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
