// repl_run.cpp: `run N`: N real training steps of the current program on this machine (the
// actor runtime, one worker per rank, as `dist run`), the loss of each, then the last step's
// measured time and bubble beside the simulator's prediction for the same plan.
#include "cli/repl.hpp"
#include "cli/repl_format.hpp"

#include "actors/runtime/job.hpp"
#include "actors/runtime/measured.hpp"
#include "models/trainer.hpp"

#include <cmath>
#include <cstdio>
#include <optional>
#include <ostream>
#include <unistd.h>

namespace dist::cli {

namespace {

// Weights, gradients and AdamW's state of the whole model, as the runtime holds them in fp32.
constexpr double train_bytes_per_parameter = 16.0;
constexpr int32_t max_run_ranks = 64;

double physical_memory_bytes() {
    long pages = ::sysconf(_SC_PHYS_PAGES), size = ::sysconf(_SC_PAGE_SIZE);
    return pages > 0 && size > 0 ? static_cast<double>(pages) * static_cast<double>(size) : 0.0;
}

} // namespace

void ReplSession::cmd_run(const std::string& args) {
    char* end = nullptr;
    long steps = std::strtol(args.c_str(), &end, 10);
    if (args.empty() || *end != '\0' || steps < 1 || steps > 100000) {
        error("`run` takes a number of steps", "for example `run 5`");
        return;
    }
    const sim::Timeline* timeline = current_timeline();
    if (!timeline) return;
    // Copies: the job keeps references to them while it runs.
    const Program p = *program_;
    const plan::Graph graph = timeline->graph;
    const sim::Timeline predicted = *timeline;
    double need = train_bytes_per_parameter * static_cast<double>(p.model.parameters);
    double have = physical_memory_bytes();
    if (graph.ranks.size() > static_cast<size_t>(max_run_ranks) || (have > 0 && need > have / 2)) {
        error("`run` trains on this machine's CPU cores, and this plan is too big for them (" +
                  std::to_string(graph.ranks.size()) + " ranks, " +
                  bytes_text(static_cast<int64_t>(need)) + " of weights and optimizer state)",
              "at most " + std::to_string(max_run_ranks) +
                  " ranks and half of this machine's memory; make the model smaller "
                  "(`set model.layers 2`) or the mesh (`set mesh.dp 1`)");
        return;
    }
    models::TokenData data;
    if (std::string e = models::load_data(p.train.data, p.model, data); !e.empty()) {
        error(e);
        return;
    }
    std::optional<runtime::Job> job_storage;
    try {
        job_storage.emplace(p, graph, data);
    } catch (const std::runtime_error& e) {
        error(e.what(), "`set mesh.devices cpu`");
        return;
    }
    runtime::Job& job = *job_storage;
    out_ << "training " << steps << (steps == 1 ? " step" : " steps") << " on " << mesh_line(p)
         << "\n"
         << std::flush;
    runtime::JobOptions jo;
    jo.first_step = 0;
    jo.end_step = steps;
    runtime::StepReport last;
    std::string failure;
    jo.on_step = [&](const runtime::StepReport& rep) {
        const models::StepMetrics& m = rep.metrics;
        last = rep;
        char line[160];
        std::snprintf(line, sizeof line, "step %lld  loss %.4f  %.1f ms  %.0f tokens/s\n",
                      static_cast<long long>(m.step), m.loss, 1e3 * m.step_time_s, m.tokens_per_s);
        out_ << line << std::flush;
        if (!std::isfinite(m.loss)) {
            failure = "the loss became " + std::to_string(m.loss) + " at step " +
                      std::to_string(m.step) + "; lower train.optimizer.lr or set train.clip";
            return false;
        }
        return true;
    };
    std::string e = job.run(jo);
    if (e.empty()) e = failure;
    if (!e.empty()) {
        error(e);
        return;
    }
    if (last.timings.empty()) return;
    sim::Timeline measured = runtime::measured_timeline(graph, last.timings);
    char line[256];
    std::snprintf(line, sizeof line,
                  "last step: measured %.3f ms, simulated %.3f ms (the %s profile); bubble "
                  "measured %s, simulated %s\n",
                  1e3 * last.metrics.step_time_s, 1e3 * predicted.step_time_s,
                  p.mesh.profile.name.c_str(), percent_text(measured.bubble_fraction).c_str(),
                  percent_text(predicted.bubble_fraction).c_str());
    out_ << line;
}

} // namespace dist::cli
