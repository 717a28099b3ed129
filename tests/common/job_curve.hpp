// job_curve.hpp: a runtime job's losses and gradient norms, step by step, for the runtime's
// equivalence tests.
#pragma once

#include "actors/runtime/job.hpp"

#include <chrono>
#include <string>
#include <vector>

namespace dist::tests {

struct JobCurve {
    std::vector<double> losses, norms;
    std::string error;           ///< what the job's run returned: empty when it trained to the end
    models::ExpertStats experts; ///< the routers' counts of the last step (models with experts)
};

/// Runs `job` to `end_step`, keeping each step's loss and gradient norm.
inline JobCurve run_job(runtime::Job& job, int64_t end_step, std::chrono::seconds watchdog) {
    JobCurve c;
    runtime::JobOptions o;
    o.end_step = end_step;
    o.watchdog = watchdog;
    o.on_step = [&](const runtime::StepReport& r) {
        c.losses.push_back(r.metrics.loss);
        c.norms.push_back(r.metrics.grad_norm);
        c.experts = r.metrics.experts;
        return true;
    };
    c.error = job.run(o);
    return c;
}

} // namespace dist::tests
