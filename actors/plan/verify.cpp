// verify.cpp: the static checks first (they name the exact action at fault), then the
// abstract execution for what only a run can show: waits that form a cycle.
#include "actors/plan/verify.hpp"

#include "actors/plan/execute.hpp"

#include <map>
#include <set>
#include <tuple>

namespace dist::plan {

namespace {

std::string where(const PlanRank& r) {
    return "rank " + std::to_string(r.rank);
}

// The custom table's cell nearest to action i: the action itself, else the compute action it
// feeds (a receive) or follows (a send, an all-to-all).
lang::SourceLoc loc_near(const PlanRank& r, size_t i) {
    if (i < r.actions.size() && is_exchange(r.actions[i].kind))
        for (size_t k = i; k-- > 0;)
            if (is_compute(r.actions[k].kind)) return r.actions[k].loc;
    for (size_t k = i; k < r.actions.size(); ++k)
        if (is_compute(r.actions[k].kind)) return r.actions[k].loc;
    for (size_t k = i; k-- > 0;)
        if (is_compute(r.actions[k].kind)) return r.actions[k].loc;
    return {};
}

void check_order(const Graph& g, std::vector<PlanError>& errors) {
    const int32_t S = g.num_stages(), M = g.microbatches;
    // (stage, mb) -> ops seen, over the replicas with dp = tp = 0 (the others are copies and
    // are compared with them below).
    std::map<std::pair<int32_t, int32_t>, std::string> seen;
    for (const PlanRank& r : g.ranks) {
        if (r.dp != 0 || r.tp != 0 || r.cp != 0) continue;
        for (size_t i = 0; i < r.actions.size(); ++i) {
            const PlanAction& a = r.actions[i];
            if (!is_compute(a.kind)) continue;
            std::string name = to_string(a);
            if (a.stage < 0 || a.stage >= S || a.microbatch < 0 || a.microbatch >= M) {
                errors.push_back(
                    {a.loc, where(r) + " runs `" + name + "`, which does not exist", ""});
                continue;
            }
            if (g.stages[static_cast<size_t>(a.stage)].pp != r.pp) {
                errors.push_back({a.loc,
                                  where(r) + " runs `" + name + "`, but stage " +
                                      std::to_string(a.stage) + " lives on pipeline rank " +
                                      std::to_string(g.stages[static_cast<size_t>(a.stage)].pp),
                                  ""});
                continue;
            }
            std::string& ops = seen[{a.stage, a.microbatch}];
            char op = op_name(a.kind)[0];
            std::string f = std::to_string(a.stage) + "F" + std::to_string(a.microbatch);
            if (ops.find(op) != std::string::npos)
                errors.push_back({a.loc, where(r) + " runs `" + name + "` twice", ""});
            else if (op != 'F' && ops.find('F') == std::string::npos)
                errors.push_back({a.loc,
                                  where(r) + " runs `" + name + "` before its forward `" + f + "`",
                                  "move `" + f + "` earlier in the row"});
            else if (op == 'W' && ops.find('I') == std::string::npos)
                errors.push_back({a.loc,
                                  where(r) + " runs `" + name + "` before its input gradient `" +
                                      std::to_string(a.stage) + "I" + std::to_string(a.microbatch) +
                                      "`",
                                  ""});
            ops += op;
        }
    }
    if (!errors.empty()) return;
    for (int32_t s = 0; s < S; ++s) {
        for (int32_t k = 0; k < M; ++k) {
            const std::string& ops = seen[{s, k}];
            bool b = ops.find('B') != std::string::npos, i = ops.find('I') != std::string::npos,
                 w = ops.find('W') != std::string::npos;
            if (ops.find('F') == std::string::npos || !(b != (i && w)) || (b && (i || w))) {
                errors.push_back({{},
                                  "stage " + std::to_string(s) + " microbatch " +
                                      std::to_string(k) + " runs `" + ops +
                                      "`; it needs F and then B, or F, I and W",
                                  ""});
                return;
            }
        }
    }
}

// On each rank, a stage's input arrives before the compute that reads it and a result is sent
// after the compute that makes it: F after its RECV_F, B / I after their RECV_B, SEND_F after
// its F, SEND_B after its B / I.
void check_local_order(const Graph& g, std::vector<PlanError>& errors) {
    for (const PlanRank& r : g.ranks) {
        // (kind, stage, mb) done so far on this rank
        std::set<std::tuple<int, int32_t, int32_t>> done;
        auto did = [&](ActionKind k, int32_t s, int32_t mb) {
            return done.count({static_cast<int>(k), s, mb}) != 0;
        };
        auto remote = [&](int32_t stage) {
            return stage >= 0 && stage < g.num_stages() &&
                   g.stages[static_cast<size_t>(stage)].pp != r.pp;
        };
        for (size_t i = 0; i < r.actions.size(); ++i) {
            const PlanAction& a = r.actions[i];
            const int32_t s = a.stage, mb = a.microbatch;
            std::string missing;
            if (a.kind == ActionKind::forward && remote(s - 1) &&
                !did(ActionKind::recv_forward, s, mb))
                missing = "its input is received (`" + std::to_string(s) + "RECV_F" +
                          std::to_string(mb) + "`)";
            bool grad = a.kind == ActionKind::backward || a.kind == ActionKind::backward_input;
            if (grad && remote(s + 1) && !did(ActionKind::recv_backward, s, mb))
                missing = "its output's gradient is received (`" + std::to_string(s) + "RECV_B" +
                          std::to_string(mb) + "`)";
            if (a.kind == ActionKind::send_forward && !did(ActionKind::forward, s, mb))
                missing = "its forward `" + std::to_string(s) + "F" + std::to_string(mb) + "`";
            if (a.kind == ActionKind::send_backward && !did(ActionKind::backward, s, mb) &&
                !did(ActionKind::backward_input, s, mb))
                missing = "its backward `" + std::to_string(s) + "B" + std::to_string(mb) + "`";
            if (!missing.empty()) {
                errors.push_back({loc_near(r, i),
                                  where(r) + " runs `" + to_string(a) + "` before " + missing, ""});
                if (errors.size() > 20) return;
            }
            done.insert({static_cast<int>(a.kind), s, mb});
        }
    }
}

// Expert parallelism: every compute action (or overlapped pair) is followed by exactly the
// all-to-alls it runs, in their order, and no all-to-all stands anywhere else.
void check_exchanges(const Graph& g, std::vector<PlanError>& errors) {
    auto words = [](const std::vector<PlanAction>& xs) {
        std::string out;
        for (const PlanAction& x : xs) out += (out.empty() ? "`" : " `") + to_string(x) + "`";
        return out.empty() ? std::string("none") : out;
    };
    for (const PlanRank& r : g.ranks) {
        for (size_t i = 0; i < r.actions.size();) {
            const PlanAction& a = r.actions[i];
            if (is_exchange(a.kind)) {
                errors.push_back({loc_near(r, i),
                                  where(r) + " runs `" + to_string(a) +
                                      "` after no compute action that exchanges tokens",
                                  "an all-to-all follows the F, B or I it runs inside"});
                return;
            }
            if (!is_compute(a.kind)) {
                ++i;
                continue;
            }
            size_t end = i + 1;
            std::vector<PlanAction> expected = exchanges_of(g, a);
            for (; end < r.actions.size() && r.actions[end - 1].overlap_next; ++end)
                for (const PlanAction& x : exchanges_of(g, r.actions[end])) expected.push_back(x);
            std::vector<PlanAction> listed;
            while (end < r.actions.size() && is_exchange(r.actions[end].kind))
                listed.push_back(r.actions[end++]);
            if (listed != expected) {
                errors.push_back({r.actions[i].loc,
                                  where(r) + ": `" + to_string(a) + "` runs the all-to-alls " +
                                      words(expected) + ", but the plan lists " + words(listed) +
                                      " after it",
                                  ""});
                return;
            }
            i = end;
        }
    }
}

void check_messages(const Graph& g, std::vector<PlanError>& errors) {
    // (direction, receiving stage, mb, from, to) -> (sends, receives, where)
    struct Count {
        int sends = 0, recvs = 0;
        lang::SourceLoc loc;
        std::string what;
    };
    std::map<std::tuple<int, int32_t, int32_t, int32_t, int32_t>, Count> msgs;
    for (const PlanRank& r : g.ranks) {
        for (size_t i = 0; i < r.actions.size(); ++i) {
            const PlanAction& a = r.actions[i];
            if (!is_p2p(a.kind)) continue;
            if (a.peer < 0 || static_cast<size_t>(a.peer) >= g.ranks.size() || a.peer == r.rank) {
                errors.push_back({loc_near(r, i),
                                  where(r) + ": `" + to_string(a) + "` names no other rank", ""});
                continue;
            }
            bool fwd = a.kind == ActionKind::send_forward || a.kind == ActionKind::recv_forward;
            bool send = a.kind == ActionKind::send_forward || a.kind == ActionKind::send_backward;
            int32_t stage = send ? (fwd ? a.stage + 1 : a.stage - 1) : a.stage;
            Count& c = msgs[{fwd ? 0 : 1, stage, a.microbatch, send ? r.rank : a.peer,
                             send ? a.peer : r.rank}];
            (send ? c.sends : c.recvs)++;
            if (!c.loc.valid()) c.loc = loc_near(r, i);
            if (c.what.empty()) c.what = where(r) + "'s `" + to_string(a) + "`";
        }
    }
    for (const auto& [key, c] : msgs) {
        auto [dir, stage, mb, from, to] = key;
        std::string msg = (dir == 0 ? "the activation of microbatch " : "the gradient of ") +
                          (dir == 0 ? std::to_string(mb) : "microbatch " + std::to_string(mb)) +
                          " from rank " + std::to_string(from) + " to rank " + std::to_string(to);
        if (c.sends == 1 && c.recvs == 1) continue;
        if (c.recvs == 0)
            errors.push_back({c.loc,
                              c.what + " has no matching receive: rank " + std::to_string(to) +
                                  " never receives " + msg,
                              ""});
        else if (c.sends == 0)
            errors.push_back({c.loc,
                              c.what + " has no matching send: rank " + std::to_string(from) +
                                  " never sends " + msg,
                              ""});
        else
            errors.push_back({c.loc,
                              msg + " is sent " + std::to_string(c.sends) + " times and received " +
                                  std::to_string(c.recvs) + " times",
                              ""});
    }
}

// Collective groups: the replica group of every (pp, tp) (its dp x cp ranks) enters
// REDUCE_GRAD, REDUCE_SCATTER and the gathers of ZeRO 3; the tensor-parallel group of every
// (dp, pp, cp) enters the reductions inside each compute action, the context-parallel ring
// of every (dp, pp, tp) the key/value exchanges inside each attention, and the expert-parallel
// group the all-to-alls.
void check_collectives(const Graph& g, std::vector<PlanError>& errors) {
    enum Which { reductions, computes, exchanges };
    auto sequence = [](const PlanRank& r, Which which) {
        std::vector<std::string> out;
        for (const PlanAction& a : r.actions)
            if (which == reductions ? is_dp_collective(a.kind)
                : which == computes ? is_compute(a.kind)
                                    : is_exchange(a.kind))
                out.push_back(to_string(a));
        return out;
    };
    auto compare = [&](const PlanRank& a, const PlanRank& b, Which which, const char* group) {
        auto x = sequence(a, which), y = sequence(b, which);
        for (size_t k = 0; k < std::max(x.size(), y.size()); ++k) {
            std::string xa = k < x.size() ? "`" + x[k] + "`" : "nothing";
            std::string yb = k < y.size() ? "`" + y[k] + "`" : "nothing";
            if (xa == yb) continue;
            errors.push_back({{},
                              "ranks " + std::to_string(a.rank) + " and " + std::to_string(b.rank) +
                                  " enter their " + std::string(group) +
                                  " collectives in different orders: collective " +
                                  std::to_string(k + 1) + " is " + xa + " on rank " +
                                  std::to_string(a.rank) + " but " + yb + " on rank " +
                                  std::to_string(b.rank),
                              "every member of a group must enter its collectives in one order"});
            return;
        }
    };
    for (const PlanRank& r : g.ranks) {
        auto at = [&](int32_t rank) -> const PlanRank& {
            return g.ranks[static_cast<size_t>(rank)];
        };
        if (r.dp > 0 || r.cp > 0)
            compare(at(g.rank_of(0, r.pp, r.tp, 0)), r, reductions, "data-parallel");
        if (r.tp > 0) compare(at(g.rank_of(r.dp, r.pp, 0, r.cp)), r, computes, "tensor-parallel");
        // The context-parallel ring passes key/value blocks inside every attention.
        if (r.cp > 0) compare(at(g.rank_of(r.dp, r.pp, r.tp, 0)), r, computes, "context-parallel");
        if (g.ep > 1 && g.expert_group(r).front() != r.rank)
            compare(at(g.expert_group(r).front()), r, exchanges, "expert-parallel");
    }
}

void check_deadlock(const Graph& g, std::vector<PlanError>& errors) {
    ExecTimes t = execute(g, zero_costs());
    if (t.complete) return;
    // Follow the wait-for edges from the lowest blocked rank until a rank repeats.
    size_t n = g.ranks.size();
    int32_t at = -1;
    for (size_t r = 0; r < n && at < 0; ++r)
        if (!t.waits_for[r].empty()) at = static_cast<int32_t>(r);
    if (at < 0) {
        errors.push_back(
            {{}, "the plan cannot finish: a rank blocks with nothing to wait for", ""});
        return;
    }
    std::vector<int32_t> path;
    std::set<int32_t> on_path;
    while (at >= 0 && !on_path.count(at)) {
        path.push_back(at);
        on_path.insert(at);
        const auto& w = t.waits_for[static_cast<size_t>(at)];
        at = w.empty() ? -1 : w.front();
    }
    auto blocked = [&](int32_t r) -> std::pair<std::string, lang::SourceLoc> {
        const PlanRank& rank = g.ranks[static_cast<size_t>(r)];
        size_t i = t.stopped_at[static_cast<size_t>(r)];
        if (i >= rank.actions.size()) return {"has finished", {}};
        return {"waits at `" + to_string(rank.actions[i]) + "`", loc_near(rank, i)};
    };
    std::string msg;
    lang::SourceLoc loc;
    size_t first = 0;
    if (at >= 0)
        while (path[first] != at) ++first;
    for (size_t k = first; k < path.size(); ++k) {
        auto [what, l] = blocked(path[k]);
        if (!loc.valid()) loc = l;
        if (k == first)
            msg += where(g.ranks[static_cast<size_t>(path[k])]) + " " + what;
        else
            msg += ", which " + what;
        if (k + 1 < path.size())
            msg += " for rank " + std::to_string(path[k + 1]);
        else if (at >= 0)
            msg += " for rank " + std::to_string(at);
    }
    if (at >= 0)
        errors.push_back({loc, "deadlock: " + msg,
                          "reorder the actions so that each receive's sender gets to its send"});
    else
        errors.push_back({loc, "the plan cannot finish: " + msg, ""});
}

} // namespace

std::vector<PlanError> verify(const Graph& g) {
    std::vector<PlanError> errors;
    check_order(g, errors);
    check_exchanges(g, errors);
    check_messages(g, errors);
    if (errors.empty()) check_local_order(g, errors);
    check_collectives(g, errors);
    if (errors.empty()) check_deadlock(g, errors);
    return errors;
}

} // namespace dist::plan
