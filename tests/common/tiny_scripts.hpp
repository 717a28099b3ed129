// tiny_scripts.hpp: the small GPT-2, Llama and mixture-of-experts scripts that the runtime's
// equivalence tests and the multi-process tests train, with the number of steps of their
// learning-rate schedule.
#pragma once

#include <string>

namespace dist::tests {

// A script of `model` (after `import`) on one CPU device, trained on synthetic data in batches of
// 8 with a learning rate of 1e-2; `optimizer` and `train` add lines to those blocks.
inline std::string tiny_script(const std::string& import, const std::string& model, int steps,
                               int seed, const std::string& optimizer = "",
                               const std::string& train = "") {
    return "import \"" + import + "\"\nmodel = " + model +
           "\nmesh {\n    devices: cpu\n}\ntrain {\n    data: synthetic()\n    batch: 8\n"
           "    steps: " +
           std::to_string(steps) + "\n    seed: " + std::to_string(seed) +
           "\n    optimizer {\n        lr: 1e-2\n" + optimizer + "    }\n" + train + "}\n";
}

inline std::string tiny_gpt_script(int steps) {
    return tiny_script("std/gpt.dist", "gpt(vocab: 32, context: 8, layers: 4, heads: 4, width: 16)",
                       steps, 7, "        weight_decay: 0.1\n", "    clip: 0.5\n");
}

inline std::string tiny_llama_script(int steps) {
    return tiny_script(
        "std/llama.dist",
        "llama(vocab: 32, context: 8, layers: 4, heads: 4, kv_heads: 2, width: 16, hidden: 24)",
        steps, 11);
}

inline std::string tiny_moe_script(int steps) {
    return tiny_script(
        "std/moe.dist",
        "mixtral(vocab: 32, context: 8, layers: 2, heads: 4, kv_heads: 2, width: 16, "
        "experts: 4, top_k: 2, hidden: 16, theta: 10000.0)",
        steps, 13);
}

} // namespace dist::tests
