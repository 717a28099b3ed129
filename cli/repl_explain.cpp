// repl_explain.cpp: `explain`: why the simulated step takes as long as it does.
//
// Derived from the Timeline's spans (when each compute action ran) and the Graph's dependencies
// (the receives, reductions and their producers in every rank's action list): every idle gap
// before a compute action is put down to what the rank was waiting for (an activation from the
// previous stage's rank, a gradient from the next one's, the data-parallel reduction, the start
// of the pipeline), and the critical path is walked back from the action that ends last, each
// step to the dependency that finished latest.
#include "cli/repl.hpp"
#include "cli/repl_format.hpp"

#include <algorithm>
#include <map>
#include <ostream>
#include <unordered_map>

namespace dist::cli {

namespace {

using plan::ActionKind;
using plan::PlanAction;

enum class Cause {
    warmup,
    activation,
    gradient,
    dp_reduction,
    tied,
    norm,
    transfer,
    core,
    cooldown
};

struct Wait {
    Cause cause = Cause::transfer;
    int32_t peer = -1;      // the rank waited for
    int32_t from_rank = -1; // the dependency that finished last: its rank and span
    size_t from_span = 0;
    int32_t microbatch = -1;
};

class Explainer {
  public:
    explicit Explainer(const sim::Timeline& t) : t_(t), g_(t.graph), produced_(g_.ranks.size()) {
        // Which span produced each activation (F) and each input gradient (B or I).
        for (size_t r = 0; r < t_.ranks.size(); ++r) {
            const auto& spans = t_.ranks[r].spans;
            for (size_t k = 0; k < spans.size(); ++k) {
                const PlanAction& a = action(static_cast<int32_t>(r), k);
                if (a.kind == ActionKind::forward)
                    produced_[r][key(a.stage, a.microbatch, false)] = k;
                if (a.kind == ActionKind::backward || a.kind == ActionKind::backward_input)
                    produced_[r][key(a.stage, a.microbatch, true)] = k;
            }
        }
    }

    const PlanAction& action(int32_t rank, size_t span) const {
        size_t r = static_cast<size_t>(rank);
        return g_.ranks[r].actions[t_.ranks[r].spans[span].action];
    }
    const sim::Span& span(int32_t rank, size_t k) const {
        return t_.ranks[static_cast<size_t>(rank)].spans[k];
    }

    /// What span k of `rank` waited for before it started. `follow_reductions` also finds the
    /// data-parallel peer that reached the reduction last (a scan of its actions).
    Wait wait_before(int32_t rank, size_t k, bool follow_reductions) const {
        const auto& actions = g_.ranks[static_cast<size_t>(rank)].actions;
        const auto& spans = t_.ranks[static_cast<size_t>(rank)].spans;
        size_t lo = k > 0 ? spans[k - 1].action + 1 : 0, hi = spans[k].action;
        Wait w;
        w.cause = k == 0 ? Cause::warmup : Cause::transfer;
        // Only a dependency that finished after the rank's previous action kept it waiting;
        // otherwise the gap is the transfer itself.
        double latest = k > 0 ? spans[k - 1].end : 0.0;
        bool reduction = false;
        for (size_t i = lo; i < hi; ++i) {
            const PlanAction& a = actions[i];
            bool fwd = a.kind == ActionKind::recv_forward,
                 bwd = a.kind == ActionKind::recv_backward;
            if (fwd || bwd) {
                const auto& made = produced_[static_cast<size_t>(a.peer)];
                auto it = made.find(key(fwd ? a.stage - 1 : a.stage + 1, a.microbatch, bwd));
                if (it == made.end()) continue;
                double end = span(a.peer, it->second).end;
                if (end > latest) {
                    latest = end;
                    w.cause = k == 0 ? Cause::warmup : fwd ? Cause::activation : Cause::gradient;
                    w.peer = w.from_rank = a.peer;
                    w.from_span = it->second;
                    w.microbatch = a.microbatch;
                }
            }
            if (plan::is_dp_collective(a.kind)) {
                reduction = true;
                if (follow_reductions) follow_reduction(rank, a, latest, w);
            }
        }
        if (w.peer < 0 && reduction) w.cause = Cause::dp_reduction;
        if (actions[hi].kind == ActionKind::step) {
            // The first and the last stage's ranks sum their copies of a tied embedding before
            // the norm.
            const int32_t pp = g_.ranks[static_cast<size_t>(rank)].pp;
            if (w.peer < 0 && !reduction && g_.tied_bytes > 0 &&
                (pp == g_.stages.front().pp || pp == g_.stages.back().pp))
                w.cause = Cause::tied;
            follow_norm(rank, latest, w);
        }
        return w;
    }

  private:
    // The update waits for the gradient norm, an all-reduce over the model replica (every rank
    // under ZeRO): the member whose last action before STEP ends last holds it up.
    void follow_norm(int32_t rank, double& latest, Wait& w) const {
        const plan::PlanRank& me = g_.ranks[static_cast<size_t>(rank)];
        for (const plan::PlanRank& q : g_.ranks) {
            if (q.rank == rank || (g_.zero == 0 && (q.dp != me.dp || q.cp != me.cp))) continue;
            const auto& qs = t_.ranks[static_cast<size_t>(q.rank)].spans;
            // Its last span before its own STEP.
            if (qs.empty()) continue;
            size_t k = qs.size() - 1;
            const auto& qa = g_.ranks[static_cast<size_t>(q.rank)].actions;
            if (qa[qs[k].action].kind == ActionKind::step) {
                if (k == 0) continue;
                --k;
            }
            if (qs[k].end > latest) {
                latest = qs[k].end;
                w.cause = Cause::norm;
                w.peer = w.from_rank = q.rank;
                w.from_span = k;
            }
        }
    }

    static uint64_t key(int32_t stage, int32_t microbatch, bool grad) {
        return (static_cast<uint64_t>(static_cast<uint32_t>(stage)) << 33) |
               (static_cast<uint64_t>(static_cast<uint32_t>(microbatch)) << 1) | (grad ? 1 : 0);
    }

    // The peers of a reduction: the data-parallel group, or the first and last stage's ranks.
    void follow_reduction(int32_t rank, const PlanAction& a, double& latest, Wait& w) const {
        const plan::PlanRank& me = g_.ranks[static_cast<size_t>(rank)];
        std::vector<int32_t> peers = g_.replica_group(me);
        for (int32_t q : peers) {
            if (q == rank) continue;
            const auto& qa = g_.ranks[static_cast<size_t>(q)].actions;
            // The same gradient bucket of the same stage.
            auto at = std::find_if(qa.begin(), qa.end(), [&](const PlanAction& b) {
                return b.kind == a.kind && b.microbatch == a.microbatch && b.stage == a.stage;
            });
            if (at == qa.end()) continue;
            size_t index = static_cast<size_t>(at - qa.begin());
            const auto& qs = t_.ranks[static_cast<size_t>(q)].spans;
            // The last compute span before the peer's reduction.
            auto after =
                std::lower_bound(qs.begin(), qs.end(), index,
                                 [](const sim::Span& s, size_t i) { return s.action < i; });
            if (after == qs.begin()) continue;
            size_t k = static_cast<size_t>(after - qs.begin()) - 1;
            if (qs[k].end > latest) {
                latest = qs[k].end;
                w.cause = Cause::dp_reduction;
                w.peer = w.from_rank = q;
                w.from_span = k;
            }
        }
    }

    const sim::Timeline& t_;
    const plan::Graph& g_;
    std::vector<std::unordered_map<uint64_t, size_t>> produced_;
};

std::string cause_text(Cause c, int32_t peer) {
    std::string p = std::to_string(peer);
    switch (c) {
    case Cause::warmup:
        return peer >= 0 ? "warm-up: waiting for the first activation from rank " + p
                         : "warm-up: nothing to do before the step's first action";
    case Cause::activation: return "waiting for an activation from rank " + p;
    case Cause::gradient: return "waiting for a gradient from rank " + p;
    case Cause::dp_reduction:
        return "in the data-parallel gradient reduction" +
               (peer >= 0 ? ", waiting for rank " + p : std::string());
    case Cause::tied: return "summing the tied embedding's copies of the first and last stage";
    case Cause::norm:
        return "waiting for the gradient norm before the update: rank " + p +
               " of the replica finishes last";
    case Cause::transfer: return "in transit: the transfers' own time";
    case Cause::core: return "waiting for a core: the host's ranks outnumber its cores";
    case Cause::cooldown: return "cool-down: its work is done while other ranks finish";
    }
    return "";
}

void explain_critical_path(const sim::Timeline& t, const Explainer& ex, std::ostream& out) {
    // The compute span that ends last.
    int32_t rank = -1;
    size_t k = 0;
    double last = -1;
    for (const sim::RankReport& r : t.ranks)
        for (size_t i = 0; i < r.spans.size(); ++i)
            if (r.spans[i].end > last + 1e-15) {
                last = r.spans[i].end;
                rank = r.rank;
                k = i;
            }
    if (rank < 0) {
        out << "the step runs no compute action\n";
        return;
    }
    // Walk back; each node is a run of consecutive spans on one rank.
    struct Segment {
        int32_t rank;
        size_t first, last;
        Wait via; // how the segment was reached
        bool reached = false;
    };
    std::vector<Segment> path{{rank, k, k, {}, false}};
    double compute = 0;
    for (size_t guard = 0; guard < 1000000; ++guard) {
        const sim::Span& s = ex.span(rank, k);
        compute += s.end - s.start;
        double prev_end = k > 0 ? ex.span(rank, k - 1).end : 0.0;
        Wait w = ex.wait_before(rank, k, true);
        bool elsewhere = w.from_rank >= 0 && ex.span(w.from_rank, w.from_span).end > prev_end;
        if (s.start - prev_end > 1e-12 * std::max(1.0, t.makespan) && elsewhere) {
            path.back().via = w;
            path.back().reached = true;
            rank = w.from_rank;
            k = w.from_span;
            path.push_back({rank, k, k, {}, false});
        } else if (k > 0) {
            path.back().first = --k;
        } else {
            break;
        }
    }
    std::reverse(path.begin(), path.end());
    out << "critical path (" << time_text(t, t.makespan) << "): compute " << time_text(t, compute)
        << ", waiting and transfers " << time_text(t, t.makespan - compute) << "; " << path.size()
        << (path.size() == 1 ? " run" : " runs") << " of actions, each on one rank:\n";
    const size_t show = 24;
    for (size_t i = 0; i < path.size(); ++i) {
        if (path.size() > show && i == show / 2) {
            out << "  ... " << path.size() - show << " more runs ...\n";
            i = path.size() - show / 2 - 1;
            continue;
        }
        const Segment& sg = path[i];
        if (sg.reached && i > 0) {
            const Segment& before = path[i - 1];
            std::string what = sg.via.cause == Cause::dp_reduction ? "data-parallel reduction"
                               : sg.via.cause == Cause::norm       ? "gradient norm"
                               : sg.via.cause == Cause::gradient   ? "gradient"
                                                                   : "activation";
            out << "    -> " << what;
            if (sg.via.microbatch >= 0) out << " of microbatch " << sg.via.microbatch;
            out << " to rank " << sg.rank << ", which starts "
                << time_text(t, ex.span(sg.rank, sg.first).start -
                                    ex.span(before.rank, before.last).end)
                << " later\n";
        }
        out << "  rank " << sg.rank << "  " << plan::to_string(ex.action(sg.rank, sg.first));
        if (sg.last != sg.first)
            out << " .. " << plan::to_string(ex.action(sg.rank, sg.last)) << " ("
                << sg.last - sg.first + 1 << " actions)";
        out << "  " << time_text(t, ex.span(sg.rank, sg.first).start) << " - "
            << time_text(t, ex.span(sg.rank, sg.last).end) << "\n";
    }
}

// One rank's idle time, by cause and peer.
std::map<std::pair<Cause, int32_t>, std::pair<double, int>>
idle_of(const sim::Timeline& t, const Explainer& ex, int32_t rank) {
    std::map<std::pair<Cause, int32_t>, std::pair<double, int>> out;
    const auto& spans = t.ranks[static_cast<size_t>(rank)].spans;
    double prev = 0;
    for (size_t k = 0; k < spans.size(); ++k) {
        double gap = spans[k].start - prev;
        prev = std::max(prev, spans[k].end);
        // The end of the gap, when the action could have begun but its thread had no core.
        const double core = std::min(std::max(gap, 0.0), spans[k].core_wait);
        if (core > 1e-12 * std::max(1.0, t.makespan)) {
            auto& slot = out[{Cause::core, -1}];
            slot.first += core;
            slot.second += 1;
            gap -= core;
        }
        if (gap <= 1e-12 * std::max(1.0, t.makespan)) continue;
        Wait w = ex.wait_before(rank, k, true);
        auto& slot = out[{w.cause, w.peer}];
        slot.first += gap;
        slot.second += 1;
    }
    if (t.makespan - prev > 1e-12 * std::max(1.0, t.makespan))
        out[{Cause::cooldown, -1}] = {t.makespan - prev, 1};
    return out;
}

} // namespace

void ReplSession::cmd_explain() {
    const sim::Timeline* timeline = current_timeline();
    if (!timeline) return;
    const sim::Timeline& t = *timeline;
    const plan::Graph& g = t.graph;
    Explainer ex(t);
    explain_critical_path(t, ex, out_);

    out_ << "\nwhere the ranks idle (bubble " << percent_text(t.bubble_fraction) << ")";
    if (g.dp > 1 || g.tp > 1) out_ << ", along the pipeline of dp 0, tp 0";
    out_ << ":\n";
    std::vector<double> idle_at_pp(static_cast<size_t>(g.pp), 0.0);
    for (int32_t pp = 0; pp < g.pp; ++pp) {
        int32_t rank = g.rank_of(0, pp, 0);
        const sim::RankReport& r = t.ranks[static_cast<size_t>(rank)];
        idle_at_pp[static_cast<size_t>(pp)] = r.idle;
        out_ << "  rank " << rank << " (pp " << pp << "): busy " << time_text(t, r.busy)
             << ", idle " << time_text(t, r.idle) << " ("
             << percent_text(t.makespan > 0 ? r.idle / t.makespan : 0.0) << ")\n";
        auto causes = idle_of(t, ex, rank);
        std::vector<std::pair<std::pair<Cause, int32_t>, std::pair<double, int>>> sorted(
            causes.begin(), causes.end());
        std::stable_sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) {
            return a.second.first > b.second.first;
        });
        for (const auto& [what, amount] : sorted) {
            out_ << "    " << time_text(t, amount.first) << "  "
                 << cause_text(what.first, what.second);
            if (amount.second > 1) out_ << " (" << amount.second << " times)";
            out_ << "\n";
        }
    }
    if (g.dp > 1 || g.tp > 1) {
        double spread = 0;
        for (const sim::RankReport& r : t.ranks) {
            const plan::PlanRank& pr = g.ranks[static_cast<size_t>(r.rank)];
            spread = std::max(spread, std::abs(r.idle - idle_at_pp[static_cast<size_t>(pr.pp)]));
        }
        out_ << "  the other " << t.ranks.size() - static_cast<size_t>(g.pp)
             << " ranks (dp and tp replicas) idle as the rank of their pipeline stage above, "
                "within "
             << time_text(t, spread) << "\n";
    }
    if (last_measured_ && last_measured_->graph == g && t.cost == sim::CostModel::profile)
        out_ << "\nthe last `run`'s step beside this prediction (" << program_->mesh.profile.name
             << " profile): " << sim::disagreement_text(*last_measured_, t);
}

} // namespace dist::cli
