// generate_test.cpp: generation on a mesh against one device.
#include "actors/plan/lower.hpp"
#include "actors/runtime/generate.hpp"
#include "lang/check.hpp"
#include "models/trainer.hpp"

#include <gtest/gtest.h>

#include <filesystem>

using namespace dist;

namespace {

const char* script = R"(import "std/llama.dist"
model = llama(vocab: 32, context: 24, layers: 4, heads: 4, kv_heads: 2, width: 16, hidden: 24)
mesh {
    devices: cpu
}
train {
    data: synthetic()
    batch: 4
    steps: 1
}
)";

struct Planned {
    Program program;
    plan::Graph graph;
};

Planned planned(const std::string& text, const std::vector<std::string>& overrides) {
    lang::FrontendOptions o;
    o.search_roots = {std::filesystem::path(DIST_SOURCE_DIR) / "stdlib"};
    o.overrides = overrides;
    lang::CheckResult r = lang::check_text("g.dist", text, o);
    EXPECT_TRUE(r.ok()) << r.report();
    plan::PlanResult p = plan::lower(*r.program);
    EXPECT_TRUE(p.ok()) << plan::render_errors("g.dist", p.errors);
    return {*r.program, *p.graph};
}

GenerateSpec greedy(int64_t n) {
    GenerateSpec g;
    g.temperature = 0.0;
    g.max_tokens = n;
    return g;
}

} // namespace

TEST(Generate, GreedyTextIsTheSameOnOneDeviceAndOnPp2Tp2) {
    Planned one = planned(script, {});
    Planned mesh = planned(script, {"mesh.pp=2", "mesh.tp=2"});
    models::Model whole(one.program.model, 21);
    std::vector<std::vector<int32_t>> prompts{{3, 1, 4, 1, 5}, {9, 2, 6}};
    runtime::Generator a(one.program, one.graph, whole);
    runtime::Generator b(mesh.program, mesh.graph, whole);
    auto x = a.generate(prompts, greedy(12), 1);
    auto y = b.generate(prompts, greedy(12), 1);
    ASSERT_EQ(x.size(), 2u);
    EXPECT_EQ(x[0].size(), 12u);
    EXPECT_EQ(x, y);
    // And both equal sampling by recomputing the whole prefix at every token (no cache).
    for (size_t i = 0; i < prompts.size(); ++i) {
        std::vector<int32_t> tokens = prompts[i];
        models::sample(whole, greedy(12), 1, tokens);
        EXPECT_EQ(std::vector<int32_t>(tokens.begin() + static_cast<long>(prompts[i].size()),
                                       tokens.end()),
                  x[i])
            << "prompt " << i;
    }
}

TEST(Generate, BatchedPromptsContinueAsIfAlone) {
    Planned one = planned(script, {"mesh.tp=2"});
    models::Model whole(one.program.model, 4);
    runtime::Generator g(one.program, one.graph, whole);
    GenerateSpec gen;
    gen.temperature = 0.9;
    gen.top_k = 8;
    gen.max_tokens = 6;
    std::vector<std::vector<int32_t>> prompts{{1, 2, 3, 4, 5, 6}, {7}, {8, 9}};
    std::vector<size_t> streamed(3);
    auto together = g.generate(prompts, gen, 77, [&](size_t row, int32_t) { ++streamed[row]; });
    EXPECT_EQ(streamed, (std::vector<size_t>{6, 6, 6}));
    for (size_t i = 0; i < prompts.size(); ++i) {
        // Alone, the row is row 0: draw with the same row index by batching it in its place.
        std::vector<std::vector<int32_t>> alone(i + 1, std::vector<int32_t>{0});
        alone[i] = prompts[i];
        EXPECT_EQ(g.generate(alone, gen, 77)[i], together[i]) << "prompt " << i;
    }
}

TEST(Generate, RefusesPromptsItCannotContinue) {
    Planned one = planned(script, {});
    models::Model whole(one.program.model, 4);
    runtime::Generator g(one.program, one.graph, whole);
    EXPECT_THROW(g.generate({std::vector<int32_t>(25, 1)}, greedy(2), 1), std::invalid_argument);
    EXPECT_THROW(g.generate({{1, 32}}, greedy(2), 1), std::invalid_argument);
    EXPECT_THROW(g.generate({{}}, greedy(2), 1), std::invalid_argument);
    // The context ends generation: 24 positions, a prompt of 20, at most 5 new tokens.
    EXPECT_EQ(g.generate({std::vector<int32_t>(20, 1)}, greedy(50), 1)[0].size(), 5u);
}
