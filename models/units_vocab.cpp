// units_vocab.cpp: the units at the two ends of a model, the token and position embeddings,
// the output head and the loss, with the vocabulary-parallel variants of Megatron-LM.
//
// Split by vocabulary, rank r holds rows [r V/tp, (r+1) V/tp) of the embedding (and of a tied
// head). The embedding looks up the tokens it holds, leaves zeros for the rest and sums over
// the group; the head produces the logits of its slice; the loss reduces the row maximum, the
// sum of exponentials and the target's logit over the group, so no rank ever holds the
// (B,T,V) logits.
#include "models/unit_common.hpp"

#include <cmath>
#include <cstring>

namespace dist::models::detail {

namespace {

void check_tokens(const Tensor& tokens, int64_t vocab, const char* what) {
    const int32_t* tok = tokens.data<int32_t>();
    for (int64_t i = 0; i < tokens.numel(); ++i)
        if (tok[i] < 0 || tok[i] >= vocab)
            throw std::out_of_range(std::string(what) + " " + std::to_string(tok[i]) +
                                    " is outside the vocabulary of " + std::to_string(vocab));
}

class EmbeddingUnit : public Named {
  public:
    EmbeddingUnit(const LayerSpec& l, UnitContext& ctx)
        : Named(l.name), tp_(ctx, l.shard == ShardDim::vocab), vocab_(l.vocab) {
        auto [begin, end] = tp_.part(l.vocab);
        begin_ = begin;
        rows_ = end - begin;
        weight_ = &ctx.params.add(l.name + ".weight", {l.vocab, l.width}, Init::normal(0.02), true,
                                  ctx.seed, tp_.split ? Shard::range(0, begin, end) : Shard{});
        ctx.embedding = weight_;
    }
    Tensor forward(int64_t mb, const Tensor& tokens, const Batch&) override {
        check_tokens(tokens, vocab_, "token");
        int64_t C = weight_->value.dim(1), N = tokens.numel();
        const int32_t* tok = tokens.data<int32_t>();
        const float* table = weight_->value.data<float>();
        Tensor y({tokens.dim(0), tokens.dim(1), C});
        if (!tp_.split) {
            ops::embedding_forward(tok, table, N, C, y.data<float>());
        } else {
            float* out = y.data<float>();
            for (int64_t i = 0; i < N; ++i) {
                int64_t row = tok[i] - begin_;
                if (row >= 0 && row < rows_)
                    std::memcpy(out + i * C, table + row * C, static_cast<size_t>(C) * 4);
                else
                    std::memset(out + i * C, 0, static_cast<size_t>(C) * 4);
            }
            tp_.all_reduce(y);
        }
        saved_[mb].tokens = tokens;
        return y;
    }
    Tensor backward_input(int64_t mb, const Tensor& dy) override {
        saved_.at(mb).dy = dy;
        return {};
    }
    void backward_weight(int64_t mb) override {
        Saved s = take(saved_, mb, "embedding");
        int64_t C = weight_->value.dim(1), N = s.tokens.numel();
        const int32_t* tok = s.tokens.data<int32_t>();
        float* grad = weight_->grad.data<float>();
        if (!tp_.split) {
            ops::embedding_backward(tok, s.dy.data<float>(), N, C, grad);
            return;
        }
        const float* dy = s.dy.data<float>();
        for (int64_t i = 0; i < N; ++i) {
            int64_t row = tok[i] - begin_;
            if (row < 0 || row >= rows_) continue;
            for (int64_t c = 0; c < C; ++c) grad[row * C + c] += dy[i * C + c];
        }
    }

    void discard(int64_t mb) override { saved_.erase(mb); }

  private:
    struct Saved {
        Tensor tokens, dy;
    };
    TensorParallel tp_;
    int64_t vocab_, begin_ = 0, rows_ = 0;
    Parameter* weight_;
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
    Tensor infer(const Tensor& x, const Batch&, const InferContext& ctx) override {
        int64_t B = x.dim(0), T = x.dim(1), C = x.dim(2), context = weight_->value.dim(0);
        Tensor y = x.clone();
        const float* wpe = weight_->value.data<float>();
        for (int64_t b = 0; b < B; ++b) {
            for (int64_t t = 0; t < T; ++t) {
                int64_t pos = ctx.pos0 + t - ctx.start(b);
                if (pos < 0) continue; // left padding: no position
                if (pos >= context)
                    throw std::out_of_range("position " + std::to_string(pos) +
                                            " is beyond the context of " + std::to_string(context));
                float* row = y.data<float>() + (b * T + t) * C;
                for (int64_t c = 0; c < C; ++c) row[c] += wpe[pos * C + c];
            }
        }
        return y;
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

class HeadUnit : public Named {
  public:
    HeadUnit(const LayerSpec& l, UnitContext& ctx) : Named(l.name), tp_(ctx, false) {
        Shard shard;
        if (l.tied) {
            if (!ctx.embedding) throw std::logic_error("tied head without an embedding");
            // A tied head is split exactly as the embedding it shares.
            head_.weight = ctx.embedding;
            shard = ctx.embedding->shard;
            tp_.split = !shard.whole();
        } else {
            tp_ = TensorParallel(ctx, l.shard == ShardDim::vocab);
            auto [begin, end] = tp_.part(l.vocab);
            if (tp_.split) shard = Shard::range(0, begin, end);
            head_.weight = &ctx.params.add(l.name + ".weight", {l.vocab, l.width},
                                           Init::normal(0.02), true, ctx.seed, shard);
        }
        if (l.bias)
            head_.bias =
                &ctx.params.add(l.name + ".bias", {l.vocab}, Init::zeros(), false, ctx.seed, shard);
        ctx.logits_vocab = l.vocab;
        ctx.logits_begin = shard.whole() ? 0 : shard.ranges.at(0).first;
        ctx.logits_size = head_.out_features();
    }
    Tensor forward(int64_t mb, const Tensor& x, const Batch&) override {
        saved_[mb].x = x;
        return head_.forward(x);
    }
    Tensor backward_input(int64_t mb, const Tensor& dy) override {
        saved_.at(mb).dy = dy;
        Tensor dx = head_.backward_input(dy);
        tp_.all_reduce(dx);
        return dx;
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
    TensorParallel tp_;
    Linear head_;
    std::map<int64_t, Saved> saved_;
};

class LossUnit : public Named {
  public:
    LossUnit(const LayerSpec& l, const UnitContext& ctx)
        : Named(l.name), tp_(ctx, ctx.logits_size != ctx.logits_vocab), vocab_(ctx.logits_vocab),
          begin_(ctx.logits_begin) {}

    Tensor forward(int64_t mb, const Tensor& logits, const Batch& batch) override {
        int64_t B = logits.dim(0), T = logits.dim(1), V = logits.dim(2);
        Tensor losses({B, T}), lse({B * T});
        check_tokens(batch.targets, tp_.split ? vocab_ : V, "target token");
        const int32_t* tgt = batch.targets.data<int32_t>();
        if (tp_.split)
            split_forward(logits, tgt, losses, lse);
        else
            ops::cross_entropy_forward(logits.data<float>(), tgt, B * T, V, losses.data<float>(),
                                       lse.data<float>());
        saved_[mb] = {logits, lse, batch.targets};
        return losses;
    }
    Tensor backward_input(int64_t mb, const Tensor& dlosses) override {
        Saved s = take(saved_, mb, "cross_entropy");
        int64_t N = rows(s.logits), V = s.logits.dim(2);
        Tensor dlogits(s.logits.shape());
        const int32_t* tgt = s.targets.data<int32_t>();
        if (!tp_.split) {
            ops::cross_entropy_backward(s.logits.data<float>(), tgt, s.lse.data<float>(),
                                        dlosses.data<float>(), N, V, dlogits.data<float>());
            return dlogits;
        }
        const float* x = s.logits.data<float>();
        const float* lse = s.lse.data<float>();
        const float* dl = dlosses.data<float>();
        float* d = dlogits.data<float>();
        for (int64_t n = 0; n < N; ++n) {
            for (int64_t j = 0; j < V; ++j) d[n * V + j] = dl[n] * std::exp(x[n * V + j] - lse[n]);
            int64_t t = tgt[n] - begin_;
            if (t >= 0 && t < V) d[n * V + t] -= dl[n];
        }
        return dlogits;
    }
    void backward_weight(int64_t) override {}

    void discard(int64_t mb) override { saved_.erase(mb); }

  private:
    // Softmax cross-entropy over logits split by vocabulary: the row maximum first, then the
    // sums of exponentials and the target logits, reduced together.
    void split_forward(const Tensor& logits, const int32_t* tgt, Tensor& losses,
                       Tensor& lse) const {
        int64_t N = rows(logits), V = logits.dim(2);
        const float* x = logits.data<float>();
        Tensor row_max({N}), sums({2 * N});
        float* mx = row_max.data<float>();
        for (int64_t n = 0; n < N; ++n) {
            float m = x[n * V];
            for (int64_t j = 1; j < V; ++j) m = std::max(m, x[n * V + j]);
            mx[n] = m;
        }
        tp_.all_reduce(row_max, transport::ReduceOp::max);
        float* s = sums.data<float>();
        for (int64_t n = 0; n < N; ++n) {
            float e = 0.0f;
            for (int64_t j = 0; j < V; ++j) e += std::exp(x[n * V + j] - mx[n]);
            s[n] = e;
            int64_t t = tgt[n] - begin_;
            s[N + n] = t >= 0 && t < V ? x[n * V + t] : 0.0f;
        }
        tp_.all_reduce(sums);
        for (int64_t n = 0; n < N; ++n) {
            lse.data<float>()[n] = mx[n] + std::log(s[n]);
            losses.data<float>()[n] = lse.data<float>()[n] - s[N + n];
        }
    }

    struct Saved {
        Tensor logits, lse, targets;
    };
    TensorParallel tp_;
    int64_t vocab_, begin_;
    std::map<int64_t, Saved> saved_;
};

} // namespace

std::unique_ptr<Unit> make_embedding(const LayerSpec& l, UnitContext& ctx) {
    return std::make_unique<EmbeddingUnit>(l, ctx);
}
std::unique_ptr<Unit> make_position(const LayerSpec& l, UnitContext& ctx) {
    return std::make_unique<PositionUnit>(l, ctx);
}
std::unique_ptr<Unit> make_head(const LayerSpec& l, UnitContext& ctx) {
    return std::make_unique<HeadUnit>(l, ctx);
}
std::unique_ptr<Unit> make_loss(const LayerSpec& l, UnitContext& ctx) {
    return std::make_unique<LossUnit>(l, ctx);
}

} // namespace dist::models::detail
