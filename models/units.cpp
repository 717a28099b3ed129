// units.cpp: the units behind each layer kind, on the CPU kernels.
#include "models/units.hpp"

#include "kernels/cpu/ops.hpp"

#include <cmath>
#include <cstring>
#include <stdexcept>

namespace dist::models {

namespace ops = kernels::cpu;

namespace {

// Rows of an activation: everything but the last dimension.
int64_t rows(const Tensor& t) {
    return t.numel() / t.shape().back();
}

std::vector<int64_t> with_last(const Tensor& t, int64_t last) {
    std::vector<int64_t> s = t.shape();
    s.back() = last;
    return s;
}

template <typename Saved> Saved take(std::map<int64_t, Saved>& m, int64_t mb, const char* what) {
    auto it = m.find(mb);
    if (it == m.end())
        throw std::logic_error(std::string(what) + ": no saved state for this microbatch");
    Saved s = std::move(it->second);
    m.erase(it);
    return s;
}

class Named : public Unit {
  public:
    explicit Named(std::string name) : name_(std::move(name)) {}
    const std::string& name() const override { return name_; }

  protected:
    std::string name_;
};

// ----- embeddings ---------------------------------------------------------------------------

class EmbeddingUnit : public Named {
  public:
    EmbeddingUnit(const LayerSpec& l, UnitContext& ctx) : Named(l.name) {
        weight_ = &ctx.params.add(l.name + ".weight", {l.vocab, l.width}, Init::normal(0.02), true,
                                  ctx.seed);
        ctx.embedding = weight_;
        vocab_ = l.vocab;
    }
    Tensor forward(int64_t mb, const Tensor& tokens, const Batch&) override {
        int64_t C = weight_->value.dim(1);
        const int32_t* tok = tokens.data<int32_t>();
        for (int64_t i = 0; i < tokens.numel(); ++i)
            if (tok[i] < 0 || tok[i] >= vocab_)
                throw std::out_of_range("token " + std::to_string(tok[i]) +
                                        " is outside the vocabulary of " + std::to_string(vocab_));
        Tensor y({tokens.dim(0), tokens.dim(1), C});
        ops::embedding_forward(tok, weight_->value.data<float>(), tokens.numel(), C,
                               y.data<float>());
        saved_[mb].tokens = tokens;
        return y;
    }
    Tensor backward_input(int64_t mb, const Tensor& dy) override {
        saved_.at(mb).dy = dy;
        return {};
    }
    void backward_weight(int64_t mb) override {
        Saved s = take(saved_, mb, "embedding");
        ops::embedding_backward(s.tokens.data<int32_t>(), s.dy.data<float>(), s.tokens.numel(),
                                weight_->value.dim(1), weight_->grad.data<float>());
    }

    void discard(int64_t mb) override { saved_.erase(mb); }

  private:
    struct Saved {
        Tensor tokens, dy;
    };
    Parameter* weight_;
    int64_t vocab_;
    std::map<int64_t, Saved> saved_;
};

class PositionUnit : public Named {
  public:
    PositionUnit(const LayerSpec& l, UnitContext& ctx) : Named(l.name) {
        weight_ = &ctx.params.add(l.name + ".weight", {l.context, l.width}, Init::normal(0.02),
                                  true, ctx.seed);
    }
    Tensor forward(int64_t, const Tensor& x, const Batch&) override {
        if (x.dim(1) > weight_->value.dim(0))
            throw std::out_of_range("sequence of " + std::to_string(x.dim(1)) +
                                    " tokens is longer than the context of " +
                                    std::to_string(weight_->value.dim(0)));
        Tensor y = x.clone();
        ops::positions_forward(weight_->value.data<float>(), x.dim(0), x.dim(1), x.dim(2),
                               y.data<float>());
        return y;
    }
    Tensor backward_input(int64_t mb, const Tensor& dy) override {
        saved_[mb] = dy;
        return dy;
    }
    void backward_weight(int64_t mb) override {
        Tensor dy = take(saved_, mb, "positions");
        ops::positions_backward(dy.data<float>(), dy.dim(0), dy.dim(1), dy.dim(2),
                                weight_->grad.data<float>());
    }

    void discard(int64_t mb) override { saved_.erase(mb); }

  private:
    Parameter* weight_;
    std::map<int64_t, Tensor> saved_;
};

// ----- norms --------------------------------------------------------------------------------

class NormUnit : public Named {
  public:
    NormUnit(const LayerSpec& l, UnitContext& ctx)
        : Named(l.name), rms_(l.kind == LayerKind::rms_norm), eps_(l.eps) {
        weight_ = &ctx.params.add(l.name + ".weight", {l.width}, Init::ones(), false, ctx.seed);
        if (!rms_ && l.bias)
            bias_ = &ctx.params.add(l.name + ".bias", {l.width}, Init::zeros(), false, ctx.seed);
    }
    Tensor forward(int64_t mb, const Tensor& x, const Batch&) override {
        int64_t N = rows(x), C = x.shape().back();
        Tensor y(x.shape()), mean({N}), rstd({N});
        if (rms_)
            ops::rmsnorm_forward(x.data<float>(), weight_->value.data<float>(), N, C, eps_,
                                 y.data<float>(), rstd.data<float>());
        else
            ops::layernorm_forward(x.data<float>(), weight_->value.data<float>(),
                                   bias_ ? bias_->value.data<float>() : nullptr, N, C, eps_,
                                   y.data<float>(), mean.data<float>(), rstd.data<float>());
        saved_[mb] = {x, mean, rstd, {}};
        return y;
    }
    Tensor backward_input(int64_t mb, const Tensor& dy) override {
        Saved& s = saved_.at(mb);
        int64_t N = rows(s.x), C = s.x.shape().back();
        Tensor dx = Tensor::zeros(s.x.shape());
        if (rms_)
            ops::rmsnorm_backward_input(dy.data<float>(), s.x.data<float>(),
                                        weight_->value.data<float>(), s.rstd.data<float>(), N, C,
                                        dx.data<float>());
        else
            ops::layernorm_backward_input(dy.data<float>(), s.x.data<float>(),
                                          weight_->value.data<float>(), s.mean.data<float>(),
                                          s.rstd.data<float>(), N, C, dx.data<float>());
        s.dy = dy;
        return dx;
    }
    void backward_weight(int64_t mb) override {
        Saved s = take(saved_, mb, "norm");
        int64_t N = rows(s.x), C = s.x.shape().back();
        if (rms_)
            ops::rmsnorm_backward_weight(s.dy.data<float>(), s.x.data<float>(),
                                         s.rstd.data<float>(), N, C, weight_->grad.data<float>());
        else
            ops::layernorm_backward_weight(
                s.dy.data<float>(), s.x.data<float>(), s.mean.data<float>(), s.rstd.data<float>(),
                N, C, weight_->grad.data<float>(), bias_ ? bias_->grad.data<float>() : nullptr);
    }

    void discard(int64_t mb) override { saved_.erase(mb); }

  private:
    struct Saved {
        Tensor x, mean, rstd, dy;
    };
    bool rms_;
    double eps_;
    Parameter* weight_ = nullptr;
    Parameter* bias_ = nullptr;
    std::map<int64_t, Saved> saved_;
};

// ----- linear (a matmul with optional bias), used inside attention, MLP and head ------------

struct Linear {
    Parameter* weight = nullptr; // (OC, C)
    Parameter* bias = nullptr;   // (OC) or null

    int64_t out_features() const { return weight->value.dim(0); }
    int64_t in_features() const { return weight->value.dim(1); }

    Tensor forward(const Tensor& x) const {
        Tensor y(with_last(x, out_features()));
        ops::matmul_forward(x.data<float>(), weight->value.data<float>(),
                            bias ? bias->value.data<float>() : nullptr, rows(x), in_features(),
                            out_features(), y.data<float>());
        return y;
    }
    Tensor backward_input(const Tensor& dy) const {
        Tensor dx = Tensor::zeros(with_last(dy, in_features()));
        ops::matmul_backward_input(dy.data<float>(), weight->value.data<float>(), rows(dy),
                                   in_features(), out_features(), dx.data<float>());
        return dx;
    }
    void backward_weight(const Tensor& dy, const Tensor& x) const {
        ops::matmul_backward_weight(dy.data<float>(), x.data<float>(), rows(x), in_features(),
                                    out_features(), weight->grad.data<float>(),
                                    bias ? bias->grad.data<float>() : nullptr);
    }
};

Linear make_linear(UnitContext& ctx, const std::string& name, int64_t in, int64_t out, bool bias,
                   double std) {
    Linear l;
    l.weight = &ctx.params.add(name + ".weight", {out, in}, Init::normal(std), true, ctx.seed);
    if (bias) l.bias = &ctx.params.add(name + ".bias", {out}, Init::zeros(), false, ctx.seed);
    return l;
}

// GPT-2 scales the projections that write into the residual stream by 1/sqrt(2 x layers).
double residual_std(const UnitContext& ctx) {
    return 0.02 / std::sqrt(2.0 * static_cast<double>(ctx.layers));
}

// ----- attention ----------------------------------------------------------------------------

class AttentionUnit : public Named {
  public:
    AttentionUnit(const LayerSpec& l, UnitContext& ctx)
        : Named(l.name), H_(l.heads), KV_(l.kv_heads), D_(l.head_dim), theta_(ctx.rotary_theta) {
        qkv_ = make_linear(ctx, l.name + ".qkv", l.width, (H_ + 2 * KV_) * D_, l.bias, 0.02);
        out_ = make_linear(ctx, l.name + ".out", H_ * D_, l.width, l.bias, residual_std(ctx));
    }

    Tensor forward(int64_t mb, const Tensor& x, const Batch&) override {
        int64_t B = x.dim(0), T = x.dim(1);
        Tensor qkv = qkv_.forward(x);
        Tensor q({B, T, H_, D_}), k({B, T, KV_, D_}), v({B, T, KV_, D_});
        split(qkv, q, k, v);
        if (theta_ > 0) {
            ops::rope_forward(q.data<float>(), B, T, H_, D_, theta_, 0, q.data<float>());
            ops::rope_forward(k.data<float>(), B, T, KV_, D_, theta_, 0, k.data<float>());
        }
        Tensor a({B, T, H_ * D_}), lse({B, H_, T});
        ops::attention_forward(q.data<float>(), k.data<float>(), v.data<float>(), B, T, H_, KV_, D_,
                               a.data<float>(), lse.data<float>());
        saved_[mb] = {x, q, k, v, a, lse, {}, {}};
        return out_.forward(a);
    }

    Tensor backward_input(int64_t mb, const Tensor& dy) override {
        Saved& s = saved_.at(mb);
        int64_t B = s.x.dim(0), T = s.x.dim(1);
        Tensor da = out_.backward_input(dy);
        Tensor dq = Tensor::zeros(s.q.shape()), dk = Tensor::zeros(s.k.shape()),
               dv = Tensor::zeros(s.v.shape());
        ops::attention_backward(da.data<float>(), s.q.data<float>(), s.k.data<float>(),
                                s.v.data<float>(), s.a.data<float>(), s.lse.data<float>(), B, T, H_,
                                KV_, D_, dq.data<float>(), dk.data<float>(), dv.data<float>());
        Tensor dqkv({B, T, (H_ + 2 * KV_) * D_});
        if (theta_ > 0) {
            Tensor rq = Tensor::zeros(dq.shape()), rk = Tensor::zeros(dk.shape());
            ops::rope_backward(dq.data<float>(), B, T, H_, D_, theta_, 0, rq.data<float>());
            ops::rope_backward(dk.data<float>(), B, T, KV_, D_, theta_, 0, rk.data<float>());
            dq = rq;
            dk = rk;
        }
        join(dq, dk, dv, dqkv);
        s.dy = dy;
        s.dqkv = dqkv;
        return qkv_.backward_input(dqkv);
    }

    void backward_weight(int64_t mb) override {
        Saved s = take(saved_, mb, "attention");
        out_.backward_weight(s.dy, s.a);
        qkv_.backward_weight(s.dqkv, s.x);
    }

    void discard(int64_t mb) override { saved_.erase(mb); }

  private:
    // (B,T,(H+2KV)D) rows into q (B,T,H,D), k and v (B,T,KV,D).
    void split(const Tensor& qkv, Tensor& q, Tensor& k, Tensor& v) const {
        int64_t n = rows(qkv), row = (H_ + 2 * KV_) * D_;
        const float* src = qkv.data<float>();
        for (int64_t i = 0; i < n; ++i) {
            std::memcpy(q.data<float>() + i * H_ * D_, src + i * row, H_ * D_ * sizeof(float));
            std::memcpy(k.data<float>() + i * KV_ * D_, src + i * row + H_ * D_,
                        KV_ * D_ * sizeof(float));
            std::memcpy(v.data<float>() + i * KV_ * D_, src + i * row + (H_ + KV_) * D_,
                        KV_ * D_ * sizeof(float));
        }
    }
    void join(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& qkv) const {
        int64_t n = rows(qkv), row = (H_ + 2 * KV_) * D_;
        float* dst = qkv.data<float>();
        for (int64_t i = 0; i < n; ++i) {
            std::memcpy(dst + i * row, q.data<float>() + i * H_ * D_, H_ * D_ * sizeof(float));
            std::memcpy(dst + i * row + H_ * D_, k.data<float>() + i * KV_ * D_,
                        KV_ * D_ * sizeof(float));
            std::memcpy(dst + i * row + (H_ + KV_) * D_, v.data<float>() + i * KV_ * D_,
                        KV_ * D_ * sizeof(float));
        }
    }

    struct Saved {
        Tensor x, q, k, v, a, lse, dy, dqkv;
    };
    int64_t H_, KV_, D_;
    double theta_;
    Linear qkv_, out_;
    std::map<int64_t, Saved> saved_;
};

// ----- MLP ----------------------------------------------------------------------------------

class MlpUnit : public Named {
  public:
    MlpUnit(const LayerSpec& l, UnitContext& ctx)
        : Named(l.name), act_(l.activation), hidden_(l.hidden) {
        int64_t fc_out = act_ == Activation::swiglu ? 2 * l.hidden : l.hidden;
        fc_ = make_linear(ctx, l.name + ".fc", l.width, fc_out, l.bias, 0.02);
        proj_ = make_linear(ctx, l.name + ".proj", l.hidden, l.width, l.bias, residual_std(ctx));
    }

    Tensor forward(int64_t mb, const Tensor& x, const Batch&) override {
        Tensor h = fc_.forward(x);
        Tensor g(with_last(x, hidden_));
        activate(h, g);
        saved_[mb] = {x, h, g, {}, {}};
        return proj_.forward(g);
    }

    Tensor backward_input(int64_t mb, const Tensor& dy) override {
        Saved& s = saved_.at(mb);
        Tensor dg = proj_.backward_input(dy);
        Tensor dh = Tensor::zeros(s.h.shape());
        int64_t N = rows(s.h);
        switch (act_) {
        case Activation::swiglu:
            ops::swiglu_backward(s.h.data<float>(), dg.data<float>(), N, hidden_, dh.data<float>());
            break;
        case Activation::gelu_tanh:
            ops::gelu_backward(s.h.data<float>(), dg.data<float>(), s.h.numel(), dh.data<float>());
            break;
        case Activation::gelu:
        case Activation::relu: activation_backward(s.h, dg, dh); break;
        }
        s.dy = dy;
        s.dh = dh;
        return fc_.backward_input(dh);
    }

    void backward_weight(int64_t mb) override {
        Saved s = take(saved_, mb, "mlp");
        proj_.backward_weight(s.dy, s.g);
        fc_.backward_weight(s.dh, s.x);
    }

    void discard(int64_t mb) override { saved_.erase(mb); }

  private:
    void activate(const Tensor& h, Tensor& g) const {
        const float* in = h.data<float>();
        float* out = g.data<float>();
        int64_t n = h.numel();
        switch (act_) {
        case Activation::swiglu: ops::swiglu_forward(in, rows(h), hidden_, out); break;
        case Activation::gelu_tanh: ops::gelu_forward(in, n, out); break;
        case Activation::gelu:
            for (int64_t i = 0; i < n; ++i)
                out[i] = 0.5f * in[i] * (1.0f + std::erf(in[i] * 0.70710678f));
            break;
        case Activation::relu:
            for (int64_t i = 0; i < n; ++i) out[i] = in[i] > 0 ? in[i] : 0.0f;
            break;
        }
    }
    void activation_backward(const Tensor& h, const Tensor& dg, Tensor& dh) const {
        const float* x = h.data<float>();
        const float* g = dg.data<float>();
        float* d = dh.data<float>();
        for (int64_t i = 0; i < h.numel(); ++i) {
            if (act_ == Activation::relu) {
                d[i] += x[i] > 0 ? g[i] : 0.0f;
            } else {
                float cdf = 0.5f * (1.0f + std::erf(x[i] * 0.70710678f));
                float pdf = 0.39894228f * std::exp(-0.5f * x[i] * x[i]);
                d[i] += g[i] * (cdf + x[i] * pdf);
            }
        }
    }

    struct Saved {
        Tensor x, h, g, dy, dh;
    };
    Activation act_;
    int64_t hidden_;
    Linear fc_, proj_;
    std::map<int64_t, Saved> saved_;
};

// ----- head and loss ------------------------------------------------------------------------

class HeadUnit : public Named {
  public:
    HeadUnit(const LayerSpec& l, UnitContext& ctx) : Named(l.name) {
        if (l.tied) {
            if (!ctx.embedding) throw std::logic_error("tied head without an embedding");
            head_.weight = ctx.embedding;
        } else {
            head_.weight = &ctx.params.add(l.name + ".weight", {l.vocab, l.width},
                                           Init::normal(0.02), true, ctx.seed);
        }
        if (l.bias)
            head_.bias =
                &ctx.params.add(l.name + ".bias", {l.vocab}, Init::zeros(), false, ctx.seed);
    }
    Tensor forward(int64_t mb, const Tensor& x, const Batch&) override {
        saved_[mb].x = x;
        return head_.forward(x);
    }
    Tensor backward_input(int64_t mb, const Tensor& dy) override {
        saved_.at(mb).dy = dy;
        return head_.backward_input(dy);
    }
    void backward_weight(int64_t mb) override {
        Saved s = take(saved_, mb, "lm_head");
        head_.backward_weight(s.dy, s.x);
    }

    void discard(int64_t mb) override { saved_.erase(mb); }

  private:
    struct Saved {
        Tensor x, dy;
    };
    Linear head_;
    std::map<int64_t, Saved> saved_;
};

class LossUnit : public Named {
  public:
    explicit LossUnit(const LayerSpec& l) : Named(l.name) {}
    Tensor forward(int64_t mb, const Tensor& logits, const Batch& batch) override {
        int64_t B = logits.dim(0), T = logits.dim(1), V = logits.dim(2);
        Tensor losses({B, T}), lse({B * T});
        const int32_t* tgt = batch.targets.data<int32_t>();
        for (int64_t i = 0; i < B * T; ++i)
            if (tgt[i] < 0 || tgt[i] >= V)
                throw std::out_of_range("target token " + std::to_string(tgt[i]) +
                                        " is outside the vocabulary of " + std::to_string(V));
        ops::cross_entropy_forward(logits.data<float>(), tgt, B * T, V, losses.data<float>(),
                                   lse.data<float>());
        saved_[mb] = {logits, lse, batch.targets};
        return losses;
    }
    Tensor backward_input(int64_t mb, const Tensor& dlosses) override {
        Saved s = take(saved_, mb, "cross_entropy");
        int64_t V = s.logits.dim(2);
        Tensor dlogits(s.logits.shape());
        ops::cross_entropy_backward(s.logits.data<float>(), s.targets.data<int32_t>(),
                                    s.lse.data<float>(), dlosses.data<float>(), rows(s.logits), V,
                                    dlogits.data<float>());
        return dlogits;
    }
    void backward_weight(int64_t) override {}

    void discard(int64_t mb) override { saved_.erase(mb); }

  private:
    struct Saved {
        Tensor logits, lse, targets;
    };
    std::map<int64_t, Saved> saved_;
};

// ----- residual groups ----------------------------------------------------------------------

class ResidualUnit : public Named {
  public:
    ResidualUnit(std::string name, std::vector<std::unique_ptr<Unit>> body, bool recompute)
        : Named(std::move(name)), body_(std::move(body)), recompute_(recompute) {}

    Tensor forward(int64_t mb, const Tensor& x, const Batch& batch) override {
        Tensor h = body_forward(mb, x, batch);
        if (recompute_) {
            // Keep only the group's input; backward runs the body again.
            for (auto& u : body_) u->discard(mb);
            inputs_[mb] = {x, batch};
        }
        Tensor y(x.shape());
        const float* a = x.data<float>();
        float* out = y.data<float>();
        const float* f = h.data<float>();
        for (int64_t i = 0; i < x.numel(); ++i) out[i] = a[i] + f[i];
        return y;
    }
    Tensor backward_input(int64_t mb, const Tensor& dy) override {
        if (recompute_) {
            Input in = take(inputs_, mb, "recomputed residual");
            body_forward(mb, in.x, in.batch);
        }
        Tensor g = dy;
        for (auto it = body_.rbegin(); it != body_.rend(); ++it) g = (*it)->backward_input(mb, g);
        Tensor dx(dy.shape());
        const float* a = dy.data<float>();
        const float* b = g.data<float>();
        float* out = dx.data<float>();
        for (int64_t i = 0; i < dy.numel(); ++i) out[i] = a[i] + b[i];
        return dx;
    }
    void backward_weight(int64_t mb) override {
        for (auto& u : body_) u->backward_weight(mb);
    }

    void discard(int64_t mb) override {
        inputs_.erase(mb);
        for (auto& u : body_) u->discard(mb);
    }

  private:
    Tensor body_forward(int64_t mb, const Tensor& x, const Batch& batch) {
        Tensor h = x;
        for (auto& u : body_) h = u->forward(mb, h, batch);
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

std::unique_ptr<Unit> make_unit(const LayerSpec& l, UnitContext& ctx) {
    switch (l.kind) {
    case LayerKind::embedding: return std::make_unique<EmbeddingUnit>(l, ctx);
    case LayerKind::position_embedding: return std::make_unique<PositionUnit>(l, ctx);
    case LayerKind::rotary_embedding: return nullptr;
    case LayerKind::layer_norm:
    case LayerKind::rms_norm: return std::make_unique<NormUnit>(l, ctx);
    case LayerKind::attention: return std::make_unique<AttentionUnit>(l, ctx);
    case LayerKind::mlp: return std::make_unique<MlpUnit>(l, ctx);
    case LayerKind::lm_head: return std::make_unique<HeadUnit>(l, ctx);
    case LayerKind::cross_entropy: return std::make_unique<LossUnit>(l);
    }
    return nullptr;
}

std::unique_ptr<Unit> make_residual(std::string name, std::vector<std::unique_ptr<Unit>> body,
                                    bool recompute) {
    return std::make_unique<ResidualUnit>(std::move(name), std::move(body), recompute);
}

} // namespace dist::models
