// stage.hpp: one pipeline stage of a model, the unit a rank of a pipeline-parallel mesh runs.
//
// A stage is a contiguous range of the model's blocks; the first stage also holds the layers
// before the blocks (embeddings), the last the layers after them (final norm, head, loss). A
// stage builds and initialises only its own parameters, from the same (seed, name, index)
// function as the whole model, so that the stages of any partition hold exactly the whole
// model's weights. When the head is tied to the token embedding and the two sit on different
// stages, the last stage holds its own copy of the embedding (as Megatron-LM does): the
// runtime must sum that parameter's gradient over the two stages so the copies stay equal.
#pragma once

#include "lang/program.hpp"
#include "models/parameters.hpp"
#include "models/units.hpp"

#include <memory>
#include <string>
#include <vector>

namespace dist::models {

/// Blocks [begin_block, end_block) of a model; `first` and `last` add the layers before and
/// after the blocks.
struct StageSpan {
    int64_t begin_block = 0;
    int64_t end_block = 0;
    bool first = true;
    bool last = true;

    /// The whole model as one stage.
    static StageSpan whole(const ModelSpec& spec) {
        return {0, static_cast<int64_t>(spec.blocks.size()), true, true};
    }
};

/// Called around every unit's part of a forward or backward: what ZeRO 3 needs to have a
/// unit's weights gathered while it computes, and only then.
class UnitHooks {
  public:
    enum class Phase { forward, backward_input, backward_weight };
    virtual ~UnitHooks() = default;
    virtual void before(size_t unit, Phase phase) = 0;
    virtual void after(size_t unit, Phase phase) = 0;
};

class Stage {
  public:
    /// Throws std::invalid_argument for a span outside the model. The stage's parameters live
    /// and its units compute on `device` (null: the CPU); its inputs must be there too.
    /// With `sequence_parallel` (and a tp group of more than one) the stage's activations
    /// between layers, its input and its output are this rank's 1/tp of the tokens. With
    /// Precision::bf16 the units compute in bf16 (UnitContext::bf16), and the stage rounds every
    /// unit's output and input gradient to bf16 but the per-token losses.
    Stage(const ModelSpec& spec, StageSpan span, uint64_t seed,
          Recompute recompute = Recompute::none, transport::Collectives* tp = nullptr,
          kernels::Backend* device = nullptr, bool sequence_parallel = false,
          transport::Collectives* cp = nullptr, transport::Collectives* ep = nullptr,
          Precision precision = Precision::f32);

    /// The first stage reads tokens (B,T) i32, the others activations (B,T,C). Returns the
    /// activations for the next stage, or on the last stage the per-token losses (B,T).
    /// `batch` carries the targets the loss needs.
    Tensor forward(int64_t mb, const Tensor& input, const Batch& batch);
    /// Gradient of the stage's output -> gradient of its input (undefined on the first stage).
    /// Keeps what backward_weight needs.
    Tensor backward_input(int64_t mb, const Tensor& dy);
    /// Adds the parameter gradients of microbatch `mb` and frees its state.
    void backward_weight(int64_t mb);
    /// Both halves, unit by unit from the last: each unit adds its weight gradients and frees
    /// what it kept right after its input gradient, so that a whole backward holds one unit's
    /// state at a time rather than every unit's until the end. Returns the input gradient.
    Tensor backward(int64_t mb, const Tensor& dy);
    /// Drops the state a forward kept for `mb`.
    void discard(int64_t mb);
    /// What the stage's mixtures of experts saw since the last call (empty without experts).
    ExpertStats take_expert_stats();
    /// The forward of every unit but the last (the loss): logits on the last stage.
    Tensor forward_without_loss(int64_t mb, const Tensor& input, const Batch& batch);

    /// Inference over new tokens (see InferContext): every unit but the loss, extending the
    /// key/value caches of ctx.session. The last stage returns logits.
    Tensor infer(const Tensor& input, const InferContext& ctx);
    void end_session(int64_t session);

    ParameterStore& params() { return params_; }
    const ParameterStore& params() const { return params_; }
    const StageSpan& span() const { return span_; }
    kernels::Backend& device() const { return *device_; }
    /// Names of parameters this stage holds a copy of, whose gradient the runtime must sum with
    /// the stage that owns them (the tied embedding on the last stage).
    const std::vector<std::string>& tied_copies() const { return tied_copies_; }

    /// The parameters each unit reads, in the order the units run forward (a tied head reads
    /// the embedding).
    const std::vector<std::vector<Parameter*>>& unit_parameters() const { return unit_params_; }
    /// Hooks called around each unit in forward, backward_input and backward_weight (not in
    /// inference); null for none.
    void set_hooks(UnitHooks* hooks) { hooks_ = hooks; }

  private:
    template <typename F> auto with_hooks(size_t unit, UnitHooks::Phase phase, F&& run);
    /// With bf16: a unit's output (unless it is the loss's) or input gradient rounded in place.
    void round(const Tensor& t, size_t unit) const;

    StageSpan span_;
    kernels::Backend* device_;
    ParameterStore params_;
    std::vector<std::unique_ptr<Unit>> units_;
    std::vector<std::string> tied_copies_;
    std::vector<std::vector<Parameter*>> unit_params_;
    UnitHooks* hooks_ = nullptr;
    bool bf16_ = false;
};

} // namespace dist::models
