// measured.cpp: building the Timeline of a step that ran.
#include "actors/runtime/measured.hpp"

#include <algorithm>

namespace dist::runtime {

using plan::ActionKind;

std::vector<double> timing_origins(const std::vector<std::vector<ActionTiming>>& timings) {
    std::vector<double> firsts;
    for (const auto& rank : timings) firsts.push_back(rank.empty() ? 0.0 : rank.front().start_s);
    if (firsts.empty()) return firsts;
    double lo = *std::min_element(firsts.begin(), firsts.end());
    double hi = *std::max_element(firsts.begin(), firsts.end());
    // One step lasts less than a minute; clocks further apart are different hosts'.
    if (hi - lo > 60.0) return firsts;
    return std::vector<double>(firsts.size(), lo);
}

namespace {

// The ranks' spans, idle time and bubble, without the graph (which the caller copies in when
// it keeps the timeline).
sim::Timeline measured_ranks(const plan::Graph& graph,
                             const std::vector<std::vector<ActionTiming>>& timings) {
    const std::vector<double> origin = timing_origins(timings);
    sim::Timeline t;
    t.cost = sim::CostModel::profile;
    for (size_t r = 0; r < timings.size() && r < graph.ranks.size(); ++r) {
        sim::RankReport rep;
        rep.rank = static_cast<int32_t>(r);
        const auto& actions = graph.ranks[r].actions;
        bool first = true;
        for (ActionTiming a : timings[r]) {
            a.start_s -= origin[r];
            a.end_s -= origin[r];
            if (a.action >= actions.size()) continue;
            if (a.collective) { // the communication thread's, apart from the rank's own
                rep.collectives.push_back({a.action, a.start_s, a.end_s});
                continue;
            }
            // Compute actions and the optimizer step: the spans the simulator reports.
            ActionKind kind = actions[a.action].kind;
            if (plan::is_exchange(kind)) rep.exchanges.push_back({a.action, a.start_s, a.end_s});
            if (!plan::is_compute(kind) && kind != ActionKind::step) continue;
            rep.spans.push_back({a.action, a.start_s, a.end_s, 0.0, a.cpu_s});
            rep.busy += a.end_s - a.start_s;
            if (first) rep.first_start = a.start_s;
            first = false;
            rep.last_end = a.end_s;
        }
        for (const ActionTiming& a : timings[r])
            if (!a.collective) t.makespan = std::max(t.makespan, a.end_s - origin[r]);
        t.ranks.push_back(std::move(rep));
    }
    double idle = 0;
    for (auto& r : t.ranks) {
        r.idle = t.makespan - r.busy;
        idle += r.idle;
    }
    if (t.makespan > 0 && !t.ranks.empty())
        t.bubble_fraction = idle / (static_cast<double>(t.ranks.size()) * t.makespan);
    t.step_time_s = t.makespan;
    return t;
}

} // namespace

sim::Timeline measured_timeline(const plan::Graph& graph,
                                const std::vector<std::vector<ActionTiming>>& timings) {
    sim::Timeline t = measured_ranks(graph, timings);
    t.graph = graph;
    return t;
}

double measured_bubble(const plan::Graph& graph,
                       const std::vector<std::vector<ActionTiming>>& timings) {
    return measured_ranks(graph, timings).bubble_fraction;
}

void StepTally::add(double step_time_s, double bubble) {
    steps_.push_back(step_time_s);
    bubbles_.push_back(bubble);
}

std::pair<double, double> StepTally::middle_half_s() const {
    if (steps_.size() < kMiddleHalfSteps + 1) return {0.0, 0.0};
    std::vector<double> v(steps_.begin() + 1, steps_.end());
    std::sort(v.begin(), v.end());
    auto at = [&](double q) {
        const double x = q * static_cast<double>(v.size() - 1);
        const size_t i = static_cast<size_t>(x);
        return i + 1 < v.size() ? v[i] + (x - static_cast<double>(i)) * (v[i + 1] - v[i]) : v[i];
    };
    return {at(0.25), at(0.75)};
}

double StepTally::median_of(std::vector<double> v) {
    // After the first step (which warms up), when there are others.
    if (v.size() > 1) v.erase(v.begin());
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

} // namespace dist::runtime
