// check_layers.cpp: the built-in layers: their signatures, argument binding and checks, and
// their parameter counts. The template expander (check_model.cpp) calls build_layer for every
// layer it meets.
#include "lang/check_layers.hpp"

#include <algorithm>
#include <map>
#include <set>

namespace dist::lang {

namespace {

struct ParamSig {
    const char* name;
    Value::Type type;
    bool required;
    Value fallback; // used when not required and absent (symbol "=width/heads" style defaults
                    // are computed by the builder instead)
};

struct LayerSig {
    LayerKind kind;
    const char* name;
    std::vector<ParamSig> params;
    std::vector<ShardDim> shards;
};

const std::vector<LayerSig>& layer_sigs() {
    using T = Value::Type;
    static const std::vector<LayerSig> sigs = {
        {LayerKind::embedding,
         "embedding",
         {{"vocab", T::integer, true, {}}, {"width", T::integer, true, {}}},
         {ShardDim::vocab}},
        {LayerKind::position_embedding,
         "position_embedding",
         {{"context", T::integer, true, {}}, {"width", T::integer, true, {}}},
         {}},
        {LayerKind::rotary_embedding,
         "rotary_embedding",
         {{"context", T::integer, true, {}}, {"theta", T::real, false, Value::real(10000.0)}},
         {}},
        {LayerKind::layer_norm,
         "layer_norm",
         {{"width", T::integer, true, {}},
          {"eps", T::real, false, Value::real(1e-5)},
          {"bias", T::boolean, false, Value::boolean(true)}},
         {}},
        {LayerKind::rms_norm,
         "rms_norm",
         {{"width", T::integer, true, {}}, {"eps", T::real, false, Value::real(1e-6)}},
         {}},
        {LayerKind::attention,
         "attention",
         {{"width", T::integer, true, {}},
          {"heads", T::integer, true, {}},
          {"kv_heads", T::integer, false, Value::integer(0)},
          {"head_dim", T::integer, false, Value::integer(0)},
          {"bias", T::boolean, false, Value::boolean(false)},
          {"kernel", T::symbol, false, Value::symbol("flash")}},
         {ShardDim::heads}},
        {LayerKind::mlp,
         "mlp",
         {{"width", T::integer, true, {}},
          {"hidden", T::integer, true, {}},
          {"activation", T::symbol, false, Value::symbol("gelu_tanh")},
          {"bias", T::boolean, false, Value::boolean(false)}},
         {ShardDim::hidden}},
        {LayerKind::lm_head,
         "lm_head",
         {{"width", T::integer, true, {}},
          {"vocab", T::integer, true, {}},
          {"tied", T::boolean, false, Value::boolean(false)},
          {"bias", T::boolean, false, Value::boolean(false)}},
         {ShardDim::vocab}},
        {LayerKind::cross_entropy, "cross_entropy", {}, {ShardDim::vocab}},
        {LayerKind::moe,
         "moe",
         {{"width", T::integer, true, {}},
          {"experts", T::integer, true, {}},
          {"top_k", T::integer, true, {}},
          {"hidden", T::integer, true, {}},
          {"activation", T::symbol, false, Value::symbol("swiglu")},
          {"shared", T::integer, false, Value::integer(0)},
          {"shared_hidden", T::integer, false, Value::integer(0)},
          {"router", T::symbol, false, Value::symbol("softmax")},
          {"normalize", T::boolean, false, Value::boolean(true)},
          {"capacity", T::real, false, Value::real(0.0)},
          {"aux_loss", T::real, false, Value::real(0.0)}},
         {ShardDim::hidden}},
    };
    return sigs;
}

const std::vector<std::string> activation_names = {"gelu_tanh", "gelu", "relu", "swiglu"};
const std::vector<std::string> router_names = {"softmax", "sigmoid"};
const std::vector<std::string> kernel_names = {"flash", "materialized"};
// Arguments that take a name (`activation: swiglu`), and those where 0 means "none".
bool takes_symbol(const std::string& p) {
    return p == "activation" || p == "router" || p == "kernel";
}
bool zero_allowed(const std::string& p) {
    return p == "shared" || p == "shared_hidden" || p == "capacity" || p == "aux_loss";
}

struct BoundArg {
    Value value;
    SourceLoc loc;
};

} // namespace

std::vector<std::string> layer_names() {
    std::vector<std::string> out;
    for (const auto& s : layer_sigs()) out.push_back(s.name);
    return out;
}

int64_t count_parameters(const LayerSpec& l) {
    int64_t c = l.width;
    switch (l.kind) {
    case LayerKind::embedding: return sat_mul(l.vocab, c);
    case LayerKind::position_embedding: return sat_mul(l.context, c);
    case LayerKind::rotary_embedding:
    case LayerKind::cross_entropy: return 0;
    case LayerKind::layer_norm: return sat_mul(c, l.bias ? 2 : 1);
    case LayerKind::rms_norm: return c;
    case LayerKind::attention: {
        int64_t q = sat_mul(l.heads, l.head_dim), kv = sat_mul(l.kv_heads, l.head_dim);
        int64_t n = sat_add(sat_mul(c, sat_add(q, sat_mul(2, kv))), sat_mul(q, c));
        if (l.bias) n = sat_add(n, sat_add(sat_add(q, sat_mul(2, kv)), c));
        return n;
    }
    case LayerKind::mlp: {
        int64_t mats = l.activation == Activation::swiglu ? 3 : 2;
        int64_t n = sat_mul(mats, sat_mul(c, l.hidden));
        if (l.bias) n = sat_add(n, sat_add(sat_mul(mats - 1, l.hidden), c));
        return n;
    }
    case LayerKind::lm_head: {
        int64_t n = l.tied ? 0 : sat_mul(c, l.vocab);
        if (l.bias) n = sat_add(n, l.vocab);
        return n;
    }
    case LayerKind::moe:
        return sat_add(sat_mul(l.experts, expert_parameters(l)), shared_parameters(l));
    }
    return 0;
}

int64_t expert_parameters(const LayerSpec& l) {
    int64_t mats = l.activation == Activation::swiglu ? 3 : 2;
    return sat_mul(mats, sat_mul(l.width, l.hidden));
}

int64_t shared_parameters(const LayerSpec& l) {
    int64_t mats = l.activation == Activation::swiglu ? 3 : 2;
    // The router's one score per expert, and the shared experts.
    return sat_add(sat_mul(l.experts, l.width),
                   sat_mul(l.shared_experts, sat_mul(mats, sat_mul(l.width, l.shared_hidden))));
}

int64_t parameters_on_device(const LayerSpec& l, int64_t tp, int64_t ep) {
    if (l.kind == LayerKind::moe) {
        int64_t t = l.shard == ShardDim::none ? 1 : tp;
        int64_t mats = l.activation == Activation::swiglu ? 3 : 2;
        int64_t router = sat_mul(l.experts, l.width);
        int64_t shared =
            sat_mul(l.shared_experts, sat_mul(mats, sat_mul(l.width, l.shared_hidden)));
        int64_t routed = sat_mul(l.experts / ep, expert_parameters(l));
        return sat_add(router, (sat_add(shared, routed) + t - 1) / t);
    }
    return l.shard == ShardDim::none ? l.parameters : (l.parameters + tp - 1) / tp;
}

int64_t active_parameters(const LayerSpec& l) {
    if (l.kind != LayerKind::moe) return l.parameters;
    return sat_add(sat_mul(l.top_k, expert_parameters(l)), shared_parameters(l));
}

bool build_layer(const ModelItem& item, const Scope& scope, const std::string& name,
                 Diagnostics& diags, LayerSpec& out) {
    const Expr& call = *item.value;
    const LayerSig* sig = nullptr;
    for (const auto& s : layer_sigs())
        if (call.text == s.name) sig = &s;
    if (!sig) {
        std::string best = closest_name(call.text, layer_names());
        diags.error(call.loc, "unknown layer `" + call.text + "`",
                    best.empty() ? "the layers are " + join_names(layer_names())
                                 : "did you mean `" + best + "`?");
        return false;
    }
    // Bind arguments to the signature.
    std::map<std::string, BoundArg> args;
    std::set<std::string> given;
    bool ok = true;
    size_t positional = 0;
    bool named_seen = false;
    for (const auto& a : call.args) {
        std::string pname;
        SourceLoc at = a.name.empty() ? a.value->loc : a.name_loc;
        if (a.name.empty()) {
            if (named_seen) {
                diags.error(at, "positional argument after a named one");
                ok = false;
                continue;
            }
            if (positional >= sig->params.size()) {
                diags.error(at, "`" + call.text + "` takes " + std::to_string(sig->params.size()) +
                                    " arguments");
                ok = false;
                continue;
            }
            pname = sig->params[positional++].name;
        } else {
            named_seen = true;
            pname = a.name;
            bool known = false;
            std::vector<std::string> pnames;
            for (const auto& p : sig->params) {
                pnames.push_back(p.name);
                known |= pname == p.name;
            }
            if (!known) {
                std::string best = closest_name(pname, pnames);
                diags.error(at, "`" + call.text + "` has no argument `" + pname + "`",
                            best.empty()
                                ? (pnames.empty() ? "it takes no arguments"
                                                  : "its arguments are " + join_names(pnames))
                                : "did you mean `" + best + "`?");
                ok = false;
                continue;
            }
        }
        if (args.count(pname)) {
            diags.error(at, "argument `" + pname + "` is given twice");
            ok = false;
            continue;
        }
        std::optional<Value> v;
        // A bare name is the activation itself unless it names a value in scope.
        bool bare = a.value->kind == ExprKind::name && !scope.find(a.value->text);
        if (takes_symbol(pname) && bare) {
            v = Value::symbol(a.value->text);
        } else if (takes_symbol(pname)) {
            // A template parameter may carry the activation as a string.
            v = evaluate(*a.value, scope, diags);
            if (!v) {
                ok = false;
                continue;
            }
            if (v->type == Value::Type::string) v = Value::symbol(v->s);
        } else {
            v = evaluate(*a.value, scope, diags);
            if (!v) {
                ok = false;
                continue;
            }
        }
        args[pname] = {v.value_or(Value::integer(0)), a.value->loc};
        given.insert(pname);
        if (takes_symbol(pname) && !v) {
            diags.error(a.value->loc,
                        "`activation` is one of " + join_names(activation_names, " or "));
            ok = false;
        }
    }
    for (const auto& p : sig->params) {
        auto it = args.find(p.name);
        if (it == args.end()) {
            if (p.required && ok) {
                diags.error(call.loc,
                            "`" + call.text + "` needs argument `" + std::string(p.name) + "`");
                ok = false;
            } else {
                args[p.name] = {p.fallback, call.loc};
            }
            continue;
        }
        Value& v = it->second.value;
        if (p.type == Value::Type::real && v.type == Value::Type::integer)
            v = Value::real(static_cast<double>(v.i));
        if (v.type != p.type) {
            static const char* names[] = {"an integer", "a real number", "a boolean",
                                          "a string",   "a name",        "a list"};
            diags.error(it->second.loc, "`" + std::string(p.name) + "` of `" + call.text +
                                            "` must be " + names[static_cast<int>(p.type)] +
                                            ", got " + v.type_name());
            ok = false;
        }
    }
    if (!ok) {
        return false;
    }
    out.kind = sig->kind;
    out.name = name;
    out.loc = call.loc;
    // Sizes: every integer argument is a positive size (0 marks "derive it" defaults).
    for (const auto& p : sig->params) {
        const BoundArg& a = args[p.name];
        if (!given.count(p.name)) continue;
        if (zero_allowed(p.name)) {
            if ((p.type == Value::Type::integer && a.value.i < 0) ||
                (p.type == Value::Type::real && !(a.value.r >= 0.0))) {
                diags.error(a.loc, "`" + std::string(p.name) + "` must be 0 or more, got " +
                                       a.value.str());
                ok = false;
            }
            continue;
        }
        if (p.type == Value::Type::integer && a.value.i < 1) {
            diags.error(a.loc, "`" + std::string(p.name) + "` must be positive, got " +
                                   std::to_string(a.value.i));
            ok = false;
        }
        if (p.type == Value::Type::real && !(a.value.r > 0.0)) {
            diags.error(a.loc,
                        "`" + std::string(p.name) + "` must be positive, got " + a.value.str());
            ok = false;
        }
    }
    auto get_i = [&](const char* n) { return args[n].value.i; };
    auto get_r = [&](const char* n) { return args[n].value.r; };
    auto get_b = [&](const char* n) { return args[n].value.b; };
    if (args.count("width")) out.width = get_i("width");
    if (args.count("vocab")) out.vocab = get_i("vocab");
    if (args.count("context")) out.context = get_i("context");
    if (args.count("eps")) out.eps = get_r("eps");
    if (args.count("theta")) out.theta = get_r("theta");
    if (args.count("bias")) out.bias = get_b("bias");
    if (args.count("tied")) out.tied = get_b("tied");
    if (args.count("hidden")) out.hidden = get_i("hidden");
    if (sig->kind == LayerKind::mlp || sig->kind == LayerKind::moe) {
        const std::string& act = args["activation"].value.s;
        auto it = std::find(activation_names.begin(), activation_names.end(), act);
        if (it == activation_names.end()) {
            std::string best = closest_name(act, activation_names);
            diags.error(args["activation"].loc, "unknown activation `" + act + "`",
                        best.empty() ? "the activations are " + join_names(activation_names)
                                     : "did you mean `" + best + "`?");
            ok = false;
        } else {
            out.activation = static_cast<Activation>(it - activation_names.begin());
        }
    }
    if (sig->kind == LayerKind::attention) {
        const std::string& k = args["kernel"].value.s;
        auto it = std::find(kernel_names.begin(), kernel_names.end(), k);
        if (it == kernel_names.end()) {
            diags.error(args["kernel"].loc, "unknown attention kernel `" + k + "`",
                        "attention computes its scores by `flash` (no T x T matrix) or "
                        "`materialized` (the scores written to memory)");
            ok = false;
        } else {
            out.kernel = static_cast<AttentionKernel>(it - kernel_names.begin());
        }
    }
    if (sig->kind == LayerKind::moe && ok) {
        out.experts = get_i("experts");
        out.top_k = get_i("top_k");
        out.shared_experts = get_i("shared");
        out.shared_hidden = get_i("shared_hidden") ? get_i("shared_hidden") : out.hidden;
        out.normalize = get_b("normalize");
        out.capacity = get_r("capacity");
        out.aux_loss = get_r("aux_loss");
        const std::string& r = args["router"].value.s;
        auto it = std::find(router_names.begin(), router_names.end(), r);
        if (it == router_names.end()) {
            diags.error(args["router"].loc, "unknown router `" + r + "`",
                        "a router scores experts by `softmax` or `sigmoid`");
            ok = false;
        } else {
            out.router = static_cast<RouterScore>(it - router_names.begin());
        }
        if (out.top_k > out.experts) {
            diags.error(args["top_k"].loc,
                        "top_k " + std::to_string(out.top_k) + " is more than the " +
                            std::to_string(out.experts) + " experts",
                        "each token picks top_k of the experts: use top_k <= experts");
            ok = false;
        }
        if (given.count("shared_hidden") && out.shared_experts == 0) {
            diags.error(args["shared_hidden"].loc, "`shared_hidden` without `shared` experts",
                        "give `shared: N` for N experts that every token passes through");
            ok = false;
        }
    }
    if (sig->kind == LayerKind::attention && ok) {
        out.heads = get_i("heads");
        out.kv_heads = get_i("kv_heads") ? get_i("kv_heads") : out.heads;
        out.head_dim = get_i("head_dim");
        if (out.head_dim == 0) {
            if (out.width % out.heads != 0) {
                diags.error(args["heads"].loc,
                            "width " + std::to_string(out.width) + " is not divisible by heads " +
                                std::to_string(out.heads),
                            "give `head_dim` explicitly, or choose heads that divide the "
                            "width");
                ok = false;
            }
            out.head_dim = out.width / out.heads;
        }
        if (out.kv_heads > out.heads || out.heads % out.kv_heads != 0) {
            diags.error(args["kv_heads"].loc,
                        "heads " + std::to_string(out.heads) + " is not a multiple of kv_heads " +
                            std::to_string(out.kv_heads),
                        "grouped-query attention shares each key/value head among an "
                        "equal number of query heads");
            ok = false;
        }
    }
    // Shard annotation.
    if (!item.shard.empty()) {
        static const std::vector<std::string> dims = {"none", "heads", "hidden", "vocab"};
        auto it = std::find(dims.begin(), dims.end(), item.shard);
        if (it == dims.end()) {
            std::string best = closest_name(item.shard, dims);
            diags.error(item.shard_loc, "unknown shard dimension `" + item.shard + "`",
                        best.empty() ? "layers shard by `heads`, `hidden` or `vocab`"
                                     : "did you mean `" + best + "`?");
            ok = false;
        } else {
            ShardDim d = static_cast<ShardDim>(it - dims.begin());
            if (d != ShardDim::none &&
                std::find(sig->shards.begin(), sig->shards.end(), d) == sig->shards.end()) {
                diags.error(item.shard_loc,
                            "`" + call.text + "` cannot be sharded by `" + item.shard + "`",
                            sig->shards.empty() ? "it is replicated on every tensor-parallel rank"
                                                : std::string("it shards by `") +
                                                      to_string(sig->shards.front()) + "`");
                ok = false;
            } else {
                out.shard = d;
            }
        }
    }
    if (ok) out.parameters = count_parameters(out);
    return ok;
}

} // namespace dist::lang
