// hf_checkpoint_test.cpp: a GPT-2 checkpoint written by Hugging Face's own tools
// (GPT2LMHeadModel.save_pretrained, by scripts/hf-reference.py) loads, and evaluates to the loss
// Hugging Face's model computed over the same text, cut the same way.
//
// The fixture needs `transformers`, which Debian does not package: it is made where that is
// installed (the lent GPU machine has it) and committed under tests/fixtures/hf_gpt2_tiny/ with
// the loss beside it. Without the folder the test is skipped with that explanation.
#include "model_fixtures.hpp"

#include "models/checkpoint.hpp"
#include "models/data.hpp"
#include "models/trainer.hpp"

#include <nlohmann/json.hpp>

#include <fstream>

namespace fs = std::filesystem;
using namespace dist;
using namespace dist::models;

TEST(HuggingFaceCheckpoint, Gpt2WrittenByTransformersEvaluatesToItsOwnLoss) {
    const fs::path dir = fs::path(DIST_SOURCE_DIR) / "tests/fixtures/hf_gpt2_tiny";
    if (!fs::exists(dir / "hf_eval.json"))
        GTEST_SKIP() << "no " << dir
                     << ": make it with scripts/hf-reference.py where transformers is installed";
    nlohmann::json expected;
    std::ifstream(dir / "hf_eval.json") >> expected;
    ModelSpec spec =
        fixtures::spec_of("gpt(vocab: 256, context: 64, layers: 2, heads: 2, width: 64)");
    Model model(spec, 1);
    ASSERT_EQ(load_weights(dir.string(), model), "");
    TokenData data;
    const std::string text =
        (fs::path(DIST_SOURCE_DIR) / expected["text"].get<std::string>()).string();
    ASSERT_EQ(TokenData::load_text(text, 65, data), "");
    EvalResult r = evaluate(model, data);
    EXPECT_EQ(r.tokens, expected["tokens"].get<int64_t>());
    EXPECT_NEAR(r.loss, expected["loss"].get<double>(), 1e-5 * expected["loss"].get<double>());
}
