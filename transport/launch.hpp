// launch.hpp: where this process sits in a job, read from the launcher that started it.
//
// Processes started by Slurm's srun, OpenMPI's mpirun, or anything that sets DIST_RANK and
// DIST_WORLD_SIZE (Dist's own local launcher among them) learn their rank, the job's size, their
// index on the host, and where rank 0's coordinator listens (DIST_COORDINATOR=host:port, as
// MASTER_ADDR / MASTER_PORT for torchrun; by default the first host of a Slurm allocation, or
// this host, at port 29400).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace dist::transport {

struct LaunchInfo {
    std::string launcher = "none"; // "slurm", "mpirun", "dist" or "none" (one process)
    int rank = 0;
    int world_size = 1;
    int local_rank = 0;
    std::string coordinator_host = "127.0.0.1";
    int coordinator_port = 29400;
    std::vector<std::string> hosts; // the allocation's hosts, when the launcher says
};

/// Reads the environment through `getenv` (std::getenv in production). Slurm is recognised by
/// SLURM_PROCID, OpenMPI by OMPI_COMM_WORLD_RANK, Dist by DIST_RANK; DIST_RANK and
/// DIST_WORLD_SIZE win over the others when set. A malformed value (not a number, a rank outside
/// the world, a bad host:port, a bad Slurm node list) is an error naming the variable; on error
/// the result is empty and `error` says why.
std::optional<LaunchInfo> detect_launch(const std::function<const char*(const char*)>& getenv,
                                        std::string& error);

/// Expands a Slurm host list: "gpu[01-03,07],login2" -> gpu01 gpu02 gpu03 gpu07 login2 (zero
/// padding kept). Empty and an error on malformed input.
std::vector<std::string> expand_nodelist(const std::string& list, std::string& error);

/// A TCP port on 127.0.0.1 that nothing is bound to now, for a coordinator to listen on a moment
/// later. It is drawn at random from below the kernel's ephemeral range
/// (/proc/sys/net/ipv4/ip_local_port_range), where no outgoing connection and no `bind` to port
/// 0 lands in the meantime, so only another caller of this function can take it first, and two
/// callers agree only by chance. -1 and `error` when no port can be bound.
int free_loopback_port(std::string& error);

} // namespace dist::transport
