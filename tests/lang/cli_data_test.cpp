// cli_data_test.cpp: `dist tokenize` and `dist plot` as a user runs them.
#include "tests/common/dist_command.hpp"
#include "tests/common/gpt2_bytes.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <array>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <unistd.h>

namespace fs = std::filesystem;

namespace {

using Result = dist::tests::DistResult;
using dist::tests::slurp;

Result run(const std::string& args) {
    return dist::tests::run_dist(args);
}

struct Dir {
    fs::path path;
    explicit Dir(const std::string& name)
        : path(fs::temp_directory_path() / (name + "-" + std::to_string(::getpid()))) {
        fs::remove_all(path);
        fs::create_directories(path);
    }
    ~Dir() { fs::remove_all(path); }
    std::string operator/(const std::string& f) const { return (path / f).string(); }
};

using dist::tests::gpt2_byte_char;

// A vocabulary of the 256 bytes (id = byte), "he" (256) and, when asked, <|endoftext|> (257).
void write_tokenizer(const fs::path& dir, bool eot) {
    fs::create_directories(dir);
    nlohmann::json vocab = nlohmann::json::object();
    for (int b = 0; b < 256; ++b) vocab[gpt2_byte_char(b)] = b;
    vocab["he"] = 256;
    if (eot) vocab["<|endoftext|>"] = 257;
    std::ofstream(dir / "vocab.json") << vocab.dump();
    std::ofstream(dir / "merges.txt") << "#version: 0.2\nh e\n";
}

// The tokens of an llm.c .bin file (header of 256 int32: magic, version, count).
std::vector<uint16_t> read_bin(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::array<int32_t, 256> header{};
    in.read(reinterpret_cast<char*>(header.data()), sizeof header);
    EXPECT_EQ(header[0], 20240520);
    std::vector<uint16_t> tokens(static_cast<size_t>(header[2]));
    in.read(reinterpret_cast<char*>(tokens.data()),
            static_cast<std::streamsize>(tokens.size() * sizeof(uint16_t)));
    EXPECT_TRUE(in.good());
    return tokens;
}

} // namespace

TEST(Tokenize, WritesTheTokensOfEachDocumentAfterItsEndOfTextToken) {
    Dir d("dist-tokenize");
    write_tokenizer(d.path / "tok", true);
    std::ofstream(d / "a.txt") << "hehe\n";
    std::ofstream(d / "b.txt") << "she";
    Result r = run("tokenize --tokenizer " + d / "tok" + " " + d / "a.txt" + " " + d / "b.txt" +
                   " --out " + d / "out.bin" + " --eot");
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_NE(r.out.find("7 tokens from 2 files (8 bytes"), std::string::npos) << r.out;
    // "hehe" -> he he, "\n" -> byte 10; " she"... is "she" -> s, he.
    EXPECT_EQ(read_bin(d / "out.bin"), (std::vector<uint16_t>{257, 256, 256, 10, 257, 's', 256}));
    // Without --eot the documents follow one another.
    r = run("tokenize --tokenizer " + d / "tok" + " " + d / "a.txt" + " --out " + d / "two.bin");
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(read_bin(d / "two.bin"), (std::vector<uint16_t>{256, 256, 10}));
}

TEST(Tokenize, RefusesWhatItCannotDoAndWritesNothing) {
    Dir d("dist-tokenize-bad");
    write_tokenizer(d.path / "tok", false);
    std::ofstream(d / "a.txt") << "hello";
    Result r = run("tokenize --tokenizer " + d / "tok" + " " + d / "missing.txt" + " --out " +
                   d / "out.bin");
    EXPECT_EQ(r.status, 1);
    EXPECT_NE(r.err.find("missing.txt`: no such file"), std::string::npos) << r.err;
    r = run("tokenize --tokenizer " + d / "tok" + " " + d / "a.txt" + " --out " + d / "out.bin" +
            " --eot");
    EXPECT_EQ(r.status, 1);
    EXPECT_NE(r.err.find("--eot needs the token `<|endoftext|>`"), std::string::npos) << r.err;
    r = run("tokenize --tokenizer " + d / "nowhere" + " " + d / "a.txt" + " --out " +
            d / "out.bin");
    EXPECT_EQ(r.status, 1);
    EXPECT_NE(r.err.find("vocab.json"), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(d / "out.bin"));
    EXPECT_EQ(run("tokenize " + d / "a.txt" + " --out " + d / "out.bin").status, 2);
}

TEST(Plot, DrawsOneCurvePerRunWithALegend) {
    Dir d("dist-plot");
    {
        std::ofstream a(d / "dp1.jsonl"), b(d / "dp4.jsonl");
        for (int s = 1; s <= 20; ++s) {
            a << nlohmann::json{{"step", s}, {"loss", 5.0 - 0.1 * s}, {"lr", 1e-3}}.dump() << "\n";
            b << nlohmann::json{{"step", s}, {"loss", 5.0 - 0.1 * s + 0.01}, {"lr", 1e-3}}.dump()
              << "\n";
        }
    }
    Result r = run("plot " + d / "dp1.jsonl" + " " + d / "dp4.jsonl" + " --svg " + d / "c.svg");
    ASSERT_EQ(r.status, 0) << r.err;
    std::string svg = slurp(d / "c.svg");
    EXPECT_EQ(svg.rfind("<svg", 0), 0u);
    size_t lines = 0;
    for (size_t at = svg.find("<polyline"); at != std::string::npos;
         at = svg.find("<polyline", at + 1))
        ++lines;
    EXPECT_EQ(lines, 2u);
    EXPECT_NE(svg.find(">dp1<"), std::string::npos);
    EXPECT_NE(svg.find(">dp4<"), std::string::npos);
    EXPECT_NE(svg.find(">loss by step<"), std::string::npos);
    // Labels of one's own, another value.
    r = run("plot " + d / "dp1.jsonl" + " --y lr --label 'one & only' --svg " + d / "lr.svg");
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_NE(slurp(d / "lr.svg").find(">one &amp; only<"), std::string::npos);
}

TEST(Plot, NamesTheFileAndLineOfBadInput) {
    Dir d("dist-plot-bad");
    std::ofstream(d / "bad.jsonl") << "{\"step\": 1, \"loss\": 2.0}\nnot json\n";
    std::ofstream(d / "ok.jsonl") << "{\"step\": 1, \"loss\": 2.0}\n";
    Result r = run("plot " + d / "bad.jsonl" + " --svg " + d / "c.svg");
    EXPECT_EQ(r.status, 1);
    EXPECT_NE(r.err.find("bad.jsonl:2: not a JSON object"), std::string::npos) << r.err;
    r = run("plot " + d / "ok.jsonl" + " --y grad_norm --svg " + d / "c.svg");
    EXPECT_EQ(r.status, 1);
    EXPECT_NE(r.err.find("has no `grad_norm` on any line"), std::string::npos) << r.err;
    r = run("plot " + d / "ok.jsonl" + " --label a --label b --svg " + d / "c.svg");
    EXPECT_EQ(r.status, 2);
    EXPECT_FALSE(fs::exists(d / "c.svg"));
}
