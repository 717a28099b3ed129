// stages.hpp: the cost model of layers and the partition of blocks into pipeline stages.
//
// Part of lowering: it runs before the schedule's actions are placed, because both the
// partition and the simulator need every stage's FLOPs, bytes and memory.
#pragma once

#include "actors/plan/graph.hpp"

#include <string>
#include <vector>

namespace dist::plan {

/// Costs of one model part (a block, or the layers before / after the blocks) for one
/// microbatch on one tensor-parallel rank.
struct PartCost {
    int64_t parameters = 0;
    double flops_forward = 0, flops_input_grad = 0, flops_weight_grad = 0;
    double bytes_elementwise = 0;
    int64_t activation_bytes = 0;
    /// Tensor-parallel all-reduces of the stage's boundary activation in one forward and in one
    /// backward (the vocabulary-split embedding's are in its forward, the head's in its
    /// backward), and the vocabulary-split loss's small ones (row maxima, then sums) in its
    /// forward, of `tp_loss_bytes` each.
    int32_t tp_reductions = 0, tp_backward_reductions = 0;
    int32_t tp_loss_reductions = 0;
    double tp_loss_bytes = 0;
    int64_t cp_ring_bytes = 0;  // key/value bytes passed along the cp ring in one forward
    double attention_flops = 0; // the forward FLOPs the ring hides behind
    double flash_forward = 0, flash_input_grad = 0; // causal flash products (PlanStage)
    /// Mixtures of experts: all-to-alls in one forward (a dispatch and a combine per layer; as
    /// many in the backward), the bytes each rank puts in one, and the parameters of routed
    /// experts on this rank (their gradients are reduced over dp x cp / ep ranks).
    int32_t all_to_alls = 0;
    int64_t all_to_all_bytes = 0;
    int64_t expert_parameters = 0;

    void add(const PartCost& o);
    /// Seconds of one forward and backward at `flops_rate` and `bytes_rate` (the balancing key).
    double seconds(double flops_rate, double bytes_rate) const;
};

PartCost cost_of_items(const Program& p, const std::vector<ModelItemSpec>& items);

/// Bytes a block saves for its backward per microbatch on one rank: Korthikanti et al.'s
/// formula with its tensor-, sequence-parallel and recomputation variants (stages.cpp).
int64_t block_activation_bytes(const Program& p, const BlockSpec& block);

/// The expected largest of n independent standard normal variables (z_2 = 1 / sqrt(pi)).
double expected_max_normal(int64_t n);
/// Loads of n groups (experts, or the ranks holding them) that are sums of many independent
/// choices, each load of mean `mean` and variance `variance`, their total fixed (so any two are
/// correlated by -1 / (n - 1)): the expected busiest load over the mean,
/// 1 + z_n sqrt(n / (n - 1)) sqrt(variance) / mean.
double busiest_over_mean(int64_t n, double mean, double variance);
/// Routing by chance alone (every token's top_k experts uniformly at random, what an auxiliary
/// loss drives a router towards): the busiest of `ep` expert-parallel ranks' token copies over
/// the mean, each rank sending `tokens` tokens of `l` per microbatch.
double expert_rank_imbalance(const LayerSpec& l, int64_t ep, double tokens);

/// Blocks per stage minimising the slowest stage, embeddings counted on the first stage and
/// the head and loss on the last; every stage gets at least one block.
/// On a mesh of several kinds of device, `stage_rank` (the pipeline rank of each stage) prices
/// each stage on its rank's kind.
std::vector<int64_t> balanced_partition(const Program& p, int32_t stages,
                                        const std::vector<int32_t>& stage_rank = {});

/// Whether the head shares the embedding's weights (GPT-2) on another rank than the embedding:
/// then both ranks hold a copy and STEP all-reduces its gradient between them; and its bytes.
bool tied_elsewhere(const Program& p, const std::vector<int32_t>& stage_rank);
int64_t tied_gradient_bytes(const Program& p, const std::vector<int32_t>& stage_rank);

/// One kernel call of a stage's forward on one rank for one microbatch, with the calls of its
/// backward implied: what a calibrated cost model prices by shape (actors/sim/calibrated.hpp).
struct KernelCall {
    enum class Kind { matmul, attention, elementwise };
    Kind kind = Kind::matmul;
    /// elementwise: embedding, layernorm, rmsnorm, gelu, swiglu, rope, cross_entropy, copy
    std::string op;
    /// matmul: out (m, n) = in (m, k) x weight^T; its input gradient is an (m, k, n) product and
    /// its weight gradient an (n, k, m) one. attention: m sequences of n tokens, k = head_dim.
    /// elementwise: m elements.
    int64_t m = 0, n = 0, k = 0;
    int64_t heads = 0; // attention: query heads on the rank
    bool bias = false; // matmul: adds a bias (a pass over its output, and a column sum back)
    /// attention: the share of the T x T scores the rank computes (1 / cp).
    double share = 1.0;
    /// A loop of the host's own around the kernels (a mixture of experts' dispatch and
    /// combine), on one thread whatever the rank has.
    bool serial = false;
    /// elementwise: the layer keeps these m elements for its backward (a norm's input, an
    /// activation's, attention's q, k and v, the logits): bf16 storage under bf16.
    bool kept = false;
    /// elementwise: the residual sum x + f(x), whose output and body's gradient bf16 rounds.
    bool residual = false;
};

/// The kernels of one stage's forward, in order (embeddings, blocks, head).
std::vector<KernelCall> stage_kernels(const Program& p, const PlanStage& stage);

/// The stages of the plan with their costs, for the partition in `partition`.
std::vector<PlanStage> build_stages(const Program& p, const std::vector<int64_t>& partition,
                                    const std::vector<int32_t>& stage_rank);

} // namespace dist::plan
