// block_reader.cpp: BlockReader, which reads the fields of one configuration block with their
// types and ranges and reports what it was never asked for; and small arithmetic helpers.
#include "lang/check_internal.hpp"

#include <algorithm>
#include <cstdio>

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

const Field* BlockReader::single(const std::string& name) {
    const Field* f = field(name);
    if (f && f->count) {
        fail(f->count->loc, "`x` counts devices; it belongs to `mesh.devices` only");
        return nullptr;
    }
    return f;
}

std::optional<Value> BlockReader::value(const std::string& name) {
    const Field* f = single(name);
    if (!f) return std::nullopt;
    auto v = evaluate(*f->value, scope_, diags_);
    if (!v) failed_ = true;
    return v;
}

std::nullopt_t BlockReader::fail(SourceLoc loc, std::string message, std::string hint) {
    diags_.error(loc, std::move(message), std::move(hint));
    failed_ = true;
    return std::nullopt;
}

std::optional<Value> BlockReader::typed(const std::string& name, bool (*accept)(const Value&),
                                        const char* what) {
    const Field* f = field(name);
    auto v = value(name);
    if (!v) return std::nullopt;
    if (!accept(*v))
        return fail(f->value->loc,
                    "`" + path_ + "." + name + "` must be " + what + ", got " + v->type_name());
    return v;
}

std::optional<int64_t> BlockReader::integer(const std::string& name, int64_t min, int64_t max) {
    auto v = typed(
        name, [](const Value& x) { return x.type == Value::Type::integer; }, "an integer");
    if (!v) return std::nullopt;
    SourceLoc at = field(name)->value->loc;
    std::string key = "`" + path_ + "." + name + "` must be ";
    if (v->i < min) {
        std::string range = min == 1   ? std::string("positive")
                            : min == 0 ? std::string("zero or more")
                                       : "at least " + std::to_string(min);
        return fail(at, key + range + ", got " + std::to_string(v->i));
    }
    if (v->i > max)
        return fail(at, key + "at most " + std::to_string(max) + ", got " + std::to_string(v->i));
    return v->i;
}

std::optional<double> BlockReader::real(const std::string& name, double min, bool min_exclusive,
                                        double max, bool max_exclusive) {
    auto v = typed(
        name, [](const Value& x) { return x.is_number(); }, "a number");
    if (!v) return std::nullopt;
    double r = v->as_real();
    bool low = min_exclusive ? !(r > min) : !(r >= min);
    bool high = max_exclusive ? !(r < max) : !(r <= max);
    if (!low && !high) return r;
    std::string range;
    if (max >= 1e300)
        range = min_exclusive && min == 0.0 ? "positive"
                : min == 0.0                ? "zero or more"
                                            : "at least " + Value::real(min).str();
    else
        range = std::string(min_exclusive ? "in (" : "in [") + Value::real(min).str() + ", " +
                Value::real(max).str() + (max_exclusive ? ")" : "]");
    return fail(field(name)->value->loc,
                "`" + path_ + "." + name + "` must be " + range + ", got " + v->str());
}

std::optional<bool> BlockReader::boolean(const std::string& name) {
    auto v = typed(
        name, [](const Value& x) { return x.type == Value::Type::boolean; }, "`true` or `false`");
    if (!v) return std::nullopt;
    return v->b;
}

std::optional<std::string> BlockReader::string(const std::string& name) {
    auto v = typed(
        name, [](const Value& x) { return x.type == Value::Type::string; }, "a string");
    if (!v) return std::nullopt;
    return v->s;
}

std::optional<std::string> BlockReader::choice(const std::string& name,
                                               const std::vector<std::string>& options,
                                               const std::string& what) {
    const Field* f = single(name);
    if (!f) return std::nullopt;
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

} // namespace dist::lang
