// ucx.hpp: point-to-point transfer of activations and their gradients between processes (and
// hosts) over UCX's tagged messages.
//
// Each endpoint owns one UCX context and one worker. At creation it publishes its worker address
// in a KeyValueStore under `<prefix>/ucx/<rank>`; the connection to a peer is made on the first
// send to or receive from it, reading the peer's address from the store. No UCX type crosses
// this header.
//
// Wire format: a message is a header (magic, version, dtype, shape, byte count) followed, for
// tensors of at most `kUcxInlineBytes`, by the data in the same UCX message; a larger tensor
// follows as a second message whose bytes UCX moves straight between the two tensors' storage
// (rendezvous, zero-copy where the transport allows).
//
// The 64-bit UCX tag (bit 63 first):
//   [63]     part: 0 the header, 1 the data of a large tensor
//   [62..47] the sending rank (16 bits: ranks 0..65535)
//   [46]     direction: 0 activation, 1 gradient
//   [45..34] stage (12 bits: 0..4095)
//   [33..20] microbatch (14 bits: 0..16383)
//   [19..0]  step modulo 2^20. Only a few consecutive steps are ever in flight, so steps a
//            multiple of 2^20 apart never meet; a negative step is refused.
// A rank, stage or microbatch outside its range is refused with a TransportError naming it.
//
// Threads: an endpoint is driven by one thread (its rank's worker): send, recv, post_recv and
// flush must not be called concurrently. `abort` and `rank` may be called from any thread.
// Progress happens inside those calls; waiting sleeps on the worker's event file descriptor
// (ucp_worker_arm + poll) instead of spinning. A send that has not completed moves on only while
// its thread is inside the endpoint (the next send, recv or flush).
//
// Destruction waits (up to the timeout) for this endpoint's sends to complete, unless it was
// aborted, then closes its connections gracefully: each close waits up to 2 s for the peer to
// answer, so peers should close at about the same time (as the processes of a job do).
#pragma once

#include "transport/p2p.hpp"
#include "transport/store.hpp"

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

namespace dist::transport {

/// Tensors of at most this many bytes travel inside the header message (one UCX message).
inline constexpr size_t kUcxInlineBytes = 8192;

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

/// Bytes and message counts through one endpoint.
struct UcxStats {
    uint64_t messages_sent = 0;
    uint64_t bytes_sent = 0; // tensor bytes, headers excluded
    uint64_t messages_received = 0;
    uint64_t bytes_received = 0;
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
    /// Posts the receive of (`peer`, `tag`) ahead of `recv`, so a large tensor lands in its
    /// final buffer as soon as it arrives. The later `recv` of the same pair returns it.
    virtual void post_recv(int peer, const P2PTag& tag) = 0;
    /// Waits (up to the timeout) until every send has completed.
    virtual void flush() = 0;
    /// Fails every waiting and later call with `why`; callable from any thread.
    virtual void abort(const std::string& why) = 0;
    virtual UcxStats stats() const = 0;
};

/// Creates `rank`'s endpoint of a group of `size` meeting under `prefix` in `store`, publishing
/// its worker address there. Throws TransportError with the failing UCX call, its file:line and
/// UCX's status string when UCX cannot start.
std::unique_ptr<UcxEndpoint> make_ucx_endpoint(KeyValueStore& store, const std::string& prefix,
                                               int rank, int size, const UcxOptions& options = {});

/// The UCX tag of (`source`, `tag`) for the header (`data_part` false) or data message; throws
/// TransportError when a field does not fit the layout above. Exposed for tests.
uint64_t ucx_tag(int source, const P2PTag& tag, bool data_part);

} // namespace dist::transport
