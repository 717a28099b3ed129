// data.cpp: loading token files, writing llm.c .bin files atomically, and cutting batches and
// evaluation windows from the stream.
//
// Every integer in a .bin is decoded byte by byte as little-endian, so the files read the same
// on any host. Loaders fill a local TokenData and move it into `out` only on success.
#include "models/data.hpp"

#include "models/atomic_file.hpp"

#include <algorithm>
#include <cassert>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include <sys/stat.h>

namespace fs = std::filesystem;

namespace dist::models {

namespace {

constexpr int32_t bin_magic = 20240520;
constexpr int32_t bin_version = 1;
constexpr int64_t header_ints = 256;
constexpr int64_t header_bytes = header_ints * 4;

// splitmix64's finaliser, with its golden-ratio increment: a bijection of 64-bit words.
uint64_t mix64(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// The full 128-bit product a*b as (hi, lo), from 32-bit halves so it needs no compiler extension.
void mul128(uint64_t a, uint64_t b, uint64_t& hi, uint64_t& lo) {
    const uint64_t mask = 0xffffffffull;
    uint64_t p0 = (a & mask) * (b & mask);
    uint64_t p1 = (a & mask) * (b >> 32);
    uint64_t p2 = (a >> 32) * (b & mask);
    uint64_t p3 = (a >> 32) * (b >> 32);
    uint64_t mid = (p0 >> 32) + (p1 & mask) + (p2 & mask);
    lo = (mid << 32) | (p0 & mask);
    hi = p3 + (p1 >> 32) + (p2 >> 32) + (mid >> 32);
}

// A draw uniform over [0, n) for n >= 1, by Lemire's multiply-and-reject: exact, and a function
// of `h` alone (a rejected draw is replaced by mix64 of it, with probability below n / 2^64).
uint64_t uniform_below(uint64_t h, uint64_t n) {
    uint64_t hi = 0, lo = 0;
    mul128(h, n, hi, lo);
    if (lo < n) {
        uint64_t threshold = (0 - n) % n;
        while (lo < threshold) {
            h = mix64(h);
            mul128(h, n, hi, lo);
        }
    }
    return hi;
}

int32_t read_le32(const unsigned char* p) {
    uint32_t v = uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
    return static_cast<int32_t>(v);
}

void write_le32(int32_t value, unsigned char* p) {
    uint32_t v = static_cast<uint32_t>(value);
    for (int i = 0; i < 4; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}

std::string quoted(const std::string& path) {
    return "`" + path + "`: ";
}

// Checks that `path` names a regular file and gives its size in bytes.
std::string regular_file_size(const std::string& path, int64_t& bytes) {
    std::error_code ec;
    fs::file_status st = fs::status(path, ec);
    if (!fs::exists(st)) return quoted(path) + "no such file";
    if (fs::is_directory(st)) return quoted(path) + "is a directory, not a file";
    if (!fs::is_regular_file(st)) return quoted(path) + "is not a regular file";
    uintmax_t n = fs::file_size(path, ec);
    if (ec) return quoted(path) + "cannot read its size: " + ec.message();
    bytes = static_cast<int64_t>(n);
    return "";
}

// Reads exactly `n` bytes that begin at byte `offset` of the file.
std::string read_exactly(std::ifstream& in, const std::string& path, int64_t offset, int64_t n,
                         unsigned char* data) {
    in.read(reinterpret_cast<char*>(data), static_cast<std::streamsize>(n));
    if (in.gcount() != n) {
        return quoted(path) + "byte " + std::to_string(offset + in.gcount()) +
               ": read failed (the file changed while it was read?)";
    }
    return "";
}

std::string too_few(const std::string& path, int64_t count, int64_t min_tokens) {
    return quoted(path) + "has " + std::to_string(count) + " tokens, fewer than the " +
           std::to_string(min_tokens) + " that one step needs (T+1)";
}

} // namespace

std::string TokenData::from_tokens(const std::vector<uint16_t>& tokens, TokenData& out) {
    if (tokens.empty()) return "no tokens";
    out.tokens_.assign(tokens.begin(), tokens.end());
    return {};
}

uint64_t hash64(uint64_t a, uint64_t b, uint64_t c) {
    return mix64(a ^ mix64(b ^ mix64(c)));
}

std::string TokenData::load_text(const std::string& path, int64_t min_tokens, TokenData& out) {
    int64_t bytes = 0;
    if (std::string err = regular_file_size(path, bytes); !err.empty()) return err;
    std::ifstream in(path, std::ios::binary);
    if (!in) return quoted(path) + "cannot open: " + std::strerror(errno);
    if (bytes == 0) return quoted(path) + "is empty: a text file needs at least one byte";
    if (bytes < min_tokens) return too_few(path, bytes, min_tokens);
    std::vector<unsigned char> data(static_cast<size_t>(bytes));
    if (std::string err = read_exactly(in, path, 0, bytes, data.data()); !err.empty()) return err;
    TokenData result;
    result.tokens_.assign(data.begin(), data.end());
    out = std::move(result);
    return "";
}

std::string TokenData::load_bin(const std::string& path, int32_t vocab, int64_t min_tokens,
                                TokenData& out) {
    if (vocab < 1 || vocab > 65536) {
        return quoted(path) + "vocabulary size " + std::to_string(vocab) +
               " is outside 1..65536 (a .bin holds uint16 tokens)";
    }
    int64_t bytes = 0;
    if (std::string err = regular_file_size(path, bytes); !err.empty()) return err;
    std::ifstream in(path, std::ios::binary);
    if (!in) return quoted(path) + "cannot open: " + std::strerror(errno);

    unsigned char header[header_bytes] = {};
    int64_t head = std::min(bytes, header_bytes);
    if (std::string err = read_exactly(in, path, 0, head, header); !err.empty()) return err;
    // The magic is checked before the length, so that a text file passed by mistake is named as
    // such even when it is short.
    if (head >= 4 && read_le32(header) != bin_magic) {
        int32_t found = read_le32(header);
        char hex[16];
        std::snprintf(hex, sizeof hex, "0x%08x", static_cast<uint32_t>(found));
        return quoted(path) + "byte 0: magic number is " + std::to_string(found) + " (" + hex +
               "), expected " + std::to_string(bin_magic) + ": this is not an llm.c token file";
    }
    if (bytes < header_bytes) {
        return quoted(path) + "the file is " + std::to_string(bytes) + " bytes, shorter than the " +
               std::to_string(header_bytes) + "-byte header of an llm.c token file";
    }
    int32_t version = read_le32(header + 4);
    if (version != bin_version) {
        return quoted(path) + "byte 4: version " + std::to_string(version) +
               " is not supported (only version 1, uint16 tokens)";
    }
    int64_t count = read_le32(header + 8);
    if (count < 0) return quoted(path) + "byte 8: negative token count " + std::to_string(count);
    int64_t expected = header_bytes + 2 * count;
    if (bytes != expected) {
        std::string what = bytes < expected
                               ? "truncated: " + std::to_string(expected - bytes) + " bytes missing"
                               : std::to_string(bytes - expected) + " trailing bytes";
        return quoted(path) + "byte 8: the header says " + std::to_string(count) + " tokens (" +
               std::to_string(expected) + " bytes with the header) but the file is " +
               std::to_string(bytes) + " bytes: " + what;
    }
    if (count == 0) return quoted(path) + "holds no tokens";
    if (count < min_tokens) return too_few(path, count, min_tokens);

    TokenData result;
    result.tokens_.resize(static_cast<size_t>(count));
    const int64_t chunk = int64_t(1) << 20;
    std::vector<unsigned char> buf(static_cast<size_t>(2 * std::min(chunk, count)));
    for (int64_t first = 0; first < count; first += chunk) {
        int64_t n = std::min(chunk, count - first);
        int64_t offset = header_bytes + 2 * first;
        if (std::string err = read_exactly(in, path, offset, 2 * n, buf.data()); !err.empty())
            return err;
        for (int64_t i = 0; i < n; ++i) {
            int32_t token = int32_t(buf[2 * i]) | int32_t(buf[2 * i + 1]) << 8;
            if (token >= vocab) {
                return quoted(path) + "byte " + std::to_string(offset + 2 * i) + ": token " +
                       std::to_string(first + i) + " is " + std::to_string(token) +
                       ", not below the vocabulary size " + std::to_string(vocab);
            }
            result.tokens_[static_cast<size_t>(first + i)] = token;
        }
    }
    out = std::move(result);
    return "";
}

std::string TokenData::write_bin(const std::string& path, const std::vector<uint16_t>& tokens) {
    if (tokens.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
        return quoted(path) + std::to_string(tokens.size()) +
               " tokens do not fit the int32 count of an llm.c header";
    }
    std::vector<unsigned char> data(static_cast<size_t>(header_bytes) + 2 * tokens.size(), 0);
    write_le32(bin_magic, data.data());
    write_le32(bin_version, data.data() + 4);
    write_le32(static_cast<int32_t>(tokens.size()), data.data() + 8);
    for (size_t i = 0; i < tokens.size(); ++i) {
        data[header_bytes + 2 * i] = static_cast<unsigned char>(tokens[i] & 0xff);
        data[header_bytes + 2 * i + 1] = static_cast<unsigned char>(tokens[i] >> 8);
    }

    std::string e = write_file_atomically(
        path, {std::string_view(reinterpret_cast<const char*>(data.data()), data.size())});
    return e;
}

void TokenData::batch(uint64_t seed, int64_t step, int64_t B, int64_t T, int64_t dp_rank,
                      int64_t dp, int32_t* inputs, int32_t* targets) const {
    assert(B >= 1 && T >= 1 && dp >= 1 && B % dp == 0 && dp_rank >= 0 && dp_rank < dp);
    assert(size() >= T + 1);
    const int64_t rows = B / dp;
    const uint64_t offsets = static_cast<uint64_t>(size() - T);
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t b = dp_rank * rows + r;
        uint64_t h = hash64(seed, static_cast<uint64_t>(step), static_cast<uint64_t>(b));
        const int32_t* window = tokens_.data() + uniform_below(h, offsets);
        std::memcpy(inputs + r * T, window, static_cast<size_t>(T) * sizeof(int32_t));
        std::memcpy(targets + r * T, window + 1, static_cast<size_t>(T) * sizeof(int32_t));
    }
}

int64_t TokenData::eval_windows(int64_t T) const {
    assert(T >= 1);
    return size() / (T + 1);
}

void TokenData::eval_window(int64_t w, int64_t T, int32_t* inputs, int32_t* targets) const {
    assert(w >= 0 && w < eval_windows(T));
    const int32_t* window = tokens_.data() + w * (T + 1);
    std::memcpy(inputs, window, static_cast<size_t>(T) * sizeof(int32_t));
    std::memcpy(targets, window + 1, static_cast<size_t>(T) * sizeof(int32_t));
}

} // namespace dist::models
