// local_comms.hpp: the communication groups of a graph's ranks when all of them are threads of
// this process: one in-process fabric for point-to-point, and one collectives group per
// tensor-parallel, data-parallel, model-replica and tied-embedding group, in-process or Gloo.
#pragma once

#include "actors/plan/graph.hpp"
#include "actors/runtime/executor.hpp"
#include "transport/inprocess.hpp"
#include "transport/p2p.hpp"
#include "transport/store.hpp"

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace dist::runtime {

enum class CollectivesBackend { inprocess, gloo };

class LocalComms {
  public:
    LocalComms(const plan::Graph& graph, CollectivesBackend backend = CollectivesBackend::inprocess,
               std::chrono::milliseconds timeout = std::chrono::minutes(5));
    ~LocalComms();

    /// The handles of `rank` (valid while this object lives).
    RankComms for_rank(int32_t rank);
    /// Fails every pending and later transfer and in-process collective with `why`.
    void abort(const std::string& why);

  private:
    struct Group;
    transport::Collectives* join(const std::vector<int32_t>& key, int32_t rank,
                                 const std::string& name);

    const plan::Graph& graph_;
    CollectivesBackend backend_;
    std::chrono::milliseconds timeout_;
    transport::InProcessFabric fabric_;
    transport::MemoryStore store_;
    std::vector<std::unique_ptr<transport::PointToPoint>> endpoints_;
    std::map<std::vector<int32_t>, std::unique_ptr<Group>> groups_;
};

} // namespace dist::runtime
