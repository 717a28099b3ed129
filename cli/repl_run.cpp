// repl_run.cpp: `run N`: N real training steps of the current program on this machine (the
// training session, one worker per rank, as `dist run`), the loss of each, then the measured
// step time and bubble (medians after the first step) beside the simulator's prediction for the
// same plan; `explain` compares the last step's timeline.
#include "cli/pace.hpp"
#include "cli/repl.hpp"
#include "cli/repl_format.hpp"

#include "actors/runtime/job.hpp"
#include "actors/runtime/measured.hpp"
#include "actors/runtime/session.hpp"
#include "actors/runtime/steal.hpp"
#include "actors/sim/simulate.hpp"
#include "kernels/devices.hpp"
#include "models/trainer.hpp"

#include <algorithm>
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
    sim::Timeline predicted = *timeline;
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
    out_ << "training " << steps << (steps == 1 ? " step" : " steps")
         << (p.train.precision == Precision::bf16 ? " in bf16" : "") << " on " << mesh_line(p)
         << "\n"
         << std::flush;
    // One process, whatever the environment says: the REPL explores on this machine.
    Program run_program = p;
    // Steps 1..steps of the script's run (its learning-rate schedule), or more than it has.
    run_program.train.stop_after = steps;
    run_program.train.steps = std::max<int64_t>(steps, p.train.steps);
    run_program.train.checkpoint.dir.clear();
    runtime::SessionOptions so;
    so.join_launch = false;
    runtime::StepTally tally;
    so.on_step = [&](const runtime::SessionStep& s) {
        const models::StepMetrics& m = s.metrics;
        tally.add(m.step_time_s, s.bubble);
        char line[160];
        std::snprintf(line, sizeof line, "step %lld  loss %.4f  %.1f ms  %.0f tokens/s",
                      static_cast<long long>(m.step), m.loss, 1e3 * m.step_time_s, m.tokens_per_s);
        if (s.eval_loss)
            out_ << line << "  eval " << std::to_string(*s.eval_loss).substr(0, 6);
        else
            out_ << line;
        out_ << (s.nonfinite.empty() ? "" : "  (skipped: non-finite " + s.nonfinite + ")") << "\n"
             << std::flush;
        return true;
    };
    runtime::Session session(run_program, graph, so);
    runtime::SessionError e = session.open();
    // On a calibrated CPU, the profile's matmul timed around the run (pace.hpp).
    PaceCheck pace(p.mesh.profile);
    if (e.message.empty()) pace.before();
    const runtime::CpuTicks ticks_before = runtime::read_cpu_ticks();
    const runtime::OtherLoad others;
    if (e.message.empty()) e = session.run();
    const double stolen = runtime::stolen_share(ticks_before, runtime::read_cpu_ticks());
    const double others_used = others.share();
    const std::string pace_line = e.message.empty() ? pace.after() : "";
    if (e.located) {
        out_.flush();
        err_ << e.message << std::flush; // rendered as the checker renders its errors
        return;
    }
    if (!e.message.empty()) {
        if (!p.mesh.profile.cpu())
            error(e.message, "`set mesh.devices cpu`");
        else
            error(e.message);
        return;
    }
    const runtime::SessionStep* done = session.last();
    if (!done) return;
    const runtime::SessionStep& last = *done;
    if (last.timings.empty()) return;
    sim::Timeline measured = runtime::measured_timeline(graph, last.timings);
    // Ranks that outnumber this machine's GPUs took turns on them: a GPU's calibration predicts
    // them so (as `dist run` does).
    if (p.mesh.profile.calibration.gpu() && kernels::gpu_count() > 0) {
        sim::SimOptions so_shared;
        so_shared.shared_gpus = runtime::gpus_in_use(runtime::place_in_one_process(p, graph));
        sim::SimResult shared = sim::simulate(graph, p, so_shared);
        if (shared.ok()) predicted = std::move(*shared.timeline);
    }
    // The medians of the steps after the first (which warms up).
    out_ << sim::comparison_line(tally.median_step_s(), tally.median_bubble(), predicted,
                                 p.mesh.profile.name, tally.middle_half_s())
         << "\n";
    if (std::string hint = sim::calibration_hint(p.mesh.profile); !hint.empty())
        out_ << hint << "\n";
    if (std::string note = runtime::stolen_note(stolen); !note.empty()) out_ << note << "\n";
    if (std::string note = runtime::others_note(others_used); !note.empty()) out_ << note << "\n";
    if (!pace_line.empty()) out_ << pace_line << "\n";
    out_ << "(`explain` says where they differ)\n";
    last_measured_ = std::move(measured);
}

} // namespace dist::cli
