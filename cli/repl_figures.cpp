// repl_figures.cpp: the REPL's views of the plan and of its simulated step: `plan`, `sim`,
// `compare` (the headline figures for several schedule kinds or values of one key), `memory`,
// and `trace` / `svg` files.
#include "cli/repl.hpp"
#include "cli/repl_format.hpp"

#include "lang/diagnostics.hpp"
#include "lang/program_json.hpp"
#include "models/atomic_file.hpp"

#include <algorithm>
#include <future>
#include <ostream>
#include <sstream>
#include <thread>

namespace dist::cli {

namespace {

// The rank whose peak memory is the largest.
const sim::RankReport& fullest(const sim::Timeline& t) {
    return *std::max_element(t.ranks.begin(), t.ranks.end(),
                             [](const sim::RankReport& a, const sim::RankReport& b) {
                                 return a.peak_memory_bytes < b.peak_memory_bytes;
                             });
}

// "file:1:2: error: message" and its source lines, to the message alone.
std::string first_error(const std::string& report) {
    std::string line = report.substr(0, report.find('\n'));
    size_t at = line.find("error: ");
    return at == std::string::npos ? line : line.substr(at + 7);
}

// Values of `compare KEY=A,B,C`: split at the commas outside parentheses, so a tuple such as
// `(0.9, 0.95)` stays whole.
std::vector<std::string> split_values(const std::string& text) {
    std::vector<std::string> out;
    std::string cur;
    int depth = 0;
    for (char c : text) {
        if (c == '(' || c == '[') ++depth;
        if (c == ')' || c == ']') --depth;
        if (c == ',' && depth == 0) {
            out.push_back(cur);
            cur.clear();
        } else if (c != ' ' || depth > 0) {
            cur += c;
        }
    }
    out.push_back(cur);
    return out;
}

} // namespace

void ReplSession::cmd_plan() {
    const plan::Graph* graph = current_graph();
    if (!graph) return;
    // The checker's summary, less its schedule line: the plan shows the real partition.
    std::istringstream summary(lang::summary(*program_));
    for (std::string line; std::getline(summary, line);)
        if (line.rfind("schedule ", 0) != 0) out_ << line << "\n";
    out_ << plan::print(*graph);
}

void ReplSession::cmd_sim() {
    const sim::Timeline* timeline = current_timeline();
    if (!timeline) return;
    const sim::Timeline& t = *timeline;
    out_ << sim::text_report(t);
    const sim::RankReport& top = fullest(t);
    out_ << "peak memory " << bytes_text(top.peak_memory_bytes) << " on rank " << top.rank
         << " (the fullest), " << bytes_text(t.memory_limit_bytes)
         << (t.shared_memory ? " shared by all ranks" : " per device") << "\n";
}

void ReplSession::cmd_memory() {
    const sim::Timeline* timeline = current_timeline();
    if (!timeline) return;
    const sim::Timeline& t = *timeline;
    char buf[256];
    std::snprintf(buf, sizeof buf, "%-13s %10s %10s %10s %11s %10s %10s\n", "", "weights",
                  "gradients", "optimizer", "activations", "buffers", "peak");
    out_ << buf;
    // Runs of ranks with the same figures share a line (the data-parallel replicas do).
    auto same = [](const sim::RankReport& a, const sim::RankReport& b) {
        return a.parameters_bytes == b.parameters_bytes && a.gradients_bytes == b.gradients_bytes &&
               a.optimizer_bytes == b.optimizer_bytes &&
               a.activations_bytes == b.activations_bytes &&
               a.communication_bytes == b.communication_bytes;
    };
    for (size_t i = 0; i < t.ranks.size();) {
        size_t j = i;
        while (j + 1 < t.ranks.size() && same(t.ranks[i], t.ranks[j + 1])) ++j;
        const sim::RankReport& r = t.ranks[i];
        std::snprintf(
            buf, sizeof buf, "%-13s %10s %10s %10s %11s %10s %10s\n",
            ranks_text(t.ranks[i].rank, t.ranks[j].rank).c_str(),
            bytes_text(r.parameters_bytes).c_str(), bytes_text(r.gradients_bytes).c_str(),
            bytes_text(r.optimizer_bytes).c_str(), bytes_text(r.activations_bytes).c_str(),
            bytes_text(r.communication_bytes).c_str(), bytes_text(r.peak_memory_bytes).c_str());
        out_ << buf;
        i = j + 1;
    }
    const sim::RankReport& top = fullest(t);
    out_ << "(activations: at the worst moment, " << top.peak_inflight_microbatches
         << " microbatches in flight on rank " << top.rank << "; optimizer: AdamW's two moments)\n"
         << sim::memory_model_text(t.graph);
    if (t.memory_limit_bytes <= 0) {
        out_ << "no memory limit: the hardware profile gives none\n";
        return;
    }
    if (t.shared_memory) {
        out_ << (t.fits ? "fits: " : "DOES NOT FIT: ") << "the " << t.ranks.size()
             << " ranks share one machine's " << bytes_text(t.memory_limit_bytes) << " and need "
             << bytes_text(t.shared_peak_bytes) << " together at the most\n";
        return;
    }
    int64_t over = 0;
    for (const sim::RankReport& r : t.ranks) over += r.peak_memory_bytes > t.memory_limit_bytes;
    if (t.fits)
        out_ << "fits: the fullest rank (" << top.rank << ") needs "
             << bytes_text(top.peak_memory_bytes) << " of the device's "
             << bytes_text(t.memory_limit_bytes) << " ("
             << percent_text(static_cast<double>(top.peak_memory_bytes) /
                             static_cast<double>(t.memory_limit_bytes))
             << ")\n";
    else
        out_ << "DOES NOT FIT: " << over << " of " << t.ranks.size() << " ranks need more than "
             << "the device's " << bytes_text(t.memory_limit_bytes) << " (rank " << top.rank << ": "
             << bytes_text(top.peak_memory_bytes)
             << "); try more pipeline or tensor parallelism, more microbatches, "
                "schedule.recompute or train.precision bf16\n";
}

void ReplSession::cmd_write(const std::string& what, const std::string& path) {
    if (path.empty()) {
        error("`" + what + "` takes a file name",
              what == "svg" ? "for example `svg step.svg`" : "for example `trace step.json`");
        return;
    }
    const sim::Timeline* timeline = current_timeline();
    if (!timeline) return;
    std::string text = what == "svg" ? sim::svg(*timeline) : sim::chrome_trace(*timeline);
    if (std::string e = models::write_file_atomically(path, {text}); !e.empty()) {
        error(e);
        return;
    }
    out_ << "wrote " << path
         << (what == "svg" ? " (a Gantt chart of the step; open it in a browser)\n"
                           : " (open it in https://ui.perfetto.dev or chrome://tracing)\n");
}

void ReplSession::cmd_compare(const std::string& args) {
    if (args.empty()) {
        error("`compare` takes schedule kinds or KEY=V1,V2,...",
              "for example `compare gpipe 1f1b zbv` or `compare mesh.pp=2,4,8`");
        return;
    }
    std::string key = "schedule.kind";
    std::vector<std::string> values;
    if (size_t eq = args.find('='); eq != std::string::npos) {
        key = args.substr(0, eq);
        key.erase(key.find_last_not_of(" \t") + 1);
        values = split_values(args.substr(eq + 1));
        std::vector<std::string> known = keys();
        if (std::find(known.begin(), known.end(), key) == known.end()) {
            std::string best = lang::closest_name(key, known);
            error("unknown key `" + key + "`",
                  best.empty() ? "`help set` lists the keys" : "did you mean `" + best + "`?");
            return;
        }
    } else {
        std::istringstream words(args);
        for (std::string w; words >> w;) {
            const auto& kinds = schedule_kinds();
            if (std::find(kinds.begin(), kinds.end(), w) == kinds.end()) {
                std::string best = lang::closest_name(w, kinds);
                error("`" + w + "` is not a schedule kind",
                      (best.empty() ? "" : "did you mean `" + best + "`? ") + "the kinds are " +
                          lang::join_names(kinds, ", "));
                return;
            }
            values.push_back(w);
        }
    }
    if (std::any_of(values.begin(), values.end(), [](const std::string& v) { return v.empty(); })) {
        error("an empty value in `" + args + "`", "for example `compare mesh.pp=2,4,8`");
        return;
    }
    // Each row evaluated first, so that the first column fits its widest label. The checks
    // run one after another (the parser is not known to be thread-safe); planning and
    // simulation, the costly part at a thousand ranks, run side by side.
    struct Row {
        std::string value, label;
        ReplEvaluation ev;
        std::string text; // the columns after the label
    };
    std::vector<Row> rows;
    bool adjusted = false;
    for (const std::string& v : values) {
        Row row{v, v, {}, ""};
        row.ev.checked = check(override_texts({{key, v}}));
        if (!row.ev.checked->ok()) {
            // The values that go with it (virtual stages for a kind, dp or the device count
            // for a mesh axis), as `set` would find them.
            for (const auto& extra : companions({key, v})) {
                std::vector<ReplOverride> all = {{key, v}};
                all.insert(all.end(), extra.begin(), extra.end());
                lang::CheckResult retry = check(override_texts(all));
                if (!retry.ok()) continue;
                row.ev.checked = std::move(retry);
                row.label += " (";
                for (size_t i = 0; i < extra.size(); ++i)
                    row.label += (i ? ", " : "") + extra[i].key.substr(extra[i].key.find('.') + 1) +
                                 " " + extra[i].value;
                row.label += ")";
                adjusted = true;
                break;
            }
        }
        rows.push_back(std::move(row));
    }
    size_t threads = std::max(1u, std::thread::hardware_concurrency());
    for (size_t first = 0; first < rows.size(); first += threads) {
        std::vector<std::future<void>> running;
        for (size_t i = first; i < std::min(rows.size(), first + threads); ++i) {
            if (!rows[i].ev.checked->ok()) continue;
            running.push_back(
                std::async(std::launch::async, [this, &rows, i] { finish(rows[i].ev, true); }));
        }
        for (auto& r : running) r.get();
    }
    char buf[512];
    for (Row& row : rows) {
        if (!row.ev.checked->ok()) row.ev.error = row.ev.checked->report();
        if (!row.ev.ok()) {
            row.label = row.value;
            row.text = " error: " + first_error(row.ev.error);
            continue;
        }
        const sim::Timeline& t = *row.ev.timeline;
        std::snprintf(buf, sizeof buf, " %12s %8.4f %12s %5s %7s %14.0f",
                      time_text(t, t.step_time_s).c_str(), t.bubble_fraction,
                      bytes_text(fullest(t).peak_memory_bytes).c_str(), t.fits ? "yes" : "NO",
                      percent_text(t.mfu).c_str(), t.tokens_per_s);
        row.text = buf;
    }
    size_t width = key.size();
    for (const Row& row : rows) width = std::max(width, row.label.size());
    std::snprintf(buf, sizeof buf, "%-*s %12s %8s %12s %5s %7s %14s\n", static_cast<int>(width),
                  key.c_str(), "step", "bubble", "peak memory", "fits", "MFU", "tokens/s");
    out_ << buf;
    for (const Row& row : rows)
        out_ << row.label << std::string(width - row.label.size(), ' ') << row.text << "\n";
    out_ << "(peak memory: the fullest rank"
         << (adjusted ? "; in parentheses: what changes with the value for it to check" : "")
         << ")\n";
}

} // namespace dist::cli
