// cluster_helpers.hpp: what the cluster tests share: a fresh folder with the test scripts,
// processes of the dist binary (or another program) with their own environment and output
// files, the metrics they write, free ports and the children of a launcher.
#pragma once

#include "tests/common/tiny_scripts.hpp"
#include "transport/launch.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <arpa/inet.h>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <netinet/in.h>
#include <optional>
#include <sstream>
#include <sys/socket.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace dist::tests::cluster {

inline const std::string gpt_script = dist::tests::tiny_gpt_script(400);
inline const std::string llama_script = dist::tests::tiny_llama_script(400);
inline const std::string moe_script = dist::tests::tiny_moe_script(400);

inline std::string slurp(const fs::path& p) {
    std::ifstream in(p);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

// A fresh folder per test, with the two scripts in it.
struct Dir {
    fs::path path;
    explicit Dir(const std::string& name) {
        path =
            fs::temp_directory_path() / ("dist_cluster_" + name + "_" + std::to_string(::getpid()));
        fs::remove_all(path);
        fs::create_directories(path);
        std::ofstream(path / "gpt.dist") << gpt_script;
        std::ofstream(path / "llama.dist") << llama_script;
        std::ofstream(path / "moe.dist") << moe_script;
    }
    ~Dir() { fs::remove_all(path); }
    std::string operator/(const std::string& f) const { return (path / f).string(); }
};

// A process of the dist binary: its arguments after `dist`, extra environment, and where its
// output goes.
struct Proc {
    pid_t pid = -1;
    std::string out, err; // files

    Proc(const std::vector<std::string>& args, const std::map<std::string, std::string>& env,
         const std::string& out_file, const std::string& err_file,
         const std::string& program = DIST_BINARY)
        : out(out_file), err(err_file) {
        pid = ::fork();
        if (pid != 0) return;
        for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
        if (!std::freopen(out_file.c_str(), "w", stdout) ||
            !std::freopen(err_file.c_str(), "w", stderr))
            ::_exit(126);
        std::vector<char*> argv;
        argv.push_back(const_cast<char*>(program.c_str()));
        for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
        argv.push_back(nullptr);
        ::execvp(argv[0], argv.data());
        ::_exit(127);
    }

    /// Whether it still runs (once ended, its status is kept for wait).
    bool running() {
        if (pid <= 0) return false;
        int st = 0;
        if (::waitpid(pid, &st, WNOHANG) != pid) return true;
        pid = -1;
        status = WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
        return false;
    }

    /// The exit status (-signal when killed), or nullopt when it is still running after
    /// `timeout` (then it is killed).
    std::optional<int> wait(std::chrono::milliseconds timeout) {
        auto deadline = std::chrono::steady_clock::now() + timeout;
        for (;;) {
            if (!running()) return status;
            if (std::chrono::steady_clock::now() > deadline) {
                ::kill(pid, SIGKILL);
                ::waitpid(pid, nullptr, 0);
                pid = -1;
                return std::nullopt;
            }
            std::this_thread::sleep_for(20ms);
        }
    }
    std::optional<int> status;

    ~Proc() {
        if (pid > 0) {
            ::kill(pid, SIGKILL);
            ::waitpid(pid, nullptr, 0);
        }
    }
};

// Waits (up to `timeout`) until `done` holds or `p` has ended.
inline void wait_until(Proc& p, const std::function<bool()>& done, std::chrono::seconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!done() && p.running() && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(50ms);
}

// Waits for `p` to end after something was done to it; its status and the seconds it took.
inline std::pair<std::optional<int>, double> time_to_end(Proc& p) {
    auto start = std::chrono::steady_clock::now();
    std::optional<int> status = p.wait(60s);
    return {status,
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()};
}

inline std::vector<std::string> run_args(const std::string& script,
                                         const std::vector<std::string>& sets,
                                         const std::string& metrics, int steps) {
    std::vector<std::string> a = {"run", script, "--quiet", "--metrics", metrics};
    std::vector<std::string> all = sets;
    all.push_back("train.stop_after=" + std::to_string(steps));
    for (const auto& s : all) {
        a.push_back("--set");
        a.push_back(s);
    }
    return a;
}

struct Step {
    double loss = 0, grad_norm = 0;
};

/// Every line of a metrics file, parsed.
inline std::vector<nlohmann::json> json_lines(const std::string& metrics) {
    std::vector<nlohmann::json> out;
    std::ifstream in(metrics);
    std::string line;
    while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line));
    return out;
}

inline std::vector<Step> steps_of(const std::string& metrics) {
    std::vector<Step> out;
    std::ifstream in(metrics);
    std::string line;
    while (std::getline(in, line)) {
        auto loss = line.find("\"loss\":"), norm = line.find("\"grad_norm\":");
        if (loss == std::string::npos || norm == std::string::npos) continue;
        out.push_back({std::stod(line.substr(loss + 7)), std::stod(line.substr(norm + 12))});
    }
    return out;
}

inline void expect_same_steps(const std::vector<Step>& a, const std::vector<Step>& b,
                              const std::string& what) {
    ASSERT_EQ(a.size(), b.size()) << what;
    ASSERT_FALSE(a.empty()) << what;
    for (size_t i = 0; i < a.size(); ++i) {
        EXPECT_NEAR(a[i].loss, b[i].loss, 1e-5 * std::abs(a[i].loss)) << what << " step " << i + 1;
        EXPECT_NEAR(a[i].grad_norm, b[i].grad_norm, 1e-4 * std::abs(a[i].grad_norm))
            << what << " step " << i + 1;
    }
}

// A TCP port on loopback that nobody listens on now, drawn as the launcher draws one.
inline int free_port() {
    std::string error;
    int port = dist::transport::free_loopback_port(error);
    EXPECT_GT(port, 0) << error;
    return port;
}

// The children of `pid`, oldest first: every process whose parent it is (read from /proc, which
// every Linux has, unlike the optional children list).
inline std::vector<pid_t> children_of(pid_t pid) {
    std::vector<std::pair<unsigned long long, pid_t>> found; // (start time, pid)
    for (const auto& e : fs::directory_iterator("/proc")) {
        const std::string name = e.path().filename().string();
        if (name.find_first_not_of("0123456789") != std::string::npos) continue;
        std::ifstream stat(e.path() / "stat");
        std::string line;
        if (!std::getline(stat, line)) continue;
        auto close = line.rfind(')');
        if (close == std::string::npos) continue;
        std::istringstream rest(line.substr(close + 2));
        std::string state, skip;
        pid_t parent = 0;
        rest >> state >> parent;
        for (int field = 5; field < 22 && rest >> skip; ++field) {
        }
        unsigned long long start = 0;
        rest >> start; // field 22: start time
        if (parent == pid) found.push_back({start, static_cast<pid_t>(std::stol(name))});
    }
    std::sort(found.begin(), found.end());
    std::vector<pid_t> out;
    for (auto& [start, child] : found) out.push_back(child);
    return out;
}

inline bool alive(pid_t pid) {
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    if (!stat) return false;
    std::string s;
    std::getline(stat, s);
    auto close = s.rfind(')');
    return close != std::string::npos && close + 2 < s.size() && s[close + 2] != 'Z';
}

inline int64_t checkpoint_step(const fs::path& dir) {
    std::string state = slurp(dir / "state.json");
    auto at = state.find("\"step\":");
    return at == std::string::npos ? -1 : std::stoll(state.substr(at + 7));
}

struct Mesh {
    std::string name, script;
    std::vector<std::string> sets;
    int ranks;
};

inline std::vector<std::string> mesh_sets(int dp, int tp, int pp, const std::string& kind, int m,
                                          int v = 1) {
    std::vector<std::string> s = {"mesh.dp=" + std::to_string(dp), "mesh.tp=" + std::to_string(tp),
                                  "mesh.pp=" + std::to_string(pp), "schedule.kind=" + kind,
                                  "schedule.microbatches=" + std::to_string(m)};
    if (v > 1) s.push_back("schedule.virtual_stages=" + std::to_string(v));
    return s;
}

// Processes of a 2-process job started by hand, as a launcher would.
inline std::map<std::string, std::string> member_env(int rank, int port, const std::string& token) {
    return {{"DIST_RANK", std::to_string(rank)},
            {"DIST_WORLD_SIZE", "2"},
            {"DIST_COORDINATOR", "127.0.0.1:" + std::to_string(port)},
            {"DIST_JOB_TOKEN", token}};
}

} // namespace dist::tests::cluster
