// model.cpp: building units from a ModelSpec and running them in order.
#include "models/model.hpp"

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
            out.push_back(make_residual(std::move(name), std::move(body), recompute));
        } else {
            for (auto& u : body) out.push_back(std::move(u));
        }
    }
}

} // namespace

Model::Model(const ModelSpec& spec, uint64_t seed, Recompute recompute, transport::Collectives* tp)
    : spec_(spec) {
    UnitContext ctx{params_, seed, static_cast<int64_t>(spec.blocks.size())};
    ctx.tp = tp;
    for (const auto& item : spec.pre)
        for (const auto& l : item.layers)
            if (l.kind == LayerKind::rotary_embedding) ctx.rotary_theta = l.theta;
    add_items(spec.pre, ctx, false, units_);
    for (const auto& block : spec.blocks)
        add_items(block.items, ctx, recompute == Recompute::full, units_);
    add_items(spec.post, ctx, false, units_);
}

double Model::forward(int64_t mb, const Tensor& tokens, const Tensor& targets) {
    Batch& batch = batches_[mb];
    batch = {tokens, targets};
    Tensor x = tokens;
    for (auto& u : units_) x = u->forward(mb, x, batch);
    loss_shape_[mb] = x.shape();
    double sum = 0.0;
    const float* l = x.data<float>();
    for (int64_t i = 0; i < x.numel(); ++i) sum += l[i];
    return sum / static_cast<double>(x.numel());
}

void Model::backward_input(int64_t mb, double weight) {
    auto it = loss_shape_.find(mb);
    if (it == loss_shape_.end()) throw std::logic_error("backward before forward");
    Tensor g(it->second);
    float w = static_cast<float>(weight / static_cast<double>(g.numel()));
    float* d = g.data<float>();
    for (int64_t i = 0; i < g.numel(); ++i) d[i] = w;
    loss_shape_.erase(it);
    for (auto u = units_.rbegin(); u != units_.rend(); ++u) g = (*u)->backward_input(mb, g);
}

void Model::backward_weight(int64_t mb) {
    for (auto& u : units_) u->backward_weight(mb);
    batches_.erase(mb);
}

namespace {
constexpr int64_t inference_mb = -1; // the microbatch id of forwards that keep no state
} // namespace

Tensor Model::logits(const Tensor& tokens) {
    Batch batch{tokens, {}};
    Tensor x = tokens;
    // Every unit but the loss.
    for (size_t i = 0; i + 1 < units_.size(); ++i) x = units_[i]->forward(inference_mb, x, batch);
    for (auto& u : units_) u->discard(inference_mb);
    return x;
}

double Model::loss(const Tensor& tokens, const Tensor& targets) {
    double l = forward(inference_mb, tokens, targets);
    for (auto& u : units_) u->discard(inference_mb);
    loss_shape_.erase(inference_mb);
    batches_.erase(inference_mb);
    return l;
}

void Model::backward(int64_t mb, double weight) {
    backward_input(mb, weight);
    backward_weight(mb);
}

} // namespace dist::models
