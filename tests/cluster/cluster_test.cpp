// cluster_test.cpp: one job spread over operating-system processes, as users run it: `dist run
// --procs N`, processes started by mpirun or by hand (DIST_RANK ...), two network namespaces as
// two hosts; the same losses as one process; a killed process ends the job cleanly and the run
// resumes from its last checkpoint; peers without the token, of another plan, or speaking
// random bytes are refused while the job carries on.
#include "actors/runtime/job.hpp"
#include "actors/runtime/protocol.hpp"

#include "tests/cluster/cluster_helpers.hpp"
#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <arpa/inet.h>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <netinet/in.h>
#include <optional>
#include <set>
#include <sstream>
#include <sys/socket.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

namespace fs = std::filesystem;
using namespace std::chrono_literals;

using namespace dist::tests::cluster;

TEST(Cluster, RanksAreDividedInContiguousBlocks) {
    using dist::runtime::process_of_ranks;
    EXPECT_EQ(process_of_ranks(8, 2), (std::vector<int32_t>{0, 0, 0, 0, 1, 1, 1, 1}));
    EXPECT_EQ(process_of_ranks(8, 4), (std::vector<int32_t>{0, 0, 1, 1, 2, 2, 3, 3}));
    EXPECT_EQ(process_of_ranks(5, 2), (std::vector<int32_t>{0, 0, 0, 1, 1}));
    EXPECT_EQ(process_of_ranks(3, 3), (std::vector<int32_t>{0, 1, 2}));
    EXPECT_EQ(process_of_ranks(4, 1), (std::vector<int32_t>{0, 0, 0, 0}));
}

// The runtime's equivalence cases, with the ranks spread over 2 and 4 processes: pipeline
// neighbours in different processes (UCX), data- and tensor-parallel groups across processes
// (Gloo), the tied embedding's group across processes.
namespace {
std::vector<std::string> with_zero(int stage, std::vector<std::string> sets) {
    sets.push_back("mesh.zero=" + std::to_string(stage));
    return sets;
}
std::vector<std::string> with_ep(int ep, std::vector<std::string> sets) {
    sets.push_back("mesh.ep=" + std::to_string(ep));
    return sets;
}
std::vector<std::string> with_cp(std::vector<std::string> sets) {
    sets.push_back("mesh.cp=2");
    return sets;
}
std::vector<std::string> with_sp(std::vector<std::string> sets) {
    sets.push_back("mesh.sp=true");
    return sets;
}
} // namespace

TEST(Cluster, SameLossesOverTwoAndFourProcessesAsInOne) {
    Dir dir("equivalence");
    const std::vector<Mesh> meshes = {
        {"dp2 pp2 1f1b", "gpt.dist", mesh_sets(2, 1, 2, "1f1b", 2), 4},
        {"tp2 pp2 gpipe", "gpt.dist", mesh_sets(1, 2, 2, "gpipe", 2), 4},
        {"tp4", "gpt.dist", mesh_sets(1, 4, 1, "1f1b", 1), 4},
        {"pp2 zb_h1", "gpt.dist", mesh_sets(1, 1, 2, "zb_h1", 4), 2},
        {"pp2 interleaved v2", "gpt.dist", mesh_sets(1, 1, 2, "interleaved_1f1b", 4, 2), 2},
        {"pp2 zbv", "gpt.dist", mesh_sets(1, 1, 2, "zbv", 4, 2), 2},
        {"pp4 1f1b", "gpt.dist", mesh_sets(1, 1, 4, "1f1b", 4), 4},
        {"dp2 tp2 pp2", "gpt.dist", mesh_sets(2, 2, 2, "1f1b", 2), 8},
        {"llama tp2 pp2", "llama.dist", mesh_sets(1, 2, 2, "1f1b", 2), 4},
        // ZeRO over Gloo: moments, gradients and (3) weights sharded over the dp group.
        {"dp2 pp2 zero 2", "gpt.dist", with_zero(2, mesh_sets(2, 1, 2, "1f1b", 2)), 4},
        {"dp2 tp2 zero 3", "gpt.dist", with_zero(3, mesh_sets(2, 2, 1, "1f1b", 2)), 4},
        {"tp2 sp pp2", "gpt.dist", with_sp(mesh_sets(1, 2, 2, "1f1b", 2)), 4},
        {"cp2 tp2", "llama.dist", with_cp(mesh_sets(1, 2, 1, "1f1b", 2)), 4},
        // Experts split over the dp ranks: Gloo's all-to-all between processes.
        {"moe dp4 ep2", "moe.dist", with_ep(2, mesh_sets(4, 1, 1, "1f1b", 1)), 4},
        // ZeRO 2 beside them: the experts' shares reduce-scattered among their holders.
        {"moe dp4 ep2 zero 2", "moe.dist", with_zero(2, with_ep(2, mesh_sets(4, 1, 1, "1f1b", 1))),
         4},
    };
    for (const Mesh& m : meshes) {
        std::string one = dir / "one.jsonl";
        fs::remove(one);
        Proc ref(run_args(dir / m.script, m.sets, one, 3), {}, dir / "one.out", dir / "one.err");
        ASSERT_EQ(ref.wait(120s), 0) << m.name << ": " << slurp(dir / "one.err");
        std::vector<Step> expected = steps_of(one);
        ASSERT_EQ(expected.size(), 3u) << m.name;
        for (int procs : {2, 4}) {
            if (procs > m.ranks) continue;
            std::string many = dir / "many.jsonl";
            fs::remove(many);
            auto args = run_args(dir / m.script, m.sets, many, 3);
            args.push_back("--procs");
            args.push_back(std::to_string(procs));
            Proc job(args, {}, dir / "many.out", dir / "many.err");
            std::string what = m.name + " over " + std::to_string(procs) + " processes";
            ASSERT_EQ(job.wait(120s), 0) << what << ": " << slurp(dir / "many.err");
            EXPECT_NE(slurp(dir / "many.out").find("in " + std::to_string(procs) + " processes"),
                      std::string::npos)
                << slurp(dir / "many.out");
            expect_same_steps(expected, steps_of(many), what);
        }
    }
}

// Over TCP (as between hosts), an activation above UCX's rendezvous threshold moves only while
// both sides progress, including the sender after it has gone on to the optimizer step's
// collectives. A 1 KB threshold puts every activation of the test model on that path; the
// losses must be one process's.
TEST(Cluster, RendezvousTransfersOverTcpBetweenProcesses) {
    Dir dir("tcp");
    for (const auto& sets : {mesh_sets(1, 1, 2, "1f1b", 2), mesh_sets(2, 1, 2, "1f1b", 2)}) {
        fs::remove(dir / "one.jsonl");
        fs::remove(dir / "two.jsonl");
        Proc ref(run_args(dir / "gpt.dist", sets, dir / "one.jsonl", 3), {}, dir / "one.out",
                 dir / "one.err");
        ASSERT_EQ(ref.wait(120s), 0) << slurp(dir / "one.err");
        auto args = run_args(dir / "gpt.dist", sets, dir / "two.jsonl", 3);
        args.push_back("--procs");
        args.push_back("2");
        Proc job(args, {{"UCX_TLS", "tcp,self"}, {"UCX_RNDV_THRESH", "1024"}}, dir / "two.out",
                 dir / "two.err");
        ASSERT_EQ(job.wait(120s), 0) << slurp(dir / "two.err");
        expect_same_steps(steps_of(dir / "one.jsonl"), steps_of(dir / "two.jsonl"),
                          "over TCP with rendezvous");
    }
}

// Two steps of the test job on `sets` in two processes, its metrics in m.jsonl and the last
// step's trace in trace.json.
void run_traced_in_two_processes(const Dir& dir, const std::vector<std::string>& sets) {
    auto args = run_args(dir / "gpt.dist", sets, dir / "m.jsonl", 2);
    args.insert(args.end(), {"--procs", "2", "--trace", dir / "trace.json"});
    Proc job(args, {}, dir / "out", dir / "err");
    ASSERT_EQ(job.wait(120s), 0) << slurp(dir / "err");
}

TEST(Cluster, ActivationsBetweenProcessesAreCountedInTheMetrics) {
    Dir dir("traffic");
    run_traced_in_two_processes(dir, mesh_sets(1, 1, 2, "1f1b", 2));
    if (HasFatalFailure()) return;
    std::string metrics = slurp(dir / "m.jsonl");
    // Stage 0 (rank 0, process 0) sends two microbatches of (4 rows x 8 tokens x 16 floats)
    // activations to rank 1 each step, and rank 1 sends as many gradients back.
    const std::string act =
        "\"sent_activations\":{\"bytes\":" + std::to_string(2 * 4 * 8 * 16 * 4) + ",\"messages\":2";
    EXPECT_NE(metrics.find(act), std::string::npos) << metrics;
    const std::string grad =
        "\"sent_gradients\":{\"bytes\":" + std::to_string(2 * 4 * 8 * 16 * 4) + ",\"messages\":2";
    EXPECT_NE(metrics.find(grad), std::string::npos) << metrics;
    // Per peer: rank 0 exchanges with rank 1 only, and the other way round.
    std::istringstream lines(metrics);
    std::string line;
    int checked = 0;
    while (std::getline(lines, line)) {
        auto j = nlohmann::json::parse(line);
        const auto& ranks = j["p2p"]["by_rank"];
        ASSERT_EQ(ranks.size(), 2u) << line;
        ASSERT_EQ(ranks[0]["peers"].size(), 1u) << line;
        EXPECT_EQ(ranks[0]["peers"][0]["peer"], 1) << line;
        EXPECT_EQ(ranks[0]["peers"][0]["sent_activations"]["bytes"], 2 * 4 * 8 * 16 * 4) << line;
        EXPECT_EQ(ranks[0]["peers"][0]["received_gradients"]["messages"], 2) << line;
        EXPECT_EQ(ranks[1]["peers"][0]["peer"], 0) << line;
        EXPECT_EQ(ranks[1]["peers"][0]["sent_gradients"]["bytes"], 2 * 4 * 8 * 16 * 4) << line;
        ++checked;
    }
    EXPECT_EQ(checked, 2);
    // The trace carries the last step's figures, one event per rank.
    std::string trace = slurp(dir / "trace.json");
    size_t events = 0;
    for (size_t at = 0;
         (at = trace.find("\"transfers between processes\"", at)) != std::string::npos; ++at)
        ++events;
    EXPECT_EQ(events, 2u) << trace;
    EXPECT_NE(trace.find(act), std::string::npos) << trace;
}

// The collectives a rank's communication thread ran in another process come back to the trace:
// dp 2 in two processes, each rank's REDUCE_GRAD on its communication track, measured as
// predicted.
TEST(Cluster, CollectivesOfOtherProcessesAreInTheTrace) {
    Dir dir("collectives");
    run_traced_in_two_processes(dir, mesh_sets(2, 1, 1, "1f1b", 2));
    if (HasFatalFailure()) return;
    auto j = nlohmann::json::parse(slurp(dir / "trace.json"));
    std::map<std::pair<int, int>, std::set<std::string>> names; // (pid, rank) -> actions
    for (const auto& e : j["traceEvents"])
        if (e["ph"] == "X" && e["tid"].get<int>() >= 2) // the ranks' communication tracks
            names[{e["pid"].get<int>(), e["tid"].get<int>() - 2}].insert(
                e["name"].get<std::string>());
    for (int rank = 0; rank < 2; ++rank) {
        const auto& measured = names[{0, rank}];
        ASSERT_FALSE(measured.empty()) << "rank " << rank;
        for (const std::string& n : measured)
            EXPECT_NE(n.find("REDUCE_GRAD"), std::string::npos) << n;
        EXPECT_EQ(measured, (names[{1, rank}])) << "rank " << rank;
    }
}

// In bf16 the same activations and gradients cross between the processes in 2 bytes an element
// (they hold bf16 values already), half of f32's 4, through UCX's wire.
TEST(Cluster, Bf16ActivationsCrossBetweenProcessesInHalfTheBytes) {
    Dir dir("traffic16");
    std::vector<std::string> sets = mesh_sets(1, 1, 2, "1f1b", 2);
    sets.push_back("train.precision=bf16");
    auto args = run_args(dir / "gpt.dist", sets, dir / "m.jsonl", 2);
    args.insert(args.end(), {"--procs", "2"});
    Proc job(args, {}, dir / "out", dir / "err");
    ASSERT_EQ(job.wait(120s), 0) << slurp(dir / "err");
    std::string metrics = slurp(dir / "m.jsonl");
    for (const char* what : {"sent_activations", "sent_gradients"}) {
        const std::string bytes = "\"" + std::string(what) +
                                  "\":{\"bytes\":" + std::to_string(2 * 4 * 8 * 16 * 2) +
                                  ",\"messages\":2";
        EXPECT_NE(metrics.find(bytes), std::string::npos) << metrics;
    }
}

// Ctrl-C on the launcher ends every process.
TEST(Cluster, InterruptingTheLauncherLeavesNoProcess) {
    Dir dir("interrupt");
    auto args = run_args(dir / "gpt.dist", mesh_sets(2, 1, 2, "1f1b", 2), dir / "m.jsonl", 400);
    args.insert(args.end(), {"--procs", "2", "--set", "train.steps=100000"});
    Proc job(args, {}, dir / "out", dir / "err");
    wait_until(
        job, [&] { return steps_of(dir / "m.jsonl").size() >= 2; }, 60s);
    ASSERT_GE(steps_of(dir / "m.jsonl").size(), 2u) << slurp(dir / "err");
    std::vector<pid_t> procs = children_of(job.pid);
    ASSERT_EQ(procs.size(), 2u);
    ASSERT_EQ(::kill(job.pid, SIGINT), 0);
    std::optional<int> status = job.wait(30s);
    ASSERT_TRUE(status.has_value()) << "the launcher did not end";
    EXPECT_EQ(*status, 128 + SIGINT);
    EXPECT_NE(slurp(dir / "err").find("ending the job"), std::string::npos) << slurp(dir / "err");
    for (pid_t p : procs) EXPECT_FALSE(alive(p)) << "process " << p << " is left behind";
}

// The dp2 x pp2 test job in one process, then in two processes started by `launcher` (its
// arguments `args`, then dist's command line): the same losses, and the job says it ran in two
// processes.
void expect_launched_job_matches_one_process(const Dir& dir, const std::string& launcher,
                                             std::vector<std::string> args,
                                             const std::map<std::string, std::string>& env) {
    auto sets = mesh_sets(2, 1, 2, "1f1b", 2);
    Proc ref(run_args(dir / "gpt.dist", sets, dir / "one.jsonl", 3), {}, dir / "one.out",
             dir / "one.err");
    ASSERT_EQ(ref.wait(120s), 0) << slurp(dir / "one.err");
    args.push_back(DIST_BINARY);
    for (const auto& a : run_args(dir / "gpt.dist", sets, dir / "job.jsonl", 3)) args.push_back(a);
    Proc job(args, env, dir / "job.out", dir / "job.err", launcher);
    ASSERT_EQ(job.wait(180s), 0) << slurp(dir / "job.err") << slurp(dir / "job.out");
    EXPECT_NE(slurp(dir / "job.out").find("in 2 processes"), std::string::npos)
        << slurp(dir / "job.out");
    expect_same_steps(steps_of(dir / "one.jsonl"), steps_of(dir / "job.jsonl"),
                      "under " + launcher);
}

TEST(Cluster, ProcessesStartedByMpirunJoin) {
    if (std::system("command -v mpirun > /dev/null 2>&1") != 0)
        GTEST_SKIP() << "mpirun is not installed (Debian: openmpi-bin)";
    if (std::system("mpirun --allow-run-as-root --oversubscribe -np 2 true > /dev/null 2>&1") != 0)
        GTEST_SKIP() << "mpirun cannot start two processes here";
    Dir dir("mpirun");
    expect_launched_job_matches_one_process(
        dir, "mpirun",
        {"--allow-run-as-root", "--oversubscribe", "-np", "2", "-x",
         "DIST_COORDINATOR=127.0.0.1:" + std::to_string(free_port()), "-x",
         "DIST_JOB_TOKEN=mpirun-test-token", "--mca", "btl", "self,tcp"},
        {});
}

// Under Slurm, as docs/cluster.md's sbatch script runs it: srun's tasks find the coordinator on
// the first node of the step (port 29400) by themselves and present the job token, since that
// is not loopback. Runs where a Slurm controller answers (scripts/local-slurm.sh starts one on
// this machine); skipped elsewhere.
TEST(Cluster, ProcessesStartedBySrunJoin) {
    if (std::system("command -v srun > /dev/null 2>&1") != 0)
        GTEST_SKIP() << "srun is not installed (Debian: slurm-client)";
    if (std::system("timeout 5 sinfo -h -o %a 2>/dev/null | grep -q up") != 0)
        GTEST_SKIP() << "no Slurm partition is up here (scripts/local-slurm.sh starts one)";
    Dir dir("srun");
    expect_launched_job_matches_one_process(
        dir, "srun", {"-n", "2", "--time=5", "--kill-on-bad-exit=1"},
        {{"DIST_JOB_TOKEN", "srun-test-token"}, {"UCX_TLS", "tcp,self"}});
}

// Kill -9 one process of a running 4-process job: the job ends within 15 s naming it, no
// process is left, and --resume continues from the last checkpoint with the losses of an
// uninterrupted run.
TEST(Cluster, KilledProcessEndsTheJobAndTheRunResumes) {
    Dir dir("kill");
    auto sets = mesh_sets(2, 2, 2, "1f1b", 2);
    sets.push_back("train.checkpoint.every=3");
    sets.push_back("train.checkpoint.dir=\"" + (dir / "ck") + "\"");
    auto args = run_args(dir / "gpt.dist", sets, dir / "a.jsonl", 400);
    args.insert(args.end(), {"--procs", "4"});
    Proc job(args, {}, dir / "a.out", dir / "a.err");
    // Wait for a checkpoint, then a few more steps.
    wait_until(
        job, [&] { return checkpoint_step(dir.path / "ck") >= 3; }, 120s);
    ASSERT_GE(checkpoint_step(dir.path / "ck"), 3) << slurp(dir / "a.err");
    std::this_thread::sleep_for(300ms);
    std::vector<pid_t> procs = children_of(job.pid);
    ASSERT_EQ(procs.size(), 4u);
    const pid_t victim = procs[2];
    ASSERT_EQ(::kill(victim, SIGKILL), 0);
    auto [status, took] = time_to_end(job);
    ASSERT_TRUE(status.has_value()) << "the job did not end";
    EXPECT_NE(*status, 0);
    EXPECT_LT(took, 15.0);
    std::string err = slurp(dir / "a.err");
    EXPECT_NE(err.find("pid " + std::to_string(victim)), std::string::npos) << err;
    EXPECT_NE(err.find("was killed by signal 9"), std::string::npos) << err;
    EXPECT_NE(err.find("ranks "), std::string::npos) << err; // the lost process's ranks
    for (pid_t p : procs) EXPECT_FALSE(alive(p)) << "process " << p << " is left behind";

    // Resume from the checkpoint for three steps, on 4 processes again, and compare with an
    // uninterrupted single-process run of as many steps.
    const int64_t at = checkpoint_step(dir.path / "ck");
    ASSERT_GE(at, 3);
    std::vector<std::string> plain;
    for (const auto& s : sets)
        if (s.rfind("train.checkpoint", 0) != 0) plain.push_back(s);
    Proc ref(run_args(dir / "gpt.dist", plain, dir / "ref.jsonl", static_cast<int>(at) + 3), {},
             dir / "ref.out", dir / "ref.err");
    ASSERT_EQ(ref.wait(120s), 0) << slurp(dir / "ref.err");
    auto resume = run_args(dir / "gpt.dist", plain, dir / "b.jsonl", static_cast<int>(at) + 3);
    resume.insert(resume.end(), {"--procs", "4", "--resume", dir / "ck"});
    Proc again(resume, {}, dir / "b.out", dir / "b.err");
    ASSERT_EQ(again.wait(120s), 0) << slurp(dir / "b.err");
    std::vector<Step> ref_steps = steps_of(dir / "ref.jsonl");
    ASSERT_EQ(ref_steps.size(), static_cast<size_t>(at + 3));
    std::vector<Step> tail(ref_steps.end() - 3, ref_steps.end());
    std::vector<Step> resumed = steps_of(dir / "b.jsonl");
    // b.jsonl: the resumed steps only (a fresh file).
    expect_same_steps(tail, resumed, "resumed after the kill");
}

namespace {

void send_random_bytes(int port) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    for (int i = 0; i < 100 && ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0; ++i)
        std::this_thread::sleep_for(100ms);
    std::string junk(4096, '\0');
    uint32_t x = 12345;
    for (char& c : junk) c = static_cast<char>((x = x * 1664525 + 1013904223) >> 24);
    (void)::write(fd, junk.data(), junk.size());
    std::this_thread::sleep_for(200ms);
    ::close(fd);
}

} // namespace

TEST(Cluster, PeersWithoutTheTokenOrOfAnotherPlanAreRefusedAndTheJobCarriesOn) {
    Dir dir("refuse");
    const int port = free_port();
    auto sets = mesh_sets(1, 1, 2, "1f1b", 2);
    Proc lead(run_args(dir / "gpt.dist", sets, dir / "m.jsonl", 3), member_env(0, port, "s3cret"),
              dir / "0.out", dir / "0.err");
    send_random_bytes(port);
    {
        Proc intruder(run_args(dir / "gpt.dist", sets, dir / "x.jsonl", 3),
                      member_env(1, port, "guess"), dir / "x.out", dir / "x.err");
        EXPECT_EQ(intruder.wait(60s), 1) << slurp(dir / "x.err");
        EXPECT_NE(slurp(dir / "x.err").find("the coordinator did not prove this job's token"),
                  std::string::npos)
            << slurp(dir / "x.err");
    }
    {
        auto other = sets;
        other.push_back("train.optimizer.lr=0.5");
        Proc stranger(run_args(dir / "gpt.dist", other, dir / "y.jsonl", 3),
                      member_env(1, port, "s3cret"), dir / "y.out", dir / "y.err");
        EXPECT_EQ(stranger.wait(60s), 1) << slurp(dir / "y.err");
        EXPECT_NE(slurp(dir / "y.err").find("runs a different plan"), std::string::npos)
            << slurp(dir / "y.err");
    }
    send_random_bytes(port);
    Proc member(run_args(dir / "gpt.dist", sets, dir / "n.jsonl", 3), member_env(1, port, "s3cret"),
                dir / "1.out", dir / "1.err");
    EXPECT_EQ(member.wait(120s), 0) << slurp(dir / "1.err");
    EXPECT_EQ(lead.wait(120s), 0) << slurp(dir / "0.err");
    EXPECT_EQ(steps_of(dir / "m.jsonl").size(), 3u);
    std::string log = slurp(dir / "0.err");
    EXPECT_NE(log.find("refused a peer"), std::string::npos) << log;
}

// A peer that speaks CAF but not this protocol's version, sends messages of no known shape, or
// asks for the job's store without having joined: refused, and the job carries on.
TEST(Cluster, ForeignPeersSpeakingCafAreRefusedAndTheJobCarriesOn) {
    using dist::runtime::challenge_atom;
    using dist::runtime::get_atom;
    using dist::runtime::hello_atom;
    Dir dir("foreign");
    const int port = free_port();
    auto sets = mesh_sets(1, 1, 2, "1f1b", 2);
    Proc lead(run_args(dir / "gpt.dist", sets, dir / "m.jsonl", 3), member_env(0, port, "s3cret"),
              dir / "0.out", dir / "0.err");
    caf::actor_system_config cfg;
    cfg.load<caf::io::middleman>();
    caf::actor_system sys{cfg};
    caf::expected<caf::actor> coordinator = caf::sec::runtime_error;
    for (int i = 0; i < 300 && !coordinator; ++i) {
        coordinator = sys.middleman().remote_actor("127.0.0.1", static_cast<uint16_t>(port));
        if (!coordinator) std::this_thread::sleep_for(100ms);
    }
    ASSERT_TRUE(coordinator) << sys.render(coordinator.error());
    caf::scoped_actor self{sys};
    auto hello = [&](int32_t version, const std::string& proof, const std::string& nonce) {
        std::string answer;
        self->request(*coordinator, 10s, hello_atom::value, version, proof, nonce,
                      std::string("digest"), int32_t{1}, static_cast<int32_t>(::getpid()),
                      std::string("test"), caf::actor{})
            .receive([&](std::string& r, std::string&) { answer = r; },
                     [&](caf::error& e) { answer = "error: " + sys.render(e); });
        return answer;
    };
    std::string answer = hello(999, "proof", "nonce");
    EXPECT_NE(answer.find("it speaks protocol version 999"), std::string::npos) << answer;
    // A hello that answers no challenge (forged, or one seen on the wire and replayed).
    answer = hello(dist::runtime::protocol_version, std::string(64, '0'), std::string(32, 'a'));
    EXPECT_NE(answer.find("answers no challenge"), std::string::npos) << answer;
    // A fresh challenge, answered without the token: refused; the nonce is then used up.
    std::string nonce;
    self->request(*coordinator, 10s, challenge_atom::value, std::string(32, 'b'))
        .receive([&](std::string& n, std::string&) { nonce = n; }, [&](caf::error&) {});
    ASSERT_EQ(nonce.size(), 32u);
    answer = hello(dist::runtime::protocol_version, std::string(64, '0'), nonce);
    EXPECT_NE(answer.find("did not prove this job's token"), std::string::npos) << answer;
    answer = hello(dist::runtime::protocol_version, std::string(64, '0'), nonce);
    EXPECT_NE(answer.find("answers no challenge"), std::string::npos) << answer;
    bool refused = false;
    self->request(*coordinator, 10s, std::string("what is this"), 42.0)
        .receive([&](caf::message&) {}, [&](caf::error&) { refused = true; });
    EXPECT_TRUE(refused) << "a message of no known shape was answered";
    refused = false;
    self->request(*coordinator, 10s, get_atom::value, std::string("job/ucx/0"))
        .receive([&](std::string&) {}, [&](caf::error&) { refused = true; });
    EXPECT_TRUE(refused) << "the store answered a peer that did not join";
    // The coordinator's own commands, sent anonymously or from this foreign node: ignored (the
    // job below still runs its three steps and ends well).
    for (const char* name : {"start", "stop", "tick", "abandon", "give_up"}) {
        caf::anon_send(*coordinator, caf::atom_from_string(name));
        self->send(*coordinator, caf::atom_from_string(name));
    }

    Proc member(run_args(dir / "gpt.dist", sets, dir / "n.jsonl", 3), member_env(1, port, "s3cret"),
                dir / "1.out", dir / "1.err");
    EXPECT_EQ(member.wait(120s), 0) << slurp(dir / "1.err");
    EXPECT_EQ(lead.wait(120s), 0) << slurp(dir / "0.err");
    EXPECT_EQ(steps_of(dir / "m.jsonl").size(), 3u);
}

// Two hosts on one machine: network namespaces joined by a veth pair, one process in each, UCX
// and Gloo over TCP between them, the coordinator on a non-loopback address (so the token is
// required).
TEST(Cluster, TwoNetworkNamespacesActAsTwoHosts) {
    const std::string a = "distA" + std::to_string(::getpid() % 100000),
                      b = "distB" + std::to_string(::getpid() % 100000);
    const std::string va = "dva" + std::to_string(::getpid() % 100000),
                      vb = "dvb" + std::to_string(::getpid() % 100000);
    std::string setup = "ip netns add " + a + " && ip netns add " + b + " && ip link add " + va +
                        " type veth peer name " + vb + " && ip link set " + va + " netns " + a +
                        " && ip link set " + vb + " netns " + b + " && ip -n " + a +
                        " addr add 10.231.7.1/24 dev " + va + " && ip -n " + b +
                        " addr add 10.231.7.2/24 dev " + vb + " && ip -n " + a + " link set " + va +
                        " up && ip -n " + b + " link set " + vb + " up && ip -n " + a +
                        " link set lo up && ip -n " + b + " link set lo up";
    std::string teardown = "ip netns del " + a + " 2>/dev/null; ip netns del " + b + " 2>/dev/null";
    if (std::system((setup + " > /dev/null 2>&1").c_str()) != 0) {
        std::system(teardown.c_str());
        GTEST_SKIP() << "network namespaces cannot be created here (needs root and iproute2)";
    }
    Dir dir("netns");
    auto pp = mesh_sets(1, 1, 2, "1f1b", 2); // stage 0 on host A, stage 1 on host B: UCX
    Proc ref(run_args(dir / "gpt.dist", pp, dir / "one.jsonl", 3), {}, dir / "one.out",
             dir / "one.err");
    ASSERT_EQ(ref.wait(120s), 0) << slurp(dir / "one.err");
    auto host = [&](const std::string& ns, int rank, const std::string& dev,
                    const std::string& metrics) {
        std::vector<std::string> args = {
            "netns", "exec", ns, "env", "DIST_RANK=" + std::to_string(rank), "DIST_WORLD_SIZE=2",
            "DIST_COORDINATOR=10.231.7.1:29411", "DIST_JOB_TOKEN=two-hosts", "UCX_TLS=tcp,self",
            "UCX_NET_DEVICES=" + dev,
            // The test model's activations are small enough to go
            // eagerly; a real model's go by rendezvous, which
            // needs both sides to progress. Put them on that path.
            "UCX_RNDV_THRESH=1024", DIST_BINARY};
        for (const auto& x : run_args(dir / "gpt.dist", pp, metrics, 3)) args.push_back(x);
        return args;
    };
    {
        Proc pa(host(a, 0, va, dir / "a.jsonl"), {}, dir / "a.out", dir / "a.err", "ip");
        Proc pb(host(b, 1, vb, dir / "b.jsonl"), {}, dir / "b.out", dir / "b.err", "ip");
        auto sb = pb.wait(120s);
        auto sa = pa.wait(120s);
        std::system(teardown.c_str());
        ASSERT_EQ(sa, 0) << slurp(dir / "a.err");
        ASSERT_EQ(sb, 0) << slurp(dir / "b.err");
    }
    EXPECT_NE(slurp(dir / "a.out").find("in 2 processes"), std::string::npos);
    std::string metrics = slurp(dir / "a.jsonl");
    EXPECT_NE(metrics.find("\"messages\":2"), std::string::npos) << metrics; // over UCX
    expect_same_steps(steps_of(dir / "one.jsonl"), steps_of(dir / "a.jsonl"), "two namespaces");
}

// A process that stops answering (here: stopped with SIGSTOP, its connections open) is lost
// once its heartbeats stay away for DIST_HEARTBEAT_TIMEOUT.
TEST(Cluster, AProcessThatStopsAnsweringIsLostAfterTheHeartbeatTimeout) {
    Dir dir("silent");
    auto args = run_args(dir / "gpt.dist", mesh_sets(1, 1, 2, "1f1b", 2), dir / "m.jsonl", 400);
    args.insert(args.end(), {"--procs", "2", "--set", "train.steps=100000"});
    Proc job(args, {{"DIST_HEARTBEAT_TIMEOUT", "2"}}, dir / "out", dir / "err");
    wait_until(
        job, [&] { return steps_of(dir / "m.jsonl").size() >= 3; }, 60s);
    ASSERT_GE(steps_of(dir / "m.jsonl").size(), 3u) << slurp(dir / "err");
    std::vector<pid_t> procs = children_of(job.pid);
    ASSERT_EQ(procs.size(), 2u);
    ASSERT_EQ(::kill(procs[1], SIGSTOP), 0);
    auto [status, took] = time_to_end(job);
    ASSERT_TRUE(status.has_value()) << "the job did not end";
    EXPECT_NE(*status, 0);
    EXPECT_LT(took, 15.0);
    std::string err = slurp(dir / "err");
    EXPECT_NE(err.find("process 1 (rank 1, host"), std::string::npos) << err;
    EXPECT_NE(err.find("stopped answering: no heartbeat for"), std::string::npos) << err;
    for (pid_t p : procs) EXPECT_FALSE(alive(p)) << "process " << p << " is left behind";
}
