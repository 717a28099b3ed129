// golden_test.cpp: one test per file under tests/golden/, compared with its `.expected` file.
//
//   parse/NAME.dist   -> the AST (S-expressions)
//   format/NAME.dist  -> `dist fmt` output (and formatting that output again changes nothing)
//   check/NAME.dist   -> `dist plan --json` of the checked program
//   errors/NAME.dist  -> the diagnostics, exactly as `dist check` prints them
//
// A script may start with `# set: KEY=VALUE` lines: overrides, as `--set` would give them.
// DIST_GOLDEN_REWRITE=1 rewrites the expected files from the current output (review the diff).
#include "lang/check.hpp"
#include "lang/format.hpp"
#include "lang/loader.hpp"
#include "lang/parse.hpp"
#include "lang/program_json.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

namespace fs = std::filesystem;
using namespace dist::lang;

namespace {

std::string slurp(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

std::vector<std::string> overrides_of(const std::string& text) {
    std::vector<std::string> out;
    std::istringstream in(text);
    std::string line;
    while (std::getline(in, line) && line.rfind("# set: ", 0) == 0) out.push_back(line.substr(7));
    return out;
}

FrontendOptions options_for(const std::string& text) {
    FrontendOptions o;
    o.search_roots = {fs::path(DIST_SOURCE_DIR) / "stdlib"};
    o.overrides = overrides_of(text);
    return o;
}

// Absolute paths of this checkout would make the expected files machine-specific.
std::string portable(std::string s) {
    const std::string src = fs::path(DIST_SOURCE_DIR).string();
    for (size_t at; (at = s.find(src)) != std::string::npos;) s.replace(at, src.size(), "<src>");
    return s;
}

std::string actual_output(const std::string& kind, const fs::path& rel) {
    std::string text = slurp(fs::path(DIST_SOURCE_DIR) / rel);
    if (kind == "parse" || kind == "format") {
        SourceManager sources;
        Diagnostics diags;
        uint32_t id = sources.add(rel.string(), text);
        auto script = parse_script(sources, id, diags);
        if (!script) return diags.render(sources);
        return kind == "parse" ? dump(*script) : format_script(*script);
    }
    CheckResult r = check_file(rel, options_for(text));
    if (kind == "check") return r.ok() ? portable(to_json(*r.program).dump(2)) + "\n" : r.report();
    return portable(r.report());
}

class GoldenTest : public testing::Test {
  public:
    GoldenTest(std::string kind, fs::path rel) : kind_(std::move(kind)), rel_(std::move(rel)) {}

    void TestBody() override {
        fs::path expected_path = fs::path(DIST_SOURCE_DIR) / rel_;
        expected_path.replace_extension(".expected");
        std::string actual = actual_output(kind_, rel_);
        if (std::getenv("DIST_GOLDEN_REWRITE")) {
            std::ofstream(expected_path, std::ios::binary) << actual;
            return;
        }
        ASSERT_TRUE(fs::exists(expected_path))
            << expected_path << " is missing; run with DIST_GOLDEN_REWRITE=1 to create it";
        EXPECT_EQ(slurp(expected_path), actual) << "golden file " << rel_;
        if (kind_ == "errors") {
            EXPECT_NE(actual.find(": error: "), std::string::npos)
                << rel_ << " is in errors/ but checks cleanly";
        }
        if (kind_ == "check") {
            EXPECT_EQ(actual.find(": error: "), std::string::npos) << actual;
        }
        if (kind_ == "format") {
            // Idempotence: the formatted text formats to itself.
            SourceManager sources;
            Diagnostics diags;
            auto script = parse_script(sources, sources.add("formatted", actual), diags);
            ASSERT_TRUE(script) << diags.render(sources);
            EXPECT_EQ(actual, format_script(*script));
        }
    }

  private:
    std::string kind_;
    fs::path rel_;
};

// Registered before main runs, one test per golden file.
const bool registered = [] {
    fs::current_path(DIST_SOURCE_DIR);
    for (const char* kind : {"parse", "format", "check", "errors"}) {
        fs::path dir = fs::path("tests/golden") / kind;
        if (!fs::is_directory(dir)) continue;
        std::vector<fs::path> files;
        for (const auto& e : fs::directory_iterator(dir))
            if (e.path().extension() == ".dist") files.push_back(e.path());
        std::sort(files.begin(), files.end());
        for (const auto& f : files) {
            std::string k = kind;
            testing::RegisterTest(("Golden_" + k).c_str(), f.stem().string().c_str(), nullptr,
                                  nullptr, __FILE__, __LINE__,
                                  [k, f]() -> testing::Test* { return new GoldenTest(k, f); });
        }
    }
    return true;
}();

} // namespace
