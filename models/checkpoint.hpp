// checkpoint.hpp: saving and loading models and training state.
//
// A checkpoint folder holds `model.safetensors` with Hugging Face names and layouts (GPT-2's
// for the `gpt` family, with its [in, out] matrices; Llama's for `llama`, with q/k/v and
// gate/up as separate tensors; Dist's own names for other templates), a Hugging Face-style
// `config.json`, and, for resuming, `optimizer.safetensors` (AdamW moments) and `state.json`
// (the step; the batch of a step is a function of (seed, step), so the step is the data
// position). A save writes every file atomically into `.pending/` inside the folder, then a
// commit marker, then moves the files up: a save cut short before the marker leaves the last
// checkpoint as it was, one cut short after it is read from the pending files (and finished by
// the next save), so a kill at any moment leaves a folder that loads whole. Loading still
// checks that the files belong to the same step.
#pragma once

#include "models/model.hpp"

#include <string>

namespace dist::models {

/// Writes the model (and, when `step` > 0, the optimizer state and step) into `dir`, creating
/// it. "" on success. With `bf16_weights` model.safetensors holds the weights rounded to BF16
/// (half the bytes; the optimizer state stays f32, and a run resumed from it starts from the
/// rounded weights).
std::string save_checkpoint(const std::string& dir, Model& model, int64_t step, uint64_t seed,
                            bool bf16_weights = false);

/// Loads weights from `dir`: a Dist checkpoint or a Hugging Face model folder, whichever of its
/// layouts it has: model.safetensors, shards named by model.safetensors.index.json, PyTorch's
/// pytorch_model.bin (torch.save), or its shards named by pytorch_model.bin.index.json. Names
/// may carry the `transformer.` / `model.` prefix or not; F32, BF16, F16 and F64 weights are
/// read (and kept as f32); tensors the model does not use (attention-mask buffers) are ignored.
/// A missing tensor, or a shape that does not match the script's model, is an error that names
/// the tensor and both shapes.
std::string load_weights(const std::string& dir, Model& model);

/// Loads weights and optimizer state and returns the step to continue from in `step`.
std::string load_training_state(const std::string& dir, Model& model, int64_t& step);

/// The name a parameter has in checkpoints (for messages and tests).
std::string external_name(const ModelSpec& spec, const std::string& internal);

} // namespace dist::models
