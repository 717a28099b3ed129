// working_memory_test.cpp: the plan's memory of a microbatch against what the units hold.
//
// A stage's forward, whole backward, input gradient and weight gradient run on the host
// allocator, which counts every live tensor; the plan's figures for the same stage
// (actors/plan/stages.cpp: what a microbatch keeps, what each phase holds for a moment beside it
// and what the input gradient leaves for the weight gradient) must come within 7% of the peaks
// and the bytes measured, for GPT-2's and Llama's blocks, in f32 and bf16, with and without full
// recomputation.
#include "actors/plan/lower.hpp"
#include "models/stage.hpp"

#include "tests/common/checked_script.hpp"
#include "tests/common/tiny_scripts.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

using namespace dist;
using kernels::Tensor;

namespace {

struct Measured {
    double kept = 0, forward = 0, backward = 0, input = 0, weight_stash = 0, weight = 0;
};

// Every figure in bytes above what the stage holds before its first forward.
Measured measure(const Program& p) {
    auto& host = kernels::Allocator::cpu();
    const int64_t B = p.train.microbatch_size, T = p.model.context;
    models::Stage stage(p.model, models::StageSpan::whole(p.model), 1, p.schedule.recompute,
                        nullptr, nullptr, false, nullptr, nullptr, p.train.precision);
    Tensor tokens({B, T}, kernels::DType::i32), targets({B, T}, kernels::DType::i32);
    const auto vocab = static_cast<int32_t>(p.model.vocab);
    for (int64_t i = 0; i < B * T; ++i) {
        tokens.data<int32_t>()[i] = static_cast<int32_t>((7 + i * 5) % vocab);
        targets.data<int32_t>()[i] = static_cast<int32_t>((3 + i * 11) % vocab);
    }
    models::Batch batch{tokens, targets};
    Tensor dy({B, T});
    for (int64_t i = 0; i < B * T; ++i) dy.data<float>()[i] = 1.0f / static_cast<float>(B * T);
    const auto base = static_cast<double>(host.bytes_in_use());
    auto now = [&] { return static_cast<double>(host.bytes_in_use()) - base; };
    auto peak = [&] { return static_cast<double>(host.peak_bytes_in_use()) - base; };
    Measured m;
    host.reset_peak();
    stage.forward(0, tokens, batch); // the losses go at once
    m.forward = peak();
    m.kept = now();
    host.reset_peak();
    stage.backward(0, dy);
    m.backward = peak();
    EXPECT_LT(now(), 0.01 * m.kept) << "a whole backward leaves nothing behind";
    stage.forward(1, tokens, batch);
    host.reset_peak();
    stage.backward_input(1, dy);
    m.input = peak();
    m.weight_stash = now();
    host.reset_peak();
    stage.backward_weight(1);
    m.weight = peak();
    return m;
}

void expect_near_measured(const std::string& model, const std::string& import,
                          const std::vector<std::string>& overrides) {
    std::string trace = model;
    for (const std::string& o : overrides) trace += ", " + o;
    SCOPED_TRACE(trace);
    Program p = tests::checked_script(tests::tiny_script(import, model, 1, 1), overrides);
    plan::PlanResult planned = plan::lower(p);
    ASSERT_TRUE(planned.ok());
    const plan::PlanStage& s = planned.graph->stages.front();
    const Measured m = measure(p);
    const auto kept = static_cast<double>(s.activation_bytes);
    auto near = [](const char* what, double predicted, double measured) {
        EXPECT_NEAR(predicted, measured, 0.07 * measured)
            << what << ": predicted " << predicted << " bytes, measured " << measured;
    };
    near("kept after the forward", kept, m.kept);
    near("the forward's peak", kept + static_cast<double>(s.forward_working_bytes), m.forward);
    near("a whole backward's peak", kept + static_cast<double>(s.backward_working_bytes),
         m.backward);
    near("the input gradient's peak", kept + static_cast<double>(s.input_working_bytes), m.input);
    near("kept for the weight gradient", static_cast<double>(s.weight_stash_bytes), m.weight_stash);
    near("the weight gradient's peak",
         static_cast<double>(s.weight_stash_bytes + s.weight_working_bytes), m.weight);
}

const char* gpt = "gpt(vocab: 256, context: 64, layers: 2, heads: 4, width: 128)";
const char* llama = "llama(vocab: 256, context: 64, layers: 2, heads: 4, kv_heads: 2, width: 128, "
                    "hidden: 344)";

std::vector<std::string> with(std::vector<std::string> extra) {
    std::vector<std::string> o = {"train.batch=16", "schedule.microbatches=1"};
    o.insert(o.end(), extra.begin(), extra.end());
    return o;
}

} // namespace

TEST(WorkingMemory, GptInF32) {
    expect_near_measured(gpt, "std/gpt.dist", with({}));
    expect_near_measured(gpt, "std/gpt.dist", with({"schedule.recompute=full"}));
}

TEST(WorkingMemory, GptInBf16) {
    expect_near_measured(gpt, "std/gpt.dist", with({"train.precision=bf16"}));
    expect_near_measured(gpt, "std/gpt.dist",
                         with({"train.precision=bf16", "schedule.recompute=full"}));
}

TEST(WorkingMemory, LlamaInF32AndBf16) {
    expect_near_measured(llama, "std/llama.dist", with({}));
    expect_near_measured(llama, "std/llama.dist", with({"schedule.recompute=full"}));
    expect_near_measured(llama, "std/llama.dist", with({"train.precision=bf16"}));
    expect_near_measured(llama, "std/llama.dist",
                         with({"train.precision=bf16", "schedule.recompute=full"}));
}
