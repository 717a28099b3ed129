// gloo.hpp: collectives over Gloo's TCP transport, for CPU ranks in different processes (and,
// for tests, threads of one process).
//
// Members meet through a KeyValueStore: each publishes its TCP address under the group's
// prefix and connects to every other (a full mesh). No Gloo type crosses this header.
#pragma once

#include "transport/collectives.hpp"
#include "transport/store.hpp"

#include <chrono>
#include <memory>
#include <string>

namespace dist::transport {

struct GlooOptions {
    std::string hostname = "127.0.0.1"; // the interface this member listens on
    std::chrono::milliseconds timeout = std::chrono::minutes(5);
};

/// Joins group `prefix` as `rank` of `size`; returns when every member has joined. Blocks until
/// the others arrive (up to the timeout): members must be created concurrently. Throws
/// CollectiveError with the cause when the group cannot form.
std::unique_ptr<Collectives> make_gloo_collectives(KeyValueStore& store, const std::string& prefix,
                                                   int rank, int size,
                                                   const GlooOptions& options = {});

} // namespace dist::transport
