// nccl.hpp: collectives over NCCL for ranks that each own one GPU.
//
// The data pointers given to the Collectives calls are device memory on the member's GPU.
// Members meet through a KeyValueStore: rank 0 creates NCCL's unique id and publishes it under
// the group's prefix; the others read it. Each call runs on the member's own CUDA stream, after
// the work already queued on the device's default stream (where the kernels that wrote the
// data run), and returns when the result is in place (the interface is blocking). The wait
// polls, so that abort() from another thread (a peer failed and will never join) ends it with a
// CollectiveError instead of a hang. Compiled only where CUDA and NCCL are found
// (DIST_HAVE_NCCL); no CUDA or NCCL type crosses this header.
#pragma once

#include "transport/collectives.hpp"
#include "transport/store.hpp"

#include <chrono>
#include <memory>
#include <string>

namespace dist::transport {

/// Joins group `prefix` as `rank` of `size` on GPU `device`. Blocks until every member has
/// joined (members are created concurrently). Throws CollectiveError with the failing call and
/// NCCL's or CUDA's message.
std::unique_ptr<Collectives> make_nccl_collectives(KeyValueStore& store, const std::string& prefix,
                                                   int rank, int size, int device,
                                                   std::chrono::milliseconds timeout);

} // namespace dist::transport
