// program.hpp: the checked program, the front end's output type.
//
// Plain, fully evaluated structs: every template call expanded, every default filled in, every
// override applied, every rule of the language checked. Planning, simulation and the runtime
// read only this.
#pragma once

#include "lang/source.hpp"
#include "lang/value.hpp"

#include <array>
#include <compare>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace dist {

enum class LayerKind {
    embedding,
    position_embedding,
    rotary_embedding,
    layer_norm,
    rms_norm,
    attention,
    mlp,
    lm_head,
    cross_entropy,
    moe
};
enum class ShardDim { none, heads, hidden, vocab };
enum class Activation { gelu_tanh, gelu, relu, swiglu };
/// How a mixture of experts' router scores the experts of a token.
enum class RouterScore { softmax, sigmoid };
/// How attention computes its scores: `flash` keeps no T x T matrix (an online softmax over
/// blocks of keys, recomputed in the backward: Dist's kernels, FlashAttention); `materialized`
/// writes the scores and their softmax to memory (before FlashAttention, 2022), which costs
/// their bytes each way and keeps the probabilities for the backward.
enum class AttentionKernel { flash, materialized };
enum class ScheduleKind {
    gpipe,
    one_f_one_b,
    interleaved_1f1b,
    looped_bfs,
    zb_h1,
    zb_h2,
    zbv,
    dualpipev,
    custom
};
enum class Recompute { none, selective, full };
enum class DataFormat { none, text, tokens, synthetic };
enum class LrScheduleKind { constant, cosine, linear };
enum class Precision { f32, bf16 };
/// What a training run does at a step whose loss or gradient norm is not finite.
enum class NonFinitePolicy { stop, skip };

const char* to_string(LayerKind k);
const char* to_string(ShardDim s);
const char* to_string(Activation a);
const char* to_string(RouterScore r);
const char* to_string(AttentionKernel k);
const char* to_string(ScheduleKind k);
const char* to_string(Recompute r);
const char* to_string(DataFormat f);
const char* to_string(LrScheduleKind k);
const char* to_string(Precision p);
const char* to_string(NonFinitePolicy p);

/// One layer with every argument resolved. Fields a kind does not use stay 0.
struct LayerSpec {
    LayerKind kind = LayerKind::layer_norm;
    std::string name; // dotted path, e.g. "h.3.attn" (Hugging Face style)
    ShardDim shard = ShardDim::none;
    int64_t width = 0;    // residual stream width (C)
    int64_t vocab = 0;    // embedding, lm_head, cross_entropy
    int64_t context = 0;  // position / rotary embedding
    int64_t heads = 0;    // attention
    int64_t kv_heads = 0; // attention (grouped-query when < heads)
    int64_t head_dim = 0; // attention
    int64_t hidden = 0;   // mlp; moe: each expert's
    // moe: a routed mixture of experts (each an MLP of `hidden`), `top_k` of them per token,
    // plus `shared_experts` MLPs of `shared_hidden` that every token passes through.
    int64_t experts = 0;
    int64_t top_k = 0;
    int64_t shared_experts = 0;
    int64_t shared_hidden = 0;
    RouterScore router = RouterScore::softmax;
    bool normalize = true; // the top-k scores rescaled to sum to 1
    double capacity = 0.0; // capacity factor: each expert takes capacity x (tokens k / experts)
                           // per microbatch and drops the rest; 0: dropless
    double aux_loss = 0.0; // the load-balancing loss's coefficient
    double eps = 0.0;      // norms
    double theta = 0.0;    // rotary base
    bool bias = false;
    bool tied = false; // lm_head shares the token embedding
    Activation activation = Activation::gelu_tanh;
    AttentionKernel kernel = AttentionKernel::flash; // attention
    int64_t parameters = 0;                          // on one device, unsharded
    lang::SourceLoc loc;
};

/// A layer, or a residual group `x + f(x)` of layers.
struct ModelItemSpec {
    bool residual = false;
    std::string name; // label of a residual group, or ""
    std::vector<LayerSpec> layers;
};

/// One repetition of the model's `repeat` body: the unit that pipeline stages are cut from.
struct BlockSpec {
    std::string name; // e.g. "h.3"
    std::vector<ModelItemSpec> items;
    int64_t parameters = 0;
    int32_t repeat = 0; // which of the model's `repeat`s made it (0: the first)
};

struct ModelSpec {
    std::string template_name; // e.g. "gpt"
    std::string preset;        // e.g. "gpt2_124m", or "" when the template was called directly
    std::vector<std::pair<std::string, lang::Value>> arguments; // every template argument
    std::vector<ModelItemSpec> pre;                             // before the blocks (embeddings)
    std::vector<BlockSpec> blocks;                              // the repeated blocks
    std::vector<ModelItemSpec> post; // after the blocks (final norm, head, loss)
    int64_t vocab = 0;
    int64_t context = 0;
    int64_t width = 0;
    int64_t parameters = 0; // total, unsharded
    /// What one token passes through: every layer but the experts a router does not pick
    /// (equal to `parameters` in a dense model).
    int64_t active_parameters = 0;
    bool has_experts() const {
        for (const BlockSpec& b : blocks)
            for (const ModelItemSpec& it : b.items)
                for (const LayerSpec& l : it.layers)
                    if (l.kind == LayerKind::moe) return true;
        return false;
    }
};

struct LinkSpec {
    double bandwidth = 0.0; // bytes per second, one direction
    double latency = 0.0;   // seconds
};

/// What `dist calibrate` measured on a machine (empty in a datasheet profile). Rates are of
/// Dist's own kernels and transports, alone on an idle machine unless said otherwise.
struct MatmulRate {
    /// "nt": out = in weight^T (a forward); "nn": an input gradient; "tn": a weight gradient.
    std::string kernel;
    int64_t m = 0, n = 0, k = 0; // C (m, n) = op(A) (m, k) op(B) (k, n)
    int32_t threads = 1;
    double flops = 0; // FLOP/s, the weight operand from beyond the core's own caches
    double warm = 0;  // FLOP/s, the weight operand used again (in those caches); 0: not measured
};
struct AttentionRate {
    int64_t seq = 0, head_dim = 0;
    int32_t threads = 1;
    double forward = 0, backward = 0; // FLOP/s of causal attention's score and value matmuls
};
/// An element-wise kernel (layernorm, gelu, cross_entropy, copy, adamw ...) over `elements`.
struct StreamRate {
    std::string op;
    int64_t elements = 0;
    int32_t threads = 1;
    double forward = 0, backward = 0; // elements per second
};
/// `threads` single-threaded workers running at once: each one's speed relative to one alone.
struct SharingPoint {
    int32_t threads = 1;
    double speed = 1;
    /// The bytes each worker's matmul touches (its operands): threads that take turns on a
    /// core refill its cache at every turn, which costs more the larger this is. 0: the
    /// default workers' (sharing_default_bytes).
    double bytes = 0;
};
/// A `sharing` row without `bytes`: workers of a 256 x 256 product of a matrix with itself.
inline constexpr double sharing_default_bytes = 2.0 * 256 * 256 * 4;
/// One message of `bytes` through a transport ("inprocess", "ucx-sm", "ucx-tcp").
struct TransferSample {
    std::string transport;
    int64_t bytes = 0;
    double seconds = 0;
};
/// One collective over `ranks` members (backend "inprocess", "gloo", "nccl").
struct CollectiveSample {
    std::string backend, op; // op: all_reduce, reduce_scatter, all_gather
    int32_t ranks = 0;
    int64_t bytes = 0;
    double seconds = 0;
};
/// The value at `x` of `points` (x, value), sorted by x: linear in log x between the nearest
/// two, the nearest one's outside them. None: 0.
double log_between(const std::vector<std::pair<double, double>>& points, double x);
/// Whole actions against their kernels (buffers, caches, bookkeeping) on ranks of `threads`
/// compute threads: what a forward's blocks, its ends (embeddings, head, loss), a backward's
/// blocks and ends cost per second of their kernels, and a fixed cost per block of a forward
/// and of a backward (seconds) beyond the scales.
struct WholeActions {
    int32_t threads = 0; // 0: the calibration's cores
    std::array<double, 4> scales{1, 1, 1, 1};
    std::array<double, 2> block_overhead_s{0, 0};
    int32_t width = 0;  // the probes' model width; 0: fitted over every width
    int64_t tokens = 0; // the probes' tokens per microbatch (by_width); 0: not said
    /// The first end's (the embeddings') own scales, forward and backward; 0: the ends' (a
    /// profile written before they were timed apart).
    std::array<double, 2> first_end{0, 0};
    int32_t blocks = 0; // the probe's blocks (by_width); 0: not said (a fit over every count)
};
/// A row of `calibration.oversubscribed`: the work factor measured for single-threaded ranks
/// `ranks_per_core` a core at matmuls of `width`, in a pipeline (`tp` 1) or in tensor-parallel
/// groups of `tp` along a pipeline.
struct OversubscribedRow {
    double ranks_per_core = 2, width = 0, work = 1;
    int32_t tp = 1;
    auto operator<=>(const OversubscribedRow&) const = default;
};
/// A row of `calibration.reuse`: what reading a microbatch's saved activations costs beyond
/// the probes' order (where each backward follows its forward), per byte of them, when other
/// microbatches' activations of `distance` bytes were touched on the rank in between, on ranks
/// of `threads` threads; and writing a forward's where the memory it takes was last touched
/// that long ago.
struct ReuseRow {
    int32_t threads = 1;
    double distance = 0;              // bytes
    double forward = 0, backward = 0; // seconds per byte
    auto operator<=>(const ReuseRow&) const = default;
};
/// A row of `calibration.split_backward`: what a backward split into its input gradient (I) and
/// its weight gradient (W), as zero-bubble schedules run it, costs against the same backward
/// whole, on ranks of `threads` threads: I's time over the whole backward's share of it that
/// its kernels say (`input`), and W's the same (`weight`).
struct SplitRow {
    int32_t threads = 1;
    double input = 1, weight = 1;
    auto operator<=>(const SplitRow&) const = default;
};
struct Calibration {
    std::string command, date;
    double took_s = 0; // how long the calibration took (seconds; 0: not said)
    /// What was calibrated: "cpu" (ranks share the cores) or "cuda" (a GPU per rank).
    std::string device = "cpu";
    bool gpu() const { return device == "cuda"; }
    int32_t cores = 0; // the cores a process's ranks share (0: not calibrated)
    /// The cache a core keeps to itself (its L2), bytes (0: not known): a rank whose weights fit
    /// in its cores' caches runs its matmuls at their `warm` rates.
    int64_t cache_bytes = 0;
    /// The OS scheduler's time slice: how long a thread runs before another that waits for its
    /// core has a turn (seconds; 0: not measured, threads on a core share it evenly).
    double slice_s = 0;
    /// How long a thread blocked on a message takes to run once the message is in (seconds;
    /// 0: not measured, at once): the wake-up of its idle core, the hypervisor's on a VM.
    double wake_s = 0;
    /// Seconds more that each step of a Gloo collective takes when other threads fill the
    /// cores: its woken member's wait for a core and its own work slowed (0: not measured; the
    /// model takes half the slice).
    double collective_wait_s = 0;
    /// The standard deviation of one core's pace over a step against the cores' mean (0: not
    /// measured): ranks that each hold a core of their own run at their cores' paces, and the
    /// slowest of them sets a meeting's time.
    double core_spread = 0;
    /// Whole actions against their kernels, for a rank on all the cores.
    WholeActions actions;
    /// The same for ranks of fewer threads (`calibration.fewer_threads`), by thread count.
    std::vector<WholeActions> fewer_threads;
    /// The fits of the probes of one width (`calibration.by_width`), each for one thread
    /// count, token count and count of blocks: small widths cost more beyond their kernels
    /// than one line over all widths says, small microbatches less than large ones, and a
    /// block more in a stage of many blocks than alone (its activations further from the
    /// caches).
    std::vector<WholeActions> by_width;
    /// The fit for a rank of `threads` threads: the measured one of that count, else
    /// interpolated in log threads between the nearest two (the nearest outside them). With
    /// `by_width` fits and a `width` (a stage's matmuls' width), those of each thread count,
    /// width and token count interpolated in log blocks at `blocks` (a stage's; 0: the most
    /// probed), then in log tokens at `tokens` (a microbatch's; 0: the most probed), then in
    /// log width, each between the nearest two (the nearest outside them).
    WholeActions whole_actions(double threads, double width = 0, double tokens = 0,
                               double blocks = 0) const;
    /// Single-threaded ranks beyond the cores (`calibration.oversubscribed`): how much more
    /// their actions cost than alone, by how many such ranks share each core and the width of
    /// their matmuls. Each turn on a core finds other ranks' data in its caches, the more of
    /// them the more so, and the turns come at every action.
    std::vector<OversubscribedRow> oversubscribed; // by ranks per core, then width
    /// The factor for `ranks_per_core` ranks a core at `width`: each count's rows between the
    /// nearest two widths by log width, then between the nearest two counts by log count,
    /// outside them the nearest; 1 without the rows. Ranks in tensor-parallel groups
    /// (`tensor_parallel`) take the rows measured with them where the profile has those; the
    /// others, and a profile without them, the pipelines' rows.
    double oversubscribed_work(double width, double ranks_per_core = 2,
                               bool tensor_parallel = false) const;
    /// Activations that have left the caches by the time they are used (`calibration.reuse`),
    /// by thread count, then distance.
    std::vector<ReuseRow> reuse;
    /// Seconds per byte of a microbatch's activations read by its backward (`backward`), or
    /// written by its forward, at reuse `distance` bytes on a rank of `threads` threads: the
    /// rows of the nearest thread count, linear in distance from none at 0 to the first row,
    /// then linear in log distance between the nearest two, the last one's beyond them; 0
    /// without rows.
    double reuse_cost(double threads, double distance, bool backward) const;
    /// Backwards split into I and W (`calibration.split_backward`), by thread count.
    std::vector<SplitRow> split_backward;
    /// The factors on a split backward's I and W on a rank of `threads` threads: between the
    /// rows of the nearest two thread counts in log threads (the nearest outside them); 1 and
    /// 1 without rows.
    std::pair<double, double> split_factors(double threads) const;
    std::vector<MatmulRate> matmul;
    /// The matmul a run times again to tell whether the machine runs at the calibrated pace
    /// (`calibration.pace`; cli/pace.hpp), its `warm` the rate it ran at beside the whole-action
    /// probes, at the pace they kept: none in a profile written before it was timed so.
    std::optional<MatmulRate> pace;
    std::vector<AttentionRate> attention;
    std::vector<StreamRate> elementwise;
    std::vector<SharingPoint> sharing;
    std::vector<TransferSample> transfers;
    std::vector<CollectiveSample> collectives;
};

/// A device kind and its links, read from stdlib/hardware/NAME.toml.
struct HardwareProfile {
    std::string name;
    std::string description;
    std::string path;
    std::vector<std::string> aliases;
    double peak_flops_f32 = 0.0;
    double peak_flops_bf16 = 0.0;
    int64_t memory_bytes = 0;
    double memory_bandwidth = 0.0; // bytes per second
    int64_t devices_per_host = 0;  // 0: no limit (CPU cores shared by ranks)
    LinkSpec intra_host;
    LinkSpec inter_host;
    /// The fraction of peak that matmuls reach (a published measurement for a datasheet
    /// profile; 0: the simulator's default). `matmul_efficiency_by_width`, when given, is
    /// (width, efficiency) points, the width of a tensor-parallel shard (model width / tp):
    /// larger matmuls run closer to peak.
    double matmul_efficiency = 0.0;
    std::vector<std::pair<double, double>> matmul_efficiency_by_width;
    /// A flash attention kernel's fraction of peak over the score and value products it runs
    /// (0: the matmuls' efficiency), and the query rows of its tiles: a causal mask skips every
    /// tile wholly above the diagonal (0: 128, FlashAttention-2's).
    double attention_efficiency = 0.0;
    int64_t attention_block = 0;
    /// How much slower compute runs while a collective runs beside it on the same device (a
    /// GPU's communication kernels take SMs and memory bandwidth): 0.19 runs it at 1 / 1.19 of
    /// its speed for as long as the device's communication stream is busy. 0: not slowed.
    double overlap_slowdown = 0.0;
    Calibration calibration;

    /// Ranks on this machine's CPU cores: the `cpu` profile, or one `dist calibrate` measured
    /// on a CPU (it has no devices per host).
    bool cpu() const { return name == "cpu" || (calibration.cores > 0 && devices_per_host == 0); }
};

struct MeshSpec {
    std::string device; // the profile name as written in the script
    HardwareProfile profile;
    int64_t dp = 1, tp = 1, pp = 1;
    /// Context parallelism: each sequence split over `cp` ranks (load-balanced causal halves).
    int64_t cp = 1;
    /// ZeRO stage over the dp x cp ranks that hold one replica's weights: 1 shards the AdamW
    /// state, 2 also the gradients, 3 also the weights (FSDP).
    int64_t zero = 0;
    /// Megatron-LM sequence parallelism over the tensor-parallel group (needs tp > 1).
    bool sp = false;
    /// Expert parallelism: a mixture of experts' experts split over `ep` of the dp x cp ranks
    /// (ep divides dp x cp; the device count stays dp x cp x tp x pp).
    int64_t ep = 1;
    int64_t devices = 1; // dp * cp * tp * pp
    int64_t hosts = 1;
    int64_t devices_per_host = 1; // devices / hosts
    int64_t memory_bytes = 0;     // per device: the profile's, or the script's `memory`
    bool memory_given = false;    // the script's `memory`, for every kind
    /// Several kinds of device (`devices: [h100, a100] x [32, 32]`): the kind of each pipeline
    /// rank, first to last; empty when the mesh has one kind (`profile`, which is then also the
    /// first kind).
    std::vector<HardwareProfile> pp_profiles;

    const HardwareProfile& profile_of(int64_t pp) const {
        return pp_profiles.empty() ? profile : pp_profiles[static_cast<size_t>(pp)];
    }
    int64_t memory_of(int64_t pp) const {
        return pp_profiles.empty() || memory_given
                   ? memory_bytes
                   : pp_profiles[static_cast<size_t>(pp)].memory_bytes;
    }
    /// Whether the mesh has more than one kind of device.
    bool mixed() const {
        for (const HardwareProfile& h : pp_profiles)
            if (h.name != profile.name) return true;
        return false;
    }
};

/// One compute action of a custom schedule, `<stage><op><microbatch>`.
struct ActionSpec {
    int64_t stage = 0;
    char op = 'F'; // F, B, I or W
    int64_t microbatch = 0;
    lang::SourceLoc loc;
};

struct ScheduleSpec {
    ScheduleKind kind = ScheduleKind::one_f_one_b;
    int64_t microbatches = 1;
    int64_t virtual_stages = 1;
    Recompute recompute = Recompute::none;
    std::vector<int64_t> partition;               // blocks per stage (pp * virtual_stages entries)
    bool partition_given = false;                 // from the script, not the default even split
    std::vector<std::vector<ActionSpec>> actions; // custom: per pipeline rank
    std::vector<lang::SourceLoc> action_rows;     // custom: where each rank's row is
    std::vector<int64_t> stage_ranks; // custom: the pipeline rank of each stage, from the table
};

struct DataSpec {
    DataFormat format = DataFormat::none;
    std::string path; // resolved against the script's folder
};

struct OptimizerSpec {
    double lr = 3e-4;
    double beta1 = 0.9;
    double beta2 = 0.95;
    double eps = 1e-8;
    double weight_decay = 0.0;
};

struct LrScheduleSpec {
    LrScheduleKind kind = LrScheduleKind::constant;
    int64_t warmup = 0;
    double min_lr = 0.0;
};

struct CheckpointSpec {
    int64_t every = 0; // 0: only at the end, when a folder is given
    std::string dir;
    /// The weights' type in model.safetensors (the optimizer state is f32 whatever it is).
    Precision dtype = Precision::f32;
};

struct EvalSpec {
    int64_t every = 0; // 0: no evaluation
    DataSpec data;
    int64_t batches = 1;
};

struct TrainSpec {
    DataSpec data;
    int64_t batch = 1; // global batch, in sequences
    int64_t steps = 1;
    int64_t stop_after = 0; // 0: run all steps
    int64_t seed = 1337;
    Precision precision = Precision::f32;
    OptimizerSpec optimizer;
    LrScheduleSpec lr_schedule;
    double clip = 0.0; // 0: no clipping
    /// stop: end the run at the first non-finite loss or gradient norm (exit 1); skip: skip that
    /// step's update on every rank and go on. Either way no weight takes the step.
    NonFinitePolicy on_nonfinite = NonFinitePolicy::stop;
    /// Why training cannot honour this program as written, rendered as the checker renders an
    /// error (file:line:col, the source line, a caret, a hint); "" when it can. Planning and
    /// simulation take the program as it is; a training session refuses it with this.
    std::string training_refusal;
    CheckpointSpec checkpoint;
    EvalSpec eval;
    int64_t microbatch_size = 1; // sequences per microbatch on one data-parallel rank
};

struct GenerateSpec {
    double temperature = 1.0;
    int64_t top_k = 0; // 0: the whole vocabulary
    int64_t max_tokens = 256;
};

/// Weight, gradient and optimizer-state bytes of the fullest device: the floor under any plan.
struct MemoryFloor {
    int64_t parameters_per_device = 0;
    int64_t bytes_per_device = 0;
    int64_t bytes_per_parameter = 16;
};

struct Program {
    std::string file;
    ModelSpec model;
    MeshSpec mesh;
    ScheduleSpec schedule;
    TrainSpec train;
    GenerateSpec generate;
    MemoryFloor memory;
};

} // namespace dist
