// compare.cpp: a measured step beside its prediction: the summary line after a run, and where
// the two disagree (by action kind over all ranks, and the worst rank and kind).
#include "actors/sim/simulate.hpp"

#include <cmath>
#include <cstdio>
#include <map>
#include <set>

namespace dist::sim {

namespace {

std::string ms(double s) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f ms", s * 1e3);
    return buf;
}

std::string relative(double measured, double predicted) {
    if (!(measured > 0)) return "";
    char buf[32];
    std::snprintf(buf, sizeof buf, " (%+.0f%%)", 100.0 * (predicted - measured) / measured);
    return buf;
}

// A mixture of experts' all-to-alls, a row of their own: their spans lie inside the F, B and I
// that run them, and hold the wait for the group's last member as well as the transfer.
const char* const all_to_all_row = "all-to-all (in F, B, I)";

// Seconds of each kind of compute action on each rank, of the all-to-alls inside them, and of
// each kind of collective on the rank's communication thread (a row "KIND (comm)": measured, a
// collective's span holds the wait for the other members to come to it as well).
std::vector<std::map<std::string, double>> busy_by_kind(const Timeline& t) {
    std::vector<std::map<std::string, double>> out(t.ranks.size());
    for (size_t i = 0; i < t.ranks.size(); ++i) {
        const RankReport& r = t.ranks[i];
        const plan::PlanRank& rank = t.graph.ranks[static_cast<size_t>(r.rank)];
        for (const Span& s : r.spans)
            out[i][plan::op_name(rank.actions[s.action].kind)] += s.end - s.start;
        for (const Span& s : r.exchanges) out[i][all_to_all_row] += s.end - s.start;
        for (const Span& s : r.collectives)
            out[i][std::string(plan::op_name(rank.actions[s.action].kind)) + " (comm)"] +=
                s.end - s.start;
    }
    return out;
}

// Of each kind of compute action's seconds summed over the ranks, those its threads ran on a
// core; a kind with a span whose time on a core is not known is left out.
std::map<std::string, double> on_core_by_kind(const Timeline& t) {
    std::map<std::string, double> out;
    std::set<std::string> unknown;
    for (const RankReport& r : t.ranks) {
        const plan::PlanRank& rank = t.graph.ranks[static_cast<size_t>(r.rank)];
        for (const Span& s : r.spans) {
            const std::string kind = plan::op_name(rank.actions[s.action].kind);
            if (s.on_core < 0)
                unknown.insert(kind);
            else
                out[kind] += s.on_core;
        }
    }
    for (const std::string& kind : unknown) out.erase(kind);
    return out;
}

} // namespace

std::string comparison_line(double measured_step_s, double measured_bubble,
                            const Timeline& predicted, const std::string& profile,
                            std::pair<double, double> middle_half_s) {
    std::string spread;
    if (middle_half_s.first > 0 && middle_half_s.second >= middle_half_s.first) {
        char range[96];
        std::snprintf(range, sizeof range, " (the middle half of the steps %.1f-%.1f ms)",
                      1e3 * middle_half_s.first, 1e3 * middle_half_s.second);
        spread = range;
    }
    char buf[400];
    std::snprintf(buf, sizeof buf,
                  "step time: measured %s%s, predicted %s (%.2fx); bubble: measured %.1f%%, "
                  "predicted %.1f%% (`dist sim` with the %s profile)",
                  ms(measured_step_s).c_str(), spread.c_str(), ms(predicted.step_time_s).c_str(),
                  measured_step_s > 0 ? predicted.step_time_s / measured_step_s : 0.0,
                  100.0 * measured_bubble, 100.0 * predicted.bubble_fraction, profile.c_str());
    return buf;
}

std::string calibration_hint(const HardwareProfile& profile) {
    if (profile.calibration.cores > 0) return "";
    if (profile.name == "cpu")
        return "(the cpu profile is a datasheet guess, not this machine: `dist calibrate --device "
               "cpu --out DIR/hardware/here.toml` measures it, and `--set mesh.devices=here` with "
               "DIR on DIST_PATH predicts with it; docs/simulator.md)";
    return "(the " + profile.name + " profile prices the published kernels its efficiencies " +
           "cite (cuBLAS, FlashAttention-2), not Dist's own: `dist calibrate --device cuda " +
           "--out DIR/hardware/gpu.toml` measures them on this GPU, and `--set " +
           "mesh.devices=gpu` with DIR on DIST_PATH predicts with it; docs/simulator.md)";
}

std::string disagreement_text(const Timeline& measured, const Timeline& predicted) {
    auto m = busy_by_kind(measured), p = busy_by_kind(predicted);
    std::map<std::string, std::pair<double, double>> total; // kind -> (measured, predicted)
    for (size_t r = 0; r < m.size(); ++r)
        for (const auto& [k, s] : m[r]) total[k].first += s;
    for (size_t r = 0; r < p.size(); ++r)
        for (const auto& [k, s] : p[r]) total[k].second += s;
    std::string out = "measured against predicted, summed over the ranks:\n";
    char buf[256];
    // Under each kind, where both know it: of its time, that on a core (the rest its threads
    // waited inside it, for a core or for their tensor-parallel group).
    const std::map<std::string, double> mc = on_core_by_kind(measured),
                                        pc = on_core_by_kind(predicted);
    for (const auto& [kind, mp] : total) {
        std::snprintf(buf, sizeof buf, "  %-23s measured %10s, predicted %10s%s\n", kind.c_str(),
                      ms(mp.first).c_str(), ms(mp.second).c_str(),
                      relative(mp.first, mp.second).c_str());
        out += buf;
        auto mi = mc.find(kind), pi = pc.find(kind);
        if (mi == mc.end() || pi == pc.end()) continue;
        std::snprintf(buf, sizeof buf, "    %-21s measured %10s, predicted %10s%s\n",
                      "of it on a core", ms(mi->second).c_str(), ms(pi->second).c_str(),
                      relative(mi->second, pi->second).c_str());
        out += buf;
    }
    double mi = 0, pi = 0;
    for (const RankReport& r : measured.ranks) mi += r.idle;
    for (const RankReport& r : predicted.ranks) pi += r.idle;
    std::snprintf(buf, sizeof buf, "  %-23s measured %10s, predicted %10s%s\n", "idle",
                  ms(mi).c_str(), ms(pi).c_str(), relative(mi, pi).c_str());
    out += buf;
    // The rank and kind with the largest absolute gap.
    double worst = -1;
    size_t worst_rank = 0;
    std::string worst_kind;
    for (size_t r = 0; r < m.size() && r < p.size(); ++r) {
        std::map<std::string, bool> kinds;
        for (const auto& [k, s] : m[r]) kinds[k] = true;
        for (const auto& [k, s] : p[r]) kinds[k] = true;
        for (const auto& [k, unused] : kinds) {
            double gap = std::abs(m[r][k] - p[r][k]);
            if (gap > worst) {
                worst = gap;
                worst_rank = r;
                worst_kind = k;
            }
        }
    }
    if (worst > 0) {
        const plan::PlanRank& rank = predicted.graph.ranks[worst_rank];
        std::snprintf(buf, sizeof buf,
                      "the largest gap: %s on rank %zu (dp %d, pp %d, tp %d): measured %s, "
                      "predicted %s%s\n",
                      worst_kind.c_str(), worst_rank, rank.dp, rank.pp, rank.tp,
                      ms(m[worst_rank][worst_kind]).c_str(), ms(p[worst_rank][worst_kind]).c_str(),
                      relative(m[worst_rank][worst_kind], p[worst_rank][worst_kind]).c_str());
        out += buf;
    }
    return out;
}

} // namespace dist::sim
