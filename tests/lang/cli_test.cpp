// cli_test.cpp: the `dist` executable as a user runs it: exit statuses, where output goes, and
// `fmt --write` replacing a file whole or not at all.
#include "kernels/devices.hpp"
#include "tests/common/dist_command.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

namespace fs = std::filesystem;

namespace {

using Result = dist::tests::DistResult;
using dist::tests::slurp;

Result run(const std::string& args) {
    return dist::tests::run_dist(args);
}

} // namespace

TEST(Cli, CheckSucceedsOnEveryExample) {
    for (const auto& e : fs::directory_iterator("examples")) {
        if (e.path().extension() != ".dist") continue;
        Result r = run("check " + e.path().string());
        EXPECT_EQ(r.status, 0) << e.path() << "\n" << r.err;
        EXPECT_NE(r.out.find(": ok ("), std::string::npos);
        EXPECT_TRUE(r.err.empty()) << r.err;
    }
}

TEST(Cli, UserErrorsExitOneWithLocatedDiagnostics) {
    Result r = run("check examples/gpt_tiny.dist --set mesh.tp=3");
    EXPECT_EQ(r.status, 1);
    EXPECT_TRUE(r.out.empty());
    EXPECT_EQ(r.err.rfind("--set:1:1: error: tp = 3 does not divide", 0), 0u) << r.err;
    Result missing = run("check no/such/file.dist");
    EXPECT_EQ(missing.status, 1);
    EXPECT_NE(missing.err.find("cannot read `no/such/file.dist`: no such file"), std::string::npos);
    Result dir = run("check examples");
    EXPECT_EQ(dir.status, 1);
    EXPECT_NE(dir.err.find("it is a directory"), std::string::npos);
}

TEST(Cli, UsageErrorsExitTwo) {
    EXPECT_EQ(run("").status, 2);
    EXPECT_EQ(run("frobnicate x.dist").status, 2);
    EXPECT_EQ(run("check").status, 2);
    EXPECT_EQ(run("check examples/gpt_tiny.dist --bogus").status, 2);
    EXPECT_EQ(run("fmt examples/gpt_tiny.dist --write --check").status, 2);
    EXPECT_EQ(run("--help").status, 0);
}

TEST(Cli, PlanJsonIsJsonWithTheResolvedValues) {
    Result r = run("plan examples/gpt_tiny.dist --json --set mesh.pp=2 --set mesh.dp=2 "
                   "--set train.batch=32");
    ASSERT_EQ(r.status, 0) << r.err;
    nlohmann::json j = nlohmann::json::parse(r.out);
    // The checked program, as the checker resolved it (its partition is the even split).
    const nlohmann::json& p = j["program"];
    EXPECT_EQ(p["mesh"]["devices"], 4);
    EXPECT_EQ(p["mesh"]["pp"], 2);
    EXPECT_EQ(p["schedule"]["partition"], nlohmann::json::array({2, 2}));
    EXPECT_EQ(p["train"]["microbatch_size"], 8);
    EXPECT_EQ(p["model"]["arguments"]["layers"], 4);
    // The plan: 4 ranks in DESIGN.md's order, rank = (dp * PP + pp) * TP + tp.
    ASSERT_EQ(j["ranks"].size(), 4u);
    for (int r = 0; r < 4; ++r) {
        EXPECT_EQ(j["ranks"][r]["rank"], r);
        EXPECT_EQ(j["ranks"][r]["dp"], r / 2);
        EXPECT_EQ(j["ranks"][r]["pp"], r % 2);
        EXPECT_EQ(j["ranks"][r]["tp"], 0);
    }
    // 1F1B with p = 2, m = 2 on the first pipeline rank, then the gradient all-reduce.
    EXPECT_EQ(j["ranks"][0]["actions"],
              nlohmann::json::array({"0F0", "0SEND_F0>r1", "0F1", "0SEND_F1>r1", "0RECV_B0<r1",
                                     "0B0", "0RECV_B1<r1", "0B1", "0REDUCE_GRAD0", "STEP"}));
}

TEST(Cli, FmtWriteReplacesTheFileWholeOrNotAtAll) {
    fs::path dir = fs::temp_directory_path() / ("dist-fmt-" + std::to_string(::getpid()));
    fs::create_directories(dir);
    fs::path f = dir / "s.dist";
    std::ofstream(f) << "let a=1 # one\nmesh{dp:2}\n";
    ::chmod(f.c_str(), 0640);
    Result w = run("fmt --write " + f.string());
    ASSERT_EQ(w.status, 0) << w.err;
    EXPECT_EQ(slurp(f), "let a = 1  # one\nmesh {\n    dp: 2\n}\n");
    struct stat st {};
    ::stat(f.c_str(), &st);
    EXPECT_EQ(st.st_mode & 0777, 0640u);
    EXPECT_EQ(run("fmt --check " + f.string()).status, 0);
    // A syntax error leaves the file as it was, and no temporary file behind.
    std::ofstream(f) << "mesh { dp: }\n";
    Result bad = run("fmt --write " + f.string());
    EXPECT_EQ(bad.status, 1);
    EXPECT_EQ(slurp(f), "mesh { dp: }\n");
    size_t entries = 0;
    for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir)) ++entries;
    EXPECT_EQ(entries, 1u);
    fs::remove_all(dir);
}

TEST(Cli, RunTrainsSavesAndEvalReadsTheCheckpoint) {
    fs::path dir = fs::temp_directory_path() / ("dist-run-" + std::to_string(::getpid()));
    fs::remove_all(dir);
    std::string ck = (dir / "ck").string(), metrics = (dir / "m.jsonl").string();
    fs::create_directories(dir);
    Result r = run("run examples/gpt_tiny.dist --set train.stop_after=3 --set model.layers=1 "
                   "--quiet --save " +
                   ck + " --metrics " + metrics);
    ASSERT_EQ(r.status, 0) << r.err;
    std::ifstream in(metrics);
    std::string line;
    int lines = 0;
    while (std::getline(in, line)) {
        nlohmann::json j = nlohmann::json::parse(line);
        for (const char* k :
             {"step", "loss", "lr", "grad_norm", "tokens", "step_time_s", "tokens_per_s"})
            EXPECT_TRUE(j.contains(k)) << k;
        EXPECT_EQ(j["step"], ++lines);
    }
    EXPECT_EQ(lines, 3);
    for (const char* f :
         {"model.safetensors", "config.json", "optimizer.safetensors", "state.json"})
        EXPECT_TRUE(fs::exists(fs::path(ck) / f)) << f;
    Result e = run("eval examples/gpt_tiny.dist --set model.layers=1 --json --load " + ck +
                   " --data /usr/share/games/fortunes/riddles");
    ASSERT_EQ(e.status, 0) << e.err;
    nlohmann::json j = nlohmann::json::parse(e.out);
    EXPECT_GT(j["tokens"].get<int64_t>(), 1000);
    EXPECT_LT(j["loss"].get<double>(), 5.6);
    // The checkpoint is for one block: a two-block model refuses it and names the tensor.
    Result bad = run("eval examples/gpt_tiny.dist --set model.layers=2 --load " + ck +
                     " --data /usr/share/games/fortunes/riddles");
    EXPECT_EQ(bad.status, 1);
    EXPECT_NE(bad.err.find("has no tensor `h.1.ln_1.weight`"), std::string::npos) << bad.err;
    fs::remove_all(dir);
}

// examples/moe_tiny.dist as a user runs it: the loss falls on the fortunes text, every step's
// metrics count the routed copies, and a run saved with the experts split over two ranks
// resumes with every rank holding all of them, with the losses of the run that never stopped.
TEST(Cli, TheMixtureOfExpertsExampleTrainsAndResumesOnAnotherEp) {
    fs::path dir = fs::temp_directory_path() / ("dist-moe-" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
    const std::string sets = " --quiet --set train.steps=40 --set train.lr_schedule.warmup=5";
    auto losses = [](const fs::path& f) {
        std::vector<double> out;
        std::ifstream in(f);
        std::string line;
        while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line)["loss"]);
        return out;
    };
    const fs::path whole = dir / "whole.jsonl", first = dir / "first.jsonl",
                   rest = dir / "rest.jsonl", ck = dir / "ck";
    Result r = run("run examples/moe_tiny.dist" + sets + " --metrics " + whole.string());
    ASSERT_EQ(r.status, 0) << r.err;
    std::vector<double> all = losses(whole);
    ASSERT_EQ(all.size(), 40u);
    EXPECT_LT(all.back(), all.front() - 2.0) << "from " << all.front() << " to " << all.back();
    std::ifstream in(whole);
    std::string line;
    while (std::getline(in, line)) {
        nlohmann::json j = nlohmann::json::parse(line);
        // 16 sequences of 64 tokens, two copies each, in each of 4 layers.
        ASSERT_EQ(j["routed_tokens"], 16 * 64 * 2 * 4) << line;
        int64_t load = 0;
        for (int64_t l : j["expert_load"]) load += l;
        EXPECT_EQ(load + j["dropped_tokens"].get<int64_t>(), 16 * 64 * 2 * 4) << line;
        EXPECT_GE(j["expert_imbalance"].get<double>(), 1.0) << line;
        EXPECT_GT(j["aux_loss"].get<double>(), 0.0) << line;
    }
    r = run("run examples/moe_tiny.dist" + sets + " --set train.stop_after=20 --save " +
            ck.string() + " --metrics " + first.string());
    ASSERT_EQ(r.status, 0) << r.err;
    r = run("run examples/moe_tiny.dist" + sets + " --set mesh.ep=1 --resume " + ck.string() +
            " --metrics " + rest.string());
    ASSERT_EQ(r.status, 0) << r.err;
    std::vector<double> resumed = losses(first), after = losses(rest);
    resumed.insert(resumed.end(), after.begin(), after.end());
    ASSERT_EQ(resumed.size(), all.size());
    for (size_t i = 0; i < all.size(); ++i)
        EXPECT_NEAR(resumed[i], all[i], 1e-5 * all[i]) << "step " << i + 1;
    fs::remove_all(dir);
}

// bf16 trains (and says so) over pipeline stages, saves its weights in BF16 when asked, and an
// f32 run starts from them.
TEST(Cli, Bf16TrainsAndSavesBf16WeightsThatAnF32RunLoads) {
    fs::path dir = fs::temp_directory_path() / ("dist-bf16-" + std::to_string(::getpid()));
    fs::remove_all(dir);
    Result bf16 = run("run examples/gpt_tiny.dist --set train.precision=bf16 "
                      "--set train.stop_after=2 --set mesh.pp=2 --set mesh.devices='cpu x 2' "
                      "--set train.checkpoint.dtype=bf16 --save " +
                      dir.string());
    EXPECT_EQ(bf16.status, 0) << bf16.err;
    EXPECT_NE(bf16.out.find("tokens each, in bf16, on 2 cpu ranks"), std::string::npos) << bf16.out;
    EXPECT_NE(bf16.out.find("step time: measured"), std::string::npos) << bf16.out;
    std::ifstream weights(dir / "model.safetensors", std::ios::binary);
    std::string head(4096, '\0');
    weights.read(head.data(), static_cast<std::streamsize>(head.size()));
    EXPECT_NE(head.find("\"dtype\":\"BF16\""), std::string::npos);
    EXPECT_EQ(head.find("\"dtype\":\"F32\""), std::string::npos);
    Result f32 = run("run examples/gpt_tiny.dist --set train.stop_after=1 --load " + dir.string());
    EXPECT_EQ(f32.status, 0) << f32.err;
    EXPECT_EQ(run("sim examples/gpt_tiny.dist --set train.precision=bf16").status, 0);
    fs::remove_all(dir);
}

TEST(Cli, RunRefusesWhatItCannotDoWithAMessage) {
    if (dist::kernels::gpu_count() == 0) {
        Result gpu = run("run examples/gpt2_124m_8xh200.dist");
        EXPECT_EQ(gpu.status, 1);
        EXPECT_NE(gpu.err.find("the mesh is 8 h200-sxm device(s)"), std::string::npos) << gpu.err;
        EXPECT_NE(gpu.err.find("mesh.devices=cpu"), std::string::npos) << gpu.err;
    }
    Result generate = run("generate examples/gpt2_124m_8xh200.dist --load /no/such --prompt hi");
    EXPECT_EQ(generate.status, 1);
    EXPECT_NE(generate.err.find("this command runs meshes of `cpu` devices"), std::string::npos)
        << generate.err;
    Result plan = run("run examples/gpt_tiny.dist --set mesh.pp=2 --set schedule.kind=zb_h1 "
                      "--set schedule.microbatches=1");
    EXPECT_EQ(plan.status, 1);
    EXPECT_NE(plan.err.find("microbatches"), std::string::npos) << plan.err;
    Result nodata = run("run examples/gpt_tiny.dist --set 'train.data=text(\"/no/such/file\")'");
    EXPECT_EQ(nodata.status, 1);
    EXPECT_NE(nodata.err.find("cannot find data file"), std::string::npos) << nodata.err;
    Result resume = run("run examples/gpt_tiny.dist --resume /no/such/dir");
    EXPECT_EQ(resume.status, 1);
    EXPECT_NE(resume.err.find("state.json"), std::string::npos) << resume.err;
    Result both = run("run examples/gpt_tiny.dist --resume a --load b");
    EXPECT_EQ(both.status, 2);
    // An unwritable checkpoint folder is found before training, not after it.
    Result save = run("run examples/gpt_tiny.dist --save /proc/no/such/folder");
    EXPECT_EQ(save.status, 1);
    EXPECT_NE(save.err.find("cannot save checkpoints into `/proc/no/such/folder`"),
              std::string::npos)
        << save.err;
    EXPECT_EQ(save.out.find("training"), std::string::npos) << save.out;
    // With --procs, a script that does not check or plan, fewer ranks than processes, or a mesh
    // this machine cannot run is refused once, before any process starts.
    std::vector<std::pair<std::string, std::string>> refused = {
        {"gpt_tiny.dist --procs 2 --set mesh.tp=3", "tp = 3 does not divide"},
        {"gpt_tiny.dist --procs 3 --set mesh.pp=2",
         "error: --procs 3 for 2 ranks: every process needs at least one rank"},
        {"gpt_tiny.dist --procs 2 --set mesh.pp=2 --set schedule.kind=zb_h1 --set "
         "schedule.microbatches=1",
         "microbatches"}};
    if (dist::kernels::gpu_count() == 0)
        refused.push_back({"gpt2_124m_8xh200.dist --procs 2", "the mesh is 8 h200-sxm device(s)"});
    for (const auto& [args, why] : refused) {
        Result apart = run("run examples/" + args);
        EXPECT_EQ(apart.status, 1) << args;
        EXPECT_NE(apart.err.find(why), std::string::npos) << args << ": " << apart.err;
        EXPECT_EQ(apart.err.find("error: "), apart.err.rfind("error: "))
            << args << ": " << apart.err;
        EXPECT_EQ(apart.err.find("[0]"), std::string::npos) << args << ": " << apart.err;
        EXPECT_EQ(apart.out.find("[0]"), std::string::npos) << args << ": " << apart.out;
    }
}

namespace {

std::vector<double> losses_of(const fs::path& metrics) {
    std::vector<double> out;
    std::ifstream in(metrics);
    std::string line;
    while (std::getline(in, line)) {
        auto at = line.find("\"loss\":");
        if (at != std::string::npos) out.push_back(std::stod(line.substr(at + 7)));
    }
    return out;
}

} // namespace

TEST(Cli, RunSavedOnOneMeshResumesOnAnotherAsIfUninterrupted) {
    fs::path dir = fs::temp_directory_path() / ("dist_cli_mesh_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
    const std::string small =
        "run examples/gpt_tiny.dist --quiet --set model.width=32 --set model.context=16 "
        "--set train.batch=8 --set 'train.data=synthetic()' --set schedule.microbatches=2 ";
    Result whole = run(small + "--set train.stop_after=4 --metrics " + (dir / "a.jsonl").string());
    ASSERT_EQ(whole.status, 0) << whole.err;
    // Two steps on dp 2 x tp 2 x pp 2, then two more on pp 2 with interleaved virtual stages.
    Result first = run(small + "--set train.stop_after=2 --set mesh.dp=2 --set mesh.tp=2 " +
                       "--set mesh.pp=2 --save " + (dir / "ck").string() + " --metrics " +
                       (dir / "b.jsonl").string());
    ASSERT_EQ(first.status, 0) << first.err;
    EXPECT_NE(first.out.find("8 cpu ranks (dp 2, tp 2, pp 2, 1f1b)"), std::string::npos)
        << first.out;
    Result second =
        run(small + "--set train.stop_after=4 --set mesh.pp=2 " +
            "--set schedule.kind=interleaved_1f1b --set schedule.virtual_stages=2 " + "--resume " +
            (dir / "ck").string() + " --metrics " + (dir / "b.jsonl").string());
    ASSERT_EQ(second.status, 0) << second.err;
    std::vector<double> a = losses_of(dir / "a.jsonl"), b = losses_of(dir / "b.jsonl");
    ASSERT_EQ(a.size(), 4u);
    ASSERT_EQ(b.size(), 4u);
    for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(a[i], b[i], 1e-5 * a[i]) << "step " << i + 1;
    fs::remove_all(dir);
}

// Under ZeRO every data-parallel rank keeps a share of the AdamW moments (and under ZeRO 3 of
// the weights); the checkpoint holds them whole, so a run saved under ZeRO 3 on dp 4 resumes on
// a plain pp 2 mesh, and one saved there resumes under ZeRO 1 on dp 2, with the losses of the
// uninterrupted run.
TEST(Cli, RunSavedUnderZeroResumesWithoutItAndTheOtherWayRound) {
    fs::path dir = fs::temp_directory_path() / ("dist_cli_zero_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
    const std::string small =
        "run examples/gpt_tiny.dist --quiet --set model.width=32 --set model.context=16 "
        "--set train.batch=8 --set 'train.data=synthetic()' --set schedule.microbatches=2 ";
    Result whole = run(small + "--set train.stop_after=6 --metrics " + (dir / "a.jsonl").string());
    ASSERT_EQ(whole.status, 0) << whole.err;
    auto part = [&](int stop, const std::string& mesh, const std::string& from,
                    const std::string& to) {
        Result r = run(small + "--set train.stop_after=" + std::to_string(stop) + " " + mesh +
                       (from.empty() ? "" : " --resume " + (dir / from).string()) + " --save " +
                       (dir / to).string() + " --metrics " + (dir / "b.jsonl").string());
        EXPECT_EQ(r.status, 0) << r.err;
        return r;
    };
    Result first = part(2, "--set mesh.dp=4 --set mesh.zero=3", "", "ck1");
    EXPECT_NE(first.out.find("4 cpu ranks (dp 4, tp 1, pp 1, ZeRO 3, 1f1b)"), std::string::npos)
        << first.out;
    part(4, "--set mesh.pp=2", "ck1", "ck2");
    part(6, "--set mesh.dp=2 --set mesh.zero=1", "ck2", "ck3");
    std::vector<double> a = losses_of(dir / "a.jsonl"), b = losses_of(dir / "b.jsonl");
    ASSERT_EQ(a.size(), 6u);
    ASSERT_EQ(b.size(), 6u);
    for (size_t i = 0; i < 6; ++i) EXPECT_NEAR(a[i], b[i], 1e-5 * a[i]) << "step " << i + 1;
    fs::remove_all(dir);
}

// cp 2 gives each rank two chunks of 3 of a 12-token sequence; sp over tp 3 cuts those 6 tokens
// in 3 shards of 2, the middle one across the two chunks (positions 3 apart). The losses are
// one device's.
TEST(Cli, SequenceShardsAcrossTheTwoContextChunksKeepTheirPositions) {
    fs::path dir = fs::temp_directory_path() / ("dist_cli_cpsp_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
    const std::string small =
        "run examples/gpt_tiny.dist --quiet --set model.width=24 --set model.heads=3 "
        "--set model.context=12 --set model.vocab=258 --set 'train.data=synthetic()' "
        "--set train.batch=4 --set train.stop_after=3 ";
    Result one = run(small + "--metrics " + (dir / "a.jsonl").string());
    ASSERT_EQ(one.status, 0) << one.err;
    Result mesh = run(small + "--set mesh.cp=2 --set mesh.tp=3 --set mesh.sp=true --metrics " +
                      (dir / "b.jsonl").string());
    ASSERT_EQ(mesh.status, 0) << mesh.err;
    std::vector<double> a = losses_of(dir / "a.jsonl"), b = losses_of(dir / "b.jsonl");
    ASSERT_EQ(a.size(), 3u);
    ASSERT_EQ(b.size(), 3u);
    for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(a[i], b[i], 1e-5 * a[i]) << "step " << i + 1;
    fs::remove_all(dir);
}

// The run's memory line: the host allocator's peak over every tensor of the run beside the most
// the simulated ranks hold at once, on one device and across pipeline, tensor- and sequence-
// parallel and context-parallel ranks, in f32 and bf16 (the working memory of
// docs/schedules.md: what each phase holds beside what a microbatch keeps).
TEST(Cli, RunsMemoryPeakIsTheOneTheModelPredicts) {
    const std::string base = "run examples/gpt_tiny.dist --quiet --set 'train.data=synthetic()' "
                             "--set train.stop_after=2 ";
    for (const std::string sets :
         {"", "--set train.precision=bf16 --set schedule.recompute=full ",
          "--set mesh.pp=2 --set schedule.microbatches=4 ",
          "--set mesh.pp=2 --set schedule.kind=zb_h1 --set schedule.microbatches=4 "
          "--set train.precision=bf16 ",
          "--set mesh.tp=2 --set mesh.sp=true ", "--set mesh.cp=2 "}) {
        Result r = run(base + sets);
        ASSERT_EQ(r.status, 0) << sets << ": " << r.err;
        double measured = 0, predicted = 0;
        const size_t at = r.out.find("memory: measured ");
        ASSERT_NE(at, std::string::npos) << r.out;
        const std::string line = r.out.substr(at, r.out.find('\n', at) - at);
        ASSERT_EQ(std::sscanf(line.c_str(), "memory: measured %lf MB", &measured), 1) << line;
        const size_t p = line.find("predicted ");
        ASSERT_NE(p, std::string::npos) << line;
        ASSERT_EQ(std::sscanf(line.c_str() + p, "predicted %lf MB", &predicted), 1) << line;
        // Two pipeline ranks in one process reach their peaks at times that depend on how the
        // host interleaves their steps: the measured sum can fall short of the simulated one,
        // whose ranks keep the schedule's timing, by a few points more than it can exceed it.
        const bool pipelined = sets.find("mesh.pp=2") != std::string::npos;
        EXPECT_LE(predicted / measured, pipelined ? 1.15 : 1.1) << sets << ": " << line;
        EXPECT_GE(predicted / measured, 0.9) << sets << ": " << line;
    }
}

// ZeRO 2 as this runtime runs it keeps whole gradient buffers until the step's reduce-scatter,
// where the memory model shards them: the run says how much of its peak that is, and the
// prediction with it added matches the measured peak. ZeRO 1 keeps them whole in both.
// ZeRO 2 keeps each rank's share of the gradients, whole ones only for the units between their
// weight gradient and its reduce-scatter: the measured peak drops below ZeRO 1's by at least
// the half of the gradients each of the two ranks gives up, and stays near the prediction.
TEST(Cli, RunUnderZeroTwoHoldsTheGradientSharesItPredicts) {
    const std::string base = "run examples/gpt_tiny.dist --quiet --set 'train.data=synthetic()' "
                             "--set train.stop_after=2 --set mesh.dp=2 ";
    auto figure = [](const std::string& out, const std::string& from, const std::string& word) {
        const size_t at = out.find(from);
        if (at == std::string::npos) return -1.0;
        const std::string line = out.substr(at, out.find('\n', at) - at);
        const size_t w = line.find(word);
        double x = -1;
        if (w != std::string::npos) std::sscanf(line.c_str() + w + word.size(), "%lf", &x);
        return x;
    };
    Result one = run(base + "--set mesh.zero=1");
    ASSERT_EQ(one.status, 0) << one.err;
    Result two = run(base + "--set mesh.zero=2");
    ASSERT_EQ(two.status, 0) << two.err;
    const double measured_one = figure(one.out, "memory: measured", "measured ");
    const double measured = figure(two.out, "memory: measured", "measured ");
    const double predicted = figure(two.out, "memory: measured", "predicted ");
    ASSERT_GT(measured_one, 0) << one.out;
    ASSERT_GT(measured, 0) << two.out;
    ASSERT_GT(predicted, 0) << two.out;
    // gpt_tiny's f32 gradients, 4 bytes per parameter: each of the two ranks keeps half.
    Result check = run("check examples/gpt_tiny.dist");
    ASSERT_EQ(check.status, 0) << check.err;
    const double millions = figure(check.out, "ok (gpt, ", "ok (gpt, ");
    ASSERT_GT(millions, 0) << check.out;
    EXPECT_LT(measured, measured_one - 2 * 4.0 * millions / 2 + 0.5) << one.out << two.out;
    EXPECT_NEAR(predicted / measured, 1.0, 0.1) << two.out;
    // ZeRO 3 shares the weights too, gathering a unit at a time: its prediction holds as well.
    Result three = run(base + "--set mesh.zero=3");
    ASSERT_EQ(three.status, 0) << three.err;
    const double measured_three = figure(three.out, "memory: measured", "measured ");
    const double predicted_three = figure(three.out, "memory: measured", "predicted ");
    ASSERT_GT(measured_three, 0) << three.out;
    EXPECT_NEAR(predicted_three / measured_three, 1.0, 0.1) << three.out;
}

// The last step as it ran and as the simulator predicts it: one trace of two processes with the
// same actions on every rank, both timelines in one picture, and the two step times and bubbles
// on the run's last line, the measured ones the medians of the steps after the first.
TEST(Cli, RunWritesTheMeasuredStepBesideThePredictedOne) {
    fs::path dir = fs::temp_directory_path() / ("dist_cli_trace_" + std::to_string(::getpid()));
    fs::create_directories(dir);
    Result r = run("run examples/gpt_tiny.dist --quiet --set model.width=32 --set train.batch=4 "
                   "--set 'train.data=synthetic()' --set train.stop_after=6 --set mesh.pp=2 "
                   "--set schedule.microbatches=4 --trace " +
                   (dir / "t.json").string() + " --svg " + (dir / "t.svg").string() +
                   " --metrics " + (dir / "m.jsonl").string());
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_NE(r.out.find("step time: measured "), std::string::npos) << r.out;
    // Each step's bubble in the metrics: two stages idle while the pipeline fills and drains.
    std::vector<double> steps, bubbles;
    std::istringstream lines(slurp(dir / "m.jsonl"));
    for (std::string line; std::getline(lines, line);) {
        nlohmann::json m = nlohmann::json::parse(line);
        ASSERT_TRUE(m.contains("bubble")) << line;
        EXPECT_GT(m["bubble"].get<double>(), 0.0) << line;
        EXPECT_LT(m["bubble"].get<double>(), 1.0) << line;
        steps.push_back(m["step_time_s"].get<double>());
        bubbles.push_back(m["bubble"].get<double>());
    }
    ASSERT_EQ(bubbles.size(), 6u);
    // Steps 2 to 6: the middle one of five, and the middle half between the second and the
    // fourth (the 25th and 75th percentiles of five fall on them).
    auto after_first = [](std::vector<double> v, size_t k) {
        std::sort(v.begin() + 1, v.end());
        return v[1 + k];
    };
    char expected[160];
    std::snprintf(expected, sizeof expected,
                  "step time: measured %.1f ms (the middle half of the steps %.1f-%.1f ms), "
                  "predicted ", // as ms() prints
                  1e3 * after_first(steps, 2), 1e3 * after_first(steps, 1),
                  1e3 * after_first(steps, 3));
    EXPECT_NE(r.out.find(expected), std::string::npos) << expected << "\n" << r.out;
    std::snprintf(expected, sizeof expected, "bubble: measured %.1f%%",
                  100 * after_first(bubbles, 2));
    EXPECT_NE(r.out.find(expected), std::string::npos) << expected << "\n" << r.out;
    // gpt_tiny's `cpu` profile is the datasheet one: the run says how to measure this machine.
    EXPECT_NE(r.out.find("(the cpu profile is a datasheet guess, not this machine: "),
              std::string::npos)
        << r.out;
    EXPECT_EQ(r.out.find("\npace: "), std::string::npos) << r.out; // no calibrated rate to time
    EXPECT_NE(r.out.find("predicted "), std::string::npos) << r.out;
    auto j = nlohmann::json::parse(slurp(dir / "t.json"));
    std::map<int, std::string> processes;
    std::map<int, std::map<int, std::vector<std::string>>> actions; // pid -> rank -> names
    for (const auto& e : j["traceEvents"]) {
        if (e["ph"] == "M" && e["name"] == "process_name")
            processes[e["pid"].get<int>()] = e["args"]["name"].get<std::string>();
        if (e["ph"] == "X")
            actions[e["pid"].get<int>()][e["tid"].get<int>()].push_back(
                e["name"].get<std::string>());
    }
    ASSERT_EQ(processes.size(), 2u) << slurp(dir / "t.json");
    EXPECT_EQ(processes[0].rfind("measured", 0), 0u) << processes[0];
    EXPECT_EQ(processes[1].rfind("predicted", 0), 0u) << processes[1];
    ASSERT_EQ(actions[0].size(), 2u); // a track per rank in each
    for (int rank = 0; rank < 2; ++rank) {
        std::vector<std::string> measured = actions[0][rank], predicted = actions[1][rank];
        // Four microbatches, a forward and a backward each, and the optimizer step.
        EXPECT_EQ(measured.size(), 2u * 4 + 1) << "rank " << rank;
        std::sort(measured.begin(), measured.end());
        std::sort(predicted.begin(), predicted.end());
        EXPECT_EQ(measured, predicted) << "rank " << rank;
    }
    std::string svg = slurp(dir / "t.svg");
    EXPECT_NE(svg.find(">measured"), std::string::npos);
    EXPECT_NE(svg.find(">predicted"), std::string::npos);
    fs::remove_all(dir);
}

// The data-parallel collectives on each rank's communication track, measured and predicted:
// ZeRO 3's gathers and reduce-scatters (unit by unit as they ran; as predicted, the action's
// own unit and the rest of them) and ZeRO 0's bucket all-reduces, the same actions in both,
// one after another on the thread, inside the step.
TEST(Cli, RunTracesTheCollectivesOnACommunicationTrackMeasuredAndPredicted) {
    fs::path dir = fs::temp_directory_path() / ("dist_cli_comm_" + std::to_string(::getpid()));
    fs::create_directories(dir);
    for (const char* zero : {"3", "0"}) {
        Result r = run("run examples/gpt_tiny.dist --quiet --set model.width=32 --set "
                       "train.batch=4 --set 'train.data=synthetic()' --set train.stop_after=2 "
                       "--set mesh.dp=2 --set mesh.pp=2 --set schedule.microbatches=2 "
                       "--set mesh.zero=" +
                       std::string(zero) + " --trace " + (dir / "t.json").string());
        ASSERT_EQ(r.status, 0) << r.err;
        auto j = nlohmann::json::parse(slurp(dir / "t.json"));
        struct Event {
            std::string name;
            double start, end;
        };
        std::map<int, std::map<int, std::string>> tracks;        // pid -> tid -> name
        std::map<int, std::map<int, std::vector<Event>>> events; // pid -> tid -> events
        for (const auto& e : j["traceEvents"]) {
            if (e["ph"] == "M" && e["name"] == "thread_name")
                tracks[e["pid"].get<int>()][e["tid"].get<int>()] =
                    e["args"]["name"].get<std::string>();
            if (e["ph"] == "X") {
                double ts = e["ts"].get<double>();
                events[e["pid"].get<int>()][e["tid"].get<int>()].push_back(
                    {e["name"].get<std::string>(), ts, ts + e["dur"].get<double>()});
            }
        }
        const int ranks = 4;
        for (int rank = 0; rank < ranks; ++rank) {
            std::set<std::string> names[2];
            size_t predicted_spans = 0;
            for (int pid = 0; pid < 2; ++pid) {
                ASSERT_EQ(tracks[pid][ranks + rank],
                          "rank " + std::to_string(rank) + " communication")
                    << "zero " << zero << " pid " << pid;
                double step_end = 0;
                for (const Event& x : events[pid][rank]) step_end = std::max(step_end, x.end);
                std::vector<Event> comm = events[pid][ranks + rank];
                ASSERT_FALSE(comm.empty()) << "zero " << zero << " rank " << rank;
                std::sort(comm.begin(), comm.end(),
                          [](const Event& a, const Event& b) { return a.start < b.start; });
                for (size_t i = 0; i < comm.size(); ++i) {
                    const Event& x = comm[i];
                    names[pid].insert(x.name);
                    const bool expected =
                        std::string(zero) == "3"
                            ? x.name.find("GATHER_") != std::string::npos ||
                                  x.name.find("REDUCE_SCATTER") != std::string::npos
                            : x.name.find("REDUCE_GRAD") != std::string::npos;
                    EXPECT_TRUE(expected) << x.name << " under ZeRO " << zero;
                    EXPECT_GE(x.start, 0.0);
                    EXPECT_LE(x.end, step_end + 1.0) << x.name; // microseconds
                    if (i > 0) {
                        EXPECT_GE(x.start, comm[i - 1].end - 1.0) << x.name << " overlaps";
                    }
                }
                if (pid == 1) predicted_spans = comm.size();
            }
            EXPECT_EQ(names[0], names[1]) << "zero " << zero << " rank " << rank;
            // Predicted: an all-reduce is one span; a ZeRO gather or reduce-scatter two, the
            // action's own unit and the rest, which the compute action that needs or writes
            // them queues (every stage here has several units).
            EXPECT_EQ(predicted_spans, (std::string(zero) == "3" ? 2 : 1) * names[1].size())
                << "zero " << zero << " rank " << rank;
            if (std::string(zero) == "3") {
                // Both microbatches' forward and backward gathers and reduce-scatters.
                EXPECT_EQ(names[1].size(), 6u) << "rank " << rank;
            }
        }
    }
    fs::remove_all(dir);
}

// Expert parallelism: every all-to-all the plan lists is in both traces, inside the compute
// action that ran it.
TEST(Cli, RunTracesEachAllToAllInsideItsComputeMeasuredAndPredicted) {
    fs::path dir = fs::temp_directory_path() / ("dist_cli_a2a_" + std::to_string(::getpid()));
    fs::create_directories(dir);
    Result r = run("run examples/moe_tiny.dist --quiet --set train.batch=4 "
                   "--set 'train.data=synthetic()' --set train.stop_after=2 --trace " +
                   (dir / "t.json").string());
    ASSERT_EQ(r.status, 0) << r.err;
    auto j = nlohmann::json::parse(slurp(dir / "t.json"));
    struct Event {
        std::string name;
        double start, end;
    };
    std::map<int, std::map<int, std::vector<Event>>> events; // pid -> rank -> events
    for (const auto& e : j["traceEvents"])
        if (e["ph"] == "X") {
            double ts = e["ts"].get<double>();
            events[e["pid"].get<int>()][e["tid"].get<int>()].push_back(
                {e["name"].get<std::string>(), ts, ts + e["dur"].get<double>()});
        }
    ASSERT_EQ(events.size(), 2u);
    for (int rank = 0; rank < 2; ++rank) {
        std::vector<std::string> names[2];
        for (int pid = 0; pid < 2; ++pid) {
            int exchanges = 0;
            for (const Event& x : events[pid][rank]) {
                names[pid].push_back(x.name);
                if (x.name.find("DISPATCH_") == std::string::npos &&
                    x.name.find("COMBINE_") == std::string::npos)
                    continue;
                ++exchanges;
                bool inside = false;
                for (const Event& c : events[pid][rank])
                    if (c.name.find('@') == std::string::npos && c.name != "STEP" &&
                        c.start <= x.start + 1e-3 && x.end <= c.end + 1e-3)
                        inside = true;
                EXPECT_TRUE(inside) << "pid " << pid << " rank " << rank << ": " << x.name;
            }
            // Four blocks, one microbatch: a dispatch and a combine per block each way.
            EXPECT_EQ(exchanges, 4 * 2 * 2) << "pid " << pid << " rank " << rank;
            std::sort(names[pid].begin(), names[pid].end());
        }
        EXPECT_EQ(names[0], names[1]) << "rank " << rank;
    }
    fs::remove_all(dir);
}

TEST(Cli, GenerateStreamsTheSameGreedyTextOnAnyMesh) {
    fs::path dir = fs::temp_directory_path() / ("dist_cli_gen_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    Result trained = run("run examples/gpt_tiny.dist --quiet --set model.width=32 "
                         "--set train.batch=4 --set 'train.data=synthetic()' "
                         "--set train.stop_after=2 --save " +
                         dir.string());
    ASSERT_EQ(trained.status, 0) << trained.err;
    const std::string gen = "generate examples/gpt_tiny.dist --set model.width=32 --load " +
                            dir.string() +
                            " --set generate.temperature=0 --set generate.max_tokens=20 ";
    Result one = run(gen + "--prompt 'You will'");
    ASSERT_EQ(one.status, 0) << one.err;
    EXPECT_EQ(one.out.size(), 21u) << one.out; // the 20 new bytes and a newline, nothing else
    EXPECT_NE(one.err.find("20 tokens in"), std::string::npos) << one.err;
    Result mesh = run(gen + "--prompt 'You will' --set mesh.pp=2 --set mesh.tp=2");
    ASSERT_EQ(mesh.status, 0) << mesh.err;
    EXPECT_EQ(mesh.out, one.out);
    Result none = run(gen + "< /dev/null");
    EXPECT_EQ(none.status, 2);
    EXPECT_NE(none.err.find("no prompt"), std::string::npos) << none.err;
    fs::remove_all(dir);
}
