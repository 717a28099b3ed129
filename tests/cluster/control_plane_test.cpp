// control_plane_test.cpp: the control plane under fire and under TLS. A bounded fuzz of the
// coordinator's port while process 0 waits for its peer: random bytes, the coordinator's own
// protocol frames cut short or with bytes flipped, and a CAF peer sending every message of the
// protocol with wrong arguments, wrong versions, forged and replayed hellos; then the real
// member joins and the job trains to the end. And a job whose control plane runs over mutual
// TLS (DIST_TLS_CERT / KEY / CA): the port speaks TLS with a certificate of the job's CA and
// asks for the client's, and the losses are one process's.
#include "actors/runtime/protocol.hpp"

#include "tests/cluster/cluster_helpers.hpp"

#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include <poll.h>
#include <random>

using namespace dist::tests::cluster;

namespace {

// A TCP connection to the coordinator's port on loopback (-1 when none after 10 s).
int connect_to(int port) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    for (int i = 0; i < 100; ++i) {
        int fd = ::socket(AF_INET, SOCK_STREAM, 0);
        if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) return fd;
        ::close(fd);
        std::this_thread::sleep_for(100ms);
    }
    return -1;
}

// What the server sends first on a new connection (CAF's handshake frame), read for up to 2 s.
std::string server_hello(int fd) {
    std::string got;
    char buf[4096];
    pollfd p{fd, POLLIN, 0};
    while (::poll(&p, 1, got.empty() ? 2000 : 200) > 0) {
        ssize_t n = ::read(fd, buf, sizeof buf);
        if (n <= 0) break;
        got.append(buf, static_cast<size_t>(n));
    }
    return got;
}

} // namespace

TEST(Cluster, TheControlPortSurvivesABoundedFuzzAndTheJobFinishes) {
    Dir dir("fuzz");
    const int port = free_port();
    auto sets = mesh_sets(1, 1, 2, "1f1b", 2);
    Proc lead(run_args(dir / "gpt.dist", sets, dir / "m.jsonl", 3), member_env(0, port, "s3cret"),
              dir / "0.out", dir / "0.err");
    std::mt19937 rng(20261201);
    auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };

    // Raw bytes: random ones, and the coordinator's own first frame echoed back cut short or
    // with a few bytes flipped (frames of the right shape with wrong contents).
    int fd = connect_to(port);
    ASSERT_GE(fd, 0);
    const std::string frame = server_hello(fd);
    ::close(fd);
    ASSERT_FALSE(frame.empty()) << "the coordinator sent no handshake";
    for (int round = 0; round < 60; ++round) {
        fd = connect_to(port);
        ASSERT_GE(fd, 0);
        std::string bytes;
        switch (round % 3) {
        case 0: // random bytes of a random length
            bytes.resize(1 + pick(8192));
            for (char& c : bytes) c = static_cast<char>(rng());
            break;
        case 1: // the frame cut short
            bytes = frame.substr(0, pick(frame.size()));
            break;
        default: // the frame with bytes flipped
            bytes = frame;
            for (int k = 0; k < 4; ++k)
                bytes[pick(bytes.size())] ^= static_cast<char>(1 + pick(255));
        }
        (void)::write(fd, bytes.data(), bytes.size());
        if (round % 10 == 0) std::this_thread::sleep_for(50ms);
        ::close(fd);
    }

    // A CAF peer: every message of the protocol with arguments of the wrong kind or value.
    using namespace dist::runtime;
    caf::actor_system_config cfg;
    cfg.load<caf::io::middleman>();
    caf::actor_system sys{cfg};
    caf::expected<caf::actor> coordinator = caf::sec::runtime_error;
    for (int i = 0; i < 100 && !coordinator; ++i) {
        coordinator = sys.middleman().remote_actor("127.0.0.1", static_cast<uint16_t>(port));
        if (!coordinator) std::this_thread::sleep_for(100ms);
    }
    ASSERT_TRUE(coordinator) << sys.render(coordinator.error());
    caf::scoped_actor self{sys};
    auto text = [&] {
        std::string s(pick(80), '\0');
        for (char& c : s) c = static_cast<char>(rng());
        return s;
    };
    auto any = [&] {
        switch (pick(6)) {
        case 0: return caf::make_message(static_cast<int32_t>(rng()));
        case 1: return caf::make_message(text());
        case 2: return caf::make_message(static_cast<int64_t>(rng()), text());
        case 3: return caf::make_message(true, text());
        case 4:
            return caf::make_message(static_cast<int32_t>(rng()), static_cast<uint64_t>(rng()),
                                     text());
        default: return caf::make_message(3.5, caf::actor{});
        }
    };
    const std::vector<caf::atom_value> atoms = {
        start_atom::value,  tick_atom::value,    challenge_atom::value, hello_atom::value,
        worker_atom::value, ready_atom::value,   beat_atom::value,      set_atom::value,
        get_atom::value,    abandon_atom::value, give_up_atom::value,   stop_atom::value,
        next_atom::value,   alive_atom::value,   done_atom::value,      gather_atom::value};
    for (int round = 0; round < 200; ++round) {
        caf::message m = caf::make_message(atoms[pick(atoms.size())]) + any();
        if (round % 2)
            self->send(*coordinator, m);
        else
            caf::anon_send(*coordinator, m);
    }
    // Hellos: a wrong version, a forged proof, and a proof replayed under a used challenge.
    auto hello = [&](int32_t version, const std::string& proof, const std::string& nonce) {
        std::string answer = "no answer";
        self->request(*coordinator, 10s, hello_atom::value, version, proof, nonce,
                      std::string("digest"), int32_t{1}, int32_t{1}, std::string("fuzz"),
                      caf::actor{})
            .receive([&](std::string& r, std::string&) { answer = r; },
                     [&](caf::error& e) { answer = sys.render(e); });
        return answer;
    };
    for (int round = 0; round < 20; ++round) {
        std::string nonce;
        self->request(*coordinator, 10s, challenge_atom::value, std::string(32, 'c'))
            .receive([&](std::string& n, std::string&) { nonce = n; }, [&](caf::error&) {});
        ASSERT_EQ(nonce.size(), 32u) << "round " << round;
        int32_t version = round % 4 == 0 ? static_cast<int32_t>(rng()) : protocol_version;
        std::string first = hello(version, text(), nonce);
        EXPECT_EQ(first.find("refused by the coordinator"), 0u) << first;
        std::string replayed = hello(protocol_version, text(), nonce);
        EXPECT_NE(replayed.find("answers no challenge"), std::string::npos) << replayed;
    }

    // The real member: the job forms and trains its three steps.
    Proc member(run_args(dir / "gpt.dist", sets, dir / "n.jsonl", 3), member_env(1, port, "s3cret"),
                dir / "1.out", dir / "1.err");
    EXPECT_EQ(member.wait(120s), 0) << slurp(dir / "1.err");
    EXPECT_EQ(lead.wait(120s), 0) << slurp(dir / "0.err");
    EXPECT_EQ(steps_of(dir / "m.jsonl").size(), 3u);
}

// A CA, and one certificate it signs for every node (CAF checks the chain, not the name).
bool make_certificates(const Dir& dir) {
    const std::string d = dir.path.string();
    const std::string cmd =
        "cd '" + d +
        "' && openssl ecparam -name prime256v1 -genkey -noout -out ca.key && "
        "openssl req -x509 -new -key ca.key -sha256 -days 2 -subj /CN=dist-test-ca -out ca.pem && "
        "openssl ecparam -name prime256v1 -genkey -noout -out node.key && "
        "openssl req -new -key node.key -subj /CN=dist-node -out node.csr && "
        "openssl x509 -req -in node.csr -CA ca.pem -CAkey ca.key -CAcreateserial -sha256 -days 2 "
        "-out node.pem > /dev/null 2>&1";
    return std::system(cmd.c_str()) == 0;
}

TEST(Cluster, AJobOverMutualTlsTrainsAsOneProcess) {
    if (std::system("command -v openssl > /dev/null 2>&1") != 0)
        GTEST_SKIP() << "the openssl command is not installed (Debian: openssl)";
    Dir dir("tls");
    ASSERT_TRUE(make_certificates(dir));
    auto sets = mesh_sets(2, 1, 2, "1f1b", 2);
    Proc ref(run_args(dir / "gpt.dist", sets, dir / "one.jsonl", 3), {}, dir / "one.out",
             dir / "one.err");
    ASSERT_EQ(ref.wait(120s), 0) << slurp(dir / "one.err");
    const int port = free_port();
    auto env = [&](int rank) {
        auto e = member_env(rank, port, "tls-token");
        e["DIST_TLS_CERT"] = dir / "node.pem";
        e["DIST_TLS_KEY"] = dir / "node.key";
        e["DIST_TLS_CA"] = dir / "ca.pem";
        return e;
    };
    Proc lead(run_args(dir / "gpt.dist", sets, dir / "tls.jsonl", 3), env(0), dir / "0.out",
              dir / "0.err");
    // The port speaks TLS with the node's certificate, which the job's CA verifies, and asks the
    // client for a certificate (the request's signature algorithms; CAF names no CAs in it).
    int fd = connect_to(port);
    ASSERT_GE(fd, 0);
    ::close(fd);
    const std::string probe =
        "timeout 10 openssl s_client -connect 127.0.0.1:" + std::to_string(port) + " -CAfile '" +
        (dir / "ca.pem") + "' < /dev/null > '" + (dir / "probe.txt") + "' 2>&1";
    (void)std::system(probe.c_str());
    std::string seen = slurp(dir / "probe.txt");
    EXPECT_NE(seen.find("subject=CN = dist-node"), std::string::npos) << seen;
    EXPECT_NE(seen.find("Verify return code: 0 (ok)"), std::string::npos) << seen;
    EXPECT_NE(seen.find("Requested Signature Algorithms"), std::string::npos) << seen;
    Proc member(run_args(dir / "gpt.dist", sets, dir / "m.jsonl", 3), env(1), dir / "1.out",
                dir / "1.err");
    EXPECT_EQ(member.wait(120s), 0) << slurp(dir / "1.err");
    ASSERT_EQ(lead.wait(120s), 0) << slurp(dir / "0.err");
    expect_same_steps(steps_of(dir / "one.jsonl"), steps_of(dir / "tls.jsonl"), "over TLS");
}

// Half a TLS configuration, or files that are not certificates and keys, are refused before
// anything starts, naming what is wrong.
TEST(Cluster, PartOfATlsConfigurationIsAnErrorThatNamesTheRest) {
    Dir dir("tls_half");
    auto e = member_env(1, 1, "t");
    e["DIST_TLS_CERT"] = dir / "gpt.dist";
    Proc p(run_args(dir / "gpt.dist", mesh_sets(1, 1, 2, "1f1b", 2), dir / "m.jsonl", 2), e,
           dir / "out", dir / "err");
    EXPECT_EQ(p.wait(60s), 2) << slurp(dir / "err");
    EXPECT_NE(slurp(dir / "err").find("DIST_TLS_KEY is not set"), std::string::npos)
        << slurp(dir / "err");
    // Files that are not what they say: refused the same way, naming the file.
    e["DIST_TLS_KEY"] = dir / "gpt.dist";
    e["DIST_TLS_CA"] = dir / "gpt.dist";
    Proc junk(run_args(dir / "gpt.dist", mesh_sets(1, 1, 2, "1f1b", 2), dir / "m.jsonl", 2), e,
              dir / "out2", dir / "err2");
    EXPECT_EQ(junk.wait(60s), 2) << slurp(dir / "err2");
    EXPECT_NE(
        slurp(dir / "err2")
            .find("DIST_TLS_CERT: `" + (dir / "gpt.dist") + "` is not a PEM certificate chain"),
        std::string::npos)
        << slurp(dir / "err2");
}
