// stages.cpp: FLOPs, bytes and memory of every layer kind, and the balanced partition.
//
// Counts are per microbatch (b sequences of T tokens) on one tensor- and context-parallel rank,
// which sees N = b T / cp tokens. Matmuls cost 2 FLOPs per multiply-add; an input gradient costs
// what the forward costs, and a weight gradient what the forward's weight matmuls cost (so
// B = I + W is about 2 F). Causal attention under cp's load-balanced split gives every rank the
// same share, 1/cp, of the T x T scores.
//
// Saved activations of a block are what Dist's own units keep, counted layer by layer (the
// input of each, q, k, v and the attention's output, the MLP's products), when its attention is
// flash, as Dist's kernels are. A block whose attention is materialized is Megatron-LM's layer of
// before FlashAttention, and follows Korthikanti et al. 2022 ("Reducing Activation
// Recomputation in Large Transformer Models", section 4), in bytes for 2-byte activations, per
// layer of s tokens, b sequences, width h, a heads, tensor-parallel size t:
//     no parallelism      s b h (34 + 5 a s / h)
//     tensor parallel     s b h (10 + 24 / t + 5 a s / (h t))
//     tensor + sequence   s b h (34 / t + 5 a s / (h t))
//     selective recompute drops the 5 a s / h term (the scores stay on chip and are redone)
//     full recompute      2 s b h (2 s b h / t with sequence parallelism): the block's input
// scaled by the element size over 2 (f32 doubles it). Context parallelism makes s the rank's
// s / cp tokens; their scores span the whole sequence (5 a (s / cp) s b / t). The formula is the
// GPT block's (a 4h GeLU MLP). Embeddings, head and loss are counted layer by layer: the input
// each keeps and the logits.
#include "actors/plan/stages.hpp"
#include "lang/check_layers.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

namespace dist::plan {

void PartCost::add(const PartCost& o) {
    parameters += o.parameters;
    flops_forward += o.flops_forward;
    flops_input_grad += o.flops_input_grad;
    flops_weight_grad += o.flops_weight_grad;
    bytes_elementwise += o.bytes_elementwise;
    activation_bytes += o.activation_bytes;
    tp_reductions += o.tp_reductions;
    tp_backward_reductions += o.tp_backward_reductions;
    tp_loss_reductions += o.tp_loss_reductions;
    tp_loss_bytes = std::max(tp_loss_bytes, o.tp_loss_bytes);
    cp_ring_bytes += o.cp_ring_bytes;
    attention_flops += o.attention_flops;
    flash_forward += o.flash_forward;
    flash_input_grad += o.flash_input_grad;
    all_to_alls += o.all_to_alls;
    all_to_all_bytes = std::max(all_to_all_bytes, o.all_to_all_bytes);
    expert_parameters += o.expert_parameters;
}

double PartCost::seconds(double flops_rate, double bytes_rate) const {
    double f = flops_forward + flops_input_grad + flops_weight_grad;
    return f / flops_rate + 3.0 * bytes_elementwise / bytes_rate;
}

namespace {

int64_t bytes_per_element(const Program& p) {
    return p.train.precision == Precision::bf16 ? 2 : 4;
}

// A layer's vocabulary: the loss's is the head's, the model's.
int64_t vocab_of(const Program& p, const LayerSpec& l) {
    return l.vocab > 0 ? l.vocab : p.model.vocab;
}

// The token copies a rank's experts take per microbatch of `tokens` tokens: capacity pads
// every expert to it; dropless, the busiest rank's share by chance.
double routed_copies(const LayerSpec& l, int64_t ep, double tokens) {
    return tokens * static_cast<double>(l.top_k) *
           (l.capacity > 0 ? l.capacity : expert_rank_imbalance(l, ep, tokens));
}

PartCost cost_of_layer(const Program& p, const LayerSpec& l) {
    PartCost c;
    const double tp = static_cast<double>(p.mesh.tp);
    const double cp = static_cast<double>(p.mesh.cp);
    const double b = static_cast<double>(p.train.microbatch_size);
    const double T = static_cast<double>(p.model.context);
    const double N = b * T / cp;
    // Sequence parallelism runs the norms on the rank's 1/tp of the tokens.
    const double sp = p.mesh.sp ? tp : 1.0;
    const double C = static_cast<double>(l.width ? l.width : p.model.width);
    const double elt = static_cast<double>(bytes_per_element(p));
    const double shard = l.shard == ShardDim::none ? 1.0 : tp;
    c.parameters = static_cast<int64_t>(static_cast<double>(l.parameters) / shard);
    if (l.kind == LayerKind::moe)
        c.parameters = lang::parameters_on_device(l, p.mesh.tp, p.mesh.ep);
    double saved = 0; // elements
    switch (l.kind) {
    case LayerKind::embedding:
    case LayerKind::position_embedding:
        c.bytes_elementwise = N * C * elt;
        // A vocabulary-split table's rows are summed over the group in the forward (under sp,
        // reduce-scattered; the backward then all-gathers the gradient: counted as the pair).
        if (l.kind == LayerKind::embedding && l.shard == ShardDim::vocab && p.mesh.tp > 1)
            c.tp_reductions = 1;
        break;
    case LayerKind::rotary_embedding: c.bytes_elementwise = 2 * N * C * elt; break;
    case LayerKind::layer_norm:
    case LayerKind::rms_norm:
        c.bytes_elementwise = 2 * N * C * elt / sp;
        // Its input and each row's mean and reciprocal deviation (f32; rms norms keep both).
        saved = N * C / sp + 8 * N / sp / elt;
        break;
    case LayerKind::attention: {
        double h = static_cast<double>(l.heads) / tp;
        double kv = std::max(1.0, static_cast<double>(l.kv_heads) / tp);
        double hd = static_cast<double>(l.head_dim);
        double weights = 2 * N * C * (h + 2 * kv) * hd + 2 * N * h * hd * C;
        double scores = 4 * b * T * T * h * hd / cp;
        c.flops_forward = weights + scores;
        c.attention_flops = c.flops_forward;
        // The ring passes every other rank's key and value blocks through this one.
        if (p.mesh.cp > 1) c.cp_ring_bytes = static_cast<int64_t>((cp - 1) * 2 * N * kv * hd * elt);
        // The scores' gradient is two products each way (dq, dk; dp, dv). A flash kernel keeps
        // no probabilities, so its backward first computes q k^T again: five products to the
        // forward's two (Dao 2023, FlashAttention-2, section 3.1.2). A materialized kernel under
        // selective recomputation redoes its whole forward (Korthikanti et al. 2022, section 4).
        const bool materialized = l.kernel == AttentionKernel::materialized;
        c.flops_input_grad = weights + 2 * scores;
        if (!materialized) {
            c.flops_input_grad += scores / 2;
            c.flash_forward = scores;
            c.flash_input_grad = 2.5 * scores;
        }
        if (materialized && p.schedule.recompute == Recompute::selective)
            c.flops_input_grad += scores;
        c.flops_weight_grad = weights;
        // A flash kernel reads q, k and v and writes its output, and keeps no T x T matrix.
        // A materialized one writes the scores, reads them into the softmax, writes the
        // probabilities and reads them into the product with v: four passes over b h T^2
        // elements (the rank's 1 / cp of them); it keeps the probabilities for the backward
        // unless the backward recomputes them (selective or full recomputation).
        c.bytes_elementwise =
            materialized ? 4 * b * h * T * T * elt / cp : 4 * N * (h + 2 * kv) * hd * elt;
        // What the unit keeps (models/units_block.cpp): its input (the rank's shard under sp),
        // q, k, v, the output and each row's log-sum-exp (f32). Under cp, k and v are the ring's:
        // every rank's blocks, the whole sequence; and each causal half keeps its output and
        // log-sum-exp padded to the keys it sees: chunks r and 2 cp - 1 - r of c = T / (2 cp)
        // rows give halves of (r + 1) c and (2 cp - r) c rows, (2 cp + 1) c in all.
        saved = N * C / sp + 2 * N * h * hd;
        if (p.mesh.cp > 1) {
            const double halves = b * T * (2 * cp + 1) / (2 * cp);
            saved += 2 * b * T * kv * hd + halves * h * (hd + 4 / elt);
        } else {
            saved += 2 * N * kv * hd + N * h * 4 / elt;
        }
        if (materialized && p.schedule.recompute == Recompute::none) saved += b * h * T * T / cp;
        c.tp_reductions = c.tp_backward_reductions = p.mesh.tp > 1 ? 1 : 0;
        break;
    }
    case LayerKind::mlp: {
        double hidden = static_cast<double>(l.hidden) / tp;
        double mats = l.activation == Activation::swiglu ? 3 : 2;
        c.flops_forward = 2 * N * C * hidden * mats;
        c.flops_input_grad = c.flops_forward;
        c.flops_weight_grad = c.flops_forward;
        c.bytes_elementwise = 2 * N * hidden * elt;
        // Its input, the first product and the activation's output; in f32, the tanh-approximate
        // GELU also keeps its tanh for the backward.
        saved = N * C / sp + N * hidden * (mats == 3 ? 3 : 2);
        if (l.activation == Activation::gelu_tanh && elt == 4) saved += N * hidden;
        c.tp_reductions = c.tp_backward_reductions = p.mesh.tp > 1 ? 1 : 0;
        break;
    }
    case LayerKind::lm_head: {
        double v = static_cast<double>(l.vocab) / shard;
        c.flops_forward = 2 * N * C * v;
        c.flops_input_grad = c.flops_forward;
        c.flops_weight_grad = c.flops_forward;
        saved = N * C;
        // Split by vocabulary, each rank's input gradient is a partial sum over its columns
        // (models/units_vocab.cpp, HeadUnit::backward_input); under sp the reduce-scatter, and
        // the forward's all-gather counted with it.
        if (l.shard == ShardDim::vocab && p.mesh.tp > 1) c.tp_backward_reductions = 1;
        break;
    }
    case LayerKind::cross_entropy: {
        double v = static_cast<double>(vocab_of(p, l)) / shard;
        c.bytes_elementwise = 3 * N * v * elt;
        // The logits and each row's log-sum-exp (f32).
        saved = N * v + 4 * N / elt;
        // Over logits split by vocabulary, the row maxima (N floats) and then the sums of
        // exponentials with the target logits (2 N) are all-reduced: latency, mostly.
        if (l.shard != ShardDim::none && p.mesh.tp > 1) {
            c.tp_loss_reductions = 2;
            c.tp_loss_bytes = 6 * N;
        }
        break;
    }
    case LayerKind::moe: {
        // Each rank's experts take, on average, the N k token copies its own tokens send out; a
        // capacity factor pads every expert to its capacity. Dropless, the busiest of the ep
        // ranks holds up the others at every all-to-all: it is priced, by the imbalance that
        // routing by chance leaves (a trained router's own skew comes on top).
        const double E = static_cast<double>(l.experts), k = static_cast<double>(l.top_k);
        const double busiest = expert_rank_imbalance(l, p.mesh.ep, N);
        const double copies = routed_copies(l, p.mesh.ep, N);
        const double hidden = static_cast<double>(l.hidden) / shard;
        const double shared = static_cast<double>(l.shared_experts * l.shared_hidden) / shard;
        const double mats = l.activation == Activation::swiglu ? 3 : 2;
        const double router = 2 * N * C * E;
        const double experts = 2 * (copies * hidden + N * shared) * C * mats;
        c.flops_forward = router + experts;
        c.flops_input_grad = c.flops_forward;
        c.flops_weight_grad = c.flops_forward;
        // Scores and their softmax or sigmoid, the tokens permuted to their experts and back,
        // the activation inside each expert.
        c.bytes_elementwise =
            (2 * N * E + 2 * N * k * C + 2 * (copies * hidden + N * shared)) * elt;
        const double kept = mats == 3 ? 3 : 2;
        // The layer's input, the scores, each copy as its expert received it and as it came
        // back (the combine weights' gradient reads the outputs), the experts' activations.
        saved = N * C + N * E + 2 * copies * C + (copies * hidden + N * shared) * kept;
        c.tp_reductions = c.tp_backward_reductions = p.mesh.tp > 1 ? 1 : 0;
        c.expert_parameters = lang::sat_mul(l.experts / p.mesh.ep, lang::expert_parameters(l)) /
                              static_cast<int64_t>(shard);
        if (p.mesh.ep > 1) {
            c.all_to_alls = 2;
            c.all_to_all_bytes = static_cast<int64_t>(N / sp * k * busiest * C * elt);
        }
        break;
    }
    }
    c.activation_bytes = static_cast<int64_t>(saved * elt);
    return c;
}

} // namespace

double expected_max_normal(int64_t n) {
    if (n <= 1) return 0.0;
    // Every lowering of a mixture of experts asks, for a few n: remember them.
    thread_local std::map<int64_t, double> known;
    if (auto it = known.find(n); it != known.end()) return it->second;
    // E[max] = integral of x n phi(x) Phi(x)^(n - 1) dx, by the midpoint rule over [-10, 10].
    const int steps = 4000;
    const double lo = -10.0, dx = 20.0 / steps, pi = 3.14159265358979323846;
    double sum = 0.0;
    for (int i = 0; i < steps; ++i) {
        const double x = lo + (i + 0.5) * dx;
        const double phi = std::exp(-0.5 * x * x) / std::sqrt(2 * pi);
        const double cdf = 0.5 * std::erfc(-x / std::sqrt(2.0));
        sum += x * static_cast<double>(n) * phi * std::pow(cdf, static_cast<double>(n - 1)) * dx;
    }
    known[n] = sum;
    return sum;
}

double busiest_over_mean(int64_t n, double mean, double variance) {
    if (n <= 1 || mean <= 0 || variance <= 0) return 1.0;
    const double m = static_cast<double>(n);
    return 1.0 + expected_max_normal(n) * std::sqrt(m / (m - 1)) * std::sqrt(variance) / mean;
}

double expert_rank_imbalance(const LayerSpec& l, int64_t ep, double tokens) {
    if (ep <= 1 || l.capacity > 0 || l.experts <= l.top_k) return 1.0;
    // The ep ranks' tokens each send top_k copies to distinct experts, E / ep of them on every
    // rank: how many land on one rank is hypergeometric, of mean k / ep and variance
    // k (1 / ep) (1 - 1 / ep) (E - k) / (E - 1). A rank receives from ep ranks' tokens.
    const double E = static_cast<double>(l.experts), k = static_cast<double>(l.top_k);
    const double r = static_cast<double>(ep);
    return busiest_over_mean(ep, tokens * k, tokens * k * (1 - 1 / r) * (E - k) / (E - 1));
}

int64_t block_activation_bytes(const Program& p, const BlockSpec& block) {
    int64_t heads = 0;
    for (const ModelItemSpec& it : block.items)
        for (const LayerSpec& l : it.layers)
            if (l.kind == LayerKind::attention) heads = l.heads;
    bool experts = false;
    for (const ModelItemSpec& it : block.items)
        for (const LayerSpec& l : it.layers) experts |= l.kind == LayerKind::moe;
    // The formula's block has a 4h MLP; a mixture of experts' is counted layer by layer.
    if (heads == 0 || (experts && p.schedule.recompute != Recompute::full))
        return cost_of_items(p, block.items).activation_bytes;
    bool materialized = false;
    for (const ModelItemSpec& it : block.items) {
        for (const LayerSpec& l : it.layers)
            materialized |=
                l.kind == LayerKind::attention && l.kernel == AttentionKernel::materialized;
    }
    if (!materialized) {
        // Dist's own units (flash attention), counted one by one. Without recomputation
        // selective has nothing to drop: a flash kernel keeps no scores. Under full
        // recomputation each residual group keeps only its input (models/units.cpp), the float
        // stream tensor in either precision, the rank's shard under sp; a layer outside a
        // group keeps what it always keeps.
        if (p.schedule.recompute != Recompute::full)
            return cost_of_items(p, block.items).activation_bytes;
        const double N = static_cast<double>(p.train.microbatch_size * p.model.context) /
                         static_cast<double>(p.mesh.cp * (p.mesh.sp ? p.mesh.tp : 1));
        int64_t bytes = 0;
        for (const ModelItemSpec& it : block.items)
            bytes += it.residual ? static_cast<int64_t>(N * static_cast<double>(p.model.width) * 4)
                                 : cost_of_items(p, {it}).activation_bytes;
        return bytes;
    }
    const double t = static_cast<double>(p.mesh.tp);
    const double cp = static_cast<double>(p.mesh.cp);
    const double s_full = static_cast<double>(p.model.context);
    const double s = s_full / cp;
    const double b = static_cast<double>(p.train.microbatch_size);
    const double h = static_cast<double>(p.model.width);
    const double a = static_cast<double>(heads);
    const double scale = static_cast<double>(bytes_per_element(p)) / 2.0;
    const double sbh = s * b * h;
    // Megatron-LM's layer, as Korthikanti et al. count it (its dropout masks included).
    double bytes = 0;
    if (p.schedule.recompute == Recompute::full) {
        bytes = 2 * sbh / (p.mesh.sp ? t : 1.0);
    } else {
        double linear = p.mesh.sp ? 34 / t : 10 + 24 / t;
        // The 5 a s / (h t) of the scores: their softmax, a dropout mask and its output.
        double scores = p.schedule.recompute == Recompute::none ? 5 * a * s_full / (h * t) : 0.0;
        bytes = sbh * (linear + scores);
    }
    return static_cast<int64_t>(bytes * scale);
}

bool tied_elsewhere(const Program& p, const std::vector<int32_t>& stage_rank) {
    if (stage_rank.empty() || stage_rank.front() == stage_rank.back() || p.model.pre.empty())
        return false;
    for (const ModelItemSpec& it : p.model.post)
        for (const LayerSpec& l : it.layers)
            if (l.kind == LayerKind::lm_head && l.tied) return true;
    return false;
}

int64_t tied_gradient_bytes(const Program& p, const std::vector<int32_t>& stage_rank) {
    if (!tied_elsewhere(p, stage_rank)) return 0;
    return cost_of_layer(p, p.model.pre.front().layers.front()).parameters * bytes_per_element(p);
}

namespace {

PartCost pre_cost(const Program& p) {
    return cost_of_items(p, p.model.pre);
}
PartCost post_cost(const Program& p) {
    return cost_of_items(p, p.model.post);
}

PartCost block_cost(const Program& p, size_t i) {
    PartCost c = cost_of_items(p, p.model.blocks[i].items);
    c.activation_bytes = block_activation_bytes(p, p.model.blocks[i]);
    // Full recomputation runs the forward again inside the backward.
    if (p.schedule.recompute == Recompute::full) {
        c.flops_input_grad += c.flops_forward;
        c.flash_input_grad += c.flash_forward;
    }
    return c;
}

double flops_rate(const Program& p, const HardwareProfile& h) {
    double r = p.train.precision == Precision::bf16 ? h.peak_flops_bf16 : h.peak_flops_f32;
    return r > 0 ? r : 1e12;
}

double bytes_rate(const HardwareProfile& h) {
    return h.memory_bandwidth > 0 ? h.memory_bandwidth : 1e11;
}

} // namespace

PartCost cost_of_items(const Program& p, const std::vector<ModelItemSpec>& items) {
    PartCost c;
    for (const ModelItemSpec& it : items)
        for (const LayerSpec& l : it.layers) c.add(cost_of_layer(p, l));
    return c;
}

namespace {

// ----- working memory -------------------------------------------------------------------------
//
// What one layer holds for one microbatch (models/units_*.cpp), in bytes on one rank: what it
// keeps after its forward; what it keeps after its input gradient, until its weight gradient
// (the inputs and output gradients of its products); the most it holds for a moment above what
// it keeps in its forward, its input gradient and its weight gradient; its forward's input,
// where that is not what it keeps; and its output's gradient, which its input gradient reads.
// Gradients and work buffers are float in either precision; a bf16 unit keeps bf16 copies and
// widens them to float while it uses them. Under sp a unit gathers its input and output
// gradient whole for its products.
struct Footprint {
    double kept = 0, after_input = 0, forward = 0, input = 0, weight = 0, in = 0, grad = 0;
};

Footprint footprint(const Program& p, const LayerSpec& l) {
    Footprint f;
    f.kept = static_cast<double>(cost_of_layer(p, l).activation_bytes);
    const double tp = static_cast<double>(p.mesh.tp), cp = static_cast<double>(p.mesh.cp);
    const double n = static_cast<double>(p.train.microbatch_size * p.model.context) / cp;
    const double s = p.mesh.sp ? tp : 1.0;
    const double ns = n / s;
    const double C = static_cast<double>(l.width ? l.width : p.model.width);
    const double E = static_cast<double>(bytes_per_element(p));
    const bool bf16 = E == 2;
    const double wide = bf16 ? 4.0 : 0.0;              // a float copy of what was kept in bf16
    const double copy = bf16 ? E : 0.0;                // a bf16 copy of a float tensor
    const double gathered = s > 1 ? 4.0 : 0.0;         // a whole copy of an sp shard
    const double whole_kept = E * n * C * (1 - 1 / s); // a kept shard replaced by the whole
    const double shard = l.shard == ShardDim::none ? 1.0 : tp;
    // Under sp a row-parallel product's whole partial output and its packed copy stand beside
    // the shard the reduce-scatter leaves, and so do a column-parallel input gradient's.
    const double scattered = s > 1 ? 8 * n * C : 0.0;
    f.in = wide * ns * C; // a float input beside its bf16 copy (in f32 it is what is kept)
    f.grad = 4 * ns * C;
    switch (l.kind) {
    case LayerKind::embedding:
        // Nothing but the tokens; the input gradient keeps every token's output gradient for W.
        f.in = 0;
        f.forward = 4 * ns * C + scattered;
        f.input = gathered * n * C + copy * n * C;
        f.after_input = E * n * C;
        f.weight = wide * n * C;
        break;
    case LayerKind::position_embedding:
        // Positions write into a copy of their input (with a bf16 copy of the table) and pass
        // the output gradient on as it is, keeping it for W: in f32 the tensor the token
        // embedding keeps too.
        f.in = 4 * ns * C;
        f.forward = 4 * ns * C + wide * static_cast<double>(p.model.context) * C;
        f.input = copy * ns * C;
        f.after_input = copy * ns * C;
        f.weight = wide * ns * C;
        break;
    case LayerKind::rotary_embedding: f.in = f.grad = 0; break;
    case LayerKind::layer_norm:
    case LayerKind::rms_norm:
        f.forward = 4 * ns * C;
        // Its input gradient, its input widened, the copy of its output's gradient.
        f.input = 4 * ns * C + wide * ns * C + copy * ns * C;
        f.after_input = f.kept + E * ns * C;
        f.weight = 2 * wide * ns * C;
        break;
    case LayerKind::attention: {
        const double h = static_cast<double>(l.heads) / tp;
        const double kv = std::max(1.0, static_cast<double>(l.kv_heads) / tp);
        const double hd = static_cast<double>(l.head_dim);
        const double q = n * h * hd, qkv = n * (h + 2 * kv) * hd, x = n * C;
        // bf16 products read a float copy of their weights, the fused one the larger.
        const double weights = wide * C * (h + 2 * kv) * hd;
        // The fused product (alive to the end), the output, the input gathered; bf16 keeps
        // copies of q, k, v and the attention's output beside their float selves.
        f.forward = 4 * qkv + 4 * ns * C + gathered * x + wide * (q + qkv) + scattered + weights;
        // At the fused product's input gradient: the attention output's gradient, q, k and v's,
        // the fused one and the input's; the output gradient and input gathered under sp; bf16
        // widens the input, q, k, v and the output, and at the end copies the output gradient.
        // With rotary positions, the rotated gradients of q and k stand beside the others
        // first.
        bool rotary = false;
        for (const ModelItemSpec& it : p.model.pre)
            for (const LayerSpec& x2 : it.layers) rotary |= x2.kind == LayerKind::rotary_embedding;
        const double at_product = 4 * (q + 2 * qkv + x);
        const double at_rope = rotary ? 4 * (q + qkv + q + n * kv * hd + qkv) : 0.0;
        f.input = std::max(at_product, at_rope) + 2 * gathered * x + wide * (x + q + qkv) +
                  copy * x + (s > 1 ? 4 * n * C + 4 * ns * C : 0.0) + weights;
        // Under cp each causal half pads its queries, keys and values (and their gradients) to
        // the keys it sees, up to the whole sequence.
        if (p.mesh.cp > 1) {
            f.forward += 4 * cp * n * hd * (h + 2 * kv);
            f.input += 4 * cp * n * hd * (3 * h + 4 * kv);
        }
        // I drops q, k and v (under cp the ring's keys and values and the padded halves'
        // outputs) and keeps the input whole, the output's gradient and the fused one.
        f.after_input = f.kept + whole_kept + E * x;
        if (p.mesh.cp > 1)
            f.after_input -=
                E * 2 * (cp - 1) * n * kv * hd + n * (2 * cp + 1) / 2 * h * (E * hd + 4);
        f.weight = wide * (x + qkv); // the fused product's gradient and input
        break;
    }
    case LayerKind::mlp: {
        const double hidden = static_cast<double>(l.hidden) / tp;
        const bool glu = l.activation == Activation::swiglu;
        const double fc = n * hidden * (glu ? 2 : 1), g = n * hidden, x = n * C;
        const double tanh = l.activation == Activation::gelu_tanh ? g : 0.0;
        const double th = bf16 ? 0.0 : 4 * tanh;  // kept in f32 only
        const double weights = wide * C * fc / n; // the first product's float weights in bf16
        // f32 keeps the product, the tanh and the activation themselves. bf16 holds all three
        // in float beside the copies of the input and product, then the activation's float
        // beside the output.
        f.forward =
            gathered * x + scattered + weights +
            (bf16 ? std::max(4 * (fc + tanh + g) + E * (x + fc) - f.kept, 4 * g + 4 * ns * C)
                  : 4 * ns * C);
        // First the activation's gradient and its input's together; then, its kept input and
        // tanh gone, the input's gradient beside the fused one and the copies I keeps.
        const double first = 4 * (g + fc) + gathered * x;
        const double then = 4 * fc + 4 * x + (bf16 || s > 1 ? 4 * x : 0.0) + gathered * x +
                            copy * (fc + x) - E * fc - th + (s > 1 ? 4 * n * C + 4 * ns * C : 0.0);
        f.input = std::max(first, then) + weights;
        f.after_input = f.kept - th + whole_kept + E * x;
        f.weight = wide * (x + std::max(g, fc));
        break;
    }
    case LayerKind::lm_head: {
        const double v = static_cast<double>(l.vocab) / shard;
        const double weights = wide * v * C;
        // Its input shard beside the whole it gathers (in f32 without sp, what it keeps).
        f.in = bf16 || s > 1 ? 4 * ns * C : 0.0;
        f.grad = 4 * n * v;
        f.forward = 4 * n * v + (bf16 && s > 1 ? 4 * n * C : 0.0) + weights; // the logits
        f.input = 4 * n * C + gathered * n * C + copy * n * v + weights;
        f.after_input = f.kept + E * n * v; // the logits' gradient, for W
        f.weight = wide * n * (v + C);
        break;
    }
    case LayerKind::cross_entropy: {
        const double v = static_cast<double>(vocab_of(p, l)) / shard;
        f.in = wide * n * v; // bf16's float logits beside their copy
        f.grad = 4 * n;
        f.forward = 4 * n; // the losses
        // The logits' gradient, and in bf16 the logits widened in place of their copy.
        f.input = 4 * n * v + (wide - copy) * n * v;
        f.after_input = 0; // the logits' gradient goes on to the head, which keeps it
        break;
    }
    case LayerKind::moe:
        // Counted coarsely: its gradients as large as what it keeps, all of which W uses.
        f.forward = 4 * ns * C + wide * f.kept / E;
        f.input = 4 * f.kept / E;
        f.after_input = f.kept;
        f.weight = wide * f.kept / E;
        break;
    }
    return f;
}

struct Working {
    double stash = 0, forward = 0, backward = 0, input = 0, weight_stash = 0, weight = 0;
};

// One microbatch through the stage's units as the runtime runs them (models/stage.cpp,
// models/units.cpp): the forward; a whole backward, unit by unit, each unit's input gradient and
// then its weight gradient; and the split one, every input gradient and later every weight
// gradient. A residual group holds its output gradient while its body runs backward; under full
// recomputation it keeps only its input and runs its body again at the start of its backward.
Working stage_working(const Program& p, const std::vector<const ModelItemSpec*>& items, bool first,
                      bool last) {
    const bool recompute = p.schedule.recompute == Recompute::full;
    const double ns = static_cast<double>(p.train.microbatch_size * p.model.context) /
                      static_cast<double>(p.mesh.cp * (p.mesh.sp ? p.mesh.tp : 1));
    const double stream = 4 * ns * static_cast<double>(p.model.width);
    std::vector<std::vector<Footprint>> fp;
    for (const ModelItemSpec* it : items) {
        fp.emplace_back();
        for (const LayerSpec& l : it->layers) fp.back().push_back(footprint(p, l));
    }
    auto again = [&](size_t i) { return recompute && items[i]->residual; };
    Working w;
    double live = 0, peak = 0;
    auto hold = [&](double extra) { peak = std::max(peak, live + extra); };
    // A group's input stays alive for its sum with the body's output: in f32 its first layer
    // keeps it as it is, in bf16 it is one more float beside the body. So does the stage's
    // input, which the runtime holds for the whole forward (the first group's input).
    const double group_input = bytes_per_element(p) == 2 ? stream : 0.0;
    const double stage_input = first ? 0.0 : group_input;
    for (size_t i = 0; i < items.size(); ++i) {
        double body = 0;
        for (size_t k = 0; k < fp[i].size(); ++k) {
            const Footprint& f = fp[i][k];
            const double beside = (i > 0 || k > 0 ? stage_input : 0.0) +
                                  (items[i]->residual && k > 0 && i > 0 ? group_input : 0.0);
            hold(beside + f.in + f.kept + f.forward);
            live += f.kept;
            body += f.kept;
        }
        if (again(i)) live += stream - body;
    }
    w.stash = live;
    w.forward = peak - live;
    // The input gradients of item i (recomputing it first when it must), leaving its layers'
    // after_input and, with `whole`, each weight gradient right after.
    auto backward = [&](bool whole) {
        live = peak = w.stash;
        for (size_t i = items.size(); i-- > 0;) {
            // A group holds its output gradient while its body runs backward; a stage that is
            // not the last holds the gradient it received for its whole backward.
            const double held = (items[i]->residual ? stream : 0.0) +
                                (!last && i + 1 < items.size() ? stream : 0.0);
            if (again(i)) {
                // The kept input becomes the body's first input again: in f32 the tensor its
                // first layer keeps, in bf16 a float that goes once the body has run.
                live -= stream;
                for (size_t k = 0; k < fp[i].size(); ++k) {
                    const Footprint& f = fp[i][k];
                    hold(held + (k > 0 ? group_input : 0.0) + f.in + f.kept + f.forward);
                    live += f.kept;
                }
            }
            // The body's last layer reads the group's output gradient itself.
            for (size_t k = fp[i].size(); k-- > 0;) {
                const Footprint& f = fp[i][k];
                const bool top = items[i]->residual && k + 1 == fp[i].size();
                hold(held + (top ? 0.0 : f.grad) + f.input);
                live += f.after_input - f.kept;
            }
            if (!whole) continue;
            for (const Footprint& f : fp[i]) {
                hold(f.weight);
                live -= f.after_input;
            }
        }
        return peak - w.stash;
    };
    w.backward = backward(true);
    w.input = backward(false);
    w.weight_stash = live;
    peak = live;
    for (const auto& layers : fp) {
        for (const Footprint& f : layers) {
            hold(f.weight);
            live -= f.after_input;
        }
    }
    w.weight = peak - w.weight_stash;
    return w;
}

} // namespace

std::vector<int64_t> balanced_partition(const Program& p, int32_t stages,
                                        const std::vector<int32_t>& stage_rank) {
    const size_t n = p.model.blocks.size();
    const size_t S = static_cast<size_t>(stages);
    // A stage's time on its rank's kind of device: FLOPs and element-wise bytes at its rates.
    std::vector<double> fr(S), br(S);
    for (size_t s = 0; s < S; ++s) {
        const HardwareProfile& h = p.mesh.profile_of(stage_rank.size() == S ? stage_rank[s] : 0);
        fr[s] = flops_rate(p, h);
        br[s] = bytes_rate(h);
    }
    std::vector<double> flops(n + 1, 0.0), bytes(n + 1, 0.0);
    for (size_t i = 0; i < n; ++i) {
        PartCost c = block_cost(p, i);
        flops[i + 1] = flops[i] + c.flops_forward + c.flops_input_grad + c.flops_weight_grad;
        bytes[i + 1] = bytes[i] + c.bytes_elementwise;
    }
    PartCost pre_c = pre_cost(p), post_c = post_cost(p);
    std::vector<double> pre(S), post(S);
    for (size_t s = 0; s < S; ++s) {
        pre[s] = pre_c.seconds(fr[s], br[s]);
        post[s] = post_c.seconds(fr[s], br[s]);
    }
    // Blocks j..i-1 as stage s (0-based), with the embeddings on the first and the head last:
    // PartCost::seconds over the sums.
    auto span = [&](size_t s, size_t j, size_t i) {
        double t = (flops[i] - flops[j]) / fr[s] + 3.0 * (bytes[i] - bytes[j]) / br[s];
        if (s == 0) t += pre[s];
        if (s + 1 == S) t += post[s];
        return t;
    };
    const double inf = std::numeric_limits<double>::infinity();
    // best[s][i]: the slowest stage when stages 0..s-1 hold blocks 0..i-1.
    std::vector<std::vector<double>> best(S + 1, std::vector<double>(n + 1, inf));
    std::vector<std::vector<size_t>> cut(S + 1, std::vector<size_t>(n + 1, 0));
    best[0][0] = 0.0;
    for (size_t s = 1; s <= S; ++s) {
        for (size_t i = s; i + (S - s) <= n; ++i) {
            for (size_t j = s - 1; j < i; ++j) {
                if (best[s - 1][j] == inf) continue;
                double c = span(s - 1, j, i);
                double worst = std::max(best[s - 1][j], c);
                // Strictly better only: ties keep the earlier cut, so extra blocks go later.
                if (worst < best[s][i] * (1 - 1e-12)) {
                    best[s][i] = worst;
                    cut[s][i] = j;
                }
            }
        }
    }
    std::vector<int64_t> out(S, 0);
    size_t i = n;
    for (size_t s = S; s >= 1; --s) {
        out[s - 1] = static_cast<int64_t>(i - cut[s][i]);
        i = cut[s][i];
    }
    return out;
}

std::vector<PlanStage> build_stages(const Program& p, const std::vector<int64_t>& partition,
                                    const std::vector<int32_t>& stage_rank) {
    std::vector<PlanStage> out;
    const int64_t elt = bytes_per_element(p);
    // A rank's tokens of a microbatch: its 1/cp of each sequence, and 1/tp of that between
    // stages under sequence parallelism (Megatron-LM sends the sequence shard).
    const int64_t N =
        p.train.microbatch_size * p.model.context / p.mesh.cp / (p.mesh.sp ? p.mesh.tp : 1);
    const int64_t bucket_cap = 25 << 20; // PyTorch DDP's default bucket_cap_mb
    int32_t first = 0;
    for (size_t s = 0; s < partition.size(); ++s) {
        PlanStage st;
        st.index = static_cast<int32_t>(s);
        st.pp = stage_rank[s];
        st.first_block = first;
        st.blocks = static_cast<int32_t>(partition[s]);
        st.embedding = s == 0;
        st.head = s + 1 == partition.size();
        PartCost c;
        // The runtime's units (models/stage.cpp), which ZeRO 3 gathers and ZeRO 2 and 3
        // reduce one at a time: each residual group, and each layer outside one (the
        // embeddings, the final norm, the head, which reads a tied embedding's copy).
        st.units = 0;
        int64_t second = 0; // the second largest unit
        auto unit = [&st, &second](int64_t parameters) {
            ++st.units;
            second = std::max(second, std::min(st.largest_unit_parameters, parameters));
            st.largest_unit_parameters = std::max(st.largest_unit_parameters, parameters);
            st.two_largest_units_parameters = st.largest_unit_parameters + second;
        };
        const bool copy = st.head && tied_elsewhere(p, stage_rank);
        auto units_of = [&](const std::vector<ModelItemSpec>& items) {
            for (const ModelItemSpec& it : items) {
                int64_t group = 0;
                for (const LayerSpec& l : it.layers) {
                    int64_t n = cost_of_layer(p, l).parameters;
                    if (copy && l.kind == LayerKind::lm_head && l.tied)
                        n += cost_of_layer(p, p.model.pre.front().layers.front()).parameters;
                    if (it.residual)
                        group += n;
                    else
                        unit(n);
                }
                if (it.residual) unit(group);
            }
        };
        if (st.embedding) {
            c.add(pre_cost(p));
            units_of(p.model.pre);
        }
        for (int32_t k = 0; k < st.blocks; ++k) {
            PartCost b = block_cost(p, static_cast<size_t>(first + k));
            c.add(b);
            units_of(p.model.blocks[static_cast<size_t>(first + k)].items);
        }
        if (st.head) {
            c.add(post_cost(p));
            units_of(p.model.post);
        }
        auto shard_items = [&](const std::vector<ModelItemSpec>& items) {
            if (p.mesh.tp <= 1) return;
            for (const ModelItemSpec& it : items) {
                for (const LayerSpec& l : it.layers) {
                    int64_t size = l.shard == ShardDim::heads    ? l.heads
                                   : l.shard == ShardDim::hidden ? l.hidden
                                   : l.shard == ShardDim::vocab  ? l.vocab
                                                                 : 0;
                    if (size > 0) st.shards.push_back({l.name, l.shard, size});
                }
            }
        };
        if (st.embedding) shard_items(p.model.pre);
        for (int32_t k = 0; k < st.blocks; ++k)
            shard_items(p.model.blocks[static_cast<size_t>(first + k)].items);
        if (st.head) {
            shard_items(p.model.post);
            // A tied head on another rank than the embedding keeps its own copy of it.
            if (tied_elsewhere(p, stage_rank))
                c.parameters += cost_of_layer(p, p.model.pre.front().layers.front()).parameters;
        }
        first += st.blocks;
        st.parameters = c.parameters;
        st.flops_forward = c.flops_forward;
        st.flops_input_grad = c.flops_input_grad;
        st.flops_weight_grad = c.flops_weight_grad;
        st.bytes_elementwise = c.bytes_elementwise;
        st.activation_bytes = c.activation_bytes;
        std::vector<const ModelItemSpec*> items;
        if (st.embedding)
            for (const ModelItemSpec& it : p.model.pre) items.push_back(&it);
        for (int32_t k = 0; k < st.blocks; ++k)
            for (const ModelItemSpec& it :
                 p.model.blocks[static_cast<size_t>(st.first_block + k)].items)
                items.push_back(&it);
        if (st.head)
            for (const ModelItemSpec& it : p.model.post) items.push_back(&it);
        // A materialized block keeps what Korthikanti et al. count rather than what the walk
        // counts layer by layer; its working memory is the walk's all the same.
        const Working work = stage_working(p, items, st.embedding, st.head);
        const double kept_by_formula = static_cast<double>(c.activation_bytes) - work.stash;
        st.forward_working_bytes = static_cast<int64_t>(std::max(0.0, work.forward));
        st.backward_working_bytes = static_cast<int64_t>(std::max(0.0, work.backward));
        st.input_working_bytes = static_cast<int64_t>(std::max(0.0, work.input));
        st.weight_stash_bytes =
            static_cast<int64_t>(std::max(0.0, work.weight_stash + kept_by_formula));
        st.weight_working_bytes = static_cast<int64_t>(std::max(0.0, work.weight));
        st.cp_ring_bytes = c.cp_ring_bytes;
        st.all_to_alls = c.all_to_alls;
        st.all_to_all_bytes = c.all_to_all_bytes;
        for (int32_t k = 0; k < st.blocks && p.mesh.ep > 1; ++k) {
            const auto& parts = p.model.blocks[static_cast<size_t>(st.first_block + k)].items;
            for (size_t i = 0; i < parts.size(); ++i)
                for (const LayerSpec& l : parts[i].layers)
                    if (l.kind == LayerKind::moe)
                        st.exchange_layers.push_back(
                            {st.first_block + k, parts[i].residual ? static_cast<int32_t>(i) : -1});
        }
        st.expert_parameters = p.mesh.ep > 1 ? c.expert_parameters : 0;
        st.attention_flops = c.attention_flops;
        st.flash_forward = c.flash_forward;
        st.flash_input_grad = c.flash_input_grad;
        st.flash_sequence = c.flash_forward > 0 ? p.model.context : 0;
        st.boundary_bytes = N * p.model.width * elt;
        st.tp_reductions = c.tp_reductions;
        st.tp_backward_reductions = c.tp_backward_reductions;
        st.tp_loss_reductions = c.tp_loss_reductions;
        st.tp_loss_bytes = static_cast<int64_t>(c.tp_loss_bytes);
        // With sequence parallelism each all-reduce is a reduce-scatter and an all-gather of
        // the same total volume: priced as the all-reduce it replaces.
        st.tp_reduction_bytes =
            p.mesh.tp > 1 ? N * (p.mesh.sp ? p.mesh.tp : 1) * p.model.width * elt : 0;
        // Gradients are reduced in the precision they are kept in (that of the weights).
        // Under expert parallelism the routed experts' gradients go in buckets of their own,
        // reduced over the dp x cp / ep ranks holding the same experts (none when that is one).
        const int64_t replicas = p.mesh.dp * p.mesh.cp;
        const int64_t expert_bytes = p.mesh.ep > 1 ? c.expert_parameters * elt : 0;
        int64_t grad_bytes = st.parameters * elt - expert_bytes;
        if (replicas > 1) {
            for (int64_t left = grad_bytes; left > 0; left -= bucket_cap)
                st.buckets.push_back(std::min(left, bucket_cap));
        }
        if (replicas / p.mesh.ep > 1) {
            for (int64_t left = expert_bytes; left > 0; left -= bucket_cap) {
                st.buckets.push_back(std::min(left, bucket_cap));
                ++st.expert_buckets;
            }
        }
        out.push_back(std::move(st));
    }
    return out;
}

namespace {

void layer_kernels(const Program& p, const LayerSpec& l, std::vector<KernelCall>& out) {
    using K = KernelCall::Kind;
    const int64_t tp = p.mesh.tp, cp = p.mesh.cp;
    const int64_t b = p.train.microbatch_size, T = p.model.context;
    const int64_t N = b * T / cp;
    const int64_t sp = p.mesh.sp ? tp : 1;
    const int64_t C = l.width ? l.width : p.model.width;
    const int64_t shard = l.shard == ShardDim::none ? 1 : tp;
    auto matmul = [&](int64_t in, int64_t outf) {
        KernelCall m{K::matmul, "", N, outf, in};
        m.bias = l.bias;
        out.push_back(m);
    };
    auto elementwise = [&](const char* op, int64_t elements, bool kept = false) {
        KernelCall e{K::elementwise, op, elements};
        e.kept = kept;
        out.push_back(e);
    };
    switch (l.kind) {
    case LayerKind::embedding:
    case LayerKind::position_embedding: elementwise("embedding", N * C / sp); break;
    case LayerKind::rotary_embedding: break; // applied inside attention, below
    case LayerKind::layer_norm: elementwise("layernorm", N * C / sp, true); break;
    case LayerKind::rms_norm: elementwise("rmsnorm", N * C / sp, true); break;
    case LayerKind::attention: {
        const int64_t h = std::max<int64_t>(1, l.heads / tp);
        const int64_t kv = std::max<int64_t>(1, l.kv_heads / tp);
        const int64_t hd = l.head_dim;
        matmul(C, (h + 2 * kv) * hd);
        // q, k, v split out of the fused product, and kept
        elementwise("copy", N * (h + 2 * kv) * hd, true);
        bool rotary = false;
        for (const ModelItemSpec& it : p.model.pre)
            for (const LayerSpec& x : it.layers) rotary |= x.kind == LayerKind::rotary_embedding;
        if (rotary) elementwise("rope", N * (h + kv) * hd);
        KernelCall a{K::attention, "", b, T, hd};
        a.heads = h;
        a.share = 1.0 / static_cast<double>(cp);
        out.push_back(a);
        // A materialized kernel's four passes over the scores: two copies' worth.
        if (l.kernel == AttentionKernel::materialized) elementwise("copy", 2 * b * h * T * T / cp);
        matmul(h * hd, C);
        break;
    }
    case LayerKind::mlp: {
        const int64_t hidden = l.hidden / tp;
        const bool glu = l.activation == Activation::swiglu;
        matmul(C, glu ? 2 * hidden : hidden);
        elementwise(glu ? "swiglu" : "gelu", N * hidden, true);
        matmul(hidden, C);
        break;
    }
    case LayerKind::lm_head: matmul(C, l.vocab / shard); break;
    case LayerKind::cross_entropy:
        elementwise("cross_entropy", N * vocab_of(p, l) / shard, true);
        break;
    case LayerKind::moe: {
        // The router; each admitted copy's token row copied out (the dispatch, a loop of the
        // host's); each of the rank's experts with its share of the copies (balanced routing)
        // copied in, through the MLP, and copied back; the weighted sum of each token's copies
        // (the combine, another loop); then the shared experts.
        const auto copies =
            static_cast<int64_t>(routed_copies(l, p.mesh.ep, static_cast<double>(N)));
        const int64_t hidden = l.hidden / shard;
        const bool glu = l.activation == Activation::swiglu;
        const int64_t local = std::max<int64_t>(1, l.experts / p.mesh.ep);
        const int64_t rows = (copies + local - 1) / local;
        auto serial = [&](int64_t elements) {
            KernelCall c{K::elementwise, "copy", elements};
            c.serial = true;
            out.push_back(c);
        };
        out.push_back({K::matmul, "", N, l.experts, C});
        serial(N * l.top_k * C);
        for (int64_t e = 0; e < local; ++e) {
            serial(rows * C);
            out.push_back({K::matmul, "", rows, glu ? 2 * hidden : hidden, C});
            elementwise(glu ? "swiglu" : "gelu", rows * hidden);
            out.push_back({K::matmul, "", rows, C, hidden});
            serial(rows * C);
        }
        serial(N * l.top_k * C);
        if (l.shared_experts > 0) {
            const int64_t sh = l.shared_experts * l.shared_hidden / shard;
            matmul(C, glu ? 2 * sh : sh);
            elementwise(glu ? "swiglu" : "gelu", N * sh);
            matmul(sh, C);
        }
        break;
    }
    }
}

void items_kernels(const Program& p, const std::vector<ModelItemSpec>& items,
                   std::vector<KernelCall>& out) {
    for (const ModelItemSpec& it : items) {
        for (const LayerSpec& l : it.layers) layer_kernels(p, l, out);
        // x + f(x): one pass over the residual stream each way.
        if (it.residual) {
            const int64_t N =
                p.train.microbatch_size * p.model.context / p.mesh.cp / (p.mesh.sp ? p.mesh.tp : 1);
            KernelCall add{KernelCall::Kind::elementwise, "copy", N * p.model.width};
            add.residual = true;
            out.push_back(add);
        }
    }
}

} // namespace

std::vector<KernelCall> stage_kernels(const Program& p, const PlanStage& stage) {
    std::vector<KernelCall> out;
    if (stage.embedding) items_kernels(p, p.model.pre, out);
    for (int32_t k = 0; k < stage.blocks; ++k)
        items_kernels(p, p.model.blocks[static_cast<size_t>(stage.first_block + k)].items, out);
    if (stage.head) items_kernels(p, p.model.post, out);
    return out;
}

} // namespace dist::plan
