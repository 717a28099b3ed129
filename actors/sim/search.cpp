// search.cpp: every layout of a script's model on its devices, bounded, simulated, ranked.
#include "actors/sim/search.hpp"

#include "actors/plan/lower.hpp"
#include "actors/plan/schedules.hpp"
#include "actors/plan/stages.hpp"
#include "lang/check.hpp"
#include "lang/program_json.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <numeric>
#include <queue>
#include <thread>
#include <tuple>

namespace dist::sim {

namespace {

std::vector<int64_t> divisors(int64_t n) {
    std::vector<int64_t> out;
    for (int64_t d = 1; d <= n; ++d)
        if (n % d == 0) out.push_back(d);
    return out;
}

/// The schedules (kind, virtual stages) that apply to `pp` ranks and `blocks` blocks.
std::vector<std::pair<ScheduleKind, int64_t>> schedules_for(int64_t pp, int64_t blocks) {
    if (pp == 1) return {{ScheduleKind::one_f_one_b, 1}};
    std::vector<std::pair<ScheduleKind, int64_t>> out = {{ScheduleKind::gpipe, 1},
                                                         {ScheduleKind::one_f_one_b, 1},
                                                         {ScheduleKind::zb_h1, 1},
                                                         {ScheduleKind::zb_h2, 1}};
    // Interleaved stages as Megatron-LM sizes them: an equal number of blocks in each.
    for (int64_t v = 2; pp * v <= blocks; ++v)
        if (blocks % (pp * v) == 0) {
            out.push_back({ScheduleKind::interleaved_1f1b, v});
            out.push_back({ScheduleKind::looped_bfs, v});
        }
    if (2 * pp <= blocks) {
        out.push_back({ScheduleKind::zbv, 2});
        out.push_back({ScheduleKind::dualpipev, 2});
    }
    return out;
}

/// Whether the schedule's rules (lang/check_schedule.cpp) allow m microbatches.
bool microbatches_allowed(ScheduleKind k, int64_t pp, int64_t m) {
    switch (k) {
    case ScheduleKind::interleaved_1f1b: return m % pp == 0;
    case ScheduleKind::zb_h1:
    case ScheduleKind::zb_h2:
    case ScheduleKind::zbv: return m >= pp;
    case ScheduleKind::dualpipev: return m >= 2 * pp;
    default: return true;
    }
}

void apply(const Layout& l, Program& p) {
    p.mesh.zero = l.zero;
    p.schedule.kind = l.kind;
    p.schedule.virtual_stages = l.virtual_stages;
    p.schedule.microbatches = l.microbatches;
    p.schedule.recompute = l.recompute;
    p.schedule.partition.clear();
    p.schedule.partition_given = false;
    p.train.microbatch_size = p.train.batch / (p.mesh.dp * l.microbatches);
}

std::string seconds_text(double s) {
    char buf[32];
    if (s >= 1)
        std::snprintf(buf, sizeof buf, "%.2f s", s);
    else
        std::snprintf(buf, sizeof buf, "%.1f ms", s * 1e3);
    return buf;
}

std::string count_text(double x) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.0f", x);
    std::string s = buf, out;
    for (size_t i = 0; i < s.size(); ++i) {
        if (i > 0 && (s.size() - i) % 3 == 0) out += ',';
        out += s[i];
    }
    return out;
}

std::string gb_text(int64_t bytes) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f GB", static_cast<double>(bytes) / 1e9);
    return buf;
}

std::string percent(double f) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.0f%%", f * 100);
    return buf;
}

/// The fullest device's memory, or on a CPU mesh all ranks' together (they share one memory).
int64_t used_memory(const Timeline& t) {
    if (t.shared_memory) return t.shared_peak_bytes;
    int64_t used = 0;
    for (const RankReport& r : t.ranks) used = std::max(used, r.peak_memory_bytes);
    return used;
}

/// What holds a simulated layout back, in one phrase.
std::string limit_of(const Layout& l, const Timeline& t, const Program& p) {
    if (!t.fits) return "memory: does not fit";
    const int64_t host = p.mesh.profile.devices_per_host;
    if (l.pp > 1 && t.bubble_fraction >= 0.15)
        return "pipeline bubble (" + percent(t.bubble_fraction) + " idle)";
    if (t.bubble_fraction >= 0.15)
        return (l.zero >= 3 ? "ZeRO-3 weight gathers (" : "gradient reduction (") +
               percent(t.bubble_fraction) + " idle)";
    if (host > 0 && l.tp > host) return "tensor-parallel all-reduces across hosts";
    const double used = static_cast<double>(used_memory(t));
    if (t.memory_limit_bytes > 0 && used > 0.9 * static_cast<double>(t.memory_limit_bytes))
        return "memory (" + percent(used / static_cast<double>(t.memory_limit_bytes)) + " used)";
    if (l.pp > 1 && t.bubble_fraction >= 0.05)
        return "compute, then the pipeline bubble (" + percent(t.bubble_fraction) + ")";
    return "compute (MFU " + percent(t.mfu) + ")";
}

/// The script checked with `fo`'s overrides.
lang::CheckResult checked(const SearchOptions& o, const lang::FrontendOptions& fo) {
    return o.text.empty() ? lang::check_file(o.file, fo)
                          : lang::check_text(o.file.string(), o.text, fo);
}

/// A layout checked, planned and simulated exactly as `dist sim --set ...` would.
struct Exact {
    std::optional<SearchRow> row;
    std::string error;
};

Exact simulate_layout(const SearchOptions& o, Layout l, const Program* shape) {
    Exact out;
    if (shape && shape->schedule.partition_given) {
        // The script's partition is for its own stages: state the balanced one for these.
        Program p = *shape;
        apply(l, p);
        const int32_t pp = static_cast<int32_t>(l.pp), v = static_cast<int32_t>(l.virtual_stages);
        plan::ScheduleOrder order = plan::compile_schedule(
            l.kind, pp, static_cast<int32_t>(std::min<int64_t>(l.microbatches, 2 * l.pp)), v);
        l.partition = plan::balanced_partition(p, pp * v, order.stage_rank);
    }
    lang::FrontendOptions fo;
    fo.search_roots = o.search_roots;
    fo.overrides = o.overrides;
    for (std::string& s : overrides_of(l)) fo.overrides.push_back(std::move(s));
    lang::CheckResult r = checked(o, fo);
    if (!r.ok()) {
        out.error = r.report();
        return out;
    }
    plan::PlanResult pr = plan::lower(*r.program, false);
    if (!pr.ok()) {
        out.error = plan::render_errors(o.file.string(), pr.errors);
        return out;
    }
    SimOptions so;
    so.verified = true;
    SimResult s = simulate(*pr.graph, *r.program, so);
    if (!s.ok()) {
        out.error = plan::render_errors(o.file.string(), s.errors);
        return out;
    }
    const Timeline& t = *s.timeline;
    SearchRow row;
    row.layout = l;
    row.step_time_s = t.step_time_s;
    row.tokens_per_s = t.tokens_per_s;
    row.mfu = t.mfu;
    row.bubble = t.bubble_fraction;
    row.fits = t.fits;
    row.memory_limit_bytes = t.memory_limit_bytes;
    row.peak_memory_bytes = used_memory(t);
    row.limit = limit_of(l, t, *r.program);
    out.row = row;
    return out;
}

/// Runs f(i, k) for i = 0 .. n - 1 on up to `threads` threads; k is the thread's index.
void parallel_for(size_t n, int32_t threads, const std::function<void(size_t, size_t)>& f) {
    size_t t = std::min<size_t>(n, static_cast<size_t>(std::max(threads, 1)));
    if (t <= 1) {
        for (size_t i = 0; i < n; ++i) f(i, 0);
        return;
    }
    std::vector<std::thread> pool;
    for (size_t k = 0; k < t; ++k)
        pool.emplace_back([&, k] {
            for (size_t i = k; i < n; i += t) f(i, k);
        });
    for (std::thread& th : pool) th.join();
}

/// Faster first; between equal steps, less memory, then the simpler layout.
bool faster(const SearchRow& a, const SearchRow& b) {
    double tol = 1e-9 * std::max(a.step_time_s, b.step_time_s);
    if (std::abs(a.step_time_s - b.step_time_s) > tol) return a.step_time_s < b.step_time_s;
    const Layout &x = a.layout, &y = b.layout;
    return std::make_tuple(a.peak_memory_bytes, x.cp, x.zero, x.ep, x.tp, x.pp, x.virtual_stages,
                           static_cast<int>(x.recompute), x.sp, x.microbatches,
                           static_cast<int>(x.kind)) <
           std::make_tuple(b.peak_memory_bytes, y.cp, y.zero, y.ep, y.tp, y.pp, y.virtual_stages,
                           static_cast<int>(y.recompute), y.sp, y.microbatches,
                           static_cast<int>(y.kind));
}

/// The same step and the same memory: two layouts a user cannot tell apart by their figures.
bool equivalent(const SearchRow& a, const SearchRow& b) {
    return std::abs(a.step_time_s - b.step_time_s) <=
               1e-9 * std::max(a.step_time_s, b.step_time_s) &&
           a.peak_memory_bytes == b.peak_memory_bytes;
}

struct Candidate {
    Layout layout;
    size_t shape = 0; // index of the checked mesh program it varies
    StepBounds bounds;
};

} // namespace

Layout layout_of(const Program& p) {
    Layout l;
    l.dp = p.mesh.dp;
    l.tp = p.mesh.tp;
    l.pp = p.mesh.pp;
    l.cp = p.mesh.cp;
    l.zero = p.mesh.zero;
    l.sp = p.mesh.sp;
    l.ep = p.model.has_experts() ? p.mesh.ep : 0;
    l.kind = p.schedule.kind;
    l.virtual_stages = p.schedule.virtual_stages;
    l.microbatches = p.schedule.microbatches;
    l.recompute = p.schedule.recompute;
    if (p.schedule.partition_given) l.partition = p.schedule.partition;
    return l;
}

std::vector<std::string> overrides_of(const Layout& l) {
    std::vector<std::string> out = {
        "mesh.dp=" + std::to_string(l.dp),     "mesh.tp=" + std::to_string(l.tp),
        "mesh.pp=" + std::to_string(l.pp),     "mesh.cp=" + std::to_string(l.cp),
        "mesh.zero=" + std::to_string(l.zero), std::string("mesh.sp=") + (l.sp ? "true" : "false"),
    };
    if (l.ep > 0) out.push_back("mesh.ep=" + std::to_string(l.ep));
    for (std::string s : {
             std::string("schedule.kind=") + to_string(l.kind),
             "schedule.virtual_stages=" + std::to_string(l.virtual_stages),
             "schedule.microbatches=" + std::to_string(l.microbatches),
             std::string("schedule.recompute=") + to_string(l.recompute),
         })
        out.push_back(std::move(s));
    if (!l.partition.empty()) {
        std::string s = "schedule.partition=[";
        for (size_t i = 0; i < l.partition.size(); ++i)
            s += (i ? ", " : "") + std::to_string(l.partition[i]);
        out.push_back(s + "]");
    }
    return out;
}

std::string describe(const Layout& l) {
    std::string s = "dp " + std::to_string(l.dp) + " tp " + std::to_string(l.tp) + " pp " +
                    std::to_string(l.pp);
    if (l.cp > 1) s += " cp " + std::to_string(l.cp);
    if (l.sp) s += " sp";
    if (l.zero > 0) s += " zero " + std::to_string(l.zero);
    if (l.ep > 1) s += " ep " + std::to_string(l.ep);
    s += ", ";
    if (l.pp > 1) {
        s += to_string(l.kind);
        if (l.virtual_stages > 1) s += " v" + std::to_string(l.virtual_stages);
        s += ", ";
    }
    s += "m " + std::to_string(l.microbatches);
    if (l.recompute != Recompute::none) s += std::string(", recompute ") + to_string(l.recompute);
    return s;
}

SearchReport search(const SearchOptions& o) {
    const auto began = std::chrono::steady_clock::now();
    SearchReport rep;
    lang::FrontendOptions fo;
    fo.search_roots = o.search_roots;
    fo.overrides = o.overrides;
    lang::CheckResult base = checked(o, fo);
    std::string own_refusal; // why the script's own layout does not check, when it does not
    if (!base.ok() && base.report().find("does not fit") != std::string::npos) {
        // The script's own layout cannot hold the model's state on these devices; sharded over
        // every replica rank (ZeRO 3), it may: the search needs a program, not that layout.
        lang::FrontendOptions sharded = fo;
        sharded.overrides.push_back("mesh.zero=3");
        lang::CheckResult retry = checked(o, sharded);
        if (retry.ok()) {
            own_refusal = base.report();
            base = std::move(retry);
        }
    }
    if (!base.ok()) {
        rep.error = base.report();
        return rep;
    }
    const Program& P = *base.program;
    if (P.schedule.kind == ScheduleKind::custom) {
        rep.error = o.file.string() +
                    ": error: the schedule is a custom `actions` table, which holds for its own "
                    "mesh only\nhint: search explores Dist's schedules: copy the script with "
                    "another `kind` (for example `1f1b`) and search that\n";
        return rep;
    }
    rep.model = P.model.preset.empty() ? P.model.template_name : P.model.preset;
    rep.device = P.mesh.profile.name;
    if (P.mesh.mixed()) rep.device = lang::devices_text(P.mesh);
    rep.devices = P.mesh.devices;
    rep.hosts = P.mesh.hosts;
    rep.batch = P.train.batch;
    rep.context = P.model.context;
    rep.memory_bytes = P.mesh.memory_bytes;
    rep.shared_memory = P.mesh.profile.devices_per_host == 0;
    const HardwareProfile& hw = P.mesh.profile;
    rep.peak_flops = P.train.precision == Precision::bf16 ? hw.peak_flops_bf16 : hw.peak_flops_f32;
    rep.memory_bandwidth = hw.memory_bandwidth;
    rep.intra_bandwidth = hw.intra_host.bandwidth;
    rep.inter_bandwidth = hw.inter_host.bandwidth;
    const size_t K = static_cast<size_t>(std::max(o.top, 1));

    // The script's own layout, exactly.
    // (When it needed ZeRO 3 to check, P is not that layout: the script's stays unplaced.)
    const Layout own = layout_of(P);
    const bool own_checks = own_refusal.empty();
    Exact mine = own_checks ? simulate_layout(o, own, nullptr) : Exact{std::nullopt, own_refusal};
    rep.script = mine.row;
    rep.script_error = mine.error;

    // The meshes: tensor-parallel groups inside a host, as Megatron-LM keeps them; context
    // parallelism where the context splits into 2 cp chunks; no more stages than blocks.
    const int64_t N = P.mesh.devices;
    const int64_t host = P.mesh.profile.devices_per_host;
    const int64_t blocks = static_cast<int64_t>(P.model.blocks.size());
    const int64_t T = P.model.context;
    struct Shape {
        Layout axes;
        std::optional<Program> program;
    };
    std::vector<Shape> shapes;
    // Expert parallelism divides dp x cp and every layer's experts.
    int64_t experts = 0;
    for (const BlockSpec& b : P.model.blocks)
        for (const ModelItemSpec& it : b.items)
            for (const LayerSpec& l : it.layers)
                if (l.kind == LayerKind::moe) experts = std::gcd(experts, l.experts);
    for (int64_t tp : divisors(N)) {
        if (host > 0 && tp > host) continue;
        for (int64_t cp : divisors(N / tp)) {
            if (cp > 1 && T % (2 * cp) != 0) continue;
            for (int64_t pp : divisors(N / (tp * cp))) {
                if (pp > blocks) continue;
                int64_t dp = N / (tp * cp * pp);
                if (P.train.batch % dp != 0) continue;
                for (bool sp : {false, true}) {
                    if (sp && (tp == 1 || (T / cp) % tp != 0)) continue;
                    for (int64_t ep : experts > 0 ? divisors(dp * cp) : std::vector<int64_t>{0}) {
                        if (experts > 0 && experts % ep != 0) continue;
                        Shape s;
                        s.axes.dp = dp;
                        s.axes.tp = tp;
                        s.axes.pp = pp;
                        s.axes.cp = cp;
                        s.axes.sp = sp;
                        s.axes.ep = ep;
                        shapes.push_back(std::move(s));
                    }
                }
            }
        }
    }
    // Each mesh checked once, with the least memory its layouts can take (ZeRO 3 where there
    // are replicas to shard over, full recomputation, one sequence per microbatch): a mesh
    // whose state cannot fit even so is out, with all its layouts.
    std::vector<std::string> shape_errors(shapes.size());
    parallel_for(shapes.size(), o.threads, [&](size_t i, size_t) {
        Layout rep_layout = shapes[i].axes;
        rep_layout.zero = rep_layout.dp * rep_layout.cp > 1 ? 3 : 0;
        rep_layout.recompute = Recompute::full;
        rep_layout.microbatches = P.train.batch / rep_layout.dp;
        if (P.schedule.partition_given) {
            rep_layout.partition.assign(static_cast<size_t>(rep_layout.pp), 0);
            for (int64_t k = 0; k < rep_layout.pp; ++k)
                rep_layout.partition[static_cast<size_t>(k)] =
                    blocks / rep_layout.pp + (k >= rep_layout.pp - blocks % rep_layout.pp);
        }
        lang::FrontendOptions f = fo;
        for (std::string& s : overrides_of(rep_layout)) f.overrides.push_back(std::move(s));
        lang::CheckResult r = checked(o, f);
        if (r.ok())
            shapes[i].program = *r.program;
        else
            shape_errors[i] = r.report();
    });

    // Every layout of every mesh, with its cheap bound and memory floor.
    std::vector<Candidate> candidates;
    bool own_enumerated = false;
    for (size_t i = 0; i < shapes.size(); ++i) {
        const Layout& ax = shapes[i].axes;
        std::vector<Layout> layouts;
        const int64_t replica_batch = P.train.batch / ax.dp;
        // ZeRO where there are replicas to shard over.
        std::vector<int64_t> zeros = {0};
        if (ax.dp * ax.cp > 1) zeros = {0, 1, 2, 3};
        for (int64_t zero : zeros)
            for (Recompute rc : {Recompute::none, Recompute::selective, Recompute::full})
                for (auto [kind, v] : schedules_for(ax.pp, blocks))
                    for (int64_t m : divisors(replica_batch)) {
                        if (!microbatches_allowed(kind, ax.pp, m)) continue;
                        Layout l = ax;
                        l.zero = zero;
                        l.recompute = rc;
                        l.kind = kind;
                        l.virtual_stages = v;
                        l.microbatches = m;
                        layouts.push_back(l);
                    }
        rep.considered += static_cast<int64_t>(layouts.size());
        if (!shapes[i].program) {
            bool memory = shape_errors[i].find("does not fit") != std::string::npos;
            (memory ? rep.pruned_memory : rep.refused) += static_cast<int64_t>(layouts.size());
            continue;
        }
        for (const Layout& l : layouts) {
            Layout key = l;
            key.partition = own.partition;
            if (own_checks && key == own) {
                own_enumerated = true;
                continue; // simulated above
            }
            candidates.push_back({l, i, {}});
        }
    }
    if (own_checks && !own_enumerated) ++rep.considered;
    // The bounds price the stages of the partition the plan will use: found once for each
    // mesh, recomputation, stage count and microbatch size.
    std::map<std::tuple<size_t, int, int64_t, int64_t>, std::vector<int64_t>> partitions;
    std::mutex partitions_lock;
    // One program per thread, copied only when the mesh changes.
    std::vector<std::pair<size_t, std::optional<Program>>> scratch(
        static_cast<size_t>(std::max(o.threads, 1)));
    auto bounded = [&](const Candidate& c, size_t thread) -> const Program& {
        auto& [shape, program] = scratch[thread];
        if (!program || shape != c.shape) {
            program = *shapes[c.shape].program;
            shape = c.shape;
        }
        Program& p = *program;
        apply(c.layout, p);
        // On a mesh of several kinds the partition depends on where each stage sits: the
        // bounds find it with the schedule.
        p.schedule.partition.clear();
        p.schedule.partition_given = false;
        if (p.mesh.mixed()) return p;
        auto key = std::make_tuple(c.shape, static_cast<int>(c.layout.recompute),
                                   c.layout.virtual_stages, c.layout.microbatches);
        std::vector<int64_t> partition;
        {
            std::lock_guard<std::mutex> hold(partitions_lock);
            auto it = partitions.find(key);
            if (it != partitions.end()) partition = it->second;
        }
        if (partition.empty()) {
            partition = plan::balanced_partition(
                p, static_cast<int32_t>(c.layout.pp * c.layout.virtual_stages));
            std::lock_guard<std::mutex> hold(partitions_lock);
            partitions[key] = partition;
        }
        p.schedule.partition = partition;
        p.schedule.partition_given = true;
        return p;
    };
    // The cheap bound depends on the schedule only through where stages sit and whether
    // backwards split (one class per pair of kinds below), and on ZeRO only through the
    // optimizer step: priced once for each class, every ZeRO stage at once.
    auto kind_class = [](ScheduleKind k) {
        switch (k) {
        case ScheduleKind::gpipe:
        case ScheduleKind::one_f_one_b: return 0;
        case ScheduleKind::zb_h1:
        case ScheduleKind::zb_h2: return 1;
        case ScheduleKind::interleaved_1f1b:
        case ScheduleKind::looped_bfs: return 2;
        default: return 3 + static_cast<int>(k);
        }
    };
    std::map<std::tuple<size_t, int, int64_t, int64_t, int>, std::vector<StepBounds>> busy_cache;
    std::mutex busy_lock;
    parallel_for(candidates.size(), o.threads, [&](size_t i, size_t k) {
        Candidate& c = candidates[i];
        auto key =
            std::make_tuple(c.shape, static_cast<int>(c.layout.recompute), c.layout.virtual_stages,
                            c.layout.microbatches, kind_class(c.layout.kind));
        {
            std::lock_guard<std::mutex> hold(busy_lock);
            auto it = busy_cache.find(key);
            if (it != busy_cache.end()) {
                c.bounds = it->second[static_cast<size_t>(c.layout.zero)];
                return;
            }
        }
        const Program& p = bounded(c, k);
        std::vector<StepBounds> all = busy_bounds(p, {0, 1, 2, 3});
        c.bounds = all[static_cast<size_t>(c.layout.zero)];
        std::lock_guard<std::mutex> hold(busy_lock);
        busy_cache.emplace(key, std::move(all));
    });
    std::vector<size_t> order;
    for (size_t i = 0; i < candidates.size(); ++i) {
        const StepBounds& b = candidates[i].bounds;
        if (!b.error.empty())
            ++rep.refused;
        else if (!o.exhaustive && !rep.shared_memory && !b.fits)
            ++rep.pruned_memory;
        else
            order.push_back(i);
    }
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
        return candidates[a].bounds.busy < candidates[b].bounds.busy;
    });

    // Best first: refine the lowest bound, simulate the lowest refined one, until no bound is
    // below the K-th best step found.
    std::vector<SearchRow> best;
    const double own_step = mine.row && mine.row->fits ? mine.row->step_time_s : 0;
    int64_t faster_than_own = 0;
    auto add = [&](const SearchRow& row) {
        if (!row.fits) {
            ++rep.not_fitting;
            return;
        }
        if (row.step_time_s < own_step * (1 - 1e-9)) ++faster_than_own;
        auto at = std::upper_bound(best.begin(), best.end(), row, faster);
        best.insert(at, row);
        // Keep K groups of equivalent layouts (the same step and memory: data and context
        // parallelism traded one for the other, say), whole.
        size_t groups = 0, end = 0;
        for (size_t i = 0; i < best.size(); ++i) {
            if (i == 0 || !equivalent(best[i - 1], best[i])) ++groups;
            if (groups > K) break;
            end = i + 1;
        }
        best.resize(end);
    };
    auto kth_step = [&]() -> double {
        size_t groups = 0;
        for (size_t i = 0; i < best.size(); ++i)
            if (i == 0 || !equivalent(best[i - 1], best[i])) ++groups;
        return groups >= K ? best.back().step_time_s : std::numeric_limits<double>::infinity();
    };
    if (mine.row) add(*mine.row);
    auto later = [&](size_t a, size_t b) {
        return candidates[a].bounds.pipeline > candidates[b].bounds.pipeline;
    };
    std::priority_queue<size_t, std::vector<size_t>, decltype(later)> refined(later);
    const size_t batch = static_cast<size_t>(std::max(o.threads, 1));
    size_t next = 0;
    // Visits the layouts whose bound is at most limit() (at most `budget` simulations); true
    // when none is left.
    auto explore = [&](const std::function<double()>& limit_of, int64_t budget) {
        const double inf = std::numeric_limits<double>::infinity();
        int64_t spent = 0;
        while (true) {
            double k0 = next < order.size() ? candidates[order[next]].bounds.busy : inf;
            double k1 = refined.empty() ? inf : candidates[refined.top()].bounds.pipeline;
            double limit = limit_of();
            if (std::min(k0, k1) == inf || std::min(k0, k1) > limit) return true;
            if (spent >= budget) return false;
            std::vector<size_t> work;
            if (k0 <= k1) {
                while (work.size() < batch && next < order.size() &&
                       candidates[order[next]].bounds.busy <= limit)
                    work.push_back(order[next++]);
                parallel_for(work.size(), o.threads, [&](size_t w, size_t k) {
                    Candidate& c = candidates[work[w]];
                    pipeline_bound(bounded(c, k), c.bounds);
                    c.bounds.pipeline = std::max(c.bounds.pipeline, c.bounds.busy);
                });
                for (size_t i : work) {
                    const StepBounds& b = candidates[i].bounds;
                    if (!b.error.empty())
                        ++rep.refused;
                    else if (!o.exhaustive && b.memory_known && !b.fits)
                        ++rep.pruned_memory;
                    else
                        refined.push(i);
                }
            } else {
                while (work.size() < batch && !refined.empty() &&
                       candidates[refined.top()].bounds.pipeline <= limit) {
                    work.push_back(refined.top());
                    refined.pop();
                }
                std::vector<Exact> done(work.size());
                parallel_for(work.size(), o.threads, [&](size_t w, size_t) {
                    const Candidate& c = candidates[work[w]];
                    done[w] = simulate_layout(o, c.layout, &*shapes[c.shape].program);
                });
                spent += static_cast<int64_t>(work.size());
                for (const Exact& e : done) {
                    if (!e.row) {
                        ++rep.refused;
                        continue;
                    }
                    ++rep.simulated;
                    add(*e.row);
                }
            }
        }
    };
    // A layout whose bound equals the K-th best step may tie with it, and win on memory or
    // simplicity (`faster`): only those strictly slower are pruned.
    explore(
        [&] {
            return o.exhaustive ? std::numeric_limits<double>::infinity() : kth_step() * (1 + 1e-9);
        },
        std::numeric_limits<int64_t>::max());
    // One row per group, the script's own layout standing for its group.
    std::vector<SearchRow> rows;
    for (size_t i = 0; i < best.size(); ++i) {
        if (i == 0 || !equivalent(best[i - 1], best[i])) {
            rows.push_back(best[i]);
            rows.back().equivalent = 0;
        } else {
            ++rows.back().equivalent;
        }
        if (mine.row && mine.row->fits && best[i].layout == own) {
            int64_t n = rows.back().equivalent;
            rows.back() = best[i];
            rows.back().equivalent = n;
            rep.script_rank = static_cast<int64_t>(rows.size());
        }
    }
    // Below the rows: its place among all layouts, from those strictly faster (within a
    // budget of simulations; past it, a floor).
    if (own_step > 0 && rep.script_rank == 0) {
        int64_t before = rep.simulated;
        bool all = explore([&] { return own_step * (1 - 1e-9); }, o.rank_budget);
        rep.simulated_placing = rep.simulated - before;
        rep.script_place = faster_than_own + 1;
        rep.script_place_exact = all;
    }
    rep.pruned_bound = static_cast<int64_t>(order.size() - next + refined.size());
    if (mine.row) ++rep.simulated;
    rep.rows = rows;
    rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
    return rep;
}

std::string search_text(const SearchReport& r) {
    if (!r.error.empty()) return r.error;
    std::string out =
        "search: " + r.model + " on " +
        (r.device.find(" x ") != std::string::npos ? r.device
                                                   : std::to_string(r.devices) + " x " + r.device);
    if (r.hosts > 1) out += " (" + std::to_string(r.hosts) + " hosts)";
    out += ", batch " + std::to_string(r.batch) + " x " + std::to_string(r.context) + " tokens, " +
           gb_text(r.memory_bytes) + (r.shared_memory ? " shared by all ranks\n" : " per device\n");
    // Columns sized to their widest cell.
    std::vector<std::vector<std::string>> cells = {
        {"#", "layout", "step", "tokens/s", "MFU", "bubble", "memory", "limited by"}};
    for (size_t i = 0; i < r.rows.size(); ++i) {
        const SearchRow& row = r.rows[i];
        bool own = r.script_rank == static_cast<int64_t>(i) + 1;
        char mfu[16], bubble[16];
        std::snprintf(mfu, sizeof mfu, "%.1f%%", row.mfu * 100);
        std::snprintf(bubble, sizeof bubble, "%.1f%%", row.bubble * 100);
        std::string layout = describe(row.layout);
        if (row.equivalent > 0) layout += " (+" + std::to_string(row.equivalent) + " alike)";
        cells.push_back({std::to_string(i + 1) + (own ? "*" : ""), layout,
                         seconds_text(row.step_time_s), count_text(row.tokens_per_s), mfu, bubble,
                         gb_text(row.peak_memory_bytes), row.limit});
    }
    std::vector<size_t> width(cells[0].size(), 0);
    for (const auto& line : cells)
        for (size_t c = 0; c < line.size(); ++c) width[c] = std::max(width[c], line[c].size());
    for (const auto& line : cells) {
        std::string text;
        for (size_t c = 0; c < line.size(); ++c) {
            bool right = c == 2 || c == 3 || c == 4 || c == 5 || c == 6;
            std::string pad(width[c] - line[c].size(), ' ');
            std::string cell = right ? pad + line[c] : line[c] + (c + 1 < line.size() ? pad : "");
            text += (c ? "  " : "") + cell;
        }
        out += text + "\n";
    }
    if (r.rows.empty()) out += "(no layout fits)\n";
    bool alike = false;
    for (const SearchRow& row : r.rows) alike = alike || row.equivalent > 0;
    if (alike) out += "(+N alike: N more layouts with the same step and memory)\n";
    if (r.script) {
        const SearchRow& s = *r.script;
        if (r.script_rank > 0) {
            out += "* the script's layout\n";
        } else if (!s.fits) {
            out += "the script's layout (" + describe(s.layout) +
                   ") does not fit: " + gb_text(s.peak_memory_bytes) + " on its fullest device\n";
        } else if (!r.rows.empty()) {
            char ratio[32];
            std::snprintf(ratio, sizeof ratio, "%.2fx", s.step_time_s / r.rows[0].step_time_s);
            std::string place = r.script_place == 1
                                    ? "as fast as the best (a tie)"
                                    : (r.script_place_exact ? "rank " : "rank beyond ") +
                                          count_text(static_cast<double>(r.script_place));
            out += "the script's layout (" + describe(s.layout) + "): step " +
                   seconds_text(s.step_time_s) + " (" + ratio + " the best), " + place + "\n";
        }
    } else if (!r.script_error.empty()) {
        out += "the script's own layout does not plan:\n" + r.script_error;
    }
    char secs[32];
    std::snprintf(secs, sizeof secs, "%.1f s", r.seconds);
    out += "layouts: " + count_text(static_cast<double>(r.considered)) + " considered, " +
           count_text(static_cast<double>(r.simulated)) + " simulated" +
           (r.simulated_placing > 0 ? " (" + count_text(static_cast<double>(r.simulated_placing)) +
                                          " to place the script's)"
                                    : "") +
           ", " + count_text(static_cast<double>(r.pruned_memory)) + " pruned by memory, " +
           count_text(static_cast<double>(r.pruned_bound)) + " pruned by their bound, " +
           count_text(static_cast<double>(r.refused)) + " refused by the rules";
    if (r.not_fitting > 0)
        out += ", " + count_text(static_cast<double>(r.not_fitting)) + " did not fit";
    out += " (" + std::string(secs) + ")\n";
    return out;
}

namespace {

nlohmann::json row_json(const SearchRow& row, const std::vector<std::string>& extra) {
    const Layout& l = row.layout;
    nlohmann::json layout = {{"dp", l.dp},
                             {"tp", l.tp},
                             {"pp", l.pp},
                             {"cp", l.cp},
                             {"zero", l.zero},
                             {"sp", l.sp},
                             {"schedule", to_string(l.kind)},
                             {"virtual_stages", l.virtual_stages},
                             {"microbatches", l.microbatches},
                             {"recompute", to_string(l.recompute)}};
    if (!l.partition.empty()) layout["partition"] = l.partition;
    if (l.ep > 0) layout["ep"] = l.ep;
    std::vector<std::string> set = extra;
    for (std::string& o : overrides_of(l)) set.push_back(std::move(o));
    return {{"layout", layout},
            {"describe", describe(l)},
            {"set", set},
            {"step_time_s", row.step_time_s},
            {"tokens_per_s", row.tokens_per_s},
            {"mfu", row.mfu},
            {"bubble", row.bubble},
            {"peak_memory_bytes", row.peak_memory_bytes},
            {"fits", row.fits},
            {"limited_by", row.limit},
            {"equivalent", row.equivalent}};
}

} // namespace

nlohmann::json to_json(const SearchReport& r) {
    nlohmann::json j;
    if (!r.error.empty()) {
        j["error"] = r.error;
        return j;
    }
    j["model"] = r.model;
    j["device"] = r.device;
    j["devices"] = r.devices;
    j["hosts"] = r.hosts;
    j["batch"] = r.batch;
    j["context"] = r.context;
    j["memory_bytes"] = r.memory_bytes;
    j["rows"] = nlohmann::json::array();
    for (size_t i = 0; i < r.rows.size(); ++i) {
        nlohmann::json row = row_json(r.rows[i], r.extra);
        row["rank"] = i + 1;
        j["rows"].push_back(row);
    }
    if (r.script) {
        j["script"] = row_json(*r.script, r.extra);
        j["script"]["rank"] = r.script_rank > 0 ? r.script_rank : r.script_place;
        j["script"]["rank_exact"] = r.script_rank > 0 || r.script_place_exact;
    } else {
        j["script"] = {{"error", r.script_error}};
    }
    j["layouts"] = {
        {"considered", r.considered},     {"simulated_placing_the_script", r.simulated_placing},
        {"simulated", r.simulated},       {"pruned_memory", r.pruned_memory},
        {"pruned_bound", r.pruned_bound}, {"refused", r.refused},
        {"not_fitting", r.not_fitting}};
    j["seconds"] = r.seconds;
    return j;
}

std::string changes_text(const std::vector<SearchReport>& reports) {
    std::string out;
    const SearchReport* prev = nullptr;
    for (const SearchReport& r : reports) {
        if (!r.error.empty() || r.rows.empty()) continue;
        const SearchRow& b = r.rows[0];
        out += "- " +
               (r.device.find(" x ") != std::string::npos
                    ? r.device
                    : std::to_string(r.devices) + " x " + r.device) +
               ": " + describe(b.layout) + ", " + count_text(b.tokens_per_s) +
               " tokens/s, limited by " + b.limit + "\n";
        if (prev) {
            const SearchRow& a = prev->rows[0];
            const Layout &x = a.layout, &y = b.layout;
            std::vector<std::string> moved;
            auto axis = [&](const char* name, int64_t from, int64_t to) {
                if (from != to)
                    moved.push_back(std::string(name) + " " + std::to_string(from) + " -> " +
                                    std::to_string(to));
            };
            axis("dp", x.dp, y.dp);
            axis("tp", x.tp, y.tp);
            axis("pp", x.pp, y.pp);
            axis("cp", x.cp, y.cp);
            axis("zero", x.zero, y.zero);
            axis("ep", x.ep, y.ep);
            axis("microbatches", x.microbatches, y.microbatches);
            if (x.kind != y.kind)
                moved.push_back(std::string("schedule ") + to_string(x.kind) + " -> " +
                                to_string(y.kind));
            if (x.recompute != y.recompute)
                moved.push_back(std::string("recompute ") + to_string(x.recompute) + " -> " +
                                to_string(y.recompute));
            char speed[32];
            std::snprintf(speed, sizeof speed, "%.2fx", b.tokens_per_s / a.tokens_per_s);
            out += "  from " + prev->device + ": " +
                   (moved.empty() ? std::string("the same layout") : "");
            for (size_t i = 0; i < moved.size(); ++i) out += (i ? ", " : "") + moved[i];
            out += std::string("; ") + speed + " the tokens/s";
            auto kind = [](const std::string& limit) { return limit.substr(0, limit.find(" (")); };
            if (kind(a.limit) != kind(b.limit))
                out += "; the limit moves from " + a.limit + " to " + b.limit;
            out += "\n";
            // Why: what differs between the two devices.
            std::vector<std::string> why;
            auto ratio = [&](const char* what, double x, double y) {
                if (x <= 0 || y <= 0 || std::abs(y / x - 1) < 0.01) return;
                char buf[96];
                std::snprintf(buf, sizeof buf, "%.2fx the %s", y / x, what);
                why.push_back(buf);
            };
            ratio("FLOP/s", prev->peak_flops, r.peak_flops);
            ratio("memory", static_cast<double>(prev->memory_bytes),
                  static_cast<double>(r.memory_bytes));
            ratio("memory bandwidth", prev->memory_bandwidth, r.memory_bandwidth);
            ratio("bandwidth in a host", prev->intra_bandwidth, r.intra_bandwidth);
            ratio("bandwidth between hosts", prev->inter_bandwidth, r.inter_bandwidth);
            // (Between meshes of several kinds the first kind's figures would not tell.)
            bool mixed = r.device.find(" + ") != std::string::npos ||
                         prev->device.find(" + ") != std::string::npos;
            if (!why.empty() && !mixed) {
                out += "  (the device has ";
                for (size_t i = 0; i < why.size(); ++i)
                    out += (i == 0 ? "" : i + 1 == why.size() ? " and " : ", ") + why[i];
                out += ")\n";
            }
        }
        prev = &r;
    }
    return out;
}

} // namespace dist::sim
