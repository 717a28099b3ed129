// ucx_wire_test.cpp: the UCX endpoint's tags and tensor headers, and the refusal of malformed
// headers (a peer must never crash the receiver).
#include "transport/ucx_wire.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

using namespace dist;
using namespace dist::transport;

namespace {

P2PTag act(int64_t step, int stage, int mb) {
    return {step, stage, mb, Direction::activation};
}
P2PTag grad(int64_t step, int stage, int mb) {
    return {step, stage, mb, Direction::gradient};
}

// A header message as a sender builds it: the header, then inline data.
std::vector<char> message(const ucx_wire::Header& h, size_t data_bytes) {
    std::vector<char> m(sizeof h + data_bytes, 7);
    std::memcpy(m.data(), &h, sizeof h);
    return m;
}

std::string refusal(const std::vector<char>& m) {
    try {
        ucx_wire::read(m.data(), m.size(), "step 0 from rank 1");
    } catch (const TransportError& e) {
        return e.what();
    }
    return "accepted";
}

} // namespace

TEST(UcxTag, EachFieldHasItsBitsAndWhatDoesNotFitIsRefused) {
    EXPECT_EQ(ucx_tag(0, act(0, 0, 0), false), 0u);
    EXPECT_EQ(ucx_tag(0, act(0, 0, 0), true), uint64_t{1} << 63);
    EXPECT_EQ(ucx_tag(65535, act(0, 0, 0), false), uint64_t{0xffff} << 47);
    EXPECT_EQ(ucx_tag(0, grad(0, 0, 0), false), uint64_t{1} << 46);
    EXPECT_EQ(ucx_tag(0, act(0, 4095, 0), false), uint64_t{0xfff} << 34);
    EXPECT_EQ(ucx_tag(0, act(0, 0, 16383), false), uint64_t{0x3fff} << 20);
    EXPECT_EQ(ucx_tag(0, act((1 << 20) - 1, 0, 0), false), uint64_t{0xfffff});
    // Steps wrap modulo 2^20: only neighbouring steps are ever in flight together.
    EXPECT_EQ(ucx_tag(3, act((1 << 20) + 5, 2, 1), false), ucx_tag(3, act(5, 2, 1), false));
    EXPECT_NE(ucx_tag(3, act(5, 2, 1), false), ucx_tag(3, grad(5, 2, 1), false));
    EXPECT_NE(ucx_tag(3, act(5, 2, 1), false), ucx_tag(2, act(5, 2, 1), false));
    for (auto [rank, tag] : {std::pair{65536, act(0, 0, 0)}, std::pair{-1, act(0, 0, 0)},
                             std::pair{0, act(0, 4096, 0)}, std::pair{0, act(0, 0, 16384)},
                             std::pair{0, act(-1, 0, 0)}, std::pair{0, act(0, -1, 0)}}) {
        try {
            ucx_tag(rank, tag, false);
            ADD_FAILURE() << "accepted rank " << rank << ", " << tag.str();
        } catch (const TransportError& e) {
            EXPECT_NE(std::string(e.what()).find(tag.str()), std::string::npos) << e.what();
        }
    }
}

TEST(UcxWire, AHeaderDescribesItsTensorAndReadsBack) {
    kernels::Tensor small({2, 3}, kernels::DType::i32);
    for (int i = 0; i < 6; ++i) small.data<int32_t>()[i] = i * 11;
    auto h = ucx_wire::describe(small, "test");
    EXPECT_EQ(h.flags, ucx_wire::kDefined | ucx_wire::kInline);
    auto m = message(h, small.bytes());
    std::memcpy(m.data() + sizeof h, small.raw(), small.bytes());
    auto a = ucx_wire::read(m.data(), m.size(), "test");
    EXPECT_TRUE(a.complete);
    EXPECT_EQ(a.tensor.shape(), small.shape());
    EXPECT_EQ(a.tensor.dtype(), kernels::DType::i32);
    EXPECT_EQ(a.tensor.data<int32_t>()[5], 55);

    // Past the inline limit the data follows in its own message.
    kernels::Tensor large({int64_t{kUcxInlineBytes / 4 + 1}});
    auto hl = ucx_wire::describe(large, "test");
    EXPECT_EQ(hl.flags, ucx_wire::kDefined);
    auto al = ucx_wire::read(message(hl, 0).data(), sizeof hl, "test");
    EXPECT_FALSE(al.complete);
    EXPECT_EQ(al.tensor.numel(), large.numel());

    EXPECT_TRUE(ucx_wire::data_follows(hl));
    EXPECT_FALSE(ucx_wire::data_follows(h));

    // An undefined tensor is a header alone.
    auto hu = ucx_wire::describe(kernels::Tensor(), "test");
    EXPECT_FALSE(ucx_wire::data_follows(hu));
    auto au = ucx_wire::read(message(hu, 0).data(), sizeof hu, "test");
    EXPECT_TRUE(au.complete);
    EXPECT_FALSE(au.tensor.defined());

    EXPECT_THROW(ucx_wire::describe(kernels::Tensor({1, 1, 1, 1, 1, 1, 1, 1, 1}), "test"),
                 TransportError);
}

TEST(UcxWire, MalformedHeadersAreRefusedWithTheCause) {
    ucx_wire::Header good = ucx_wire::describe(kernels::Tensor({4}), "test");
    auto expect_refused = [&](const std::vector<char>& m, const std::string& cause) {
        std::string what = refusal(m);
        EXPECT_NE(what.find("malformed message step 0 from rank 1"), std::string::npos) << what;
        EXPECT_NE(what.find(cause), std::string::npos) << what;
    };
    expect_refused(std::vector<char>(10, 0), "shorter than a header");
    auto h = good;
    h.magic = 0x12345678;
    expect_refused(message(h, 16), "bad magic");
    h = good;
    h.version = 2;
    expect_refused(message(h, 16), "protocol version 2");
    h = good;
    h.dtype = 9;
    expect_refused(message(h, 16), "unknown dtype 9");
    h = good;
    h.dims = 100;
    expect_refused(message(h, 16), "100 dimensions");
    h = good;
    h.shape[0] = -4;
    expect_refused(message(h, 16), "negative dimension");
    h = good;
    h.bytes = 12;
    expect_refused(message(h, 16), "does not match its shape");
    expect_refused(message(good, 15), "bytes where");
    expect_refused(message(good, 17), "bytes where");
    // Sizes that would overflow or exhaust memory are refused before any allocation.
    h = good;
    h.dims = 3;
    h.shape[0] = h.shape[1] = h.shape[2] = int64_t{1} << 30;
    expect_refused(message(h, 16), "more than");
    h = good;
    h.shape[0] = int64_t{1} << 40;
    h.bytes = uint64_t{1} << 42;
    h.flags = ucx_wire::kDefined;
    expect_refused(message(h, 0), "more than");
    // Inline data above the limit, or a small tensor announced as separate.
    h = good;
    h.flags = ucx_wire::kDefined;
    expect_refused(message(h, 0), "separate data of 16 bytes");
    h = good;
    h.flags = ucx_wire::kDefined;
    expect_refused(message(h, 16), "separate data");
}
