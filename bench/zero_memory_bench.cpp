// zero_memory_bench: what each ZeRO stage and sequence parallelism save on a CPU mesh,
// measured beside the simulator's prediction, and what they cost in step time.
//
// usage: zero_memory_bench [STEPS]
//
// A GPT of 4 blocks, width 256, context 128, on 4 ranks of one process (in-process
// collectives): dp 4 under ZeRO 0, 1, 2 and 3; tp 4 without and with sp; dp 4, dp 2 x cp 2 and
// cp 4 (each sequence over 1, 2 or 4 ranks, the same tokens per rank). The ranks share
// the process's CPU allocator and are symmetric, so a rank's figure is the allocator's total
// over the 4: the state (bytes in use once the ranks are built: weights, gradients, AdamW
// moments) and the high-water mark during the steps (everything: state, activations, buffers),
// each beside `dist sim`'s per-rank figures. The step time is the median over STEPS steps after
// a warm-up, as a ratio to the first row of its group.
#include "actors/plan/lower.hpp"
#include "actors/runtime/job.hpp"
#include "actors/sim/simulate.hpp"
#include "lang/check.hpp"
#include "models/data.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

using namespace dist;

namespace {

const char* script = R"(import "std/gpt.dist"
model = gpt(vocab: 512, context: 128, layers: 4, heads: 4, width: 256)
mesh { devices: cpu  dp: 4 }
schedule { kind: 1f1b  microbatches: 2 }
train { data: synthetic()  batch: 16  steps: 100 }
)";

struct Row {
    std::string name;
    int group = 0;
    double predicted_state = 0, measured_state = 0;
    double predicted_peak = 0, measured_peak = 0;
    double step_s = 0;
};

double mib(double bytes) {
    return bytes / (1024.0 * 1024.0);
}

} // namespace

int main(int argc, char** argv) {
    const int steps = argc > 1 ? std::max(1, std::atoi(argv[1])) : 5;
    struct Config {
        std::string name;
        int group;
        std::vector<std::string> overrides;
    };
    const std::vector<Config> configs = {
        {"dp 4, ZeRO 0", 0, {"mesh.zero=0"}},
        {"dp 4, ZeRO 1", 0, {"mesh.zero=1"}},
        {"dp 4, ZeRO 2", 0, {"mesh.zero=2"}},
        {"dp 4, ZeRO 3", 0, {"mesh.zero=3"}},
        {"tp 4", 1, {"mesh.dp=1", "mesh.tp=4"}},
        {"tp 4, sp", 1, {"mesh.dp=1", "mesh.tp=4", "mesh.sp=true"}},
        {"dp 4", 2, {"mesh.dp=4"}},
        {"dp 2, cp 2", 2, {"mesh.dp=2", "mesh.cp=2"}},
        {"cp 4", 2, {"mesh.dp=1", "mesh.cp=4"}},
    };
    std::vector<Row> rows;
    for (const Config& config : configs) {
        lang::FrontendOptions o;
        o.search_roots = {DIST_SOURCE_DIR "/stdlib"};
        o.overrides = config.overrides;
        lang::CheckResult checked = lang::check_text("bench.dist", script, o);
        if (!checked.ok()) {
            std::fprintf(stderr, "%s", checked.report().c_str());
            return 1;
        }
        const Program& p = *checked.program;
        plan::PlanResult planned = plan::lower(p);
        if (!planned.ok()) {
            std::fprintf(stderr, "%s", plan::render_errors("bench.dist", planned.errors).c_str());
            return 1;
        }
        sim::SimResult sim = sim::simulate(*planned.graph, p);
        if (!sim.ok()) return 1;
        const sim::RankReport& r0 = sim.timeline->ranks.front();
        Row row;
        row.name = config.name;
        row.group = config.group;
        row.predicted_state =
            static_cast<double>(r0.parameters_bytes + r0.gradients_bytes + r0.optimizer_bytes);
        row.predicted_peak = static_cast<double>(r0.peak_memory_bytes);

        models::TokenData data;
        if (std::string e = models::load_data(p.train.data, p.model, data); !e.empty()) {
            std::fprintf(stderr, "%s\n", e.c_str());
            return 1;
        }
        kernels::Allocator& cpu = kernels::Allocator::cpu();
        const double ranks = static_cast<double>(p.mesh.devices);
        const size_t before = cpu.bytes_in_use();
        runtime::Job job(p, *planned.graph, data);
        row.measured_state = static_cast<double>(cpu.bytes_in_use() - before) / ranks;
        cpu.reset_peak();
        std::vector<double> times;
        runtime::JobOptions jo;
        jo.end_step = steps + 1;
        jo.on_step = [&](const runtime::StepReport& s) {
            if (s.metrics.step > 1) times.push_back(s.metrics.step_time_s);
            return true;
        };
        if (std::string e = job.run(jo); !e.empty()) {
            std::fprintf(stderr, "%s: %s\n", config.name.c_str(), e.c_str());
            return 1;
        }
        row.measured_peak = static_cast<double>(cpu.peak_bytes_in_use() - before) / ranks;
        std::sort(times.begin(), times.end());
        row.step_s = times.empty() ? 0.0 : times[times.size() / 2];
        rows.push_back(row);
    }
    std::printf("GPT 4 x 256, context 128, on 4 CPU ranks; per rank, MiB (measured: the CPU "
                "allocator's bytes / 4)\n");
    std::printf("%-14s %10s %10s %10s %10s %12s\n", "mesh", "state sim", "state meas", "peak sim",
                "peak meas", "step ratio");
    double base = 0;
    for (size_t i = 0; i < rows.size(); ++i) {
        const Row& r = rows[i];
        if (i == 0 || r.group != rows[i - 1].group) base = r.step_s;
        std::printf("%-14s %10.2f %10.2f %10.2f %10.2f %12.2f\n", r.name.c_str(),
                    mib(r.predicted_state), mib(r.measured_state), mib(r.predicted_peak),
                    mib(r.measured_peak), base > 0 ? r.step_s / base : 0.0);
    }
    return 0;
}
