// check_blocks.cpp: the configuration blocks (mesh, schedule, train, generate), read through
// BlockReader, and the rules that tie them to the model: tensor-parallel divisibility, enough
// blocks for the stages, batch divisibility, schedule constraints, and the memory floor.
#include "lang/check_internal.hpp"
#include "lang/hardware.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <set>

namespace fs = std::filesystem;

namespace dist::lang {

int64_t sat_mul(int64_t a, int64_t b) {
    int64_t r = 0;
    if (a < 0 || b < 0) return 0;
    return __builtin_mul_overflow(a, b, &r) ? INT64_MAX : r;
}

int64_t sat_add(int64_t a, int64_t b) {
    int64_t r = 0;
    return __builtin_add_overflow(a, b, &r) ? INT64_MAX : r;
}

std::string format_bytes(int64_t bytes) {
    char buf[64];
    double b = static_cast<double>(bytes);
    if (b >= (1LL << 40))
        std::snprintf(buf, sizeof buf, "%.1f TiB", b / static_cast<double>(1LL << 40));
    else if (b >= (1LL << 30))
        std::snprintf(buf, sizeof buf, "%.1f GiB", b / static_cast<double>(1LL << 30));
    else if (b >= (1LL << 20))
        std::snprintf(buf, sizeof buf, "%.1f MiB", b / static_cast<double>(1LL << 20));
    else
        std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(bytes));
    return buf;
}

// ---------------------------------------------------------------------------------------------
// BlockReader

BlockReader::BlockReader(const Block* block, std::string path, const Scope& scope,
                         Diagnostics& diags)
    : block_(block), path_(std::move(path)), scope_(scope), diags_(diags) {
    if (!block_) return;
    std::map<std::string, uint32_t> seen;
    for (const auto& item : block_->items) {
        std::string name;
        SourceLoc loc;
        if (item.kind == BlockItem::Kind::field) {
            name = item.field.name;
            loc = item.field.loc;
        } else if (item.kind == BlockItem::Kind::block) {
            name = item.block->name;
            loc = item.block->loc;
        } else {
            continue;
        }
        auto [it, fresh] = seen.emplace(name, loc.line);
        if (!fresh) {
            diags_.error(loc, "`" + name + "` is set twice in " + path_,
                         "first set at line " + std::to_string(it->second));
            failed_ = true;
        }
    }
}

const Field* BlockReader::field(const std::string& name) {
    if (std::find(known_.begin(), known_.end(), name) == known_.end()) known_.push_back(name);
    fields_.insert(name);
    if (!block_) return nullptr;
    for (const auto& item : block_->items)
        if (item.kind == BlockItem::Kind::field && item.field.name == name) return &item.field;
    return nullptr;
}

const Block* BlockReader::block(const std::string& name) {
    if (std::find(known_.begin(), known_.end(), name) == known_.end()) known_.push_back(name);
    blocks_.insert(name);
    if (!block_) return nullptr;
    for (const auto& item : block_->items)
        if (item.kind == BlockItem::Kind::block && item.block->name == name)
            return item.block.get();
    return nullptr;
}

SourceLoc BlockReader::loc_of(const std::string& name) const {
    if (!block_) return {};
    for (const auto& item : block_->items)
        if (item.kind == BlockItem::Kind::field && item.field.name == name) return item.field.loc;
    return block_->loc;
}

std::optional<Value> BlockReader::value(const std::string& name) {
    const Field* f = field(name);
    if (!f) return std::nullopt;
    if (f->count) {
        diags_.error(f->count->loc, "`x` counts devices; it belongs to `mesh.devices` only");
        failed_ = true;
        return std::nullopt;
    }
    auto v = evaluate(*f->value, scope_, diags_);
    if (!v) failed_ = true;
    return v;
}

std::optional<int64_t> BlockReader::integer(const std::string& name, int64_t min, int64_t max) {
    const Field* f = field(name);
    auto v = value(name);
    if (!v) return std::nullopt;
    if (v->type != Value::Type::integer) {
        diags_.error(f->value->loc,
                     "`" + path_ + "." + name + "` must be an integer, got " + v->type_name());
        failed_ = true;
        return std::nullopt;
    }
    if (v->i < min) {
        diags_.error(f->value->loc, "`" + path_ + "." + name + "` must be " +
                                        (min == 1   ? std::string("positive")
                                         : min == 0 ? std::string("zero or more")
                                                    : "at least " + std::to_string(min)) +
                                        ", got " + std::to_string(v->i));
        failed_ = true;
        return std::nullopt;
    }
    if (v->i > max) {
        diags_.error(f->value->loc, "`" + path_ + "." + name + "` must be at most " +
                                        std::to_string(max) + ", got " + std::to_string(v->i));
        failed_ = true;
        return std::nullopt;
    }
    return v->i;
}

std::optional<double> BlockReader::real(const std::string& name, double min, bool min_exclusive,
                                        double max, bool max_exclusive) {
    const Field* f = field(name);
    auto v = value(name);
    if (!v) return std::nullopt;
    if (!v->is_number()) {
        diags_.error(f->value->loc,
                     "`" + path_ + "." + name + "` must be a number, got " + v->type_name());
        failed_ = true;
        return std::nullopt;
    }
    double r = v->as_real();
    bool low = min_exclusive ? !(r > min) : !(r >= min);
    bool high = max_exclusive ? !(r < max) : !(r <= max);
    if (low || high) {
        std::string range;
        if (max >= 1e300)
            range = min_exclusive && min == 0.0 ? "positive"
                    : min == 0.0                ? "zero or more"
                                                : "at least " + Value::real(min).str();
        else
            range = std::string(min_exclusive ? "in (" : "in [") + Value::real(min).str() + ", " +
                    Value::real(max).str() + (max_exclusive ? ")" : "]");
        diags_.error(f->value->loc,
                     "`" + path_ + "." + name + "` must be " + range + ", got " + v->str());
        failed_ = true;
        return std::nullopt;
    }
    return r;
}

std::optional<bool> BlockReader::boolean(const std::string& name) {
    const Field* f = field(name);
    auto v = value(name);
    if (!v) return std::nullopt;
    if (v->type != Value::Type::boolean) {
        diags_.error(f->value->loc, "`" + path_ + "." + name + "` must be `true` or `false`, got " +
                                        v->type_name());
        failed_ = true;
        return std::nullopt;
    }
    return v->b;
}

std::optional<std::string> BlockReader::string(const std::string& name) {
    const Field* f = field(name);
    auto v = value(name);
    if (!v) return std::nullopt;
    if (v->type != Value::Type::string) {
        diags_.error(f->value->loc,
                     "`" + path_ + "." + name + "` must be a string, got " + v->type_name());
        failed_ = true;
        return std::nullopt;
    }
    return v->s;
}

std::optional<std::string> BlockReader::choice(const std::string& name,
                                               const std::vector<std::string>& options,
                                               const std::string& what) {
    const Field* f = field(name);
    if (!f) return std::nullopt;
    if (f->count) {
        diags_.error(f->count->loc, "`x` counts devices; it belongs to `mesh.devices` only");
        failed_ = true;
        return std::nullopt;
    }
    const Expr& e = *f->value;
    std::string text = e.kind == ExprKind::name ? e.text : "";
    if (e.kind != ExprKind::name) {
        diags_.error(e.loc, "`" + path_ + "." + name + "` is one of " + join_names(options, " or "),
                     e.kind == ExprKind::string ? "write the name without quotes" : "");
        failed_ = true;
        return std::nullopt;
    }
    if (std::find(options.begin(), options.end(), text) == options.end()) {
        std::string best = closest_name(text, options);
        diags_.error(e.loc, "unknown " + what + " `" + text + "`",
                     best.empty() ? "the choices are " + join_names(options, " and ")
                                  : "did you mean `" + best + "`?");
        failed_ = true;
        return std::nullopt;
    }
    return text;
}

std::vector<const TableRow*> BlockReader::rows() {
    rows_read_ = true;
    std::vector<const TableRow*> out;
    if (!block_) return out;
    for (const auto& item : block_->items)
        if (item.kind == BlockItem::Kind::row) out.push_back(&item.row);
    return out;
}

void BlockReader::finish() {
    if (!block_) return;
    for (const auto& item : block_->items) {
        if (item.kind == BlockItem::Kind::row) {
            if (!rows_read_) {
                diags_.error(item.row.loc, "`rank` rows belong in `schedule { actions { ... } }`");
                failed_ = true;
            }
            continue;
        }
        bool is_field = item.kind == BlockItem::Kind::field;
        const std::string& name = is_field ? item.field.name : item.block->name;
        SourceLoc loc = is_field ? item.field.loc : item.block->loc;
        if (is_field ? fields_.count(name) : blocks_.count(name)) continue;
        if (is_field && blocks_.count(name)) {
            diags_.error(loc, "`" + name + "` is a block in " + path_,
                         "write `" + name + " { ... }` and set its fields inside");
            failed_ = true;
            continue;
        }
        if (!is_field && fields_.count(name)) {
            diags_.error(loc, "`" + name + "` is a field in " + path_,
                         "write `" + name + ": VALUE`");
            failed_ = true;
            continue;
        }
        std::string best = closest_name(name, known_);
        std::string list = path_ + " holds " + join_names(known_, " and ");
        diags_.error(loc,
                     std::string("unknown ") +
                         (item.kind == BlockItem::Kind::field ? "field" : "block") + " `" + name +
                         "` in " + path_,
                     best.empty() ? list : "did you mean `" + best + "`? " + list);
        failed_ = true;
    }
}

// ---------------------------------------------------------------------------------------------

namespace {

const std::vector<std::string> schedule_kinds = {"gpipe",      "1f1b",      "interleaved_1f1b",
                                                 "looped_bfs", "zb_h1",     "zb_h2",
                                                 "zbv",        "dualpipev", "custom"};

template <typename E> E pick(const std::vector<std::string>& names, const std::string& s) {
    return static_cast<E>(std::find(names.begin(), names.end(), s) - names.begin());
}

std::string divisors_hint(int64_t n, int64_t limit = 64) {
    std::vector<std::string> ds;
    for (int64_t d = 1; d <= n && d <= limit; ++d)
        if (n % d == 0) ds.push_back(std::to_string(d));
    return join_names(ds, " or ");
}

struct Checker {
    const Definitions& defs;
    const fs::path& dir;
    const FrontendOptions& options;
    SourceManager& sources;
    Diagnostics& diags;
    Program& p;
    uint32_t file;
    bool model_ok;
    bool unknown_block = false;
    bool ok = true;

    Checker(const Definitions& d, const fs::path& dir_, const FrontendOptions& o, SourceManager& s,
            Diagnostics& dg, Program& prog, uint32_t f, bool model)
        : defs(d), dir(dir_), options(o), sources(s), diags(dg), p(prog), file(f), model_ok(model) {
    }

    // Locations that later rules point at.
    SourceLoc tp_loc, pp_loc, dp_loc, devices_loc, v_loc, m_loc, batch_loc, kind_loc;

    bool read_data(BlockReader& r, const std::string& name, DataSpec& out) {
        const Field* f = r.field(name);
        if (!f) return true;
        const Expr& e = *f->value;
        static const std::vector<std::string> sources_ = {"text", "tokens", "synthetic"};
        if (e.kind != ExprKind::call ||
            std::find(sources_.begin(), sources_.end(), e.text) == sources_.end()) {
            std::string best = e.kind == ExprKind::call ? closest_name(e.text, sources_) : "";
            diags.error(e.loc, "data is `text(\"FILE\")`, `tokens(\"FILE.bin\")` or `synthetic()`",
                        best.empty() ? "" : "did you mean `" + best + "`?");
            return false;
        }
        out.format = e.text == "text"     ? DataFormat::text
                     : e.text == "tokens" ? DataFormat::tokens
                                          : DataFormat::synthetic;
        if (out.format == DataFormat::synthetic) {
            if (!e.args.empty()) {
                diags.error(e.args[0].value->loc, "`synthetic()` takes no arguments");
                return false;
            }
            return true;
        }
        if (e.args.size() != 1 || !e.args[0].name.empty()) {
            diags.error(e.loc, "`" + e.text + "` takes one argument: the file's path");
            return false;
        }
        auto v = evaluate(*e.args[0].value, defs.globals, diags);
        if (!v) return false;
        if (v->type != Value::Type::string || v->s.empty()) {
            diags.error(e.args[0].value->loc, "the data file is a non-empty string");
            return false;
        }
        fs::path path(v->s);
        if (path.is_relative()) path = dir / path;
        out.path = path.lexically_normal().string();
        if (options.check_files) {
            std::error_code ec;
            if (!fs::exists(path, ec)) {
                diags.error(e.args[0].value->loc, "cannot find data file `" + v->s + "`",
                            v->s.find("fortunes") != std::string::npos
                                ? "Debian's `fortunes` package provides it: run `make deps`"
                                : "paths are relative to the script's folder");
                return false;
            }
            if (!fs::is_regular_file(path, ec)) {
                diags.error(e.args[0].value->loc, "data file `" + v->s + "` is not a regular file");
                return false;
            }
        }
        return true;
    }

    void mesh(const Block* block) {
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
        dp_loc = r.loc_of("dp");
        tp_loc = r.loc_of("tp");
        pp_loc = r.loc_of("pp");
        auto hosts = r.integer("hosts", 1, max_ranks);
        auto per_host = r.integer("devices_per_host", 1, max_ranks);
        auto memory = r.integer("memory", 1);
        r.finish();
        if (r.failed()) ok = false;

        int64_t ranks = sat_mul(sat_mul(m.dp, m.tp), m.pp);
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
        if (dev->value->kind != ExprKind::name) {
            diags.error(dev->value->loc, "`devices` names a hardware profile, e.g. `h200 x 8`",
                        dev->value->kind == ExprKind::string ? "write the name without quotes"
                                                             : "");
            ok = false;
            return;
        }
        m.device = dev->value->text;
        // Find the profile by file name, else by alias. Only the chosen profile's errors
        // concern this script: the others are read quietly while looking for an alias.
        std::vector<std::filesystem::path> files = profile_files(options.search_roots);
        std::vector<std::string> names;
        bool found = false;
        for (const auto& path : files) {
            if (path.stem() != m.device) continue;
            auto prof = load_profile(path, sources, diags);
            if (!prof) {
                ok = false;
                return;
            }
            m.profile = *prof;
            found = true;
        }
        for (const auto& path : files) {
            if (found) break;
            SourceManager scratch;
            Diagnostics quiet;
            auto prof = load_profile(path, scratch, quiet);
            if (!prof) continue;
            if (path.stem().string().find('-') == std::string::npos)
                names.push_back(path.stem().string());
            names.insert(names.end(), prof->aliases.begin(), prof->aliases.end());
            if (std::find(prof->aliases.begin(), prof->aliases.end(), m.device) !=
                prof->aliases.end()) {
                m.profile = *prof;
                found = true;
            }
        }
        if (!found) {
            std::string best = closest_name(m.device, names);
            diags.error(dev->value->loc, "unknown device `" + m.device + "`",
                        best.empty() ? "the devices are " + join_names(names)
                                     : "did you mean `" + best + "`?");
            ok = false;
            return;
        }
        if (dev->count) {
            auto c = evaluate(*dev->count, defs.globals, diags);
            if (!c) {
                ok = false;
                return;
            }
            if (c->type != Value::Type::integer || c->i < 1) {
                diags.error(dev->count->loc, "the device count must be a positive integer");
                ok = false;
                return;
            }
            if (c->i != ranks) {
                int64_t tpp = m.tp * m.pp;
                std::string hint = c->i % tpp == 0
                                       ? "set `dp: " + std::to_string(c->i / tpp) + "` to use " +
                                             std::to_string(c->i) + " devices"
                                       : "the device count is dp x tp x pp";
                diags.error(dev->count->loc,
                            "the mesh has dp x tp x pp = " + std::to_string(m.dp) + " x " +
                                std::to_string(m.tp) + " x " + std::to_string(m.pp) + " = " +
                                std::to_string(ranks) + " ranks, but " + std::to_string(c->i) +
                                " devices",
                            hint);
                ok = false;
                return;
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
    }

    void schedule(const Block* block) {
        BlockReader r(block, "schedule", defs.globals, diags);
        ScheduleSpec& s = p.schedule;
        auto kind = r.choice("kind", schedule_kinds, "schedule kind");
        kind_loc = r.loc_of("kind");
        if (kind) s.kind = pick<ScheduleKind>(schedule_kinds, *kind);
        bool two_per_rank = s.kind == ScheduleKind::zbv || s.kind == ScheduleKind::dualpipev;
        auto m = r.integer("microbatches", 1, max_microbatches);
        m_loc = r.loc_of("microbatches");
        auto v = r.integer("virtual_stages", 1, 1024);
        v_loc = r.loc_of("virtual_stages");
        s.microbatches = m.value_or(1);
        s.virtual_stages = v.value_or(two_per_rank ? 2 : 1);
        static const std::vector<std::string> recompute = {"none", "selective", "full"};
        if (auto rc = r.choice("recompute", recompute, "recompute mode"))
            s.recompute = pick<Recompute>(recompute, *rc);
        const Field* part = r.field("partition");
        const Block* actions = r.block("actions");
        r.finish();
        if (r.failed()) {
            ok = false;
            return;
        }
        int64_t pp = p.mesh.pp, vs = s.virtual_stages, mb = s.microbatches;
        int64_t stages = pp * vs;
        if (!model_ok) {
            // The stage rules need the model's blocks; the custom table can still be read.
            if (s.kind == ScheduleKind::custom && actions) custom(actions);
            return;
        }
        int64_t blocks = static_cast<int64_t>(p.model.blocks.size());
        std::string kname = to_string(s.kind);

        // Constraints of each schedule family.
        if ((s.kind == ScheduleKind::gpipe || s.kind == ScheduleKind::one_f_one_b ||
             s.kind == ScheduleKind::zb_h1 || s.kind == ScheduleKind::zb_h2) &&
            vs != 1) {
            diags.error(v_loc, "`" + kname + "` runs one stage per rank, not " + std::to_string(vs),
                        "use `interleaved_1f1b` or `looped_bfs` for virtual stages");
            ok = false;
        }
        if (s.kind == ScheduleKind::interleaved_1f1b) {
            if (vs < 2) {
                diags.error(v.has_value() ? v_loc : kind_loc,
                            "`interleaved_1f1b` needs virtual_stages of 2 or more",
                            "with one stage per rank, use `1f1b`");
                ok = false;
            }
            if (mb % pp != 0) {
                diags.error(m_loc,
                            "`interleaved_1f1b` needs microbatches divisible by pp = " +
                                std::to_string(pp) + ", got " + std::to_string(mb),
                            "use " + std::to_string(((mb + pp - 1) / pp) * pp) +
                                " microbatches (a multiple of pp, as Megatron-LM requires)");
                ok = false;
            }
        }
        if (two_per_rank && vs != 2) {
            diags.error(v_loc, "`" + kname + "` places exactly two stages on each rank, in a V",
                        "set `virtual_stages: 2`");
            ok = false;
        }
        if ((s.kind == ScheduleKind::zb_h1 || s.kind == ScheduleKind::zb_h2 ||
             s.kind == ScheduleKind::zbv) &&
            mb < pp) {
            diags.error(m_loc,
                        "`" + kname + "` needs at least pp = " + std::to_string(pp) +
                            " microbatches, got " + std::to_string(mb),
                        "use " + std::to_string(pp) + " or more microbatches");
            ok = false;
        }
        if (s.kind == ScheduleKind::dualpipev && mb < 2 * pp) {
            diags.error(m_loc,
                        "`dualpipev` needs at least 2 x pp = " + std::to_string(2 * pp) +
                            " microbatches, got " + std::to_string(mb),
                        "use " + std::to_string(2 * pp) + " or more microbatches");
            ok = false;
        }
        if (blocks < stages) {
            diags.error(pp_loc.valid() && pp > 1 ? pp_loc
                        : v_loc.valid()          ? v_loc
                                                 : kind_loc,
                        "the model has " + std::to_string(blocks) +
                            " blocks, too few for pp x "
                            "virtual_stages = " +
                            std::to_string(pp) + " x " + std::to_string(vs) + " = " +
                            std::to_string(stages) + " stages",
                        "use at most " + std::to_string(blocks) + " stages, or more layers");
            ok = false;
            return;
        }
        // Partition: blocks per stage, given or an even split.
        if (part) {
            auto pv = evaluate(*part->value, defs.globals, diags);
            if (!pv) {
                ok = false;
                return;
            }
            bool shape = pv->type == Value::Type::tuple;
            for (const auto& x : pv->items)
                shape = shape && x.type == Value::Type::integer && x.i >= 0;
            if (!shape) {
                diags.error(part->value->loc, "`partition` is a list of block counts, one per "
                                              "stage, e.g. [3, 3, 2]");
                ok = false;
                return;
            }
            int64_t sum = 0;
            for (const auto& x : pv->items) sum = sat_add(sum, x.i);
            if (static_cast<int64_t>(pv->items.size()) != stages) {
                diags.error(part->value->loc,
                            "`partition` has " + std::to_string(pv->items.size()) +
                                " entries for " + std::to_string(stages) + " stages");
                ok = false;
                return;
            }
            if (sum != blocks) {
                diags.error(part->value->loc, "`partition` places " + std::to_string(sum) +
                                                  " blocks; the model has " +
                                                  std::to_string(blocks));
                ok = false;
                return;
            }
            for (const auto& x : pv->items) s.partition.push_back(x.i);
            s.partition_given = true;
        } else {
            for (int64_t i = 0; i < stages; ++i) {
                // Extra blocks go to the later stages: the first one also holds the embeddings.
                s.partition.push_back(blocks / stages + (i >= stages - blocks % stages ? 1 : 0));
            }
        }
        // Custom tables.
        if (actions && s.kind != ScheduleKind::custom) {
            diags.error(actions->loc, "an `actions` table needs `kind: custom`");
            ok = false;
        }
        if (s.kind == ScheduleKind::custom) {
            if (!actions) {
                diags.error(kind_loc, "a custom schedule needs an `actions` table",
                            "add `actions { rank 0: 0F0 0B0 ... }` with one row per pipeline "
                            "rank");
                ok = false;
                return;
            }
            custom(actions);
        }
    }

    void custom(const Block* actions) {
        BlockReader r(actions, "schedule.actions", defs.globals, diags);
        std::vector<const TableRow*> rows = r.rows();
        r.finish();
        if (r.failed()) ok = false;
        ScheduleSpec& s = p.schedule;
        int64_t pp = p.mesh.pp, stages = pp * s.virtual_stages, mb = s.microbatches;
        s.actions.assign(static_cast<size_t>(pp), {});
        s.action_rows.assign(static_cast<size_t>(pp), SourceLoc{});
        std::vector<bool> seen(static_cast<size_t>(pp), false);
        std::map<int64_t, int64_t> stage_rank;
        // count[stage][mb][op]
        std::map<std::tuple<int64_t, int64_t, char>, SourceLoc> done;
        std::set<int64_t> split_stages;
        bool table_ok = true;
        for (const TableRow* row : rows) {
            auto rank = evaluate(*row->rank, defs.globals, diags);
            if (!rank) {
                table_ok = false;
                continue;
            }
            if (rank->type != Value::Type::integer || rank->i < 0 || rank->i >= pp) {
                diags.error(row->rank->loc, "`rank` is a pipeline rank from 0 to " +
                                                std::to_string(pp - 1) + ", got " + rank->str());
                table_ok = false;
                continue;
            }
            size_t ri = static_cast<size_t>(rank->i);
            if (seen[ri]) {
                diags.error(row->loc, "rank " + rank->str() + " has two rows");
                table_ok = false;
                continue;
            }
            seen[ri] = true;
            s.action_rows[ri] = row->loc;
            for (size_t k = 0; k < row->actions.size(); ++k) {
                const std::string& a = row->actions[k];
                SourceLoc at = row->action_locs[k];
                size_t i = 0;
                while (i < a.size() && std::isdigit(static_cast<unsigned char>(a[i]))) ++i;
                size_t op_at = i;
                bool shape =
                    i > 0 && i < a.size() && std::string("FBIW").find(a[i]) != std::string::npos;
                size_t j = op_at + 1;
                while (shape && j < a.size() && std::isdigit(static_cast<unsigned char>(a[j]))) ++j;
                shape = shape && j == a.size() && j > op_at + 1 && op_at <= 9 &&
                        a.size() - op_at - 1 <= 9;
                if (!shape) {
                    diags.error(at, "`" + a + "` is not an action",
                                "write <stage><F|B|I|W><microbatch>, e.g. `0F1`");
                    table_ok = false;
                    continue;
                }
                ActionSpec act;
                act.stage = std::stoll(a.substr(0, op_at));
                act.op = a[op_at];
                act.microbatch = std::stoll(a.substr(op_at + 1));
                act.loc = at;
                if (act.stage >= stages) {
                    diags.error(at, "stage " + std::to_string(act.stage) + " does not exist; " +
                                        "the stages are 0 to " + std::to_string(stages - 1));
                    table_ok = false;
                    continue;
                }
                if (act.microbatch >= mb) {
                    diags.error(at, "microbatch " + std::to_string(act.microbatch) +
                                        " does not exist; the microbatches are 0 to " +
                                        std::to_string(mb - 1));
                    table_ok = false;
                    continue;
                }
                auto [it, fresh] = stage_rank.emplace(act.stage, rank->i);
                if (!fresh && it->second != rank->i) {
                    if (split_stages.insert(act.stage).second)
                        diags.error(at,
                                    "stage " + std::to_string(act.stage) + " is on rank " +
                                        std::to_string(it->second) + " already",
                                    "each stage lives on one rank");
                    table_ok = false;
                    continue;
                }
                auto key = std::make_tuple(act.stage, act.microbatch, act.op);
                if (done.count(key)) {
                    diags.error(at, "`" + a + "` appears twice",
                                "first at column " + std::to_string(done[key].col));
                    table_ok = false;
                    continue;
                }
                done[key] = at;
                s.actions[ri].push_back(act);
            }
        }
        for (int64_t ri = 0; ri < pp; ++ri) {
            if (!seen[static_cast<size_t>(ri)]) {
                diags.error(actions->loc, "the table has no row for rank " + std::to_string(ri),
                            "give every pipeline rank 0 to " + std::to_string(pp - 1) + " a row");
                table_ok = false;
            }
        }
        if (table_ok) {
            // Completeness: every stage and microbatch runs F and a backward, once.
            for (int64_t st = 0; st < stages && table_ok; ++st) {
                for (int64_t m = 0; m < mb; ++m) {
                    bool f = done.count({st, m, 'F'}), b = done.count({st, m, 'B'}),
                         i = done.count({st, m, 'I'}), w = done.count({st, m, 'W'});
                    std::string what;
                    if (!f)
                        what = "no forward `" + std::to_string(st) + "F" + std::to_string(m) + "`";
                    else if (b && (i || w))
                        what = "both B and I/W for stage " + std::to_string(st) + " microbatch " +
                               std::to_string(m);
                    else if (!b && !(i && w))
                        what = "no backward for stage " + std::to_string(st) + " microbatch " +
                               std::to_string(m) + " (B, or I and W)";
                    if (!what.empty()) {
                        auto owner = stage_rank.find(st);
                        SourceLoc at = owner != stage_rank.end()
                                           ? s.action_rows[static_cast<size_t>(owner->second)]
                                           : actions->loc;
                        diags.error(at, "the table has " + what);
                        table_ok = false;
                        break;
                    }
                }
            }
        }
        if (table_ok) {
            // Each rank runs virtual_stages stages of its own.
            std::vector<int64_t> per_rank(static_cast<size_t>(pp), 0);
            for (const auto& [stage, rank] : stage_rank) ++per_rank[static_cast<size_t>(rank)];
            for (int64_t ri = 0; ri < pp && table_ok; ++ri) {
                if (per_rank[static_cast<size_t>(ri)] != s.virtual_stages) {
                    diags.error(s.action_rows[static_cast<size_t>(ri)],
                                "rank " + std::to_string(ri) + " runs " +
                                    std::to_string(per_rank[static_cast<size_t>(ri)]) +
                                    " stages; each rank runs virtual_stages = " +
                                    std::to_string(s.virtual_stages));
                    table_ok = false;
                }
            }
            for (const auto& [stage, rank] : stage_rank) s.stage_ranks.push_back(rank);
        }
        ok = ok && table_ok;
    }

    void train(const Block* block) {
        BlockReader r(block, "train", defs.globals, diags);
        TrainSpec& t = p.train;
        if (!block) {
            if (!unknown_block)
                diags.error({file, 1, 1, 1}, "the script has no `train` block",
                            "add `train { batch: 8  steps: 100 }` at least");
            ok = false;
            return;
        }
        if (!read_data(r, "data", t.data)) ok = false;
        auto batch = r.integer("batch", 1, INT64_MAX / 2);
        batch_loc = r.loc_of("batch");
        auto steps = r.integer("steps", 1);
        auto stop = r.integer("stop_after", 1);
        t.seed = r.integer("seed", 0).value_or(1337);
        static const std::vector<std::string> precisions = {"f32", "bf16"};
        if (auto pr = r.choice("precision", precisions, "precision"))
            t.precision = pick<Precision>(precisions, *pr);
        t.clip = r.real("clip", 0.0, false).value_or(0.0);

        BlockReader o(r.block("optimizer"), "train.optimizer", defs.globals, diags);
        o.choice("kind", {"adamw"}, "optimizer");
        t.optimizer.lr = o.real("lr", 0.0, true).value_or(t.optimizer.lr);
        if (const Field* betas = o.field("betas")) {
            auto bv = evaluate(*betas->value, defs.globals, diags);
            bool shape = bv && bv->type == Value::Type::tuple && bv->items.size() == 2 &&
                         bv->items[0].is_number() && bv->items[1].is_number();
            if (!shape || bv->items[0].as_real() < 0 || bv->items[0].as_real() >= 1 ||
                bv->items[1].as_real() < 0 || bv->items[1].as_real() >= 1) {
                if (bv)
                    diags.error(betas->value->loc, "`betas` is two numbers in [0, 1), e.g. "
                                                   "(0.9, 0.95)");
                ok = false;
            } else {
                t.optimizer.beta1 = bv->items[0].as_real();
                t.optimizer.beta2 = bv->items[1].as_real();
            }
        }
        t.optimizer.eps = o.real("eps", 0.0, true).value_or(t.optimizer.eps);
        t.optimizer.weight_decay = o.real("weight_decay", 0.0, false).value_or(0.0);
        o.finish();

        static const std::vector<std::string> lr_kinds = {"constant", "cosine", "linear"};
        BlockReader l(r.block("lr_schedule"), "train.lr_schedule", defs.globals, diags);
        if (auto k = l.choice("kind", lr_kinds, "lr schedule"))
            t.lr_schedule.kind = pick<LrScheduleKind>(lr_kinds, *k);
        auto warmup = l.integer("warmup", 0);
        t.lr_schedule.warmup = warmup.value_or(0);
        auto min_lr = l.real("min_lr", 0.0, false);
        t.lr_schedule.min_lr = min_lr.value_or(0.0);
        l.finish();

        BlockReader c(r.block("checkpoint"), "train.checkpoint", defs.globals, diags);
        t.checkpoint.every = c.integer("every", 1).value_or(0);
        auto ckdir = c.string("dir");
        if (ckdir) {
            if (ckdir->empty()) {
                diags.error(c.loc_of("dir"), "`train.checkpoint.dir` is empty");
                ok = false;
            } else {
                fs::path d(*ckdir);
                t.checkpoint.dir = (d.is_relative() ? dir / d : d).lexically_normal().string();
            }
        } else if (c.present() && !c.failed()) {
            diags.error(c.loc(), "`checkpoint` needs `dir`, the folder to save into");
            ok = false;
        }
        c.finish();

        BlockReader e(r.block("eval"), "train.eval", defs.globals, diags);
        t.eval.every = e.integer("every", 1).value_or(0);
        if (!read_data(e, "data", t.eval.data)) ok = false;
        t.eval.batches = e.integer("batches", 1).value_or(1);
        if (e.present() && !e.failed() && t.eval.data.format == DataFormat::none) {
            diags.error(e.loc(), "`eval` needs `data`");
            ok = false;
        }
        e.finish();
        r.finish();
        ok = ok && !r.failed() && !o.failed() && !l.failed() && !c.failed() && !e.failed();

        if (!batch) {
            if (!r.failed())
                diags.error(block->loc, "`train` needs `batch`, the global batch in sequences");
            ok = false;
        }
        if (!steps) {
            if (!r.failed()) diags.error(block->loc, "`train` needs `steps`");
            ok = false;
        }
        if (!batch || !steps) return;
        t.batch = *batch;
        t.steps = *steps;
        if (stop) {
            if (*stop > t.steps) {
                diags.error(r.loc_of("stop_after"), "`stop_after` " + std::to_string(*stop) +
                                                        " is past the last step " +
                                                        std::to_string(t.steps));
                ok = false;
            }
            t.stop_after = *stop;
        }
        if (warmup && *warmup > t.steps) {
            diags.error(l.loc_of("warmup"), "warm-up of " + std::to_string(*warmup) +
                                                " steps is longer than the run's " +
                                                std::to_string(t.steps));
            ok = false;
        }
        if (min_lr && *min_lr > t.optimizer.lr) {
            diags.error(l.loc_of("min_lr"),
                        "`min_lr` is above the peak `lr` " + Value::real(t.optimizer.lr).str());
            ok = false;
        }
    }

    void generate(const Block* block) {
        BlockReader r(block, "generate", defs.globals, diags);
        GenerateSpec& g = p.generate;
        g.temperature = r.real("temperature", 0.0, false).value_or(1.0);
        g.top_k = r.integer("top_k", 0, model_ok ? p.model.vocab : INT64_MAX).value_or(0);
        // Generation may run past the context: it then conditions on the last `context` tokens.
        g.max_tokens = r.integer("max_tokens", 1, 1 << 20).value_or(256);
        r.finish();
        if (r.failed()) ok = false;
    }

    // Rules across blocks: tensor-parallel divisibility, the batch, the memory floor.
    void cross() {
        const MeshSpec& m = p.mesh;
        if (m.tp > 1) {
            // Every sharded size must split evenly; report each size that does not, once.
            struct Need {
                int64_t n;
                const LayerSpec* layer;
                const char* what;
            };
            std::vector<Need> needs;
            auto visit = [&](const LayerSpec& l) {
                switch (l.shard) {
                case ShardDim::heads:
                    needs.push_back({l.heads, &l, "attention heads"});
                    needs.push_back({l.kv_heads, &l, "key/value heads"});
                    break;
                case ShardDim::hidden: needs.push_back({l.hidden, &l, "hidden size"}); break;
                case ShardDim::vocab: needs.push_back({l.vocab, &l, "vocabulary"}); break;
                case ShardDim::none: break;
                }
            };
            for (const auto& it : p.model.pre)
                for (const auto& l : it.layers) visit(l);
            for (const auto& it : p.model.blocks.front().items)
                for (const auto& l : it.layers) visit(l);
            for (const auto& it : p.model.post)
                for (const auto& l : it.layers) visit(l);
            int64_t g = 0;
            for (const auto& n : needs) g = std::gcd(g, n.n);
            // One error for the one cause, naming every size that does not split.
            std::set<std::string> said;
            std::vector<std::string> parts;
            bool vocab = false;
            int64_t vocab_size = 0;
            for (const auto& n : needs) {
                if (n.n % m.tp == 0) continue;
                if (!said.insert(std::string(n.what) + std::to_string(n.n)).second) continue;
                if (std::string(n.what) == "key/value heads" && n.layer->kv_heads == n.layer->heads)
                    continue;
                parts.push_back(std::string(n.what) + " " + std::to_string(n.n) + " (`" +
                                n.layer->name + "`)");
                if (std::string(n.what) == "vocabulary") {
                    vocab = true;
                    vocab_size = n.n;
                }
            }
            if (!parts.empty()) {
                std::string list;
                for (size_t i = 0; i < parts.size(); ++i)
                    list += (i == 0 ? "" : i + 1 == parts.size() ? " and " : ", ") + parts[i];
                std::string hint =
                    "tp must divide every size it splits: use tp = " + divisors_hint(g);
                if (vocab) {
                    int64_t step = std::lcm<int64_t>(m.tp, 128);
                    hint += "; or pad the vocabulary to " +
                            std::to_string(((vocab_size + step - 1) / step) * step);
                }
                diags.error(tp_loc, "tp = " + std::to_string(m.tp) + " does not divide the " + list,
                            hint);
                ok = false;
            }
        }
        int64_t split = sat_mul(m.dp, p.schedule.microbatches);
        if (p.train.batch % split != 0) {
            int64_t up = ((p.train.batch + split - 1) / split) * split;
            diags.error(batch_loc,
                        "global batch " + std::to_string(p.train.batch) +
                            " is not divisible by dp x microbatches = " + std::to_string(m.dp) +
                            " x " + std::to_string(p.schedule.microbatches) + " = " +
                            std::to_string(split),
                        "use a batch of " + std::to_string(up) + " (or " +
                            std::to_string(split * 2 > up ? split * 2 : up + split) + ")");
            ok = false;
        } else {
            p.train.microbatch_size = p.train.batch / split;
        }
        memory_floor();
    }

    void memory_floor() {
        const MeshSpec& m = p.mesh;
        const ScheduleSpec& s = p.schedule;
        int64_t stages = static_cast<int64_t>(s.partition.size());
        if (stages == 0) return;
        bool v_shape = s.kind == ScheduleKind::zbv || s.kind == ScheduleKind::dualpipev;
        auto rank_of = [&](int64_t stage) {
            if (!s.stage_ranks.empty()) return s.stage_ranks[static_cast<size_t>(stage)];
            if (v_shape) return stage < m.pp ? stage : 2 * m.pp - 1 - stage;
            return stage % m.pp;
        };
        auto on_device = [&](const LayerSpec& l) {
            return l.shard == ShardDim::none ? l.parameters : (l.parameters + m.tp - 1) / m.tp;
        };
        std::vector<int64_t> per_rank(static_cast<size_t>(m.pp), 0);
        auto add = [&](int64_t stage, int64_t n) {
            int64_t& slot = per_rank[static_cast<size_t>(rank_of(stage))];
            slot = sat_add(slot, n);
        };
        const LayerSpec* embedding = &p.model.pre.front().layers.front();
        for (const auto& it : p.model.pre)
            for (const auto& l : it.layers) add(0, on_device(l));
        int64_t block = 0;
        for (int64_t st = 0; st < stages; ++st) {
            for (int64_t k = 0; k < s.partition[static_cast<size_t>(st)]; ++k, ++block) {
                for (const auto& it : p.model.blocks[static_cast<size_t>(block)].items)
                    for (const auto& l : it.layers) add(st, on_device(l));
            }
        }
        for (const auto& it : p.model.post) {
            for (const auto& l : it.layers) {
                add(stages - 1, on_device(l));
                // A tied head on another rank keeps its own copy of the embedding.
                if (l.kind == LayerKind::lm_head && l.tied && rank_of(stages - 1) != rank_of(0))
                    add(stages - 1, on_device(*embedding));
            }
        }
        int64_t worst = *std::max_element(per_rank.begin(), per_rank.end());
        p.memory.parameters_per_device = worst;
        p.memory.bytes_per_device = sat_mul(worst, p.memory.bytes_per_parameter);
        if (p.memory.bytes_per_device > m.memory_bytes) {
            char params[64];
            double n = static_cast<double>(worst);
            if (n >= 1e9)
                std::snprintf(params, sizeof params, "%.2fB", n / 1e9);
            else
                std::snprintf(params, sizeof params, "%.2fM", n / 1e6);
            diags.error(devices_loc,
                        "the model does not fit: the fullest device holds " + std::string(params) +
                            " parameters, " + format_bytes(p.memory.bytes_per_device) +
                            " of weights, gradients and AdamW state, but one " + m.profile.name +
                            " has " + format_bytes(m.memory_bytes),
                        "raise tp or pp to spread the model, or pick a device with more memory");
            ok = false;
        }
    }
};

} // namespace

bool check_blocks(const BlockSet& blocks, const Definitions& defs, const fs::path& script_dir,
                  const FrontendOptions& options, SourceManager& sources, Diagnostics& diags,
                  Program& program) {
    Checker c(defs, script_dir, options, sources, diags, program, blocks.file, blocks.model_ok);
    c.unknown_block = blocks.unknown_block;
    c.mesh(blocks.mesh);
    if (!c.ok) {
        // Later rules need a valid mesh; still read the other blocks for their own errors.
        program.mesh.pp = std::max<int64_t>(program.mesh.pp, 1);
    }
    bool mesh_ok = c.ok;
    c.schedule(blocks.schedule);
    bool schedule_ok = c.ok;
    c.train(blocks.train);
    c.generate(blocks.generate);
    if (mesh_ok && schedule_ok && c.ok && blocks.model_ok) c.cross();
    return c.ok;
}

} // namespace dist::lang
