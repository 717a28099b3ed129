// generate.cpp: prefill and decode through the stages of a mesh.
#include "actors/runtime/generate.hpp"

#include "models/trainer.hpp"

#include <algorithm>
#include <cstring>
#include <future>
#include <stdexcept>

namespace dist::runtime {

using kernels::Tensor;

Generator::Generator(const Program& program, const plan::Graph& graph, const models::Model& whole)
    : program_(program), comms_(std::make_unique<LocalComms>(graph)) {
    stages_.resize(graph.stages.size());
    for (const auto& r : graph.ranks) {
        if (r.dp != 0 || r.cp != 0) continue;
        transport::Collectives* tp = comms_->for_rank(r.rank).tp;
        for (const auto& s : graph.stages) {
            if (s.pp != r.pp) continue;
            models::StageSpan span{s.first_block, s.first_block + s.blocks, s.embedding, s.head};
            auto stage = std::make_unique<models::Stage>(
                program.model, span, static_cast<uint64_t>(program.train.seed), Recompute::none, tp,
                nullptr, false, nullptr, nullptr, program.train.precision);
            models::copy_from_whole(whole.params(), stage->params());
            stages_[static_cast<size_t>(s.index)].push_back({r.rank, std::move(stage)});
        }
    }
}

Generator::~Generator() = default;

Tensor Generator::forward(const Tensor& tokens, const models::InferContext& ctx) {
    Tensor x = tokens;
    for (auto& members : stages_) {
        std::vector<Tensor> out(members.size());
        if (members.size() == 1) {
            out[0] = members[0].stage->infer(x, ctx);
        } else {
            // The tensor-parallel ranks of a stage run together: their reductions meet.
            std::vector<std::future<Tensor>> running;
            for (auto& m : members)
                running.push_back(std::async(std::launch::async,
                                             [&m, &x, &ctx] { return m.stage->infer(x, ctx); }));
            for (size_t i = 0; i < running.size(); ++i) out[i] = running[i].get();
        }
        x = out[0];
        const int64_t V = program_.model.vocab;
        if (&members == &stages_.back() && x.shape().back() != V) {
            // Logits split by vocabulary: rank i holds the i-th slice.
            int64_t rows = x.numel() / x.shape().back();
            std::vector<int64_t> shape = x.shape();
            shape.back() = V;
            Tensor whole(shape);
            int64_t at = 0;
            for (const Tensor& part : out) {
                int64_t w = part.shape().back();
                for (int64_t r = 0; r < rows; ++r)
                    std::memcpy(whole.data<float>() + r * V + at, part.data<float>() + r * w,
                                static_cast<size_t>(w) * sizeof(float));
                at += w;
            }
            x = whole;
        }
    }
    return x;
}

std::vector<std::vector<int32_t>>
Generator::generate(const std::vector<std::vector<int32_t>>& prompts, const GenerateSpec& gen,
                    uint64_t seed, const std::function<void(size_t, int32_t)>& on_token) {
    const int64_t context = program_.model.context, V = program_.model.vocab;
    const auto B = static_cast<int64_t>(prompts.size());
    std::vector<std::vector<int32_t>> out(prompts.size());
    if (B == 0) return out;
    int64_t L = 0;
    for (const auto& p : prompts) {
        if (p.empty()) throw std::invalid_argument("an empty prompt");
        for (int32_t t : p)
            if (t < 0 || t >= V)
                throw std::invalid_argument("prompt token " + std::to_string(t) +
                                            " is outside the vocabulary of " + std::to_string(V));
        L = std::max<int64_t>(L, static_cast<int64_t>(p.size()));
    }
    if (L > context)
        throw std::invalid_argument("a prompt of " + std::to_string(L) +
                                    " tokens is longer than the context of " +
                                    std::to_string(context));
    const int64_t steps = std::min(gen.max_tokens, context - L + 1);
    models::InferContext ctx;
    ctx.session = 1;
    Tensor tokens({B, L}, kernels::DType::i32);
    for (int64_t b = 0; b < B; ++b) {
        const auto& p = prompts[static_cast<size_t>(b)];
        int64_t pad = L - static_cast<int64_t>(p.size());
        ctx.row_start.push_back(pad);
        std::fill(tokens.data<int32_t>() + b * L, tokens.data<int32_t>() + b * L + pad, 0);
        std::copy(p.begin(), p.end(), tokens.data<int32_t>() + b * L + pad);
    }
    for (int64_t k = 0; k < steps; ++k) {
        Tensor logits = forward(tokens, ctx);
        const int64_t t = tokens.dim(1);
        Tensor next({B, 1}, kernels::DType::i32);
        for (int64_t b = 0; b < B; ++b) {
            const float* z = logits.data<float>() + (b * t + t - 1) * V;
            auto position = static_cast<uint64_t>(prompts[static_cast<size_t>(b)].size()) +
                            static_cast<uint64_t>(k);
            int32_t token =
                models::choose_token(z, V, gen, seed, position, static_cast<uint64_t>(b));
            next.data<int32_t>()[b] = token;
            out[static_cast<size_t>(b)].push_back(token);
            if (on_token) on_token(static_cast<size_t>(b), token);
        }
        ctx.pos0 += t;
        tokens = next;
        if (ctx.pos0 >= context) break; // the next token would have no position
    }
    for (auto& members : stages_)
        for (auto& m : members) m.stage->end_session(ctx.session);
    return out;
}

} // namespace dist::runtime
