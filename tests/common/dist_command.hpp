// dist_command.hpp: the `dist` executable run as a user runs it, for the command-line tests.
// Needs DIST_BINARY (the executable's path) defined.
#pragma once

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <sys/wait.h>
#include <unistd.h>

namespace dist::tests {

struct DistResult {
    int status = -1;
    std::string out; // stdout
    std::string err; // stderr
};

/// A shell command line's exit status (-1 when it did not exit) and standard output.
inline DistResult run_shell(const std::string& command) {
    DistResult r;
    FILE* p = ::popen(command.c_str(), "r");
    if (!p) return r;
    std::array<char, 4096> buf{};
    size_t n;
    while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
    int st = ::pclose(p);
    r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return r;
}

/// `dist ARGS` (a shell command line after `dist`), its exit status and both outputs.
inline DistResult run_dist(const std::string& args) {
    namespace fs = std::filesystem;
    fs::path err_file = fs::temp_directory_path() / ("dist-cli-" + std::to_string(::getpid()));
    DistResult r = run_shell(std::string(DIST_BINARY) + " " + args + " 2>" + err_file.string());
    std::ifstream in(err_file);
    std::stringstream ss;
    ss << in.rdbuf();
    r.err = ss.str();
    fs::remove(err_file);
    return r;
}

/// A whole file's bytes ("" when it cannot be read).
inline std::string slurp(const std::filesystem::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

} // namespace dist::tests
