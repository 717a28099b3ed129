// units.cpp: residual groups, and the unit behind each layer kind (the layer units themselves
// are in units_vocab.cpp and units_block.cpp).
#include "models/unit_common.hpp"

#include <stdexcept>

namespace dist::models {

using namespace detail;

// The microbatch id of inference forwards (never a training microbatch).
constexpr int64_t infer_mb = -2;

Tensor Unit::infer(const Tensor& x, const Batch& batch, const InferContext&) {
    Tensor y = forward(infer_mb, x, batch);
    discard(infer_mb);
    return y;
}

namespace {

// ----- residual groups ----------------------------------------------------------------------

class ResidualUnit : public Named {
  public:
    ResidualUnit(std::string name, std::vector<std::unique_ptr<Unit>> body,
                 kernels::Backend& device, bool recompute, bool bf16)
        : Named(std::move(name), device, bf16), body_(std::move(body)), recompute_(recompute) {}

    Tensor forward(int64_t mb, const Tensor& x, const Batch& batch) override {
        Tensor h = body_forward(mb, x, batch);
        if (recompute_) {
            // Keep only the group's input; backward runs the body again.
            for (auto& u : body_) u->discard(mb);
            inputs_[mb] = {x, batch};
        }
        return sum(x, h);
    }
    Tensor backward_input(int64_t mb, const Tensor& dy) override {
        if (recompute_) {
            Input in = take(inputs_, mb, "recomputed residual");
            in.batch.recomputed = true;
            body_forward(mb, in.x, in.batch);
        }
        Tensor g = dy;
        for (auto it = body_.rbegin(); it != body_.rend(); ++it) {
            g = (*it)->backward_input(mb, g);
            bf16_.round(g);
        }
        return sum(dy, g);
    }
    void backward_weight(int64_t mb) override {
        for (auto& u : body_) u->backward_weight(mb);
    }

    void discard(int64_t mb) override {
        inputs_.erase(mb);
        for (auto& u : body_) u->discard(mb);
    }

    Tensor infer(const Tensor& x, const Batch& batch, const InferContext& ctx) override {
        Tensor h = x;
        for (auto& u : body_) {
            h = u->infer(h, batch, ctx);
            bf16_.round(h);
        }
        return sum(x, h);
    }
    void end_session(int64_t session) override {
        for (auto& u : body_) u->end_session(session);
    }
    void take_expert_stats(ExpertStats& into) override {
        for (auto& u : body_) u->take_expert_stats(into);
    }

  private:
    Tensor sum(const Tensor& a, const Tensor& b) {
        Tensor y = be_.empty(a.shape());
        be_.add(a.data<float>(), b.data<float>(), a.numel(), y.data<float>());
        bf16_.round(y);
        return y;
    }
    Tensor body_forward(int64_t mb, const Tensor& x, const Batch& batch) {
        Tensor h = x;
        for (auto& u : body_) {
            h = u->forward(mb, h, batch);
            bf16_.round(h);
        }
        return h;
    }

    struct Input {
        Tensor x;
        Batch batch;
    };
    std::vector<std::unique_ptr<Unit>> body_;
    bool recompute_;
    std::map<int64_t, Input> inputs_;
};

} // namespace

void ExpertStats::merge(const ExpertStats& o) {
    if (o.load.empty()) return;
    if (load.size() < o.load.size()) load.resize(o.load.size(), 0);
    for (size_t e = 0; e < o.load.size(); ++e) load[e] += o.load[e];
    dropped += o.dropped;
    routed += o.routed;
    aux_loss += o.aux_loss;
    aux_terms += o.aux_terms;
}

std::unique_ptr<Unit> make_unit(const LayerSpec& l, UnitContext& ctx) {
    switch (l.kind) {
    case LayerKind::embedding: return make_embedding(l, ctx);
    case LayerKind::position_embedding: return make_position(l, ctx);
    case LayerKind::rotary_embedding: return nullptr;
    case LayerKind::layer_norm:
    case LayerKind::rms_norm: return make_norm(l, ctx);
    case LayerKind::attention: return make_attention(l, ctx);
    case LayerKind::mlp: return make_mlp(l, ctx);
    case LayerKind::lm_head: return make_head(l, ctx);
    case LayerKind::cross_entropy: return make_loss(l, ctx);
    case LayerKind::moe: return make_moe(l, ctx);
    }
    return nullptr;
}

std::unique_ptr<Unit> make_residual(std::string name, std::vector<std::unique_ptr<Unit>> body,
                                    kernels::Backend& device, bool recompute, bool bf16) {
    return std::make_unique<ResidualUnit>(std::move(name), std::move(body), device, recompute,
                                          bf16);
}

} // namespace dist::models
