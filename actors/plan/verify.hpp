// verify.hpp: proves a Graph sound before it is simulated or run: every microbatch's forward
// precedes its backward (I before W when split), every send has exactly one matching receive,
// the members of every collective group enter their collectives in the same order, and the
// abstract execution (execute.hpp) reaches the end of every list. A deadlock comes back as the
// cycle of ranks and the actions they block at, located at a custom table's cell when the
// schedule came from one.
#pragma once

#include "actors/plan/lower.hpp"

#include <vector>

namespace dist::plan {

std::vector<PlanError> verify(const Graph& g);

} // namespace dist::plan
