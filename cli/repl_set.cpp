// repl_set.cpp: `set` and `unset`. Each change is checked at once, with the other values set,
// exactly as `--set KEY=VALUE` would be; one that does not check leaves the session as it was.
// A change that does not check alone is retried with the values that usually go with it (the
// mesh's device count or data parallelism for a mesh axis, virtual stages for a schedule kind).
#include "cli/repl.hpp"
#include "cli/repl_format.hpp"

#include "lang/diagnostics.hpp"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <ostream>

namespace dist::cli {

std::vector<std::vector<ReplOverride>> ReplSession::companions(const ReplOverride& c) const {
    std::vector<std::vector<ReplOverride>> out;
    if (c.key == "schedule.kind") {
        out.push_back({{"schedule.virtual_stages", "2"}});
        out.push_back({{"schedule.virtual_stages", "1"}});
        return out;
    }
    if (!program_ ||
        (c.key != "mesh.dp" && c.key != "mesh.tp" && c.key != "mesh.pp" && c.key != "mesh.cp"))
        return out;
    char* end = nullptr;
    long long v = std::strtoll(c.value.c_str(), &end, 10);
    if (c.value.empty() || *end != '\0' || v < 1 || v > 65536) return out;
    const MeshSpec& m = program_->mesh;
    int64_t dp = c.key == "mesh.dp" ? v : m.dp, tp = c.key == "mesh.tp" ? v : m.tp,
            pp = c.key == "mesh.pp" ? v : m.pp, cp = c.key == "mesh.cp" ? v : m.cp;
    // The same devices, laid out anew: data parallelism takes what the other axes leave.
    if (c.key != "mesh.dp" && m.devices % (cp * tp * pp) == 0)
        out.push_back({{"mesh.dp", std::to_string(m.devices / (cp * tp * pp))}});
    // Or as many devices as the axes make, on as many hosts as they need.
    int64_t n = dp * cp * tp * pp;
    std::string devices = m.device + " x " + std::to_string(n);
    out.push_back({{"mesh.devices", devices}});
    int64_t per_host = m.profile.devices_per_host;
    if (per_host > 0 && n % std::min(per_host, n) == 0)
        out.push_back(
            {{"mesh.devices", devices}, {"mesh.hosts", std::to_string(n / std::min(per_host, n))}});
    return out;
}

namespace {

// `KEY VALUE`, or one or more `KEY=VALUE` separated by spaces (a value may hold spaces:
// `mesh.devices=h100 x 16 mesh.dp=2` is two assignments).
std::vector<ReplOverride> parse_assignments(const std::string& args) {
    std::vector<ReplOverride> out;
    size_t eq = args.find('='), space = args.find_first_of(" \t");
    if (eq == std::string::npos || (space != std::string::npos && space < eq)) {
        if (space == std::string::npos) return {{args, ""}};
        return {{args.substr(0, space), trim(args.substr(space))}};
    }
    // Starts of assignments: a dotted name followed by `=`, at the start or after a space.
    std::vector<size_t> starts;
    for (size_t i = 0; i < args.size(); ++i) {
        if (i > 0 && args[i - 1] != ' ' && args[i - 1] != '\t') continue;
        size_t j = i;
        while (j < args.size() && (std::isalnum(static_cast<unsigned char>(args[j])) ||
                                   args[j] == '_' || args[j] == '.'))
            ++j;
        if (j > i && j < args.size() && args[j] == '=' && args.find('.', i) < j)
            starts.push_back(i);
    }
    if (starts.empty() || starts[0] != 0) starts.insert(starts.begin(), 0);
    for (size_t k = 0; k < starts.size(); ++k) {
        std::string part = args.substr(starts[k], k + 1 < starts.size() ? starts[k + 1] - starts[k]
                                                                        : std::string::npos);
        size_t e = part.find('=');
        if (e == std::string::npos)
            out.push_back({trim(part), ""});
        else
            out.push_back({trim(part.substr(0, e)), trim(part.substr(e + 1))});
    }
    return out;
}

} // namespace

void ReplSession::cmd_set(const std::string& args) {
    std::vector<ReplOverride> changes = parse_assignments(args);
    for (const ReplOverride& c : changes) {
        if (c.key.empty() || c.value.empty()) {
            error("`set` takes a key and a value",
                  "for example `set mesh.pp 4`, or `set mesh.pp=4 schedule.microbatches=8`");
            return;
        }
    }
    lang::CheckResult r = check(override_texts(changes));
    if (!r.ok() && changes.size() == 1) {
        for (const auto& extra : companions(changes[0])) {
            std::vector<ReplOverride> more = changes;
            more.insert(more.end(), extra.begin(), extra.end());
            lang::CheckResult retry = check(override_texts(more));
            if (retry.ok()) {
                r = std::move(retry);
                changes = std::move(more);
                break;
            }
        }
    }
    if (!r.ok()) {
        out_.flush();
        err_ << r.report();
        std::vector<std::string> known = keys();
        bool hinted = r.report().find("did you mean") != std::string::npos;
        for (const ReplOverride& c : changes) {
            if (hinted || std::find(known.begin(), known.end(), c.key) != known.end()) continue;
            std::string best = lang::closest_name(c.key, known);
            err_ << "hint: `" << c.key << "` is not a key `set` knows"
                 << (best.empty() ? "; `help set` lists them" : "; did you mean `" + best + "`?")
                 << "\n";
        }
        err_ << "(nothing changed)\n";
        err_.flush();
        return;
    }
    for (const ReplOverride& c : changes) {
        auto it = std::find_if(overrides_.begin(), overrides_.end(),
                               [&](const ReplOverride& o) { return o.key == c.key; });
        if (it != overrides_.end())
            it->value = c.value;
        else
            overrides_.push_back(c);
    }
    program_ = std::move(*r.program);
    planned_ = simulated_ = false;
    for (size_t i = 0; i < changes.size(); ++i)
        out_ << (i == 0 ? "" : ", ") << changes[i].key << " = " << changes[i].value;
    out_ << ": " << mesh_line(*program_) << "\n";
}

void ReplSession::cmd_unset(const std::string& args) {
    std::string key = trim(args);
    auto it = std::find_if(overrides_.begin(), overrides_.end(),
                           [&](const ReplOverride& o) { return o.key == key; });
    if (it == overrides_.end()) {
        std::vector<std::string> set;
        for (const ReplOverride& o : overrides_) set.push_back(o.key);
        std::string best = lang::closest_name(key, set);
        error("`" + key + "` is not set",
              set.empty() ? "nothing is set"
                          : (best.empty() ? "the keys set are " + lang::join_names(set)
                                          : "did you mean `" + best + "`?"));
        return;
    }
    ReplOverride removed = *it;
    overrides_.erase(it);
    lang::CheckResult r = check(override_texts());
    if (!r.ok()) {
        // Another override depended on this one (mesh.pp=4 with its microbatches).
        overrides_.insert(overrides_.begin(), removed);
        out_.flush();
        err_ << r.report() << "(nothing changed: the other values need `" << removed.text()
             << "`)\n";
        err_.flush();
        return;
    }
    program_ = std::move(*r.program);
    planned_ = simulated_ = false;
    out_ << key << " back to the script's value: " << mesh_line(*program_) << "\n";
}

} // namespace dist::cli
