// search_command.cpp: `dist search`: the fastest layouts of a script's model, on its own
// devices or on each of a list of device kinds (actors/sim/search.hpp).
#include "actors/sim/search.hpp"
#include "cli/commands.hpp"
#include "cli/search.hpp"
#include "lang/check.hpp"
#include "lang/hardware.hpp"

#include <algorithm>
#include <ostream>
#include <thread>

namespace dist::cli {

namespace {

/// One search's devices: a kind and its count, or several kinds (pipeline ranks in order).
struct DeviceChoice {
    std::vector<std::string> names;
    std::vector<int64_t> counts;
    int64_t total() const {
        int64_t n = 0;
        for (int64_t c : counts) n += c;
        return n;
    }
    /// `mesh.devices=` value: `h100 x 64`, or `[h100, a100] x [32, 32]`.
    std::string value() const {
        if (names.size() == 1) return names[0] + " x " + std::to_string(counts[0]);
        std::string k = "[", c = "[";
        for (size_t i = 0; i < names.size(); ++i) {
            k += (i ? ", " : "") + names[i];
            c += (i ? ", " : "") + std::to_string(counts[i]);
        }
        return k + "] x " + c + "]";
    }
};

std::string trim(const std::string& s) {
    size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
    return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

/// "a100-80g x 64,h100-sxm x 64": NAME x COUNT, comma-separated; a mesh of several kinds joins
/// them with `+` ("h100 x 32 + a100 x 32": the first kind holds the first pipeline ranks).
bool parse_devices(const std::string& text, std::vector<DeviceChoice>& out, std::string& error) {
    size_t start = 0;
    while (start <= text.size()) {
        size_t comma = text.find(',', start);
        std::string choice =
            text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
        DeviceChoice c;
        size_t from = 0;
        while (from <= choice.size()) {
            size_t plus = choice.find('+', from);
            std::string item = trim(
                choice.substr(from, plus == std::string::npos ? std::string::npos : plus - from));
            size_t x = item.rfind('x');
            std::string name = x == std::string::npos ? "" : trim(item.substr(0, x));
            std::string count = x == std::string::npos ? "" : trim(item.substr(x + 1));
            bool digits = !count.empty() && count.size() < 8 &&
                          std::all_of(count.begin(), count.end(),
                                      [](char ch) { return ch >= '0' && ch <= '9'; });
            if (name.empty() || !digits || std::stoll(count) < 1) {
                error = "`" + item +
                        "` is not NAME x COUNT (for example `h100 x 64`, or "
                        "`h100 x 32 + a100 x 32` for two kinds)";
                return false;
            }
            c.names.push_back(name);
            c.counts.push_back(std::stoll(count));
            if (plus == std::string::npos) break;
            from = plus + 1;
        }
        out.push_back(c);
        if (comma == std::string::npos) break;
        start = comma + 1;
    }
    return true;
}

/// Devices per host of the profile called `name` (file stem or alias); 0 when it has no host
/// limit or is not found (the checker then says what is wrong, located at the `--set`).
int64_t host_size(const std::string& name) {
    for (const auto& path : lang::profile_files(lang::default_search_roots())) {
        lang::SourceManager sources;
        lang::Diagnostics quiet;
        auto prof = lang::load_profile(path, sources, quiet);
        if (!prof) continue;
        if (path.stem() == name ||
            std::find(prof->aliases.begin(), prof->aliases.end(), name) != prof->aliases.end())
            return prof->devices_per_host;
    }
    return 0;
}

} // namespace

std::vector<sim::SearchReport> run_searches(const SearchRequest& q, std::string& usage,
                                            std::string& error) {
    std::vector<DeviceChoice> choices;
    if (!q.devices.empty() && !parse_devices(q.devices, choices, usage)) {
        usage = "--devices: " + usage;
        return {};
    }
    if (q.top < 1) {
        usage = "--top is at least 1";
        return {};
    }
    sim::SearchOptions so;
    so.file = q.file;
    so.text = q.text;
    so.search_roots = lang::default_search_roots();
    so.top = q.top;
    so.exhaustive = q.exhaustive;
    so.threads = static_cast<int32_t>(std::max(1u, std::thread::hardware_concurrency()));
    // On other devices the script's own layout keeps its tp, pp and cp where the count allows,
    // with dp making up the rest; else it becomes pure data parallelism.
    int64_t model_parallel = 1;
    if (!choices.empty()) {
        lang::FrontendOptions fo;
        fo.search_roots = so.search_roots;
        fo.overrides = q.overrides;
        lang::CheckResult r =
            q.text.empty() ? lang::check_file(q.file, fo) : lang::check_text(q.file, q.text, fo);
        if (!r.ok()) {
            error = r.report();
            return {};
        }
        model_parallel = r.program->mesh.tp * r.program->mesh.pp * r.program->mesh.cp;
    }
    std::vector<sim::SearchReport> reports;
    if (choices.empty()) choices.push_back({});
    for (const DeviceChoice& c : choices) {
        so.overrides = q.overrides;
        std::vector<std::string> device;
        const int64_t count = c.total();
        if (count > 0) {
            device.push_back("mesh.devices=" + c.value());
            if (count % model_parallel == 0) {
                device.push_back("mesh.dp=" + std::to_string(count / model_parallel));
            } else {
                for (const char* axis :
                     {"mesh.tp=1", "mesh.pp=1", "mesh.cp=1", "mesh.sp=false", "schedule.kind=1f1b",
                      "schedule.virtual_stages=1", "schedule.microbatches=1"})
                    device.push_back(axis);
                device.push_back("mesh.dp=" + std::to_string(count));
            }
            // Hosts: each kind on hosts of its own, full ones where it fills them.
            int64_t per_host = host_size(c.names[0]);
            if (per_host > 0) {
                int64_t hosts = 0;
                for (size_t k = 0; k < c.counts.size(); ++k) {
                    if (c.counts[k] > per_host && c.counts[k] % per_host != 0) {
                        usage = "--devices: " + std::to_string(c.counts[k]) + " " + c.names[k] +
                                " do not fill hosts of " + std::to_string(per_host) +
                                " (use a multiple of " + std::to_string(per_host) + ")";
                        return {};
                    }
                    hosts += c.counts[k] <= per_host ? 1 : c.counts[k] / per_host;
                }
                device.push_back("mesh.hosts=" + std::to_string(hosts));
            }
        }
        so.overrides.insert(so.overrides.end(), device.begin(), device.end());
        reports.push_back(sim::search(so));
        reports.back().extra = device;
        if (!reports.back().error.empty()) {
            error = reports.back().error;
            return {};
        }
    }
    return reports;
}

std::string searches_text(const std::vector<sim::SearchReport>& reports) {
    std::string out;
    for (size_t i = 0; i < reports.size(); ++i)
        out += (i ? "\n" : "") + sim::search_text(reports[i]);
    if (reports.size() > 1) out += "\nthe best layout on each:\n" + sim::changes_text(reports);
    return out;
}

int run_search(const CommonOptions& o, const SearchCommandOptions& s, std::ostream& out,
               std::ostream& err) {
    SearchRequest q;
    q.file = o.file;
    q.overrides = o.overrides;
    q.devices = s.devices;
    q.top = s.top;
    q.exhaustive = s.exhaustive;
    std::string usage, error;
    std::vector<sim::SearchReport> reports = run_searches(q, usage, error);
    if (!usage.empty()) {
        err << "error: " << usage << "\n";
        return 2;
    }
    if (!error.empty()) {
        err << error;
        return 1;
    }
    if (s.json) {
        if (reports.size() == 1) {
            out << sim::to_json(reports[0]).dump(2) << "\n";
        } else {
            nlohmann::json j;
            for (const auto& r : reports) j["searches"].push_back(sim::to_json(r));
            j["changes"] = sim::changes_text(reports);
            out << j.dump(2) << "\n";
        }
        return 0;
    }
    out << searches_text(reports);
    return 0;
}

} // namespace dist::cli
