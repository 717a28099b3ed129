// member.cpp: the actor of a process other than 0. It hears the coordinator's abort, abandon and
// end, answers its requests for this process's parameter shards, sends heartbeats (with what
// its ranks are running) and listens for the coordinator's: a coordinator that dies, or falls
// silent for the heartbeat timeout (a host that froze or dropped off the network with its
// connections open), ends this process's ranks and then the process, with a message that names
// process 0, where it ran and how long it has been silent.
#include "actors/runtime/net.hpp"

#include <chrono>
#include <thread>

namespace dist::runtime {

namespace {

struct MemberState {
    Job::Net* net = nullptr;
    std::chrono::steady_clock::time_point last_heard; // from the coordinator
    std::chrono::steady_clock::time_point last_tick;
    bool lost = false;
};

using member_pointer = caf::stateful_actor<MemberState>*;

// The coordinator is gone or silent: this process's ranks stop, the job's run here ends with
// `why`, and the process ends (the caller's abandon) when ranks are still stuck a while later.
void lose_coordinator(member_pointer self, const std::string& why) {
    Job::Net* net = self->state.net;
    if (self->state.lost) return;
    self->state.lost = true;
    net->abort(why);
    net->end_member(why);
    // Without a coordinator nobody says when to give up: ranks still busy after a while wait
    // in Gloo for peers that are gone.
    if (net->cluster.abandon)
        net->abandon_thread = std::thread([net, why] {
            auto deadline = std::chrono::steady_clock::now() + net->cluster.abandon_after;
            while (std::chrono::steady_clock::now() < deadline) {
                // Still forming the job counts as busy: it waits on the store it lost.
                if (net->closing.load() || (net->formed.load() && !net->busy())) return;
                std::this_thread::sleep_for(std::chrono::milliseconds(50));
            }
            if (!net->closing.load()) net->cluster.abandon(why);
        });
    self->quit();
}

// "the coordinator, process 0 (ranks 0-1, host vm, pid 12), at 127.0.0.1:29400".
std::string coordinator_name(const Job::Net& net) {
    return "the coordinator, " + net.process_name(0, net.coordinator_place) + ", at " +
           net.cluster.host + ":" + std::to_string(net.cluster.port);
}

caf::behavior member(member_pointer self, Job::Net* net) {
    self->state.net = net;
    self->state.last_heard = std::chrono::steady_clock::now();
    ignore_remote_exits(self);
    self->monitor(net->coordinator);
    self->set_down_handler([self, net](caf::down_msg& dm) {
        lose_coordinator(self, "lost " + coordinator_name(*net) + " (" +
                                   self->system().render(dm.reason) + ")");
    });
    self->send(self, tick_atom::value);
    // Only the coordinator's process (and this one) is heard; every message from it shows
    // that it is alive.
    auto heard = [self, net] {
        const auto& s = self->current_sender();
        if (s && s->node() == net->coordinator.node()) {
            self->state.last_heard = std::chrono::steady_clock::now();
            return true;
        }
        return s && s->node() == self->node();
    };
    return {
        [self](stop_atom) {
            if (self->current_sender() && self->current_sender()->node() == self->node())
                self->quit();
        },
        [heard](alive_atom) { heard(); },
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
        [self, net, heard](done_atom, const std::string& result) -> caf::result<ok_atom> {
            if (!heard()) return caf::sec::request_receiver_down;
            net->end_member(result);
            self->quit();
            return ok_atom::value;
        },
        [net, heard](gather_atom) -> caf::result<std::string> {
            if (!heard()) return caf::sec::request_receiver_down;
            return net->gather_local();
        },
        [self, net](tick_atom) {
            if (!self->current_sender() || self->current_sender()->node() != self->node()) return;
            auto now = std::chrono::steady_clock::now();
            // A tick far behind its time: this process was frozen, not the coordinator.
            if (self->state.last_tick.time_since_epoch().count() != 0 &&
                now - self->state.last_tick > net->cluster.heartbeat_timeout / 2)
                self->state.last_heard = now;
            self->state.last_tick = now;
            auto silent = now - self->state.last_heard;
            if (silent > net->cluster.heartbeat_timeout)
                return lose_coordinator(
                    self,
                    "lost " + coordinator_name(*net) + ": no heartbeat for " +
                        std::to_string(
                            std::chrono::duration_cast<std::chrono::seconds>(silent).count()) +
                        " s (it stopped answering: a frozen or unreachable host)");
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

} // namespace

caf::actor spawn_member(Job::Net& net) {
    return net.sys->spawn(member, &net);
}

} // namespace dist::runtime
