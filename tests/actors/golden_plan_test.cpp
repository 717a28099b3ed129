// golden_plan_test.cpp: `dist plan` of every script in examples/, compared with
// tests/golden/plan/NAME.expected, one test per example. DIST_GOLDEN_REWRITE=1 rewrites the
// expected files from the current output (review the diff before committing it).
#include "cli/commands.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace fs = std::filesystem;

namespace {

std::string slurp(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

class GoldenPlan : public testing::Test {
  public:
    explicit GoldenPlan(fs::path script) : script_(std::move(script)) {}

    void TestBody() override {
        std::ostringstream out, err;
        dist::cli::CommonOptions o;
        o.file = script_.string();
        int status = dist::cli::run_plan(o, false, out, err);
        ASSERT_EQ(status, 0) << err.str();
        fs::path expected = fs::path("tests/golden/plan") / script_.filename();
        expected.replace_extension(".expected");
        if (std::getenv("DIST_GOLDEN_REWRITE")) {
            std::ofstream(expected, std::ios::binary) << out.str();
            return;
        }
        ASSERT_TRUE(fs::exists(expected))
            << expected << " is missing; run with DIST_GOLDEN_REWRITE=1 to create it";
        EXPECT_EQ(slurp(expected), out.str()) << "golden file " << expected;
    }

  private:
    fs::path script_;
};

const bool registered = [] {
    fs::current_path(DIST_SOURCE_DIR);
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator("examples"))
        if (e.path().extension() == ".dist") files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
        testing::RegisterTest("GoldenPlan", f.stem().string().c_str(), nullptr, nullptr, __FILE__,
                              __LINE__, [f]() -> testing::Test* { return new GoldenPlan(f); });
    }
    return true;
}();

} // namespace
