// graph_json.cpp: Graph <-> JSON with nlohmann-json.
#include "actors/plan/graph_json.hpp"

#include <sstream>

namespace dist::plan {

using nlohmann::json;

json to_json(const Graph& g) {
    json stages = json::array();
    for (const PlanStage& s : g.stages) {
        json shards = json::array();
        for (const PlanShard& sh : s.shards)
            shards.push_back({{"layer", sh.layer}, {"dim", to_string(sh.dim)}, {"size", sh.size}});
        json st = {
            {"stage", s.index},
            {"pp", s.pp},
            {"blocks", {s.first_block, s.blocks}},
            {"embedding", s.embedding},
            {"head", s.head},
            {"parameters", s.parameters},
            {"flops",
             {{"F", s.flops_forward}, {"I", s.flops_input_grad}, {"W", s.flops_weight_grad}}},
            {"bytes_elementwise", s.bytes_elementwise},
            {"activation_bytes", s.activation_bytes},
            {"working_bytes",
             {{"F", s.forward_working_bytes},
              {"B", s.backward_working_bytes},
              {"I", s.input_working_bytes},
              {"W_stash", s.weight_stash_bytes},
              {"W", s.weight_working_bytes}}},
            {"boundary_bytes", s.boundary_bytes},
            {"tp_reductions", s.tp_reductions},
            {"tp_backward_reductions", s.tp_backward_reductions},
            {"tp_reduction_bytes", s.tp_reduction_bytes},
            {"tp_loss_reductions", s.tp_loss_reductions},
            {"tp_loss_bytes", s.tp_loss_bytes},
            {"buckets", s.buckets},
            {"cp_ring_bytes", s.cp_ring_bytes},
            {"attention_flops", s.attention_flops},
            {"flash", {{"F", s.flash_forward}, {"I", s.flash_input_grad}, {"T", s.flash_sequence}}},
            {"largest_unit_parameters", s.largest_unit_parameters},
            {"two_largest_units_parameters", s.two_largest_units_parameters},
            {"units", s.units},
            {"shards", shards}};
        if (s.all_to_alls > 0) {
            st["all_to_alls"] = s.all_to_alls;
            st["all_to_all_bytes"] = s.all_to_all_bytes;
        }
        if (!s.exchange_layers.empty()) {
            json layers = json::array();
            for (const PlanExchange& x : s.exchange_layers) layers.push_back({x.block, x.group});
            st["exchange_layers"] = layers;
        }
        if (s.expert_buckets > 0) st["expert_buckets"] = s.expert_buckets;
        if (s.expert_parameters > 0) st["expert_parameters"] = s.expert_parameters;
        stages.push_back(st);
    }
    json ranks = json::array();
    for (const PlanRank& r : g.ranks) {
        json actions = json::array();
        for (size_t i = 0; i < r.actions.size(); ++i) {
            std::string word = to_string(r.actions[i]);
            while (r.actions[i].overlap_next && i + 1 < r.actions.size()) {
                word += '+';
                word += to_string(r.actions[++i]);
            }
            actions.push_back(word);
        }
        ranks.push_back({{"rank", r.rank},
                         {"dp", r.dp},
                         {"pp", r.pp},
                         {"tp", r.tp},
                         {"cp", r.cp},
                         {"host", r.host},
                         {"actions", actions}});
    }
    json out = {{"file", g.file},
                {"schedule", to_string(g.schedule)},
                {"dp", g.dp},
                {"tp", g.tp},
                {"pp", g.pp},
                {"cp", g.cp},
                {"zero", g.zero},
                {"sp", g.sp},
                {"virtual_stages", g.virtual_stages},
                {"microbatches", g.microbatches},
                {"microbatch_tokens", g.microbatch_tokens},
                {"bytes_per_element", g.bytes_per_element},
                {"partition_given", g.partition_given},
                {"tied_bytes", g.tied_bytes},
                {"stages", stages},
                {"ranks", ranks}};
    if (g.ep > 1) out["ep"] = g.ep;
    if (g.recompute) out["recompute"] = true;
    return out;
}

bool from_json(const json& j, Graph& out, std::string& error) {
    Graph g;
    try {
        g.file = j.at("file").get<std::string>();
        std::string kind = j.at("schedule").get<std::string>();
        bool known = false;
        for (int k = 0; k <= static_cast<int>(ScheduleKind::custom); ++k) {
            if (kind == to_string(static_cast<ScheduleKind>(k))) {
                g.schedule = static_cast<ScheduleKind>(k);
                known = true;
            }
        }
        if (!known) {
            error = "unknown schedule `" + kind + "`";
            return false;
        }
        g.dp = j.at("dp").get<int32_t>();
        g.tp = j.at("tp").get<int32_t>();
        g.pp = j.at("pp").get<int32_t>();
        g.cp = j.value("cp", 1);
        g.zero = j.value("zero", 0);
        g.ep = j.value("ep", 1);
        g.sp = j.value("sp", false);
        g.recompute = j.value("recompute", false);
        g.virtual_stages = j.at("virtual_stages").get<int32_t>();
        g.microbatches = j.at("microbatches").get<int32_t>();
        g.microbatch_tokens = j.at("microbatch_tokens").get<int64_t>();
        g.bytes_per_element = j.at("bytes_per_element").get<int32_t>();
        g.partition_given = j.at("partition_given").get<bool>();
        g.tied_bytes = j.at("tied_bytes").get<int64_t>();
        for (const json& s : j.at("stages")) {
            PlanStage st;
            st.index = s.at("stage").get<int32_t>();
            st.pp = s.at("pp").get<int32_t>();
            st.first_block = s.at("blocks").at(0).get<int32_t>();
            st.blocks = s.at("blocks").at(1).get<int32_t>();
            st.embedding = s.at("embedding").get<bool>();
            st.head = s.at("head").get<bool>();
            st.parameters = s.at("parameters").get<int64_t>();
            st.flops_forward = s.at("flops").at("F").get<double>();
            st.flops_input_grad = s.at("flops").at("I").get<double>();
            st.flops_weight_grad = s.at("flops").at("W").get<double>();
            st.bytes_elementwise = s.at("bytes_elementwise").get<double>();
            st.activation_bytes = s.at("activation_bytes").get<int64_t>();
            if (s.contains("working_bytes")) {
                const json& w = s.at("working_bytes");
                st.forward_working_bytes = w.value("F", int64_t{0});
                st.backward_working_bytes = w.value("B", int64_t{0});
                st.input_working_bytes = w.value("I", int64_t{0});
                st.weight_stash_bytes = w.value("W_stash", int64_t{0});
                st.weight_working_bytes = w.value("W", int64_t{0});
            }
            st.boundary_bytes = s.at("boundary_bytes").get<int64_t>();
            st.tp_reductions = s.at("tp_reductions").get<int32_t>();
            st.tp_backward_reductions = s.value("tp_backward_reductions", st.tp_reductions);
            st.tp_loss_reductions = s.value("tp_loss_reductions", int32_t{0});
            st.tp_loss_bytes = s.value("tp_loss_bytes", int64_t{0});
            st.tp_reduction_bytes = s.at("tp_reduction_bytes").get<int64_t>();
            st.buckets = s.at("buckets").get<std::vector<int64_t>>();
            st.cp_ring_bytes = s.value("cp_ring_bytes", int64_t{0});
            st.attention_flops = s.value("attention_flops", 0.0);
            if (s.contains("flash")) {
                st.flash_forward = s.at("flash").value("F", 0.0);
                st.flash_input_grad = s.at("flash").value("I", 0.0);
                st.flash_sequence = s.at("flash").value("T", int64_t{0});
            }
            st.largest_unit_parameters = s.value("largest_unit_parameters", int64_t{0});
            st.two_largest_units_parameters = s.value("two_largest_units_parameters", int64_t{0});
            st.units = s.value("units", 1);
            st.all_to_alls = s.value("all_to_alls", 0);
            st.all_to_all_bytes = s.value("all_to_all_bytes", int64_t{0});
            if (s.contains("exchange_layers"))
                for (const json& x : s.at("exchange_layers"))
                    st.exchange_layers.push_back({x.at(0).get<int32_t>(), x.at(1).get<int32_t>()});
            st.expert_buckets = s.value("expert_buckets", 0);
            st.expert_parameters = s.value("expert_parameters", int64_t{0});
            for (const json& sh : s.at("shards")) {
                PlanShard x;
                x.layer = sh.at("layer").get<std::string>();
                std::string dim = sh.at("dim").get<std::string>();
                for (ShardDim d : {ShardDim::heads, ShardDim::hidden, ShardDim::vocab})
                    if (dim == to_string(d)) x.dim = d;
                x.size = sh.at("size").get<int64_t>();
                st.shards.push_back(std::move(x));
            }
            g.stages.push_back(std::move(st));
        }
        for (const json& r : j.at("ranks")) {
            PlanRank rank;
            rank.rank = r.at("rank").get<int32_t>();
            rank.dp = r.at("dp").get<int32_t>();
            rank.pp = r.at("pp").get<int32_t>();
            rank.tp = r.at("tp").get<int32_t>();
            rank.cp = r.value("cp", 0);
            rank.host = r.at("host").get<int32_t>();
            for (const json& a : r.at("actions")) {
                std::stringstream words(a.get<std::string>());
                std::string word;
                size_t first = rank.actions.size();
                while (std::getline(words, word, '+')) {
                    auto parsed = parse_action(word);
                    if (!parsed) {
                        error = "rank " + std::to_string(rank.rank) + ": `" + word +
                                "` is not an action";
                        return false;
                    }
                    rank.actions.push_back(*parsed);
                }
                for (size_t k = first; k + 1 < rank.actions.size(); ++k)
                    rank.actions[k].overlap_next = true;
            }
            if (rank.rank != static_cast<int32_t>(g.ranks.size())) {
                error = "ranks must be listed in order; rank " + std::to_string(rank.rank) +
                        " is entry " + std::to_string(g.ranks.size());
                return false;
            }
            g.ranks.push_back(std::move(rank));
        }
    } catch (const json::exception& e) {
        error = e.what();
        return false;
    }
    out = std::move(g);
    return true;
}

} // namespace dist::plan
