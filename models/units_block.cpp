// units_block.cpp: the units inside a transformer block, norms, attention and the MLP, with
// the tensor-parallel split of Megatron-LM.
//
// Split over tp ranks, attention keeps heads [r H/tp, (r+1) H/tp) and the matching key/value
// heads (rows of the fused q/k/v weight in three places, columns of the output projection);
// the MLP keeps hidden units [r h/tp, (r+1) h/tp) (for SwiGLU, of the gate and of the up
// projection). Each rank computes a partial output projection and one all-reduce sums them
// (the bias is added once, after it); in backward the partial input gradients are summed the
// same way. Norms are replicated.
#include "models/unit_common.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace dist::models::detail {

// ----- sequence parallelism -----------------------------------------------------------------

Tensor SequenceParallel::gather(const Tensor& x, kernels::Backend& be) const {
    if (!on) return x;
    // The members' shards side by side, then each into its rows of every sequence.
    const int64_t B = x.dim(0), Tl = x.dim(1), inner = x.numel() / (B * Tl), n = x.numel();
    Tensor all = be.empty({size * n});
    group->all_gather(x.data<float>(), n, all.data<float>());
    std::vector<int64_t> shape = x.shape();
    shape[1] = Tl * size;
    Tensor y = be.empty(shape);
    for (int r = 0; r < size; ++r)
        be.copy_block(all.data<float>() + r * n, Tl * inner, y.data<float>() + r * Tl * inner,
                      Tl * size * inner, B, Tl * inner);
    return y;
}

Tensor SequenceParallel::finish(Tensor y, const TensorParallel& tp, kernels::Backend& be) const {
    if (!on) {
        tp.all_reduce(y);
        return y;
    }
    const int64_t B = y.dim(0), T = y.dim(1), inner = y.numel() / (B * T);
    if (T % size != 0)
        throw std::invalid_argument("sequence parallelism: " + std::to_string(T) +
                                    " tokens do not split over " + std::to_string(size) + " ranks");
    const int64_t Tl = T / size, n = B * Tl * inner;
    std::vector<int64_t> shape = y.shape();
    shape[1] = Tl;
    Tensor out = be.empty(shape);
    if (!tp.split) { // every rank holds the whole result: its slice
        be.copy_block(y.data<float>() + rank * Tl * inner, T * inner, out.data<float>(), Tl * inner,
                      B, Tl * inner);
        return out;
    }
    // Each member's tokens together, member by member, for the reduce-scatter.
    Tensor packed = be.empty({size * n});
    for (int r = 0; r < size; ++r)
        be.copy_block(y.data<float>() + r * Tl * inner, T * inner, packed.data<float>() + r * n,
                      Tl * inner, B, Tl * inner);
    group->reduce_scatter(packed.data<float>(), n, out.data<float>());
    return out;
}

Tensor ContextParallel::gather(const Tensor& x, kernels::Backend& be) const {
    const int64_t B = x.dim(0), T2 = x.dim(1), c = T2 / 2, inner = x.numel() / (B * T2);
    const int64_t n = x.numel(), T = T2 * size;
    Tensor all = be.empty({size * n});
    group->all_gather(x.data<float>(), n, all.data<float>());
    std::vector<int64_t> shape = x.shape();
    shape[1] = T;
    Tensor y = be.empty(shape);
    for (int r = 0; r < size; ++r)
        for (int h = 0; h < 2; ++h)
            be.copy_block(all.data<float>() + r * n + h * c * inner, T2 * inner,
                          y.data<float>() + chunk(h, r) * c * inner, T * inner, B, c * inner);
    return y;
}

Tensor ContextParallel::scatter_sum(const Tensor& x, kernels::Backend& be) const {
    const int64_t B = x.dim(0), T = x.dim(1), c = T / (2 * size), inner = x.numel() / (B * T);
    const int64_t n = B * 2 * c * inner;
    Tensor packed = be.empty({size * n});
    for (int r = 0; r < size; ++r)
        for (int h = 0; h < 2; ++h)
            be.copy_block(x.data<float>() + chunk(h, r) * c * inner, T * inner,
                          packed.data<float>() + r * n + h * c * inner, 2 * c * inner, B,
                          c * inner);
    std::vector<int64_t> shape = x.shape();
    shape[1] = 2 * c;
    Tensor out = be.empty(shape);
    group->reduce_scatter(packed.data<float>(), n, out.data<float>());
    return out;
}

// ----- linear -------------------------------------------------------------------------------

Tensor Linear::forward(const Tensor& x, bool add_bias) const {
    Tensor y = be->empty(with_last(x, out_features()));
    bf16.round(x);
    Tensor w = bf16.weights(*weight);
    Tensor b = bias && add_bias ? bf16.weights(*bias) : Tensor();
    be->matmul_forward(x.data<float>(), w.data<float>(), b.defined() ? b.data<float>() : nullptr,
                       rows(x), in_features(), out_features(), y.data<float>());
    bf16.round(y);
    return y;
}

void Linear::add_bias_to(Tensor& y) const {
    if (!bias) return;
    be->add_rows(bf16.weights(*bias).data<float>(), rows(y), out_features(), y.data<float>());
    bf16.round(y);
}

Tensor Linear::backward_input(const Tensor& dy) const {
    Tensor dx = be->zeros(with_last(dy, in_features()));
    bf16.round(dy);
    be->matmul_backward_input(dy.data<float>(), bf16.weights(*weight).data<float>(), rows(dy),
                              in_features(), out_features(), dx.data<float>());
    bf16.round(dx);
    return dx;
}

void Linear::backward_weight(const Tensor& dy, const Tensor& x) const {
    be->matmul_backward_weight(dy.data<float>(), x.data<float>(), rows(x), in_features(),
                               out_features(), weight->grad.data<float>(),
                               bias ? bias->grad.data<float>() : nullptr);
}

Linear make_linear(UnitContext& ctx, const std::string& name, int64_t in, int64_t out, bool bias,
                   double std, const Shard& shard) {
    Linear l;
    l.be = &ctx.device();
    l.bf16 = {l.be, ctx.bf16};
    l.weight =
        &ctx.params.add(name + ".weight", {out, in}, Init::normal(std), true, ctx.seed, shard);
    if (bias)
        l.bias = &ctx.params.add(name + ".bias", {out}, Init::zeros(), false, ctx.seed,
                                 shard.dim == 0 ? shard : Shard{});
    return l;
}

double residual_std(const UnitContext& ctx) {
    return 0.02 / std::sqrt(2.0 * static_cast<double>(ctx.layers));
}

namespace {

// ----- norms --------------------------------------------------------------------------------

class NormUnit : public Named {
  public:
    NormUnit(const LayerSpec& l, UnitContext& ctx)
        : Named(l.name, ctx), rms_(l.kind == LayerKind::rms_norm), eps_(l.eps) {
        weight_ = &ctx.params.add(l.name + ".weight", {l.width}, Init::ones(), false, ctx.seed);
        if (!rms_ && l.bias)
            bias_ = &ctx.params.add(l.name + ".bias", {l.width}, Init::zeros(), false, ctx.seed);
        // On a sequence shard the gradients are this rank's part of the group's sum.
        if (SequenceParallel(ctx).on) {
            weight_->sequence_partial = true;
            if (bias_) bias_->sequence_partial = true;
        }
    }
    Tensor forward(int64_t mb, const Tensor& x, const Batch&) override {
        int64_t N = rows(x), C = x.shape().back();
        Tensor y = be_.empty(x.shape()), mean = be_.empty({N}), rstd = be_.empty({N});
        Tensor w = bf16_.weights(*weight_), b = bias_ ? bf16_.weights(*bias_) : Tensor();
        if (rms_)
            be_.rmsnorm_forward(x.data<float>(), w.data<float>(), N, C, eps_, y.data<float>(),
                                rstd.data<float>());
        else
            be_.layernorm_forward(x.data<float>(), w.data<float>(),
                                  b.defined() ? b.data<float>() : nullptr, N, C, eps_,
                                  y.data<float>(), mean.data<float>(), rstd.data<float>());
        saved_[mb] = {bf16_.keep(x), mean, rstd, {}};
        return y;
    }
    Tensor backward_input(int64_t mb, const Tensor& dy) override {
        Saved& s = saved_.at(mb);
        Tensor x = bf16_.use(s.x), w = bf16_.weights(*weight_);
        int64_t N = rows(x), C = x.shape().back();
        Tensor dx = be_.zeros(x.shape());
        if (rms_)
            be_.rmsnorm_backward_input(dy.data<float>(), x.data<float>(), w.data<float>(),
                                       s.rstd.data<float>(), N, C, dx.data<float>());
        else
            be_.layernorm_backward_input(dy.data<float>(), x.data<float>(), w.data<float>(),
                                         s.mean.data<float>(), s.rstd.data<float>(), N, C,
                                         dx.data<float>());
        s.dy = bf16_.keep(dy);
        return dx;
    }
    void backward_weight(int64_t mb) override {
        Saved s = take(saved_, mb, "norm");
        Tensor x = bf16_.use(s.x), dy = bf16_.use(s.dy);
        int64_t N = rows(x), C = x.shape().back();
        if (rms_)
            be_.rmsnorm_backward_weight(dy.data<float>(), x.data<float>(), s.rstd.data<float>(), N,
                                        C, weight_->grad.data<float>());
        else
            be_.layernorm_backward_weight(dy.data<float>(), x.data<float>(), s.mean.data<float>(),
                                          s.rstd.data<float>(), N, C, weight_->grad.data<float>(),
                                          bias_ ? bias_->grad.data<float>() : nullptr);
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

// ----- attention ----------------------------------------------------------------------------

class AttentionUnit : public Named {
  public:
    AttentionUnit(const LayerSpec& l, UnitContext& ctx)
        : Named(l.name, ctx), tp_(ctx, l.shard == ShardDim::heads), sp_(ctx), cp_(ctx),
          D_(l.head_dim), theta_(ctx.rotary_theta) {
        auto [h0, h1] = tp_.part(l.heads);
        auto [k0, k1] = tp_.part(l.kv_heads);
        H_ = h1 - h0;
        KV_ = k1 - k0;
        int64_t D = D_, H = l.heads, KV = l.kv_heads;
        Shard rows, cols;
        if (tp_.split) {
            // The fused weight stacks all q heads, then all k heads, then all v heads.
            rows = {0,
                    {{h0 * D, h1 * D},
                     {(H + k0) * D, (H + k1) * D},
                     {(H + KV + k0) * D, (H + KV + k1) * D}}};
            cols = Shard::range(1, h0 * D, h1 * D);
        }
        qkv_ = make_linear(ctx, l.name + ".qkv", l.width, (H + 2 * KV) * D, l.bias, 0.02, rows);
        out_ = make_linear(ctx, l.name + ".out", H * D, l.width, l.bias, residual_std(ctx), cols);
    }

    Tensor forward(int64_t mb, const Tensor& shard, const Batch& batch) override {
        if (cp_.on) return forward_cp(mb, shard);
        (void)batch;
        Tensor x = sp_.gather(shard, be_);
        int64_t B = x.dim(0), T = x.dim(1);
        Tensor qkv = qkv_.forward(x);
        Tensor q = be_.empty({B, T, H_, D_}), k = be_.empty({B, T, KV_, D_}),
               v = be_.empty({B, T, KV_, D_});
        split(qkv, q, k, v);
        if (theta_ > 0) {
            be_.rope_forward(q.data<float>(), B, T, H_, D_, theta_, 0, q.data<float>());
            be_.rope_forward(k.data<float>(), B, T, KV_, D_, theta_, 0, k.data<float>());
            bf16_.round(q);
            bf16_.round(k);
        }
        Tensor a = be_.empty({B, T, H_ * D_}), lse = be_.empty({B, H_, T});
        be_.attention_forward(q.data<float>(), k.data<float>(), v.data<float>(), B, T, H_, KV_, D_,
                              a.data<float>(), lse.data<float>());
        Tensor y = out_.forward_row_parallel(a, tp_, &sp_); // rounds a first when bf16 is on
        // With sp the input is kept as this rank's shard and gathered again for the backward
        // (Megatron-LM's choice: one more all-gather for 1/tp of the memory).
        saved_[mb] = {bf16_.keep(sp_.on ? shard : x),
                      bf16_.keep(q),
                      bf16_.keep(k),
                      bf16_.keep(v),
                      bf16_.keep(a),
                      lse,
                      {},
                      {}};
        return y;
    }

    Tensor backward_input(int64_t mb, const Tensor& dy_shard) override {
        if (cp_.on) return backward_cp(mb, dy_shard);
        Saved& s = saved_.at(mb);
        Tensor dy = sp_.gather(dy_shard, be_);
        Tensor x = sp_.gather(bf16_.use(s.x), be_); // the weight gradient's input, whole
        Tensor q = bf16_.use(s.q), k = bf16_.use(s.k), v = bf16_.use(s.v), a = bf16_.use(s.a);
        int64_t B = x.dim(0), T = x.dim(1);
        Tensor da = out_.backward_input(dy);
        Tensor dq = be_.zeros(q.shape()), dk = be_.zeros(k.shape()), dv = be_.zeros(v.shape());
        be_.attention_backward(da.data<float>(), q.data<float>(), k.data<float>(), v.data<float>(),
                               a.data<float>(), s.lse.data<float>(), B, T, H_, KV_, D_,
                               dq.data<float>(), dk.data<float>(), dv.data<float>());
        Tensor dqkv = be_.empty({B, T, (H_ + 2 * KV_) * D_});
        if (theta_ > 0) {
            Tensor rq = be_.zeros(dq.shape()), rk = be_.zeros(dk.shape());
            be_.rope_backward(dq.data<float>(), B, T, H_, D_, theta_, 0, rq.data<float>());
            be_.rope_backward(dk.data<float>(), B, T, KV_, D_, theta_, 0, rk.data<float>());
            dq = rq;
            dk = rk;
        }
        join(dq, dk, dv, dqkv);
        bf16_.round(dqkv);
        Tensor dx = sp_.finish(qkv_.backward_input(dqkv), tp_, be_);
        s.q = s.k = s.v = Tensor(); // no longer needed
        s.x = bf16_.keep(x);
        s.dy = bf16_.keep(dy);
        s.dqkv = bf16_.keep(dqkv);
        return dx;
    }

    void backward_weight(int64_t mb) override {
        Saved s = take(saved_, mb, "attention");
        out_.backward_weight(bf16_.use(s.dy), bf16_.use(s.a));
        qkv_.backward_weight(bf16_.use(s.dqkv), bf16_.use(s.x));
        ring_.erase(mb);
    }

    void discard(int64_t mb) override {
        saved_.erase(mb);
        ring_.erase(mb);
    }

    Tensor infer(const Tensor& x, const Batch&, const InferContext& ctx) override {
        check_host("attention with a key/value cache");
        int64_t B = x.dim(0), T = x.dim(1);
        Tensor qkv = qkv_.forward(x);
        Tensor q({B, T, H_, D_}), k({B, T, KV_, D_}), v({B, T, KV_, D_});
        split(qkv, q, k, v);
        Cache& cache = caches_[ctx.session];
        if (cache.keys.empty()) cache.keys.resize(static_cast<size_t>(B));
        if (cache.values.empty()) cache.values.resize(static_cast<size_t>(B));
        if (cache.length != ctx.pos0 || static_cast<int64_t>(cache.keys.size()) != B)
            throw std::logic_error("key/value cache of " + std::to_string(cache.length) +
                                   " tokens extended at position " + std::to_string(ctx.pos0));
        const int64_t row_q = H_ * D_, row_kv = KV_ * D_;
        for (int64_t b = 0; b < B; ++b) {
            if (theta_ > 0) {
                // Rotary positions count from the row's first real token.
                int64_t p0 = ctx.pos0 - ctx.start(b);
                float* qb = q.data<float>() + b * T * row_q;
                float* kb = k.data<float>() + b * T * row_kv;
                be_.rope_forward(qb, 1, T, H_, D_, theta_, p0, qb);
                be_.rope_forward(kb, 1, T, KV_, D_, theta_, p0, kb);
            }
            auto& K = cache.keys[static_cast<size_t>(b)];
            auto& V = cache.values[static_cast<size_t>(b)];
            K.insert(K.end(), k.data<float>() + b * T * row_kv,
                     k.data<float>() + (b + 1) * T * row_kv);
            V.insert(V.end(), v.data<float>() + b * T * row_kv,
                     v.data<float>() + (b + 1) * T * row_kv);
        }
        cache.length += T;
        // Each new token attends to the cached keys up to its own position, from the row's
        // first real token: softmax(q k / sqrt(D)) v, one row at a time.
        Tensor a({B, T, H_ * D_});
        const float scale = 1.0f / std::sqrt(static_cast<float>(D_));
        const int64_t group = H_ / KV_;
        std::vector<float> scores;
        for (int64_t b = 0; b < B; ++b) {
            const auto& K = cache.keys[static_cast<size_t>(b)];
            const auto& V = cache.values[static_cast<size_t>(b)];
            for (int64_t t = 0; t < T; ++t) {
                int64_t p = ctx.pos0 + t, j0 = std::min(ctx.start(b), p);
                scores.assign(static_cast<size_t>(p + 1 - j0), 0.0f);
                for (int64_t h = 0; h < H_; ++h) {
                    const float* qh = q.data<float>() + (b * T + t) * row_q + h * D_;
                    int64_t kvh = h / group;
                    float mx = -INFINITY;
                    for (int64_t j = j0; j <= p; ++j) {
                        const float* kj = K.data() + j * row_kv + kvh * D_;
                        float s = 0.0f;
                        for (int64_t d = 0; d < D_; ++d) s += qh[d] * kj[d];
                        scores[static_cast<size_t>(j - j0)] = s * scale;
                        mx = std::max(mx, s * scale);
                    }
                    float total = 0.0f;
                    for (auto& s : scores) total += (s = std::exp(s - mx));
                    float* out = a.data<float>() + (b * T + t) * row_q + h * D_;
                    for (int64_t d = 0; d < D_; ++d) out[d] = 0.0f;
                    for (int64_t j = j0; j <= p; ++j) {
                        float w = scores[static_cast<size_t>(j - j0)] / total;
                        const float* vj = V.data() + j * row_kv + kvh * D_;
                        for (int64_t d = 0; d < D_; ++d) out[d] += w * vj[d];
                    }
                }
            }
        }
        return out_.forward_row_parallel(a, tp_);
    }
    void end_session(int64_t session) override { caches_.erase(session); }

  private:
    // ----- context parallelism: the two local chunks against every rank's keys and values --
    //
    // Every rank's keys and values are gathered in sequence order (the same bytes a ring passes
    // around, in one collective). Local chunk j, of queries at positions [j c, (j+1) c), needs
    // the keys of positions [0, (j+1) c): it runs the causal attention of length L = (j+1) c with
    // its queries in the last c rows and zeros above them, whose rows are dropped (and, with a
    // zero output gradient, give no gradient to anything). Key and value gradients are summed
    // over the group back to the ranks that hold those positions.
    struct Half {
        Tensor a, lse; // (B, L, H D) and (B, H, L) of the padded attention
    };
    struct Ring {
        Tensor keys, values; // (B, T, KV, D), rotary positions applied
        Half half[2];
    };

    // Rotary positions of the two local chunks, in place (backward: into `out`).
    void rope_chunks(float* x, int64_t B, int64_t heads, bool backward, float* out) const {
        const int64_t c = chunk_tokens_, row = heads * D_;
        for (int64_t b = 0; b < B; ++b)
            for (int h = 0; h < 2; ++h) {
                int64_t at = (b * 2 * c + h * c) * row;
                if (backward)
                    be_.rope_backward(x + at, 1, c, heads, D_, theta_, cp_.chunk(h) * c, out + at);
                else
                    be_.rope_forward(x + at, 1, c, heads, D_, theta_, cp_.chunk(h) * c, x + at);
            }
    }

    // Rows [0, L) of every sequence of `whole` (B, T, inner), or the local half h of `local`
    // (B, 2c, inner) in the last c of L rows of zeros.
    Tensor prefix(const Tensor& whole, int64_t L) const {
        const int64_t B = whole.dim(0), T = whole.dim(1), inner = whole.numel() / (B * T);
        Tensor out = be_.empty({B, L, inner});
        be_.copy_block(whole.data<float>(), T * inner, out.data<float>(), L * inner, B, L * inner);
        return out;
    }
    Tensor padded(const Tensor& local, int h, int64_t L) const {
        const int64_t B = local.dim(0), c = chunk_tokens_, inner = local.numel() / (B * 2 * c);
        Tensor out = be_.zeros({B, L, inner});
        be_.copy_block(local.data<float>() + h * c * inner, 2 * c * inner,
                       out.data<float>() + (L - c) * inner, L * inner, B, c * inner);
        return out;
    }
    // The last c rows of `full` (B, L, inner) into local half h of `local` (B, 2c, inner).
    void unpad(const Tensor& full, int h, Tensor& local) const {
        const int64_t B = full.dim(0), L = full.dim(1), c = chunk_tokens_,
                      inner = full.numel() / (B * L);
        be_.copy_block(full.data<float>() + (L - c) * inner, L * inner,
                       local.data<float>() + h * c * inner, 2 * c * inner, B, c * inner);
    }

    Tensor forward_cp(int64_t mb, const Tensor& shard) {
        Tensor x = sp_.gather(shard, be_); // with sp, the local tokens from the tp group
        const int64_t B = x.dim(0), T2 = x.dim(1);
        chunk_tokens_ = T2 / 2;
        Tensor qkv = qkv_.forward(x);
        Tensor q = be_.empty({B, T2, H_, D_}), k = be_.empty({B, T2, KV_, D_}),
               v = be_.empty({B, T2, KV_, D_});
        split(qkv, q, k, v);
        if (theta_ > 0) {
            rope_chunks(q.data<float>(), B, H_, false, nullptr);
            rope_chunks(k.data<float>(), B, KV_, false, nullptr);
            bf16_.round(q);
            bf16_.round(k);
        }
        Ring ring{cp_.gather(k, be_), cp_.gather(v, be_), {}};
        Tensor a = be_.empty({B, T2, H_ * D_});
        for (int h = 0; h < 2; ++h) {
            const int64_t L = (cp_.chunk(h) + 1) * chunk_tokens_;
            Tensor qp = padded(q, h, L), kp = prefix(ring.keys, L), vp = prefix(ring.values, L);
            Half& half = ring.half[h];
            half.a = be_.empty({B, L, H_ * D_});
            half.lse = be_.empty({B, H_, L});
            be_.attention_forward(qp.data<float>(), kp.data<float>(), vp.data<float>(), B, L, H_,
                                  KV_, D_, half.a.data<float>(), half.lse.data<float>());
            unpad(half.a, h, a);
        }
        Tensor y = out_.forward_row_parallel(a, tp_, &sp_); // rounds a first when bf16 is on
        for (Half& half : ring.half) half.a = bf16_.keep(half.a);
        ring.keys = bf16_.keep(ring.keys);
        ring.values = bf16_.keep(ring.values);
        saved_[mb] = {
            bf16_.keep(sp_.on ? shard : x), bf16_.keep(q), {}, {}, bf16_.keep(a), {}, {}, {}};
        ring_[mb] = std::move(ring);
        return y;
    }

    Tensor backward_cp(int64_t mb, const Tensor& dy_shard) {
        Saved& s = saved_.at(mb);
        Ring& ring = ring_.at(mb);
        Tensor dy = sp_.gather(dy_shard, be_);
        Tensor x = sp_.gather(bf16_.use(s.x), be_);
        const Tensor q = bf16_.use(s.q), keys = bf16_.use(ring.keys),
                     values = bf16_.use(ring.values);
        const int64_t B = x.dim(0), T2 = x.dim(1), T = keys.dim(1);
        Tensor da = out_.backward_input(dy);
        Tensor dq = be_.empty({B, T2, H_, D_});
        Tensor dkeys = be_.zeros({B, T, KV_, D_}), dvalues = be_.zeros({B, T, KV_, D_});
        const int64_t kv_row = KV_ * D_;
        for (int h = 0; h < 2; ++h) {
            const int64_t L = (cp_.chunk(h) + 1) * chunk_tokens_;
            Tensor qp = padded(q, h, L), kp = prefix(keys, L), vp = prefix(values, L);
            Tensor dap = padded(da, h, L);
            Tensor dqp = be_.zeros(qp.shape()), dkp = be_.zeros(kp.shape()),
                   dvp = be_.zeros(vp.shape());
            const Half& half = ring.half[h];
            const Tensor half_a = bf16_.use(half.a);
            be_.attention_backward(dap.data<float>(), qp.data<float>(), kp.data<float>(),
                                   vp.data<float>(), half_a.data<float>(), half.lse.data<float>(),
                                   B, L, H_, KV_, D_, dqp.data<float>(), dkp.data<float>(),
                                   dvp.data<float>());
            unpad(dqp, h, dq);
            for (int64_t b = 0; b < B; ++b) {
                float* dk = dkeys.data<float>() + b * T * kv_row;
                float* dv = dvalues.data<float>() + b * T * kv_row;
                be_.add(dk, dkp.data<float>() + b * L * kv_row, L * kv_row, dk);
                be_.add(dv, dvp.data<float>() + b * L * kv_row, L * kv_row, dv);
            }
        }
        ring_.erase(mb);
        Tensor dk = cp_.scatter_sum(dkeys, be_), dv = cp_.scatter_sum(dvalues, be_);
        if (theta_ > 0) {
            Tensor rq = be_.zeros(dq.shape()), rk = be_.zeros(dk.shape());
            rope_chunks(dq.data<float>(), B, H_, true, rq.data<float>());
            rope_chunks(dk.data<float>(), B, KV_, true, rk.data<float>());
            dq = rq;
            dk = rk;
        }
        Tensor dqkv = be_.empty({B, T2, (H_ + 2 * KV_) * D_});
        join(dq, dk, dv, dqkv);
        bf16_.round(dqkv);
        Tensor dx = sp_.finish(qkv_.backward_input(dqkv), tp_, be_);
        s.q = Tensor(); // no longer needed
        s.x = bf16_.keep(x);
        s.dy = bf16_.keep(dy);
        s.dqkv = bf16_.keep(dqkv);
        return dx;
    }

    struct Cache {
        int64_t length = 0;
        std::vector<std::vector<float>> keys, values; // per row: (length, KV, D)
    };
    std::map<int64_t, Cache> caches_;

    // (B,T,(H+2KV)D) rows into q (B,T,H,D), k and v (B,T,KV,D).
    void split(const Tensor& qkv, Tensor& q, Tensor& k, Tensor& v) const {
        int64_t n = rows(qkv), row = (H_ + 2 * KV_) * D_;
        const float* src = qkv.data<float>();
        be_.copy_block(src, row, q.data<float>(), H_ * D_, n, H_ * D_);
        be_.copy_block(src + H_ * D_, row, k.data<float>(), KV_ * D_, n, KV_ * D_);
        be_.copy_block(src + (H_ + KV_) * D_, row, v.data<float>(), KV_ * D_, n, KV_ * D_);
    }
    void join(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& qkv) const {
        int64_t n = rows(qkv), row = (H_ + 2 * KV_) * D_;
        float* dst = qkv.data<float>();
        be_.copy_block(q.data<float>(), H_ * D_, dst, row, n, H_ * D_);
        be_.copy_block(k.data<float>(), KV_ * D_, dst + H_ * D_, row, n, KV_ * D_);
        be_.copy_block(v.data<float>(), KV_ * D_, dst + (H_ + KV_) * D_, row, n, KV_ * D_);
    }

    struct Saved {
        Tensor x, q, k, v, a, lse, dy, dqkv;
    };
    TensorParallel tp_;
    SequenceParallel sp_;
    ContextParallel cp_;
    std::map<int64_t, Ring> ring_;
    int64_t chunk_tokens_ = 0;
    int64_t H_ = 0, KV_ = 0, D_;
    double theta_;
    Linear qkv_, out_;
    std::map<int64_t, Saved> saved_;
};

// ----- MLP ----------------------------------------------------------------------------------

} // namespace

MlpLinears make_mlp_linears(UnitContext& ctx, const std::string& name, int64_t width,
                            int64_t hidden, Activation act, bool bias, const TensorParallel& tp) {
    auto [h0, h1] = tp.part(hidden);
    const bool glu = act == Activation::swiglu;
    Shard rows, cols;
    if (tp.split) {
        rows = glu ? Shard{0, {{h0, h1}, {hidden + h0, hidden + h1}}} : Shard::range(0, h0, h1);
        cols = Shard::range(1, h0, h1);
    }
    MlpLinears m;
    m.fc = make_linear(ctx, name + ".fc", width, glu ? 2 * hidden : hidden, bias, 0.02, rows);
    m.proj = make_linear(ctx, name + ".proj", hidden, width, bias, residual_std(ctx), cols);
    m.local_hidden = h1 - h0;
    return m;
}

Tensor activation_forward(kernels::Backend& be, Activation act, const Tensor& h, int64_t hidden,
                          Tensor& th) {
    Tensor g = be.empty(with_last(h, hidden));
    const float* in = h.data<float>();
    float* out = g.data<float>();
    const int64_t n = h.numel();
    switch (act) {
    case Activation::swiglu: be.swiglu_forward(in, rows(h), hidden, out); break;
    case Activation::gelu_tanh:
        th = be.empty(h.shape());
        be.gelu_forward_keeping(in, n, out, th.data<float>());
        break;
    case Activation::gelu: be.gelu_erf_forward(in, n, out); break;
    case Activation::relu: be.relu_forward(in, n, out); break;
    }
    return g;
}

Tensor activation_backward(kernels::Backend& be, Activation act, const Tensor& h, const Tensor& th,
                           const Tensor& dg, int64_t hidden) {
    // Written whole by GELU's backward; the others accumulate into zeros.
    Tensor dh = act == Activation::gelu_tanh ? be.empty(h.shape()) : be.zeros(h.shape());
    const float* in = h.data<float>();
    float* out = dh.data<float>();
    const int64_t n = h.numel();
    switch (act) {
    case Activation::swiglu: be.swiglu_backward(in, dg.data<float>(), rows(h), hidden, out); break;
    case Activation::gelu_tanh:
        be.gelu_backward_kept(in, th.data<float>(), dg.data<float>(), n, out);
        break;
    case Activation::gelu: be.gelu_erf_backward(in, dg.data<float>(), n, out); break;
    case Activation::relu: be.relu_backward(in, dg.data<float>(), n, out); break;
    }
    return dh;
}

namespace {

// activation_backward from the bf16 copy of its input h that a bf16 MLP keeps: a block of rows
// at a time from a float copy of the block, so that no float copy of the whole (N, hidden)
// input is alive beside its bf16 one. GPT-2's GELU computes its tanh again from the block
// rather than keeping it (as llm.c does), so a bf16 MLP keeps what Korthikanti et al. count.
Tensor activation_backward_kept(const Bf16& bf16, Activation act, const Tensor& h, const Tensor& dg,
                                int64_t hidden) {
    kernels::Backend& be = *bf16.be;
    const int64_t N = rows(h), W = h.shape().back(), G = dg.shape().back();
    const int64_t block = std::max<int64_t>(1, (int64_t{1} << 16) / W);
    Tensor dh = be.empty(h.shape());
    for (int64_t r = 0; r < N; r += block) {
        const int64_t n = std::min(block, N - r);
        Tensor hb = be.empty({n, W}), thb, dgb = be.empty({n, G});
        be.from_bf16(h.data<uint16_t>() + r * W, n * W, hb.data<float>());
        if (act == Activation::gelu_tanh) {
            Tensor out = be.empty({n, W});
            thb = be.empty({n, W});
            be.gelu_forward_keeping(hb.data<float>(), n * W, out.data<float>(), thb.data<float>());
        }
        be.copy_block(dg.data<float>() + r * G, G, dgb.data<float>(), G, n, G);
        Tensor d = activation_backward(be, act, hb, thb, dgb, hidden);
        be.copy_block(d.data<float>(), W, dh.data<float>() + r * W, W, n, W);
    }
    return dh;
}

class MlpUnit : public Named {
  public:
    MlpUnit(const LayerSpec& l, UnitContext& ctx)
        : Named(l.name, ctx), tp_(ctx, l.shard == ShardDim::hidden), sp_(ctx), act_(l.activation) {
        MlpLinears m = make_mlp_linears(ctx, l.name, l.width, l.hidden, act_, l.bias, tp_);
        fc_ = m.fc;
        proj_ = m.proj;
        hidden_ = m.local_hidden;
    }

    Tensor forward(int64_t mb, const Tensor& shard, const Batch&) override {
        Tensor x = sp_.gather(shard, be_);
        Tensor h = fc_.forward(x);
        Tensor th;
        Tensor g = activation_forward(be_, act_, h, hidden_, th);
        // Kept as attention keeps its input; with bf16 each float tensor goes as soon as its
        // bf16 copy is made, so that at most a few are alive at once.
        Saved s{bf16_.keep(sp_.on ? shard : x), bf16_.keep(h), {}, {}, {},
                bf16_.on ? Tensor() : th};
        h = th = Tensor();
        Tensor y = proj_.forward_row_parallel(g, tp_, &sp_); // rounds g first when bf16 is on
        s.g = bf16_.keep(g);
        saved_[mb] = std::move(s);
        return y;
    }

    Tensor backward_input(int64_t mb, const Tensor& dy_shard) override {
        Saved& s = saved_.at(mb);
        Tensor dy = sp_.gather(dy_shard, be_);
        Tensor dg = proj_.backward_input(dy);
        Tensor dh = bf16_.on ? activation_backward_kept(bf16_, act_, s.h, dg, hidden_)
                             : activation_backward(be_, act_, s.h, s.th, dg, hidden_);
        dg = Tensor();
        s.h = s.th = Tensor(); // no longer needed
        bf16_.round(dh);
        Tensor x = sp_.gather(bf16_.use(s.x), be_);
        Tensor dx = sp_.finish(fc_.backward_input(dh), tp_, be_);
        s.x = bf16_.keep(x);
        s.dy = bf16_.keep(dy);
        s.dh = bf16_.keep(dh);
        return dx;
    }

    void backward_weight(int64_t mb) override {
        Saved s = take(saved_, mb, "mlp");
        proj_.backward_weight(bf16_.use(s.dy), bf16_.use(s.g));
        fc_.backward_weight(bf16_.use(s.dh), bf16_.use(s.x));
    }

    void discard(int64_t mb) override { saved_.erase(mb); }

  private:
    struct Saved {
        Tensor x, h, g, dy, dh, th;
    };
    TensorParallel tp_;
    SequenceParallel sp_;
    Activation act_;
    int64_t hidden_ = 0;
    Linear fc_, proj_;
    std::map<int64_t, Saved> saved_;
};

} // namespace

std::unique_ptr<Unit> make_norm(const LayerSpec& l, UnitContext& ctx) {
    return std::make_unique<NormUnit>(l, ctx);
}
std::unique_ptr<Unit> make_attention(const LayerSpec& l, UnitContext& ctx) {
    return std::make_unique<AttentionUnit>(l, ctx);
}
std::unique_ptr<Unit> make_mlp(const LayerSpec& l, UnitContext& ctx) {
    return std::make_unique<MlpUnit>(l, ctx);
}

} // namespace dist::models::detail
