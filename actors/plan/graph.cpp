// graph.cpp: action names, their text form and the `dist plan` printer.
#include "actors/plan/graph.hpp"

#include "lang/program_json.hpp"

#include <cctype>
#include <cstdio>

namespace dist::plan {

namespace {

struct OpText {
    ActionKind kind;
    const char* name;
};
// Longest names first, so that parsing never takes a prefix ("B" of nothing, "SEND_F" first).
const OpText op_texts[] = {{ActionKind::reduce_scatter, "REDUCE_SCATTER"},
                           {ActionKind::reduce_grad, "REDUCE_GRAD"},
                           {ActionKind::gather_forward, "GATHER_F"},
                           {ActionKind::gather_backward, "GATHER_B"},
                           {ActionKind::send_forward, "SEND_F"},
                           {ActionKind::recv_forward, "RECV_F"},
                           {ActionKind::send_backward, "SEND_B"},
                           {ActionKind::recv_backward, "RECV_B"},
                           {ActionKind::dispatch_forward, "DISPATCH_F"},
                           {ActionKind::combine_forward, "COMBINE_F"},
                           {ActionKind::combine_backward, "COMBINE_B"},
                           {ActionKind::dispatch_backward, "DISPATCH_B"},
                           {ActionKind::forward, "F"},
                           {ActionKind::backward, "B"},
                           {ActionKind::backward_input, "I"},
                           {ActionKind::backward_weight, "W"}};

bool read_int(const std::string& s, size_t& at, int32_t& out) {
    size_t start = at;
    int64_t v = 0;
    while (at < s.size() && std::isdigit(static_cast<unsigned char>(s[at])) && at - start < 9)
        v = v * 10 + (s[at++] - '0');
    if (at == start || (at < s.size() && std::isdigit(static_cast<unsigned char>(s[at]))))
        return false;
    out = static_cast<int32_t>(v);
    return true;
}

} // namespace

bool is_compute(ActionKind k) {
    return k == ActionKind::forward || k == ActionKind::backward ||
           k == ActionKind::backward_input || k == ActionKind::backward_weight;
}

bool is_p2p(ActionKind k) {
    return k == ActionKind::send_forward || k == ActionKind::recv_forward ||
           k == ActionKind::send_backward || k == ActionKind::recv_backward;
}

bool is_dp_collective(ActionKind k) {
    return k == ActionKind::reduce_grad || k == ActionKind::reduce_scatter ||
           k == ActionKind::gather_forward || k == ActionKind::gather_backward;
}

bool is_exchange(ActionKind k) {
    return k == ActionKind::dispatch_forward || k == ActionKind::combine_forward ||
           k == ActionKind::combine_backward || k == ActionKind::dispatch_backward;
}

const char* op_name(ActionKind k) {
    if (k == ActionKind::step) return "STEP";
    for (const OpText& t : op_texts)
        if (t.kind == k) return t.name;
    return "?";
}

std::string to_string(const PlanAction& a) {
    if (a.kind == ActionKind::step) return "STEP";
    std::string s = std::to_string(a.stage) + op_name(a.kind) + std::to_string(a.microbatch);
    if (a.kind == ActionKind::send_forward || a.kind == ActionKind::send_backward)
        s += ">r" + std::to_string(a.peer);
    if (a.kind == ActionKind::recv_forward || a.kind == ActionKind::recv_backward)
        s += "<r" + std::to_string(a.peer);
    if (is_exchange(a.kind)) s += "@" + std::to_string(a.block);
    return s;
}

std::optional<PlanAction> parse_action(const std::string& text) {
    PlanAction a;
    if (text == "STEP") {
        a.kind = ActionKind::step;
        return a;
    }
    size_t at = 0;
    if (!read_int(text, at, a.stage)) return std::nullopt;
    bool found = false;
    for (const OpText& t : op_texts) {
        std::string n = t.name;
        if (text.compare(at, n.size(), n) == 0) {
            a.kind = t.kind;
            at += n.size();
            found = true;
            break;
        }
    }
    if (!found || !read_int(text, at, a.microbatch)) return std::nullopt;
    if (is_p2p(a.kind)) {
        bool send = a.kind == ActionKind::send_forward || a.kind == ActionKind::send_backward;
        std::string arrow = send ? ">r" : "<r";
        if (text.compare(at, 2, arrow) != 0) return std::nullopt;
        at += 2;
        if (!read_int(text, at, a.peer)) return std::nullopt;
    }
    if (is_exchange(a.kind)) {
        if (text.compare(at, 1, "@") != 0) return std::nullopt;
        ++at;
        if (!read_int(text, at, a.block)) return std::nullopt;
    }
    if (at != text.size()) return std::nullopt;
    return a;
}

std::vector<PlanAction> exchanges_of(const Graph& g, const PlanAction& a) {
    std::vector<PlanAction> out;
    if (g.ep <= 1 || !is_compute(a.kind) || a.kind == ActionKind::backward_weight || a.stage < 0 ||
        a.stage >= g.num_stages())
        return out;
    const std::vector<PlanExchange>& layers =
        g.stages[static_cast<size_t>(a.stage)].exchange_layers;
    auto add = [&](ActionKind kind, int32_t block) {
        PlanAction x;
        x.kind = kind;
        x.stage = a.stage;
        x.microbatch = a.microbatch;
        x.block = block;
        out.push_back(x);
    };
    if (a.kind == ActionKind::forward) {
        for (const PlanExchange& x : layers) {
            add(ActionKind::dispatch_forward, x.block);
            add(ActionKind::combine_forward, x.block);
        }
        return out;
    }
    // Residual group by residual group from the last: under full recomputation the group's
    // forward again (its layers in order), then its layers' backwards from the last.
    for (size_t end = layers.size(); end > 0;) {
        size_t begin = end - 1;
        const PlanExchange& last = layers[begin];
        while (last.group >= 0 && begin > 0 && layers[begin - 1].block == last.block &&
               layers[begin - 1].group == last.group)
            --begin;
        if (g.recompute && last.group >= 0)
            for (size_t i = begin; i < end; ++i) {
                add(ActionKind::dispatch_forward, layers[i].block);
                add(ActionKind::combine_forward, layers[i].block);
            }
        for (size_t i = end; i-- > begin;) {
            add(ActionKind::combine_backward, layers[i].block);
            add(ActionKind::dispatch_backward, layers[i].block);
        }
        end = begin;
    }
    return out;
}

void add_exchanges(Graph& g) {
    if (g.ep <= 1) return;
    for (PlanRank& r : g.ranks) {
        std::vector<PlanAction> out;
        std::vector<PlanAction> pending; // an overlapped pair's, until the pair is over
        for (const PlanAction& a : r.actions) {
            out.push_back(a);
            if (!is_compute(a.kind)) continue;
            for (PlanAction& x : exchanges_of(g, a)) pending.push_back(x);
            if (a.overlap_next) continue;
            out.insert(out.end(), pending.begin(), pending.end());
            pending.clear();
        }
        r.actions = std::move(out);
    }
}

std::string axes_text(const Graph& g) {
    MeshSpec m;
    m.dp = g.dp;
    m.cp = g.cp;
    m.tp = g.tp;
    m.pp = g.pp;
    m.sp = g.sp;
    m.zero = g.zero;
    m.ep = g.ep;
    return lang::axes_text(m);
}

std::string print(const Graph& g, int width) {
    std::string out;
    char buf[512];
    std::snprintf(buf, sizeof buf,
                  "plan      %s, %d microbatch%s, %d stage%s (%d per pipeline rank), %zu rank%s "
                  "(%s)\n",
                  to_string(g.schedule), g.microbatches, g.microbatches == 1 ? "" : "es",
                  g.num_stages(), g.num_stages() == 1 ? "" : "s", g.virtual_stages, g.ranks.size(),
                  g.ranks.size() == 1 ? "" : "s", axes_text(g).c_str());
    out += buf;
    out += g.partition_given ? "stages    (partition from the script)\n"
                             : "stages    (partition balanced by the cost model)\n";
    for (const PlanStage& s : g.stages) {
        std::string what;
        if (s.embedding) what += "embeddings + ";
        what += s.blocks == 1 ? "block " + std::to_string(s.first_block)
                              : "blocks " + std::to_string(s.first_block) + "-" +
                                    std::to_string(s.first_block + s.blocks - 1);
        if (s.head) what += " + head";
        std::snprintf(buf, sizeof buf, "  stage %-3d pp %-3d %-34s %8.2fM params  %8.3f GFLOP F\n",
                      s.index, s.pp, what.c_str(), static_cast<double>(s.parameters) / 1e6,
                      s.flops_forward / 1e9);
        out += buf;
        if (s.tp_reductions > 0 || s.tp_backward_reductions > 0) {
            const int32_t f = s.tp_reductions, b = s.tp_backward_reductions;
            const char* what = g.sp ? "reduce-scatter + all-gather pair" : "all-reduce";
            const double mb = static_cast<double>(s.tp_reduction_bytes) / 1e6;
            if (f == b)
                std::snprintf(buf, sizeof buf,
                              "            tp: %d %s%s of %.2f MB inside each F, B and I%s\n", f,
                              what, f == 1 ? "" : "s", mb, g.sp ? " (sequence parallel)" : "");
            else
                std::snprintf(
                    buf, sizeof buf,
                    "            tp: %ss of %.2f MB, %d inside each F, %d inside each B and I%s\n",
                    what, mb, f, b, g.sp ? " (sequence parallel)" : "");
            out += buf;
        }
        if (s.tp_loss_reductions > 0) {
            std::snprintf(buf, sizeof buf,
                          "            tp: %d all-reduces of %.1f KB inside the loss's F (row "
                          "maxima, then sums)\n",
                          s.tp_loss_reductions, static_cast<double>(s.tp_loss_bytes) / 1e3);
            out += buf;
        }
        if (s.all_to_alls > 0) {
            std::snprintf(buf, sizeof buf,
                          "            ep: %d all-to-alls of %.2f MB among %d ranks inside each "
                          "F, B and I (dispatch and combine; listed after each%s)\n",
                          s.all_to_alls, static_cast<double>(s.all_to_all_bytes) / 1e6, g.ep,
                          g.recompute ? "; B and I redo the forward's first" : "");
            out += buf;
        }
        if (s.cp_ring_bytes > 0) {
            std::snprintf(buf, sizeof buf,
                          "            cp: %.2f MB of key/value blocks around the ring of %d in "
                          "each F, twice that in each B and I\n",
                          static_cast<double>(s.cp_ring_bytes) / 1e6, g.cp);
            out += buf;
        }
        if (!s.shards.empty()) {
            // One line per kind of split: which slice tensor-parallel rank t owns.
            std::string seen;
            for (const PlanShard& sh : s.shards) {
                std::string what = std::string(to_string(sh.dim)) + std::to_string(sh.size) + ";";
                if (seen.find(what) != std::string::npos) continue;
                seen += what;
                long long per = static_cast<long long>(sh.size / g.tp);
                std::snprintf(buf, sizeof buf,
                              "            tp shard: %s by %s, %lld of %lld: rank t owns "
                              "[%lld t, %lld (t+1))\n",
                              sh.layer.c_str(), to_string(sh.dim), per,
                              static_cast<long long>(sh.size), per, per);
                out += buf;
            }
        }
        if (!s.buckets.empty()) {
            const size_t dense = s.buckets.size() - static_cast<size_t>(s.expert_buckets);
            int64_t total = 0, experts = 0;
            for (size_t i = 0; i < s.buckets.size(); ++i)
                (s.expert_bucket(static_cast<int64_t>(i)) ? experts : total) += s.buckets[i];
            const char* group = g.cp > 1 ? "dp x cp" : "dp";
            if (g.zero >= 2)
                std::snprintf(buf, sizeof buf,
                              "            %s: gradients (%.2f MB) reduce-scattered after every "
                              "B or W, unit by unit; each rank keeps its share\n",
                              group, static_cast<double>(total) / 1e6);
            else
                std::snprintf(buf, sizeof buf,
                              "            %s: %zu gradient bucket%s (%.2f MB), each all-reduced "
                              "once final\n",
                              group, dense, dense == 1 ? "" : "s",
                              static_cast<double>(total) / 1e6);
            out += buf;
            if (s.expert_buckets > 0) {
                if (g.zero >= 2)
                    std::snprintf(buf, sizeof buf,
                                  "            %s / ep: experts' gradients (%.2f MB) "
                                  "reduce-scattered among the %d ranks holding the same "
                                  "experts\n",
                                  group, static_cast<double>(experts) / 1e6, g.dp * g.cp / g.ep);
                else
                    std::snprintf(buf, sizeof buf,
                                  "            %s / ep: %d bucket%s of experts' gradients "
                                  "(%.2f MB), each all-reduced among the %d ranks holding the "
                                  "same experts\n",
                                  group, s.expert_buckets, s.expert_buckets == 1 ? "" : "s",
                                  static_cast<double>(experts) / 1e6, g.dp * g.cp / g.ep);
                out += buf;
            }
            if (g.zero >= 3) {
                std::snprintf(
                    buf, sizeof buf,
                    "            %s: weights all-gathered before each F and B, unit by unit "
                    "(%d unit%s, the largest %.2fM params), one action ahead\n",
                    group, s.units, s.units == 1 ? "" : "s",
                    static_cast<double>(s.largest_unit_parameters) / 1e6);
                out += buf;
            }
        }
    }
    for (const PlanRank& r : g.ranks) {
        if (g.cp > 1)
            std::snprintf(buf, sizeof buf, "rank %d (dp %d, pp %d, cp %d, tp %d, host %d):\n",
                          r.rank, r.dp, r.pp, r.cp, r.tp, r.host);
        else
            std::snprintf(buf, sizeof buf, "rank %d (dp %d, pp %d, tp %d, host %d):\n", r.rank,
                          r.dp, r.pp, r.tp, r.host);
        out += buf;
        std::string line = "   ";
        auto put = [&](const std::string& word) {
            if (static_cast<int>(line.size() + 1 + word.size()) > width && line.size() > 3) {
                out += line + "\n";
                line = "   ";
            }
            line += " " + word;
        };
        for (size_t i = 0; i < r.actions.size(); ++i) {
            std::string word = to_string(r.actions[i]);
            while (r.actions[i].overlap_next && i + 1 < r.actions.size()) {
                word += '+';
                word += to_string(r.actions[++i]);
            }
            put(word);
            // A long run of all-to-alls (a stage of many expert blocks) as its first and last;
            // `dist plan --json` lists every one.
            size_t run = 0;
            while (i + 1 + run < r.actions.size() && is_exchange(r.actions[i + 1 + run].kind))
                ++run;
            if (run > 8) {
                put("[" + std::to_string(run) + " all-to-alls " + to_string(r.actions[i + 1]) +
                    " .. " + to_string(r.actions[i + run]) + "]");
                i += run;
            }
        }
        out += line + "\n";
    }
    return out;
}

} // namespace dist::plan
