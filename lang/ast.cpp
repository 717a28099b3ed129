// ast.cpp: S-expression dump and deep copy of the syntax tree.
#include "lang/ast.hpp"

namespace dist::lang {

namespace {

void dump_expr(const Expr& e, std::string& out) {
    switch (e.kind) {
    case ExprKind::integer:
    case ExprKind::real:
        out += e.text;
        if (!e.unit.empty()) out += " " + e.unit;
        return;
    case ExprKind::string: {
        out += '"';
        for (char c : e.text) {
            if (c == '"' || c == '\\') out += '\\';
            if (c == '\n') {
                out += "\\n";
                continue;
            }
            if (c == '\t') {
                out += "\\t";
                continue;
            }
            out += c;
        }
        out += '"';
        return;
    }
    case ExprKind::boolean: out += e.bool_value ? "true" : "false"; return;
    case ExprKind::name: out += e.text; return;
    case ExprKind::unary:
        out += "(" + e.text + " ";
        dump_expr(*e.items[0], out);
        out += ")";
        return;
    case ExprKind::binary:
        out += "(" + e.text + " ";
        dump_expr(*e.items[0], out);
        out += " ";
        dump_expr(*e.items[1], out);
        out += ")";
        return;
    case ExprKind::call:
        out += "(call " + e.text;
        for (const auto& a : e.args) {
            out += " ";
            if (!a.name.empty()) out += a.name + ":";
            dump_expr(*a.value, out);
        }
        out += ")";
        return;
    case ExprKind::tuple:
    case ExprKind::list:
        out += e.kind == ExprKind::tuple ? "(tuple" : "(list";
        for (const auto& i : e.items) {
            out += " ";
            dump_expr(*i, out);
        }
        out += ")";
        return;
    }
}

void indent(std::string& out, int depth) {
    out.append(static_cast<size_t>(depth) * 2, ' ');
}

void dump_block(const Block& b, std::string& out, int depth) {
    indent(out, depth);
    out += "(block " + b.name + "\n";
    for (const auto& item : b.items) {
        switch (item.kind) {
        case BlockItem::Kind::field:
            indent(out, depth + 1);
            out += "(field " + item.field.name + " ";
            dump_expr(*item.field.value, out);
            if (item.field.count) {
                out += " x ";
                dump_expr(*item.field.count, out);
            }
            out += ")\n";
            break;
        case BlockItem::Kind::block: dump_block(*item.block, out, depth + 1); break;
        case BlockItem::Kind::row:
            indent(out, depth + 1);
            out += "(rank ";
            dump_expr(*item.row.rank, out);
            for (const auto& a : item.row.actions) out += " " + a;
            out += ")\n";
            break;
        }
    }
    indent(out, depth);
    out += ")\n";
}

void dump_items(const std::vector<ModelItem>& items, std::string& out, int depth) {
    for (const auto& m : items) {
        indent(out, depth);
        switch (m.kind) {
        case ModelItem::Kind::let:
            out += "(let " + m.name + " ";
            dump_expr(*m.value, out);
            out += ")\n";
            break;
        case ModelItem::Kind::layer:
            out += "(layer " + (m.name.empty() ? std::string("_") : m.name) + " ";
            dump_expr(*m.value, out);
            if (!m.shard.empty()) out += " shard " + m.shard;
            out += ")\n";
            break;
        case ModelItem::Kind::repeat:
        case ModelItem::Kind::residual:
            if (m.kind == ModelItem::Kind::repeat) {
                out += "(repeat " + (m.name.empty() ? std::string("_") : m.name) + " ";
                dump_expr(*m.value, out);
            } else {
                out += "(residual " + (m.name.empty() ? std::string("_") : m.name);
            }
            if (!m.shard.empty()) out += " shard " + m.shard;
            out += "\n";
            dump_items(m.body, out, depth + 1);
            indent(out, depth);
            out += ")\n";
            break;
        }
    }
}

} // namespace

std::string dump(const Expr& expr) {
    std::string out;
    dump_expr(expr, out);
    return out;
}

std::string dump(const Script& script) {
    std::string out;
    for (const auto& s : script.statements) {
        switch (s.kind) {
        case Statement::Kind::import: out += "(import \"" + s.name + "\")\n"; break;
        case Statement::Kind::model_template:
            out += "(template " + s.name + " (";
            for (size_t i = 0; i < s.params.size(); ++i) {
                if (i) out += " ";
                out += s.params[i].name;
                if (s.params[i].default_value) out += "=" + dump(*s.params[i].default_value);
            }
            out += ")\n";
            dump_items(s.body, out, 1);
            out += ")\n";
            break;
        case Statement::Kind::preset:
            out += "(preset " + s.name + " " + dump(*s.value) + ")\n";
            break;
        case Statement::Kind::let: out += "(let " + s.name + " " + dump(*s.value) + ")\n"; break;
        case Statement::Kind::model: out += "(model " + dump(*s.value) + ")\n"; break;
        case Statement::Kind::block: dump_block(*s.block, out, 0); break;
        }
    }
    return out;
}

ExprPtr clone(const Expr& e) {
    auto c = std::make_unique<Expr>();
    c->kind = e.kind;
    c->loc = e.loc;
    c->text = e.text;
    c->unit = e.unit;
    c->int_value = e.int_value;
    c->real_value = e.real_value;
    c->bool_value = e.bool_value;
    for (const auto& i : e.items) c->items.push_back(clone(*i));
    for (const auto& a : e.args) c->args.push_back({a.name, a.name_loc, clone(*a.value)});
    return c;
}

} // namespace dist::lang
