// execute.cpp: a fixpoint over the ranks. Each pass advances every rank as far as its next
// receive's message or its step's reductions allow; an action's start is the later of its
// rank's clock and what it waits for, so the times are those of the longest path through the
// graph. When a pass advances nothing and a rank is unfinished, the graph is stuck.
#include "actors/plan/execute.hpp"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
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

// Data-parallel collectives (reductions, ZeRO's gathers and reduce-scatters): the k-th one of
// each group starts once every member has entered it and the members' communication streams
// are free.
//
// ZeRO 2 and 3 run theirs unit by unit (a residual group, or a layer outside one), as the
// runtime does: GATHER_F / GATHER_B gather the first unit of the coming pass; the compute
// action gathers each next unit as it starts one (so the rest of its gathers are queued once
// it starts, not at GATHER), and a pass that writes weight gradients reduce-scatters each unit
// once it is done (the rest of them inside the action, ahead of the next gathers on the
// stream; REDUCE_SCATTER keeps the last unit's). A compute action's rest is its own collective
// (two: the gathers, then the reduce-scatters), which its members enter when they start it.
struct Collectives {
    const Graph& g;
    const ExecCosts& costs;
    std::vector<double> comm_free;
    std::vector<int32_t> entered;                                       // per rank
    std::map<std::pair<int32_t, int32_t>, std::vector<double>> entries; // (group, k) -> times
    std::map<std::pair<int32_t, int32_t>, double> finished, begun;
    std::vector<std::vector<size_t>> action_of; // per rank: the action of each collective k
    // ZeRO 3: the collective number and action of the gather a compute action waits for.
    using GatherKey = std::tuple<int32_t, int32_t, bool>; // stage, microbatch, forward
    std::vector<std::map<GatherKey, std::pair<int32_t, size_t>>> gathered;
    // ZeRO 2 and 3: the (stage, microbatch) whose REDUCE_SCATTER has only its last unit left.
    std::vector<std::set<std::pair<int32_t, int32_t>>> scattered;
    // Per rank: the compute action (its position and start) whose rest it entered, the rest's
    // last collective (-1: none) and the seconds the action runs beyond its end.
    struct Rest {
        size_t pos = 0;
        double start = 0;
        int32_t last = -1;
        double tail = 0;
    };
    std::vector<std::optional<Rest>> rest;
    std::vector<int32_t> overlap_from; // per rank: its first collective not over (slowed_end)

    // Where a host's cores are shared (execute_shared): a collective's members are threads
    // that keep a core of their host busy while it runs (the communication threads pack, reduce
    // and copy back on the CPU). Its time, calibrated with only its members busy, stretches by
    // the threads busy on its hosts when it starts. The collectives whose last member enters
    // are settled together once every rank has gone as far as it can at that time (settle).
    bool shared = false;
    struct Running {
        double begin, end;
        std::map<int32_t, double> threads; // per host: its members there
    };
    std::vector<Running> running;
    struct Unsettled {
        std::pair<int32_t, int32_t> key;
        double ready, seconds;
        std::vector<int32_t> members;
        double wait = 0; // ExecCosts::reduction_wait
    };
    std::vector<Unsettled> unsettled;

    Collectives(const Graph& graph, const ExecCosts& c)
        : g(graph), costs(c), comm_free(graph.ranks.size(), 0.0), entered(graph.ranks.size(), 0),
          action_of(graph.ranks.size()), gathered(graph.ranks.size()),
          scattered(graph.ranks.size()), rest(graph.ranks.size()),
          overlap_from(graph.ranks.size(), 0) {}

    /// The member threads of the collectives running at `at` on each host.
    std::map<int32_t, double> threads_at(double at) const {
        std::map<int32_t, double> out;
        for (const Running& c : running)
            if (c.begin <= at && at < c.end)
                for (auto [host, n] : c.threads) out[host] += n;
        return out;
    }

    /// Starts the collectives entered at `now`, in order, each stretched by the compute threads
    /// busy on its hosts (`computing`), the collectives running there and the ones starting with
    /// it. Returns whether there were any.
    bool settle(double now, std::map<int32_t, double> on) {
        if (unsettled.empty()) return false;
        for (auto [host, k] : threads_at(now)) on[host] += k;
        auto hosts = [&](const std::vector<int32_t>& members) {
            std::map<int32_t, double> mine;
            for (int32_t m : members) mine[g.ranks[static_cast<size_t>(m)].host] += 1;
            return mine;
        };
        // The ones that start now: their members' streams free, and not behind another one.
        std::set<int32_t> claimed;
        for (const Unsettled& u : unsettled) {
            bool now_free = u.seconds > 0;
            for (int32_t m : u.members)
                now_free = now_free && comm_free[static_cast<size_t>(m)] <= now &&
                           claimed.insert(m).second;
            if (now_free)
                for (auto [host, k] : hosts(u.members)) on[host] += k;
        }
        for (const Unsettled& u : unsettled) {
            double start = u.ready, seconds = u.seconds;
            for (int32_t m : u.members) start = std::max(start, comm_free[static_cast<size_t>(m)]);
            Running run{start, start, hosts(u.members)};
            // Members that wait for cores the others fill (ExecCosts::reduction_wait) are
            // priced by that wait, not stretched as well.
            bool waits = false;
            for (auto [host, k] : run.threads)
                waits = waits || (u.wait > 0 && costs.cores > 0 && on[host] - k >= costs.cores);
            if (waits)
                seconds += u.wait;
            else
                for (auto [host, k] : run.threads)
                    seconds = std::max(seconds, u.seconds * costs.speed(k) / costs.speed(on[host]));
            run.end = start + seconds;
            for (int32_t m : u.members) comm_free[static_cast<size_t>(m)] = run.end;
            finished[u.key] = run.end;
            begun[u.key] = start;
            if (seconds > 0) running.push_back(std::move(run));
        }
        unsettled.clear();
        return true;
    }

    int32_t group_of(const PlanRank& r) const { return r.pp * g.tp + r.tp; }

    static int32_t units(const Graph& g, int32_t stage) {
        return std::max(1, g.stages[static_cast<size_t>(stage)].units);
    }

    /// Rank `r` enters collective action `a` (at `index` in its list) at `at`; returns its end
    /// once known (else -1: not all members have entered, or it is settled later). A gather
    /// runs the first unit; a reduce-scatter whose backward ran the others, the last.
    double enter(const PlanRank& rank, const PlanAction& a, size_t index, double at) {
        const size_t r = static_cast<size_t>(rank.rank);
        double share = 1;
        if (a.kind == ActionKind::gather_forward || a.kind == ActionKind::gather_backward) {
            gathered[r][{a.stage, a.microbatch, a.kind == ActionKind::gather_forward}] = {
                entered[r], index};
            share = 1.0 / units(g, a.stage);
        } else if (a.kind == ActionKind::reduce_scatter &&
                   scattered[r].erase({a.stage, a.microbatch}) > 0) {
            share = 1.0 / units(g, a.stage);
        }
        return queue(rank, index, at, share * costs.reduction(rank, a),
                     costs.reduction_wait ? share * costs.reduction_wait(rank, a) : 0.0);
    }

    /// When the first unit of the weights compute action `a` needs has arrived (0: it needs no
    /// gather), or -1 while that gather has not settled.
    double first_in(const PlanRank& rank, const PlanAction& a) const {
        if (a.kind == ActionKind::backward_weight) return 0;
        const auto& mine = gathered[static_cast<size_t>(rank.rank)];
        auto it = mine.find({a.stage, a.microbatch, a.kind == ActionKind::forward});
        if (it == mine.end()) return 0;
        auto fin = finished.find({group_of(rank), it->second.first});
        return fin == finished.end() ? -1.0 : fin->second;
    }

    /// Rank `rank` starts compute action `a` (at `pos`, `compute` seconds) at `at`: it enters
    /// the rest of its unit-by-unit gathers and reduce-scatters (once; later calls do nothing).
    /// Returns the action's start: `at` at the first call.
    double begin(const PlanRank& rank, const PlanAction& a, size_t pos, double at, double compute) {
        const size_t r = static_cast<size_t>(rank.rank);
        if (rest[r] && rest[r]->pos == pos) return rest[r]->start;
        Rest out;
        out.pos = pos;
        out.start = at;
        const double n = units(g, a.stage), unit = compute / n;
        auto& mine = gathered[r];
        double gathers = 0, scatters = 0;
        if (a.kind != ActionKind::backward_weight) {
            auto it = mine.find({a.stage, a.microbatch, a.kind == ActionKind::forward});
            if (it != mine.end()) {
                if (n > 1) {
                    const PlanAction& gather = rank.actions[it->second.second];
                    gathers = costs.reduction(rank, gather) * (n - 1) / n;
                    queue(rank, it->second.second, at, gathers,
                          costs.reduction_wait ? costs.reduction_wait(rank, gather) * (n - 1) / n
                                               : 0.0);
                    out.last = entered[r] - 1;
                }
                mine.erase(it);
            }
        }
        if (n > 1 && (a.kind == ActionKind::backward || a.kind == ActionKind::backward_weight)) {
            for (size_t i = pos + 1; i < rank.actions.size(); ++i) {
                const PlanAction& s = rank.actions[i];
                if (s.kind != ActionKind::reduce_scatter || s.stage != a.stage ||
                    s.microbatch != a.microbatch)
                    continue;
                scatters = costs.reduction(rank, s) * (n - 1) / n;
                queue(rank, i, at, scatters,
                      costs.reduction_wait ? costs.reduction_wait(rank, s) * (n - 1) / n : 0.0);
                out.last = entered[r] - 1;
                scattered[r].insert({a.stage, a.microbatch});
                break;
            }
        }
        // Beyond the rest: a forward (or an input gradient) computes its last unit after the
        // last gather; a backward that gathers and reduce-scatters computes it while the
        // stream reduce-scatters the unit before it, and waits for that one (at most two
        // units' gradients whole); one that only reduce-scatters starts its first once its
        // first unit is computed.
        out.tail = gathers > 0 && scatters > 0 ? std::max(0.0, unit - scatters / (n - 1)) : unit;
        rest[r] = out;
        return at;
    }

    /// The earliest the compute action at `pos` may end, given the rest `begin` entered (0:
    /// none), or -1 while that has not settled.
    double rest_end(const PlanRank& rank, size_t pos) {
        const size_t r = static_cast<size_t>(rank.rank);
        if (!rest[r] || rest[r]->pos != pos) return 0;
        double end = 0;
        if (rest[r]->last >= 0) {
            auto fin = finished.find({group_of(rank), rest[r]->last});
            if (fin == finished.end()) return -1.0;
            end = fin->second + rest[r]->tail;
        }
        rest[r].reset();
        return end;
    }

    /// Where compute `seconds` long that starts at `start` ends when it runs at 1 / (1 + slow)
    /// of its speed while the rank's stream runs a collective, or -1 while one the rank entered
    /// has not settled. A rank's collectives end in the order it entered them, and its compute
    /// actions start in order: the ones over before a start are never looked at again.
    double slowed_end(const PlanRank& rank, double start, double seconds, double slow) {
        const size_t r = static_cast<size_t>(rank.rank);
        int32_t& k = overlap_from[r];
        const int32_t group = group_of(rank);
        for (int32_t j = k; j < entered[r]; ++j)
            if (!finished.count({group, j})) return -1.0;
        while (k < entered[r] && finished.at({group, k}) <= start) ++k;
        double at = start, left = seconds;
        for (int32_t j = k; j < entered[r] && left > 0; ++j) {
            const double b = std::max(at, begun.at({group, j})), e = finished.at({group, j});
            if (e <= at) continue;
            if (b >= at + left) break; // done before it starts
            left -= b - at;            // at full speed up to it
            at = b;
            const double beside = std::min(e - at, left * (1 + slow));
            left -= beside / (1 + slow);
            at += beside;
        }
        return at + left;
    }

    /// The end of the rank's last collective when all have finished (else -1): STEP waits for it.
    double all_done(const PlanRank& rank) const {
        double at = 0;
        for (int32_t k = 0; k < entered[static_cast<size_t>(rank.rank)]; ++k) {
            auto it = finished.find({group_of(rank), k});
            if (it == finished.end()) return -1.0;
            at = std::max(at, it->second);
        }
        return at;
    }

  private:
    // The rank's next collective, of `seconds` (and `wait`, ExecCosts::reduction_wait), for
    // its action at `index`, entered at `at`: its end once known, else -1.
    double queue(const PlanRank& rank, size_t index, double at, double seconds, double wait) {
        const size_t r = static_cast<size_t>(rank.rank);
        int32_t k = entered[r]++;
        action_of[r].push_back(index);
        auto key = std::make_pair(group_of(rank), k);
        auto& e = entries[key];
        e.push_back(at);
        if (static_cast<int32_t>(e.size()) < g.dp * g.cp || finished.count(key)) return -1.0;
        double start = *std::max_element(e.begin(), e.end());
        std::vector<int32_t> ms = g.replica_group(rank);
        if (shared) {
            unsettled.push_back({key, start, seconds, ms, wait});
            return -1.0;
        }
        for (int32_t m : ms) start = std::max(start, comm_free[static_cast<size_t>(m)]);
        double end = start + seconds;
        for (int32_t m : ms) comm_free[static_cast<size_t>(m)] = end;
        finished[key] = end;
        begun[key] = start;
        return end;
    }
};

// The expert-parallel group's all-to-alls: the k-th of each group starts when the last member
// has come to it, on every member's compute stream.
struct Exchanges {
    const Graph& g;
    const ExecCosts& costs;
    std::vector<int32_t> entered; // per rank: all-to-alls done
    std::vector<char> waiting;    // per rank: has come to its next one
    std::vector<double> arrived;  // per rank: when it came to it
    std::map<std::pair<int32_t, int32_t>, std::vector<double>> entries; // (group, k) -> times
    std::map<std::pair<int32_t, int32_t>, std::pair<double, double>> done;

    Exchanges(const Graph& graph, const ExecCosts& c)
        : g(graph), costs(c), entered(graph.ranks.size(), 0), waiting(graph.ranks.size(), 0),
          arrived(graph.ranks.size(), 0.0) {}

    std::pair<int32_t, int32_t> key(const PlanRank& rank) const {
        return {g.expert_group(rank).front(), entered[static_cast<size_t>(rank.rank)]};
    }

    /// Rank `rank` comes to all-to-all `a` at `at` (once; later calls only ask): its start and
    /// end once every member has come, else nothing. The rank's span runs from its arrival, as
    /// the runtime measures it: the wait for the last member is part of it.
    std::optional<std::pair<double, double>> enter(const PlanRank& rank, const PlanAction& a,
                                                   double at) {
        const size_t r = static_cast<size_t>(rank.rank);
        auto k = key(rank);
        if (!waiting[r]) {
            entries[k].push_back(at);
            waiting[r] = 1;
            arrived[r] = at;
        }
        const auto& e = entries[k];
        if (e.size() < g.expert_group(rank).size()) return std::nullopt;
        auto it = done.find(k);
        if (it == done.end()) {
            double start = *std::max_element(e.begin(), e.end());
            it = done.emplace(k,
                              std::make_pair(
                                  start, start + (costs.exchange ? costs.exchange(rank, a) : 0.0)))
                     .first;
        }
        return it->second;
    }
    void leave(const PlanRank& rank) {
        waiting[static_cast<size_t>(rank.rank)] = 0;
        ++entered[static_cast<size_t>(rank.rank)];
    }
};

// The all-to-alls listed right after the compute action at `pos` (which runs them), or 0.
size_t exchanges_after(const PlanRank& rank, size_t pos) {
    if (rank.actions[pos].overlap_next) return 0;
    size_t k = 0;
    while (pos + 1 + k < rank.actions.size() && is_exchange(rank.actions[pos + 1 + k].kind)) ++k;
    return k;
}

// STEP's gradient norm: the latest arrival at STEP among the ranks it is reduced over (the
// model replica's, every rank's under ZeRO); negative while one of them has not arrived.
double norm_barrier(const Graph& g, const PlanRank& rank, const std::vector<double>& arrived) {
    double last = 0;
    for (const PlanRank& m : g.ranks) {
        if (g.zero == 0 && (m.dp != rank.dp || m.cp != rank.cp)) continue;
        double at = arrived[static_cast<size_t>(m.rank)];
        if (at < 0) return -1.0;
        last = std::max(last, at);
    }
    return last;
}

// Whether every rank finished, and what the stuck ones wait for.
void conclude(const Graph& g, const Collectives& dp, const Exchanges& ex, ExecTimes& t) {
    t.complete = true;
    for (size_t r = 0; r < g.ranks.size(); ++r) {
        const PlanRank& rank = g.ranks[r];
        // The rank's k-th collective is its group's k-th collective.
        for (size_t k = 0; k < dp.action_of[r].size(); ++k) {
            const auto key = std::make_pair(dp.group_of(rank), static_cast<int32_t>(k));
            auto b = dp.begun.find(key), f = dp.finished.find(key);
            if (b != dp.begun.end() && f != dp.finished.end())
                t.collectives[r].push_back({dp.action_of[r][k], b->second, f->second});
        }
        if (t.stopped_at[r] == rank.actions.size()) continue;
        t.complete = false;
        const PlanAction& a = rank.actions[t.stopped_at[r]];
        if (is_p2p(a.kind)) {
            if (a.peer >= 0 && static_cast<size_t>(a.peer) < g.ranks.size())
                t.waits_for[r].push_back(a.peer);
        } else if (is_exchange(a.kind)) {
            // A member that has not come to this all-to-all holds it up.
            for (int32_t m : g.expert_group(rank))
                if (static_cast<size_t>(m) != r && !ex.waiting[static_cast<size_t>(m)] &&
                    ex.entered[static_cast<size_t>(m)] <= ex.entered[r])
                    t.waits_for[r].push_back(m);
        } else if (a.kind == ActionKind::step || is_compute(a.kind)) {
            for (int32_t m : g.replica_group(rank)) {
                if (static_cast<size_t>(m) == r) continue;
                // A member that has entered fewer reductions than this rank holds it up.
                if (dp.entered[static_cast<size_t>(m)] < dp.entered[r]) t.waits_for[r].push_back(m);
            }
        }
    }
}

/// A compute action cut by the all-to-alls listed after it: its first piece before them, one
/// after each. Where it is in the rank's list (-1: none open), each piece's seconds, and the
/// earliest it may end (ZeRO 3's last unit).
struct Cut {
    int64_t at = -1;
    double piece = 0, not_before = 0;

    bool open() const { return at >= 0; }
    /// Cuts the compute at `pos` of `seconds` into k + 1 pieces: the first one's seconds.
    double begin(size_t pos, double seconds, size_t k, double end_not_before) {
        at = static_cast<int64_t>(pos);
        piece = seconds / static_cast<double>(k + 1);
        not_before = end_not_before;
        return piece;
    }
    /// Whether the all-to-all at `pos` is the last of the cut (its piece ends the compute).
    static bool last(const std::vector<PlanAction>& list, size_t pos) {
        return pos + 1 >= list.size() || !is_exchange(list[pos + 1].kind);
    }
};

ExecTimes sized(const Graph& g) {
    const size_t n = g.ranks.size();
    ExecTimes t;
    t.start.resize(n);
    t.end.resize(n);
    t.core_wait.resize(n);
    t.on_core.resize(n);
    t.collectives.resize(n);
    t.stopped_at.assign(n, 0);
    t.waits_for.assign(n, {});
    for (size_t r = 0; r < n; ++r) {
        t.start[r].assign(g.ranks[r].actions.size(), 0.0);
        t.end[r].assign(g.ranks[r].actions.size(), 0.0);
        t.core_wait[r].assign(g.ranks[r].actions.size(), 0.0);
        t.on_core[r].assign(g.ranks[r].actions.size(), -1.0);
    }
    return t;
}

// Each rank on its own device: a fixpoint over the ranks.
ExecTimes execute_devices(const Graph& g, const ExecCosts& costs) {
    const size_t n = g.ranks.size();
    ExecTimes t = sized(g);
    std::vector<double> clock(n, 0.0);
    std::map<MessageKey, double> arrived;
    Collectives dp(g, costs);
    Exchanges ex(g, costs);
    std::vector<Cut> cut(n);
    std::vector<double> at_step(n, -1.0); // when each rank reached STEP
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
                    // Under ZeRO 3 it starts once its first unit is in, and ends no sooner
                    // than the rest of its units allow (Collectives::begin).
                    double compute = costs.compute(rank, a);
                    const double first = dp.first_in(rank, a);
                    if (first < 0) break;
                    start = std::max(start, first);
                    start = dp.begin(rank, a, pos, start, compute);
                    if (const double slow =
                            costs.overlap_slowdown ? costs.overlap_slowdown(rank) : 0.0;
                        slow > 0) {
                        // Slowed while the rank's collectives run beside it.
                        const double slowed = dp.slowed_end(rank, start, compute, slow);
                        if (slowed < 0) break;
                        compute = slowed - start;
                    }
                    const double not_before = dp.rest_end(rank, pos);
                    if (not_before < 0) break;
                    end = std::max(start + compute, not_before);
                    if (size_t k = exchanges_after(rank, pos); k > 0) {
                        // Its first piece now; its end once the last all-to-all is over.
                        end = start + cut[r].begin(pos, compute, k, not_before);
                    }
                } else if (is_exchange(a.kind)) {
                    auto when = ex.enter(rank, a, start);
                    if (!when) break;
                    ex.leave(rank);
                    t.start[r][pos] = ex.arrived[r];
                    t.end[r][pos] = when->second;
                    clock[r] = when->second;
                    if (cut[r].open()) {
                        clock[r] += cut[r].piece;
                        if (Cut::last(rank.actions, pos)) {
                            clock[r] = std::max(clock[r], cut[r].not_before);
                            t.end[r][static_cast<size_t>(cut[r].at)] = clock[r];
                            cut[r] = {};
                        }
                    }
                    ++pos;
                    progress = true;
                    continue;
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
                    dp.enter(rank, a, pos, start);
                } else { // STEP: after this rank's reductions
                    double done = dp.all_done(rank);
                    if (done < 0) break;
                    start = std::max(start, done);
                    if (costs.step_before) start += costs.step_before(rank);
                    if (costs.step_barrier) {
                        // The update starts once the norm is in: the wait before is idle.
                        at_step[r] = start;
                        double all = norm_barrier(g, rank, at_step);
                        if (all < 0) break;
                        start = all;
                    }
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
    conclude(g, dp, ex, t);
    return t;
}

// Single-threaded ranks that outnumber a host's cores, run as the OS scheduler runs their
// threads (Linux's per-core run queues). Each core runs one thread at a time and keeps a queue
// of those waiting for it. A thread that becomes busy goes to its last core if that core is
// idle, else to any idle core, else to its last core's queue (one it never ran on: the core
// with the fewest threads). A core whose thread stops being busy takes the first of its own
// queue, or, with none, the longest-waiting thread of the longest queue elsewhere. While a
// core's queue is not empty its thread runs for one time slice (ExecCosts::slice), then goes to
// the back of that queue and the first waiting takes the core. An action shorter than a slice
// thus runs whole once it has a core, after a wait in the queue that is idle time, not part of
// its span; threads stay on their cores while the cores are busy. But a thread woken by a
// message while no core idles takes its sender's core at once where no other thread waits
// there (Linux's scheduler preempts the waker for the woken thread, which has had less than its
// share): the sender, which has just sent at the end of its action, waits first in that
// queue, its next action not yet begun. Without a slice every busy thread has an equal share
// of the cores.
class CoreQueues {
  public:
    CoreQueues(const Graph& g, const ExecCosts& costs)
        : cores_(static_cast<size_t>(costs.cores)), slice_(costs.slice), host_(g.ranks.size()),
          busy_(g.ranks.size(), false), on_core_(g.ranks.size(), false),
          covered_(g.ranks.size(), false), last_(g.ranks.size(), kNone) {
        std::map<int32_t, size_t> ranks;
        std::map<int32_t, bool> single;
        for (const PlanRank& r : g.ranks) {
            ++ranks[r.host];
            auto it = single.emplace(r.host, true).first;
            it->second = it->second && costs.threads(r) == 1.0;
        }
        for (const auto& [host, count] : ranks)
            if (count > cores_ && single[host]) hosts_[host].cores.resize(cores_);
        for (size_t r = 0; r < covered_.size(); ++r) {
            host_[r] = g.ranks[r].host;
            covered_[r] = hosts_.count(host_[r]) > 0;
        }
    }

    bool covers(size_t r) const { return covered_[r]; }

    /// Rank r, blocked, is woken now by a message from `sender`, which has begun no action since
    /// the send but the one it may be running.
    void woken_by(size_t r, size_t sender) {
        if (covers(r) && covers(sender) && host_[r] == host_[sender]) woken_by_[r] = sender;
    }

    /// Queues the ranks busy at `now`, hands over the cores whose slices are over. Returns the
    /// ranks that got a core for the first time since they became busy.
    std::vector<size_t> place(const std::vector<bool>& busy, double now) {
        std::vector<size_t> first;
        for (auto& [host, h] : hosts_) {
            for (Core& c : h.cores) {
                std::erase_if(c.waiting, [&](size_t r) { return !busy[r]; });
                if (c.rank != kNone && !busy[c.rank]) c.rank = kNone;
                c.waited = !c.waiting.empty();
            }
        }
        for (size_t r = 0; r < busy.size(); ++r) {
            if (!covers(r) || busy_[r] == busy[r]) continue;
            busy_[r] = busy[r];
            on_core_[r] = false;
            Host& h = hosts_[host_[r]];
            if (!busy[r]) {
                --h.busy;
                started_.erase(r); // its next action waits for a core anew
                continue;
            }
            ++h.busy;
            if (slice_ <= 0)
                begin(r, first); // sharing evenly: it runs at once
            else if (!takes_senders_core(h, r, now, first))
                h.cores[wake_core(h, r)].waiting.push_back(r);
        }
        woken_by_.clear(); // wakings that did not make a rank busy now
        if (slice_ <= 0) return first;
        for (auto& [host, h] : hosts_) {
            // Idle cores take their own first waiting, or pull one from the longest queue.
            for (size_t k = 0; k < h.cores.size(); ++k) {
                if (h.cores[k].rank != kNone) continue;
                size_t from = k;
                if (h.cores[k].waiting.empty())
                    for (size_t j = 0; j < h.cores.size(); ++j)
                        if (h.cores[j].waiting.size() > h.cores[from].waiting.size()) from = j;
                if (h.cores[from].waiting.empty()) continue;
                const size_t r = h.cores[from].waiting.front();
                h.cores[from].waiting.pop_front();
                run(h.cores[k], k, r, now, first);
            }
            // Turns on the cores where a thread waits.
            for (size_t k = 0; k < h.cores.size(); ++k) {
                Core& c = h.cores[k];
                if (c.rank == kNone || c.waiting.empty()) continue;
                // One that ran alone has had slice after slice; it finishes its current one.
                if (!c.waited) c.since += std::floor((now - c.since) / slice_) * slice_;
                if (now < c.since + slice_ * (1 - 1e-9)) continue;
                on_core_[c.rank] = false;
                c.waiting.push_back(c.rank);
                const size_t r = c.waiting.front();
                c.waiting.pop_front();
                run(c, k, r, now, first);
            }
        }
        return first;
    }

    /// Rank r's share of a core now (it is covered and busy).
    double share(size_t r) const {
        if (slice_ > 0) return on_core_[r] ? 1.0 : 0.0;
        const size_t busy = hosts_.at(host_[r]).busy;
        return std::min(1.0, static_cast<double>(cores_) / static_cast<double>(busy));
    }

    /// When the next slice ends on a core where a thread waits (infinity: none).
    double next_turn() const {
        double t = std::numeric_limits<double>::infinity();
        if (slice_ <= 0) return t;
        for (const auto& [host, h] : hosts_)
            for (const Core& c : h.cores)
                if (c.rank != kNone && !c.waiting.empty()) t = std::min(t, c.since + slice_);
        return t;
    }

  private:
    static constexpr size_t kNone = SIZE_MAX;
    struct Core {
        size_t rank = kNone;        // the thread it runs
        double since = 0;           // when that thread's current slice began
        std::deque<size_t> waiting; // for this core
        bool waited = false;        // a thread waited before the placement now
    };
    struct Host {
        std::vector<Core> cores;
        size_t busy = 0; // its busy threads
    };

    // Rank r, woken by a message while no core idles, takes the core of its sender if the
    // sender runs there with no thread waiting: the sender waits first in the queue, and its
    // action begins anew when it has the core again.
    bool takes_senders_core(Host& h, size_t r, double now, std::vector<size_t>& first) {
        const auto it = woken_by_.find(r);
        if (it == woken_by_.end()) return false;
        const size_t sender = it->second;
        for (const Core& c : h.cores)
            if (c.rank == kNone && c.waiting.empty()) return false; // an idle core
        for (size_t k = 0; k < h.cores.size(); ++k) {
            Core& c = h.cores[k];
            if (c.rank != sender || !c.waiting.empty()) continue;
            on_core_[sender] = false;
            started_.erase(sender);
            c.waiting.push_front(sender);
            run(c, k, r, now, first);
            c.waited = true; // its slice begins now
            return true;
        }
        return false;
    }

    // The core rank r goes to as it becomes busy: its last one if idle, else an idle one, else
    // its last one's queue (never run: the core with the fewest threads).
    size_t wake_core(const Host& h, size_t r) const {
        auto idle = [&](size_t k) {
            return h.cores[k].rank == kNone && h.cores[k].waiting.empty();
        };
        const size_t last = last_[r];
        if (last != kNone && idle(last)) return last;
        for (size_t k = 0; k < h.cores.size(); ++k)
            if (idle(k)) return k;
        if (last != kNone) return last;
        size_t best = 0, fewest = kNone;
        for (size_t k = 0; k < h.cores.size(); ++k) {
            const size_t load = h.cores[k].waiting.size() + (h.cores[k].rank != kNone ? 1 : 0);
            if (load < fewest) fewest = load, best = k;
        }
        return best;
    }

    // Busy rank r takes core k now.
    void run(Core& c, size_t k, size_t r, double now, std::vector<size_t>& first) {
        c.rank = r;
        c.since = now;
        last_[r] = k;
        on_core_[r] = true;
        begin(r, first);
    }

    // Busy rank r runs for the first time since it became busy.
    void begin(size_t r, std::vector<size_t>& first) {
        if (started_.insert(r).second) first.push_back(r);
    }

    size_t cores_;
    double slice_;
    std::vector<int32_t> host_;
    std::vector<bool> busy_;    // at the last placement
    std::vector<bool> on_core_; // has a core now (with a slice)
    std::vector<bool> covered_; // on a host in hosts_
    std::vector<size_t> last_;  // the core each rank last ran on (kNone: none yet)
    std::map<int32_t, Host> hosts_;
    std::set<size_t> started_;          // busy ranks that have had a core
    std::map<size_t, size_t> woken_by_; // ranks woken now by a message: their senders
};

// Ranks sharing a host's cores: an event-driven execution in time order. Between two events
// every running compute action progresses at its speed given the threads then busy on its host.
ExecTimes execute_shared(const Graph& g, const ExecCosts& costs) {
    const size_t n = g.ranks.size();
    ExecTimes t = sized(g);
    std::map<MessageKey, double> arrived;
    std::map<MessageKey, size_t> sent_from; // each message's send: its position in the sender
    Collectives dp(g, costs);
    struct Running {
        bool on = false;
        double left = 0, total = 0; // seconds of work alone on the host
        double not_before = 0;      // ZeRO 3: cannot end before its last unit has arrived
        double threads = 1;
        double wait = 0; // off the core once the work is done (ExecCosts::compute_wait)
        // Pieces between the meetings of a tensor-parallel group (ExecCosts::meets): meetings
        // in the action and those passed, each later piece's seconds, the hand-over after each
        // meeting, and the earliest the last piece may end. Meeting: at one, off the core until
        // every member is (since `met_at`); handing: after one, off the core for the hand-over.
        int32_t meets = 0, met = 0;
        double piece = 0, hand_over = 0, end_not_before = 0, met_at = 0;
        bool meeting = false, handing = false;
        // Its end waits for the rest of its units (ZeRO 2 and 3) to settle (Collectives::rest).
        bool rest = false;
    };
    std::vector<Running> run(n);
    Exchanges ex(g, costs);
    std::vector<Cut> cut(n);
    std::vector<double> at_step(n, -1.0); // when each rank reached STEP
    std::set<double> wakes;               // future times at which a waiting rank may go on
    // Where each rank first came to the receive it waits at, and when.
    std::vector<size_t> blocked_at(n, SIZE_MAX);
    std::vector<double> blocked_since(n, 0.0);
    std::unique_ptr<CoreQueues> queues;
    if (costs.cores >= 1) queues = std::make_unique<CoreQueues>(g, costs);
    // A tensor-parallel group's members meet inside their actions where they queue for cores.
    auto meets_in = [&](size_t r, const PlanAction& a) -> int32_t {
        if (!costs.meets || !queues || !queues->covers(r) || g.tp < 2) return 0;
        return std::max(0, costs.meets(g.ranks[r], a));
    };
    // A blocked rank woken by its message, where the sender has begun no action since the send
    // but the one it may be running (CoreQueues::woken_by).
    auto woken_by_message = [&](size_t r, const PlanAction& a, const MessageKey& key) {
        const auto from = sent_from.find(key);
        if (from == sent_from.end() || a.peer < 0 || static_cast<size_t>(a.peer) >= n) return;
        const size_t sender = static_cast<size_t>(a.peer);
        const auto& actions = g.ranks[sender].actions;
        const auto since = actions.begin() + static_cast<std::ptrdiff_t>(from->second + 1);
        const auto upto = actions.begin() + static_cast<std::ptrdiff_t>(
                                                std::min(t.stopped_at[sender], actions.size()));
        if (std::none_of(since, std::max(since, upto), [](const PlanAction& b) {
                return is_compute(b.kind) || b.kind == ActionKind::step;
            }))
            queues->woken_by(r, sender);
    };
    auto start_pieces = [&](size_t r, int32_t k, double compute, double wait, double not_before) {
        Running& x = run[r];
        x = {};
        x.on = true;
        x.threads = costs.threads(g.ranks[r]);
        x.meets = k;
        x.piece = (compute - wait) / static_cast<double>(k + 1);
        x.hand_over = wait / static_cast<double>(k);
        x.end_not_before = not_before;
        x.left = x.total = x.piece;
    };
    double now = 0;
    dp.shared = true;
    while (true) {
        // Every idle rank goes as far as it can at `now`.
        for (bool moved = true; moved;) {
            moved = false;
            for (size_t r = 0; r < n; ++r) {
                if (run[r].on) continue;
                const PlanRank& rank = g.ranks[r];
                size_t& pos = t.stopped_at[r];
                while (pos < rank.actions.size()) {
                    const PlanAction& a = rank.actions[pos];
                    if (is_compute(a.kind) || a.kind == ActionKind::step) {
                        double compute = costs.compute(rank, a);
                        double wait = 0;
                        if (a.kind == ActionKind::step) {
                            double done = dp.all_done(rank);
                            if (done < 0) break;
                            if (done > now) {
                                wakes.insert(done);
                                break;
                            }
                            if (at_step[r] < 0) {
                                at_step[r] =
                                    now + (costs.step_before ? costs.step_before(rank) : 0.0);
                                moved = true; // ranks waiting at the barrier look again
                            }
                            const double go =
                                costs.step_barrier ? norm_barrier(g, rank, at_step) : at_step[r];
                            if (go < 0) break;
                            if (go > now) {
                                wakes.insert(go);
                                break;
                            }
                        } else {
                            // Under ZeRO 3 it starts once its first unit is in; it ends no
                            // sooner than the rest of its units allow (Collectives::begin),
                            // known once every member has started it.
                            const double first = dp.first_in(rank, a);
                            if (first < 0) break;
                            if (first > now) {
                                wakes.insert(first);
                                break;
                            }
                            dp.begin(rank, a, pos, now, compute);
                            if (size_t k = exchanges_after(rank, pos); k > 0) {
                                // Its first piece now; the others after its all-to-alls.
                                compute = cut[r].begin(pos, compute, k, 0.0);
                            } else if (costs.compute_wait) {
                                wait = std::clamp(costs.compute_wait(rank, a), 0.0, compute);
                            }
                            if (const int32_t k = meets_in(r, a); k > 0 && !cut[r].open()) {
                                start_pieces(r, k, compute, wait, 0.0);
                                run[r].rest = true;
                                t.start[r][pos] = now;
                                t.on_core[r][pos] = 0.0;
                                break;
                            }
                        }
                        run[r] = {true, compute - wait,      compute - wait,
                                  0.0,  costs.threads(rank), wait};
                        run[r].rest = !cut[r].open() && a.kind != ActionKind::step;
                        t.start[r][pos] = now;
                        t.on_core[r][pos] = 0.0;
                        break;
                    }
                    if (is_exchange(a.kind)) {
                        auto when = ex.enter(rank, a, now);
                        if (!when) break;
                        if (when->second > now) {
                            wakes.insert(when->second);
                            break;
                        }
                        ex.leave(rank);
                        t.start[r][pos] = ex.arrived[r];
                        t.end[r][pos] = when->second;
                        if (cut[r].open()) {
                            // The compute's next piece, which ends it after the last one.
                            const Cut& c = cut[r];
                            run[r] = {true, c.piece, c.piece, 0.0, costs.threads(rank)};
                            run[r].rest = Cut::last(rank.actions, pos);
                            moved = true; // members waiting at it go on at `now` too
                            break;
                        }
                        ++pos;
                        moved = true;
                        continue;
                    }
                    if (a.kind == ActionKind::send_forward || a.kind == ActionKind::send_backward) {
                        if (a.peer < 0 || static_cast<size_t>(a.peer) >= n) break;
                        double at =
                            now + costs.transfer(rank, g.ranks[static_cast<size_t>(a.peer)], a);
                        arrived[send_key(rank.rank, a)] = at;
                        sent_from[send_key(rank.rank, a)] = pos;
                        if (at > now) wakes.insert(at);
                    } else if (a.kind == ActionKind::recv_forward ||
                               a.kind == ActionKind::recv_backward) {
                        if (blocked_at[r] != pos) {
                            blocked_at[r] = pos;
                            blocked_since[r] = now;
                        }
                        auto it = arrived.find(recv_key(rank.rank, a));
                        if (it == arrived.end()) break;
                        // A thread that blocked for it runs once woken (ExecCosts::wake).
                        const double go =
                            it->second + (blocked_since[r] < it->second ? costs.wake : 0.0);
                        if (go > now) {
                            wakes.insert(go);
                            break;
                        }
                        if (queues && blocked_since[r] < it->second)
                            woken_by_message(r, a, it->first);
                        sent_from.erase(it->first);
                        arrived.erase(it);
                    } else if (is_dp_collective(a.kind)) {
                        double end = dp.enter(rank, a, pos, now);
                        if (end > now) wakes.insert(end);
                    }
                    t.start[r][pos] = t.end[r][pos] = now;
                    ++pos;
                    moved = true;
                }
            }
        }
        // The threads busy on each host (the collectives' apart).
        std::map<int32_t, double> busy;
        std::vector<bool> busy_now(n, false);
        for (size_t r = 0; r < n; ++r) {
            busy_now[r] = run[r].on && run[r].left > 0 && t.start[r][t.stopped_at[r]] <= now;
            if (busy_now[r]) busy[g.ranks[r].host] += run[r].threads;
        }
        // The collectives entered now start beside them; the ranks waiting for them look again.
        if (dp.settle(now, busy)) continue;
        // The compute actions whose rest of units has settled end no sooner than it allows.
        for (size_t r = 0; r < n; ++r) {
            if (!run[r].on || !run[r].rest) continue;
            const size_t at = cut[r].open() ? static_cast<size_t>(cut[r].at) : t.stopped_at[r];
            const double end = dp.rest_end(g.ranks[r], at);
            if (end < 0) continue;
            run[r].rest = false;
            run[r].end_not_before = std::max(run[r].end_not_before, end);
        }
        // The next event.
        std::erase_if(dp.running, [&](const Collectives::Running& c) { return c.end <= now; });
        std::map<int32_t, double> comm = dp.threads_at(now);
        if (queues)
            for (size_t r : queues->place(busy_now, now)) {
                // A compute action's span begins when its thread first has a core (not a
                // later piece of one cut by its all-to-alls).
                const size_t at = t.stopped_at[r];
                const ActionKind k = g.ranks[r].actions[at].kind;
                if ((is_compute(k) || k == ActionKind::step) && run[r].met == 0 &&
                    (!cut[r].open() || at == static_cast<size_t>(cut[r].at))) {
                    t.core_wait[r][at] = now - t.start[r][at];
                    t.start[r][at] = now;
                    t.on_core[r][at] = 0.0; // a sender put back in the queue begins anew
                }
            }
        auto speed_of = [&](size_t r) {
            double alone = costs.speed(run[r].threads);
            const double on = busy[g.ranks[r].host], talking = comm[g.ranks[r].host];
            if (queues && queues->covers(r)) {
                // On a core it runs as fast as the cores all busy allow. What taking turns
                // costs (caches refilled after each) is in the calibrated `oversubscribed`
                // work of the ranks' actions, fitted to pipelines that take turns: the workers'
                // sharing beyond the cores as well would count it twice (a pipeline's steady
                // actions, traced, stretch as the ranks in action over the cores, no more).
                const double full = costs.speed(std::min(on, costs.cores) + talking);
                return queues->share(r) * full / alone;
            }
            return costs.speed(std::max(on, run[r].threads) + talking) / alone;
        };
        double next = std::numeric_limits<double>::infinity();
        for (size_t r = 0; r < n; ++r) {
            if (!run[r].on || run[r].meeting) continue;
            if (run[r].rest && run[r].left <= 0) continue; // for its rest to settle
            double done = run[r].left > 0 ? now + run[r].left / speed_of(r) : now;
            next = std::min(next, std::max(done, run[r].not_before));
        }
        auto wake = wakes.upper_bound(now);
        if (wake != wakes.end()) next = std::min(next, *wake);
        if (queues) next = std::min(next, queues->next_turn());
        for (const Collectives::Running& c : dp.running)
            for (double at : {c.begin, c.end})
                if (at > now) next = std::min(next, at);
        if (!std::isfinite(next)) break; // nothing runs and nothing will arrive
        for (size_t r = 0; r < n; ++r) {
            if (!run[r].on || t.start[r][t.stopped_at[r]] > now || run[r].left <= 0) continue;
            // Its thread's time on a core: all of it with a core of its own, its turns where
            // ranks queue for the cores, its even share where they share them without turns.
            const size_t at = cut[r].open() ? static_cast<size_t>(cut[r].at) : t.stopped_at[r];
            double& on_core = t.on_core[r][at];
            on_core = std::max(on_core, 0.0) +
                      (next - now) * (queues && queues->covers(r) ? queues->share(r) : 1.0);
            run[r].left -= (next - now) * speed_of(r);
            if (run[r].left <= 1e-9 * run[r].total) run[r].left = 0;
        }
        now = next;
        wakes.erase(wakes.begin(), wakes.upper_bound(now));
        for (size_t r = 0; r < n; ++r) {
            if (!run[r].on || run[r].left > 0 || run[r].not_before > now ||
                t.start[r][t.stopped_at[r]] > now)
                continue;
            if (run[r].handing) { // the hand-over is over: the next piece
                run[r].handing = false;
                run[r].left = run[r].total = run[r].piece;
                continue;
            }
            if (run[r].meeting || run[r].met < run[r].meets) { // a meeting of its group
                if (!run[r].meeting) {
                    run[r].meeting = true;
                    run[r].met_at = now;
                    ++run[r].met;
                }
                const std::vector<int32_t> group = g.tensor_group(g.ranks[r]);
                const bool all = std::all_of(group.begin(), group.end(), [&](int32_t m) {
                    const size_t i = static_cast<size_t>(m);
                    return run[i].on && run[i].meeting && run[i].met == run[r].met &&
                           t.stopped_at[i] == t.stopped_at[r];
                });
                if (!all) continue;
                // Every member but the last to come (of those that came at once, the last in
                // the group) blocked there: it goes on once woken (ExecCosts::wake), as at a
                // receive.
                int32_t last = group.front();
                for (int32_t m : group)
                    if (run[static_cast<size_t>(m)].met_at >= run[static_cast<size_t>(last)].met_at)
                        last = m;
                for (int32_t m : group) {
                    Running& x = run[static_cast<size_t>(m)];
                    x.meeting = false;
                    x.handing = true;
                    x.not_before = now + x.hand_over + (m != last ? costs.wake : 0.0);
                }
                continue;
            }
            if (run[r].rest) continue;         // its rest of units has not settled
            if (run[r].end_not_before > now) { // ZeRO 3: its last unit arrives later
                run[r].not_before = run[r].end_not_before;
                run[r].end_not_before = 0;
                continue;
            }
            if (run[r].wait > 0) { // its work done, it waits off the core
                run[r].not_before = now + run[r].wait;
                run[r].wait = 0;
                continue;
            }
            run[r].on = false;
            if (!cut[r].open()) {
                t.end[r][t.stopped_at[r]++] = now;
                continue;
            }
            // A piece of a compute action cut by its all-to-alls: the last one ends it.
            const size_t i = t.stopped_at[r]++;
            if (i != static_cast<size_t>(cut[r].at) && Cut::last(g.ranks[r].actions, i)) {
                t.end[r][static_cast<size_t>(cut[r].at)] = now;
                cut[r] = {};
            }
        }
    }
    conclude(g, dp, ex, t);
    return t;
}

} // namespace

ExecTimes execute(const Graph& g, const ExecCosts& costs) {
    return costs.speed && costs.threads ? execute_shared(g, costs) : execute_devices(g, costs);
}

} // namespace dist::plan
