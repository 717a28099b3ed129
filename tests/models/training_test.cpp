// training_test.cpp: the one-device training loop, checkpoints and evaluation: resuming gives
// the same losses as not stopping, training lowers the loss on real text, and `evaluate` on a
// saved GPT-2 checkpoint agrees with an independent GPT-2 forward pass that reads the file in
// Hugging Face's layout.
#include "lang/check.hpp"
#include "models/checkpoint.hpp"
#include "models/safetensors.hpp"
#include "models/trainer.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace fs = std::filesystem;
using namespace dist;
using namespace dist::models;

namespace {

const char* fortunes = "/usr/share/games/fortunes/fortunes";

Program program_of(const std::string& model, std::vector<std::string> overrides = {}) {
    lang::FrontendOptions o;
    o.search_roots = {fs::path(DIST_SOURCE_DIR) / "stdlib"};
    o.overrides = std::move(overrides);
    std::string text =
        "import \"std/gpt.dist\"\nimport \"std/llama.dist\"\nmodel = " + model +
        "\nmesh {\n devices: cpu\n}\nschedule {\n microbatches: 2\n}\n"
        "train {\n data: text(\"" +
        std::string(fortunes) +
        "\")\n batch: 4\n steps: 12\n seed: 3\n optimizer {\n lr: 3e-3\n }\n"
        " lr_schedule {\n kind: cosine\n warmup: 2\n min_lr: 3e-4\n }\n clip: 1.0\n}\n";
    lang::CheckResult r = lang::check_text("t.dist", text, o);
    EXPECT_TRUE(r.ok()) << r.report();
    return *r.program;
}

const char* tiny = "gpt(vocab: 256, context: 16, layers: 2, heads: 2, width: 16)";

struct TempDir {
    fs::path path = fs::temp_directory_path() / ("dist-train-" + std::to_string(::getpid()) + "-" +
                                                 std::to_string(reinterpret_cast<uintptr_t>(this)));
    TempDir() { fs::create_directories(path); }
    ~TempDir() { fs::remove_all(path); }
};

std::vector<double> run(const Program& p, Model& m, const TokenData& d, int64_t first = 0) {
    std::vector<double> losses;
    std::string e = train(p, m, d, first, [&](const StepMetrics& s) {
        losses.push_back(s.loss);
        return true;
    });
    EXPECT_EQ(e, "");
    return losses;
}

} // namespace

TEST(LearningRate, WarmupThenDecayToTheMinimum) {
    TrainSpec t;
    t.steps = 11;
    t.optimizer.lr = 1.0;
    t.lr_schedule = {LrScheduleKind::cosine, 2, 0.1};
    EXPECT_DOUBLE_EQ(learning_rate(t, 0), 0.5);
    EXPECT_DOUBLE_EQ(learning_rate(t, 1), 1.0);
    EXPECT_DOUBLE_EQ(learning_rate(t, 2), 1.0);
    EXPECT_NEAR(learning_rate(t, 6), 0.55, 1e-12); // halfway: (1 + 0.1) / 2
    EXPECT_DOUBLE_EQ(learning_rate(t, 10), 0.1);
    t.lr_schedule.kind = LrScheduleKind::linear;
    EXPECT_NEAR(learning_rate(t, 6), 0.55, 1e-12);
    t.lr_schedule.kind = LrScheduleKind::constant;
    EXPECT_DOUBLE_EQ(learning_rate(t, 10), 1.0);
}

TEST(Training, LowersTheLossOnText) {
    Program p = program_of(tiny, {"train.steps=40", "train.batch=8"});
    TokenData d;
    ASSERT_EQ(load_data(p.train.data, p.model, d), "");
    Model m(p.model, 3);
    std::vector<double> l = run(p, m, d);
    ASSERT_EQ(l.size(), 40u);
    double first = (l[0] + l[1] + l[2]) / 3, last = (l[37] + l[38] + l[39]) / 3;
    EXPECT_NEAR(first, std::log(256.0), 0.2);
    // Uniform guessing costs ln 256 = 5.55 nats a byte; learning even the byte frequencies of
    // English text brings it under 4.5.
    EXPECT_LT(last, std::log(256.0) - 1.0) << "the loss fell from " << first << " to " << last;
}

TEST(Training, ResumingGivesTheLossesOfAnUninterruptedRun) {
    Program p = program_of(tiny);
    TokenData d;
    ASSERT_EQ(load_data(p.train.data, p.model, d), "");
    Model straight(p.model, 3);
    std::vector<double> all = run(p, straight, d);

    TempDir dir;
    Program first_half = p;
    first_half.train.stop_after = 5;
    Model a(p.model, 3);
    std::vector<double> head = run(first_half, a, d);
    ASSERT_EQ(save_checkpoint(dir.path.string(), a, 5, 3), "");
    Model b(p.model, 99); // a different init: everything must come from the checkpoint
    int64_t step = -1;
    ASSERT_EQ(load_training_state(dir.path.string(), b, step), "");
    EXPECT_EQ(step, 5);
    std::vector<double> tail = run(p, b, d, step);
    head.insert(head.end(), tail.begin(), tail.end());
    ASSERT_EQ(head.size(), all.size());
    for (size_t i = 0; i < all.size(); ++i) EXPECT_EQ(head[i], all[i]) << "step " << i + 1;
}

// bf16 trains as f32 does: within a few percent at every step, and not identically (the
// rounding is real). Its weights and moments stay f32, so its checkpoint is an f32 one, loaded
// bit for bit by a run of either precision.
TEST(Training, Bf16FollowsTheLossCurveOfF32) {
    Program p = program_of(tiny, {"train.steps=30"});
    Program q = program_of(tiny, {"train.steps=30", "train.precision=bf16"});
    ASSERT_EQ(q.train.precision, Precision::bf16);
    TokenData d;
    ASSERT_EQ(load_data(p.train.data, p.model, d), "");
    Model f(p.model, 3), b(q.model, 3, Recompute::none, nullptr, Precision::bf16);
    std::vector<double> lf = run(p, f, d), lb = run(q, b, d);
    ASSERT_EQ(lb.size(), lf.size());
    size_t differ = 0;
    for (size_t i = 0; i < lf.size(); ++i) {
        EXPECT_NEAR(lb[i], lf[i], 0.03 * lf[i]) << "step " << i + 1;
        differ += lb[i] != lf[i];
    }
    EXPECT_GT(differ, lf.size() / 2);
    EXPECT_LT(lb.back(), lb.front() - 0.5);

    TempDir dir;
    ASSERT_EQ(save_checkpoint(dir.path.string(), b, 30, 3), "");
    Model g(p.model, 99);
    int64_t step = -1;
    ASSERT_EQ(load_training_state(dir.path.string(), g, step), "");
    for (size_t i = 0; i < b.params().all().size(); ++i) {
        const Parameter& x = b.params().all()[i];
        const Parameter& y = g.params().all()[i];
        ASSERT_EQ(std::memcmp(x.value.raw(), y.value.raw(), x.value.bytes()), 0) << x.name;
        ASSERT_EQ(std::memcmp(x.v.raw(), y.v.raw(), x.v.bytes()), 0) << x.name;
    }
}

// On request (train.checkpoint.dtype bf16) the weights file holds BF16: half the bytes, every
// value the nearest bf16 to the weight, read back as such; the moments stay f32.
TEST(Checkpoint, WritesBf16WeightsOnRequest) {
    Program p = program_of(tiny, {"train.steps=3"});
    TokenData d;
    ASSERT_EQ(load_data(p.train.data, p.model, d), "");
    Model m(p.model, 3);
    run(p, m, d);
    TempDir f32, bf16;
    ASSERT_EQ(save_checkpoint(f32.path.string(), m, 3, 3), "");
    ASSERT_EQ(save_checkpoint(bf16.path.string(), m, 3, 3, true), "");
    SafetensorsFile a, b;
    ASSERT_EQ(read_safetensors((f32.path / "model.safetensors").string(), a), "");
    ASSERT_EQ(read_safetensors((bf16.path / "model.safetensors").string(), b), "");
    size_t bytes_a = 0, bytes_b = 0;
    for (const TensorRecord& r : b.tensors) {
        EXPECT_EQ(r.dtype, TensorDType::bf16) << r.name;
        bytes_b += r.bytes.size();
    }
    for (const TensorRecord& r : a.tensors) bytes_a += r.bytes.size();
    EXPECT_EQ(2 * bytes_b, bytes_a);
    Model back(p.model, 99);
    int64_t step = -1;
    ASSERT_EQ(load_training_state(bf16.path.string(), back, step), "");
    EXPECT_EQ(step, 3);
    for (size_t i = 0; i < m.params().all().size(); ++i) {
        const Parameter& x = m.params().all()[i];
        const Parameter& y = back.params().all()[i];
        for (int64_t j = 0; j < x.value.numel(); ++j)
            ASSERT_EQ(y.value.data<float>()[j],
                      kernels::bf16_to_f32(kernels::f32_to_bf16(x.value.data<float>()[j])))
                << x.name;
        ASSERT_EQ(std::memcmp(x.m.raw(), y.m.raw(), x.m.bytes()), 0) << x.name;
    }
}

TEST(Checkpoint, UsesHuggingFaceNamesAndLayouts) {
    Program p = program_of(tiny);
    Model m(p.model, 1);
    TempDir dir;
    ASSERT_EQ(save_checkpoint(dir.path.string(), m, 0, 1), "");
    SafetensorsFile f;
    ASSERT_EQ(read_safetensors((dir.path / "model.safetensors").string(), f), "");
    EXPECT_EQ(f.metadata["format"], "pt");
    const TensorRecord* c_attn = f.find("h.1.attn.c_attn.weight");
    ASSERT_NE(c_attn, nullptr);
    EXPECT_EQ(c_attn->shape, (std::vector<int64_t>{16, 48})); // Conv1D: [in, out]
    ASSERT_NE(f.find("h.0.mlp.c_proj.bias"), nullptr);
    EXPECT_EQ(f.find("lm_head.weight"), nullptr); // tied to wte
    // Element [i][j] of the file is element [j][i] of the internal (out, in) matrix.
    float stored;
    std::memcpy(&stored, c_attn->bytes.data() + (2 * 48 + 5) * 4, 4);
    EXPECT_EQ(stored, m.params().find("h.1.attn.qkv.weight")->value.data<float>()[5 * 16 + 2]);
    // Llama: q, k and v are separate tensors.
    Program l = program_of(
        "llama(vocab: 256, context: 16, layers: 1, heads: 4, kv_heads: 2, width: 16, hidden: 24)");
    Model lm(l.model, 1);
    TempDir ldir;
    ASSERT_EQ(save_checkpoint(ldir.path.string(), lm, 0, 1), "");
    SafetensorsFile lf;
    ASSERT_EQ(read_safetensors((ldir.path / "model.safetensors").string(), lf), "");
    ASSERT_NE(lf.find("model.layers.0.self_attn.k_proj.weight"), nullptr);
    EXPECT_EQ(lf.find("model.layers.0.self_attn.k_proj.weight")->shape,
              (std::vector<int64_t>{8, 16}));
    EXPECT_EQ(lf.find("model.layers.0.mlp.up_proj.weight")->shape, (std::vector<int64_t>{24, 16}));
    ASSERT_NE(lf.find("lm_head.weight"), nullptr);
    // And the round trip gives the same predictions.
    Model back(l.model, 2);
    ASSERT_EQ(load_weights(ldir.path.string(), back), "");
    kernels::Tensor tok({1, 5}, kernels::DType::i32);
    for (int i = 0; i < 5; ++i) tok.data<int32_t>()[i] = 10 * i;
    kernels::Tensor a = lm.logits(tok), b = back.logits(tok);
    EXPECT_EQ(0, std::memcmp(a.raw(), b.raw(), a.bytes()));
}

TEST(Checkpoint, RefusesWrongShapesMissingTensorsAndMixedSteps) {
    Program p = program_of(tiny);
    Model m(p.model, 1);
    TempDir dir;
    ASSERT_EQ(save_checkpoint(dir.path.string(), m, 4, 1), "");
    Program wide = program_of("gpt(vocab: 256, context: 16, layers: 2, heads: 2, width: 32)");
    Model w(wide.model, 1);
    std::string e = load_weights(dir.path.string(), w);
    EXPECT_NE(e.find("tensor `wte.weight` has shape [256, 16], but the script's model expects "
                     "[256, 32]"),
              std::string::npos)
        << e;
    Program deep = program_of("gpt(vocab: 256, context: 16, layers: 3, heads: 2, width: 16)");
    Model d(deep.model, 1);
    e = load_weights(dir.path.string(), d);
    EXPECT_NE(e.find("has no tensor `h.2.ln_1.weight`"), std::string::npos) << e;
    // An interrupted save: state.json of another step.
    std::ofstream(dir.path / "state.json") << R"({"format": "dist-checkpoint-1", "step": 9})";
    int64_t step = 0;
    e = load_training_state(dir.path.string(), m, step);
    EXPECT_NE(e.find("mixes files of different steps"), std::string::npos) << e;
    EXPECT_NE(load_weights((dir.path / "nope").string(), m).find("not a checkpoint folder"),
              std::string::npos);
}

// A save cut short at any point leaves a folder that loads whole: before its commit marker,
// the step before; after it, the new step (the files still pending are read from there, and
// the next save moves them into place).
TEST(Checkpoint, ASaveCutShortLeavesAWholeCheckpoint) {
    Program p = program_of(tiny);
    Model old_model(p.model, 1), new_model(p.model, 2);
    TempDir a, b;
    ASSERT_EQ(save_checkpoint(a.path.string(), old_model, 4, 1), "");
    ASSERT_EQ(save_checkpoint(b.path.string(), new_model, 6, 1), "");
    EXPECT_FALSE(fs::exists(a.path / ".pending")) << "a finished save leaves nothing pending";
    const char* files[] = {"model.safetensors", "config.json", "optimizer.safetensors",
                           "state.json"};
    const fs::path pending = a.path / ".pending";
    auto loads_as = [&](int64_t expect, const Model& like) {
        Model m(p.model, 3);
        int64_t step = 0;
        std::string e = load_training_state(a.path.string(), m, step);
        ASSERT_EQ(e, "");
        EXPECT_EQ(step, expect);
        const auto& got = m.params().all().front();
        const auto& want = like.params().all().front();
        EXPECT_EQ(0, std::memcmp(got.value.raw(), want.value.raw(), got.value.bytes()));
    };
    // Cut short while writing the pending files: no marker, the folder's step 4 stands.
    fs::create_directories(pending);
    for (const char* f : {"model.safetensors", "config.json"})
        fs::copy_file(b.path / f, pending / f);
    loads_as(4, old_model);
    // Cut short after the marker, with the model already moved up and the rest still pending:
    // step 6, whole.
    for (const char* f : {"optimizer.safetensors", "state.json"})
        fs::copy_file(b.path / f, pending / f);
    std::ofstream(pending / "COMMIT") << "6\n";
    fs::rename(pending / "model.safetensors", a.path / "model.safetensors");
    loads_as(6, new_model);
    // The next save finishes the moves first, then writes its own step.
    ASSERT_EQ(save_checkpoint(a.path.string(), new_model, 8, 1), "");
    EXPECT_FALSE(fs::exists(pending));
    loads_as(8, new_model);
    for (const char* f : files) EXPECT_TRUE(fs::exists(a.path / f)) << f;
}

TEST(Checkpoint, ReadsNamesWithTheTransformerPrefix) {
    Program p = program_of(tiny);
    Model m(p.model, 1);
    TempDir dir;
    ASSERT_EQ(save_checkpoint(dir.path.string(), m, 0, 1), "");
    SafetensorsFile f;
    ASSERT_EQ(read_safetensors((dir.path / "model.safetensors").string(), f), "");
    for (auto& t : f.tensors) t.name = "transformer." + t.name; // as GPT2LMHeadModel saves them
    TempDir hf;
    ASSERT_EQ(write_safetensors((hf.path / "model.safetensors").string(), f), "");
    Model back(p.model, 7);
    ASSERT_EQ(load_weights(hf.path.string(), back), "");
    EXPECT_EQ(0, std::memcmp(back.params().find("h.0.attn.qkv.weight")->value.raw(),
                             m.params().find("h.0.attn.qkv.weight")->value.raw(),
                             m.params().find("h.0.attn.qkv.weight")->value.bytes()));
}

namespace {

// GPT-2's forward pass written from its definition, in double, reading a Hugging Face
// checkpoint: the reference that `evaluate` is compared with.
struct Gpt2Reference {
    const SafetensorsFile& f;
    int64_t C, L, H;

    std::vector<double> get(const std::string& name) const {
        const TensorRecord* r = f.find(name);
        EXPECT_NE(r, nullptr) << name;
        std::vector<double> out(r->bytes.size() / 4);
        for (size_t i = 0; i < out.size(); ++i) {
            float v;
            std::memcpy(&v, r->bytes.data() + 4 * i, 4);
            out[i] = v;
        }
        return out;
    }
    static void layer_norm(std::vector<double>& x, const std::vector<double>& g,
                           const std::vector<double>& b) {
        double m = 0, v = 0;
        for (double a : x) m += a / static_cast<double>(x.size());
        for (double a : x) v += (a - m) * (a - m) / static_cast<double>(x.size());
        for (size_t i = 0; i < x.size(); ++i) x[i] = (x[i] - m) / std::sqrt(v + 1e-5) * g[i] + b[i];
    }
    // y = x @ W + b with W stored [in, out] (Conv1D).
    static std::vector<double> conv1d(const std::vector<double>& x, const std::vector<double>& w,
                                      const std::vector<double>& b) {
        size_t out = b.size();
        std::vector<double> y(b);
        for (size_t i = 0; i < x.size(); ++i)
            for (size_t o = 0; o < out; ++o) y[o] += x[i] * w[i * out + o];
        return y;
    }

    // Mean loss of predicting window[1..T] from window[0..T-1].
    double loss(const std::vector<int32_t>& window) const {
        int64_t T = static_cast<int64_t>(window.size()) - 1, D = C / H;
        auto wte = get("wte.weight"), wpe = get("wpe.weight");
        std::vector<std::vector<double>> x(static_cast<size_t>(T), std::vector<double>(C));
        for (int64_t t = 0; t < T; ++t)
            for (int64_t c = 0; c < C; ++c) x[t][c] = wte[window[t] * C + c] + wpe[t * C + c];
        for (int64_t l = 0; l < L; ++l) {
            std::string p = "h." + std::to_string(l) + ".";
            std::vector<std::vector<double>> qkv;
            for (int64_t t = 0; t < T; ++t) {
                auto h = x[t];
                layer_norm(h, get(p + "ln_1.weight"), get(p + "ln_1.bias"));
                qkv.push_back(
                    conv1d(h, get(p + "attn.c_attn.weight"), get(p + "attn.c_attn.bias")));
            }
            for (int64_t t = 0; t < T; ++t) {
                std::vector<double> a(C, 0.0);
                for (int64_t h = 0; h < H; ++h) {
                    std::vector<double> s(t + 1);
                    double mx = -1e300, z = 0;
                    for (int64_t u = 0; u <= t; ++u) {
                        double d = 0;
                        for (int64_t i = 0; i < D; ++i)
                            d += qkv[t][h * D + i] * qkv[u][C + h * D + i];
                        s[u] = d / std::sqrt(static_cast<double>(D));
                        mx = std::max(mx, s[u]);
                    }
                    for (auto& v : s) z += (v = std::exp(v - mx));
                    for (int64_t u = 0; u <= t; ++u)
                        for (int64_t i = 0; i < D; ++i)
                            a[h * D + i] += s[u] / z * qkv[u][2 * C + h * D + i];
                }
                auto o = conv1d(a, get(p + "attn.c_proj.weight"), get(p + "attn.c_proj.bias"));
                for (int64_t c = 0; c < C; ++c) x[t][c] += o[c];
                auto h = x[t];
                layer_norm(h, get(p + "ln_2.weight"), get(p + "ln_2.bias"));
                auto f = conv1d(h, get(p + "mlp.c_fc.weight"), get(p + "mlp.c_fc.bias"));
                for (auto& v : f)
                    v = 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
                auto y = conv1d(f, get(p + "mlp.c_proj.weight"), get(p + "mlp.c_proj.bias"));
                for (int64_t c = 0; c < C; ++c) x[t][c] += y[c];
            }
        }
        double total = 0;
        int64_t V = static_cast<int64_t>(wte.size()) / C;
        for (int64_t t = 0; t < T; ++t) {
            auto h = x[t];
            layer_norm(h, get("ln_f.weight"), get("ln_f.bias"));
            std::vector<double> z(V);
            double mx = -1e300, sum = 0;
            for (int64_t v = 0; v < V; ++v) {
                for (int64_t c = 0; c < C; ++c) z[v] += h[c] * wte[v * C + c]; // tied head
                mx = std::max(mx, z[v]);
            }
            for (double a : z) sum += std::exp(a - mx);
            total += mx + std::log(sum) - z[window[t + 1]];
        }
        return total / static_cast<double>(T);
    }
};

} // namespace

TEST(Evaluate, MatchesAnIndependentGpt2ForwardOnTheSavedCheckpoint) {
    Program p = program_of("gpt(vocab: 256, context: 8, layers: 2, heads: 2, width: 16)",
                           {"train.steps=5"});
    TokenData d;
    ASSERT_EQ(load_data(p.train.data, p.model, d), "");
    Model m(p.model, 5);
    run(p, m, d); // trained weights, not just the initial ones
    TempDir dir;
    ASSERT_EQ(save_checkpoint(dir.path.string(), m, 5, 5), "");
    // A small evaluation text: its windows of 9 bytes.
    std::string text = "The quick brown fox jumps over the lazy dog, twice over.";
    fs::path txt = dir.path / "eval.txt";
    std::ofstream(txt) << text;
    TokenData eval;
    ASSERT_EQ(TokenData::load_text(txt.string(), 9, eval), "");
    Model loaded(p.model, 123);
    ASSERT_EQ(load_weights(dir.path.string(), loaded), "");
    EvalResult r = evaluate(loaded, eval);
    EXPECT_EQ(r.tokens, static_cast<int64_t>(text.size() / 9) * 8);

    SafetensorsFile f;
    ASSERT_EQ(read_safetensors((dir.path / "model.safetensors").string(), f), "");
    Gpt2Reference ref{f, 16, 2, 2};
    double sum = 0;
    int64_t windows = static_cast<int64_t>(text.size()) / 9;
    for (int64_t w = 0; w < windows; ++w) {
        std::vector<int32_t> win(text.begin() + w * 9, text.begin() + w * 9 + 9);
        sum += ref.loss(win);
    }
    EXPECT_NEAR(r.loss, sum / static_cast<double>(windows), 1e-4);
}
