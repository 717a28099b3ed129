// search.hpp: the fastest layouts of a script's model on its devices (`dist search`).
//
// A layout is the mesh's axes (dp, tp, pp, cp, zero, sp) and the schedule (kind, virtual
// stages, microbatches, recomputation) for a fixed model, global batch and device count. Every
// layout is written as the `--set` overrides that make it, and a layout's figures are those of
// `dist sim` on the script with those overrides: the same checker, plan and simulator.
//
// The search is exact for its top rows: layouts are visited in order of a lower bound on their
// step (sim::busy_bound, then sim::pipeline_bound), memory first, and a layout is simulated
// only while its bound is below the K-th best step found; what is left can only be slower.
#pragma once

#include "actors/sim/simulate.hpp"
#include "lang/program.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace dist::sim {

struct Layout {
    int64_t dp = 1, tp = 1, pp = 1, cp = 1, zero = 0;
    bool sp = false;
    /// Expert parallelism, for a model with experts; 0 for one without (not part of its layout).
    int64_t ep = 0;
    ScheduleKind kind = ScheduleKind::one_f_one_b;
    int64_t virtual_stages = 1, microbatches = 1;
    Recompute recompute = Recompute::none;
    /// Blocks per stage, only when the script gives a partition (`--set` cannot remove it, so
    /// each layout states the balanced one for its stages).
    std::vector<int64_t> partition;

    bool operator==(const Layout&) const = default;
};

/// The layout a checked program has.
Layout layout_of(const Program& p);
/// The `--set` overrides that give a script this layout.
std::vector<std::string> overrides_of(const Layout& l);
/// "dp 16 tp 8 pp 8, zbv v2, m 64, recompute selective, zero 1, sp".
std::string describe(const Layout& l);

struct SearchRow {
    Layout layout;
    double step_time_s = 0, tokens_per_s = 0, mfu = 0, bubble = 0;
    int64_t peak_memory_bytes = 0, memory_limit_bytes = 0;
    bool fits = true;
    std::string limit; // what holds it back, in one phrase
    /// Other layouts with the same step and memory (left out of the rows), e.g. dp and cp
    /// traded for each other.
    int64_t equivalent = 0;
};

struct SearchOptions {
    std::filesystem::path file;
    std::string text; // the script's text when it is not read from `file` (which names it)
    std::vector<std::filesystem::path> search_roots;
    std::vector<std::string> overrides; // the user's `--set`, under every layout
    int32_t top = 10;
    int32_t threads = 2;
    bool exhaustive = false; // simulate every layout that fits in memory (tests compare)
    /// Simulations allowed, past the top rows, for placing the script's own layout.
    int64_t rank_budget = 200;
};

struct SearchReport {
    std::string error; // why nothing was searched (rendered diagnostics), or ""
    std::string model, device;
    int64_t devices = 0, hosts = 0, batch = 0, context = 0;
    int64_t memory_bytes = 0;
    bool shared_memory = false;
    /// The device's figures the search priced with (FLOP/s at the script's precision, memory
    /// bandwidth, and the two links' bandwidths), to tell why answers differ between devices.
    double peak_flops = 0, memory_bandwidth = 0, intra_bandwidth = 0, inter_bandwidth = 0;
    std::vector<SearchRow> rows;     // the fastest that fit, fastest first
    std::optional<SearchRow> script; // the script's own layout, when it plans
    /// The script's place among the layouts that fit (1 = fastest) when it is among the rows;
    /// 0 when it is slower than every row shown.
    int64_t script_rank = 0;
    /// Then its place counted past the rows: exact when every layout that might be faster was
    /// simulated within the budget, else a floor (at least this place).
    int64_t script_place = 0;
    bool script_place_exact = false;
    std::string script_error; // why the script's own layout could not be simulated
    int64_t considered = 0, refused = 0, pruned_memory = 0, pruned_bound = 0, simulated = 0,
            not_fitting = 0;
    int64_t simulated_placing = 0; // of `simulated`: those that placed the script's layout
    double seconds = 0;
    /// Overrides the caller added to put the script on these devices (`dist search
    /// --devices`); a row's full `--set` list is these, then the row's own.
    std::vector<std::string> extra;
};

SearchReport search(const SearchOptions& o);

std::string search_text(const SearchReport& r);
nlohmann::json to_json(const SearchReport& r);
/// How the best layout moves between searches of the same model on different hardware, and
/// why, as a few lines.
std::string changes_text(const std::vector<SearchReport>& reports);

} // namespace dist::sim
