// parse_test.cpp: the parser adapter: the AST it builds, and its refusal of hostile input
// (NUL bytes, invalid UTF-8, deep nesting, huge lines) with a located error and no crash.
#include "lang/format.hpp"
#include "lang/parse.hpp"

#include <gtest/gtest.h>

using namespace dist::lang;

namespace {

struct Parsed {
    SourceManager sources;
    Diagnostics diags;
    std::unique_ptr<Script> script;
    std::string report() const { return diags.render(sources); }
};

std::unique_ptr<Parsed> parse(const std::string& text) {
    auto p = std::make_unique<Parsed>();
    uint32_t id = p->sources.add("t.dist", text);
    p->script = parse_script(p->sources, id, p->diags);
    return p;
}

} // namespace

TEST(Parse, BuildsTheTree) {
    auto p = parse("import \"std/gpt.dist\"\n"
                   "let w = 2 * 64\n"
                   "model = gpt(vocab: 256, context: 64, layers: 2, heads: 2, width: w)\n"
                   "mesh { devices: h200 x 8  tp: 2 }\n"
                   "schedule { kind: 1f1b  actions { rank 0: 0F0 0B0 } }\n");
    ASSERT_TRUE(p->script) << p->report();
    EXPECT_EQ(dump(*p->script),
              "(import \"std/gpt.dist\")\n"
              "(let w (* 2 64))\n"
              "(model (call gpt vocab:256 context:64 layers:2 heads:2 width:w))\n"
              "(block mesh\n  (field devices h200 x 8)\n  (field tp 2)\n)\n"
              "(block schedule\n  (field kind 1f1b)\n  (block actions\n    (rank 0 0F0 0B0)\n"
              "  )\n)\n");
}

TEST(Parse, TemplatesWithLabelsRepeatResidualAndShard) {
    auto p = parse("model m(a, b = a * 2) {\n"
                   "  let c = a + b\n"
                   "  e: embedding(a, c) shard vocab\n"
                   "  h: repeat 3 { residual { n: layer_norm(c) } }\n"
                   "}\n");
    ASSERT_TRUE(p->script) << p->report();
    EXPECT_EQ(dump(*p->script), "(template m (a b=(* a 2))\n"
                                "  (let c (+ a b))\n"
                                "  (layer e (call embedding a c) shard vocab)\n"
                                "  (repeat h 3\n"
                                "    (residual _\n"
                                "      (layer n (call layer_norm c))\n"
                                "    )\n"
                                "  )\n"
                                ")\n");
}

TEST(Parse, LocationsPointAtTokens) {
    auto p = parse("mesh {\n    dp: 2\n}\n");
    ASSERT_TRUE(p->script);
    const Field& f = p->script->statements[0].block->items[0].field;
    EXPECT_EQ(f.loc.line, 2u);
    EXPECT_EQ(f.loc.col, 5u);
    EXPECT_EQ(f.loc.length, 2u);
    EXPECT_EQ(f.value->loc.col, 9u);
}

TEST(Parse, CommentsAreKeptWithTheirPlaces) {
    auto p = parse("# top\nmesh {  # after brace\n    dp: 2  # trailing\n}\n");
    ASSERT_TRUE(p->script);
    ASSERT_EQ(p->script->comments.size(), 3u);
    EXPECT_TRUE(p->script->comments[0].own_line);
    EXPECT_FALSE(p->script->comments[1].own_line);
    EXPECT_EQ(p->script->comments[2].text, "# trailing");
}

TEST(Parse, SyntaxErrorsAreLocatedAndAllReported) {
    auto p = parse("mesh {\n    dp 2\n}\ntrain {\n    batch: \n}\n");
    EXPECT_FALSE(p->script);
    std::string r = p->report();
    EXPECT_NE(r.find("t.dist:2:8: error:"), std::string::npos) << r;
    EXPECT_NE(r.find("t.dist:6:1: error:"), std::string::npos) << r;
    EXPECT_NE(r.find("    ^"), std::string::npos) << r;
}

TEST(Parse, EmptyAndCommentOnlyFilesParse) {
    EXPECT_TRUE(parse("")->script);
    EXPECT_TRUE(parse("# nothing here\n")->script);
}

TEST(Parse, RefusesNulBytes) {
    auto p = parse(std::string("mesh {\n  dp: 1\0\n}", 16));
    EXPECT_FALSE(p->script);
    EXPECT_NE(p->report().find("t.dist:2:8: error: NUL byte"), std::string::npos) << p->report();
}

TEST(Parse, RefusesInvalidUtf8) {
    for (std::string bad :
         {"\xff", "\xc0\xaf", "\xe0\x80\x80", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xc3"}) {
        auto p = parse("let a = 1 # " + bad + "\n");
        EXPECT_FALSE(p->script);
        EXPECT_NE(p->report().find("t.dist:1:13: error: invalid UTF-8"), std::string::npos)
            << p->report();
    }
    EXPECT_TRUE(parse("let a = 1 # caf\xc3\xa9 \xe2\x82\xac\n")->script);
}

TEST(Parse, RefusesDeepNestingBeforeTheParserRecurses) {
    std::string deep = "let a = " + std::string(20000, '(') + "1" + std::string(20000, ')');
    auto p = parse(deep);
    EXPECT_FALSE(p->script);
    EXPECT_NE(p->report().find("nesting deeper than 64 levels"), std::string::npos);
    std::string braces = std::string(50000, '{');
    EXPECT_FALSE(parse(braces)->script);
}

TEST(Parse, RefusesOperatorChainsThatWouldMakeDeepTrees) {
    std::string chain = "let a = 1";
    for (int i = 0; i < 100000; ++i) chain += "+1";
    auto p = parse(chain);
    EXPECT_FALSE(p->script);
    EXPECT_NE(p->report().find("more than 256 operators"), std::string::npos);
    std::string unary = "let a = " + std::string(100000, '-') + "1";
    EXPECT_FALSE(parse(unary)->script);
}

TEST(Parse, HandlesHugeLines) {
    // 200 KB of fields on one line parse; 200 KB of junk is refused with a short report.
    std::string fields = "mesh {";
    while (fields.size() < 200000) fields += " dp: 1";
    fields += " }";
    auto ok = parse(fields);
    EXPECT_TRUE(ok->script);
    auto junk = parse(std::string(200000, '$'));
    EXPECT_FALSE(junk->script);
    std::string r = junk->report();
    EXPECT_LT(r.size(), 20000u);
    EXPECT_NE(r.find("too many errors"), std::string::npos);
    EXPECT_NE(r.find("..."), std::string::npos); // the shown line is cut around the caret
}

TEST(Parse, HugeTokensDoNotMakeHugeMessages) {
    auto p = parse("let a = " + std::string(200000, '9') + "\n");
    EXPECT_FALSE(p->script);
    ASSERT_EQ(p->diags.all().size(), 1u);
    EXPECT_LT(p->diags.all()[0].message.size(), 200u) << p->diags.all()[0].message;
    EXPECT_LT(p->report().size(), 1000u);
}

TEST(Parse, StringsAndEscapes) {
    auto p = parse("let s = \"a\\tb\\\"c\\\\\"\n");
    ASSERT_TRUE(p->script) << p->report();
    EXPECT_EQ(p->script->statements[0].value->text, "a\tb\"c\\");
    auto bad = parse("let s = \"a\\qb\"\n");
    EXPECT_FALSE(bad->script);
    EXPECT_NE(bad->report().find("unknown escape `\\q`"), std::string::npos);
    auto open = parse("let s = \"abc\n");
    EXPECT_FALSE(open->script);
    EXPECT_NE(open->report().find("t.dist:1:9: error: unterminated string"), std::string::npos);
}

TEST(Parse, UnknownCharactersAreNamed) {
    auto p = parse("mesh { dp: 2 $ }\n");
    EXPECT_FALSE(p->script);
    EXPECT_NE(p->report().find("t.dist:1:14: error: unexpected character `$`"), std::string::npos);
    auto ctl = parse("mesh { \x01 }\n");
    EXPECT_NE(ctl->report().find("U+0001"), std::string::npos);
}

TEST(Format, IsIdempotentAndKeepsComments) {
    std::string messy = "# head\nimport   \"std/gpt.dist\"\n\n\n\nmesh{dp:2,tp : 1 # t\n"
                        "# inside\n}\nlet x=(1+2)*3 # x\n";
    auto p = parse(messy);
    ASSERT_TRUE(p->script) << p->report();
    std::string once = format_script(*p->script);
    EXPECT_EQ(once, "# head\nimport \"std/gpt.dist\"\n\nmesh {\n    dp: 2\n    tp: 1  # t\n"
                    "    # inside\n}\nlet x = (1 + 2) * 3  # x\n");
    auto q = parse(once);
    ASSERT_TRUE(q->script);
    EXPECT_EQ(format_script(*q->script), once);
    EXPECT_EQ(dump(*q->script), dump(*p->script));
}

TEST(Format, ParenthesesOnlyWhereNeeded) {
    auto p = parse("let a = (1 - (2 - 3)) * -(4 + 5) ** 2 ** (1 + 1)\nlet b = (-2) ** 2\n"
                   "let c = - -1\n");
    ASSERT_TRUE(p->script) << p->report();
    std::string f = format_script(*p->script);
    EXPECT_EQ(f, "let a = (1 - (2 - 3)) * -(4 + 5) ** 2 ** (1 + 1)\nlet b = (-2) ** 2\n"
                 "let c = - -1\n");
    auto q = parse(f);
    ASSERT_TRUE(q->script);
    EXPECT_EQ(dump(*q->script), dump(*p->script));
}
