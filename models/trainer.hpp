// trainer.hpp: training and evaluation on one device.
//
// The loop every later runtime distributes: for each step, the global batch of (seed, step),
// cut into microbatches whose gradients accumulate; the gradient norm, clipping, the learning
// rate of the step, one AdamW update. Metrics go to a callback (JSON lines, a progress line, or
// an embedding application), which may stop the run.
#pragma once

#include "lang/program.hpp"
#include "models/data.hpp"
#include "models/model.hpp"

#include <functional>
#include <string>

namespace dist::models {

struct StepMetrics {
    int64_t step = 0; // 1-based: the step just finished
    double loss = 0.0;
    double lr = 0.0;
    double grad_norm = 0.0; // before clipping
    int64_t tokens = 0;     // tokens in this step's batch
    double step_time_s = 0.0;
    double tokens_per_s = 0.0;
    /// A model with experts: what its routers did this step, over every rank and layer.
    ExpertStats experts;
};

/// The learning rate of step `step` (0-based): linear warm-up to `lr`, then constant, cosine or
/// linear decay to `min_lr` at the last step.
double learning_rate(const TrainSpec& train, int64_t step);

/// Scales the gradients by clip / norm when clipping applies (train.clip > 0 and norm above
/// it), then one AdamW update of every parameter with the learning rate of `step` (0-based),
/// weight decay on the parameters that take it. Returns the learning rate. The parameters live
/// on `device`.
double optimizer_step(const TrainSpec& train, int64_t step, double norm,
                      const std::vector<Parameter*>& params,
                      kernels::Backend& device = kernels::cpu_backend());

/// Reads the training data the program names; "" or an error that names the file.
std::string load_data(const DataSpec& data, const ModelSpec& model, TokenData& out);

/// Trains on one device from step `first_step` (0, or where a resumed run left off).
/// `on_step` returns false to stop. "" on success, else the error.
std::string train(const Program& program, Model& model, const TokenData& data, int64_t first_step,
                  const std::function<bool(const StepMetrics&)>& on_step);

struct EvalResult {
    double loss = 0.0;  // mean next-token loss
    int64_t tokens = 0; // tokens predicted
};

/// The mean loss of predicting tokens 1..T of every window of T+1 tokens (T the model's
/// context) from the ones before, windows consecutive and non-overlapping.
/// `max_windows` >= 0 stops after that many windows (the first ones).
EvalResult evaluate(Model& model, const TokenData& data, int64_t max_windows = -1);

/// The next token from logits z (V): the largest at temperature 0, else a draw from the
/// softmax of the top_k logits at the temperature, a function of (seed, position, row).
int32_t choose_token(const float* z, int64_t V, const GenerateSpec& gen, uint64_t seed,
                     uint64_t position, uint64_t row);

/// Appends up to `max_tokens` sampled tokens to `tokens` (temperature 0: greedy; top_k 0: the
/// whole vocabulary), conditioning on at most the model's context. Deterministic for a seed.
void sample(Model& model, const GenerateSpec& gen, uint64_t seed, std::vector<int32_t>& tokens);

/// One metrics record as a JSON line (the `--metrics` format).
std::string metrics_json(const StepMetrics& m);

} // namespace dist::models
