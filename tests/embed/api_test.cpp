// api_test.cpp: the embedding API (include/dist/) as an application sees it, linked against
// the shared library: errors come back as values, overrides are checked when set, the
// simulator's figures are filled in, and training calls back after every step and stops when
// the callback says so; the trained weights then evaluate, generate and resume.
#include "dist/dist.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <unistd.h>

namespace fs = std::filesystem;

namespace {

const char* tiny_script = R"(import "std/gpt.dist"
model = gpt(vocab: 256, context: 8, layers: 2, heads: 2, width: 16)
mesh {
    devices: cpu
}
train {
    data: synthetic()
    batch: 4
    steps: 10
    seed: 5
    optimizer {
        lr: 1e-2
    }
}
generate {
    temperature: 0
    max_tokens: 6
}
)";

// A fresh folder under the system's temporary folder, removed at the end of the test.
class TempDir {
  public:
    TempDir() {
        path_ = fs::temp_directory_path() /
                ("dist_api_test_" + std::to_string(::getpid()) + "_" + std::to_string(next_++));
        fs::remove_all(path_);
        fs::create_directories(path_);
    }
    ~TempDir() {
        std::error_code ec;
        fs::remove_all(path_, ec);
    }
    const fs::path& path() const { return path_; }

  private:
    static inline int next_ = 0;
    fs::path path_;
};

dist::Options source_stdlib() {
    dist::Options o;
    o.stdlib_dir = std::string(DIST_SOURCE_DIR) + "/stdlib";
    return o;
}

dist::Script tiny(const TempDir& dir) {
    auto s =
        dist::Script::from_text((dir.path() / "tiny.dist").string(), tiny_script, source_stdlib());
    EXPECT_TRUE(s.ok()) << s.error();
    return std::move(s).value();
}

TEST(EmbedApi, VersionAndDefaultRoots) {
    EXPECT_FALSE(dist::version().empty());
    // The build tree's stdlib is among the default roots of an uninstalled library.
    bool found = false;
    for (const auto& r : dist::default_search_roots())
        if (fs::exists(fs::path(r) / "std" / "gpt.dist")) found = true;
    EXPECT_TRUE(found);
    EXPECT_TRUE(fs::exists(fs::path(dist::find_stdlib()) / "std" / "gpt.dist"));
}

TEST(EmbedApi, AnExplicitStdlibReplacesTheDefaults) {
    EXPECT_EQ(dist::find_stdlib(source_stdlib()), std::string(DIST_SOURCE_DIR) + "/stdlib");
    dist::Options nowhere;
    nowhere.stdlib_dir = "/nonexistent/stdlib";
    EXPECT_EQ(dist::find_stdlib(nowhere), "");
    auto s = dist::Script::from_text("t.dist", tiny_script, nowhere);
    ASSERT_TRUE(s.ok()) << s.error();
    dist::CheckReport r = s->check();
    EXPECT_FALSE(r.ok);
    EXPECT_NE(r.text.find("std/gpt.dist"), std::string::npos) << r.text;
}

TEST(EmbedApi, MissingFileIsAnError) {
    auto s = dist::Script::load("/nonexistent/script.dist");
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.error().find("cannot read"), std::string::npos) << s.error();
    EXPECT_THROW(s.value(), std::logic_error);
}

TEST(EmbedApi, CheckErrorsAreValues) {
    std::string text = tiny_script;
    text.replace(text.find("batch: 4"), 8, "bacth: 4");
    auto s = dist::Script::from_text("bad.dist", text, source_stdlib());
    ASSERT_TRUE(s.ok()) << s.error();
    dist::CheckReport r = s->check();
    EXPECT_FALSE(r.ok);
    ASSERT_FALSE(r.diagnostics.empty());
    const dist::Diagnostic& d = r.diagnostics.front();
    EXPECT_EQ(d.file, "bad.dist");
    EXPECT_EQ(d.line, 8);
    EXPECT_GT(d.column, 0);
    EXPECT_NE(d.message.find("bacth"), std::string::npos) << d.message;
    EXPECT_NE(d.hint.find("batch"), std::string::npos) << d.hint;
    EXPECT_NE(r.text.find("bad.dist:8:"), std::string::npos) << r.text;
    // Every later phase refuses the script with the same report.
    auto planned = s->plan();
    EXPECT_FALSE(planned.ok());
    EXPECT_NE(planned.error().find("bad.dist:8:"), std::string::npos);
    EXPECT_FALSE(s->train().ok());
}

TEST(EmbedApi, SetChecksTheOverride) {
    TempDir dir;
    dist::Script s = tiny(dir);
    EXPECT_TRUE(s.check().ok) << s.check().text;

    dist::Status bad_key = s.set("mesh.tq", "2");
    EXPECT_FALSE(bad_key.ok());
    EXPECT_NE(bad_key.message().find("--set"), std::string::npos) << bad_key.message();
    EXPECT_FALSE(s.set("train.steps", "\"many\"").ok());
    EXPECT_FALSE(s.set("", "1").ok());
    EXPECT_TRUE(s.overrides().empty());

    EXPECT_TRUE(s.set("train.steps", "3").ok());
    EXPECT_TRUE(s.set("train.steps", "4").ok());
    ASSERT_EQ(s.overrides().size(), 1u);
    EXPECT_EQ(s.overrides()[0], "train.steps=4");
    s.clear_overrides();
    EXPECT_TRUE(s.overrides().empty());
}

TEST(EmbedApi, PlanAndSimulateFigures) {
    auto s = dist::Script::load(std::string(DIST_SOURCE_DIR) + "/examples/gpt_tiny.dist",
                                source_stdlib());
    ASSERT_TRUE(s.ok()) << s.error();
    ASSERT_TRUE(s->set("mesh.pp", "2").ok());
    auto plan = s->plan();
    ASSERT_TRUE(plan.ok()) << plan.error();
    EXPECT_EQ(plan->pp, 2);
    ASSERT_EQ(plan->ranks.size(), 2u);
    EXPECT_FALSE(plan->ranks[1].actions.empty());
    EXPECT_EQ(plan->ranks[0].actions.back(), "STEP");
    EXPECT_FALSE(plan->text.empty());

    auto sim = s->simulate();
    ASSERT_TRUE(sim.ok()) << sim.error();
    EXPECT_GT(sim->step_time_s, 0);
    EXPECT_GT(sim->tokens_per_s, 0);
    EXPECT_GT(sim->mfu, 0);
    EXPECT_GT(sim->bubble_fraction, 0); // two stages, two microbatches
    ASSERT_EQ(sim->peak_memory_bytes.size(), 2u);
    EXPECT_GT(sim->peak_memory_bytes[0], 0);
    EXPECT_TRUE(sim->fits);
    EXPECT_FALSE(sim->text.empty());
}

TEST(EmbedApi, TrainStopsWhenTheCallbackSaysSo) {
    TempDir dir;
    dist::Script s = tiny(dir);
    std::vector<dist::StepInfo> seen;
    dist::TrainOptions o;
    o.on_step = [&](const dist::StepInfo& info) {
        seen.push_back(info);
        return info.step < 2;
    };
    auto r = s.train(o);
    ASSERT_TRUE(r.ok()) << r.error();
    ASSERT_EQ(seen.size(), 2u);
    EXPECT_EQ(seen[0].step, 1);
    EXPECT_EQ(seen[1].step, 2);
    for (const auto& info : seen) {
        EXPECT_TRUE(std::isfinite(info.loss));
        EXPECT_GT(info.lr, 0);
        EXPECT_GT(info.grad_norm, 0);
        EXPECT_EQ(info.tokens, 4 * 8);
        EXPECT_GT(info.tokens_per_s, 0);
        EXPECT_GT(info.step_time_s, 0);
    }
    EXPECT_EQ(r->first_step, 1);
    EXPECT_EQ(r->last_step, 2);
    EXPECT_TRUE(r->stopped);
    EXPECT_EQ(r->final_loss, seen[1].loss);
    EXPECT_TRUE(r->checkpoint_dir.empty());

    // The trained weights stay with the Script.
    fs::path text = dir.path() / "eval.txt";
    std::ofstream(text) << std::string(200, 'a');
    auto e = s.evaluate(text.string());
    ASSERT_TRUE(e.ok()) << e.error();
    EXPECT_TRUE(std::isfinite(e->loss));
    EXPECT_GT(e->tokens, 0);
    EXPECT_NEAR(e->perplexity, std::exp(e->loss), 1e-9 * e->perplexity);
    EXPECT_FALSE(s.evaluate((dir.path() / "missing.txt").string()).ok());

    std::string streamed;
    dist::GenerateOptions g;
    g.on_text = [&](size_t row, const std::string& t) {
        EXPECT_EQ(row, 0u);
        streamed += t;
    };
    auto texts = s.generate({"ab"}, g);
    ASSERT_TRUE(texts.ok()) << texts.error();
    ASSERT_EQ(texts->size(), 1u);
    EXPECT_EQ((*texts)[0].size(), 6u);
    EXPECT_EQ((*texts)[0], streamed);
    auto empty_prompt = s.generate({""});
    EXPECT_FALSE(empty_prompt.ok());
}

TEST(EmbedApi, TrainingAGpuMeshWithoutAGpuIsAnErrorThatSaysWhy) {
    TempDir dir;
    dist::Script s = tiny(dir);
    ASSERT_TRUE(s.set("mesh.devices", "h200").ok());
    ASSERT_TRUE(s.set("train.stop_after", "1").ok());
    auto r = s.train();
    if (r.ok()) return; // a machine with a GPU trains on it
    EXPECT_NE(r.error().find("h200-sxm device(s), but this"), std::string::npos) << r.error();
    EXPECT_EQ(r.error().find("internal error"), std::string::npos) << r.error();
}

TEST(EmbedApi, NoWeightsIsAnError) {
    TempDir dir;
    dist::Script s = tiny(dir);
    auto e = s.evaluate("/nonexistent.txt");
    EXPECT_FALSE(e.ok());
    EXPECT_NE(e.error().find("train"), std::string::npos) << e.error();
    EXPECT_FALSE(s.generate({"a"}).ok());
}

TEST(EmbedApi, CheckpointAndResume) {
    TempDir dir;
    dist::Script s = tiny(dir);
    ASSERT_TRUE(s.set("train.stop_after", "2").ok());
    dist::TrainOptions o;
    o.checkpoint_dir = (dir.path() / "ckpt").string();
    auto first = s.train(o);
    ASSERT_TRUE(first.ok()) << first.error();
    EXPECT_EQ(first->checkpoint_dir, o.checkpoint_dir);
    EXPECT_FALSE(first->stopped);

    ASSERT_TRUE(s.set("train.stop_after", "3").ok());
    dist::TrainOptions again;
    again.resume_from = o.checkpoint_dir;
    std::vector<int64_t> steps;
    again.on_step = [&](const dist::StepInfo& info) {
        steps.push_back(info.step);
        return true;
    };
    auto second = s.train(again);
    ASSERT_TRUE(second.ok()) << second.error();
    EXPECT_EQ(second->first_step, 3);
    EXPECT_EQ(steps, std::vector<int64_t>{3});

    // Saved weights serve evaluate and generate in another Script.
    dist::Script other = tiny(dir);
    fs::path text = dir.path() / "eval.txt";
    std::ofstream(text) << std::string(100, 'b');
    EXPECT_TRUE(other.evaluate(text.string(), o.checkpoint_dir).ok());
    dist::GenerateOptions g;
    g.weights = o.checkpoint_dir;
    g.max_tokens = 3;
    auto texts = other.generate({"x", "yz"}, g);
    ASSERT_TRUE(texts.ok()) << texts.error();
    EXPECT_EQ(texts->size(), 2u);
    EXPECT_FALSE(other.evaluate(text.string(), (dir.path() / "nothing").string()).ok());
}

TEST(EmbedApi, ACallbackThatThrowsEndsTheRunWithAnError) {
    TempDir dir;
    dist::Script s = tiny(dir);
    dist::TrainOptions o;
    o.on_step = [](const dist::StepInfo&) -> bool { throw std::runtime_error("boom"); };
    auto r = s.train(o);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().find("boom"), std::string::npos) << r.error();
}

} // namespace
