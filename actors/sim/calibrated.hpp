// calibrated.hpp: the cost of a stage's kernels from what `dist calibrate` measured.
//
// A calibrated profile holds the rates of Dist's own kernels at a grid of shapes, alone on an
// idle machine, for each thread count a rank may get; how fast each busy thread runs when
// several share the cores; and the times of transfers and collectives by size. Rates between
// measured shapes are interpolated in log space (a matmul's rate on its three dimensions, the
// rest on one), and clamped outside the grid.
#pragma once

#include "actors/plan/graph.hpp"
#include "actors/plan/stages.hpp"
#include "lang/program.hpp"

#include <string>
#include <vector>

namespace dist::sim {

class Rates {
  public:
    explicit Rates(const Calibration& c) : c_(&c) {}

    /// FLOP/s of one matmul kernel ("nt", "nn", "tn") of shape (m, n, k) on `threads` threads;
    /// `warm`: its weight operand still in the cores' caches (the rates measured so, where they
    /// were), else from beyond them, as a step meets a layer's weights.
    double matmul(const std::string& kernel, double m, double n, double k, double threads,
                  bool warm = false) const;
    /// FLOP/s of causal attention over sequences of `seq` tokens (4 seq^2 heads head_dim FLOPs
    /// per sequence forward, twice that backward: the plan's count).
    double attention(double seq, double head_dim, double threads, bool backward) const;
    /// Elements per second of an element-wise kernel over `elements` elements.
    double elementwise(const std::string& op, double elements, double threads, bool backward) const;
    /// Each busy thread's speed, relative to one thread alone, when `threads` are busy at once
    /// on the host's cores, each working over `bytes` (the largest matmul's operands of the
    /// host's ranks): between the working sets measured, interpolated in log bytes; beyond
    /// them, the nearest. 0 bytes: the smallest measured.
    double sharing(double threads, double bytes = 0) const;
    /// Seconds of one message of `bytes` through `transport`; negative when not measured.
    double transfer(const std::string& transport, double bytes) const;
    /// Seconds of a collective; negative when not measured for that backend and op.
    double collective(const std::string& backend, const std::string& op, int32_t ranks,
                      double bytes) const;

    const Calibration& calibration() const { return *c_; }

  private:
    const Calibration* c_;
};

/// Seconds of one stage's forward, input gradient and weight gradient for one microbatch on a
/// rank with `threads` threads (backward = input + weight), and of its AdamW step.
struct StageSeconds {
    double forward = 0, input = 0, weight = 0;
};
/// `whole`: as whole actions cost, the kernels' time scaled as the calibration measured; else
/// the kernels' time alone.
StageSeconds stage_seconds(const Program& p, const plan::PlanStage& s, const Rates& r,
                           double threads, bool whole = true);
double step_seconds(double parameters, const Rates& r, double threads);

/// The width of a stage's matmuls on one rank: a tensor-parallel shard's (model width / tp),
/// the key of a profile's `matmul_efficiency_by_width` and of its whole actions by width.
double shard_width(const Program& p);
/// The tokens of one microbatch on one rank (a context-parallel rank's share of its
/// sequences): the key of the whole actions' fits by token count.
double microbatch_tokens(const Program& p);

/// The most ranks of `g` on one host.
int32_t most_ranks_on_a_host(const plan::Graph& g);
/// The threads each rank of `g` computes on: the host's cores divided between its ranks, at
/// least one (the runtime's rule, actors/runtime/job.cpp).
int32_t rank_threads(const plan::Graph& g, int32_t cores);

/// How far back each stash of a rank was last touched, in bytes of other stashes touched since
/// (its reuse distance): for each of the rank's actions in order, that of the microbatch's
/// saved activations its B, I or W reads, and of the memory its F takes to write them (the
/// memory its rank freed last and has not taken again, as an allocator hands out what was
/// freed last); -1 for the other actions. A stash is a stage's `activation_bytes`; F takes it
/// and writes it, B reads it and frees it, I reads it and frees it unless a W of the same
/// microbatch follows, which then reads it and frees it. Of the step after another like it
/// (the previous step's frees are what its F take); the actions of the probes' order, each B
/// right after its F, touch nothing between and are at 0.
std::vector<double> reuse_distances(const plan::Graph& g, const plan::PlanRank& r);

/// The expected `i`-th largest of `n` independent standard normal draws (i from 1): the
/// expected order statistic, integrated numerically (n = 2: 1/sqrt(pi) and its negative).
double normal_order_statistic(int32_t i, int32_t n);
/// Each rank's pace on the host's cores (a factor on its compute's time; 1: the cores' mean), in
/// each of the draws a simulation averages over. Where a host's n ranks each hold a core or more
/// of their own, they run at their cores' paces, which spread by `core_spread` (one core's
/// standard deviation against the mean; a rank's of t threads sqrt(t) times less): the expected
/// paces of n draws, slowest first, in turn from each of its ranks in rank order (the first
/// draw gives rank order's first the slowest, the next the second, ...), for at most
/// kMostPaceDraws turns evenly spread. The tensor- and context-parallel ranks of a (dp, pp)
/// position, which meet inside every layer, all go at their slowest's pace; a stage's
/// replicas wait for the slowest in their gradients' collectives, and a pipeline's stages for
/// each other's activations and gradients, whichever drew the slower core. Ranks beyond the
/// cores take turns on them: 1 each. Without a spread, or where the draws are all alike: one.
inline constexpr size_t kMostPaceDraws = 8;
std::vector<std::vector<double>> core_paces(const plan::Graph& g, int32_t cores,
                                            double core_spread);

} // namespace dist::sim
