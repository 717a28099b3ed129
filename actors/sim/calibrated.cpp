// calibrated.cpp: interpolating measured rates, and a stage's kernels priced with them.
#include "actors/sim/calibrated.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

namespace dist::sim {

namespace {

// Position of x among the sorted values: the bracketing pair and the weight of the upper one,
// linear in log space, clamped at the ends.
struct Bracket {
    size_t lo = 0, hi = 0;
    double w = 0;
};

Bracket bracket(const std::vector<double>& values, double x) {
    Bracket b;
    if (values.empty()) return b;
    if (x <= values.front()) return b;
    if (x >= values.back()) {
        b.lo = b.hi = values.size() - 1;
        return b;
    }
    size_t hi =
        static_cast<size_t>(std::upper_bound(values.begin(), values.end(), x) - values.begin());
    b.lo = hi - 1;
    b.hi = hi;
    b.w = std::log(x / values[b.lo]) / std::log(values[b.hi] / values[b.lo]);
    return b;
}

template <typename T, typename Get>
std::vector<double> distinct(const std::vector<const T*>& rows, Get get) {
    std::set<double> s;
    for (const T* r : rows) s.insert(static_cast<double>(get(*r)));
    return {s.begin(), s.end()};
}

// Interpolates over thread counts (linear in log space) a quantity that `at` gives for the rows
// of one measured thread count.
template <typename T, typename At>
double over_threads(const std::vector<const T*>& rows, double threads, At at) {
    std::vector<double> counts = distinct(rows, [](const T& r) { return r.threads; });
    if (counts.empty()) return 0.0;
    Bracket b = bracket(counts, threads);
    auto with = [&](double count) {
        std::vector<const T*> these;
        for (const T* r : rows)
            if (r->threads == count) these.push_back(r);
        return at(these);
    };
    double lo = with(counts[b.lo]);
    if (b.hi == b.lo || b.w == 0) return lo;
    double hi = with(counts[b.hi]);
    return std::exp((1 - b.w) * std::log(lo) + b.w * std::log(hi));
}

// Rows of `rows` keyed on one dimension: log-log interpolation of `value` at x.
template <typename T, typename Key, typename Value>
double along(const std::vector<const T*>& rows, double x, Key key, Value value) {
    std::map<double, double> points;
    for (const T* r : rows) points[static_cast<double>(key(*r))] = value(*r);
    if (points.empty()) return 0.0;
    std::vector<double> xs;
    for (const auto& [k, v] : points) xs.push_back(k);
    Bracket b = bracket(xs, x);
    double lo = points[xs[b.lo]], hi = points[xs[b.hi]];
    return std::exp((1 - b.w) * std::log(lo) + b.w * std::log(hi));
}

} // namespace

double Rates::matmul(const std::string& kernel, double m, double n, double k, double threads,
                     bool warm) const {
    auto rate = [warm](const MatmulRate& r) { return warm && r.warm > 0 ? r.warm : r.flops; };
    std::vector<const MatmulRate*> rows;
    for (const MatmulRate& r : c_->matmul)
        if (r.kernel == kernel) rows.push_back(&r);
    if (rows.empty())
        for (const MatmulRate& r : c_->matmul) rows.push_back(&r);
    return over_threads(rows, threads, [&](const std::vector<const MatmulRate*>& these) {
        // Trilinear in log space over the grid of measured (m, n, k); a shape missing from the
        // grid falls back to the nearest measured one.
        std::vector<double> ms = distinct(these, [](const MatmulRate& r) { return r.m; });
        std::vector<double> ns = distinct(these, [](const MatmulRate& r) { return r.n; });
        std::vector<double> ks = distinct(these, [](const MatmulRate& r) { return r.k; });
        std::map<std::tuple<double, double, double>, double> grid;
        for (const MatmulRate* r : these)
            grid[{static_cast<double>(r->m), static_cast<double>(r->n),
                  static_cast<double>(r->k)}] = rate(*r);
        auto nearest = [&](double a, double b, double c) {
            double best = 0, dist = 1e300;
            for (const MatmulRate* r : these) {
                double d = std::pow(std::log(a / static_cast<double>(r->m)), 2) +
                           std::pow(std::log(b / static_cast<double>(r->n)), 2) +
                           std::pow(std::log(c / static_cast<double>(r->k)), 2);
                if (d < dist) {
                    dist = d;
                    best = rate(*r);
                }
            }
            return best;
        };
        Bracket bm = bracket(ms, m), bn = bracket(ns, n), bk = bracket(ks, k);
        double log_rate = 0;
        for (int i = 0; i < 8; ++i) {
            double wm = (i & 1) ? bm.w : 1 - bm.w, wn = (i & 2) ? bn.w : 1 - bn.w,
                   wk = (i & 4) ? bk.w : 1 - bk.w;
            double w = wm * wn * wk;
            if (w == 0) continue;
            double x = ms[(i & 1) ? bm.hi : bm.lo], y = ns[(i & 2) ? bn.hi : bn.lo],
                   z = ks[(i & 4) ? bk.hi : bk.lo];
            auto it = grid.find({x, y, z});
            log_rate += w * std::log(it != grid.end() ? it->second : nearest(x, y, z));
        }
        return std::exp(log_rate);
    });
}

double Rates::attention(double seq, double head_dim, double threads, bool backward) const {
    std::vector<const AttentionRate*> rows;
    for (const AttentionRate& r : c_->attention) rows.push_back(&r);
    if (rows.empty()) return matmul("nt", seq, seq, head_dim, threads);
    return over_threads(rows, threads, [&](const std::vector<const AttentionRate*>& these) {
        // The measured head size nearest in log space, then along the sequence length.
        double best = 0, dist = 1e300;
        for (const AttentionRate* r : these) {
            double d = std::abs(std::log(head_dim / static_cast<double>(r->head_dim)));
            if (d < dist) {
                dist = d;
                best = static_cast<double>(r->head_dim);
            }
        }
        std::vector<const AttentionRate*> same;
        for (const AttentionRate* r : these)
            if (static_cast<double>(r->head_dim) == best) same.push_back(r);
        return along(
            same, seq, [](const AttentionRate& r) { return r.seq; },
            [backward](const AttentionRate& r) { return backward ? r.backward : r.forward; });
    });
}

double Rates::elementwise(const std::string& op, double elements, double threads,
                          bool backward) const {
    std::vector<const StreamRate*> rows;
    for (const StreamRate& r : c_->elementwise)
        if (r.op == op) rows.push_back(&r);
    if (rows.empty())
        for (const StreamRate& r : c_->elementwise)
            if (r.op == "copy") rows.push_back(&r);
    if (rows.empty()) return 1e9;
    return over_threads(rows, threads, [&](const std::vector<const StreamRate*>& these) {
        return along(
            these, elements, [](const StreamRate& r) { return r.elements; },
            [backward](const StreamRate& r) { return backward ? r.backward : r.forward; });
    });
}

double Rates::sharing(double threads, double bytes) const {
    if (threads <= 1 || c_->sharing.empty()) return 1.0;
    std::map<double, std::map<double, double>> sets; // working set -> threads -> speed
    for (const SharingPoint& s : c_->sharing)
        sets[s.bytes > 0 ? s.bytes : sharing_default_bytes][s.threads] = s.speed;
    auto speed = [threads](std::map<double, double> points) {
        points[1.0] = 1.0;
        auto last = std::prev(points.end());
        // Beyond the measured counts the cores are divided further.
        if (threads >= last->first) return last->second * last->first / threads;
        auto hi = points.upper_bound(threads), lo = std::prev(hi);
        double w = (threads - lo->first) / (hi->first - lo->first);
        return (1 - w) * lo->second + w * hi->second;
    };
    if (bytes <= sets.begin()->first) return speed(sets.begin()->second);
    if (bytes >= sets.rbegin()->first) return speed(sets.rbegin()->second);
    auto hi = sets.upper_bound(bytes), lo = std::prev(hi);
    double w = std::log(bytes / lo->first) / std::log(hi->first / lo->first);
    return (1 - w) * speed(lo->second) + w * speed(hi->second);
}

namespace {

// Piecewise linear in bytes through the measured sizes; beyond the largest, the last segment's
// slope (the bandwidth); below the smallest, its time (the latency).
double by_size(const std::map<double, double>& points, double bytes) {
    if (points.empty()) return -1.0;
    auto first = points.begin();
    if (points.size() == 1 || bytes <= first->first) return first->second;
    auto hi = points.lower_bound(bytes);
    if (hi == points.end()) hi = std::prev(points.end());
    auto lo = std::prev(hi);
    double slope = (hi->second - lo->second) / (hi->first - lo->first);
    return std::max(first->second, lo->second + slope * (bytes - lo->first));
}

} // namespace

double Rates::transfer(const std::string& transport, double bytes) const {
    std::map<double, double> points;
    for (const TransferSample& t : c_->transfers)
        if (t.transport == transport) points[static_cast<double>(t.bytes)] = t.seconds;
    return by_size(points, bytes);
}

double Rates::collective(const std::string& backend, const std::string& op, int32_t ranks,
                         double bytes) const {
    if (ranks <= 1) return 0.0;
    // The measured group size nearest to `ranks`; a ring's time grows as 2 (n - 1) / n.
    int32_t best = 0;
    for (const CollectiveSample& s : c_->collectives)
        if (s.backend == backend && s.op == op &&
            (best == 0 || std::abs(s.ranks - ranks) < std::abs(best - ranks)))
            best = s.ranks;
    if (best == 0) return -1.0;
    std::map<double, double> points;
    for (const CollectiveSample& s : c_->collectives)
        if (s.backend == backend && s.op == op && s.ranks == best)
            points[static_cast<double>(s.bytes)] = s.seconds;
    double scale =
        (static_cast<double>(ranks - 1) / ranks) / (static_cast<double>(best - 1) / best);
    return by_size(points, bytes) * scale;
}

namespace {

StageSeconds kernel_seconds(const Program& p, const plan::PlanStage& s, const Rates& r,
                            double rank_threads) {
    StageSeconds out;
    using K = plan::KernelCall::Kind;
    // A stage whose weights (f32 on the CPU) fit in the caches of the cores its rank computes on
    // finds them there at every pass; a larger one streams them in from beyond.
    const int64_t cache = r.calibration().cache_bytes;
    const bool warm = cache > 0 && 4.0 * static_cast<double>(s.parameters) <=
                                       std::max(1.0, rank_threads) * static_cast<double>(cache);
    // bf16 with float arithmetic (models/unit_common.hpp's Bf16): passes over tensors that
    // f32 does not make. Rounding in place, a kept tensor's bf16 copy and its float copy back.
    const bool bf16 = p.train.precision == Precision::bf16;
    auto rounds = [&](double e, double threads) {
        return e / r.elementwise("bf16_round", e, threads, false);
    };
    auto keeps = [&](double e, double threads) {
        return e / r.elementwise("bf16_keep", e, threads, false);
    };
    auto widens = [&](double e, double threads) {
        return e / r.elementwise("bf16_keep", e, threads, true);
    };
    for (const plan::KernelCall& k : plan::stage_kernels(p, s)) {
        const double m = static_cast<double>(k.m), n = static_cast<double>(k.n),
                     kk = static_cast<double>(k.k);
        const double threads = k.serial ? 1.0 : rank_threads; // the host's own loops: one
        if (bf16 && k.kind == K::matmul) {
            // A linear layer rounds its input and output, and computes with a rounded copy of
            // its weights (a copy and a rounding, forward and again for the input gradient);
            // it keeps its input in bf16. The input gradient rounds the output's gradient and
            // its own, widens the kept input and keeps it again with the output's gradient for
            // the weight gradient, which widens both.
            const double weights =
                rounds(n * kk, threads) + n * kk / r.elementwise("copy", n * kk, threads, false);
            out.forward +=
                rounds(m * kk, threads) + rounds(m * n, threads) + weights + keeps(m * kk, threads);
            out.input += rounds(m * n, threads) + rounds(m * kk, threads) + weights +
                         widens(m * kk, threads) + keeps(m * kk, threads) + keeps(m * n, threads);
            out.weight += widens(m * kk, threads) + widens(m * n, threads);
        }
        if (bf16 && k.kind == K::elementwise && k.kept) {
            // Kept in bf16, widened for the backward, whose gradient is rounded.
            out.forward += keeps(m, threads);
            out.input += widens(m, threads) + rounds(m, threads);
        }
        if (bf16 && k.kind == K::elementwise && k.residual) {
            // The body's output and the sum rounded; the body's gradient rounded.
            out.forward += 2 * rounds(m, threads);
            out.input += rounds(m, threads);
        }
        switch (k.kind) {
        case K::matmul: {
            const double flops = 2 * m * n * kk;
            out.forward += flops / r.matmul("nt", m, n, kk, threads, warm);
            out.input += flops / r.matmul("nn", m, kk, n, threads, warm);
            out.weight += flops / r.matmul("tn", n, kk, m, threads, warm);
            // The input gradient is accumulated into a zeroed buffer; a bias is one more pass
            // over the output forward and a column sum of its gradient backward.
            out.input += m * kk / r.elementwise("zero", m * kk, threads, false);
            if (k.bias) {
                out.forward += m * n / r.elementwise("bias", m * n, threads, false);
                out.weight += m * n / r.elementwise("bias", m * n, threads, true);
            }
            break;
        }
        case K::attention: {
            const double flops = 4 * m * n * n * static_cast<double>(k.heads) * kk * k.share;
            out.forward += flops / r.attention(n, kk, threads, false);
            out.input += 2 * flops / r.attention(n, kk, threads, true);
            break;
        }
        case K::elementwise:
            out.forward += m / r.elementwise(k.op, m, threads, false);
            // An embedding's backward is its table's gradient, a weight gradient.
            (k.op == "embedding" ? out.weight : out.input) +=
                m / r.elementwise(k.op, m, threads, true);
            break;
        }
    }
    return out;
}

} // namespace

StageSeconds stage_seconds(const Program& p, const plan::PlanStage& s, const Rates& r,
                           double threads, bool whole) {
    if (!whole) return kernel_seconds(p, s, r, threads);
    // What whole actions cost beyond their kernels, as measured on the machine: the blocks'
    // kernels, the first end's (the embeddings) and the last end's (final norm, head, loss)
    // apart.
    plan::PlanStage blocks = s, first = s, last = s;
    blocks.embedding = blocks.head = false;
    first.blocks = last.blocks = 0;
    first.head = last.embedding = false;
    StageSeconds kb = kernel_seconds(p, blocks, r, threads);
    StageSeconds kf = kernel_seconds(p, first, r, threads);
    StageSeconds kl = kernel_seconds(p, last, r, threads);
    // The probes' fits by width where the calibration has them, at the stage's matmuls' width,
    // its microbatch's tokens and its blocks.
    const WholeActions fit = r.calibration().whole_actions(
        threads, shard_width(p), microbatch_tokens(p), static_cast<double>(s.blocks));
    const std::array<double, 4>& c = fit.scales;
    const std::array<double, 2>& o = fit.block_overhead_s;
    // The first end's scales where the profile has them apart, else the ends'.
    const double first_f = fit.first_end[0] > 0 ? fit.first_end[0] : c[1];
    const double first_b = fit.first_end[1] > 0 ? fit.first_end[1] : c[3];
    const double blocks_n = s.blocks;
    StageSeconds out;
    out.forward = c[0] * kb.forward + first_f * kf.forward + c[1] * kl.forward + o[0] * blocks_n;
    const double kb_back = kb.input + kb.weight;
    out.input = c[2] * kb.input + first_b * kf.input + c[3] * kl.input +
                (kb_back > 0 ? o[1] * blocks_n * kb.input / kb_back : 0.0);
    out.weight = c[2] * kb.weight + first_b * kf.weight + c[3] * kl.weight +
                 (kb_back > 0 ? o[1] * blocks_n * kb.weight / kb_back : 0.0);
    if (p.schedule.recompute == Recompute::full) out.input += out.forward;
    return out;
}

double shard_width(const Program& p) {
    return static_cast<double>(p.model.width) /
           static_cast<double>(std::max<int64_t>(1, p.mesh.tp));
}

double microbatch_tokens(const Program& p) {
    return static_cast<double>(p.train.microbatch_size * p.model.context) /
           static_cast<double>(std::max<int64_t>(1, p.mesh.cp));
}

double step_seconds(double parameters, const Rates& r, double threads) {
    return parameters / r.elementwise("adamw", parameters, threads, false);
}

int32_t most_ranks_on_a_host(const plan::Graph& g) {
    std::map<int32_t, int32_t> per_host;
    for (const plan::PlanRank& r : g.ranks) ++per_host[r.host];
    int32_t most = 1;
    for (const auto& [host, count] : per_host) most = std::max(most, count);
    return most;
}

int32_t rank_threads(const plan::Graph& g, int32_t cores) {
    return std::max(1, cores / most_ranks_on_a_host(g));
}

std::vector<double> reuse_distances(const plan::Graph& g, const plan::PlanRank& r) {
    using plan::ActionKind;
    struct Region {
        double bytes = 0;
        int64_t touched = 0; // when last (a count of touches)
    };
    std::vector<Region> regions;
    std::map<std::pair<int32_t, int32_t>, size_t> live; // (stage, microbatch) -> its region
    std::vector<size_t> freed;                          // most recently freed last
    int64_t clock = 0;
    // The bytes of the other regions touched after `k` was.
    auto since = [&](size_t k) {
        double bytes = 0;
        for (size_t j = 0; j < regions.size(); ++j)
            if (j != k && regions[j].touched > regions[k].touched) bytes += regions[j].bytes;
        return bytes;
    };
    // Where a zero-bubble schedule splits a backward, its W reads the stash after its I and
    // frees it.
    std::set<std::pair<int32_t, int32_t>> weighed;
    for (const plan::PlanAction& a : r.actions)
        if (a.kind == ActionKind::backward_weight) weighed.insert({a.stage, a.microbatch});
    std::vector<double> out(r.actions.size(), -1.0);
    for (int step = 0; step < 2; ++step) // the first step leaves the frees the second takes
        for (size_t i = 0; i < r.actions.size(); ++i) {
            const plan::PlanAction& a = r.actions[i];
            const bool writes = a.kind == ActionKind::forward;
            const bool reads = !writes && plan::is_compute(a.kind); // B, I or W
            if ((!writes && !reads) || a.stage < 0) continue;
            const std::pair<int32_t, int32_t> key{a.stage, a.microbatch};
            size_t k = 0;
            double distance = 0;
            if (writes) {
                if (freed.empty()) {
                    regions.push_back({});
                    k = regions.size() - 1;
                } else {
                    k = freed.back();
                    freed.pop_back();
                    distance = since(k);
                }
                regions[k].bytes =
                    static_cast<double>(g.stages[static_cast<size_t>(a.stage)].activation_bytes);
                live[key] = k;
            } else {
                auto it = live.find(key);
                if (it == live.end()) continue; // no F before it on this rank
                k = it->second;
                distance = since(k);
                if (a.kind != ActionKind::backward_input || !weighed.count(key)) {
                    live.erase(it);
                    freed.push_back(k);
                }
            }
            regions[k].touched = ++clock;
            if (step == 1) out[i] = distance;
        }
    return out;
}

double normal_order_statistic(int32_t i, int32_t n) {
    if (n < 2 || i < 1 || i > n) return 0.0;
    // E[X_(i)] = n! / ((i - 1)! (n - i)!) * integral of x phi(x) Phi(x)^(n - i)
    // (1 - Phi(x))^(i - 1) dx, by Simpson's rule over [-9, 9], where the rest is negligible.
    const double log_c = std::lgamma(n + 1.0) - std::lgamma(1.0 * i) - std::lgamma(n - i + 1.0);
    auto f = [&](double x) {
        const double below = 0.5 * std::erfc(-x / std::sqrt(2.0)), above = 1.0 - below;
        if (below <= 0 || above <= 0) return 0.0;
        return x * std::exp(log_c - 0.5 * x * x - 0.5 * std::log(2 * M_PI) +
                            (n - i) * std::log(below) + (i - 1) * std::log(above));
    };
    const int steps = 2000;
    const double lo = -9, h = 18.0 / steps;
    double sum = f(lo) + f(-lo);
    for (int k = 1; k < steps; ++k) sum += (k % 2 ? 4 : 2) * f(lo + k * h);
    return sum * h / 3;
}

std::vector<std::vector<double>> core_paces(const plan::Graph& g, int32_t cores,
                                            double core_spread) {
    std::map<int32_t, std::vector<size_t>> on_host; // its ranks, in rank order
    for (size_t r = 0; r < g.ranks.size(); ++r) on_host[g.ranks[r].host].push_back(r);
    // Hosts of several ranks that each hold cores of their own: as many draws as the most ranks
    // of one, at most kMostPaceDraws.
    auto drawn = [&](const std::vector<size_t>& ranks) {
        return core_spread > 0 && ranks.size() >= 2 && ranks.size() <= static_cast<size_t>(cores);
    };
    size_t draws = 1;
    for (const auto& [host, ranks] : on_host)
        if (drawn(ranks)) draws = std::max(draws, std::min(ranks.size(), kMostPaceDraws));
    std::vector<std::vector<double>> paces(draws, std::vector<double>(g.ranks.size(), 1.0));
    if (draws == 1) return paces;
    for (const auto& [host, ranks] : on_host) {
        if (!drawn(ranks)) continue;
        const auto n = static_cast<int32_t>(ranks.size());
        const double sigma = core_spread / std::sqrt(static_cast<double>(cores / n));
        for (size_t d = 0; d < draws; ++d) {
            // This draw's turn of the host's paces: spread evenly over the n where fewer.
            const auto turn = static_cast<int32_t>(d * ranks.size() / draws);
            for (int32_t i = 0; i < n; ++i)
                paces[d][ranks[static_cast<size_t>(i)]] =
                    std::max(0.5, 1.0 + sigma * normal_order_statistic((i + turn) % n + 1, n));
        }
    }
    // A (dp, pp) position's tensor- and context-parallel ranks meet inside every layer: all go
    // at the slowest one's pace.
    std::map<std::pair<int32_t, int32_t>, std::vector<size_t>> layer_groups;
    for (size_t r = 0; r < g.ranks.size(); ++r)
        layer_groups[{g.ranks[r].dp, g.ranks[r].pp}].push_back(r);
    for (std::vector<double>& pace : paces)
        for (const auto& [position, ranks] : layer_groups) {
            double slowest = 0;
            for (size_t r : ranks) slowest = std::max(slowest, pace[r]);
            for (size_t r : ranks) pace[r] = slowest;
        }
    // Draws all alike (a single such group) are one.
    if (std::all_of(paces.begin(), paces.end(), [&](const auto& d) { return d == paces[0]; }))
        paces.resize(1);
    return paces;
}

} // namespace dist::sim
