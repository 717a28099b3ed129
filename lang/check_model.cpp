// check_model.cpp: model templates. Binds the model call's arguments (through a preset, the
// script and `--set model.ARG`), expands the template body into layers and blocks, checks every
// layer's arguments and the model's structure, and counts parameters.
#include "lang/check_internal.hpp"
#include "lang/check_layers.hpp"

#include <algorithm>
#include <set>

namespace dist::lang {

namespace {

// An argument's value and where it was written (for errors about it).
struct BoundArg {
    Value value;
    SourceLoc loc;
};

class Expander {
  public:
    explicit Expander(Diagnostics& diags) : diags_(diags) {}

    bool run(const Statement& tmpl, Scope& scope, ModelSpec& out) {
        bool seen_repeat = false;
        std::set<std::string> names;
        for (const auto& item : tmpl.body) {
            switch (item.kind) {
            case ModelItem::Kind::let: bind_let(item, scope); break;
            case ModelItem::Kind::layer:
            case ModelItem::Kind::residual: {
                ModelItemSpec spec;
                if (!item_spec(item, scope, "", names, spec)) break;
                (seen_repeat ? out.post : out.pre).push_back(std::move(spec));
                break;
            }
            case ModelItem::Kind::repeat:
                if (!item.shard.empty()) shard_on_group(item);
                if (seen_repeat && !out.post.empty()) {
                    diags_.error(item.loc, "a model's `repeat`s of blocks come one after another",
                                 "pipeline stages are cut from one sequence of blocks: move the "
                                 "layers between them into a block");
                    break;
                }
                seen_repeat = true;
                expand_repeat(item, scope, names, out);
                break;
            }
        }
        if (!seen_repeat && ok_) {
            diags_.error(tmpl.name_loc, "model `" + tmpl.name + "` has no `repeat` of blocks",
                         "wrap the transformer block in `repeat layers { ... }`");
            ok_ = false;
        }
        return ok_;
    }

  private:
    void bind_let(const ModelItem& item, Scope& scope) {
        if (scope.defined_here(item.name)) {
            diags_.error(item.name_loc, "`" + item.name + "` is already defined here");
            ok_ = false;
            return;
        }
        if (auto v = evaluate(*item.value, scope, diags_))
            scope.set(item.name, *v, item.name_loc);
        else
            ok_ = false;
    }

    void shard_on_group(const ModelItem& item) {
        diags_.error(item.shard_loc, "`shard` goes on a layer, not on a group of layers");
        ok_ = false;
    }

    bool claim_name(const std::string& name, const ModelItem& item, std::set<std::string>& names) {
        if (!names.insert(name).second) {
            SourceLoc at = item.name.empty() ? item.value->loc : item.name_loc;
            diags_.error(at, "two layers are named `" + name + "` here",
                         item.name.empty() ? "give each a label, e.g. `ln_1: layer_norm(width)`"
                                           : "labels must differ within one body");
            ok_ = false;
            return false;
        }
        return true;
    }

    // A layer or a residual group, named under `prefix`.
    bool item_spec(const ModelItem& item, Scope& scope, const std::string& prefix,
                   std::set<std::string>& names, ModelItemSpec& out) {
        if (item.kind == ModelItem::Kind::layer) {
            LayerSpec layer;
            std::string label = item.name.empty() ? item.value->text : item.name;
            if (!claim_name(label, item, names)) return false;
            if (!build_layer(item, scope, prefix + label, layer)) return false;
            out.layers.push_back(std::move(layer));
            return true;
        }
        // residual
        if (!item.shard.empty()) shard_on_group(item);
        out.residual = true;
        Scope inner(&scope);
        std::string inner_prefix = prefix;
        std::set<std::string> inner_names;
        std::set<std::string>* group_names = &names;
        if (!item.name.empty()) {
            if (!claim_name(item.name, item, names)) return false;
            out.name = prefix + item.name;
            inner_prefix = out.name + ".";
            group_names = &inner_names;
        }
        bool ok = true;
        for (const auto& child : item.body) {
            switch (child.kind) {
            case ModelItem::Kind::let: bind_let(child, inner); break;
            case ModelItem::Kind::layer: {
                ModelItemSpec one;
                if (item_spec(child, inner, inner_prefix, *group_names, one))
                    out.layers.push_back(std::move(one.layers.front()));
                else
                    ok = false;
                break;
            }
            case ModelItem::Kind::residual:
            case ModelItem::Kind::repeat:
                diags_.error(child.loc,
                             std::string("a `") +
                                 (child.kind == ModelItem::Kind::repeat ? "repeat" : "residual") +
                                 "` cannot sit inside a `residual`");
                ok = false;
                break;
            }
        }
        if (out.layers.empty() && ok) {
            diags_.error(item.loc, "empty `residual` group");
            ok = false;
        }
        ok_ = ok_ && ok;
        return ok;
    }

    void expand_repeat(const ModelItem& item, Scope& scope, std::set<std::string>& names,
                       ModelSpec& out) {
        std::string label = item.name.empty() ? "layers" : item.name;
        // A `repeat` right after one of the same label numbers its blocks on from it
        // (layers.0 dense, then layers.1 ... with experts).
        const bool continues = repeats_ > 0 && label == last_label_;
        const int32_t index = repeats_++;
        const int64_t offset = continues ? next_index_ : 0;
        last_label_ = label;
        if (!continues && !names.insert(label).second) {
            diags_.error(item.loc, "two layers are named `" + label + "` here");
            ok_ = false;
        }
        auto count = evaluate(*item.value, scope, diags_);
        if (!count) {
            ok_ = false;
            return;
        }
        if (count->type != Value::Type::integer) {
            diags_.error(item.value->loc,
                         "`repeat` needs an integer count, got " + count->type_name());
            ok_ = false;
            return;
        }
        if (count->i < 1 || count->i > max_blocks) {
            diags_.error(item.value->loc,
                         count->i < 1
                             ? "`repeat` count must be positive, got " + std::to_string(count->i)
                             : "`repeat` count " + std::to_string(count->i) +
                                   " is more than the limit of " + std::to_string(max_blocks) +
                                   " blocks");
            ok_ = false;
            return;
        }
        // The body has no index variable, so every block is the same: expand once, rename.
        Scope inner(&scope);
        std::set<std::string> inner_names;
        BlockSpec first;
        bool ok = true;
        for (const auto& child : item.body) {
            switch (child.kind) {
            case ModelItem::Kind::let: bind_let(child, inner); break;
            case ModelItem::Kind::layer:
            case ModelItem::Kind::residual: {
                ModelItemSpec spec;
                if (item_spec(child, inner, "\x01", inner_names, spec))
                    first.items.push_back(std::move(spec));
                else
                    ok = false;
                break;
            }
            case ModelItem::Kind::repeat:
                diags_.error(child.loc, "a `repeat` cannot sit inside another `repeat`");
                ok = false;
                break;
            }
        }
        if (!ok) {
            ok_ = false;
            return;
        }
        if (first.items.empty()) {
            diags_.error(item.loc, "empty `repeat` body");
            ok_ = false;
            return;
        }
        for (const auto& spec : first.items)
            for (const auto& l : spec.layers)
                first.parameters = sat_add(first.parameters, l.parameters);
        out.blocks.reserve(static_cast<size_t>(count->i));
        if (static_cast<int64_t>(out.blocks.size()) + count->i > max_blocks) {
            diags_.error(item.value->loc, "the model's `repeat`s hold more than the limit of " +
                                              std::to_string(max_blocks) + " blocks");
            ok_ = false;
            return;
        }
        next_index_ = offset + count->i;
        for (int64_t i = 0; i < count->i; ++i) {
            BlockSpec b = first;
            b.repeat = index;
            b.name = label + "." + std::to_string(offset + i);
            auto rename = [&](std::string& n) {
                if (!n.empty() && n[0] == '\x01') n = b.name + "." + n.substr(1);
            };
            for (auto& spec : b.items) {
                rename(spec.name);
                for (auto& l : spec.layers) rename(l.name);
            }
            out.blocks.push_back(std::move(b));
        }
    }

    bool build_layer(const ModelItem& item, const Scope& scope, const std::string& name,
                     LayerSpec& out) {
        bool ok = dist::lang::build_layer(item, scope, name, diags_, out);
        ok_ = ok_ && ok;
        return ok;
    }

    Diagnostics& diags_;
    bool ok_ = true;
    int32_t repeats_ = 0;    // `repeat`s expanded so far
    std::string last_label_; // the label of the last one
    int64_t next_index_ = 0; // the number its next block would take
};

// Structure: one token embedding first, one kind of positions, one head, the loss last, and
// one residual width throughout.
bool check_structure(const ModelSpec& m, SourceLoc call_loc, Diagnostics& diags) {
    bool ok = true;
    std::vector<const LayerSpec*> all;
    for (const auto& it : m.pre)
        for (const auto& l : it.layers) all.push_back(&l);
    // The blocks of one `repeat` are the same: its first stands for all (errors are reported
    // once).
    std::vector<const LayerSpec*> in_blocks;
    for (size_t b = 0; b < m.blocks.size(); ++b)
        if (b == 0 || m.blocks[b].repeat != m.blocks[b - 1].repeat)
            for (const auto& it : m.blocks[b].items)
                for (const auto& l : it.layers) {
                    all.push_back(&l);
                    in_blocks.push_back(&l);
                }
    for (const auto& it : m.post)
        for (const auto& l : it.layers) all.push_back(&l);

    for (const LayerSpec* l : all) {
        if (l->kind == LayerKind::moe &&
            std::find(in_blocks.begin(), in_blocks.end(), l) == in_blocks.end()) {
            diags.error(l->loc, "a mixture of experts sits in the repeated blocks",
                        "put `" + l->name + "` inside the `repeat`, in place of a block's `mlp`");
            ok = false;
        }
    }
    auto count = [&](LayerKind k) {
        return std::count_if(all.begin(), all.end(),
                             [&](const LayerSpec* l) { return l->kind == k; });
    };
    const LayerSpec* embedding = nullptr;
    const LayerSpec* head = nullptr;
    for (const LayerSpec* l : all) {
        if (l->kind == LayerKind::embedding && !embedding) embedding = l;
        if (l->kind == LayerKind::lm_head && !head) head = l;
    }
    if (count(LayerKind::embedding) != 1 || all.front()->kind != LayerKind::embedding) {
        diags.error(embedding ? embedding->loc : call_loc,
                    "a model starts with exactly one token `embedding`");
        return false;
    }
    if (count(LayerKind::position_embedding) + count(LayerKind::rotary_embedding) != 1) {
        diags.error(call_loc, "a model has exactly one `position_embedding` or `rotary_embedding`");
        return false;
    }
    for (const LayerSpec* l : all) {
        if ((l->kind == LayerKind::position_embedding || l->kind == LayerKind::rotary_embedding) &&
            l != all[1] && l != all[0]) {
            diags.error(l->loc, "positions come right after the token embedding");
            ok = false;
        }
    }
    if (count(LayerKind::lm_head) != 1 || count(LayerKind::cross_entropy) != 1 ||
        all.back()->kind != LayerKind::cross_entropy || all.size() < 2 ||
        all[all.size() - 2]->kind != LayerKind::lm_head) {
        diags.error(head ? head->loc : call_loc,
                    "a model ends with one `lm_head` followed by `cross_entropy`");
        return false;
    }
    for (const LayerSpec* l : all) {
        bool has_width =
            l->kind != LayerKind::rotary_embedding && l->kind != LayerKind::cross_entropy;
        if (has_width && l->width != embedding->width) {
            diags.error(l->loc,
                        "`" + l->name + "` has width " + std::to_string(l->width) +
                            " but the model's residual width is " +
                            std::to_string(embedding->width),
                        "every layer reads and writes the residual stream of the embedding");
            ok = false;
        }
        if (l->kind == LayerKind::attention && count(LayerKind::rotary_embedding) &&
            l->head_dim % 2 != 0) {
            diags.error(l->loc, "rotary positions need an even head_dim, `" + l->name + "` has " +
                                    std::to_string(l->head_dim));
            ok = false;
        }
    }
    if (head->vocab != embedding->vocab) {
        diags.error(head->loc, "`lm_head` predicts " + std::to_string(head->vocab) +
                                   " tokens but the embedding has " +
                                   std::to_string(embedding->vocab));
        ok = false;
    }
    if (head->tied && head->shard != embedding->shard) {
        diags.error(head->loc, "a tied `lm_head` must shard like the embedding it shares",
                    std::string("the embedding is sharded by `") + to_string(embedding->shard) +
                        "`");
        ok = false;
    }
    const LayerSpec* loss = all.back();
    if (loss->shard == ShardDim::vocab && head->shard != ShardDim::vocab) {
        diags.error(loss->loc, "a vocabulary-parallel `cross_entropy` needs a vocabulary-parallel "
                               "`lm_head`");
        ok = false;
    }
    return ok;
}

} // namespace

bool check_model(const Statement& model_stmt, const Definitions& defs,
                 const std::vector<Override>& model_overrides, Diagnostics& diags, ModelSpec& out) {
    const Expr& call = *model_stmt.value;
    const Statement* tmpl = nullptr;
    const Statement* preset = nullptr;
    if (auto p = defs.presets.find(call.text); p != defs.presets.end()) {
        preset = p->second.stmt;
        auto t = defs.templates.find(preset->value->text);
        if (t == defs.templates.end()) {
            diags.error(preset->value->loc, "preset `" + preset->name + "` calls `" +
                                                preset->value->text +
                                                "`, which is not a model template");
            return false;
        }
        tmpl = t->second.stmt;
    } else if (auto t = defs.templates.find(call.text); t != defs.templates.end()) {
        tmpl = t->second.stmt;
    } else {
        std::vector<std::string> names;
        for (const auto& [n, _] : defs.templates) names.push_back(n);
        for (const auto& [n, _] : defs.presets) names.push_back(n);
        std::string best = closest_name(call.text, names);
        std::string hint;
        if (!best.empty())
            hint = "did you mean `" + best + "`?";
        else if (const auto layers = layer_names();
                 std::find(layers.begin(), layers.end(), call.text) != layers.end())
            hint = "`" + call.text + "` is a layer; a model comes from a template such as `gpt`";
        else if (names.empty())
            hint = "import a model family first, e.g. `import \"std/gpt.dist\"`";
        else
            hint = "the models are " + join_names(names);
        diags.error(call.loc, "unknown model `" + call.text + "`", hint);
        return false;
    }

    std::vector<std::string> pnames;
    for (const auto& p : tmpl->params) pnames.push_back(p.name);
    std::map<std::string, BoundArg> bound;
    bool ok = true;
    // Arguments in rising priority: the preset's, the script's, then `--set model.ARG`.
    auto bind = [&](const Expr& c, bool allow_positional) {
        size_t positional = 0;
        std::set<std::string> here;
        for (const auto& a : c.args) {
            std::string name = a.name;
            SourceLoc at = a.name.empty() ? a.value->loc : a.name_loc;
            if (name.empty()) {
                if (!allow_positional || positional >= pnames.size()) {
                    diags.error(at, positional >= pnames.size()
                                        ? "`" + tmpl->name + "` takes " +
                                              std::to_string(pnames.size()) + " arguments"
                                        : "name the arguments of a preset");
                    ok = false;
                    continue;
                }
                name = pnames[positional++];
            } else if (std::find(pnames.begin(), pnames.end(), name) == pnames.end()) {
                std::string best = closest_name(name, pnames);
                diags.error(at, "model `" + tmpl->name + "` has no argument `" + name + "`",
                            best.empty() ? "its arguments are " + join_names(pnames)
                                         : "did you mean `" + best + "`?");
                ok = false;
                continue;
            }
            if (!here.insert(name).second) {
                diags.error(at, "argument `" + name + "` is given twice");
                ok = false;
                continue;
            }
            if (auto v = evaluate(*a.value, defs.globals, diags))
                bound[name] = {*v, a.value->loc};
            else
                ok = false;
        }
    };
    if (preset) bind(*preset->value, false);
    bind(call, true);
    for (const auto& o : model_overrides) {
        const std::string& name = o.path[1];
        if (o.path.size() != 2) {
            diags.error(o.key_loc, "model arguments are set as `model.ARG`, one level deep");
            ok = false;
            continue;
        }
        if (std::find(pnames.begin(), pnames.end(), name) == pnames.end()) {
            std::string best = closest_name(name, pnames);
            diags.error(
                o.key_loc,
                "model `" + tmpl->name + "` has no argument `" + name + "`", "the keys are " + [&] {
                    std::vector<std::string> keys;
                    for (const auto& p : pnames) keys.push_back("model." + p);
                    return join_names(keys, " and ");
                }() + (best.empty() ? "" : "; did you mean `model." + best + "`?"));
            ok = false;
            continue;
        }
        if (o.count) {
            diags.error(o.value_loc, "a model argument takes one value");
            ok = false;
            continue;
        }
        if (auto v = evaluate(*o.value, defs.globals, diags))
            bound[name] = {*v, o.value_loc};
        else
            ok = false;
    }
    if (!ok) return false;

    Scope scope(&defs.globals);
    for (const auto& p : tmpl->params) {
        auto it = bound.find(p.name);
        if (it != bound.end()) {
            scope.set(p.name, it->second.value, it->second.loc);
        } else if (p.default_value) {
            auto v = evaluate(*p.default_value, scope, diags);
            if (!v) return false;
            scope.set(p.name, *v, p.loc);
        } else {
            diags.error(call.loc, "model `" + tmpl->name + "` needs argument `" + p.name + "`",
                        "its arguments are " + join_names(pnames));
            ok = false;
            continue;
        }
        out.arguments.emplace_back(p.name, *scope.find(p.name));
    }
    if (!ok) return false;

    out.template_name = tmpl->name;
    out.preset = preset ? preset->name : "";
    Expander ex(diags);
    bool expanded = ex.run(*tmpl, scope, out) && check_structure(out, call.loc, diags);
    if (!expanded) {
        // The errors sit in the template, often in a library file: show where it was called.
        if (tmpl->name_loc.file != call.loc.file)
            diags.note(call.loc, "in the model `" + tmpl->name + "` called here");
        return false;
    }

    const LayerSpec& emb = out.pre.front().layers.front();
    out.vocab = emb.vocab;
    out.width = emb.width;
    for (const auto& it : out.pre)
        for (const auto& l : it.layers)
            if (l.kind == LayerKind::position_embedding || l.kind == LayerKind::rotary_embedding)
                out.context = l.context;
    int64_t total = 0;
    for (const auto& it : out.pre)
        for (const auto& l : it.layers) total = sat_add(total, l.parameters);
    for (const auto& b : out.blocks) total = sat_add(total, b.parameters);
    for (const auto& it : out.post)
        for (const auto& l : it.layers) total = sat_add(total, l.parameters);
    if (total == INT64_MAX) {
        diags.error(call.loc, "the model's parameter count overflows 64 bits",
                    "check the sizes of its arguments");
        return false;
    }
    out.parameters = total;
    int64_t active = 0;
    auto add_active = [&active](const std::vector<ModelItemSpec>& items) {
        for (const auto& it : items)
            for (const auto& l : it.layers) active = sat_add(active, active_parameters(l));
    };
    add_active(out.pre);
    for (const auto& b : out.blocks) add_active(b.items);
    add_active(out.post);
    out.active_parameters = active;
    return true;
}

} // namespace dist::lang