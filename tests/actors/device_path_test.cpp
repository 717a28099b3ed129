// device_path_test.cpp: the runtime's device paths, run on this machine's CPU.
//
// Two stand-in devices (cuda:6 and cuda:7 to the runtime) keep their memory in arenas of their
// own and compute with the CPU ops, but every op first checks that each pointer it is given
// lies in its own device's arena. A host tensor passed to a device op, or one rank's tensor
// used on another rank's device without the copy, fails the test with the op's name. Ranks on
// alternate devices exercise what a GPU job does: parameters materialised on the host and
// copied, activations moved between devices, groups that share a device reduced through the
// host, consolidated checkpoints read back through the host; and the losses must be the CPU
// runtime's.
#include "actors/plan/lower.hpp"
#include "actors/runtime/executor.hpp"
#include "actors/runtime/job.hpp"
#include "actors/runtime/local_comms.hpp"
#include "kernels/devices.hpp"
#include "models/trainer.hpp"

#include "tests/common/checked_script.hpp"
#include "tests/common/tiny_scripts.hpp"

#include <gtest/gtest.h>

#include <sys/mman.h>

#include <atomic>
#include <cstring>
#include <future>
#include <initializer_list>
#include <mutex>

using namespace dist;

namespace {

// Device memory of stand-in I: a bump allocator over one mapping (the Allocator in front of it
// keeps freed buffers for reuse, so a few steps of a tiny model stay well inside it).
template <int I> struct Arena {
    static constexpr size_t size = size_t(256) << 20;
    static char* base() {
        static char* b = static_cast<char*>(
            ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
        return b;
    }
    static std::atomic<size_t>& used() {
        static std::atomic<size_t> u{0};
        return u;
    }
    static bool holds(const void* p) {
        auto* c = static_cast<const char*>(p);
        return c >= base() && c < base() + size;
    }
    static void* allocate(size_t bytes, int) {
        size_t at = used().fetch_add((bytes + 63) / 64 * 64);
        if (at + bytes > size) throw std::runtime_error("stand-in device memory exhausted");
        return base() + at;
    }
    static void release(void*, int) {}
    static void zero(void* p, size_t bytes, int) { std::memset(p, 0, bytes); }
    static void copy(void* dst, const void* src, size_t bytes, int) {
        EXPECT_TRUE(holds(dst) && holds(src)) << "a copy within the device leaves it";
        std::memcpy(dst, src, bytes);
    }
    static void to_host(void* host, const void* src, size_t bytes, int) {
        EXPECT_TRUE(holds(src) && !holds(host)) << "to_host from outside the device";
        std::memcpy(host, src, bytes);
    }
    static void from_host(void* dst, const void* host, size_t bytes, int) {
        EXPECT_TRUE(holds(dst) && !holds(host)) << "from_host into outside the device";
        std::memcpy(dst, host, bytes);
    }
    // From the other stand-in, without the host (as cudaMemcpyPeer).
    static void from_peer(void* dst, int, const void* src, int, size_t bytes) {
        EXPECT_TRUE(holds(dst) && !holds(src)) << "from_peer into outside the device";
        std::memcpy(dst, src, bytes);
    }
    static kernels::MemoryOps ops() {
        return {allocate, release, zero, copy, to_host, from_host, from_peer};
    }
};

template <int I> class StandIn final : public kernels::Backend {
  public:
    StandIn() : allocator_(kernels::Device{kernels::Device::Kind::cuda, I}, Arena<I>::ops()) {}
    kernels::Device device() const override { return allocator_.device(); }
    kernels::Allocator& allocator() override { return allocator_; }
    int misplaced() const { return misplaced_.load(); }

    void matmul_forward(const float* inp, const float* weight, const float* bias, int64_t N,
                        int64_t C, int64_t OC, float* out) override {
        check("matmul_forward", {inp, weight, bias, out});
        cpu().matmul_forward(inp, weight, bias, N, C, OC, out);
    }
    void matmul_backward_input(const float* dout, const float* weight, int64_t N, int64_t C,
                               int64_t OC, float* dinp) override {
        check("matmul_backward_input", {dout, weight, dinp});
        cpu().matmul_backward_input(dout, weight, N, C, OC, dinp);
    }
    void matmul_backward_weight(const float* dout, const float* inp, int64_t N, int64_t C,
                                int64_t OC, float* dweight, float* dbias) override {
        check("matmul_backward_weight", {dout, inp, dweight, dbias});
        cpu().matmul_backward_weight(dout, inp, N, C, OC, dweight, dbias);
    }
    void layernorm_forward(const float* inp, const float* weight, const float* bias, int64_t N,
                           int64_t C, double eps, float* out, float* mean, float* rstd) override {
        check("layernorm_forward", {inp, weight, bias, out, mean, rstd});
        cpu().layernorm_forward(inp, weight, bias, N, C, eps, out, mean, rstd);
    }
    void layernorm_backward_input(const float* dout, const float* inp, const float* weight,
                                  const float* mean, const float* rstd, int64_t N, int64_t C,
                                  float* dinp) override {
        check("layernorm_backward_input", {dout, inp, weight, mean, rstd, dinp});
        cpu().layernorm_backward_input(dout, inp, weight, mean, rstd, N, C, dinp);
    }
    void layernorm_backward_weight(const float* dout, const float* inp, const float* mean,
                                   const float* rstd, int64_t N, int64_t C, float* dweight,
                                   float* dbias) override {
        check("layernorm_backward_weight", {dout, inp, mean, rstd, dweight, dbias});
        cpu().layernorm_backward_weight(dout, inp, mean, rstd, N, C, dweight, dbias);
    }
    void rmsnorm_forward(const float* inp, const float* weight, int64_t N, int64_t C, double eps,
                         float* out, float* rstd) override {
        check("rmsnorm_forward", {inp, weight, out, rstd});
        cpu().rmsnorm_forward(inp, weight, N, C, eps, out, rstd);
    }
    void rmsnorm_backward_input(const float* dout, const float* inp, const float* weight,
                                const float* rstd, int64_t N, int64_t C, float* dinp) override {
        check("rmsnorm_backward_input", {dout, inp, weight, rstd, dinp});
        cpu().rmsnorm_backward_input(dout, inp, weight, rstd, N, C, dinp);
    }
    void rmsnorm_backward_weight(const float* dout, const float* inp, const float* rstd, int64_t N,
                                 int64_t C, float* dweight) override {
        check("rmsnorm_backward_weight", {dout, inp, rstd, dweight});
        cpu().rmsnorm_backward_weight(dout, inp, rstd, N, C, dweight);
    }
    void gelu_forward(const float* inp, int64_t n, float* out) override {
        check("gelu_forward", {inp, out});
        cpu().gelu_forward(inp, n, out);
    }
    void gelu_forward_keeping(const float* inp, int64_t n, float* out, float* th) override {
        check("gelu_forward_keeping", {inp, out, th});
        cpu().gelu_forward_keeping(inp, n, out, th);
    }
    void gelu_backward_kept(const float* inp, const float* th, const float* dout, int64_t n,
                            float* dinp) override {
        check("gelu_backward_kept", {inp, th, dout, dinp});
        cpu().gelu_backward_kept(inp, th, dout, n, dinp);
    }
    void swiglu_forward(const float* inp, int64_t N, int64_t H, float* out) override {
        check("swiglu_forward", {inp, out});
        cpu().swiglu_forward(inp, N, H, out);
    }
    void swiglu_backward(const float* inp, const float* dout, int64_t N, int64_t H,
                         float* dinp) override {
        check("swiglu_backward", {inp, dout, dinp});
        cpu().swiglu_backward(inp, dout, N, H, dinp);
    }
    void rope_forward(const float* inp, int64_t B, int64_t T, int64_t H, int64_t D, double theta,
                      int64_t pos0, float* out) override {
        check("rope_forward", {inp, out});
        cpu().rope_forward(inp, B, T, H, D, theta, pos0, out);
    }
    void rope_backward(const float* dout, int64_t B, int64_t T, int64_t H, int64_t D, double theta,
                       int64_t pos0, float* dinp) override {
        check("rope_backward", {dout, dinp});
        cpu().rope_backward(dout, B, T, H, D, theta, pos0, dinp);
    }
    void embedding_forward(const int32_t* tokens, const float* table, int64_t N, int64_t C,
                           float* out) override {
        check("embedding_forward", {tokens, table, out});
        cpu().embedding_forward(tokens, table, N, C, out);
    }
    void embedding_backward(const int32_t* tokens, const float* dout, int64_t N, int64_t C,
                            float* dtable) override {
        check("embedding_backward", {tokens, dout, dtable});
        cpu().embedding_backward(tokens, dout, N, C, dtable);
    }
    void positions_forward(const float* wpe, int64_t B, int64_t T, int64_t C, float* out) override {
        check("positions_forward", {wpe, out});
        cpu().positions_forward(wpe, B, T, C, out);
    }
    void positions_backward(const float* dout, int64_t B, int64_t T, int64_t C,
                            float* dwpe) override {
        check("positions_backward", {dout, dwpe});
        cpu().positions_backward(dout, B, T, C, dwpe);
    }
    void attention_forward(const float* q, const float* k, const float* v, int64_t B, int64_t T,
                           int64_t H, int64_t KV, int64_t D, float* out, float* lse) override {
        check("attention_forward", {q, k, v, out, lse});
        cpu().attention_forward(q, k, v, B, T, H, KV, D, out, lse);
    }
    void attention_backward(const float* dout, const float* q, const float* k, const float* v,
                            const float* out, const float* lse, int64_t B, int64_t T, int64_t H,
                            int64_t KV, int64_t D, float* dq, float* dk, float* dv) override {
        check("attention_backward", {dout, q, k, v, out, lse, dq, dk, dv});
        cpu().attention_backward(dout, q, k, v, out, lse, B, T, H, KV, D, dq, dk, dv);
    }
    void cross_entropy_forward(const float* logits, const int32_t* targets, int64_t N, int64_t V,
                               float* losses, float* lse) override {
        check("cross_entropy_forward", {logits, targets, losses, lse});
        cpu().cross_entropy_forward(logits, targets, N, V, losses, lse);
    }
    void cross_entropy_backward(const float* logits, const int32_t* targets, const float* lse,
                                const float* dlosses, int64_t N, int64_t V,
                                float* dlogits) override {
        check("cross_entropy_backward", {logits, targets, lse, dlosses, dlogits});
        cpu().cross_entropy_backward(logits, targets, lse, dlosses, N, V, dlogits);
    }
    void adamw_step(const float* grads, int64_t n, double lr, double beta1, double beta2,
                    double eps, double weight_decay, int64_t step, float* params, float* m,
                    float* v) override {
        check("adamw_step", {grads, params, m, v});
        cpu().adamw_step(grads, n, lr, beta1, beta2, eps, weight_decay, step, params, m, v);
    }
    double sum_squares(const float* x, int64_t n) override {
        check("sum_squares", {x});
        return cpu().sum_squares(x, n);
    }
    double sum(const float* x, int64_t n) override {
        check("sum", {x});
        return cpu().sum(x, n);
    }
    void scale(float* x, int64_t n, double s) override {
        check("scale", {x});
        cpu().scale(x, n, s);
    }
    void add(const float* a, const float* b, int64_t n, float* out) override {
        check("add", {a, b, out});
        cpu().add(a, b, n, out);
    }
    void fill(float* x, int64_t n, float value) override {
        check("fill", {x});
        cpu().fill(x, n, value);
    }
    void round_bf16(float* x, int64_t n) override {
        check("round_bf16", {x});
        cpu().round_bf16(x, n);
    }
    void to_bf16(const float* x, int64_t n, uint16_t* out) override {
        check("to_bf16", {x, out});
        cpu().to_bf16(x, n, out);
    }
    void from_bf16(const uint16_t* x, int64_t n, float* out) override {
        check("from_bf16", {x, out});
        cpu().from_bf16(x, n, out);
    }
    void add_rows(const float* bias, int64_t N, int64_t C, float* out) override {
        check("add_rows", {bias, out});
        cpu().add_rows(bias, N, C, out);
    }
    void copy_block(const float* src, int64_t src_stride, float* dst, int64_t dst_stride,
                    int64_t rows, int64_t width) override {
        check("copy_block", {src, dst});
        cpu().copy_block(src, src_stride, dst, dst_stride, rows, width);
    }
    void gelu_erf_forward(const float* inp, int64_t n, float* out) override {
        check("gelu_erf_forward", {inp, out});
        cpu().gelu_erf_forward(inp, n, out);
    }
    void gelu_erf_backward(const float* inp, const float* dout, int64_t n, float* dinp) override {
        check("gelu_erf_backward", {inp, dout, dinp});
        cpu().gelu_erf_backward(inp, dout, n, dinp);
    }
    void relu_forward(const float* inp, int64_t n, float* out) override {
        check("relu_forward", {inp, out});
        cpu().relu_forward(inp, n, out);
    }
    void relu_backward(const float* inp, const float* dout, int64_t n, float* dinp) override {
        check("relu_backward", {inp, dout, dinp});
        cpu().relu_backward(inp, dout, n, dinp);
    }
    void embedding_forward_part(const int32_t* tokens, const float* table, int64_t N, int64_t C,
                                int64_t begin, int64_t rows, float* out) override {
        check("embedding_forward_part", {tokens, table, out});
        cpu().embedding_forward_part(tokens, table, N, C, begin, rows, out);
    }
    void embedding_backward_part(const int32_t* tokens, const float* dout, int64_t N, int64_t C,
                                 int64_t begin, int64_t rows, float* dtable) override {
        check("embedding_backward_part", {tokens, dout, dtable});
        cpu().embedding_backward_part(tokens, dout, N, C, begin, rows, dtable);
    }
    void row_max(const float* logits, int64_t N, int64_t V, float* out) override {
        check("row_max", {logits, out});
        cpu().row_max(logits, N, V, out);
    }
    void cross_entropy_part_sums(const float* logits, const int32_t* targets, const float* row_max,
                                 int64_t N, int64_t V, int64_t begin, float* sums) override {
        check("cross_entropy_part_sums", {logits, targets, row_max, sums});
        cpu().cross_entropy_part_sums(logits, targets, row_max, N, V, begin, sums);
    }
    void cross_entropy_part_finish(const float* row_max, const float* sums, int64_t N, float* lse,
                                   float* losses) override {
        check("cross_entropy_part_finish", {row_max, sums, lse, losses});
        cpu().cross_entropy_part_finish(row_max, sums, N, lse, losses);
    }
    void cross_entropy_part_backward(const float* logits, const int32_t* targets, const float* lse,
                                     const float* dlosses, int64_t N, int64_t V, int64_t begin,
                                     float* dlogits) override {
        check("cross_entropy_part_backward", {logits, targets, lse, dlosses, dlogits});
        cpu().cross_entropy_part_backward(logits, targets, lse, dlosses, N, V, begin, dlogits);
    }

  private:
    static kernels::Backend& cpu() { return kernels::cpu_backend(); }
    void check(const char* op, std::initializer_list<const void*> pointers) {
        for (const void* p : pointers)
            if (p && !Arena<I>::holds(p)) {
                ++misplaced_;
                ADD_FAILURE() << op << " on cuda:" << I << " was given memory outside the device";
            }
    }
    kernels::Allocator allocator_;
    std::atomic<int> misplaced_{0};
};

// The stand-ins, registered as the devices' backends while a test runs.
struct StandIns {
    StandIn<6> six;
    StandIn<7> seven;
    StandIns() {
        kernels::set_backend_for(six.device(), &six);
        kernels::set_backend_for(seven.device(), &seven);
    }
    ~StandIns() {
        kernels::set_backend_for(six.device(), nullptr);
        kernels::set_backend_for(seven.device(), nullptr);
    }
    kernels::Backend& of(int32_t rank) {
        return rank % 2 == 0 ? static_cast<kernels::Backend&>(six) : seven;
    }
};

struct Losses {
    std::vector<double> loss, norm;
};

// Two steps of every rank of `graph` on plain threads, each rank on `device_of(rank)` (null:
// the CPU); the weights gathered from the ranks into `whole`. With `processes` > 1 the ranks
// are laid out as the processes of a job would hold them (one LocalComms per process, meeting
// in one store): UCX between the processes, Gloo for their groups.
Losses run(const Program& p, const plan::Graph& graph, const models::TokenData& data,
           const std::function<kernels::Backend*(int32_t)>& device_of, models::Model& whole,
           int32_t processes = 1) {
    std::vector<kernels::Device> devices;
    for (const auto& r : graph.ranks)
        devices.push_back(device_of(r.rank) ? device_of(r.rank)->device() : kernels::Device::cpu());
    std::vector<std::unique_ptr<runtime::LocalComms>> comms;
    transport::MemoryStore store;
    const auto ranks_count = static_cast<int32_t>(graph.ranks.size());
    std::vector<int32_t> process_of = runtime::process_of_ranks(ranks_count, processes);
    if (processes == 1) {
        comms.push_back(std::make_unique<runtime::LocalComms>(
            graph, runtime::CollectivesBackend::inprocess, std::chrono::seconds(60), devices));
    } else {
        // The processes' groups and endpoints form together, as separate processes would.
        std::vector<std::future<std::unique_ptr<runtime::LocalComms>>> forming;
        for (int32_t proc = 0; proc < processes; ++proc)
            forming.push_back(std::async(std::launch::async, [&, proc] {
                runtime::CommsLayout layout;
                layout.process_of = process_of;
                layout.process = proc;
                layout.store = &store;
                layout.devices = devices;
                return std::make_unique<runtime::LocalComms>(graph, layout,
                                                             std::chrono::seconds(60));
            }));
        for (auto& f : forming) comms.push_back(f.get());
    }
    std::vector<std::unique_ptr<runtime::RankExecutor>> ranks;
    for (const auto& r : graph.ranks) {
        auto& mine =
            *comms[processes == 1 ? 0
                                  : static_cast<size_t>(process_of[static_cast<size_t>(r.rank)])];
        ranks.push_back(std::make_unique<runtime::RankExecutor>(
            p, graph, r.rank, mine.for_rank(r.rank), device_of(r.rank)));
    }
    Losses out;
    for (int64_t step = 0; step < 2; ++step) {
        std::vector<std::future<runtime::RankStepResult>> running;
        for (auto& ex : ranks)
            running.push_back(std::async(std::launch::async,
                                         [&, e = ex.get()] { return e->run_step(step, data); }));
        double loss = 0, norm = 0;
        int64_t n = 0;
        for (auto& f : running) {
            runtime::RankStepResult r = f.get();
            loss += r.loss_sum;
            n += r.loss_microbatches;
            norm = r.grad_norm;
        }
        out.loss.push_back(loss / static_cast<double>(n));
        out.norm.push_back(norm);
    }
    for (auto& ex : ranks)
        for (auto& [index, stage] : ex->stages())
            models::copy_to_whole(stage->params(), whole.params(), stage->tied_copies());
    return out;
}

struct DeviceCase {
    std::string name;
    bool llama;
    std::vector<std::string> mesh;
    int32_t processes = 1;
};

void PrintTo(const DeviceCase& c, std::ostream* os) {
    *os << c.name;
}

class DevicePath : public ::testing::TestWithParam<DeviceCase> {};

TEST_P(DevicePath, RanksOnStandInDevicesTrainAsOnTheCpu) {
    const DeviceCase& c = GetParam();
    const std::string text = c.llama ? tests::tiny_llama_script(2) : tests::tiny_gpt_script(2);
    Program p = tests::checked_script(text, c.mesh);
    plan::PlanResult planned = plan::lower(p);
    ASSERT_TRUE(planned.ok()) << plan::render_errors("t.dist", planned.errors);
    models::TokenData data;
    ASSERT_EQ(models::load_data(p.train.data, p.model, data), "");

    models::Model on_cpu(p.model, 0), on_devices(p.model, 0);
    Losses cpu = run(
        p, *planned.graph, data, [](int32_t) { return nullptr; }, on_cpu);
    StandIns devices;
    Losses dev = run(
        p, *planned.graph, data, [&](int32_t r) { return &devices.of(r); }, on_devices,
        c.processes);
    EXPECT_EQ(devices.six.misplaced() + devices.seven.misplaced(), 0);
    for (size_t i = 0; i < cpu.loss.size(); ++i) {
        EXPECT_NEAR(dev.loss[i], cpu.loss[i], 1e-6 * cpu.loss[i]) << "step " << i + 1;
        EXPECT_NEAR(dev.norm[i], cpu.norm[i], 1e-5 * cpu.norm[i]) << "step " << i + 1;
    }
    for (const auto& w : on_cpu.params().all()) {
        const models::Parameter* d = on_devices.params().find(w.name);
        for (int64_t i = 0; i < w.value.numel(); ++i)
            ASSERT_NEAR(d->value.data<float>()[i], w.value.data<float>()[i], 1e-5) << w.name;
    }
}

using tests::mesh_overrides;

// A mesh with ZeRO stage `zero`.
std::vector<std::string> with_zero(std::vector<std::string> mesh, int zero) {
    mesh.push_back("mesh.zero=" + std::to_string(zero));
    return mesh;
}

INSTANTIATE_TEST_SUITE_P(
    Meshes, DevicePath,
    ::testing::Values(
        DeviceCase{"dp2_tp2_pp2", false, mesh_overrides(2, 2, 2, "1f1b", 2)},
        DeviceCase{"tp2", false, mesh_overrides(1, 2, 1, "1f1b", 1)},
        DeviceCase{"pp2_zbv", false, mesh_overrides(1, 1, 2, "zbv", 4, 2)},
        DeviceCase{"llama_dp2_tp2", true, mesh_overrides(2, 2, 1, "1f1b", 2)},
        // ZeRO's shards on the devices: the gradient norm's partial sums reduce
        // over the data-parallel group, which reduces device memory.
        DeviceCase{"dp2_zero1", false, with_zero(mesh_overrides(2, 1, 1, "1f1b", 2), 1)},
        DeviceCase{"dp2_zero2", false, with_zero(mesh_overrides(2, 1, 1, "1f1b", 2), 2)},
        DeviceCase{"dp2_pp2_zero3", false, with_zero(mesh_overrides(2, 1, 2, "1f1b", 2), 3)},
        // As the processes of a job: the two pipeline ranks in two processes
        // (activations over UCX, the tied embedding's group over Gloo), and the
        // data-parallel groups of a dp 2 x pp 2 mesh across two processes.
        DeviceCase{"two_processes_pp2", false, mesh_overrides(1, 1, 2, "1f1b", 4), 2},
        DeviceCase{"two_processes_dp2_pp2", false, mesh_overrides(2, 1, 2, "1f1b", 2), 2}),
    [](const ::testing::TestParamInfo<DeviceCase>& i) { return i.param.name; });

} // namespace
