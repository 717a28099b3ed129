// value.hpp: evaluated values and the expression evaluator of the checker.
//
// Arithmetic is exact on 64-bit integers (overflow, division by zero and inexact `/` are located
// errors) and IEEE double on reals; names resolve through a chain of scopes (template arguments
// and `let`s, then the script's global `let`s).
#pragma once

#include "lang/ast.hpp"
#include "lang/diagnostics.hpp"

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace dist::lang {

/// A checked value: what a `.dist` expression evaluates to.
struct Value {
    enum class Type { integer, real, boolean, string, symbol, tuple };
    Type type = Type::integer;
    int64_t i = 0;
    double r = 0.0;
    bool b = false;
    std::string s; // string contents or symbol name
    std::vector<Value> items;

    static Value integer(int64_t v) { return {Type::integer, v, 0.0, false, {}, {}}; }
    static Value real(double v) { return {Type::real, 0, v, false, {}, {}}; }
    static Value boolean(bool v) { return {Type::boolean, 0, 0.0, v, {}, {}}; }
    static Value string(std::string v) { return {Type::string, 0, 0.0, false, std::move(v), {}}; }
    static Value symbol(std::string v) { return {Type::symbol, 0, 0.0, false, std::move(v), {}}; }

    bool is_number() const { return type == Type::integer || type == Type::real; }
    double as_real() const { return type == Type::integer ? static_cast<double>(i) : r; }
    /// "an integer", "a string", ... for messages.
    std::string type_name() const;
    /// The value as the language would write it.
    std::string str() const;

    bool operator==(const Value&) const = default;
};

/// Names visible at one point: a chain of maps.
class Scope {
  public:
    explicit Scope(const Scope* parent = nullptr) : parent_(parent) {}
    void set(const std::string& name, Value v, SourceLoc loc) { vars_[name] = {std::move(v), loc}; }
    const Value* find(const std::string& name) const;
    /// Where `name` was defined in this scope (not its parents), or null.
    const SourceLoc* defined_here(const std::string& name) const;
    std::vector<std::string> names() const;

  private:
    struct Entry {
        Value value;
        SourceLoc loc;
    };
    const Scope* parent_;
    std::map<std::string, Entry> vars_;
};

/// Evaluates an expression; returns nullopt after reporting any error.
std::optional<Value> evaluate(const Expr& e, const Scope& scope, Diagnostics& diags);

/// Bytes in one unit (`GiB` = 2^30), or 0 for an unknown unit.
int64_t unit_bytes(const std::string& unit);

} // namespace dist::lang
