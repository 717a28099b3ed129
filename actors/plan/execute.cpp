// execute.cpp: a fixpoint over the ranks. Each pass advances every rank as far as its next
// receive's message or its step's reductions allow; an action's start is the later of its
// rank's clock and what it waits for, so the times are those of the longest path through the
// graph. When a pass advances nothing and a rank is unfinished, the graph is stuck.
#include "actors/plan/execute.hpp"

#include <algorithm>
#include <map>
#include <tuple>

namespace dist::plan {

ExecCosts zero_costs() {
    ExecCosts c;
    c.compute = [](const PlanRank&, const PlanAction&) { return 0.0; };
    c.transfer = [](const PlanRank&, const PlanRank&, const PlanAction&) { return 0.0; };
    c.reduction = [](const PlanRank&, const PlanAction&) { return 0.0; };
    return c;
}

namespace {

// A message: direction (0 forward, 1 backward), receiving stage, microbatch, source, target.
using MessageKey = std::tuple<int, int32_t, int32_t, int32_t, int32_t>;

MessageKey send_key(int32_t from, const PlanAction& a) {
    bool fwd = a.kind == ActionKind::send_forward;
    return {fwd ? 0 : 1, fwd ? a.stage + 1 : a.stage - 1, a.microbatch, from, a.peer};
}

MessageKey recv_key(int32_t to, const PlanAction& a) {
    return {a.kind == ActionKind::recv_forward ? 0 : 1, a.stage, a.microbatch, a.peer, to};
}

} // namespace

ExecTimes execute(const Graph& g, const ExecCosts& costs) {
    const size_t n = g.ranks.size();
    ExecTimes t;
    t.start.resize(n);
    t.end.resize(n);
    t.stopped_at.assign(n, 0);
    t.waits_for.assign(n, {});
    for (size_t r = 0; r < n; ++r) {
        t.start[r].assign(g.ranks[r].actions.size(), 0.0);
        t.end[r].assign(g.ranks[r].actions.size(), 0.0);
    }
    std::vector<double> clock(n, 0.0), comm_free(n, 0.0);
    std::map<MessageKey, double> arrived;
    // Reductions: the k-th one of each data-parallel group, entered by its members.
    auto group_of = [&](const PlanRank& r) { return r.pp * g.tp + r.tp; };
    std::vector<int32_t> entered(n, 0); // reductions entered per rank
    std::map<std::pair<int32_t, int32_t>, std::vector<double>> entries; // (group, k) -> times
    std::map<std::pair<int32_t, int32_t>, double> finished;             // (group, k) -> end
    std::map<std::pair<int32_t, int32_t>, double> begun;                // (group, k) -> start
    auto members = [&](const PlanRank& r) { return g.replica_group(r); };
    const int32_t group_size = g.dp * g.cp;
    // ZeRO 3: the collective number of the gather a compute action waits for, per rank.
    using GatherKey = std::tuple<int32_t, int32_t, bool>; // stage, microbatch, forward
    std::vector<std::map<GatherKey, int32_t>> gathered(n);
    auto settle = [&](int32_t group, int32_t k, const PlanRank& any, const PlanAction& a) {
        auto key = std::make_pair(group, k);
        auto& e = entries[key];
        if (static_cast<int32_t>(e.size()) < group_size || finished.count(key)) return;
        double start = *std::max_element(e.begin(), e.end());
        std::vector<int32_t> ms = members(any);
        for (int32_t m : ms) start = std::max(start, comm_free[static_cast<size_t>(m)]);
        double end = start + costs.reduction(any, a);
        for (int32_t m : ms) comm_free[static_cast<size_t>(m)] = end;
        finished[key] = end;
        begun[key] = start;
    };
    bool progress = true;
    while (progress) {
        progress = false;
        for (size_t r = 0; r < n; ++r) {
            const PlanRank& rank = g.ranks[r];
            size_t& pos = t.stopped_at[r];
            while (pos < rank.actions.size()) {
                const PlanAction& a = rank.actions[pos];
                double start = clock[r], end = start;
                if (is_compute(a.kind)) {
                    // Under ZeRO 3 the stage's weights must have arrived.
                    GatherKey gk{a.stage, a.microbatch, a.kind == ActionKind::forward};
                    auto git = a.kind == ActionKind::backward_weight ? gathered[r].end()
                                                                     : gathered[r].find(gk);
                    double compute = costs.compute(rank, a);
                    if (git != gathered[r].end()) {
                        auto key = std::make_pair(group_of(rank), git->second);
                        auto fin = finished.find(key);
                        if (fin == finished.end()) break;
                        // The gather runs a unit (block) at a time, one ahead of the compute:
                        // the compute starts once the first unit is in and cannot finish
                        // before the last unit has arrived and been computed.
                        double units = std::max(1, g.stages[static_cast<size_t>(a.stage)].units);
                        double began = begun[key], took = fin->second - began;
                        start = std::max(start, began + took / units);
                        end = std::max(start + compute, fin->second + compute / units);
                        gathered[r].erase(git);
                    } else {
                        end = start + compute;
                    }
                } else if (a.kind == ActionKind::send_forward ||
                           a.kind == ActionKind::send_backward) {
                    if (a.peer < 0 || static_cast<size_t>(a.peer) >= n) break;
                    arrived[send_key(rank.rank, a)] =
                        start + costs.transfer(rank, g.ranks[static_cast<size_t>(a.peer)], a);
                } else if (a.kind == ActionKind::recv_forward ||
                           a.kind == ActionKind::recv_backward) {
                    auto it = arrived.find(recv_key(rank.rank, a));
                    if (it == arrived.end()) break;
                    start = end = std::max(start, it->second);
                    arrived.erase(it);
                } else if (is_dp_collective(a.kind)) {
                    int32_t k = entered[r]++;
                    if (a.kind == ActionKind::gather_forward ||
                        a.kind == ActionKind::gather_backward)
                        gathered[r][{a.stage, a.microbatch, a.kind == ActionKind::gather_forward}] =
                            k;
                    entries[{group_of(rank), k}].push_back(start);
                    settle(group_of(rank), k, rank, a);
                } else { // STEP: after this rank's reductions
                    bool ready = true;
                    for (int32_t k = 0; k < entered[r]; ++k) {
                        auto it = finished.find({group_of(rank), k});
                        if (it == finished.end()) {
                            ready = false;
                            break;
                        }
                        start = std::max(start, it->second);
                    }
                    if (!ready) break;
                    end = start + costs.compute(rank, a);
                }
                t.start[r][pos] = start;
                t.end[r][pos] = end;
                clock[r] = end;
                ++pos;
                progress = true;
            }
        }
    }
    t.complete = true;
    for (size_t r = 0; r < n; ++r) {
        const PlanRank& rank = g.ranks[r];
        if (t.stopped_at[r] == rank.actions.size()) continue;
        t.complete = false;
        const PlanAction& a = rank.actions[t.stopped_at[r]];
        if (is_p2p(a.kind)) {
            if (a.peer >= 0 && static_cast<size_t>(a.peer) < n) t.waits_for[r].push_back(a.peer);
        } else if (a.kind == ActionKind::step || is_compute(a.kind)) {
            for (int32_t m : members(rank)) {
                if (static_cast<size_t>(m) == r) continue;
                // A member that has entered fewer reductions than this rank holds it up.
                if (entered[static_cast<size_t>(m)] < entered[r]) t.waits_for[r].push_back(m);
            }
        }
    }
    return t;
}

} // namespace dist::plan
