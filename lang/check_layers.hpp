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

} // namespace dist::lang
