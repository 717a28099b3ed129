// program_json.hpp: the checked program as JSON (`dist plan --json`) and as a short summary.
#pragma once

#include "lang/program.hpp"

#include <nlohmann/json.hpp>
#include <string>

namespace dist::lang {

nlohmann::json to_json(const Program& program);
nlohmann::json to_json(const lang::Value& value);

/// A few lines for people: model, mesh, schedule, batch, memory floor.
/// The mesh's devices: "64 x h100-sxm", or by kind in pipeline order, "32 x h100-sxm + 32 x
/// a100-80g".
std::string devices_text(const MeshSpec& m);

std::string summary(const Program& program);
/// "dp 4, cp 2, tp 4 with sp, pp 2, ZeRO 1": the mesh's axes; cp, sp and ZeRO only when on.
std::string axes_text(const MeshSpec& mesh);

} // namespace dist::lang
