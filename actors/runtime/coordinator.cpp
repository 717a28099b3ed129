// coordinator.cpp: process 0's coordinator actor. It admits the other processes (a
// challenge-response on the job's token, the plan's digest), serves the job's key-value store,
// starts every step on every rank's worker, hands each step's report to the thread that runs
// the job (Job::run calls on_step there, never in this actor, so that a checkpoint's gather or
// a slow callback holds up neither heartbeats nor the store), and supervises: heartbeats both
// ways, the watchdog, lost processes, and the abandon of ranks stuck in a failed step.
#include "actors/runtime/auth.hpp"
#include "actors/runtime/control_store.hpp"
#include "actors/runtime/net.hpp"

#include <chrono>
#include <map>
#include <set>
#include <unistd.h>

namespace dist::runtime {

namespace {

// A process other than 0, as the coordinator knows it.
struct Member {
    caf::actor actor;
    std::string host;
    int32_t pid = 0;
    bool ready = false;
    bool lost = false;    // gone: no end to tell it
    bool leaving = false; // said it ends itself after the job failed (not a cause)
    std::chrono::steady_clock::time_point last_beat;
    uint64_t progress = 0;
    std::string actions; // "rank 4 in 1F3; rank 5 finished its step"
};

struct CoordinatorState {
    Job::Net* net = nullptr;
    std::vector<worker_actor> workers; // by rank
    std::map<int32_t, Member> members; // by process
    std::set<caf::node_id> accepted;   // nodes whose messages are heard
    bool own_ready = false;
    bool start_requested = false, started = false;
    std::chrono::steady_clock::time_point created;
    std::map<std::string, std::string> store;
    std::map<std::string, std::vector<caf::response_promise>> waiting;
    int64_t step = 0;
    size_t pending = 0;
    std::vector<bool> replied; // by rank, this step
    std::vector<StepOutcome> replies;
    std::string failure;
    std::string lost_note; // the first lost process, which the final failure names first
    bool finished = false;
    caf::response_promise promise;
    caf::strong_actor_ptr driver; // the thread in Job::run: it takes the steps' reports
    bool between_steps = false;   // a report is with the driver; no rank is meant to be busy
    /// Challenges handed out and not yet answered by a hello, with when (each answers one).
    std::map<std::string, std::chrono::steady_clock::time_point> nonces;
    uint64_t last_progress = 0;
    std::chrono::steady_clock::time_point last_change;
    std::chrono::steady_clock::time_point step_start;
    std::chrono::steady_clock::time_point last_tick;
};

using coordinator_pointer = caf::stateful_actor<CoordinatorState>*;

/// Challenges a coordinator keeps open at once: joins of a job come at about the same time.
constexpr size_t max_outstanding_nonces = 1024;

// Where this process runs, as the members name it: "host vm, pid 123".
std::string this_place() {
    return "host " + host_name() + ", pid " + std::to_string(::getpid());
}

std::string reported(const CoordinatorState& st, const std::string& outcome);

void fail(coordinator_pointer self, const std::string& why) {
    auto& st = self->state;
    if (!st.failure.empty()) return;
    st.failure = why;
    st.net->set_failure(reported(st, why));
    // Whoever still waits for a key of the job's store (a process joining) waits in vain.
    for (auto& [key, promises] : st.waiting)
        for (auto& p : promises) p.deliver(caf::make_error(caf::sec::runtime_error, why));
    st.waiting.clear();
    // Wake every rank blocked on a peer, here and in every other process: they end the step
    // with an error instead of hanging.
    st.net->abort(why);
    for (auto& [p, m] : st.members) self->send(m.actor, abort_atom::value, why);
    if (!st.members.empty())
        self->delayed_send(self, st.net->cluster.abandon_after, abandon_atom::value);
}

void step_done(coordinator_pointer self);
void finish(coordinator_pointer self, const std::string& result);

// Takes `o` as rank o.rank's answer to this step, unless it has answered already (a lost
// process's ranks are answered for; their late replies are dropped).
void take_reply(coordinator_pointer self, StepOutcome o) {
    auto& s = self->state;
    auto r = static_cast<size_t>(o.rank);
    if (!s.started || s.finished || r >= s.replied.size() || s.replied[r]) return;
    s.replied[r] = true;
    if (!o.ok) fail(self, RankFailure{o.rank, o.action, o.cause}.str());
    s.replies.push_back(std::move(o));
    if (--s.pending == 0) step_done(self);
}

// Process `p` is gone or silent: the failure names it and what its ranks were doing; its ranks'
// answers to the step will never come, so they are taken as failed.
void lost(coordinator_pointer self, int32_t p, const std::string& how) {
    auto& st = self->state;
    auto it = st.members.find(p);
    std::string who = "process " + std::to_string(p) + " (" + st.net->ranks_of(p);
    if (it != st.members.end())
        who += ", host " + it->second.host + ", pid " + std::to_string(it->second.pid);
    who += ")";
    std::string doing = it != st.members.end() && !it->second.actions.empty()
                            ? "; last heard: " + it->second.actions
                            : "";
    const bool cause = it == st.members.end() || !it->second.leaving;
    if (it != st.members.end()) it->second.lost = true;
    if (cause && st.lost_note.empty()) st.lost_note = who + " " + how + doing;
    if (cause) fail(self, who + " " + how + doing);
    if (!st.started) {
        if (st.start_requested) finish(self, st.failure);
        return;
    }
    for (size_t r = 0; r < st.net->process_of.size(); ++r)
        if (st.net->process_of[r] == p && !st.replied[r]) {
            StepOutcome o;
            o.rank = static_cast<int32_t>(r);
            o.cause = "its process was lost";
            take_reply(self, o);
        }
}

// The run's failure as reported: a lost process is the cause of what its peers then saw, so
// it comes first.
std::string reported(const CoordinatorState& st, const std::string& outcome) {
    if (outcome.empty() || st.lost_note.empty() || outcome == st.lost_note) return outcome;
    return st.lost_note + "\n  (then: " + outcome + ")";
}

void finish(coordinator_pointer self, const std::string& outcome) {
    auto& st = self->state;
    if (st.finished) return;
    st.finished = true;
    const std::string result = reported(st, outcome);
    // Every other process hears the end and acknowledges it before this one returns (and may
    // exit): otherwise they would see the coordinator vanish and report it lost.
    size_t alive = 0;
    for (auto& [p, m] : st.members) alive += !m.lost;
    auto remaining = std::make_shared<size_t>(alive);
    auto deliver = [self, result, remaining] {
        if (*remaining > 0 && --*remaining > 0) return;
        self->state.promise.deliver(result);
        self->quit();
    };
    if (alive == 0) {
        st.promise.deliver(result);
        self->quit();
        return;
    }
    for (auto& [p, m] : st.members)
        if (!m.lost)
            self->request(m.actor, std::chrono::seconds(2), done_atom::value, result)
                .then([deliver](ok_atom) { deliver(); }, [deliver](caf::error&) { deliver(); });
}

void start_step(coordinator_pointer self);

void step_done(coordinator_pointer self) {
    auto& st = self->state;
    if (!st.failure.empty()) return finish(self, st.failure);
    StepReport report;
    double loss = 0, secs = 0;
    int64_t n = 0;
    report.timings.resize(st.replies.size());
    report.traffic.resize(st.replies.size());
    for (const auto& o : st.replies) {
        loss += o.loss_sum;
        n += o.loss_microbatches;
        auto& t = report.timings[static_cast<size_t>(o.rank)];
        for (size_t i = 0; i + 3 < o.timings.size(); i += 4) {
            const bool collective = o.timings[i] < 0;
            const double at = collective ? -o.timings[i] - 1 : o.timings[i];
            t.push_back({static_cast<size_t>(at), o.timings[i + 1], o.timings[i + 2], collective,
                         o.timings[i + 3]});
        }
        report.traffic[static_cast<size_t>(o.rank)] = decode(o.traffic);
        if (o.experts.size() >= 4) {
            models::ExpertStats e;
            e.dropped = static_cast<int64_t>(o.experts[0]);
            e.routed = static_cast<int64_t>(o.experts[1]);
            e.aux_loss = o.experts[2];
            e.aux_terms = static_cast<int64_t>(o.experts[3]);
            for (size_t i = 4; i < o.experts.size(); ++i)
                e.load.push_back(static_cast<int64_t>(o.experts[i]));
            report.metrics.experts.merge(e);
        }
    }
    secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - st.step_start).count();
    const StepOutcome& any = st.replies.front();
    models::StepMetrics& m = report.metrics;
    m.step = st.step + 1;
    m.loss = n > 0 ? loss / static_cast<double>(n) : 0.0;
    m.lr = any.lr;
    m.grad_norm = any.grad_norm;
    m.tokens = st.net->tokens_per_step;
    m.step_time_s = secs;
    m.tokens_per_s = secs > 0 ? static_cast<double>(m.tokens) / secs : 0.0;
    for (const auto& o : st.replies)
        if (report.nonfinite.empty() || o.nonfinite == "loss") report.nonfinite = o.nonfinite;
    {
        std::lock_guard lock(st.net->report_mutex);
        st.net->report = std::move(report);
    }
    st.between_steps = true;
    self->send(caf::actor_cast<caf::actor>(st.driver), stepped_atom::value);
}

// The driver has handled the step's report: `go_on`, or `error` (a callback's failure).
void next_step(coordinator_pointer self, bool go_on, const std::string& error) {
    auto& st = self->state;
    if (!st.between_steps || st.finished) return;
    st.between_steps = false;
    if (!error.empty()) fail(self, error);
    // A process lost while the driver handled the report (or the callback's own failure).
    if (!st.failure.empty()) return finish(self, st.failure);
    // The callback may have taken long (a checkpoint): the watchdog counts from now.
    const auto now = std::chrono::steady_clock::now();
    st.last_change = now;
    if (!go_on || st.step + 1 >= st.net->options.end_step) return finish(self, "");
    ++st.step;
    start_step(self);
}

void start_step(coordinator_pointer self) {
    auto& st = self->state;
    st.replies.clear();
    st.pending = st.workers.size();
    st.replied.assign(st.workers.size(), false);
    st.step_start = std::chrono::steady_clock::now();
    for (size_t i = 0; i < st.workers.size(); ++i) {
        auto on_reply = [self](StepOutcome& o) { take_reply(self, std::move(o)); };
        self->request(st.workers[i], caf::infinite, run_atom::value, st.step)
            .then(on_reply, [self, on_reply, i](caf::error& e) {
                auto& s = self->state;
                int32_t p = s.net->process_of[i];
                if (p != s.net->cluster.process)
                    lost(self, p, "was lost: " + self->system().render(e));
                StepOutcome o;
                o.rank = static_cast<int32_t>(i);
                o.cause = "the worker is gone: " + self->system().render(e);
                on_reply(o);
            });
    }
}

void maybe_start(coordinator_pointer self) {
    auto& st = self->state;
    if (st.started || !st.start_requested) return;
    if (!st.failure.empty()) return finish(self, st.failure);
    if (!st.own_ready) return;
    for (auto& [p, m] : st.members)
        if (!m.ready) return;
    if (st.members.size() + 1 < static_cast<size_t>(st.net->cluster.processes)) return;
    st.started = true;
    st.step = st.net->options.first_step;
    st.last_change = std::chrono::steady_clock::now();
    if (st.step >= st.net->options.end_step) return finish(self, "");
    start_step(self);
}

// Whether the message being handled comes from this process or an accepted one.
bool heard(coordinator_pointer self) {
    const auto& sender = self->current_sender();
    return sender && (sender->node() == self->node() || self->state.accepted.count(sender->node()));
}

// Whether it comes from this process (its delayed messages to itself carry it as the sender; a
// message without a sender may come from anywhere).
bool own(coordinator_pointer self) {
    const auto& sender = self->current_sender();
    return sender && sender->node() == self->node();
}

caf::behavior coordinator(coordinator_pointer self, Job::Net* net) {
    auto& st0 = self->state;
    (void)st0;
    st0.net = net;
    st0.workers.resize(net->process_of.size());
    st0.created = std::chrono::steady_clock::now();
    ignore_remote_exits(self);
    self->set_down_handler([self](caf::down_msg& dm) {
        auto& st = self->state;
        for (auto& [p, m] : st.members)
            if (m.actor.address() == dm.source) {
                if (st.finished || m.lost) {
                    m.lost = true;
                    return;
                }
                return lost(self, p, "was lost: " + self->system().render(dm.reason));
            }
    });
    self->delayed_send(self, std::chrono::milliseconds(200), tick_atom::value);
    return {
        [self](challenge_atom,
               const std::string& member_nonce) -> caf::result<std::string, std::string> {
            // Anyone may ask; what proves the token is the answer's HMAC, and the nonce is
            // good for one hello. A bounded number stay outstanding (the oldest go first).
            auto& st = self->state;
            // Refused: no nonce, and the reason in place of the proof.
            if (st.started)
                return caf::result<std::string, std::string>(std::string(), "the job has started");
            if (member_nonce.size() != nonce_bytes * 2)
                return caf::result<std::string, std::string>(
                    std::string(), "its challenge is not " + std::to_string(nonce_bytes * 2) +
                                       " hexadecimal digits");
            if (st.nonces.size() >= max_outstanding_nonces) {
                auto oldest = st.nonces.begin();
                for (auto it = st.nonces.begin(); it != st.nonces.end(); ++it)
                    if (it->second < oldest->second) oldest = it;
                st.nonces.erase(oldest);
            }
            std::string nonce = fresh_nonce();
            st.nonces[nonce] = std::chrono::steady_clock::now();
            std::string proof = prove(st.net->cluster.token, {"coordinator", member_nonce, nonce});
            return caf::result<std::string, std::string>(std::move(nonce), std::move(proof));
        },
        [self](hello_atom, int32_t protocol, const std::string& proof, const std::string& nonce,
               const std::string& digest, int32_t process, int32_t pid, const std::string& host,
               const caf::actor& member) -> caf::result<std::string, std::string> {
            auto& st = self->state;
            const ClusterOptions& c = st.net->cluster;
            std::string who = "a peer on " + host + " (pid " + std::to_string(pid) + ")";
            std::string refusal;
            auto issued = st.nonces.find(nonce);
            if (protocol != protocol_version)
                refusal = "it speaks protocol version " + std::to_string(protocol) +
                          ", this coordinator " + std::to_string(protocol_version);
            else if (issued == st.nonces.end())
                refusal = "its hello answers no challenge of this coordinator (a replayed or "
                          "forged hello)";
            else if (!same_proof(proof,
                                 prove(c.token, {"member", nonce, digest, std::to_string(process),
                                                 std::to_string(pid), host})))
                refusal = "it did not prove this job's token";
            else if (digest != c.digest)
                refusal = "it runs a different plan (digest " + digest + ", this job's " +
                          c.digest + ": another script, overrides or mesh)";
            else if (process <= 0 || process >= c.processes)
                refusal = "it claims process " + std::to_string(process) + " of a job of " +
                          std::to_string(c.processes);
            else if (st.members.count(process))
                refusal = "process " + std::to_string(process) + " has joined already";
            else if (st.started)
                refusal = "the job has started";
            if (issued != st.nonces.end()) st.nonces.erase(issued);
            if (!refusal.empty()) {
                if (c.log) c.log("refused " + who + ": " + refusal);
                return caf::result<std::string, std::string>(
                    "refused by the coordinator: " + refusal, std::string());
            }
            if (self->current_sender()) st.accepted.insert(self->current_sender()->node());
            Member m;
            m.actor = member;
            m.host = host;
            m.pid = pid;
            m.last_beat = std::chrono::steady_clock::now();
            st.members[process] = m;
            st.net->member_actors[process] = member;
            st.net->member_places[process] = "host " + host + ", pid " + std::to_string(pid);
            self->monitor(member);
            return caf::result<std::string, std::string>(std::string(), this_place());
        },
        [self](worker_atom, int32_t rank, const caf::actor& w) {
            auto& st = self->state;
            if (!heard(self) || rank < 0 || static_cast<size_t>(rank) >= st.workers.size()) return;
            st.workers[static_cast<size_t>(rank)] = caf::actor_cast<worker_actor>(w);
        },
        [self](ready_atom, int32_t process) {
            auto& st = self->state;
            if (!heard(self)) return;
            if (process == st.net->cluster.process)
                st.own_ready = true;
            else if (auto it = st.members.find(process); it != st.members.end())
                it->second.ready = true;
            maybe_start(self);
        },
        [self](stop_atom) {
            if (own(self)) self->quit();
        },
        [self](next_atom, bool go_on, const std::string& error) {
            if (own(self)) next_step(self, go_on, error);
        },
        [self](abandon_atom) {
            // The job failed a while ago and ranks are still inside the step: they wait in
            // Gloo for peers that gave up. The other processes end themselves, which frees them.
            auto& st = self->state;
            if (!own(self) || st.finished || st.failure.empty() || st.pending == 0) return;
            for (auto& [p, m] : st.members)
                if (!m.lost) {
                    m.leaving = true;
                    self->send(m.actor, abandon_atom::value, st.failure);
                }
            self->delayed_send(self, st.net->cluster.abandon_after / 2, give_up_atom::value);
        },
        [self](give_up_atom) {
            // Ranks of this process still wait, on a peer that can neither answer nor end (a
            // stopped or unreachable host): this process ends too, as the others did.
            auto& st = self->state;
            if (!own(self) || st.finished || st.failure.empty() || st.pending == 0) return;
            if (st.net->cluster.abandon) st.net->cluster.abandon(reported(st, st.failure));
        },
        [self](beat_atom, int32_t process, uint64_t progress, const std::string& actions) {
            auto& st = self->state;
            auto it = st.members.find(process);
            if (!heard(self) || it == st.members.end()) return;
            it->second.last_beat = std::chrono::steady_clock::now();
            it->second.progress = progress;
            it->second.actions = actions;
        },
        [self](set_atom, const std::string& key, const std::string& value) -> caf::result<ok_atom> {
            auto& st = self->state;
            if (!heard(self)) return caf::sec::request_receiver_down;
            st.store[key] = value;
            if (auto it = st.waiting.find(key); it != st.waiting.end()) {
                for (auto& p : it->second) p.deliver(value);
                st.waiting.erase(it);
            }
            return ok_atom::value;
        },
        [self](get_atom, const std::string& key) -> caf::result<std::string> {
            auto& st = self->state;
            if (!heard(self)) return caf::sec::request_receiver_down;
            if (auto it = st.store.find(key); it != st.store.end()) return it->second;
            if (!st.failure.empty()) return caf::make_error(caf::sec::runtime_error, st.failure);
            auto promise = self->make_response_promise();
            st.waiting[key].push_back(promise);
            return caf::delegated<std::string>();
        },
        [self](start_atom) -> caf::result<std::string> {
            auto& st = self->state;
            if (!own(self) || st.start_requested) return caf::sec::unexpected_message;
            // Before the promise, which takes the sender out of the message.
            st.driver = self->current_sender();
            st.promise = self->make_response_promise();
            st.start_requested = true;
            st.created = std::chrono::steady_clock::now(); // the join timeout runs from here
            maybe_start(self);
            return caf::delegated<std::string>();
        },
        [self](tick_atom) {
            auto& st = self->state;
            if (st.finished || !own(self)) return;
            self->delayed_send(self, std::chrono::milliseconds(200), tick_atom::value);
            auto now = std::chrono::steady_clock::now();
            const ClusterOptions& c = st.net->cluster;
            // A tick far behind its time means this process itself was frozen (stopped, or
            // starved): the members' heartbeats queued meanwhile are not theirs to answer for.
            // Between steps their silence counts as ever: a member frozen while its shards are
            // gathered for a checkpoint is lost, and the gather ends with it (Job::gather).
            if (st.last_tick.time_since_epoch().count() != 0 &&
                now - st.last_tick > c.heartbeat_timeout / 2)
                for (auto& [p, m] : st.members) m.last_beat = now;
            st.last_tick = now;
            // Heartbeats the other way: a member that stops hearing them ends its process.
            for (auto& [p, m] : st.members)
                if (!m.lost) self->send(m.actor, alive_atom::value);
            if (!st.started) {
                if (st.start_requested && st.failure.empty() && now - st.created > c.join_timeout) {
                    std::string missing;
                    for (int32_t p = 1; p < c.processes; ++p)
                        if (!st.members.count(p) || !st.members[p].ready)
                            missing += (missing.empty() ? "" : ", ") + std::to_string(p);
                    st.failure = "process(es) " + missing + " did not join within " +
                                 std::to_string(c.join_timeout.count() / 1000) + " s";
                    finish(self, st.failure);
                }
                return;
            }
            for (auto& [p, m] : st.members)
                if (st.failure.empty() && now - m.last_beat > c.heartbeat_timeout)
                    lost(self, p,
                         "stopped answering: no heartbeat for " +
                             std::to_string(
                                 std::chrono::duration_cast<std::chrono::seconds>(now - m.last_beat)
                                     .count()) +
                             " s");
            uint64_t progress = st.net->progress();
            for (auto& [p, m] : st.members) progress += m.progress;
            if (progress != st.last_progress) {
                st.last_progress = progress;
                st.last_change = now;
            } else if (st.between_steps) {
                st.last_change = now; // the driver's callback runs; no rank is meant to act
            } else if (st.failure.empty() && now - st.last_change > st.net->options.watchdog) {
                std::string why = "watchdog: no action completed on any rank for " +
                                  std::to_string(std::chrono::duration_cast<std::chrono::seconds>(
                                                     st.net->options.watchdog)
                                                     .count()) +
                                  " s; " + st.net->actions();
                for (auto& [p, m] : st.members) why += "; " + m.actions;
                fail(self, why);
            }
        },
    };
}

} // namespace

caf::actor spawn_coordinator(Job::Net& net) {
    return net.sys->spawn(coordinator, &net);
}

} // namespace dist::runtime
