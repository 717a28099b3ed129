// search_test.cpp: `dist search` loses nothing to its pruning, and every row it prints is what
// `dist sim` gives for that row's `--set` overrides.
#include "actors/plan/lower.hpp"
#include "actors/sim/search.hpp"
#include "actors/sim/simulate.hpp"
#include "cli/commands.hpp"
#include "lang/check.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <unistd.h>

namespace fs = std::filesystem;
using namespace dist;

namespace {

fs::path stdlib() {
    return fs::path(DIST_SOURCE_DIR) / "stdlib";
}

/// A script written to a temporary folder (search reads a file, as the command does).
fs::path script(const std::string& name, const std::string& text) {
    fs::path dir = fs::temp_directory_path() / ("dist-search-" + std::to_string(::getpid()));
    fs::create_directories(dir);
    fs::path f = dir / name;
    std::ofstream(f) << text;
    return f;
}

// Eight blocks on 8 A100s in two hosts of 4 (a profile edited as `--set hardware.host.devices=4`
// would): meshes with tensor groups inside and across hosts, pipelines of up to 8 stages, ZeRO,
// context and sequence parallelism.
const char* small_gpu = R"(import "std/gpt.dist"
model = gpt(vocab: 512, context: 256, layers: 8, heads: 8, width: 256)
mesh {
    devices: a100 x 8
    hosts: 2
    dp: 2
    tp: 2
    pp: 2
}
schedule {
    kind: 1f1b
    microbatches: 4
}
train {
    data: synthetic()
    batch: 32
    steps: 1
    precision: bf16
}
)";

// Four CPU ranks sharing one memory.
const char* small_cpu = R"(import "std/gpt.dist"
model = gpt(vocab: 256, context: 64, layers: 4, heads: 4, width: 64)
mesh {
    devices: cpu x 4
    dp: 2
    pp: 2
}
schedule {
    kind: gpipe
    microbatches: 2
}
train {
    data: synthetic()
    batch: 8
    steps: 1
}
)";

/// small_gpu with two kinds: the first four devices (pipeline rank 0) H100s, the last four A100s,
/// tp 4 filling each host of 4.
std::string small_mixed() {
    std::string text = small_gpu;
    text.replace(text.find("devices: a100 x 8"), 17, "devices: [h100, a100] x [4, 4]");
    text.replace(text.find("dp: 2"), 5, "dp: 1");
    text.replace(text.find("tp: 2"), 5, "tp: 4");
    return text;
}

sim::SearchOptions options(const fs::path& file, std::vector<std::string> overrides = {}) {
    sim::SearchOptions o;
    o.file = file;
    o.search_roots = {stdlib()};
    o.overrides = std::move(overrides);
    o.top = 5;
    return o;
}

/// `dist sim` of the script with the overrides, as a user would run it.
sim::Timeline simulated(const fs::path& file, const std::vector<std::string>& overrides) {
    lang::FrontendOptions fo;
    fo.search_roots = {stdlib()};
    fo.overrides = overrides;
    lang::CheckResult r = lang::check_file(file, fo);
    EXPECT_TRUE(r.ok()) << r.report();
    if (!r.ok()) return {};
    plan::PlanResult p = plan::lower(*r.program);
    EXPECT_TRUE(p.ok());
    if (!p.ok()) return {};
    sim::SimResult s = sim::simulate(*p.graph, *r.program);
    EXPECT_TRUE(s.ok());
    return s.ok() ? *s.timeline : sim::Timeline{};
}

int64_t peak_memory(const sim::Timeline& t) {
    int64_t peak = 0;
    for (const auto& r : t.ranks)
        peak = t.shared_memory ? peak + r.peak_memory_bytes : std::max(peak, r.peak_memory_bytes);
    return peak;
}

void expect_same_best(const sim::SearchOptions& o) {
    sim::SearchReport pruned = sim::search(o);
    ASSERT_TRUE(pruned.error.empty()) << pruned.error;
    sim::SearchOptions all = o;
    all.exhaustive = true;
    sim::SearchReport full = sim::search(all);
    ASSERT_TRUE(full.error.empty()) << full.error;
    // The pruned search simulated far fewer layouts and found the same steps, in order.
    EXPECT_LT(pruned.simulated, full.simulated);
    EXPECT_GT(pruned.pruned_bound + pruned.pruned_memory, 0);
    ASSERT_EQ(pruned.rows.size(), full.rows.size());
    for (size_t i = 0; i < full.rows.size(); ++i)
        EXPECT_NEAR(pruned.rows[i].step_time_s, full.rows[i].step_time_s,
                    1e-9 * full.rows[i].step_time_s)
            << "row " << i + 1 << ": " << sim::describe(pruned.rows[i].layout) << " vs "
            << sim::describe(full.rows[i].layout);
}

void expect_rows_reproduce(const sim::SearchOptions& o) {
    sim::SearchReport rep = sim::search(o);
    ASSERT_TRUE(rep.error.empty()) << rep.error;
    ASSERT_FALSE(rep.rows.empty());
    for (const sim::SearchRow& row : rep.rows) {
        std::vector<std::string> set = o.overrides;
        for (const std::string& s : sim::overrides_of(row.layout)) set.push_back(s);
        sim::Timeline t = simulated(o.file, set);
        SCOPED_TRACE(sim::describe(row.layout));
        EXPECT_DOUBLE_EQ(t.step_time_s, row.step_time_s);
        EXPECT_DOUBLE_EQ(t.tokens_per_s, row.tokens_per_s);
        EXPECT_DOUBLE_EQ(t.mfu, row.mfu);
        EXPECT_DOUBLE_EQ(t.bubble_fraction, row.bubble);
        EXPECT_EQ(peak_memory(t), row.peak_memory_bytes);
        // Never printed as fitting when it does not.
        EXPECT_TRUE(t.fits);
        EXPECT_LE(row.peak_memory_bytes, t.memory_limit_bytes);
        // And each row is what the re-applied overrides say it is.
        EXPECT_EQ(t.graph.dp, row.layout.dp);
        EXPECT_EQ(t.graph.tp, row.layout.tp);
        EXPECT_EQ(t.graph.pp, row.layout.pp);
        EXPECT_EQ(t.graph.microbatches, row.layout.microbatches);
    }
}

} // namespace

TEST(Search, PruningLosesNothingOnGpus) {
    expect_same_best(options(script("g.dist", small_gpu)));
}

TEST(Search, PruningLosesNothingWhenMemoryIsTight) {
    // 1 GB per device: many layouts do not fit (the state alone, or with their activations).
    sim::SearchOptions o = options(script("g.dist", small_gpu), {"hardware.memory.bytes=1e8"});
    expect_same_best(o);
    sim::SearchReport rep = sim::search(o);
    EXPECT_GT(rep.pruned_memory, 0);
    expect_rows_reproduce(o);
}

TEST(Search, PruningLosesNothingOnCpuRanks) {
    expect_same_best(options(script("c.dist", small_cpu)));
}

TEST(Search, RowsReproduceWithTheirOverrides) {
    expect_rows_reproduce(options(script("g.dist", small_gpu)));
    expect_rows_reproduce(options(script("c.dist", small_cpu)));
}

/// Over every layout that fits, simulated: the bounds never exceed the step, and the pipeline
/// bound's memory is the simulation's.
void expect_bounds_hold(const fs::path& file) {
    sim::SearchOptions o = options(file);
    o.exhaustive = true;
    o.top = 1000;
    sim::SearchReport rep = sim::search(o);
    ASSERT_GT(rep.rows.size(), 5u);
    // Every simulated layout's bounds, from the same program the simulation used.
    for (const sim::SearchRow& row : rep.rows) {
        lang::FrontendOptions fo;
        fo.search_roots = {stdlib()};
        fo.overrides = sim::overrides_of(row.layout);
        lang::CheckResult r = lang::check_file(file, fo);
        ASSERT_TRUE(r.ok()) << r.report();
        sim::StepBounds b = sim::busy_bound(*r.program);
        sim::pipeline_bound(*r.program, b);
        SCOPED_TRACE(sim::describe(row.layout));
        ASSERT_TRUE(b.error.empty()) << b.error;
        EXPECT_GT(b.busy, 0);
        EXPECT_LE(b.busy, row.step_time_s * (1 + 1e-12));
        EXPECT_LE(b.pipeline, row.step_time_s * (1 + 1e-12));
        EXPECT_LE(b.floor_bytes, row.peak_memory_bytes);
        ASSERT_TRUE(b.memory_known);
        EXPECT_EQ(b.peak_bytes, row.peak_memory_bytes);
    }
}

TEST(Search, BoundsNeverExceedTheSimulatedStep) {
    expect_bounds_hold(script("g.dist", small_gpu));
}

TEST(Search, MarksTheScriptsOwnLayout) {
    sim::SearchOptions o = options(script("g.dist", small_gpu));
    o.top = 100000; // every layout that fits: the script's is among them
    sim::SearchReport rep = sim::search(o);
    ASSERT_TRUE(rep.script.has_value()) << rep.script_error;
    EXPECT_EQ(rep.script->layout.dp, 2);
    EXPECT_EQ(rep.script->layout.tp, 2);
    EXPECT_EQ(rep.script->layout.kind, ScheduleKind::one_f_one_b);
    ASSERT_GT(rep.script_rank, 0);
    const sim::SearchRow& at = rep.rows[static_cast<size_t>(rep.script_rank - 1)];
    EXPECT_EQ(at.layout, rep.script->layout);
    EXPECT_DOUBLE_EQ(at.step_time_s, rep.script->step_time_s);
    std::string text = sim::search_text(rep);
    EXPECT_NE(text.find(std::to_string(rep.script_rank) + "*"), std::string::npos) << text;
}

TEST(Search, HardwareOverridesChangeTheAnswer) {
    fs::path file = script("g.dist", small_gpu);
    // Two pipeline stages in two hosts: their activations cross the 25 GB/s link, or 4 TB/s.
    std::vector<std::string> pipeline = {"mesh.dp=1", "mesh.tp=4", "mesh.pp=2"};
    sim::Timeline slow = simulated(file, pipeline);
    pipeline.push_back("hardware.links.inter_host.bandwidth=4e12");
    sim::Timeline fast = simulated(file, pipeline);
    EXPECT_LT(fast.step_time_s, slow.step_time_s);
    // Twice the FLOPs: every compute-bound step shorter.
    sim::Timeline twice = simulated(file, {"hardware.compute.peak_flops_bf16=624e12"});
    sim::Timeline once = simulated(file, {});
    EXPECT_LT(twice.step_time_s, once.step_time_s);
    // Slower flash attention lengthens the step; tiles as long as the sequence run the whole
    // T x T square, the causal half skipped no more.
    sim::Timeline slow_attention = simulated(file, {"hardware.compute.attention_efficiency=0.05"});
    EXPECT_GT(slow_attention.step_time_s, once.step_time_s);
    sim::Timeline whole = simulated(file, {"hardware.compute.attention_block=1048576"});
    EXPECT_GT(whole.step_time_s, once.step_time_s);
    // ZeRO 3 gathers and reduce-scatters beside compute that outlasts them: the a100's 0.19
    // slowdown beside them lengthens the step, none shortens it.
    std::vector<std::string> fsdp = {
        "mesh.dp=8",      "mesh.tp=1", "mesh.pp=1", "mesh.zero=3", "schedule.microbatches=1",
        "train.batch=256"};
    sim::Timeline slowed = simulated(file, fsdp);
    fsdp.push_back("hardware.compute.overlap_slowdown=0");
    sim::Timeline free = simulated(file, fsdp);
    EXPECT_GT(slowed.step_time_s, free.step_time_s);
    // Memory comes from the edited profile.
    sim::Timeline small = simulated(file, {"hardware.memory.bytes=1e9"});
    EXPECT_EQ(small.memory_limit_bytes, 1000000000);
}

TEST(Search, HardwareOverridesAreCheckedAndLocated) {
    fs::path file = script("g.dist", small_gpu);
    auto errors = [&](const std::string& set) {
        lang::FrontendOptions fo;
        fo.search_roots = {stdlib()};
        fo.overrides = {set};
        lang::CheckResult r = lang::check_file(file, fo);
        EXPECT_FALSE(r.ok()) << set;
        return r.report();
    };
    std::string e = errors("hardware.links.inter_host.bandwith=1e9");
    EXPECT_NE(e.find("--set:1:1"), std::string::npos) << e;
    EXPECT_NE(e.find("did you mean `hardware.links.inter_host.bandwidth`"), std::string::npos) << e;
    e = errors("hardware.compute.matmul_efficiency=1.5");
    EXPECT_NE(e.find("a fraction in (0, 1]"), std::string::npos) << e;
    e = errors("hardware.compute.attention_efficiency=2");
    EXPECT_NE(e.find("a fraction in (0, 1]"), std::string::npos) << e;
    e = errors("hardware.compute.overlap_slowdown=-0.1");
    EXPECT_NE(e.find("a number of 0 or more"), std::string::npos) << e;
    e = errors("hardware.memory.bytes=-3");
    EXPECT_NE(e.find("positive whole number"), std::string::npos) << e;
    e = errors("hardware.host.devices=2.5");
    EXPECT_NE(e.find("positive whole number"), std::string::npos) << e;
}

TEST(Search, CommandPrintsTableAndJson) {
    fs::path file = script("g.dist", small_gpu);
    cli::CommonOptions c;
    c.file = file.string();
    cli::SearchCommandOptions s;
    s.top = 3;
    s.json = true;
    std::ostringstream out, err;
    ASSERT_EQ(cli::run_search(c, s, out, err), 0) << err.str();
    nlohmann::json j = nlohmann::json::parse(out.str());
    ASSERT_EQ(j["rows"].size(), 3u);
    for (const auto& row : j["rows"]) {
        EXPECT_TRUE(row["set"].is_array());
        EXPECT_GT(row["tokens_per_s"].get<double>(), 0);
        EXPECT_TRUE(row["fits"].get<bool>());
    }
    EXPECT_GT(j["layouts"]["considered"].get<int64_t>(), j["layouts"]["simulated"].get<int64_t>());

    // Several device kinds: one search each, and how the best moves.
    s.json = false;
    s.devices = "a100 x 16, h100 x 16"; // two hosts each
    std::ostringstream out2, err2;
    ASSERT_EQ(cli::run_search(c, s, out2, err2), 0) << err2.str();
    EXPECT_NE(out2.str().find("on 16 x a100-80g"), std::string::npos) << out2.str();
    EXPECT_NE(out2.str().find("on 16 x h100-sxm"), std::string::npos) << out2.str();
    EXPECT_NE(out2.str().find("the best layout on each"), std::string::npos) << out2.str();

    s.devices = "a100 16";
    std::ostringstream out3, err3;
    EXPECT_EQ(cli::run_search(c, s, out3, err3), 2);
    EXPECT_NE(err3.str().find("NAME x COUNT"), std::string::npos) << err3.str();
}

namespace {

/// Times and the search's own counts change with the machine and its cores: the page's text
/// and the run's are compared without them.
std::string without_counts(const std::string& text) {
    std::string out;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) {
        if (line.rfind("layouts: ", 0) == 0) line = line.substr(0, line.find(" considered"));
        size_t beyond = line.find("rank beyond ");
        if (beyond != std::string::npos) line = line.substr(0, beyond) + "rank beyond N";
        out += line + "\n";
    }
    return out;
}

std::string run_dist(const std::string& args) {
    std::string cmd =
        "cd '" + std::string(DIST_SOURCE_DIR) + "' && " + DIST_BINARY + " " + args + " 2>&1";
    std::string out;
    FILE* p = ::popen(cmd.c_str(), "r");
    if (!p) return out;
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    ::pclose(p);
    return out;
}

} // namespace

// docs/search.md shows commands (```sh) and what they print (```text after each): every one
// still prints that. DIST_GOLDEN_REWRITE=1 writes the outputs into the page.
TEST(SearchDoc, EveryCommandPrintsWhatThePageSays) {
    fs::path page = fs::path(DIST_SOURCE_DIR) / "docs/search.md";
    std::ifstream in(page);
    std::stringstream ss;
    ss << in.rdbuf();
    std::string text = ss.str(), rewritten;
    const std::string sh = "```sh\ndist ", text_open = "```\n\n```text\n", close = "```\n";
    size_t at = 0, blocks = 0;
    while (true) {
        size_t cmd = text.find(sh, at);
        if (cmd == std::string::npos) break;
        size_t cmd_end = text.find('\n', cmd + sh.size());
        std::string args = text.substr(cmd + sh.size(), cmd_end - cmd - sh.size());
        ASSERT_EQ(text.compare(cmd_end + 1, text_open.size(), text_open), 0)
            << "`dist " << args << "` needs a ```text block after it";
        size_t out_begin = cmd_end + 1 + text_open.size();
        size_t out_end = text.find(close, out_begin);
        ASSERT_NE(out_end, std::string::npos);
        std::string shown = text.substr(out_begin, out_end - out_begin);
        std::string printed = run_dist(args);
        EXPECT_EQ(without_counts(shown), without_counts(printed)) << "dist " << args;
        rewritten += text.substr(at, out_begin - at) + printed;
        at = out_end;
        ++blocks;
    }
    rewritten += text.substr(at);
    EXPECT_GE(blocks, 10u);
    if (std::getenv("DIST_GOLDEN_REWRITE")) std::ofstream(page) << rewritten;
}

// Two kinds of device in one mesh: the first four pipeline-rank devices H100s, the last four
// A100s (`devices: [h100, a100] x [4, 4]`), hosts of 4.
TEST(Search, MixedMeshesPruneNothingAndReproduce) {
    std::string text = small_mixed();
    fs::path file = script("m.dist", text);
    sim::SearchOptions o = options(file);
    expect_same_best(o);
    expect_rows_reproduce(o);
    sim::SearchReport rep = sim::search(o);
    EXPECT_EQ(rep.device, "4 x h100-sxm + 4 x a100-80g");
    // Layouts whose kinds would share a host, or split a pipeline rank, are the checker's to
    // refuse.
    EXPECT_GT(rep.refused, 0);
}

TEST(Search, MixedMeshBoundsNeverExceedTheStep) {
    expect_bounds_hold(script("m.dist", small_mixed()));
}

// The faster kind's stages get more blocks; the step lies between the two kinds' alone; the
// memory of each rank is held against its own kind's; training refuses, located.
TEST(MixedMesh, PlannedBySpeedSimulatedAndRefusedForTraining) {
    std::string text = small_gpu;
    text.replace(text.find("devices: a100 x 8"), 17, "devices: [h100, a100] x [4, 4]");
    text.replace(text.find("hosts: 2"), 8, "hosts: 2\n    memory: 8 GiB");
    fs::path file = script("m.dist", text);
    std::vector<std::string> mesh = {"mesh.dp=1", "mesh.tp=4", "mesh.pp=2"};
    lang::FrontendOptions fo;
    fo.search_roots = {stdlib()};
    fo.overrides = mesh;
    fo.overrides.push_back("train.precision=f32"); // bf16 would be refused first
    lang::CheckResult r = lang::check_file(file, fo);
    ASSERT_TRUE(r.ok()) << r.report();
    const Program& p = *r.program;
    ASSERT_EQ(p.mesh.pp_profiles.size(), 2u);
    EXPECT_EQ(p.mesh.pp_profiles[0].name, "h100-sxm");
    EXPECT_EQ(p.mesh.pp_profiles[1].name, "a100-80g");
    EXPECT_TRUE(p.mesh.mixed());
    plan::PlanResult g = plan::lower(p);
    ASSERT_TRUE(g.ok());
    EXPECT_GT(g.graph->stages[0].blocks, g.graph->stages[1].blocks);
    sim::Timeline both = simulated(file, mesh);
    std::vector<std::string> h100 = mesh, a100 = mesh;
    h100.push_back("mesh.devices=h100 x 8");
    a100.push_back("mesh.devices=a100 x 8");
    EXPECT_LT(simulated(file, h100).step_time_s, both.step_time_s);
    EXPECT_LT(both.step_time_s, simulated(file, a100).step_time_s);
    // Training: refused at the devices, by the session's front door.
    EXPECT_NE(p.train.training_refusal.find("several kinds of device (h100-sxm and a100-80g)"),
              std::string::npos)
        << p.train.training_refusal;
    EXPECT_NE(p.train.training_refusal.find("m.dist:4:5"), std::string::npos)
        << p.train.training_refusal;
}

TEST(MixedMesh, RulesAreLocated) {
    std::string text = small_gpu;
    fs::path file = script("g.dist", text);
    auto error = [&](const std::vector<std::string>& set) {
        lang::FrontendOptions fo;
        fo.search_roots = {stdlib()};
        fo.overrides = set;
        lang::CheckResult r = lang::check_file(file, fo);
        EXPECT_FALSE(r.ok());
        return r.report();
    };
    std::string e = error({"mesh.devices=[h100, a100] x [6, 2]"});
    EXPECT_NE(e.find("6 h100 are not whole pipeline ranks: each holds dp x cp x tp = 4"),
              std::string::npos)
        << e;
    e = error({"mesh.devices=[h100, a100] x 8"});
    EXPECT_NE(e.find("several device kinds take one count each"), std::string::npos) << e;
    e = error({"mesh.devices=[h100, cpu] x [4, 4]"});
    EXPECT_NE(e.find("`cpu` shares one machine's cores"), std::string::npos) << e;
    // dp 2, tp 2: a host of 4 would hold ranks of both pipeline ranks, of two kinds.
    e = error({"mesh.devices=[h100, a100] x [4, 4]"});
    EXPECT_NE(e.find("host 0 would hold both h100-sxm and a100-80g devices"), std::string::npos)
        << e;
    e = error({"mesh.devices=[h100, a10] x [4, 4]"});
    EXPECT_NE(e.find("unknown device `a10`"), std::string::npos) << e;
}

// The commands as a user meets a mixed mesh: check names both kinds, `dist run` refuses at the
// devices, `dist search --devices` takes `+` for two kinds, `dist plan --json` lists the kinds.
TEST(MixedMesh, CommandsSayWhatTheyDo) {
    std::string text = small_mixed();
    text.replace(text.find("precision: bf16"), 15, "precision: f32");
    fs::path file = script("m.dist", text);
    std::string out = run_dist("check " + file.string());
    EXPECT_NE(out.find("ok (gpt, "), std::string::npos) << out;
    EXPECT_NE(out.find("4 x h100-sxm + 4 x a100-80g)"), std::string::npos) << out;
    out = run_dist("run " + file.string());
    EXPECT_NE(out.find("m.dist:4:5: error: a mesh of several kinds of device"), std::string::npos)
        << out;
    out = run_dist("plan " + file.string() + " --json");
    nlohmann::json j = nlohmann::json::parse(out);
    ASSERT_EQ(j["program"]["mesh"]["pipeline_kinds"].size(), 2u) << out.substr(0, 400);
    EXPECT_EQ(j["program"]["mesh"]["pipeline_kinds"][1]["profile"], "a100-80g");
    out = run_dist("search " + file.string() + " --top 1 --devices 'h100 x 8,h100 x 4 + a100 x 4'");
    EXPECT_NE(out.find("search: gpt on 8 x h100-sxm"), std::string::npos) << out;
    EXPECT_NE(out.find("search: gpt on 4 x h100-sxm + 4 x a100-80g"), std::string::npos) << out;
}

// A small Mixtral-shaped model on 8 A100s in two hosts: expert parallelism is searched beside
// the other axes, pruning loses nothing, and each row's overrides (mesh.ep included) reproduce it.
const char* small_moe = R"(import "std/moe.dist"
model = mixtral(vocab: 512, context: 256, layers: 4, heads: 8, kv_heads: 4, width: 256,
                experts: 8, top_k: 2, hidden: 512)
mesh {
    devices: a100 x 8
    hosts: 2
    dp: 4
    pp: 2
    ep: 2
}
schedule {
    kind: 1f1b
    microbatches: 4
}
train {
    data: synthetic()
    batch: 32
    steps: 1
    precision: bf16
}
)";

TEST(Search, ExpertParallelismIsSearchedAndReproduces) {
    sim::SearchOptions o = options(script("moe.dist", small_moe));
    expect_same_best(o);
    expect_rows_reproduce(o);
    sim::SearchOptions all = o;
    all.exhaustive = true;
    all.top = 100000;
    sim::SearchReport rep = sim::search(all);
    ASSERT_TRUE(rep.error.empty()) << rep.error;
    std::set<int64_t> eps;
    std::set<int64_t> zeros_with_ep;
    for (const sim::SearchRow& row : rep.rows) {
        eps.insert(row.layout.ep);
        // ep divides the replicas and the 8 experts; every ZeRO stage combines with it.
        EXPECT_EQ(row.layout.dp * row.layout.cp % row.layout.ep, 0);
        EXPECT_EQ(8 % row.layout.ep, 0);
        if (row.layout.ep > 1) zeros_with_ep.insert(row.layout.zero);
    }
    EXPECT_TRUE(eps.count(1) && eps.count(2) && eps.count(4) && eps.count(8));
    EXPECT_EQ(zeros_with_ep, (std::set<int64_t>{0, 1, 2, 3}));
    // The best row's overrides give a plan with its ep.
    std::vector<std::string> set = sim::overrides_of(rep.rows.front().layout);
    EXPECT_EQ(simulated(o.file, set).graph.ep, std::max<int64_t>(rep.rows.front().layout.ep, 1));
}

TEST(Search, ExpertParallelBoundsNeverExceedTheSimulatedStep) {
    expect_bounds_hold(script("moe.dist", small_moe));
}
