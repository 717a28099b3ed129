// calibrate_gpu.cpp: `dist calibrate` on a GPU: the device measured, and written as a profile.
//
// The kernels are the ones a rank on this GPU runs (the device's Backend, kernels/cuda), at a
// grid of shapes sized for a GPU; the memory bandwidth is the device's copy; the collectives
// are NCCL's between the GPUs of this host, one thread per GPU, when there are two or more; the
// whole-action probes train small GPTs on the first GPU. A rate is the fastest of three batches
// of calls, each batch waited for on the device. The profile has the schema of
// stdlib/hardware/ with `[host] devices` set, so `devices: NAME` places ranks on GPUs, and a
// `calibration.device = "cuda"` that the simulator prices kernels from (one device per rank).
#include "cli/calibrate_parts.hpp"
#include "cli/commands.hpp"

#include "kernels/devices.hpp"
#include "kernels/tensor.hpp"
#include "models/atomic_file.hpp"
#include "transport/store.hpp"
#ifdef DIST_HAVE_NCCL
#include "transport/nccl.hpp"
#endif

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <future>
#include <limits>
#include <sstream>
#include <thread>

namespace dist::cli {

namespace {

using namespace calibration;
using kernels::Backend;
using kernels::Tensor;

struct GpuPlan {
    std::vector<int64_t> grid, seqs, head_dims, elements, message;
    int64_t heads = 8;
    // The query rows (batch x heads x sequence) an attention call is measured with: a GPU's
    // rate depends on how many rows fill its multiprocessors, and a training microbatch's many
    // heads and sequences fill them (GPT-2 124M at batch 16 and context 256: 49,152 rows),
    // where one sequence of a few heads would leave most of them idle.
    int64_t attention_rows = 1 << 16;
    double min_s = 0.02;
};

GpuPlan gpu_plan(bool quick) {
    GpuPlan p;
    if (quick) {
        p.grid = {64, 256};
        p.seqs = {64, 256};
        p.head_dims = {32};
        p.elements = {1 << 12, 1 << 16};
        p.message = {4096, 1 << 20};
        p.heads = 2;
        p.attention_rows = 1 << 10;
        p.min_s = 0.002;
    } else {
        p.grid = {256, 1024, 4096, 8192};
        p.seqs = {128, 256, 512, 1024, 2048, 4096};
        p.head_dims = {64, 128};
        p.elements = {1 << 16, 1 << 20, 1 << 24, 1 << 27};
        p.message = {4096, 1 << 20, 1 << 24, 1 << 26, 1 << 28};
    }
    return p;
}

// The whole-action probes on a GPU (width, sequences of 64 tokens, blocks, heads of 64): large
// enough that their kernels, not the launches between them, take most of an action (the
// CPU's probes would be launch gaps on a GPU), one block and four of each width to tell a
// block's fixed cost from the kernels' scale.
std::vector<Probe> gpu_probes(bool quick) {
    if (quick) return {{64, 1, 1, {}, {}}};
    std::vector<Probe> out;
    for (auto [width, rows] : {std::pair{512, 64}, std::pair{768, 32}, std::pair{1024, 16}})
        for (int blocks : {1, 4}) {
            Probe pr{width, rows, blocks, {}, {}};
            pr.heads = width / 64;
            out.push_back(pr);
        }
    return out;
}
constexpr int probe_passes = 2;

// Seconds per call on the device: one call to warm up, one alone to size the batches, then the
// fastest of three batches of at least `min_s`, each ended by waiting for the device.
double device_call(Backend& b, const std::function<void()>& call, double min_s) {
    call();
    b.synchronize();
    auto t0 = Clock::now();
    call();
    b.synchronize();
    const double one = std::max(since(t0), 1e-7);
    const int calls = static_cast<int>(std::clamp(min_s / one, 1.0, 10000.0));
    double best = std::numeric_limits<double>::infinity();
    for (int batch = 0; batch < 3; ++batch) {
        t0 = Clock::now();
        for (int i = 0; i < calls; ++i) call();
        b.synchronize();
        best = std::min(best, since(t0) / calls);
    }
    return best;
}

// `n` values on the device, drawn as filled() draws them.
Tensor on_device(Backend& b, int64_t n, float scale = 0.01f) {
    std::vector<float> values = filled(n, scale);
    Tensor host({std::max<int64_t>(n, 1)});
    std::memcpy(host.data<float>(), values.data(), values.size() * sizeof(float));
    return b.here(host);
}

std::vector<MatmulRate> gpu_matmuls(Backend& b, const GpuPlan& plan, Progress& progress) {
    const int64_t big = plan.grid.back();
    Tensor x = on_device(b, big * big), w = on_device(b, big * big), y = b.zeros({big * big});
    float *a = x.data<float>(), *bw = w.data<float>(), *c = y.data<float>();
    std::vector<MatmulRate> out;
    for (const std::string kernel : {"nt", "nn", "tn"})
        for (int64_t m : plan.grid)
            for (int64_t n : plan.grid)
                for (int64_t k : plan.grid) {
                    std::function<void()> call;
                    if (kernel == "nt") // out (m, n) = in (m, k) weight (n, k)^T
                        call = [&, m, n, k] { b.matmul_forward(a, bw, nullptr, m, k, n, c); };
                    else if (kernel == "nn") // dinp (m, n) += dout (m, k) weight (k, n)
                        call = [&, m, n, k] { b.matmul_backward_input(a, bw, m, n, k, c); };
                    else // dweight (m, n) += dout^T (m, k) in (k, n)
                        call = [&, m, n, k] {
                            b.matmul_backward_weight(a, bw, k, n, m, c, nullptr);
                        };
                    const double s = device_call(b, call, plan.min_s);
                    out.push_back({kernel, m, n, k, 1, 2.0 * static_cast<double>(m * n * k) / s});
                    progress.tick("matmuls (" + kernel + ")");
                }
    return out;
}

std::vector<AttentionRate> gpu_attention(Backend& b, const GpuPlan& plan, Progress& progress) {
    std::vector<AttentionRate> out;
    const int64_t H = plan.heads;
    for (int64_t D : plan.head_dims)
        for (int64_t T : plan.seqs) {
            const int64_t B = std::max<int64_t>(1, plan.attention_rows / (H * T));
            const int64_t n = B * T * H * D;
            Tensor q = on_device(b, n), k = on_device(b, n), v = on_device(b, n),
                   dout = on_device(b, n), o = b.zeros({n}), lse = b.zeros({B * T * H}),
                   dq = b.zeros({n}), dk = b.zeros({n}), dv = b.zeros({n});
            auto forward = [&] {
                b.attention_forward(q.data<float>(), k.data<float>(), v.data<float>(), B, T, H, H,
                                    D, o.data<float>(), lse.data<float>());
            };
            const double f = device_call(b, forward, plan.min_s);
            const double bw = device_call(
                b,
                [&] {
                    b.attention_backward(dout.data<float>(), q.data<float>(), k.data<float>(),
                                         v.data<float>(), o.data<float>(), lse.data<float>(), B, T,
                                         H, H, D, dq.data<float>(), dk.data<float>(),
                                         dv.data<float>());
                },
                plan.min_s);
            // The plan's count: 4 B T^2 H D forward (scores and values, no causal halving).
            const double flops = 4.0 * static_cast<double>(B * T * T * H * D);
            out.push_back({T, D, 1, flops / f, 2 * flops / bw});
            progress.tick("attention");
        }
    return out;
}

std::vector<StreamRate> gpu_elementwise(Backend& b, const GpuPlan& plan, Progress& progress) {
    const int64_t most = plan.elements.back();
    const int64_t C = 256, V = 256;
    Tensor x = on_device(b, most * 2), y = b.zeros({most * 2}), z = on_device(b, most * 2),
           w = on_device(b, C * 4, 1.0f), dw = b.zeros({C * 4}), s1 = b.zeros({most}),
           s2 = b.zeros({most}), m = b.zeros({most}), v = b.zeros({most}),
           half({most}, kernels::DType::bf16, b.allocator());
    Tensor host_tokens({most / C + 1}, kernels::DType::i32);
    for (int64_t i = 0; i < host_tokens.numel(); ++i)
        host_tokens.data<int32_t>()[i] = static_cast<int32_t>(i % V);
    Tensor tokens = b.here(host_tokens);
    float *X = x.data<float>(), *Y = y.data<float>(), *Z = z.data<float>(), *W = w.data<float>(),
          *DW = dw.data<float>(), *S1 = s1.data<float>(), *S2 = s2.data<float>();
    const int32_t* tok = tokens.data<int32_t>();
    using Run = std::function<void(int64_t, bool)>;
    const std::vector<std::pair<const char*, Run>> ops = {
        // as many as elementwise_kernels
        {"embedding",
         [&](int64_t n, bool bw) {
             if (bw)
                 b.embedding_backward(tok, X, n / C, C, Y);
             else
                 b.embedding_forward(tok, X, n / C, C, Y);
         }},
        {"layernorm",
         [&](int64_t n, bool bw) {
             if (!bw) return b.layernorm_forward(X, W, W + C, n / C, C, 1e-5, Y, S1, S2);
             b.layernorm_backward_input(Z, X, W, S1, S2, n / C, C, Y);
             b.layernorm_backward_weight(Z, X, S1, S2, n / C, C, DW, DW + C);
         }},
        {"rmsnorm",
         [&](int64_t n, bool bw) {
             if (!bw) return b.rmsnorm_forward(X, W, n / C, C, 1e-5, Y, S1);
             b.rmsnorm_backward_input(Z, X, W, S1, n / C, C, Y);
             b.rmsnorm_backward_weight(Z, X, S1, n / C, C, DW);
         }},
        {"gelu",
         [&](int64_t n, bool bw) {
             if (bw)
                 b.gelu_backward_kept(X, S1, Z, n, Y);
             else
                 b.gelu_forward_keeping(X, n, Y, S1);
         }},
        {"swiglu",
         [&](int64_t n, bool bw) {
             if (bw)
                 b.swiglu_backward(X, Z, n / C, C, Y);
             else
                 b.swiglu_forward(X, n / C, C, Y);
         }},
        {"rope",
         [&](int64_t n, bool bw) {
             const int64_t D = 64, T = 256, H = std::max<int64_t>(1, n / (T * D));
             if (bw)
                 b.rope_backward(X, 1, T, H, D, 10000.0, 0, Y);
             else
                 b.rope_forward(X, 1, T, H, D, 10000.0, 0, Y);
         }},
        {"cross_entropy",
         [&](int64_t n, bool bw) {
             if (bw)
                 b.cross_entropy_backward(X, tok, S1, S2, n / V, V, Y);
             else
                 b.cross_entropy_forward(X, tok, n / V, V, S2, S1);
         }},
        {"copy", [&](int64_t n, bool) { b.copy_block(X, n, Y, n, 1, n); }},
        // bf16 mixed precision, as the CPU's calibration measures it: a tensor rounded in
        // place; one kept in bf16 storage (forward) and widened again (backward).
        {"bf16_round", [&](int64_t n, bool) { b.round_bf16(X, n); }},
        {"bf16_keep",
         [&](int64_t n, bool bw) {
             if (bw)
                 b.from_bf16(half.data<uint16_t>(), n, Y);
             else
                 b.to_bf16(X, n, half.data<uint16_t>());
         }},
        // A fresh gradient buffer, zeroed (the kernels accumulate into it).
        {"zero", [&](int64_t n, bool) { b.zeros({n}); }},
        // A linear layer's bias written into each output row (a pass over the rows, forward
        // and backward alike here).
        {"bias", [&](int64_t n, bool) { b.add_rows(W, n / C, C, Y); }},
        // The gradient norm's pass alone (before its all-reduce and the update).
        {"sum_squares", [&](int64_t n, bool) { (void)b.sum_squares(Z, n); }},
        // The optimizer's pass per parameter: the gradient norm, the clip, the AdamW update
        // and the zeroing of the gradient.
        {"adamw",
         [&](int64_t n, bool) {
             (void)b.sum_squares(Z, n);
             b.scale(Z, n, 1.0);
             b.adamw_step(Z, n, 1e-3, 0.9, 0.95, 1e-8, 0.1, 1, X, m.data<float>(), v.data<float>());
             b.fill(Y, n, 0.0f);
         }},
    };
    std::vector<StreamRate> out;
    for (const auto& [op, run] : ops)
        for (int64_t n : plan.elements) {
            const double f = device_call(
                b, [&] { run(n, false); }, plan.min_s);
            const double bw = device_call(
                b, [&] { run(n, true); }, plan.min_s);
            out.push_back({op, n, 1, static_cast<double>(n) / f, static_cast<double>(n) / bw});
            progress.tick("element-wise kernels");
        }
    return out;
}

// NCCL between this host's GPUs, one thread per GPU: groups of 2, 4 and 8 as far as the GPUs
// go. Empty, with the reason in `skipped`, on one GPU or without NCCL.
std::vector<CollectiveSample> gpu_collectives(int gpus, const GpuPlan& plan, Progress& progress,
                                              std::vector<std::string>& skipped) {
    std::vector<CollectiveSample> out;
    if (gpus < 2) {
        skipped.push_back("collectives: one GPU on this host (NCCL needs two or more)");
        return out;
    }
#ifdef DIST_HAVE_NCCL
    for (int size = 2; size <= gpus && size <= 8; size *= 2) {
        std::vector<std::unique_ptr<transport::Collectives>> members(static_cast<size_t>(size));
        try {
            transport::MemoryStore store;
            std::vector<std::future<std::unique_ptr<transport::Collectives>>> joining;
            for (int i = 0; i < size; ++i)
                joining.push_back(std::async(std::launch::async, [&, i] {
                    return transport::make_nccl_collectives(store,
                                                            "calibrate" + std::to_string(size), i,
                                                            size, i, std::chrono::minutes(2));
                }));
            for (int i = 0; i < size; ++i) members[static_cast<size_t>(i)] = joining[i].get();
        } catch (const std::exception& e) {
            skipped.push_back(std::string("nccl: ") + e.what());
            return out;
        }
        for (const char* op : {"all_reduce", "reduce_scatter", "all_gather"})
            for (int64_t bytes : plan.message) {
                const int64_t n = std::max<int64_t>(size, bytes / 4) / size * size;
                const int64_t chunk = n / size;
                std::vector<Tensor> in, res;
                for (int i = 0; i < size; ++i) {
                    Backend& b = kernels::backend_for({kernels::Device::Kind::cuda, i});
                    in.push_back(on_device(b, n));
                    res.push_back(b.zeros({n}));
                }
                auto calls = [&](int count) {
                    auto t0 = Clock::now();
                    std::vector<std::thread> threads;
                    for (int i = 0; i < size; ++i)
                        threads.emplace_back([&, i] {
                            transport::Collectives& c = *members[static_cast<size_t>(i)];
                            float* data = in[static_cast<size_t>(i)].data<float>();
                            float* got = res[static_cast<size_t>(i)].data<float>();
                            for (int k = 0; k < count; ++k) {
                                if (std::string(op) == "all_reduce")
                                    c.all_reduce(data, n, transport::ReduceOp::sum);
                                else if (std::string(op) == "reduce_scatter")
                                    c.reduce_scatter(data, chunk, got);
                                else
                                    c.all_gather(data, chunk, got);
                            }
                        });
                    for (auto& t : threads) t.join();
                    return since(t0) / count;
                };
                const double guess = calls(3);
                const int count = static_cast<int>(std::clamp(plan.min_s / guess, 3.0, 200.0));
                out.push_back({"nccl", op, size, bytes,
                               std::min({calls(count), calls(count), calls(count)})});
                progress.tick("collectives");
            }
    }
#else
    (void)plan;
    (void)progress;
    skipped.push_back("collectives: this build has no NCCL");
#endif
    return out;
}

} // namespace

int run_calibrate_gpu(const CalibrateOptions& c, const std::string& name, int gpus,
                      std::ostream& out, std::ostream& err) {
    Backend& b = kernels::backend_for({kernels::Device::Kind::cuda, 0});
    const Backend::Description device = b.describe();
    const GpuPlan plan = gpu_plan(c.quick);
    const auto g = static_cast<int>(plan.grid.size());
    int groups = 0;
    for (int size = 2; size <= gpus && size <= 8; size *= 2) ++groups;
    const int total = 3 * g * g * g + static_cast<int>(plan.seqs.size() * plan.head_dims.size()) +
                      elementwise_kernels * static_cast<int>(plan.elements.size()) +
                      static_cast<int>(gpu_probes(c.quick).size()) * probe_passes + 7 +
                      groups * 3 * static_cast<int>(plan.message.size());
    Progress progress(err, total);
    auto t0 = Clock::now();
    std::vector<std::string> skipped;
    Retakes retakes(c.quick ? 10 : 60); // the host's threads launch the GPU's work
    // Any GPU profile places a probe's rank on the first GPU; its figures are not used.
    std::vector<Probe> probes = run_probes(gpu_probes(c.quick), probe_passes, c.quick, "h100", {0},
                                           progress, retakes, skipped)[0];
    auto mm = gpu_matmuls(b, plan, progress);
    auto att = gpu_attention(b, plan, progress);
    auto elt = gpu_elementwise(b, plan, progress);
    auto collectives = gpu_collectives(gpus, plan, progress, skipped);
    // The host's side: UCX over TCP on the loopback stands for the link to another host.
    const int32_t cores = omp_get_num_procs();
    auto transfers =
        measure_transfers({plan.message.front(), plan.message.back()}, progress, retakes, skipped);
    Calibration measured;
    measured.cores = cores;
    measured.device = "cuda";
    measured.matmul = mm;
    measured.attention = att;
    measured.elementwise = elt;
    ActionFit fit = fit_actions(probes, measured, 1);
    progress.end();
    warn_if_stolen(retakes, err);

    double best = 0, copy = 0;
    for (const MatmulRate& r : mm) best = std::max(best, r.flops);
    int64_t largest = 0;
    for (const StreamRate& r : elt)
        if (r.op == "copy" && r.elements >= largest) {
            largest = r.elements;
            copy = r.forward * 8.0; // bytes read and written
        }
    // Between two GPUs of this host: the all-gather's bus bandwidth at its two largest sizes,
    // and its smallest one's time; on one GPU, the host's loopback stands in.
    LinkSpec inter = link_of(transfers, "ucx-tcp"), intra = inter;
    std::string intra_source = "one GPU here: nothing to measure between two, the loopback below";
    std::vector<const CollectiveSample*> gathers;
    for (const CollectiveSample& s : collectives)
        if (s.op == "all_gather" && s.ranks == 2) gathers.push_back(&s);
    if (gathers.size() >= 2) {
        const CollectiveSample &a = *gathers[gathers.size() - 2], &z = *gathers.back();
        intra.latency = gathers.front()->seconds;
        const double dt = z.seconds - a.seconds;
        // Each member receives half of the whole: bytes / 2 over the link.
        intra.bandwidth = dt > 0 ? static_cast<double>(z.bytes - a.bytes) / 2 / dt
                                 : static_cast<double>(z.bytes) / 2 / z.seconds;
        intra_source = "NCCL's all-gather between two GPUs below (half the buffer crosses)";
    }
    const std::string date = utc_now();
    std::string command =
        "dist calibrate --out " + c.out + (c.quick ? " --quick" : "") + " --device cuda";
    std::ostringstream o;
    o << "# " << name << ".toml: this machine's GPU as `dist calibrate` measured it.\n"
      << "# Every number below was measured by `" << command << "` on " << date << ",\n"
      << "# on " << device.model << " (" << gpus << " on this host), from Dist's own kernels\n"
      << "# (the device's backend) and NCCL; rates are the fastest of three timed batches.\n"
      << "# Attention runs over " << plan.attention_rows
      << " query rows (batch x heads x sequence) a call, as a training microbatch fills the GPU.\n"
      << "name = \"" << escaped(name) << "\"\n"
      << "description = \"" << escaped(device.model) << ", calibrated on " << date.substr(0, 10)
      << "\"\n\n"
      << "[compute]\n"
      << "# The best matmul rate measured below (the kernels compute in f32 whatever the\n"
      << "# precision).\n"
      << "peak_flops_f32 = " << number(best) << "\n"
      << "peak_flops_bf16 = " << number(best) << "\n"
      << "# Not measured here: compute beside an NCCL collective, 18.9% slower on average on\n"
      << "# A100s and H100s (Lee et al. 2025, arXiv 2507.03114), as in the datasheet profiles.\n"
      << "overlap_slowdown = 0.19\n\n"
      << "[memory]\n"
      << "# The device's memory; the bandwidth of the largest copy below (read and written).\n"
      << "bytes = " << device.memory_bytes << "\n"
      << "bandwidth = " << number(copy) << "\n\n"
      << "[host]\n"
      << "devices = " << gpus << "\n\n"
      << "[links.intra_host]\n"
      << "# " << intra_source << ".\n"
      << "bandwidth = " << number(intra.bandwidth) << "\n"
      << "latency = " << number(intra.latency) << "\n\n"
      << "[links.inter_host]\n"
      << "# UCX over TCP on this host's loopback: what another host's link can at best be.\n"
      << "bandwidth = " << number(inter.bandwidth) << "\n"
      << "latency = " << number(inter.latency) << "\n\n"
      << "[calibration]\n"
      << "device = \"cuda\"\n"
      << "command = \"" << escaped(command) << "\"\n"
      << "date = \"" << date << "\"\n"
      << "cores = " << cores << "\n"
      << "seconds = " << number(since(t0)) << "\n"
      << steal_lines(retakes)
      << "# Whole actions of small GPTs trained on the first GPU, beside their kernels'\n"
      << "# prediction from the rates below, fitted as for a CPU:\n";
    write_fit(o, fit, {}, {}, skipped);
    write_kernels(o, "on the device", mm, att, elt);
    write_rows(o,
               "One-way seconds of a message between two threads of the host (UCX: its loopback).",
               transfers,
               "Seconds of one NCCL collective over `ranks` GPUs of this host, one thread each.",
               collectives);
    std::string e = models::write_file_atomically(c.out, {o.str()});
    if (!e.empty()) {
        err << "error: " << e << "\n";
        return 1;
    }
    char took[32];
    std::snprintf(took, sizeof took, "%.0f", since(t0));
    out << "wrote " << c.out << " (" << device.model << ", measured in " << took << " s)\n";
    return 0;
}

} // namespace dist::cli
