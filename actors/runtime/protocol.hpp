// protocol.hpp: the runtime's wire types between actors: the atoms of the control plane, a
// worker's answer to a step, and the traffic figures it carries. Shared by the coordinator, the
// member and the worker actors (and nothing outside actors/runtime: CAF stays here).
//
// Joining a job of several processes, protocol version 2:
//   member -> coordinator  challenge(member nonce)
//   coordinator -> member  (coordinator nonce, HMAC(token, "coordinator", member nonce,
//                           coordinator nonce))       the coordinator proves the token
//                          or ("", why not) once the job has started
//   member -> coordinator  hello(version, HMAC(token, "member", coordinator nonce, digest,
//                           process, pid, host), coordinator nonce, digest, process, pid, host,
//                           actor)
//   coordinator -> member  (refusal or "", where process 0 runs: "host H, pid P")
// A coordinator nonce answers one hello (a replayed hello is refused); the token never crosses
// the wire.
#pragma once

#include "actors/runtime/job.hpp"

#include <caf/all.hpp>

#include <string>
#include <vector>

namespace dist::runtime {

/// A peer that speaks another version is refused at hello.
constexpr int32_t protocol_version = 2;

using run_atom = caf::atom_constant<caf::atom("run")>;
using start_atom = caf::atom_constant<caf::atom("start")>;
using tick_atom = caf::atom_constant<caf::atom("tick")>;
using challenge_atom = caf::atom_constant<caf::atom("challenge")>;
using hello_atom = caf::atom_constant<caf::atom("hello")>;
using worker_atom = caf::atom_constant<caf::atom("worker")>;
using ready_atom = caf::atom_constant<caf::atom("ready")>;
using beat_atom = caf::atom_constant<caf::atom("beat")>;
using alive_atom = caf::atom_constant<caf::atom("alive")>;
using set_atom = caf::atom_constant<caf::atom("store_set")>;
using get_atom = caf::atom_constant<caf::atom("store_get")>;
using abort_atom = caf::atom_constant<caf::atom("abort")>;
using done_atom = caf::atom_constant<caf::atom("done")>;
using gather_atom = caf::atom_constant<caf::atom("gather")>;
using ok_atom = caf::atom_constant<caf::atom("ok")>;
using abandon_atom = caf::atom_constant<caf::atom("abandon")>;
using give_up_atom = caf::atom_constant<caf::atom("give_up")>;
using stop_atom = caf::atom_constant<caf::atom("stop")>;
/// Coordinator -> the thread that runs the job: a step's report waits in Net::report.
using stepped_atom = caf::atom_constant<caf::atom("stepped")>;
/// That thread -> coordinator: the report was handled; go on (true) or end ("" or a failure).
using next_atom = caf::atom_constant<caf::atom("next")>;

/// A worker's answer to "run step s".
struct StepOutcome {
    int32_t rank = -1;
    bool ok = false;
    std::string action, cause; // when not ok
    double loss_sum = 0;
    int64_t loss_microbatches = 0;
    double grad_norm = 0, lr = 0, step_time_s = 0;
    /// "" when the step updated the weights, else the non-finite value ("loss", "gradient
    /// norm") for which every rank skipped the update.
    std::string nonfinite;
    /// (action index, start, end, seconds on a core) quadruples; a collective run for action i
    /// (ActionTiming::collective) has index -(i + 1); a negative time on a core: not measured.
    std::vector<double> timings;
    /// This step's traffic with other processes: per peer, its rank, then per direction sent
    /// (messages, bytes, seconds) and received (messages, bytes, seconds).
    std::vector<double> traffic;
    /// RankStepResult::experts: dropped, routed, aux sum, aux terms, then the load per expert
    /// (empty without experts).
    std::vector<double> experts;
};

template <class Inspector> typename Inspector::result_type inspect(Inspector& f, StepOutcome& x) {
    return f(caf::meta::type_name("StepOutcome"), x.rank, x.ok, x.action, x.cause, x.loss_sum,
             x.loss_microbatches, x.grad_norm, x.lr, x.step_time_s, x.nonfinite, x.timings,
             x.traffic, x.experts);
}

/// A rank's traffic as the flat list StepOutcome carries, and back.
std::vector<double> encode(const RankTraffic& t);
RankTraffic decode(const std::vector<double>& v);
/// The traffic of a step: the totals after it minus those before.
RankTraffic minus(const RankTraffic& after, const RankTraffic& before);

/// The contract between the coordinator and the workers.
using worker_actor = caf::typed_actor<caf::replies_to<run_atom, int64_t>::with<StepOutcome>>;

/// A rank's worker: runs `ex`'s steps on `data` with `threads` OpenMP threads when asked.
worker_actor::behavior_type worker(worker_actor::pointer, RankExecutor* ex,
                                   const models::TokenData* data, int threads, LocalComms* comms);

/// The actor system's settings for a job: with the middleman when it spans processes, and
/// CAF's OpenSSL module on top when `tls` names a certificate (mutual TLS on the control plane).
void configure(caf::actor_system_config& cfg, bool middleman, const TlsFiles* tls = nullptr);

} // namespace dist::runtime
