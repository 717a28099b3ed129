// worker.cpp: a rank's worker actor (runs its executor's step when the coordinator asks) and
// the wire form of the step's traffic figures.
#include "actors/runtime/protocol.hpp"

#include <caf/io/all.hpp>
#include <caf/openssl/all.hpp>
#include <omp.h>

namespace dist::runtime {

namespace {
constexpr size_t per_peer = 13; // the peer, then 2 directions x (sent, received) x 3 figures
} // namespace

std::vector<double> encode(const RankTraffic& t) {
    std::vector<double> v;
    for (const auto& [peer, p] : t) {
        v.push_back(peer);
        for (size_t d = 0; d < 2; ++d)
            for (const auto* x : {&p.sent[d], &p.received[d]})
                v.insert(v.end(), {static_cast<double>(x->messages), static_cast<double>(x->bytes),
                                   x->seconds});
    }
    return v;
}

RankTraffic decode(const std::vector<double>& v) {
    RankTraffic t;
    for (size_t i = 0; i + per_peer <= v.size();) {
        PeerTraffic& p = t[static_cast<int32_t>(v[i++])];
        for (size_t d = 0; d < 2; ++d)
            for (auto* x : {&p.sent[d], &p.received[d]}) {
                x->messages = static_cast<uint64_t>(v[i++]);
                x->bytes = static_cast<uint64_t>(v[i++]);
                x->seconds = v[i++];
            }
    }
    return t;
}

RankTraffic minus(const RankTraffic& after, const RankTraffic& before) {
    RankTraffic t;
    for (const auto& [peer, a] : after) {
        PeerTraffic p = a;
        if (auto it = before.find(peer); it != before.end())
            for (size_t d = 0; d < 2; ++d)
                for (auto [x, y] : {std::pair{&p.sent[d], &it->second.sent[d]},
                                    {&p.received[d], &it->second.received[d]}}) {
                    x->messages -= y->messages;
                    x->bytes -= y->bytes;
                    x->seconds -= y->seconds;
                }
        bool any = false;
        for (size_t d = 0; d < 2; ++d) any |= p.sent[d].messages > 0 || p.received[d].messages > 0;
        if (any) t[peer] = p;
    }
    return t;
}

worker_actor::behavior_type worker(worker_actor::pointer, RankExecutor* ex,
                                   const models::TokenData* data, int threads, LocalComms* comms) {
    auto last = std::make_shared<RankTraffic>();
    return {[=](run_atom, int64_t step) -> StepOutcome {
        // The worker's share of the cores (an OpenMP setting of this thread only).
        omp_set_num_threads(threads);
        StepOutcome o;
        o.rank = ex->rank();
        try {
            RankStepResult r = ex->run_step(step, *data);
            o.ok = true;
            o.loss_sum = r.loss_sum;
            o.loss_microbatches = r.loss_microbatches;
            o.grad_norm = r.grad_norm;
            o.lr = r.lr;
            o.step_time_s = r.step_time_s;
            o.nonfinite = r.nonfinite;
            if (!r.experts.empty()) {
                const models::ExpertStats& e = r.experts;
                o.experts = {static_cast<double>(e.dropped), static_cast<double>(e.routed),
                             e.aux_loss, static_cast<double>(e.aux_terms)};
                for (int64_t l : e.load) o.experts.push_back(static_cast<double>(l));
            }
            for (const auto& t : r.timings) {
                const double at = static_cast<double>(t.action);
                o.timings.insert(o.timings.end(),
                                 {t.collective ? -(at + 1) : at, t.start_s, t.end_s, t.cpu_s});
            }
            RankTraffic now = comms->traffic(ex->rank());
            o.traffic = encode(minus(now, *last));
            *last = now;
        } catch (const std::exception& e) {
            o.action = ex->current_action();
            o.cause = e.what();
        } catch (...) {
            o.action = ex->current_action();
            o.cause = "an exception that is not a std::exception";
        }
        return o;
    }};
}

void configure(caf::actor_system_config& cfg, bool middleman, const TlsFiles* tls) {
    cfg.add_message_type<StepOutcome>("StepOutcome");
    // The workers are detached (a thread each); the scheduler runs the coordinator (and the
    // member actor). Threads that sleep on a queue, not work-stealing threads that poll: on a
    // small machine polling threads take the cores the ranks compute on.
    cfg.set("scheduler.policy", caf::atom("sharing"));
    cfg.set("scheduler.max-threads", static_cast<size_t>(middleman ? 2 : 1));
    if (middleman) {
        cfg.load<caf::io::middleman>();
        cfg.set("middleman.enable-automatic-connections", false);
    }
    if (middleman && tls && tls->enabled()) {
        // Every connection then presents this node's certificate and requires the peer's, both
        // signed by the CA (SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT in CAF 0.17).
        cfg.load<caf::openssl::manager>();
        cfg.openssl_certificate = tls->cert;
        cfg.openssl_key = tls->key;
        cfg.openssl_cafile = tls->ca;
    }
}

} // namespace dist::runtime
