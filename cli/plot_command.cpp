// plot_command.cpp: `dist plot`, the curves of one or several runs' metrics in one SVG chart.
//
// Each METRICS.jsonl file (what `dist run --metrics` writes) is one curve of a value (the loss
// by default) against the step, labelled by its file name or by --label. Axes carry rounded
// ticks; the legend names every curve in its colour.
#include "cli/commands.hpp"

#include "models/atomic_file.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <ostream>
#include <sstream>

namespace dist::cli {

namespace {

struct Curve {
    std::string label;
    std::vector<std::pair<double, double>> points; // (step, value)
};

// Reads one metrics file's (step, key) points; "" or an error naming the file and line.
std::string read_curve(const std::string& path, const std::string& key, Curve& c) {
    std::ifstream in(path);
    if (!in) return "cannot read `" + path + "`";
    std::string line;
    int64_t n = 0;
    bool seen = false;
    while (std::getline(in, line)) {
        ++n;
        if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
        nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
        const std::string where = path + ":" + std::to_string(n) + ": ";
        if (j.is_discarded() || !j.is_object())
            return where + "not a JSON object (a metrics file has one per line)";
        if (!j.contains("step") || !j["step"].is_number()) return where + "no `step`";
        if (!j.contains(key)) continue; // a line without the value (a skipped step)
        seen = true;
        if (!j[key].is_number()) continue; // NaN is written as null: left out of the curve
        double v = j[key].get<double>();
        if (std::isfinite(v)) c.points.push_back({j["step"].get<double>(), v});
    }
    if (!seen) return "`" + path + "` has no `" + key + "` on any line";
    return {};
}

// About `count` round tick values covering [lo, hi]: steps of 1, 2 or 5 times a power of ten.
std::vector<double> ticks(double lo, double hi, int count) {
    if (!(hi > lo)) return {lo};
    double raw = (hi - lo) / count, mag = std::pow(10.0, std::floor(std::log10(raw)));
    double step = mag * (raw / mag < 1.5 ? 1 : raw / mag < 3.5 ? 2 : raw / mag < 7.5 ? 5 : 10);
    std::vector<double> out;
    for (double t = std::ceil(lo / step) * step; t <= hi + step * 1e-9; t += step)
        out.push_back(std::fabs(t) < step * 1e-9 ? 0.0 : t);
    return out;
}

std::string number(double v) {
    char text[32];
    std::snprintf(text, sizeof text, "%g", v);
    return text;
}

std::string escape(const std::string& s) {
    std::string out;
    for (char c : s) {
        if (c == '<')
            out += "&lt;";
        else if (c == '>')
            out += "&gt;";
        else if (c == '&')
            out += "&amp;";
        else if (c == '"')
            out += "&quot;";
        else
            out += c;
    }
    return out;
}

const char* const palette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                               "#9467bd", "#8c564b", "#e377c2", "#17becf"};

std::string render(const std::vector<Curve>& curves, const PlotOptions& o) {
    const double width = 760, height = 420, left = 72, right = 24, top = 44, bottom = 52;
    double x0 = std::numeric_limits<double>::infinity(), x1 = -x0, y0 = x0, y1 = -x0;
    for (const Curve& c : curves)
        for (auto [x, y] : c.points) {
            x0 = std::min(x0, x), x1 = std::max(x1, x);
            y0 = std::min(y0, y), y1 = std::max(y1, y);
        }
    if (!(x1 > x0)) x1 = x0 + 1;
    if (!(y1 > y0)) y0 -= 0.5, y1 += 0.5;
    const double pad = (y1 - y0) * 0.05;
    y0 -= pad, y1 += pad;
    const double pw = width - left - right, ph = height - top - bottom;
    auto sx = [&](double x) { return left + (x - x0) / (x1 - x0) * pw; };
    auto sy = [&](double y) { return top + (1 - (y - y0) / (y1 - y0)) * ph; };
    std::ostringstream s;
    s.setf(std::ios::fixed);
    s.precision(1);
    s << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
      << "\" viewBox=\"0 0 " << width << " " << height
      << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
      << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
    const std::string title = o.title.empty() ? o.y + " by step" : o.title;
    s << "<text x=\"" << width / 2 << "\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">"
      << escape(title) << "</text>\n";
    for (double t : ticks(y0, y1, 6)) {
        s << "<line x1=\"" << left << "\" x2=\"" << left + pw << "\" y1=\"" << sy(t) << "\" y2=\""
          << sy(t) << "\" stroke=\"#e4e4e4\"/>\n"
          << "<text x=\"" << left - 6 << "\" y=\"" << sy(t) + 4 << "\" text-anchor=\"end\">"
          << number(t) << "</text>\n";
    }
    for (double t : ticks(x0, x1, 8))
        s << "<line x1=\"" << sx(t) << "\" x2=\"" << sx(t) << "\" y1=\"" << top + ph << "\" y2=\""
          << top + ph + 5 << "\" stroke=\"#444\"/>\n"
          << "<text x=\"" << sx(t) << "\" y=\"" << top + ph + 18 << "\" text-anchor=\"middle\">"
          << number(t) << "</text>\n";
    s << "<rect x=\"" << left << "\" y=\"" << top << "\" width=\"" << pw << "\" height=\"" << ph
      << "\" fill=\"none\" stroke=\"#444\"/>\n"
      << "<text x=\"" << left + pw / 2 << "\" y=\"" << height - 12
      << "\" text-anchor=\"middle\">step</text>\n"
      << "<text transform=\"translate(16 " << top + ph / 2
      << ") rotate(-90)\" text-anchor=\"middle\">" << escape(o.y) << "</text>\n";
    for (size_t i = 0; i < curves.size(); ++i) {
        const char* colour = palette[i % std::size(palette)];
        s << "<polyline fill=\"none\" stroke=\"" << colour << "\" stroke-width=\"1.5\" points=\"";
        for (auto [x, y] : curves[i].points) s << sx(x) << "," << sy(y) << " ";
        s << "\"/>\n";
        const double ly = top + 16 + 18 * static_cast<double>(i);
        s << "<line x1=\"" << left + pw - 170 << "\" x2=\"" << left + pw - 146 << "\" y1=\"" << ly
          << "\" y2=\"" << ly << "\" stroke=\"" << colour << "\" stroke-width=\"2\"/>\n"
          << "<text x=\"" << left + pw - 140 << "\" y=\"" << ly + 4 << "\">"
          << escape(curves[i].label) << "</text>\n";
    }
    s << "</svg>\n";
    return s.str();
}

} // namespace

int run_plot(const PlotOptions& o, std::ostream& out, std::ostream& err) {
    if (!o.labels.empty() && o.labels.size() != o.files.size()) {
        err << "error: " << o.labels.size() << " --label for " << o.files.size()
            << " metrics files: give one per file, or none\n";
        return 2;
    }
    std::vector<Curve> curves;
    for (size_t i = 0; i < o.files.size(); ++i) {
        Curve c;
        c.label =
            o.labels.empty() ? std::filesystem::path(o.files[i]).stem().string() : o.labels[i];
        if (std::string e = read_curve(o.files[i], o.y, c); !e.empty()) {
            err << "error: " << e << "\n";
            return 1;
        }
        if (c.points.empty()) {
            err << "error: `" << o.files[i] << "` has no finite `" << o.y << "` to draw\n";
            return 1;
        }
        curves.push_back(std::move(c));
    }
    const std::string svg = render(curves, o);
    if (std::string e = models::write_file_atomically(o.svg, {svg}); !e.empty()) {
        err << "error: " << e << "\n";
        return 1;
    }
    out << o.svg << ": " << o.y << " of " << curves.size()
        << (curves.size() == 1 ? " run" : " runs") << "\n";
    return 0;
}

} // namespace dist::cli
