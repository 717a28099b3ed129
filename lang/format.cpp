// format.cpp: the formatter. Walks the AST in source order and interleaves the comments by line.
#include "lang/format.hpp"

namespace dist::lang {

namespace {

int precedence(const Expr& e) {
    if (e.kind == ExprKind::binary) {
        if (e.text == "+" || e.text == "-") return 1;
        if (e.text == "**") return 4;
        return 2;
    }
    if (e.kind == ExprKind::unary) return 3;
    return 5;
}

std::string quote(const std::string& s) {
    std::string out = "\"";
    for (char c : s) {
        switch (c) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\n': out += "\\n"; break;
        case '\t': out += "\\t"; break;
        default: out += c;
        }
    }
    return out + "\"";
}

std::string expr_text(const Expr& e);

std::string operand(const Expr& e, int min_prec) {
    std::string s = expr_text(e);
    return precedence(e) < min_prec ? "(" + s + ")" : s;
}

std::string expr_text(const Expr& e) {
    switch (e.kind) {
    case ExprKind::integer:
    case ExprKind::real: return e.unit.empty() ? e.text : e.text + " " + e.unit;
    case ExprKind::string: return quote(e.text);
    case ExprKind::boolean: return e.bool_value ? "true" : "false";
    case ExprKind::name: return e.text;
    case ExprKind::unary: {
        const Expr& x = *e.items[0];
        // `- -1` rather than `-(-1)`: parentheses would add nesting the source did not have.
        return e.text + (x.kind == ExprKind::unary ? " " + expr_text(x) : operand(x, 3));
    }
    case ExprKind::binary: {
        int p = precedence(e);
        if (e.text == "**") return operand(*e.items[0], 5) + " ** " + operand(*e.items[1], 3);
        return operand(*e.items[0], p) + " " + e.text + " " + operand(*e.items[1], p + 1);
    }
    case ExprKind::call: {
        std::string s = e.text + "(";
        for (size_t i = 0; i < e.args.size(); ++i) {
            if (i) s += ", ";
            if (!e.args[i].name.empty()) s += e.args[i].name + ": ";
            s += expr_text(*e.args[i].value);
        }
        return s + ")";
    }
    case ExprKind::tuple:
    case ExprKind::list: {
        bool tuple = e.kind == ExprKind::tuple;
        std::string s = tuple ? "(" : "[";
        for (size_t i = 0; i < e.items.size(); ++i) {
            if (i) s += ", ";
            s += expr_text(*e.items[i]);
        }
        if (tuple && e.items.size() == 1) s += ",";
        return s + (tuple ? ")" : "]");
    }
    }
    return {};
}

constexpr size_t max_columns = 100;

// `head(a, b, c)tail` on one line, or, when that is longer than the limit, with the items
// filled greedily onto lines that align under the first one.
std::string wrap(size_t indent_cols, const std::string& head, const std::vector<std::string>& items,
                 const std::string& tail) {
    std::string one = head;
    for (size_t i = 0; i < items.size(); ++i) one += (i ? ", " : "") + items[i];
    one += tail;
    if (indent_cols + one.size() <= max_columns || items.size() < 2) return one;
    size_t align = indent_cols + head.size();
    std::string out = head;
    size_t col = align;
    for (size_t i = 0; i < items.size(); ++i) {
        std::string piece = items[i] + (i + 1 < items.size() ? "," : tail);
        if (i > 0) {
            if (col + 1 + piece.size() > max_columns) {
                out += "\n" + std::string(align, ' ');
                col = align;
            } else {
                out += " ";
                col += 1;
            }
        }
        out += piece;
        col += piece.size();
    }
    return out;
}

std::vector<std::string> arg_texts(const Expr& call) {
    std::vector<std::string> items;
    for (const auto& a : call.args)
        items.push_back((a.name.empty() ? "" : a.name + ": ") + expr_text(*a.value));
    return items;
}

std::string call_text(size_t indent_cols, const std::string& prefix, const Expr& call,
                      const std::string& suffix = "") {
    return wrap(indent_cols, prefix + call.text + "(", arg_texts(call), ")" + suffix);
}

class Printer {
  public:
    explicit Printer(const Script& s) : script_(s) {}

    std::string run() {
        const auto& sts = script_.statements;
        for (size_t i = 0; i < sts.size(); ++i)
            statement(sts[i], i + 1 == sts.size() || sts[i + 1].loc.line > sts[i].end_line);
        leading(UINT32_MAX, 0);
        return out_;
    }

  private:
    void line(int indent, const std::string& text) {
        out_.append(static_cast<size_t>(indent) * 4, ' ');
        out_ += text;
    }

    void gap(uint32_t next) {
        if (!fresh_scope_ && last_ && next > last_ + 1) out_ += "\n";
        fresh_scope_ = false;
    }

    // Own-line comments above `limit`.
    void leading(uint32_t limit, int indent) {
        while (ci_ < script_.comments.size() && script_.comments[ci_].line < limit) {
            const Comment& c = script_.comments[ci_++];
            gap(c.line);
            line(indent, c.text);
            out_ += "\n";
            last_ = c.line;
        }
    }

    // A comment at the end of source line `at`, appended to the printed line; then a newline.
    // `take` is false for a block header whose first entry shares its line: the comment then
    // belongs to that entry.
    void end_line(uint32_t at, bool take = true) {
        if (take && ci_ < script_.comments.size() && script_.comments[ci_].line == at &&
            !script_.comments[ci_].own_line) {
            out_ += "  " + script_.comments[ci_++].text;
        }
        out_ += "\n";
    }

    void begin_item(SourceLoc loc, int indent) {
        leading(loc.line, indent);
        gap(loc.line);
    }

    void close(uint32_t end, int indent, const std::string& suffix = "") {
        leading(end, indent + 1);
        line(indent, "}" + suffix);
        end_line(end);
        last_ = end;
        fresh_scope_ = false;
    }

    void statement(const Statement& st, bool take) {
        begin_item(st.loc, 0);
        switch (st.kind) {
        case Statement::Kind::import:
            line(0, "import " + quote(st.name));
            end_line(st.end_line, take);
            break;
        case Statement::Kind::preset:
            line(0, call_text(0, "preset " + st.name + " = ", *st.value));
            end_line(st.end_line, take);
            break;
        case Statement::Kind::let:
            line(0, "let " + st.name + " = " + expr_text(*st.value));
            end_line(st.end_line, take);
            break;
        case Statement::Kind::model:
            line(0, call_text(0, "model = ", *st.value));
            end_line(st.end_line, take);
            break;
        case Statement::Kind::model_template: {
            std::vector<std::string> params;
            for (const auto& p : st.params)
                params.push_back(p.name + (p.default_value ? " = " + expr_text(*p.default_value)
                                                           : std::string()));
            line(0, wrap(0, "model " + st.name + "(", params, ") {"));
            end_line(st.loc.line, st.body.empty() || st.body.front().loc.line > st.loc.line);
            last_ = st.loc.line;
            fresh_scope_ = true;
            model_items(st.body, 1);
            close(st.end_line, 0);
            break;
        }
        case Statement::Kind::block: block(*st.block, 0, st.end_line); break;
        }
        last_ = st.end_line;
    }

    static uint32_t item_line(const BlockItem& item) {
        return item.kind == BlockItem::Kind::field   ? item.field.loc.line
               : item.kind == BlockItem::Kind::block ? item.block->loc.line
                                                     : item.row.loc.line;
    }

    void block(const Block& b, int indent, uint32_t end) {
        line(indent, b.name + " {");
        end_line(b.loc.line, b.items.empty() || item_line(b.items.front()) > b.loc.line);
        last_ = b.loc.line;
        fresh_scope_ = true;
        for (size_t i = 0; i < b.items.size(); ++i) {
            const BlockItem& item = b.items[i];
            // A comment at the end of a line belongs to the last entry on that line.
            bool take = i + 1 == b.items.size() || item_line(b.items[i + 1]) > item.end_line;
            begin_item({0, item_line(item), 1, 1}, indent + 1);
            switch (item.kind) {
            case BlockItem::Kind::field: {
                std::string s = item.field.name + ": " + expr_text(*item.field.value);
                if (item.field.count) s += " x " + expr_text(*item.field.count);
                line(indent + 1, s);
                end_line(item.end_line, take);
                break;
            }
            case BlockItem::Kind::block: block(*item.block, indent + 1, item.end_line); break;
            case BlockItem::Kind::row: {
                std::string s = "rank " + expr_text(*item.row.rank) + ":";
                for (const auto& a : item.row.actions) s += " " + a;
                line(indent + 1, s);
                end_line(item.end_line, take);
                break;
            }
            }
            last_ = item.end_line;
        }
        close(end, indent);
    }

    void model_items(const std::vector<ModelItem>& items, int indent) {
        for (size_t i = 0; i < items.size(); ++i) {
            bool take = i + 1 == items.size() || items[i + 1].loc.line > items[i].end_line;
            model_item(items[i], indent, take);
        }
    }

    void model_item(const ModelItem& m, int indent, bool take) {
        begin_item(m.loc, indent);
        std::string label = m.name.empty() || m.kind == ModelItem::Kind::let ? "" : m.name + ": ";
        std::string shard = m.shard.empty() ? "" : " shard " + m.shard;
        switch (m.kind) {
        case ModelItem::Kind::let:
            line(indent, "let " + m.name + " = " + expr_text(*m.value));
            end_line(m.end_line, take);
            break;
        case ModelItem::Kind::layer:
            line(indent, call_text(static_cast<size_t>(indent) * 4, label, *m.value, shard));
            end_line(m.end_line, take);
            break;
        case ModelItem::Kind::repeat:
        case ModelItem::Kind::residual: {
            std::string head = m.kind == ModelItem::Kind::repeat ? "repeat " + expr_text(*m.value)
                                                                 : std::string("residual");
            line(indent, label + head + " {");
            end_line(m.loc.line, m.body.empty() || m.body.front().loc.line > m.loc.line);
            last_ = m.loc.line;
            fresh_scope_ = true;
            model_items(m.body, indent + 1);
            // `shard` on a group is an error the checker reports; keep it visible here.
            close(m.end_line, indent, shard);
            break;
        }
        }
        last_ = m.end_line;
    }

    const Script& script_;
    std::string out_;
    size_t ci_ = 0;
    uint32_t last_ = 0;
    bool fresh_scope_ = true;
};

} // namespace

std::string format_script(const Script& script) {
    return Printer(script).run();
}

} // namespace dist::lang
