// staged.hpp: collectives over device memory through a group that reduces host memory.
//
// Each call copies the member's data from its device to a host buffer, runs the host group's
// collective (in-process or Gloo) and copies the result back. It serves GPU ranks where NCCL
// cannot: a build without NCCL, or members that share one GPU (NCCL refuses two members on one
// device). The copies are synchronous, so they see every kernel queued before them.
#pragma once

#include "kernels/tensor.hpp"
#include "transport/collectives.hpp"

#include <memory>

namespace dist::transport {

/// `host`'s member, taking data in the memory of `device`'s device.
std::unique_ptr<Collectives> make_host_staged(std::unique_ptr<Collectives> host,
                                              kernels::Allocator& device);

} // namespace dist::transport
