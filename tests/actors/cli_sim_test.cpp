// cli_sim_test.cpp: `dist sim` as a user runs it: the JSON fields of DESIGN.md, the pictures
// written to files, and the exit statuses.
#include "tests/common/dist_command.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <sys/wait.h>
#include <unistd.h>

namespace fs = std::filesystem;

namespace {

using Result = dist::tests::DistResult;

// `dist ARGS`, stdout and stderr together in `out`.
Result run(const std::string& args) {
    return dist::tests::run_shell(std::string(DIST_BINARY) + " " + args + " 2>&1");
}

} // namespace

TEST(CliSim, JsonHasTheFieldsOfTheDesign) {
    // GPipe, p = 4, m = 4 at unit costs: bubble (p-1)/(m+p-1) = 3/7, makespan 3 (m+p-1) = 21.
    Result r = run("sim examples/gpt_tiny.dist --json --cost unit --set mesh.pp=4 "
                   "--set schedule.kind=gpipe --set schedule.microbatches=4");
    ASSERT_EQ(r.status, 0) << r.out;
    nlohmann::json j = nlohmann::json::parse(r.out);
    EXPECT_DOUBLE_EQ(j["makespan"].get<double>(), 21.0);
    EXPECT_NEAR(j["bubble_fraction"].get<double>(), 3.0 / 7.0, 1e-12);
    ASSERT_EQ(j["ranks"].size(), 4u);
    for (const auto& rank : j["ranks"]) {
        EXPECT_DOUBLE_EQ(rank["idle"].get<double>(), 9.0);
        EXPECT_EQ(rank["peak_inflight_microbatches"], 4);
        EXPECT_GT(rank["peak_memory_bytes"].get<int64_t>(), 0);
    }
}

TEST(CliSim, WritesSvgAndTrace) {
    fs::path dir = fs::temp_directory_path() / ("dist-sim-" + std::to_string(::getpid()));
    fs::create_directories(dir);
    std::string svg = (dir / "a.svg").string(), trace = (dir / "a.json").string();
    Result r = run("sim examples/gpt2_124m_8xh200.dist --svg " + svg + " --trace " + trace);
    ASSERT_EQ(r.status, 0) << r.out;
    EXPECT_NE(r.out.find("bubble"), std::string::npos);
    std::ifstream t(trace);
    nlohmann::json j = nlohmann::json::parse(t);
    EXPECT_FALSE(j["traceEvents"].empty());
    std::ifstream s(svg);
    std::stringstream ss;
    ss << s.rdbuf();
    EXPECT_NE(ss.str().find("</svg>"), std::string::npos);
    fs::remove_all(dir);
}

TEST(CliSim, ErrorsAndUsage) {
    EXPECT_EQ(run("sim examples/gpt_tiny.dist --cost fast").status, 2);
    Result r = run("sim examples/gpt_tiny.dist --set mesh.pp=4 --set schedule.kind=zb_h1");
    EXPECT_EQ(r.status, 1);
    EXPECT_NE(r.out.find("error: `zb_h1` needs at least pp = 4 microbatches"), std::string::npos)
        << r.out;
    // The processes of `dist run --procs N`: at least one, and a rank for each.
    EXPECT_EQ(run("sim examples/gpt_tiny.dist --procs 0").status, 2);
    r = run("sim examples/gpt_tiny.dist --set mesh.pp=2 --procs 3");
    EXPECT_EQ(r.status, 1);
    EXPECT_NE(r.out.find("error: --procs 3 for 2 ranks: every process needs at least one rank"),
              std::string::npos)
        << r.out;
    EXPECT_EQ(run("sim examples/gpt_tiny.dist --set mesh.pp=2 --procs 2").status, 0);
}
