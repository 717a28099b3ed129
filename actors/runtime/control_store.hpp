// control_store.hpp: the job's key-value store over the control plane, and where this host is
// reached.
#pragma once

#include "transport/store.hpp"

#include <caf/all.hpp>

#include <cstdint>
#include <memory>
#include <string>

namespace dist::runtime {

/// The store kept by `coordinator` (a set or get is a request to it).
std::unique_ptr<transport::KeyValueStore> make_control_store(caf::actor_system& sys,
                                                             caf::actor coordinator);

/// This machine's host name, as the processes of a job name each other.
std::string host_name();

/// Whether `host` names this machine's loopback.
bool loopback(const std::string& host);

/// The address of this host's interface that reaches `host` (where Gloo should listen).
std::string address_towards(const std::string& host, uint16_t port);

} // namespace dist::runtime
