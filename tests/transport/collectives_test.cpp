// collectives_test.cpp: every collectives backend against the definition of each collective.
//
// One suite, parameterised by backend and group size. Each test runs its members on threads
// under a watchdog: a member that has not returned after a few seconds aborts the group, so a
// hang fails the test instead of stopping the suite.
#include "transport/gloo.hpp"
#include "transport/inprocess.hpp"
#include "transport/staged.hpp"

#include <gtest/gtest.h>

#include <functional>
#include <future>
#include <numeric>
#include <thread>

namespace dist::transport {
namespace {

struct Backend {
    std::string name;
    int size;
};

class Group {
  public:
    explicit Group(const Backend& b) : size_(b.size) {
        if (b.name == "solo") {
            solo_ = std::make_unique<SoloCollectives>();
        } else if (b.name == "gloo") {
            // Members join concurrently: each waits in the rendezvous for the others.
            std::vector<std::future<std::unique_ptr<Collectives>>> joining;
            for (int r = 0; r < b.size; ++r)
                joining.push_back(std::async(std::launch::async, [this, r, &b] {
                    GlooOptions o;
                    o.timeout = std::chrono::seconds(20);
                    return make_gloo_collectives(store_, "test", r, b.size, o);
                }));
            for (auto& j : joining) members_.push_back(j.get());
        } else {
            group_ = std::make_unique<InProcessGroup>(b.size, "test group",
                                                      std::chrono::milliseconds(20000));
            for (int r = 0; r < b.size; ++r) members_.push_back(group_->member(r));
            // Staged through host buffers (the GPU ranks' fallback), here from host memory:
            // the copies and the buffer sizes of each collective are what is under test.
            if (b.name == "staged")
                for (auto& m : members_)
                    m = make_host_staged(std::move(m), kernels::Allocator::cpu());
        }
    }
    int size() const { return size_; }
    Collectives& member(int r) { return solo_ ? *solo_ : *members_[static_cast<size_t>(r)]; }
    InProcessGroup* group() { return group_.get(); }

    /// Runs body(rank, collectives) on one thread per member; fails the test on a hang.
    void run(const std::function<void(int, Collectives&)>& body) {
        std::vector<std::future<void>> done;
        for (int r = 0; r < size_; ++r)
            done.push_back(std::async(std::launch::async, [&, r] { body(r, member(r)); }));
        auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        for (auto& f : done) {
            if (f.wait_until(deadline) == std::future_status::timeout) {
                if (group_) group_->abort("watchdog: the test took more than 10 s");
                ADD_FAILURE() << "a member did not return within 10 s";
            }
        }
        for (auto& f : done) f.get();
    }

  private:
    int size_;
    MemoryStore store_;
    std::unique_ptr<SoloCollectives> solo_;
    std::unique_ptr<InProcessGroup> group_;
    std::vector<std::unique_ptr<Collectives>> members_;
};

class CollectivesTest : public ::testing::TestWithParam<Backend> {};

// Member r's element i: distinct across members and elements, exact in float.
float value(int r, int64_t i) {
    return static_cast<float>((r + 1) * 1000 + i % 997) * (i % 2 ? -1.0f : 1.0f);
}

TEST_P(CollectivesTest, AllReduceSumAndMaxGiveEveryMemberTheReduction) {
    Group g(GetParam());
    // Sizes that do not divide evenly among members, an empty call, and one whose shares span
    // several of the in-process path's blocks of 2,048 with a part of one left over.
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{20011}}) {
        for (ReduceOp op : {ReduceOp::sum, ReduceOp::max}) {
            std::vector<std::vector<float>> data(static_cast<size_t>(g.size()));
            g.run([&](int r, Collectives& c) {
                EXPECT_EQ(c.rank(), r);
                EXPECT_EQ(c.size(), g.size());
                auto& d = data[static_cast<size_t>(r)];
                for (int64_t i = 0; i < n; ++i) d.push_back(value(r, i));
                c.all_reduce(d.data(), n, op);
            });
            for (int64_t i = 0; i < n; ++i) {
                float expect = value(0, i);
                for (int r = 1; r < g.size(); ++r)
                    expect =
                        op == ReduceOp::sum ? expect + value(r, i) : std::max(expect, value(r, i));
                for (int r = 0; r < g.size(); ++r)
                    ASSERT_EQ(data[static_cast<size_t>(r)][static_cast<size_t>(i)], expect)
                        << "member " << r << " element " << i;
            }
        }
    }
}

TEST_P(CollectivesTest, AllGatherPlacesEachMembersDataAtItsOffset) {
    Group g(GetParam());
    const int64_t n = 13;
    std::vector<std::vector<float>> out(static_cast<size_t>(g.size()));
    g.run([&](int r, Collectives& c) {
        std::vector<float> in;
        for (int64_t i = 0; i < n; ++i) in.push_back(value(r, i));
        auto& o = out[static_cast<size_t>(r)];
        o.assign(static_cast<size_t>(n * g.size()), 0.0f);
        c.all_gather(in.data(), n, o.data());
    });
    for (int r = 0; r < g.size(); ++r)
        for (int src = 0; src < g.size(); ++src)
            for (int64_t i = 0; i < n; ++i)
                ASSERT_EQ(out[static_cast<size_t>(r)][static_cast<size_t>(src * n + i)],
                          value(src, i));
}

TEST_P(CollectivesTest, ReduceScatterGivesMemberRTheSumOfChunkR) {
    Group g(GetParam());
    const int64_t n = 9;
    std::vector<std::vector<float>> out(static_cast<size_t>(g.size()));
    g.run([&](int r, Collectives& c) {
        // First into a buffer of its own, with other values; then in place: the output is the
        // member's own chunk of its input (a second call finds nothing of the first).
        std::vector<float> buf, first(static_cast<size_t>(n));
        for (int64_t i = 0; i < n * g.size(); ++i) buf.push_back(-2.0f * value(r, i));
        c.reduce_scatter(buf.data(), n, first.data());
        for (int64_t i = 0; i < n; ++i) {
            float expect = 0.0f;
            for (int m = 0; m < g.size(); ++m) expect += -2.0f * value(m, r * n + i);
            ASSERT_EQ(first[static_cast<size_t>(i)], expect);
        }
        buf.clear();
        for (int64_t i = 0; i < n * g.size(); ++i) buf.push_back(value(r, i));
        c.reduce_scatter(buf.data(), n, buf.data() + r * n);
        out[static_cast<size_t>(r)].assign(buf.begin() + r * n, buf.begin() + (r + 1) * n);
    });
    for (int r = 0; r < g.size(); ++r)
        for (int64_t i = 0; i < n; ++i) {
            float expect = 0.0f;
            for (int m = 0; m < g.size(); ++m) expect += value(m, r * n + i);
            ASSERT_EQ(out[static_cast<size_t>(r)][static_cast<size_t>(i)], expect);
        }
}

TEST_P(CollectivesTest, BroadcastCopiesTheRootsData) {
    Group g(GetParam());
    const int root = g.size() - 1;
    std::vector<std::vector<float>> data(static_cast<size_t>(g.size()));
    g.run([&](int r, Collectives& c) {
        auto& d = data[static_cast<size_t>(r)];
        for (int64_t i = 0; i < 5; ++i) d.push_back(value(r, i));
        c.broadcast(d.data(), 5, root);
    });
    for (int r = 0; r < g.size(); ++r)
        for (int64_t i = 0; i < 5; ++i) ASSERT_EQ(data[static_cast<size_t>(r)][i], value(root, i));
}

// Member s sends (s + 2 d) % 3 values to member d (some of them none): member d receives,
// sender by sender, exactly the values s put in its block for d, whatever the other blocks.
TEST_P(CollectivesTest, AllToAllDeliversEachBlockToItsMemberInSenderOrder) {
    Group g(GetParam());
    const int n = g.size();
    auto count = [](int s, int d) { return static_cast<int64_t>((s + 2 * d) % 3); };
    auto val = [](int s, int d, int64_t i) { return static_cast<float>(1000 * s + 10 * d + i); };
    std::vector<std::vector<float>> got(static_cast<size_t>(n));
    g.run([&](int r, Collectives& c) {
        std::vector<int64_t> send, recv;
        std::vector<float> in;
        int64_t total = 0;
        for (int d = 0; d < n; ++d) {
            send.push_back(count(r, d));
            recv.push_back(count(d, r));
            total += count(d, r);
            for (int64_t i = 0; i < count(r, d); ++i) in.push_back(val(r, d, i));
        }
        in.push_back(0.0f); // never an empty buffer
        auto& out = got[static_cast<size_t>(r)];
        out.assign(static_cast<size_t>(total) + 1, -1.0f);
        c.all_to_all(in.data(), send, out.data(), recv);
    });
    for (int d = 0; d < n; ++d) {
        size_t at = 0;
        for (int s = 0; s < n; ++s)
            for (int64_t i = 0; i < count(s, d); ++i)
                ASSERT_EQ(got[static_cast<size_t>(d)][at++], val(s, d, i))
                    << "member " << d << " from " << s;
        EXPECT_EQ(got[static_cast<size_t>(d)][at], -1.0f)
            << "member " << d << ": wrote past its data";
    }
}

TEST_P(CollectivesTest, ManyCallsInARowStayInStep) {
    Group g(GetParam());
    std::vector<float> last(static_cast<size_t>(g.size()));
    g.run([&](int r, Collectives& c) {
        float x = 0;
        for (int k = 0; k < 200; ++k) {
            x = static_cast<float>(r + k);
            c.all_reduce(&x, 1, ReduceOp::sum);
        }
        last[static_cast<size_t>(r)] = x;
    });
    int s = g.size();
    for (float x : last) EXPECT_EQ(x, static_cast<float>(s * (s - 1) / 2 + 199 * s));
}

std::string backend_name(const ::testing::TestParamInfo<Backend>& info) {
    return info.param.name + std::to_string(info.param.size);
}

INSTANTIATE_TEST_SUITE_P(Backends, CollectivesTest,
                         ::testing::Values(Backend{"solo", 1}, Backend{"inprocess", 1},
                                           Backend{"inprocess", 2}, Backend{"inprocess", 3},
                                           Backend{"inprocess", 4}, Backend{"gloo", 1},
                                           Backend{"gloo", 2}, Backend{"gloo", 3},
                                           Backend{"gloo", 4}, Backend{"staged", 1},
                                           Backend{"staged", 3}),
                         backend_name);

// ----- failures (in-process only: the solo group cannot fail) --------------------------------

TEST(InProcessGroup, AllToAllCountsThatDisagreeAreAnErrorOnEveryMember) {
    InProcessGroup group(2, "ep group 0", std::chrono::milliseconds(5000));
    auto a = group.member(0), b = group.member(1);
    std::vector<float> in(4, 1.0f), out(4, 0.0f);
    // Member 0 sends 2 values to member 1, which expects 3.
    auto first = std::async(std::launch::async, [&] {
        std::vector<float> mine(4, 0.0f);
        a->all_to_all(in.data(), {1, 2}, mine.data(), {1, 1});
    });
    auto second = std::async(std::launch::async, [&] {
        b->all_to_all(in.data(), {1, 1}, out.data(), {3, 1});
    });
    for (auto* f : {&first, &second}) {
        try {
            f->get();
            ADD_FAILURE() << "the all-to-all went through";
        } catch (const CollectiveError& e) {
            EXPECT_NE(
                std::string(e.what()).find("rank 0 sends 2 values to rank 1, which expects 3"),
                std::string::npos)
                << e.what();
        }
    }
}

TEST(InProcessGroup, AbortWakesEveryWaitingMember) {
    InProcessGroup group(3, "tp group 0");
    auto m0 = group.member(0), m1 = group.member(1);
    std::vector<std::future<std::string>> waiting;
    for (Collectives* c : {m0.get(), m1.get()})
        waiting.push_back(std::async(std::launch::async, [c] {
            float x = 1;
            try {
                c->all_reduce(&x, 1, ReduceOp::sum);
            } catch (const CollectiveError& e) {
                return std::string(e.what());
            }
            return std::string("returned");
        }));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    group.abort("rank 2 failed: out of memory");
    for (auto& f : waiting) {
        ASSERT_EQ(f.wait_for(std::chrono::seconds(5)), std::future_status::ready);
        std::string what = f.get();
        EXPECT_NE(what.find("tp group 0"), std::string::npos) << what;
        EXPECT_NE(what.find("rank 2 failed: out of memory"), std::string::npos) << what;
    }
    // Later calls fail at once.
    float x = 0;
    EXPECT_THROW(m0->all_reduce(&x, 1, ReduceOp::sum), CollectiveError);
}

TEST(InProcessGroup, AMemberThatNeverComesTimesOutWithAMessage) {
    InProcessGroup group(2, "dp group", std::chrono::milliseconds(100));
    auto m0 = group.member(0);
    float x = 1;
    try {
        m0->all_reduce(&x, 1, ReduceOp::sum);
        FAIL() << "returned without its peer";
    } catch (const CollectiveError& e) {
        std::string what = e.what();
        EXPECT_NE(what.find("rank 0 waited 100 ms in all_reduce for 1 of 2 members"),
                  std::string::npos)
            << what;
    }
    EXPECT_TRUE(group.aborted());
}

TEST(InProcessGroup, MembersThatDisagreeAboutTheCallAreStopped) {
    InProcessGroup group(2, "tp group 1");
    auto m0 = group.member(0), m1 = group.member(1);
    auto a = std::async(std::launch::async, [&] {
        std::vector<float> x(4);
        m0->all_reduce(x.data(), 4, ReduceOp::sum);
    });
    auto b = std::async(std::launch::async, [&] {
        std::vector<float> x(8);
        m1->all_gather(x.data(), 4, x.data());
    });
    ASSERT_EQ(a.wait_for(std::chrono::seconds(5)), std::future_status::ready);
    ASSERT_EQ(b.wait_for(std::chrono::seconds(5)), std::future_status::ready);
    EXPECT_THROW(a.get(), CollectiveError);
    EXPECT_THROW(b.get(), CollectiveError);
}

TEST(InProcessGroup, RefusesRanksOutsideTheGroup) {
    InProcessGroup group(2, "g");
    EXPECT_THROW(group.member(2), std::invalid_argument);
    EXPECT_THROW(group.member(-1), std::invalid_argument);
    EXPECT_THROW(InProcessGroup(0, "empty"), std::invalid_argument);
}

} // namespace
} // namespace dist::transport

namespace dist::transport {
namespace {

TEST(GlooGroup, AMemberThatNeverJoinsIsAnErrorNotAHang) {
    MemoryStore store;
    GlooOptions o;
    o.timeout = std::chrono::milliseconds(300);
    try {
        make_gloo_collectives(store, "dp group", 0, 2, o);
        FAIL() << "joined a group of two alone";
    } catch (const CollectiveError& e) {
        std::string what = e.what();
        EXPECT_NE(what.find("dp group: rank 0 of 2 could not join"), std::string::npos) << what;
    }
    EXPECT_THROW(make_gloo_collectives(store, "g", 2, 2, o), std::invalid_argument);
}

} // namespace
} // namespace dist::transport
