// check_layers.hpp: building one checked layer from its call in a model template.
#pragma once

#include "lang/check_internal.hpp"

namespace dist::lang {

/// The names of the built-in layers, for suggestions.
std::vector<std::string> layer_names();

/// Binds the call's arguments to the layer's signature, checks them and fills `out` (named
/// `name`); false after reporting errors.
bool build_layer(const ModelItem& item, const Scope& scope, const std::string& name,
                 Diagnostics& diags, LayerSpec& out);

/// Parameters of one layer on one device, unsharded (saturating at INT64_MAX).
int64_t count_parameters(const LayerSpec& layer);

/// A mixture of experts' parameters: one routed expert's, and those every token uses (the
/// router and the shared experts).
int64_t expert_parameters(const LayerSpec& moe);
int64_t shared_parameters(const LayerSpec& moe);
/// A layer's parameters on one device of a mesh with tensor- and expert-parallel sizes tp, ep:
/// sharded layers hold 1/tp, a mixture of experts 1/ep of its experts (its router whole).
int64_t parameters_on_device(const LayerSpec& layer, int64_t tp, int64_t ep);
/// The parameters one token passes through (a moe layer's top_k experts, not all).
int64_t active_parameters(const LayerSpec& layer);

} // namespace dist::lang
