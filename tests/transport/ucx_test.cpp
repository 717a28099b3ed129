// ucx_test.cpp: the UCX point-to-point backend, between two endpoints of one process (over
// shared memory and over TCP on loopback) and between two processes.
//
// Each test runs its ranks on threads under a watchdog: a rank still running after the limit
// aborts both endpoints, so a hang fails the test instead of stopping the suite. The
// two-process test runs this same binary as the second process (fork, then exec with a filter
// that selects the child's role), so the child starts from a clean UCX state.
#include "transport/ucx.hpp"

#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <future>
#include <thread>

using namespace dist;
using namespace dist::transport;

namespace {

using std::chrono::milliseconds;

struct Transport {
    std::string name, tls, devices;
    int spin_us = 0;
};

// For gtest's messages: the name, not the bytes of the struct.
void PrintTo(const Transport& t, std::ostream* os) {
    *os << t.name;
}

UcxOptions options_for(const Transport& t, milliseconds timeout = std::chrono::seconds(20)) {
    UcxOptions o;
    o.timeout = timeout;
    o.transports = t.tls;
    o.net_devices = t.devices;
    o.spin = std::chrono::microseconds(t.spin_us);
    return o;
}

/// Runs one body per endpoint on its own thread; aborts both after `limit` and fails the test.
void run_ranks(const std::vector<UcxEndpoint*>& eps,
               const std::vector<std::function<void()>>& bodies,
               milliseconds limit = std::chrono::seconds(30)) {
    std::vector<std::future<void>> done;
    for (const auto& body : bodies) done.push_back(std::async(std::launch::async, body));
    auto deadline = std::chrono::steady_clock::now() + limit;
    for (auto& f : done) {
        if (f.wait_until(deadline) == std::future_status::timeout) {
            for (auto* ep : eps) ep->abort("watchdog: the test took too long");
            ADD_FAILURE() << "a rank did not return within " << limit.count() << " ms";
        }
    }
    for (auto& f : done) f.get();
}

// Element i of a test tensor: distinct per tensor (`seed`) and exact in f32 and i32.
kernels::Tensor make(std::vector<int64_t> shape, kernels::DType dtype, int seed) {
    kernels::Tensor t(std::move(shape), dtype);
    for (int64_t i = 0; i < t.numel(); ++i) {
        int32_t v = static_cast<int32_t>((i * 7 + seed * 131) % 100003) - 50000;
        if (dtype == kernels::DType::f32)
            t.data<float>()[i] = static_cast<float>(v) * 0.5f;
        else if (dtype == kernels::DType::i32)
            t.data<int32_t>()[i] = v;
        else
            t.data<uint16_t>()[i] = kernels::f32_to_bf16(static_cast<float>(v));
    }
    return t;
}

void expect_same(const kernels::Tensor& got, const kernels::Tensor& want, const std::string& what) {
    ASSERT_EQ(got.defined(), want.defined()) << what;
    ASSERT_EQ(got.shape(), want.shape()) << what;
    ASSERT_EQ(got.dtype(), want.dtype()) << what;
    if (want.bytes()) {
        EXPECT_EQ(std::memcmp(got.raw(), want.raw(), want.bytes()), 0) << what;
    }
}

P2PTag act(int64_t step, int stage, int mb) {
    return {step, stage, mb, Direction::activation};
}
P2PTag grad(int64_t step, int stage, int mb) {
    return {step, stage, mb, Direction::gradient};
}

// Tensors that cross every path: empty, scalar, inline (up to kUcxInlineBytes), just past it,
// and large (4 MB and more, rendezvous); f32, i32 and bf16; an undefined tensor.
std::vector<kernels::Tensor> assorted() {
    using kernels::DType;
    std::vector<kernels::Tensor> ts;
    int seed = 0;
    for (DType d : {DType::f32, DType::i32})
        for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{2048}, int64_t{2049},
                          int64_t{(1 << 20) + 3}})
            ts.push_back(make({n}, d, ++seed));
    ts.push_back(make({}, DType::f32, ++seed));
    ts.push_back(make({3, 0, 5}, DType::f32, ++seed));
    ts.push_back(make({64, 257}, DType::bf16, ++seed));
    ts.push_back(make({2, 3, 4, 5, 6, 7, 8, 9}, DType::i32, ++seed));
    ts.push_back(kernels::Tensor());
    return ts;
}

class UcxPair : public ::testing::TestWithParam<Transport> {
  protected:
    void make_pair(milliseconds timeout = std::chrono::seconds(20)) {
        a_ = make_ucx_endpoint(store_, "pair", 0, 2, options_for(GetParam(), timeout));
        b_ = make_ucx_endpoint(store_, "pair", 1, 2, options_for(GetParam(), timeout));
    }
    // Both close at once, as two processes do: a graceful close waits for the peer's answer.
    void TearDown() override {
        auto closing = std::async(std::launch::async, [&] { a_.reset(); });
        b_.reset();
        closing.get();
    }
    MemoryStore store_;
    std::unique_ptr<UcxEndpoint> a_, b_;
};

} // namespace

TEST_P(UcxPair, TensorsOfEverySizeAndDtypeArriveIntactBothWays) {
    make_pair();
    auto sent = assorted();
    std::vector<kernels::Tensor> got(sent.size()), back(sent.size());
    run_ranks({a_.get(), b_.get()}, {[&] {
                                         for (size_t i = 0; i < sent.size(); ++i)
                                             a_->send(1, act(1, 0, static_cast<int>(i)), sent[i]);
                                         for (size_t i = 0; i < sent.size(); ++i)
                                             back[i] = a_->recv(1, grad(1, 0, static_cast<int>(i)));
                                         a_->flush();
                                     },
                                     [&] {
                                         for (size_t i = 0; i < sent.size(); ++i) {
                                             got[i] = b_->recv(0, act(1, 0, static_cast<int>(i)));
                                             b_->send(0, grad(1, 0, static_cast<int>(i)), got[i]);
                                         }
                                         b_->flush();
                                     }});
    for (size_t i = 0; i < sent.size(); ++i) {
        expect_same(got[i], sent[i], "forward " + std::to_string(i));
        expect_same(back[i], sent[i], "backward " + std::to_string(i));
    }
    // Statistics by peer and kind: activations one way, gradients the other.
    uint64_t bytes = 0;
    for (const auto& t : sent) bytes += t.bytes();
    auto a = a_->stats(), b = b_->stats();
    EXPECT_EQ(a.sent[1][0].messages, sent.size());
    EXPECT_EQ(a.sent[1][0].bytes, bytes);
    EXPECT_EQ(a.received[1][1].messages, sent.size());
    EXPECT_EQ(b.received[0][0].bytes, bytes);
    EXPECT_EQ(b.sent[0][1].bytes, bytes);
    EXPECT_EQ(a.sent[1][1].messages + a.sent[0][0].messages + b.sent[1][0].messages, 0u);
    EXPECT_EQ(UcxStats::total(b.received).bytes, bytes);
    EXPECT_GT(UcxStats::total(a.received).seconds, 0.0);
}

TEST_P(UcxPair, ReceivesMatchTagsNotArrivalOrder) {
    make_pair();
    // Every field of the tag tells messages apart, small and large alike.
    std::vector<P2PTag> tags{act(0, 0, 0),  act(0, 0, 1), act(1, 0, 0),  act(0, 1, 0),
                             grad(0, 0, 0), act(0, 0, 2), grad(1, 1, 1), act(7, 3, 5)};
    std::vector<kernels::Tensor> sent;
    for (size_t i = 0; i < tags.size(); ++i)
        sent.push_back(make({i % 2 ? int64_t{1 << 19} : int64_t{5}}, kernels::DType::f32,
                            static_cast<int>(i)));
    std::vector<kernels::Tensor> got(tags.size());
    run_ranks({a_.get(), b_.get()}, {[&] {
                                         for (size_t i = 0; i < tags.size(); ++i)
                                             a_->send(1, tags[i], sent[i]);
                                         a_->flush();
                                     },
                                     [&] {
                                         // Reverse order: every message waits, unexpected.
                                         std::this_thread::sleep_for(milliseconds(50));
                                         for (size_t i = tags.size(); i-- > 0;)
                                             got[i] = b_->recv(0, tags[i]);
                                     }});
    for (size_t i = 0; i < tags.size(); ++i) expect_same(got[i], sent[i], tags[i].str());
}

TEST_P(UcxPair, PostedReceivesCompleteWhicheverArrivesFirst) {
    make_pair();
    std::vector<kernels::Tensor> sent;
    for (int i = 0; i < 4; ++i) sent.push_back(make({(i + 1) * 300000}, kernels::DType::f32, i));
    std::vector<kernels::Tensor> got(sent.size());
    run_ranks({a_.get(), b_.get()}, {[&] {
                                         for (int i = 3; i >= 0; --i)
                                             a_->send(1, act(2, 1, i), sent[i]);
                                         a_->flush();
                                     },
                                     [&] {
                                         for (int i = 0; i < 4; ++i) b_->post_recv(0, act(2, 1, i));
                                         EXPECT_THROW(b_->post_recv(0, act(2, 1, 0)),
                                                      TransportError);
                                         for (int i = 0; i < 4; ++i)
                                             got[i] = b_->recv(0, act(2, 1, i));
                                     }});
    for (size_t i = 0; i < sent.size(); ++i) expect_same(got[i], sent[i], std::to_string(i));
}

TEST_P(UcxPair, TheSenderMayDropItsTensorBeforeTheTransferCompletes) {
    make_pair();
    auto want = make({3 << 20}, kernels::DType::f32, 42).clone();
    kernels::Tensor got;
    run_ranks({a_.get(), b_.get()}, {[&] {
                                         {
                                             auto t = want.clone();
                                             a_->send(1, act(0, 0, 0), t);
                                         } // the endpoint keeps the storage alive
                                         // Allocations that would reuse a freed buffer.
                                         auto junk = kernels::Tensor::zeros({3 << 20});
                                         a_->flush();
                                     },
                                     [&] {
                                         std::this_thread::sleep_for(milliseconds(100));
                                         got = b_->recv(0, act(0, 0, 0));
                                     }});
    expect_same(got, want, "dropped tensor");
}

// A pipeline stage sends its activation and goes on to something that waits for the receiver
// (a Gloo collective at the optimizer step, say) without calling into the endpoint again. Over
// TCP a large message is a rendezvous that needs the sender to progress after the receiver
// answers; the endpoint's progress thread does that, so the receive completes, whether the
// sender said it was going away (as the runtime does before collectives) or not. (Before the
// progress thread, the receive timed out here over TCP.)
TEST_P(UcxPair, ASendCompletesWhileItsRankWaitsElsewhere) {
    make_pair(std::chrono::seconds(10));
    for (bool told : {true, false}) {
        auto want = make({4 << 20}, kernels::DType::f32, told ? 7 : 8);
        kernels::Tensor got;
        std::promise<void> received;
        auto heard = received.get_future();
        const P2PTag tag = act(told ? 0 : 1, 0, 0);
        auto sender = [&] {
            a_->send(1, tag, want);
            if (told) a_->away();
            // Blocked outside the endpoint until the peer has it.
            ASSERT_EQ(heard.wait_for(std::chrono::seconds(15)), std::future_status::ready)
                << "the receiver never got the tensor";
        };
        auto receiver = [&] {
            got = b_->recv(0, tag);
            received.set_value();
        };
        run_ranks({a_.get(), b_.get()}, {sender, receiver});
        expect_same(got, want, told ? "sent, then away" : "sent, then blocked without a word");
    }
}

TEST_P(UcxPair, AMissingSendTimesOutNamingTheTagAndThePeer) {
    make_pair(milliseconds(300));
    kernels::Tensor got;
    run_ranks({a_.get(), b_.get()},
              {[&] {
                   try {
                       a_->recv(1, grad(9, 2, 4));
                       ADD_FAILURE() << "no timeout";
                   } catch (const TransportError& e) {
                       std::string what = e.what();
                       EXPECT_NE(what.find(grad(9, 2, 4).str() + " from rank 1"), std::string::npos)
                           << what;
                       EXPECT_NE(what.find("300 ms"), std::string::npos) << what;
                   }
                   // The endpoint still works afterwards.
                   got = a_->recv(1, grad(9, 2, 5));
               },
               [&] {
                   b_->send(0, grad(9, 2, 5), make({10}, kernels::DType::f32, 1));
                   b_->flush();
               }});
    expect_same(got, make({10}, kernels::DType::f32, 1), "after the timeout");
}

TEST_P(UcxPair, AbortWakesAWaitingReceiveWithTheCause) {
    make_pair();
    auto waiting = std::async(std::launch::async, [&] {
        try {
            b_->recv(0, act(1, 0, 0));
        } catch (const TransportError& e) {
            return std::string(e.what());
        }
        return std::string("received");
    });
    std::this_thread::sleep_for(milliseconds(100));
    b_->abort("rank 0 failed in 0F0: boom");
    ASSERT_EQ(waiting.wait_for(std::chrono::seconds(5)), std::future_status::ready);
    std::string what = waiting.get();
    EXPECT_NE(what.find("rank 0 failed in 0F0: boom"), std::string::npos) << what;
    EXPECT_NE(what.find(act(1, 0, 0).str()), std::string::npos) << what;
    // Later calls fail at once.
    EXPECT_THROW(b_->recv(0, act(1, 0, 1)), TransportError);
    EXPECT_THROW(b_->send(0, act(1, 0, 1), kernels::Tensor({1})), TransportError);
}

TEST_P(UcxPair, UnknownPeersAndTagsThatDoNotFitAreRefused) {
    make_pair(milliseconds(300));
    EXPECT_THROW(a_->send(2, act(0, 0, 0), kernels::Tensor({1})), TransportError);
    EXPECT_THROW(a_->recv(-1, act(0, 0, 0)), TransportError);
    EXPECT_THROW(a_->send(1, act(0, 5000, 0), kernels::Tensor({1})), TransportError);
    EXPECT_THROW(a_->send(1, act(0, 0, 0), kernels::Tensor({1, 1, 1, 1, 1, 1, 1, 1, 1})),
                 TransportError);
    EXPECT_THROW(make_ucx_endpoint(store_, "pair", 2, 2), TransportError);
    // Transports UCX does not have: the error names them and UCX's cause.
    UcxOptions bogus = options_for(GetParam());
    bogus.transports = "no_such_transport";
    try {
        make_ucx_endpoint(store_, "other", 0, 2, bogus);
        ADD_FAILURE() << "UCX started without transports";
    } catch (const TransportError& e) {
        EXPECT_NE(std::string(e.what()).find("no_such_transport"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("ucp_"), std::string::npos) << e.what();
    }
    // A peer that never published its address.
    MemoryStore lonely;
    auto solo = make_ucx_endpoint(lonely, "solo", 0, 2, options_for(GetParam(), milliseconds(50)));
    EXPECT_THROW(solo->send(1, act(0, 0, 0), kernels::Tensor({1})), TransportError);
}

INSTANTIATE_TEST_SUITE_P(Transports, UcxPair,
                         ::testing::Values(Transport{"shm", "sm,self", ""},
                                           Transport{"tcp", "tcp,self", "lo"},
                                           Transport{"shm_spin", "sm,self", "", 50}),
                         [](const auto& info) { return info.param.name; });

// ----- two processes -------------------------------------------------------------------------

namespace {

constexpr const char* kChildDirEnv = "DIST_UCX_TEST_CHILD_DIR";
constexpr const char* kChildRoleEnv = "DIST_UCX_TEST_CHILD_ROLE";

// The exchange both processes run: rank 0 sends activations, rank 1 returns each as its
// gradient.
void pipeline_rank(UcxEndpoint& ep) {
    auto ts = assorted();
    if (ep.rank() == 0) {
        for (size_t i = 0; i < ts.size(); ++i) ep.send(1, act(3, 0, static_cast<int>(i)), ts[i]);
        for (size_t i = 0; i < ts.size(); ++i) {
            auto g = ep.recv(1, grad(3, 0, static_cast<int>(i)));
            expect_same(g, ts[i], "gradient " + std::to_string(i));
        }
    } else {
        for (size_t i = 0; i < ts.size(); ++i) {
            auto x = ep.recv(0, act(3, 0, static_cast<int>(i)));
            expect_same(x, ts[i], "activation " + std::to_string(i));
            ep.send(0, grad(3, 0, static_cast<int>(i)), x);
        }
    }
    ep.flush();
}

UcxOptions tcp_detecting() {
    UcxOptions o;
    o.timeout = std::chrono::seconds(20);
    o.transports = "tcp,self";
    o.net_devices = "lo";
    o.detect_peer_failure = true;
    return o;
}

/// This test binary again, as rank 1 in `role`, meeting rank 0 through a FileStore in `dir`.
pid_t spawn_child(const std::string& role, const std::string& dir) {
    // Everything the child needs is built before fork: after it, only exec.
    std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
    std::string filter = "--gtest_filter=UcxProcesses.ChildRole";
    std::vector<std::string> env_strings{std::string(kChildDirEnv) + "=" + dir,
                                         std::string(kChildRoleEnv) + "=" + role};
    for (char** e = environ; *e; ++e)
        if (std::strncmp(*e, "DIST_UCX_TEST_CHILD_", 20) != 0) env_strings.emplace_back(*e);
    std::vector<char*> argv{self.data(), filter.data(), nullptr};
    std::vector<char*> envp;
    for (auto& str : env_strings) envp.push_back(str.data());
    envp.push_back(nullptr);
    pid_t child = ::fork();
    if (child == 0) {
        ::execve(argv[0], argv.data(), envp.data());
        ::_exit(127);
    }
    return child;
}

/// The child's exit status; the child is killed when it has not finished within `limit`.
int reap_child(pid_t child, milliseconds limit) {
    int status = 0;
    auto deadline = std::chrono::steady_clock::now() + limit;
    pid_t done = 0;
    while ((done = ::waitpid(child, &status, WNOHANG)) == 0 &&
           std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(milliseconds(10));
    if (done == 0) {
        ::kill(child, SIGKILL);
        ::waitpid(child, &status, 0);
        ADD_FAILURE() << "the child process did not finish in time";
    }
    return status;
}

std::string fresh_dir() {
    std::string templ = (std::filesystem::temp_directory_path() / "dist-ucx-test-XXXXXX").string();
    if (!::mkdtemp(templ.data())) throw std::runtime_error("mkdtemp failed");
    return templ;
}

} // namespace

// The second process's roles; skipped unless started by the tests below.
TEST(UcxProcesses, ChildRole) {
    const char* dir = std::getenv(kChildDirEnv);
    const char* role = std::getenv(kChildRoleEnv);
    if (!dir || !role) GTEST_SKIP() << "runs only as the child of the other UcxProcesses tests";
    FileStore store(dir);
    if (std::string(role) == "exchange") {
        UcxOptions o;
        o.timeout = std::chrono::seconds(20);
        auto ep = make_ucx_endpoint(store, "procs", 1, 2, o);
        pipeline_rank(*ep);
    } else if (std::string(role) == "die") {
        // Connects both ways, then dies without closing anything.
        auto ep = make_ucx_endpoint(store, "procs", 1, 2, tcp_detecting());
        ep->send(0, act(0, 0, 0), make({100}, kernels::DType::f32, 1));
        ep->recv(0, grad(0, 0, 0));
        ep->flush();
        ::kill(::getpid(), SIGKILL);
    } else {
        FAIL() << "unknown role " << role;
    }
}

TEST(UcxProcesses, TwoProcessesExchangeTensors) {
    if (std::getenv(kChildDirEnv)) GTEST_SKIP() << "this is the child";
    std::string dir = fresh_dir();
    pid_t child = spawn_child("exchange", dir);
    ASSERT_GE(child, 0) << std::strerror(errno);
    FileStore store(dir);
    UcxOptions o;
    o.timeout = std::chrono::seconds(20);
    {
        auto ep = make_ucx_endpoint(store, "procs", 0, 2, o);
        run_ranks({ep.get()}, {[&] { pipeline_rank(*ep); }});
    }
    int status = reap_child(child, std::chrono::seconds(30));
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
    std::filesystem::remove_all(dir);
}

TEST(UcxProcesses, APeerThatDiesFailsTheReceiveWaitingForIt) {
    if (std::getenv(kChildDirEnv)) GTEST_SKIP() << "this is the child";
    std::string dir = fresh_dir();
    pid_t child = spawn_child("die", dir);
    ASSERT_GE(child, 0) << std::strerror(errno);
    FileStore store(dir);
    {
        auto ep = make_ucx_endpoint(store, "procs", 0, 2, tcp_detecting());
        run_ranks(
            {ep.get()}, {[&] {
                auto x = ep->recv(1, act(0, 0, 0));
                ep->send(1, grad(0, 0, 0), x);
                ep->flush();
                try {
                    ep->recv(1, act(0, 0, 1));
                    ADD_FAILURE() << "received from a dead peer";
                } catch (const TransportError& e) {
                    std::string what = e.what();
                    EXPECT_NE(what.find("link from rank 0 to rank 1 failed"), std::string::npos)
                        << what;
                    EXPECT_NE(what.find(act(0, 0, 1).str()), std::string::npos) << what;
                }
                // The message names the failed link, not the 20 s timeout: the death was
                // noticed, not waited out.
            }});
    }
    int status = reap_child(child, std::chrono::seconds(30));
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "child status " << status;
    std::filesystem::remove_all(dir);
}
