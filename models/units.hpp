// units.hpp: the layers of a model as executable units, each with forward, backward_input and
// backward_weight.
//
// A unit keeps what its backward needs per microbatch (keyed by microbatch id) and frees it when
// the backward that needs it has run. backward_input returns the gradient of the unit's input
// and keeps what backward_weight needs, so a zero-bubble schedule can run the two apart;
// backward() runs both.
//
// Tensor parallelism (Megatron-LM's layout) lives inside the units the script shards: attention
// by heads and the MLP by its hidden size (column-parallel first linear, row-parallel second,
// one all-reduce in forward and one in backward), the token embedding, head and loss by
// vocabulary. Each rank materialises only its part of a split parameter. With no group, or a
// group of one, the units compute exactly what they compute on one device.
#pragma once

#include "kernels/backend.hpp"
#include "kernels/tensor.hpp"
#include "lang/program.hpp"
#include "models/parameters.hpp"
#include "transport/collectives.hpp"

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace dist::models {

using kernels::Tensor;

/// Per-microbatch inputs every unit may read: the targets of the loss.
struct Batch {
    Tensor tokens;  // (B,T) i32
    Tensor targets; // (B,T) i32
    /// The weight of this microbatch's mean loss in the step's objective (1 / microbatches):
    /// what a loss a unit adds of its own (a mixture of experts' auxiliary loss) is scaled by.
    double loss_weight = 1.0;
    /// A forward run again at backward (recomputation), not a new one.
    bool recomputed = false;
};

/// What the mixtures of experts of a stage saw over the microbatches of a step: copies
/// admitted per expert (the load), copies dropped at capacity, and the sum over microbatches
/// and layers of the auxiliary loss (unweighted by its coefficient's absence: the value added
/// to the objective), with how many (layer, microbatch) pairs it sums.
struct ExpertStats {
    std::vector<int64_t> load; // per expert, summed over the stage's moe layers
    int64_t dropped = 0;
    int64_t routed = 0; // token copies routed (admitted + dropped)
    double aux_loss = 0.0;
    int64_t aux_terms = 0;
    bool empty() const { return load.empty(); }
    void merge(const ExpertStats& o);
};

/// Where an inference forward's new tokens sit, and the key/value cache they extend. Rows may
/// be left-padded so that prompts of different lengths share a batch: the tokens of row b
/// before index row_start[b] are padding, attended by nothing and at no position.
struct InferContext {
    int64_t session = 0;            // the cache to read and extend
    int64_t pos0 = 0;               // index of the first new token in every row
    std::vector<int64_t> row_start; // per row; empty: no padding
    int64_t start(int64_t row) const {
        return row_start.empty() ? 0 : row_start[static_cast<size_t>(row)];
    }
};

class Unit {
  public:
    virtual ~Unit() = default;
    virtual const std::string& name() const = 0;
    /// x -> y. The first unit reads tokens (B,T) i32; the loss unit returns per-token losses
    /// (B,T); the others map activations (B,T,C) to (B,T,C) or logits (B,T,V).
    virtual Tensor forward(int64_t mb, const Tensor& x, const Batch& batch) = 0;
    /// dy -> dx (undefined for the first unit). Keeps what backward_weight needs, and writes
    /// no parameter gradient: under ZeRO 2 and 3 the gradients are there only for
    /// backward_weight.
    virtual Tensor backward_input(int64_t mb, const Tensor& dy) = 0;
    /// Adds this microbatch's parameter gradients and frees its state.
    virtual void backward_weight(int64_t mb) = 0;
    /// Drops what a forward saved for `mb` without a backward (evaluation, generation).
    virtual void discard(int64_t mb) = 0;

    /// Inference: x -> y for new tokens at ctx.pos0 onwards, keeping no state but the key/value
    /// cache of ctx.session. The default runs forward and drops what it saved; units that
    /// depend on positions or keep a cache override it.
    virtual Tensor infer(const Tensor& x, const Batch& batch, const InferContext& ctx);
    /// Frees the cache of a session.
    virtual void end_session(int64_t) {}
    /// Adds what the unit's routers saw since the last call to `into`, and forgets it (units
    /// without experts add nothing).
    virtual void take_expert_stats(ExpertStats&) {}

    Tensor backward(int64_t mb, const Tensor& dy) {
        Tensor dx = backward_input(mb, dy);
        backward_weight(mb);
        return dx;
    }
};

/// Context parallelism's split of a sequence into 2 `size` equal chunks: rank `rank` of the cp
/// group holds chunks rank and 2 size - 1 - rank side by side; this is the chunk in its local
/// half `half` (0 or 1).
inline int64_t context_chunk(int half, int rank, int size) {
    return half == 0 ? rank : 2 * size - 1 - rank;
}

/// What building a unit needs besides its LayerSpec.
struct UnitContext {
    ParameterStore& params;
    uint64_t seed;
    int64_t layers;            // blocks in the model (GPT-2 scales residual projections)
    double rotary_theta = 0.0; // > 0 when the model has rotary positions
    /// The tensor-parallel group: layers the script shards hold their part of every split
    /// parameter and reduce through it. Null, or a group of one: every layer whole.
    transport::Collectives* tp = nullptr;
    /// Megatron-LM sequence parallelism over `tp`: between its layers a unit's activations are
    /// this rank's 1/tp of the tokens (see SequenceParallel in unit_common.hpp).
    bool sequence_parallel = false;
    /// The context-parallel group: each rank holds two chunks of every sequence (see
    /// ContextParallel in unit_common.hpp). Null, or a group of one: whole sequences.
    transport::Collectives* cp = nullptr;
    /// The expert-parallel group: a mixture of experts' experts split over its ranks, the
    /// all-to-alls of its tokens within it. Null, or a group of one: every expert here.
    transport::Collectives* ep = nullptr;
    /// Mixed precision (train.precision bf16): the units compute with bf16 values (weights,
    /// activations and their gradients rounded to bf16, arithmetic and accumulation in float)
    /// and keep their saved activations in bf16; parameters, gradients and AdamW state stay
    /// float (see Bf16 in unit_common.hpp).
    bool bf16 = false;
    /// The device the units compute on, where `params` lives too. Null: the CPU.
    kernels::Backend* backend = nullptr;
    kernels::Backend& device() const { return backend ? *backend : kernels::cpu_backend(); }
    Parameter* embedding = nullptr; // the token embedding, for a tied head
    /// Set by the head for the loss: the vocabulary slice [begin, begin + size) this rank's
    /// logits cover, of `vocab` in all (size == vocab when they are whole).
    int64_t logits_begin = 0, logits_size = 0, logits_vocab = 0;
};

/// The unit for one layer; null for layers with no computation of their own (rotary
/// positions, which attention applies).
std::unique_ptr<Unit> make_unit(const LayerSpec& layer, UnitContext& ctx);

/// y = x + f(x) over a group of units on `device`. With `recompute`, the group keeps only its
/// input after forward and runs the body again at backward (full activation recomputation).
/// With `bf16` the sums (forward and backward) are rounded to bf16.
std::unique_ptr<Unit> make_residual(std::string name, std::vector<std::unique_ptr<Unit>> body,
                                    kernels::Backend& device, bool recompute = false,
                                    bool bf16 = false);

} // namespace dist::models
