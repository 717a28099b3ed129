// units_moe.cpp: the `moe` layer, a routed mixture of experts, with expert parallelism.
//
// For the N tokens of a microbatch on this rank (whole sequences under sequence parallelism):
// the router scores every expert, softmax or sigmoid of x R^T; each token takes its top_k
// experts (ties to the lower index), weighted by their scores, rescaled to sum to 1 when
// `normalize`. Copies are admitted in token order and, within a token, best first; with a
// capacity factor c an expert admits at most ceil(c N top_k / E) of them, and a copy beyond is
// dropped: it adds nothing, and its score stays in the normalisation. Experts are MLPs of the
// layer's activation without bias; the shared experts are one such MLP of shared x
// shared_hidden units (S MLPs summed are one MLP with their hidden units side by side).
//
// Expert parallelism: rank g of the ep group owns experts [g E/ep, (g+1) E/ep). The copies are
// packed expert by expert (so owner by owner), sent by one all-to-all (dispatch), computed by
// their owners, and sent back by another (combine); the backward sends the copies' output
// gradients the same way and returns their input gradients. Each rank routes its own tokens,
// so routing, drops and the auxiliary loss are the same for every ep.
//
// Tensor parallelism splits every expert's hidden units as it splits an `mlp`: each rank
// computes partial outputs, summed once for the whole layer (all-reduce, or reduce-scatter under
// sequence parallelism). The router is replicated and routes alike on every rank of the group.
//
// The auxiliary loss is Switch Transformer's: aux = a E sum_e f_e P_e, with f_e the fraction of
// the N top_k copies routed to e (before drops) and P_e the mean score of e. Its gradient
// reaches the router weighted as the microbatch's loss is in the step (Batch::loss_weight).
#include "models/unit_common.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace dist::models::detail {
namespace {

/// An MLP without bias that computes this tensor-parallel rank's partial output.
struct Ffn {
    Linear fc, proj;
    Activation act = Activation::swiglu;
    int64_t hidden = 0; // this rank's hidden units
    kernels::Backend* be = nullptr;

    struct Saved {
        Tensor x, h, g, th, dy, dh;
    };

    Ffn(UnitContext& ctx, const std::string& name, int64_t width, int64_t full_hidden, Activation a,
        const TensorParallel& tp)
        : act(a), be(&ctx.device()) {
        MlpLinears m = make_mlp_linears(ctx, name, width, full_hidden, a, false, tp);
        fc = m.fc;
        proj = m.proj;
        hidden = m.local_hidden;
    }

    /// With bf16 (the linears') what it keeps is held in bf16.
    Tensor forward(const Tensor& x, Saved& s) const {
        const Bf16& bf16 = fc.bf16;
        Tensor h = fc.forward(x), th;
        Tensor g = activation_forward(*be, act, h, hidden, th);
        Tensor y = proj.forward(g);
        s.x = bf16.keep(x);
        s.h = bf16.keep(h);
        s.g = bf16.keep(g);
        s.th = bf16.keep(th);
        return y;
    }

    /// This rank's partial input gradient; keeps what backward_weight needs.
    Tensor backward_input(const Tensor& dy, Saved& s) const {
        const Bf16& bf16 = fc.bf16;
        Tensor dh = activation_backward(*be, act, bf16.use(s.h), bf16.use(s.th),
                                        proj.backward_input(dy), hidden);
        bf16.round(dh);
        s.h = s.th = Tensor();
        Tensor dx = fc.backward_input(dh);
        s.dh = bf16.keep(dh);
        s.dy = bf16.keep(dy);
        return dx;
    }

    void backward_weight(Saved& s) const {
        const Bf16& bf16 = fc.bf16;
        proj.backward_weight(bf16.use(s.dy), bf16.use(s.g));
        fc.backward_weight(bf16.use(s.dh), bf16.use(s.x));
        s = {};
    }
};

class MoeUnit : public Named {
  public:
    MoeUnit(const LayerSpec& l, UnitContext& ctx)
        : Named(l.name, ctx), tp_(ctx, l.shard == ShardDim::hidden), sp_(ctx), ep_(ctx.ep),
          experts_(l.experts), top_k_(l.top_k), sigmoid_(l.router == RouterScore::sigmoid),
          normalize_(l.normalize), capacity_(l.capacity), aux_(l.aux_loss) {
        if (be_.device().kind != kernels::Device::Kind::cpu)
            throw std::invalid_argument("`" + l.name + "`: a mixture of experts trains on CPU " +
                                        "devices only (its router runs on the host), not on " +
                                        be_.device().str());
        if (experts_ % ep_.size != 0)
            throw std::invalid_argument("`" + l.name + "`: " + std::to_string(experts_) +
                                        " experts do not split over " + std::to_string(ep_.size) +
                                        " expert-parallel ranks");
        local_ = experts_ / ep_.size;
        first_ = ep_.rank * local_;
        router_ = make_linear(ctx, l.name + ".router", l.width, experts_, false, 0.02);
        for (int64_t e = first_; e < first_ + local_; ++e) {
            ffn_.emplace_back(ctx, l.name + ".experts." + std::to_string(e), l.width, l.hidden,
                              l.activation, tp_);
            ffn_.back().fc.weight->expert = true;
            ffn_.back().proj.weight->expert = true;
        }
        if (l.shared_experts > 0)
            shared_ = std::make_unique<Ffn>(ctx, l.name + ".shared", l.width,
                                            l.shared_experts * l.shared_hidden, l.activation, tp_);
        stats_.load.assign(static_cast<size_t>(experts_), 0);
    }

    Tensor forward(int64_t mb, const Tensor& shard, const Batch& batch) override {
        Saved s;
        s.x = sp_.gather(shard, be_);
        s.loss_weight = batch.loss_weight;
        const Tensor& x = s.x;
        const int64_t N = rows(x), C = x.dim(x.rank() - 1);
        Tensor logits = router_.forward(x);
        route(logits, s);
        // Dispatch: every admitted copy's token, expert by expert.
        Tensor sent = be_.empty({std::max<int64_t>(s.copies, 1), C});
        const float* xp = x.data<float>();
        for (int64_t i = 0; i < N * top_k_; ++i)
            if (s.slot[idx(i)] >= 0)
                std::copy_n(xp + (i / top_k_) * C, C, sent.data<float>() + s.slot[idx(i)] * C);
        Tensor out = exchange(sent, s, C, /*dispatch=*/true);
        Tensor done = run_experts(out, s, C, /*forward=*/true);
        s.outputs = exchange(done, s, C, /*dispatch=*/false);
        // Combine: each token's admitted copies, weighted.
        Tensor y = shared_ ? shared_->forward(x, s.shared) : be_.zeros(x.shape());
        float* yp = y.data<float>();
        const float* op = s.outputs.data<float>();
        for (int64_t i = 0; i < N * top_k_; ++i) {
            int64_t slot = s.slot[idx(i)];
            if (slot < 0) continue;
            float w = s.weight[idx(i)];
            float* row = yp + (i / top_k_) * C;
            const float* o = op + slot * C;
            for (int64_t c = 0; c < C; ++c) row[c] += w * o[c];
        }
        // Not a generation's forward, nor one recomputed at backward.
        if (mb >= 0 && !batch.recomputed) record(s);
        s.x = bf16_.keep(s.x);
        s.outputs = bf16_.keep(s.outputs);
        saved_[mb] = std::move(s);
        return sp_.finish(y, tp_, be_);
    }

    Tensor backward_input(int64_t mb, const Tensor& dy_shard) override {
        Saved& s = saved_.at(mb);
        Tensor dy = sp_.gather(dy_shard, be_);
        const int64_t N = rows(dy), C = dy.dim(dy.rank() - 1), K = top_k_;
        const float* dyp = dy.data<float>();
        // The weights' gradients: each admitted copy's output against the token's gradient
        // (partial sums under tensor parallelism, whose outputs are partial).
        Tensor dw = be_.zeros({N, K});
        Tensor sent = be_.empty({std::max<int64_t>(s.copies, 1), C});
        const Tensor outputs = bf16_.use(s.outputs);
        const float* op = outputs.data<float>();
        for (int64_t i = 0; i < N * K; ++i) {
            int64_t slot = s.slot[idx(i)];
            if (slot < 0) continue;
            const float* g = dyp + (i / K) * C;
            const float* o = op + slot * C;
            float* d = sent.data<float>() + slot * C;
            double dot = 0.0;
            float w = s.weight[idx(i)];
            for (int64_t c = 0; c < C; ++c) {
                dot += static_cast<double>(g[c]) * o[c];
                d[c] = w * g[c];
            }
            dw.data<float>()[i] = static_cast<float>(dot);
        }
        s.outputs = Tensor();
        tp_.all_reduce(dw);
        Tensor out = exchange(sent, s, C, true);
        Tensor done = run_experts(out, s, C, /*forward=*/false);
        Tensor back = exchange(done, s, C, false);
        Tensor dx = shared_ ? shared_->backward_input(dy, s.shared) : be_.zeros(dy.shape());
        float* dxp = dx.data<float>();
        const float* bp = back.data<float>();
        for (int64_t i = 0; i < N * K; ++i) {
            int64_t slot = s.slot[idx(i)];
            if (slot < 0) continue;
            float* row = dxp + (i / K) * C;
            const float* b = bp + slot * C;
            for (int64_t c = 0; c < C; ++c) row[c] += b[c];
        }
        // The router: the scores' gradient from the weights and from the auxiliary loss.
        s.dlogits = router_gradient(dw, s);
        // The router is replicated: its part of dx is whole on every rank, so under tensor
        // parallelism only the first rank adds it before the partial sums are reduced.
        if (!tp_.split || tp_.rank == 0)
            be_.matmul_backward_input(s.dlogits.data<float>(),
                                      bf16_.weights(*router_.weight).data<float>(), N, C, experts_,
                                      dxp);
        return sp_.finish(dx, tp_, be_);
    }

    void backward_weight(int64_t mb) override {
        Saved s = take(saved_, mb, "moe");
        router_.backward_weight(s.dlogits, bf16_.use(s.x));
        for (size_t e = 0; e < ffn_.size(); ++e)
            if (s.expert[e].x.defined()) ffn_[e].backward_weight(s.expert[e]);
        if (shared_) shared_->backward_weight(s.shared);
    }

    void discard(int64_t mb) override { saved_.erase(mb); }

    void take_expert_stats(ExpertStats& into) override {
        into.merge(stats_);
        stats_ = {};
        stats_.load.assign(static_cast<size_t>(experts_), 0);
    }

  private:
    struct Saved {
        Tensor x;                       // the layer's input, whole sequences
        double loss_weight = 1.0;       // Batch::loss_weight
        std::vector<float> scores;      // (N, E)
        std::vector<int32_t> pick;      // (N, K) the experts each token takes
        std::vector<float> weight;      // (N, K) their weights
        std::vector<int64_t> slot;      // (N, K) the copy's row in the dispatch, -1: dropped
        std::vector<int64_t> load;      // (E) admitted copies
        std::vector<int64_t> want;      // (E) copies routed, before drops
        int64_t copies = 0;             // admitted copies
        std::vector<int64_t> peers;     // (ep x E) every member's load, under expert parallelism
        std::vector<Ffn::Saved> expert; // this rank's experts
        Ffn::Saved shared;
        Tensor outputs; // (copies, C) the experts' (partial) outputs, in dispatch order
        Tensor dlogits; // (N, E)
    };

    static size_t idx(int64_t i) { return static_cast<size_t>(i); }

    // Scores, top-k, weights, admission and the dispatch order.
    void route(const Tensor& logits, Saved& s) const {
        const int64_t N = rows(logits);
        const int64_t E = experts_, K = top_k_;
        const float* z = logits.data<float>();
        s.scores.resize(idx(N * E));
        s.pick.resize(idx(N * K));
        s.weight.resize(idx(N * K));
        s.slot.assign(idx(N * K), -1);
        s.load.assign(idx(E), 0);
        s.want.assign(idx(E), 0);
        std::vector<int32_t> order(idx(E));
        for (int64_t t = 0; t < N; ++t) {
            const float* zt = z + t * E;
            float* st = s.scores.data() + t * E;
            if (sigmoid_) {
                for (int64_t e = 0; e < E; ++e) st[e] = 1.0f / (1.0f + std::exp(-zt[e]));
            } else {
                float m = *std::max_element(zt, zt + E);
                double sum = 0.0;
                for (int64_t e = 0; e < E; ++e) sum += st[e] = std::exp(zt[e] - m);
                for (int64_t e = 0; e < E; ++e) st[e] = static_cast<float>(st[e] / sum);
            }
            std::iota(order.begin(), order.end(), 0);
            std::partial_sort(
                order.begin(), order.begin() + K, order.end(),
                [&](int32_t a, int32_t b) { return st[a] > st[b] || (st[a] == st[b] && a < b); });
            double total = 0.0;
            for (int64_t j = 0; j < K; ++j) total += st[order[idx(j)]];
            for (int64_t j = 0; j < K; ++j) {
                int32_t e = order[idx(j)];
                s.pick[idx(t * K + j)] = e;
                s.weight[idx(t * K + j)] = normalize_ ? static_cast<float>(st[e] / total) : st[e];
            }
        }
        const int64_t cap =
            capacity_ > 0.0
                ? static_cast<int64_t>(std::ceil(
                      capacity_ * static_cast<double>(N * K) / static_cast<double>(E) - 1e-9))
                : N * K;
        std::vector<int64_t> rank_in(idx(N * K));
        for (int64_t i = 0; i < N * K; ++i) {
            size_t e = idx(s.pick[idx(i)]);
            ++s.want[e];
            if (s.load[e] < cap)
                rank_in[idx(i)] = s.load[e]++;
            else
                rank_in[idx(i)] = -1;
        }
        std::vector<int64_t> start(idx(E), 0);
        for (int64_t e = 1; e < E; ++e) start[idx(e)] = start[idx(e - 1)] + s.load[idx(e - 1)];
        s.copies = start[idx(E - 1)] + s.load[idx(E - 1)];
        for (int64_t i = 0; i < N * K; ++i)
            if (rank_in[idx(i)] >= 0) s.slot[idx(i)] = start[idx(s.pick[idx(i)])] + rank_in[idx(i)];
    }

    // Under expert parallelism, the dispatch (rows expert by expert, to their owners) and the
    // combine (the owners' rows back, in the sender's order). Alone, the rows stay.
    Tensor exchange(const Tensor& rows_in, Saved& s, int64_t C, bool dispatch) const {
        if (ep_.size == 1) return rows_in;
        const int n = ep_.size;
        if (s.peers.empty()) {
            // Every member's load, so that each knows what it receives from whom.
            std::vector<float> mine(s.load.begin(), s.load.end());
            std::vector<float> all(static_cast<size_t>(n) * idx(experts_));
            ep_.group->all_gather(mine.data(), experts_, all.data());
            s.peers.assign(all.begin(), all.end());
        }
        auto load = [&](int src, int64_t e) {
            return s.peers[static_cast<size_t>(src) * idx(experts_) + idx(e)];
        };
        // Rows this rank sends to (dispatch) or receives from (combine) member g: its copies
        // for g's experts; rows g sends to it (dispatch) or it returns to g: g's copies for
        // this rank's experts.
        std::vector<int64_t> to_owner(idx(n), 0), from_sender(idx(n), 0);
        for (int g = 0; g < n; ++g)
            for (int64_t e = 0; e < local_; ++e) {
                to_owner[idx(g)] += load(ep_.rank, g * local_ + e);
                from_sender[idx(g)] += load(g, first_ + e);
            }
        const std::vector<int64_t>& send = dispatch ? to_owner : from_sender;
        const std::vector<int64_t>& recv = dispatch ? from_sender : to_owner;
        std::vector<int64_t> send_n(idx(n)), recv_n(idx(n));
        int64_t total = 0;
        for (int g = 0; g < n; ++g) {
            send_n[idx(g)] = send[idx(g)] * C;
            recv_n[idx(g)] = recv[idx(g)] * C;
            total += recv[idx(g)];
        }
        Tensor out = be_.empty({std::max<int64_t>(total, 1), C});
        ep_.group->all_to_all(rows_in.data<float>(), send_n, out.data<float>(), recv_n);
        return out;
    }

    // The rows this rank's experts received (member by member, expert by expert within each)
    // through their experts: forward, or the input gradient of the rows' output gradients.
    Tensor run_experts(const Tensor& in, Saved& s, int64_t C, bool forward) {
        const int n = ep_.size;
        auto count = [&](int src, int64_t e) {
            return n == 1 ? s.load[idx(e)]
                          : s.peers[static_cast<size_t>(src) * idx(experts_) + idx(e)];
        };
        // Where each (sender, local expert) block starts in `in`.
        std::vector<int64_t> at(static_cast<size_t>(n) * idx(local_));
        int64_t row = 0;
        for (int g = 0; g < n; ++g)
            for (int64_t e = 0; e < local_; ++e) {
                at[static_cast<size_t>(g) * idx(local_) + idx(e)] = row;
                row += count(g, first_ + e);
            }
        Tensor out = be_.empty({std::max<int64_t>(row, 1), C});
        if (forward) s.expert.resize(ffn_.size());
        for (int64_t e = 0; e < local_; ++e) {
            int64_t rows_e = 0;
            for (int g = 0; g < n; ++g) rows_e += count(g, first_ + e);
            if (rows_e == 0) continue;
            Tensor xe = be_.empty({rows_e, C});
            int64_t r = 0;
            for (int g = 0; g < n; ++g) {
                int64_t c = count(g, first_ + e);
                std::copy_n(in.data<float>() +
                                at[static_cast<size_t>(g) * idx(local_) + idx(e)] * C,
                            c * C, xe.data<float>() + r * C);
                r += c;
            }
            Ffn::Saved& saved = s.expert[idx(e)];
            Tensor ye =
                forward ? ffn_[idx(e)].forward(xe, saved) : ffn_[idx(e)].backward_input(xe, saved);
            r = 0;
            for (int g = 0; g < n; ++g) {
                int64_t c = count(g, first_ + e);
                std::copy_n(ye.data<float>() + r * C, c * C,
                            out.data<float>() +
                                at[static_cast<size_t>(g) * idx(local_) + idx(e)] * C);
                r += c;
            }
        }
        return out;
    }

    // d(objective)/d(router logits) (N, E) from the weights' gradients dw (N, K).
    Tensor router_gradient(const Tensor& dw_t, const Saved& s) const {
        const int64_t E = experts_, K = top_k_, N = static_cast<int64_t>(s.scores.size()) / E;
        const float* dw = dw_t.data<float>();
        std::vector<double> ds(idx(E));
        // The auxiliary loss a E sum_e f_e P_e: dP_e/ds_te = 1/N, f_e held constant.
        std::vector<double> aux_grad(idx(E), 0.0);
        if (aux_ > 0.0)
            for (int64_t e = 0; e < E; ++e)
                aux_grad[idx(e)] = s.loss_weight * aux_ * static_cast<double>(E) *
                                   static_cast<double>(s.want[idx(e)]) /
                                   static_cast<double>(N * K) / static_cast<double>(N);
        Tensor dz = be_.empty({N, E});
        for (int64_t t = 0; t < N; ++t) {
            const float* st = s.scores.data() + t * E;
            for (int64_t e = 0; e < E; ++e) ds[idx(e)] = aux_grad[idx(e)];
            const int32_t* pick = s.pick.data() + t * K;
            const float* w = s.weight.data() + t * K;
            if (normalize_) {
                // w_j = s_j / S over the picked: ds_j = (dw_j - sum_i dw_i w_i) / S.
                double S = 0.0, mean = 0.0;
                for (int64_t j = 0; j < K; ++j) {
                    S += st[pick[j]];
                    mean += static_cast<double>(dw[t * K + j]) * w[j];
                }
                for (int64_t j = 0; j < K; ++j) ds[idx(pick[j])] += (dw[t * K + j] - mean) / S;
            } else {
                for (int64_t j = 0; j < K; ++j) ds[idx(pick[j])] += dw[t * K + j];
            }
            float* d = dz.data<float>() + t * E;
            if (sigmoid_) {
                for (int64_t e = 0; e < E; ++e)
                    d[e] = static_cast<float>(ds[idx(e)] * st[e] * (1.0 - st[e]));
            } else {
                double dot = 0.0;
                for (int64_t e = 0; e < E; ++e) dot += ds[idx(e)] * st[e];
                for (int64_t e = 0; e < E; ++e)
                    d[e] = static_cast<float>(st[e] * (ds[idx(e)] - dot));
            }
        }
        return dz;
    }

    // The step's statistics, from a training forward (the executor's microbatches are >= 0).
    void record(const Saved& s) {
        const int64_t E = experts_, K = top_k_, N = static_cast<int64_t>(s.scores.size()) / E;
        double aux = 0.0;
        for (int64_t e = 0; e < E; ++e) {
            double mean = 0.0;
            for (int64_t t = 0; t < N; ++t) mean += s.scores[idx(t * E + e)];
            mean /= static_cast<double>(N);
            aux += static_cast<double>(s.want[idx(e)]) / static_cast<double>(N * K) * mean;
            stats_.load[idx(e)] += s.load[idx(e)];
        }
        stats_.dropped += N * K - s.copies;
        stats_.routed += N * K;
        stats_.aux_loss += aux_ * static_cast<double>(E) * aux;
        ++stats_.aux_terms;
    }

    TensorParallel tp_;
    SequenceParallel sp_;
    GroupPlace ep_;
    int64_t experts_, top_k_;
    bool sigmoid_, normalize_;
    double capacity_, aux_;
    int64_t local_ = 0, first_ = 0;
    Linear router_;
    std::vector<Ffn> ffn_;
    std::unique_ptr<Ffn> shared_;
    std::map<int64_t, Saved> saved_;
    ExpertStats stats_;
};

} // namespace

std::unique_ptr<Unit> make_moe(const LayerSpec& l, UnitContext& ctx) {
    return std::make_unique<MoeUnit>(l, ctx);
}

} // namespace dist::models::detail
