// model.cpp: the whole model as one stage, with the loss reduced to its mean.
#include "models/model.hpp"

#include <stdexcept>

namespace dist::models {

Model::Model(const ModelSpec& spec, uint64_t seed, Recompute recompute, transport::Collectives* tp,
             Precision precision)
    : spec_(spec), stage_(spec, StageSpan::whole(spec), seed, recompute, tp, nullptr, false,
                          nullptr, nullptr, precision) {}

double Model::forward(int64_t mb, const Tensor& tokens, const Tensor& targets, double loss_weight) {
    Batch& batch = batches_[mb];
    batch = {tokens, targets};
    batch.loss_weight = loss_weight;
    Tensor x = stage_.forward(mb, tokens, batch);
    loss_shape_[mb] = x.shape();
    double sum = 0.0;
    const float* l = x.data<float>();
    for (int64_t i = 0; i < x.numel(); ++i) sum += l[i];
    return sum / static_cast<double>(x.numel());
}

Tensor Model::loss_gradient(int64_t mb, double weight) {
    auto it = loss_shape_.find(mb);
    if (it == loss_shape_.end()) throw std::logic_error("backward before forward");
    Tensor g(it->second);
    float w = static_cast<float>(weight / static_cast<double>(g.numel()));
    float* d = g.data<float>();
    for (int64_t i = 0; i < g.numel(); ++i) d[i] = w;
    loss_shape_.erase(it);
    return g;
}

void Model::backward_input(int64_t mb, double weight) {
    stage_.backward_input(mb, loss_gradient(mb, weight));
}

void Model::backward_weight(int64_t mb) {
    stage_.backward_weight(mb);
    batches_.erase(mb);
}

namespace {
constexpr int64_t inference_mb = -1; // the microbatch id of forwards that keep no state
} // namespace

Tensor Model::logits(const Tensor& tokens) {
    Batch batch{tokens, {}};
    Tensor x = stage_.forward_without_loss(inference_mb, tokens, batch);
    stage_.discard(inference_mb);
    return x;
}

double Model::loss(const Tensor& tokens, const Tensor& targets) {
    double l = forward(inference_mb, tokens, targets);
    stage_.discard(inference_mb);
    loss_shape_.erase(inference_mb);
    batches_.erase(inference_mb);
    return l;
}

void Model::backward(int64_t mb, double weight) {
    stage_.backward(mb, loss_gradient(mb, weight));
    batches_.erase(mb);
}

} // namespace dist::models
