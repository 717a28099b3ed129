// tiny_scripts.hpp: the small GPT-2 and Llama scripts that the runtime's equivalence tests and the
// multi-process tests train, with the number of steps of their learning-rate schedule.
#pragma once

#include <string>

namespace dist::tests {

inline std::string tiny_gpt_script(int steps) {
    return R"(import "std/gpt.dist"
model = gpt(vocab: 32, context: 8, layers: 4, heads: 4, width: 16)
mesh {
    devices: cpu
}
train {
    data: synthetic()
    batch: 8
    steps: )" +
           std::to_string(steps) +
           R"(
    seed: 7
    optimizer {
        lr: 1e-2
        weight_decay: 0.1
    }
    clip: 0.5
}
)";
}

inline std::string tiny_llama_script(int steps) {
    return R"(import "std/llama.dist"
model = llama(vocab: 32, context: 8, layers: 4, heads: 4, kv_heads: 2, width: 16, hidden: 24)
mesh {
    devices: cpu
}
train {
    data: synthetic()
    batch: 8
    steps: )" +
           std::to_string(steps) +
           R"(
    seed: 11
    optimizer {
        lr: 1e-2
    }
}
)";
}

inline std::string tiny_moe_script(int steps) {
    return R"(import "std/moe.dist"
model = mixtral(vocab: 32, context: 8, layers: 2, heads: 4, kv_heads: 2, width: 16, experts: 4,
                top_k: 2, hidden: 16, theta: 10000.0)
mesh {
    devices: cpu
}
train {
    data: synthetic()
    batch: 8
    steps: )" +
           std::to_string(steps) +
           R"(
    seed: 13
    optimizer {
        lr: 1e-2
    }
}
)";
}

} // namespace dist::tests
