// check_test.cpp: the checker: parameter counts against published figures, mesh and schedule
// rules, overrides, imports, and the round trip fmt(parse(x)) for every shipped script.
#include "lang/check.hpp"
#include "lang/format.hpp"
#include "lang/loader.hpp"
#include "lang/parse.hpp"
#include "lang/program_json.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

namespace fs = std::filesystem;
using namespace dist;
using namespace dist::lang;

namespace {

FrontendOptions opts(std::vector<std::string> overrides = {}) {
    FrontendOptions o;
    o.search_roots = {fs::path(DIST_SOURCE_DIR) / "stdlib"};
    o.overrides = std::move(overrides);
    return o;
}

const char* tiny_body = R"(
mesh {
    devices: cpu
}
train {
    batch: 8
    steps: 10
}
)";

CheckResult check(const std::string& model_line, std::vector<std::string> overrides = {},
                  const std::string& body = tiny_body) {
    std::string text =
        "import \"std/gpt.dist\"\nimport \"std/llama.dist\"\nmodel = " + model_line + "\n" + body;
    return check_text("t.dist", text, opts(std::move(overrides)));
}

std::string errors(const CheckResult& r) {
    return r.report();
}

// A fresh folder under the system's temporary directory, removed at the end of the test.
struct TempDir {
    fs::path path;
    TempDir() {
        path = fs::temp_directory_path() /
               ("dist-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter()++));
        fs::create_directories(path);
    }
    ~TempDir() { fs::remove_all(path); }
    static int& counter() {
        static int n = 0;
        return n;
    }
    void write(const std::string& rel, const std::string& text) const {
        fs::create_directories((path / rel).parent_path());
        std::ofstream(path / rel) << text;
    }
};

} // namespace

// GPT-2 has 12 C^2 + 13 C parameters per block (QKV and projection 4 C^2 + 4 C, MLP 8 C^2 + 5 C,
// two LayerNorms 4 C), token and position embeddings, and a final LayerNorm; the head is tied.
int64_t gpt2_parameters(int64_t vocab, int64_t context, int64_t layers, int64_t width) {
    return layers * (12 * width * width + 13 * width) + vocab * width + context * width + 2 * width;
}

TEST(Check, Gpt2PresetsHaveTheirPublishedSizes) {
    struct Case {
        const char* preset;
        int64_t layers, width;
    } cases[] = {{"gpt2_124m", 12, 768},
                 {"gpt2_350m", 24, 1024},
                 {"gpt2_774m", 36, 1280},
                 {"gpt2_1_5b", 48, 1600}};
    for (const auto& c : cases) {
        CheckResult r = check(std::string(c.preset) + "()");
        ASSERT_TRUE(r.ok()) << errors(r);
        EXPECT_EQ(r.program->model.parameters, gpt2_parameters(50257, 1024, c.layers, c.width))
            << c.preset;
    }
    // Hugging Face's published count for `gpt2`.
    EXPECT_EQ(check("gpt2_124m()").program->model.parameters, 124439808);
}

TEST(Check, LlamaPresetsHaveTheirPublishedSizes) {
    // Parameter counts of Meta's released checkpoints (Llama 3.2 1B, Llama 3 8B and 70B).
    CheckResult one = check("llama3_1b()");
    ASSERT_TRUE(one.ok()) << errors(one);
    EXPECT_EQ(one.program->model.parameters, 1235814400);
    CheckResult eight = check("llama3_8b()", {}, R"(
mesh {
    devices: h100 x 8
    tp: 8
}
train {
    batch: 8
    steps: 10
})");
    ASSERT_TRUE(eight.ok()) << errors(eight);
    EXPECT_EQ(eight.program->model.parameters, 8030261248);
    const LayerSpec& attn = eight.program->model.blocks[0].items[0].layers[1];
    EXPECT_EQ(attn.name, "layers.0.self_attn");
    EXPECT_EQ(attn.kv_heads, 8);
    EXPECT_EQ(attn.head_dim, 128);
    CheckResult seventy =
        check("llama3_70b()", {"mesh.devices=h100 x 64", "mesh.tp=8", "mesh.pp=8"});
    ASSERT_TRUE(seventy.ok()) << errors(seventy);
    EXPECT_EQ(seventy.program->model.parameters, 70553706496);
    EXPECT_EQ(seventy.program->mesh.hosts, 8);
}

TEST(Check, LayerNamesFollowHuggingFace) {
    CheckResult r = check("gpt(vocab: 256, context: 64, layers: 2, heads: 2, width: 64)");
    ASSERT_TRUE(r.ok()) << errors(r);
    const ModelSpec& m = r.program->model;
    EXPECT_EQ(m.pre[0].layers[0].name, "wte");
    EXPECT_EQ(m.pre[1].layers[0].name, "wpe");
    EXPECT_EQ(m.blocks[1].name, "h.1");
    EXPECT_EQ(m.blocks[1].items[0].layers[0].name, "h.1.ln_1");
    EXPECT_EQ(m.blocks[1].items[1].layers[1].name, "h.1.mlp");
    EXPECT_EQ(m.blocks[1].items[1].layers[1].hidden, 256);
    EXPECT_EQ(m.post[0].layers[0].name, "ln_f");
    EXPECT_TRUE(m.post[1].layers[0].tied);
    EXPECT_EQ(m.post[1].layers[0].parameters, 0);
}

TEST(Check, MeshWithoutACountHasTheProductOfItsAxes) {
    CheckResult r =
        check("gpt(vocab: 256, context: 64, layers: 4, heads: 2, width: 64)", {"mesh.pp=4"});
    ASSERT_TRUE(r.ok()) << errors(r);
    EXPECT_EQ(r.program->mesh.devices, 4);
    EXPECT_EQ(r.program->schedule.partition, (std::vector<int64_t>{1, 1, 1, 1}));
    CheckResult bad = check("gpt(vocab: 256, context: 64, layers: 4, heads: 2, width: 64)",
                            {"mesh.devices=cpu x 8", "mesh.tp=2"});
    EXPECT_NE(errors(bad).find("the mesh has dp x tp x pp = 1 x 2 x 1 = 2 ranks, but 8 devices"),
              std::string::npos)
        << errors(bad);
    EXPECT_NE(errors(bad).find("hint: set `dp: 4` to use 8 devices"), std::string::npos);
}

TEST(Check, HostsComeFromTheProfile) {
    CheckResult r = check("llama3_8b()", {"mesh.devices=h100 x 16", "mesh.tp=8", "mesh.pp=2"});
    ASSERT_TRUE(r.ok()) << errors(r);
    EXPECT_EQ(r.program->mesh.hosts, 2);
    EXPECT_EQ(r.program->mesh.devices_per_host, 8);
    CheckResult one =
        check("llama3_8b()", {"mesh.devices=h100 x 16", "mesh.tp=8", "mesh.pp=2", "mesh.hosts=1"});
    EXPECT_NE(errors(one).find("16 devices per host, but one h100-sxm host holds at most 8"),
              std::string::npos)
        << errors(one);
}

TEST(Check, TensorParallelMustDivideWhatItSplits) {
    std::string model = "gpt(vocab: 256, context: 64, layers: 2, heads: 6, width: 96)";
    EXPECT_TRUE(check(model, {"mesh.tp=2"}).ok()) << errors(check(model, {"mesh.tp=2"}));
    EXPECT_FALSE(check(model, {"mesh.tp=2", "model.vocab=255"}).ok());
    CheckResult r = check(model, {"mesh.tp=4"});
    ASSERT_FALSE(r.ok());
    EXPECT_NE(errors(r).find("tp = 4 does not divide the attention heads 6 (`h.0.attn`)"),
              std::string::npos)
        << errors(r);
    EXPECT_NE(errors(r).find("use tp = `1` or `2`"), std::string::npos) << errors(r);
    // The GPT-2 vocabulary is prime to 2: the hint says what to pad it to.
    CheckResult v = check("gpt2_124m()", {"mesh.tp=2", "mesh.devices=h100"});
    EXPECT_NE(errors(v).find("pad the vocabulary to 50304"), std::string::npos) << errors(v);
}

TEST(Check, StagesBatchAndSchedules) {
    std::string model = "gpt(vocab: 256, context: 64, layers: 4, heads: 2, width: 64)";
    EXPECT_NE(errors(check(model, {"mesh.pp=8"})).find("4 blocks, too few for pp x virtual_stages"),
              std::string::npos);
    EXPECT_NE(errors(check(model, {"mesh.dp=3"}))
                  .find("global batch 8 is not divisible by dp x "
                        "microbatches = 3 x 1 = 3"),
              std::string::npos);
    EXPECT_NE(errors(check(model, {"mesh.pp=2", "schedule.kind=zbv", "schedule.virtual_stages=1"}))
                  .find("places exactly two stages on each rank"),
              std::string::npos);
    EXPECT_TRUE(check(model, {"mesh.pp=2", "schedule.kind=zbv", "schedule.microbatches=2"}).ok());
    EXPECT_NE(errors(check(model, {"mesh.pp=2", "schedule.kind=interleaved_1f1b",
                                   "schedule.virtual_stages=2", "schedule.microbatches=3",
                                   "train.batch=12"}))
                  .find("microbatches divisible by pp = 2"),
              std::string::npos);
    EXPECT_NE(errors(check(model, {"mesh.pp=2", "schedule.kind=1f1b", "schedule.virtual_stages=2"}))
                  .find("runs one stage per rank"),
              std::string::npos);
}

TEST(Check, ModelsThatCannotFitAreRefused) {
    CheckResult r = check("llama3_70b()");
    ASSERT_FALSE(r.ok());
    EXPECT_NE(errors(r).find("the model does not fit"), std::string::npos) << errors(r);
    // Splitting it over 64 H100s brings the floor under 80 GB.
    EXPECT_TRUE(check("llama3_70b()", {"mesh.devices=h100 x 64", "mesh.tp=8", "mesh.pp=8"}).ok());
}

TEST(Check, OverridesGoThroughTheSameRules) {
    std::string model = "gpt(vocab: 256, context: 64, layers: 4, heads: 2, width: 64)";
    CheckResult r =
        check(model, {"model.layers=8", "train.optimizer.lr=1e-3", "schedule.kind=gpipe"});
    ASSERT_TRUE(r.ok()) << errors(r);
    EXPECT_EQ(r.program->model.blocks.size(), 8u);
    EXPECT_DOUBLE_EQ(r.program->train.optimizer.lr, 1e-3);
    EXPECT_EQ(r.program->schedule.kind, ScheduleKind::gpipe);

    CheckResult unknown = check(model, {"mesh.dpp=2"});
    EXPECT_NE(errors(unknown).find("--set:1:1: error: unknown field `dpp` in mesh"),
              std::string::npos)
        << errors(unknown);
    EXPECT_NE(errors(unknown).find("mesh holds `devices`, `dp`"), std::string::npos);
    CheckResult arg = check(model, {"model.layer=2"});
    EXPECT_NE(errors(arg).find("model `gpt` has no argument `layer`"), std::string::npos);
    EXPECT_NE(errors(arg).find("did you mean `model.layers`?"), std::string::npos);
    CheckResult syntax = check(model, {"mesh.dp=(2"});
    EXPECT_NE(errors(syntax).find("--set:1:"), std::string::npos) << errors(syntax);
    CheckResult neg = check(model, {"mesh.dp=-2"});
    EXPECT_NE(errors(neg).find("--set:1:9: error: `mesh.dp` must be positive, got -2"),
              std::string::npos)
        << errors(neg);
}

TEST(Check, SeveralErrorsAreAllReportedOnce) {
    CheckResult r = check("gpt(vocab: 256, context: 64, layers: 2, heads: 2, width: 64)", {},
                          R"(
mesh {
    devices: cpu
    dp: 0
    tpp: 2
}
train {
    batch: -1
    steps: 10
    optimizer {
        lr: 0
    }
})");
    std::string e = errors(r);
    EXPECT_NE(e.find("`mesh.dp` must be positive, got 0"), std::string::npos) << e;
    EXPECT_NE(e.find("unknown field `tpp` in mesh"), std::string::npos) << e;
    EXPECT_NE(e.find("`train.batch` must be positive, got -1"), std::string::npos) << e;
    EXPECT_NE(e.find("`train.optimizer.lr` must be positive, got 0"), std::string::npos) << e;
    EXPECT_EQ(r.diagnostics.all().size(), 4u) << e;
}

TEST(Check, CustomTablesAreReadAndValidated) {
    std::string model = "gpt(vocab: 256, context: 64, layers: 2, heads: 2, width: 64)";
    std::string body = R"(
mesh {
    devices: cpu
    pp: 2
}
schedule {
    kind: custom
    microbatches: 2
    actions {
        rank 0: 0F0 0F1 0I0 0W0 0B1
        rank 1: 1F0 1B0 1F1 1B1
    }
}
train {
    batch: 8
    steps: 10
})";
    CheckResult r = check(model, {}, body);
    ASSERT_TRUE(r.ok()) << errors(r);
    const auto& a = r.program->schedule.actions;
    ASSERT_EQ(a.size(), 2u);
    ASSERT_EQ(a[0].size(), 5u);
    EXPECT_EQ(a[0][2].op, 'I');
    EXPECT_EQ(a[1][1].stage, 1);
    EXPECT_EQ(a[1][1].op, 'B');
    EXPECT_EQ(a[1][1].microbatch, 0);

    std::string missing = body;
    missing.replace(missing.find(" 0B1"), 4, "");
    EXPECT_NE(errors(check(model, {}, missing)).find("no backward for stage 0 microbatch 1"),
              std::string::npos);
    std::string twice = body;
    twice.replace(twice.find("1F1 1B1"), 7, "1F1 1B1 1B1");
    EXPECT_NE(errors(check(model, {}, twice)).find("`1B1` appears twice"), std::string::npos);
}

TEST(Imports, ResolveAgainstTheScriptFolderThenTheLibrary) {
    TempDir d;
    d.write("lib/shapes.dist", "let width = 64\n");
    d.write("main.dist", "import \"lib/shapes.dist\"\nimport \"std/gpt.dist\"\n"
                         "model = gpt(vocab: 256, context: 64, layers: 2, heads: 2, width: width)"
                         "\nmesh {\n devices: cpu\n}\ntrain {\n batch: 2\n steps: 1\n}\n");
    CheckResult r = check_file(d.path / "main.dist", opts());
    ASSERT_TRUE(r.ok()) << r.report();
    EXPECT_EQ(r.program->model.width, 64);
}

TEST(Imports, CyclesMissingFilesAndEscapesAreLocatedErrors) {
    TempDir d;
    d.write("a.dist", "import \"b.dist\"\n");
    d.write("b.dist", "import \"a.dist\"\n");
    CheckResult cycle = check_file(d.path / "a.dist", opts());
    EXPECT_NE(cycle.report().find("import cycle: a.dist -> b.dist -> a.dist"), std::string::npos)
        << cycle.report();

    d.write("m.dist", "import \"nope.dist\"\n");
    EXPECT_NE(check_file(d.path / "m.dist", opts()).report().find("cannot find `nope.dist`"),
              std::string::npos);
    d.write("up.dist", "import \"../x.dist\"\n");
    EXPECT_NE(check_file(d.path / "up.dist", opts()).report().find("may not contain `..`"),
              std::string::npos);
    d.write("abs.dist", "import \"/etc/passwd.dist\"\n");
    EXPECT_NE(check_file(d.path / "abs.dist", opts()).report().find("import paths are relative"),
              std::string::npos);
    // A symbolic link inside the folder that leads out of it.
    TempDir outside;
    outside.write("evil.dist", "let x = 1\n");
    fs::create_symlink(outside.path / "evil.dist", d.path / "link.dist");
    d.write("sym.dist", "import \"link.dist\"\n");
    EXPECT_NE(check_file(d.path / "sym.dist", opts()).report().find("through a symbolic link"),
              std::string::npos)
        << check_file(d.path / "sym.dist", opts()).report();
    d.write("blk.dist", "mesh {\n devices: cpu\n}\n");
    d.write("imp.dist", "import \"blk.dist\"\n");
    EXPECT_NE(check_file(d.path / "imp.dist", opts()).report().find("holds definitions only"),
              std::string::npos);
}

TEST(Imports, DistPathAddsFolders) {
    TempDir lib, work;
    lib.write("team/sizes.dist", "let layers = 3\n");
    work.write("s.dist", "import \"team/sizes.dist\"\nimport \"std/gpt.dist\"\n"
                         "model = gpt(vocab: 256, context: 64, layers: layers, heads: 2, width: 64)"
                         "\nmesh {\n devices: cpu\n}\ntrain {\n batch: 2\n steps: 1\n}\n");
    FrontendOptions o = opts();
    EXPECT_FALSE(check_file(work.path / "s.dist", o).ok());
    o.search_roots.insert(o.search_roots.begin(), lib.path);
    CheckResult r = check_file(work.path / "s.dist", o);
    ASSERT_TRUE(r.ok()) << r.report();
    EXPECT_EQ(r.program->model.blocks.size(), 3u);
}

TEST(Check, MissingFilesAreReportedNotThrown) {
    CheckResult r = check_file("/nonexistent/dir/x.dist", opts());
    EXPECT_FALSE(r.ok());
    EXPECT_NE(r.report().find("cannot read `/nonexistent/dir/x.dist`"), std::string::npos);
}

// Round trip: every shipped script and golden file formats to text that parses to the same tree
// and, when it checks, to the same program.
TEST(RoundTrip, FormatPreservesTheProgram) {
    std::vector<fs::path> files;
    for (const char* dir : {"examples", "stdlib/std", "tests/golden/parse", "tests/golden/format",
                            "tests/golden/check", "tests/golden/errors"}) {
        fs::path d = fs::path(DIST_SOURCE_DIR) / dir;
        if (!fs::is_directory(d)) continue;
        for (const auto& e : fs::directory_iterator(d))
            if (e.path().extension() == ".dist") files.push_back(e.path());
    }
    ASSERT_GT(files.size(), 8u);
    size_t compared = 0;
    for (const auto& f : files) {
        std::string text, error;
        ASSERT_TRUE(read_source_file(f, text, error)) << f;
        SourceManager sources;
        Diagnostics diags;
        auto script = parse_script(sources, sources.add(f.string(), text), diags);
        if (!script) continue; // a golden file with a syntax error
        std::string formatted = format_script(*script);
        auto again = parse_script(sources, sources.add("formatted", formatted), diags);
        ASSERT_TRUE(again) << f << "\n" << diags.render(sources) << formatted;
        EXPECT_EQ(dump(*again), dump(*script)) << f;
        EXPECT_EQ(format_script(*again), formatted) << f << " is not idempotent";
        EXPECT_EQ(again->comments.size(), script->comments.size()) << f << " lost comments";

        FrontendOptions o = opts();
        o.overrides.clear();
        CheckResult before = check_text(f.string(), text, o);
        if (!before.ok()) continue;
        // The formatted text, checked as if it were the same file (same folder for imports).
        CheckResult after = check_text(f.string(), formatted, o);
        ASSERT_TRUE(after.ok()) << f << "\n" << after.report();
        EXPECT_EQ(to_json(*before.program), to_json(*after.program)) << f;
        ++compared;
    }
    EXPECT_GE(compared, 10u) << "too few scripts checked cleanly to compare programs";
}

// The scripts of bench/published check as written, and the profiles of the parts its rows ran on
// load from that folder on DIST_PATH: torchtitan's H100, the silicon of h100-sxm with more
// memory, less bandwidth, and a peak at or below the SXM's and at or above the NVL's 835 TFLOPS;
// Jean Zay's A100 hosts.
TEST(Published, ScriptsCheckAndTheProfilesOfTheirPartsLoad) {
    const fs::path dir = fs::path(DIST_SOURCE_DIR) / "bench/published";
    FrontendOptions o = opts();
    o.search_roots.insert(o.search_roots.begin(), dir);
    size_t checked = 0;
    for (const auto& e : fs::directory_iterator(dir)) {
        if (e.path().extension() != ".dist") continue;
        CheckResult r = check_file(e.path(), o);
        EXPECT_TRUE(r.ok()) << e.path() << "\n" << r.report();
        ++checked;
    }
    EXPECT_GE(checked, 5u);
    auto on = [&](const std::string& devices) {
        FrontendOptions with = o;
        with.overrides = {"mesh.devices=" + devices, "mesh.dp=8", "train.batch=16"};
        return check_file(dir / "torchtitan_llama3.dist", with);
    };
    CheckResult gt = on("h100_gt500 x 8"), sxm = on("h100 x 8");
    ASSERT_TRUE(gt.ok()) << gt.report();
    ASSERT_TRUE(sxm.ok()) << sxm.report();
    const HardwareProfile &g = gt.program->mesh.profile_of(0), &s = sxm.program->mesh.profile_of(0);
    EXPECT_EQ(g.name, "h100-gt500");
    EXPECT_LE(g.peak_flops_bf16, s.peak_flops_bf16);
    EXPECT_GE(g.peak_flops_bf16, 835e12);
    EXPECT_GT(g.memory_bytes, s.memory_bytes);
    EXPECT_LT(g.memory_bandwidth, s.memory_bandwidth);
    EXPECT_EQ(g.matmul_efficiency_by_width, s.matmul_efficiency_by_width);
    EXPECT_EQ(g.attention_efficiency, s.attention_efficiency);
    EXPECT_EQ(g.overlap_slowdown, s.overlap_slowdown);
    // BLOOM's hosts: the A100 of a100-80g with slower links between hosts, nothing else.
    CheckResult jz = on("a100_jz x 8"), a100 = on("a100 x 8");
    ASSERT_TRUE(jz.ok()) << jz.report();
    ASSERT_TRUE(a100.ok()) << a100.report();
    const HardwareProfile &j = jz.program->mesh.profile_of(0),
                          &a = a100.program->mesh.profile_of(0);
    EXPECT_EQ(j.name, "a100-jz");
    EXPECT_LT(j.inter_host.bandwidth, a.inter_host.bandwidth);
    EXPECT_EQ(j.peak_flops_bf16, a.peak_flops_bf16);
    EXPECT_EQ(j.memory_bytes, a.memory_bytes);
    EXPECT_EQ(j.memory_bandwidth, a.memory_bandwidth);
    EXPECT_EQ(j.intra_host.bandwidth, a.intra_host.bandwidth);
    EXPECT_EQ(j.matmul_efficiency_by_width, a.matmul_efficiency_by_width);
    EXPECT_EQ(j.attention_efficiency, a.attention_efficiency);
    EXPECT_EQ(j.overlap_slowdown, a.overlap_slowdown);
    // The GPUs' compute beside a collective slowed by a fraction, as published.
    EXPECT_GT(a.overlap_slowdown, 0.0);
    EXPECT_LT(a.overlap_slowdown, 1.0);
    EXPECT_GT(s.overlap_slowdown, 0.0);
}

// Every ```dist example of the language reference checks (the formatter's "Input" included).
TEST(Docs, LanguageReferenceExamplesCheck) {
    std::string text, error;
    ASSERT_TRUE(read_source_file(fs::path(DIST_SOURCE_DIR) / "docs/language.md", text, error));
    size_t count = 0;
    for (size_t at = 0; (at = text.find("```dist\n", at)) != std::string::npos;) {
        at += 8;
        size_t end = text.find("```", at);
        ASSERT_NE(end, std::string::npos);
        std::string example = text.substr(at, end - at);
        CheckResult r = check_text("docs/language.md", example, opts());
        EXPECT_TRUE(r.ok()) << "example " << count << ":\n" << example << "\n" << r.report();
        ++count;
        at = end + 3;
    }
    EXPECT_GE(count, 8u);
}
