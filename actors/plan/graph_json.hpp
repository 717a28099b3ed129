// graph_json.hpp: the Graph as JSON (`dist plan --json`) and back.
//
// {"schedule": "1f1b", "dp": .., "tp": .., "pp": .., "virtual_stages": .., "microbatches": ..,
//  "stages": [{"stage": 0, "pp": 0, "blocks": [first, count], ...}],
//  "ranks": [{"rank": 0, "dp": 0, "pp": 0, "tp": 0, "host": 0, "actions": ["0F0", ...]}]}
// An overlapped pair is one string, `6F3+1B1`. Reading back gives a graph equal to the one
// written (source locations of custom tables are not kept).
#pragma once

#include "actors/plan/graph.hpp"

#include <nlohmann/json.hpp>

#include <string>

namespace dist::plan {

nlohmann::json to_json(const Graph& g);

/// Reads a graph; on failure returns false and says what is wrong in `error`.
bool from_json(const nlohmann::json& j, Graph& out, std::string& error);

} // namespace dist::plan
