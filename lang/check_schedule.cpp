// check_schedule.cpp: the `schedule` block: kind and its constraints, stages against blocks,
// the partition, and custom action tables.
#include "lang/check_blocks.hpp"

#include <map>
#include <set>
#include <tuple>

namespace dist::lang {

void BlockChecker::schedule(const Block* block) {
    BlockReader r(block, "schedule", defs.globals, diags);
    ScheduleSpec& s = p.schedule;
    auto kind = r.choice("kind", schedule_kinds, "schedule kind");
    kind_loc = r.loc_of("kind");
    if (kind) s.kind = pick<ScheduleKind>(schedule_kinds, *kind);
    bool two_per_rank = s.kind == ScheduleKind::zbv || s.kind == ScheduleKind::dualpipev;
    auto m = r.integer("microbatches", 1, max_microbatches);
    m_loc = r.loc_of("microbatches");
    auto v = r.integer("virtual_stages", 1, 1024);
    v_loc = r.loc_of("virtual_stages");
    s.microbatches = m.value_or(1);
    s.virtual_stages = v.value_or(two_per_rank ? 2 : 1);
    static const std::vector<std::string> recompute = {"none", "selective", "full"};
    if (auto rc = r.choice("recompute", recompute, "recompute mode"))
        s.recompute = pick<Recompute>(recompute, *rc);
    const Field* part = r.field("partition");
    const Block* actions = r.block("actions");
    r.finish();
    if (r.failed()) {
        ok = false;
        return;
    }
    int64_t pp = p.mesh.pp, vs = s.virtual_stages, mb = s.microbatches;
    int64_t stages = pp * vs;
    if (!model_ok) {
        // The stage rules need the model's blocks; the custom table can still be read.
        if (s.kind == ScheduleKind::custom && actions) custom(actions);
        return;
    }
    int64_t blocks = static_cast<int64_t>(p.model.blocks.size());
    std::string kname = to_string(s.kind);

    // Constraints of each schedule family.
    if ((s.kind == ScheduleKind::gpipe || s.kind == ScheduleKind::one_f_one_b ||
         s.kind == ScheduleKind::zb_h1 || s.kind == ScheduleKind::zb_h2) &&
        vs != 1) {
        diags.error(v_loc, "`" + kname + "` runs one stage per rank, not " + std::to_string(vs),
                    "use `interleaved_1f1b` or `looped_bfs` for virtual stages");
        ok = false;
    }
    if (s.kind == ScheduleKind::interleaved_1f1b) {
        if (vs < 2) {
            diags.error(v.has_value() ? v_loc : kind_loc,
                        "`interleaved_1f1b` needs virtual_stages of 2 or more",
                        "with one stage per rank, use `1f1b`");
            ok = false;
        }
        if (mb % pp != 0) {
            diags.error(m_loc,
                        "`interleaved_1f1b` needs microbatches divisible by pp = " +
                            std::to_string(pp) + ", got " + std::to_string(mb),
                        "use " + std::to_string(((mb + pp - 1) / pp) * pp) +
                            " microbatches (a multiple of pp, as Megatron-LM requires)");
            ok = false;
        }
    }
    if (two_per_rank && vs != 2) {
        diags.error(v_loc, "`" + kname + "` places exactly two stages on each rank, in a V",
                    "set `virtual_stages: 2`");
        ok = false;
    }
    if ((s.kind == ScheduleKind::zb_h1 || s.kind == ScheduleKind::zb_h2 ||
         s.kind == ScheduleKind::zbv) &&
        mb < pp) {
        diags.error(m_loc,
                    "`" + kname + "` needs at least pp = " + std::to_string(pp) +
                        " microbatches, got " + std::to_string(mb),
                    "use " + std::to_string(pp) + " or more microbatches");
        ok = false;
    }
    if (s.kind == ScheduleKind::dualpipev && mb < 2 * pp) {
        diags.error(m_loc,
                    "`dualpipev` needs at least 2 x pp = " + std::to_string(2 * pp) +
                        " microbatches, got " + std::to_string(mb),
                    "use " + std::to_string(2 * pp) + " or more microbatches");
        ok = false;
    }
    if (blocks < stages) {
        diags.error(pp_loc.valid() && pp > 1 ? pp_loc
                    : v_loc.valid()          ? v_loc
                                             : kind_loc,
                    "the model has " + std::to_string(blocks) +
                        " blocks, too few for pp x "
                        "virtual_stages = " +
                        std::to_string(pp) + " x " + std::to_string(vs) + " = " +
                        std::to_string(stages) + " stages",
                    "use at most " + std::to_string(blocks) + " stages, or more layers");
        ok = false;
        return;
    }
    // Partition: blocks per stage, given or an even split.
    if (part) {
        auto pv = evaluate(*part->value, defs.globals, diags);
        if (!pv) {
            ok = false;
            return;
        }
        bool shape = pv->type == Value::Type::tuple;
        for (const auto& x : pv->items) shape = shape && x.type == Value::Type::integer && x.i >= 0;
        if (!shape) {
            diags.error(part->value->loc, "`partition` is a list of block counts, one per "
                                          "stage, e.g. [3, 3, 2]");
            ok = false;
            return;
        }
        int64_t sum = 0;
        for (const auto& x : pv->items) sum = sat_add(sum, x.i);
        if (static_cast<int64_t>(pv->items.size()) != stages) {
            diags.error(part->value->loc, "`partition` has " + std::to_string(pv->items.size()) +
                                              " entries for " + std::to_string(stages) + " stages");
            ok = false;
            return;
        }
        if (sum != blocks) {
            diags.error(part->value->loc, "`partition` places " + std::to_string(sum) +
                                              " blocks; the model has " + std::to_string(blocks));
            ok = false;
            return;
        }
        for (const auto& x : pv->items) s.partition.push_back(x.i);
        s.partition_given = true;
    } else {
        for (int64_t i = 0; i < stages; ++i) {
            // Extra blocks go to the later stages: the first one also holds the embeddings.
            s.partition.push_back(blocks / stages + (i >= stages - blocks % stages ? 1 : 0));
        }
    }
    // Custom tables.
    if (actions && s.kind != ScheduleKind::custom) {
        diags.error(actions->loc, "an `actions` table needs `kind: custom`");
        ok = false;
    }
    if (s.kind == ScheduleKind::custom) {
        if (!actions) {
            diags.error(kind_loc, "a custom schedule needs an `actions` table",
                        "add `actions { rank 0: 0F0 0B0 ... }` with one row per pipeline "
                        "rank");
            ok = false;
            return;
        }
        custom(actions);
    }
}

void BlockChecker::custom(const Block* actions) {
    BlockReader r(actions, "schedule.actions", defs.globals, diags);
    std::vector<const TableRow*> rows = r.rows();
    r.finish();
    if (r.failed()) ok = false;
    ScheduleSpec& s = p.schedule;
    int64_t pp = p.mesh.pp, stages = pp * s.virtual_stages, mb = s.microbatches;
    s.actions.assign(static_cast<size_t>(pp), {});
    s.action_rows.assign(static_cast<size_t>(pp), SourceLoc{});
    std::vector<bool> seen(static_cast<size_t>(pp), false);
    std::map<int64_t, int64_t> stage_rank;
    // count[stage][mb][op]
    std::map<std::tuple<int64_t, int64_t, char>, SourceLoc> done;
    std::set<int64_t> split_stages;
    bool table_ok = true;
    for (const TableRow* row : rows) {
        auto rank = evaluate(*row->rank, defs.globals, diags);
        if (!rank) {
            table_ok = false;
            continue;
        }
        if (rank->type != Value::Type::integer || rank->i < 0 || rank->i >= pp) {
            diags.error(row->rank->loc, "`rank` is a pipeline rank from 0 to " +
                                            std::to_string(pp - 1) + ", got " + rank->str());
            table_ok = false;
            continue;
        }
        size_t ri = static_cast<size_t>(rank->i);
        if (seen[ri]) {
            diags.error(row->loc, "rank " + rank->str() + " has two rows");
            table_ok = false;
            continue;
        }
        seen[ri] = true;
        s.action_rows[ri] = row->loc;
        for (size_t k = 0; k < row->actions.size(); ++k) {
            const std::string& a = row->actions[k];
            SourceLoc at = row->action_locs[k];
            size_t i = 0;
            while (i < a.size() && std::isdigit(static_cast<unsigned char>(a[i]))) ++i;
            size_t op_at = i;
            bool shape =
                i > 0 && i < a.size() && std::string("FBIW").find(a[i]) != std::string::npos;
            size_t j = op_at + 1;
            while (shape && j < a.size() && std::isdigit(static_cast<unsigned char>(a[j]))) ++j;
            shape =
                shape && j == a.size() && j > op_at + 1 && op_at <= 9 && a.size() - op_at - 1 <= 9;
            if (!shape) {
                diags.error(at, "`" + a + "` is not an action",
                            "write <stage><F|B|I|W><microbatch>, e.g. `0F1`");
                table_ok = false;
                continue;
            }
            ActionSpec act;
            act.stage = std::stoll(a.substr(0, op_at));
            act.op = a[op_at];
            act.microbatch = std::stoll(a.substr(op_at + 1));
            act.loc = at;
            if (act.stage >= stages) {
                diags.error(at, "stage " + std::to_string(act.stage) + " does not exist; " +
                                    "the stages are 0 to " + std::to_string(stages - 1));
                table_ok = false;
                continue;
            }
            if (act.microbatch >= mb) {
                diags.error(at, "microbatch " + std::to_string(act.microbatch) +
                                    " does not exist; the microbatches are 0 to " +
                                    std::to_string(mb - 1));
                table_ok = false;
                continue;
            }
            auto [it, fresh] = stage_rank.emplace(act.stage, rank->i);
            if (!fresh && it->second != rank->i) {
                if (split_stages.insert(act.stage).second)
                    diags.error(at,
                                "stage " + std::to_string(act.stage) + " is on rank " +
                                    std::to_string(it->second) + " already",
                                "each stage lives on one rank");
                table_ok = false;
                continue;
            }
            auto key = std::make_tuple(act.stage, act.microbatch, act.op);
            if (done.count(key)) {
                diags.error(at, "`" + a + "` appears twice",
                            "first at column " + std::to_string(done[key].col));
                table_ok = false;
                continue;
            }
            done[key] = at;
            s.actions[ri].push_back(act);
        }
    }
    for (int64_t ri = 0; ri < pp; ++ri) {
        if (!seen[static_cast<size_t>(ri)]) {
            diags.error(actions->loc, "the table has no row for rank " + std::to_string(ri),
                        "give every pipeline rank 0 to " + std::to_string(pp - 1) + " a row");
            table_ok = false;
        }
    }
    if (table_ok) {
        // Completeness: every stage and microbatch runs F and a backward, once.
        for (int64_t st = 0; st < stages && table_ok; ++st) {
            for (int64_t m = 0; m < mb; ++m) {
                bool f = done.count({st, m, 'F'}), b = done.count({st, m, 'B'}),
                     i = done.count({st, m, 'I'}), w = done.count({st, m, 'W'});
                std::string what;
                if (!f)
                    what = "no forward `" + std::to_string(st) + "F" + std::to_string(m) + "`";
                else if (b && (i || w))
                    what = "both B and I/W for stage " + std::to_string(st) + " microbatch " +
                           std::to_string(m);
                else if (!b && !(i && w))
                    what = "no backward for stage " + std::to_string(st) + " microbatch " +
                           std::to_string(m) + " (B, or I and W)";
                if (!what.empty()) {
                    auto owner = stage_rank.find(st);
                    SourceLoc at = owner != stage_rank.end()
                                       ? s.action_rows[static_cast<size_t>(owner->second)]
                                       : actions->loc;
                    diags.error(at, "the table has " + what);
                    table_ok = false;
                    break;
                }
            }
        }
    }
    if (table_ok) {
        // Each rank runs virtual_stages stages of its own.
        std::vector<int64_t> per_rank(static_cast<size_t>(pp), 0);
        for (const auto& [stage, rank] : stage_rank) ++per_rank[static_cast<size_t>(rank)];
        for (int64_t ri = 0; ri < pp && table_ok; ++ri) {
            if (per_rank[static_cast<size_t>(ri)] != s.virtual_stages) {
                diags.error(s.action_rows[static_cast<size_t>(ri)],
                            "rank " + std::to_string(ri) + " runs " +
                                std::to_string(per_rank[static_cast<size_t>(ri)]) +
                                " stages; each rank runs virtual_stages = " +
                                std::to_string(s.virtual_stages));
                table_ok = false;
            }
        }
        for (const auto& [stage, rank] : stage_rank) s.stage_ranks.push_back(rank);
    }
    ok = ok && table_ok;
}

} // namespace dist::lang
