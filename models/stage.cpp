// stage.cpp: building the units of a stage and running them in order.
#include "models/stage.hpp"

#include <stdexcept>

namespace dist::models {

namespace {

void add_items(const std::vector<ModelItemSpec>& items, UnitContext& ctx, bool recompute,
               std::vector<std::unique_ptr<Unit>>& out) {
    for (const auto& item : items) {
        std::vector<std::unique_ptr<Unit>> body;
        for (const auto& layer : item.layers)
            if (auto u = make_unit(layer, ctx)) body.push_back(std::move(u));
        if (item.residual) {
            std::string name = item.name.empty() ? body.front()->name() + "+" : item.name;
            out.push_back(make_residual(std::move(name), std::move(body), ctx.device(), recompute));
        } else {
            for (auto& u : body) out.push_back(std::move(u));
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
             transport::Collectives* tp, kernels::Backend* device)
    : span_(span), device_(device ? device : &kernels::cpu_backend()),
      params_(device_->allocator()) {
    auto blocks = static_cast<int64_t>(spec.blocks.size());
    if (span.begin_block < 0 || span.end_block > blocks || span.begin_block > span.end_block)
        throw std::invalid_argument("stage of blocks [" + std::to_string(span.begin_block) + ", " +
                                    std::to_string(span.end_block) + ") outside a model of " +
                                    std::to_string(blocks) + " blocks");
    UnitContext ctx{params_, seed, blocks};
    ctx.tp = tp;
    ctx.backend = device_;
    if (const LayerSpec* rotary = find_layer(spec.pre, LayerKind::rotary_embedding))
        ctx.rotary_theta = rotary->theta;
    if (span.first) {
        add_items(spec.pre, ctx, false, units_);
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
                  units_);
    if (span.last) add_items(spec.post, ctx, false, units_);
}

Tensor Stage::forward(int64_t mb, const Tensor& input, const Batch& batch) {
    Tensor x = input;
    for (auto& u : units_) x = u->forward(mb, x, batch);
    return x;
}

Tensor Stage::forward_without_loss(int64_t mb, const Tensor& input, const Batch& batch) {
    Tensor x = input;
    size_t n = units_.size() - (span_.last && !units_.empty() ? 1 : 0);
    for (size_t i = 0; i < n; ++i) x = units_[i]->forward(mb, x, batch);
    return x;
}

Tensor Stage::backward_input(int64_t mb, const Tensor& dy) {
    Tensor g = dy;
    for (auto u = units_.rbegin(); u != units_.rend(); ++u) g = (*u)->backward_input(mb, g);
    return g;
}

void Stage::backward_weight(int64_t mb) {
    for (auto& u : units_) u->backward_weight(mb);
}

Tensor Stage::infer(const Tensor& input, const InferContext& ctx) {
    Batch batch{input, {}};
    Tensor x = input;
    size_t n = units_.size() - (span_.last && !units_.empty() ? 1 : 0);
    for (size_t i = 0; i < n; ++i) x = units_[i]->infer(x, batch, ctx);
    return x;
}

void Stage::end_session(int64_t session) {
    for (auto& u : units_) u->end_session(session);
}

void Stage::discard(int64_t mb) {
    for (auto& u : units_) u->discard(mb);
}

} // namespace dist::models
