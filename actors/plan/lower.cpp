// lower.cpp: Program -> Graph. The schedule compilers give each pipeline rank its compute
// order; here that order is replicated over the data- and tensor-parallel axes and the
// communication that a real step needs is inserted around it.
#include "actors/plan/lower.hpp"

#include "actors/plan/stages.hpp"
#include "actors/plan/verify.hpp"

#include <algorithm>
#include <map>

namespace dist::plan {

namespace {

PlanAction comm(ActionKind kind, int32_t stage, int32_t mb, int32_t peer) {
    PlanAction a;
    a.kind = kind;
    a.stage = stage;
    a.microbatch = mb;
    a.peer = peer;
    return a;
}

} // namespace

Graph assemble(const ScheduleOrder& order, std::vector<PlanStage> stages, ScheduleKind kind,
               int32_t dp, int32_t tp, int32_t microbatches, int32_t devices_per_host, int32_t cp,
               int32_t zero) {
    Graph g;
    g.schedule = kind;
    g.dp = dp;
    g.tp = tp;
    g.cp = cp;
    g.zero = zero;
    g.pp = static_cast<int32_t>(order.ranks.size());
    g.virtual_stages = g.pp > 0 ? static_cast<int32_t>(order.stage_rank.size()) / g.pp : 1;
    g.microbatches = microbatches;
    g.stages = std::move(stages);
    const int32_t S = g.num_stages();
    auto rank_of_stage = [&](int32_t s) { return order.stage_rank[static_cast<size_t>(s)]; };
    for (int32_t d = 0; d < dp; ++d) {
        for (int32_t pp = 0; pp < g.pp; ++pp) {
            for (int32_t c = 0; c < cp; ++c) {
                for (int32_t t = 0; t < tp; ++t) {
                    PlanRank r;
                    r.rank = g.rank_of(d, pp, t, c);
                    r.dp = d;
                    r.pp = pp;
                    r.tp = t;
                    r.cp = c;
                    r.host = devices_per_host > 0 ? r.rank / devices_per_host : 0;
                    g.ranks.push_back(std::move(r));
                }
            }
        }
    }
    for (PlanRank& r : g.ranks) {
        const std::vector<PlanAction>& compute = order.ranks[static_cast<size_t>(r.pp)];
        // The last action that writes each stage's gradients: its buckets are final after it.
        std::map<int32_t, size_t> last_grad;
        for (size_t i = 0; i < compute.size(); ++i) {
            const PlanAction& a = compute[i];
            if (a.kind == ActionKind::backward || a.kind == ActionKind::backward_weight)
                last_grad[a.stage] = i;
        }
        auto peer = [&](int32_t stage) {
            return g.rank_of(r.dp, rank_of_stage(stage), r.tp, r.cp);
        };
        const bool reduces = dp * cp > 1;
        auto remote = [&](int32_t stage) {
            return stage >= 0 && stage < S && rank_of_stage(stage) != r.pp;
        };
        std::vector<PlanAction> out;
        // An overlapped pair is one unit: its receives before it, its sends after it.
        auto unit_end = [&](size_t i) {
            size_t end = i + 1;
            while (end < compute.size() && compute[end - 1].overlap_next) ++end;
            return end;
        };
        // ZeRO 3: the weights for the forwards and backwards of the unit at i, gathered before
        // the unit ahead of it starts, so that the gathers run behind it.
        auto gathers = [&](size_t i) {
            if (zero < 3 || !reduces) return;
            for (size_t k = i; k < unit_end(i); ++k) {
                const PlanAction& a = compute[k];
                if (a.kind == ActionKind::forward)
                    out.push_back(comm(ActionKind::gather_forward, a.stage, a.microbatch, -1));
                else if (a.kind == ActionKind::backward || a.kind == ActionKind::backward_input)
                    out.push_back(comm(ActionKind::gather_backward, a.stage, a.microbatch, -1));
            }
        };
        if (!compute.empty()) gathers(0);
        for (size_t i = 0; i < compute.size();) {
            size_t end = unit_end(i);
            if (end < compute.size()) gathers(end);
            for (size_t k = i; k < end; ++k) {
                const PlanAction& a = compute[k];
                if (a.kind == ActionKind::forward && remote(a.stage - 1))
                    out.push_back(
                        comm(ActionKind::recv_forward, a.stage, a.microbatch, peer(a.stage - 1)));
                bool grad_in =
                    a.kind == ActionKind::backward || a.kind == ActionKind::backward_input;
                if (grad_in && remote(a.stage + 1))
                    out.push_back(
                        comm(ActionKind::recv_backward, a.stage, a.microbatch, peer(a.stage + 1)));
            }
            for (size_t k = i; k < end; ++k) out.push_back(compute[k]);
            for (size_t k = i; k < end; ++k) {
                const PlanAction& a = compute[k];
                if (a.kind == ActionKind::forward && remote(a.stage + 1))
                    out.push_back(
                        comm(ActionKind::send_forward, a.stage, a.microbatch, peer(a.stage + 1)));
                bool grad_out =
                    a.kind == ActionKind::backward || a.kind == ActionKind::backward_input;
                if (grad_out && remote(a.stage - 1))
                    out.push_back(
                        comm(ActionKind::send_backward, a.stage, a.microbatch, peer(a.stage - 1)));
            }
            // A stage's gradient buckets, all-reduced once its last weight gradient is in; or
            // under ZeRO 2 and 3 each microbatch's gradients of the stage, reduce-scattered
            // after every action that writes them (unit by unit as the backward leaves them:
            // docs/training.md).
            for (size_t k = i; k < end; ++k) {
                const PlanAction& a = compute[k];
                auto it = last_grad.find(a.stage);
                if (!reduces || it == last_grad.end()) continue;
                if (zero >= 2) {
                    if (a.kind == ActionKind::backward || a.kind == ActionKind::backward_weight)
                        out.push_back(comm(ActionKind::reduce_scatter, a.stage, a.microbatch, -1));
                    continue;
                }
                if (it->second != k) continue;
                const PlanStage& st = g.stages[static_cast<size_t>(a.stage)];
                for (size_t b = 0; b < st.buckets.size(); ++b)
                    out.push_back(
                        comm(ActionKind::reduce_grad, st.index, static_cast<int32_t>(b), -1));
            }
            i = end;
        }
        PlanAction step;
        step.kind = ActionKind::step;
        out.push_back(step);
        r.actions = std::move(out);
    }
    return g;
}

PlanResult schedule_graph(ScheduleKind kind, int32_t p, int32_t m, int32_t v) {
    PlanResult res;
    ScheduleOrder order = compile_schedule(kind, p, m, v);
    if (!order.error.empty()) {
        res.errors.push_back({{}, order.error, order.hint});
        return res;
    }
    std::vector<PlanStage> stages(order.stage_rank.size());
    for (size_t s = 0; s < stages.size(); ++s) {
        stages[s].index = static_cast<int32_t>(s);
        stages[s].pp = order.stage_rank[s];
        stages[s].first_block = static_cast<int32_t>(s);
        stages[s].blocks = 1;
        stages[s].embedding = s == 0;
        stages[s].head = s + 1 == stages.size();
    }
    Graph g = assemble(order, std::move(stages), kind, 1, 1, m, 0);
    res.errors = verify(g);
    if (res.errors.empty()) res.graph = std::move(g);
    return res;
}

PlanResult lower(const Program& p, bool verify_graph) {
    PlanResult res;
    const ScheduleSpec& s = p.schedule;
    const int32_t pp = static_cast<int32_t>(p.mesh.pp);
    const int32_t v = static_cast<int32_t>(s.virtual_stages);
    const int32_t m = static_cast<int32_t>(s.microbatches);
    ScheduleOrder order = compile_schedule(s.kind, pp, m, v, s);
    if (!order.error.empty()) {
        res.errors.push_back({{}, order.error, order.hint});
        return res;
    }
    std::vector<int64_t> partition = s.partition;
    if (!s.partition_given) partition = balanced_partition(p, pp * v, order.stage_rank);
    if (partition.size() != order.stage_rank.size()) {
        res.errors.push_back({{},
                              "the partition has " + std::to_string(partition.size()) +
                                  " entries for " + std::to_string(order.stage_rank.size()) +
                                  " stages",
                              ""});
        return res;
    }
    Graph g = assemble(order, build_stages(p, partition, order.stage_rank), s.kind,
                       static_cast<int32_t>(p.mesh.dp), static_cast<int32_t>(p.mesh.tp), m,
                       static_cast<int32_t>(p.mesh.devices_per_host),
                       static_cast<int32_t>(p.mesh.cp), static_cast<int32_t>(p.mesh.zero));
    g.sp = p.mesh.sp;
    g.ep = static_cast<int32_t>(p.mesh.ep);
    g.recompute = p.schedule.recompute == Recompute::full;
    add_exchanges(g);
    g.file = p.file;
    g.partition_given = s.partition_given;
    g.microbatch_tokens = p.train.microbatch_size * p.model.context;
    g.bytes_per_element = p.train.precision == Precision::bf16 ? 2 : 4;
    // GPT-2's head shares the embedding: when they sit on different ranks each keeps a copy,
    // and STEP sums the two copies' gradients, as Megatron-LM does.
    g.tied_bytes = tied_gradient_bytes(p, order.stage_rank);
    if (verify_graph) res.errors = verify(g);
    if (res.errors.empty()) res.graph = std::move(g);
    return res;
}

std::string render_errors(const std::string& file, const std::vector<PlanError>& errors) {
    std::string out;
    for (const PlanError& e : errors) {
        if (e.loc.valid())
            out += file + ":" + std::to_string(e.loc.line) + ":" + std::to_string(e.loc.col) + ": ";
        out += "error: " + e.message + "\n";
        if (!e.hint.empty()) out += "hint: " + e.hint + "\n";
    }
    return out;
}

} // namespace dist::plan
