// generation_test.cpp: inference through the key/value cache against full recomputation.
#include "model_fixtures.hpp"

#include <gtest/gtest.h>

#include <cmath>

using namespace dist;
using namespace dist::models;
using namespace dist::models::fixtures;

namespace {

Tensor tokens_of(const std::vector<std::vector<int32_t>>& rows) {
    Tensor t({static_cast<int64_t>(rows.size()), static_cast<int64_t>(rows[0].size())},
             kernels::DType::i32);
    for (size_t b = 0; b < rows.size(); ++b)
        std::copy(rows[b].begin(), rows[b].end(), t.data<int32_t>() + b * rows[0].size());
    return t;
}

Tensor slice(const Tensor& t, int64_t from, int64_t to) {
    Tensor out({t.dim(0), to - from}, kernels::DType::i32);
    for (int64_t b = 0; b < t.dim(0); ++b)
        for (int64_t i = from; i < to; ++i)
            out.data<int32_t>()[b * (to - from) + i - from] = t.data<int32_t>()[b * t.dim(1) + i];
    return out;
}

// A prefix prefilled, then one token at a time: every position's logits equal those of the
// whole sequence computed at once.
void expect_cache_matches_recompute(const std::string& model_line) {
    ModelSpec spec = spec_of(model_line);
    Model m(spec, 5);
    Tensor seq = tokens_of({{1, 7, 3, 9, 2, 4}, {5, 5, 0, 8, 6, 1}});
    Tensor full = m.logits(seq);
    const int64_t V = spec.vocab, T = 6;
    InferContext ctx;
    ctx.session = 1;
    Tensor first = m.infer(slice(seq, 0, 3), ctx);
    std::vector<Tensor> parts{first};
    for (int64_t p = 3; p < T; ++p) {
        ctx.pos0 = p;
        parts.push_back(m.infer(slice(seq, p, p + 1), ctx));
    }
    m.end_session(1);
    for (int64_t b = 0; b < 2; ++b) {
        int64_t p = 0;
        for (const Tensor& part : parts)
            for (int64_t t = 0; t < part.dim(1); ++t, ++p)
                for (int64_t v = 0; v < V; ++v)
                    ASSERT_NEAR(part.data<float>()[(b * part.dim(1) + t) * V + v],
                                full.data<float>()[(b * T + p) * V + v], 1e-5)
                        << "row " << b << " position " << p;
    }
}

} // namespace

TEST(Generation, GptKeyValueCacheGivesTheLogitsOfRecomputation) {
    expect_cache_matches_recompute("gpt(vocab: 11, context: 6, layers: 2, heads: 2, width: 8)");
}

TEST(Generation, LlamaKeyValueCacheGivesTheLogitsOfRecomputation) {
    expect_cache_matches_recompute(
        "llama(vocab: 13, context: 6, layers: 2, heads: 4, kv_heads: 2, width: 8, hidden: 12)");
}

TEST(Generation, ALeftPaddedRowComputesAsIfAlone) {
    for (const char* line :
         {"gpt(vocab: 11, context: 8, layers: 2, heads: 2, width: 8)",
          "llama(vocab: 13, context: 8, layers: 2, heads: 4, kv_heads: 2, width: 8, hidden: 12)"}) {
        ModelSpec spec = spec_of(line);
        Model m(spec, 3);
        const int64_t V = spec.vocab;
        // Row 1 is the prompt {4, 2} behind three padding tokens.
        Tensor batch = tokens_of({{1, 2, 3, 4, 5}, {0, 0, 0, 4, 2}});
        InferContext ctx;
        ctx.row_start = {0, 3};
        Tensor padded = m.infer(batch, ctx);
        Tensor alone = m.logits(tokens_of({{4, 2}}));
        for (int64_t t = 0; t < 2; ++t)
            for (int64_t v = 0; v < V; ++v)
                ASSERT_NEAR(padded.data<float>()[(5 + 3 + t) * V + v],
                            alone.data<float>()[t * V + v], 1e-5)
                    << line << " position " << t;
        // The next token extends both rows.
        ctx.pos0 = 5;
        Tensor next = m.infer(tokens_of({{6}, {7}}), ctx);
        Tensor alone_next = m.logits(tokens_of({{4, 2, 7}}));
        for (int64_t v = 0; v < V; ++v)
            ASSERT_NEAR(next.data<float>()[V + v], alone_next.data<float>()[2 * V + v], 1e-5);
    }
}
