// value.cpp: the evaluator. Exact integer arithmetic with located overflow and division errors.
#include "lang/value.hpp"

#include <cmath>
#include <cstdio>
#include <limits>

namespace dist::lang {

std::string Value::type_name() const {
    switch (type) {
    case Type::integer: return "an integer";
    case Type::real: return "a real number";
    case Type::boolean: return "a boolean";
    case Type::string: return "a string";
    case Type::symbol: return "a name";
    case Type::tuple: return "a list";
    }
    return "a value";
}

std::string Value::str() const {
    switch (type) {
    case Type::integer: return std::to_string(i);
    case Type::real: {
        char buf[64];
        std::snprintf(buf, sizeof buf, "%.17g", r);
        // Shortest form that reads back to the same double.
        for (int prec = 1; prec <= 17; ++prec) {
            std::snprintf(buf, sizeof buf, "%.*g", prec, r);
            if (std::strtod(buf, nullptr) == r) break;
        }
        std::string out = buf;
        if (out.find_first_of(".eni") == std::string::npos) out += ".0";
        return out;
    }
    case Type::boolean: return b ? "true" : "false";
    case Type::string: return "\"" + s + "\"";
    case Type::symbol: return s;
    case Type::tuple: {
        std::string out = "(";
        for (size_t k = 0; k < items.size(); ++k) out += (k ? ", " : "") + items[k].str();
        return out + ")";
    }
    }
    return {};
}

const Value* Scope::find(const std::string& name) const {
    for (const Scope* s = this; s; s = s->parent_) {
        auto it = s->vars_.find(name);
        if (it != s->vars_.end()) return &it->second.value;
    }
    return nullptr;
}

const SourceLoc* Scope::defined_here(const std::string& name) const {
    auto it = vars_.find(name);
    return it == vars_.end() ? nullptr : &it->second.loc;
}

std::vector<std::string> Scope::names() const {
    std::vector<std::string> out;
    for (const Scope* s = this; s; s = s->parent_)
        for (const auto& [k, v] : s->vars_) out.push_back(k);
    return out;
}

int64_t unit_bytes(const std::string& unit) {
    if (unit == "B") return 1;
    if (unit == "KB") return 1000;
    if (unit == "MB") return 1000 * 1000;
    if (unit == "GB") return 1000LL * 1000 * 1000;
    if (unit == "TB") return 1000LL * 1000 * 1000 * 1000;
    if (unit == "KiB") return 1LL << 10;
    if (unit == "MiB") return 1LL << 20;
    if (unit == "GiB") return 1LL << 30;
    if (unit == "TiB") return 1LL << 40;
    return 0;
}

namespace {

using Opt = std::optional<Value>;

bool is_unit(std::string_view s) {
    for (const char* u : {"B", "KB", "MB", "GB", "TB", "KiB", "MiB", "GiB", "TiB"})
        if (s == u) return true;
    return false;
}

std::string name_hint(const std::string& name, const Scope& scope) {
    // `16GiB`: a number glued to a unit lexes as one name.
    size_t digits = 0;
    while (digits < name.size() && std::isdigit(static_cast<unsigned char>(name[digits]))) ++digits;
    if (digits > 0 && digits < name.size()) {
        std::string rest = name.substr(digits);
        if (is_unit(rest))
            return "write `" + name.substr(0, digits) + " " + rest + "`, with a space";
        return "a name cannot start with a digit here";
    }
    std::string best = closest_name(name, scope.names());
    if (!best.empty()) return "did you mean `" + best + "`?";
    return {};
}

Opt real_result(double v, const Expr& e, Diagnostics& diags) {
    if (!std::isfinite(v)) {
        diags.error(e.loc, "arithmetic overflow in `" + e.text + "`");
        return std::nullopt;
    }
    return Value::real(v);
}

Opt binary(const Expr& e, const Value& a, const Value& b, Diagnostics& diags) {
    const std::string& op = e.text;
    if (!a.is_number() || !b.is_number()) {
        const Value& bad = a.is_number() ? b : a;
        diags.error(e.loc, "`" + op + "` needs numbers, got " + bad.type_name());
        return std::nullopt;
    }
    bool ints = a.type == Value::Type::integer && b.type == Value::Type::integer;
    if (ints) {
        int64_t x = a.i, y = b.i, r = 0;
        if (op == "+" || op == "-" || op == "*") {
            bool overflow = op == "+"   ? __builtin_add_overflow(x, y, &r)
                            : op == "-" ? __builtin_sub_overflow(x, y, &r)
                                        : __builtin_mul_overflow(x, y, &r);
            if (overflow) {
                diags.error(e.loc, "integer overflow in `" + op + "`",
                            "the result does not fit in 64 bits");
                return std::nullopt;
            }
            return Value::integer(r);
        }
        if (op == "/" || op == "//" || op == "%") {
            if (y == 0) {
                diags.error(e.loc, "division by zero");
                return std::nullopt;
            }
            if (x == std::numeric_limits<int64_t>::min() && y == -1) {
                diags.error(e.loc, "integer overflow in `" + op + "`");
                return std::nullopt;
            }
            int64_t q = x / y, m = x % y;
            if (op == "/") {
                if (m != 0) {
                    diags.error(e.loc,
                                std::to_string(x) + " / " + std::to_string(y) +
                                    " does not divide evenly",
                                "use `//` for floor division, or a real such as " +
                                    std::to_string(x) + ".0 for a fraction");
                    return std::nullopt;
                }
                return Value::integer(q);
            }
            if (m != 0 && ((m < 0) != (y < 0))) {
                q -= 1;
                m += y;
            }
            return Value::integer(op == "//" ? q : m);
        }
        if (op == "**") {
            if (y < 0)
                return real_result(std::pow(static_cast<double>(x), static_cast<double>(y)), e,
                                   diags);
            int64_t result = 1, base = x;
            for (int64_t k = y; k > 0; k >>= 1) {
                if ((k & 1) && __builtin_mul_overflow(result, base, &result)) {
                    diags.error(e.loc, "integer overflow in `**`",
                                "the result does not fit in 64 bits");
                    return std::nullopt;
                }
                if (k > 1 && __builtin_mul_overflow(base, base, &base)) {
                    diags.error(e.loc, "integer overflow in `**`",
                                "the result does not fit in 64 bits");
                    return std::nullopt;
                }
            }
            return Value::integer(result);
        }
    }
    double x = a.as_real(), y = b.as_real();
    if (op == "+") return real_result(x + y, e, diags);
    if (op == "-") return real_result(x - y, e, diags);
    if (op == "*") return real_result(x * y, e, diags);
    if (op == "/" || op == "//") {
        if (y == 0.0) {
            diags.error(e.loc, "division by zero");
            return std::nullopt;
        }
        return real_result(op == "/" ? x / y : std::floor(x / y), e, diags);
    }
    if (op == "%") {
        diags.error(e.loc, "`%` needs integers");
        return std::nullopt;
    }
    if (op == "**") {
        if (x < 0 && std::floor(y) != y) {
            diags.error(e.loc, "negative number to a fractional power");
            return std::nullopt;
        }
        return real_result(std::pow(x, y), e, diags);
    }
    diags.error(e.loc, "unknown operator `" + op + "`");
    return std::nullopt;
}

Opt call(const Expr& e, const Scope& scope, Diagnostics& diags) {
    static const std::vector<std::string> functions = {"min", "max", "round_up", "ceil_div"};
    bool known = false;
    for (const auto& f : functions) known |= f == e.text;
    if (!known) {
        std::string best = closest_name(e.text, functions);
        diags.error(e.loc, "`" + e.text + "` is not a function that can be used here",
                    best.empty() ? "the functions are `min`, `max`, `round_up` and `ceil_div`"
                                 : "did you mean `" + best + "`?");
        return std::nullopt;
    }
    std::vector<Value> args;
    bool ok = true;
    for (const auto& a : e.args) {
        if (!a.name.empty()) {
            diags.error(a.name_loc, "`" + e.text + "` takes positional arguments only");
            ok = false;
            continue;
        }
        Opt v = evaluate(*a.value, scope, diags);
        if (!v) {
            ok = false;
            continue;
        }
        if (!v->is_number()) {
            diags.error(a.value->loc, "`" + e.text + "` needs numbers, got " + v->type_name());
            ok = false;
            continue;
        }
        args.push_back(*v);
    }
    if (!ok) return std::nullopt;
    if (e.text == "min" || e.text == "max") {
        if (args.empty()) {
            diags.error(e.loc, "`" + e.text + "` needs at least one argument");
            return std::nullopt;
        }
        Value best = args[0];
        for (const auto& v : args) {
            bool less = v.as_real() < best.as_real();
            if (e.text == "min" ? less : (!less && v.as_real() != best.as_real())) best = v;
        }
        return best;
    }
    // round_up(x, m) and ceil_div(x, m): positive integers.
    if (args.size() != 2 || args[0].type != Value::Type::integer ||
        args[1].type != Value::Type::integer) {
        diags.error(e.loc, "`" + e.text + "` takes two integers");
        return std::nullopt;
    }
    int64_t x = args[0].i, m = args[1].i;
    if (m <= 0) {
        diags.error(e.args[1].value->loc, "`" + e.text + "` needs a positive divisor");
        return std::nullopt;
    }
    int64_t q = x / m + ((x % m != 0 && x > 0) ? 1 : 0);
    if (e.text == "ceil_div") return Value::integer(q);
    int64_t r = 0;
    if (__builtin_mul_overflow(q, m, &r)) {
        diags.error(e.loc, "integer overflow in `round_up`");
        return std::nullopt;
    }
    return Value::integer(r);
}

} // namespace

std::optional<Value> evaluate(const Expr& e, const Scope& scope, Diagnostics& diags) {
    switch (e.kind) {
    case ExprKind::integer:
    case ExprKind::real: {
        if (e.unit.empty()) {
            return e.kind == ExprKind::integer ? Value::integer(e.int_value)
                                               : Value::real(e.real_value);
        }
        int64_t scale = unit_bytes(e.unit);
        if (e.kind == ExprKind::integer) {
            int64_t r = 0;
            if (__builtin_mul_overflow(e.int_value, scale, &r)) {
                diags.error(e.loc, "`" + e.text + " " + e.unit + "` is too large");
                return std::nullopt;
            }
            return Value::integer(r);
        }
        double bytes = e.real_value * static_cast<double>(scale);
        if (bytes != std::floor(bytes) || bytes > 9.2e18) {
            diags.error(e.loc, "`" + e.text + " " + e.unit + "` is not a whole number of bytes");
            return std::nullopt;
        }
        return Value::integer(static_cast<int64_t>(bytes));
    }
    case ExprKind::string: return Value::string(e.text);
    case ExprKind::boolean: return Value::boolean(e.bool_value);
    case ExprKind::name: {
        if (const Value* v = scope.find(e.text)) return *v;
        diags.error(e.loc, "unknown name `" + e.text + "`", name_hint(e.text, scope));
        return std::nullopt;
    }
    case ExprKind::unary: {
        Opt v = evaluate(*e.items[0], scope, diags);
        if (!v) return std::nullopt;
        if (!v->is_number()) {
            diags.error(e.loc, "`" + e.text + "` needs a number, got " + v->type_name());
            return std::nullopt;
        }
        if (e.text == "+") return v;
        if (v->type == Value::Type::real) return Value::real(-v->r);
        if (v->i == std::numeric_limits<int64_t>::min()) {
            diags.error(e.loc, "integer overflow in `-`");
            return std::nullopt;
        }
        return Value::integer(-v->i);
    }
    case ExprKind::binary: {
        Opt a = evaluate(*e.items[0], scope, diags);
        Opt b = evaluate(*e.items[1], scope, diags);
        if (!a || !b) return std::nullopt;
        return binary(e, *a, *b, diags);
    }
    case ExprKind::call: return call(e, scope, diags);
    case ExprKind::tuple:
    case ExprKind::list: {
        Value t;
        t.type = Value::Type::tuple;
        bool ok = true;
        for (const auto& item : e.items) {
            Opt v = evaluate(*item, scope, diags);
            if (v)
                t.items.push_back(*v);
            else
                ok = false;
        }
        if (!ok) return std::nullopt;
        return t;
    }
    }
    return std::nullopt;
}

} // namespace dist::lang
