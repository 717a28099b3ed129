// hardware.cpp: reading hardware profiles with toml++.
#include "lang/hardware.hpp"

#include <toml++/toml.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

namespace dist::lang {

namespace {

SourceLoc region_loc(uint32_t file, const toml::source_region& r, size_t length = 1) {
    return {file, static_cast<uint32_t>(std::max<toml::source_index>(r.begin.line, 1)),
            static_cast<uint32_t>(std::max<toml::source_index>(r.begin.column, 1)),
            static_cast<uint32_t>(std::max<size_t>(length, 1))};
}

SourceLoc node_loc(uint32_t file, const toml::node* node, const toml::table& root) {
    return region_loc(file, node ? node->source() : root.source());
}

class Reader {
  public:
    Reader(const toml::table& root, uint32_t file, Diagnostics& diags)
        : root_(root), file_(file), diags_(diags) {}

    /// `path` is a key of the profile, read other than through this reader.
    void mark(std::string_view path) { read_.insert(std::string(path)); }

    /// An error at every key of the table that nothing read: a misspelt key would otherwise
    /// leave its setting out without a word. `what` names the table in the message.
    void refuse_unread(const std::string& what) const { refuse_unread(root_, "", what); }

    // A positive number at a dotted path (integers and floats both accepted).
    double number(std::string_view path, bool required = true) {
        mark(path);
        toml::node_view<const toml::node> n = root_.at_path(path);
        if (!n) {
            if (required)
                diags_.error(node_loc(file_, nullptr, root_),
                             "hardware profile has no `" + std::string(path) + "`");
            return 0.0;
        }
        std::optional<double> v = n.value<double>();
        if (!v || !(*v > 0.0) || !std::isfinite(*v)) {
            diags_.error(node_loc(file_, n.node(), root_),
                         "`" + std::string(path) + "` must be a positive number");
            return 0.0;
        }
        return *v;
    }

    // A positive whole number (a count, a size in bytes or elements): 64.5 is refused, not
    // truncated; 8e10 and 64.0 are whole.
    int64_t whole(std::string_view path, bool required = true) {
        double v = number(path, required);
        if (v == 0.0) return 0;
        if (v != std::floor(v) || v > 9.0e18) {
            diags_.error(node_loc(file_, root_.at_path(path).node(), root_),
                         "`" + std::string(path) + "` must be a whole number");
            return 0;
        }
        return static_cast<int64_t>(v);
    }

    std::string string(std::string_view path, bool required = true) {
        mark(path);
        toml::node_view<const toml::node> n = root_.at_path(path);
        if (!n) {
            if (required)
                diags_.error(node_loc(file_, nullptr, root_),
                             "hardware profile has no `" + std::string(path) + "`");
            return {};
        }
        std::optional<std::string> v = n.value<std::string>();
        if (!v) {
            diags_.error(node_loc(file_, n.node(), root_),
                         "`" + std::string(path) + "` must be a string");
            return {};
        }
        return *v;
    }

    /// N numbers at `path` (absent: `out` kept), each positive, or at least 0 with `zero`.
    template <size_t N>
    void numbers(std::string_view path, std::array<double, N>& out, bool zero,
                 const std::string& what) {
        mark(path);
        toml::node_view<const toml::node> n = root_.at_path(path);
        if (!n) return;
        const toml::array* list = n.as_array();
        bool good = list && list->size() == N;
        std::array<double, N> v{};
        for (size_t i = 0; good && i < N; ++i) {
            v[i] = (*list)[i].value<double>().value_or(-1.0);
            good = (zero ? v[i] >= 0 : v[i] > 0) && std::isfinite(v[i]);
        }
        if (good)
            out = v;
        else
            diags_.error(node_loc(file_, n.node(), root_),
                         "`" + std::string(path) + "` must be " + what);
    }

    /// An error at the value of `path` (at the table's own place without it).
    void refuse(std::string_view path, const std::string& why) {
        toml::node_view<const toml::node> n = root_.at_path(path);
        diags_.error(node_loc(file_, n ? n.node() : nullptr, root_), why);
    }

    /// An array of tables at `path` (absent: empty), each read by `row`.
    template <typename Row> void rows(std::string_view path, const Row& row) {
        mark(path);
        toml::node_view<const toml::node> n = root_.at_path(path);
        if (!n) return;
        const toml::array* list = n.as_array();
        if (!list) {
            diags_.error(node_loc(file_, n.node(), root_),
                         "`" + std::string(path) + "` must be an array of tables");
            return;
        }
        for (const toml::node& e : *list) {
            const toml::table* t = e.as_table();
            if (!t) {
                diags_.error(node_loc(file_, &e, root_),
                             "`" + std::string(path) + "` must be an array of tables");
                continue;
            }
            Reader inner(*t, file_, diags_);
            row(inner);
            inner.refuse_unread("a `" + std::string(path) + "` row");
        }
    }

  private:
    void refuse_unread(const toml::table& table, const std::string& prefix,
                       const std::string& what) const {
        for (const auto& [key, node] : table) {
            const std::string path = prefix + std::string(key.str());
            if (read_.count(path)) continue;
            const toml::table* inner = node.as_table();
            auto below = read_.lower_bound(path + ".");
            if (inner && below != read_.end() && below->rfind(path + ".", 0) == 0) {
                refuse_unread(*inner, path + ".", what);
                continue;
            }
            diags_.error(region_loc(file_, key.source(), key.str().size()),
                         "`" + path + "` is not a key of " + what);
        }
    }

    const toml::table& root_;
    uint32_t file_;
    Diagnostics& diags_;
    std::set<std::string> read_; // the paths asked for, present or not
};

int32_t count(Reader& r, std::string_view key) {
    int64_t n = r.whole(key);
    return n > INT32_MAX ? INT32_MAX : static_cast<int32_t>(n);
}

void read_calibration(Reader& r, const toml::table& root, uint32_t file, Diagnostics& diags,
                      Calibration& c) {
    if (!root.contains("calibration")) return;
    c.command = r.string("calibration.command");
    c.date = r.string("calibration.date");
    c.took_s = r.number("calibration.seconds", false);
    if (root.at_path("calibration.device")) {
        c.device = r.string("calibration.device");
        if (c.device != "cpu" && c.device != "cuda")
            diags.error(node_loc(file, root.at_path("calibration.device").node(), root),
                        "`calibration.device` is \"cpu\" or \"cuda\", not \"" + c.device + "\"");
    }
    c.cores = count(r, "calibration.cores");
    c.slice_s = r.number("calibration.slice", false);
    c.wake_s = r.number("calibration.wake", false);
    c.cache_bytes = r.whole("calibration.cache_bytes", false);
    c.collective_wait_s = r.number("calibration.collective_wait", false);
    c.core_spread = r.number("calibration.core_spread", false);
    if (c.core_spread >= 0.5) {
        diags.error(node_loc(file, root.at_path("calibration.core_spread").node(), root),
                    "`calibration.core_spread` is a fraction of a core's pace below 0.5");
        c.core_spread = 0;
    }
    r.numbers("calibration.scales", c.actions.scales, false, "four positive numbers");
    r.numbers("calibration.block_overhead", c.actions.block_overhead_s, true,
              "two numbers of seconds, at least 0");
    r.rows("calibration.fewer_threads", [&](Reader& t) {
        WholeActions a;
        a.threads = count(t, "threads");
        t.numbers("scales", a.scales, false, "four positive numbers");
        t.numbers("block_overhead", a.block_overhead_s, true, "two numbers of seconds, at least 0");
        c.fewer_threads.push_back(a);
    });
    r.rows("calibration.by_width", [&](Reader& t) {
        WholeActions a;
        a.threads = count(t, "threads");
        a.width = count(t, "width");
        a.tokens = t.whole("tokens", false);
        a.blocks = static_cast<int32_t>(t.whole("blocks", false));
        t.numbers("scales", a.scales, false, "four positive numbers");
        t.numbers("block_overhead", a.block_overhead_s, true, "two numbers of seconds, at least 0");
        t.numbers("first_end", a.first_end, false, "two positive numbers");
        c.by_width.push_back(a);
    });
    r.rows("calibration.matmul", [&](Reader& t) {
        c.matmul.push_back({t.string("kernel"), t.whole("m"), t.whole("n"), t.whole("k"),
                            count(t, "threads"), t.number("flops"), t.number("warm", false)});
    });
    if (root.at_path("calibration.pace")) {
        // One forward (out = in weight^T) of sides the calibration's grid has (to 2048): a row
        // edited to a side of a billion would not ask a run for gigabytes.
        MatmulRate p{r.string("calibration.pace.kernel"),
                     r.whole("calibration.pace.m"),
                     r.whole("calibration.pace.n"),
                     r.whole("calibration.pace.k"),
                     count(r, "calibration.pace.threads"),
                     0,
                     0};
        p.warm = p.flops = r.number("calibration.pace.flops");
        if (p.kernel != "nt")
            r.refuse("calibration.pace.kernel",
                     "`calibration.pace.kernel` is \"nt\" (a forward), not \"" + p.kernel + "\"");
        else if (std::max({p.m, p.n, p.k}) > 4096)
            r.refuse("calibration.pace", "`calibration.pace` times a matmul of sides up to 4096");
        else if (p.m > 0 && p.n > 0 && p.k > 0 && p.threads > 0 && p.warm > 0)
            c.pace = p;
    }
    r.rows("calibration.attention", [&](Reader& t) {
        c.attention.push_back({t.whole("seq"), t.whole("head_dim"), count(t, "threads"),
                               t.number("forward"), t.number("backward")});
    });
    r.rows("calibration.elementwise", [&](Reader& t) {
        c.elementwise.push_back({t.string("op"), t.whole("elements"), count(t, "threads"),
                                 t.number("forward"), t.number("backward")});
    });
    r.rows("calibration.oversubscribed", [&](Reader& t) {
        // Rows written before ranks per core were measured are of twice as many as cores.
        const double per_core = t.number("ranks_per_core", false);
        const int64_t tp = t.whole("tp", false);
        c.oversubscribed.push_back({per_core > 0 ? per_core : 2.0,
                                    static_cast<double>(count(t, "width")), t.number("work"),
                                    static_cast<int32_t>(std::clamp<int64_t>(tp, 1, 1 << 20))});
    });
    std::sort(c.oversubscribed.begin(), c.oversubscribed.end());
    r.rows("calibration.reuse", [&](Reader& t) {
        // A forward's cost may not have been told from nothing: absent, it is none.
        c.reuse.push_back({std::max(1, count(t, "threads")), t.number("distance"),
                           t.number("forward", false), t.number("backward")});
    });
    std::sort(c.reuse.begin(), c.reuse.end());
    r.rows("calibration.split_backward", [&](Reader& t) {
        SplitRow row{count(t, "threads"), t.number("input"), t.number("weight")};
        for (const SplitRow& before : c.split_backward)
            if (row.threads > 0 && before.threads == row.threads)
                t.refuse("threads", "`split_backward` has two rows of " +
                                        std::to_string(row.threads) +
                                        (row.threads == 1 ? " thread" : " threads"));
        c.split_backward.push_back(row);
    });
    std::sort(c.split_backward.begin(), c.split_backward.end());
    r.rows("calibration.sharing", [&](Reader& t) {
        c.sharing.push_back({count(t, "threads"), t.number("speed"), t.number("bytes", false)});
    });
    r.rows("calibration.transfer", [&](Reader& t) {
        c.transfers.push_back({t.string("transport"), t.whole("bytes"), t.number("seconds")});
    });
    r.rows("calibration.collective", [&](Reader& t) {
        c.collectives.push_back({t.string("backend"), t.string("op"), count(t, "ranks"),
                                 t.whole("bytes"), t.number("seconds")});
    });
    if (c.matmul.empty() || (c.sharing.empty() && !c.gpu()))
        diags.error(node_loc(file, root.at_path("calibration").node(), root),
                    c.gpu() ? "a calibration needs its `matmul` rows"
                            : "a calibration of a CPU needs its `matmul` and `sharing` rows");
    if (c.gpu() && !root.at_path("host.devices"))
        diags.error(node_loc(file, root.at_path("calibration").node(), root),
                    "a calibration of a GPU needs `[host] devices`, the GPUs of a host");
}

} // namespace

std::optional<HardwareProfile> load_profile(const std::filesystem::path& path,
                                            SourceManager& sources, Diagnostics& diags) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    uint32_t file = sources.add(path.string(), ss.str());
    size_t before = diags.error_count();
    toml::table root;
    try {
        root = toml::parse(sources.file(file).text(), path.string());
    } catch (const toml::parse_error& e) {
        diags.error(region_loc(file, e.source()),
                    "invalid hardware profile: " + std::string(e.description()));
        return std::nullopt;
    }
    Reader r(root, file, diags);
    HardwareProfile p;
    p.path = path.string();
    p.name = r.string("name");
    p.description = r.string("description", false);
    r.mark("aliases");
    r.mark("compute.matmul_efficiency");
    if (const toml::array* aliases = root["aliases"].as_array()) {
        for (const auto& a : *aliases) {
            if (auto s = a.value<std::string>())
                p.aliases.push_back(*s);
            else
                diags.error(node_loc(file, &a, root), "`aliases` must be a list of strings");
        }
    }
    p.peak_flops_f32 = r.number("compute.peak_flops_f32");
    p.peak_flops_bf16 = r.number("compute.peak_flops_bf16");
    p.memory_bytes = r.whole("memory.bytes");
    p.memory_bandwidth = r.number("memory.bandwidth");
    if (root.at_path("host.devices")) {
        p.devices_per_host = r.whole("host.devices");
    }
    p.intra_host.bandwidth = r.number("links.intra_host.bandwidth");
    p.intra_host.latency = r.number("links.intra_host.latency");
    p.inter_host.bandwidth = r.number("links.inter_host.bandwidth");
    p.inter_host.latency = r.number("links.inter_host.latency");
    if (const toml::array* curve = root.at_path("compute.matmul_efficiency").as_array()) {
        // [[width, efficiency], ...], widths ascending.
        for (const toml::node& point : *curve) {
            const toml::array* pair = point.as_array();
            double w = 0, e = 0;
            if (pair && pair->size() == 2) {
                w = (*pair)[0].value<double>().value_or(0.0);
                e = (*pair)[1].value<double>().value_or(0.0);
            }
            if (!(w > 0) || !(e > 0) || e > 1 ||
                (!p.matmul_efficiency_by_width.empty() &&
                 w <= p.matmul_efficiency_by_width.back().first)) {
                diags.error(node_loc(file, &point, root),
                            "`matmul_efficiency` points are [width, efficiency] pairs, widths "
                            "ascending, efficiencies in (0, 1]");
                break;
            }
            p.matmul_efficiency_by_width.push_back({w, e});
        }
    } else {
        p.matmul_efficiency = r.number("compute.matmul_efficiency", false);
        if (p.matmul_efficiency > 1.0)
            diags.error(node_loc(file, root.at_path("compute.matmul_efficiency").node(), root),
                        "`matmul_efficiency` is a fraction of peak, at most 1");
    }
    p.attention_efficiency = r.number("compute.attention_efficiency", false);
    if (p.attention_efficiency > 1.0)
        diags.error(node_loc(file, root.at_path("compute.attention_efficiency").node(), root),
                    "`attention_efficiency` is a fraction of peak, at most 1");
    p.attention_block = r.whole("compute.attention_block", false);
    p.overlap_slowdown = r.number("compute.overlap_slowdown", false);
    read_calibration(r, root, file, diags, p.calibration);
    if (p.overlap_slowdown > 0 && p.calibration.cores > 0 && !p.calibration.gpu())
        diags.error(node_loc(file, root.at_path("compute.overlap_slowdown").node(), root),
                    "a CPU's calibration prices its collectives' threads on the shared cores as "
                    "measured; `overlap_slowdown` is for a device's compute beside its own "
                    "collectives",
                    "remove it, or calibrate with `--device cuda` on a GPU");
    r.refuse_unread("a hardware profile");
    if (diags.error_count() > before) return std::nullopt;
    return p;
}

std::vector<std::filesystem::path> profile_files(const std::vector<std::filesystem::path>& roots) {
    std::vector<std::filesystem::path> out;
    std::vector<std::string> seen;
    for (const auto& root : roots) {
        std::error_code ec;
        std::filesystem::path dir = root / "hardware";
        if (!std::filesystem::is_directory(dir, ec)) continue;
        std::vector<std::filesystem::path> here;
        for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
            if (entry.path().extension() == ".toml" && entry.is_regular_file(ec))
                here.push_back(entry.path());
        }
        std::sort(here.begin(), here.end());
        for (const auto& p : here) {
            std::string stem = p.stem().string();
            if (std::find(seen.begin(), seen.end(), stem) != seen.end()) continue;
            seen.push_back(stem);
            out.push_back(p);
        }
    }
    return out;
}

} // namespace dist::lang

namespace dist {

namespace {

// The fit at `x` between fits `a` at xa and `b` at xb, weighted by log x.
WholeActions between(const WholeActions& a, double xa, const WholeActions& b, double xb, double x) {
    const double f = std::log(x / xa) / std::log(xb / xa);
    WholeActions out = a;
    for (size_t k = 0; k < 4; ++k) out.scales[k] = a.scales[k] + f * (b.scales[k] - a.scales[k]);
    for (size_t k = 0; k < 2; ++k) {
        out.block_overhead_s[k] =
            a.block_overhead_s[k] + f * (b.block_overhead_s[k] - a.block_overhead_s[k]);
        out.first_end[k] = a.first_end[k] > 0 && b.first_end[k] > 0
                               ? a.first_end[k] + f * (b.first_end[k] - a.first_end[k])
                               : 0.0;
    }
    return out;
}

// The fit at `x` of the fits `by` (key: their x), sorted by it: between the nearest two, or the
// nearest outside them.
template <typename Key> WholeActions along(std::vector<WholeActions> by, const Key& key, double x) {
    std::sort(by.begin(), by.end(),
              [&](const WholeActions& a, const WholeActions& b) { return key(a) < key(b); });
    if (x <= key(by.front())) return by.front();
    for (size_t i = 1; i < by.size(); ++i) {
        if (x == key(by[i])) return by[i]; // a + (b - a) need not be b in floating point
        if (x < key(by[i])) return between(by[i - 1], key(by[i - 1]), by[i], key(by[i]), x);
    }
    return by.back();
}

} // namespace

double log_between(const std::vector<std::pair<double, double>>& points, double x) {
    if (points.empty()) return 0.0;
    if (x <= points.front().first) return points.front().second;
    for (size_t i = 1; i < points.size(); ++i) {
        const auto [x0, y0] = points[i - 1];
        const auto [x1, y1] = points[i];
        if (x <= x1) return y0 + std::log(x / x0) / std::log(x1 / x0) * (y1 - y0);
    }
    return points.back().second;
}

double Calibration::oversubscribed_work(double width, double ranks_per_core,
                                        bool tensor_parallel) const {
    if (oversubscribed.empty()) return 1.0;
    const bool groups = tensor_parallel && std::any_of(oversubscribed.begin(), oversubscribed.end(),
                                                       [](const auto& row) { return row.tp > 1; });
    std::map<double, std::vector<std::pair<double, double>>> widths; // by ranks per core
    for (const OversubscribedRow& row : oversubscribed)
        if ((row.tp > 1) == groups) widths[row.ranks_per_core].push_back({row.width, row.work});
    if (widths.empty()) return 1.0;
    std::vector<std::pair<double, double>> counts; // (ranks per core, work at `width`)
    for (const auto& [per_core, rows] : widths)
        counts.push_back({per_core, log_between(rows, width)});
    return log_between(counts, ranks_per_core);
}

double Calibration::reuse_cost(double threads, double distance, bool backward) const {
    if (reuse.empty() || distance <= 0) return 0.0;
    // The measured thread count nearest `threads` (in log threads).
    int32_t count = reuse.front().threads;
    for (const ReuseRow& row : reuse)
        if (std::abs(std::log(row.threads / threads)) < std::abs(std::log(count / threads)))
            count = row.threads;
    std::vector<std::pair<double, double>> rows;
    for (const ReuseRow& row : reuse)
        if (row.threads == count)
            rows.push_back({row.distance, backward ? row.backward : row.forward});
    if (distance < rows.front().first) return rows.front().second * distance / rows.front().first;
    return log_between(rows, distance);
}

std::pair<double, double> Calibration::split_factors(double threads) const {
    std::vector<std::pair<double, double>> input, weight;
    for (const SplitRow& row : split_backward) {
        input.push_back({row.threads, row.input});
        weight.push_back({row.threads, row.weight});
    }
    if (input.empty()) return {1.0, 1.0};
    return {log_between(input, threads), log_between(weight, threads)};
}

WholeActions Calibration::whole_actions(double threads, double width, double tokens,
                                        double blocks) const {
    auto threads_of = [](const WholeActions& a) { return static_cast<double>(a.threads); };
    if (!by_width.empty() && width > 0) {
        // Each thread count's, width's and token count's fits across the counts of blocks at
        // `blocks`, then across the token counts at `tokens`, then each thread count's across
        // the widths at `width`, then across the thread counts.
        std::map<int32_t, std::map<int32_t, std::map<int64_t, std::vector<WholeActions>>>> counts;
        for (const WholeActions& a : by_width) counts[a.threads][a.width][a.tokens].push_back(a);
        auto tokens_of = [](const WholeActions& a) { return std::max(1.0, 1.0 * a.tokens); };
        auto blocks_of = [](const WholeActions& a) { return std::max(1.0, 1.0 * a.blocks); };
        auto at_most = [](const std::vector<WholeActions>& fits, const auto& key, double x) {
            double most = 0;
            for (const WholeActions& a : fits) most = std::max(most, key(a));
            return x > 0 ? x : most;
        };
        std::vector<WholeActions> at_width;
        for (const auto& [count, widths] : counts) {
            std::vector<WholeActions> at_tokens;
            for (const auto& [w, by_tokens] : widths) {
                std::vector<WholeActions> at_blocks;
                for (const auto& [n, fits] : by_tokens)
                    at_blocks.push_back(along(fits, blocks_of, at_most(fits, blocks_of, blocks)));
                at_tokens.push_back(
                    along(at_blocks, tokens_of, at_most(at_blocks, tokens_of, tokens)));
            }
            at_width.push_back(along(
                at_tokens, [](const WholeActions& a) { return 1.0 * a.width; }, width));
        }
        WholeActions out = along(at_width, threads_of, threads);
        out.threads = static_cast<int32_t>(std::lround(threads));
        out.width = static_cast<int32_t>(std::lround(width));
        out.tokens = std::llround(tokens);
        out.blocks = static_cast<int32_t>(std::lround(blocks));
        return out;
    }
    std::vector<WholeActions> by = fewer_threads;
    WholeActions all = actions;
    all.threads = std::max(1, cores);
    std::erase_if(by, [&](const WholeActions& a) { return a.threads >= all.threads; });
    by.push_back(all);
    WholeActions out = along(by, threads_of, threads);
    out.threads = static_cast<int32_t>(std::lround(threads));
    return out;
}

} // namespace dist
