// safetensors_test.cpp: safetensors checkpoints: round trips, the exact bytes of a known file, a
// hand-made Hugging Face file, every malformed-file check, and the atomic-write guarantees.
#include "models/safetensors.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

using namespace dist::models;
namespace fs = std::filesystem;

namespace {

// Host bytes of `values`; the tests assume a little-endian host, as the format does.
template <typename T> std::vector<uint8_t> bytes_of(const std::vector<T>& values) {
    std::vector<uint8_t> out(values.size() * sizeof(T));
    if (!out.empty()) std::memcpy(out.data(), values.data(), out.size());
    return out;
}

// A file in the Hugging Face layout: length prefix, `header` verbatim, then `buffer`.
std::string raw_file(const std::string& header, const std::string& buffer) {
    std::string out;
    for (int i = 0; i < 8; ++i)
        out += static_cast<char>((uint64_t{header.size()} >> (8 * i)) & 0xff);
    return out + header + buffer;
}

// Like raw_file, but with a length prefix that need not match the header.
std::string raw_file_with_length(uint64_t length, const std::string& rest) {
    std::string out;
    for (int i = 0; i < 8; ++i) out += static_cast<char>((length >> (8 * i)) & 0xff);
    return out + rest;
}

void write_bytes(const fs::path& path, const std::string& bytes) {
    std::ofstream out(path, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string read_bytes(const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::vector<std::string> list_dir(const fs::path& dir) {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename());
    return names;
}

// A SafetensorsFile with content, so a test can check that a failed read empties it.
SafetensorsFile junk() {
    SafetensorsFile f;
    f.tensors.push_back({"junk", TensorDType::i32, {1}, {1, 2, 3, 4}});
    f.metadata["junk"] = "yes";
    return f;
}

void expect_same(const SafetensorsFile& a, const SafetensorsFile& b) {
    ASSERT_EQ(a.tensors.size(), b.tensors.size());
    for (size_t i = 0; i < a.tensors.size(); ++i) {
        SCOPED_TRACE(a.tensors[i].name);
        EXPECT_EQ(a.tensors[i].name, b.tensors[i].name);
        EXPECT_EQ(a.tensors[i].dtype, b.tensors[i].dtype);
        EXPECT_EQ(a.tensors[i].shape, b.tensors[i].shape);
        EXPECT_EQ(a.tensors[i].bytes, b.tensors[i].bytes);
    }
    EXPECT_EQ(a.metadata, b.metadata);
}

class SafetensorsTest : public testing::Test {
  protected:
    void SetUp() override {
        std::random_device rd;
        dir_ = fs::temp_directory_path() /
               ("dist_safetensors_test_" + std::to_string(rd()) + "_" + std::to_string(rd()));
        ASSERT_TRUE(fs::create_directory(dir_));
    }
    void TearDown() override {
        std::error_code ec;
        fs::remove_all(dir_, ec);
    }
    std::string path(const std::string& name) const { return (dir_ / name).string(); }

    fs::path dir_;
};

TEST_F(SafetensorsTest, RoundTripsDtypesShapesAndMetadata) {
    SafetensorsFile file;
    file.tensors.push_back(
        {"wte", TensorDType::f32, {3, 2}, bytes_of<float>({1, -2, 3.5f, 0, 5, 6})});
    file.tensors.push_back(
        {"ln.bias", TensorDType::bf16, {4}, bytes_of<uint16_t>({0x3f80, 0, 1, 2})});
    file.tensors.push_back({"empty", TensorDType::i32, {0, 5}, {}});
    file.tensors.push_back(
        {"h.0.attn", TensorDType::f16, {2, 1, 2}, bytes_of<uint16_t>({1, 2, 3, 4})});
    file.tensors.push_back({"step", TensorDType::i64, {}, bytes_of<int64_t>({-42})});
    file.tensors.push_back({"ids", TensorDType::i32, {3}, bytes_of<int32_t>({7, 8, 9})});
    file.metadata = {{"format", "pt"}, {"note", "caf\xc3\xa9"}};

    ASSERT_EQ(write_safetensors(path("m.safetensors"), file), "");
    SafetensorsFile back = junk();
    ASSERT_EQ(read_safetensors(path("m.safetensors"), back), "");
    expect_same(file, back);

    ASSERT_NE(back.find("step"), nullptr);
    EXPECT_EQ(back.find("step")->shape.size(), 0u);
    EXPECT_EQ(back.find("step")->bytes, bytes_of<int64_t>({-42}));
    EXPECT_EQ(back.find("missing"), nullptr);
    EXPECT_EQ(list_dir(dir_), std::vector<std::string>{"m.safetensors"});
}

TEST_F(SafetensorsTest, RoundTripsAFileWithNoTensors) {
    ASSERT_EQ(write_safetensors(path("e.safetensors"), SafetensorsFile{}), "");
    EXPECT_EQ(read_bytes(path("e.safetensors")), raw_file("{}      ", ""));
    SafetensorsFile back = junk();
    ASSERT_EQ(read_safetensors(path("e.safetensors"), back), "");
    expect_same(SafetensorsFile{}, back);
}

TEST_F(SafetensorsTest, WritesTheExactBytesOfATinyFile) {
    SafetensorsFile file;
    file.tensors.push_back({"a", TensorDType::f32, {2}, bytes_of<float>({1.0f, 2.0f})});
    ASSERT_EQ(write_safetensors(path("a.safetensors"), file), "");

    // 54 bytes of JSON, padded with two spaces to 56 = 0x38.
    const std::string expected = std::string("\x38\0\0\0\0\0\0\0", 8) +
                                 R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})"
                                 "  " +
                                 std::string("\x00\x00\x80\x3f\x00\x00\x00\x40", 8);
    EXPECT_EQ(read_bytes(path("a.safetensors")), expected);
}

TEST_F(SafetensorsTest, ReadsAHandWrittenHuggingFaceFile) {
    // Metadata first, tensors not in name order, the buffer order differing from the key order.
    std::string header = R"({"__metadata__":{"format":"pt"},)"
                         R"("b":{"dtype":"I64","shape":[2],"data_offsets":[0,16]},)"
                         R"("a":{"dtype":"BF16","shape":[1,2],"data_offsets":[16,20]}})";
    header.append((8 - header.size() % 8) % 8, ' ');
    const std::string buffer = std::string("\x07\0\0\0\0\0\0\0", 8) +
                               std::string("\xff\xff\xff\xff\xff\xff\xff\xff", 8) +
                               std::string("\x80\x3f\x00\xc0", 4);
    write_bytes(path("hf.safetensors"), raw_file(header, buffer));

    SafetensorsFile back;
    ASSERT_EQ(read_safetensors(path("hf.safetensors"), back), "");
    ASSERT_EQ(back.tensors.size(), 2u);
    EXPECT_EQ(back.tensors[0].name, "b");
    EXPECT_EQ(back.tensors[1].name, "a");
    const TensorRecord* b = back.find("b");
    ASSERT_NE(b, nullptr);
    EXPECT_EQ(b->dtype, TensorDType::i64);
    EXPECT_EQ(b->shape, std::vector<int64_t>{2});
    EXPECT_EQ(b->bytes, bytes_of<int64_t>({7, -1}));
    const TensorRecord* a = back.find("a");
    ASSERT_NE(a, nullptr);
    EXPECT_EQ(a->dtype, TensorDType::bf16);
    EXPECT_EQ(a->shape, (std::vector<int64_t>{1, 2}));
    EXPECT_EQ(a->bytes, bytes_of<uint16_t>({0x3f80, 0xc000}));
    EXPECT_EQ(back.metadata, (std::map<std::string, std::string>{{"format", "pt"}}));
}

TEST_F(SafetensorsTest, MissingFileIsAnError) {
    SafetensorsFile out = junk();
    const std::string err = read_safetensors(path("nope.safetensors"), out);
    EXPECT_NE(err.find("cannot open"), std::string::npos) << err;
    EXPECT_NE(err.find("nope.safetensors"), std::string::npos) << err;
    EXPECT_TRUE(out.tensors.empty() && out.metadata.empty());
}

// One malformed file: its bytes, a phrase the error must contain, and the tensor it must name.
struct BadFile {
    std::string name;
    std::string bytes;
    std::string phrase;
    std::string tensor;
};

std::string f32_entry(const std::string& name, const std::string& shape,
                      const std::string& offsets) {
    return "\"" + name + R"(":{"dtype":"F32","shape":)" + shape + R"(,"data_offsets":)" + offsets +
           "}";
}

std::vector<BadFile> bad_files() {
    const std::string four(4, '\0'), eight(8, '\0'), twelve(12, '\0');
    const auto one = [](const std::string& entry) { return "{" + entry + "}"; };
    return {
        {"TooShort", "abc", "shorter than the 8-byte header length", ""},
        {"HeaderLongerThanFile", raw_file_with_length(100, "{}"), "is larger than the 2 bytes", ""},
        {"HeaderOverLimit", raw_file_with_length(200'000'000, "{}"), "exceeds the limit", ""},
        {"NotJson", raw_file("{not json", ""), "header is not valid JSON", ""},
        {"InvalidUtf8", raw_file("{\"\xff\":1}", ""), "header is not valid JSON", ""},
        {"NotObject", raw_file("[1,2]", ""), "header is not a JSON object", ""},
        {"EntryNotObject", raw_file(R"({"a":3})", ""), "header entry is not a JSON object", "a"},
        {"MissingDtype", raw_file(R"({"a":{"shape":[1],"data_offsets":[0,4]}})", four),
         "missing \"dtype\"", "a"},
        {"MissingShape", raw_file(R"({"a":{"dtype":"F32","data_offsets":[0,4]}})", four),
         "missing \"shape\"", "a"},
        {"MissingOffsets", raw_file(R"({"a":{"dtype":"F32","shape":[1]}})", four),
         "missing \"data_offsets\"", "a"},
        {"DtypeNotString", raw_file(R"({"a":{"dtype":4,"shape":[1],"data_offsets":[0,4]}})", four),
         "\"dtype\" is not a string", "a"},
        {"ShapeNotArray", raw_file(one(f32_entry("a", "\"1\"", "[0,4]")), four),
         "\"shape\" is not an array of integers", "a"},
        {"ShapeFloat", raw_file(one(f32_entry("a", "[1.5]", "[0,4]")), four),
         "\"shape\" is not an array of integers", "a"},
        {"OffsetsThree", raw_file(one(f32_entry("a", "[1]", "[0,4,4]")), four),
         "not an array of two non-negative integers", "a"},
        {"OffsetsNegative", raw_file(one(f32_entry("a", "[1]", "[-1,4]")), four),
         "not an array of two non-negative integers", "a"},
        {"OffsetsStrings", raw_file(one(f32_entry("a", "[1]", R"(["0","4"])")), four),
         "not an array of two non-negative integers", "a"},
        {"UnknownDtype",
         raw_file(R"({"a":{"dtype":"Q4_K","shape":[1],"data_offsets":[0,8]}})", eight),
         "unknown dtype 'Q4_K'", "a"},
        {"NegativeDim", raw_file(one(f32_entry("a", "[-2]", "[0,4]")), four),
         "negative dimension -2", "a"},
        {"NumelOverflow", raw_file(one(f32_entry("a", "[4294967296,4294967296]", "[0,4]")), four),
         "overflows", "a"},
        {"ByteCountOverflow", raw_file(one(f32_entry("a", "[4611686018427387904]", "[0,4]")), four),
         "overflows", "a"},
        {"DimTooLarge", raw_file(one(f32_entry("a", "[18446744073709551615]", "[0,4]")), four),
         "too large", "a"},
        {"BeginAfterEnd", raw_file(one(f32_entry("a", "[1]", "[4,0]")), four),
         "has begin after end", "a"},
        {"OffsetsOutsideBuffer", raw_file(one(f32_entry("a", "[2]", "[0,8]")), four),
         "lie outside the 4-byte buffer", "a"},
        {"ByteCountMismatch", raw_file(one(f32_entry("a", "[2]", "[0,4]")), four),
         "hold 4 bytes but shape [2] of F32 needs 8", "a"},
        {"Overlap",
         raw_file("{" + f32_entry("a", "[2]", "[0,8]") + "," + f32_entry("b", "[2]", "[4,12]") +
                      "}",
                  twelve),
         "overlaps", "b"},
        {"Hole",
         raw_file("{" + f32_entry("a", "[1]", "[0,4]") + "," + f32_entry("b", "[1]", "[8,12]") +
                      "}",
                  twelve),
         "hole of 4 bytes", "b"},
        {"HoleAtStart", raw_file(one(f32_entry("a", "[1]", "[4,8]")), eight), "hole of 4 bytes",
         "a"},
        {"TrailingBytes", raw_file(one(f32_entry("a", "[1]", "[0,4]")), eight), "4 trailing bytes",
         ""},
        {"TrailingBytesNoTensors", raw_file("{}", "xyz"), "3 trailing bytes", ""},
        {"DuplicateName",
         raw_file("{" + f32_entry("a", "[1]", "[0,4]") + "," + f32_entry("a", "[1]", "[4,8]") + "}",
                  eight),
         "duplicate name 'a'", ""},
        {"MetadataNotObject", raw_file(R"({"__metadata__":[1]})", ""),
         "\"__metadata__\" is not a JSON object", ""},
        {"MetadataValueNotString", raw_file(R"({"__metadata__":{"k":1}})", ""),
         "value of 'k' is not a string", ""},
    };
}

class SafetensorsBadFile : public SafetensorsTest, public testing::WithParamInterface<BadFile> {};

TEST_P(SafetensorsBadFile, IsRefusedWithAClearMessage) {
    const BadFile& bad = GetParam();
    const std::string file = path(bad.name + ".safetensors");
    write_bytes(file, bad.bytes);
    SafetensorsFile out = junk();
    const std::string err = read_safetensors(file, out);
    EXPECT_NE(err.find(bad.phrase), std::string::npos) << err;
    EXPECT_NE(err.find(file), std::string::npos) << err;
    if (!bad.tensor.empty()) {
        EXPECT_NE(err.find("tensor '" + bad.tensor + "'"), std::string::npos) << err;
    }
    EXPECT_TRUE(out.tensors.empty());
    EXPECT_TRUE(out.metadata.empty());
}

INSTANTIATE_TEST_SUITE_P(Malformed, SafetensorsBadFile, testing::ValuesIn(bad_files()),
                         [](const testing::TestParamInfo<BadFile>& info) {
                             return info.param.name;
                         });

TEST_F(SafetensorsTest, WriteToAMissingFolderFailsAndLeavesNothing) {
    SafetensorsFile file;
    file.tensors.push_back({"a", TensorDType::f32, {1}, bytes_of<float>({1})});
    const std::string err = write_safetensors(path("missing/x.safetensors"), file);
    EXPECT_NE(err.find("cannot create a temporary file"), std::string::npos) << err;
    EXPECT_NE(err.find("x.safetensors"), std::string::npos) << err;
    EXPECT_FALSE(fs::exists(dir_ / "missing"));
    EXPECT_TRUE(list_dir(dir_).empty());
}

TEST_F(SafetensorsTest, FailedRenameLeavesNoTemporary) {
    fs::create_directory(dir_ / "sub");
    SafetensorsFile file;
    file.tensors.push_back({"a", TensorDType::f32, {1}, bytes_of<float>({1})});
    const std::string err = write_safetensors(path("sub"), file);
    EXPECT_NE(err.find("cannot replace the file"), std::string::npos) << err;
    EXPECT_EQ(list_dir(dir_), std::vector<std::string>{"sub"});
    EXPECT_TRUE(fs::is_empty(dir_ / "sub"));
}

TEST_F(SafetensorsTest, OverwriteReplacesTheWholeFile) {
    SafetensorsFile big;
    big.tensors.push_back({"w", TensorDType::f32, {1000}, bytes_of(std::vector<float>(1000, 3))});
    big.metadata["kind"] = "big";
    ASSERT_EQ(write_safetensors(path("ckpt.safetensors"), big), "");

    SafetensorsFile small;
    small.tensors.push_back({"a", TensorDType::f32, {2}, bytes_of<float>({1.0f, 2.0f})});
    ASSERT_EQ(write_safetensors(path("ckpt.safetensors"), small), "");

    EXPECT_EQ(fs::file_size(dir_ / "ckpt.safetensors"), 8u + 56u + 8u);
    SafetensorsFile back;
    ASSERT_EQ(read_safetensors(path("ckpt.safetensors"), back), "");
    expect_same(small, back);
    EXPECT_EQ(list_dir(dir_), std::vector<std::string>{"ckpt.safetensors"});
}

TEST_F(SafetensorsTest, InvalidInputIsRefusedAndTheOldFileKept) {
    SafetensorsFile good;
    good.tensors.push_back({"a", TensorDType::f32, {2}, bytes_of<float>({1.0f, 2.0f})});
    ASSERT_EQ(write_safetensors(path("ckpt.safetensors"), good), "");
    const std::string before = read_bytes(path("ckpt.safetensors"));

    const auto refused = [&](SafetensorsFile bad, const std::string& phrase) {
        const std::string err = write_safetensors(path("ckpt.safetensors"), bad);
        EXPECT_NE(err.find(phrase), std::string::npos) << err;
        EXPECT_EQ(read_bytes(path("ckpt.safetensors")), before);
        EXPECT_EQ(list_dir(dir_), std::vector<std::string>{"ckpt.safetensors"});
    };
    SafetensorsFile dup = good;
    dup.tensors.push_back(good.tensors[0]);
    refused(dup, "tensor 'a': duplicate name");
    SafetensorsFile short_bytes = good;
    short_bytes.tensors[0].bytes.pop_back();
    refused(short_bytes, "holds 7 bytes but shape [2] of F32 needs 8");
    SafetensorsFile negative = good;
    negative.tensors[0].shape = {-2};
    refused(negative, "negative dimension -2");
    SafetensorsFile reserved = good;
    reserved.tensors[0].name = "__metadata__";
    refused(reserved, "reserved for metadata");
    SafetensorsFile bad_utf8 = good;
    bad_utf8.tensors[0].name = "\xff";
    refused(bad_utf8, "not valid UTF-8");
}

TEST(TensorDType, BytesAndNames) {
    EXPECT_EQ(dtype_bytes(TensorDType::f32), 4u);
    EXPECT_EQ(dtype_bytes(TensorDType::bf16), 2u);
    EXPECT_EQ(dtype_bytes(TensorDType::f16), 2u);
    EXPECT_EQ(dtype_bytes(TensorDType::i32), 4u);
    EXPECT_EQ(dtype_bytes(TensorDType::i64), 8u);
    EXPECT_EQ(dtype_bytes(TensorDType::f64), 8u);
    EXPECT_EQ(dtype_bytes(TensorDType::f8_e5m2), 1u);
    EXPECT_EQ(dtype_bytes(TensorDType::u16), 2u);
    EXPECT_EQ(dtype_bytes(TensorDType::boolean), 1u);
    EXPECT_STREQ(to_string(TensorDType::bf16), "BF16");
    EXPECT_STREQ(to_string(TensorDType::f8_e4m3), "F8_E4M3");
    EXPECT_STREQ(to_string(TensorDType::boolean), "BOOL");
}

// Files from other tools carry more than weights: GPT-2 folders, for one, hold attention masks as
// BOOL or U8 buffers. Every type the format names reads back as itself, with its element size.
TEST_F(SafetensorsTest, EveryTypeOfTheFormatIsRead) {
    const std::pair<const char*, size_t> types[] = {
        {"F64", 8},     {"F32", 4}, {"BF16", 2}, {"F16", 2}, {"F8_E4M3", 1},
        {"F8_E5M2", 1}, {"I64", 8}, {"I32", 4},  {"I16", 2}, {"I8", 1},
        {"U64", 8},     {"U32", 4}, {"U16", 2},  {"U8", 1},  {"BOOL", 1}};
    for (const auto& [name, size] : types) {
        const std::string end = std::to_string(3 * size);
        write_bytes(path("t.safetensors"),
                    raw_file(R"({"t":{"dtype":")" + std::string(name) +
                                 R"(","shape":[3],"data_offsets":[0,)" + end + "]}}",
                             std::string(3 * size, '\x01')));
        SafetensorsFile f;
        ASSERT_EQ(read_safetensors(path("t.safetensors"), f), "") << name;
        ASSERT_EQ(f.tensors.size(), 1u);
        EXPECT_STREQ(to_string(f.tensors[0].dtype), name);
        EXPECT_EQ(dtype_bytes(f.tensors[0].dtype), size) << name;
        EXPECT_EQ(f.tensors[0].bytes.size(), 3 * size);
    }
}

} // namespace
