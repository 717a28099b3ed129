// job.cpp: the coordinator, worker and member actors (CAF 0.17) around the rank executors, and
// the control plane between processes (CAF's middleman).
#include "actors/runtime/job.hpp"

#include "kernels/devices.hpp"

#include <arpa/inet.h>
#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <netdb.h>
#include <omp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>

namespace dist::runtime {

namespace {

// The control plane's protocol: a peer that speaks another is refused at hello.
constexpr int32_t protocol_version = 1;

using run_atom = caf::atom_constant<caf::atom("run")>;
using start_atom = caf::atom_constant<caf::atom("start")>;
using tick_atom = caf::atom_constant<caf::atom("tick")>;
using hello_atom = caf::atom_constant<caf::atom("hello")>;
using worker_atom = caf::atom_constant<caf::atom("worker")>;
using ready_atom = caf::atom_constant<caf::atom("ready")>;
using beat_atom = caf::atom_constant<caf::atom("beat")>;
using set_atom = caf::atom_constant<caf::atom("store_set")>;
using get_atom = caf::atom_constant<caf::atom("store_get")>;
using abort_atom = caf::atom_constant<caf::atom("abort")>;
using done_atom = caf::atom_constant<caf::atom("done")>;
using gather_atom = caf::atom_constant<caf::atom("gather")>;
using ok_atom = caf::atom_constant<caf::atom("ok")>;
using abandon_atom = caf::atom_constant<caf::atom("abandon")>;
using give_up_atom = caf::atom_constant<caf::atom("give_up")>;
using stop_atom = caf::atom_constant<caf::atom("stop")>;

/// A worker's answer to "run step s".
struct StepOutcome {
    int32_t rank = -1;
    bool ok = false;
    std::string action, cause; // when not ok
    double loss_sum = 0;
    int64_t loss_microbatches = 0;
    double grad_norm = 0, lr = 0, step_time_s = 0;
    std::vector<double> timings; // (action index, start, end) triples
    /// This step's traffic with other processes: per peer, its rank, then per direction sent
    /// (messages, bytes, seconds) and received (messages, bytes, seconds).
    std::vector<double> traffic;
};

template <class Inspector> typename Inspector::result_type inspect(Inspector& f, StepOutcome& x) {
    return f(caf::meta::type_name("StepOutcome"), x.rank, x.ok, x.action, x.cause, x.loss_sum,
             x.loss_microbatches, x.grad_norm, x.lr, x.step_time_s, x.timings, x.traffic);
}

constexpr size_t per_peer = 13; // the peer, then 2 directions x (sent, received) x 3 figures

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

// The traffic of a step: the totals after it minus those before.
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

// The contract between the coordinator and the workers.
using worker_actor = caf::typed_actor<caf::replies_to<run_atom, int64_t>::with<StepOutcome>>;

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
            for (const auto& t : r.timings)
                o.timings.insert(o.timings.end(),
                                 {static_cast<double>(t.action), t.start_s, t.end_s});
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
    uint64_t last_progress = 0;
    std::chrono::steady_clock::time_point last_change;
    std::chrono::steady_clock::time_point step_start;
};

using coordinator_pointer = caf::stateful_actor<CoordinatorState>*;

} // namespace

// What the actors of this process share: the actor system, the job's parts and options.
struct Job::Net {
    caf::actor_system_config cfg;
    std::unique_ptr<caf::actor_system> sys;
    caf::actor coordinator; // here (process 0) or a proxy
    caf::actor member;      // this process's member actor (processes other than 0)
    std::map<int32_t, caf::actor> member_actors;  // process 0: the others' (by the coordinator)
    std::map<int32_t, std::string> member_places; // process 0: "host vm, pid 123" of the others
    std::vector<int32_t> process_of;
    ClusterOptions cluster;
    JobOptions options;
    // This process's communication and executors, owned by the Job: set once formed, read by
    // the actors (on their threads), cleared under `parts` before the Job destroys them.
    std::mutex parts;
    LocalComms* comms = nullptr;
    std::vector<RankExecutor*> executors;

    void abort(const std::string& why) {
        std::lock_guard lock(parts);
        if (comms) comms->abort(why);
    }
    /// Actions completed by this process's ranks so far.
    uint64_t progress() {
        std::lock_guard lock(parts);
        uint64_t p = 0;
        for (auto* ex : executors) p += ex->progress();
        return p;
    }
    /// "rank 4 in 1F3; rank 5 finished its step".
    std::string actions();
    /// Whether any rank here is inside an action.
    bool busy() {
        std::lock_guard lock(parts);
        for (auto* ex : executors)
            if (!ex->current_action().empty()) return true;
        return false;
    }
    void detach_parts() {
        std::lock_guard lock(parts);
        comms = nullptr;
        executors.clear();
    }
    int64_t tokens_per_step = 0;
    std::promise<std::string> member_done;
    std::atomic<bool> member_finished{false};
    bool ran = false;
    std::atomic<bool> formed{false};           // the constructor has finished
    std::function<std::string()> gather_local; // this process's parameter shards, serialised
    /// The job's store (UCX endpoints read peers' addresses from it when they first connect).
    std::unique_ptr<transport::KeyValueStore> store;

    /// Ends this process's coordinator (if it lives here) and member actor. Exit messages from
    /// other processes are ignored, and so are anonymous ones, so this comes from an actor here.
    void stop_actors() {
        caf::scoped_actor self{*sys};
        if (coordinator && coordinator.node() == sys->node())
            self->send(coordinator, stop_atom::value);
        if (member) self->send(member, stop_atom::value);
    }

    ~Net() {
        // The actor system's destructor waits for every actor: end this process's own first.
        if (!sys) return;
        stop_actors();
        // The actors use the members below: the system (which waits for them) goes first.
        store.reset();
        sys.reset();
    }

    std::string ranks_of(int32_t process) const {
        std::vector<int32_t> r;
        for (size_t i = 0; i < process_of.size(); ++i)
            if (process_of[i] == process) r.push_back(static_cast<int32_t>(i));
        if (r.empty()) return "no ranks";
        if (r.size() == 1) return "rank " + std::to_string(r.front());
        return "ranks " + std::to_string(r.front()) + "-" + std::to_string(r.back());
    }
};

namespace {} // namespace

std::string Job::Net::actions() {
    std::lock_guard lock(parts);
    std::string s;
    for (auto* ex : executors) {
        std::string at = ex->current_action();
        if (!s.empty()) s += "; ";
        s += "rank " + std::to_string(ex->rank()) + " " +
             (at.empty() ? "finished its step" : "in " + at);
    }
    return s;
}

namespace {

void fail(coordinator_pointer self, const std::string& why) {
    auto& st = self->state;
    if (!st.failure.empty()) return;
    st.failure = why;
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
        for (size_t i = 0; i + 2 < o.timings.size(); i += 3)
            t.push_back({static_cast<size_t>(o.timings[i]), o.timings[i + 1], o.timings[i + 2]});
        report.traffic[static_cast<size_t>(o.rank)] = decode(o.traffic);
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
    const JobOptions& options = st.net->options;
    bool go_on = true;
    try {
        if (options.on_step) go_on = options.on_step(report);
    } catch (const std::exception& e) {
        fail(self, std::string("after step ") + std::to_string(m.step) + ": " + e.what());
        return finish(self, st.failure);
    }
    // The callback may have taken long (a checkpoint): heartbeats that queued up meanwhile are
    // not late, and the watchdog counts from now.
    const auto now = std::chrono::steady_clock::now();
    for (auto& [p, member] : st.members) member.last_beat = now;
    st.last_change = now;
    if (!go_on || st.step + 1 >= options.end_step) return finish(self, "");
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

// Exit messages from other processes are ignored: only this process ends its actors.
template <class Self> void ignore_remote_exits(Self* self) {
    self->set_exit_handler([self](caf::exit_msg& m) {
        if (m.source.node() == self->node()) self->quit(m.reason);
    });
}

caf::behavior coordinator(coordinator_pointer self, Job::Net* net) {
    auto& st0 = self->state;
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
        [self](hello_atom, int32_t protocol, const std::string& token, const std::string& digest,
               int32_t process, int32_t pid, const std::string& host,
               const caf::actor& member) -> std::string {
            auto& st = self->state;
            const ClusterOptions& c = st.net->cluster;
            std::string who = "a peer on " + host + " (pid " + std::to_string(pid) + ")";
            std::string refusal;
            if (protocol != protocol_version)
                refusal = "it speaks protocol version " + std::to_string(protocol) +
                          ", this coordinator " + std::to_string(protocol_version);
            else if (token != c.token)
                refusal = "it did not present this job's token";
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
            if (!refusal.empty()) {
                if (c.log) c.log("refused " + who + ": " + refusal);
                return "refused by the coordinator: " + refusal;
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
            return "";
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

// A process other than 0: hears the coordinator's abort and end, sends heartbeats and its
// parameter shards.
struct MemberState {
    Job::Net* net = nullptr;
};

caf::behavior member(caf::stateful_actor<MemberState>* self, Job::Net* net) {
    self->state.net = net;
    ignore_remote_exits(self);
    self->monitor(net->coordinator);
    auto end = [net](const std::string& result) {
        if (!net->member_finished.exchange(true)) net->member_done.set_value(result);
    };
    self->set_down_handler([self, net, end](caf::down_msg& dm) {
        std::string why = "lost the coordinator at " + net->cluster.host + ":" +
                          std::to_string(net->cluster.port) + " (" +
                          self->system().render(dm.reason) + ")";
        net->abort(why);
        end(why);
        // Without a coordinator nobody says when to give up: ranks still busy after a while
        // wait in Gloo for peers that are gone.
        if (net->cluster.abandon)
            std::thread([net, why] {
                auto deadline = std::chrono::steady_clock::now() + net->cluster.abandon_after;
                while (std::chrono::steady_clock::now() < deadline) {
                    // Still forming the job counts as busy: it waits on the store it lost.
                    if (net->formed.load() && !net->busy()) return;
                    std::this_thread::sleep_for(std::chrono::milliseconds(50));
                }
                net->cluster.abandon(why);
            }).detach();
        self->quit();
    });
    self->send(self, tick_atom::value);
    // Only the coordinator's process (and this one) is heard.
    auto heard = [self, net] {
        const auto& s = self->current_sender();
        return s && (s->node() == net->coordinator.node() || s->node() == self->node());
    };
    return {
        [self](stop_atom) {
            if (self->current_sender() && self->current_sender()->node() == self->node())
                self->quit();
        },
        [net, heard](abort_atom, const std::string& why) {
            if (heard()) net->abort(why);
        },
        [net, heard](abandon_atom, const std::string& why) {
            if (!heard()) return;
            // Ranks somewhere are still inside the failed step, waiting in Gloo for peers that
            // gave up: this process ends (its caller says how), and its closed sockets free
            // them.
            if (net->cluster.abandon) net->cluster.abandon(why);
        },
        [self, end, heard](done_atom, const std::string& result) -> caf::result<ok_atom> {
            if (!heard()) return caf::sec::request_receiver_down;
            end(result);
            self->quit();
            return ok_atom::value;
        },
        [net, heard](gather_atom) -> caf::result<std::string> {
            if (!heard()) return caf::sec::request_receiver_down;
            return net->gather_local();
        },
        [self, net](tick_atom) {
            if (!self->current_sender() || self->current_sender()->node() != self->node()) return;
            // The executors exist once the job has formed; until then the beat says nothing.
            uint64_t progress = 0;
            std::string actions;
            if (net->formed.load()) {
                progress = net->progress();
                actions = net->actions();
            }
            self->send(net->coordinator, beat_atom::value, net->cluster.process, progress, actions);
            self->delayed_send(self, std::chrono::milliseconds(250), tick_atom::value);
        },
    };
}

// The job's key-value store, kept by the coordinator.
class ControlStore final : public transport::KeyValueStore {
  public:
    ControlStore(caf::actor_system& sys, caf::actor coordinator)
        : sys_(sys), coordinator_(std::move(coordinator)) {}
    void set(const std::string& key, const std::vector<char>& value) override {
        caf::scoped_actor self{sys_};
        std::string error;
        self->request(coordinator_, std::chrono::seconds(30), set_atom::value, key,
                      std::string(value.begin(), value.end()))
            .receive([](ok_atom) {}, [&](caf::error& e) { error = sys_.render(e); });
        if (!error.empty())
            throw std::runtime_error("the job's store did not take `" + key + "`: " + error);
    }
    std::vector<char> get(const std::string& key, std::chrono::milliseconds timeout) override {
        caf::scoped_actor self{sys_};
        std::vector<char> value;
        std::string error;
        self->request(coordinator_, timeout, get_atom::value, key)
            .receive([&](std::string& v) { value.assign(v.begin(), v.end()); },
                     [&](caf::error& e) { error = sys_.render(e); });
        if (!error.empty())
            throw std::runtime_error("the job's store has no `" + key + "` after " +
                                     std::to_string(timeout.count()) + " ms: " + error);
        return value;
    }

  private:
    caf::actor_system& sys_;
    caf::actor coordinator_;
};

bool loopback(const std::string& host) {
    return host == "127.0.0.1" || host == "localhost" || host == "::1" ||
           host.rfind("127.", 0) == 0;
}

// The address of this host's interface that reaches `host` (where Gloo should listen).
std::string address_towards(const std::string& host, uint16_t port) {
    if (loopback(host)) return "127.0.0.1";
    // A UDP "connection" sends nothing; it makes the kernel pick the route and so the
    // interface's address.
    addrinfo hints{}, *res = nullptr;
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_DGRAM;
    if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0 || !res)
        return "127.0.0.1";
    std::string out = "127.0.0.1";
    int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
    if (fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
        sockaddr_in me{};
        socklen_t len = sizeof me;
        char text[INET_ADDRSTRLEN] = {};
        if (::getsockname(fd, reinterpret_cast<sockaddr*>(&me), &len) == 0 &&
            ::inet_ntop(AF_INET, &me.sin_addr, text, sizeof text))
            out = text;
    }
    if (fd >= 0) ::close(fd);
    freeaddrinfo(res);
    return out;
}

void configure(caf::actor_system_config& cfg, bool middleman) {
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
}

} // namespace

std::vector<int32_t> process_of_ranks(int32_t ranks, int32_t processes) {
    std::vector<int32_t> out(static_cast<size_t>(ranks));
    for (int32_t r = 0; r < ranks; ++r)
        out[static_cast<size_t>(r)] =
            static_cast<int32_t>(static_cast<int64_t>(r) * processes / ranks);
    return out;
}

std::vector<kernels::Device> place_ranks(const Program& program, const plan::Graph& graph,
                                         const std::vector<int32_t>& process_of, int32_t process,
                                         int32_t local_process) {
    std::vector<kernels::Device> out(graph.ranks.size());
    if (program.mesh.profile.name == "cpu") return out;
    const int gpus = kernels::gpu_count();
    if (gpus == 0)
        throw std::runtime_error("the mesh is " + std::to_string(program.mesh.devices) + " " +
                                 program.mesh.profile.name + " device(s), but " +
                                 (kernels::built_with_cuda()
                                      ? std::string("this machine has no GPU that CUDA can use")
                                      : std::string("this build has no CUDA support")) +
                                 "; a mesh of `cpu` devices trains on this machine's cores");
    // This host's processes are the `local_process` before this one and those after it: the
    // ranks of the ones before take the first GPUs (process sizes may differ by one).
    int64_t next = 0;
    for (int32_t q : process_of)
        if (q >= process - local_process && q < process) ++next;
    for (size_t r = 0; r < out.size(); ++r)
        if (process_of.at(r) == process)
            out[r] = {kernels::Device::Kind::cuda, static_cast<int>(next++ % gpus)};
    return out;
}

Job::Job(const Program& program, const plan::Graph& graph, const models::TokenData& data,
         CollectivesBackend backend)
    : program_(program), data_(data), net_(std::make_unique<Net>()) {
    configure(net_->cfg, false);
    net_->sys = std::make_unique<caf::actor_system>(net_->cfg);
    net_->process_of.assign(graph.ranks.size(), 0);
    devices_ = place_ranks(program, graph, net_->process_of, 0, 0);
    comms_ = std::make_unique<LocalComms>(graph, backend, std::chrono::minutes(5), devices_);
    build_executors(graph);
}

Job::Job(const Program& program, const plan::Graph& graph, const models::TokenData& data,
         const ClusterOptions& cluster)
    : program_(program), data_(data), cluster_(cluster), net_(std::make_unique<Net>()) {
    Net& net = *net_;
    net.cluster = cluster;
    const int32_t ranks = static_cast<int32_t>(graph.ranks.size());
    if (cluster.processes < 1 || cluster.process < 0 || cluster.process >= cluster.processes)
        throw std::runtime_error("process " + std::to_string(cluster.process) + " of " +
                                 std::to_string(cluster.processes) +
                                 " is not a process of the job");
    if (cluster.processes > ranks)
        throw std::runtime_error(std::to_string(cluster.processes) + " processes for " +
                                 std::to_string(ranks) +
                                 " ranks: every process needs at least one rank");
    if (!loopback(cluster.host) && cluster.token.empty())
        throw std::runtime_error(
            "the coordinator " + cluster.host +
            " is not on loopback: every process needs the job's token (DIST_JOB_TOKEN or "
            "DIST_JOB_TOKEN_FILE)");
    net.process_of = process_of_ranks(ranks, cluster.processes);
    devices_ = place_ranks(program, graph, net.process_of, cluster.process, cluster.local_process);
    configure(net.cfg, true);
    net.sys = std::make_unique<caf::actor_system>(net.cfg);
    caf::actor_system& sys = *net.sys;
    const std::string where = cluster.host + ":" + std::to_string(cluster.port);
    if (cluster.process == 0) {
        net.coordinator = sys.spawn(coordinator, &net);
        auto port = sys.middleman().publish(net.coordinator, cluster.port,
                                            loopback(cluster.host) ? "127.0.0.1" : nullptr, true);
        if (!port) {
            net.stop_actors();
            throw std::runtime_error("the coordinator cannot listen on " + where + ": " +
                                     sys.render(port.error()));
        }
    } else {
        // The coordinator may not be listening yet: try until the join timeout.
        auto deadline = std::chrono::steady_clock::now() + cluster.join_timeout;
        std::string last;
        for (;;) {
            auto coord = sys.middleman().remote_actor(cluster.host, cluster.port);
            if (coord) {
                net.coordinator = *coord;
                break;
            }
            last = sys.render(coord.error());
            if (std::chrono::steady_clock::now() > deadline)
                throw std::runtime_error("cannot reach the coordinator at " + where + " within " +
                                         std::to_string(cluster.join_timeout.count() / 1000) +
                                         " s: " + last);
            std::this_thread::sleep_for(std::chrono::milliseconds(200));
        }
    }
    // The member actor exists before hello, so the coordinator can monitor it from then on; it
    // starts its heartbeats at once.
    if (cluster.process != 0) net.member = sys.spawn(member, &net);
    if (cluster.process != 0) {
        char host[256] = {};
        ::gethostname(host, sizeof host - 1);
        caf::scoped_actor self{sys};
        std::string refusal;
        self->request(net.coordinator, std::chrono::seconds(30), hello_atom::value,
                      protocol_version, cluster.token, cluster.digest, cluster.process,
                      static_cast<int32_t>(::getpid()), std::string(host), net.member)
            .receive([&](std::string& r) { refusal = r; },
                     [&](caf::error& e) { refusal = "no answer to hello: " + sys.render(e); });
        if (!refusal.empty()) {
            net.stop_actors();
            throw std::runtime_error("joining the job at " + where + ": " + refusal);
        }
    }
    net.store = std::make_unique<ControlStore>(sys, net.coordinator);
    CommsLayout layout;
    layout.process_of = net.process_of;
    layout.process = cluster.process;
    layout.store = net.store.get();
    layout.gloo_host = address_towards(cluster.host, cluster.port);
    layout.ucx = cluster.ucx;
    layout.devices = devices_;
    comms_ = std::make_unique<LocalComms>(graph, layout);
    build_executors(graph);
}

void Job::build_executors(const plan::Graph& graph) {
    for (const auto& r : graph.ranks)
        if (net_->process_of[static_cast<size_t>(r.rank)] == cluster_.process)
            executors_.push_back(std::make_unique<RankExecutor>(
                program_, graph, r.rank, comms_->for_rank(r.rank),
                &kernels::backend_for(devices_.at(static_cast<size_t>(r.rank)))));
    {
        std::lock_guard lock(net_->parts);
        for (auto& ex : executors_) net_->executors.push_back(ex.get());
        net_->comms = comms_.get();
    }
    net_->tokens_per_step = program_.train.batch * program_.model.context;
    net_->gather_local = [net = net_.get()] {
        std::lock_guard lock(net->parts);
        std::string bytes;
        for (auto* ex : net->executors)
            for (auto& [index, stage] : ex->stages())
                models::append_serialised(stage->params(), stage->tied_copies(), bytes);
        return bytes;
    };
    net_->formed = true;
}

Job::~Job() {
    // The executors and communication go before the actor system (net_, declared first); its
    // actors, still running, stop seeing them first.
    net_->detach_parts();
    executors_.clear();
    comms_.reset();
}

RankExecutor& Job::executor(int32_t rank) {
    for (auto& ex : executors_)
        if (ex->rank() == rank) return *ex;
    throw std::out_of_range("rank " + std::to_string(rank) + " is not a rank of this process");
}

std::string Job::run(const JobOptions& options) {
    Net& net = *net_;
    caf::actor_system& sys = *net.sys;
    net.options = options;
    int cores = std::max(1, omp_get_num_procs() / std::max(1, cluster_.local_processes));
    int threads = std::max(1, cores / static_cast<int>(std::max<size_t>(1, executors_.size())));
    if (cluster_.processes == 1) // a fresh coordinator for every run
        net.coordinator = sys.spawn(coordinator, &net);
    else if (net.ran)
        throw std::logic_error("a job of several processes runs once");
    net.ran = true;
    std::vector<caf::actor> workers;
    std::string result;
    {
        caf::scoped_actor self{sys};
        for (auto& ex : executors_) {
            auto w = sys.spawn<caf::detached>(worker, ex.get(), &data_, threads, comms_.get());
            workers.push_back(caf::actor_cast<caf::actor>(w));
            self->send(net.coordinator, worker_atom::value, ex->rank(), workers.back());
        }
        self->send(net.coordinator, ready_atom::value, cluster_.process);
        if (coordinating()) {
            // The coordinator's answer, or its end (a promise it never kept is not reported).
            self->monitor(net.coordinator);
            self->send(net.coordinator, start_atom::value);
            bool answered = false;
            self->receive_while([&] { return !answered; })(
                [&](std::string& r) {
                    result = r;
                    answered = true;
                },
                [&](caf::error& e) {
                    result = "the coordinator failed: " + sys.render(e);
                    answered = true;
                },
                [&](caf::down_msg& dm) {
                    if (dm.source != net.coordinator.address()) return;
                    result = "the coordinator ended before the job did: " + sys.render(dm.reason);
                    answered = true;
                });
        } else {
            result = net.member_done.get_future().get();
        }
        for (auto& w : workers) self->send_exit(w, caf::exit_reason::user_shutdown);
        // The executors must outlive their workers. A worker stuck in a collective after a
        // failure ends with its process (the abandon callback).
        for (auto& w : workers) self->wait_for(w);
    }
    return result;
}

void Job::gather(models::Model& whole) {
    for (auto& ex : executors_)
        for (auto& [index, stage] : ex->stages())
            models::copy_to_whole(stage->params(), whole.params(), stage->tied_copies());
    if (cluster_.processes == 1 || !coordinating()) return;
    // The other processes' shards, asked of their member actors from here: on_step runs inside
    // the coordinator (which keeps member_actors), so the requests go out from a scoped actor
    // that waits for the answers.
    caf::actor_system& sys = *net_->sys;
    caf::scoped_actor self{sys};
    for (auto& [p, actor] : net_->member_actors) {
        // The answer, or the process's end (a request to a process that died meanwhile is
        // never answered), or the time limit.
        std::string error;
        bool answered = false;
        self->monitor(actor);
        self->send(actor, gather_atom::value);
        self->receive_while([&] { return !answered; })(
            [&](std::string& shards) {
                error = models::merge_serialised(shards, whole.params());
                answered = true;
            },
            [&](caf::error& e) {
                error = sys.render(e);
                answered = true;
            },
            [&](caf::down_msg& dm) {
                if (dm.source != actor.address()) return;
                error = "was lost: " + sys.render(dm.reason);
                answered = true;
            },
            caf::after(std::chrono::minutes(2)) >>
                [&] {
                    error = "no answer in 2 minutes";
                    answered = true;
                });
        self->demonitor(actor);
        if (error.empty()) continue;
        // Named as a process lost during a step is: its ranks, host and pid.
        std::string who = "process " + std::to_string(p) + " (" + net_->ranks_of(p);
        if (auto place = net_->member_places.find(p); place != net_->member_places.end())
            who += ", " + place->second;
        who += ")";
        if (error.rfind("was lost", 0) == 0)
            throw std::runtime_error(who + " " + error +
                                     " while its parameters were gathered for the checkpoint");
        throw std::runtime_error("gathering the parameters of " + who + ": " + error);
    }
}

void Job::scatter(models::Model& whole) {
    for (auto& ex : executors_)
        for (auto& [index, stage] : ex->stages())
            models::copy_from_whole(whole.params(), stage->params());
}

} // namespace dist::runtime
