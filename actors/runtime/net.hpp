// net.hpp: what the actors of one process of a job share (Job::Net): the actor system, the
// job's options, this process's executors and communication, and the hand-over of step reports
// from the coordinator to the thread that runs the job. Also the behaviours of the coordinator
// (coordinator.cpp) and of a member process's actor (member.cpp).
#pragma once

#include "actors/runtime/job.hpp"
#include "actors/runtime/protocol.hpp"

#include <atomic>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

namespace dist::runtime {

struct Job::Net {
    caf::actor_system_config cfg;
    std::unique_ptr<caf::actor_system> sys;
    caf::actor coordinator; // here (process 0) or a proxy
    caf::actor member;      // this process's member actor (processes other than 0)
    std::map<int32_t, caf::actor> member_actors;  // process 0: the others' (by the coordinator)
    std::map<int32_t, std::string> member_places; // process 0: "host vm, pid 123" of the others
    /// Processes other than 0: where process 0 runs ("host vm, pid 123"), told at hello.
    std::string coordinator_place;
    std::vector<int32_t> process_of;
    ClusterOptions cluster;
    JobOptions options;
    // This process's communication and executors, owned by the Job: set once formed, read by
    // the actors (on their threads), cleared under `parts` before the Job destroys them.
    std::mutex parts;
    LocalComms* comms = nullptr;
    std::vector<RankExecutor*> executors;
    int64_t tokens_per_step = 0;
    std::promise<std::string> member_done;
    std::atomic<bool> member_finished{false};
    /// Process 0: the job's failure once the coordinator has one ("" until then), for the
    /// thread that gathers a checkpoint, which waits on a member meanwhile.
    void set_failure(const std::string& why) {
        std::lock_guard lock(failure_mutex);
        failure = why;
    }
    std::string failed() {
        std::lock_guard lock(failure_mutex);
        return failure;
    }
    std::mutex failure_mutex;
    std::string failure;
    /// A process other than 0: its part of the job ends with `result` (the first call counts).
    void end_member(const std::string& result) {
        if (!member_finished.exchange(true)) member_done.set_value(result);
    }
    bool ran = false;
    std::atomic<bool> formed{false};           // the constructor has finished
    std::function<std::string()> gather_local; // this process's parameter shards, serialised
    /// The job's store (UCX endpoints read peers' addresses from it when they first connect).
    std::unique_ptr<transport::KeyValueStore> store;
    /// The last step's report, from the coordinator to the thread in Job::run that hands it to
    /// on_step (a callback never runs inside the coordinator, which keeps serving heartbeats and
    /// the store meanwhile).
    std::mutex report_mutex;
    std::optional<StepReport> report;
    /// A member that lost its coordinator: ends the process if its ranks stay stuck (member.cpp).
    /// Joined by the destructor, which tells it to stop looking first.
    std::thread abandon_thread;
    std::atomic<bool> closing{false};

    void abort(const std::string& why);
    /// Actions completed by this process's ranks so far.
    uint64_t progress();
    /// "rank 4 in 1F3; rank 5 finished its step".
    std::string actions();
    /// Whether any rank here is inside an action.
    bool busy();
    void detach_parts();
    /// Ends this process's coordinator (if it lives here) and member actor. Exit messages from
    /// other processes are ignored, and so are anonymous ones, so this comes from an actor here.
    void stop_actors();
    /// "rank 3" or "ranks 4-7": the ranks of `process`.
    std::string ranks_of(int32_t process) const;
    /// "process 2 (ranks 4-5, host vm, pid 123)".
    std::string process_name(int32_t process, const std::string& place) const;

    ~Net();
};

/// Process 0's coordinator: admits the other processes, serves the store, runs the steps,
/// supervises (heartbeats both ways, the watchdog, lost processes).
caf::actor spawn_coordinator(Job::Net& net);

/// A process other than 0: hears the coordinator's abort and end, sends heartbeats and its
/// parameter shards, and ends the process when the coordinator falls silent.
caf::actor spawn_member(Job::Net& net);

/// Ignores exit messages from other processes: only this process ends its actors.
template <class Self> void ignore_remote_exits(Self* self) {
    self->set_exit_handler([self](caf::exit_msg& m) {
        if (m.source.node() == self->node()) self->quit(m.reason);
    });
}

} // namespace dist::runtime
