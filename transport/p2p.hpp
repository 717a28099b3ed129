// p2p.hpp: point-to-point transfer of activations and their gradients between pipeline stages.
//
// Every message is tagged by (step, stage, microbatch, direction), which the plan makes unique:
// a receive names exactly one send. Backends: the in-process fabric below (ranks that are
// threads of one process hand tensors over without a copy) and UCX across processes.
#pragma once

#include "kernels/tensor.hpp"

#include <chrono>
#include <compare>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>

namespace dist::transport {

enum class Direction : uint8_t { activation, gradient };

struct P2PTag {
    int64_t step = 0;
    int32_t stage = 0; // the stage that sends an activation / receives its gradient
    int32_t microbatch = 0;
    Direction direction = Direction::activation;

    auto operator<=>(const P2PTag&) const = default;
    /// "step 3, stage 1, microbatch 2, activation".
    std::string str() const;
};

/// A transfer that cannot complete: the fabric was aborted, or the peer did not send in time.
class TransportError : public std::runtime_error {
  public:
    using std::runtime_error::runtime_error;
};

class PointToPoint {
  public:
    virtual ~PointToPoint() = default;
    virtual int rank() const = 0;
    /// Hands `t` to rank `peer`. The tensor must not be written afterwards (in process it is
    /// shared, not copied).
    virtual void send(int peer, const P2PTag& tag, const kernels::Tensor& t) = 0;
    /// The tensor `peer` sent under `tag`, waiting for it if needed.
    virtual kernels::Tensor recv(int peer, const P2PTag& tag) = 0;
    /// Waits until every send has been delivered, where delivery needs this endpoint's help
    /// (a transfer between processes moves on only while its sender's thread is inside the
    /// endpoint): the end of a rank's step calls it.
    virtual void flush() {}
    /// Announces a receive that will follow, so that a transport can post it ahead (UCX then
    /// moves the data in as it arrives, instead of holding it as unexpected). Optional.
    virtual void expect(int peer, const P2PTag& tag) {
        (void)peer;
        (void)tag;
    }
};

/// Mailboxes shared by the ranks of one process.
class InProcessFabric {
  public:
    explicit InProcessFabric(std::chrono::milliseconds timeout = std::chrono::minutes(5))
        : timeout_(timeout) {}

    /// The endpoint of `rank`.
    std::unique_ptr<PointToPoint> endpoint(int rank);
    /// Fails every waiting and later receive with `why`.
    void abort(const std::string& why);
    /// Messages sent and not yet received (0 at the end of a sound step).
    size_t pending() const;

  private:
    friend class InProcessEndpoint;
    void put(int from, int to, const P2PTag& tag, const kernels::Tensor& t);
    kernels::Tensor take(int from, int to, const P2PTag& tag);
    /// Wakes every waiting receive (mutex_ held): the fabric has failed.
    void wake_all();

    using Key = std::tuple<int, int, P2PTag>;
    std::chrono::milliseconds timeout_;
    mutable std::mutex mutex_;
    // Each receiving rank waits on its own: a send wakes its receiver, not every rank waiting.
    std::map<int, std::condition_variable> arrivals_;
    std::map<Key, kernels::Tensor> mail_;
    std::string abort_reason_;
};

} // namespace dist::transport
