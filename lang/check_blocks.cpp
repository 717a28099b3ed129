// check_blocks.cpp: the rules that tie the blocks to the model (tensor-parallel divisibility,
// batch divisibility, the memory floor) and the entry point that runs every block check.
#include "lang/check_blocks.hpp"
#include "lang/check_layers.hpp"

#include <cstdio>
#include <numeric>
#include <set>

namespace fs = std::filesystem;

namespace dist::lang {

const std::vector<std::string> schedule_kinds = {"gpipe",      "1f1b",      "interleaved_1f1b",
                                                 "looped_bfs", "zb_h1",     "zb_h2",
                                                 "zbv",        "dualpipev", "custom"};

std::string divisors_hint(int64_t n, int64_t limit) {
    std::vector<std::string> ds;
    for (int64_t d = 1; d <= n && d <= limit; ++d)
        if (n % d == 0) ds.push_back(std::to_string(d));
    return join_names(ds, " or ");
}

void BlockChecker::cross() {
    const MeshSpec& m = p.mesh;
    if (m.tp > 1) {
        // Every sharded size must split evenly; report each size that does not, once.
        struct Need {
            int64_t n;
            const LayerSpec* layer;
            const char* what;
        };
        std::vector<Need> needs;
        auto visit = [&](const LayerSpec& l) {
            switch (l.shard) {
            case ShardDim::heads:
                needs.push_back({l.heads, &l, "attention heads"});
                needs.push_back({l.kv_heads, &l, "key/value heads"});
                break;
            case ShardDim::hidden:
                needs.push_back({l.hidden, &l, "hidden size"});
                if (l.kind == LayerKind::moe && l.shared_experts > 0)
                    needs.push_back({l.shared_hidden, &l, "shared experts' hidden size"});
                break;
            case ShardDim::vocab: needs.push_back({l.vocab, &l, "vocabulary"}); break;
            case ShardDim::none: break;
            }
        };
        for (const auto& it : p.model.pre)
            for (const auto& l : it.layers) visit(l);
        for (size_t b = 0; b < p.model.blocks.size(); ++b)
            if (b == 0 || p.model.blocks[b].repeat != p.model.blocks[b - 1].repeat)
                for (const auto& it : p.model.blocks[b].items)
                    for (const auto& l : it.layers) visit(l);
        for (const auto& it : p.model.post)
            for (const auto& l : it.layers) visit(l);
        int64_t g = 0;
        for (const auto& n : needs) g = std::gcd(g, n.n);
        // One error for the one cause, naming every size that does not split.
        std::set<std::string> said;
        std::vector<std::string> parts;
        bool vocab = false;
        int64_t vocab_size = 0;
        for (const auto& n : needs) {
            if (n.n % m.tp == 0) continue;
            if (!said.insert(std::string(n.what) + std::to_string(n.n)).second) continue;
            if (std::string(n.what) == "key/value heads" && n.layer->kv_heads == n.layer->heads)
                continue;
            parts.push_back(std::string(n.what) + " " + std::to_string(n.n) + " (`" +
                            n.layer->name + "`)");
            if (std::string(n.what) == "vocabulary") {
                vocab = true;
                vocab_size = n.n;
            }
        }
        if (!parts.empty()) {
            std::string list;
            for (size_t i = 0; i < parts.size(); ++i)
                list += (i == 0 ? "" : i + 1 == parts.size() ? " and " : ", ") + parts[i];
            std::string hint = "tp must divide every size it splits: use tp = " + divisors_hint(g);
            if (vocab) {
                int64_t step = std::lcm<int64_t>(m.tp, 128);
                hint += "; or pad the vocabulary to " +
                        std::to_string(((vocab_size + step - 1) / step) * step);
            }
            diags.error(tp_loc, "tp = " + std::to_string(m.tp) + " does not divide the " + list,
                        hint);
            ok = false;
        }
    }
    const int64_t T = p.model.context;
    if (m.cp > 1 && T % (2 * m.cp) != 0) {
        std::vector<std::string> fits;
        for (int64_t c = 2; c <= 64 && c <= T / 2; ++c)
            if (T % (2 * c) == 0) fits.push_back(std::to_string(c));
        diags.error(cp_loc,
                    "cp = " + std::to_string(m.cp) + " cannot split the context of " +
                        std::to_string(T) + " tokens into 2 x " + std::to_string(m.cp) +
                        " equal chunks (rank i takes chunks i and " + std::to_string(2 * m.cp - 1) +
                        " - i, so that causal attention gives "
                        "every rank the same work)",
                    fits.empty() ? "the context is too short to split"
                                 : "use cp = " + join_names(fits, " or "));
        ok = false;
    } else if (m.sp && m.tp > 1 && (T / m.cp) % m.tp != 0) {
        diags.error(sp_loc,
                    "sequence parallelism splits each rank's " + std::to_string(T / m.cp) +
                        " tokens over tp = " + std::to_string(m.tp) +
                        ", which does not divide "
                        "them",
                    "use a tp that divides " + std::to_string(T / m.cp));
        ok = false;
    }
    int64_t split = sat_mul(m.dp, p.schedule.microbatches);
    if (p.train.batch % split != 0) {
        int64_t up = ((p.train.batch + split - 1) / split) * split;
        diags.error(batch_loc,
                    "global batch " + std::to_string(p.train.batch) +
                        " is not divisible by dp x microbatches = " + std::to_string(m.dp) + " x " +
                        std::to_string(p.schedule.microbatches) + " = " + std::to_string(split),
                    "use a batch of " + std::to_string(up) + " (or " +
                        std::to_string(split * 2 > up ? split * 2 : up + split) + ")");
        ok = false;
    } else {
        p.train.microbatch_size = p.train.batch / split;
    }
    memory_floor();
}

void BlockChecker::experts() {
    const MeshSpec& m = p.mesh;
    std::vector<const LayerSpec*> moes;
    for (const BlockSpec& b : p.model.blocks)
        for (const ModelItemSpec& it : b.items)
            for (const LayerSpec& l : it.layers)
                if (l.kind == LayerKind::moe) moes.push_back(&l);
    if (m.ep == 1) return;
    if (moes.empty()) {
        diags.error(ep_loc,
                    "ep = " + std::to_string(m.ep) +
                        " splits a mixture of experts' experts, and the model has none",
                    "drop `ep`, or use a model with `moe` layers (std/moe.dist)");
        ok = false;
        return;
    }
    const int64_t replicas = m.dp * m.cp;
    if (replicas % m.ep != 0) {
        diags.error(ep_loc,
                    "ep = " + std::to_string(m.ep) + " does not divide the " +
                        std::to_string(replicas) + " data-parallel ranks (dp x cp)" +
                        ": each expert group is ep of a replica's ranks, so ep divides dp x cp",
                    "use ep = " + divisors_hint(replicas) + ", or raise dp");
        ok = false;
    }
    for (const LayerSpec* l : moes) {
        if (l->experts % m.ep == 0) continue;
        diags.error(ep_loc,
                    "ep = " + std::to_string(m.ep) + " does not divide the " +
                        std::to_string(l->experts) + " experts of `" + l->name + "`",
                    "use ep = " + divisors_hint(std::gcd(l->experts, replicas)));
        ok = false;
        break;
    }
}

void BlockChecker::memory_floor() {
    const MeshSpec& m = p.mesh;
    const ScheduleSpec& s = p.schedule;
    int64_t stages = static_cast<int64_t>(s.partition.size());
    if (stages == 0) return;
    bool v_shape = s.kind == ScheduleKind::zbv || s.kind == ScheduleKind::dualpipev;
    auto rank_of = [&](int64_t stage) {
        if (!s.stage_ranks.empty()) return s.stage_ranks[static_cast<size_t>(stage)];
        if (v_shape) return stage < m.pp ? stage : 2 * m.pp - 1 - stage;
        return stage % m.pp;
    };
    auto on_device = [&](const LayerSpec& l) { return parameters_on_device(l, m.tp, m.ep); };
    // Under ep the routed experts' state is shared among their dp x cp / ep holders only.
    auto experts_on_device = [&](const LayerSpec& l) -> int64_t {
        if (l.kind != LayerKind::moe || m.ep <= 1) return 0;
        return sat_mul(l.experts / m.ep, expert_parameters(l)) /
               (l.shard == ShardDim::none ? 1 : m.tp);
    };
    std::vector<int64_t> per_rank(static_cast<size_t>(m.pp), 0);
    std::vector<int64_t> experts_per_rank(static_cast<size_t>(m.pp), 0);
    auto add_layer = [&](int64_t stage, const LayerSpec& l) {
        const auto r = static_cast<size_t>(rank_of(stage));
        per_rank[r] = sat_add(per_rank[r], on_device(l));
        experts_per_rank[r] = sat_add(experts_per_rank[r], experts_on_device(l));
    };
    const LayerSpec* embedding = &p.model.pre.front().layers.front();
    for (const auto& it : p.model.pre)
        for (const auto& l : it.layers) add_layer(0, l);
    int64_t block = 0;
    for (int64_t st = 0; st < stages; ++st) {
        for (int64_t k = 0; k < s.partition[static_cast<size_t>(st)]; ++k, ++block) {
            for (const auto& it : p.model.blocks[static_cast<size_t>(block)].items)
                for (const auto& l : it.layers) add_layer(st, l);
        }
    }
    for (const auto& it : p.model.post) {
        for (const auto& l : it.layers) {
            add_layer(stages - 1, l);
            // A tied head on another rank keeps its own copy of the embedding.
            if (l.kind == LayerKind::lm_head && l.tied && rank_of(stages - 1) != rank_of(0))
                add_layer(stages - 1, *embedding);
        }
    }
    int64_t worst = *std::max_element(per_rank.begin(), per_rank.end());
    p.memory.parameters_per_device = worst;
    // ZeRO's (2 + 2 + K) psi / N_d with what the runtime holds per parameter: 4 + 4 + 8 in
    // either precision (bf16 computes with its f32 master weights cast where they are used and
    // keeps f32 gradients, docs/training.md), each divided over the N_d = dp x cp ranks of a
    // replica from stage 3, 2 and 1 on (a routed expert's over its N_d / ep holders).
    const double nd = static_cast<double>(m.dp * m.cp);
    const double w = 4.0;
    const double k = static_cast<double>(p.memory.bytes_per_parameter) - 2 * w;
    auto per_param = [&](double n) {
        return w / (m.zero >= 3 ? n : 1.0) + w / (m.zero >= 2 ? n : 1.0) +
               k / (m.zero >= 1 ? n : 1.0);
    };
    const double holders = std::max(1.0, nd / static_cast<double>(std::max<int64_t>(1, m.ep)));
    auto bytes_of = [&](int64_t params, int64_t experts) {
        double b = static_cast<double>(params - experts) * per_param(nd) +
                   static_cast<double>(experts) * per_param(holders);
        return b >= 9.2e18 ? INT64_MAX : static_cast<int64_t>(b);
    };
    auto bytes_of_rank = [&](size_t i) { return bytes_of(per_rank[i], experts_per_rank[i]); };
    p.memory.bytes_per_device = 0;
    for (size_t i = 0; i < per_rank.size(); ++i)
        p.memory.bytes_per_device = std::max(p.memory.bytes_per_device, bytes_of_rank(i));
    std::string zero_note = m.zero > 0 && nd > 1 ? " (ZeRO " + std::to_string(m.zero) + " over " +
                                                       std::to_string(m.dp * m.cp) + " ranks)"
                                                 : "";
    // Each pipeline rank against its own kind's memory (one kind: the fullest against it).
    int64_t over = -1;
    for (size_t i = 0; i < per_rank.size() && over < 0; ++i)
        if (bytes_of_rank(i) > m.memory_of(static_cast<int64_t>(i))) over = static_cast<int64_t>(i);
    if (m.pp_profiles.empty() && p.memory.bytes_per_device <= m.memory_bytes) over = -1;
    if (over >= 0) {
        if (!m.pp_profiles.empty()) worst = per_rank[static_cast<size_t>(over)];
        char params[64];
        double n = static_cast<double>(worst);
        if (n >= 1e9)
            std::snprintf(params, sizeof params, "%.2fB", n / 1e9);
        else
            std::snprintf(params, sizeof params, "%.2fM", n / 1e6);
        diags.error(devices_loc,
                    "the model does not fit: the fullest device holds " + std::string(params) +
                        " parameters, " + format_bytes(p.memory.bytes_per_device) +
                        " of weights, gradients and AdamW state" + zero_note + ", but one " +
                        m.profile_of(over).name + " has " + format_bytes(m.memory_of(over)),
                    m.zero < 3 && nd > 1
                        ? "shard the replica's state over its " + std::to_string(m.dp * m.cp) +
                              " data-parallel ranks (`zero: 3` in mesh), raise tp or pp, or "
                              "pick a device with more memory"
                        : "raise tp or pp to spread the model, or pick a device with more "
                          "memory");
        ok = false;
        return;
    }
    // Devices without a host limit (CPU cores) share one machine's memory: all ranks together
    // must fit in it.
    if (m.profile.devices_per_host == 0) {
        int64_t bytes = 0;
        for (size_t i = 0; i < per_rank.size(); ++i) bytes = sat_add(bytes, bytes_of_rank(i));
        bytes = sat_mul(sat_mul(bytes, m.tp), sat_mul(m.dp, m.cp));
        if (bytes > m.memory_bytes) {
            diags.error(devices_loc,
                        "the model does not fit: the " + std::to_string(m.devices) +
                            " ranks of this " + m.profile.name + " mesh share " +
                            format_bytes(m.memory_bytes) + " and together need " +
                            format_bytes(bytes) + " for weights, gradients and AdamW state",
                        "use fewer data-parallel replicas, a smaller model, or more memory "
                        "(`memory: 64 GiB` in mesh)");
            ok = false;
        }
    }
}

bool check_blocks(const BlockSet& blocks, const Definitions& defs, const fs::path& script_dir,
                  const FrontendOptions& options, SourceManager& sources, Diagnostics& diags,
                  Program& program) {
    BlockChecker c(defs, script_dir, options, sources, diags, program, blocks.file,
                   blocks.model_ok);
    c.unknown_block = blocks.unknown_block;
    c.hardware = blocks.hardware;
    c.mesh(blocks.mesh);
    if (!c.ok) {
        // Later rules need a valid mesh; still read the other blocks for their own errors.
        program.mesh.pp = std::max<int64_t>(program.mesh.pp, 1);
    }
    bool mesh_ok = c.ok;
    c.schedule(blocks.schedule);
    bool schedule_ok = c.ok;
    c.train(blocks.train);
    if (program.mesh.mixed() && program.train.training_refusal.empty()) {
        std::string kinds;
        for (const HardwareProfile& h : program.mesh.pp_profiles)
            if (kinds.find(h.name) == std::string::npos)
                kinds += (kinds.empty() ? "" : " and ") + h.name;
        program.train.training_refusal = render_diagnostic(
            sources, {c.devices_loc,
                      "a mesh of several kinds of device (" + kinds +
                          ") is planned and simulated, not trained: each rank's kernels run on "
                          "one kind of device",
                      "`dist sim` and `dist search` take this mesh; train with one kind"});
    }
    if (blocks.model_ok && program.model.has_experts() && !program.mesh.profile.cpu() &&
        program.train.training_refusal.empty()) {
        const LayerSpec* moe = nullptr;
        for (const BlockSpec& b : program.model.blocks)
            for (const ModelItemSpec& it : b.items)
                for (const LayerSpec& l : it.layers)
                    if (l.kind == LayerKind::moe && !moe) moe = &l;
        program.train.training_refusal = render_diagnostic(
            sources, {moe->loc,
                      "a mixture of experts trains on `cpu` devices: its router runs on the "
                      "host, and " +
                          program.mesh.profile.name + " ranks compute on GPUs",
                      "`dist check`, `dist plan` and `dist sim` take this model; a mesh of `cpu` "
                      "devices trains it on this machine's cores"});
    }
    if (blocks.model_ok && program.train.training_refusal.empty()) {
        const LayerSpec* scores = nullptr;
        for (const BlockSpec& b : program.model.blocks)
            for (const ModelItemSpec& it : b.items)
                for (const LayerSpec& l : it.layers)
                    if (l.kind == LayerKind::attention &&
                        l.kernel == AttentionKernel::materialized && !scores)
                        scores = &l;
        if (scores)
            program.train.training_refusal = render_diagnostic(
                sources, {scores->loc,
                          "attention with `kernel: materialized` is planned and simulated, not "
                          "trained: Dist's attention kernels keep no T x T scores (flash)",
                          "`dist sim` prices the materialized scores (runs before FlashAttention); "
                          "training computes the same numbers with `flash`, the default"});
    }
    c.generate(blocks.generate);
    if (mesh_ok && schedule_ok && c.ok && blocks.model_ok) {
        c.experts();
        if (c.ok) c.cross();
    }
    return c.ok;
}

} // namespace dist::lang
