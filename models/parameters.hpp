// parameters.hpp: a model's parameters, their gradients and optimizer state, and their
// initialisation.
//
// Initial values are a pure function of (seed, parameter name, element index): any shard of any
// parameter can be materialised alone, and every mesh starts from the same weights.
#pragma once

#include "kernels/tensor.hpp"

#include <deque>
#include <string>
#include <vector>

namespace dist::models {

struct Init {
    enum class Kind { normal, zeros, ones } kind = Kind::zeros;
    double std = 0.0;

    static Init normal(double std) { return {Kind::normal, std}; }
    static Init zeros() { return {Kind::zeros, 0.0}; }
    static Init ones() { return {Kind::ones, 0.0}; }
};

/// One parameter with its gradient and AdamW moments (all f32, same shape).
struct Parameter {
    std::string name; // e.g. "h.0.attn.qkv.weight"
    kernels::Tensor value;
    kernels::Tensor grad;
    kernels::Tensor m;
    kernels::Tensor v;
    Init init;
    bool decay = true; // weight decay applies (matrices), or not (biases and norm gains)
};

/// The parameters of a model, in creation order. References stay valid as more are added.
class ParameterStore {
  public:
    /// Adds and initialises a parameter.
    Parameter& add(std::string name, std::vector<int64_t> shape, Init init, bool decay,
                   uint64_t seed);
    Parameter* find(const std::string& name);
    std::deque<Parameter>& all() { return params_; }
    const std::deque<Parameter>& all() const { return params_; }
    int64_t count() const;
    void zero_grads();

  private:
    std::deque<Parameter> params_;
};

/// Element `index` of parameter `name` under `init`: the function every shard evaluates.
float initial_value(uint64_t seed, const std::string& name, int64_t index, const Init& init);

} // namespace dist::models
