// gpu_runtime_test.cpp: the runtime on GPUs. Where ranks go (place_ranks), the clear error of a
// GPU mesh on a machine without one, and, where a GPU is visible, the equivalence test of
// runtime_test.cpp on a mesh of h200 devices: every rank on a GPU (ranks share GPUs when there
// are fewer GPUs than ranks, their groups then reduce through the host; with a GPU per rank,
// through NCCL), the per-step losses and gradient norms of the CPU's single-device run within
// float tolerance of a different reduction order, and the gathered weights likewise.
#include "actors/plan/lower.hpp"
#include "actors/runtime/job.hpp"
#include "actors/runtime/local_comms.hpp"
#include "kernels/devices.hpp"
#include "models/trainer.hpp"

#include "tests/common/checked_script.hpp"
#include "tests/common/job_curve.hpp"
#include "tests/common/tiny_scripts.hpp"

#include <gtest/gtest.h>

#include <cmath>

using namespace dist;

namespace {

std::vector<std::string> mesh(const std::string& devices, int dp, int tp, int pp,
                              const std::string& kind, int m) {
    std::vector<std::string> o = tests::mesh_overrides(dp, tp, pp, kind, m);
    o.push_back("mesh.devices=" + devices);
    return o;
}

TEST(Devices, ACpuMeshPutsEveryRankOnTheCpu) {
    Program p = tests::checked_script(tests::tiny_gpt_script(2), mesh("cpu", 2, 1, 2, "1f1b", 2));
    plan::PlanResult planned = plan::lower(p);
    ASSERT_TRUE(planned.ok());
    auto devices = runtime::place_ranks(p, *planned.graph, {0, 0, 1, 1}, 1, 1);
    ASSERT_EQ(devices.size(), 4u);
    for (const auto& d : devices) EXPECT_EQ(d, kernels::Device::cpu());
}

TEST(Devices, GpuRanksTakeTheHostsGpusInTurn) {
    Program p = tests::checked_script(tests::tiny_gpt_script(2), mesh("h200", 2, 1, 2, "1f1b", 2));
    plan::PlanResult planned = plan::lower(p);
    ASSERT_TRUE(planned.ok());
    const int gpus = kernels::gpu_count();
    if (gpus == 0) {
        // A GPU mesh here is refused before anything is built, with what to do instead.
        try {
            runtime::place_ranks(p, *planned.graph, {0, 0, 0, 0}, 0, 0);
            FAIL() << "a GPU mesh was placed on a machine without GPUs";
        } catch (const std::runtime_error& e) {
            std::string what = e.what();
            EXPECT_NE(what.find("4 h200-sxm device(s)"), std::string::npos) << what;
            EXPECT_NE(what.find("a mesh of `cpu` devices"), std::string::npos) << what;
        }
        return;
    }
    // Process 1 of two on this host holds ranks 2 and 3: after process 0's two GPUs.
    auto devices = runtime::place_ranks(p, *planned.graph, {0, 0, 1, 1}, 1, 1);
    EXPECT_EQ(devices[0], kernels::Device::cpu()); // another process's rank: not placed here
    EXPECT_EQ(devices[2], (kernels::Device{kernels::Device::Kind::cuda, 2 % gpus}));
    EXPECT_EQ(devices[3], (kernels::Device{kernels::Device::Kind::cuda, 3 % gpus}));
    // Processes of different sizes: process 1 after process 0's three ranks.
    devices = runtime::place_ranks(p, *planned.graph, {0, 0, 0, 1}, 1, 1);
    EXPECT_EQ(devices[3], (kernels::Device{kernels::Device::Kind::cuda, 3 % gpus}));
    // The first process of another host starts from GPU 0.
    devices = runtime::place_ranks(p, *planned.graph, {0, 0, 1, 1}, 1, 0);
    EXPECT_EQ(devices[2], (kernels::Device{kernels::Device::Kind::cuda, 0}));
    EXPECT_EQ(devices[3], (kernels::Device{kernels::Device::Kind::cuda, 1 % gpus}));
}

TEST(Devices, NcclServesAGroupWhoseMembersEachHaveAGpuOfTheirOwn) {
    using runtime::GpuIdentity;
    using runtime::nccl_can_serve;
    // Ranks 0-3 on four GPUs of two hosts; rank 4 on the CPU.
    std::vector<GpuIdentity> ids = {{"a/0000:01:00.0", true},
                                    {"a/0000:02:00.0", true},
                                    {"b/0000:01:00.0", true},
                                    {"b/0000:02:00.0", true},
                                    {"", false}};
    EXPECT_TRUE(nccl_can_serve(ids, {0, 1}));
    EXPECT_TRUE(nccl_can_serve(ids, {0, 2})); // the same bus id on another host: another GPU
    EXPECT_TRUE(nccl_can_serve(ids, {0, 1, 2, 3}));
    EXPECT_FALSE(nccl_can_serve(ids, {0, 4})); // a member not on a GPU
    EXPECT_FALSE(nccl_can_serve(ids, {0, 9})); // a rank the job does not have

    // A process that cannot use NCCL on its GPU (a build without it, a stand-in device): every
    // process sees its flag, so none forms a communicator it would wait in alone.
    ids[1].nccl = false;
    EXPECT_FALSE(nccl_can_serve(ids, {0, 1}));
    EXPECT_TRUE(nccl_can_serve(ids, {0, 2}));
    ids[1].nccl = true;

    // Rank 4 on rank 0's GPU: NCCL refuses a group with both; and a group of rank 0 alone with
    // others would put two communicators of this job on that GPU at once (rank 4's groups).
    ids[4] = ids[0];
    EXPECT_FALSE(nccl_can_serve(ids, {0, 4}));
    EXPECT_FALSE(nccl_can_serve(ids, {0, 1}));
    EXPECT_TRUE(nccl_can_serve(ids, {1, 2, 3}));
}

struct GpuCase {
    std::string name;
    bool llama;
    int dp, tp, pp;
    std::string kind;
    int microbatches;
    int zero = 0; // the ZeRO stage over the data-parallel ranks
};

void PrintTo(const GpuCase& c, std::ostream* os) {
    *os << c.name;
}

// A script trained on one CPU device: the reference of the GPU runs.
struct CpuRun {
    Program program;
    models::Model model;
    std::vector<double> losses, norms;

    CpuRun(Program p, models::TokenData& data)
        : program(std::move(p)), model(program.model, static_cast<uint64_t>(program.train.seed),
                                       Recompute::none, nullptr, program.train.precision) {
        EXPECT_EQ(models::load_data(program.train.data, program.model, data), "");
        EXPECT_EQ(models::train(program, model, data, 0,
                                [&](const models::StepMetrics& m) {
                                    losses.push_back(m.loss);
                                    norms.push_back(m.grad_norm);
                                    return true;
                                }),
                  "");
    }
};

class GpuEquivalence : public ::testing::TestWithParam<GpuCase> {};

TEST_P(GpuEquivalence, LossesNormsAndWeightsMatchTheCpu) {
    if (kernels::gpu_count() == 0) GTEST_SKIP() << "no CUDA device visible";
    const GpuCase& c = GetParam();
    const std::string text = c.llama ? tests::tiny_llama_script(3) : tests::tiny_gpt_script(3);

    // The reference: one CPU device.
    models::TokenData data;
    CpuRun cpu(tests::checked_script(text, {}), data);
    const std::vector<double>&ref_losses = cpu.losses, &ref_norms = cpu.norms;
    const models::Model& ref = cpu.model;

    std::vector<std::string> overrides = mesh("h200", c.dp, c.tp, c.pp, c.kind, c.microbatches);
    overrides.push_back("mesh.zero=" + std::to_string(c.zero));
    Program p = tests::checked_script(text, overrides);
    plan::PlanResult planned = plan::lower(p);
    ASSERT_TRUE(planned.ok()) << plan::render_errors("t.dist", planned.errors);
    runtime::Job job(p, *planned.graph, data);
    for (const auto& d : job.devices()) EXPECT_EQ(d.kind, kernels::Device::Kind::cuda);
    const int ranks = c.dp * c.tp * c.pp;
    // With a GPU per rank every device group has NCCL (where built); with one GPU for all, none
    // has. In between, groups whose members have GPUs of their own have it, the others not.
    if (c.dp * c.tp > 1 && kernels::gpu_count() >= ranks) {
        EXPECT_EQ(job.device_collectives(), runtime::built_with_nccl() ? "nccl" : "staged");
    }
    if (c.dp * c.tp > 1 && kernels::gpu_count() == 1) {
        EXPECT_EQ(job.device_collectives(), "staged");
    }
    auto [losses, norms, error, experts] =
        tests::run_job(job, p.train.steps, std::chrono::seconds(60));
    ASSERT_EQ(error, "");
    ASSERT_EQ(losses.size(), ref_losses.size());
    for (size_t i = 0; i < losses.size(); ++i) {
        EXPECT_NEAR(losses[i], ref_losses[i], 1e-4 * std::abs(ref_losses[i])) << "step " << i + 1;
        EXPECT_NEAR(norms[i], ref_norms[i], 1e-3 * ref_norms[i]) << "step " << i + 1;
    }
    models::Model whole(p.model, 0); // other initial values: every element must be overwritten
    job.gather(whole);
    for (const auto& w : ref.params().all()) {
        const models::Parameter* g = whole.params().find(w.name);
        ASSERT_NE(g, nullptr) << w.name;
        for (int64_t i = 0; i < w.value.numel(); ++i)
            ASSERT_NEAR(g->value.data<float>()[i], w.value.data<float>()[i], 1e-3) << w.name;
    }
}

INSTANTIATE_TEST_SUITE_P(Meshes, GpuEquivalence,
                         ::testing::Values(GpuCase{"one", false, 1, 1, 1, "1f1b", 1},
                                           GpuCase{"dp2", false, 2, 1, 1, "1f1b", 2},
                                           GpuCase{"tp2", false, 1, 2, 1, "1f1b", 1},
                                           GpuCase{"pp2_1f1b", false, 1, 1, 2, "1f1b", 4},
                                           GpuCase{"pp2_zb_h1", false, 1, 1, 2, "zb_h1", 4},
                                           GpuCase{"dp2_tp2_pp2", false, 2, 2, 2, "1f1b", 2},
                                           // ZeRO 2's reduce-scatter unit by unit and ZeRO
                                           // 3's gathers, on device memory.
                                           GpuCase{"dp2_zero2", false, 2, 1, 1, "1f1b", 2, 2},
                                           GpuCase{"dp2_pp2_zero3", false, 2, 1, 2, "1f1b", 2, 3},
                                           GpuCase{"llama_tp2_pp2", true, 1, 2, 2, "1f1b", 2}),
                         [](const ::testing::TestParamInfo<GpuCase>& i) { return i.param.name; });

} // namespace

// bf16 on a GPU rounds where the CPU's bf16 rounds: the losses follow the CPU's bf16 run within
// what a different float summation order can move a bf16 rounding, and stay apart from f32's.
TEST(GpuBf16, TrainsAsTheCpusBf16Does) {
    if (kernels::gpu_count() == 0) GTEST_SKIP() << "no CUDA device visible";
    const std::string text = tests::tiny_gpt_script(3);
    models::TokenData data;
    CpuRun cpu(tests::checked_script(text, {"train.precision=bf16"}), data);
    std::vector<std::string> o = mesh("h200", 1, 1, 1, "1f1b", 1);
    o.push_back("train.precision=bf16");
    Program p = tests::checked_script(text, o);
    plan::PlanResult planned = plan::lower(p);
    ASSERT_TRUE(planned.ok()) << plan::render_errors("t.dist", planned.errors);
    runtime::Job job(p, *planned.graph, data);
    auto [losses, norms, error, experts] =
        tests::run_job(job, p.train.steps, std::chrono::seconds(60));
    ASSERT_EQ(error, "");
    ASSERT_EQ(losses.size(), cpu.losses.size());
    for (size_t i = 0; i < losses.size(); ++i)
        EXPECT_NEAR(losses[i], cpu.losses[i], 1e-2 * std::abs(cpu.losses[i])) << "step " << i + 1;
}
