// schedules.hpp: pipeline schedule compilers, from (p, m, v) to each pipeline rank's order of
// compute actions. The first step of lowering; communication is inserted afterwards.
//
// Each compiler follows its paper; where a paper leaves the order open, the order that
// PyTorch's torch.distributed.pipelining executes. docs/schedules.md explains each one.
#pragma once

#include "actors/plan/graph.hpp"

#include <string>
#include <vector>

namespace dist::plan {

/// Compute actions per pipeline rank and the pipeline rank of every stage.
struct ScheduleOrder {
    std::vector<int32_t> stage_rank;            // p * v entries
    std::vector<std::vector<PlanAction>> ranks; // p lists of F, B, I, W actions
    std::string error;                          // empty when the schedule exists
    std::string hint;                           // what would work, with an error
};

/// The order for `kind` with p pipeline ranks, m microbatches and v stages per rank. `custom`
/// tables (and their source locations) come from `spec`, which is otherwise unused.
ScheduleOrder compile_schedule(ScheduleKind kind, int32_t p, int32_t m, int32_t v,
                               const ScheduleSpec& spec = {});

} // namespace dist::plan
