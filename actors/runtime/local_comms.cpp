// local_comms.cpp: building the groups of a graph inside one process.
#include "actors/runtime/local_comms.hpp"

#include "transport/gloo.hpp"

#include <algorithm>
#include <future>

namespace dist::runtime {

// One group: its members' handles, created together (Gloo's members must join concurrently).
struct LocalComms::Group {
    std::vector<int32_t> ranks;
    std::unique_ptr<transport::InProcessGroup> inprocess;
    std::vector<std::unique_ptr<transport::Collectives>> members;
};

LocalComms::LocalComms(const plan::Graph& graph, CollectivesBackend backend,
                       std::chrono::milliseconds timeout)
    : graph_(graph), backend_(backend), timeout_(timeout), fabric_(timeout) {
    for (const auto& r : graph.ranks) endpoints_.push_back(fabric_.endpoint(r.rank));
}

LocalComms::~LocalComms() = default;

transport::Collectives* LocalComms::join(const std::vector<int32_t>& key, int32_t rank,
                                         const std::string& name) {
    // key = a kind tag, then the members' ranks: two kinds of group over the same ranks differ.
    std::vector<int32_t> ranks(key.begin() + 1, key.end());
    if (ranks.size() < 2) return nullptr;
    auto& g = groups_[key];
    if (!g) {
        g = std::make_unique<Group>();
        g->ranks = ranks;
        int size = static_cast<int>(ranks.size());
        if (backend_ == CollectivesBackend::inprocess) {
            g->inprocess = std::make_unique<transport::InProcessGroup>(size, name, timeout_);
            for (int i = 0; i < size; ++i) g->members.push_back(g->inprocess->member(i));
        } else {
            std::string prefix = name;
            for (int32_t r : ranks) prefix += "." + std::to_string(r);
            std::vector<std::future<std::unique_ptr<transport::Collectives>>> joining;
            for (int i = 0; i < size; ++i)
                joining.push_back(std::async(std::launch::async, [&, i] {
                    transport::GlooOptions o;
                    o.timeout = timeout_;
                    return transport::make_gloo_collectives(store_, prefix, i, size, o);
                }));
            for (auto& j : joining) g->members.push_back(j.get());
        }
    }
    auto it = std::find(g->ranks.begin(), g->ranks.end(), rank);
    return g->members[static_cast<size_t>(it - g->ranks.begin())].get();
}

RankComms LocalComms::for_rank(int32_t rank) {
    const plan::PlanRank& me = graph_.ranks.at(static_cast<size_t>(rank));
    RankComms c;
    c.p2p = endpoints_.at(static_cast<size_t>(rank)).get();
    std::vector<int32_t> tp{0}, dp{1}, model{2};
    for (const auto& r : graph_.ranks) {
        if (r.dp == me.dp && r.pp == me.pp) tp.push_back(r.rank);
        if (r.pp == me.pp && r.tp == me.tp) dp.push_back(r.rank);
        if (r.dp == me.dp) model.push_back(r.rank);
    }
    c.tp = join(tp, rank, "tp group");
    c.dp = join(dp, rank, "dp group");
    c.model = join(model, rank, "model group");
    if (!graph_.stages.empty()) {
        int32_t first = graph_.stages.front().pp, last = graph_.stages.back().pp;
        if (first != last && (me.pp == first || me.pp == last))
            c.tied =
                join({3, graph_.rank_of(me.dp, first, me.tp), graph_.rank_of(me.dp, last, me.tp)},
                     rank, "tied embedding group");
    }
    return c;
}

void LocalComms::abort(const std::string& why) {
    fabric_.abort(why);
    for (auto& [key, g] : groups_)
        if (g->inprocess) g->inprocess->abort(why);
}

} // namespace dist::runtime
