// p2p.cpp: tags and the in-process fabric.
#include "transport/p2p.hpp"

namespace dist::transport {

std::string P2PTag::str() const {
    return "step " + std::to_string(step) + ", stage " + std::to_string(stage) + ", microbatch " +
           std::to_string(microbatch) + ", " +
           (direction == Direction::activation ? "activation" : "gradient");
}

class InProcessEndpoint final : public PointToPoint {
  public:
    InProcessEndpoint(InProcessFabric& fabric, int rank) : fabric_(fabric), rank_(rank) {}
    int rank() const override { return rank_; }
    void send(int peer, const P2PTag& tag, const kernels::Tensor& t) override {
        fabric_.put(rank_, peer, tag, t);
    }
    kernels::Tensor recv(int peer, const P2PTag& tag) override {
        return fabric_.take(peer, rank_, tag);
    }

  private:
    InProcessFabric& fabric_;
    int rank_;
};

std::unique_ptr<PointToPoint> InProcessFabric::endpoint(int rank) {
    return std::make_unique<InProcessEndpoint>(*this, rank);
}

void InProcessFabric::abort(const std::string& why) {
    std::lock_guard lock(mutex_);
    if (abort_reason_.empty()) abort_reason_ = why;
    wake_all();
}

void InProcessFabric::wake_all() {
    for (auto& [rank, arrival] : arrivals_) arrival.notify_all();
}

size_t InProcessFabric::pending() const {
    std::lock_guard lock(mutex_);
    return mail_.size();
}

void InProcessFabric::put(int from, int to, const P2PTag& tag, const kernels::Tensor& t) {
    std::lock_guard lock(mutex_);
    if (!abort_reason_.empty())
        throw TransportError("send from rank " + std::to_string(from) + " to rank " +
                             std::to_string(to) + " (" + tag.str() +
                             ") after abort: " + abort_reason_);
    if (!mail_.emplace(Key{from, to, tag}, t).second)
        throw TransportError("rank " + std::to_string(from) + " sent " + tag.str() + " to rank " +
                             std::to_string(to) + " twice");
    if (auto it = arrivals_.find(to); it != arrivals_.end()) it->second.notify_all();
}

kernels::Tensor InProcessFabric::take(int from, int to, const P2PTag& tag) {
    std::unique_lock lock(mutex_);
    Key key{from, to, tag};
    auto ready = [&] { return !abort_reason_.empty() || mail_.count(key) != 0; };
    std::condition_variable& arrival = arrivals_[to];
    if (!arrival.wait_for(lock, timeout_, ready)) {
        abort_reason_ = "rank " + std::to_string(to) + " waited " +
                        std::to_string(timeout_.count()) + " ms for " + tag.str() + " from rank " +
                        std::to_string(from);
        wake_all();
    }
    auto it = mail_.find(key);
    if (it == mail_.end())
        throw TransportError("receive on rank " + std::to_string(to) + " of " + tag.str() +
                             " from rank " + std::to_string(from) + " failed: " + abort_reason_);
    kernels::Tensor t = std::move(it->second);
    mail_.erase(it);
    return t;
}

} // namespace dist::transport
