// collectives_bench.cpp: the all-reduce of a data-parallel gradient bucket through Gloo (TCP over
// loopback, as between processes of one host) beside the in-process path (shared memory, what
// ranks in one process use), with the same members, sizes and threads, in one run; then Gloo's
// reduce-scatter beside its all-reduce of the same buffer.
//
//   collectives_bench [MEMBERS [SIZES_KIB...]]   defaults: 2 members; 256, 4096, 32768 KiB
//
// Members are threads of this process in both cases (Gloo's members still talk through TCP
// sockets). Each size: 3 warm-up calls, then 7 batches of calls; the median batch gives the time
// per call. Bus bandwidth as NCCL's tests count it: 2 (n - 1) / n x bytes / time.
#include "transport/gloo.hpp"
#include "transport/inprocess.hpp"
#include "transport/store.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

using namespace dist::transport;

namespace {

using Members = std::vector<std::unique_ptr<Collectives>>;

// Seconds per call of `op` on buffers of `n` floats, all members calling together.
double time_calls(Members& members, int64_t n,
                  const std::function<void(Collectives&, std::vector<float>&)>& op) {
    const size_t size = members.size();
    std::vector<std::vector<float>> data(size, std::vector<float>(static_cast<size_t>(n), 1.0f));
    auto calls = [&](int count) {
        std::vector<std::thread> threads;
        for (size_t i = 0; i < size; ++i)
            threads.emplace_back([&, i] {
                for (int c = 0; c < count; ++c) op(*members[i], data[i]);
            });
        for (auto& t : threads) t.join();
    };
    calls(3);
    const int per_batch = n >= (int64_t(1) << 22) ? 3 : 20;
    std::vector<double> batches;
    for (int b = 0; b < 7; ++b) {
        auto t0 = std::chrono::steady_clock::now();
        calls(per_batch);
        batches.push_back(
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() /
            per_batch);
    }
    std::sort(batches.begin(), batches.end());
    return batches[batches.size() / 2];
}

// Seconds per all-reduce of `n` floats.
double time_all_reduce(Members& members, int64_t n) {
    return time_calls(members, n, [n](Collectives& c, std::vector<float>& d) {
        c.all_reduce(d.data(), n, ReduceOp::sum);
    });
}

// Seconds per reduce-scatter of `n` floats (each member keeps n / size of them, in place).
double time_reduce_scatter(Members& members, int64_t n) {
    const int64_t chunk = n / static_cast<int64_t>(members.size());
    return time_calls(members, n, [chunk](Collectives& c, std::vector<float>& d) {
        c.reduce_scatter(d.data(), chunk, d.data() + c.rank() * chunk);
    });
}

} // namespace

int main(int argc, char** argv) {
    const int size = argc > 1 ? std::atoi(argv[1]) : 2;
    std::vector<int64_t> kib;
    for (int i = 2; i < argc; ++i) kib.push_back(std::atoll(argv[i]));
    if (kib.empty()) kib = {256, 4096, 32768};
    if (size < 2) {
        std::fprintf(stderr, "collectives_bench: at least 2 members\n");
        return 2;
    }

    InProcessGroup group(size, "bench");
    Members inprocess;
    for (int i = 0; i < size; ++i) inprocess.push_back(group.member(i));
    MemoryStore store;
    Members gloo;
    {
        std::vector<std::future<std::unique_ptr<Collectives>>> joining;
        for (int i = 0; i < size; ++i)
            joining.push_back(std::async(std::launch::async, [&, i] {
                return make_gloo_collectives(store, "bench", i, size);
            }));
        for (auto& j : joining) gloo.push_back(j.get());
    }

    std::printf("all-reduce (sum) of float buffers, %d members, %u hardware threads\n\n", size,
                std::thread::hardware_concurrency());
    std::printf(
        "| size | in-process ms | Gloo ms | Gloo / in-process | in-process GB/s | Gloo GB/s |\n");
    std::printf("| --- | --- | --- | --- | --- | --- |\n");
    for (int64_t k : kib) {
        const int64_t n = k * 1024 / 4;
        double a = time_all_reduce(inprocess, n), b = time_all_reduce(gloo, n);
        const double bus = 2.0 * (size - 1) / size * static_cast<double>(n) * 4;
        std::printf("| %lld KiB | %.3f | %.3f | %.2f | %.2f | %.2f |\n", static_cast<long long>(k),
                    a * 1e3, b * 1e3, b / a, bus / a / 1e9, bus / b / 1e9);
    }
    // ZeRO-2's gradient reduction: a reduce-scatter of the bucket, beside the all-reduce of the
    // same bucket that it replaces (the data each member ends with is its chunk either way).
    std::printf("\nreduce-scatter beside the all-reduce of the same buffer, Gloo, %d members\n\n",
                size);
    std::printf("| size | all-reduce ms | reduce-scatter ms | reduce-scatter / all-reduce |\n");
    std::printf("| --- | --- | --- | --- |\n");
    for (int64_t k : kib) {
        const int64_t n = k * 1024 / 4 / size * size;
        double a = time_all_reduce(gloo, n), b = time_reduce_scatter(gloo, n);
        std::printf("| %lld KiB | %.3f | %.3f | %.2f |\n", static_cast<long long>(k), a * 1e3,
                    b * 1e3, b / a);
    }
    return 0;
}
