// repl_script.cpp: the script with the REPL's values written into it, for `show` and `save`.
//
// The script is parsed again and every override is written into its syntax tree where the
// script would hold it (a field replaced, or added to its block; a model argument replaced, or
// added to the model's call), then printed by the formatter (lang/format.hpp), so the comments
// stay and the result is a script `dist check` accepts. The checker's own `--set` pass cannot be
// reused: it moves the fields' locations to the `--set` text, which the formatter would misplace
// comments around.
#include "cli/repl.hpp"

#include "lang/ast.hpp"
#include "lang/format.hpp"
#include "lang/loader.hpp"
#include "lang/parse.hpp"

#include <algorithm>

namespace dist::cli {

namespace {

using lang::Block;
using lang::BlockItem;
using lang::Statement;

std::vector<std::string> split_key(const std::string& key) {
    std::vector<std::string> parts;
    size_t start = 0;
    for (size_t dot; (dot = key.find('.', start)) != std::string::npos; start = dot + 1)
        parts.push_back(key.substr(start, dot - start));
    parts.push_back(key.substr(start));
    return parts;
}

// New entries take line `at`, the line of the closing brace of their block: the formatter then
// prints them last in the block, after the comments that were there, and moves no comment.
BlockItem new_field(const std::string& name, uint32_t file, uint32_t at) {
    BlockItem item;
    item.kind = BlockItem::Kind::field;
    item.field.name = name;
    item.field.loc = {file, at, 1, 1};
    item.end_line = at;
    return item;
}

// Writes `value` (and the device count of `devices: h100 x 8`) at `path` below `block`, whose
// closing brace is on line `end`. "" or what went wrong.
std::string write_field(Block& block, uint32_t end, const std::vector<std::string>& path, size_t k,
                        lang::ExprPtr value, lang::ExprPtr count, uint32_t file) {
    const std::string& name = path[k];
    bool last = k + 1 == path.size();
    for (BlockItem& item : block.items) {
        if (item.kind == BlockItem::Kind::field && item.field.name == name) {
            if (!last) return "`" + name + "` is a field, not a block";
            item.field.value = std::move(value);
            item.field.count = std::move(count);
            return "";
        }
        if (item.kind == BlockItem::Kind::block && item.block->name == name) {
            if (last) return "`" + name + "` is a block; set one of its fields";
            return write_field(*item.block, item.end_line, path, k + 1, std::move(value),
                               std::move(count), file);
        }
    }
    if (last) {
        BlockItem item = new_field(name, file, end);
        item.field.value = std::move(value);
        item.field.count = std::move(count);
        block.items.push_back(std::move(item));
        return "";
    }
    BlockItem item;
    item.kind = BlockItem::Kind::block;
    item.block = std::make_unique<Block>();
    item.block->name = name;
    item.block->loc = {file, end, 1, 1};
    item.block->end_line = end;
    item.end_line = end;
    block.items.push_back(std::move(item));
    return write_field(*block.items.back().block, end, path, k + 1, std::move(value),
                       std::move(count), file);
}

} // namespace

std::string ReplSession::script_with_overrides(std::string& error_out) const {
    std::string text = text_;
    if (!file_.empty() && !lang::read_source_file(file_, text, error_out)) {
        error_out = "cannot read `" + file_ + "`: " + error_out;
        return "";
    }
    lang::SourceManager sources;
    lang::Diagnostics diags;
    uint32_t id = sources.add(name_, text);
    std::unique_ptr<lang::Script> script = lang::parse_script(sources, id, diags);
    if (!script) {
        error_out = "`" + name_ + "` no longer parses:\n" + diags.render(sources);
        return "";
    }
    // Past the last line of the script and of its comments: where new blocks go.
    uint32_t bottom = 0;
    for (const Statement& st : script->statements) bottom = std::max(bottom, st.end_line);
    for (const lang::Comment& c : script->comments) bottom = std::max(bottom, c.line);

    for (const ReplOverride& o : overrides_) {
        std::string whole = o.text();
        uint32_t file = sources.add("set", whole);
        lang::ExprPtr count;
        lang::ExprPtr value = lang::parse_set_value(sources, file, o.key.size() + 1, diags, count);
        if (!value) {
            error_out = "`" + whole + "` does not parse:\n" + diags.render(sources);
            return "";
        }
        std::vector<std::string> path = split_key(o.key);
        if (path[0] == "model") {
            auto model =
                std::find_if(script->statements.begin(), script->statements.end(),
                             [](const Statement& s) { return s.kind == Statement::Kind::model; });
            if (model == script->statements.end() || path.size() != 2) {
                error_out = "cannot write `" + whole + "` into the script";
                return "";
            }
            lang::Expr& call = *model->value;
            // A positional argument of a template call holds the parameter of its position.
            size_t position = 0;
            if (program_ && program_->model.preset.empty())
                while (position < program_->model.arguments.size() &&
                       program_->model.arguments[position].first != path[1])
                    ++position;
            lang::Arg* target = nullptr;
            size_t positional = 0;
            for (lang::Arg& a : call.args) {
                if (a.name == path[1] ||
                    (a.name.empty() && program_ && program_->model.preset.empty() &&
                     positional++ == position))
                    target = &a;
            }
            if (target) {
                target->value = std::move(value);
            } else {
                lang::Arg a;
                a.name = path[1];
                a.name_loc = call.loc;
                a.value = std::move(value);
                call.args.push_back(std::move(a));
            }
            continue;
        }
        auto block = std::find_if(
            script->statements.begin(), script->statements.end(), [&](const Statement& s) {
                return s.kind == Statement::Kind::block && s.block->name == path[0];
            });
        if (block == script->statements.end()) {
            bottom += 2;
            Statement st;
            st.kind = Statement::Kind::block;
            st.loc = {id, bottom, 1, 1};
            st.name = path[0];
            st.block = std::make_unique<Block>();
            st.block->name = path[0];
            st.block->loc = st.loc;
            st.end_line = bottom;
            script->statements.push_back(std::move(st));
            block = script->statements.end() - 1;
        }
        std::string e = write_field(*block->block, block->end_line, path, 1, std::move(value),
                                    std::move(count), id);
        if (!e.empty()) {
            error_out = "cannot write `" + whole + "`: " + e;
            return "";
        }
    }
    return lang::format_script(*script);
}

} // namespace dist::cli
