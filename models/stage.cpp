// stage.cpp: building the units of a stage and running them in order.
#include "models/stage.hpp"

#include <stdexcept>

namespace dist::models {

namespace {

// Builds the units of `items` into `out`, and into `reads` the parameters each one reads: those
// it created, and for a tied head the embedding.
void add_items(const std::vector<ModelItemSpec>& items, UnitContext& ctx, bool recompute,
               std::vector<std::unique_ptr<Unit>>& out,
               std::vector<std::vector<Parameter*>>& reads) {
    auto& params = ctx.params.all();
    for (const auto& item : items) {
        std::vector<std::unique_ptr<Unit>> body;
        std::vector<std::vector<Parameter*>> body_reads;
        for (const auto& layer : item.layers) {
            size_t before = params.size();
            auto u = make_unit(layer, ctx);
            if (!u) continue;
            std::vector<Parameter*> r;
            for (size_t i = before; i < params.size(); ++i) r.push_back(&params[i]);
            if (layer.kind == LayerKind::lm_head && layer.tied && ctx.embedding)
                r.push_back(ctx.embedding);
            body.push_back(std::move(u));
            body_reads.push_back(std::move(r));
        }
        if (item.residual) {
            std::string name = item.name.empty() ? body.front()->name() + "+" : item.name;
            out.push_back(
                make_residual(std::move(name), std::move(body), ctx.device(), recompute, ctx.bf16));
            std::vector<Parameter*> all;
            for (auto& r : body_reads) all.insert(all.end(), r.begin(), r.end());
            reads.push_back(std::move(all));
        } else {
            for (size_t i = 0; i < body.size(); ++i) {
                out.push_back(std::move(body[i]));
                reads.push_back(std::move(body_reads[i]));
            }
        }
    }
}

const LayerSpec* find_layer(const std::vector<ModelItemSpec>& items, LayerKind kind) {
    for (const auto& item : items)
        for (const auto& l : item.layers)
            if (l.kind == kind) return &l;
    return nullptr;
}

} // namespace

Stage::Stage(const ModelSpec& spec, StageSpan span, uint64_t seed, Recompute recompute,
             transport::Collectives* tp, kernels::Backend* device, bool sequence_parallel,
             transport::Collectives* cp, transport::Collectives* ep, Precision precision)
    : span_(span), device_(device ? device : &kernels::cpu_backend()),
      params_(device_->allocator()), bf16_(precision == Precision::bf16) {
    auto blocks = static_cast<int64_t>(spec.blocks.size());
    if (span.begin_block < 0 || span.end_block > blocks || span.begin_block > span.end_block)
        throw std::invalid_argument("stage of blocks [" + std::to_string(span.begin_block) + ", " +
                                    std::to_string(span.end_block) + ") outside a model of " +
                                    std::to_string(blocks) + " blocks");
    UnitContext ctx{params_, seed, blocks};
    ctx.tp = tp;
    ctx.sequence_parallel = sequence_parallel;
    ctx.cp = cp;
    ctx.ep = ep;
    ctx.backend = device_;
    ctx.bf16 = bf16_;
    if (const LayerSpec* rotary = find_layer(spec.pre, LayerKind::rotary_embedding))
        ctx.rotary_theta = rotary->theta;
    if (span.first) {
        add_items(spec.pre, ctx, false, units_, unit_params_);
    } else if (span.last) {
        // A head tied to an embedding on another stage gets its own copy of the embedding,
        // made by the embedding's unit (same name, shape, shard and initial values); the copy
        // itself computes nothing here.
        const LayerSpec* head = find_layer(spec.post, LayerKind::lm_head);
        const LayerSpec* embedding = find_layer(spec.pre, LayerKind::embedding);
        if (head && head->tied && embedding) {
            make_unit(*embedding, ctx);
            tied_copies_.push_back(ctx.embedding->name);
        }
    }
    for (int64_t b = span.begin_block; b < span.end_block; ++b)
        add_items(spec.blocks[static_cast<size_t>(b)].items, ctx, recompute == Recompute::full,
                  units_, unit_params_);
    if (span.last) add_items(spec.post, ctx, false, units_, unit_params_);
}

template <typename F> auto Stage::with_hooks(size_t unit, UnitHooks::Phase phase, F&& run) {
    if (!hooks_) return run();
    hooks_->before(unit, phase);
    auto out = run();
    hooks_->after(unit, phase);
    return out;
}

void Stage::round(const Tensor& t, size_t unit) const {
    // The loss's per-token losses stay float; so do tokens and undefined gradients. A gradient
    // is never the losses: the backward loops pass unit 0.
    if (!bf16_ || !t.defined() || t.dtype() != kernels::DType::f32) return;
    if (span_.last && unit + 1 == units_.size()) return;
    device_->round_bf16(t.data<float>(), t.numel());
}

Tensor Stage::forward(int64_t mb, const Tensor& input, const Batch& batch) {
    Tensor x = input;
    for (size_t i = 0; i < units_.size(); ++i) {
        x = with_hooks(i, UnitHooks::Phase::forward,
                       [&] { return units_[i]->forward(mb, x, batch); });
        round(x, i);
    }
    return x;
}

Tensor Stage::forward_without_loss(int64_t mb, const Tensor& input, const Batch& batch) {
    Tensor x = input;
    size_t n = units_.size() - (span_.last && !units_.empty() ? 1 : 0);
    for (size_t i = 0; i < n; ++i) {
        x = units_[i]->forward(mb, x, batch);
        round(x, i);
    }
    return x;
}

Tensor Stage::backward_input(int64_t mb, const Tensor& dy) {
    Tensor g = dy;
    for (size_t i = units_.size(); i-- > 0;) {
        g = with_hooks(i, UnitHooks::Phase::backward_input,
                       [&] { return units_[i]->backward_input(mb, g); });
        round(g, 0);
    }
    return g;
}

Tensor Stage::backward(int64_t mb, const Tensor& dy) {
    Tensor g = dy;
    for (size_t i = units_.size(); i-- > 0;) {
        g = with_hooks(i, UnitHooks::Phase::backward_input,
                       [&] { return units_[i]->backward_input(mb, g); });
        round(g, 0);
        with_hooks(i, UnitHooks::Phase::backward_weight, [&] {
            units_[i]->backward_weight(mb);
            return 0;
        });
    }
    return g;
}

void Stage::backward_weight(int64_t mb) {
    for (size_t i = 0; i < units_.size(); ++i)
        with_hooks(i, UnitHooks::Phase::backward_weight, [&] {
            units_[i]->backward_weight(mb);
            return 0;
        });
}

Tensor Stage::infer(const Tensor& input, const InferContext& ctx) {
    Batch batch{input, {}};
    Tensor x = input;
    size_t n = units_.size() - (span_.last && !units_.empty() ? 1 : 0);
    for (size_t i = 0; i < n; ++i) {
        x = units_[i]->infer(x, batch, ctx);
        round(x, i);
    }
    return x;
}

void Stage::end_session(int64_t session) {
    for (auto& u : units_) u->end_session(session);
}

ExpertStats Stage::take_expert_stats() {
    ExpertStats stats;
    for (auto& u : units_) u->take_expert_stats(stats);
    return stats;
}

void Stage::discard(int64_t mb) {
    for (auto& u : units_) u->discard(mb);
}

} // namespace dist::models
