// model.hpp: a model built from the checked Program's ModelSpec, as a sequence of units.
//
// The units run in order: the pre layers (embeddings), every block (residual groups of
// layers), the post layers (final norm, head, loss). Pipeline stages are contiguous ranges of
// these units; one device runs them all. Forward returns the mean loss of a microbatch;
// backward takes the weight of that microbatch in the step's loss.
#pragma once

#include "lang/program.hpp"
#include "models/parameters.hpp"
#include "models/stage.hpp"
#include "models/units.hpp"

#include <memory>
#include <vector>

namespace dist::models {

class Model {
  public:
    /// Builds the units and initialises their parameters from `seed`. With
    /// Recompute::full, every residual group of a block keeps only its input after forward and
    /// recomputes the rest during backward. Recompute::selective needs nothing more here:
    /// attention never keeps its (T,T) scores (its backward recomputes them from the saved
    /// log-sum-exp), which is what selective recomputation saves in Megatron-LM.
    ///
    /// With a tensor-parallel group `tp` of more than one rank, this is the model of rank
    /// tp->rank(): the layers the script shards hold their part of the split parameters and
    /// reduce through `tp`, whose members must run the same calls in the same order. Losses and
    /// the gradients of replicated parameters are then the same on every member. With
    /// Precision::bf16 it computes in bf16 (see Stage).
    Model(const ModelSpec& spec, uint64_t seed, Recompute recompute = Recompute::none,
          transport::Collectives* tp = nullptr, Precision precision = Precision::f32);

    /// tokens, targets (B,T) i32 -> the mean of the B*T token losses.
    /// `loss_weight`: the weight backward will give this microbatch's loss (Batch::loss_weight).
    double forward(int64_t mb, const Tensor& tokens, const Tensor& targets,
                   double loss_weight = 1.0);
    /// Adds the gradients of `weight` x (this microbatch's mean loss).
    void backward(int64_t mb, double weight);
    /// The two halves of backward, over the whole model: the input gradients first, then the
    /// weight gradients (what a schedule with split backward runs at different times).
    void backward_input(int64_t mb, double weight);
    void backward_weight(int64_t mb);

    /// tokens (B,T) -> logits (B,T,V) of every position, keeping no state (inference).
    Tensor logits(const Tensor& tokens);
    /// tokens (B,t) at ctx.pos0 onwards -> logits (B,t,V), through the key/value cache of
    /// ctx.session (generation).
    Tensor infer(const Tensor& tokens, const InferContext& ctx) {
        return stage_.infer(tokens, ctx);
    }
    void end_session(int64_t session) { stage_.end_session(session); }
    /// tokens, targets (B,T) -> the mean loss, keeping no state (evaluation).
    double loss(const Tensor& tokens, const Tensor& targets);

    ParameterStore& params() { return stage_.params(); }
    /// What the model's mixtures of experts saw since the last call.
    ExpertStats take_expert_stats() { return stage_.take_expert_stats(); }
    /// Hooks around each unit of the whole model in forward and backward (Stage::set_hooks);
    /// null for none.
    void set_hooks(UnitHooks* hooks) { stage_.set_hooks(hooks); }
    const ParameterStore& params() const { return stage_.params(); }
    const ModelSpec& spec() const { return spec_; }

  private:
    /// The gradient of microbatch `mb`'s per-token losses: each token's `weight` / tokens.
    Tensor loss_gradient(int64_t mb, double weight);

    ModelSpec spec_;
    Stage stage_; // the whole model as one stage
    std::map<int64_t, Batch> batches_;
    std::map<int64_t, std::vector<int64_t>> loss_shape_;
};

} // namespace dist::models
