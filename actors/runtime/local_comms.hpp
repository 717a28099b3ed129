// local_comms.hpp: the communication groups of a graph's ranks in this process: point-to-point
// handles and one collectives group per tensor-parallel, data-parallel, model-replica and
// tied-embedding group.
//
// With every rank in this process: one in-process fabric for point-to-point, and in-process or
// Gloo collectives. With the ranks spread over processes (a CommsLayout): ranks of this process
// still talk to each other through the in-process fabric, and to ranks elsewhere through UCX
// (one endpoint per rank, meeting in the layout's store); a group with members in other
// processes reduces through Gloo, meeting in the same store, and a group wholly inside this
// process stays in-process. Groups are formed in one order that every process follows, so no
// two processes wait for each other's groups.
//
// Ranks on GPUs (devices naming CUDA devices) reduce their tensor-parallel, data-parallel and
// tied-embedding groups in device memory: through NCCL where every member's process can use it
// and every member has a GPU of its own (see nccl_can_serve; every process publishes its ranks'
// GPUs, host name and PCI bus id, in the store, so all of them decide alike), else through the
// host groups above with staging copies. NCCL's unique id travels through the same store. The
// model-replica group reduces one host scalar (the gradient norm) and stays on the host.
#pragma once

#include "actors/plan/graph.hpp"
#include "actors/runtime/executor.hpp"
#include "transport/inprocess.hpp"
#include "transport/p2p.hpp"
#include "transport/store.hpp"
#include "transport/ucx.hpp"

#include <array>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace dist::runtime {

enum class CollectivesBackend { inprocess, gloo };

/// Where the ranks of a job live when they are spread over processes.
struct CommsLayout {
    /// The process of every rank, and this process's number.
    std::vector<int32_t> process_of;
    int32_t process = 0;
    /// Shared by every process of the job (the control plane's store).
    transport::KeyValueStore* store = nullptr;
    /// Keys in the store start with it (a job's own namespace).
    std::string prefix = "job";
    /// The address this process's Gloo members listen on (reachable by the other processes).
    std::string gloo_host = "127.0.0.1";
    transport::UcxOptions ucx;
    /// The device of every rank (only this process's are read); empty: all on the CPU.
    std::vector<kernels::Device> devices;
};

/// Bytes and time of one rank's point-to-point traffic with one rank of another process, by
/// direction of the pipeline (0 activations, 1 gradients).
struct PeerTraffic {
    std::array<transport::UcxTraffic, 2> sent, received;
};
/// The GPU a rank computes on, as every process of a job sees it.
struct GpuIdentity {
    std::string gpu;   ///< "host/PCI bus id"; empty: the rank is not on a GPU
    bool nccl = false; ///< its process can reduce that GPU's memory through NCCL
};
/// Whether NCCL reduces the device group of `ranks`, given every rank's GPU (`ids`, by rank):
/// when every member's process can use NCCL, no two members share a GPU (NCCL refuses that),
/// and no member's GPU also serves another rank of the job. Two communicators busy at once on
/// one GPU can deadlock when their ranks issue their calls in different orders, which ranks
/// sharing a GPU do; the host-staged groups then reduce instead.
bool nccl_can_serve(const std::vector<GpuIdentity>& ids, const std::vector<int32_t>& ranks);
/// Whether this build reduces GPU groups through NCCL at all.
bool built_with_nccl();

/// A rank's traffic with other processes, by peer rank (peers it exchanged nothing with are
/// absent): a step's transfer statistics.
using RankTraffic = std::map<int32_t, PeerTraffic>;

class LocalComms {
  public:
    /// Every rank of `graph` in this process, on `devices` (by rank; empty: all on the CPU).
    LocalComms(const plan::Graph& graph, CollectivesBackend backend = CollectivesBackend::inprocess,
               std::chrono::milliseconds timeout = std::chrono::minutes(5),
               std::vector<kernels::Device> devices = {});
    /// The ranks of `layout.process` only, the others reached across processes.
    LocalComms(const plan::Graph& graph, const CommsLayout& layout,
               std::chrono::milliseconds timeout = std::chrono::minutes(5));
    ~LocalComms();

    /// The handles of `rank`, a rank of this process (valid while this object lives).
    RankComms for_rank(int32_t rank);
    /// What reduces the device-memory groups of GPU ranks in this process: "nccl", "staged"
    /// (through host groups), or "" when no group of this process has GPU members.
    std::string device_collectives() const { return device_collectives_; }
    /// Fails every pending and later transfer and in-process collective with `why`.
    void abort(const std::string& why);
    /// The traffic of `rank` with other processes so far (zero within one process). From the
    /// rank's own thread, between its steps.
    RankTraffic traffic(int32_t rank) const;

  private:
    struct Group;
    class Routed;
    void form_groups();
    transport::Collectives* member(const std::vector<int32_t>& key, int32_t rank) const;
    bool local(int32_t rank) const;
    bool gpu(int32_t rank) const;
    /// Learns which physical GPU every rank uses (identity_), from this process's backends and
    /// the other processes' entries in the store.
    void learn_identities();

    const plan::Graph& graph_;
    CollectivesBackend backend_;
    std::chrono::milliseconds timeout_;
    std::optional<CommsLayout> layout_;
    std::vector<kernels::Device> devices_;
    std::vector<GpuIdentity> identity_; // by rank (empty: no rank of this process on a GPU)
    transport::InProcessFabric fabric_;
    transport::MemoryStore store_;
    std::map<int32_t, std::unique_ptr<transport::PointToPoint>> endpoints_;
    std::map<int32_t, transport::UcxEndpoint*> ucx_; // inside the Routed endpoints
    std::map<std::vector<int32_t>, std::unique_ptr<Group>> groups_;
    std::string device_collectives_;
    class AwayHint;
    std::map<std::pair<int32_t, transport::Collectives*>, std::unique_ptr<AwayHint>> hints_;
};

} // namespace dist::runtime
