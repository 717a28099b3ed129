// job.hpp: a training run on a mesh, executed by CAF actors in this process or spread over
// several processes (and hosts).
//
// A coordinator actor and one detached worker actor per rank. Each worker owns its rank's
// RankExecutor (its stages, shard of the parameters and optimizer state) and runs the plan's
// action list when the coordinator asks for a step. The coordinator starts every step, gathers
// the losses and statistics, hands the step's report to the caller (metrics, progress,
// checkpoints), and supervises: a failing worker's reply ends the step on every rank (the
// communication is aborted, so no rank stays blocked) and the run, with the rank, the action
// and the cause; a watchdog that sees no action complete for a while reports what every rank
// is waiting for and ends the run the same way. Nothing calls exit(); errors are returned.
//
// Across processes (ClusterOptions): process 0 hosts the coordinator and publishes it through
// CAF's middleman; every other process connects, proves the job's token by a challenge-response
// (and has the coordinator prove it back), says hello (protocol version, the plan's digest, its
// process number, host and pid) and is refused unless all of them match; only then are its
// messages heard. The coordinator serves the job's key-value store (where UCX and Gloo meet),
// hands out steps to every rank's worker wherever it lives, and watches liveness both ways: it
// hears a heartbeat from each process and notices one that dies (CAF's monitor of its member
// actor) or stops answering: the run ends naming the process's ranks, host, pid and what its
// ranks were running, and every process is told to abort. Each member hears the coordinator's
// heartbeats in turn and ends its process, naming process 0, when they stop.
//
// Files: protocol.hpp (wire types), coordinator.cpp, member.cpp, worker.cpp (the actors),
// control_store.cpp (the store over the control plane), placement.cpp (ranks to processes and
// devices), auth.cpp (the token's HMAC), job.cpp (this class).
#pragma once

#include "actors/plan/graph.hpp"
#include "actors/runtime/executor.hpp"
#include "actors/runtime/local_comms.hpp"
#include "lang/program.hpp"
#include "models/data.hpp"
#include "models/model.hpp"
#include "models/trainer.hpp"

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace dist::runtime {

struct StepReport {
    models::StepMetrics metrics;
    /// Per rank: when each action ran, relative to the start of the rank's step.
    std::vector<std::vector<ActionTiming>> timings;
    /// Per rank: its point-to-point traffic with other processes in this step.
    std::vector<RankTraffic> traffic;
    /// "" when the weights were updated; else the value that was not finite ("loss" or
    /// "gradient norm"), for which every rank skipped this step's update.
    std::string nonfinite;
};

/// Mutual TLS on the control plane: this node's certificate and key, and the CA that signs
/// every node's (PEM files). All three or none.
struct TlsFiles {
    std::string cert, key, ca;
    bool enabled() const { return !cert.empty(); }
};

/// This process's place in a job of several processes.
struct ClusterOptions {
    int32_t process = 0;
    int32_t processes = 1;
    /// Processes of this job on this host (they share its cores and GPUs), and this one's
    /// index among them (the launcher's local rank).
    int32_t local_processes = 1;
    int32_t local_process = 0;
    /// Where process 0's coordinator listens (and binds: loopback stays loopback).
    std::string host = "127.0.0.1";
    uint16_t port = 29400;
    /// The job's shared secret, required: a peer that cannot prove it holds it is refused, and
    /// a coordinator that cannot is left.
    std::string token;
    /// The plan's digest: every process must run the same plan.
    std::string digest;
    /// How long a process tries to reach the coordinator, and how long the coordinator waits
    /// for every process to join.
    std::chrono::milliseconds join_timeout = std::chrono::seconds(60);
    /// A process whose heartbeat has not arrived for this long is lost (both ways: the
    /// coordinator's heartbeats to the members too).
    std::chrono::milliseconds heartbeat_timeout = std::chrono::seconds(10);
    /// Where the coordinator reports refused peers (stderr in `dist run`).
    std::function<void(const std::string&)> log;
    /// Called (with the failure) in the processes other than 0 when ranks are still inside
    /// their step `abandon_after` after the job failed (or, without a coordinator, when this
    /// process's are): a rank can wait in a Gloo collective for a peer that already gave up,
    /// and Gloo cannot be interrupted. `dist run` ends the process (its sockets close, which
    /// frees the ranks waiting on it elsewhere); without it such a rank waits for Gloo's
    /// timeout.
    std::function<void(const std::string&)> abandon;
    std::chrono::milliseconds abandon_after = std::chrono::seconds(2);
    /// This process's data-plane options.
    transport::UcxOptions ucx;
    /// The control plane over mutual TLS (every process of the job alike), or plain TCP.
    TlsFiles tls;
};

/// The process of every rank when `ranks` ranks are divided among `processes` processes:
/// contiguous blocks, sizes differing by at most one.
std::vector<int32_t> process_of_ranks(int32_t ranks, int32_t processes);

/// The device of every rank of `graph` that process `process` runs (the others' entries are
/// the CPU, unread): the CPU for a mesh of `cpu` devices; else this host's GPUs in turn, the
/// process's ranks after those of the `local_process` processes before it on the host (the
/// processes numbered just before it), as torchrun gives local rank i the GPU i. More ranks
/// than GPUs share them. Throws
/// std::runtime_error when the mesh names GPUs and this build or machine has none.
std::vector<kernels::Device> place_ranks(const Program& program, const plan::Graph& graph,
                                         const std::vector<int32_t>& process_of, int32_t process,
                                         int32_t local_process);

/// place_ranks for a job of one process: every rank of `graph` on this host's devices.
std::vector<kernels::Device> place_in_one_process(const Program& program, const plan::Graph& graph);
/// The distinct GPUs among `placed` (place_ranks): what a run's ranks share, when they outnumber
/// them (sim::SimOptions::shared_gpus).
int32_t gpus_in_use(const std::vector<kernels::Device>& placed);

struct JobOptions {
    int64_t first_step = 0; // 0-based: the first step to run
    int64_t end_step = 0;   // exclusive
    /// No action completed on any rank for this long ends the run.
    std::chrono::milliseconds watchdog = std::chrono::minutes(2);
    /// Each rank's compute threads; 0: the process's share of the cores divided between its
    /// ranks (what the simulator assumes).
    int threads = 0;
    /// After every step, on the thread that called run() (never inside an actor), while every
    /// rank waits; returning false stops the run (after that step). What it throws ends the run
    /// as a failure "after step N: ...".
    std::function<bool(const StepReport&)> on_step;
};

class Job {
  public:
    /// Builds every rank's executor (and parameters) and the communication among them.
    Job(const Program& program, const plan::Graph& graph, const models::TokenData& data,
        CollectivesBackend backend = CollectivesBackend::inprocess);
    /// This process's part of a job of several: joins the control plane (process 0 publishes
    /// it), then builds the ranks of this process and their communication. Throws
    /// std::runtime_error when the job cannot form (coordinator unreachable, refused, a peer
    /// missing after the join timeout).
    Job(const Program& program, const plan::Graph& graph, const models::TokenData& data,
        const ClusterOptions& cluster);
    ~Job();

    /// Process 0 (or the only process): runs on_step, gathers checkpoints.
    bool coordinating() const { return cluster_.process == 0; }

    /// Runs steps [first_step, end_step). "" on success (also when on_step stopped the run),
    /// else the failure: "rank R in ACTION: cause". In a process other than 0, serves its
    /// ranks' steps until the coordinator ends the job (options.on_step is not called there).
    std::string run(const JobOptions& options);

    /// The device of every rank of this process (place_ranks).
    const std::vector<kernels::Device>& devices() const { return devices_; }
    /// What reduces GPU ranks' groups here (LocalComms::device_collectives).
    std::string device_collectives() const { return comms_->device_collectives(); }

    /// The executor of `rank`, a rank of this process (tests plant faults through its action
    /// hook).
    RankExecutor& executor(int32_t rank);

    /// Copies every rank's part of the parameters, gradients' optimizer moments included, into
    /// `whole` (a model of the full shapes): a consolidated checkpoint of any mesh. Across
    /// processes, on process 0, between steps (from on_step): the other processes send theirs.
    void gather(models::Model& whole);
    /// The inverse: every rank of this process takes its part of `whole`'s values and
    /// optimizer moments.
    void scatter(models::Model& whole);

    /// The actor system and the control plane (job.cpp).
    struct Net;

  private:
    void build_executors(const plan::Graph& graph);

    const Program& program_;
    const models::TokenData& data_;
    ClusterOptions cluster_;
    std::unique_ptr<Net> net_; // the actor system and the control plane
    std::vector<kernels::Device> devices_;
    std::unique_ptr<LocalComms> comms_;
    std::vector<std::unique_ptr<RankExecutor>> executors_;
};

} // namespace dist::runtime
