// lower.hpp: a checked Program to a verified Graph, the entry point of actors/plan.
//
// Passes, in order: rank layout (DESIGN.md's rank order) -> stage partition (the script's, or
// balanced by the cost model) -> stage costs and tensor-parallel shards -> the schedule's
// compute order per pipeline rank -> point-to-point sends and receives between stages on
// different ranks -> data-parallel gradient buckets, each reduced right after the action that
// finishes its gradients -> the optimizer step -> the verifier.
#pragma once

#include "actors/plan/graph.hpp"
#include "actors/plan/schedules.hpp"

#include <optional>
#include <string>
#include <vector>

namespace dist::plan {

/// A located planning error; `loc` is invalid when nothing in the script is to blame.
struct PlanError {
    lang::SourceLoc loc;
    std::string message;
    std::string hint;
};

struct PlanResult {
    std::optional<Graph> graph;
    std::vector<PlanError> errors;
    bool ok() const { return graph.has_value() && errors.empty(); }
};

/// Lowers and verifies. Errors come back as values; the graph is absent when there are any.
/// `verify` false skips the verifier (a search lowering thousands of layouts whose rows are
/// then reproduced, verified, by `dist sim`).
PlanResult lower(const Program& p, bool verify = true);

/// Places a compute order on a mesh: one list per rank with the sends, receives, gradient
/// reductions and the optimizer step inserted. `stages` must have p * v entries. With `zero`
/// >= 2 a bucket is reduce-scattered instead of all-reduced; with 3 every forward and backward
/// of a stage is preceded (one compute action ahead) by the all-gather of its weights.
Graph assemble(const ScheduleOrder& order, std::vector<PlanStage> stages, ScheduleKind kind,
               int32_t dp, int32_t tp, int32_t microbatches, int32_t devices_per_host,
               int32_t cp = 1, int32_t zero = 0);

/// A graph with dp = tp = 1 and stages without costs, for studying a schedule on its own (the
/// tests, the docs, `--cost unit`). Errors of the schedule come back in the result.
PlanResult schedule_graph(ScheduleKind kind, int32_t p, int32_t m, int32_t v);

/// `file:line:col: error: message` (or `error: message`) and the hint, one error per line.
std::string render_errors(const std::string& file, const std::vector<PlanError>& errors);

} // namespace dist::plan
