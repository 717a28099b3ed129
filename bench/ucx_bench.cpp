// ucx_bench.cpp: activation transfer between two processes through Dist's UCX endpoint
// (transport/ucx.hpp), the path a pipeline stage's activations and gradients take between
// processes. ucx_compare.sh runs it beside ucx_perftest and prints the ratios.
//
//   ucx_bench [--sizes B,B,...] [--iters N] [--window W] [--spin-us U]
//
// The process runs rank 0 and starts itself again as rank 1 (fork + exec); the two meet through
// a FileStore in a fresh temporary directory. For each size (bytes of an f32 tensor) it prints
//   size_bytes latency_us bandwidth_MiBps
// latency: one way, half the round trip of a tensor sent as an activation and returned as its
// gradient (as ucx_perftest's tag_lat); bandwidth: W tensors in flight, then a one-element
// acknowledgement (as tag_bw with a window), counting tensor bytes only.
#include "transport/ucx.hpp"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

using namespace dist;
using namespace dist::transport;

namespace {

struct Args {
    std::vector<size_t> sizes{8, 65536, 4194304};
    int iters = 0; // 0: chosen per size
    int window = 16;
    int spin_us = 0;
    std::string peer_dir; // set in the second process
};

Args parse(int argc, char** argv) {
    Args a;
    for (int i = 1; i < argc; ++i) {
        std::string k = argv[i];
        auto value = [&]() -> std::string {
            if (i + 1 >= argc) {
                std::fprintf(stderr, "ucx_bench: %s needs a value\n", k.c_str());
                std::exit(2);
            }
            return argv[++i];
        };
        if (k == "--sizes") {
            a.sizes.clear();
            std::string list = value();
            for (size_t pos = 0; pos <= list.size();) {
                size_t comma = list.find(',', pos);
                if (comma == std::string::npos) comma = list.size();
                a.sizes.push_back(std::stoull(list.substr(pos, comma - pos)));
                pos = comma + 1;
            }
        } else if (k == "--iters") {
            a.iters = std::stoi(value());
        } else if (k == "--window") {
            a.window = std::stoi(value());
        } else if (k == "--spin-us") {
            a.spin_us = std::stoi(value());
        } else if (k == "--peer") {
            a.peer_dir = value();
        } else {
            std::fprintf(
                stderr,
                "usage: ucx_bench [--sizes B,B,...] [--iters N] [--window W] [--spin-us U]\n");
            std::exit(2);
        }
    }
    return a;
}

using Clock = std::chrono::steady_clock;

// Both ranks run the same sequence; rank 0 times it. Tags: one step per exchange.
void run(UcxEndpoint& ep, const Args& args) {
    const bool lead = ep.rank() == 0;
    const int other = 1 - ep.rank();
    int64_t step = 0;
    auto act = [](int64_t s, int mb) { return P2PTag{s, 0, mb, Direction::activation}; };
    auto grad = [](int64_t s, int mb) { return P2PTag{s, 0, mb, Direction::gradient}; };
    kernels::Tensor ack({1});
    ack.data<float>()[0] = 1;
    for (size_t bytes : args.sizes) {
        kernels::Tensor x({static_cast<int64_t>(bytes / sizeof(float))});
        std::memset(x.raw(), 1, x.bytes());
        int lat_iters = args.iters ? args.iters : bytes <= 65536 ? 5000 : 200;
        int bw_iters = args.iters ? args.iters : bytes <= 65536 ? 500 : 50;

        auto ping_pong = [&](int n) {
            for (int i = 0; i < n; ++i, ++step) {
                if (lead) {
                    ep.send(other, act(step, 0), x);
                    ep.recv(other, grad(step, 0));
                } else {
                    ep.send(other, grad(step, 0), ep.recv(other, act(step, 0)));
                }
            }
        };
        auto stream = [&](int n) {
            for (int i = 0; i < n; ++i, ++step) {
                if (lead) {
                    for (int w = 0; w < args.window; ++w) ep.send(other, act(step, w), x);
                    ep.recv(other, grad(step, 0));
                } else {
                    for (int w = 0; w < args.window; ++w) ep.post_recv(other, act(step, w));
                    for (int w = 0; w < args.window; ++w) ep.recv(other, act(step, w));
                    ep.send(other, grad(step, 0), ack);
                }
            }
        };

        ping_pong(lat_iters / 10 + 1); // warm-up: connections, registration caches
        auto t0 = Clock::now();
        ping_pong(lat_iters);
        double lat_s = std::chrono::duration<double>(Clock::now() - t0).count();
        stream(bw_iters / 10 + 1);
        t0 = Clock::now();
        stream(bw_iters);
        double bw_s = std::chrono::duration<double>(Clock::now() - t0).count();
        if (lead)
            std::printf("%zu %.3f %.1f\n", bytes, lat_s / (2.0 * lat_iters) * 1e6,
                        static_cast<double>(bytes) * args.window * bw_iters / bw_s / (1 << 20));
        std::fflush(stdout);
    }
    ep.flush();
}

int run_rank(const std::string& dir, int rank, const Args& args) {
    FileStore store(dir);
    UcxOptions options;
    options.timeout = std::chrono::seconds(60);
    options.spin = std::chrono::microseconds(args.spin_us);
    auto ep = make_ucx_endpoint(store, "bench", rank, 2, options);
    run(*ep, args);
    return 0;
}

} // namespace

int main(int argc, char** argv) {
    Args args = parse(argc, argv);
    try {
        if (!args.peer_dir.empty()) return run_rank(args.peer_dir, 1, args);

        std::string dir = (std::filesystem::temp_directory_path() / "dist-ucx-bench-XXXXXX");
        if (!::mkdtemp(dir.data())) {
            std::perror("ucx_bench: mkdtemp");
            return 1;
        }
        std::vector<std::string> child_args(argv, argv + argc);
        child_args.insert(child_args.end(), {"--peer", dir});
        std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
        std::vector<char*> cargv{self.data()};
        for (size_t i = 1; i < child_args.size(); ++i) cargv.push_back(child_args[i].data());
        cargv.push_back(nullptr);
        pid_t child = ::fork();
        if (child < 0) {
            std::perror("ucx_bench: fork");
            return 1;
        }
        if (child == 0) {
            ::execv(cargv[0], cargv.data());
            ::_exit(127);
        }
        std::printf("# size_bytes latency_us bandwidth_MiBps\n");
        int rc = 1;
        try {
            rc = run_rank(dir, 0, args);
        } catch (const std::exception& e) {
            std::fprintf(stderr, "ucx_bench: %s\n", e.what());
            ::kill(child, SIGKILL); // it would wait for its timeout otherwise
        }
        int status = 0;
        ::waitpid(child, &status, 0);
        std::filesystem::remove_all(dir);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            std::fprintf(stderr, "ucx_bench: the second process failed (status %d)\n", status);
            return 1;
        }
        return rc;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "ucx_bench: %s\n", e.what());
        return 1;
    }
}
