// local_comms.cpp: building the groups of a graph's ranks in this process.
#include "actors/runtime/local_comms.hpp"

#include "kernels/devices.hpp"
#include "transport/gloo.hpp"
#include "transport/staged.hpp"
#ifdef DIST_HAVE_NCCL
#include "transport/nccl.hpp"
#endif

#include <algorithm>
#include <future>
#include <set>
#include <unistd.h>

namespace dist::runtime {

// One group: the handles of its members in this process, created together (Gloo's members
// must join concurrently).
struct LocalComms::Group {
    std::vector<int32_t> ranks;
    bool nccl = false;
    std::unique_ptr<transport::InProcessGroup> inprocess;
    std::map<int32_t, std::unique_ptr<transport::Collectives>> members;
};

// A rank's point-to-point handle when peers live in other processes: the in-process fabric for
// ranks of this process, UCX for the others.
class LocalComms::Routed final : public transport::PointToPoint {
  public:
    Routed(std::unique_ptr<transport::PointToPoint> near,
           std::unique_ptr<transport::UcxEndpoint> far, const LocalComms& comms)
        : near_(std::move(near)), far_(std::move(far)), comms_(comms) {}
    int rank() const override { return near_->rank(); }
    void send(int peer, const transport::P2PTag& tag, const kernels::Tensor& t) override {
        if (comms_.local(peer)) return near_->send(peer, tag, t);
        // UCX carries host memory here: a GPU rank's tensor goes through the host.
        far_->send(peer, tag, t.on_host());
        far_->away(); // the rank goes on computing: its transfers move on meanwhile
    }
    kernels::Tensor recv(int peer, const transport::P2PTag& tag) override {
        if (!comms_.local(peer)) return far_->recv(peer, tag);
        far_->away(); // blocked on a neighbour here, the UCX transfers move on meanwhile
        return near_->recv(peer, tag);
    }
    void flush() override { far_->flush(); }
    void expect(int peer, const transport::P2PTag& tag) override {
        if (!comms_.local(peer)) far_->post_recv(peer, tag);
    }
    transport::UcxEndpoint* far() { return far_.get(); }

  private:
    std::unique_ptr<transport::PointToPoint> near_;
    std::unique_ptr<transport::UcxEndpoint> far_;
    const LocalComms& comms_;
};

// A rank's collective when its process has UCX transfers: before blocking in the collective,
// the rank lets its endpoint's progress thread move them on (a rendezvous over TCP whose
// sender waits in a collective for its receiver would otherwise never finish).
class LocalComms::AwayHint final : public transport::Collectives {
  public:
    AwayHint(transport::Collectives& inner, transport::UcxEndpoint& ucx)
        : inner_(inner), ucx_(ucx) {}
    int rank() const override { return inner_.rank(); }
    int size() const override { return inner_.size(); }
    void all_reduce(float* data, int64_t n, transport::ReduceOp op) override {
        ucx_.away();
        inner_.all_reduce(data, n, op);
    }
    void all_gather(const float* in, int64_t n, float* out) override {
        ucx_.away();
        inner_.all_gather(in, n, out);
    }
    void reduce_scatter(const float* in, int64_t n, float* out) override {
        ucx_.away();
        inner_.reduce_scatter(in, n, out);
    }
    void broadcast(float* data, int64_t n, int root) override {
        ucx_.away();
        inner_.broadcast(data, n, root);
    }
    void all_to_all(const float* in, const std::vector<int64_t>& send, float* out,
                    const std::vector<int64_t>& recv) override {
        ucx_.away();
        inner_.all_to_all(in, send, out, recv);
    }

  private:
    transport::Collectives& inner_;
    transport::UcxEndpoint& ucx_;
};

LocalComms::LocalComms(const plan::Graph& graph, CollectivesBackend backend,
                       std::chrono::milliseconds timeout, std::vector<kernels::Device> devices)
    : graph_(graph), backend_(backend), timeout_(timeout), devices_(std::move(devices)),
      fabric_(timeout) {
    for (const auto& r : graph.ranks) endpoints_[r.rank] = fabric_.endpoint(r.rank);
    learn_identities();
    form_groups();
}

LocalComms::LocalComms(const plan::Graph& graph, const CommsLayout& layout,
                       std::chrono::milliseconds timeout)
    : graph_(graph), backend_(CollectivesBackend::inprocess), timeout_(timeout), layout_(layout),
      devices_(layout.devices), fabric_(timeout) {
    if (layout.process_of.size() != graph.ranks.size() || !layout.store)
        throw std::logic_error("LocalComms: a layout needs every rank's process and a store");
    const int size = static_cast<int>(graph.ranks.size());
    bool spread = std::any_of(layout.process_of.begin(), layout.process_of.end(),
                              [&](int32_t p) { return p != layout.process; });
    transport::UcxOptions ucx = layout.ucx;
    ucx.timeout = timeout;
    for (const auto& r : graph.ranks) {
        if (!local(r.rank)) continue;
        auto near = fabric_.endpoint(r.rank);
        if (!spread) {
            endpoints_[r.rank] = std::move(near);
            continue;
        }
        auto routed = std::make_unique<Routed>(
            std::move(near),
            transport::make_ucx_endpoint(*layout.store, layout.prefix, r.rank, size, ucx), *this);
        ucx_[r.rank] = routed->far();
        endpoints_[r.rank] = std::move(routed);
    }
    learn_identities();
    form_groups();
}

LocalComms::~LocalComms() {
    // A group's members in this process leave it together, each from its own thread: NCCL's
    // destroy finalises with the other members, so one thread leaving for several would wait
    // for itself.
    for (auto& [key, g] : groups_) {
        if (!g->nccl || g->members.size() < 2) continue;
        std::vector<std::future<void>> leaving;
        for (auto& [rank, member] : g->members)
            leaving.push_back(std::async(std::launch::async, [&m = member] { m.reset(); }));
        for (auto& f : leaving) f.wait();
    }
}

bool LocalComms::gpu(int32_t rank) const {
    return static_cast<size_t>(rank) < devices_.size() &&
           devices_[static_cast<size_t>(rank)].kind == kernels::Device::Kind::cuda;
}

void LocalComms::learn_identities() {
    bool any = false;
    for (const auto& r : graph_.ranks) any |= local(r.rank) && gpu(r.rank);
    if (!any) return;
    identity_.assign(graph_.ranks.size(), GpuIdentity{});
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    for (const auto& r : graph_.ranks) {
        if (!local(r.rank) || !gpu(r.rank)) continue;
        kernels::Backend& b = kernels::backend_for(devices_[static_cast<size_t>(r.rank)]);
        // A stand-in device's memory is no GPU's: NCCL cannot reduce it.
        identity_[static_cast<size_t>(r.rank)] = {std::string(host) + "/" + b.identity(),
                                                  built_with_nccl() && b.nccl_memory()};
    }
    if (!layout_) return;
    // Publish ours, then read the others' (every process publishes before it reads): the NCCL
    // flag first, then the GPU.
    auto key = [&](int32_t rank) { return layout_->prefix + "/gpu." + std::to_string(rank); };
    for (const auto& r : graph_.ranks) {
        if (!local(r.rank)) continue;
        const GpuIdentity& id = identity_[static_cast<size_t>(r.rank)];
        const std::string entry = (id.nccl ? "1" : "0") + id.gpu;
        layout_->store->set(key(r.rank), std::vector<char>(entry.begin(), entry.end()));
    }
    for (const auto& r : graph_.ranks) {
        if (local(r.rank)) continue;
        std::vector<char> bytes = layout_->store->get(key(r.rank), timeout_);
        if (bytes.empty() || (bytes[0] != '0' && bytes[0] != '1'))
            throw std::runtime_error("the store's entry for rank " + std::to_string(r.rank) +
                                     "'s GPU is malformed");
        identity_[static_cast<size_t>(r.rank)] = {std::string(bytes.begin() + 1, bytes.end()),
                                                  bytes[0] == '1'};
    }
}

bool built_with_nccl() {
#ifdef DIST_HAVE_NCCL
    return true;
#else
    return false;
#endif
}

bool nccl_can_serve(const std::vector<GpuIdentity>& ids, const std::vector<int32_t>& ranks) {
    std::map<std::string, int> ranks_on; // by GPU: the job's ranks on it
    for (const GpuIdentity& id : ids)
        if (!id.gpu.empty()) ++ranks_on[id.gpu];
    for (int32_t r : ranks) {
        if (r < 0 || static_cast<size_t>(r) >= ids.size()) return false;
        const GpuIdentity& id = ids[static_cast<size_t>(r)];
        if (id.gpu.empty() || !id.nccl || ranks_on[id.gpu] != 1) return false;
    }
    return true;
}

bool LocalComms::local(int32_t rank) const {
    return !layout_ || layout_->process_of.at(static_cast<size_t>(rank)) == layout_->process;
}

namespace {

// The groups of `r`: a kind tag, then the members' ranks (two kinds of group over the same
// ranks differ), with the group's name.
std::vector<std::pair<std::vector<int32_t>, std::string>> groups_of(const plan::Graph& graph,
                                                                    const plan::PlanRank& me) {
    std::vector<int32_t> tp{0}, dp{1}, model{2}, cp{4};
    for (const auto& r : graph.ranks) {
        if (r.dp == me.dp && r.pp == me.pp && r.cp == me.cp) tp.push_back(r.rank);
        if (r.pp == me.pp && r.tp == me.tp) dp.push_back(r.rank);
        if (r.dp == me.dp && r.cp == me.cp) model.push_back(r.rank);
        if (r.dp == me.dp && r.pp == me.pp && r.tp == me.tp) cp.push_back(r.rank);
    }
    std::vector<std::pair<std::vector<int32_t>, std::string>> out = {
        {tp, "tp group"}, {dp, "dp group"}, {model, "model group"}, {cp, "cp group"}};
    if (graph.ep > 1) {
        // Expert parallelism within one (pp, tp) position's dp x cp ranks, numbered
        // q = dp_index cp + cp_index: ep consecutive q share the experts (the all-to-alls,
        // Graph::expert_group), and the q equal modulo ep hold the same experts (their
        // gradients' reduction, among the replica group).
        auto q = [&](const plan::PlanRank& r) { return r.dp * graph.cp + r.cp; };
        std::vector<int32_t> ep{5}, edp{6};
        for (int32_t r : graph.expert_group(me)) ep.push_back(r);
        for (int32_t r : graph.replica_group(me))
            if (q(graph.ranks[static_cast<size_t>(r)]) % graph.ep == q(me) % graph.ep)
                edp.push_back(r);
        out.push_back({ep, "ep group"});
        out.push_back({edp, "expert dp group"});
    }
    if (!graph.stages.empty()) {
        int32_t first = graph.stages.front().pp, last = graph.stages.back().pp;
        if (first != last && (me.pp == first || me.pp == last))
            out.push_back({{3, graph.rank_of(me.dp, first, me.tp, me.cp),
                            graph.rank_of(me.dp, last, me.tp, me.cp)},
                           "tied embedding group"});
    }
    return out;
}

} // namespace

void LocalComms::form_groups() {
    // Every process walks the same groups in the same order (the ranks', then each rank's
    // kinds), forming those it has members in.
    std::set<std::vector<int32_t>> seen;
    for (const auto& me : graph_.ranks)
        for (auto& [key, name] : groups_of(graph_, me)) {
            if (key.size() < 3 || !seen.insert(key).second) continue;
            std::vector<int32_t> ranks(key.begin() + 1, key.end());
            std::vector<int32_t> mine;
            for (int32_t r : ranks)
                if (local(r)) mine.push_back(r);
            if (mine.empty()) continue;
            auto g = std::make_unique<Group>();
            g->ranks = ranks;
            const int size = static_cast<int>(ranks.size());
            auto index = [&](int32_t r) {
                return static_cast<int>(std::find(ranks.begin(), ranks.end(), r) - ranks.begin());
            };
            const bool within = mine.size() == ranks.size();
            std::string prefix = (layout_ ? layout_->prefix + "/" : std::string()) + name;
            for (int32_t r : ranks) prefix += "." + std::to_string(r);
            // Groups other than the model replica's (kind 2: a host scalar) reduce the device
            // memory of GPU ranks.
            const bool on_gpu = key[0] != 2 && gpu(mine.front());
            const bool nccl = on_gpu && nccl_can_serve(identity_, ranks);
            g->nccl = nccl;
            if (nccl) {
#ifdef DIST_HAVE_NCCL
                transport::KeyValueStore& store = within ? store_ : *layout_->store;
                std::vector<std::future<std::unique_ptr<transport::Collectives>>> joining;
                for (int32_t r : mine)
                    joining.push_back(std::async(std::launch::async, [&, r] {
                        return transport::make_nccl_collectives(
                            store, prefix + "/nccl", index(r), size,
                            devices_[static_cast<size_t>(r)].index, timeout_);
                    }));
                for (size_t i = 0; i < mine.size(); ++i) g->members[mine[i]] = joining[i].get();
                device_collectives_ = "nccl";
#endif
            } else if (within && backend_ == CollectivesBackend::inprocess) {
                g->inprocess = std::make_unique<transport::InProcessGroup>(size, name, timeout_);
                for (int32_t r : ranks) g->members[r] = g->inprocess->member(index(r));
            } else {
                transport::KeyValueStore& store = within ? store_ : *layout_->store;
                transport::GlooOptions o;
                o.timeout = timeout_;
                if (layout_) o.hostname = layout_->gloo_host;
                std::vector<std::future<std::unique_ptr<transport::Collectives>>> joining;
                for (int32_t r : mine)
                    joining.push_back(std::async(std::launch::async, [&, r] {
                        return transport::make_gloo_collectives(store, prefix, index(r), size, o);
                    }));
                for (size_t i = 0; i < mine.size(); ++i) g->members[mine[i]] = joining[i].get();
            }
            if (on_gpu && !nccl) {
                for (int32_t r : mine)
                    g->members[r] = transport::make_host_staged(
                        std::move(g->members[r]),
                        kernels::backend_for(devices_[static_cast<size_t>(r)]).allocator());
                if (device_collectives_.empty()) device_collectives_ = "staged";
            }
            groups_[key] = std::move(g);
        }
}

transport::Collectives* LocalComms::member(const std::vector<int32_t>& key, int32_t rank) const {
    auto it = groups_.find(key);
    if (it == groups_.end()) return nullptr; // a group of one
    return it->second->members.at(rank).get();
}

RankComms LocalComms::for_rank(int32_t rank) {
    const plan::PlanRank& me = graph_.ranks.at(static_cast<size_t>(rank));
    RankComms c;
    c.p2p = endpoints_.at(rank).get();
    for (auto& [key, name] : groups_of(graph_, me)) {
        transport::Collectives* g = member(key, rank);
        if (name == "tp group")
            c.tp = g;
        else if (name == "dp group")
            c.dp = g;
        else if (name == "model group")
            c.model = g;
        else if (name == "cp group")
            c.cp = g;
        else if (name == "tied embedding group")
            c.tied = g;
        else if (name == "ep group")
            c.ep = g;
        else if (name == "expert dp group")
            c.edp = g;
    }
    auto far = ucx_.find(rank);
    if (far == ucx_.end()) return c;
    for (transport::Collectives** g : {&c.tp, &c.dp, &c.model, &c.cp, &c.tied, &c.ep, &c.edp}) {
        if (!*g) continue;
        auto& hint = hints_[{rank, *g}];
        if (!hint) hint = std::make_unique<AwayHint>(**g, *far->second);
        *g = hint.get();
    }
    return c;
}

void LocalComms::abort(const std::string& why) {
    fabric_.abort(why);
    for (auto& [rank, ucx] : ucx_) ucx->abort(why);
    for (auto& [key, g] : groups_) {
        if (g->inprocess) g->inprocess->abort(why);
        for (auto& [rank, member] : g->members) member->abort(); // NCCL's waits
    }
}

RankTraffic LocalComms::traffic(int32_t rank) const {
    RankTraffic t;
    auto it = ucx_.find(rank);
    if (it == ucx_.end()) return t;
    transport::UcxStats s = it->second->stats();
    for (size_t peer = 0; peer < s.sent.size() || peer < s.received.size(); ++peer) {
        PeerTraffic p;
        bool any = false;
        for (size_t d = 0; d < 2; ++d) {
            if (peer < s.sent.size()) p.sent[d] = s.sent[peer][d];
            if (peer < s.received.size()) p.received[d] = s.received[peer][d];
            any |= p.sent[d].messages > 0 || p.received[d].messages > 0;
        }
        if (any) t[static_cast<int32_t>(peer)] = p;
    }
    return t;
}

} // namespace dist::runtime
