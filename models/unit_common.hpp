// unit_common.hpp: what the unit implementations share (internal to models/): shape helpers,
// per-microbatch state, the linear layer, the tensor-parallel view of a unit, and the
// factories behind make_unit.
#pragma once

#include "models/units.hpp"
#include "transport/collectives.hpp"

#include <map>
#include <stdexcept>
#include <string>

namespace dist::models::detail {

/// Rows of an activation: everything but the last dimension.
inline int64_t rows(const Tensor& t) {
    return t.numel() / t.shape().back();
}

inline std::vector<int64_t> with_last(const Tensor& t, int64_t last) {
    std::vector<int64_t> s = t.shape();
    s.back() = last;
    return s;
}

/// Removes and returns the state saved for `mb`.
template <typename Saved> Saved take(std::map<int64_t, Saved>& m, int64_t mb, const char* what) {
    auto it = m.find(mb);
    if (it == m.end())
        throw std::logic_error(std::string(what) + ": no saved state for this microbatch");
    Saved s = std::move(it->second);
    m.erase(it);
    return s;
}

/// Mixed precision in bf16 the way Megatron-LM and llm.c run it, with float arithmetic: what a
/// unit computes with and hands on is rounded to bf16 at the points where a bf16 run stores a
/// tensor (each matmul's operands and output, each layer's output and input gradient), every
/// sum accumulates in float, and what a unit keeps for its backward is held in bf16 storage
/// (exactly, its values being bf16 already). Weights are cast where they are used, as
/// torch.autocast does: the float parameters are the master copy, never held twice. Off, every
/// function leaves its argument as it is.
struct Bf16 {
    kernels::Backend* be = nullptr;
    bool on = false;

    /// t's elements rounded to bf16, in place.
    void round(const Tensor& t) const {
        if (on && t.defined()) be->round_bf16(t.data<float>(), t.numel());
    }
    /// What a unit keeps of a float tensor for its backward: a bf16 copy when on.
    Tensor keep(const Tensor& t) const {
        if (!on || !t.defined() || t.dtype() != kernels::DType::f32) return t;
        Tensor k = be->empty(t.shape(), kernels::DType::bf16);
        be->to_bf16(t.data<float>(), t.numel(), k.data<uint16_t>());
        return k;
    }
    /// A kept tensor as float again (a float one as it is).
    Tensor use(const Tensor& t) const {
        if (!t.defined() || t.dtype() != kernels::DType::bf16) return t;
        Tensor f = be->empty(t.shape());
        be->from_bf16(t.data<uint16_t>(), t.numel(), f.data<float>());
        return f;
    }
    /// The values of `p` a unit computes with: its own, or when on a rounded copy of them.
    Tensor weights(const Parameter& p) const {
        if (!on) return p.value;
        Tensor w = p.value.clone();
        be->round_bf16(w.data<float>(), w.numel());
        return w;
    }
};

/// A unit with a name, computing on one device.
class Named : public Unit {
  public:
    Named(std::string name, kernels::Backend& device, bool bf16 = false)
        : name_(std::move(name)), be_(device), bf16_{&device, bf16} {}
    Named(std::string name, const UnitContext& ctx)
        : Named(std::move(name), ctx.device(), ctx.bf16) {}
    const std::string& name() const override { return name_; }

  protected:
    /// Inference keeps its key/value caches and positions in host memory.
    void check_host(const char* what) const {
        if (be_.device().kind != kernels::Device::Kind::cpu)
            throw std::logic_error(std::string(what) + " on " + be_.device().str() +
                                   ": inference runs on the CPU");
    }

    std::string name_;
    kernels::Backend& be_;
    Bf16 bf16_;
};

/// This rank's place in the tensor-parallel group. `split` is whether the layer at hand is
/// sharded: a layer the script does not shard, or a group of one, runs exactly as on one
/// device (no reduction is called).
/// A rank's place in one of its groups: the group (null: alone), its rank in it, the size.
struct GroupPlace {
    transport::Collectives* group = nullptr;
    int rank = 0;
    int size = 1;

    explicit GroupPlace(transport::Collectives* g)
        : group(g), rank(g ? g->rank() : 0), size(g ? g->size() : 1) {}
};

struct TensorParallel : GroupPlace {
    bool split = false;

    TensorParallel(const UnitContext& ctx, bool shard)
        : GroupPlace(ctx.tp), split(shard && size > 1) {}
    /// [begin, end) of this rank's equal part of n.
    std::pair<int64_t, int64_t> part(int64_t n) const {
        if (!split) return {0, n};
        if (n % size != 0)
            throw std::invalid_argument(std::to_string(n) + " does not split over " +
                                        std::to_string(size) + " tensor-parallel ranks");
        return {n / size * rank, n / size * (rank + 1)};
    }
    /// Sums partial results over the group (Megatron-LM's g in forward, f in backward).
    void all_reduce(Tensor& t, transport::ReduceOp op = transport::ReduceOp::sum) const {
        if (split) group->all_reduce(t.data<float>(), t.numel(), op);
    }
};

/// Megatron-LM's sequence parallelism (Korthikanti et al. 2022): between the tensor-parallel
/// layers rank r of the group holds tokens [r T/tp, (r+1) T/tp) of every sequence, so the norms,
/// the residual adds and the positions run on 1/tp of the tokens. A layer that needs the whole
/// sequence gathers it first (all-gather), and the sum over the group that tensor parallelism
/// all-reduces is reduce-scattered instead, back to the shards: the same volume, and no rank
/// keeps a whole activation between layers. `on` only when the script sets sp and the group has
/// more than one rank.
struct SequenceParallel : GroupPlace {
    bool on = false;

    explicit SequenceParallel(const UnitContext& ctx)
        : GroupPlace(ctx.tp), on(ctx.sequence_parallel && size > 1) {}
    /// (B, T/tp, ...) shards of the group -> (B, T, ...); x itself when off.
    Tensor gather(const Tensor& x, kernels::Backend& be) const;
    /// The output of a layer run on the whole sequence, as the next layer takes it: with sp this
    /// rank's shard of the sum of the group's partial results (`tp.split`: reduce-scatter) or of
    /// a result every rank holds whole (a slice); without, the all-reduce of partial results.
    Tensor finish(Tensor y, const TensorParallel& tp, kernels::Backend& be) const;
};

/// Context parallelism: a sequence of T tokens is cut into 2 cp chunks of c = T / (2 cp), and
/// rank r of the group holds chunks r and 2 cp - 1 - r side by side (its 2c local tokens), so
/// that under the causal mask every rank does the same attention work. Only attention looks
/// across tokens: it gathers every rank's keys and values, and reduce-scatters their gradients.
struct ContextParallel : GroupPlace {
    bool on = false;

    explicit ContextParallel(const UnitContext& ctx) : GroupPlace(ctx.cp), on(size > 1) {}
    /// The chunk that local half h (0 or 1) of rank `r` holds.
    int64_t chunk(int h, int r) const { return context_chunk(h, r, size); }
    int64_t chunk(int h) const { return chunk(h, rank); }
    /// Every rank's (B, 2c, ...) local tokens -> (B, T, ...) in sequence order.
    Tensor gather(const Tensor& x, kernels::Backend& be) const;
    /// (B, T, ...) partial sums from every rank -> the sum's rows of this rank's two chunks.
    Tensor scatter_sum(const Tensor& x, kernels::Backend& be) const;
};

/// y = x W^T (+ b): W (OC, C), b (OC) or null. Column- and row-parallel variants are the same
/// matmul on a shard of W; the owning unit does the reduction.
struct Linear {
    Parameter* weight = nullptr;
    Parameter* bias = nullptr;
    kernels::Backend* be = nullptr;
    /// With bf16 on: the input (in place), the weight, the output and the input gradient are
    /// rounded to bf16; the products accumulate in float.
    Bf16 bf16;

    // From the local shape: the weight's values may be away (ZeRO 3 gathers them only for the
    // forward and the input gradient), and so may its gradient (ZeRO 2 and 3 keep it only
    // until its reduce-scatter).
    int64_t out_features() const { return weight->shape[0]; }
    int64_t in_features() const { return weight->shape[1]; }

    /// With `add_bias` false the bias is left for after a reduction (row-parallel).
    Tensor forward(const Tensor& x, bool add_bias = true) const;
    void add_bias_to(Tensor& y) const;
    /// A row-parallel linear's output: the partial products summed over the group, then the
    /// bias added once.
    Tensor forward_row_parallel(const Tensor& x, const TensorParallel& tp,
                                const SequenceParallel* sp = nullptr) const {
        Tensor y = forward(x, !tp.split);
        if (sp && sp->on) {
            y = sp->finish(y, tp, *be);
            if (tp.split) add_bias_to(y);
        } else if (tp.split) {
            tp.all_reduce(y);
            add_bias_to(y);
        }
        return y;
    }
    Tensor backward_input(const Tensor& dy) const;
    void backward_weight(const Tensor& dy, const Tensor& x) const;
};

/// An MLP's two linears, the first of `hidden` units (twice that for SwiGLU: the gate's rows,
/// then the up projection's) and the second back to `width`, each split by hidden units when
/// `tp` splits the layer; `local_hidden` is this rank's share.
struct MlpLinears {
    Linear fc, proj;
    int64_t local_hidden = 0;
};
MlpLinears make_mlp_linears(UnitContext& ctx, const std::string& name, int64_t width,
                            int64_t hidden, Activation act, bool bias, const TensorParallel& tp);

/// An MLP's activation, h (rows, 2 hidden for SwiGLU, else hidden) -> g (rows, hidden). GPT-2's
/// tanh GELU keeps its tanh values in `th` (allocated here), so that its backward needs no tanh.
Tensor activation_forward(kernels::Backend& be, Activation act, const Tensor& h, int64_t hidden,
                          Tensor& th);
/// dg (rows, hidden) -> dh, the gradient of h, from h (and `th` for the tanh GELU).
Tensor activation_backward(kernels::Backend& be, Activation act, const Tensor& h, const Tensor& th,
                           const Tensor& dg, int64_t hidden);

/// A linear layer's parameters (and its bias's, sharded along the output dimension the same
/// way when the weight is split by rows; whole when split by columns).
Linear make_linear(UnitContext& ctx, const std::string& name, int64_t in, int64_t out, bool bias,
                   double std, const Shard& shard = {});

/// GPT-2 scales the projections that write into the residual stream by 1/sqrt(2 x layers).
double residual_std(const UnitContext& ctx);

std::unique_ptr<Unit> make_embedding(const LayerSpec& l, UnitContext& ctx);
std::unique_ptr<Unit> make_position(const LayerSpec& l, UnitContext& ctx);
std::unique_ptr<Unit> make_head(const LayerSpec& l, UnitContext& ctx);
std::unique_ptr<Unit> make_loss(const LayerSpec& l, UnitContext& ctx);
std::unique_ptr<Unit> make_norm(const LayerSpec& l, UnitContext& ctx);
std::unique_ptr<Unit> make_attention(const LayerSpec& l, UnitContext& ctx);
std::unique_ptr<Unit> make_mlp(const LayerSpec& l, UnitContext& ctx);
std::unique_ptr<Unit> make_moe(const LayerSpec& l, UnitContext& ctx);

} // namespace dist::models::detail
