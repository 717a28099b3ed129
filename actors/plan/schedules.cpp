// schedules.cpp: one compiler per schedule kind. Every compiler writes a rank's order with the
// small helper `Order`, which counts per stage how many F, B / I and W it has issued, so that
// each action takes the next microbatch of its stage.
#include "actors/plan/schedules.hpp"

#include <algorithm>
#include <deque>

namespace dist::plan {

namespace {

using K = ActionKind;

PlanAction act(int32_t stage, K kind, int32_t mb) {
    PlanAction a;
    a.kind = kind;
    a.stage = stage;
    a.microbatch = mb;
    return a;
}

/// One rank's list under construction: next microbatch per (stage, op).
class Order {
  public:
    explicit Order(int32_t stages) : f_(stages, 0), b_(stages, 0), w_(stages, 0) {}
    void f(int32_t s) { list.push_back(act(s, K::forward, f_[s]++)); }
    void b(int32_t s) { list.push_back(act(s, K::backward, b_[s]++)); }
    /// The input gradient; its W is queued for `w()`.
    void i(int32_t s) {
        pending.push_back({s, b_[s]});
        list.push_back(act(s, K::backward_input, b_[s]++));
    }
    /// The oldest queued W.
    void w() {
        auto [s, mb] = pending.front();
        pending.pop_front();
        list.push_back(act(s, K::backward_weight, mb));
    }
    void overlap_last() { list[list.size() - 2].overlap_next = true; }
    int32_t forwards(int32_t s) const { return f_[s]; }
    int32_t backwards(int32_t s) const { return b_[s]; }

    std::vector<PlanAction> list;
    std::deque<std::pair<int32_t, int32_t>> pending;

  private:
    std::vector<int32_t> f_, b_, w_;
};

// GPipe (Huang et al. 2019): every forward, then every backward, in microbatch order as
// PyTorch's ScheduleGPipe runs them.
std::vector<PlanAction> gpipe(int32_t p, int32_t m, int32_t r) {
    Order o(p);
    for (int32_t k = 0; k < m; ++k) o.f(r);
    for (int32_t k = 0; k < m; ++k) o.b(r);
    return o.list;
}

// 1F1B (PipeDream-Flush, Narayanan et al. 2021): p-1-r warm-up forwards, then alternate one
// forward and one backward, then the remaining backwards. At most p-r activations live on r.
// With `split`, each B becomes I with its W right after it, except that rank r holds back its
// first r W passes to fill the cool-down (ZB-H1, Qi et al. 2024; PyTorch's zero-bubble order).
std::vector<PlanAction> one_f_one_b(int32_t p, int32_t m, int32_t r, bool split) {
    Order o(p);
    int32_t warmup = std::min(m, p - 1 - r);
    for (int32_t k = 0; k < warmup; ++k) o.f(r);
    int32_t steps = 0;
    auto backward = [&] {
        if (!split) return o.b(r);
        o.i(r);
        if (steps++ >= r) o.w();
    };
    for (int32_t k = warmup; k < m; ++k) {
        o.f(r);
        backward();
    }
    for (int32_t k = 0; k < warmup; ++k) backward();
    while (!o.pending.empty()) o.w();
    return o.list;
}

// ZB-H2 (Qi et al. 2024): 2(p-r)-1 warm-up forwards fill the wait for the first input
// gradient; then rank r alternates I and F 2r times without W, which lets later ranks bank the
// W passes that fill the end; then I, W, F triples; then I and W in turn; then the banked W.
// At unit costs every rank is busy from its first action to its last (a parallelogram).
std::vector<PlanAction> zb_h2(int32_t p, int32_t m, int32_t r) {
    Order o(p);
    auto f_left = [&] { return o.forwards(r) < m; };
    for (int32_t k = 0; k < std::min(m, 2 * (p - r) - 1); ++k) o.f(r);
    for (int32_t k = 0; k < 2 * r && f_left(); ++k) {
        o.i(r);
        o.f(r);
    }
    while (f_left()) {
        o.i(r);
        o.w();
        o.f(r);
    }
    while (o.backwards(r) < m) {
        o.i(r);
        o.w();
    }
    while (!o.pending.empty()) o.w();
    return o.list;
}

// Interleaved 1F1B (Narayanan et al. 2021, Megatron-LM): rank r owns stages r, r+p, ...
// Forwards go round the local stages in groups of p microbatches; backwards go round them in
// the opposite order. Warm-up: (v-1)p + 2(p-1-r) forwards, then one F and one B in turn.
std::vector<PlanAction> interleaved(int32_t p, int32_t m, int32_t v, int32_t r) {
    Order o(p * v);
    int32_t total = m * v;
    auto fwd_stage = [&](int32_t k) { return ((k / p) % v) * p + r; };
    auto bwd_stage = [&](int32_t k) { return (v - 1 - (k / p) % v) * p + r; };
    int32_t warmup = std::min(total, (v - 1) * p + 2 * (p - 1 - r));
    int32_t fk = 0, bk = 0;
    for (; fk < warmup; ++fk) o.f(fwd_stage(fk));
    while (fk < total) {
        o.f(fwd_stage(fk++));
        o.b(bwd_stage(bk++));
    }
    while (bk < total) o.b(bwd_stage(bk++));
    return o.list;
}

// Looped BFS (Lamy-Poirier 2023, breadth-first): every microbatch through one local stage
// before the next; backwards in the reverse order of stages and microbatches, as PyTorch's
// ScheduleLoopedBFS runs them.
std::vector<PlanAction> looped_bfs(int32_t p, int32_t m, int32_t v, int32_t r) {
    std::vector<PlanAction> list;
    for (int32_t c = 0; c < v; ++c)
        for (int32_t k = 0; k < m; ++k) list.push_back(act(c * p + r, K::forward, k));
    for (int32_t c = v - 1; c >= 0; --c)
        for (int32_t k = m - 1; k >= 0; --k) list.push_back(act(c * p + r, K::backward, k));
    return list;
}

// ZBV (Qi et al. 2024, "Pipeline Parallelism with Controllable Memory"): rank r owns stage r on
// the way down and stage 2p-1-r on the way up. Warm-up fills the V with forwards of the first
// chunk, then of both; the steady phase runs F, I, W of each chunk in turn; the cool-down
// runs the input gradients first and the weight gradients last. PyTorch's ScheduleZBVZeroBubble
// has the same phases.
std::vector<PlanAction> zbv(int32_t p, int32_t m_given, int32_t r) {
    // The V fills with 2p-1 microbatches: with fewer, the order is that of 2p-1 with the
    // missing microbatches left out (as PyTorch does), which keeps the dependencies acyclic.
    const int32_t m = std::max(m_given, 2 * p - 1);
    int32_t s0 = r, s1 = 2 * p - 1 - r;
    Order o(2 * p);
    auto f0 = [&] { return o.forwards(s0) < m; };
    for (int32_t k = 0; k < 2 * (p - r) - 1 && f0(); ++k) o.f(s0);
    for (int32_t k = 0; k < r && f0(); ++k) {
        o.f(s1);
        o.f(s0);
    }
    for (int32_t k = 0; k < p - r && o.forwards(s1) < o.forwards(s0); ++k) {
        o.f(s1);
        o.i(s1);
        o.w();
    }
    while (o.forwards(s1) < m) {
        if (f0()) o.f(s0);
        o.i(s0);
        o.w();
        o.f(s1);
        o.i(s1);
        o.w();
    }
    // Cool-down: input gradients first; W passes wait in the queue and fill the gaps.
    std::deque<std::pair<int32_t, int32_t>> w0, w1;
    for (int32_t k = 0; k < r && o.backwards(s0) < m; ++k) {
        o.i(s0);
        if (o.backwards(s1) < m) o.i(s1);
    }
    while (o.backwards(s0) < m) {
        o.i(s0);
        // The W of the chunk going up is banked longest: it is needed last.
        auto it = std::find_if(o.pending.begin(), o.pending.end(),
                               [&](auto& x) { return x.first == s0; });
        if (it != o.pending.end()) {
            o.list.push_back(act(s0, K::backward_weight, it->second));
            o.pending.erase(it);
        }
    }
    while (o.backwards(s1) < m) o.i(s1);
    std::stable_partition(o.pending.begin(), o.pending.end(),
                          [&](auto& x) { return x.first == s1; });
    while (!o.pending.empty()) o.w();
    std::erase_if(o.list, [&](const PlanAction& a) { return a.microbatch >= m_given; });
    return o.list;
}

// DualPipeV (DeepSeek 2025, DualPipe cut in half): the V placement of ZBV; in the steady phase
// a forward of one chunk runs overlapped with a full backward of the other (`+` pairs), so the
// communication of one hides behind the computation of the other. Phases as in DeepSeek's
// published dualpipev: forwards of chunk 0, pairs of forwards, B/W/F of chunk 1, the
// overlapped main loop, B then an overlapped pair, both backwards (split in the second half),
// W then I of chunk 0, and the remaining W.
std::vector<PlanAction> dualpipev(int32_t p, int32_t m, int32_t r) {
    int32_t s0 = r, s1 = 2 * p - 1 - r;
    Order o(2 * p);
    for (int32_t k = 0; k < 2 * (p - r - 1); ++k) o.f(s0);
    for (int32_t k = 0; k < r + 1; ++k) {
        o.f(s0);
        o.f(s1);
    }
    for (int32_t k = 0; k < p - r - 1; ++k) {
        o.i(s1);
        o.w();
        o.f(s1);
    }
    for (int32_t k = 0; k < m - 2 * p + r + 1; ++k) {
        o.f(s0);
        o.b(s1);
        // The last rank runs its first pair apart: the two halves depend on each other there.
        if (!(k == 0 && r == p - 1)) o.overlap_last();
        o.f(s1);
        o.b(s0);
        o.overlap_last();
    }
    for (int32_t k = 0; k < p - r - 1; ++k) {
        o.b(s1);
        o.f(s1);
        o.b(s0);
        o.overlap_last();
    }
    bool split = false;
    int32_t n6 = r + 1;
    for (int32_t k = 0; k < n6; ++k) {
        if (k == n6 / 2 && r % 2 == 1) split = true;
        split ? o.i(s1) : o.b(s1);
        if (k == n6 / 2 && r % 2 == 0) split = true;
        split ? o.i(s0) : o.b(s0);
    }
    for (int32_t k = 0; k < p - r - 1; ++k) {
        o.w();
        o.i(s0);
    }
    while (!o.pending.empty()) o.w();
    return o.list;
}

} // namespace

ScheduleOrder compile_schedule(ScheduleKind kind, int32_t p, int32_t m, int32_t v,
                               const ScheduleSpec& spec) {
    ScheduleOrder out;
    auto fail = [&](std::string e, std::string h) {
        out.error = std::move(e);
        out.hint = std::move(h);
        return out;
    };
    std::string name = to_string(kind);
    bool one_stage = kind == ScheduleKind::gpipe || kind == ScheduleKind::one_f_one_b ||
                     kind == ScheduleKind::zb_h1 || kind == ScheduleKind::zb_h2;
    bool vee = kind == ScheduleKind::zbv || kind == ScheduleKind::dualpipev;
    if (p < 1 || m < 1 || v < 1) return fail("p, m and v must be positive", "");
    if (one_stage && v != 1)
        return fail("`" + name + "` runs one stage per rank, not " + std::to_string(v),
                    "use `interleaved_1f1b` or `looped_bfs` for virtual stages");
    if (vee && v != 2)
        return fail("`" + name + "` places exactly two stages on each rank, in a V",
                    "set `virtual_stages: 2`");
    if (kind == ScheduleKind::interleaved_1f1b && (v < 2 || m % p != 0))
        return fail("`interleaved_1f1b` needs virtual_stages >= 2 and microbatches divisible by "
                    "pp = " +
                        std::to_string(p),
                    "use " + std::to_string(((m + p - 1) / p) * p) + " microbatches");
    if ((kind == ScheduleKind::zb_h1 || kind == ScheduleKind::zb_h2) && m < p)
        return fail("`" + name + "` needs at least pp = " + std::to_string(p) + " microbatches",
                    "use " + std::to_string(p) + " or more microbatches");
    if (kind == ScheduleKind::zbv && m < p)
        return fail("`zbv` needs at least pp = " + std::to_string(p) + " microbatches",
                    "use " + std::to_string(p) + " or more microbatches (" +
                        std::to_string(2 * p - 1) + " or more fill the V without a bubble)");
    if (kind == ScheduleKind::dualpipev && m < 2 * p)
        return fail("`dualpipev` needs at least 2 x pp = " + std::to_string(2 * p) +
                        " microbatches",
                    "use " + std::to_string(2 * p) + " or more microbatches");
    int32_t stages = p * v;
    out.stage_rank.resize(static_cast<size_t>(stages));
    for (int32_t s = 0; s < stages; ++s)
        out.stage_rank[static_cast<size_t>(s)] = vee ? (s < p ? s : 2 * p - 1 - s) : s % p;
    if (kind == ScheduleKind::custom) {
        if (spec.stage_ranks.size() != static_cast<size_t>(stages) ||
            spec.actions.size() != static_cast<size_t>(p))
            return fail("the custom table does not cover " + std::to_string(stages) +
                            " stages on " + std::to_string(p) + " ranks",
                        "");
        for (int32_t s = 0; s < stages; ++s)
            out.stage_rank[static_cast<size_t>(s)] =
                static_cast<int32_t>(spec.stage_ranks[static_cast<size_t>(s)]);
    }
    for (int32_t r = 0; r < p; ++r) {
        switch (kind) {
        case ScheduleKind::gpipe: out.ranks.push_back(gpipe(p, m, r)); break;
        case ScheduleKind::one_f_one_b: out.ranks.push_back(one_f_one_b(p, m, r, false)); break;
        case ScheduleKind::zb_h1: out.ranks.push_back(one_f_one_b(p, m, r, true)); break;
        case ScheduleKind::zb_h2: out.ranks.push_back(zb_h2(p, m, r)); break;
        case ScheduleKind::interleaved_1f1b: out.ranks.push_back(interleaved(p, m, v, r)); break;
        case ScheduleKind::looped_bfs: out.ranks.push_back(looped_bfs(p, m, v, r)); break;
        case ScheduleKind::zbv: out.ranks.push_back(zbv(p, m, r)); break;
        case ScheduleKind::dualpipev: out.ranks.push_back(dualpipev(p, m, r)); break;
        case ScheduleKind::custom: {
            std::vector<PlanAction> list;
            for (const ActionSpec& a : spec.actions[static_cast<size_t>(r)]) {
                K k = a.op == 'F'   ? K::forward
                      : a.op == 'B' ? K::backward
                      : a.op == 'I' ? K::backward_input
                                    : K::backward_weight;
                PlanAction x =
                    act(static_cast<int32_t>(a.stage), k, static_cast<int32_t>(a.microbatch));
                x.loc = a.loc;
                list.push_back(x);
            }
            out.ranks.push_back(std::move(list));
            break;
        }
        }
    }
    return out;
}

} // namespace dist::plan
