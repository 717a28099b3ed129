// launch_test.cpp: rank, world and coordinator from each launcher's environment.
#include "transport/launch.hpp"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <map>

using namespace dist::transport;

namespace {

std::optional<LaunchInfo> from(const std::map<std::string, std::string>& env, std::string& error) {
    return detect_launch(
        [&](const char* name) {
            auto it = env.find(name);
            return it == env.end() ? static_cast<const char*>(nullptr) : it->second.c_str();
        },
        error);
}

} // namespace

TEST(Launch, OneProcessWithoutALauncher) {
    std::string e;
    auto info = from({}, e);
    ASSERT_TRUE(info) << e;
    EXPECT_EQ(info->launcher, "none");
    EXPECT_EQ(info->world_size, 1);
    EXPECT_EQ(info->coordinator_host, "127.0.0.1");
    EXPECT_EQ(info->coordinator_port, 29400);
}

TEST(Launch, SlurmGivesRankWorldLocalRankAndTheFirstHostAsCoordinator) {
    std::string e;
    auto info = from({{"SLURM_PROCID", "5"},
                      {"SLURM_NTASKS", "16"},
                      {"SLURM_LOCALID", "1"},
                      {"SLURM_JOB_NODELIST", "gpu[07-09,12],login2"}},
                     e);
    ASSERT_TRUE(info) << e;
    EXPECT_EQ(info->launcher, "slurm");
    EXPECT_EQ(info->rank, 5);
    EXPECT_EQ(info->world_size, 16);
    EXPECT_EQ(info->local_rank, 1);
    EXPECT_EQ(info->hosts,
              (std::vector<std::string>{"gpu07", "gpu08", "gpu09", "gpu12", "login2"}));
    EXPECT_EQ(info->coordinator_host, "gpu07");
}

TEST(Launch, MpirunAndDistVariablesAndAnExplicitCoordinator) {
    std::string e;
    auto mpi = from({{"OMPI_COMM_WORLD_RANK", "3"},
                     {"OMPI_COMM_WORLD_SIZE", "4"},
                     {"OMPI_COMM_WORLD_LOCAL_RANK", "3"},
                     {"DIST_COORDINATOR", "node1.cluster:4242"}},
                    e);
    ASSERT_TRUE(mpi) << e;
    EXPECT_EQ(mpi->launcher, "mpirun");
    EXPECT_EQ(mpi->rank, 3);
    EXPECT_EQ(mpi->coordinator_host, "node1.cluster");
    EXPECT_EQ(mpi->coordinator_port, 4242);
    // DIST_RANK wins over a launcher's own variables.
    auto dist = from({{"DIST_RANK", "1"}, {"DIST_WORLD_SIZE", "2"}, {"SLURM_PROCID", "7"}}, e);
    ASSERT_TRUE(dist) << e;
    EXPECT_EQ(dist->launcher, "dist");
    EXPECT_EQ(dist->rank, 1);
}

TEST(Launch, MalformedValuesAreErrorsNamingTheVariable) {
    std::string e;
    EXPECT_FALSE(from({{"SLURM_PROCID", "x"}, {"SLURM_NTASKS", "2"}}, e));
    EXPECT_EQ(e, "SLURM_PROCID=`x` is not a non-negative integer");
    EXPECT_FALSE(from({{"OMPI_COMM_WORLD_RANK", "4"}, {"OMPI_COMM_WORLD_SIZE", "4"}}, e));
    EXPECT_EQ(e, "rank 4 is outside a world of 4 (from mpirun)");
    EXPECT_FALSE(from({{"DIST_RANK", "0"}}, e));
    EXPECT_EQ(e, "DIST_RANK is set but DIST_WORLD_SIZE is not");
    EXPECT_FALSE(from({{"DIST_COORDINATOR", "nohost"}}, e));
    EXPECT_EQ(e, "DIST_COORDINATOR=`nohost` is not host:port");
    EXPECT_FALSE(from({{"DIST_COORDINATOR", "h:70000"}}, e));
    EXPECT_FALSE(
        from({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"SLURM_JOB_NODELIST", "a[3-1]"}}, e));
    EXPECT_NE(e.find("SLURM_JOB_NODELIST"), std::string::npos) << e;
    EXPECT_TRUE(expand_nodelist("a[1-", e).empty());
    EXPECT_TRUE(expand_nodelist("", e).empty());
}

// The coordinator's port is drawn below the ephemeral range, where the outgoing connections and
// port-0 listeners of other jobs on the host land, and it can be listened on.
TEST(Launch, AFreePortLiesBelowTheEphemeralRangeAndCanBeListenedOn) {
    int low = 0, high = 0;
    std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
    if (!(range >> low >> high) || low < 11000)
        GTEST_SKIP() << "the ephemeral range leaves no room below it";
    for (int i = 0; i < 8; ++i) {
        std::string error;
        const int port = free_loopback_port(error);
        ASSERT_GT(port, 0) << error;
        EXPECT_GE(port, 10000);
        EXPECT_LT(port, low);
        int fd = ::socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        a.sin_port = htons(static_cast<uint16_t>(port));
        EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << port;
        EXPECT_EQ(::listen(fd, 1), 0) << port;
        ::close(fd);
    }
}
