// job.cpp: a Job: the actor system of this process, joining the control plane (process 0
// publishes the coordinator; the others prove the token and say hello), the ranks' executors
// and communication, and the thread that runs the steps (it hands each report to on_step).
// The coordinator, member and worker actors are in their own files (coordinator.cpp,
// member.cpp, worker.cpp); the wire types in protocol.hpp.
#include "actors/runtime/job.hpp"

#include "actors/runtime/auth.hpp"
#include "actors/runtime/control_store.hpp"
#include "actors/runtime/net.hpp"
#include "kernels/devices.hpp"

#include <caf/io/all.hpp>
#include <caf/openssl/all.hpp>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <stdexcept>
#include <thread>

namespace dist::runtime {

void Job::Net::abort(const std::string& why) {
    std::lock_guard lock(parts);
    if (comms) comms->abort(why);
}

uint64_t Job::Net::progress() {
    std::lock_guard lock(parts);
    uint64_t p = 0;
    for (auto* ex : executors) p += ex->progress();
    return p;
}

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

bool Job::Net::busy() {
    std::lock_guard lock(parts);
    for (auto* ex : executors)
        if (!ex->current_action().empty()) return true;
    return false;
}

void Job::Net::detach_parts() {
    std::lock_guard lock(parts);
    comms = nullptr;
    executors.clear();
}

void Job::Net::stop_actors() {
    caf::scoped_actor self{*sys};
    if (coordinator && coordinator.node() == sys->node()) self->send(coordinator, stop_atom::value);
    if (member) self->send(member, stop_atom::value);
}

Job::Net::~Net() {
    // The actor system's destructor waits for every actor: end this process's own first.
    if (!sys) return;
    stop_actors();
    // The actors use the members below: the system (which waits for them) goes first.
    store.reset();
    sys.reset();
    closing = true;
    if (abandon_thread.joinable()) abandon_thread.join();
}

std::string Job::Net::ranks_of(int32_t process) const {
    std::vector<int32_t> r;
    for (size_t i = 0; i < process_of.size(); ++i)
        if (process_of[i] == process) r.push_back(static_cast<int32_t>(i));
    if (r.empty()) return "no ranks";
    if (r.size() == 1) return "rank " + std::to_string(r.front());
    return "ranks " + std::to_string(r.front()) + "-" + std::to_string(r.back());
}

std::string Job::Net::process_name(int32_t process, const std::string& place) const {
    return "process " + std::to_string(process) + " (" + ranks_of(process) +
           (place.empty() ? "" : ", " + place) + ")";
}

namespace {

// A process other than 0 joins: it challenges the coordinator (which must prove the token),
// answers the coordinator's challenge with its hello, and learns where process 0 runs. "" when
// admitted, else why not.
std::string join(Job::Net& net, const ClusterOptions& cluster) {
    caf::actor_system& sys = *net.sys;
    caf::scoped_actor self{sys};
    const std::string host = host_name();
    const std::string mine = fresh_nonce();
    std::string nonce, proof, refusal;
    self->request(net.coordinator, std::chrono::seconds(30), challenge_atom::value, mine)
        .receive(
            [&](std::string& n, std::string& p) {
                nonce = std::move(n);
                proof = std::move(p);
            },
            [&](caf::error& e) { refusal = "no answer to the challenge: " + sys.render(e); });
    if (!refusal.empty()) return refusal;
    if (nonce.empty()) return "refused by the coordinator: " + proof;
    if (!same_proof(proof, prove(cluster.token, {"coordinator", mine, nonce})))
        return "the coordinator did not prove this job's token (another job's coordinator, or "
               "the token differs: DIST_JOB_TOKEN or DIST_JOB_TOKEN_FILE)";
    self->request(
            net.coordinator, std::chrono::seconds(30), hello_atom::value, protocol_version,
            prove(cluster.token, {"member", nonce, cluster.digest, std::to_string(cluster.process),
                                  std::to_string(::getpid()), host}),
            nonce, cluster.digest, cluster.process, static_cast<int32_t>(::getpid()), host,
            net.member)
        .receive(
            [&](std::string& r, std::string& place) {
                refusal = std::move(r);
                net.coordinator_place = std::move(place);
            },
            [&](caf::error& e) { refusal = "no answer to hello: " + sys.render(e); });
    return refusal;
}

} // namespace

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
    if (cluster.token.empty())
        throw std::runtime_error(
            "a job of several processes needs a token that every process presents: set "
            "DIST_JOB_TOKEN to the same secret in each (for example `export DIST_JOB_TOKEN=$(head "
            "-c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n')` before srun or mpirun), or "
            "DIST_JOB_TOKEN_FILE to a file that holds it; `dist run --procs N` makes one itself");
    net.process_of = process_of_ranks(ranks, cluster.processes);
    devices_ = place_ranks(program, graph, net.process_of, cluster.process, cluster.local_process);
    configure(net.cfg, true, &cluster.tls);
    net.sys = std::make_unique<caf::actor_system>(net.cfg);
    caf::actor_system& sys = *net.sys;
    const std::string where = cluster.host + ":" + std::to_string(cluster.port);
    if (cluster.process == 0) {
        net.coordinator = spawn_coordinator(net);
        const char* in = loopback(cluster.host) ? "127.0.0.1" : nullptr;
        auto port = cluster.tls.enabled()
                        ? caf::openssl::publish(net.coordinator, cluster.port, in, true)
                        : sys.middleman().publish(net.coordinator, cluster.port, in, true);
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
            auto coord = cluster.tls.enabled()
                             ? caf::openssl::remote_actor(sys, cluster.host, cluster.port)
                             : sys.middleman().remote_actor(cluster.host, cluster.port);
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
    if (cluster.process != 0) net.member = spawn_member(net);
    if (cluster.process != 0) {
        std::string refusal = join(net, cluster);
        if (!refusal.empty()) {
            net.stop_actors();
            throw std::runtime_error("joining the job at " + where + ": " + refusal);
        }
    }
    net.store = make_control_store(sys, net.coordinator);
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

namespace {

// OpenMP keeps the threads of a team for as long as the thread that started it lives. With more
// of them in the process than cores, libgomp has every team's threads sleep as soon as a
// parallel region ends, and each region of the ranks' kernels then waits for its threads to
// wake: 50-80 us a region on a two-core machine, against 1-4 with no team beside the ranks'.
// The work this thread does (the executors' parameters initialised, a checkpoint read or
// written between steps) leaves no team behind.
void release_openmp_team() {
    omp_pause_resource_all(omp_pause_soft);
}

} // namespace

std::string Job::run(const JobOptions& options) {
    release_openmp_team();
    Net& net = *net_;
    caf::actor_system& sys = *net.sys;
    net.options = options;
    int cores = std::max(1, omp_get_num_procs() / std::max(1, cluster_.local_processes));
    int threads =
        options.threads > 0
            ? options.threads
            : std::max(1, cores / static_cast<int>(std::max<size_t>(1, executors_.size())));
    if (cluster_.processes == 1) // a fresh coordinator for every run
        net.coordinator = spawn_coordinator(net);
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
                [&](stepped_atom) {
                    // The step's report, handed to the caller here, on the caller's thread.
                    std::optional<StepReport> report;
                    {
                        std::lock_guard lock(net.report_mutex);
                        report.swap(net.report);
                    }
                    if (!report) return;
                    bool go_on = true;
                    std::string error;
                    try {
                        if (options.on_step) go_on = options.on_step(*report);
                    } catch (const std::exception& e) {
                        error =
                            "after step " + std::to_string(report->metrics.step) + ": " + e.what();
                    }
                    release_openmp_team();
                    self->send(net.coordinator, next_atom::value, go_on, error);
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
    // The other processes' shards, asked of their member actors from here (on_step runs on the
    // thread in run(), between steps), from a scoped actor that waits for the answers.
    caf::actor_system& sys = *net_->sys;
    caf::scoped_actor self{sys};
    for (auto& [p, actor] : net_->member_actors) {
        // The answer, or the process's end (a request to a process that died meanwhile is
        // never answered), or the time limit.
        std::string error;
        bool answered = false;
        self->monitor(actor);
        self->send(actor, gather_atom::value);
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(2);
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
            // Every 200 ms without an answer: the job may have failed meanwhile (this member
            // stopped answering its heartbeats, say), or the time may be up.
            caf::after(std::chrono::milliseconds(200)) >>
                [&] {
                    if (std::string why = net_->failed(); !why.empty()) {
                        error = "the job failed: " + why;
                        answered = true;
                    } else if (std::chrono::steady_clock::now() > deadline) {
                        error = "no answer in 2 minutes";
                        answered = true;
                    }
                });
        self->demonitor(actor);
        if (error.empty()) continue;
        // Named as a process lost during a step is: its ranks, host and pid.
        auto place = net_->member_places.find(p);
        std::string who =
            net_->process_name(p, place != net_->member_places.end() ? place->second : "");
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
