// parameters.hpp: a model's parameters, their gradients and optimizer state, and their
// initialisation.
//
// Initial values are a pure function of (seed, parameter name, element index): any shard of any
// parameter can be materialised alone, and every mesh starts from the same weights.
#pragma once

#include "kernels/tensor.hpp"

#include <deque>
#include <string>
#include <utility>
#include <vector>

namespace dist::models {

struct Init {
    enum class Kind { normal, zeros, ones } kind = Kind::zeros;
    double std = 0.0;

    static Init normal(double std) { return {Kind::normal, std}; }
    static Init zeros() { return {Kind::zeros, 0.0}; }
    static Init ones() { return {Kind::ones, 0.0}; }
};

/// The part of a full parameter one tensor-parallel rank holds: along dimension `dim`, the
/// concatenation of the global index ranges [begin, end) in `ranges` (a fused q/k/v weight is
/// split in three places). An empty shard is the whole parameter.
struct Shard {
    int dim = -1;
    std::vector<std::pair<int64_t, int64_t>> ranges;

    bool whole() const { return dim < 0; }
    /// Rows [begin, end) of a parameter split along dimension 0 (or columns for dim 1).
    static Shard range(int dim, int64_t begin, int64_t end) { return {dim, {{begin, end}}}; }
    /// The local shape of a parameter of shape `full`.
    std::vector<int64_t> local_shape(const std::vector<int64_t>& full) const;
    /// The index in the full parameter of the element at `local` in the shard.
    int64_t global_index(const std::vector<int64_t>& full, int64_t local) const;
};

/// One parameter with its gradient and AdamW moments (all f32). Value and gradient have the
/// local shape; the moments cover the local elements [state_begin, state_begin + m.numel()):
/// all of them, or under ZeRO this data-parallel rank's share. Under ZeRO 3 `owned` holds the
/// values of that share, and `value` is whole (gathered) only while a unit computes with it:
/// otherwise it is undefined. Under ZeRO 2 and 3 `grad_share` holds the reduced gradient of
/// the share, and `grad` is whole only from a unit's backward until its reduce-scatter:
/// otherwise it is undefined.
struct Parameter {
    std::string name;                // e.g. "h.0.attn.qkv.weight"
    std::vector<int64_t> full_shape; // unsharded
    Shard shard;                     // what this rank holds of it
    std::vector<int64_t> shape;      // the local shape: the value's and the gradient's
    kernels::Tensor value;
    kernels::Tensor grad;
    kernels::Tensor m;
    kernels::Tensor v;
    int64_t state_begin = 0;
    kernels::Tensor owned;
    kernels::Tensor grad_share;
    /// Its gradient is this tensor-parallel rank's part of a sum over the group (a norm or
    /// the positions, computed on a sequence shard): the runtime all-reduces it over tp.
    bool sequence_partial = false;
    /// A routed expert's weight: under expert parallelism its gradient is summed over the
    /// expert-data-parallel group, not the data-parallel one.
    bool expert = false;
    Init init;
    bool decay = true; // weight decay applies (matrices), or not (biases and norm gains)

    /// The local elements.
    int64_t numel() const;
    /// The gradient of the elements the moments cover: the reduced share under ZeRO 2 and 3,
    /// else that range of the whole gradient.
    float* state_grad() {
        return grad_share.defined() ? grad_share.data<float>() : grad.data<float>() + state_begin;
    }
};

/// The parameters of a model, in creation order. References stay valid as more are added.
class ParameterStore {
  public:
    /// Parameters, gradients and moments in the memory of `allocator`'s device (the host's by
    /// default). Initial values are computed on the host and copied there.
    explicit ParameterStore(kernels::Allocator& allocator = kernels::Allocator::cpu())
        : allocator_(&allocator) {}
    kernels::Allocator& allocator() const { return *allocator_; }

    /// Adds a parameter of full shape `shape` and initialises the part `shard` of it, each
    /// element from its index in the full parameter.
    Parameter& add(std::string name, std::vector<int64_t> shape, Init init, bool decay,
                   uint64_t seed, const Shard& shard = {});
    Parameter* find(const std::string& name);
    const Parameter* find(const std::string& name) const;
    std::deque<Parameter>& all() { return params_; }
    const std::deque<Parameter>& all() const { return params_; }
    int64_t count() const;
    /// Clears every gradient there is: the whole ones and the reduced shares.
    void zero_grads();

  private:
    kernels::Allocator* allocator_;
    std::deque<Parameter> params_;
};

/// Sets every parameter of `part` (a stage or tensor-parallel shard of a model) to its elements
/// of `whole`'s values and AdamW moments. Throws std::logic_error for a name `whole` lacks.
/// Either store may live on a device (copied through the host); so may those below.
void copy_from_whole(const ParameterStore& whole, ParameterStore& part);
/// The inverse: writes `part`'s elements into `whole`, except the parameters named in `skip`.
void copy_to_whole(const ParameterStore& part, ParameterStore& whole,
                   const std::vector<std::string>& skip = {});

/// Appends `part`'s parameters, except those named in `skip`, to `out` as bytes: per parameter
/// its name, full shape, shard, and the values and AdamW moments of its part. How the shards of
/// processes other than the one writing a checkpoint travel to it.
void append_serialised(const ParameterStore& part, const std::vector<std::string>& skip,
                       std::string& out);
/// Writes the parameters of such bytes into `whole`, as copy_to_whole would have. "" on success,
/// else what is wrong with the bytes (truncated, a parameter `whole` lacks or has in another
/// shape, a shard outside its parameter); `whole` may then be partly written.
std::string merge_serialised(const std::string& bytes, ParameterStore& whole);

/// Element `index` of parameter `name` under `init`: the function every shard evaluates.
float initial_value(uint64_t seed, const std::string& name, int64_t index, const Init& init);

} // namespace dist::models
