// data_test.cpp: token files (text, llm.c .bin and its malformed variants), the determinism and
// data-parallel slicing of training batches, evaluation windows, and the hash behind them.
#include "models/data.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <bitset>
#include <filesystem>
#include <fstream>
#include <random>
#include <unordered_set>
#include <vector>

#include <unistd.h>

using namespace dist::models;
namespace fs = std::filesystem;

namespace {

using Bytes = std::vector<unsigned char>;

void put_le32(int32_t value, Bytes& out) {
    uint32_t v = static_cast<uint32_t>(value);
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<unsigned char>(v >> (8 * i)));
}

// A .bin assembled byte by byte: a 256-int32 header (the first three given), then the tokens.
Bytes bin_bytes(int32_t magic, int32_t version, int32_t count, const std::vector<uint16_t>& toks) {
    Bytes out;
    put_le32(magic, out);
    put_le32(version, out);
    put_le32(count, out);
    for (int i = 3; i < 256; ++i) put_le32(0, out);
    for (uint16_t t : toks) {
        out.push_back(static_cast<unsigned char>(t & 0xff));
        out.push_back(static_cast<unsigned char>(t >> 8));
    }
    return out;
}

// The stream 0, 1, ..., n-1: a token's value is its position, so a window shows where it lies.
std::vector<uint16_t> iota_tokens(int n) {
    std::vector<uint16_t> v(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<uint16_t>(i);
    return v;
}

class DataTest : public ::testing::Test {
  protected:
    void SetUp() override {
        const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
        dir_ = fs::temp_directory_path() /
               ("dist_data_test_" + std::to_string(::getpid()) + "_" + info->name());
        fs::remove_all(dir_);
        fs::create_directories(dir_);
    }
    void TearDown() override { fs::remove_all(dir_); }

    std::string path(const std::string& name) const { return (dir_ / name).string(); }

    std::string write_file(const std::string& name, const Bytes& bytes) const {
        std::ofstream out(path(name), std::ios::binary);
        out.write(reinterpret_cast<const char*>(bytes.data()),
                  static_cast<std::streamsize>(bytes.size()));
        return path(name);
    }

    TokenData load_iota(int n) const {
        std::string p = path("iota.bin");
        EXPECT_EQ(TokenData::write_bin(p, iota_tokens(n)), "");
        TokenData data;
        EXPECT_EQ(TokenData::load_bin(p, 65536, 1, data), "");
        EXPECT_EQ(data.size(), n);
        return data;
    }

    fs::path dir_;
};

TEST_F(DataTest, TextBytesAreTokens) {
    Bytes bytes = {'h', 'i', 0, 1, 127, 128, 200, 255, '\n'};
    std::string p = write_file("a.txt", bytes);
    TokenData data;
    ASSERT_EQ(TokenData::load_text(p, 1, data), "");
    ASSERT_EQ(data.size(), 9);
    std::vector<int32_t> expected(bytes.begin(), bytes.end());
    EXPECT_EQ(data.tokens(), expected);
    EXPECT_EQ(TokenData::load_text(p, 9, data), "");
}

TEST_F(DataTest, TextErrors) {
    TokenData data;
    ASSERT_EQ(TokenData::load_text(write_file("keep.txt", {'x', 'y'}), 1, data), "");

    std::string err = TokenData::load_text(path("missing.txt"), 1, data);
    EXPECT_NE(err.find("missing.txt"), std::string::npos) << err;
    EXPECT_NE(err.find("no such file"), std::string::npos) << err;

    fs::create_directories(path("folder"));
    err = TokenData::load_text(path("folder"), 1, data);
    EXPECT_NE(err.find("is a directory"), std::string::npos) << err;

    err = TokenData::load_text(write_file("empty.txt", {}), 1, data);
    EXPECT_NE(err.find("empty.txt"), std::string::npos) << err;
    EXPECT_NE(err.find("is empty"), std::string::npos) << err;

    err = TokenData::load_text(write_file("short.txt", {'a', 'b', 'c', 'd', 'e'}), 9, data);
    EXPECT_NE(err.find("has 5 tokens"), std::string::npos) << err;
    EXPECT_NE(err.find("the 9 that one step needs"), std::string::npos) << err;

    // A failed load leaves the previous stream in place.
    EXPECT_EQ(data.tokens(), (std::vector<int32_t>{'x', 'y'}));
}

TEST_F(DataTest, BinRoundTrip) {
    std::mt19937 rng(7);
    std::vector<uint16_t> tokens(3000);
    for (auto& t : tokens) t = static_cast<uint16_t>(rng());
    tokens[0] = 0;
    tokens[1] = 65535;
    std::string p = path("round.bin");
    ASSERT_EQ(TokenData::write_bin(p, {1, 2, 3}), "");
    ASSERT_EQ(TokenData::write_bin(p, tokens), ""); // replaces the earlier file
    TokenData data;
    ASSERT_EQ(TokenData::load_bin(p, 65536, 1, data), "");
    EXPECT_EQ(data.tokens(), std::vector<int32_t>(tokens.begin(), tokens.end()));
    // No temp file is left beside the target.
    EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1);
}

TEST_F(DataTest, BinBuiltByHandReadsBack) {
    std::vector<uint16_t> tokens = {0, 1, 255, 256, 258, 50256};
    Bytes bytes = bin_bytes(20240520, 1, 6, tokens);
    ASSERT_EQ(bytes.size(), 1024u + 12u);
    EXPECT_EQ(bytes[0], 0x88); // 20240520 = 0x0134D888, little-endian
    EXPECT_EQ(bytes[1], 0xD8);
    EXPECT_EQ(bytes[3], 0x01);
    EXPECT_EQ(bytes[1024 + 2 * 4], 0x02); // 258 = 0x0102, low byte first
    EXPECT_EQ(bytes[1024 + 2 * 4 + 1], 0x01);
    std::string p = write_file("hand.bin", bytes);
    TokenData data;
    ASSERT_EQ(TokenData::load_bin(p, 50257, 6, data), "");
    EXPECT_EQ(data.tokens(), (std::vector<int32_t>{0, 1, 255, 256, 258, 50256}));

    // write_bin produces exactly these bytes.
    std::string q = path("written.bin");
    ASSERT_EQ(TokenData::write_bin(q, tokens), "");
    std::ifstream in(q, std::ios::binary);
    Bytes written((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(written, bytes);
}

TEST_F(DataTest, MalformedBinErrors) {
    struct Case {
        const char* name;
        Bytes bytes;
        int32_t vocab;
        int64_t min_tokens;
        std::vector<std::string> phrases;
    };
    Bytes short_file = bin_bytes(20240520, 1, 0, {});
    short_file.resize(100);
    Bytes trailing = bin_bytes(20240520, 1, 10, iota_tokens(10));
    trailing.insert(trailing.end(), {7, 7, 7});
    std::vector<Case> cases = {
        {"short.bin", short_file, 256, 1, {"100 bytes", "shorter than the 1024-byte header"}},
        {"magic.bin",
         bin_bytes(12345, 1, 4, iota_tokens(4)),
         256,
         1,
         {"byte 0", "magic number is 12345", "20240520", "not an llm.c token file"}},
        {"text.bin",
         {'h', 'e', 'l', 'l', 'o', '\n'},
         256,
         1,
         {"magic number is", "not an llm.c token file"}},
        {"version.bin",
         bin_bytes(20240520, 2, 4, iota_tokens(4)),
         256,
         1,
         {"byte 4", "version 2", "not supported"}},
        {"negative.bin", bin_bytes(20240520, 1, -1, {}), 256, 1, {"negative token count -1"}},
        {"truncated.bin",
         bin_bytes(20240520, 1, 10, iota_tokens(8)),
         256,
         1,
         {"10 tokens", "1044 bytes", "file is 1040 bytes", "truncated", "4 bytes missing"}},
        {"trailing.bin",
         trailing,
         256,
         1,
         {"10 tokens", "1044 bytes", "file is 1047 bytes", "3 trailing bytes"}},
        {"empty.bin", bin_bytes(20240520, 1, 0, {}), 256, 1, {"no tokens"}},
        {"few.bin",
         bin_bytes(20240520, 1, 4, iota_tokens(4)),
         256,
         9,
         {"has 4 tokens", "the 9 that one step needs"}},
        {"vocab.bin",
         bin_bytes(20240520, 1, 4, {1, 2, 300, 4}),
         256,
         1,
         {"byte 1028", "token 2 is 300", "vocabulary size 256"}},
    };
    for (const Case& c : cases) {
        std::string p = write_file(c.name, c.bytes);
        TokenData data;
        std::string err = TokenData::load_bin(p, c.vocab, c.min_tokens, data);
        EXPECT_NE(err.find(c.name), std::string::npos) << c.name << ": " << err;
        for (const std::string& phrase : c.phrases)
            EXPECT_NE(err.find(phrase), std::string::npos) << c.name << ": " << err;
        EXPECT_EQ(data.size(), 0) << c.name;
    }
    TokenData data;
    std::string err = TokenData::load_bin(path("missing.bin"), 256, 1, data);
    EXPECT_NE(err.find("no such file"), std::string::npos) << err;
}

TEST_F(DataTest, BatchIsAFunctionOfSeedAndStep) {
    const int n = 5000;
    const int64_t B = 8, T = 16;
    TokenData data = load_iota(n);
    auto batch = [&](uint64_t seed, int64_t step) {
        std::vector<int32_t> x(B * T), y(B * T);
        data.batch(seed, step, B, T, 0, 1, x.data(), y.data());
        return std::make_pair(x, y);
    };
    auto first = batch(42, 3);
    for (int64_t step = 0; step < 20; ++step) batch(42, step); // history does not matter
    EXPECT_EQ(batch(42, 3), first);
    EXPECT_NE(batch(43, 3).first, first.first);

    std::vector<std::vector<int32_t>> seen;
    for (int64_t step = 0; step < 50; ++step) {
        auto [x, y] = batch(42, step);
        for (const auto& other : seen) EXPECT_NE(x, other) << "step " << step;
        seen.push_back(x);
        for (int64_t b = 0; b < B; ++b) {
            int32_t start = x[b * T]; // a token's value is its position in the stream
            ASSERT_GE(start, 0);
            ASSERT_LE(start, n - T - 1);
            for (int64_t t = 0; t < T; ++t) {
                EXPECT_EQ(x[b * T + t], data.tokens()[start + t]);
                EXPECT_EQ(y[b * T + t], data.tokens()[start + t + 1]);
            }
        }
    }
}

TEST_F(DataTest, BatchOffsetsCoverTheWholeRange) {
    const int64_t T = 4, B = 64;
    TokenData data = load_iota(12); // offsets 0..7
    std::vector<int> count(8, 0);
    std::vector<int32_t> x(B * T), y(B * T);
    for (int64_t step = 0; step < 100; ++step) {
        data.batch(1, step, B, T, 0, 1, x.data(), y.data());
        for (int64_t b = 0; b < B; ++b) {
            ASSERT_LT(x[b * T], 8);
            ++count[static_cast<size_t>(x[b * T])];
        }
    }
    for (int c : count) { // 6400 draws, 800 expected each, standard deviation about 26
        EXPECT_GT(c, 650);
        EXPECT_LT(c, 950);
    }

    TokenData exact = load_iota(5); // a stream of exactly T+1 tokens has one window
    exact.batch(9, 0, 2, T, 0, 1, x.data(), y.data());
    EXPECT_EQ(std::vector<int32_t>(x.begin(), x.begin() + 8),
              (std::vector<int32_t>{0, 1, 2, 3, 0, 1, 2, 3}));
    EXPECT_EQ(std::vector<int32_t>(y.begin(), y.begin() + 8),
              (std::vector<int32_t>{1, 2, 3, 4, 1, 2, 3, 4}));
}

TEST_F(DataTest, DataParallelRanksSliceTheGlobalBatch) {
    const int64_t B = 12, T = 5;
    TokenData data = load_iota(1000);
    std::vector<int32_t> gx(B * T), gy(B * T);
    data.batch(5, 17, B, T, 0, 1, gx.data(), gy.data());
    for (int64_t dp : {1, 2, 3, 4, 6, 12}) {
        std::vector<int32_t> cx, cy;
        for (int64_t rank = 0; rank < dp; ++rank) {
            std::vector<int32_t> x(B / dp * T), y(B / dp * T);
            data.batch(5, 17, B, T, rank, dp, x.data(), y.data());
            cx.insert(cx.end(), x.begin(), x.end());
            cy.insert(cy.end(), y.begin(), y.end());
        }
        EXPECT_EQ(cx, gx) << "dp " << dp;
        EXPECT_EQ(cy, gy) << "dp " << dp;
    }
}

TEST_F(DataTest, EvalWindowsAreConsecutiveAndDisjoint) {
    const int64_t T = 16;
    TokenData data = load_iota(5000);
    ASSERT_EQ(data.eval_windows(T), 5000 / 17);
    std::vector<int32_t> x(T), y(T);
    int32_t next = 0; // the first token the next window must start with
    for (int64_t w = 0; w < data.eval_windows(T); ++w) {
        data.eval_window(w, T, x.data(), y.data());
        for (int64_t t = 0; t < T; ++t) {
            EXPECT_EQ(x[t], next + t);
            EXPECT_EQ(y[t], next + t + 1);
        }
        next = y[T - 1] + 1;
    }
    EXPECT_EQ(next, 5000 / 17 * 17);
}

TEST_F(DataTest, EvalWindowsOfATinyStream) {
    TokenData data;
    ASSERT_EQ(TokenData::load_text(write_file("tiny.txt", {'a', 'b', 'c', 'd', 'e', 'f', 'g', 'h'}),
                                   1, data),
              "");
    ASSERT_EQ(data.eval_windows(2), 2); // "abc", "def"; "gh" dropped
    std::vector<int32_t> x(2), y(2);
    data.eval_window(0, 2, x.data(), y.data());
    EXPECT_EQ(x, (std::vector<int32_t>{'a', 'b'}));
    EXPECT_EQ(y, (std::vector<int32_t>{'b', 'c'}));
    data.eval_window(1, 2, x.data(), y.data());
    EXPECT_EQ(x, (std::vector<int32_t>{'d', 'e'}));
    EXPECT_EQ(y, (std::vector<int32_t>{'e', 'f'}));
    EXPECT_EQ(data.eval_windows(3), 2);
    EXPECT_EQ(data.eval_windows(7), 1);
    EXPECT_EQ(data.eval_windows(8), 0);
}

TEST(Hash64, DependsOnItsArgumentsOnly) {
    uint64_t h = hash64(1, 2, 3);
    for (uint64_t i = 0; i < 1000; ++i) hash64(i, i * 7, i * 13);
    EXPECT_EQ(hash64(1, 2, 3), h);
    EXPECT_NE(hash64(0, 2, 3), h);
    EXPECT_NE(hash64(1, 0, 3), h);
    EXPECT_NE(hash64(1, 2, 0), h);
    EXPECT_NE(hash64(3, 2, 1), h);
    EXPECT_NE(hash64(2, 1, 3), h);
}

TEST(Hash64, SpreadsConsecutiveCounters) {
    const uint64_t n = 100000;
    for (int position = 0; position < 3; ++position) {
        std::unordered_set<uint64_t> seen;
        std::vector<uint64_t> ones(64, 0);
        for (uint64_t i = 0; i < n; ++i) {
            uint64_t h = position == 0   ? hash64(i, 5, 9)
                         : position == 1 ? hash64(5, i, 9)
                                         : hash64(5, 9, i);
            seen.insert(h);
            for (int bit = 0; bit < 64; ++bit) ones[bit] += (h >> bit) & 1;
        }
        EXPECT_EQ(seen.size(), n) << "position " << position;
        for (int bit = 0; bit < 64; ++bit) { // each bit set half the time, sd 0.0016
            double f = double(ones[bit]) / double(n);
            EXPECT_GT(f, 0.49) << "position " << position << " bit " << bit;
            EXPECT_LT(f, 0.51) << "position " << position << " bit " << bit;
        }
    }
}

} // namespace
