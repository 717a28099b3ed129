// repl_test.cpp: `dist repl` driven through its standard input, as a script would drive it.
//
//   golden/repl/NAME.session -> the transcript (`--echo`: each command, then its answer, standard
//   output and standard error together), compared with NAME.expected. The first line,
//   `# dist repl ARGS`, gives the arguments (`<src>` is this checkout). The session runs in an
//   empty folder; the files it writes are checked afterwards (`.dist` checks, `.json` parses,
//   `.svg` is a drawing). DIST_GOLDEN_REWRITE=1 rewrites the expected files.
//
// Real training steps and timings change from run to run: those tests assert on structure.
#include "tests/common/dist_command.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <sys/wait.h>
#include <unistd.h>

namespace fs = std::filesystem;

namespace {

// out: standard output and standard error, as they interleave.
using Result = dist::tests::DistResult;

using dist::tests::slurp;

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
    for (size_t at = 0; (at = s.find(from, at)) != std::string::npos; at += to.size())
        s.replace(at, from.size(), to);
    return s;
}

// `ENV dist ARGS < input` in `dir` (ENV: settings, each followed by a space).
Result run_in(const fs::path& dir, const std::string& args, const std::string& input,
              const std::string& env = "") {
    fs::path in_file = dir / ".stdin";
    std::ofstream(in_file, std::ios::binary) << input;
    Result r = dist::tests::run_shell("cd '" + dir.string() + "' && " + env + DIST_BINARY + " " +
                                      args + " < '" + in_file.string() + "' 2>&1");
    fs::remove(in_file);
    return r;
}

// A fresh, empty folder for one test, removed at the end.
struct TempDir {
    fs::path path;
    explicit TempDir(const std::string& name) {
        path = fs::temp_directory_path() / ("dist-repl-" + name + "-" + std::to_string(::getpid()));
        fs::remove_all(path);
        fs::create_directories(path);
    }
    ~TempDir() { fs::remove_all(path); }
};

const std::string src = DIST_SOURCE_DIR;

class ReplGoldenTest : public testing::Test {
  public:
    explicit ReplGoldenTest(fs::path session) : session_(std::move(session)) {}

    void TestBody() override {
        std::string text = slurp(session_);
        const std::string head = "# dist repl";
        ASSERT_EQ(text.rfind(head, 0), 0u) << session_ << " must start with `" << head << "`";
        std::string args = text.substr(head.size(), text.find('\n') - head.size());
        TempDir dir(session_.stem().string());
        Result r = run_in(dir.path, "repl --echo" + replace_all(args, "<src>", src), text);
        EXPECT_EQ(r.status, 0) << r.out;
        std::string actual = replace_all(r.out, src, "<src>");
        fs::path expected_path = session_;
        expected_path.replace_extension(".expected");
        if (std::getenv("DIST_GOLDEN_REWRITE")) {
            std::ofstream(expected_path, std::ios::binary) << actual;
        } else {
            ASSERT_TRUE(fs::exists(expected_path))
                << expected_path << " is missing; run with DIST_GOLDEN_REWRITE=1 to create it";
            EXPECT_EQ(slurp(expected_path), actual) << "golden file " << session_;
        }
        // What the session wrote.
        for (const auto& e : fs::directory_iterator(dir.path)) {
            std::string ext = e.path().extension().string();
            if (ext == ".dist") {
                Result c = run_in(dir.path, "check " + e.path().filename().string(), "");
                EXPECT_EQ(c.status, 0) << e.path() << "\n" << c.out;
            } else if (ext == ".json") {
                nlohmann::json j = nlohmann::json::parse(slurp(e.path()), nullptr, false);
                EXPECT_FALSE(j.is_discarded()) << e.path();
                EXPECT_TRUE(j.contains("traceEvents")) << e.path();
            } else if (ext == ".svg") {
                EXPECT_NE(slurp(e.path()).find("<svg"), std::string::npos) << e.path();
            }
        }
    }

  private:
    fs::path session_;
};

// Registered before main runs, one test per session file.
const bool registered = [] {
    fs::path dir = fs::path(src) / "tests/golden/repl";
    std::vector<fs::path> files;
    if (fs::is_directory(dir))
        for (const auto& e : fs::directory_iterator(dir))
            if (e.path().extension() == ".session") files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
        testing::RegisterTest("Golden_repl", f.stem().string().c_str(), nullptr, nullptr, __FILE__,
                              __LINE__, [f]() -> testing::Test* { return new ReplGoldenTest(f); });
    }
    return true;
}();

TEST(Repl, RunTrainsRealStepsAndSetsThemBesideTheSimulator) {
    TempDir dir("run");
    Result r = run_in(dir.path, "repl", "set model.layers 2\nrun 2\nexplain\nquit\n");
    ASSERT_EQ(r.status, 0) << r.out;
    EXPECT_NE(r.out.find("training 2 steps on 2 cpu ranks (dp 1, tp 1, pp 2)"), std::string::npos)
        << r.out;
    for (const char* step : {"\nstep 1  loss ", "\nstep 2  loss "})
        EXPECT_NE(r.out.find(step), std::string::npos) << r.out;
    size_t last = r.out.find("step time: measured ");
    ASSERT_NE(last, std::string::npos) << r.out;
    EXPECT_NE(r.out.find(" ms, predicted ", last), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("; bubble: measured ", last), std::string::npos) << r.out;
    // `explain` then sets the run beside the prediction: every kind of action, the idle time
    // and the largest gap.
    size_t beside = r.out.find("measured against predicted, summed over the ranks:", last);
    ASSERT_NE(beside, std::string::npos) << r.out;
    for (const char* kind : {"\n  F ", "\n  B ", "\n  STEP ", "\n  idle ", "the largest gap: "})
        EXPECT_NE(r.out.find(kind, beside), std::string::npos) << kind << "\n" << r.out;
    // The loss of a byte model starts near ln(256).
    double loss = std::stod(r.out.substr(r.out.find("step 1  loss ") + 13));
    EXPECT_GT(loss, 4.0);
    EXPECT_LT(loss, 7.0);
}

// `run N` trains N steps, also past the script's `train.steps`; a step whose loss is not finite
// ends the run with the training session's message, and the session goes on.
TEST(Repl, RunTrainsAsManyStepsAsAskedAndStopsAtANonFiniteLoss) {
    TempDir dir("run-steps");
    Result r = run_in(dir.path, "repl",
                      "set model.layers 2\nset train.steps 2\nrun 3\nset train.optimizer.lr 1e30\n"
                      "run 3\nquit\n");
    ASSERT_EQ(r.status, 0) << r.out;
    EXPECT_NE(r.out.find("\nstep 3  loss "), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("step 2: the loss is non-finite"), std::string::npos) << r.out;
}

TEST(Repl, RunRefusesPlansTooBigForThisMachine) {
    TempDir dir("run-big");
    Result r = run_in(dir.path, "repl " + src + "/examples/llama3_8b_64xh100.dist", "run 1\n");
    EXPECT_EQ(r.status, 0);
    EXPECT_NE(r.out.find("error: `run` trains on this machine's CPU cores"), std::string::npos)
        << r.out;
}

TEST(Repl, RunOnAGpuMeshTrainsOnTheGpuOrSaysThereIsNone) {
    TempDir dir("run-gpu");
    Result r = run_in(dir.path, "repl", "set model.layers 2\nset mesh.devices h200\nrun 1\nsim\n");
    EXPECT_EQ(r.status, 0) << r.out; // the session goes on either way
    if (r.out.find("no GPU that CUDA can use") != std::string::npos ||
        r.out.find("no CUDA support") != std::string::npos) {
        EXPECT_NE(r.out.find("error: the mesh is 2 h200-sxm device(s)"), std::string::npos)
            << r.out;
        EXPECT_EQ(r.out.find("step 1  loss "), std::string::npos) << r.out;
    } else {
        EXPECT_NE(r.out.find("\nstep 1  loss "), std::string::npos) << r.out;
    }
    EXPECT_NE(r.out.find("makespan"), std::string::npos) << r.out; // `sim` after it still runs
}

TEST(Repl, SavedScriptGivesTheSameProgramAsTheOverrides) {
    TempDir dir("save");
    const std::string file = src + "/examples/llama3_8b_64xh100.dist";
    // mesh.pp 8 on the script's 64 devices takes mesh.dp 1 with it.
    Result r = run_in(dir.path, "repl " + file,
                      "set mesh.pp 8\nset schedule.kind interleaved_1f1b\nset model.layers 16\n"
                      "set train.optimizer.eps 1e-6\nset generate.top_k 5\nsave out.dist\n");
    ASSERT_EQ(r.status, 0) << r.out;
    ASSERT_NE(r.out.find("saved out.dist (6 values written into the script)"), std::string::npos)
        << r.out;
    auto program = [&](const std::string& args) {
        Result p = run_in(dir.path, "plan --json " + args, "");
        EXPECT_EQ(p.status, 0) << p.out.substr(0, 1000);
        nlohmann::json j = nlohmann::json::parse(p.out, nullptr, false);
        EXPECT_FALSE(j.is_discarded()) << p.out.substr(0, 1000);
        if (j.is_discarded()) return j;
        j.erase("file");
        j["program"].erase("file");
        return j;
    };
    nlohmann::json saved = program("out.dist");
    nlohmann::json direct =
        program(file + " --set mesh.pp=8 --set mesh.dp=1 --set schedule.kind=interleaved_1f1b "
                       "--set model.layers=16 --set train.optimizer.eps=1e-6 --set "
                       "generate.top_k=5");
    EXPECT_FALSE(direct.is_discarded());
    EXPECT_TRUE(saved == direct) << "the saved script plans differently from the overrides";
    // The script's comments survive.
    EXPECT_NE(slurp(dir.path / "out.dist").find("# llama3_8b_64xh100.dist: Llama 3 8B"),
              std::string::npos);
}

TEST(Repl, EndOfInputEndsTheSessionWithStatusZero) {
    TempDir dir("eof");
    Result r = run_in(dir.path, "repl", "sim\n");
    EXPECT_EQ(r.status, 0) << r.out;
    EXPECT_NE(r.out.find("makespan"), std::string::npos) << r.out;
}

TEST(Repl, AMissingScriptExitsOneARefusedSetDoesNot) {
    TempDir dir("bad");
    Result r = run_in(dir.path, "repl " + src + "/examples/gpt_tiny.dist --set mesh.tp=3", "");
    EXPECT_EQ(r.status, 0) << r.out; // a bad --set is a refused `set`: the session goes on
    EXPECT_NE(r.out.find("error: tp = 3 does not divide"), std::string::npos) << r.out;
    Result missing = run_in(dir.path, "repl no/such/file.dist", "");
    EXPECT_EQ(missing.status, 1);
    EXPECT_NE(missing.out.find("cannot read `no/such/file.dist`"), std::string::npos)
        << missing.out;
}

// `compare` over the ZeRO stages of Llama 3 8B on 64 A100s: the whole replica does not fit,
// and each stage shards more of it (the fullest rank's peak falls from 1 to 3; stage 1 keeps
// 8 bytes of weights and gradients per parameter, 64 GB, and exceeds the 80 GB with its
// activations).
TEST(Repl, CompareShowsWhatEachZeroStageSaves) {
    TempDir dir("zero");
    Result r = run_in(dir.path, "repl " + src + "/examples/llama3_8b_fsdp_64xa100.dist",
                      "compare mesh.zero=0,1,2,3\n");
    ASSERT_EQ(r.status, 0) << r.out;
    EXPECT_NE(r.out.find("0         error: the model does not fit"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(" GB    NO "), std::string::npos) << r.out;
    std::regex row(R"(\n([123]) +[\d.]+ m?s +[\d.]+ +([\d.]+) GB +(yes|NO))");
    std::vector<double> peaks;
    for (std::sregex_iterator it(r.out.begin(), r.out.end(), row), end; it != end; ++it)
        peaks.push_back(std::stod((*it)[2]));
    ASSERT_EQ(peaks.size(), 3u) << r.out;
    EXPECT_GT(peaks[0], peaks[1]) << r.out;
    EXPECT_GT(peaks[1], peaks[2]) << r.out;
}

// Two pipeline ranks on a calibrated machine of one core: when both have work, one waits for
// the core, and `explain` sets that wait apart from the pipeline's own.
TEST(Repl, ExplainSetsApartTheWaitForACoreWhereRanksOutnumberTheCores) {
    TempDir dir("one-core");
    fs::create_directories(dir.path / "hardware");
    Result cal = run_in(dir.path, "calibrate --quick --cores 1 --out hardware/one.toml", "");
    ASSERT_EQ(cal.status, 0) << cal.out;
    const std::string args = "repl " + src +
                             "/examples/gpt_tiny.dist --set mesh.devices=one --set mesh.pp=2 "
                             "--set schedule.microbatches=4";
    const std::string env = "DIST_PATH='" + dir.path.string() + "' ";
    Result r = run_in(dir.path, args, "explain\n", env);
    ASSERT_EQ(r.status, 0) << r.out;
    EXPECT_NE(r.out.find("waiting for a core: the host's ranks outnumber its cores"),
              std::string::npos)
        << r.out;
    // With a core for each rank, no rank waits for one.
    Result two = run_in(dir.path, args + " --set mesh.pp=1", "explain\n", env);
    ASSERT_EQ(two.status, 0) << two.out;
    EXPECT_EQ(two.out.find("waiting for a core"), std::string::npos) << two.out;
    // `run` sets the measured steps beside the calibrated profile's prediction, with no word of
    // calibrating; on the `cpu` datasheet profile it says how to.
    Result ran = run_in(dir.path, args + " --set mesh.pp=1", "run 2\nexplain\n", env);
    ASSERT_EQ(ran.status, 0) << ran.out;
    EXPECT_NE(ran.out.find("(`dist sim` with the one profile)"), std::string::npos) << ran.out;
    EXPECT_EQ(ran.out.find("dist calibrate"), std::string::npos) << ran.out;
    // ... and times again one of the profile's matmuls, the squarest forward of the quick
    // calibration's one thread and its shapes of 32 and 256, against its calibrated rate.
    EXPECT_NE(ran.out.find("\npace: the profile's nt matmul 256 x 256 x 256 on 1 thread ran at "),
              std::string::npos)
        << ran.out;
    // `explain` then gives, under F, its time on a core: measured by the rank's CPU clock,
    // predicted by the simulator of ranks sharing the cores.
    const size_t f = ran.out.find("\n  F ", ran.out.find("measured against predicted"));
    ASSERT_NE(f, std::string::npos) << ran.out;
    EXPECT_EQ(ran.out.find("\n    of it on a core ", f), ran.out.find('\n', f + 1)) << ran.out;
    Result guess = run_in(dir.path, "repl " + src + "/examples/gpt_tiny.dist", "run 2\n", "");
    ASSERT_EQ(guess.status, 0) << guess.out;
    EXPECT_NE(guess.out.find("the cpu profile is a datasheet guess, not this machine: `dist "
                             "calibrate --device cpu --out"),
              std::string::npos)
        << guess.out;
    EXPECT_EQ(guess.out.find("pace:"), std::string::npos) << guess.out; // nothing to time again
}

TEST(Repl, AThousandRanksPlanAndSimulate) {
    TempDir dir("1024");
    Result r = run_in(dir.path,
                      "repl " + src +
                          "/examples/llama3_8b_64xh100.dist --set schedule.microbatches=16 "
                          "--set mesh.dp=32",
                      "sim\nmemory\nexplain\ncompare zb_h1 zbv\n");
    ASSERT_EQ(r.status, 0) << r.out.substr(0, 2000);
    EXPECT_NE(r.out.find("1024 ranks (dp 32, tp 8, pp 4)"), std::string::npos);
    EXPECT_NE(r.out.find("critical path ("), std::string::npos);
    EXPECT_NE(r.out.find("the other 1020 ranks"), std::string::npos);
    EXPECT_NE(r.out.find("\nzbv "), std::string::npos);
    EXPECT_EQ(r.out.find("error"), std::string::npos) << r.out.substr(0, 4000);
}

} // namespace

// `search` ranks the layouts of the current program; `use N` adopts one, after which a search
// finds the session's own layout in that row.
TEST(Repl, SearchAndUseAdoptARow) {
    TempDir dir("search");
    Result r = run_in(dir.path, "repl " + src + "/examples/gpt2_124m_8xh200.dist",
                      "use 1\nsearch --top 2 --colour\nsearch --top 2\nuse 2\nsearch --top 2\n"
                      "search --top 1 --devices h100 x 16\nuse 1\nshow\nquit\n");
    ASSERT_EQ(r.status, 0) << r.out;
    EXPECT_NE(r.out.find("error: there are no search results to use"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("error: `search` takes `--top K` and `--devices"), std::string::npos)
        << r.out;
    // The first search does not mark the script's layout among the two fastest; after `use 2`
    // the second search marks it there (a tie may put it first).
    size_t first = r.out.find("layouts: ");
    ASSERT_NE(first, std::string::npos) << r.out;
    EXPECT_NE(r.out.find("the best), rank"), std::string::npos) << r.out;
    size_t used = r.out.find("mesh.dp = ", first);
    ASSERT_NE(used, std::string::npos) << r.out;
    size_t second = r.out.find("layouts: ", used);
    ASSERT_NE(second, std::string::npos) << r.out;
    EXPECT_NE(r.out.find("* the script's layout", used), std::string::npos) << r.out;
    EXPECT_LT(r.out.find("* the script's layout", used), second) << r.out;
    // On other devices, `use` also moves the session to them.
    EXPECT_NE(r.out.find("search: gpt2_124m on 16 x h100-sxm"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("devices: h100 x 16"), std::string::npos) << r.out;
}
