// simulate.cpp: the cost model and the memory account of one simulated step.
//
// Timing is the plan's abstract execution (actors/plan/execute.hpp) with real durations.
// Memory per rank: weights, gradients and AdamW state of its stages (16 bytes per parameter,
// as the checker's memory floor assumes), the activations alive at the worst moment (saved by
// an F, freed by its B, or its W when backward is split), and the communication buffers.
#include "actors/sim/simulate.hpp"

#include "actors/plan/execute.hpp"
#include "actors/plan/verify.hpp"
#include "actors/sim/calibrated.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>

namespace dist::sim {

using plan::ActionKind;
using plan::Graph;
using plan::PlanAction;
using plan::PlanRank;
using plan::PlanStage;

namespace {

struct Profile {
    double flops = 1e12, mem_bw = 1e11, efficiency = 0.5;
    LinkSpec intra{1e10, 1e-6}, inter{1e9, 1e-5};
};

Profile profile_of(const Graph& g, const Program& p, const SimOptions& o) {
    Profile pr;
    const HardwareProfile& h = p.mesh.profile;
    double peak = g.bytes_per_element == 2 ? h.peak_flops_bf16 : h.peak_flops_f32;
    if (peak > 0) pr.flops = peak;
    if (h.memory_bandwidth > 0) pr.mem_bw = h.memory_bandwidth;
    if (h.intra_host.bandwidth > 0) pr.intra = h.intra_host;
    if (h.inter_host.bandwidth > 0) pr.inter = h.inter_host;
    pr.efficiency = h.matmul_efficiency > 0 ? h.matmul_efficiency : o.efficiency;
    const auto& curve = h.matmul_efficiency_by_width;
    if (!curve.empty()) {
        // Linear in log(width) between the profile's points, constant beyond them.
        const double w = static_cast<double>(p.model.width);
        pr.efficiency = w <= curve.front().first ? curve.front().second : curve.back().second;
        for (size_t i = 1; i < curve.size(); ++i)
            if (w > curve[i - 1].first && w <= curve[i].first) {
                double t = std::log(w / curve[i - 1].first) /
                           std::log(curve[i].first / curve[i - 1].first);
                pr.efficiency = (1 - t) * curve[i - 1].second + t * curve[i].second;
            }
    }
    return pr;
}

/// Ring all-reduce: 2 (n-1) steps, each moving bytes / n over the slowest link.
double ring_allreduce(double bytes, int32_t n, const LinkSpec& link) {
    if (n <= 1) return 0.0;
    double steps = 2.0 * (n - 1);
    return steps * (link.latency + bytes / n / link.bandwidth);
}

/// Ring all-gather or reduce-scatter of `bytes` in all: n - 1 steps of bytes / n each.
double ring_half(double bytes, int32_t n, const LinkSpec& link) {
    if (n <= 1) return 0.0;
    return (n - 1) * (link.latency + bytes / n / link.bandwidth);
}

plan::ExecCosts unit_costs() {
    plan::ExecCosts c = plan::zero_costs();
    c.compute = [](const PlanRank&, const PlanAction& a) {
        switch (a.kind) {
        case ActionKind::forward: return 1.0;
        case ActionKind::backward: return 2.0;
        case ActionKind::backward_input:
        case ActionKind::backward_weight: return 1.0;
        default: return 0.0;
        }
    };
    return c;
}

plan::ExecCosts profile_costs(const Graph& g, const Profile& pr) {
    plan::ExecCosts c;
    c.step_barrier = true; // the gradient norm before the update
    auto stage = [&g](const PlanAction& a) -> const PlanStage& {
        return g.stages[static_cast<size_t>(a.stage)];
    };
    // A group of consecutive ranks, from `first` to `last`, talks over the host's links when
    // both ends share a host. The tensor- and context-parallel groups are such runs (the
    // fastest axes of the layout), and share a host when they can.
    auto span_link = [&g, &pr](int32_t first, int32_t last) {
        return g.ranks[static_cast<size_t>(first)].host == g.ranks[static_cast<size_t>(last)].host
                   ? pr.intra
                   : pr.inter;
    };
    auto tp_link = [&g, span_link](const PlanRank& r) {
        return span_link(g.rank_of(r.dp, r.pp, 0, r.cp), g.rank_of(r.dp, r.pp, g.tp - 1, r.cp));
    };
    auto cp_link = [&g, span_link](const PlanRank& r) {
        return span_link(g.rank_of(r.dp, r.pp, r.tp, 0), g.rank_of(r.dp, r.pp, r.tp, g.cp - 1));
    };
    // The link of the replica group (dp x cp): the host's when every member shares it.
    auto replica_link = [&g, &pr](const PlanRank& r) {
        for (int32_t m : g.replica_group(r))
            if (g.ranks[static_cast<size_t>(m)].host != r.host) return pr.inter;
        return pr.intra;
    };
    const int32_t replicas = g.dp * g.cp;
    c.compute = [&g, pr, stage, tp_link, cp_link, replica_link, replicas](const PlanRank& r,
                                                                          const PlanAction& a) {
        double rate = pr.flops * pr.efficiency;
        if (a.kind == ActionKind::step) {
            // AdamW reads and writes its 16 bytes of state per parameter about twice; under ZeRO
            // each replica rank updates its 1/N share, and below stage 3 all-gathers the new
            // weights (Megatron-LM's distributed optimizer).
            double params = 0;
            for (const PlanStage& s : g.stages)
                if (s.pp == r.pp) params += static_cast<double>(s.parameters);
            double share = g.zero >= 1 ? 1.0 / replicas : 1.0;
            double step = 2.0 * 16.0 * params * share / pr.mem_bw;
            if (g.zero == 1 || g.zero == 2)
                step += ring_half(params * g.bytes_per_element, replicas, replica_link(r));
            bool first = r.pp == g.stages.front().pp, last = r.pp == g.stages.back().pp;
            if (g.tied_bytes > 0 && (first || last)) {
                // The tied embedding's two copies are summed between the two ranks.
                const PlanRank& a =
                    g.ranks[static_cast<size_t>(g.rank_of(r.dp, g.stages.front().pp, r.tp, r.cp))];
                const PlanRank& b =
                    g.ranks[static_cast<size_t>(g.rank_of(r.dp, g.stages.back().pp, r.tp, r.cp))];
                step += ring_allreduce(static_cast<double>(g.tied_bytes), 2,
                                       a.host == b.host ? pr.intra : pr.inter);
            }
            return step;
        }
        const PlanStage& s = stage(a);
        double tp = s.tp_reductions *
                    ring_allreduce(static_cast<double>(s.tp_reduction_bytes), g.tp, tp_link(r));
        // Context parallelism: the ring's transfers run behind the attention's blocks; only
        // what exceeds the attention's time shows. The backward passes twice the bytes
        // (key/value blocks and their gradients) behind twice the FLOPs.
        double ring = 0;
        if (g.cp > 1 && s.cp_ring_bytes > 0) {
            LinkSpec l = cp_link(r);
            double send =
                (g.cp - 1) * l.latency + static_cast<double>(s.cp_ring_bytes) / l.bandwidth;
            ring = std::max(0.0, send - s.attention_flops / rate);
        }
        switch (a.kind) {
        case ActionKind::forward:
            return s.flops_forward / rate + s.bytes_elementwise / pr.mem_bw + tp + ring;
        case ActionKind::backward_input:
            return s.flops_input_grad / rate + 2 * s.bytes_elementwise / pr.mem_bw + tp + 2 * ring;
        case ActionKind::backward_weight: return s.flops_weight_grad / rate;
        case ActionKind::backward:
            return (s.flops_input_grad + s.flops_weight_grad) / rate +
                   2 * s.bytes_elementwise / pr.mem_bw + tp + 2 * ring;
        default: return 0.0;
        }
    };
    c.transfer = [&g, pr, stage](const PlanRank& from, const PlanRank& to, const PlanAction& a) {
        const LinkSpec& l = from.host == to.host ? pr.intra : pr.inter;
        return l.latency + static_cast<double>(stage(a).boundary_bytes) / l.bandwidth;
    };
    c.reduction = [&g, stage, replica_link, replicas](const PlanRank& r, const PlanAction& a) {
        const PlanStage& s = stage(a);
        LinkSpec link = replica_link(r);
        switch (a.kind) {
        case ActionKind::gather_forward:
        case ActionKind::gather_backward:
            return ring_half(static_cast<double>(s.parameters) * g.bytes_per_element, replicas,
                             link);
        case ActionKind::reduce_scatter:
            return ring_half(static_cast<double>(s.buckets[static_cast<size_t>(a.microbatch)]),
                             replicas, link);
        default:
            return ring_allreduce(static_cast<double>(s.buckets[static_cast<size_t>(a.microbatch)]),
                                  replicas, link);
        }
    };
    return c;
}

// A calibrated CPU (actors/sim/calibrated.hpp): kernels priced by shape at the rates measured
// for the threads each rank gets, ranks of a host sharing its cores, transfers and collectives
// at their measured times (in-process within a host; UCX over TCP and Gloo between hosts).
plan::ExecCosts calibrated_costs(const Graph& g, const Program& p, const Profile& pr) {
    plan::ExecCosts c = profile_costs(g, pr);
    const Calibration& cal = p.mesh.profile.calibration;
    auto rates = std::make_shared<Rates>(cal);
    const double threads = rank_threads(g, cal.cores);
    auto seconds = std::make_shared<std::vector<StageSeconds>>();
    for (const PlanStage& s : g.stages) seconds->push_back(stage_seconds(p, s, *rates, threads));
    auto same_host = [&g](const std::vector<int32_t>& members) {
        for (int32_t m : members)
            if (g.ranks[static_cast<size_t>(m)].host !=
                g.ranks[static_cast<size_t>(members[0])].host)
                return false;
        return true;
    };
    // A collective's measured time, else the link model's.
    auto collective = [rates, same_host](const std::vector<int32_t>& members, const char* op,
                                         double bytes, double modelled) {
        double t = rates->collective(same_host(members) ? "inprocess" : "gloo", op,
                                     static_cast<int32_t>(members.size()), bytes);
        return t >= 0 ? t : modelled;
    };
    plan::ExecCosts fallback = c;
    const double mem_bw = pr.mem_bw;
    c.compute = [&g, fallback, seconds, rates, threads, collective, mem_bw](const PlanRank& r,
                                                                            const PlanAction& a) {
        if (a.kind == ActionKind::step) {
            // The optimizer's kernels on the rank's share of its parameters, with the
            // communication the link model prices.
            double params = 0;
            for (const PlanStage& s : g.stages)
                if (s.pp == r.pp) params += static_cast<double>(s.parameters);
            double share = g.zero >= 1 ? 1.0 / (g.dp * g.cp) : 1.0;
            double modelled = fallback.compute(r, a);
            return step_seconds(params * share, *rates, threads) +
                   std::max(0.0, modelled - 2.0 * 16.0 * params * share / mem_bw);
        }
        const PlanStage& s = g.stages[static_cast<size_t>(a.stage)];
        const StageSeconds& t = (*seconds)[static_cast<size_t>(a.stage)];
        std::vector<int32_t> tp_group;
        for (int32_t k = 0; k < g.tp; ++k) tp_group.push_back(g.rank_of(r.dp, r.pp, k, r.cp));
        double tp = s.tp_reductions * collective(tp_group, "all_reduce",
                                                 static_cast<double>(s.tp_reduction_bytes), -1.0);
        if (tp < 0) tp = 0;
        switch (a.kind) {
        case ActionKind::forward: return t.forward + tp;
        case ActionKind::backward_input: return t.input + tp;
        case ActionKind::backward_weight: return t.weight;
        case ActionKind::backward: return t.input + t.weight + tp;
        default: return 0.0;
        }
    };
    c.transfer = [&g, rates, fallback](const PlanRank& from, const PlanRank& to,
                                       const PlanAction& a) {
        double bytes = static_cast<double>(g.stages[static_cast<size_t>(a.stage)].boundary_bytes);
        double t = rates->transfer(from.host == to.host ? "inprocess" : "ucx-tcp", bytes);
        return t >= 0 ? t : fallback.transfer(from, to, a);
    };
    c.reduction = [&g, fallback, collective](const PlanRank& r, const PlanAction& a) {
        const PlanStage& s = g.stages[static_cast<size_t>(a.stage)];
        const char* op =
            a.kind == ActionKind::reduce_scatter ? "reduce_scatter"
            : a.kind == ActionKind::gather_forward || a.kind == ActionKind::gather_backward
                ? "all_gather"
                : "all_reduce";
        double bytes = a.kind == ActionKind::gather_forward || a.kind == ActionKind::gather_backward
                           ? static_cast<double>(s.parameters) * g.bytes_per_element
                           : static_cast<double>(s.buckets[static_cast<size_t>(a.microbatch)]);
        return collective(g.replica_group(r), op, bytes, fallback.reduction(r, a));
    };
    c.step_barrier = true;
    c.threads = [threads](const PlanRank&) { return threads; };
    c.speed = [rates](double busy) { return rates->sharing(busy); };
    return c;
}

void account_memory(const Graph& g, const PlanRank& r, RankReport& rep) {
    const int64_t bpe = g.bytes_per_element;
    int64_t params = 0, boundary = 0, bucket = 0, tp_buf = 0;
    for (const PlanStage& s : g.stages) {
        if (s.pp != r.pp) continue;
        params += s.parameters;
        boundary = std::max(boundary, s.boundary_bytes);
        for (int64_t b : s.buckets) bucket = std::max(bucket, b);
        tp_buf = std::max(tp_buf, s.tp_reduction_bytes);
    }
    // ZeRO's (2 + 2 + K) psi / N_d (Rajbhandari et al. 2020, figure 1): stage 1 divides the
    // optimizer's K bytes per parameter over the N_d replica ranks, 2 also the gradients, 3
    // also the weights, which then are whole only for the units being gathered: the one
    // computing and the one prefetched.
    const int64_t nd = static_cast<int64_t>(g.dp) * g.cp;
    int64_t unit = 0;
    for (const PlanStage& s : g.stages)
        if (s.pp == r.pp) unit = std::max(unit, s.largest_unit_parameters);
    const int32_t zero = nd > 1 ? g.zero : 0; // alone, a rank has nothing to shard over
    rep.parameters_bytes =
        zero >= 3 ? params * bpe / nd + std::min(params, 2 * unit) * bpe : params * bpe;
    rep.gradients_bytes = zero >= 2 ? params * bpe / nd : params * bpe;
    rep.optimizer_bytes = params * (16 - 2 * bpe) / (zero >= 1 ? nd : 1);
    bool p2p = false;
    for (const PlanAction& a : r.actions) p2p = p2p || plan::is_p2p(a.kind);
    // A send and a receive buffer each way, the largest bucket, one tensor-parallel buffer.
    rep.communication_bytes = (p2p ? 4 * boundary : 0) + bucket + tp_buf;
    // Activations: walk the compute spans in time order.
    std::map<std::pair<int32_t, int32_t>, int64_t> live;
    int64_t now = 0, peak = 0;
    size_t peak_count = 0;
    for (const Span& sp : rep.spans) {
        const PlanAction& a = r.actions[sp.action];
        if (a.kind == ActionKind::step) continue;
        auto key = std::make_pair(a.stage, a.microbatch);
        int64_t bytes = g.stages[static_cast<size_t>(a.stage)].activation_bytes;
        if (a.kind == ActionKind::forward) {
            live[key] = bytes;
            now += bytes;
            peak = std::max(peak, now);
            peak_count = std::max(peak_count, live.size());
        } else if (a.kind == ActionKind::backward || a.kind == ActionKind::backward_weight) {
            now -= live[key];
            live.erase(key);
        }
    }
    rep.peak_inflight_microbatches = static_cast<int32_t>(peak_count);
    rep.activations_bytes = peak;
    rep.peak_memory_bytes = rep.parameters_bytes + rep.gradients_bytes + rep.optimizer_bytes +
                            rep.activations_bytes + rep.communication_bytes;
}

} // namespace

SimResult simulate(const Graph& g, const Program& p, const SimOptions& o) {
    SimResult res;
    res.errors = plan::verify(g);
    if (!res.errors.empty()) return res;
    Profile pr = profile_of(g, p, o);
    const bool calibrated = p.mesh.profile.calibration.cores > 0;
    plan::ExecCosts costs = o.cost == CostModel::unit ? unit_costs()
                            : calibrated              ? calibrated_costs(g, p, pr)
                                                      : profile_costs(g, pr);
    plan::ExecTimes times = plan::execute(g, costs);
    if (!times.complete) {
        res.errors.push_back({{}, "the simulation stopped before the end of the step", ""});
        return res;
    }
    Timeline t;
    t.graph = g;
    t.cost = o.cost;
    for (const auto& ends : times.end)
        for (double e : ends) t.makespan = std::max(t.makespan, e);
    double idle_total = 0;
    for (size_t r = 0; r < g.ranks.size(); ++r) {
        const PlanRank& rank = g.ranks[r];
        RankReport rep;
        rep.rank = rank.rank;
        bool first = true;
        for (size_t i = 0; i < rank.actions.size(); ++i) {
            const PlanAction& a = rank.actions[i];
            if (!plan::is_compute(a.kind) && a.kind != ActionKind::step) continue;
            double s = times.start[r][i], e = times.end[r][i];
            if (e <= s && a.kind == ActionKind::step) continue;
            rep.spans.push_back({i, s, e});
            rep.busy += e - s;
            if (first) rep.first_start = s;
            first = false;
            rep.last_end = std::max(rep.last_end, e);
        }
        rep.idle = t.makespan - rep.busy;
        idle_total += rep.idle;
        account_memory(g, rank, rep);
        t.ranks.push_back(std::move(rep));
    }
    t.bubble_fraction =
        t.makespan > 0 ? idle_total / (static_cast<double>(g.ranks.size()) * t.makespan) : 0.0;
    t.memory_limit_bytes = p.mesh.memory_bytes;
    if (o.cost == CostModel::profile) {
        t.step_time_s = t.makespan;
        double tokens = static_cast<double>(g.microbatch_tokens) * g.microbatches * g.dp;
        double flops = 0;
        for (const PlanStage& s : g.stages)
            flops += (s.flops_forward + s.flops_input_grad + s.flops_weight_grad);
        flops *= static_cast<double>(g.microbatches) * g.dp * g.tp * g.cp;
        if (t.makespan > 0) {
            t.tokens_per_s = tokens / t.makespan;
            t.mfu = flops / (t.makespan * pr.flops * static_cast<double>(g.ranks.size()));
        }
    }
    if (t.memory_limit_bytes > 0) {
        t.shared_memory = p.mesh.profile.devices_per_host == 0;
        if (t.shared_memory) {
            int64_t total = 0;
            for (const RankReport& r : t.ranks) total += r.peak_memory_bytes;
            t.fits = total <= t.memory_limit_bytes;
        } else {
            for (const RankReport& r : t.ranks)
                t.fits = t.fits && r.peak_memory_bytes <= t.memory_limit_bytes;
        }
    }
    res.timeline = std::move(t);
    return res;
}

} // namespace dist::sim
