// simulate.cpp: the cost model and the memory account of one simulated step.
//
// Timing is the plan's abstract execution (actors/plan/execute.hpp) with real durations.
// Memory per rank: weights, gradients and AdamW state of its stages (16 bytes per parameter,
// as the checker's memory floor assumes), the activations alive at the worst moment (saved by
// an F, freed by its B, or its W when backward is split), and the communication buffers.
#include "actors/sim/simulate.hpp"

#include "actors/plan/execute.hpp"
#include "actors/plan/lower.hpp"
#include "actors/plan/schedules.hpp"
#include "actors/plan/stages.hpp"
#include "actors/plan/verify.hpp"
#include "actors/sim/calibrated.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <tuple>

namespace dist::sim {

using plan::ActionKind;
using plan::Graph;
using plan::PlanAction;
using plan::PlanRank;
using plan::PlanStage;

namespace {

struct Profile {
    double flops = 1e12, mem_bw = 1e11, efficiency = 0.5;
    /// Flash attention's fraction of peak (0: the matmuls') and its tiles' query rows.
    double attention_efficiency = 0;
    double attention_block = 128;
    double overlap_slowdown = 0; // compute beside a collective (HardwareProfile's)
    LinkSpec intra{1e10, 1e-6}, inter{1e9, 1e-5};

    /// Seconds of `flops` FLOPs of which `flash` are a causal flash kernel's products over a
    /// sequence of `seq`: the kernel runs the tiles on or below the diagonal, 1/2 + B / 2T of
    /// the square for tiles of B query rows (a rank's load-balanced cp share too: its two
    /// chunks' diagonal tiles are the same fraction of its 1/cp).
    double seconds(double all, double flash, int64_t seq) const {
        if (flash <= 0 || seq <= 0) return all / (flops * efficiency);
        const double run = std::min(1.0, 0.5 + attention_block / (2.0 * static_cast<double>(seq)));
        const double att = attention_efficiency > 0 ? attention_efficiency : efficiency;
        return (all - flash) / (flops * efficiency) + flash * run / (flops * att);
    }
};

Profile profile_of(const Graph& g, const Program& p, const SimOptions& o,
                   const HardwareProfile& h) {
    Profile pr;
    double peak = g.bytes_per_element == 2 ? h.peak_flops_bf16 : h.peak_flops_f32;
    if (peak > 0) pr.flops = peak;
    if (h.memory_bandwidth > 0) pr.mem_bw = h.memory_bandwidth;
    if (h.intra_host.bandwidth > 0) pr.intra = h.intra_host;
    if (h.inter_host.bandwidth > 0) pr.inter = h.inter_host;
    pr.efficiency = h.matmul_efficiency > 0 ? h.matmul_efficiency : o.efficiency;
    pr.attention_efficiency = h.attention_efficiency;
    pr.overlap_slowdown = h.overlap_slowdown;
    if (h.attention_block > 0) pr.attention_block = static_cast<double>(h.attention_block);
    const auto& curve = h.matmul_efficiency_by_width;
    if (!curve.empty()) {
        // Keyed by the width of a tensor-parallel shard (the matmuls' size on one device: a
        // block's are (tokens x width/tp) by (width/tp x width) and the like), linear in
        // log(width) between the profile's points, constant beyond them.
        pr.efficiency = log_between(curve, shard_width(p));
    }
    return pr;
}

Profile profile_of(const Graph& g, const Program& p, const SimOptions& o) {
    return profile_of(g, p, o, p.mesh.profile);
}

/// On a mesh of several kinds of device, the profile of each pipeline rank; else empty.
std::vector<Profile> kinds_of(const Graph& g, const Program& p, const SimOptions& o) {
    std::vector<Profile> out;
    if (!p.mesh.mixed()) return out;
    for (const HardwareProfile& h : p.mesh.pp_profiles) out.push_back(profile_of(g, p, o, h));
    return out;
}

/// Ring all-reduce: 2 (n-1) steps, each moving bytes / n over the slowest link.
double ring_allreduce(double bytes, int32_t n, const LinkSpec& link) {
    if (n <= 1) return 0.0;
    double steps = 2.0 * (n - 1);
    return steps * (link.latency + bytes / n / link.bandwidth);
}

/// Ring all-gather or reduce-scatter of `bytes` in all: n - 1 steps of bytes / n each.
/// What a rank's optimizer step updates: its stages' replicated and routed-expert parameters,
/// and under ZeRO its share of them (1/N of the replicated ones over the N = dp x cp replicas,
/// 1/(N / ep) of a routed expert's over its holders).
struct StepShare {
    double dense = 0, experts = 0, updated = 0;
    int32_t holders = 1;
};

StepShare step_share(const Graph& g, const PlanRank& r, int32_t replicas, int32_t ep) {
    StepShare s;
    for (const PlanStage& st : g.stages) {
        if (st.pp != r.pp) continue;
        s.dense += static_cast<double>(st.parameters - st.expert_parameters);
        s.experts += static_cast<double>(st.expert_parameters);
    }
    s.holders = std::max(1, replicas / std::max(1, ep));
    s.updated = g.zero >= 1 ? s.dense / replicas + s.experts / s.holders : s.dense + s.experts;
    return s;
}

double ring_half(double bytes, int32_t n, const LinkSpec& link) {
    if (n <= 1) return 0.0;
    return (n - 1) * (link.latency + bytes / n / link.bandwidth);
}

/// All-to-all of `bytes` per rank among n: each rank keeps 1/n and sends the rest, one
/// message to each other rank.
double all_to_all(double bytes, int32_t n, const LinkSpec& link) {
    if (n <= 1) return 0.0;
    return (n - 1) * link.latency + bytes * (n - 1) / n / link.bandwidth;
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

/// The mesh as the costs see it. A bound's graph holds two replicas' pipeline ranks only
/// (below); it keeps the real sizes here, and each of its ranks (d, pp) is priced as the real
/// rank (d, pp, tp 0, cp 0), links and all, so that it never costs more than the mesh.
struct Axes {
    int32_t dp = 1, tp = 1, pp = 1, cp = 1;
    int64_t per_host = 0; // > 0: hosts from these sizes (a bound), else the graph's ranks
    int32_t ep = 1;       // expert-parallel ranks, ep of a pipeline rank's dp x cp ranks
};

Axes axes_of(const Graph& g) {
    return {g.dp, g.tp, g.pp, g.cp, 0, g.ep};
}

/// `kinds`: the profile of each pipeline rank on a mesh of several kinds (else `pr` for all).
plan::ExecCosts profile_costs(const Graph& g, const Profile& pr, const Axes& ax,
                              const std::vector<Profile>& kinds = {}) {
    auto kind = [pr, kinds](int32_t pp) -> Profile {
        return kinds.empty() ? pr : kinds[static_cast<size_t>(pp)];
    };
    plan::ExecCosts c;
    c.step_barrier = true; // the gradient norm before the update
    auto stage = [&g](const PlanAction& a) -> const PlanStage& {
        return g.stages[static_cast<size_t>(a.stage)];
    };
    const bool bound = ax.per_host > 0;
    // The host of mesh coordinates (ranks are ((dp * PP + pp) * CP + cp) * TP + tp).
    auto host = [&g, ax, bound](int32_t d, int32_t p, int32_t t, int32_t k) -> int64_t {
        if (bound)
            return (((static_cast<int64_t>(d) * ax.pp + p) * ax.cp + k) * ax.tp + t) / ax.per_host;
        return g.ranks[static_cast<size_t>(g.rank_of(d, p, t, k))].host;
    };
    // A rank's mesh coordinates (dp, pp, tp, cp). In a bound's graph, its replica d is the
    // mesh's replica d, or its context-parallel rank d when the mesh has one replica.
    auto coords = [ax, bound](const PlanRank& r) -> std::array<int32_t, 4> {
        if (!bound) return {r.dp, r.pp, r.tp, r.cp};
        if (ax.dp > 1) return {r.dp, r.pp, 0, 0};
        return {0, r.pp, 0, r.dp};
    };
    auto host_of = [host, coords](const PlanRank& r) {
        auto [d, p, t, k] = coords(r);
        return host(d, p, t, k);
    };
    // Within a pipeline rank's groups, its kind's links; between two kinds, the slower ends.
    auto link_between = [kind](int32_t a, int32_t b, bool same) {
        Profile x = kind(a), y = kind(b);
        const LinkSpec &l = same ? x.intra : x.inter, &m = same ? y.intra : y.inter;
        return LinkSpec{std::min(l.bandwidth, m.bandwidth), std::max(l.latency, m.latency)};
    };
    // A group talks over the host's links when all its members share a host. The tensor- and
    // context-parallel groups are runs of consecutive ranks (the fastest axes of the layout):
    // their two ends tell.
    auto tp_link = [host, coords, link_between, ax](const PlanRank& r) {
        auto [d, p, t, k] = coords(r);
        return link_between(p, p, host(d, p, 0, k) == host(d, p, ax.tp - 1, k));
    };
    auto cp_link = [host, coords, link_between, ax](const PlanRank& r) {
        auto [d, p, t, k] = coords(r);
        return link_between(p, p, host(d, p, t, 0) == host(d, p, t, ax.cp - 1));
    };
    // The link of the replica group (dp x cp): the host's when every member shares it. Hosts
    // hold consecutive ranks, and the group's ranks grow with (dp, cp): its two ends tell.
    auto replica_link = [host, coords, link_between, ax](const PlanRank& r) {
        auto [d, p, t, k] = coords(r);
        return link_between(p, p, host(0, p, t, 0) == host(ax.dp - 1, p, t, ax.cp - 1));
    };
    // The expert-parallel group: ep consecutive replicas (dp x cp ranks, cp fastest) of the
    // rank's (pp, tp); its two ends tell.
    auto ep_link = [host, coords, link_between, ax](const PlanRank& r) {
        auto [d, p, t, k] = coords(r);
        const int32_t first = (d * ax.cp + k) / ax.ep * ax.ep, last = first + ax.ep - 1;
        return link_between(p, p,
                            host(first / ax.cp, p, t, first % ax.cp) ==
                                host(last / ax.cp, p, t, last % ax.cp));
    };
    const int32_t replicas = ax.dp * ax.cp;
    c.compute = [&g, kind, link_between, ax, host, coords, stage, tp_link, cp_link, replica_link,
                 ep_link, replicas](const PlanRank& r, const PlanAction& a) {
        const Profile pr = kind(r.pp);
        double rate = pr.flops * pr.efficiency;
        if (a.kind == ActionKind::step) {
            // AdamW reads and writes its 16 bytes of state per parameter about twice; under ZeRO
            // each replica rank updates its 1/N share (a routed expert's holder its 1/(N / ep)),
            // and below stage 3 all-gathers the new weights (Megatron-LM's distributed
            // optimizer), the experts' among their holders.
            const StepShare share = step_share(g, r, replicas, ax.ep);
            double step = 2.0 * 16.0 * share.updated / pr.mem_bw;
            if (g.zero == 1 || g.zero == 2) {
                step += ring_half(share.dense * g.bytes_per_element, replicas, replica_link(r));
                if (share.experts > 0)
                    step += ring_half(share.experts * g.bytes_per_element, share.holders,
                                      replica_link(r));
            }
            return step;
        }
        const PlanStage& s = stage(a);
        const double each =
            ring_allreduce(static_cast<double>(s.tp_reduction_bytes), ax.tp, tp_link(r));
        const double tp_f =
            s.tp_reductions * each +
            (s.tp_loss_reductions > 0
                 ? s.tp_loss_reductions *
                       ring_allreduce(static_cast<double>(s.tp_loss_bytes), ax.tp, tp_link(r))
                 : 0.0);
        const double tp_b = s.tp_backward_reductions * each;
        // Context parallelism: the ring's transfers run behind the attention's blocks; only
        // what exceeds the attention's time shows. The backward passes twice the bytes
        // (key/value blocks and their gradients) behind twice the FLOPs.
        double ring = 0;
        if (ax.cp > 1 && s.cp_ring_bytes > 0) {
            LinkSpec l = cp_link(r);
            double send =
                (ax.cp - 1) * l.latency + static_cast<double>(s.cp_ring_bytes) / l.bandwidth;
            ring = std::max(
                0.0, send - pr.seconds(s.attention_flops, s.flash_forward, s.flash_sequence));
        }
        const int64_t T = s.flash_sequence;
        switch (a.kind) {
        case ActionKind::forward:
            return pr.seconds(s.flops_forward, s.flash_forward, T) +
                   s.bytes_elementwise / pr.mem_bw + tp_f + ring;
        case ActionKind::backward_input:
            return pr.seconds(s.flops_input_grad, s.flash_input_grad, T) +
                   2 * s.bytes_elementwise / pr.mem_bw + tp_b + 2 * ring;
        case ActionKind::backward_weight: return s.flops_weight_grad / rate;
        case ActionKind::backward:
            return pr.seconds(s.flops_input_grad + s.flops_weight_grad, s.flash_input_grad, T) +
                   2 * s.bytes_elementwise / pr.mem_bw + tp_b + 2 * ring;
        default: return 0.0;
        }
    };
    // The tied embedding's two copies, summed between the first and the last stage's rank
    // before the gradient norm (the runtime's finish_step).
    c.step_before = [&g, coords, host, link_between](const PlanRank& r) {
        const bool first = r.pp == g.stages.front().pp, last = r.pp == g.stages.back().pp;
        if (g.tied_bytes <= 0 || !(first || last)) return 0.0;
        auto [d, p, t, k] = coords(r);
        bool same = host(d, g.stages.front().pp, t, k) == host(d, g.stages.back().pp, t, k);
        return ring_allreduce(static_cast<double>(g.tied_bytes), 2,
                              link_between(g.stages.front().pp, g.stages.back().pp, same));
    };
    // A mixture of experts' dispatch or combine (the graph lists them after the compute
    // action they run inside), among the ep ranks of the rank's group.
    c.exchange = [stage, ep_link, ax](const PlanRank& r, const PlanAction& a) {
        return all_to_all(static_cast<double>(stage(a).all_to_all_bytes), ax.ep, ep_link(r));
    };
    c.transfer = [link_between, host_of, stage](const PlanRank& from, const PlanRank& to,
                                                const PlanAction& a) {
        LinkSpec l = link_between(from.pp, to.pp, host_of(from) == host_of(to));
        return l.latency + static_cast<double>(stage(a).boundary_bytes) / l.bandwidth;
    };
    c.overlap_slowdown = [kind](const PlanRank& r) { return kind(r.pp).overlap_slowdown; };
    c.reduction = [&g, stage, replica_link, ax](const PlanRank& r, const PlanAction& a) {
        const PlanStage& s = stage(a);
        LinkSpec link = replica_link(r);
        const int32_t all = ax.dp * ax.cp, holders = all / std::max(1, ax.ep);
        if (a.kind == ActionKind::gather_forward || a.kind == ActionKind::gather_backward) {
            // The routed experts' weights come from their holders, the rest from the replicas.
            const double bytes = static_cast<double>(g.bytes_per_element);
            double t = ring_half(static_cast<double>(s.parameters - s.expert_parameters) * bytes,
                                 all, link);
            if (s.expert_parameters > 0)
                t += ring_half(static_cast<double>(s.expert_parameters) * bytes, holders, link);
            return t;
        }
        if (a.kind == ActionKind::reduce_scatter) {
            // A microbatch's gradients of the stage; the routed experts' among their holders.
            auto [dense, experts] = s.gradient_bytes();
            double t = ring_half(static_cast<double>(dense), all, link);
            if (experts > 0) t += ring_half(static_cast<double>(experts), holders, link);
            return t;
        }
        // Routed experts' gradients: among the replicas holding the same experts.
        const int32_t replicas = s.expert_bucket(a.microbatch) ? holders : all;
        const double bucket = static_cast<double>(s.buckets[static_cast<size_t>(a.microbatch)]);
        return ring_allreduce(bucket, replicas, link);
    };
    return c;
}

// The bytes the largest matmul of the plan touches (input, weight and output, in float): what
// ranks taking turns on a core bring back into its cache at each turn.
double largest_matmul_bytes(const Graph& g, const Program& p) {
    double most = 0;
    for (const PlanStage& s : g.stages)
        for (const plan::KernelCall& k : plan::stage_kernels(p, s))
            if (k.kind == plan::KernelCall::Kind::matmul)
                most = std::max(most, 4.0 * static_cast<double>(k.m * k.k + k.n * k.k + k.m * k.n));
    return most;
}

// A stage's tensor-parallel all-reduces inside one action of `kind`: the forward's (the
// split loss's among them), or the backward's.
int32_t tp_reductions_in(const PlanStage& s, ActionKind kind) {
    switch (kind) {
    case ActionKind::forward: return s.tp_reductions + s.tp_loss_reductions;
    case ActionKind::backward_input:
    case ActionKind::backward: return s.tp_backward_reductions;
    default: return 0;
    }
}

// The members of a tensor-parallel group meet at each of its all-reduces, and give up their
// cores (or GPU) while they wait there. Context parallelism's ring waits inside its attention
// are not cut into pieces: those ranks share each core evenly.
std::function<int32_t(const PlanRank&, const PlanAction&)> tp_meetings(const Graph& g) {
    return [&g](const PlanRank&, const PlanAction& a) -> int32_t {
        return tp_reductions_in(g.stages[static_cast<size_t>(a.stage)], a.kind);
    };
}

// A calibrated CPU (actors/sim/calibrated.hpp): kernels priced by shape at the rates measured
// for the threads each rank gets, ranks of a host sharing its cores, transfers and collectives
// at their measured times (in-process within a process; between the `processes` processes of
// a host UCX over shared memory and Gloo; UCX over TCP and Gloo between hosts). A calibrated
// GPU: each rank has its device, its kernels at the device's rates, collectives within a host
// at NCCL's measured times, the rest by the profile's links. `paces`: each rank's pace on its
// cores (core_paces), a factor on its compute.
plan::ExecCosts calibrated_costs(const Graph& g, const Program& p, const Profile& pr,
                                 int32_t processes, int32_t shared_gpus,
                                 const std::vector<double>& paces) {
    plan::ExecCosts c = profile_costs(g, pr, axes_of(g));
    const Calibration& cal = p.mesh.profile.calibration;
    const bool gpu = cal.gpu();
    auto rates = std::make_shared<Rates>(cal);
    const double threads = gpu ? 1.0 : rank_threads(g, cal.cores);
    // Single-threaded ranks beyond a host's cores take turns on them, each turn finding another
    // rank's data in the caches: their actions cost what the calibration measured them to, at
    // the model's width, not a tensor-parallel shard's: a shard's activations (its input, its
    // norms, the residual stream) are as wide as the model's, only its weights are split.
    const int32_t most = most_ranks_on_a_host(g);
    const bool queued = !gpu && threads == 1 && most > cal.cores; // CoreQueues covers them
    const double turns =
        queued ? cal.oversubscribed_work(static_cast<double>(p.model.width),
                                         static_cast<double>(most) / cal.cores, g.tp > 1)
               : 1.0;
    auto seconds = std::make_shared<std::vector<StageSeconds>>();
    for (const PlanStage& s : g.stages) {
        StageSeconds t = stage_seconds(p, s, *rates, threads);
        t.forward *= turns;
        t.input *= turns;
        t.weight *= turns;
        seconds->push_back(t);
    }
    const auto ranks = static_cast<int32_t>(g.ranks.size());
    auto process = [ranks, processes](int32_t rank) {
        return plan::process_of_rank(rank, ranks, std::max(1, processes));
    };
    auto same_host = [&g](const std::vector<int32_t>& members) {
        for (int32_t m : members)
            if (g.ranks[static_cast<size_t>(m)].host !=
                g.ranks[static_cast<size_t>(members[0])].host)
                return false;
        return true;
    };
    auto one_process = [same_host, process](const std::vector<int32_t>& members) {
        for (int32_t m : members)
            if (process(m) != process(members[0])) return false;
        return same_host(members);
    };
    // A collective's measured time, else the link model's.
    auto collective = [rates, same_host, one_process, gpu](const std::vector<int32_t>& members,
                                                           const char* op, double bytes,
                                                           double modelled) {
        if (gpu && !same_host(members)) return modelled; // NCCL between hosts: not measured here
        double t = rates->collective(gpu                    ? "nccl"
                                     : one_process(members) ? "inprocess"
                                                            : "gloo",
                                     op, static_cast<int32_t>(members.size()), bytes);
        return t >= 0 ? t : modelled;
    };
    plan::ExecCosts fallback = c;
    // The gradient norm's pass over the rank's gradients (its share under ZeRO), on its threads
    // before the norm's barrier (RankExecutor::gradient_norm): time before STEP's span, which is
    // the update alone, as the runtime counts it. The calibrated optimizer's pass includes it.
    auto norm_pass = [&g, rates, threads](const PlanRank& r) {
        const double n = step_share(g, r, g.dp * g.cp, g.ep).updated;
        return n > 0 ? n / rates->elementwise("sum_squares", n, threads, false) : 0.0;
    };
    // Before the barrier, that pass and the tied embedding's sum: the all-reduce of its
    // gradient between the first and the last stage's rank, as measured.
    c.step_before = [&g, fallback, collective, norm_pass](const PlanRank& r) {
        const double modelled = fallback.step_before(r);
        double tied = 0;
        if (modelled > 0) {
            const int32_t first = g.stages.front().pp, last = g.stages.back().pp;
            const int32_t partner = g.rank_of(r.dp, r.pp == first ? last : first, r.tp, r.cp);
            tied = collective({r.rank, partner}, "all_reduce", static_cast<double>(g.tied_bytes),
                              modelled);
        }
        return norm_pass(r) + tied;
    };
    // One all-reduce of the rank's tensor-parallel group, as measured (-1: not measured). The
    // members reach it apart: the first blocks, its core idles, and it goes on once its core
    // has woken (`wake`), where the measurement's calls, back to back, found every member at
    // once. Where single-threaded ranks take turns on the cores the simulation meets them one
    // by one, and wakes there those that came first (ExecCosts::meets).
    const double meeting_wake = !gpu && !queued ? cal.wake_s : 0.0;
    auto tp_all_reduce = [&g, collective, meeting_wake](const PlanRank& r, double bytes) {
        const double t = collective(g.tensor_group(r), "all_reduce", bytes, -1.0);
        return t >= 0 ? t + meeting_wake : t;
    };
    const double mem_bw = pr.mem_bw;
    auto pace = std::make_shared<std::vector<double>>(paces);
    // Activations the caches have lost by the time they are used: each F and B costs its
    // stash's bytes at its reuse distance (calibration.reuse) beyond what the probes' order,
    // each backward right after its forward, measured; a split backward's I and W each their
    // share of the stash (of the backward's time) at their own distances. Ranks that take
    // turns on the cores lose their caches at every turn, which their own factor prices.
    using Reused = std::map<std::tuple<ActionKind, int32_t, int32_t>, double>;
    auto reused = std::make_shared<std::vector<Reused>>(g.ranks.size());
    if (!gpu && !queued && !cal.reuse.empty())
        for (const PlanRank& r : g.ranks) {
            const std::vector<double> distance = reuse_distances(g, r);
            for (size_t i = 0; i < r.actions.size(); ++i) {
                const PlanAction& a = r.actions[i];
                if (distance[i] <= 0) continue;
                double part = 1.0; // of the stash: a split backward's I and W their shares
                if (a.kind == ActionKind::backward_input || a.kind == ActionKind::backward_weight) {
                    const StageSeconds& t = (*seconds)[static_cast<size_t>(a.stage)];
                    const double both = t.input + t.weight;
                    part = both <= 0
                               ? 0.5
                               : (a.kind == ActionKind::backward_input ? t.input : t.weight) / both;
                }
                const double bytes =
                    part *
                    static_cast<double>(g.stages[static_cast<size_t>(a.stage)].activation_bytes);
                (*reused)[static_cast<size_t>(r.rank)][{a.kind, a.stage, a.microbatch}] =
                    bytes * cal.reuse_cost(threads, distance[i], a.kind != ActionKind::forward);
            }
        }
    // A backward split into I and W costs what the calibration measured it to against whole.
    const std::pair<double, double> split = cal.split_factors(threads);
    c.compute = [&g, fallback, seconds, rates, threads, tp_all_reduce, mem_bw, norm_pass, pace,
                 reused, split](const PlanRank& r, const PlanAction& a) {
        if (a.kind == ActionKind::step) {
            // The optimizer's kernels on the rank's share of its parameters, but the norm's
            // pass (before it), with the communication the link model prices.
            const double updated = step_share(g, r, g.dp * g.cp, g.ep).updated;
            double modelled = fallback.compute(r, a);
            return std::max(0.0, step_seconds(updated, *rates, threads) - norm_pass(r)) +
                   std::max(0.0, modelled - 2.0 * 16.0 * updated / mem_bw);
        }
        const PlanStage& s = g.stages[static_cast<size_t>(a.stage)];
        StageSeconds t = (*seconds)[static_cast<size_t>(a.stage)];
        const double at = (*pace)[static_cast<size_t>(r.rank)];
        t.forward *= at;
        t.input *= at;
        t.weight *= at;
        if (a.kind == ActionKind::backward_input || a.kind == ActionKind::backward_weight) {
            t.input *= split.first;
            t.weight *= split.second;
        }
        const double each =
            std::max(0.0, tp_all_reduce(r, static_cast<double>(s.tp_reduction_bytes)));
        const double loss =
            s.tp_loss_reductions > 0
                ? s.tp_loss_reductions *
                      std::max(0.0, tp_all_reduce(r, static_cast<double>(s.tp_loss_bytes)))
                : 0.0;
        const double tp_b = s.tp_backward_reductions * each;
        const Reused& mine = (*reused)[static_cast<size_t>(r.rank)];
        if (auto it = mine.find({a.kind, a.stage, a.microbatch}); it != mine.end()) {
            if (a.kind == ActionKind::forward)
                t.forward += at * it->second;
            else if (a.kind == ActionKind::backward_weight)
                t.weight += at * it->second;
            else
                t.input += at * it->second;
        }
        switch (a.kind) {
        case ActionKind::forward: return t.forward + s.tp_reductions * each + loss;
        case ActionKind::backward_input: return t.input + tp_b;
        case ActionKind::backward_weight: return t.weight;
        case ActionKind::backward: return t.input + t.weight + tp_b;
        default: return 0.0;
        }
    };
    // A mixture of experts' all-to-alls: measured where the calibration has them, else the
    // link model's over the ends of the ep group.
    c.exchange = [&g, fallback, collective](const PlanRank& r, const PlanAction& a) {
        const double bytes =
            static_cast<double>(g.stages[static_cast<size_t>(a.stage)].all_to_all_bytes);
        return collective(g.expert_group(r), "all_to_all", bytes, fallback.exchange(r, a));
    };
    c.transfer = [&g, rates, fallback, gpu, one_process](const PlanRank& from, const PlanRank& to,
                                                         const PlanAction& a) {
        if (gpu) return fallback.transfer(from, to, a); // the profile's links
        double bytes = static_cast<double>(g.stages[static_cast<size_t>(a.stage)].boundary_bytes);
        double t = rates->transfer(one_process({from.rank, to.rank}) ? "inprocess"
                                   : from.host == to.host            ? "ucx-sm"
                                                                     : "ucx-tcp",
                                   bytes);
        if (t < 0) t = rates->transfer("ucx-tcp", bytes); // shared memory not measured
        return t >= 0 ? t : fallback.transfer(from, to, a);
    };
    // The reducer's own passes over memory, on its one thread (RankExecutor::Reducer): it
    // packs a bucket's gradients into one buffer and, after an all-reduce, copies them back
    // scaled by 1 / N_d; before a reduce-scatter it packs every member's shares, after it
    // scales its own and adds it to the share it keeps. The members of its host copy at the
    // same time (the replicas reach a bucket together) and share the memory's bandwidth: each
    // copies no faster than its share of what as many threads copy together.
    // The gradients were written over the whole backward among its activations, and the
    // reducer reads them back from beyond the caches: at the rate of the largest copy measured
    // (packing 3.3 MB of gradients took 0.17-0.31 ms, where the same copy hot takes 0.06).
    const double cores = cal.cores;
    double cold = 0;
    for (const StreamRate& r : cal.elementwise)
        if (r.op == "copy") cold = std::max(cold, static_cast<double>(r.elements));
    auto copies = [rates, cores, cold](double bytes, double together) {
        const double n = bytes / 4;
        if (n <= 0) return 0.0;
        const double at = std::max(n, cold);
        double rate = rates->elementwise("copy", at, 1.0, false);
        if (together > 1)
            rate = std::min(
                rate, rates->elementwise("copy", at * together, std::min(together, cores), false) /
                          together);
        return n / rate;
    };
    c.reduction = [&g, fallback, collective, copies](const PlanRank& r, const PlanAction& a) {
        const PlanStage& s = g.stages[static_cast<size_t>(a.stage)];
        const char* op =
            a.kind == ActionKind::reduce_scatter ? "reduce_scatter"
            : a.kind == ActionKind::gather_forward || a.kind == ActionKind::gather_backward
                ? "all_gather"
                : "all_reduce";
        const bool gather =
            a.kind == ActionKind::gather_forward || a.kind == ActionKind::gather_backward;
        const bool scatter = a.kind == ActionKind::reduce_scatter;
        double bytes = gather ? static_cast<double>(s.parameters) * g.bytes_per_element
                       : scatter
                           ? static_cast<double>(s.gradient_bytes().first)
                           : static_cast<double>(s.buckets[static_cast<size_t>(a.microbatch)]);
        if (gather || scatter ? s.expert_parameters > 0 : s.expert_bucket(a.microbatch))
            return fallback.reduction(r, a); // groups of their own: the link model's
        double own = 0, here = 0;
        for (int32_t m : g.replica_group(r))
            here += g.ranks[static_cast<size_t>(m)].host == r.host ? 1 : 0;
        if (a.kind == ActionKind::reduce_grad) {
            own = 2 * copies(bytes, here);
        } else if (a.kind == ActionKind::reduce_scatter) {
            const double members = static_cast<double>(g.replica_group(r).size());
            own = copies(bytes, here) + 2 * copies(bytes / members, here);
        }
        if (gather || scatter) {
            // The runtime gathers and reduce-scatters unit by unit (a residual group, or a
            // layer outside one), a collective each: a small unit's costs its latency.
            const double units = std::max(1, s.units);
            const double one = collective(g.replica_group(r), op, bytes / units, -1.0);
            if (one >= 0) return own + units * one;
        }
        return own + collective(g.replica_group(r), op, bytes, fallback.reduction(r, a));
    };
    c.step_barrier = true;
    if (gpu && shared_gpus > 0) {
        // The host's GPUs taken in turn by the ranks that outnumber them, as cores are: a GPU
        // runs one rank's kernels at a time at its full speed (one stream each, no slice).
        c.threads = [](const PlanRank&) { return 1.0; };
        c.speed = [](double) { return 1.0; };
        c.cores = shared_gpus;
        c.meets = tp_meetings(g);
        c.slice = 0.0;
        return c;
    }
    if (gpu) return c; // a device per rank
    // Between the processes of a host each step of a Gloo collective wakes a member's thread,
    // which then waits for a core where the other threads fill them, and the thread's own
    // work around it runs slowed: as calibrated (`collective_wait`, seconds per step), else
    // half the scheduler's slice. A unit's gather or reduce-scatter is a collective each.
    const double step_wait = cal.collective_wait_s > 0 ? cal.collective_wait_s : cal.slice_s / 2;
    c.reduction_wait = [&g, same_host, one_process, step_wait](const PlanRank& r,
                                                               const PlanAction& a) {
        const std::vector<int32_t> members = g.replica_group(r);
        if (step_wait <= 0 || one_process(members) || !same_host(members)) return 0.0;
        const double n = static_cast<double>(members.size());
        const bool whole = a.kind == ActionKind::reduce_grad; // an all-reduce: 2 (n - 1) steps
        const double calls =
            whole ? 1.0 : std::max(1, g.stages[static_cast<size_t>(a.stage)].units);
        return calls * (whole ? 2.0 : 1.0) * (n - 1) * step_wait;
    };
    // A tensor-parallel all-reduce's hand-over (its time at the smallest size measured, with
    // the wake-up) is the members waiting for each other, off their cores; the rest is the
    // copies and sums.
    c.compute_wait = [&g, tp_all_reduce](const PlanRank& r, const PlanAction& a) {
        const PlanStage& s = g.stages[static_cast<size_t>(a.stage)];
        const int32_t meetings = tp_reductions_in(s, a.kind);
        if (meetings == 0) return 0.0;
        const double hand_over = std::min(
            tp_all_reduce(r, 1.0), tp_all_reduce(r, static_cast<double>(s.tp_reduction_bytes)));
        return hand_over > 0 ? meetings * hand_over : 0.0;
    };
    c.threads = [threads](const PlanRank&) { return threads; };
    c.speed = [rates, bytes = largest_matmul_bytes(g, p)](double busy) {
        return rates->sharing(busy, bytes);
    };
    c.cores = cal.cores;
    c.meets = tp_meetings(g);
    c.slice = g.cp == 1 ? cal.slice_s : 0.0;
    c.wake = cal.wake_s;
    return c;
}

/// `replicas`: the dp x cp ranks that share a replica's state under ZeRO (the graph's own,
/// except for a bound's graph of one replica).
void account_memory(const Graph& g, const PlanRank& r, RankReport& rep, int64_t replicas) {
    int64_t params = 0, experts = 0, boundary = 0, bucket = 0, tp_buf = 0;
    for (const PlanStage& s : g.stages) {
        if (s.pp != r.pp) continue;
        params += s.parameters;
        experts += s.expert_parameters;
        boundary = std::max(boundary, s.boundary_bytes);
        for (int64_t b : s.buckets) bucket = std::max(bucket, b);
        tp_buf = std::max(tp_buf, s.tp_reduction_bytes);
        // A mixture of experts' send and receive buffers.
        tp_buf = std::max(tp_buf, 2 * s.all_to_all_bytes);
    }
    // ZeRO's (2 + 2 + K) psi / N_d (Rajbhandari et al. 2020, figure 1): stage 1 divides the
    // optimizer's K bytes per parameter over the N_d replica ranks, 2 also the gradients, 3
    // also the weights, which then are whole only for the units being gathered: the one
    // computing and the one prefetched. Routed experts under ep are shared by their N_d / ep
    // holders only.
    const int64_t nd = replicas;
    const int64_t holders = std::max<int64_t>(1, nd / std::max<int32_t>(1, g.ep));
    const int64_t dense = params - experts;
    int64_t unit = 0, two_units = 0;
    for (const PlanStage& s : g.stages)
        if (s.pp == r.pp) {
            unit = std::max(unit, s.largest_unit_parameters);
            two_units = std::max(two_units, s.two_largest_units_parameters);
        }
    const int32_t zero = nd > 1 ? g.zero : 0; // alone, a rank has nothing to shard over
    // The runtime's 4 + 4 + 8 bytes in either precision: bf16 computes with the f32 master
    // weights cast where they are used, and keeps f32 gradients (docs/training.md).
    const int64_t w = 4, k = 8;
    rep.parameters_bytes =
        zero >= 3 ? dense * w / nd + experts * w / holders + std::min(params, 2 * unit) * w
                  : params * w;
    // Gradients under ZeRO 2 and 3: the reduced shares, and whole only for the units between
    // their weight gradient and its reduce-scatter, the one computing and the one reducing.
    rep.gradients_bytes =
        zero >= 2 ? dense * w / nd + experts * w / holders + std::min(params, two_units) * w
                  : params * w;
    rep.optimizer_bytes = zero >= 1 ? dense * k / nd + experts * k / holders : params * k;
    bool p2p = false;
    for (const PlanAction& a : r.actions) p2p = p2p || plan::is_p2p(a.kind);
    // A send and a receive buffer each way, the largest bucket (under ZeRO 2 and 3 a unit's
    // gradients packed for the reduce-scatter), one tensor-parallel buffer.
    rep.communication_bytes =
        (p2p ? 4 * boundary : 0) + (zero >= 2 ? std::min(params, unit) * w : bucket) + tp_buf;
    // Activations: walk the compute spans in time order, each microbatch's kept activations
    // with what its forward and backward hold for a moment beside them.
    std::map<std::pair<int32_t, int32_t>, int64_t> live;
    int64_t now = 0, peak = 0;
    size_t peak_count = 0;
    for (const Span& sp : rep.spans) {
        const PlanAction& a = r.actions[sp.action];
        if (a.kind == ActionKind::step) continue;
        auto key = std::make_pair(a.stage, a.microbatch);
        const PlanStage& st = g.stages[static_cast<size_t>(a.stage)];
        int64_t during = now; // what the rank holds while the span runs
        switch (a.kind) {
        case ActionKind::forward:
            live[key] = st.activation_bytes;
            now += st.activation_bytes;
            during = now + st.forward_working_bytes;
            peak_count = std::max(peak_count, live.size());
            break;
        case ActionKind::backward:
            during = now + st.backward_working_bytes;
            now -= live[key];
            live.erase(key);
            break;
        case ActionKind::backward_input:
            // I leaves what W needs in place of what the forward kept.
            during = now + st.input_working_bytes;
            now += st.weight_stash_bytes - live[key];
            live[key] = st.weight_stash_bytes;
            break;
        case ActionKind::backward_weight:
            during = now + st.weight_working_bytes;
            now -= live[key];
            live.erase(key);
            break;
        default: break;
        }
        during = std::max(during, now);
        peak = std::max(peak, during);
        rep.activation_steps.emplace_back(sp.start, during);
        rep.activation_steps.emplace_back(sp.end, now);
    }
    rep.peak_inflight_microbatches = static_cast<int32_t>(peak_count);
    rep.activations_bytes = peak;
    rep.peak_memory_bytes = rep.parameters_bytes + rep.gradients_bytes + rep.optimizer_bytes +
                            rep.activations_bytes + rep.communication_bytes;
}

} // namespace

int64_t shared_peak(const Timeline& t) {
    int64_t fixed = 0;
    std::vector<std::tuple<double, size_t, size_t>> events; // time, rank, step
    for (size_t r = 0; r < t.ranks.size(); ++r) {
        const RankReport& rep = t.ranks[r];
        fixed += rep.peak_memory_bytes - rep.activations_bytes;
        for (size_t i = 0; i < rep.activation_steps.size(); ++i)
            events.emplace_back(rep.activation_steps[i].first, r, i);
    }
    std::sort(events.begin(), events.end());
    std::vector<int64_t> level(t.ranks.size(), 0);
    int64_t sum = 0, most = 0;
    for (size_t i = 0; i < events.size();) {
        // The ranks' levels after every change at this instant; a rank that rises and falls
        // within it (a span of no length) holds its highest for that instant, beside the
        // others' final levels.
        const double time = std::get<0>(events[i]);
        const size_t first = i;
        for (; i < events.size() && std::get<0>(events[i]) == time; ++i) {
            const auto [at, r, step] = events[i];
            const int64_t bytes = t.ranks[r].activation_steps[step].second;
            sum += bytes - level[r];
            level[r] = bytes;
        }
        int64_t spike = 0;
        for (size_t j = first; j < i; ++j) {
            const auto [at, r, step] = events[j];
            spike = std::max(spike, t.ranks[r].activation_steps[step].second - level[r]);
        }
        most = std::max(most, sum + spike);
    }
    return fixed + most;
}

namespace {

// The mean of executions of one graph under different costs, time by time: each action's
// start and end, its wait for a core and its time on one, and each collective's run where every
// draw ran as many.
plan::ExecTimes mean_of(const std::vector<plan::ExecTimes>& draws) {
    plan::ExecTimes out = draws.front();
    const double n = static_cast<double>(draws.size());
    for (auto field : {&plan::ExecTimes::start, &plan::ExecTimes::end, &plan::ExecTimes::core_wait,
                       &plan::ExecTimes::on_core})
        for (size_t r = 0; r < (out.*field).size(); ++r)
            for (size_t i = 0; i < (out.*field)[r].size(); ++i) {
                double sum = 0;
                for (const plan::ExecTimes& d : draws) sum += (d.*field)[r][i];
                (out.*field)[r][i] = sum / n;
            }
    for (size_t r = 0; r < out.collectives.size(); ++r) {
        const size_t runs = out.collectives[r].size();
        if (!std::all_of(draws.begin(), draws.end(),
                         [&](const plan::ExecTimes& d) { return d.collectives[r].size() == runs; }))
            continue; // the first draw's
        for (size_t i = 0; i < runs; ++i) {
            double start = 0, end = 0;
            for (const plan::ExecTimes& d : draws) {
                start += d.collectives[r][i].start;
                end += d.collectives[r][i].end;
            }
            out.collectives[r][i].start = start / n;
            out.collectives[r][i].end = end / n;
        }
    }
    return out;
}

} // namespace

SimResult simulate(const Graph& graph, const Program& p, const SimOptions& o) {
    SimResult res;
    // Ranks sharing a host's GPUs are all on that host, whatever the profile's devices per host.
    const bool shared = o.shared_gpus > 0 && p.mesh.profile.calibration.gpu() &&
                        static_cast<size_t>(o.shared_gpus) < graph.ranks.size();
    Graph on_one_host;
    if (shared) {
        on_one_host = graph;
        for (PlanRank& r : on_one_host.ranks) r.host = 0;
    }
    const Graph& g = shared ? on_one_host : graph;
    if (!o.verified) res.errors = plan::verify(g);
    if (!res.errors.empty()) return res;
    Profile pr = profile_of(g, p, o);
    const std::vector<Profile> kinds = kinds_of(g, p, o);
    const Calibration& cal = p.mesh.profile.calibration;
    const bool calibrated = o.cost == CostModel::profile && cal.cores > 0;
    // Ranks that each hold cores of their own run at their cores' paces: the step is the mean
    // of the simulations of each draw of the paces (actors/sim/calibrated.hpp).
    const std::vector<std::vector<double>> paces =
        calibrated && !cal.gpu()
            ? core_paces(g, cal.cores, cal.core_spread)
            : std::vector<std::vector<double>>{std::vector<double>(g.ranks.size(), 1.0)};
    auto costs = [&](const std::vector<double>& pace) {
        if (o.cost == CostModel::unit) return unit_costs();
        if (calibrated)
            return calibrated_costs(g, p, pr, o.processes, shared ? o.shared_gpus : 0, pace);
        return profile_costs(g, pr, axes_of(g), kinds);
    };
    std::vector<plan::ExecTimes> draws;
    for (const std::vector<double>& pace : paces) {
        draws.push_back(plan::execute(g, costs(pace)));
        if (!draws.back().complete) {
            res.errors.push_back({{}, "the simulation stopped before the end of the step", ""});
            return res;
        }
    }
    const plan::ExecTimes times = mean_of(draws);
    // A thread's time on a core where ranks share a host's CPU cores (not where they take turns
    // on its GPUs).
    const bool cores = !cal.gpu();
    Timeline t;
    t.graph = g;
    t.cost = o.cost;
    t.pace_draws = static_cast<int32_t>(paces.size());
    if (t.pace_draws > 1) t.core_spread = cal.core_spread;
    for (const auto& ends : times.end)
        for (double e : ends) t.makespan = std::max(t.makespan, e);
    double idle_total = 0;
    for (size_t r = 0; r < g.ranks.size(); ++r) {
        const PlanRank& rank = g.ranks[r];
        RankReport rep;
        rep.rank = rank.rank;
        for (const plan::ExecTimes::CollectiveRun& c : times.collectives[r])
            if (c.end > c.start) rep.collectives.push_back({c.action, c.start, c.end});
        bool first = true;
        for (size_t i = 0; i < rank.actions.size(); ++i) {
            const PlanAction& a = rank.actions[i];
            if (plan::is_exchange(a.kind))
                rep.exchanges.push_back({i, times.start[r][i], times.end[r][i]});
            if (!plan::is_compute(a.kind) && a.kind != ActionKind::step) continue;
            double s = times.start[r][i], e = times.end[r][i];
            if (e <= s && a.kind == ActionKind::step) continue;
            rep.spans.push_back({i, s, e, times.core_wait[r][i], cores ? times.on_core[r][i] : -1});
            rep.busy += e - s;
            if (first) rep.first_start = s;
            first = false;
            rep.last_end = std::max(rep.last_end, e);
        }
        rep.idle = t.makespan - rep.busy;
        idle_total += rep.idle;
        account_memory(g, rank, rep, static_cast<int64_t>(g.dp) * g.cp);
        t.ranks.push_back(std::move(rep));
    }
    t.bubble_fraction =
        t.makespan > 0 ? idle_total / (static_cast<double>(g.ranks.size()) * t.makespan) : 0.0;
    t.memory_limit_bytes = p.mesh.memory_bytes;
    if (o.cost == CostModel::profile) {
        t.step_time_s = t.makespan;
        double tokens = static_cast<double>(g.microbatch_tokens) * g.microbatches * g.dp;
        // Model FLOPs: every product once forward and twice backward (input and weight
        // gradients; the scores' gradient is two products each way), three times the forward;
        // what recomputation (or a flash kernel's backward) runs again is not counted (MFU, not
        // Korthikanti et al.'s hardware FLOPs utilization).
        double flops = 0;
        for (const PlanStage& s : g.stages) flops += 3 * s.flops_forward;
        flops *= static_cast<double>(g.microbatches) * g.dp * g.tp * g.cp;
        // Every rank's peak, of its own kind.
        double peak = 0;
        for (const PlanRank& r : g.ranks)
            peak += kinds.empty() ? pr.flops : kinds[static_cast<size_t>(r.pp)].flops;
        if (t.makespan > 0) {
            t.tokens_per_s = tokens / t.makespan;
            t.mfu = flops / (t.makespan * peak);
        }
    }
    t.shared_peak_bytes = shared_peak(t);
    if (t.memory_limit_bytes > 0) {
        t.shared_memory = p.mesh.profile.devices_per_host == 0;
        if (t.shared_memory) {
            t.fits = t.shared_peak_bytes <= t.memory_limit_bytes;
        } else {
            for (size_t r = 0; r < t.ranks.size(); ++r)
                t.fits = t.fits && t.ranks[r].peak_memory_bytes <= p.mesh.memory_of(g.ranks[r].pp);
        }
    }
    res.timeline = std::move(t);
    return res;
}

namespace {

/// The layout's stages on one replica's pipeline ranks (dp = tp = cp = 1), with the costs the
/// whole mesh's ranks would have.
struct PipelineGraph {
    Graph g;
    bool split = false; // the schedule splits backwards into I and W
    std::string error;
};

/// `actions`: with the schedule's actions (else the stages and empty ranks, for pricing:
/// where stages sit and whether backwards split do not depend on the microbatch count, so a
/// short schedule tells them).
PipelineGraph pipeline_graph(const Program& p, bool actions) {
    PipelineGraph out;
    const ScheduleSpec& s = p.schedule;
    const int32_t pp = static_cast<int32_t>(p.mesh.pp);
    const int32_t v = static_cast<int32_t>(s.virtual_stages);
    const int32_t m = static_cast<int32_t>(s.microbatches);
    const int32_t short_m = s.kind == ScheduleKind::custom ? m : std::min(m, 2 * pp);
    plan::ScheduleOrder order = plan::compile_schedule(s.kind, pp, actions ? m : short_m, v, s);
    if (!order.error.empty()) {
        out.error = order.error;
        return out;
    }
    std::vector<int64_t> partition =
        s.partition_given ? s.partition : plan::balanced_partition(p, pp * v, order.stage_rank);
    if (partition.size() != order.stage_rank.size()) {
        out.error = "the partition does not match the schedule's stages";
        return out;
    }
    for (const auto& list : order.ranks)
        for (const PlanAction& a : list)
            out.split = out.split || a.kind == ActionKind::backward_input;
    std::vector<PlanStage> stages = plan::build_stages(p, partition, order.stage_rank);
    if (actions) {
        // Two replicas when the mesh has several, so that the gradient reductions (and ZeRO's
        // gathers) are there, priced for the real group.
        const int32_t replicas = p.mesh.dp * p.mesh.cp > 1 ? 2 : 1;
        out.g = plan::assemble(order, std::move(stages), s.kind, replicas, 1, m, 1, 1,
                               static_cast<int32_t>(p.mesh.zero));
    } else {
        out.g.pp = pp;
        out.g.zero = static_cast<int32_t>(p.mesh.zero);
        out.g.microbatches = m;
        out.g.virtual_stages = v;
        out.g.stages = std::move(stages);
        for (int32_t r = 0; r < pp; ++r) {
            PlanRank rank;
            rank.rank = rank.pp = rank.host = r;
            out.g.ranks.push_back(rank);
        }
    }
    out.g.ep = static_cast<int32_t>(p.mesh.ep);
    out.g.recompute = p.schedule.recompute == Recompute::full;
    if (actions) plan::add_exchanges(out.g);
    out.g.microbatch_tokens = p.train.microbatch_size * p.model.context;
    out.g.bytes_per_element = p.train.precision == Precision::bf16 ? 2 : 4;
    out.g.tied_bytes = plan::tied_gradient_bytes(p, order.stage_rank);
    return out;
}

Axes bound_axes(const Program& p) {
    return {static_cast<int32_t>(p.mesh.dp),
            static_cast<int32_t>(p.mesh.tp),
            static_cast<int32_t>(p.mesh.pp),
            static_cast<int32_t>(p.mesh.cp),
            std::max<int64_t>(p.mesh.devices_per_host, 1),
            static_cast<int32_t>(p.mesh.ep)};
}

} // namespace

std::vector<StepBounds> busy_bounds(const Program& p, const std::vector<int64_t>& zeros) {
    std::vector<StepBounds> out(zeros.size());
    if (p.mesh.profile.calibration.cores > 0) return out; // shared cores: no cheap bound
    PipelineGraph pg = pipeline_graph(p, false);
    if (!pg.error.empty()) {
        for (StepBounds& b : out) b.error = pg.error;
        return out;
    }
    Graph& g = pg.g;
    Profile pr = profile_of(g, p, SimOptions{});
    plan::ExecCosts c = profile_costs(g, pr, bound_axes(p), kinds_of(g, p, SimOptions{}));
    // Each rank runs F and B (= I + W) of its stages once per microbatch, then STEP after
    // every rank's last backward (the gradient norm). Its first action waits for the forwards
    // of the stages before its earliest one; after its last backward (on some stage s), the
    // backwards of the stages before s still run, one after another; I only, when split.
    const size_t S = g.stages.size();
    std::vector<double> f(S), back(S), input(S);
    for (size_t i = 0; i < S; ++i) {
        const PlanRank& r = g.ranks[static_cast<size_t>(g.stages[i].pp)];
        PlanAction a;
        a.stage = static_cast<int32_t>(i);
        // Each with the all-to-alls it runs among its expert-parallel group.
        auto seconds = [&](ActionKind kind) {
            a.kind = kind;
            double t = c.compute(r, a);
            for (const PlanAction& x : plan::exchanges_of(g, a)) t += c.exchange(r, x);
            return t;
        };
        f[i] = seconds(ActionKind::forward);
        back[i] = seconds(ActionKind::backward);
        input[i] = seconds(ActionKind::backward_input);
    }
    double compute_end = 0;
    for (const PlanRank& r : g.ranks) {
        double busy = 0, forwards_inputs = 0;
        double lag = std::numeric_limits<double>::infinity(), tail = lag;
        double before_f = 0, before_b = 0;
        for (size_t i = 0; i < S; ++i) {
            if (g.stages[i].pp == r.pp) {
                busy += g.microbatches * (f[i] + back[i]);
                forwards_inputs += g.microbatches * (f[i] + input[i]);
                lag = std::min(lag, before_f);
                tail = std::min(tail, before_b);
            }
            before_f += f[i];
            before_b += pg.split ? input[i] : back[i];
        }
        if (lag == std::numeric_limits<double>::infinity()) continue; // no stage here
        compute_end = std::max(
            compute_end, lag + (pg.split ? std::max(busy, forwards_inputs + tail) : busy + tail));
    }
    // The ZeRO stage changes the optimizer step, the memory, and the data-parallel traffic.
    // A rank's collectives run one after another on its communication stream, and STEP waits
    // for them: each gradient bucket reduced once a step (under ZeRO 2 and 3 once a
    // microbatch), and under ZeRO 3 the stage's weights gathered before every forward and every
    // backward.
    const bool has_replicas = p.mesh.dp * p.mesh.cp > 1;
    for (size_t z = 0; z < zeros.size(); ++z) {
        StepBounds& b = out[z];
        g.zero = static_cast<int32_t>(zeros[z]);
        PlanAction step;
        step.kind = ActionKind::step;
        double min_step = std::numeric_limits<double>::infinity(), comm_end = 0;
        for (const PlanRank& r : g.ranks) {
            min_step = std::min(min_step, c.compute(r, step));
            if (!has_replicas) continue;
            double comm = 0;
            for (const PlanStage& st : g.stages) {
                if (st.pp != r.pp) continue;
                PlanAction a;
                a.stage = st.index;
                if (g.zero >= 2) { // every microbatch's gradients reduce-scattered
                    a.kind = ActionKind::reduce_scatter;
                    comm += static_cast<double>(g.microbatches) * c.reduction(r, a);
                } else {
                    a.kind = ActionKind::reduce_grad;
                    for (size_t k = 0; k < st.buckets.size(); ++k) {
                        a.microbatch = static_cast<int32_t>(k);
                        comm += c.reduction(r, a);
                    }
                }
                if (g.zero >= 3) {
                    a.microbatch = 0;
                    a.kind = ActionKind::gather_forward;
                    double gf = c.reduction(r, a);
                    a.kind = ActionKind::gather_backward;
                    comm += g.microbatches * (gf + c.reduction(r, a));
                }
            }
            comm_end = std::max(comm_end, comm);
        }
        b.busy = std::max(compute_end, comm_end) +
                 (min_step == std::numeric_limits<double>::infinity() ? 0 : min_step);
        // The memory floor: weights, gradients, optimizer state and buffers, and one
        // microbatch's activations.
        if (p.mesh.profile.devices_per_host > 0) {
            for (const PlanRank& r : g.ranks) {
                RankReport rep;
                account_memory(g, r, rep, p.mesh.dp * p.mesh.cp);
                // At its peak a rank holds at least one microbatch's activations of a stage,
                // and what its backward (or input gradient) holds beside them.
                int64_t activations = std::numeric_limits<int64_t>::max();
                for (const PlanStage& st : g.stages) {
                    if (st.pp != r.pp) continue;
                    activations = std::min(activations,
                                           st.activation_bytes + std::min(st.backward_working_bytes,
                                                                          st.input_working_bytes));
                }
                int64_t floor =
                    rep.peak_memory_bytes +
                    (activations == std::numeric_limits<int64_t>::max() ? 0 : activations);
                b.floor_bytes = std::max(b.floor_bytes, floor);
                b.fits = b.fits && floor <= p.mesh.memory_of(r.pp);
            }
        }
    }
    return out;
}

StepBounds busy_bound(const Program& p) {
    return busy_bounds(p, {p.mesh.zero})[0];
}

void pipeline_bound(const Program& p, StepBounds& b) {
    if (p.mesh.profile.calibration.cores > 0 || !b.error.empty()) return;
    PipelineGraph pg = pipeline_graph(p, true);
    if (!pg.error.empty()) {
        b.error = pg.error;
        return;
    }
    Profile pr = profile_of(pg.g, p, SimOptions{});
    plan::ExecTimes times = plan::execute(
        pg.g, profile_costs(pg.g, pr, bound_axes(p), kinds_of(pg.g, p, SimOptions{})));
    if (!times.complete) {
        b.error = "the schedule does not complete";
        return;
    }
    b.pipeline = 0;
    for (const auto& ends : times.end)
        for (double e : ends) b.pipeline = std::max(b.pipeline, e);
    // Memory: each pipeline rank runs the same actions in the same order as in the whole mesh,
    // so its peak is the mesh's (ZeRO shares state over the real replica group). A CPU mesh's
    // ranks share one memory: that sum needs every rank, so it waits for the simulation.
    if (p.mesh.profile.devices_per_host == 0) return;
    const int64_t replicas = p.mesh.dp * p.mesh.cp;
    for (size_t r = 0; r < pg.g.ranks.size(); ++r) {
        RankReport rep;
        const PlanRank& rank = pg.g.ranks[r];
        for (size_t i = 0; i < rank.actions.size(); ++i)
            if (plan::is_compute(rank.actions[i].kind))
                rep.spans.push_back({i, times.start[r][i], times.end[r][i]});
        account_memory(pg.g, rank, rep, replicas);
        b.peak_bytes = std::max(b.peak_bytes, rep.peak_memory_bytes);
        b.fits = b.fits && rep.peak_memory_bytes <= p.mesh.memory_of(rank.pp);
    }
    b.memory_known = true;
}

} // namespace dist::sim
