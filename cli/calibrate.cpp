// calibrate.cpp: `dist calibrate`: this machine measured, and written as a hardware profile.
//
// Everything measured is Dist's own code on this machine: the CPU kernels (kernels/cpu) at a
// grid of shapes for each thread count a rank may get, several single-threaded workers at once
// (how the cores are shared), the in-process and UCX transfers of activations, and the
// in-process and Gloo collectives (a mixture of experts' all-to-all among them). Each rate is the
// fastest of three timed batches after a warm-up call (a shared machine's other work only slows
// a measurement), each whole action the median of four passes' medians and the ranks beyond
// the cores a run's median step: the kernels' rates set shapes beside each other, the whole
// actions the level, that of a run's median step. The profile (TOML, the schema of
// stdlib/hardware/) carries the command and the date; the simulator prices kernels by shape
// from it (actors/sim/calibrated.hpp).
#include "cli/calibrate_parts.hpp"
#include "cli/commands.hpp"
#include "cli/pace.hpp"

#include "actors/plan/lower.hpp"
#include "actors/runtime/session.hpp"
#include "actors/sim/calibrated.hpp"
#include "actors/sim/simulate.hpp"
#include "kernels/cpu/ops.hpp"
#include "kernels/devices.hpp"
#include "kernels/tensor.hpp"
#include "lang/check.hpp"
#include "lang/hardware.hpp"
#include "lang/program.hpp"
#include "models/atomic_file.hpp"
#include "models/model.hpp"
#include "models/stage.hpp"
#include "transport/gloo.hpp"
#include "transport/inprocess.hpp"
#include "transport/p2p.hpp"
#include "transport/store.hpp"
#include "transport/ucx.hpp"

#include <omp.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <regex>
#include <sstream>
#include <thread>
#include <tuple>
#include <vector>

namespace dist::cli::calibration {

namespace cpu = kernels::cpu;

double since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

double per_call(const std::function<void()>& call, double min_s, int batches_of,
                std::chrono::milliseconds gap) {
    call();
    std::vector<double> batches;
    for (int b = 0; b < batches_of; ++b) {
        if (b > 0 && gap.count() > 0) std::this_thread::sleep_for(gap);
        auto t0 = Clock::now();
        int calls = 0;
        do {
            call();
            ++calls;
        } while (since(t0) < min_s);
        batches.push_back(since(t0) / calls);
    }
    return *std::min_element(batches.begin(), batches.end());
}

std::vector<float> filled(int64_t n, float scale) {
    std::vector<float> v(static_cast<size_t>(std::max<int64_t>(n, 1)));
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(-scale, scale);
    for (float& x : v) x = u(rng);
    return v;
}

std::string number(double x) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.4g", x);
    std::string s = buf;
    // TOML needs a float to look like one when it is written in exponent form.
    if (s.find_first_of(".e") == std::string::npos) s += ".0";
    return s;
}

Progress::Progress(std::ostream& err, int total) : err_(err), total_(total), tty_(::isatty(2)) {}

void Progress::tick(const std::string& what) {
    ++done_;
    if (tty_)
        err_ << "\rcalibrate: " << what << " (" << done_ * 100 / total_ << "%)\x1b[K" << std::flush;
    else if (what != last_)
        err_ << "calibrate: " << what << "\n" << std::flush;
    last_ = what;
}

void Progress::end() {
    if (tty_) err_ << "\n";
}

struct Plan {
    std::vector<int32_t> threads;
    std::vector<int64_t> grid;      // matmul dimensions
    std::vector<int64_t> seqs;      // attention
    std::vector<int64_t> head_dims; // attention
    std::vector<int64_t> elements;  // element-wise sizes
    std::vector<int64_t> message;   // transfer and collective sizes, bytes
    int64_t arena_bytes = 64 << 20; // the matmuls' weights are taken from across this many
    double min_s = 0.01;     // the shortest timed run of a transfer, collective or shared core
    double kernel_s = 0.005; // the shortest timed batch of a kernel (the fastest of three kept)
};

Plan plan_for(int32_t cores, bool quick) {
    Plan p;
    for (int32_t t = 1; t < cores; t *= 2) p.threads.push_back(t);
    p.threads.push_back(cores);
    if (quick) {
        p.threads = {1};
        p.grid = {32, 256};
        p.seqs = {64, 256};
        p.head_dims = {32};
        p.elements = {1 << 14, 1 << 18};
        p.message = {4096, 1 << 20};
        p.arena_bytes = 4 << 20;
        p.min_s = 0.002;
        p.kernel_s = 0.002;
    } else {
        p.grid = {32, 128, 512, 2048};
        p.seqs = {64, 256, 1024};
        p.head_dims = {32, 64, 128};
        p.elements = {1 << 14, 1 << 17, 1 << 20, 1 << 23};
        p.message = {256, 1 << 16, 1 << 20, 1 << 24, 1 << 26};
    }
    return p;
}

// ----- compute ------------------------------------------------------------------------------

// Each thread count's sweep of a kernel (of attention, of the element-wise kernels) is taken
// again where the host stole from it (Retakes): a spell of steal slows every batch of a short
// timing alike, and the fastest of three keeps it.
std::vector<MatmulRate> measure_matmuls(const Plan& plan, Progress& progress, Retakes& retakes) {
    std::vector<MatmulRate> out;
    const int64_t big = plan.grid.back();
    std::vector<float> a = filled(big * big), b = filled(big * big),
                       c(static_cast<size_t>(big * big));
    // In a training step a layer's weights (and its weight gradient) were last touched a whole
    // pass of the other layers ago: unless all of a rank's weights fit in its cores' own caches,
    // they come from beyond them, and the fewer the tokens the more that costs (at width 512 on
    // one thread here, 26% at 64 tokens, 5% at 512). Each shape is timed both ways: each call
    // taking its weight operand from the next slot of an arena larger than those caches
    // (`flops`), and one weight used again and again (`warm`); the activations stay where the
    // previous call left them.
    const int64_t arena_floats = std::max<int64_t>(plan.arena_bytes / 4, 2 * big * big);
    std::vector<float> arena = filled(arena_floats);
    for (int32_t t : plan.threads) {
        omp_set_num_threads(t);
        for (const char* kernel : {"nt", "nn", "tn"}) {
            const std::string kn = kernel;
            auto sweep = [&](std::vector<MatmulRate>& rows) {
                for (int64_t m : plan.grid)
                    for (int64_t n : plan.grid)
                        for (int64_t k : plan.grid) {
                            // The weight (n, k) of nt and (k, n) of nn; the gradient (m, n) of tn.
                            const int64_t size = kn == "tn" ? m * n : n * k;
                            const int64_t slots = std::max<int64_t>(1, arena_floats / size);
                            int64_t next = 0;
                            bool cold = true;
                            auto weight = [&, size, slots] {
                                float* w = arena.data() + (cold ? next % slots : 0) * size;
                                ++next;
                                return w;
                            };
                            std::function<void()> call;
                            if (kn == "nt") // out (m, n) = in (m, k) weight (n, k)^T
                                call = [&, m, n, k] {
                                    cpu::matmul_forward<float>(a.data(), weight(), nullptr, m, k, n,
                                                               c.data());
                                };
                            else if (kn == "nn") // dinp (m, n) += dout (m, k) weight (k, n)
                                call = [&, m, n, k] {
                                    cpu::matmul_backward_input<float>(a.data(), weight(), m, n, k,
                                                                      c.data());
                                };
                            else // dweight (m, n) += dout^T (m, k) in (k, n)
                                call = [&, m, n, k] {
                                    cpu::matmul_backward_weight<float>(a.data(), b.data(), k, n, m,
                                                                       weight(), nullptr);
                                };
                            const double flop = 2.0 * static_cast<double>(m * n * k);
                            const double s = per_call(call, plan.kernel_s);
                            cold = false;
                            const double s_warm = per_call(call, plan.kernel_s);
                            rows.push_back({kn, m, n, k, t, flop / s, flop / s_warm});
                            progress.tick("matmuls (" + kn + ", " + std::to_string(t) +
                                          " threads)");
                        }
                return std::string();
            };
            sweep_under<MatmulRate>(retakes, progress, out, sweep);
        }
    }
    return out;
}

std::vector<AttentionRate> measure_attention(const Plan& plan, Progress& progress,
                                             Retakes& retakes) {
    std::vector<AttentionRate> out;
    const int64_t H = 4;
    for (int32_t t : plan.threads) {
        omp_set_num_threads(t);
        sweep_under<AttentionRate>(retakes, progress, out, [&](std::vector<AttentionRate>& rows) {
            for (int64_t D : plan.head_dims)
                for (int64_t T : plan.seqs) {
                    const int64_t n = T * H * D;
                    std::vector<float> q = filled(n), k = filled(n), v = filled(n), o(n),
                                       lse(T * H), dq(n), dk(n), dv(n), dout = filled(n);
                    double f = per_call(
                        [&] {
                            cpu::attention_forward<float>(q.data(), k.data(), v.data(), 1, T, H, H,
                                                          D, o.data(), lse.data());
                        },
                        plan.kernel_s);
                    double bw = per_call(
                        [&] {
                            cpu::attention_backward<float>(dout.data(), q.data(), k.data(),
                                                           v.data(), o.data(), lse.data(), 1, T, H,
                                                           H, D, dq.data(), dk.data(), dv.data());
                        },
                        plan.kernel_s);
                    // The plan's count: 4 T^2 H D forward (scores and values, no causal halving).
                    const double flops = 4.0 * static_cast<double>(T * T * H * D);
                    rows.push_back({T, D, t, flops / f, 2 * flops / bw});
                    progress.tick("attention (" + std::to_string(t) + " threads)");
                }
            return std::string();
        });
    }
    return out;
}

// One element-wise kernel: its forward and its whole backward over `n` elements.
struct Elementwise {
    const char* op;
    std::function<void(int64_t n, bool backward)> run;
};

std::vector<StreamRate> measure_elementwise(const Plan& plan, Progress& progress,
                                            Retakes& retakes) {
    const int64_t most = plan.elements.back();
    const int64_t C = 256, V = 256;
    std::vector<float> x = filled(most * 2), y(static_cast<size_t>(most * 2)), z = filled(most * 2),
                       w = filled(C * 4, 1.0f), dw(C * 4), stats(static_cast<size_t>(most)),
                       stats2(static_cast<size_t>(most)), m(static_cast<size_t>(most)),
                       v2(static_cast<size_t>(most));
    std::vector<uint16_t> half(static_cast<size_t>(most));
    std::vector<int32_t> tokens(static_cast<size_t>(most / C + 1));
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(i % V);
    cpu::AdamWConfig adam;
    std::vector<Elementwise> ops = {
        // as many as elementwise_kernels
        {"embedding",
         [&](int64_t n, bool bw) {
             if (bw)
                 cpu::embedding_backward<float>(tokens.data(), x.data(), n / C, C, y.data());
             else
                 cpu::embedding_forward<float>(tokens.data(), x.data(), n / C, C, y.data());
         }},
        {"layernorm",
         [&](int64_t n, bool bw) {
             if (!bw)
                 return cpu::layernorm_forward<float>(x.data(), w.data(), w.data() + C, n / C, C,
                                                      1e-5, y.data(), stats.data(), stats2.data());
             cpu::layernorm_backward_input<float>(z.data(), x.data(), w.data(), stats.data(),
                                                  stats2.data(), n / C, C, y.data());
             cpu::layernorm_backward_weight<float>(z.data(), x.data(), stats.data(), stats2.data(),
                                                   n / C, C, dw.data(), dw.data() + C);
         }},
        {"rmsnorm",
         [&](int64_t n, bool bw) {
             if (!bw)
                 return cpu::rmsnorm_forward<float>(x.data(), w.data(), n / C, C, 1e-5, y.data(),
                                                    stats.data());
             cpu::rmsnorm_backward_input<float>(z.data(), x.data(), w.data(), stats.data(), n / C,
                                                C, y.data());
             cpu::rmsnorm_backward_weight<float>(z.data(), x.data(), stats.data(), n / C, C,
                                                 dw.data());
         }},
        {"gelu",
         [&](int64_t n, bool bw) {
             if (bw)
                 cpu::gelu_backward_kept<float>(x.data(), stats.data(), z.data(), n, y.data());
             else
                 cpu::gelu_forward_keeping<float>(x.data(), n, y.data(), stats.data());
         }},
        {"swiglu",
         [&](int64_t n, bool bw) {
             if (bw)
                 cpu::swiglu_backward<float>(x.data(), z.data(), n / C, C, y.data());
             else
                 cpu::swiglu_forward<float>(x.data(), n / C, C, y.data());
         }},
        {"rope",
         [&](int64_t n, bool bw) {
             const int64_t D = 64, T = 256, H = std::max<int64_t>(1, n / (T * D));
             if (bw)
                 cpu::rope_backward<float>(x.data(), 1, T, H, D, 10000.0, 0, y.data());
             else
                 cpu::rope_forward<float>(x.data(), 1, T, H, D, 10000.0, 0, y.data());
         }},
        {"cross_entropy",
         [&](int64_t n, bool bw) {
             if (bw)
                 cpu::cross_entropy_backward<float>(x.data(), tokens.data(), stats.data(),
                                                    stats2.data(), n / V, V, y.data());
             else
                 cpu::cross_entropy_forward<float>(x.data(), tokens.data(), n / V, V, stats2.data(),
                                                   stats.data());
         }},
        {"copy",
         [&](int64_t n, bool) {
             std::memcpy(y.data(), x.data(), static_cast<size_t>(n) * sizeof(float));
         }},
        // bf16 mixed precision (models/unit_common.hpp's Bf16): a tensor rounded in place,
        // forward and backward alike; a tensor kept for the backward in bf16 storage (forward)
        // and widened to float again where the backward uses it (backward).
        {"bf16_round", [&](int64_t n, bool) { cpu::round_bf16(x.data(), n); }},
        {"bf16_keep",
         [&](int64_t n, bool bw) {
             if (bw)
                 cpu::from_bf16(half.data(), n, y.data());
             else
                 cpu::to_bf16(x.data(), n, half.data());
         }},
        // A fresh gradient buffer, zeroed (the kernels accumulate into it).
        {"zero", [&](int64_t n, bool) { kernels::Tensor::zeros({n}); }},
        // A linear layer's bias: written to each output row before the product is added to it
        // (forward), its gradient the column sums (backward); the loops of kernels/cpu's
        // matmul_forward and _backward_weight.
        {"bias",
         [&](int64_t n, bool bw) {
             const int64_t rows = n / C;
             float* out = y.data();
             const float* b = w.data();
             if (!bw) {
#pragma omp parallel for schedule(static)
                 for (int64_t r = 0; r < rows; ++r) std::copy(b, b + C, out + r * C);
                 return;
             }
             float* db = dw.data();
             const float* dout = z.data();
#pragma omp parallel for schedule(static)
             for (int64_t o0 = 0; o0 < C; o0 += 256) {
                 int64_t o1 = std::min(C, o0 + 256);
                 for (int64_t r = 0; r < rows; ++r)
                     for (int64_t o = o0; o < o1; ++o) db[o] += dout[r * C + o];
             }
         }},
        // The gradient norm's pass alone (before its all-reduce and the update).
        {"sum_squares",
         [&](int64_t n, bool) {
             volatile double kept = cpu::sum_squares<float>(z.data(), n); // not optimised away
             (void)kept;
         }},
        // The optimizer's pass per parameter: the gradient norm, the clip, the AdamW update
        // and the zeroing of the gradient.
        {"adamw",
         [&](int64_t n, bool) {
             (void)cpu::sum_squares<float>(z.data(), n);
             cpu::scale<float>(z.data(), n, 1.0);
             cpu::adamw_step<float>(z.data(), n, adam, 1, x.data(), m.data(), v2.data());
             std::memset(y.data(), 0, static_cast<size_t>(n) * sizeof(float));
         }},
    };
    std::vector<StreamRate> out;
    for (int32_t t : plan.threads) {
        omp_set_num_threads(t);
        sweep_under<StreamRate>(retakes, progress, out, [&](std::vector<StreamRate>& rows) {
            for (const Elementwise& e : ops)
                for (int64_t n : plan.elements) {
                    double f = per_call([&] { e.run(n, false); }, plan.kernel_s);
                    double b = per_call([&] { e.run(n, true); }, plan.kernel_s);
                    rows.push_back(
                        {e.op, n, t, static_cast<double>(n) / f, static_cast<double>(n) / b});
                    progress.tick("element-wise kernels (" + std::to_string(t) + " threads)");
                }
            return std::string();
        });
    }
    return out;
}

double median_of(std::vector<double> v) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    const size_t h = v.size() / 2;
    return v.size() % 2 == 1 ? v[h] : 0.5 * (v[h - 1] + v[h]);
}

std::pair<double, double> median_pass(std::vector<std::pair<double, double>> passes) {
    if (passes.empty()) return {0.0, 0.0};
    std::sort(passes.begin(), passes.end(),
              [](const auto& a, const auto& b) { return a.first + a.second < b.first + b.second; });
    const size_t h = passes.size() / 2;
    if (passes.size() % 2 == 1) return passes[h];
    return {0.5 * (passes[h - 1].first + passes[h].first),
            0.5 * (passes[h - 1].second + passes[h].second)};
}

// The worker counts the cores' sharing is measured at: from two up to twice the cores, then
// three and four times; for two working sets.
std::vector<int32_t> sharing_counts(int32_t cores) {
    std::vector<int32_t> counts;
    for (int32_t w = 2; w <= 2 * cores; ++w) counts.push_back(w);
    for (int32_t w : {3 * cores, 4 * cores})
        if (w > 2 * cores) counts.push_back(w);
    return counts;
}
constexpr int sharing_sets = 2;

// Workers on one thread each, all at once: each one's matmul rate against one alone, for two
// working sets: a 256 x 256 product of a matrix with itself (512 KiB, within a core's cache),
// and a linear layer's (256, 512) x (2048, 512)^T (6.5 MiB, beyond it), whose workers taking
// turns on a core refill its cache at every turn. Up to twice as many workers as cores, then
// three and four times. A shared machine's speed drifts by several percent within seconds, so
// each count is timed right after one worker alone, in `sharing_rounds` rounds over all the
// counts, and keeps the median of its rounds' ratios.
constexpr int sharing_rounds = 5;
std::vector<SharingPoint> measure_sharing(int32_t cores, const Plan& plan, Progress& progress,
                                          Retakes& retakes) {
    const std::vector<int32_t> counts = sharing_counts(cores);
    std::vector<SharingPoint> out;
    for (auto [M, K, N] :
         std::array<std::array<int64_t, 3>, sharing_sets>{{{256, 256, 256}, {256, 512, 2048}}}) {
        const bool square = K == M && N == M; // the matrix times itself
        const double bytes = 4.0 * static_cast<double>(square ? 2 * M * M : M * K + N * K + M * N);
        auto rate_with = [&](int32_t workers) {
            std::vector<std::vector<float>> a(static_cast<size_t>(workers), filled(M * K)),
                w(static_cast<size_t>(workers), square ? std::vector<float>() : filled(N * K)),
                c(static_cast<size_t>(workers), std::vector<float>(M * N));
            std::atomic<int32_t> ready{0};
            std::atomic<bool> go{false};
            std::vector<double> rates(static_cast<size_t>(workers));
            const double span = plan.min_s * 10;
            std::vector<std::thread> threads;
            for (int32_t i = 0; i < workers; ++i)
                threads.emplace_back([&, i] {
                    omp_set_num_threads(1);
                    const float* in = a[static_cast<size_t>(i)].data();
                    const float* weight = square ? in : w[static_cast<size_t>(i)].data();
                    float* o = c[static_cast<size_t>(i)].data();
                    cpu::matmul_forward<float>(in, weight, nullptr, M, K, N, o);
                    ++ready;
                    while (!go) std::this_thread::yield();
                    auto t0 = Clock::now();
                    int calls = 0;
                    while (since(t0) < span) {
                        cpu::matmul_forward<float>(in, weight, nullptr, M, K, N, o);
                        ++calls;
                    }
                    rates[static_cast<size_t>(i)] = calls / since(t0);
                });
            while (ready < workers) std::this_thread::yield();
            go = true;
            for (auto& t : threads) t.join();
            double sum = 0;
            for (double r : rates) sum += r;
            return sum / workers;
        };
        // A working set's rounds are taken again where the host stole from them: one worker
        // alone is slowed as much as many, but a spell of steal need not cover both.
        sweep_under<SharingPoint>(retakes, progress, out, [&](std::vector<SharingPoint>& rows) {
            std::vector<std::vector<double>> ratios(counts.size());
            for (int round = 0; round < sharing_rounds; ++round)
                for (size_t k = 0; k < counts.size(); ++k) {
                    const double alone = rate_with(1);
                    ratios[k].push_back(rate_with(counts[k]) / alone);
                }
            for (size_t k = 0; k < counts.size(); ++k) {
                rows.push_back({counts[k], median_of(ratios[k]), bytes});
                progress.tick("cores shared by ranks");
            }
            return std::string();
        });
    }
    return out;
}

// The OS scheduler's time slice: two threads that never block, held to one core, each timing
// how long it runs before the other has its turn (a gap in its clock). The median turn.
double measure_slice(Progress& progress) {
    std::vector<double> turns[2];
    std::atomic<int32_t> ready{0};
    std::atomic<int> core{-1};
    auto spin = [&](std::vector<double>& out) {
        if (core < 0) core = sched_getcpu(); // the first: the core it is on; the second joins it
        OnCpu on(core);
        ++ready;
        while (ready < 2) {
        }
        auto t0 = Clock::now(), last = t0, began = t0;
        while (last - t0 < std::chrono::milliseconds(600)) {
            auto now = Clock::now();
            if (now - last > std::chrono::microseconds(50)) {
                if (began != t0) out.push_back(std::chrono::duration<double>(last - began).count());
                began = now;
            }
            last = now;
        }
    };
    // Both on the core the first one is on.
    std::thread a([&] { spin(turns[0]); });
    while (ready < 1) std::this_thread::yield();
    std::thread b([&] { spin(turns[1]); });
    a.join();
    b.join();
    progress.tick("the scheduler's time slice");
    std::vector<double> all(turns[0]);
    all.insert(all.end(), turns[1].begin(), turns[1].end());
    if (all.size() < 4) return 0.0; // the two never took turns: no slice seen
    return median_of(all);
}

// How long a thread blocked on a message takes to run once it is signalled, its core idle
// meanwhile (a pipeline's rank waiting for its activations): one thread works 1, 3 or 10 ms and
// then signals the other, which notes the time from the signal to its running again. The mean
// of 120 wake-ups, the two slowest left out (the host taking the core for longer, not a
// wake-up). Seconds.
double measure_wake(Progress& progress) {
    std::mutex m;
    std::condition_variable cv;
    bool signalled = false;
    Clock::time_point sent;
    const int n = 120;
    std::vector<double> delays;
    std::thread sleeper([&] {
        std::unique_lock lock(m);
        for (int i = 0; i < n; ++i) {
            cv.wait(lock, [&] { return signalled; });
            delays.push_back(since(sent));
            signalled = false;
            cv.notify_all();
        }
    });
    const std::array<double, 3> work_ms{1.0, 3.0, 10.0};
    for (int i = 0; i < n; ++i) {
        {
            std::unique_lock lock(m);
            cv.wait(lock, [&] { return !signalled; });
        }
        const auto t0 = Clock::now();
        while (since(t0) * 1e3 < work_ms[static_cast<size_t>(i) % work_ms.size()]) {
        }
        {
            std::lock_guard lock(m);
            signalled = true;
            sent = Clock::now();
        }
        cv.notify_all();
    }
    sleeper.join();
    progress.tick("a blocked thread's wake-up");
    std::sort(delays.begin(), delays.end());
    delays.resize(delays.size() - 2);
    double sum = 0;
    for (double d : delays) sum += d;
    return sum / static_cast<double>(delays.size());
}

// ----- communication ------------------------------------------------------------------------

// One-way seconds of a message of `bytes`: half the round trip of a tensor sent as an
// activation and returned as its gradient, between two threads.
double ping_pong(transport::PointToPoint& a, transport::PointToPoint& b, int64_t bytes, int iters) {
    kernels::Tensor t({std::max<int64_t>(1, bytes / 4)});
    std::memset(t.data<float>(), 0, static_cast<size_t>(t.numel()) * sizeof(float));
    auto echo = std::async(std::launch::async, [&] {
        for (int i = 0; i < iters + 1; ++i) {
            transport::P2PTag tag{i, 0, 0, transport::Direction::activation};
            kernels::Tensor got = b.recv(0, tag);
            b.send(0, {i, 1, 0, transport::Direction::gradient}, got);
        }
        b.flush();
    });
    Clock::time_point t0;
    for (int i = 0; i < iters + 1; ++i) {
        if (i == 1) t0 = Clock::now(); // the first exchange connects and warms up
        a.send(1, {i, 0, 0, transport::Direction::activation}, t);
        a.recv(1, {i, 1, 0, transport::Direction::gradient});
    }
    double s = since(t0) / iters / 2;
    a.flush();
    echo.get();
    return s;
}

// A message of fewer bytes takes no longer than one of more (it could be sent padded to it):
// each row's seconds at most those of the next larger one of its kind, so that a burst of
// other load during one small measurement does not price small messages above large ones.
template <class Sample, class Kind> void bound_by_larger(std::vector<Sample>& rows, Kind kind) {
    std::vector<Sample*> order;
    for (Sample& r : rows) order.push_back(&r);
    std::stable_sort(order.begin(), order.end(), [&](const Sample* a, const Sample* b) {
        return kind(*a) != kind(*b) ? kind(*a) < kind(*b) : a->bytes > b->bytes;
    });
    for (size_t i = 1; i < order.size(); ++i)
        if (kind(*order[i]) == kind(*order[i - 1]))
            order[i]->seconds = std::min(order[i]->seconds, order[i - 1]->seconds);
}

std::vector<TransferSample> measure_transfers(const std::vector<int64_t>& message,
                                              Progress& progress, Retakes& retakes,
                                              std::vector<std::string>& skipped) {
    std::vector<TransferSample> out;
    auto iters = [](int64_t bytes) { return bytes >= (1 << 22) ? 5 : 30; };
    // Every message size between two endpoints, in one sweep under `retakes`.
    auto sweep = [&](const char* name, transport::PointToPoint& a, transport::PointToPoint& b) {
        sweep_under<TransferSample>(retakes, progress, out, [&](std::vector<TransferSample>& rows) {
            for (int64_t bytes : message) {
                rows.push_back({name, bytes, ping_pong(a, b, bytes, iters(bytes))});
                progress.tick("transfers");
            }
            return std::string();
        });
    };
    {
        transport::InProcessFabric fabric;
        auto a = fabric.endpoint(0), b = fabric.endpoint(1);
        sweep("inprocess", *a, *b);
    }
    for (auto [name, tls, devices] :
         {std::tuple{"ucx-sm", "sm,self", ""}, std::tuple{"ucx-tcp", "tcp,self", "lo"}}) {
        try {
            transport::MemoryStore store;
            transport::UcxOptions o;
            o.timeout = std::chrono::seconds(20);
            o.transports = tls;
            o.net_devices = devices;
            auto fa = std::async(std::launch::async, [&] {
                return transport::make_ucx_endpoint(store, name, 0, 2, o);
            });
            auto b = transport::make_ucx_endpoint(store, name, 1, 2, o);
            auto a = fa.get();
            sweep(name, *a, *b);
            // Both close at once, as two processes do.
            auto closing = std::async(std::launch::async, [&] { a.reset(); });
            b.reset();
            closing.get();
        } catch (const std::exception& e) {
            skipped.push_back(std::string(name) + ": " + e.what());
        }
    }
    bound_by_larger(out, [](const TransferSample& t) { return t.transport; });
    return out;
}

using Members = std::vector<std::unique_ptr<transport::Collectives>>;

// A Gloo group of `size` members in this process (TCP loopback), or none (said in `skipped`).
Members join_gloo(int32_t size, const std::string& prefix, std::vector<std::string>& skipped) {
    Members gloo;
    try {
        transport::MemoryStore store;
        std::vector<std::future<std::unique_ptr<transport::Collectives>>> joining;
        for (int i = 0; i < size; ++i)
            joining.push_back(std::async(std::launch::async, [&, i] {
                return transport::make_gloo_collectives(store, prefix, i, size);
            }));
        for (auto& j : joining) gloo.push_back(j.get());
    } catch (const std::exception& e) {
        skipped.push_back(std::string("gloo: ") + e.what());
        gloo.clear();
    }
    return gloo;
}

// Between processes each step of a Gloo collective wakes a member's thread, which then waits
// for a core when other threads fill them (ExecCosts::reduction_wait), and the communication
// thread's own work around it (packing and copying each unit) runs on those cores too. Two
// members all-gather and all-reduce 64 KiB, 100 calls in a row, each after half a millisecond
// of work of its own, alone and beside two threads per core that never block (ranks that
// outnumber the cores): the extra seconds per step (one for the gather, two for the
// all-reduce), the median of five passes. 0 when Gloo is unavailable.
double measure_collective_wait(int32_t cores, Progress& progress,
                               std::vector<std::string>& skipped) {
    Members gloo = join_gloo(2, "calibrate-wait", skipped);
    progress.tick("collectives beside busy cores");
    if (gloo.empty()) return 0.0;
    const int64_t n = 16384; // 64 KiB
    std::vector<std::vector<float>> in(2, filled(n)), res(2, std::vector<float>(n));
    auto per_call = [&](bool gather) {
        auto t0 = Clock::now();
        std::vector<std::thread> members;
        for (size_t i = 0; i < 2; ++i)
            members.emplace_back([&, i] {
                for (int j = 0; j < 100; ++j) {
                    volatile double x = 1;
                    for (auto w0 = Clock::now(); since(w0) < 5e-4;) x = x * 1.0000001;
                    if (gather)
                        gloo[i]->all_gather(in[i].data(), n / 2, res[i].data());
                    else
                        gloo[i]->all_reduce(in[i].data(), n, transport::ReduceOp::sum);
                }
            });
        for (auto& t : members) t.join();
        return since(t0) / 100;
    };
    std::vector<double> waits;
    for (int pass = 0; pass < 5; ++pass) {
        const double gather = per_call(true), reduce = per_call(false);
        std::atomic<bool> stop{false};
        std::vector<std::thread> busy;
        for (int32_t i = 0; i < 2 * cores; ++i)
            busy.emplace_back([&] {
                volatile double x = 1;
                while (!stop.load(std::memory_order_relaxed)) x = x * 1.0000001 + 1e-9;
            });
        std::this_thread::sleep_for(std::chrono::milliseconds(50)); // all of them running
        const double gather_busy = per_call(true), reduce_busy = per_call(false);
        stop = true;
        for (auto& t : busy) t.join();
        waits.push_back(((gather_busy - gather) + (reduce_busy - reduce) / 2) / 2);
    }
    std::sort(waits.begin(), waits.end());
    return std::max(0.0, waits[2]);
}

std::vector<CollectiveSample> measure_collectives(int32_t cores, const Plan& plan,
                                                  Progress& progress, Retakes& retakes,
                                                  std::vector<std::string>& skipped) {
    std::vector<CollectiveSample> out;
    // Seconds per call of `count` calls in a row on every member's thread (0: as many as fill
    // about plan.min_s, chosen from a first run of three); the count used is written back.
    auto time_op = [&](Members& members, const std::string& op, int64_t bytes, int& count) {
        const int64_t n = std::max<int64_t>(members.size(), bytes / 4) / members.size() *
                          static_cast<int64_t>(members.size());
        const int64_t chunk = n / static_cast<int64_t>(members.size());
        // all_to_all: `bytes` is what each member sends in all, an equal share to each (itself
        // too), as a balanced mixture of experts' dispatch does
        // (plan::PlanStage::all_to_all_bytes).
        const std::vector<int64_t> counts(members.size(), chunk);
        std::vector<std::vector<float>> in(members.size(), filled(n)),
            res(members.size(), std::vector<float>(static_cast<size_t>(n)));
        auto calls = [&](int k) {
            auto t0 = Clock::now();
            std::vector<std::thread> threads;
            for (size_t i = 0; i < members.size(); ++i)
                threads.emplace_back([&, i] {
                    transport::Collectives& c = *members[i];
                    for (int j = 0; j < k; ++j) {
                        if (op == "all_reduce")
                            c.all_reduce(in[i].data(), n, transport::ReduceOp::sum);
                        else if (op == "reduce_scatter")
                            c.reduce_scatter(in[i].data(), chunk, res[i].data());
                        else if (op == "all_to_all")
                            c.all_to_all(in[i].data(), counts, res[i].data(), counts);
                        else
                            c.all_gather(in[i].data(), chunk, res[i].data());
                    }
                });
            for (auto& t : threads) t.join();
            return since(t0) / k;
        };
        if (count == 0) count = static_cast<int>(std::clamp(plan.min_s / calls(3), 3.0, 200.0));
        return calls(count);
    };
    std::vector<int32_t> sizes = {2};
    if (cores >= 4) sizes.push_back(4);
    for (int32_t size : sizes) {
        transport::InProcessGroup group(size, "calibrate");
        Members inprocess;
        for (int i = 0; i < size; ++i) inprocess.push_back(group.member(i));
        Members gloo = join_gloo(size, "calibrate", skipped);
        // Every collective once per pass, the passes one after another, each keeping its
        // fastest: a burst of other load on the machine slows one pass of a collective, not
        // all of its runs (run back to back, a small one's all fit in 10 ms). A pass the host
        // stole from is taken again.
        const size_t first = out.size();
        for (const char* op : {"all_reduce", "reduce_scatter", "all_gather", "all_to_all"})
            for (int64_t bytes : plan.message)
                for (const char* backend : {"inprocess", "gloo"})
                    if (std::string(backend) == "inprocess" || !gloo.empty())
                        out.push_back(
                            {backend, op, size, bytes, std::numeric_limits<double>::infinity()});
        std::vector<int> count(out.size() - first, 0);
        for (int pass = 0; pass < 3; ++pass) {
            std::vector<double> seconds;
            sweep_under<double>(retakes, progress, seconds, [&](std::vector<double>& times) {
                for (size_t k = 0; first + k < out.size(); ++k) {
                    const CollectiveSample& c = out[first + k];
                    times.push_back(
                        time_op(c.backend == "gloo" ? gloo : inprocess, c.op, c.bytes, count[k]));
                    if (pass == 2 && (c.backend == "gloo" || gloo.empty())) // one per size
                        progress.tick("collectives");
                }
                return std::string();
            });
            for (size_t k = 0; k < seconds.size(); ++k)
                out[first + k].seconds = std::min(out[first + k].seconds, seconds[k]);
        }
    }
    bound_by_larger(
        out, [](const CollectiveSample& c) { return std::make_tuple(c.backend, c.op, c.ranks); });
    return out;
}

// ----- whole actions ------------------------------------------------------------------------

// A real step's actions cost more than their kernels: buffers allocated and freed, data that
// has left the caches since it was written, the units' bookkeeping. Small GPTs train a few steps
// on one rank (with all the cores, and again with one thread), and each forward and backward is
// set beside the kernels' prediction from the rates just measured. Probes of one block and of
// more tell a fixed cost per block from the kernels' scale: measured = scale x kernels +
// overhead x blocks, fitted by least squares, for forwards and backwards apart; and each
// width's pair at each token count alone, a scale (small widths cost more beyond their kernels
// than one line over all widths gives them, and small microbatches less than large ones: their
// activations stay nearer the cores).
// The whole-action probes (width, rows of 64 tokens, layers), each width twice with more blocks
// the second time, at two token counts, and how many passes run them.
std::vector<Probe> probe_shapes(bool quick) {
    if (quick) return {{64, 1, 1, {}, {}}, {64, 1, 2, {}, {}}};
    return {{128, 8, 1, {}, {}}, {128, 8, 4, {}, {}}, {128, 2, 1, {}, {}}, {128, 2, 4, {}, {}},
            {256, 4, 1, {}, {}}, {256, 4, 4, {}, {}}, {256, 2, 1, {}, {}}, {256, 2, 4, {}, {}},
            {512, 4, 1, {}, {}}, {512, 4, 2, {}, {}}, {512, 2, 1, {}, {}}, {512, 2, 2, {}, {}}};
}
int probe_passes(bool quick) {
    return quick ? 1 : 4;
}

bool after_probe_pass(int pass, int passes) {
    return pass % 2 == 1 || pass == passes - 1;
}

int side_passes(int passes) {
    int n = 0;
    for (int pass = 0; pass < passes; ++pass) n += after_probe_pass(pass, passes) ? 1 : 0;
    return n;
}

// Trains a probe's plan in this process; what went wrong, or "".
std::string train_probe(const Program& p, const plan::Graph& g, const runtime::SessionOptions& so) {
    try {
        runtime::Session session(p, g, so);
        runtime::SessionError e = session.open();
        if (e.message.empty()) e = session.run();
        return e.message;
    } catch (const std::exception& e) {
        return e.what();
    }
}

std::string gpt_script(const GptScript& s) {
    return "import \"std/gpt.dist\"\nmodel = gpt(vocab: 256, context: 64, layers: " +
           std::to_string(s.layers) + ", heads: " + std::to_string(s.heads) +
           ", width: " + std::to_string(s.width) + ")\nmesh {\n    devices: " + s.devices +
           "\n    dp: " + std::to_string(s.dp) + "\n    tp: " + std::to_string(s.tp) +
           "\n    pp: " + std::to_string(s.pp) + "\n}\nschedule {\n    kind: " + s.schedule +
           "\n    microbatches: " + std::to_string(s.microbatches) +
           "\n}\ntrain {\n    data: synthetic()\n    batch: " + std::to_string(s.batch) +
           "\n    steps: " + std::to_string(s.steps) + "\n    seed: 1\n}\n";
}

std::string plan_script(const std::string& text, Program& program, plan::Graph& graph) {
    lang::FrontendOptions fo;
    fo.search_roots = lang::default_search_roots();
    lang::CheckResult checked = lang::check_text("<calibration probe>", text, fo);
    if (!checked.ok()) return checked.report();
    plan::PlanResult planned = plan::lower(*checked.program);
    if (!planned.ok()) return "the probe has no plan";
    program = *checked.program;
    graph = *planned.graph;
    return "";
}

namespace {

// A probe's program and plan (a GPT of its shape trained 1F1B over two microbatches on one rank
// of `devices`); what was wrong, or "". A CPU's probe trains 6 steps (5 timed) in each of its
// passes: a shared machine's pace moves within seconds, and more passes of fewer steps see
// more of it than fewer longer ones.
std::string plan_probe(Probe& pr, const std::string& devices, bool quick) {
    Program program;
    plan::Graph graph;
    const int32_t steps = quick ? 3 : devices == "cpu" ? 6 : 8;
    std::string e = plan_script(
        gpt_script({pr.width, pr.layers, pr.heads, devices, 1, 1, 2, 2 * pr.rows, steps}), program,
        graph);
    if (!e.empty()) return e;
    pr.program = std::move(program);
    pr.graph = std::move(graph);
    return "";
}

// Trains a planned probe on `threads` threads: the median forward and backward (a split one's I
// and W together) per microbatch of its steps after the first into `medians`, and where
// `input` is given, the median I; what went wrong, or "".
std::string time_probe(const Probe& pr, int32_t threads, std::pair<double, double>& medians,
                       double* input = nullptr) {
    using plan::ActionKind;
    const plan::Graph& g = *pr.graph;
    std::vector<double> f_times, b_times, i_times;
    runtime::SessionOptions so;
    so.join_launch = false;
    so.threads = threads;
    so.on_step = [&](const runtime::SessionStep& step) {
        if (step.metrics.step <= 1 || step.timings.empty()) return true; // warming up
        double f = 0, b = 0, i = 0;
        for (const runtime::ActionTiming& a : step.timings[0]) {
            const ActionKind k = g.ranks[0].actions[a.action].kind;
            const double took = a.end_s - a.start_s;
            if (k == ActionKind::forward)
                f += took;
            else if (plan::is_compute(k))
                b += took; // B, or a split one's I and W
            if (k == ActionKind::backward_input) i += took;
        }
        f_times.push_back(f / g.microbatches);
        b_times.push_back(b / g.microbatches);
        i_times.push_back(i / g.microbatches);
        return true;
    };
    if (std::string e = train_probe(*pr.program, g, so); !e.empty()) return e;
    medians = {median_of(f_times), median_of(b_times)};
    if (input) *input = median_of(i_times);
    return "";
}

} // namespace

OnCpu::OnCpu(int cpu) {
    if (cpu < 0) return;
    CPU_ZERO(&saved_);
    if (pthread_getaffinity_np(pthread_self(), sizeof saved_, &saved_) != 0) return;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    held_ = pthread_setaffinity_np(pthread_self(), sizeof one, &one) == 0;
}

OnCpu::~OnCpu() {
    if (held_) pthread_setaffinity_np(pthread_self(), sizeof saved_, &saved_);
}

namespace {

// Sums each unit's seconds, forward and backward (its input and weight gradients).
class UnitClock final : public models::UnitHooks {
  public:
    void before(size_t, Phase) override { t0_ = Clock::now(); }
    void after(size_t unit, Phase phase) override {
        if (seconds.size() <= unit) seconds.resize(unit + 1, {0, 0});
        seconds[unit][phase == Phase::forward ? 0 : 1] += since(t0_);
    }
    std::vector<std::array<double, 2>> seconds;

  private:
    Clock::time_point t0_;
};

} // namespace

std::pair<size_t, size_t> end_units(const ModelSpec& spec) {
    // A stage of no blocks of its own, first and then last.
    return {models::Stage(spec, {0, 0, true, false}, 1).unit_parameters().size(),
            models::Stage(spec, {0, 0, false, true}, 1).unit_parameters().size()};
}

EndsShare ends_share(const Program& program, int rows, int32_t threads) {
    const ModelSpec& spec = program.model;
    const auto [pre, post] = end_units(spec);
    models::Model model(spec, 1);
    const int64_t tokens = rows * spec.context;
    kernels::Tensor in({rows, spec.context}, kernels::DType::i32),
        out({rows, spec.context}, kernels::DType::i32);
    for (int64_t i = 0; i < tokens; ++i) {
        in.data<int32_t>()[i] = static_cast<int32_t>((7 * i + 3) % spec.vocab);
        out.data<int32_t>()[i] = static_cast<int32_t>((11 * i + 5) % spec.vocab);
    }
    UnitClock clock;
    const int kept_threads = omp_get_max_threads();
    omp_set_num_threads(std::max(1, threads));
    for (int step = 0; step < 6; ++step) {
        if (step == 1) model.set_hooks(&clock); // the first warms the caches and the allocator
        model.forward(step, in, out);
        model.backward(step, 1.0);
    }
    model.set_hooks(nullptr);
    omp_set_num_threads(kept_threads);
    const size_t n = clock.seconds.size();
    if (n <= pre + post) return {};
    std::array<double, 2> ends{0, 0}, first{0, 0}, all{0, 0};
    for (size_t u = 0; u < n; ++u)
        for (size_t k = 0; k < 2; ++k) {
            all[k] += clock.seconds[u][k];
            if (u < pre || u >= n - post) ends[k] += clock.seconds[u][k];
            if (u < pre) first[k] += clock.seconds[u][k];
        }
    auto share = [&](const std::array<double, 2>& part, size_t k) {
        return all[k] > 0 ? part[k] / all[k] : -1.0;
    };
    return {share(ends, 0), share(ends, 1), share(first, 0), share(first, 1)};
}

std::vector<std::vector<Probe>> run_probes(const std::vector<Probe>& shapes, int passes, bool quick,
                                           const std::string& devices,
                                           const std::vector<int32_t>& threads, Progress& progress,
                                           Retakes& retakes, std::vector<std::string>& skipped,
                                           const std::function<void(int)>& after_pass) {
    // Every probe on every thread count once per pass, the passes one after another; each
    // keeps its median pass's medians (the pass of the median forward and backward): a burst
    // of other work slows the probes of one pass, not the others, and a run's step is its
    // steps' median, not its fastest step. Each probe runs on every thread count in turn
    // before the next probe: a shared machine's pace moves within seconds, and the scales of
    // ranks of all the cores and of one thread are set against each other, so each pass times
    // a probe's thread counts at the same pace.
    const std::vector<std::vector<Probe>> failed(threads.size());
    std::vector<Probe> planned = shapes;
    for (Probe& pr : planned)
        if (std::string e = plan_probe(pr, devices, quick); !e.empty()) {
            skipped.push_back("whole actions: " + e);
            return failed;
        }
    std::vector<std::vector<Probe>> out(threads.size(), planned);
    // timed[t][i]: each pass's forward and backward of probe i on threads[t]
    std::vector<std::vector<std::vector<std::pair<double, double>>>> timed(
        threads.size(), std::vector<std::vector<std::pair<double, double>>>(shapes.size()));
    // A one-thread probe runs once on each of two cores in every pass, held to it, and the pass
    // keeps their mean: the cores' paces differ by several percent and drift apart and back over
    // minutes, and a lone thread runs on whichever core the OS gives it. Held to each in turn,
    // the probes price a core at the cores' mean pace (the pace a pipeline's ranks, a core
    // each, get on average), and the probes of a width (one block and more, whose difference
    // tells the blocks from the ends) meet the same cores.
    std::vector<int> cpus = allowed_cpus();
    const int32_t most = threads.empty() ? 1 : *std::max_element(threads.begin(), threads.end());
    if (static_cast<int32_t>(cpus.size()) > most) cpus.resize(static_cast<size_t>(most));
    const auto t0 = Clock::now();
    for (int pass = 0; pass < passes; ++pass) {
        for (size_t i = 0; i < planned.size(); ++i)
            for (size_t t = 0; t < threads.size(); ++t) {
                // Two cores a pass at most (a many-core machine's passes take the next two).
                std::vector<int> where{-1};
                if (threads[t] == 1 && cpus.size() > 1) {
                    where.clear();
                    for (size_t j = 0; j < 2; ++j)
                        where.push_back(cpus[(2 * static_cast<size_t>(pass) + j) % cpus.size()]);
                }
                std::pair<double, double> sum{0, 0};
                out[t][i].started.push_back(since(t0));
                for (int cpu : where) {
                    std::pair<double, double> medians, tried;
                    OnCpu on(cpu);
                    if (std::string e = retakes.take(
                            on.held() ? std::vector<int>{cpu} : cpus,
                            [&] { return time_probe(planned[i], threads[t], tried); },
                            [&] { medians = tried; });
                        !e.empty()) {
                        skipped.push_back("whole actions: " + e);
                        return failed;
                    }
                    sum.first += medians.first;
                    sum.second += medians.second;
                    if (on.held()) out[t][i].held.push_back({cpu, medians.first + medians.second});
                }
                const double n = static_cast<double>(where.size());
                timed[t][i].push_back({sum.first / n, sum.second / n});
                progress.tick("whole actions");
            }
        if (after_pass) after_pass(pass);
    }
    // The ends' share of each probe on the CPU, timed unit by unit on its threads.
    if (devices == "cpu")
        for (size_t t = 0; t < threads.size(); ++t)
            for (Probe& pr : out[t])
                if (threads[t] > 0) pr.ends = ends_share(*pr.program, pr.rows, threads[t]);
    for (size_t t = 0; t < threads.size(); ++t)
        for (size_t i = 0; i < planned.size(); ++i) {
            std::vector<std::pair<double, double>>& kept = timed[t][i];
            Probe& pr = out[t][i];
            for (const auto& [f, b] : kept) pr.passes.push_back(f + b);
            std::tie(pr.forward, pr.backward) = median_pass(kept);
        }
    return out;
}

std::vector<std::pair<int, double>> cpu_paces(const std::vector<Probe>& probes) {
    std::map<int, std::pair<double, int>> logs; // cpu: the sum of its runs' log paces, count
    double all = 0;
    int n = 0;
    for (const Probe& pr : probes)
        for (const auto& [cpu, seconds] : pr.held) {
            if (seconds <= 0 || pr.forward + pr.backward <= 0) continue;
            const double l = std::log(seconds / (pr.forward + pr.backward));
            logs[cpu].first += l;
            ++logs[cpu].second;
            all += l;
            ++n;
        }
    std::vector<std::pair<int, double>> out;
    if (logs.size() < 2) return out;
    for (const auto& [cpu, sum] : logs)
        out.push_back({cpu, std::exp(sum.first / sum.second - all / n)});
    return out;
}

std::vector<double> pass_pace(const std::vector<Probe>& probes) {
    std::vector<double> pace;
    for (size_t pass = 0; !probes.empty() && pass < probes[0].passes.size(); ++pass) {
        double logs = 0;
        int n = 0;
        for (const Probe& pr : probes)
            if (pass < pr.passes.size() && pr.forward + pr.backward > 0 && pr.passes[pass] > 0) {
                logs += std::log(pr.passes[pass] / (pr.forward + pr.backward));
                ++n;
            }
        pace.push_back(n ? std::exp(logs / n) : 1.0);
    }
    return pace;
}

ActionFit fit_actions(const std::vector<Probe>& probes, const Calibration& cal, int32_t threads) {
    struct Point {
        double kernels, count, measured; // the kernels' seconds, blocks, the action's seconds
    };
    std::vector<Point> fwd, bwd;
    ActionFit fit;
    fit.threads = threads;
    fit.cpu_paces = cpu_paces(probes);
    sim::Rates rates(cal);
    for (const Probe& pr : probes) {
        const Program& p = *pr.program;
        const plan::Graph& g = *pr.graph;
        // The stage's kernels, its blocks apart from its ends.
        plan::PlanStage blocks = g.stages[0], ends = g.stages[0];
        blocks.embedding = blocks.head = false;
        ends.blocks = 0;
        sim::StageSeconds kb = sim::stage_seconds(p, blocks, rates, threads, false);
        sim::StageSeconds ke = sim::stage_seconds(p, ends, rates, threads, false);
        const double count = g.stages[0].blocks;
        fwd.push_back({kb.forward + ke.forward, count, pr.forward});
        bwd.push_back({kb.input + kb.weight + ke.input + ke.weight, count, pr.backward});
        char line[200];
        std::snprintf(line, sizeof line,
                      "width %d, %d tokens, %d blocks: F %.3f ms (kernels %.3f), B %.3f ms "
                      "(kernels %.3f)",
                      pr.width, pr.rows * 64, pr.layers, 1e3 * fwd.back().measured,
                      1e3 * fwd.back().kernels, 1e3 * bwd.back().measured,
                      1e3 * bwd.back().kernels);
        std::string said = line;
        if (pr.ends.forward >= 0 && pr.ends.backward >= 0) {
            char ends[96];
            std::snprintf(ends, sizeof ends,
                          "; ends %.1f%% of F, %.1f%% of B (the embeddings %.1f%%, %.1f%%)",
                          100 * pr.ends.forward, 100 * pr.ends.backward,
                          100 * pr.ends.first_forward, 100 * pr.ends.first_backward);
            said += ends;
        }
        fit.probes.push_back(said);
    }
    // An action costs its kernels scaled and a fixed amount more per block (buffers,
    // bookkeeping): least squares of measured = s x kernels + c x blocks. Where that gives a
    // negative coefficient (or too few probes), the scale alone. The ends (embeddings, head,
    // loss) are a small part of every probe: a scale of their own is not determined by them.
    // The scale and the cost per block; the profile's blocks' and ends' scales are both the one.
    auto solve = [](const std::vector<Point>& pts) -> std::pair<double, double> {
        double kk = 0, kn = 0, nn = 0, ky = 0, ny = 0;
        for (const Point& q : pts) {
            const double k = q.kernels;
            kk += k * k;
            kn += k * q.count;
            nn += q.count * q.count;
            ky += k * q.measured;
            ny += q.count * q.measured;
        }
        const double det = kk * nn - kn * kn;
        if (pts.size() >= 3 && det > 1e-12 * kk * nn) {
            const double scale = (ky * nn - ny * kn) / det, per_block = (kk * ny - kn * ky) / det;
            if (scale > 0 && per_block >= 0) return {scale, per_block};
        }
        return {kk > 0 ? ky / kk : 1.0, 0.0};
    };
    std::tie(fit.scale[0], fit.overhead[0]) = solve(fwd);
    std::tie(fit.scale[2], fit.overhead[1]) = solve(bwd);
    fit.scale[1] = fit.scale[0];
    fit.scale[3] = fit.scale[2];
    return fit;
}

std::vector<double> blocks_and_ends_scales(const std::vector<std::vector<ActionPoint>>& groups) {
    // With r = measured: a = blocks / r and c = ends / r, each residual is a_i s_g + c_i e - 1.
    // For a given e, group g's best s_g is alpha_g - e beta_g; put back, each residual is
    // u_i + e v_i, whose least squares gives e.
    const size_t n = groups.size();
    std::vector<double> alpha(n, 0), beta(n, 0), mean(n, 0);
    double uv = 0, vv = 0, uu = 0;
    for (size_t g = 0; g < n; ++g) {
        double aa = 0, a1 = 0, ac = 0;
        for (const ActionPoint& q : groups[g]) {
            const double a = q.blocks / q.measured, c = q.ends / q.measured;
            aa += a * a;
            a1 += a;
            ac += a * c;
            mean[g] += q.measured / (q.blocks + q.ends) / static_cast<double>(groups[g].size());
        }
        if (aa <= 0) continue;
        alpha[g] = a1 / aa;
        beta[g] = ac / aa;
        for (const ActionPoint& q : groups[g]) {
            const double a = q.blocks / q.measured, c = q.ends / q.measured;
            const double u = a * alpha[g] - 1, v = c - a * beta[g];
            uv += u * v;
            vv += v * v;
            uu += u * u;
        }
    }
    // Measured: the ends' seconds (their share of each action) over their kernels'.
    double shared = 0, kernels = 0;
    bool measured = !groups.empty();
    for (const std::vector<ActionPoint>& group : groups)
        for (const ActionPoint& q : group) {
            measured = measured && q.share >= 0;
            shared += q.share * q.measured;
            kernels += q.ends;
        }
    // Else fitted; not determined where the probes of each group have the same share of ends
    // (one block count each), or none has ends.
    const double ends = measured                          ? (kernels > 0 ? shared / kernels : 0.0)
                        : vv > 1e-9 * std::max(uu, 1e-12) ? -uv / vv
                                                          : 0.0;
    std::vector<double> out(n + 1);
    bool positive = ends > 0;
    for (size_t g = 0; g < n; ++g) {
        out[g] = alpha[g] - ends * beta[g];
        positive = positive && out[g] > 0;
    }
    out[n] = ends;
    if (!positive) { // the mean ratio of each group, its ends' scale theirs too
        for (size_t g = 0; g < n; ++g) out[g] = mean[g];
        out[n] = 0;
    }
    return out;
}

std::vector<ActionFit> fits_by_width(const std::vector<Probe>& probes, const Calibration& cal,
                                     int32_t threads) {
    // Within one width and token count the probes differ only in their blocks, which tells the
    // blocks' scale from what the ends cost beyond their kernels. The ends are a small part of
    // a wide probe, too small to be told apart at one width: one scale serves every width.
    std::map<std::pair<int, int>, std::vector<const Probe*>> widths; // (width, rows)
    for (const Probe& pr : probes) widths[{pr.width, pr.rows}].push_back(&pr);
    std::erase_if(widths, [](const auto& w) { return w.second.size() < 2; });
    sim::Rates rates(cal);
    // Each probe's kernels: its blocks', its first end's (the embeddings) and its last end's
    // (final norm, head, loss), forward and backward.
    struct Kernels {
        std::array<double, 2> blocks, first, last;
    };
    auto kernels_of = [&](const Probe& pr) {
        plan::PlanStage blocks = pr.graph->stages[0], first = blocks, last = blocks;
        blocks.embedding = blocks.head = false;
        first.blocks = last.blocks = 0;
        first.head = last.embedding = false;
        auto seconds = [&](const plan::PlanStage& s) -> std::array<double, 2> {
            sim::StageSeconds k = sim::stage_seconds(*pr.program, s, rates, threads, false);
            return {k.forward, k.input + k.weight};
        };
        return Kernels{seconds(blocks), seconds(first), seconds(last)};
    };
    // Each end's own scale, its measured seconds over its kernels' over every probe: the
    // embeddings cost several times their kernels (their output allocated and copied), the
    // head and loss nearer theirs, and a stage holds one end without the other.
    std::array<double, 2> first_end{0, 0}, last_end{0, 0};
    {
        std::array<double, 2> first_s{0, 0}, first_k{0, 0}, last_s{0, 0}, last_k{0, 0};
        bool timed = !widths.empty();
        for (const auto& [shape, these] : widths)
            for (const Probe* pr : these) {
                const Kernels k = kernels_of(*pr);
                const std::array<double, 2> share{pr->ends.forward, pr->ends.backward},
                    first{pr->ends.first_forward, pr->ends.first_backward},
                    measured{pr->forward, pr->backward};
                for (size_t d = 0; d < 2; ++d) {
                    timed = timed && share[d] >= 0 && first[d] >= 0;
                    first_s[d] += first[d] * measured[d];
                    last_s[d] += (share[d] - first[d]) * measured[d];
                    first_k[d] += k.first[d];
                    last_k[d] += k.last[d];
                }
            }
        for (size_t d = 0; timed && d < 2; ++d)
            if (first_s[d] > 0 && first_k[d] > 0 && last_s[d] > 0 && last_k[d] > 0) {
                first_end[d] = first_s[d] / first_k[d];
                last_end[d] = last_s[d] / last_k[d];
            }
    }
    // The blocks' fit sees the ends at the last end's scale, the first end's kernels weighted
    // by the ratio of the two: its ends' scale is then the last end's.
    auto ends_kernels = [&](const Kernels& k, size_t d) {
        return (first_end[d] > 0 ? k.first[d] * first_end[d] / last_end[d] : k.first[d]) +
               k.last[d];
    };
    std::vector<std::vector<ActionPoint>> forward, backward;
    for (const auto& [shape, these] : widths) {
        forward.emplace_back();
        backward.emplace_back();
        for (const Probe* pr : these) {
            const Kernels k = kernels_of(*pr);
            forward.back().push_back(
                {k.blocks[0], ends_kernels(k, 0), pr->forward, pr->ends.forward});
            backward.back().push_back(
                {k.blocks[1], ends_kernels(k, 1), pr->backward, pr->ends.backward});
        }
    }
    const std::vector<double> f = blocks_and_ends_scales(forward);
    const std::vector<double> b = blocks_and_ends_scales(backward);
    std::vector<ActionFit> out;
    size_t g = 0;
    for (const auto& [shape, these] : widths) {
        ActionFit fit;
        fit.threads = threads;
        fit.width = shape.first;
        fit.tokens = static_cast<int64_t>(shape.second) * 64;
        fit.scale = {f[g], f.back() > 0 ? f.back() : f[g], b[g], b.back() > 0 ? b.back() : b[g]};
        // The first end apart where both ends' scales came out (else it is the ends').
        for (size_t d = 0; d < 2; ++d)
            fit.first_end[d] = first_end[d] > 0 && (d == 0 ? f : b).back() > 0 ? first_end[d] : 0;
        // Where the ends' scale came out, each probe's blocks at their own scale: what is left of
        // its actions beyond its ends, over its blocks' kernels. A block costs more beside
        // others than alone (the stage's activations further from the caches), which one scale
        // for the group would average away.
        std::vector<ActionFit> each;
        for (size_t i = 0; i < these.size() && f.back() > 0 && b.back() > 0; ++i) {
            const ActionPoint& qf = forward[g][i];
            const ActionPoint& qb = backward[g][i];
            ActionFit one = fit;
            one.blocks = these[i]->layers;
            one.scale[0] = qf.blocks > 0 ? (qf.measured - f.back() * qf.ends) / qf.blocks : 0.0;
            one.scale[2] = qb.blocks > 0 ? (qb.measured - b.back() * qb.ends) / qb.blocks : 0.0;
            if (one.scale[0] <= 0 || one.scale[2] <= 0) break;
            each.push_back(one);
        }
        if (each.size() == these.size())
            out.insert(out.end(), each.begin(), each.end());
        else
            out.push_back(fit);
        ++g;
    }
    return out;
}

// ----- ranks beyond the cores ---------------------------------------------------------------

// Single-threaded ranks that outnumber the cores take turns on them, and a turn comes at every
// action: each finds other ranks' data in its core's caches, so its actions cost more than the
// probes alone say, and more with more ranks a core. Pipelines of two and of four such ranks a
// core, two blocks a stage, train a few steps at each width after every other pass of the
// probes (the widest at four a core, the slowest, three steps a pass, the first untimed), and the
// simulator prices the same plans with the profile: the factor on the actions' work that makes
// it agree with a pipeline's median step (four rounds of factor x measured / simulated, the step
// being nearly all the cores' work) is a row of the profile's `oversubscribed`. Each pass's step
// is set at the pace the probes kept (over that pass's pace): a shared machine's speed drifts
// over a calibration, and the factor is a ratio of two measurements that should see the same
// speed.
struct OversubscribedRun {
    int per_core, width, steps, tp;
    Program program; // trained on `cpu`: a profile does not change how a run runs
    plan::Graph graph;
    std::vector<std::pair<int, double>> passes{}; // (pass, its median step)
    std::vector<double> bubbles{};                // each pass's median bubble
    std::vector<double> busy{}; // each pass's median share of the cores the ranks ran on them
};

// `ranks` single-threaded ranks: a pipeline, or tensor-parallel groups of `tp` along one.
std::string oversubscribed_script(int width, int ranks, int steps, const std::string& devices,
                                  int tp) {
    const int pp = std::max(1, ranks / tp);
    return gpt_script({width, 2 * pp, 4, devices, 1, pp, 2 * pp, 4 * pp, steps, tp});
}

// The pipelines: ranks a core, width, steps a pass.
std::vector<OversubscribedRun> oversubscribed_runs(int32_t cores, bool quick,
                                                   std::vector<std::string>& skipped) {
    // Ranks a core, width, steps, tensor-parallel group. Ranks that meet inside every layer take
    // their turns otherwise than a pipeline's, which meet only between actions: at four a core
    // a pipeline's factor priced dp 2 x tp 2 x pp 2 at 0.82-1.29 of its step over three runs.
    using Shape = std::tuple<int, int, int, int>;
    const std::vector<Shape> shapes =
        quick
            ? std::vector<Shape>{{2, 64, 3, 1}, {4, 64, 3, 1}, {2, 64, 3, 2}, {4, 64, 3, 2}}
            : std::vector<Shape>{{2, 128, 19, 1}, {2, 512, 9, 1}, {4, 128, 11, 1}, {4, 512, 3, 1},
                                 {2, 128, 19, 2}, {2, 512, 5, 2}, {4, 128, 11, 2}, {4, 512, 3, 2}};
    std::vector<OversubscribedRun> runs;
    for (const auto& [per_core, width, steps, tp] : shapes) {
        if (tp > per_core * cores) continue;
        OversubscribedRun run{per_core, width, steps, tp, {}, {}};
        if (std::string e =
                plan_script(oversubscribed_script(width, per_core * cores, steps, "cpu", tp),
                            run.program, run.graph);
            !e.empty()) {
            skipped.push_back("ranks beyond the cores: " + e);
            return {};
        }
        runs.push_back(std::move(run));
    }
    return runs;
}

// How many trainings the pipelines make in `passes` passes.
int oversubscribed_ticks(const std::vector<OversubscribedRun>& runs, int passes) {
    return static_cast<int>(runs.size()) * passes;
}

// The share of the cores' time in a step that its ranks' threads (`per_core` a core) ran on
// them: their actions' CPU clocks over cores x step; -1 where a clock was not read.
double cores_busy(const runtime::SessionStep& step, int per_core) {
    double on = 0;
    for (const std::vector<runtime::ActionTiming>& rank : step.timings)
        for (const runtime::ActionTiming& a : rank) {
            if (a.collective) continue;
            if (a.cpu_s < 0) return -1;
            on += a.cpu_s;
        }
    const double cores = static_cast<double>(step.timings.size()) / per_core;
    const double step_s = step.metrics.step_time_s;
    return cores > 0 && step_s > 0 ? on / (cores * step_s) : -1;
}

// One pass of `run`, as pass `pass`, a step of the progress line named `what`; what went
// wrong, or "".
std::string time_pipeline(OversubscribedRun& run, int pass, Progress& progress, Retakes& retakes,
                          const char* what = "ranks beyond the cores") {
    std::vector<double> steps, bubbles, busy, kept_steps, kept_bubbles, kept_busy;
    runtime::SessionOptions so;
    so.join_launch = false;
    so.threads = 1;
    so.on_step = [&](const runtime::SessionStep& step) {
        if (step.metrics.step > 1) { // the first allocates and warms the caches
            steps.push_back(step.metrics.step_time_s);
            if (!step.timings.empty()) bubbles.push_back(step.bubble);
            if (const double b = cores_busy(step, run.per_core); b >= 0) busy.push_back(b);
        }
        return true;
    };
    auto once = [&] {
        steps.clear();
        bubbles.clear();
        busy.clear();
        return train_probe(run.program, run.graph, so);
    };
    auto keep = [&] {
        kept_steps = steps;
        kept_bubbles = bubbles;
        kept_busy = busy;
    };
    if (std::string e = retakes.take({}, once, keep); !e.empty()) return e;
    progress.tick(what);
    if (!kept_steps.empty()) run.passes.push_back({pass, median_of(kept_steps)});
    if (!kept_bubbles.empty()) run.bubbles.push_back(median_of(kept_bubbles));
    if (!kept_busy.empty()) run.busy.push_back(median_of(kept_busy));
    return "";
}

// Pass `pass`: every pipeline, once.
void time_oversubscribed(std::vector<OversubscribedRun>& runs, int pass, Progress& progress,
                         Retakes& retakes, std::vector<std::string>& skipped) {
    for (OversubscribedRun& run : runs)
        if (std::string e = time_pipeline(run, pass, progress, retakes); !e.empty()) {
            skipped.push_back("ranks beyond the cores: " + e);
            runs.clear();
            return;
        }
}

double at_pace(const std::vector<double>& pace, int pass) {
    const size_t p = static_cast<size_t>(pass);
    return pass >= 0 && p < pace.size() && pace[p] > 0 ? pace[p] : 1.0;
}

bool passes_apart(const std::vector<std::pair<int, double>>& passes,
                  const std::vector<double>& pace) {
    if (passes.size() != 2) return false;
    const double a = passes[0].second / at_pace(pace, passes[0].first),
                 b = passes[1].second / at_pace(pace, passes[1].first);
    return std::min(a, b) > 0 && std::max(a, b) / std::min(a, b) > 1 + kPassesApart;
}

// A pipeline whose two passes ran apart is timed a third time, at once (at the kept pace: the
// probes have no pass there), for the median of three; `pass`: the index it is timed as. How
// many ran apart.
int settle_oversubscribed(std::vector<OversubscribedRun>& runs, const std::vector<double>& pace,
                          int pass, Progress& progress, Retakes& retakes,
                          std::vector<std::string>& skipped) {
    int apart = 0;
    for (OversubscribedRun& run : runs) {
        if (!passes_apart(run.passes, pace)) continue;
        ++apart;
        const int done = progress.done(); // a step the line did not count on
        std::string e =
            time_pipeline(run, pass, progress, retakes, "ranks beyond the cores, again");
        progress.back_to(done);
        if (!e.empty()) {
            skipped.push_back("ranks beyond the cores: " + e);
            runs.clear();
            break;
        }
    }
    return apart;
}

DraftProfile::DraftProfile(const std::string& text) {
    std::string dir = (std::filesystem::temp_directory_path() / "dist-calibrate.XXXXXX").string();
    if (::mkdtemp(dir.data()) == nullptr) return;
    dir_ = dir;
    std::error_code ec;
    std::filesystem::create_directories(dir_ / "hardware", ec);
    std::ofstream(dir_ / "hardware" / "calibrating.toml") << text;
}

DraftProfile::~DraftProfile() {
    std::error_code ec;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
}

std::optional<Calibration> DraftProfile::calibration() const {
    if (dir_.empty()) return std::nullopt;
    lang::SourceManager sources;
    lang::Diagnostics diags;
    std::optional<HardwareProfile> p =
        lang::load_profile(dir_ / "hardware" / "calibrating.toml", sources, diags);
    if (!p) return std::nullopt;
    return p->calibration;
}

std::vector<Oversubscribed> fit_oversubscribed(std::vector<OversubscribedRun>& runs,
                                               const std::string& profile, int32_t cores,
                                               const std::vector<double>& pace,
                                               std::vector<std::string>& skipped) {
    std::vector<Oversubscribed> out;
    const DraftProfile draft(profile);
    if (runs.empty() || draft.dir().empty()) {
        if (!runs.empty()) skipped.push_back("ranks beyond the cores: no temporary folder");
        return out;
    }
    for (OversubscribedRun& run : runs) {
        if (run.passes.empty()) continue;
        lang::FrontendOptions fo;
        fo.search_roots = lang::default_search_roots();
        fo.search_roots.insert(fo.search_roots.begin(), draft.dir());
        lang::CheckResult checked =
            lang::check_text("<calibration probe>",
                             oversubscribed_script(run.width, run.per_core * cores, run.steps,
                                                   "calibrating", run.tp),
                             fo);
        if (!checked.ok()) {
            skipped.push_back("ranks beyond the cores: " + checked.report());
            break;
        }
        Program priced = run.program;
        priced.mesh.device = checked.program->mesh.device;
        priced.mesh.profile = checked.program->mesh.profile;
        Oversubscribed o{run.per_core, run.width, run.tp};
        std::vector<double> steps;
        for (const auto& [pass, step] : run.passes) {
            const double at = at_pace(pace, pass);
            steps.push_back(step / at);
            o.passes.push_back(step);
            o.pace.push_back(at);
        }
        o.measured = median_of(steps);
        if (!run.bubbles.empty()) o.bubble_measured = median_of(run.bubbles);
        if (!run.busy.empty()) o.busy_measured = median_of(run.busy);
        // The step at `o.work` into o.simulated and o.bubble_simulated; whether it was.
        auto simulate = [&] {
            priced.mesh.profile.calibration.oversubscribed = {
                {1.0 * run.per_core, 1.0 * run.width, o.work, run.tp}};
            sim::SimResult r = sim::simulate(run.graph, priced);
            o.simulated = r.ok() ? r.timeline->step_time_s : 0.0;
            o.bubble_simulated = r.ok() ? r.timeline->bubble_fraction : 0.0;
            double on = 0;
            if (r.ok())
                for (const sim::RankReport& rank : r.timeline->ranks)
                    for (const sim::Span& s : rank.spans) on += std::max(s.on_core, 0.0);
            o.busy_simulated = o.simulated > 0 ? on / (cores * o.simulated) : 0.0;
            return o.simulated > 0;
        };
        for (int round = 0; round < 4 && simulate(); ++round)
            o.work = std::clamp(o.work * o.measured / o.simulated, 0.5, 4.0);
        if (simulate()) out.push_back(o);
    }
    return out;
}

// ----- activations beyond the caches --------------------------------------------------------

// A backward reads its microbatch's activations; the more of other microbatches' were touched
// since its forward wrote them, the less of them is still in the caches (the core's own, and
// its share of the last level's), and a forward that takes memory freed long ago writes it
// cold. The probes train each backward right after its forward. Here one GPT of four blocks,
// 256 tokens a microbatch (width 128: 11 MB of activations a microbatch, beyond the core's
// own cache), trains 1F1B over four microbatches and GPipe over two, four and eight, whose
// backwards are one, three and seven microbatches' activations from their forwards: on one
// thread here about 10% slower than 1F1B's at three and at seven. Beside them the same GPT
// trains zb_h1 over four microbatches, each backward split into I and W right after its
// forward: a split backward against a whole one, at no distance.
ReuseRuns reuse_runs(const std::vector<int32_t>& threads, bool quick,
                     std::vector<std::string>& skipped) {
    const std::vector<std::pair<std::string, int>> orders =
        quick ? std::vector<std::pair<std::string, int>>{{"1f1b", 2}, {"gpipe", 2}}
              : std::vector<std::pair<std::string, int>>{
                    {"1f1b", 4}, {"gpipe", 2}, {"gpipe", 4}, {"gpipe", 8}};
    ReuseRuns out{threads, {}, {}};
    // The run of `schedule` over `m` microbatches; what was wrong, or "".
    auto planned = [&](const std::string& schedule, int m, ReuseRun& run) {
        run = {schedule, m, {}, {}, {}, {}};
        GptScript s{quick ? 64 : 128,    quick ? 1 : 4, 4, "cpu", 1, 1, m,
                    (quick ? 1 : 4) * m, quick ? 3 : 6};
        s.schedule = schedule;
        run.passes.resize(threads.size());
        run.inputs.resize(threads.size());
        return plan_script(gpt_script(s), run.program, run.graph);
    };
    for (const auto& [schedule, m] : orders) {
        ReuseRun run;
        if (std::string e = planned(schedule, m, run); !e.empty()) {
            skipped.push_back("activations beyond the caches: " + e);
            return {};
        }
        out.runs.push_back(std::move(run));
    }
    ReuseRun split;
    if (std::string e = planned("zb_h1", orders.front().second, split); e.empty())
        out.split = std::move(split);
    else
        skipped.push_back("backwards split: " + e);
    return out;
}

int reuse_ticks(const ReuseRuns& runs) {
    return static_cast<int>((runs.runs.size() + (runs.split ? 1 : 0)) * runs.threads.size());
}

void time_reuse(ReuseRuns& runs, Progress& progress, Retakes& retakes,
                std::vector<std::string>& skipped) {
    const std::vector<int> cpus = allowed_cpus();
    std::vector<ReuseRun*> these;
    for (ReuseRun& run : runs.runs) these.push_back(&run);
    ReuseRun* split = runs.split ? &*runs.split : nullptr;
    if (split) these.push_back(split);
    for (size_t t = 0; t < runs.threads.size(); ++t) {
        for (ReuseRun* run : these) {
            Probe probe{static_cast<int>(run->program.model.width), 0, 0, run->program, run->graph};
            const int cpu = runs.threads[t] == 1 && cpus.size() > 1
                                ? cpus[run->passes[t].size() % cpus.size()]
                                : -1;
            std::pair<double, double> medians{-1, -1}, tried{-1, -1};
            double input = -1, tried_input = -1;
            OnCpu on(cpu);
            auto once = [&] {
                return time_probe(probe, runs.threads[t], tried,
                                  run == split ? &tried_input : nullptr);
            };
            auto keep = [&] {
                medians = tried;
                input = tried_input;
            };
            if (std::string e = retakes.take(on.held() ? std::vector<int>{cpu} : std::vector<int>{},
                                             once, keep);
                !e.empty()) {
                skipped.push_back("activations beyond the caches: " + e);
                runs.runs.clear();
                runs.split.reset();
                return;
            }
            run->passes[t].push_back(medians);
            run->inputs[t].push_back(input);
            progress.tick("activations beyond the caches");
        }
    }
}

std::vector<ReuseRow> fit_reuse(const ReuseRuns& runs, const Calibration& rates,
                                std::vector<std::string>& notes) {
    std::vector<ReuseRow> out;
    if (runs.runs.size() < 2) return out;
    const sim::Rates measured(rates);
    const ReuseRun& reference = runs.runs.front();
    const ModelSpec& model = reference.program.model;
    notes.push_back(
        "a GPT of " + std::to_string(model.blocks.size()) + " blocks, width " +
        std::to_string(model.width) + ", " +
        std::to_string(reference.program.train.batch / reference.microbatches * model.context) +
        " tokens a microbatch:");
    for (size_t t = 0; t < runs.threads.size(); ++t) {
        const double threads = runs.threads[t];
        struct Order {
            double bytes, backward_distance, forward, backward; // forward, backward: beyond
            std::vector<double> forward_distances;
        };
        std::vector<Order> orders;
        for (size_t i = 1; i < runs.runs.size(); ++i) {
            const ReuseRun& run = runs.runs[i];
            std::vector<double> f, b;
            const size_t n = std::min(run.passes[t].size(), reference.passes[t].size());
            for (size_t p = 0; p < n; ++p) {
                const auto [rf, rb] = reference.passes[t][p];
                const auto [mf, mb] = run.passes[t][p];
                if (rf <= 0 || rb <= 0 || mf <= 0 || mb <= 0) continue;
                f.push_back(mf - rf);
                b.push_back(mb - rb);
            }
            if (b.empty()) continue;
            const plan::PlanRank& rank = run.graph.ranks.front();
            const std::vector<double> distance = sim::reuse_distances(run.graph, rank);
            Order o{static_cast<double>(run.graph.stages.front().activation_bytes),
                    0,
                    median_of(f),
                    median_of(b),
                    {}};
            double sum = 0;
            int count = 0;
            for (size_t a = 0; a < rank.actions.size(); ++a) {
                if (distance[a] < 0) continue;
                if (rank.actions[a].kind == plan::ActionKind::forward)
                    o.forward_distances.push_back(distance[a]);
                else
                    sum += distance[a], ++count;
            }
            o.backward_distance = count > 0 ? sum / count : 0;
            if (o.bytes <= 0 || o.backward_distance <= 0) continue;
            notes.push_back(std::to_string(runs.threads[t]) +
                            (runs.threads[t] == 1 ? " thread, " : " threads, ") + run.schedule +
                            " over " + std::to_string(run.microbatches) + " microbatches: F " +
                            number(1e3 * o.forward) + " ms, B " + number(1e3 * o.backward) +
                            " ms beyond 1F1B's a microbatch of " + number(o.bytes / 1e6) +
                            " MB, its backwards " + number(o.backward_distance / 1e6) +
                            " MB from their forwards");
            orders.push_back(o);
        }
        std::sort(orders.begin(), orders.end(), [](const Order& a, const Order& b) {
            return a.backward_distance < b.backward_distance;
        });
        // A backward reads its stash at most twice (its input's gradient and its weights'), each
        // byte from memory at worst: never more than twice what copying it costs at the largest
        // copy measured on these threads. A difference of two timings is not bounded by itself:
        // beside other load it can be milliseconds on a microbatch of a few hundred kilobytes,
        // which would price a larger model's backwards at seconds.
        const bool copied = std::any_of(rates.elementwise.begin(), rates.elementwise.end(),
                                        [](const StreamRate& r) { return r.op == "copy"; });
        const double copy = copied ? measured.elementwise("copy", 1e18, threads, false) : 0.0;
        const double bound = copy > 0 ? 2.0 / (copy * sizeof(float)) : 0.0; // seconds a byte
        Calibration backwards; // the rows of this count, the backwards' alone
        double most = 0;
        for (const Order& o : orders) {
            most = std::max(most, o.backward / o.bytes);
            if (bound > 0 && most > bound) {
                notes.push_back(std::to_string(runs.threads[t]) +
                                (runs.threads[t] == 1 ? " thread: " : " threads: ") + number(most) +
                                " s a byte at " + number(o.backward_distance / 1e6) +
                                " MB, bounded at twice a copy's: " + number(bound));
                most = bound;
            }
            if (most > 0)
                backwards.reuse.push_back({runs.threads[t], o.backward_distance, 0, most});
        }
        if (backwards.reuse.empty()) continue;
        // forward = phi x backward at each distance: phi by least squares over the orders' mean
        // forward beyond the reference's.
        double num = 0, den = 0;
        for (const Order& o : orders) {
            double priced = 0;
            for (double d : o.forward_distances)
                priced += o.bytes * backwards.reuse_cost(threads, d, true);
            if (o.forward_distances.empty()) continue;
            priced /= static_cast<double>(o.forward_distances.size());
            num += priced * o.forward;
            den += priced * priced;
        }
        // A cold write reads its lines in and writes them back: twice a read's cost at most.
        const double phi = den > 0 ? std::clamp(num / den, 0.0, 2.0) : 0.0;
        for (ReuseRow row : backwards.reuse) {
            row.forward = phi * row.backward;
            out.push_back(row);
        }
    }
    return out;
}

std::vector<SplitRow> fit_split(const ReuseRuns& runs, const Calibration& calibration,
                                std::vector<std::string>& notes) {
    std::vector<SplitRow> out;
    if (runs.runs.empty() || !runs.split) return out;
    const ReuseRun& reference = runs.runs.front();
    const ReuseRun& split = *runs.split;
    const sim::Rates rates(calibration);
    for (size_t t = 0; t < runs.threads.size(); ++t) {
        std::vector<double> input, weight; // each pass's, over the reference's backward
        const size_t n =
            std::min({split.passes[t].size(), split.inputs[t].size(), reference.passes[t].size()});
        for (size_t p = 0; p < n; ++p) {
            const double whole = reference.passes[t][p].second, both = split.passes[t][p].second,
                         i = split.inputs[t][p];
            if (whole <= 0 || i <= 0 || both <= i) continue;
            input.push_back(i / whole);
            weight.push_back((both - i) / whole);
        }
        if (input.empty()) continue;
        // I's share of a whole backward as the simulator prices the stage on these threads.
        const sim::StageSeconds priced =
            sim::stage_seconds(split.program, split.graph.stages.front(), rates, runs.threads[t]);
        const double backward = priced.input + priced.weight;
        if (priced.input <= 0 || priced.weight <= 0) continue;
        const double share = priced.input / backward;
        const SplitRow row{runs.threads[t], median_of(input) / share,
                           median_of(weight) / (1 - share)};
        notes.push_back(std::to_string(row.threads) +
                        (row.threads == 1 ? " thread: I " : " threads: I ") +
                        number(median_of(input)) + " and W " + number(median_of(weight)) +
                        " of the whole backward, whose kernels give I " + number(share) + " of it");
        out.push_back(row);
    }
    return out;
}

// ----- the cores' spread ---------------------------------------------------------------------

// One data-parallel replica a core, each on one thread: their steps' compute (forward and
// backward) side by side.
std::optional<SpreadRun> spread_run(int32_t cores, bool quick, std::vector<std::string>& skipped) {
    SpreadRun run{quick ? 64 : 128, {}, {}, {}};
    if (std::string e = plan_script(
            gpt_script({run.width, 4, 4, "cpu", cores, 1, 2, 8 * cores, quick ? 12 : 26}),
            run.program, run.graph);
        !e.empty()) {
        skipped.push_back("the cores' spread: " + e);
        return std::nullopt;
    }
    return run;
}

void time_spread(std::optional<SpreadRun>& run, Progress& progress, Retakes& retakes,
                 std::vector<std::string>& skipped) {
    if (!run) return;
    runtime::SessionOptions so;
    so.join_launch = false;
    so.threads = 1;
    std::vector<double> tried;
    so.on_step = [&](const runtime::SessionStep& step) {
        if (step.metrics.step <= 2 || step.timings.size() < 2) return true; // warming up
        std::vector<double> busy;
        for (size_t r = 0; r < step.timings.size(); ++r) {
            double b = 0;
            for (const runtime::ActionTiming& a : step.timings[r])
                if (!a.collective && plan::is_compute(run->graph.ranks[r].actions[a.action].kind))
                    b += a.end_s - a.start_s;
            busy.push_back(b);
        }
        tried.push_back(relative_variance(busy));
        return true;
    };
    auto once = [&] {
        tried.clear();
        return train_probe(run->program, run->graph, so);
    };
    run->passes.emplace_back();
    if (std::string e = retakes.take({}, once, [&] { run->passes.back() = tried; }); !e.empty()) {
        skipped.push_back("the cores' spread: " + e);
        run.reset();
        return;
    }
    progress.tick("the cores' spread");
}

double relative_variance(const std::vector<double>& values) {
    const double n = static_cast<double>(values.size());
    double mean = 0, squares = 0;
    for (double v : values) mean += v / n;
    if (values.size() < 2 || !(mean > 0)) return 0.0;
    for (double v : values) squares += (v / mean - 1) * (v / mean - 1);
    return squares / (n - 1);
}

double spread_of(std::vector<double> variances, int32_t ranks) {
    if (variances.empty() || ranks < 2) return 0.0;
    // A sample variance of k = ranks - 1 degrees of freedom is sigma^2 chi^2_k / k. The median
    // of chi^2_k / k: 0.4549 for one (the square of the normal's quartile, 0.6745), ln 2 for
    // two, about (1 - 2 / 9k)^3 beyond (Wilson and Hilferty 1931).
    const double k = ranks - 1.0;
    const double middle = ranks == 2   ? 0.4549364
                          : ranks == 3 ? std::log(2.0)
                                       : std::pow(1.0 - 2.0 / (9.0 * k), 3.0);
    return std::sqrt(median_of(std::move(variances)) / middle);
}

double spread_of(const SpreadRun& run, int32_t ranks, size_t pass) {
    return pass < run.passes.size() ? spread_of(run.passes[pass], ranks) : 0.0;
}

double spread_of(const SpreadRun& run, int32_t ranks) {
    std::vector<double> each;
    for (size_t pass = 0; pass < run.passes.size(); ++pass)
        if (!run.passes[pass].empty()) each.push_back(spread_of(run, ranks, pass));
    return median_of(each);
}

// ----- the profile --------------------------------------------------------------------------

// The L2 of one core, as the C library reports it (0 where it does not).
int64_t core_cache_bytes() {
    const long l2 = ::sysconf(_SC_LEVEL2_CACHE_SIZE);
    return l2 > 0 ? static_cast<int64_t>(l2) : 0;
}

std::string cpu_model() {
    return kernels::cpu_backend().describe().model;
}

std::string utc_now() {
    std::time_t now = std::time(nullptr);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
    return buf;
}

std::string escaped(const std::string& s) {
    std::string out;
    for (char c : s) {
        if (c == '"' || c == '\\') out += '\\';
        if (static_cast<unsigned char>(c) >= 32) out += c;
    }
    return out;
}

// Latency and bandwidth of a transport from its smallest message and its two largest.
LinkSpec link_of(const std::vector<TransferSample>& samples, const std::string& transport) {
    std::vector<const TransferSample*> these;
    for (const TransferSample& s : samples)
        if (s.transport == transport) these.push_back(&s);
    LinkSpec l{1e9, 1e-5};
    if (these.size() < 2) return l;
    const TransferSample &a = *these[these.size() - 2], &b = *these.back();
    l.latency = std::max(1e-9, these.front()->seconds);
    double dt = b.seconds - a.seconds;
    l.bandwidth = dt > 0 ? static_cast<double>(b.bytes - a.bytes) / dt
                         : static_cast<double>(b.bytes) / b.seconds;
    return l;
}

void write_fit(std::ostream& o, const ActionFit& fit, const std::vector<ActionFit>& fewer,
               const std::vector<ActionFit>& by_width, const std::vector<std::string>& skipped) {
    auto scales = [](const ActionFit& f) {
        return "[" + number(f.scale[0]) + ", " + number(f.scale[1]) + ", " + number(f.scale[2]) +
               ", " + number(f.scale[3]) + "]";
    };
    auto overhead = [](const ActionFit& f) {
        return "[" + number(f.overhead[0]) + ", " + number(f.overhead[1]) + "]";
    };
    for (const std::string& line : fit.probes) o << "#   " << line << "\n";
    o << "scales = " << scales(fit) << " # forward: blocks, ends; backward: blocks, ends\n"
      << "block_overhead = " << overhead(fit) << " # seconds per block: forward, backward\n";
    if (!fewer.empty()) {
        o << "# The same for a rank of fewer threads (ranks that outnumber the cores), its probes\n"
          << "# trained with that many:\n";
        for (const ActionFit& f : fewer) {
            for (const std::string& line : f.probes)
                o << "#   " << f.threads << (f.threads == 1 ? " thread, " : " threads, ") << line
                  << "\n";
            if (f.cpu_paces.empty()) continue;
            o << "# each probe run on two cores in each pass, held to each in turn, the pass's\n"
              << "# time their mean; each core's time against the cores' mean (the geometric\n"
              << "# mean of its runs over the kept times):";
            for (size_t k = 0; k < f.cpu_paces.size(); ++k)
                o << (k ? ", " : " ") << "cpu " << f.cpu_paces[k].first << " "
                  << number(f.cpu_paces[k].second);
            o << "\n";
        }
        o << "fewer_threads = [\n";
        for (const ActionFit& f : fewer)
            o << "  { threads = " << f.threads << ", scales = " << scales(f)
              << ", block_overhead = " << overhead(f) << " },\n";
        o << "]\n";
    }
    if (!by_width.empty()) {
        o << "# Each probe's blocks' scale apart from its ends' (one scale for every width:\n"
          << "# each end's share of each probe, timed unit by unit, of its actions over their\n"
          << "# kernels; the last end's, final norm, head and loss, in `scales`, the first\n"
          << "# end's, the embeddings, in `first_end`): what the simulator uses in place of the\n"
          << "# lines above, a stage priced between the nearest two counts of blocks by log\n"
          << "# blocks (beyond them, the nearest), then between the nearest two token counts of a\n"
          << "# microbatch by log tokens, then between the nearest two widths of its matmuls\n"
          << "# (model width / tp) by log width (one row for a pair of probes, its blocks'\n"
          << "# least squares, where the ends' scale could not be told):\n"
          << "by_width = [\n";
        for (const ActionFit& f : by_width)
            o << "  { threads = " << f.threads << ", width = " << f.width
              << ", tokens = " << f.tokens
              << (f.blocks > 0 ? ", blocks = " + std::to_string(f.blocks) : std::string())
              << ", scales = " << scales(f)
              << (f.first_end[0] > 0 && f.first_end[1] > 0
                      ? ", first_end = [" + number(f.first_end[0]) + ", " + number(f.first_end[1]) +
                            "]"
                      : std::string())
              << " },\n";
        o << "]\n";
    }
    for (const std::string& s : skipped) o << "# not measured: " << s << "\n";
}

void write_kernels(std::ostream& o, const std::string& where, const std::vector<MatmulRate>& mm,
                   const std::vector<AttentionRate>& att, const std::vector<StreamRate>& elt) {
    o << "# FLOP/s of out (m, n) = op(A) (m, k) op(B) (k, n): nt a forward, nn an input\n"
      << "# gradient, tn a weight gradient, " << where << ".\n"
      << "matmul = [\n";
    for (const MatmulRate& r : mm)
        o << "  { kernel = \"" << r.kernel << "\", m = " << r.m << ", n = " << r.n
          << ", k = " << r.k << ", threads = " << r.threads << ", flops = " << number(r.flops)
          << (r.warm > 0 ? ", warm = " + number(r.warm) : std::string()) << " },\n";
    o << "]\n"
      << "# FLOP/s of causal attention (4 seq^2 heads head_dim forward, twice that backward).\n"
      << "attention = [\n";
    for (const AttentionRate& r : att)
        o << "  { seq = " << r.seq << ", head_dim = " << r.head_dim << ", threads = " << r.threads
          << ", forward = " << number(r.forward) << ", backward = " << number(r.backward)
          << " },\n";
    o << "]\n"
      << "# Elements per second of each element-wise kernel, forward and whole backward.\n"
      << "elementwise = [\n";
    for (const StreamRate& r : elt)
        o << "  { op = \"" << r.op << "\", elements = " << r.elements << ", threads = " << r.threads
          << ", forward = " << number(r.forward) << ", backward = " << number(r.backward)
          << " },\n";
    o << "]\n";
}

void write_rows(std::ostream& o, const std::string& transfer_note,
                const std::vector<TransferSample>& transfers, const std::string& collective_note,
                const std::vector<CollectiveSample>& collectives) {
    o << "# " << transfer_note << "\n"
      << "transfer = [\n";
    for (const TransferSample& t : transfers)
        o << "  { transport = \"" << t.transport << "\", bytes = " << t.bytes
          << ", seconds = " << number(t.seconds) << " },\n";
    o << "]\n"
      << "# " << collective_note << "\n"
      << "collective = [\n";
    for (const CollectiveSample& c : collectives)
        o << "  { backend = \"" << c.backend << "\", op = \"" << c.op << "\", ranks = " << c.ranks
          << ", bytes = " << c.bytes << ", seconds = " << number(c.seconds) << " },\n";
    o << "]\n";
}

std::string profile_text(
    const std::string& name, const std::string& command, int32_t cores, double took,
    const std::string& host_lines, const ActionFit& fit, const std::vector<ActionFit>& fewer,
    const std::vector<ActionFit>& by_width, const std::vector<MatmulRate>& mm,
    const std::vector<AttentionRate>& att, const std::vector<StreamRate>& elt,
    const std::vector<SharingPoint>& sharing, const std::vector<Oversubscribed>& over,
    const std::vector<ReuseRow>& reuse, const std::vector<std::string>& reuse_notes,
    const std::vector<SplitRow>& split, const std::vector<std::string>& split_notes, double slice,
    double wake, double collective_wait, double core_spread, const std::string& spread_passes,
    int spread_width, const std::vector<TransferSample>& transfers,
    const std::vector<CollectiveSample>& collectives, const std::vector<std::string>& skipped) {
    const std::string date = utc_now();
    double best_one = 0, best_copy = 0;
    for (const MatmulRate& r : mm)
        if (r.threads == 1) best_one = std::max(best_one, r.flops);
    int64_t largest = 0;
    for (const StreamRate& r : elt)
        if (r.op == "copy" && r.elements >= largest) {
            best_copy =
                r.elements > largest ? r.forward * 8.0 : std::max(best_copy, r.forward * 8.0);
            largest = r.elements;
        }
    const int64_t memory = static_cast<int64_t>(::sysconf(_SC_PHYS_PAGES)) *
                           static_cast<int64_t>(::sysconf(_SC_PAGE_SIZE));
    LinkSpec intra = link_of(transfers, "inprocess"), inter = link_of(transfers, "ucx-tcp");
    const int64_t cache = core_cache_bytes();
    std::ostringstream o;
    o << "# " << name << ".toml: this machine as `dist calibrate` measured it.\n"
      << "# Every number below was measured by `" << command << "` on " << date << ",\n"
      << "# on " << cores << " cores of " << cpu_model() << ", from Dist's own kernels\n"
      << "# (kernels/cpu) and transports; rates are the fastest of three timed batches.\n"
      << "name = \"" << escaped(name) << "\"\n"
      << "description = \"" << escaped(cpu_model()) << ", " << cores << " cores, calibrated on "
      << date.substr(0, 10) << "\"\n\n"
      << "[compute]\n"
      << "# One core: the best single-threaded matmul rate measured below (the kernels compute\n"
      << "# in f32 whatever the precision).\n"
      << "peak_flops_f32 = " << number(best_one) << "\n"
      << "peak_flops_bf16 = " << number(best_one) << "\n\n"
      << "[memory]\n"
      << "# The machine's memory, which every rank of a CPU mesh shares; the bandwidth of the\n"
      << "# largest copy measured below, on all cores (bytes read and written).\n"
      << "bytes = " << memory << "\n"
      << "bandwidth = " << number(best_copy) << "\n\n"
      << "[links.intra_host]\n"
      << "# Ranks of one process: the in-process transfers below (latency: the smallest message;\n"
      << "# bandwidth: between the two largest).\n"
      << "bandwidth = " << number(intra.bandwidth) << "\n"
      << "latency = " << number(intra.latency) << "\n\n"
      << "[links.inter_host]\n"
      << "# UCX over TCP on this machine's loopback: what another host's link can at best be.\n"
      << "bandwidth = " << number(inter.bandwidth) << "\n"
      << "latency = " << number(inter.latency) << "\n\n"
      << "[calibration]\n"
      << "command = \"" << escaped(command) << "\"\n"
      << "date = \"" << date << "\"\n"
      << "cores = " << cores << "\n"
      << (cache > 0 ? "# The cache each core keeps to itself (L2), bytes.\ncache_bytes = " +
                          std::to_string(cache) + "\n"
                    : std::string())
      << "seconds = " << number(took) << "\n"
      << host_lines // the host's steal, the probes' pace in each pass, the pipelines apart
      << "# Whole actions of small GPTs trained on one rank with all the cores, beside their\n"
      << "# kernels' prediction from the rates below: an action costs its kernels scaled and a\n"
      << "# fixed time more per block, fitted by least squares:\n";
    write_fit(o, fit, fewer, by_width, skipped);
    write_kernels(o,
                  "on `threads` OpenMP threads;\n# `flops` with each call's weight (tn: its weight "
                  "gradient) from across an arena beyond a\n# core's own caches, as a step meets "
                  "a layer's weights; `warm` with one weight used again (a\n# rank whose weights "
                  "fit in its cores' `cache_bytes`)",
                  mm, att, elt);
    o << "# `threads` single-threaded matmul workers at once, each over `bytes` of operands:\n"
      << "# each one's speed against one alone timed just before, the median of " << sharing_rounds
      << " rounds.\n"
      << "sharing = [\n";
    for (const SharingPoint& s : sharing)
        o << "  { threads = " << s.threads << ", bytes = " << static_cast<int64_t>(s.bytes)
          << ", speed = " << number(s.speed) << " },\n";
    o << "]\n";
    if (!over.empty()) {
        o << "# Single-threaded ranks beyond the cores: their actions' work against alone, by how\n"
          << "# many share each core and the width of their matmuls (pipelines of 2 and 4 ranks a\n"
          << "# core, " << 2 * cores << " and " << 4 * cores
          << " here, and with `tp`, the same ranks in tensor-parallel groups along\n"
          << "# a pipeline, which price meshes that have them; two blocks a stage, 128 tokens a\n"
          << "# microbatch, trained after the passes of the one-thread probes: the median of\n"
          << "# their passes' median steps, each over the probes' pace in its pass, against the\n"
          << "# simulated step; beside it the run's bubble, the median of its passes' median,\n"
          << "# and the simulated one; and the share of the cores' time the ranks' threads ran on\n"
          << "# them, by their CPU clocks, and simulated):\n"
          << "oversubscribed = [\n";
        for (const Oversubscribed& v : over) {
            o << "  { ranks_per_core = " << v.ranks_per_core << ", width = " << v.width
              << (v.tp > 1 ? ", tp = " + std::to_string(v.tp) : std::string())
              << ", work = " << number(v.work) << " }, # step " << number(1e3 * v.measured)
              << " ms measured, " << number(1e3 * v.simulated) << " ms simulated;";
            if (v.bubble_measured >= 0)
                o << " bubble " << number(100 * v.bubble_measured) << "% measured, "
                  << number(100 * v.bubble_simulated) << "% simulated;";
            if (v.busy_measured >= 0)
                o << " cores busy " << number(100 * v.busy_measured) << "% measured, "
                  << number(100 * v.busy_simulated) << "% simulated;";
            o << " passes";
            for (size_t p = 0; p < v.passes.size(); ++p)
                o << (p ? ", " : " ") << number(1e3 * v.passes[p]) << " ms"
                  << (p < v.pace.size() ? " at " + number(v.pace[p]) : "");
            o << "\n";
        }
        o << "]\n";
    }
    if (!reuse.empty()) {
        o << "# Activations beyond the caches: the GPT below trained on one rank (with all the\n"
          << "# cores, and with one thread held to a core) 1F1B, each backward right after its\n"
          << "# forward, and GPipe, its backwards further from their forwards, in turns after\n"
          << "# the one-thread probes; the median over those turns of each GPipe's time beyond\n"
          << "# 1F1B's in the same turn:\n";
        for (const std::string& n : reuse_notes) o << "#   " << n << "\n";
        o << "# per byte of a microbatch's activations at the distance its backwards are from\n"
          << "# their forwards (bytes of other microbatches' touched between), and the forwards'\n"
          << "# the same times one factor fitted over the runs (seconds per byte):\n"
          << "reuse = [\n";
        for (const ReuseRow& r : reuse) {
            o << "  { threads = " << r.threads << ", distance = " << std::llround(r.distance)
              << ", backward = " << number(r.backward);
            if (r.forward > 0) o << ", forward = " << number(r.forward);
            o << " },\n";
        }
        o << "]\n";
    }
    if (!split.empty()) {
        o << "# Backwards split into I and W (zero-bubble schedules): the same GPT trained zb_h1,\n"
          << "# each microbatch's F, I and W in turn, in those turns beside 1F1B; the median over\n"
          << "# the turns of its I and W, each over 1F1B's whole backward in the same turn:\n";
        for (const std::string& n : split_notes) o << "#   " << n << "\n";
        o << "# each over that share, the factor on a split backward's I and W:\n"
          << "split_backward = [\n";
        for (const SplitRow& r : split)
            o << "  { threads = " << r.threads << ", input = " << number(r.input)
              << ", weight = " << number(r.weight) << " },\n";
        o << "]\n";
    }
    if (slice > 0)
        o << "# How long a thread runs before another waiting for its core has a turn (seconds):\n"
          << "# the OS scheduler's time slice, seen by two threads held to one core.\n"
          << "slice = " << number(slice) << "\n";
    if (wake > 0)
        o << "# How long a thread blocked on a message takes to run once it is in (seconds): its\n"
          << "# idle core's wake-up, the mean of 120 after 1-10 ms of work on another thread.\n"
          << "wake = " << number(wake) << "\n";
    if (collective_wait > 0)
        o << "# How much longer each step of a Gloo collective takes when other threads fill the\n"
          << "# cores (seconds): its woken member's wait for a core, and its own work slowed. Two\n"
          << "# members all-gathering and all-reducing 64 KiB, each call after 0.5 ms of work,\n"
          << "# beside " << 2 * cores << " threads that never block, against alone.\n"
          << "collective_wait = " << number(collective_wait) << "\n";
    if (core_spread > 0)
        o << "# How far apart the cores' paces are: the standard deviation of one core's pace\n"
          << "# over a step against the cores' mean. " << cores
          << " data-parallel replicas of a GPT (width " << spread_width << ", four\n"
          << "# blocks), one a core on one thread each, trained after every pass of the\n"
          << "# probes; in each pass the median over the steps of the replicas' compute's\n"
          << "# sample variance (against its mean), at the median of a normal sample variance;\n"
          << "# the median of the passes (" << spread_passes << ").\n"
          << "# Ranks that hold a core each are priced at the expected paces of as many cores,\n"
          << "# the slowest to each in turn: a stage's members wait in their collectives for\n"
          << "# the slowest, a pipeline's stages for each other.\n"
          << "core_spread = " << number(core_spread) << "\n";
    write_rows(o,
               "One-way seconds of a message (half an activation's round trip with its "
               "gradient).",
               transfers,
               "Seconds of one collective over `ranks` threads of this process (Gloo: TCP "
               "loopback).\n# `bytes`: the buffer reduced, the whole gathered or scattered, or "
               "what each member\n# sends to all (all_to_all, an equal share each).",
               collectives);
    return o.str();
}

} // namespace dist::cli::calibration

namespace dist::cli {

using namespace calibration;

namespace {

// The row a run's pace check will pick from the profile (pace_reference) among the forwards
// this plan measures: on the most threads, the squarest up to 512 x 512 x 512.
std::optional<MatmulRate> pace_row_of(const Plan& plan, int32_t cores) {
    Calibration grid;
    grid.cores = cores;
    for (int64_t m : plan.grid)
        for (int64_t n : plan.grid)
            for (int64_t k : plan.grid)
                grid.matmul.push_back({"nt", m, n, k, plan.threads.back(), 1, 1});
    return pace_reference(grid);
}

} // namespace

int run_calibrate(const CalibrateOptions& c, std::ostream& out, std::ostream& err) {
    std::filesystem::path path(c.out);
    if (path.extension() != ".toml") {
        err << "error: --out " << c.out
            << ": a hardware profile is a .toml file (DIR/hardware/NAME.toml, found by "
               "`devices: NAME` when DIR is on DIST_PATH)\n";
        return 2;
    }
    const std::string name = path.stem().string();
    if (!std::regex_match(name, std::regex("[A-Za-z][A-Za-z0-9_-]*"))) {
        err << "error: --out " << c.out << ": the profile's name `" << name
            << "` must be a letter followed by letters, digits, `-` or `_`\n";
        return 2;
    }
    std::error_code ec;
    std::filesystem::path dir = path.parent_path().empty() ? "." : path.parent_path();
    if (!std::filesystem::is_directory(dir, ec)) {
        err << "error: --out " << c.out << ": no folder " << dir.string() << "\n";
        return 1;
    }
    const int gpus = kernels::gpu_count();
    // A GPU where the machine has one, unless the CPU is asked for (or its cores are named).
    if (c.device == "cuda" || (c.device.empty() && gpus > 0 && c.cores == 0)) {
        if (c.cores > 0) {
            err << "error: --cores " << c.cores
                << ": a GPU's calibration has no cores to choose (ranks get a GPU each)\n";
            return 2;
        }
        try {
            return run_calibrate_gpu(c, name, std::max(1, gpus), out, err);
        } catch (const std::exception& e) {
            err << "error: --device cuda: " << e.what() << "\n";
            return 1;
        }
    }
    // A calibration measures these cores: more than the process may run on would time ranks
    // taking turns as if each had one (and 99 of them on two cores ran out of memory).
    const int32_t here = omp_get_num_procs();
    if (c.cores > here) {
        err << "error: --cores " << c.cores << ": this process may run on " << here
            << " cores, and a calibration measures those (give at most " << here << ")\n";
        return 2;
    }
    const int32_t cores = c.cores > 0 ? c.cores : here;
    // Rates measured beside other work are low: say so before spending the minutes. Half a
    // second of the cores' time as other processes use it now (the load average, a mean over
    // the last minute, still counts a build that has just ended).
    {
        const runtime::OtherLoad before;
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
        warn_if_others(before.share(), "over the last half second", err);
    }
    Plan plan = plan_for(cores, c.quick);
    // One tick per measurement, in the order they run.
    const int threads = static_cast<int>(plan.threads.size());
    const int sizes = static_cast<int>(plan.grid.size()),
              messages = static_cast<int>(plan.message.size());
    const int passes = probe_passes(c.quick);
    std::vector<std::string> skipped;
    // Pipelines of more single-threaded ranks than cores (where there are several cores).
    std::vector<OversubscribedRun> beyond;
    if (cores > 1) beyond = oversubscribed_runs(cores, c.quick, skipped);
    // A replica a core, each on one thread: how far apart the cores' paces are.
    std::optional<SpreadRun> spread;
    if (cores > 1) spread = spread_run(cores, c.quick, skipped);
    std::vector<int32_t> counts = {cores};
    if (cores > 1) counts.push_back(1);
    ReuseRuns reuse = reuse_runs(counts, c.quick, skipped);
    // run_probes: every probe in every pass, on all the cores and on one.
    const int probe_runs =
        static_cast<int>(probe_shapes(c.quick).size()) * passes * (cores > 1 ? 2 : 1);
    const int scheduler = 2; // the time slice and the wake-up, a tick each
    const int total = threads * (3 * sizes * sizes * sizes +
                                 static_cast<int>(plan.seqs.size() * plan.head_dims.size()) +
                                 elementwise_kernels * static_cast<int>(plan.elements.size())) +
                      probe_runs + sharing_sets * static_cast<int>(sharing_counts(cores).size()) +
                      oversubscribed_ticks(beyond, side_passes(passes)) + (spread ? passes : 0) +
                      reuse_ticks(reuse) * side_passes(passes) + scheduler + 3 * messages +
                      4 * messages * (cores >= 4 ? 2 : 1) + 1;
    Progress progress(err, total);
    auto t0 = Clock::now();
    Retakes retakes(c.quick ? 10 : 120);
    const runtime::OtherLoad others;
    double others_used = 0; // read once the measuring is done, for the warning and the profile
    // The probes on all the cores (one rank alone) and on one thread (many ranks), taking
    // turns in each pass; where there are several cores every pass is followed by the replicas
    // a core (a second apiece), and every other pass by the pipelines of more ranks than cores
    // and the activations beyond the caches.
    // And the matmul a run times again (pace.hpp), timed as it times it right before and after
    // every pass: set at each pass's pace, its rate at the pace the probes keep.
    const std::optional<MatmulRate> pace_row = pace_row_of(plan, cores);
    std::vector<double> pace_before, pace_after;
    auto time_pace = [&](std::vector<double>& into) {
        if (!pace_row) return;
        std::this_thread::sleep_for(kPaceSettle);
        into.push_back(pace_flops(*pace_row));
    };
    const std::vector<Probe> shapes = probe_shapes(c.quick);
    time_pace(pace_before);
    std::vector<std::vector<Probe>> both = run_probes(
        shapes, passes, c.quick, "cpu", counts, progress, retakes, skipped, [&](int pass) {
            time_pace(pace_after);
            time_spread(spread, progress, retakes, skipped);
            if (after_probe_pass(pass, passes)) {
                time_oversubscribed(beyond, pass, progress, retakes, skipped);
                time_reuse(reuse, progress, retakes, skipped);
            }
            if (pass + 1 < passes) time_pace(pace_before);
        });
    std::vector<Probe> probes = std::move(both[0]);
    std::vector<Probe> probes_one = both.size() > 1 ? std::move(both[1]) : std::vector<Probe>{};
    const std::vector<double> pace_all = pass_pace(probes), pace_one = pass_pace(probes_one);
    // The row on all the cores goes at the pace of the probes on all of them; on one thread, of
    // those on one.
    const double pace_flops_kept =
        pace_row
            ? pace_at_kept(pace_before, pace_after,
                           pace_row->threads == cores || pace_one.empty() ? pace_all : pace_one)
            : 0.0;
    const int pipelines = static_cast<int>( // those timed in two passes
        std::count_if(beyond.begin(), beyond.end(),
                      [](const OversubscribedRun& r) { return r.passes.size() == 2; }));
    const int apart = settle_oversubscribed(beyond, pace_one, passes, progress, retakes, skipped);
    auto mm = measure_matmuls(plan, progress, retakes);
    auto att = measure_attention(plan, progress, retakes);
    auto elt = measure_elementwise(plan, progress, retakes);
    omp_set_num_threads(cores);
    auto sharing = measure_sharing(cores, plan, progress, retakes);
    const double slice = measure_slice(progress);
    const double wake = measure_wake(progress);
    auto transfers = measure_transfers(plan.message, progress, retakes, skipped);
    auto collectives = measure_collectives(cores, plan, progress, retakes, skipped);
    const double collective_wait = measure_collective_wait(cores, progress, skipped);
    Calibration measured;
    measured.cores = cores;
    measured.matmul = mm;
    measured.attention = att;
    measured.elementwise = elt;
    measured.sharing = sharing;
    measured.slice_s = slice;
    measured.wake_s = wake;
    // The probes' kernels priced as the simulator prices a stage: warm where its weights fit.
    measured.cache_bytes = core_cache_bytes();
    ActionFit fit = fit_actions(probes, measured, cores);
    std::vector<ActionFit> fewer;
    if (!probes_one.empty()) fewer.push_back(fit_actions(probes_one, measured, 1));
    std::vector<ActionFit> by_width = fits_by_width(probes, measured, cores);
    for (ActionFit& f : fits_by_width(probes_one, measured, 1)) by_width.push_back(f);
    std::string command = "dist calibrate --out " + c.out + (c.quick ? " --quick" : "") +
                          (c.device == "cpu" ? " --device cpu" : "") +
                          (c.cores > 0 ? " --cores " + std::to_string(c.cores) : "");
    double core_spread = spread ? spread_of(*spread, cores) : 0.0;
    std::string spread_passes = "each pass's:"; // in pass order
    for (size_t pass = 0; spread && pass < spread->passes.size(); ++pass)
        spread_passes += (pass ? ", " : " ") + number(spread_of(*spread, cores, pass));
    if (core_spread >= 0.5) { // what a profile holds: a machine this uneven is not priced so
        skipped.push_back("the cores' spread: " + number(core_spread) +
                          " of a core's pace, beyond the 0.5 a profile holds");
        core_spread = 0;
    }
    std::vector<std::string> reuse_notes, split_notes;
    const std::vector<ReuseRow> reused = fit_reuse(reuse, measured, reuse_notes);
    std::vector<SplitRow> split;
    auto text_with = [&](const std::vector<Oversubscribed>& over) {
        return profile_text(
            name, command, cores, since(t0),
            steal_lines(retakes) + others_lines(others_used) + pace_lines(pace_all, pace_one) +
                (pace_row ? pace_row_lines(*pace_row, pace_flops_kept, pace_before, pace_after)
                          : std::string()) +
                apart_lines(apart, pipelines),
            fit, fewer, by_width, mm, att, elt, sharing, over, reused, reuse_notes, split,
            split_notes, slice, wake, collective_wait, core_spread, spread_passes,
            spread ? spread->width : 0, transfers, collectives, skipped);
    };
    // Split backwards against whole ones as the profile measured so far prices them.
    if (reuse.split) {
        if (std::optional<Calibration> so_far = DraftProfile(text_with({})).calibration())
            split = fit_split(reuse, *so_far, split_notes);
        else
            skipped.push_back("backwards split: the profile measured so far does not load");
    }
    // Ranks beyond the cores, priced by the profile measured so far (one core: none beyond).
    std::vector<Oversubscribed> over;
    if (!probes_one.empty())
        over = fit_oversubscribed(beyond, text_with({}), cores, pace_one, skipped);
    progress.end();
    warn_if_stolen(retakes, err);
    others_used = others.share();
    warn_if_others(others_used, "while this ran", err);
    warn_if_moved(pace_all, pace_one, err);
    warn_if_apart(apart, pipelines, err);
    std::string text = text_with(over);
    std::string e = models::write_file_atomically(c.out, {text});
    if (!e.empty()) {
        err << "error: " << e << "\n";
        return 1;
    }
    char took[32];
    std::snprintf(took, sizeof took, "%.0f", since(t0));
    out << "wrote " << c.out << " (measured in " << took << " s)";
    if (std::filesystem::absolute(dir).filename() == "hardware")
        out << ": `devices: " << name << "` finds it when "
            << std::filesystem::absolute(dir).parent_path().string() << " is on DIST_PATH\n";
    else
        out << "; a script finds it as `devices: " << name
            << "` when it lies in a `hardware` folder under a DIST_PATH folder\n";
    return 0;
}

} // namespace dist::cli
