// launcher.cpp: `dist run --procs N`: N processes of this program on this host, each joining
// the job through DIST_RANK / DIST_WORLD_SIZE / DIST_COORDINATOR / DIST_JOB_TOKEN, supervised
// until they end.
//
// Every line a process writes is forwarded with its number in front ("[2] ..."), stdout to
// stdout and stderr to stderr. A process that fails (non-zero exit, or a signal) ends the job:
// the others get a grace period to stop on their own (the coordinator tells them), then
// SIGTERM, then SIGKILL. Ctrl-C or SIGTERM to the launcher ends them the same way. The
// children die with the launcher (PR_SET_PDEATHSIG) even when it is killed outright.
#include "actors/runtime/steal.hpp"
#include "cli/commands.hpp"
#include "cli/pace.hpp"
#include "transport/launch.hpp"

#include <csignal>
#include <cstring>
#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <iostream>
#include <map>
#include <vector>

namespace dist::cli {

namespace {

volatile std::sig_atomic_t interrupted = 0;
void on_signal(int sig) {
    interrupted = sig;
}

std::string random_token() {
    std::ifstream in("/dev/urandom", std::ios::binary);
    unsigned char bytes[16] = {};
    in.read(reinterpret_cast<char*>(bytes), sizeof bytes);
    static const char* hex = "0123456789abcdef";
    std::string t;
    for (unsigned char b : bytes) {
        t += hex[b >> 4];
        t += hex[b & 15];
    }
    return t;
}

struct Child {
    int index = 0;
    pid_t pid = -1;
    int out = -1, err = -1; // read ends
    std::string out_buf, err_buf;
    bool running = true;
    int status = 0;
};

// Writes the complete lines of `buf` with the prefix; keeps the rest (all of it at the end).
void forward(std::string& buf, const std::string& prefix, std::ostream& to, bool all) {
    size_t start = 0, nl;
    while ((nl = buf.find('\n', start)) != std::string::npos) {
        to << prefix << buf.substr(start, nl - start + 1);
        start = nl + 1;
    }
    buf.erase(0, start);
    if (all && !buf.empty()) {
        to << prefix << buf << "\n";
        buf.clear();
    }
    to << std::flush;
}

std::string describe(int status) {
    if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
    if (WIFSIGNALED(status))
        return "was killed by signal " + std::to_string(WTERMSIG(status)) + " (" +
               strsignal(WTERMSIG(status)) + ")";
    return "ended";
}

} // namespace

int launch_local(int procs, const std::vector<std::string>& args, std::ostream& out,
                 std::ostream& err, PaceCheck* pace) {
    if (procs < 1) {
        err << "error: --procs needs at least 1 process\n";
        return 2;
    }
    std::string error;
    int port = transport::free_loopback_port(error);
    if (port < 0) {
        err << "error: " << error << "\n";
        return 1;
    }
    const std::string coordinator = "127.0.0.1:" + std::to_string(port);
    const std::string token = random_token();
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);

    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART; // a write to a slow terminal is resumed, not failed
    ::sigaction(SIGINT, &sa, nullptr);
    ::sigaction(SIGTERM, &sa, nullptr);
    std::signal(SIGPIPE, SIG_IGN);

    // The profile's matmul timed with the machine to itself, before the processes start and
    // after they have all ended.
    if (pace) pace->before();
    // What other programs used of the cores while the job ran: this launcher's children are the
    // job's own, counted once they have been waited for.
    const runtime::OtherLoad others(true);
    std::vector<Child> children(static_cast<size_t>(procs));
    // On a failure to start them all, those started go (killed, reaped, their pipes closed).
    auto give_up = [&](const std::string& what) {
        err << "error: " << what << ": " << std::strerror(errno) << "\n";
        for (auto& c : children) {
            if (c.pid > 0) {
                ::kill(c.pid, SIGKILL);
                ::waitpid(c.pid, nullptr, 0);
            }
            if (c.out >= 0) ::close(c.out);
            if (c.err >= 0) ::close(c.err);
        }
        return 1;
    };
    for (int i = 0; i < procs; ++i) {
        int o[2], e[2];
        if (::pipe2(o, O_CLOEXEC) != 0) return give_up("pipe");
        if (::pipe2(e, O_CLOEXEC) != 0) {
            ::close(o[0]);
            ::close(o[1]);
            return give_up("pipe");
        }
        pid_t launcher = ::getpid();
        pid_t pid = ::fork();
        if (pid < 0) {
            for (int fd : {o[0], o[1], e[0], e[1]}) ::close(fd);
            return give_up("fork");
        }
        if (pid == 0) {
            // The child: dies with the launcher, writes into the pipes, joins as process i.
            ::prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (::getppid() != launcher) ::_exit(1);
            ::signal(SIGINT, SIG_DFL);
            ::signal(SIGTERM, SIG_DFL);
            ::dup2(o[1], STDOUT_FILENO);
            ::dup2(e[1], STDERR_FILENO);
            ::setenv("DIST_RANK", std::to_string(i).c_str(), 1);
            ::setenv("DIST_WORLD_SIZE", std::to_string(procs).c_str(), 1);
            ::setenv("DIST_LOCAL_RANK", std::to_string(i).c_str(), 1);
            ::setenv("DIST_LOCAL_WORLD_SIZE", std::to_string(procs).c_str(), 1);
            ::setenv("DIST_COORDINATOR", coordinator.c_str(), 1);
            ::setenv("DIST_JOB_TOKEN", token.c_str(), 1);
            ::execv("/proc/self/exe", argv.data());
            std::fprintf(stderr, "cannot start %s: %s\n", argv[0], std::strerror(errno));
            ::_exit(127);
        }
        ::close(o[1]);
        ::close(e[1]);
        children[static_cast<size_t>(i)] = {i, pid, o[0], e[0], {}, {}, true, 0};
    }

    using clock = std::chrono::steady_clock;
    int result = 0;
    bool ending = false;
    clock::time_point end_started, term_sent;
    bool termed = false, killed = false;
    auto running = [&] {
        int n = 0;
        for (auto& c : children) n += c.running || c.out >= 0 || c.err >= 0;
        return n;
    };
    auto signal_all = [&](int sig) {
        for (auto& c : children)
            if (c.running) {
                ::kill(c.pid, sig);
                ::kill(c.pid, SIGCONT); // a stopped process takes its signal only when woken
            }
    };
    while (running() > 0) {
        std::vector<pollfd> fds;
        std::vector<std::pair<Child*, bool>> who; // (child, is stdout)
        for (auto& c : children) {
            if (c.out >= 0) {
                fds.push_back({c.out, POLLIN, 0});
                who.push_back({&c, true});
            }
            if (c.err >= 0) {
                fds.push_back({c.err, POLLIN, 0});
                who.push_back({&c, false});
            }
        }
        if (!fds.empty())
            ::poll(fds.data(), fds.size(), 100);
        else
            ::usleep(100 * 1000);
        for (size_t k = 0; k < fds.size(); ++k) {
            if (!(fds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            auto [c, is_out] = who[k];
            char buf[65536];
            ssize_t n = ::read(fds[k].fd, buf, sizeof buf);
            std::string prefix = "[" + std::to_string(c->index) + "] ";
            std::string& b = is_out ? c->out_buf : c->err_buf;
            std::ostream& to = is_out ? out : err;
            if (n > 0) {
                b.append(buf, static_cast<size_t>(n));
                forward(b, prefix, to, false);
            } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
                forward(b, prefix, to, true);
                ::close(fds[k].fd);
                (is_out ? c->out : c->err) = -1;
            }
        }
        if (interrupted && !ending) {
            err << "dist: " << strsignal(interrupted) << "; ending the job\n" << std::flush;
            result = 128 + interrupted;
            ending = true;
            end_started = clock::now();
            signal_all(SIGTERM);
            termed = true;
            term_sent = clock::now();
        }
        for (auto& c : children) {
            if (!c.running) continue;
            int status = 0;
            if (::waitpid(c.pid, &status, WNOHANG) != c.pid) continue;
            c.running = false;
            c.status = status;
            bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
            if (!ok && !ending) {
                err << "dist: process " << c.index << " (pid " << c.pid << ") " << describe(status)
                    << "; ending the job\n"
                    << std::flush;
                result = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
                ending = true;
                end_started = clock::now();
            }
        }
        // Once process 0 (the coordinator) has ended, successfully or not, the others follow
        // within moments; those that do not are stopped below.
        if (!children[0].running && !ending) {
            ending = true;
            end_started = clock::now();
        }
        // The others normally stop by themselves within seconds of a failure (the coordinator
        // tells them, or they see it go); those that do not are terminated, then killed.
        auto now = clock::now();
        const auto grace = children[0].running ? std::chrono::seconds(10) : std::chrono::seconds(3);
        if (ending && !termed && now - end_started > grace) {
            signal_all(SIGTERM);
            termed = true;
            term_sent = now;
        }
        if (termed && !killed && now - term_sent > std::chrono::seconds(3)) {
            signal_all(SIGKILL);
            killed = true;
        }
    }
    if (result == 0) {
        if (std::string note = runtime::others_note(others.share()); !note.empty())
            out << note << "\n";
        if (std::string line = pace ? pace->after() : ""; !line.empty()) out << line << "\n";
    }
    return result;
}

} // namespace dist::cli
