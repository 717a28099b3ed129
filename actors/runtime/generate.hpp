// generate.hpp: autoregressive generation on a mesh, with key/value caches.
//
// The ranks of one data-parallel replica each hold their stages' tensor-parallel shards of the
// model. A forward pass runs the stages in pipeline order; the tensor-parallel ranks of a
// stage run together (their reductions meet in their group), and the stage's output, the
// activations of the new tokens, passes to the next stage. The last stage's logits (split by
// vocabulary over its tensor-parallel ranks when the head is) are put together and a token is
// chosen per row. Prompts of different lengths share a batch, left-padded.
#pragma once

#include "actors/plan/graph.hpp"
#include "actors/runtime/local_comms.hpp"
#include "lang/program.hpp"
#include "models/model.hpp"

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace dist::runtime {

class Generator {
  public:
    /// Shards of `whole` for the ranks of replica dp = 0 of `graph`.
    Generator(const Program& program, const plan::Graph& graph, const models::Model& whole);
    ~Generator();

    /// Continues every prompt by up to gen.max_tokens tokens (fewer where the context ends),
    /// calling on_token(row, token) as each is chosen. Throws std::invalid_argument for an
    /// empty prompt, one longer than the context, or a token outside the vocabulary.
    std::vector<std::vector<int32_t>>
    generate(const std::vector<std::vector<int32_t>>& prompts, const GenerateSpec& gen,
             uint64_t seed, const std::function<void(size_t, int32_t)>& on_token = {});

  private:
    struct Member {
        int32_t rank;
        std::unique_ptr<models::Stage> stage;
    };
    /// tokens (B,t) at ctx.pos0 -> logits (B,t,V) through every stage.
    kernels::Tensor forward(const kernels::Tensor& tokens, const models::InferContext& ctx);

    const Program& program_;
    std::unique_ptr<LocalComms> comms_;
    std::vector<std::vector<Member>> stages_; // per stage: its tensor-parallel ranks
};

} // namespace dist::runtime
