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

// Tokens on a device were checked on the host before they were copied there (the runtime
// copies only batches of its data, whose tokens the loader checked against the vocabulary).
void check_tokens(const Tensor& tokens, int64_t vocab, const char* what) {
    if (tokens.device().kind != kernels::Device::Kind::cpu) return;
    const int32_t* tok = tokens.data<int32_t>();
    for (int64_t i = 0; i < tokens.numel(); ++i)
        if (tok[i] < 0 || tok[i] >= vocab)
            throw std::out_of_range(std::string(what) + " " + std::to_string(tok[i]) +
                                    " is outside the vocabulary of " + std::to_string(vocab));
}

class EmbeddingUnit : public Named {
  public:
    EmbeddingUnit(const LayerSpec& l, UnitContext& ctx)
        : Named(l.name, ctx), tp_(ctx, l.shard == ShardDim::vocab), sp_(ctx), vocab_(l.vocab) {
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
        Tensor y = be_.empty({tokens.dim(0), tokens.dim(1), C});
        if (!tp_.split)
            be_.embedding_forward(tok, table, N, C, y.data<float>());
        else
            be_.embedding_forward_part(tok, table, N, C, begin_, rows_, y.data<float>());
        saved_[mb].tokens = tokens;
        // The group's sum of the vocabulary slices (or, with sp, this rank's tokens of it).
        return sp_.finish(y, tp_, be_);
    }
    Tensor backward_input(int64_t mb, const Tensor& dy) override {
        saved_.at(mb).dy = bf16_.keep(sp_.gather(dy, be_)); // every token's gradient, for its row
        return {};
    }
    void backward_weight(int64_t mb) override {
        Saved s = take(saved_, mb, "embedding");
        s.dy = bf16_.use(s.dy);
        int64_t C = weight_->shape[1], N = s.tokens.numel();
        const int32_t* tok = s.tokens.data<int32_t>();
        if (!tp_.split)
            be_.embedding_backward(tok, s.dy.data<float>(), N, C, weight_->grad.data<float>());
        else
            be_.embedding_backward_part(tok, s.dy.data<float>(), N, C, begin_, rows_,
                                        weight_->grad.data<float>());
    }

    void discard(int64_t mb) override { saved_.erase(mb); }

  private:
    struct Saved {
        Tensor tokens, dy;
    };
    TensorParallel tp_;
    SequenceParallel sp_;
    int64_t vocab_, begin_ = 0, rows_ = 0;
    Parameter* weight_;
    std::map<int64_t, Saved> saved_;
};

class PositionUnit : public Named {
  public:
    PositionUnit(const LayerSpec& l, UnitContext& ctx) : Named(l.name, ctx), sp_(ctx), cp_(ctx) {
        weight_ = &ctx.params.add(l.name + ".weight", {l.context, l.width}, Init::normal(0.02),
                                  true, ctx.seed);
        weight_->sequence_partial = sp_.on;
    }
    Tensor forward(int64_t mb, const Tensor& x, const Batch&) override {
        const int64_t B = x.dim(0), T = x.dim(1), C = x.dim(2);
        std::vector<Run> runs = runs_of(T);
        for (const Run& r : runs)
            if (r.position + r.count > weight_->value.dim(0))
                throw std::out_of_range("sequence of " + std::to_string(r.position + r.count) +
                                        " tokens is longer than the context of " +
                                        std::to_string(weight_->value.dim(0)));
        Tensor y = x.clone(), wpe = bf16_.weights(*weight_);
        for (const Run& r : runs)
            for (int64_t b = 0; b < (runs.size() == 1 ? 1 : B); ++b)
                be_.positions_forward(wpe.data<float>() + r.position * C, runs.size() == 1 ? B : 1,
                                      r.count, C, y.data<float>() + (b * T + r.token) * C);
        runs_[mb] = runs;
        return y;
    }
    Tensor backward_input(int64_t mb, const Tensor& dy) override {
        saved_[mb] = bf16_.keep(dy);
        return dy;
    }
    Tensor infer(const Tensor& x, const Batch&, const InferContext& ctx) override {
        check_host("positions of a generation");
        int64_t B = x.dim(0), T = x.dim(1), C = x.dim(2), context = weight_->value.dim(0);
        Tensor y = x.clone(), table = bf16_.weights(*weight_);
        const float* wpe = table.data<float>();
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
        Tensor dy = bf16_.use(take(saved_, mb, "positions"));
        std::vector<Run> runs = take(runs_, mb, "positions");
        const int64_t B = dy.dim(0), T = dy.dim(1), C = dy.dim(2);
        for (const Run& r : runs)
            for (int64_t b = 0; b < (runs.size() == 1 ? 1 : B); ++b)
                be_.positions_backward(dy.data<float>() + (b * T + r.token) * C,
                                       runs.size() == 1 ? B : 1, r.count, C,
                                       weight_->grad.data<float>() + r.position * C);
    }

    void discard(int64_t mb) override {
        saved_.erase(mb);
        runs_.erase(mb);
    }

  private:
    // Tokens [token, token + count) of each sequence sit at positions [position, + count).
    struct Run {
        int64_t position, token, count;
    };
    // x's T tokens of each sequence: with cp this rank's two chunks side by side, and of those
    // (or of the whole sequence) with sp the tp rank's 1/tp.
    std::vector<Run> runs_of(int64_t T) const {
        const int64_t first = sp_.on ? sp_.rank * T : 0; // in the rank's local tokens
        if (!cp_.on) return {{first, 0, T}};
        const int64_t c = (sp_.on ? T * sp_.size : T) / 2;
        std::vector<Run> out;
        for (int h = 0; h < 2; ++h) {
            int64_t a = std::max(first, h * c), b = std::min(first + T, (h + 1) * c);
            if (a < b) out.push_back({cp_.chunk(h) * c + (a - h * c), a - first, b - a});
        }
        return out;
    }

    SequenceParallel sp_;
    ContextParallel cp_;
    Parameter* weight_;
    std::map<int64_t, Tensor> saved_;
    std::map<int64_t, std::vector<Run>> runs_;
};

class HeadUnit : public Named {
  public:
    HeadUnit(const LayerSpec& l, UnitContext& ctx) : Named(l.name, ctx), tp_(ctx, false), sp_(ctx) {
        Shard shard;
        if (l.tied) {
            if (!ctx.embedding) throw std::logic_error("tied head without an embedding");
            // A tied head is split exactly as the embedding it shares.
            head_.weight = ctx.embedding;
            head_.be = &ctx.device();
            head_.bf16 = {head_.be, ctx.bf16};
            shard = ctx.embedding->shard;
            tp_.split = !shard.whole();
        } else {
            tp_ = TensorParallel(ctx, l.shard == ShardDim::vocab);
            auto [begin, end] = tp_.part(l.vocab);
            if (tp_.split) shard = Shard::range(0, begin, end);
            head_.weight = &ctx.params.add(l.name + ".weight", {l.vocab, l.width},
                                           Init::normal(0.02), true, ctx.seed, shard);
            head_.be = &ctx.device();
            head_.bf16 = {head_.be, ctx.bf16};
        }
        if (l.bias)
            head_.bias =
                &ctx.params.add(l.name + ".bias", {l.vocab}, Init::zeros(), false, ctx.seed, shard);
        ctx.logits_vocab = l.vocab;
        ctx.logits_begin = shard.whole() ? 0 : shard.ranges.at(0).first;
        ctx.logits_size = head_.out_features();
    }
    Tensor forward(int64_t mb, const Tensor& shard, const Batch&) override {
        Tensor x = sp_.gather(shard, be_); // the loss takes every token's logits
        Tensor y = head_.forward(x);       // rounds x first when bf16 is on
        saved_[mb].x = bf16_.keep(x);
        return y;
    }
    Tensor backward_input(int64_t mb, const Tensor& dy) override {
        Tensor dx = sp_.finish(head_.backward_input(dy), tp_, be_);
        saved_.at(mb).dy = bf16_.keep(dy);
        return dx;
    }
    void backward_weight(int64_t mb) override {
        Saved s = take(saved_, mb, "lm_head");
        head_.backward_weight(bf16_.use(s.dy), bf16_.use(s.x));
    }

    void discard(int64_t mb) override { saved_.erase(mb); }

  private:
    struct Saved {
        Tensor x, dy;
    };
    TensorParallel tp_;
    SequenceParallel sp_;
    Linear head_;
    std::map<int64_t, Saved> saved_;
};

class LossUnit : public Named {
  public:
    LossUnit(const LayerSpec& l, const UnitContext& ctx)
        : Named(l.name, ctx), tp_(ctx, ctx.logits_size != ctx.logits_vocab),
          vocab_(ctx.logits_vocab), begin_(ctx.logits_begin) {}

    Tensor forward(int64_t mb, const Tensor& logits, const Batch& batch) override {
        int64_t B = logits.dim(0), T = logits.dim(1), V = logits.dim(2);
        Tensor losses = be_.empty({B, T}), lse = be_.empty({B * T});
        check_tokens(batch.targets, tp_.split ? vocab_ : V, "target token");
        const int32_t* tgt = batch.targets.data<int32_t>();
        if (tp_.split)
            split_forward(logits, tgt, losses, lse);
        else
            be_.cross_entropy_forward(logits.data<float>(), tgt, B * T, V, losses.data<float>(),
                                      lse.data<float>());
        saved_[mb] = {bf16_.keep(logits), lse, batch.targets};
        return losses;
    }
    Tensor backward_input(int64_t mb, const Tensor& dlosses) override {
        Saved s = take(saved_, mb, "cross_entropy");
        s.logits = bf16_.use(s.logits);
        int64_t N = rows(s.logits), V = s.logits.dim(2);
        Tensor dlogits = be_.empty(s.logits.shape());
        const int32_t* tgt = s.targets.data<int32_t>();
        if (!tp_.split) {
            be_.cross_entropy_backward(s.logits.data<float>(), tgt, s.lse.data<float>(),
                                       dlosses.data<float>(), N, V, dlogits.data<float>());
            return dlogits;
        }
        be_.cross_entropy_part_backward(s.logits.data<float>(), tgt, s.lse.data<float>(),
                                        dlosses.data<float>(), N, V, begin_, dlogits.data<float>());
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
        Tensor row_max = be_.empty({N}), sums = be_.empty({2 * N});
        be_.row_max(x, N, V, row_max.data<float>());
        tp_.all_reduce(row_max, transport::ReduceOp::max);
        be_.cross_entropy_part_sums(x, tgt, row_max.data<float>(), N, V, begin_,
                                    sums.data<float>());
        tp_.all_reduce(sums);
        be_.cross_entropy_part_finish(row_max.data<float>(), sums.data<float>(), N,
                                      lse.data<float>(), losses.data<float>());
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
