// render.cpp: a Timeline as text (the terminal), JSON (`dist sim --json`), SVG (a Gantt chart)
// and Chrome's trace-event format (Perfetto, chrome://tracing).
#include "actors/sim/simulate.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace dist::sim {

using plan::ActionKind;
using plan::PlanAction;

namespace {

std::string bytes(int64_t b) {
    char buf[32];
    double x = static_cast<double>(b);
    if (x >= 1e9)
        std::snprintf(buf, sizeof buf, "%.1fG", x / 1e9);
    else if (x >= 1e6)
        std::snprintf(buf, sizeof buf, "%.1fM", x / 1e6);
    else
        std::snprintf(buf, sizeof buf, "%.1fk", x / 1e3);
    return buf;
}

// F: the microbatch's digit; B: A-J; I: a-j; W: k-t (microbatch mod 10); STEP: '*'.
char glyph(const PlanAction& a) {
    int m = a.microbatch % 10;
    switch (a.kind) {
    case ActionKind::forward: return static_cast<char>('0' + m);
    case ActionKind::backward: return static_cast<char>('A' + m);
    case ActionKind::backward_input: return static_cast<char>('a' + m);
    case ActionKind::backward_weight: return static_cast<char>('k' + m);
    default: return '*';
    }
}

std::string time_str(const Timeline& t, double x) {
    char buf[32];
    if (t.cost == CostModel::unit)
        std::snprintf(buf, sizeof buf, "%g", x);
    else if (x >= 1)
        std::snprintf(buf, sizeof buf, "%.3f s", x);
    else
        std::snprintf(buf, sizeof buf, "%.3f ms", x * 1e3);
    return buf;
}

} // namespace

std::string text_report(const Timeline& t, int width) {
    const plan::Graph& g = t.graph;
    std::string out;
    char buf[512];
    std::snprintf(buf, sizeof buf, "%s, %d rank%s (%s), %d microbatch%s, %s costs\n",
                  to_string(g.schedule), static_cast<int>(g.ranks.size()),
                  g.ranks.size() == 1 ? "" : "s", plan::axes_text(g).c_str(), g.microbatches,
                  g.microbatches == 1 ? "" : "es", t.cost == CostModel::unit ? "unit" : "profile");
    out += buf;
    out += "makespan  " + time_str(t, t.makespan) + "\n";
    std::snprintf(buf, sizeof buf, "bubble    %.4f (idle / (ranks x makespan))\n",
                  t.bubble_fraction);
    out += buf;
    if (t.cost == CostModel::profile) {
        std::snprintf(buf, sizeof buf, "step      %.4f s, %.0f tokens/s, MFU %.1f%%\n",
                      t.step_time_s, t.tokens_per_s, 100 * t.mfu);
        out += buf;
        if (t.pace_draws > 1) {
            std::snprintf(buf, sizeof buf,
                          "paces     the mean of %d draws: ranks a core each at the expected paces "
                          "of their cores (spread %.3g), the slowest to each in turn\n",
                          t.pace_draws, t.core_spread);
            out += buf;
        }
        out += "memory    " + std::string(t.fits ? "fits" : "DOES NOT FIT") + " (" +
               bytes(t.memory_limit_bytes) +
               (t.shared_memory ? "B shared by all ranks)\n" : "B per device)\n");
    }
    // Timeline: one row per rank, slots of equal time.
    const int label = 8;
    int cols = std::max(10, width - label);
    double per_col = t.makespan / cols;
    if (t.cost == CostModel::unit && t.makespan > 0) {
        int scale = static_cast<int>(cols / t.makespan);
        per_col = scale >= 1 ? 1.0 / scale : std::ceil(t.makespan / cols);
        cols = static_cast<int>(std::ceil(t.makespan / per_col));
    }
    out += "\n";
    for (const RankReport& r : t.ranks) {
        std::string row(static_cast<size_t>(cols), '.');
        const plan::PlanRank& rank = g.ranks[static_cast<size_t>(r.rank)];
        for (int c = 0; c < cols; ++c) {
            double mid = (c + 0.5) * per_col;
            for (const Span& s : r.spans)
                if (s.start <= mid && mid < s.end)
                    row[static_cast<size_t>(c)] = glyph(rank.actions[s.action]);
        }
        std::snprintf(buf, sizeof buf, "rank %-3d", r.rank);
        out += buf + row + "\n";
    }
    out += "F 0-9, B A-J, I a-j, W k-t (microbatch mod 10), . idle; a column is " +
           time_str(t, per_col) + "\n\n";
    out += "rank      idle  live  params  grads   optim   activ   comm    peak\n";
    for (const RankReport& r : t.ranks) {
        std::snprintf(buf, sizeof buf, "%-4d %9s %5d  %-7s %-7s %-7s %-7s %-7s %s\n", r.rank,
                      time_str(t, r.idle).c_str(), r.peak_inflight_microbatches,
                      bytes(r.parameters_bytes).c_str(), bytes(r.gradients_bytes).c_str(),
                      bytes(r.optimizer_bytes).c_str(), bytes(r.activations_bytes).c_str(),
                      bytes(r.communication_bytes).c_str(), bytes(r.peak_memory_bytes).c_str());
        out += buf;
    }
    out += "(live: peak microbatches in flight; memory at the peak, per rank)\n";
    out += memory_model_text(g);
    return out;
}

std::string memory_model_text(const plan::Graph& g) {
    const int32_t nd = g.dp * g.cp;
    std::string state, acts;
    if (g.zero > 0 && nd > 1)
        state = "weights, gradients and optimizer by ZeRO stage " + std::to_string(g.zero) +
                "'s (4 + 4 + 8) psi / N_d over N_d = " + std::to_string(nd) +
                " (Rajbhandari et al. 2020)";
    if (state.empty() && !g.sp && g.cp == 1) return "";
    acts = "activations as the units hold them (materialized attention: Korthikanti et al. 2022)";
    if (g.sp) acts += ", sequence parallel over tp " + std::to_string(g.tp);
    if (g.cp > 1) acts += ", the sequence split over cp " + std::to_string(g.cp);
    return "(memory model: " + state + (state.empty() || acts.empty() ? "" : "; ") + acts + ")\n";
}

nlohmann::json to_json(const Timeline& t) {
    nlohmann::json ranks = nlohmann::json::array();
    for (const RankReport& r : t.ranks) {
        ranks.push_back({{"rank", r.rank},
                         {"busy", r.busy},
                         {"idle", r.idle},
                         {"first_start", r.first_start},
                         {"last_end", r.last_end},
                         {"peak_inflight_microbatches", r.peak_inflight_microbatches},
                         {"peak_memory_bytes", r.peak_memory_bytes},
                         {"memory",
                          {{"parameters", r.parameters_bytes},
                           {"gradients", r.gradients_bytes},
                           {"optimizer_state", r.optimizer_bytes},
                           {"activations", r.activations_bytes},
                           {"communication_buffers", r.communication_bytes}}}});
    }
    return {{"schedule", to_string(t.graph.schedule)},
            {"cost", t.cost == CostModel::unit ? "unit" : "profile"},
            {"makespan", t.makespan},
            {"bubble_fraction", t.bubble_fraction},
            {"step_time_s", t.step_time_s},
            {"tokens_per_s", t.tokens_per_s},
            {"mfu", t.mfu},
            {"memory_limit_bytes", t.memory_limit_bytes},
            {"fits", t.fits},
            {"shared_memory", t.shared_memory},
            {"shared_peak_bytes", t.shared_peak_bytes},
            {"pace_draws", t.pace_draws},
            {"core_spread", t.core_spread},
            {"ranks", ranks}};
}

std::string svg(const Timeline& t) {
    return svg({{"", &t}});
}

std::string svg(const std::vector<std::pair<std::string, const Timeline*>>& panels) {
    const double left = 70, top = 40, row_h = 26, chart_w = 900, gap = 40;
    // One time scale for every panel, so that their lengths compare.
    double longest = 0, rows = 0;
    for (const auto& [label, t] : panels) {
        longest = std::max(longest, t->makespan);
        rows += static_cast<double>(t->ranks.size());
    }
    const double legend_y = top + rows * row_h + static_cast<double>(panels.size() - 1) * gap + 30;
    const double height = legend_y + 70;
    const double scale = longest > 0 ? chart_w / longest : 1.0;
    std::string out;
    char buf[512];
    std::snprintf(buf, sizeof buf,
                  "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
                  "font-family=\"sans-serif\" font-size=\"11\">\n",
                  left + chart_w + 20, height);
    out += buf;
    out += "<defs><pattern id=\"idle\" width=\"6\" height=\"6\" patternUnits=\"userSpaceOnUse\" "
           "patternTransform=\"rotate(45)\"><rect width=\"6\" height=\"6\" fill=\"#eeeeee\"/>"
           "<line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"6\" stroke=\"#bbbbbb\" stroke-width=\"2\"/>"
           "</pattern></defs>\n";
    auto colour = [&](const PlanAction& a) {
        int hue = static_cast<int>(std::lround(a.microbatch * 137.508)) % 360;
        int light = a.kind == ActionKind::forward           ? 72
                    : a.kind == ActionKind::backward_weight ? 85
                                                            : 50;
        char c[48];
        std::snprintf(c, sizeof c, "hsl(%d,70%%,%d%%)", hue, light);
        return std::string(c);
    };
    double y0 = top;
    for (const auto& [label, tp] : panels) {
        const Timeline& t = *tp;
        const plan::Graph& g = t.graph;
        char ms[64];
        if (t.cost == CostModel::unit)
            std::snprintf(ms, sizeof ms, "%g units", t.makespan);
        else
            std::snprintf(ms, sizeof ms, "%.3f ms", t.makespan * 1e3);
        std::string head = label.empty() ? "" : label + " ";
        std::snprintf(buf, sizeof buf,
                      "<text x=\"%.0f\" y=\"%.0f\" font-size=\"14\">%s%s: p=%d, m=%d, v=%d; "
                      "bubble %.3f, makespan %s</text>\n",
                      left, y0 - 20, head.c_str(), to_string(g.schedule), g.pp, g.microbatches,
                      g.virtual_stages, t.bubble_fraction, ms);
        out += buf;
        for (size_t i = 0; i < t.ranks.size(); ++i) {
            const RankReport& r = t.ranks[i];
            double y = y0 + static_cast<double>(i) * row_h;
            std::snprintf(buf, sizeof buf,
                          "<text x=\"5\" y=\"%.1f\">rank %d</text>\n"
                          "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
                          "fill=\"url(#idle)\"><title>idle %.4g</title></rect>\n",
                          y + row_h * 0.65, r.rank, left, y + 2, t.makespan * scale, row_h - 4,
                          r.idle);
            out += buf;
            const plan::PlanRank& rank = g.ranks[static_cast<size_t>(r.rank)];
            for (const Span& s : r.spans) {
                const PlanAction& a = rank.actions[s.action];
                double x = left + s.start * scale, w = std::max(0.5, (s.end - s.start) * scale);
                std::string name = plan::to_string(a);
                std::snprintf(buf, sizeof buf,
                              "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" "
                              "fill=\"%s\" stroke=\"#333333\" stroke-width=\"0.5\"><title>%s"
                              "</title></rect>\n",
                              x, y + 2, w, row_h - 4, colour(a).c_str(), name.c_str());
                out += buf;
                if (w > 7.0 * static_cast<double>(name.size()) && a.kind != ActionKind::step) {
                    std::snprintf(buf, sizeof buf,
                                  "<text x=\"%.2f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n",
                                  x + w / 2, y + row_h * 0.65, name.c_str());
                    out += buf;
                }
            }
            // The communication thread's collectives: a thin bar along the row's foot.
            for (const Span& s : r.collectives) {
                const std::string name = plan::to_string(rank.actions[s.action]);
                std::snprintf(buf, sizeof buf,
                              "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"3\" "
                              "fill=\"#333333\"><title>%s</title></rect>\n",
                              left + s.start * scale, y + row_h - 3,
                              std::max(0.5, (s.end - s.start) * scale), name.c_str());
                out += buf;
            }
        }
        y0 += static_cast<double>(t.ranks.size()) * row_h + gap;
    }
    // Legend: the phases (lightness) and the microbatches (hue).
    const char* phases[] = {"F forward", "B / I backward (input)", "W weight gradient", "idle",
                            "collective (under)"};
    int lights[] = {72, 50, 85, 0, 20};
    for (int k = 0; k < 5; ++k) {
        double x = left + k * 180;
        std::string fill = k == 3 ? "url(#idle)" : "hsl(0,0%," + std::to_string(lights[k]) + "%)";
        std::snprintf(buf, sizeof buf,
                      "<rect x=\"%.0f\" y=\"%.0f\" width=\"14\" height=\"14\" fill=\"%s\" "
                      "stroke=\"#333333\"/><text x=\"%.0f\" y=\"%.0f\">%s</text>\n",
                      x, legend_y, fill.c_str(), x + 20, legend_y + 11, phases[k]);
        out += buf;
    }
    const int32_t microbatches = panels.empty() ? 0 : panels.front().second->graph.microbatches;
    for (int32_t m = 0; m < std::min(microbatches, 16); ++m) {
        PlanAction a;
        a.microbatch = m;
        double x = left + m * 55;
        std::snprintf(buf, sizeof buf,
                      "<rect x=\"%.0f\" y=\"%.0f\" width=\"14\" height=\"14\" fill=\"%s\"/>"
                      "<text x=\"%.0f\" y=\"%.0f\">mb %d</text>\n",
                      x, legend_y + 25, colour(a).c_str(), x + 18, legend_y + 36, m);
        out += buf;
    }
    out += "</svg>\n";
    return out;
}

std::string chrome_trace(const Timeline& t, const std::string& process_name) {
    return chrome_trace(
        {{process_name.empty() ? std::string("dist sim: ") + to_string(t.graph.schedule)
                               : process_name,
          &t}});
}

std::string chrome_trace(const std::vector<std::pair<std::string, const Timeline*>>& processes) {
    // Written as text, event by event: a plan of a thousand ranks has hundreds of thousands of
    // spans, too many to build as a JSON tree first. Trace time is in microseconds; a unit of
    // `--cost unit` is drawn as one millisecond.
    std::string out = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[";
    char buf[256];
    const char* sep = "\n";
    for (size_t pid = 0; pid < processes.size(); ++pid) {
        const Timeline& t = *processes[pid].second;
        const double us = t.cost == CostModel::unit ? 1000.0 : 1e6;
        out += sep;
        sep = ",\n";
        out += "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" + std::to_string(pid) +
               ",\"args\":{\"name\":" + nlohmann::json(processes[pid].first).dump() + "}}";
        std::snprintf(buf, sizeof buf,
                      ",\n{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%zu,"
                      "\"args\":{\"sort_index\":%zu}}",
                      pid, pid);
        out += buf;
        auto span = [&](const PlanAction& a, int tid, const Span& s) {
            // Action names are letters, digits, `<`, `>`, `+`, `_` and `@`: nothing to escape.
            std::snprintf(buf, sizeof buf,
                          ",\n{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":%zu,"
                          "\"tid\":%d,\"ts\":%.17g,\"dur\":%.17g,\"args\":{\"stage\":%d,"
                          "\"microbatch\":%d",
                          plan::to_string(a).c_str(), plan::op_name(a.kind), pid, tid, s.start * us,
                          (s.end - s.start) * us, a.stage, a.microbatch);
            out += buf;
            // Of the span, its thread's time on a core (where known), in the trace's unit.
            if (s.on_core >= 0) {
                std::snprintf(buf, sizeof buf, ",\"on_core\":%.17g", s.on_core * us);
                out += buf;
            }
            out += "}}";
        };
        // A rank's compute track, and under it its communication thread's (tid: the rank
        // count after it), when it ran data-parallel collectives.
        const int comm_tid = static_cast<int>(t.graph.ranks.size());
        for (const RankReport& r : t.ranks) {
            const plan::PlanRank& rank = t.graph.ranks[static_cast<size_t>(r.rank)];
            std::snprintf(buf, sizeof buf,
                          ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%zu,\"tid\":%d,"
                          "\"args\":{\"name\":\"rank %d (dp %d, pp %d, tp %d)\"}},"
                          "\n{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":%zu,"
                          "\"tid\":%d,\"args\":{\"sort_index\":%d}}",
                          pid, r.rank, r.rank, rank.dp, rank.pp, rank.tp, pid, r.rank, 2 * r.rank);
            out += buf;
            if (!r.collectives.empty()) {
                std::snprintf(buf, sizeof buf,
                              ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%zu,"
                              "\"tid\":%d,\"args\":{\"name\":\"rank %d communication\"}},"
                              "\n{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":%zu,"
                              "\"tid\":%d,\"args\":{\"sort_index\":%d}}",
                              pid, comm_tid + r.rank, r.rank, pid, comm_tid + r.rank,
                              2 * r.rank + 1);
                out += buf;
            }
            for (const Span& s : r.collectives) span(rank.actions[s.action], comm_tid + r.rank, s);
            // The all-to-alls nest inside the compute spans that run them.
            std::vector<Span> spans = r.spans;
            spans.insert(spans.end(), r.exchanges.begin(), r.exchanges.end());
            for (const Span& s : spans) span(rank.actions[s.action], r.rank, s);
        }
    }
    out += "\n]}\n";
    return out;
}

} // namespace dist::sim
