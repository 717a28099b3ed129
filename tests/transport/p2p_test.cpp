// p2p_test.cpp: point-to-point transfer between ranks, and its failures.
#include "transport/p2p.hpp"

#include <gtest/gtest.h>

#include <future>
#include <thread>

using namespace dist;
using namespace dist::transport;

TEST(InProcessFabric, ReceivesMatchSendsByPeerAndTagInAnyOrder) {
    InProcessFabric fabric;
    auto a = fabric.endpoint(0), b = fabric.endpoint(1);
    kernels::Tensor x({2}), y({3});
    x.data<float>()[0] = 1.0f;
    y.data<float>()[0] = 2.0f;
    P2PTag t0{0, 0, 0, Direction::activation}, t1{0, 0, 1, Direction::activation};
    a->send(1, t0, x);
    a->send(1, t1, y);
    // The later message first: tags, not arrival order, decide.
    kernels::Tensor got1 = b->recv(0, t1), got0 = b->recv(0, t0);
    EXPECT_EQ(got1.numel(), 3);
    EXPECT_EQ(got0.data<float>()[0], 1.0f);
    // In process the tensor is handed over, not copied.
    EXPECT_EQ(got0.raw(), x.raw());
    EXPECT_EQ(fabric.pending(), 0u);
}

TEST(InProcessFabric, AReceiveWaitsForItsSend) {
    InProcessFabric fabric;
    auto a = fabric.endpoint(0), b = fabric.endpoint(1);
    P2PTag tag{4, 1, 2, Direction::gradient};
    auto got = std::async(std::launch::async, [&] { return b->recv(0, tag).numel(); });
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    a->send(1, tag, kernels::Tensor({5}));
    ASSERT_EQ(got.wait_for(std::chrono::seconds(5)), std::future_status::ready);
    EXPECT_EQ(got.get(), 5);
}

TEST(InProcessFabric, EveryWaitingRankGetsItsOwnSendInAnyOrder) {
    // Each receiving rank waits on its own: every rank waiting at once, sent to in reverse
    // order, gets its own message (a send that woke another rank than its receiver would leave
    // one waiting).
    InProcessFabric fabric(std::chrono::seconds(10));
    constexpr int ranks = 6;
    auto sender = fabric.endpoint(0);
    std::vector<std::unique_ptr<PointToPoint>> ends;
    std::vector<std::future<int64_t>> got;
    for (int r = 1; r <= ranks; ++r) ends.push_back(fabric.endpoint(r));
    for (int r = 1; r <= ranks; ++r)
        got.push_back(std::async(std::launch::async, [&, r] {
            return ends[static_cast<size_t>(r - 1)]
                ->recv(0, {0, 0, r, Direction::activation})
                .numel();
        }));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    for (int r = ranks; r >= 1; --r)
        sender->send(r, {0, 0, r, Direction::activation}, kernels::Tensor({r}));
    for (int r = 1; r <= ranks; ++r) {
        auto& g = got[static_cast<size_t>(r - 1)];
        ASSERT_EQ(g.wait_for(std::chrono::seconds(5)), std::future_status::ready) << "rank " << r;
        EXPECT_EQ(g.get(), r);
    }
    EXPECT_EQ(fabric.pending(), 0u);
}

TEST(InProcessFabric, AbortWakesAWaitingReceiveWithTheCause) {
    InProcessFabric fabric;
    auto b = fabric.endpoint(1);
    auto got = std::async(std::launch::async, [&] {
        try {
            b->recv(0, {1, 0, 0, Direction::activation});
        } catch (const TransportError& e) {
            return std::string(e.what());
        }
        return std::string("received");
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    fabric.abort("rank 0 failed in 0F0: boom");
    ASSERT_EQ(got.wait_for(std::chrono::seconds(5)), std::future_status::ready);
    std::string what = got.get();
    EXPECT_NE(what.find("rank 0 failed in 0F0: boom"), std::string::npos) << what;
    EXPECT_NE(what.find("step 1, stage 0, microbatch 0, activation"), std::string::npos) << what;
}

TEST(InProcessFabric, AMissingSendTimesOutAndADuplicateIsRefused) {
    InProcessFabric fabric(std::chrono::milliseconds(50));
    auto a = fabric.endpoint(0), b = fabric.endpoint(1);
    EXPECT_THROW(b->recv(0, {0, 0, 0, Direction::activation}), TransportError);
    InProcessFabric other;
    auto c = other.endpoint(0);
    c->send(1, {0, 0, 0, Direction::activation}, kernels::Tensor({1}));
    EXPECT_THROW(c->send(1, {0, 0, 0, Direction::activation}, kernels::Tensor({1})),
                 TransportError);
}
