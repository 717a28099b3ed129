// program_json.cpp: Program to JSON and to a human summary.
#include "lang/program_json.hpp"

#include "lang/check_internal.hpp"

#include <cstdio>

namespace dist {

const char* to_string(LayerKind k) {
    static const char* n[] = {"embedding",
                              "position_embedding",
                              "rotary_embedding",
                              "layer_norm",
                              "rms_norm",
                              "attention",
                              "mlp",
                              "lm_head",
                              "cross_entropy",
                              "moe"};
    return n[static_cast<int>(k)];
}
const char* to_string(RouterScore r) {
    return r == RouterScore::sigmoid ? "sigmoid" : "softmax";
}

const char* to_string(AttentionKernel k) {
    return k == AttentionKernel::materialized ? "materialized" : "flash";
}
const char* to_string(ShardDim s) {
    static const char* n[] = {"none", "heads", "hidden", "vocab"};
    return n[static_cast<int>(s)];
}
const char* to_string(Activation a) {
    static const char* n[] = {"gelu_tanh", "gelu", "relu", "swiglu"};
    return n[static_cast<int>(a)];
}
const char* to_string(ScheduleKind k) {
    static const char* n[] = {"gpipe", "1f1b", "interleaved_1f1b", "looped_bfs", "zb_h1",
                              "zb_h2", "zbv",  "dualpipev",        "custom"};
    return n[static_cast<int>(k)];
}
const char* to_string(Recompute r) {
    static const char* n[] = {"none", "selective", "full"};
    return n[static_cast<int>(r)];
}
const char* to_string(DataFormat f) {
    static const char* n[] = {"none", "text", "tokens", "synthetic"};
    return n[static_cast<int>(f)];
}
const char* to_string(LrScheduleKind k) {
    static const char* n[] = {"constant", "cosine", "linear"};
    return n[static_cast<int>(k)];
}
const char* to_string(Precision p) {
    static const char* n[] = {"f32", "bf16"};
    return n[static_cast<int>(p)];
}
const char* to_string(NonFinitePolicy p) {
    static const char* n[] = {"stop", "skip"};
    return n[static_cast<int>(p)];
}

} // namespace dist

namespace dist::lang {

using nlohmann::json;

json to_json(const Value& v) {
    switch (v.type) {
    case Value::Type::integer: return v.i;
    case Value::Type::real: return v.r;
    case Value::Type::boolean: return v.b;
    case Value::Type::string:
    case Value::Type::symbol: return v.s;
    case Value::Type::tuple: {
        json a = json::array();
        for (const auto& x : v.items) a.push_back(to_json(x));
        return a;
    }
    }
    return nullptr;
}

namespace {

json layer_json(const LayerSpec& l) {
    json j = {{"name", l.name}, {"kind", to_string(l.kind)}, {"parameters", l.parameters}};
    if (l.shard != ShardDim::none) j["shard"] = to_string(l.shard);
    switch (l.kind) {
    case LayerKind::embedding:
        j["vocab"] = l.vocab;
        j["width"] = l.width;
        break;
    case LayerKind::position_embedding:
        j["context"] = l.context;
        j["width"] = l.width;
        break;
    case LayerKind::rotary_embedding:
        j["context"] = l.context;
        j["theta"] = l.theta;
        break;
    case LayerKind::layer_norm:
        j["width"] = l.width;
        j["eps"] = l.eps;
        j["bias"] = l.bias;
        break;
    case LayerKind::rms_norm:
        j["width"] = l.width;
        j["eps"] = l.eps;
        break;
    case LayerKind::attention:
        j["width"] = l.width;
        j["heads"] = l.heads;
        j["kv_heads"] = l.kv_heads;
        j["head_dim"] = l.head_dim;
        j["bias"] = l.bias;
        j["kernel"] = to_string(l.kernel);
        break;
    case LayerKind::mlp:
        j["width"] = l.width;
        j["hidden"] = l.hidden;
        j["activation"] = to_string(l.activation);
        j["bias"] = l.bias;
        break;
    case LayerKind::lm_head:
        j["width"] = l.width;
        j["vocab"] = l.vocab;
        j["tied"] = l.tied;
        j["bias"] = l.bias;
        break;
    case LayerKind::cross_entropy: break;
    case LayerKind::moe:
        j["width"] = l.width;
        j["experts"] = l.experts;
        j["top_k"] = l.top_k;
        j["hidden"] = l.hidden;
        j["activation"] = to_string(l.activation);
        j["shared_experts"] = l.shared_experts;
        j["shared_hidden"] = l.shared_hidden;
        j["router"] = to_string(l.router);
        j["normalize"] = l.normalize;
        j["capacity"] = l.capacity;
        j["aux_loss"] = l.aux_loss;
        break;
    }
    return j;
}

json items_json(const std::vector<ModelItemSpec>& items) {
    json a = json::array();
    for (const auto& it : items) {
        if (it.residual) {
            json layers = json::array();
            for (const auto& l : it.layers) layers.push_back(layer_json(l));
            json r = {{"residual", layers}};
            if (!it.name.empty()) r["name"] = it.name;
            a.push_back(r);
        } else {
            a.push_back(layer_json(it.layers.front()));
        }
    }
    return a;
}

json data_json(const DataSpec& d) {
    json j = {{"format", to_string(d.format)}};
    if (!d.path.empty()) j["path"] = d.path;
    return j;
}

} // namespace

json to_json(const Program& p) {
    const ModelSpec& m = p.model;
    json args = json::object();
    for (const auto& [k, v] : m.arguments) args[k] = to_json(v);
    json block = m.blocks.empty() ? json::array() : items_json(m.blocks.front().items);
    json model = {{"template", m.template_name},
                  {"arguments", args},
                  {"vocab", m.vocab},
                  {"context", m.context},
                  {"width", m.width},
                  {"parameters", m.parameters},
                  {"blocks", m.blocks.size()},
                  {"block_parameters", m.blocks.empty() ? 0 : m.blocks.front().parameters},
                  {"pre", items_json(m.pre)},
                  {"block", block},
                  {"post", items_json(m.post)}};
    if (!m.preset.empty()) model["preset"] = m.preset;
    if (m.has_experts()) model["active_parameters"] = m.active_parameters;
    if (!m.blocks.empty() && m.blocks.back().repeat > 0) {
        // Several `repeat`s: each one's first block stands for the rest of it.
        json repeats = json::array();
        for (size_t i = 0; i < m.blocks.size(); ++i) {
            if (i > 0 && m.blocks[i].repeat == m.blocks[i - 1].repeat) {
                repeats.back()["count"] = repeats.back()["count"].get<int64_t>() + 1;
                continue;
            }
            repeats.push_back({{"first", m.blocks[i].name},
                               {"count", 1},
                               {"block_parameters", m.blocks[i].parameters},
                               {"block", items_json(m.blocks[i].items)}});
        }
        model["repeats"] = repeats;
    }

    const MeshSpec& mesh = p.mesh;
    const HardwareProfile& hw = mesh.profile;
    json profile = {{"name", hw.name},
                    {"peak_flops_f32", hw.peak_flops_f32},
                    {"peak_flops_bf16", hw.peak_flops_bf16},
                    {"memory_bytes", hw.memory_bytes},
                    {"memory_bandwidth", hw.memory_bandwidth},
                    {"devices_per_host", hw.devices_per_host},
                    {"intra_host",
                     {{"bandwidth", hw.intra_host.bandwidth}, {"latency", hw.intra_host.latency}}},
                    {"inter_host",
                     {{"bandwidth", hw.inter_host.bandwidth}, {"latency", hw.inter_host.latency}}}};
    json jmesh = {{"device", mesh.device},
                  {"profile", profile},
                  {"dp", mesh.dp},
                  {"tp", mesh.tp},
                  {"pp", mesh.pp},
                  {"cp", mesh.cp},
                  {"zero", mesh.zero},
                  {"sp", mesh.sp},
                  {"devices", mesh.devices},
                  {"hosts", mesh.hosts},
                  {"devices_per_host", mesh.devices_per_host},
                  {"memory_bytes", mesh.memory_bytes}};
    if (mesh.ep > 1) jmesh["ep"] = mesh.ep;
    if (mesh.mixed()) {
        // The kind of each pipeline rank, with its memory.
        json kinds = json::array();
        for (size_t i = 0; i < mesh.pp_profiles.size(); ++i)
            kinds.push_back({{"profile", mesh.pp_profiles[i].name},
                             {"memory_bytes", mesh.memory_of(static_cast<int64_t>(i))}});
        jmesh["pipeline_kinds"] = kinds;
    }

    const ScheduleSpec& s = p.schedule;
    json sched = {{"kind", to_string(s.kind)},          {"microbatches", s.microbatches},
                  {"virtual_stages", s.virtual_stages}, {"recompute", to_string(s.recompute)},
                  {"partition", s.partition},           {"partition_given", s.partition_given}};
    if (s.kind == ScheduleKind::custom) {
        json rows = json::array();
        for (const auto& row : s.actions) {
            json a = json::array();
            for (const auto& act : row)
                a.push_back(std::to_string(act.stage) + act.op + std::to_string(act.microbatch));
            rows.push_back(a);
        }
        sched["actions"] = rows;
    }

    const TrainSpec& t = p.train;
    json train = {
        {"data", data_json(t.data)},
        {"batch", t.batch},
        {"microbatch_size", t.microbatch_size},
        {"steps", t.steps},
        {"stop_after", t.stop_after},
        {"seed", t.seed},
        {"precision", to_string(t.precision)},
        {"optimizer",
         {{"kind", "adamw"},
          {"lr", t.optimizer.lr},
          {"betas", {t.optimizer.beta1, t.optimizer.beta2}},
          {"eps", t.optimizer.eps},
          {"weight_decay", t.optimizer.weight_decay}}},
        {"lr_schedule",
         {{"kind", to_string(t.lr_schedule.kind)},
          {"warmup", t.lr_schedule.warmup},
          {"min_lr", t.lr_schedule.min_lr}}},
        {"clip", t.clip},
        {"on_nonfinite", to_string(t.on_nonfinite)},
        {"checkpoint",
         {{"every", t.checkpoint.every},
          {"dir", t.checkpoint.dir},
          {"dtype", to_string(t.checkpoint.dtype)}}},
        {"eval",
         {{"every", t.eval.every}, {"data", data_json(t.eval.data)}, {"batches", t.eval.batches}}}};
    json gen = {{"temperature", p.generate.temperature},
                {"top_k", p.generate.top_k},
                {"max_tokens", p.generate.max_tokens}};
    json memory = {{"parameters_per_device", p.memory.parameters_per_device},
                   {"state_bytes_per_device", p.memory.bytes_per_device},
                   {"bytes_per_parameter", p.memory.bytes_per_parameter}};
    return {{"file", p.file}, {"model", model},  {"mesh", jmesh},   {"schedule", sched},
            {"train", train}, {"generate", gen}, {"memory", memory}};
}

std::string axes_text(const MeshSpec& m) {
    std::string s = "dp " + std::to_string(m.dp);
    if (m.cp > 1) s += ", cp " + std::to_string(m.cp);
    s += ", tp " + std::to_string(m.tp);
    if (m.sp) s += " with sp";
    s += ", pp " + std::to_string(m.pp);
    if (m.ep > 1) s += ", ep " + std::to_string(m.ep);
    if (m.zero > 0) s += ", ZeRO " + std::to_string(m.zero);
    return s;
}

std::string devices_text(const MeshSpec& m) {
    if (!m.mixed()) return std::to_string(m.devices) + " x " + m.profile.name;
    const int64_t per_pp = m.dp * m.cp * m.tp;
    std::string out;
    for (size_t i = 0; i < m.pp_profiles.size();) {
        size_t j = i;
        while (j < m.pp_profiles.size() && m.pp_profiles[j].name == m.pp_profiles[i].name) ++j;
        out += (out.empty() ? "" : " + ") + std::to_string(static_cast<int64_t>(j - i) * per_pp) +
               " x " + m.pp_profiles[i].name;
        i = j;
    }
    return out;
}

std::string summary(const Program& p) {
    char buf[512];
    std::string out;
    const ModelSpec& m = p.model;
    std::snprintf(buf, sizeof buf,
                  "model     %s%s%s: %.2fM parameters, %zu blocks, width %lld, "
                  "context %lld, vocab %lld\n",
                  m.template_name.c_str(), m.preset.empty() ? "" : " via ", m.preset.c_str(),
                  static_cast<double>(m.parameters) / 1e6, m.blocks.size(),
                  static_cast<long long>(m.width), static_cast<long long>(m.context),
                  static_cast<long long>(m.vocab));
    out += buf;
    if (m.has_experts()) {
        std::snprintf(buf, sizeof buf, "          %.2fM of them active per token (top-k experts)\n",
                      static_cast<double>(m.active_parameters) / 1e6);
        out += buf;
    }
    const MeshSpec& mesh = p.mesh;
    std::string axes = axes_text(mesh);
    std::snprintf(buf, sizeof buf, "mesh      %s (%s) on %lld host%s\n", devices_text(mesh).c_str(),
                  axes.c_str(), static_cast<long long>(mesh.hosts), mesh.hosts == 1 ? "" : "s");
    out += buf;
    const ScheduleSpec& s = p.schedule;
    std::string part;
    for (size_t i = 0; i < s.partition.size(); ++i)
        part += (i ? " " : "") + std::to_string(s.partition[i]);
    std::snprintf(buf, sizeof buf,
                  "schedule  %s, %lld microbatches, %lld stage%s per rank, blocks per stage [%s]\n",
                  to_string(s.kind), static_cast<long long>(s.microbatches),
                  static_cast<long long>(s.virtual_stages), s.virtual_stages == 1 ? "" : "s",
                  part.c_str());
    out += buf;
    std::snprintf(
        buf, sizeof buf, "train     batch %lld (%lld per microbatch), %lld steps, lr %g, %s\n",
        static_cast<long long>(p.train.batch), static_cast<long long>(p.train.microbatch_size),
        static_cast<long long>(p.train.steps), p.train.optimizer.lr,
        p.train.data.format == DataFormat::none
            ? "no data"
            : (std::string(to_string(p.train.data.format)) + " data").c_str());
    out += buf;
    std::snprintf(buf, sizeof buf,
                  "memory    at least %s per device for weights, gradients and AdamW state "
                  "(device has %s)\n",
                  format_bytes(p.memory.bytes_per_device).c_str(),
                  format_bytes(mesh.memory_bytes).c_str());
    out += buf;
    return out;
}

} // namespace dist::lang
