// liveness_test.cpp: the ends of a job of several processes that the coordinator cannot see
// coming, and the front doors that share one training session. Each of process 0 and a member,
// killed (-9) or frozen (SIGSTOP, its connections open), ends every process within seconds
// with a message that names the lost process, and the last checkpoint loads whole. A job
// without a token is refused with how to set one. A learning rate of 1e30 either stops the run
// naming the non-finite value or, with `on_nonfinite: skip`, skips those steps on every rank
// and saves only finite weights. An application embedding libdist runs as a job's processes
// and gets the losses of `dist run`.
#include "tests/cluster/cluster_helpers.hpp"

#include "models/checkpoint.hpp"
#include "models/model.hpp"
#include "tests/common/checked_script.hpp"

#include <cmath>

using namespace dist::tests::cluster;

namespace {

// Every weight of the checkpoint in `dir`, read as a model of the test script's shapes: whether
// it loads and every value is finite ("" if so, else why not).
std::string checkpoint_problem(const Dir& dir, const fs::path& ck) {
    (void)dir;
    dist::Program program = dist::tests::checked_script(gpt_script, {});
    if (program.model.parameters == 0) return "the test script does not check";
    dist::models::Model model(program.model, 1);
    int64_t step = 0;
    std::string error = dist::models::load_training_state(ck.string(), model, step);
    if (!error.empty()) return error;
    for (auto& p : model.params().all()) {
        const float* v = p.value.data<float>();
        for (int64_t i = 0; i < p.value.numel(); ++i)
            if (!std::isfinite(v[i])) return p.name + " holds a non-finite value";
    }
    return "";
}

struct Loss {
    const char* name;
    int victim; // process
    int signal;
};

class Liveness : public ::testing::TestWithParam<Loss> {};

} // namespace

// A 2-process dp2 x pp2 job saving every 2 steps; once a checkpoint is there, one process is
// killed or frozen. The job ends (a 2 s heartbeat timeout each way), non-zero, with the
// survivors' attribution of the lost process, and leaves no process behind.
TEST_P(Liveness, ALostProcessEndsTheJobNamedAndTheCheckpointLoads) {
    const Loss loss = GetParam();
    Dir dir(std::string("liveness_") + loss.name);
    auto sets = mesh_sets(2, 1, 2, "1f1b", 2);
    sets.push_back("train.checkpoint.every=2");
    sets.push_back("train.checkpoint.dir=\"" + (dir / "ck") + "\"");
    sets.push_back("train.steps=100000");
    auto args = run_args(dir / "gpt.dist", sets, dir / "m.jsonl", 100000);
    args.insert(args.end(), {"--procs", "2"});
    Proc job(args, {{"DIST_HEARTBEAT_TIMEOUT", "2"}}, dir / "out", dir / "err");
    wait_until(
        job, [&] { return checkpoint_step(dir.path / "ck") >= 2; }, 120s);
    ASSERT_GE(checkpoint_step(dir.path / "ck"), 2) << slurp(dir / "err");
    std::vector<pid_t> procs = children_of(job.pid);
    ASSERT_EQ(procs.size(), 2u);
    const pid_t victim = procs[static_cast<size_t>(loss.victim)];
    ASSERT_EQ(::kill(victim, loss.signal), 0);
    std::optional<int> status = job.wait(60s); // killed as hung after 60 s
    ASSERT_TRUE(status.has_value()) << "the job did not end";
    EXPECT_NE(*status, 0);
    std::string err = slurp(dir / "err");
    // The survivor's own words, not the launcher's line: "process N (ranks ..., pid P)".
    const std::string named = "process " + std::to_string(loss.victim) + " (ranks ";
    EXPECT_NE(err.find(named), std::string::npos) << err;
    EXPECT_NE(err.find("pid " + std::to_string(victim) + ")"), std::string::npos) << err;
    if (loss.victim == 0) {
        EXPECT_NE(err.find("lost the coordinator, process 0 (ranks 0-1"), std::string::npos) << err;
    }
    if (loss.signal == SIGSTOP) {
        EXPECT_NE(err.find(loss.victim == 0 ? "no heartbeat for" : "stopped answering"),
                  std::string::npos)
            << err;
    }
    for (pid_t p : procs) EXPECT_FALSE(alive(p)) << "process " << p << " is left behind";
    EXPECT_EQ(checkpoint_problem(dir, dir.path / "ck"), "");
}

INSTANTIATE_TEST_SUITE_P(Cluster, Liveness,
                         ::testing::Values(Loss{"coordinator_killed", 0, SIGKILL},
                                           Loss{"coordinator_frozen", 0, SIGSTOP},
                                           Loss{"member_killed", 1, SIGKILL},
                                           Loss{"member_frozen", 1, SIGSTOP}),
                         [](const auto& info) { return std::string(info.param.name); });

// Under a launcher that gives no token, a process says how to set one instead of joining.
TEST(Cluster, AJobWithoutATokenIsRefusedWithHowToSetOne) {
    Dir dir("no_token");
    Proc p(run_args(dir / "gpt.dist", mesh_sets(1, 1, 2, "1f1b", 2), dir / "m.jsonl", 2),
           {{"DIST_RANK", "1"}, {"DIST_WORLD_SIZE", "2"}, {"DIST_COORDINATOR", "127.0.0.1:1"}},
           dir / "out", dir / "err");
    EXPECT_EQ(p.wait(60s), 2) << slurp(dir / "err");
    EXPECT_NE(slurp(dir / "err").find("set DIST_JOB_TOKEN"), std::string::npos)
        << slurp(dir / "err");
}

// A learning rate of 1e30 throws the weights far enough in one step that the next loss is not
// finite. The default policy stops there, naming the step and the value, exit 1; `skip` goes
// on without an update on any rank (two processes, dp 2 x pp 2), counts the skipped steps in
// the metrics, and its final checkpoint holds only finite weights.
TEST(Cluster, NonFiniteStepsStopTheRunOrAreSkippedOnEveryRank) {
    Dir dir("nonfinite");
    auto sets = mesh_sets(2, 1, 2, "1f1b", 2);
    sets.push_back("train.optimizer.lr=1e30");
    Proc stop(run_args(dir / "gpt.dist", sets, dir / "stop.jsonl", 5), {}, dir / "stop.out",
              dir / "stop.err");
    EXPECT_EQ(stop.wait(120s), 1) << slurp(dir / "stop.err");
    std::string err = slurp(dir / "stop.err");
    EXPECT_NE(err.find("non-finite"), std::string::npos) << err;
    EXPECT_NE(err.find("step 2: the loss is non-finite"), std::string::npos) << err;
    EXPECT_EQ(steps_of(dir / "stop.jsonl").size(), 1u); // step 1 only

    auto skip = sets;
    skip.push_back("train.on_nonfinite=skip");
    skip.push_back("train.checkpoint.dir=\"" + (dir / "ck") + "\"");
    auto args = run_args(dir / "gpt.dist", skip, dir / "skip.jsonl", 5);
    args.insert(args.end(), {"--procs", "2"});
    Proc go_on(args, {}, dir / "skip.out", dir / "skip.err");
    ASSERT_EQ(go_on.wait(120s), 0) << slurp(dir / "skip.err");
    std::vector<nlohmann::json> lines = json_lines(dir / "skip.jsonl");
    ASSERT_EQ(lines.size(), 5u);
    EXPECT_FALSE(lines[0].contains("skipped_steps")) << "step 1 took its update";
    EXPECT_EQ(lines[4].value("skipped_steps", 0), 4) << "steps 2 to 5 are skipped";
    EXPECT_EQ(checkpoint_step(dir.path / "ck"), 5);
    EXPECT_EQ(checkpoint_problem(dir, dir.path / "ck"), "");
}

// One job through two front doors: `dist run` in one process, then an application that embeds
// libdist (tests/embed/train_tool.cpp) started as both processes of a job by hand, as a
// launcher would: the same losses and norms, step by step. Its step callback takes twice the
// heartbeat timeout after step 1, and nobody is declared lost meanwhile: the callback runs on
// the application's thread, not in the coordinator, whose heartbeats go on.
TEST(Cluster, AnEmbeddedApplicationRunsAJobOfSeveralProcessesWithTheCliLosses) {
    Dir dir("embedded");
    auto sets = mesh_sets(2, 1, 2, "1f1b", 2);
    Proc cli(run_args(dir / "gpt.dist", sets, dir / "cli.jsonl", 3), {}, dir / "cli.out",
             dir / "cli.err");
    ASSERT_EQ(cli.wait(120s), 0) << slurp(dir / "cli.err");
    std::vector<std::string> overrides = sets;
    overrides.push_back("train.stop_after=3");
    const int port = free_port();
    auto process = [&](int rank, const std::string& metrics) {
        std::vector<std::string> args = {"--slow-first-step", "4000", dir / "gpt.dist", metrics};
        args.insert(args.end(), overrides.begin(), overrides.end());
        return Proc(args,
                    {{"DIST_RANK", std::to_string(rank)},
                     {"DIST_WORLD_SIZE", "2"},
                     {"DIST_COORDINATOR", "127.0.0.1:" + std::to_string(port)},
                     {"DIST_JOB_TOKEN", "embedded-job"},
                     {"DIST_HEARTBEAT_TIMEOUT", "2"}},
                    dir / ("e" + std::to_string(rank) + ".out"),
                    dir / ("e" + std::to_string(rank) + ".err"), EMBED_TRAIN_TOOL);
    };
    Proc lead = process(0, dir / "embed.jsonl");
    Proc member = process(1, dir / "member.jsonl");
    EXPECT_EQ(member.wait(120s), 0) << slurp(dir / "e1.err");
    ASSERT_EQ(lead.wait(120s), 0) << slurp(dir / "e0.err");
    EXPECT_NE(slurp(dir / "embed.jsonl").find("\"p2p\""), std::string::npos)
        << "process 0's metrics carry the traffic between the processes";
    expect_same_steps(steps_of(dir / "cli.jsonl"), steps_of(dir / "embed.jsonl"),
                      "embedded, two processes");
}

// train.eval every 2 steps in a job of two processes (dp 2 x pp 2): the weights are gathered
// from both, and the loss the metrics report after the last step is the loss `dist eval` finds
// on the checkpoint of that step, over the same windows (here all of the file's).
TEST(Cluster, TrainEvalReportsTheLossDistEvalFindsOnTheSameWeights) {
    Dir dir("eval");
    std::string text;
    for (int i = 0; i < 40; ++i)
        text += "the quick brown fox jumps over the lazy dog " + std::to_string(i) + "\n";
    std::ofstream(dir / "held_out.txt") << text;
    auto sets = mesh_sets(2, 1, 2, "1f1b", 2);
    sets.push_back("train.checkpoint.dir=\"" + (dir / "ck") + "\"");
    std::string script = slurp(dir / "gpt.dist");
    script.replace(script.find("vocab: 32"), 9, "vocab: 256"); // text is read as bytes
    auto at = script.find("train {");
    ASSERT_NE(at, std::string::npos);
    script.insert(at + 7, "\n    eval {\n        data: text(\"held_out.txt\")\n        every: 2\n"
                          "        batches: 1000\n    }");
    std::ofstream(dir / "eval.dist") << script;
    auto args = run_args(dir / "eval.dist", sets, dir / "m.jsonl", 4);
    args.insert(args.end(), {"--procs", "2"});
    Proc job(args, {}, dir / "out", dir / "err");
    ASSERT_EQ(job.wait(120s), 0) << slurp(dir / "err");
    std::vector<int64_t> evaluated;
    double last_eval = -1;
    for (const auto& j : json_lines(dir / "m.jsonl"))
        if (j.contains("eval_loss")) {
            evaluated.push_back(j["step"].get<int64_t>());
            last_eval = j["eval_loss"].get<double>();
        }
    EXPECT_EQ(evaluated, (std::vector<int64_t>{2, 4}));
    Proc eval(
        {"eval", dir / "eval.dist", "--load", dir / "ck", "--data", dir / "held_out.txt", "--json"},
        {}, dir / "eval.out", dir / "eval.err");
    ASSERT_EQ(eval.wait(60s), 0) << slurp(dir / "eval.err");
    std::string out = slurp(dir / "eval.out");
    const double expected = std::stod(out.substr(out.find("\"loss\":") + 7));
    EXPECT_NEAR(last_eval, expected, 1e-9 * expected) << out;
}
