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
          {"bias", T::boolean, false, Value::boolean(false)}},
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
    };
    return sigs;
}

const std::vector<std::string> activation_names = {"gelu_tanh", "gelu", "relu", "swiglu"};

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
    }
    return 0;
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
        if (pname == "activation" && bare) {
            v = Value::symbol(a.value->text);
        } else if (pname == "activation") {
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
        if (pname == "activation" && !v) {
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
    if (sig->kind == LayerKind::mlp) {
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
