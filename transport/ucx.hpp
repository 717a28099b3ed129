// ucx.hpp: point-to-point transfer of activations and their gradients between processes (and
// hosts) over UCX's tagged messages.
//
// Each endpoint owns one UCX context and one worker. At creation it publishes its worker address
// in a KeyValueStore under `<prefix>/ucx/<rank>`; the connection to a peer is made on the first
// send to or receive from it, reading the peer's address from the store. No UCX type crosses
// this header.
//
// Messages and the 64-bit UCX tag that matches them to receives: ucx_wire.hpp. A tag carries
// the sending rank, step, stage, microbatch and direction; what does not fit is refused.
//
// Threads: an endpoint is driven by one thread (its rank's worker): send, recv, post_recv and
// flush must not be called concurrently. `abort`, `away` and `rank` may be called from any
// thread (a rank's data-parallel reducer says `away` before it blocks in a collective).
// Progress happens inside those calls, and between them on the endpoint's own progress thread,
// so that transfers move on while the rank waits in a collective or computes (a rendezvous
// transfer over TCP needs both sides to progress). The progress thread steps in when told the
// rank is going to block elsewhere (`away`), or when the rank has made no call for a quarter
// of a second with transfers in flight; calls in quick succession progress the worker
// themselves. Every wait sleeps on the worker's event file descriptor (ucp_worker_arm + poll)
// instead of spinning; the two threads take turns on the worker under a mutex.
//
// Destruction waits (up to the timeout) for this endpoint's sends to complete, unless it was
// aborted, then closes its connections gracefully: each close waits up to 2 s for the peer to
// answer, so peers should close at about the same time (as the processes of a job do).
#pragma once

#include "transport/p2p.hpp"
#include "transport/store.hpp"
#include "transport/ucx_wire.hpp"

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace dist::transport {

struct UcxOptions {
    /// How long a receive (or the connection to a peer, or the final flush) may wait.
    std::chrono::milliseconds timeout = std::chrono::minutes(5);
    /// UCX_TLS for this endpoint ("sm,self", "tcp,self", ...); empty: the environment's
    /// UCX_TLS, else UCX's own choice.
    std::string transports;
    /// UCX_NET_DEVICES for this endpoint ("lo" keeps TCP on loopback); empty: as transports.
    std::string net_devices;
    /// Asks UCX to report a peer's failure (UCP_ERR_HANDLING_MODE_PEER), which fails receives
    /// from that peer at once. UCX 1.13's shared-memory transports cannot do it, so it confines
    /// the endpoint to TCP; off by default, where the control plane notices failures and calls
    /// `abort`.
    bool detect_peer_failure = false;
    /// How long a wait keeps polling the worker before it sleeps on the event fd: a little
    /// spinning saves a wake-up on short round trips; 0 sleeps at once (two processes that
    /// spin on two shared cores slow each other down).
    std::chrono::microseconds spin{0};
};

/// Traffic with one peer in one direction of the pipeline.
struct UcxTraffic {
    uint64_t messages = 0;
    uint64_t bytes = 0; // tensor bytes, headers excluded
    double seconds = 0; // sends: time spent posting them; receives: time spent waiting in recv

    UcxTraffic& operator+=(const UcxTraffic& o) {
        messages += o.messages;
        bytes += o.bytes;
        seconds += o.seconds;
        return *this;
    }
};

/// What went through one endpoint, by peer rank and kind: `sent[peer][d]`, `received[peer][d]`
/// with d = 0 for activations, 1 for gradients (the order of Direction).
struct UcxStats {
    std::vector<std::array<UcxTraffic, 2>> sent, received;

    static UcxTraffic total(const std::vector<std::array<UcxTraffic, 2>>& by_peer) {
        UcxTraffic t;
        for (const auto& kinds : by_peer)
            for (const auto& k : kinds) t += k;
        return t;
    }
};

class UcxEndpoint : public PointToPoint {
  public:
    /// Sends `t` to `peer` without waiting for the transfer: the endpoint keeps a reference to
    /// the tensor's storage until UCX has finished with it, so the caller may drop its copy
    /// (but must not write the data). A device tensor is staged through host memory.
    void send(int peer, const P2PTag& tag, const kernels::Tensor& t) override = 0;
    /// The tensor `peer` sent under `tag`, in host memory. Throws TransportError naming the tag
    /// and the peer after the timeout, after `abort`, or when the connection to the peer fails.
    kernels::Tensor recv(int peer, const P2PTag& tag) override = 0;
    /// Posts the receive of (`peer`, `tag`) ahead of `recv`: once its header has arrived, any
    /// call into the endpoint allocates the tensor and posts the receive of its data, which UCX
    /// then moves in as the sender offers it. The later `recv` of the same pair returns it;
    /// posting the same pair twice is refused. (A tag sent twice is not detected: the second
    /// message waits unmatched.)
    virtual void post_recv(int peer, const P2PTag& tag) = 0;
    /// Waits (up to the timeout) until every send has completed.
    void flush() override = 0;
    /// Says that the endpoint's thread is about to block outside it (in a collective, or on a
    /// receive from a rank of its own process): the progress thread moves the transfers in
    /// flight on at once, until the thread's next call. Without the hint it steps in only after
    /// the thread has stayed away for a while (a quarter of a second).
    virtual void away() = 0;
    /// Fails every waiting and later call with `why`; callable from any thread.
    virtual void abort(const std::string& why) = 0;
    /// From the endpoint's own thread.
    virtual UcxStats stats() const = 0;
};

/// Creates `rank`'s endpoint of a group of `size` meeting under `prefix` in `store`, publishing
/// its worker address there. Throws TransportError with the failing UCX call, its file:line and
/// UCX's status string when UCX cannot start.
std::unique_ptr<UcxEndpoint> make_ucx_endpoint(KeyValueStore& store, const std::string& prefix,
                                               int rank, int size, const UcxOptions& options = {});

} // namespace dist::transport
