// model_fixtures.hpp: small checked models and token batches shared by the model tests.
#pragma once

#include "lang/check.hpp"
#include "models/model.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

namespace dist::models::fixtures {

/// The ModelSpec of `model_line` (a call of std/gpt.dist or std/llama.dist), checked.
inline ModelSpec spec_of(const std::string& model_line) {
    lang::FrontendOptions o;
    o.search_roots = {std::filesystem::path(DIST_SOURCE_DIR) / "stdlib"};
    std::string text =
        "import \"std/gpt.dist\"\nimport \"std/llama.dist\"\nimport \"std/moe.dist\"\nmodel = " +
        model_line + "\nmesh {\n devices: cpu\n}\ntrain {\n batch: 2\n steps: 1\n}\n";
    lang::CheckResult r = lang::check_text("t.dist", text, o);
    EXPECT_TRUE(r.ok()) << r.report();
    return r.program->model;
}

struct Data {
    Tensor tokens, targets;
};

/// A (B,T) batch of tokens and targets below `vocab`, different for each `seed`.
inline Data data(int64_t B, int64_t T, int32_t vocab, uint32_t seed) {
    Data d{Tensor({B, T}, kernels::DType::i32), Tensor({B, T}, kernels::DType::i32)};
    for (int64_t i = 0; i < B * T; ++i) {
        d.tokens.data<int32_t>()[i] = static_cast<int32_t>((seed * 7 + i * 5) % vocab);
        d.targets.data<int32_t>()[i] = static_cast<int32_t>((seed * 3 + i * 11 + 1) % vocab);
    }
    return d;
}

} // namespace dist::models::fixtures
