// graph.hpp: the actor graph, the output type of planning (actors/plan) and the input of the
// simulator (actors/sim) and the runtime (actors/runtime).
//
// Plain data: the mesh's ranks with their coordinates, the pipeline stages with what each one
// holds and costs, and every rank's ordered action list. Compute actions print as
// `<stage><op><microbatch>` (`2F0`, `1I3`); communication actions as
// `<stage>SEND_F<microbatch>>r<peer>`, `<stage>RECV_B<microbatch><r<peer>`; the data-parallel
// gradient reduction as `<stage>REDUCE_GRAD<bucket>`; the optimizer step as `STEP`. Two compute
// actions that run overlapped (DualPipeV's forward/backward pairs) print joined: `6F3+1B1`.
#pragma once

#include "lang/program.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace dist::plan {

enum class ActionKind : uint8_t {
    forward,         // F: a stage's forward of one microbatch
    backward,        // B: input and weight gradients together
    backward_input,  // I: the input gradient only (zero-bubble split)
    backward_weight, // W: the weight gradient only
    send_forward,    // SEND_F: this stage's output activation to the next stage's rank
    recv_forward,    // RECV_F: this stage's input activation from the previous stage's rank
    send_backward,   // SEND_B: the gradient of this stage's input to the previous stage's rank
    recv_backward,   // RECV_B: the gradient of this stage's output from the next stage's rank
    reduce_grad,     // REDUCE_GRAD: all-reduce of one gradient bucket over the data-parallel group
    reduce_scatter,  // REDUCE_SCATTER: ZeRO 2 and 3's reduce-scatter of a microbatch's
                     // gradients of a stage, after its B or W: each member keeps its 1/N share
    gather_forward,  // GATHER_F: ZeRO 3's all-gather of a stage's weights for the forward of a
                     // microbatch, unit by unit; issued one compute action ahead (prefetch)
    gather_backward, // GATHER_B: the same before the backward (B or I) of a microbatch
    // Expert parallelism: the all-to-alls of a block's routed experts among the ep ranks that
    // share them. They run inside the compute action they follow (F, B or I of the same stage
    // and microbatch), in the order listed: in a forward, block by block, the dispatch (each
    // token copy to its expert's rank) and the combine (the experts' outputs back); in a
    // backward, block by block from the last, the combine's backward (the outputs' gradients
    // to the experts) and the dispatch's backward (the inputs' gradients back); under full
    // recomputation a residual group's forward ones again before its backward ones.
    dispatch_forward,  // DISPATCH_F
    combine_forward,   // COMBINE_F
    combine_backward,  // COMBINE_B
    dispatch_backward, // DISPATCH_B
    step               // STEP: the optimizer step, after this rank's reductions. It sums a tied
                       // embedding's gradient with the partner rank's copy (see Graph::tied_bytes)
                       // and, with clipping, all-reduces the gradient norm over every rank
};

bool is_compute(ActionKind k);
bool is_p2p(ActionKind k);
/// REDUCE_GRAD, REDUCE_SCATTER, GATHER_F, GATHER_B: collectives of the data-parallel group, run
/// on the rank's communication stream.
bool is_dp_collective(ActionKind k);
/// DISPATCH_F, COMBINE_F, COMBINE_B, DISPATCH_B: the expert-parallel group's all-to-alls, run
/// on the compute stream inside the compute action they follow.
bool is_exchange(ActionKind k);
/// "F", "B", "I", "W", "SEND_F", ..., "REDUCE_GRAD", "STEP".
const char* op_name(ActionKind k);

/// One entry of a rank's action list.
struct PlanAction {
    ActionKind kind = ActionKind::forward;
    int32_t stage = -1;        // global virtual-stage index; -1 for STEP
    int32_t microbatch = -1;   // the bucket index for REDUCE_GRAD; -1 for STEP
    int32_t peer = -1;         // global rank at the other end of a SEND / RECV
    int32_t block = -1;        // the block of an all-to-all (DISPATCH_F ...)
    bool overlap_next = false; // runs overlapped with the next compute action (DualPipeV)
    lang::SourceLoc loc;       // the custom table's cell, when the action came from one

    /// Equality ignores `loc`: a graph read back from JSON equals the one written.
    bool operator==(const PlanAction& o) const {
        return kind == o.kind && stage == o.stage && microbatch == o.microbatch && peer == o.peer &&
               block == o.block && overlap_next == o.overlap_next;
    }
};

/// `2F0`, `0SEND_F1>r3`, `1RECV_B0<r5`, `1REDUCE_GRAD0`, `1DISPATCH_F0@5` (block 5), `STEP`.
std::string to_string(const PlanAction& a);
/// The inverse of to_string for one action (an overlapped pair is two strings joined by `+`).
std::optional<PlanAction> parse_action(const std::string& text);

/// A tensor split over the tensor-parallel ranks: rank t of T owns
/// [t * size / T, (t + 1) * size / T) along `dim` (Megatron-LM's split: attention by heads, the
/// MLP by its hidden size, embedding and head by vocabulary).
struct PlanShard {
    std::string layer; // e.g. "h.3.attn"
    ShardDim dim = ShardDim::none;
    int64_t size = 0; // of the split dimension, unsharded

    bool operator==(const PlanShard&) const = default;
};

/// A layer of routed experts under expert parallelism: its block, and the residual group of
/// the block it sits in (its index among the block's items), which full recomputation runs
/// again inside the backward; -1 outside a group (never run again).
struct PlanExchange {
    int32_t block = 0;
    int32_t group = -1;

    bool operator==(const PlanExchange&) const = default;
};

/// One pipeline stage: a contiguous run of blocks, plus the embeddings on the first stage and
/// the head and loss on the last. Costs are per microbatch on one tensor-parallel shard.
struct PlanStage {
    int32_t index = 0;
    int32_t pp = 0;          // the pipeline rank that runs it
    int32_t first_block = 0; // blocks [first_block, first_block + blocks)
    int32_t blocks = 0;
    bool embedding = false;
    bool head = false;
    int64_t parameters = 0;       // on one tensor-parallel rank
    double flops_forward = 0;     // per microbatch
    double flops_input_grad = 0;  // I
    double flops_weight_grad = 0; // W (B = I + W)
    double bytes_elementwise = 0; // memory traffic of the non-matmul layers in a forward
    int64_t activation_bytes = 0; // saved for backward, per microbatch
    /// What one microbatch holds for a moment beyond what it keeps, as the units run
    /// (actors/plan/stages.cpp): in its forward (above the activations it then keeps), in a
    /// whole backward B and in an input gradient I (above the activations it starts from); what
    /// I leaves for W to use (the inputs and output gradients of the weights' products); and what
    /// W holds above that. Per microbatch on one rank, in bytes.
    int64_t forward_working_bytes = 0;
    int64_t backward_working_bytes = 0;
    int64_t input_working_bytes = 0;
    int64_t weight_stash_bytes = 0;
    int64_t weight_working_bytes = 0;
    int64_t boundary_bytes = 0; // the activation (or its gradient) sent to a neighbour stage
    int32_t tp_reductions = 0;  // tensor-parallel all-reduces in one forward
    int32_t tp_backward_reductions = 0; // the same in one backward (B, or I)
    int64_t tp_reduction_bytes = 0;     // size of each
    /// A vocabulary-split loss's small all-reduces in its forward (row maxima, then sums), and
    /// the bytes of each.
    int32_t tp_loss_reductions = 0;
    int64_t tp_loss_bytes = 0;
    /// Context parallelism: bytes of key/value blocks this rank passes along the ring in one
    /// forward (the backward passes them and their gradients: twice as many), and the seconds-
    /// weighted share of the forward spent in attention, behind which the ring hides.
    int64_t cp_ring_bytes = 0;
    double attention_flops = 0;
    /// Causal flash attention: the FLOPs of its score and value products in one forward and in
    /// one input gradient (parts of flops_forward and flops_input_grad, counted over the whole
    /// T x T square as MFU counts them), and the sequence length T they span. A kernel skips
    /// the tiles above the diagonal: about half of these run.
    double flash_forward = 0, flash_input_grad = 0;
    int64_t flash_sequence = 0;
    /// ZeRO 3 gathers weights a unit (a residual group, or a layer outside one: the
    /// embeddings, the final norm, the head) at a time, as the runtime's units run: the
    /// largest unit's parameters on one tensor-parallel rank, and the stage's unit count.
    int64_t largest_unit_parameters = 0;
    /// ZeRO 2 and 3 hold whole gradients of two units at most, the one computing its weight
    /// gradient and the one being reduce-scattered: the two largest units' parameters.
    int64_t two_largest_units_parameters = 0;
    int32_t units = 1;
    /// Expert parallelism: all-to-alls in one forward (as many in B or I), each rank's bytes in
    /// each; 0 without it.
    int32_t all_to_alls = 0;
    int64_t all_to_all_bytes = 0;
    /// The layers of routed experts that exchange tokens, in model order (empty without ep):
    /// each compute action of the stage is followed by their DISPATCH / COMBINE actions.
    std::vector<PlanExchange> exchange_layers;
    /// The routed experts' parameters among `parameters` (under ep > 1; 0 otherwise): their
    /// state is shared by the dp x cp / ep ranks that hold them.
    int64_t expert_parameters = 0;
    std::vector<int64_t> buckets; // gradient bucket sizes in bytes, in reduction order
    /// The last `expert_buckets` buckets hold routed experts' gradients, reduced over the
    /// dp x cp / ep ranks that hold the same experts (the others over all dp x cp).
    int32_t expert_buckets = 0;
    std::vector<PlanShard> shards; // tensors split over tp (empty when tp = 1)

    /// The bytes of the stage's gradients, the dense ones and the routed experts' (the
    /// buckets' sums).
    std::pair<int64_t, int64_t> gradient_bytes() const {
        int64_t dense = 0, experts = 0;
        for (size_t i = 0; i < buckets.size(); ++i)
            (expert_bucket(static_cast<int64_t>(i)) ? experts : dense) += buckets[i];
        return {dense, experts};
    }
    /// Whether bucket `i` holds routed experts' gradients (one of the last expert_buckets).
    bool expert_bucket(int64_t i) const {
        return expert_buckets > 0 &&
               i >= static_cast<int64_t>(buckets.size()) - static_cast<int64_t>(expert_buckets);
    }

    bool operator==(const PlanStage&) const = default;
};

/// One device: its coordinates in the mesh and what it executes each step.
struct PlanRank {
    int32_t rank = 0; // ((dp * PP + pp) * CP + cp) * TP + tp
    int32_t dp = 0, pp = 0, tp = 0, cp = 0;
    int32_t host = 0;
    std::vector<PlanAction> actions;

    bool operator==(const PlanRank&) const = default;
};

struct Graph {
    std::string file; // the script, for located messages
    ScheduleKind schedule = ScheduleKind::one_f_one_b;
    int32_t dp = 1, tp = 1, pp = 1;
    int32_t cp = 1;   // context-parallel ranks per sequence
    int32_t zero = 0; // ZeRO stage over the dp x cp ranks of a replica
    int32_t ep = 1;   // expert-parallel ranks among the dp x cp ranks
    bool sp = false;  // sequence parallelism over the tp group
    /// Full recomputation: a backward redoes each block's forward, its all-to-alls included.
    bool recompute = false;
    int32_t virtual_stages = 1;
    int32_t microbatches = 1;
    int64_t microbatch_tokens = 0; // tokens of one microbatch on one data-parallel rank
    int32_t bytes_per_element = 4; // activations and gradients (2 in bf16)
    std::vector<PlanStage> stages;
    std::vector<PlanRank> ranks; // indexed by rank
    bool partition_given = false;
    /// When the head shares the embedding's weights (GPT-2) and the first and the last stage sit
    /// on different pipeline ranks, both hold a copy and STEP sums the two copies' gradients
    /// (an all-reduce between the two ranks of each (dp, tp)): these are its bytes; else 0.
    int64_t tied_bytes = 0;

    bool operator==(const Graph&) const = default;

    int32_t num_stages() const { return static_cast<int32_t>(stages.size()); }
    /// The layout puts tp fastest, then cp, so that the two axes that talk inside every layer
    /// share a host; then pp, then dp (whose reduction happens once a step).
    int32_t rank_of(int32_t dp_, int32_t pp_, int32_t tp_, int32_t cp_ = 0) const {
        return ((dp_ * pp + pp_) * cp + cp_) * tp + tp_;
    }
    /// The ranks that exchange tokens with `r` in its all-to-alls: the ep consecutive
    /// (dp, cp) positions of r's (pp, tp) that share r's block of ep.
    std::vector<int32_t> expert_group(const PlanRank& r) const {
        std::vector<int32_t> out;
        const int32_t first = (r.dp * cp + r.cp) / ep * ep;
        for (int32_t q = first; q < first + ep && q < dp * cp; ++q)
            out.push_back(rank_of(q / cp, r.pp, r.tp, q % cp));
        return out;
    }
    /// The ranks that split `r`'s layers between them and all-reduce inside every layer: every
    /// tp position of r's (dp, pp, cp).
    std::vector<int32_t> tensor_group(const PlanRank& r) const {
        std::vector<int32_t> out;
        for (int32_t t = 0; t < tp; ++t) out.push_back(rank_of(r.dp, r.pp, t, r.cp));
        return out;
    }
    /// The ranks that hold the same weights as `r` and reduce their gradients together: every
    /// (dp, cp) with r's (pp, tp). ZeRO shards over them.
    std::vector<int32_t> replica_group(const PlanRank& r) const {
        std::vector<int32_t> out;
        for (int32_t d = 0; d < dp; ++d)
            for (int32_t c = 0; c < cp; ++c) out.push_back(rank_of(d, r.pp, r.tp, c));
        return out;
    }
};

/// The all-to-alls that compute action `a` runs among its expert-parallel group, in order (see
/// ActionKind::dispatch_forward): none for W, nor for a stage without routed experts or ep.
std::vector<PlanAction> exchanges_of(const Graph& g, const PlanAction& a);

/// Lists every compute action's all-to-alls after it (after an overlapped pair, the pair's
/// in its order), as lowering does once the stages and the recomputation are known.
void add_exchanges(Graph& g);

/// The process that runs rank `rank` of `ranks` when a job is `processes` processes (`dist run
/// --procs N`, one per GPU under a launcher): contiguous blocks, sizes differing by at most one.
inline int32_t process_of_rank(int32_t rank, int32_t ranks, int32_t processes) {
    return static_cast<int32_t>(static_cast<int64_t>(rank) * processes / ranks);
}

/// "dp 4, cp 2, tp 4 with sp, pp 2, ZeRO 1": the mesh's axes, cp, sp and ZeRO only when on.
std::string axes_text(const Graph& g);

/// `dist plan`: the ranks, the partition and every rank's actions, wrapped at `width` columns.
std::string print(const Graph& g, int width = 100);

} // namespace dist::plan
