// overrides.cpp: `--set KEY=VALUE`. Each override is parsed with the language's own grammar and
// written into the main script's tree before checking, so it passes through every rule a value
// written in the script would.
#include "lang/check_internal.hpp"
#include "lang/parse.hpp"

#include <algorithm>

namespace dist::lang {

namespace {

const std::vector<std::string> top_keys = {"model", "mesh",     "schedule",
                                           "train", "generate", "hardware"};

bool ident_char(char c, bool first) {
    return c == '_' || std::isalpha(static_cast<unsigned char>(c)) ||
           (!first && std::isdigit(static_cast<unsigned char>(c)));
}

} // namespace

std::vector<Override> parse_overrides(const std::vector<std::string>& texts, SourceManager& sources,
                                      Diagnostics& diags) {
    std::vector<Override> out;
    for (const std::string& text : texts) {
        uint32_t file = sources.add("--set", text);
        size_t eq = text.find('=');
        if (eq == std::string::npos) {
            diags.error({file, 1, 1, static_cast<uint32_t>(std::max<size_t>(text.size(), 1))},
                        "`--set` takes KEY=VALUE", "for example `--set mesh.dp=2`");
            continue;
        }
        Override o;
        o.key_loc = {file, 1, 1, static_cast<uint32_t>(std::max<size_t>(eq, 1))};
        // Key: dotted identifiers.
        bool ok = eq > 0;
        size_t start = 0;
        for (size_t i = 0; ok && i <= eq; ++i) {
            if (i == eq || text[i] == '.') {
                if (i == start)
                    ok = false;
                else
                    o.path.push_back(text.substr(start, i - start));
                start = i + 1;
            } else if (!ident_char(text[i], i == start)) {
                ok = false;
            }
        }
        if (!ok || o.path.size() < 2) {
            diags.error(o.key_loc, "`" + text.substr(0, eq) + "` is not a key",
                        "keys are `block.field` (mesh.dp, schedule.kind, train.steps, "
                        "train.optimizer.lr), `model.ARG` (model.layers) or `hardware.KEY` "
                        "(hardware.memory.bytes)");
            continue;
        }
        if (std::find(top_keys.begin(), top_keys.end(), o.path[0]) == top_keys.end()) {
            std::string best = closest_name(o.path[0], top_keys);
            diags.error({file, 1, 1, static_cast<uint32_t>(o.path[0].size())},
                        "unknown key `" + text.substr(0, eq) + "`",
                        "keys start with " + join_names(top_keys, " or ") +
                            (best.empty() ? "" : "; did you mean `" + best + "`?"));
            continue;
        }
        o.value_loc = {file, 1, static_cast<uint32_t>(eq + 2),
                       static_cast<uint32_t>(std::max<size_t>(text.size() - eq - 1, 1))};
        if (eq + 1 >= text.size()) {
            diags.error(o.value_loc, "`--set " + text + "` has no value");
            continue;
        }
        o.value = parse_set_value(sources, file, eq + 1, diags, o.count);
        if (!o.value) continue;
        out.push_back(std::move(o));
    }
    return out;
}

std::vector<Override> apply_overrides(std::vector<Override> overrides, Script& script,
                                      Diagnostics& diags, std::vector<Override>& hardware) {
    std::vector<Override> model;
    for (auto& o : overrides) {
        if (o.path[0] == "model") {
            model.push_back(std::move(o));
            continue;
        }
        if (o.path[0] == "hardware") {
            hardware.push_back(std::move(o));
            continue;
        }
        // Find or add the top-level block.
        Block* block = nullptr;
        for (auto& st : script.statements)
            if (st.kind == Statement::Kind::block && st.block->name == o.path[0])
                block = st.block.get();
        if (!block) {
            Statement st;
            st.kind = Statement::Kind::block;
            st.loc = o.key_loc;
            st.block = std::make_unique<Block>();
            st.block->name = o.path[0];
            st.block->loc = o.key_loc;
            st.name = o.path[0];
            block = st.block.get();
            script.statements.push_back(std::move(st));
        }
        // Nested blocks (train.optimizer.lr).
        bool ok = true;
        for (size_t k = 1; k + 1 < o.path.size() && ok; ++k) {
            Block* next = nullptr;
            for (auto& item : block->items) {
                if (item.kind == BlockItem::Kind::block && item.block->name == o.path[k])
                    next = item.block.get();
                if (item.kind == BlockItem::Kind::field && item.field.name == o.path[k]) {
                    diags.error(o.key_loc, "`" + o.path[k] + "` is a field, not a block");
                    ok = false;
                }
            }
            if (!ok) break;
            if (!next) {
                BlockItem bi;
                bi.kind = BlockItem::Kind::block;
                bi.block = std::make_unique<Block>();
                bi.block->name = o.path[k];
                bi.block->loc = o.key_loc;
                next = bi.block.get();
                block->items.push_back(std::move(bi));
            }
            block = next;
        }
        if (!ok) continue;
        const std::string& name = o.path.back();
        Field* field = nullptr;
        for (auto& item : block->items) {
            if (item.kind == BlockItem::Kind::field && item.field.name == name) field = &item.field;
            if (item.kind == BlockItem::Kind::block && item.block->name == name) {
                diags.error(o.key_loc, "`" + name + "` is a block; set one of its fields",
                            "for example `--set train.optimizer.lr=1e-3`");
                ok = false;
            }
        }
        if (!ok) continue;
        if (!field) {
            BlockItem bi;
            bi.kind = BlockItem::Kind::field;
            bi.field.name = name;
            block->items.push_back(std::move(bi));
            field = &block->items.back().field;
        }
        // The field now points at the override, so its errors show the `--set`.
        field->loc = o.key_loc;
        field->value = std::move(o.value);
        field->count = std::move(o.count);
    }
    return model;
}

} // namespace dist::lang
