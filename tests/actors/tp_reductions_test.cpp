// tp_reductions_test.cpp: the all-reduces the plan prices inside each action of a tensor-
// parallel stage, against those the model's units make when that stage runs for real.
//
// Every member of a tp group of two is a thread with its own Stage; its collectives pass through
// a counter on their way to the in-process group. One forward, one input gradient and one
// weight gradient of one microbatch: the counts and sizes seen must be the plan's
// (PlanStage::tp_reductions, tp_backward_reductions, tp_loss_reductions and their bytes).
#include "actors/plan/lower.hpp"
#include "models/stage.hpp"
#include "tests/common/checked_script.hpp"
#include "transport/inprocess.hpp"

#include <gtest/gtest.h>

#include <future>
#include <mutex>

using namespace dist;

namespace {

// Each all-reduce's float count, by the action it was made in.
class Counting final : public transport::Collectives {
  public:
    explicit Counting(transport::Collectives& inner) : inner_(inner) {}
    int rank() const override { return inner_.rank(); }
    int size() const override { return inner_.size(); }
    void all_reduce(float* data, int64_t n, transport::ReduceOp op) override {
        seen[phase].push_back(n);
        inner_.all_reduce(data, n, op);
    }
    void all_gather(const float* in, int64_t n, float* out) override {
        other[phase] += 1;
        inner_.all_gather(in, n, out);
    }
    void reduce_scatter(const float* in, int64_t n, float* out) override {
        other[phase] += 1;
        inner_.reduce_scatter(in, n, out);
    }
    void broadcast(float* data, int64_t n, int root) override {
        other[phase] += 1;
        inner_.broadcast(data, n, root);
    }
    void all_to_all(const float* in, const std::vector<int64_t>& send, float* out,
                    const std::vector<int64_t>& recv) override {
        other[phase] += 1;
        inner_.all_to_all(in, send, out, recv);
    }

    int phase = 0; // 0 forward, 1 input gradient, 2 weight gradient
    std::vector<int64_t> seen[3];
    int other[3] = {0, 0, 0};

  private:
    transport::Collectives& inner_;
};

const char* script = R"(import "std/gpt.dist"
model = gpt(vocab: 16, context: 8, layers: 4, heads: 4, width: 16)
mesh {
    devices: cpu
}
schedule {
    kind: 1f1b
    microbatches: 2
}
train {
    data: synthetic()
    batch: 4
    steps: 1
}
)";

// Runs plan stage `s` of `p` on a tp group of two and compares what each member's collectives
// saw with the stage's counts.
void expect_stage_reductions(const Program& p, const plan::PlanStage& s) {
    const int64_t b = p.train.microbatch_size, T = p.model.context, C = p.model.width;
    const int64_t N = b * T;
    const bool first = s.embedding, last = s.head;
    models::StageSpan span{s.first_block, s.first_block + s.blocks, first, last};
    transport::InProcessGroup group(2, "tp group");
    std::vector<std::unique_ptr<Counting>> counters(2);
    std::vector<std::future<void>> runs;
    for (int r = 0; r < 2; ++r)
        runs.push_back(std::async(std::launch::async, [&, r] {
            auto member = group.member(r);
            auto& count = counters[static_cast<size_t>(r)];
            count = std::make_unique<Counting>(*member);
            try {
                models::Stage stage(p.model, span, 7, Recompute::none, count.get());
                models::Batch batch;
                batch.targets = kernels::Tensor({b, T}, kernels::DType::i32);
                kernels::Tensor input =
                    first ? kernels::Tensor({b, T}, kernels::DType::i32)
                          : kernels::Tensor::zeros({b, T, C}, kernels::DType::f32);
                for (int64_t i = 0; i < N; ++i) {
                    batch.targets.data<int32_t>()[i] = static_cast<int32_t>((i * 5 + 1) % 16);
                    if (first) input.data<int32_t>()[i] = static_cast<int32_t>((i * 3) % 16);
                }
                kernels::Tensor out = stage.forward(0, input, batch);
                kernels::Tensor dy = last ? kernels::Tensor::zeros({b, T}, kernels::DType::f32)
                                          : kernels::Tensor::zeros({b, T, C}, kernels::DType::f32);
                for (int64_t i = 0; i < dy.numel(); ++i) dy.data<float>()[i] = 1e-3f;
                count->phase = 1;
                stage.backward_input(0, dy);
                count->phase = 2;
                stage.backward_weight(0);
            } catch (...) {
                group.abort("rank " + std::to_string(r) + " failed");
                throw;
            }
        }));
    for (auto& run : runs) run.get();
    const int64_t boundary = s.tp_reduction_bytes / 4; // f32: the floats of each
    for (int r = 0; r < 2; ++r) {
        const Counting& c = *counters[static_cast<size_t>(r)];
        SCOPED_TRACE("stage " + std::to_string(s.index) + ", rank " + std::to_string(r));
        // The forward: the boundary-sized ones, then the loss's small ones.
        int32_t big = 0, small = 0;
        int64_t small_floats = 0;
        for (int64_t n : c.seen[0]) {
            if (n == boundary)
                ++big;
            else {
                ++small;
                small_floats += n;
            }
        }
        EXPECT_EQ(big, s.tp_reductions);
        EXPECT_EQ(small, s.tp_loss_reductions);
        EXPECT_EQ(4 * small_floats, s.tp_loss_reductions * s.tp_loss_bytes);
        EXPECT_EQ(static_cast<int32_t>(c.seen[1].size()), s.tp_backward_reductions);
        for (int64_t n : c.seen[1]) EXPECT_EQ(n, boundary);
        EXPECT_TRUE(c.seen[2].empty());
        EXPECT_EQ(c.other[0] + c.other[1] + c.other[2], 0);
    }
}

} // namespace

TEST(TensorParallel, ThePlanCountsTheAllReducesTheUnitsMake) {
    for (int pp : {1, 2}) {
        Program p = tests::checked_script(script, {"mesh.tp=2", "mesh.pp=" + std::to_string(pp)});
        plan::Graph g = tests::planned_graph(p);
        ASSERT_EQ(static_cast<int>(g.stages.size()), pp);
        for (const plan::PlanStage& s : g.stages) expect_stage_reductions(p, s);
        // The ends of the model are where forward and backward differ: the split embedding
        // sums its rows in the forward, the split head its input gradient in the backward.
        EXPECT_EQ(g.stages.front().tp_reductions,
                  g.stages.front().tp_backward_reductions + (pp == 1 ? 0 : 1));
        EXPECT_EQ(g.stages.back().tp_loss_reductions, 2);
    }
}
