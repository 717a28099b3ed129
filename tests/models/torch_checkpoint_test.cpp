// torch_checkpoint_test.cpp: GPT-2 checkpoints written by PyTorch's torch.save (fixtures made by
// scripts/torch-reference.py with Debian's python3-torch) load through `--load`'s code and
// evaluate to the loss PyTorch computed; the reader refuses damaged and hostile files by name.
#include "model_fixtures.hpp"

#include "kernels/tensor.hpp"
#include "models/checkpoint.hpp"
#include "models/data.hpp"
#include "models/torch_checkpoint.hpp"
#include "models/trainer.hpp"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <fstream>

namespace fs = std::filesystem;
using namespace dist;
using namespace dist::models;

namespace {

const fs::path fixtures_dir = fs::path(DIST_SOURCE_DIR) / "tests/fixtures";

std::string read_bytes(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_bytes(const fs::path& p, const std::string& bytes) {
    std::ofstream(p, std::ios::binary)
        .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

fs::path scratch(const std::string& name) {
    fs::path dir = fs::temp_directory_path() /
                   ("dist_torch_" + std::to_string(::getpid()) + "_" +
                    ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir);
    return dir / name;
}

// `dist eval`'s computation on a folder: load, then the windowed mean loss over the text the
// reference used; the loss must be PyTorch's (computed in float64) to f32 accuracy.
void expect_reference_loss(const fs::path& folder) {
    nlohmann::json expected;
    std::ifstream(folder / "reference.json") >> expected;
    Model model(fixtures::spec_of("gpt(vocab: 256, context: 64, layers: 2, heads: 2, width: 64)"),
                1);
    ASSERT_EQ(load_weights(folder.string(), model), "");
    TokenData data;
    const fs::path text = fs::path(DIST_SOURCE_DIR) / expected["text"].get<std::string>();
    ASSERT_EQ(TokenData::load_text(text.string(), 65, data), "");
    EvalResult r = evaluate(model, data);
    EXPECT_EQ(r.tokens, expected["tokens"].get<int64_t>());
    // Replacing any single tensor of the fixture with a transposed or reversed copy moves the
    // loss by 7e-4 or more (most by 1e-2 to 0.5); f32 evaluation agrees to about 1e-6.
    EXPECT_NEAR(r.loss, expected["loss"].get<double>(), 1e-5 * expected["loss"].get<double>());
}

float element(const TensorRecord& r, size_t i) {
    if (r.dtype == TensorDType::f32) {
        float f;
        std::memcpy(&f, r.bytes.data() + 4 * i, 4);
        return f;
    }
    uint16_t h;
    std::memcpy(&h, r.bytes.data() + 2 * i, 2);
    return kernels::f16_to_f32(h);
}

// ---- Hand-made archives: a ZIP writer (stored entries) and pickle building blocks ------------

uint32_t crc_of(const std::string& s) {
    uint32_t c = ~0u;
    for (unsigned char b : s) {
        c ^= b;
        for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
    }
    return ~c;
}

std::string le_bytes(uint64_t v, int n) {
    std::string s;
    for (int i = 0; i < n; ++i) s += static_cast<char>((v >> (8 * i)) & 0xff);
    return s;
}

// A ZIP archive of `entries` (name, bytes), stored; `method` is written into every header.
std::string zip_of(const std::vector<std::pair<std::string, std::string>>& entries,
                   uint16_t method = 0) {
    std::string body, dir;
    for (const auto& [name, data] : entries) {
        const uint64_t offset = body.size();
        const std::string common = le_bytes(20, 2) + le_bytes(0, 2) + le_bytes(method, 2) +
                                   le_bytes(0, 4) + le_bytes(crc_of(data), 4) +
                                   le_bytes(data.size(), 4) + le_bytes(data.size(), 4) +
                                   le_bytes(name.size(), 2) + le_bytes(0, 2);
        body += le_bytes(0x04034b50, 4) + common + name + data;
        dir += le_bytes(0x02014b50, 4) + le_bytes(20, 2) + common + le_bytes(0, 2) +
               le_bytes(0, 2) + le_bytes(0, 2) + le_bytes(0, 4) + le_bytes(offset, 4) + name;
    }
    return body + dir + le_bytes(0x06054b50, 4) + le_bytes(0, 4) + le_bytes(entries.size(), 2) +
           le_bytes(entries.size(), 2) + le_bytes(dir.size(), 4) + le_bytes(body.size(), 4) +
           le_bytes(0, 2);
}

std::string str(const std::string& s) {
    return "X" + le_bytes(s.size(), 4) + s;
}
std::string small(int v) {
    return "K" + std::string(1, static_cast<char>(v));
}
const std::string proto = "\x80\x02";

// An integer of any size (LONG1 with 8 bytes, as pickle writes large ones).
std::string long8(uint64_t v) {
    return "\x8a\x08" + le_bytes(v, 8);
}

// A tensor of `numel` elements with `stride` at `offset` into storage "0" (of
// `storage_numel` elements of the storage class `type`).
std::string tensor_pickle(uint64_t numel, uint64_t offset, uint64_t storage_numel,
                          uint64_t stride = 1, const std::string& type = "FloatStorage") {
    return "ctorch._utils\n_rebuild_tensor_v2\n((" + str("storage") + "ctorch\n" + type + "\n" +
           str("0") + str("cpu") + long8(storage_numel) + "tQ" + long8(offset) + long8(numel) +
           "\x85" + long8(stride) + "\x85" + "\x89" + "ccollections\nOrderedDict\n)RtR";
}

// A one-tensor state dict {"w": tensor} with a storage of `storage_bytes`.
std::string state_dict_archive(const std::string& tensor, const std::string& storage_bytes) {
    return zip_of({{"m/data.pkl", proto + "}(" + str("w") + tensor + "u."},
                   {"m/byteorder", "little"},
                   {"m/data/0", storage_bytes}});
}

// Reads `bytes` as a checkpoint; the error, "" when it reads.
std::string read_as_checkpoint(const std::string& bytes, SafetensorsFile* out = nullptr) {
    const fs::path p = scratch("t.bin");
    write_bytes(p, bytes);
    SafetensorsFile f;
    std::string e = read_torch_checkpoint(p.string(), f);
    if (!e.empty()) {
        EXPECT_TRUE(f.tensors.empty()) << "a failed read leaves its output empty";
    }
    if (out) *out = std::move(f);
    return e;
}

} // namespace

TEST(TorchCheckpoint, Gpt2SavedByTorchEvaluatesToItsOwnLoss) {
    expect_reference_loss(fixtures_dir / "torch_gpt2_tiny");
}

TEST(TorchCheckpoint, ShardedHalfPrecisionGpt2EvaluatesToItsOwnLoss) {
    expect_reference_loss(fixtures_dir / "torch_gpt2_tiny_sharded_f16");
}

// What the reader makes of torch.save's output, checked against what the script saved: the
// state dict's names and shapes, a BOOL causal-mask buffer, a 0-d scalar, and the tied head.
TEST(TorchCheckpoint, ReadsTheStateDictAsPyTorchSavedIt) {
    SafetensorsFile f;
    ASSERT_EQ(
        read_torch_checkpoint((fixtures_dir / "torch_gpt2_tiny/pytorch_model.bin").string(), f),
        "");
    // 2 embeddings, 2 x 14 per block (12 parameters and 2 buffers), ln_f's 2, the head.
    EXPECT_EQ(f.tensors.size(), 2u + 2 * 14 + 2 + 1);
    const TensorRecord* w = f.find("transformer.h.1.attn.c_attn.weight");
    ASSERT_NE(w, nullptr);
    EXPECT_EQ(w->dtype, TensorDType::f32);
    EXPECT_EQ(w->shape, (std::vector<int64_t>{64, 192})); // Conv1D: [in, out]
    const TensorRecord* mask = f.find("transformer.h.0.attn.bias");
    ASSERT_NE(mask, nullptr);
    EXPECT_EQ(mask->dtype, TensorDType::boolean);
    ASSERT_EQ(mask->shape, (std::vector<int64_t>{1, 1, 64, 64}));
    for (size_t i = 0; i < 64; ++i)
        for (size_t j = 0; j < 64; ++j)
            ASSERT_EQ(mask->bytes[i * 64 + j], j <= i ? 1 : 0) << i << "," << j;
    const TensorRecord* masked = f.find("transformer.h.0.attn.masked_bias");
    ASSERT_NE(masked, nullptr);
    EXPECT_TRUE(masked->shape.empty());
    EXPECT_EQ(element(*masked, 0), -1e4f);
    const TensorRecord* wte = f.find("transformer.wte.weight");
    const TensorRecord* head = f.find("lm_head.weight");
    ASSERT_TRUE(wte && head);
    EXPECT_EQ(wte->bytes, head->bytes); // one storage, saved once, read for both names
}

// The half-precision shards hold c_attn.weight as a transposed view (strides (1, 64)) and
// c_fc.bias at an offset into a larger storage: gathered, they equal the f32 originals rounded
// to half precision.
TEST(TorchCheckpoint, GathersStridedAndOffsetViews) {
    SafetensorsFile f32, f16;
    ASSERT_EQ(
        read_torch_checkpoint((fixtures_dir / "torch_gpt2_tiny/pytorch_model.bin").string(), f32),
        "");
    const fs::path shards = fixtures_dir / "torch_gpt2_tiny_sharded_f16";
    for (const char* shard :
         {"pytorch_model-00001-of-00002.bin", "pytorch_model-00002-of-00002.bin"}) {
        SafetensorsFile part;
        ASSERT_EQ(read_torch_checkpoint((shards / shard).string(), part), "");
        for (auto& t : part.tensors) f16.tensors.push_back(std::move(t));
    }
    for (const char* name : {"transformer.h.0.attn.c_attn.weight", "transformer.h.1.mlp.c_fc.bias",
                             "transformer.h.1.ln_2.weight"}) {
        const TensorRecord* a = f32.find(name);
        const TensorRecord* b = f16.find(name);
        ASSERT_TRUE(a && b) << name;
        EXPECT_EQ(b->dtype, TensorDType::f16);
        ASSERT_EQ(a->shape, b->shape) << name;
        const size_t n = a->bytes.size() / 4;
        for (size_t i = 0; i < n; ++i)
            ASSERT_NEAR(element(*b, i), element(*a, i), std::abs(element(*a, i)) / 1024 + 1e-7f)
                << name << " element " << i;
    }
}

TEST(TorchCheckpoint, ReadsAHandMadeStateDict) {
    std::string storage;
    for (float v : {1.f, 2.f, 3.f, 4.f, 5.f})
        storage += std::string(reinterpret_cast<char*>(&v), 4);
    SafetensorsFile f;
    ASSERT_EQ(read_as_checkpoint(state_dict_archive(tensor_pickle(3, 2, 5), storage), &f), "");
    ASSERT_EQ(f.tensors.size(), 1u);
    EXPECT_EQ(f.tensors[0].name, "w");
    EXPECT_EQ(f.tensors[0].shape, std::vector<int64_t>{3});
    EXPECT_EQ(element(f.tensors[0], 0), 3.f);
    EXPECT_EQ(element(f.tensors[0], 2), 5.f);
}

TEST(TorchCheckpoint, RefusesDamagedAndHostileFiles) {
    const std::string twenty(20, '\0');
    struct Case {
        const char* what;
        std::string bytes;
        const char* error;
    };
    const std::string good_pickle = proto + "}(" + str("w") + tensor_pickle(5, 0, 5) + "u.";
    const Case cases[] = {
        {"empty", "", "too short"},
        {"text", "hello, world\n", "neither a ZIP archive nor a PyTorch file"},
        {"legacy", proto + "\x8a\x0a" + std::string(10, '\x01') + ".", "legacy format"},
        {"compressed", zip_of({{"m/data.pkl", good_pickle}, {"m/data/0", twenty}}, 8),
         "is compressed (method 8)"},
        {"no pickle", zip_of({{"m/data/0", twenty}}), "no data.pkl"},
        {"calls os.system", state_dict_archive("cos\nsystem\n(" + str("rm -rf /") + "tR", twenty),
         "names `os.system`"},
        {"stack global builtins.eval",
         zip_of({{"m/data.pkl", proto + str("builtins") + str("eval") + "\x93."}}),
         "names `builtins.eval`"},
        {"not a dict", zip_of({{"m/data.pkl", proto + small(7) + "."}}), "holds an int"},
        {"a dict without tensors",
         zip_of({{"m/data.pkl", proto + "}" + str("a") + small(1) + "s."}}), "holds no tensors"},
        {"ends mid-instruction", zip_of({{"m/data.pkl", proto + "X" + le_bytes(255, 4) + "ab"}}),
         "ends in the middle of an instruction"},
        {"unknown instruction", zip_of({{"m/data.pkl", proto + "\xfe."}}), "instruction 0xfe"},
        {"reads an unwritten memo", zip_of({{"m/data.pkl", proto + "h\x05."}}), "memo slot 5"},
        {"pops an empty stack", zip_of({{"m/data.pkl", proto + "R."}}), "stack does not hold"},
        {"past its storage", state_dict_archive(tensor_pickle(5, 3, 5), twenty),
         "reaches element 7"},
        {"storage smaller than promised",
         state_dict_archive(tensor_pickle(5, 0, 5), std::string(12, '\0')), "holds 12 bytes"},
        // 8 x (2^61 + 1) wraps around to the 8 bytes there are.
        {"element count that wraps",
         state_dict_archive(tensor_pickle(1 << 20, 0, (uint64_t{1} << 61) + 1, 1, "DoubleStorage"),
                            std::string(8, '\0')),
         "holds 8 bytes"},
        // (5 - 1) x 2^62 wraps around to 0, inside the storage.
        {"extent that wraps", state_dict_archive(tensor_pickle(5, 0, 5, uint64_t{1} << 62), twenty),
         "overflow"},
        {"rebuild wrapping itself",
         state_dict_archive("ctorch._tensor\n_rebuild_from_type_v2\n(ctorch._tensor\n"
                            "_rebuild_from_type_v2\nctorch\nTensor\n)tR",
                            twenty),
         "wraps itself"},
        {"missing storage", zip_of({{"m/data.pkl", good_pickle}}), "no entry `m/data/0`"},
        {"big-endian",
         zip_of({{"m/data.pkl", good_pickle}, {"m/byteorder", "big"}, {"m/data/0", twenty}}),
         "byte order is `big`"},
    };
    for (const Case& c : cases) {
        const std::string e = read_as_checkpoint(c.bytes);
        EXPECT_NE(e.find(c.error), std::string::npos) << c.what << ": " << e;
        EXPECT_NE(e.find("t.bin"), std::string::npos) << c.what << ": the file is named: " << e;
    }
}

TEST(TorchCheckpoint, SurvivesNestingAndCycles) {
    // 200,000 nested one-tuples, and a list that contains itself: refused, not a stack overflow.
    std::string deep = proto + small(0);
    for (int i = 0; i < 200000; ++i) deep += "\x85";
    EXPECT_NE(read_as_checkpoint(zip_of({{"m/data.pkl", deep + "."}})).find("holds a tuple"),
              std::string::npos);
    const std::string cycle = proto + "]q" + le_bytes(0, 1) + "h" + le_bytes(0, 1) + "a.";
    EXPECT_NE(read_as_checkpoint(zip_of({{"m/data.pkl", cycle}})).find("holds a list"),
              std::string::npos);
}

// Every truncation of a real file, and a flipped byte in its pickle or a storage, is an error
// (the CRC catches what the structure does not), never a crash or a silent misread.
TEST(TorchCheckpoint, TruncatedOrCorruptedFilesAreRefused) {
    const std::string real = read_bytes(fixtures_dir / "torch_gpt2_tiny/pytorch_model.bin");
    ASSERT_GT(real.size(), 100000u);
    for (size_t cut = 0; cut < real.size(); cut += real.size() / 97 + 1) {
        const std::string e = read_as_checkpoint(real.substr(0, cut));
        EXPECT_FALSE(e.empty()) << "a file cut at byte " << cut << " was read";
    }
    const size_t pickle_at = real.find("_rebuild_tensor_v2");
    ASSERT_NE(pickle_at, std::string::npos);
    // The first storage's bytes: after its local header (30 bytes, the name, the extra field).
    const std::string first = "pytorch_model/data/0";
    const size_t name_at = real.find(first);
    ASSERT_NE(name_at, std::string::npos);
    const size_t extra = static_cast<unsigned char>(real[name_at - 2]) |
                         static_cast<size_t>(static_cast<unsigned char>(real[name_at - 1])) << 8;
    const size_t storage_at = name_at + first.size() + extra + 10;
    for (size_t at : {pickle_at, storage_at}) {
        std::string bad = real;
        bad[at] = static_cast<char>(bad[at] ^ 0x20);
        EXPECT_NE(read_as_checkpoint(bad).find("fails its CRC check"), std::string::npos) << at;
    }
}

// A sharded folder is read whole; an index that points outside the folder, or at a shard that
// lacks the tensor, is refused with the index named.
TEST(TorchCheckpoint, ShardIndexesAreChecked) {
    const fs::path src = fixtures_dir / "torch_gpt2_tiny_sharded_f16";
    const fs::path dir = scratch("sharded");
    fs::create_directories(dir);
    for (const auto& entry : fs::directory_iterator(src))
        fs::copy_file(entry.path(), dir / entry.path().filename(),
                      fs::copy_options::overwrite_existing);
    Model model(fixtures::spec_of("gpt(vocab: 256, context: 64, layers: 2, heads: 2, width: 64)"),
                1);
    ASSERT_EQ(load_weights(dir.string(), model), "");

    const fs::path index = dir / "pytorch_model.bin.index.json";
    nlohmann::json j;
    std::ifstream(index) >> j;
    nlohmann::json escape = j;
    escape["weight_map"]["transformer.wte.weight"] = "../../etc/passwd";
    std::ofstream(index) << escape.dump();
    std::string e = load_weights(dir.string(), model);
    EXPECT_NE(e.find("is not a file in the same folder"), std::string::npos) << e;

    nlohmann::json wrong = j;
    wrong["weight_map"]["transformer.wte.weight"] = "pytorch_model-00002-of-00002.bin";
    std::ofstream(index) << wrong.dump();
    e = load_weights(dir.string(), model);
    EXPECT_NE(e.find("places `transformer.wte.weight` in `pytorch_model-00002-of-00002.bin`"),
              std::string::npos)
        << e;

    std::ofstream(index) << "{\"metadata\": {}}";
    e = load_weights(dir.string(), model);
    EXPECT_NE(e.find("no \"weight_map\""), std::string::npos) << e;
}

TEST(TorchCheckpoint, AFolderWithoutWeightsNamesTheLayoutsItLooksFor) {
    const fs::path dir = scratch("empty");
    fs::create_directories(dir);
    Model model(fixtures::spec_of("gpt(vocab: 256, context: 64, layers: 2, heads: 2, width: 64)"),
                1);
    const std::string e = load_weights(dir.string(), model);
    EXPECT_NE(e.find("model.safetensors, model.safetensors.index.json, pytorch_model.bin or "
                     "pytorch_model.bin.index.json"),
              std::string::npos)
        << e;
}
