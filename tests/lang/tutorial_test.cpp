// tutorial_test.cpp: every command of docs/tutorial runs, and prints what the chapter shows.
//
// A chapter's ```console blocks hold `$ dist ...` commands (maybe after environment settings,
// `$ DIST_PATH=docs/tutorial dist ...`), each followed by its output. Each command runs from the
// source folder (stdout and stderr together, as a terminal shows them); it must succeed, and its
// output must be the one written below it, but for timings (tokens per second, milliseconds,
// the measured bubble, the search's seconds), which are shown and never compared, and for a
// command that ends in a comment (`# the text depends on the run`), whose output is shown only.
// The tutorial's scripts pass `dist check` and `dist fmt --check`.
//
// DIST_TUTORIAL_REWRITE=1 (`make tutorial`) writes every command's output into its chapter
// instead of comparing, and redraws the pictures in docs/tutorial/img; otherwise the pictures
// go to a temporary folder and the committed ones stay as they are.
#include "tests/common/dist_command.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <sys/wait.h>
#include <unistd.h>

namespace fs = std::filesystem;

namespace {

using dist::tests::slurp;
// stdout and stderr of `ENV dist ARGS` run from the source folder, and its exit status.
std::pair<int, std::string> run(const std::string& args, const std::string& env = "") {
    auto r = dist::tests::run_shell("cd '" + std::string(DIST_SOURCE_DIR) + "' && " + env +
                                    DIST_BINARY + " " + args + " 2>&1");
    return {r.status, r.out};
}

// The figures that depend on the machine's speed and load, masked before comparing.
std::string without_timings(std::string s) {
    static const std::vector<std::pair<std::regex, std::string>> masks = {
        {std::regex(R"([0-9.]+ tok/s)"), "# tok/s"},
        {std::regex(R"(eta [0-9.]+s)"), "eta #s"},
        // The middle half of the steps, where a run had enough of them to give one.
        {std::regex(R"( \(the middle half of the steps [0-9.]+-[0-9.]+ ms\),)"),
         " (the middle half of the steps #),"},
        {std::regex(R"(measured [0-9.]+ (ms|s)( \(the middle half of the steps #\))?, )"
                    R"(predicted ([0-9.]+ (ms|s)) \([0-9.]+x\))"),
         "measured # ms$2, predicted $3 (#x)"},
        {std::regex(R"(bubble: measured [0-9.]+%)"), "bubble: measured #%"},
        {std::regex(R"(\([0-9.]+ s\))"), "(# s)"},
        // Which buffers are alive together depends on the threads' timing.
        {std::regex(R"(measured [0-9.]+ MB at the peak)"), "measured # MB at the peak"},
        {std::regex(R"(MB \([0-9.]+x\))"), "MB (#x)"},
        // Routing follows the weights, whose last bits differ between machines.
        {std::regex(R"(busiest took [0-9.]+x)"), "busiest took #x"},
        // What other programs and the host took of the cores during a run, and how fast the
        // profile's matmul ran around it, are the moment's (the tests beside this one take the
        // other core): lines that come and go.
        {std::regex(R"(\((other processes on this machine used|the host took) [^\n]*\)\n)"), ""},
        {std::regex(R"(\npace: [^\n]*)"), ""},
    };
    for (const auto& [re, with] : masks) s = std::regex_replace(s, re, with);
    return s;
}

struct Command {
    std::string env;      // settings before `dist`, each followed by a space
    std::string args;     // after `dist `
    std::string expected; // the lines shown below it
    size_t begin = 0;     // where the expected output starts in the chapter
    size_t end = 0;       // and ends
};

// The commands of a chapter's console blocks, in order: each command's output runs from the
// line after it to the next command or the end of the block.
std::vector<Command> commands_of(const std::string& text) {
    std::vector<Command> out;
    const std::string open = "```console\n", close = "```\n";
    size_t at = 0;
    while ((at = text.find(open, at)) != std::string::npos) {
        const size_t body = at + open.size(), end = text.find(close, body);
        if (end == std::string::npos) break;
        const size_t first = out.size();
        for (size_t line = body; line < end;) {
            const size_t eol = text.find('\n', line);
            static const std::regex command(R"(\$ ((?:[A-Z_]+=\S+ )*)dist (.*))");
            std::smatch m;
            const std::string l = text.substr(line, eol - line);
            if (std::regex_match(l, m, command)) {
                if (out.size() > first) out.back().end = line;
                out.push_back({m[1].str(), m[2].str(), "", eol + 1, end});
            }
            line = eol + 1;
        }
        for (size_t i = first; i < out.size(); ++i)
            out[i].expected = text.substr(out[i].begin, out[i].end - out[i].begin);
        at = end + close.size();
    }
    return out;
}

class Chapter : public testing::Test {
  public:
    explicit Chapter(fs::path file) : file_(std::move(file)) {}
    void TestBody() override {
        const std::string text = slurp(file_);
        std::vector<Command> commands = commands_of(text);
        ASSERT_FALSE(commands.empty()) << file_ << " has no `$ dist` command";
        const char* rewrite = std::getenv("DIST_TUTORIAL_REWRITE");
        std::string updated;
        size_t copied = 0;
        const bool rewriting = rewrite && *rewrite;
        // Pictures go to a folder of the test's own unless they are being redrawn.
        const std::string img = "docs/tutorial/img/";
        const fs::path scratch =
            fs::temp_directory_path() / ("dist-tutorial-" + std::to_string(::getpid()));
        fs::create_directories(scratch);
        for (const Command& c : commands) {
            // A trailing comment marks an output that is shown, not compared.
            const size_t comment = c.args.find(" # ");
            std::string args = c.args.substr(0, comment);
            if (!rewriting)
                for (size_t at; (at = args.find(img)) != std::string::npos;)
                    args.replace(at, img.size(), scratch.string() + "/");
            auto [status, output] = run(args, c.env);
            for (size_t at; (at = output.find(scratch.string() + "/")) != std::string::npos;)
                output.replace(at, scratch.string().size() + 1, img);
            EXPECT_EQ(status, 0) << file_.filename() << ": `dist " << c.args << "` failed:\n"
                                 << output;
            if (rewriting) {
                updated += text.substr(copied, c.begin - copied) + output;
                copied = c.end;
            } else if (comment == std::string::npos) {
                EXPECT_EQ(without_timings(c.expected), without_timings(output))
                    << file_.filename() << ": `dist " << c.args << "`";
            }
        }
        fs::remove_all(scratch);
        if (rewrite && *rewrite) {
            updated += text.substr(copied);
            std::ofstream(file_) << updated;
        }
    }

  private:
    fs::path file_;
};

const bool registered = [] {
    const fs::path dir = fs::path(DIST_SOURCE_DIR) / "docs" / "tutorial";
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(dir))
        if (e.path().extension() == ".md" && e.path().filename() != "README.md")
            files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
        std::string name = f.stem().string();
        std::replace(name.begin(), name.end(), '-', '_');
        testing::RegisterTest("Tutorial", name.c_str(), nullptr, nullptr, __FILE__, __LINE__,
                              [f]() -> testing::Test* { return new Chapter(f); });
    }
    return true;
}();

TEST(TutorialScripts, CheckAndAreInTheCanonicalLayout) {
    const fs::path dir = fs::path(DIST_SOURCE_DIR) / "docs" / "tutorial";
    int scripts = 0;
    for (const auto& e : fs::directory_iterator(dir)) {
        if (e.path().extension() != ".dist") continue;
        ++scripts;
        const std::string f = e.path().string();
        auto [checked, why] = run("check " + f);
        EXPECT_EQ(checked, 0) << why;
        auto [formatted, diff] = run("fmt --check " + f);
        EXPECT_EQ(formatted, 0) << f << ": " << diff;
    }
    EXPECT_GT(scripts, 0);
}

} // namespace
