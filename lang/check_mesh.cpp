// check_mesh.cpp: the `mesh` block: axes, the hardware profile, device count, hosts.
#include "lang/check_blocks.hpp"
#include "lang/hardware.hpp"

#include <cmath>

namespace dist::lang {

void BlockChecker::mesh(const Block* block) {
    BlockReader r(block, "mesh", defs.globals, diags);
    MeshSpec& m = p.mesh;
    if (!block) {
        if (!unknown_block)
            diags.error({file, 1, 1, 1}, "the script has no `mesh` block",
                        "add `mesh { devices: cpu }` for one CPU device");
        ok = false;
        return;
    }
    const Field* dev = r.field("devices");
    devices_loc = dev ? dev->loc : block->loc;
    m.dp = r.integer("dp", 1, max_ranks).value_or(1);
    m.tp = r.integer("tp", 1, max_ranks).value_or(1);
    m.pp = r.integer("pp", 1, max_ranks).value_or(1);
    m.cp = r.integer("cp", 1, max_ranks).value_or(1);
    m.zero = r.integer("zero", 0, 3).value_or(0);
    m.sp = r.boolean("sp").value_or(false);
    m.ep = r.integer("ep", 1, max_ranks).value_or(1);
    ep_loc = r.loc_of("ep");
    cp_loc = r.loc_of("cp");
    zero_loc = r.loc_of("zero");
    sp_loc = r.loc_of("sp");
    dp_loc = r.loc_of("dp");
    tp_loc = r.loc_of("tp");
    pp_loc = r.loc_of("pp");
    auto hosts = r.integer("hosts", 1, max_ranks);
    auto per_host = r.integer("devices_per_host", 1, max_ranks);
    auto memory = r.integer("memory", 1);
    r.finish();
    if (r.failed()) ok = false;

    if (m.sp && m.tp == 1 && r.field("sp")) {
        diags.error(sp_loc,
                    "sequence parallelism splits what tensor parallelism replicates; "
                    "with tp = 1 there is nothing to split",
                    "set `tp: 2` (or more), or drop `sp`");
        ok = false;
    }
    // Planned and simulated, not yet trained: refused by every training front door, here.
    int64_t ranks = sat_mul(sat_mul(sat_mul(m.dp, m.cp), m.tp), m.pp);
    if (ranks > max_ranks) {
        diags.error(block->loc, "the mesh has " + std::to_string(ranks) +
                                    " ranks; Dist plans at most " + std::to_string(max_ranks));
        ok = false;
        return;
    }
    m.devices = ranks;
    if (!dev) {
        diags.error(block->loc, "`mesh` needs `devices`, e.g. `devices: cpu` or "
                                "`devices: h100 x 8`");
        ok = false;
        return;
    }
    // One kind (`devices: h100 x 8`), or several in pipeline order, one count each
    // (`devices: [h100, a100] x [32, 32]`): the first kind's devices hold the first pipeline
    // ranks.
    std::vector<const Expr*> kinds;
    if (dev->value->kind == ExprKind::list) {
        for (const ExprPtr& e : dev->value->items) kinds.push_back(e.get());
        if (kinds.empty() || !dev->count || dev->count->kind != ExprKind::list ||
            dev->count->items.size() != kinds.size()) {
            diags.error(dev->value->loc, "several device kinds take one count each",
                        "for example `devices: [h100, a100] x [32, 32]`");
            ok = false;
            return;
        }
    } else {
        kinds.push_back(dev->value.get());
    }
    for (const Expr* k : kinds) {
        if (k->kind != ExprKind::name) {
            diags.error(k->loc, "`devices` names a hardware profile, e.g. `h200 x 8`",
                        k->kind == ExprKind::string ? "write the name without quotes" : "");
            ok = false;
            return;
        }
    }
    // Find each profile by file name, else by alias. Only the chosen profile's errors
    // concern this script: the others are read quietly while looking for an alias.
    std::vector<std::filesystem::path> files = profile_files(options.search_roots);
    auto find_profile = [&](const Expr& kind) -> std::optional<HardwareProfile> {
        std::vector<std::string> names;
        for (const auto& path : files) {
            if (path.stem() != kind.text) continue;
            return load_profile(path, sources, diags);
        }
        for (const auto& path : files) {
            SourceManager scratch;
            Diagnostics quiet;
            auto prof = load_profile(path, scratch, quiet);
            if (!prof) continue;
            if (path.stem().string().find('-') == std::string::npos)
                names.push_back(path.stem().string());
            names.insert(names.end(), prof->aliases.begin(), prof->aliases.end());
            if (std::find(prof->aliases.begin(), prof->aliases.end(), kind.text) !=
                prof->aliases.end())
                return prof;
        }
        std::string best = closest_name(kind.text, names);
        // A profile `dist calibrate` wrote is found only through DIST_PATH: the likeliest miss
        // for a name that is none of the known ones.
        diags.error(kind.loc, "unknown device `" + kind.text + "`",
                    best.empty() ? "the devices are " + join_names(names) +
                                       "; `dist calibrate --out DIR/hardware/" + kind.text +
                                       ".toml` writes one, found when DIR is on DIST_PATH"
                                 : "did you mean `" + best + "`?");
        return std::nullopt;
    };
    std::vector<HardwareProfile> profiles;
    for (const Expr* k : kinds) {
        auto prof = find_profile(*k);
        if (!prof) {
            ok = false;
            return;
        }
        edit_profile(*prof);
        profiles.push_back(*prof);
    }
    m.device = kinds[0]->text;
    m.profile = profiles[0];
    // The counts: one for the mesh, or one per kind.
    std::vector<int64_t> counts;
    std::vector<SourceLoc> count_locs;
    if (dev->count) {
        std::vector<const Expr*> items;
        if (kinds.size() > 1)
            for (const ExprPtr& e : dev->count->items) items.push_back(e.get());
        else
            items.push_back(dev->count.get());
        for (const Expr* e : items) {
            auto c = evaluate(*e, defs.globals, diags);
            if (!c) {
                ok = false;
                return;
            }
            if (c->type != Value::Type::integer || c->i < 1) {
                diags.error(e->loc, "the device count must be a positive integer");
                ok = false;
                return;
            }
            counts.push_back(c->i);
            count_locs.push_back(e->loc);
        }
        int64_t total = 0;
        for (int64_t c : counts) total = sat_add(total, c);
        if (total != ranks) {
            int64_t tpp = m.cp * m.tp * m.pp;
            const char* axes = m.cp > 1 ? "dp x cp x tp x pp" : "dp x tp x pp";
            std::string hint = total % tpp == 0
                                   ? "set `dp: " + std::to_string(total / tpp) + "` to use " +
                                         std::to_string(total) + " devices"
                                   : std::string("the device count is ") + axes;
            std::string sizes = std::to_string(m.dp) + " x " +
                                (m.cp > 1 ? std::to_string(m.cp) + " x " : "") +
                                std::to_string(m.tp) + " x " + std::to_string(m.pp);
            diags.error(kinds.size() > 1 ? dev->count->loc : count_locs[0],
                        std::string("the mesh has ") + axes + " = " + sizes + " = " +
                            std::to_string(ranks) + " ranks, but " + std::to_string(total) +
                            " devices",
                        hint);
            ok = false;
            return;
        }
    }
    if (kinds.size() > 1) {
        // Accelerators with hosts of one size, each kind on whole pipeline ranks (dp x cp x tp
        // devices each).
        const int64_t per_pp = m.dp * m.cp * m.tp;
        for (size_t k = 0; k < kinds.size(); ++k) {
            const HardwareProfile& h = profiles[k];
            if (h.devices_per_host == 0 || h.devices_per_host != profiles[0].devices_per_host) {
                diags.error(kinds[k]->loc,
                            h.devices_per_host == 0
                                ? "`" + kinds[k]->text +
                                      "` shares one machine's cores: a mesh "
                                      "of several kinds is of accelerators"
                                : "`" + h.name + "` hosts hold " +
                                      std::to_string(h.devices_per_host) + " devices, `" +
                                      profiles[0].name + "` hosts " +
                                      std::to_string(profiles[0].devices_per_host),
                            "the kinds of one mesh need hosts of the same size");
                ok = false;
                return;
            }
        }
        for (size_t k = 0; k < kinds.size(); ++k) {
            if (counts[k] % per_pp != 0) {
                diags.error(count_locs[k],
                            std::to_string(counts[k]) + " " + kinds[k]->text +
                                " are not whole pipeline ranks: each holds dp x cp x tp = " +
                                std::to_string(per_pp) + " devices",
                            "use a multiple of " + std::to_string(per_pp));
                ok = false;
                return;
            }
            for (int64_t i = 0; i < counts[k] / per_pp; ++i) m.pp_profiles.push_back(profiles[k]);
        }
    }
    // Hosts and devices per host.
    int64_t limit = m.profile.devices_per_host;
    int64_t h = hosts.value_or(0), d = per_host.value_or(0);
    if (h && d) {
        if (sat_mul(h, d) != ranks) {
            diags.error(r.loc_of("hosts"), std::to_string(h) + " hosts x " + std::to_string(d) +
                                               " devices is not the " + std::to_string(ranks) +
                                               " devices of the mesh");
            ok = false;
            return;
        }
    } else if (h) {
        if (ranks % h != 0) {
            diags.error(r.loc_of("hosts"),
                        std::to_string(ranks) + " devices do not divide evenly over " +
                            std::to_string(h) + " hosts",
                        "use " + divisors_hint(ranks) + " hosts");
            ok = false;
            return;
        }
        d = ranks / h;
    } else if (d) {
        if (ranks % d != 0) {
            diags.error(r.loc_of("devices_per_host"), std::to_string(ranks) +
                                                          " devices do not fill hosts of " +
                                                          std::to_string(d));
            ok = false;
            return;
        }
        h = ranks / d;
    } else {
        d = limit > 0 ? std::min(limit, ranks) : ranks;
        if (ranks % d != 0) {
            diags.error(devices_loc,
                        std::to_string(ranks) + " devices do not fill hosts of " +
                            std::to_string(d) + " " + m.profile.name,
                        "use a multiple of " + std::to_string(d) +
                            " devices, or set "
                            "`hosts`");
            ok = false;
            return;
        }
        h = ranks / d;
    }
    if (limit > 0 && d > limit) {
        diags.error(hosts ? r.loc_of("hosts") : devices_loc,
                    std::to_string(d) + " devices per host, but one " + m.profile.name +
                        " host holds at most " + std::to_string(limit),
                    "set `hosts: " + std::to_string((ranks + limit - 1) / limit) + "`");
        ok = false;
        return;
    }
    m.hosts = h;
    m.devices_per_host = d;
    m.memory_bytes = memory.value_or(m.profile.memory_bytes);
    m.memory_given = memory.has_value();
    // A host holds one kind: ranks are ((dp * PP + pp) * CP + cp) * TP + tp, so its d
    // consecutive ranks must not reach two pipeline ranks of different kinds.
    for (int64_t host = 0; host < h && !m.pp_profiles.empty(); ++host) {
        auto kind_of = [&](int64_t rank) {
            return m.pp_profiles[static_cast<size_t>((rank / (m.cp * m.tp)) % m.pp)].name;
        };
        for (int64_t r = host * d + 1; r < (host + 1) * d; ++r) {
            if (kind_of(r) == kind_of(host * d)) continue;
            diags.error(devices_loc,
                        "host " + std::to_string(host) + " would hold both " + kind_of(host * d) +
                            " and " + kind_of(r) + " devices",
                        "a host's " + std::to_string(d) +
                            " consecutive ranks must belong to pipeline ranks of one kind: "
                            "make tp x cp a multiple of " +
                            std::to_string(d));
            ok = false;
            return;
        }
    }
}

namespace {

/// A profile field that `--set hardware.KEY=VALUE` may edit: where it lives, its bounds.
struct EditableField {
    const char* key;
    double min;
    bool min_exclusive;
    double max;
    bool integer;
    void (*set)(HardwareProfile&, double);
    const char* example = nullptr; // a value for the hint (else one by the field's range)
};

const EditableField editable_fields[] = {
    {"compute.peak_flops_f32", 0, true, 1e300, false,
     [](HardwareProfile& h, double v) { h.peak_flops_f32 = v; }},
    {"compute.peak_flops_bf16", 0, true, 1e300, false,
     [](HardwareProfile& h, double v) { h.peak_flops_bf16 = v; }},
    {"compute.matmul_efficiency", 0, true, 1, false,
     [](HardwareProfile& h, double v) {
         h.matmul_efficiency = v;
         h.matmul_efficiency_by_width.clear();
     }},
    {"compute.attention_efficiency", 0, true, 1, false,
     [](HardwareProfile& h, double v) { h.attention_efficiency = v; }},
    {"compute.overlap_slowdown", 0, false, 1e300, false,
     [](HardwareProfile& h, double v) { h.overlap_slowdown = v; }, "0.19"},
    {"compute.attention_block", 0, true, 1 << 20, true,
     [](HardwareProfile& h, double v) { h.attention_block = static_cast<int64_t>(v); }},
    {"memory.bytes", 0, true, 9.2e18, true,
     [](HardwareProfile& h, double v) { h.memory_bytes = static_cast<int64_t>(v); }},
    {"memory.bandwidth", 0, true, 1e300, false,
     [](HardwareProfile& h, double v) { h.memory_bandwidth = v; }},
    {"host.devices", 0, true, 1 << 20, true,
     [](HardwareProfile& h, double v) { h.devices_per_host = static_cast<int64_t>(v); }},
    {"links.intra_host.bandwidth", 0, true, 1e300, false,
     [](HardwareProfile& h, double v) { h.intra_host.bandwidth = v; }},
    {"links.intra_host.latency", 0, false, 1e300, false,
     [](HardwareProfile& h, double v) { h.intra_host.latency = v; }, "3e-6"},
    {"links.inter_host.bandwidth", 0, true, 1e300, false,
     [](HardwareProfile& h, double v) { h.inter_host.bandwidth = v; }},
    {"links.inter_host.latency", 0, false, 1e300, false,
     [](HardwareProfile& h, double v) { h.inter_host.latency = v; }, "5e-6"},
};

} // namespace

void BlockChecker::edit_profile(HardwareProfile& profile) {
    if (!hardware) return;
    std::vector<std::string> keys;
    for (const EditableField& f : editable_fields) keys.push_back(f.key);
    for (const Override& o : *hardware) {
        std::string key;
        for (size_t i = 1; i < o.path.size(); ++i) key += (i > 1 ? "." : "") + o.path[i];
        const EditableField* field = nullptr;
        for (const EditableField& f : editable_fields)
            if (key == f.key) field = &f;
        if (!field) {
            std::string best = closest_name(key, keys);
            diags.error(o.key_loc, "`hardware." + key + "` is not a profile field that can be set",
                        best.empty() ? "the fields are " + join_names(keys)
                                     : "did you mean `hardware." + best + "`?");
            ok = false;
            continue;
        }
        if (profile.calibration.cores > 0 && key != "memory.bytes") {
            diags.error(o.key_loc,
                        "`" + profile.name +
                            "` is a calibrated profile: its measured rates price the work, not `" +
                            key + "`",
                        "only `hardware.memory.bytes` applies to a calibrated profile; edit a "
                        "datasheet profile (`h100`, `cpu`) to ask what-if questions");
            ok = false;
            continue;
        }
        std::optional<Value> v = evaluate(*o.value, defs.globals, diags);
        if (!v) {
            ok = false;
            continue;
        }
        double x = v->as_real();
        bool in_range = v->is_number() && std::isfinite(x) &&
                        (field->min_exclusive ? x > field->min : x >= field->min) &&
                        x <= field->max && (!field->integer || x == std::floor(x));
        if (!in_range) {
            std::string what = field->integer         ? "a positive whole number"
                               : field->max == 1      ? "a fraction in (0, 1]"
                               : field->min_exclusive ? "a positive number"
                                                      : "a number of 0 or more";
            diags.error(o.value_loc, "`hardware." + key + "` is " + what,
                        "for example `--set hardware." + key + "=" +
                            (field->example    ? field->example
                             : field->max == 1 ? "0.6"
                             : field->integer  ? "8"
                                               : "2e12") +
                            "`");
            ok = false;
            continue;
        }
        field->set(profile, x);
    }
}

} // namespace dist::lang
