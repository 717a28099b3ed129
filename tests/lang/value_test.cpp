// value_test.cpp: the evaluator's arithmetic, units, names and error reporting.
#include "lang/parse.hpp"
#include "lang/value.hpp"

#include <gtest/gtest.h>

using namespace dist::lang;

namespace {

struct Eval {
    SourceManager sources;
    Diagnostics diags;
    std::optional<Value> result;
};

// Evaluates `text` as a --set value (so the whole expression grammar is in play).
Eval eval(const std::string& text, const Scope* scope = nullptr) {
    Eval e;
    uint32_t id = e.sources.add("expr", "k=" + text);
    ExprPtr count;
    ExprPtr expr = parse_set_value(e.sources, id, 2, e.diags, count);
    if (!expr) return e;
    Scope empty;
    e.result = evaluate(*expr, scope ? *scope : empty, e.diags);
    return e;
}

int64_t as_int(const std::string& text) {
    Eval e = eval(text);
    EXPECT_TRUE(e.result) << text << ": " << e.diags.render(e.sources);
    if (!e.result) return 0;
    EXPECT_EQ(e.result->type, Value::Type::integer) << text;
    return e.result->i;
}

std::string error_of(const std::string& text) {
    Eval e = eval(text);
    EXPECT_FALSE(e.result) << text << " evaluated to " << e.result->str();
    return e.diags.all().empty() ? "" : e.diags.all().front().message;
}

} // namespace

TEST(Value, IntegerArithmeticFollowsPrecedence) {
    EXPECT_EQ(as_int("1 + 2 * 3"), 7);
    EXPECT_EQ(as_int("(1 + 2) * 3"), 9);
    EXPECT_EQ(as_int("2 ** 3 ** 2"), 512); // right-associative
    EXPECT_EQ(as_int("-2 ** 2"), -4);      // unary minus binds looser than **
    EXPECT_EQ(as_int("10 - 3 - 2"), 5);    // left-associative
    EXPECT_EQ(as_int("1_000_000"), 1000000);
}

TEST(Value, DivisionIsExactOrFloor) {
    EXPECT_EQ(as_int("768 / 12"), 64);
    EXPECT_EQ(as_int("7 // 2"), 3);
    EXPECT_EQ(as_int("-7 // 2"), -4); // floor, as in Python
    EXPECT_EQ(as_int("-7 % 3"), 2);
    EXPECT_EQ(as_int("7 % -3"), -2);
    EXPECT_NE(error_of("10 / 3").find("does not divide evenly"), std::string::npos);
    EXPECT_EQ(error_of("1 / 0"), "division by zero");
    EXPECT_EQ(error_of("1 % 0"), "division by zero");
    EXPECT_EQ(error_of("1.0 / 0"), "division by zero");
}

TEST(Value, OverflowIsAnErrorNotAWrap) {
    EXPECT_EQ(as_int("9223372036854775807"), INT64_MAX);
    EXPECT_NE(error_of("9223372036854775807 + 1").find("overflow"), std::string::npos);
    EXPECT_NE(error_of("4294967296 * 4294967296").find("overflow"), std::string::npos);
    EXPECT_NE(error_of("2 ** 63").find("overflow"), std::string::npos);
    EXPECT_EQ(as_int("2 ** 62"), int64_t{1} << 62);
    EXPECT_NE(error_of("99999999999999999999").find("too large"), std::string::npos);
    EXPECT_NE(error_of("1e308 * 10.0").find("overflow"), std::string::npos);
}

TEST(Value, UnitsScaleToBytes) {
    EXPECT_EQ(as_int("16 GiB"), int64_t{16} << 30);
    EXPECT_EQ(as_int("80 GB"), 80000000000);
    EXPECT_EQ(as_int("1.5 KiB"), 1536);
    EXPECT_NE(error_of("1.3 B").find("whole number of bytes"), std::string::npos);
    EXPECT_NE(error_of("9000000000 GiB").find("too large"), std::string::npos);
}

TEST(Value, RealsAndMixedArithmetic) {
    Eval e = eval("3e-4 * 2");
    ASSERT_TRUE(e.result);
    EXPECT_EQ(e.result->type, Value::Type::real);
    EXPECT_DOUBLE_EQ(e.result->r, 6e-4);
    EXPECT_EQ(Value::real(0.1).str(), "0.1");
    EXPECT_EQ(Value::real(1e-5).str(), "1e-05");
    EXPECT_EQ(Value::real(3.0).str(), "3.0");
}

TEST(Value, FunctionsAndTuples) {
    EXPECT_EQ(as_int("min(4, 2, 8)"), 2);
    EXPECT_EQ(as_int("max(4, 2, 8)"), 8);
    EXPECT_EQ(as_int("round_up(50257, 128)"), 50304);
    EXPECT_EQ(as_int("ceil_div(10, 4)"), 3);
    Eval t = eval("(0.9, 0.95)");
    ASSERT_TRUE(t.result);
    EXPECT_EQ(t.result->type, Value::Type::tuple);
    EXPECT_EQ(t.result->items.size(), 2u);
    EXPECT_NE(error_of("foo(1)").find("not a function"), std::string::npos);
}

TEST(Value, TypeErrorsNameTheTypes) {
    EXPECT_EQ(error_of("\"a\" + 1"), "`+` needs numbers, got a string");
    EXPECT_EQ(error_of("-true"), "`-` needs a number, got a boolean");
    EXPECT_EQ(error_of("5.0 % 2"), "`%` needs integers");
}

TEST(Value, UnknownNamesSuggestTheClosest) {
    Scope scope;
    scope.set("width", Value::integer(128), {});
    scope.set("heads", Value::integer(4), {});
    Eval e = eval("widht / heads", &scope);
    EXPECT_FALSE(e.result);
    ASSERT_EQ(e.diags.all().size(), 1u);
    EXPECT_EQ(e.diags.all()[0].message, "unknown name `widht`");
    EXPECT_EQ(e.diags.all()[0].hint, "did you mean `width`?");
    Eval g = eval("16GiB");
    ASSERT_FALSE(g.diags.all().empty());
    EXPECT_EQ(g.diags.all()[0].hint, "write `16 GiB`, with a space");
}

TEST(Diagnostics, ClosestNameHandlesSwapsAndRefusesFarOnes) {
    EXPECT_EQ(closest_name("gtp", {"gpt", "llama"}), "gpt");
    EXPECT_EQ(closest_name("dpp", {"dp", "tp", "pp"}), "dp");
    EXPECT_EQ(closest_name("zzzzzz", {"dp", "tp"}), "");
}
