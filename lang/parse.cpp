// parse.cpp: the ANTLR adapter. Checks the raw bytes and tokens, runs the generated parser and
// builds the project's AST from the parse tree; no ANTLR type escapes this file.
#include "lang/parse.hpp"

#include "DistLexer.h"
#include "DistParser.h"
#include "antlr4-runtime.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <map>

namespace dist::lang {

using grammar::DistLexer;
using grammar::DistParser;

namespace {

// ---------------------------------------------------------------------------------------------
// Bytes: NUL and invalid UTF-8 are refused before ANTLR decodes the text (its decoder throws).

bool check_bytes(const SourceFile& f, uint32_t file, Diagnostics& diags) {
    const std::string& t = f.text();
    uint32_t line = 1, col = 1;
    for (size_t i = 0; i < t.size();) {
        unsigned char c = static_cast<unsigned char>(t[i]);
        size_t n = 0;
        uint32_t cp = 0;
        if (c == 0) {
            diags.error({file, line, col, 1}, "NUL byte in source",
                        "a .dist script is UTF-8 text; is this a binary file?");
            return false;
        }
        if (c < 0x80) {
            n = 1;
        } else if ((c >> 5) == 0x6) {
            n = 2;
            cp = c & 0x1f;
        } else if ((c >> 4) == 0xe) {
            n = 3;
            cp = c & 0x0f;
        } else if ((c >> 3) == 0x1e) {
            n = 4;
            cp = c & 0x07;
        }
        bool ok = n > 0 && i + n <= t.size();
        for (size_t k = 1; ok && k < n; ++k) {
            unsigned char cc = static_cast<unsigned char>(t[i + k]);
            if ((cc >> 6) != 0x2) ok = false;
            cp = (cp << 6) | (cc & 0x3f);
        }
        if (ok && n > 1) {
            static const uint32_t min_cp[] = {0, 0, 0x80, 0x800, 0x10000};
            if (cp < min_cp[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) ok = false;
        }
        if (!ok) {
            diags.error({file, line, col, 1}, "invalid UTF-8 in source",
                        "save the file as UTF-8 text");
            return false;
        }
        if (c == '\n') {
            ++line;
            col = 1;
        } else {
            ++col;
        }
        i += n;
    }
    return true;
}

// ---------------------------------------------------------------------------------------------
// Tokens.

uint32_t cp_length(const antlr4::Token* t) {
    if (t->getStopIndex() < t->getStartIndex()) return 1;
    return static_cast<uint32_t>(t->getStopIndex() - t->getStartIndex() + 1);
}

SourceLoc token_loc(uint32_t file, const antlr4::Token* t) {
    return {file, static_cast<uint32_t>(t->getLine()),
            static_cast<uint32_t>(t->getCharPositionInLine() + 1), cp_length(t)};
}

std::string describe_char(const std::string& text) {
    unsigned char c = text.empty() ? 0 : static_cast<unsigned char>(text[0]);
    if (c < 0x20 || c == 0x7f) {
        char buf[16];
        std::snprintf(buf, sizeof buf, "U+%04X", c);
        return buf;
    }
    return "`" + text + "`";
}

bool is_operator(size_t type, const antlr4::dfa::Vocabulary& voc) {
    std::string lit = voc.getLiteralName(type);
    return lit == "'+'" || lit == "'-'" || lit == "'*'" || lit == "'/'" || lit == "'//'" ||
           lit == "'%'" || lit == "'**'";
}

bool is_separator(const std::string& lit) {
    return lit == "','" || lit == "':'" || lit == "'='" || lit == "'{'" || lit == "'}'";
}

// Refuses what the parser must never see; returns false (with diagnostics) on any such token.
// Brackets are matched here too: an unclosed `{` is reported where it opens, which says more
// than the parser's "unexpected end of file".
bool check_tokens(const std::vector<antlr4::Token*>& tokens, uint32_t file,
                  const antlr4::dfa::Vocabulary& voc, Diagnostics& diags) {
    bool ok = true;
    int operators = 0;
    std::vector<antlr4::Token*> open;
    for (antlr4::Token* t : tokens) {
        size_t type = t->getType();
        if (type == DistLexer::ERROR_CHAR) {
            std::string text = t->getText();
            diags.error(token_loc(file, t), "unexpected character " + describe_char(text),
                        text == ";" ? "no `;` is needed: spaces and newlines separate fields" : "");
            ok = false;
            continue;
        }
        if (type == DistLexer::UNTERMINATED_STRING) {
            diags.error(token_loc(file, t), "unterminated string",
                        "close it with `\"` on the same line");
            ok = false;
            continue;
        }
        // After a lexical error the brackets no longer say anything: only collect those errors.
        if (!ok || t->getChannel() != antlr4::Token::DEFAULT_CHANNEL) continue;
        std::string lit = voc.getLiteralName(type);
        if (lit == "'('" || lit == "'['" || lit == "'{'") {
            open.push_back(t);
            if (open.size() > static_cast<size_t>(max_nesting)) {
                diags.error(token_loc(file, t),
                            "nesting deeper than " + std::to_string(max_nesting) + " levels",
                            "flatten the expression or split it with `let`");
                return false;
            }
        } else if (lit == "')'" || lit == "']'" || lit == "'}'") {
            static const std::map<std::string, std::string> pair = {
                {"')'", "("}, {"']'", "["}, {"'}'", "{"}};
            const std::string& want = pair.at(lit);
            if (open.empty()) {
                diags.error(token_loc(file, t), "`" + t->getText() + "` closes nothing");
                return false;
            }
            if (open.back()->getText() != want) {
                diags.error(token_loc(file, t),
                            "`" + t->getText() + "` does not close the `" + open.back()->getText() +
                                "` at line " + std::to_string(open.back()->getLine()) +
                                ", column " +
                                std::to_string(open.back()->getCharPositionInLine() + 1));
                return false;
            }
            open.pop_back();
        }
        if (is_separator(lit)) {
            operators = 0;
        } else if (is_operator(type, voc)) {
            if (++operators > max_operators) {
                diags.error(token_loc(file, t),
                            "expression with more than " + std::to_string(max_operators) +
                                " operators",
                            "split it into named parts with `let`");
                return false;
            }
        }
    }
    if (ok && !open.empty()) {
        antlr4::Token* t = open.back();
        static const std::map<std::string, std::string> close = {
            {"(", ")"}, {"[", "]"}, {"{", "}"}};
        diags.error(token_loc(file, t), "this `" + t->getText() + "` is never closed",
                    "add the matching `" + close.at(t->getText()) + "`");
        return false;
    }
    return ok;
}

// ---------------------------------------------------------------------------------------------
// Syntax errors, phrased for people rather than for the grammar.

std::string token_description(size_t type, const antlr4::dfa::Vocabulary& voc) {
    switch (type) {
    case antlr4::Token::EOF: return "end of file";
    case DistParser::NAME: return "a name";
    case DistParser::INT: return "an integer";
    case DistParser::FLOAT: return "a number";
    case DistParser::STRING: return "a string";
    default: break;
    }
    std::string lit = voc.getLiteralName(type);
    if (lit.size() >= 2 && lit.front() == '\'') return "`" + lit.substr(1, lit.size() - 2) + "`";
    return voc.getSymbolicName(type);
}

class ErrorListener : public antlr4::BaseErrorListener {
  public:
    ErrorListener(uint32_t file, Diagnostics& diags, bool is_value)
        : file_(file), diags_(diags), is_value_(is_value) {}

    void syntaxError(antlr4::Recognizer* recognizer, antlr4::Token* offending, size_t line,
                     size_t col, const std::string& msg, std::exception_ptr) override {
        ++errors;
        auto* parser = dynamic_cast<antlr4::Parser*>(recognizer);
        // One error per top-level statement: what the parser reports after its first error in
        // a statement is mostly the echo of that error.
        // The same goes for the rest of its line, where recovery often restarts.
        ssize_t statement = parser ? statement_start(parser) : -1;
        size_t at_line = offending ? offending->getLine() : line;
        if ((statement >= 0 && statement == last_statement_) || at_line == last_line_) return;
        last_statement_ = statement;
        last_line_ = at_line;

        SourceLoc loc{file_, static_cast<uint32_t>(line), static_cast<uint32_t>(col + 1), 1};
        std::string found = is_value_ ? "end of the value" : "end of file";
        if (offending && offending->getType() != antlr4::Token::EOF) {
            loc = token_loc(file_, offending);
            std::string text = offending->getText();
            if (text.size() > 40) text = text.substr(0, 40) + "...";
            found = "`" + text + "`";
        } else if (parser) {
            // At the end of the input, point just past the last token rather than at the
            // empty line after it.
            auto* stream = parser->getTokenStream();
            for (ssize_t i = static_cast<ssize_t>(stream->index()) - 1; i >= 0; --i) {
                antlr4::Token* t = stream->get(static_cast<size_t>(i));
                if (t->getChannel() != antlr4::Token::DEFAULT_CHANNEL) continue;
                loc = token_loc(file_, t);
                loc.col += loc.length;
                loc.length = 1;
                break;
            }
        }
        std::string expected;
        if (parser) {
            std::vector<std::string> names;
            try {
                for (ssize_t t : parser->getExpectedTokens().toList()) {
                    if (t < 0) continue;
                    names.push_back(
                        token_description(static_cast<size_t>(t), parser->getVocabulary()));
                }
            } catch (...) {
                names.clear();
            }
            // Soft keywords are names too.
            if (std::find(names.begin(), names.end(), "a name") != names.end()) {
                names.erase(std::remove_if(names.begin(), names.end(),
                                           [](const std::string& n) {
                                               return n == "`x`" || n == "`rank`" || n == "`shard`";
                                           }),
                            names.end());
            }
            bool value_start = std::find(names.begin(), names.end(), "an integer") != names.end() &&
                               std::find(names.begin(), names.end(), "a name") != names.end();
            if (value_start && names.size() > 6) {
                expected = "; expected a value";
            } else if (names.size() == 1) {
                expected = "; expected " + names[0];
            } else if (!names.empty() && names.size() <= 6) {
                expected = "; expected ";
                for (size_t i = 0; i < names.size(); ++i) {
                    if (i) expected += (i + 1 == names.size()) ? " or " : ", ";
                    expected += names[i];
                }
            }
        }
        if (offending && expected.find("`" + offending->getText() + "`") != std::string::npos)
            expected.clear();
        std::string message;
        if (msg.rfind("missing ", 0) == 0 && expected.size() > 11) {
            message = "missing " + expected.substr(11) + " before " + found;
        } else {
            message = "unexpected " + found + expected;
        }
        diags_.error(loc, message, hint_for(parser, offending));
    }

    int errors = 0;

  private:
    static ssize_t statement_start(antlr4::Parser* parser) {
        antlr4::ParserRuleContext* ctx = parser->getContext();
        while (ctx && ctx->parent && !dynamic_cast<DistParser::ScriptContext*>(ctx->parent))
            ctx = dynamic_cast<antlr4::ParserRuleContext*>(ctx->parent);
        if (!ctx || !ctx->getStart()) return -1;
        return static_cast<ssize_t>(ctx->getStart()->getTokenIndex());
    }

    std::string hint_for(antlr4::Parser* parser, antlr4::Token* t) {
        if (!t || !parser) return {};
        bool in_block = false;
        for (auto* ctx = parser->getContext(); ctx;
             ctx = dynamic_cast<antlr4::ParserRuleContext*>(ctx->parent)) {
            if (dynamic_cast<DistParser::BlockBodyContext*>(ctx)) in_block = true;
        }
        if (t->getText() == "=" && in_block) return "fields are written `name: value`";
        return {};
    }

    uint32_t file_;
    Diagnostics& diags_;
    bool is_value_;
    ssize_t last_statement_ = -2;
    size_t last_line_ = 0;
};

// ---------------------------------------------------------------------------------------------
// Parse tree to AST.

class Builder {
  public:
    Builder(uint32_t file, Diagnostics& diags) : file_(file), diags_(diags) {}

    SourceLoc loc(antlr4::Token* t) const { return token_loc(file_, t); }

    // From the first token of a context to its last one when both are on one line.
    SourceLoc loc(antlr4::ParserRuleContext* ctx) const {
        SourceLoc l = token_loc(file_, ctx->getStart());
        antlr4::Token* stop = ctx->getStop();
        if (stop && stop->getLine() == ctx->getStart()->getLine() &&
            stop->getStartIndex() >= ctx->getStart()->getStartIndex()) {
            l.length =
                static_cast<uint32_t>(stop->getStopIndex() - ctx->getStart()->getStartIndex() + 1);
        }
        return l;
    }

    uint32_t end_line(antlr4::ParserRuleContext* ctx) const {
        antlr4::Token* stop = ctx->getStop();
        return stop ? static_cast<uint32_t>(stop->getLine()) : 0;
    }

    std::string ident(DistParser::IdentContext* ctx) { return ctx->getText(); }

    Script script(DistParser::ScriptContext* ctx) {
        Script s;
        s.file = file_;
        for (auto* st : ctx->statement()) s.statements.push_back(statement(st));
        return s;
    }

    Statement statement(DistParser::StatementContext* ctx) {
        Statement s;
        s.loc = loc(ctx->getStart());
        s.end_line = end_line(ctx);
        if (auto* c = ctx->importStmt()) {
            s.kind = Statement::Kind::import;
            s.name = string_value(c->STRING()->getSymbol());
            s.name_loc = loc(c->STRING()->getSymbol());
        } else if (auto* c = ctx->templateDef()) {
            s.kind = Statement::Kind::model_template;
            s.name = ident(c->ident());
            s.name_loc = loc(c->ident());
            for (auto* p : c->param()) {
                Param param;
                param.name = ident(p->ident());
                param.loc = loc(p->ident());
                if (p->expr()) param.default_value = expr(p->expr());
                s.params.push_back(std::move(param));
            }
            for (auto* m : c->modelItem()) s.body.push_back(model_item(m));
        } else if (auto* c = ctx->presetDef()) {
            s.kind = Statement::Kind::preset;
            s.name = ident(c->ident());
            s.name_loc = loc(c->ident());
            s.value = call(c->call());
        } else if (auto* c = ctx->letStmt()) {
            s.kind = Statement::Kind::let;
            s.name = ident(c->ident());
            s.name_loc = loc(c->ident());
            s.value = expr(c->expr());
        } else if (auto* c = ctx->modelStmt()) {
            s.kind = Statement::Kind::model;
            s.value = call(c->call());
        } else if (auto* c = ctx->block()) {
            s.kind = Statement::Kind::block;
            s.block = block(c);
            s.name = s.block->name;
            s.name_loc = s.block->loc;
        }
        return s;
    }

    std::unique_ptr<Block> block(DistParser::BlockContext* ctx) {
        return block_body(ident(ctx->ident()), loc(ctx->ident()), ctx->blockBody(), end_line(ctx));
    }

    std::unique_ptr<Block> block_body(std::string name, SourceLoc at,
                                      DistParser::BlockBodyContext* body, uint32_t last) {
        auto b = std::make_unique<Block>();
        b->name = std::move(name);
        b->loc = at;
        b->end_line = last;
        for (auto* item : body->blockItem()) {
            BlockItem bi;
            bi.end_line = end_line(item);
            if (auto* r = item->tableRow()) {
                bi.kind = BlockItem::Kind::row;
                bi.row.loc = loc(r->getStart());
                bi.row.rank = expr(r->expr());
                for (auto* n : r->NAME()) {
                    bi.row.actions.push_back(n->getText());
                    bi.row.action_locs.push_back(loc(n->getSymbol()));
                }
            } else if (item->blockBody()) {
                bi.kind = BlockItem::Kind::block;
                bi.block = block_body(ident(item->ident()), loc(item->ident()), item->blockBody(),
                                      end_line(item));
            } else {
                bi.kind = BlockItem::Kind::field;
                bi.field.name = ident(item->ident());
                bi.field.loc = loc(item->ident());
                bi.field.value = expr(item->value()->expr(0));
                if (item->value()->expr().size() > 1) bi.field.count = expr(item->value()->expr(1));
            }
            b->items.push_back(std::move(bi));
        }
        return b;
    }

    ModelItem model_item(DistParser::ModelItemContext* ctx) {
        ModelItem m;
        m.loc = loc(ctx->getStart());
        m.end_line = end_line(ctx);
        if (auto* l = ctx->letStmt()) {
            m.kind = ModelItem::Kind::let;
            m.name = ident(l->ident());
            m.name_loc = loc(l->ident());
            m.value = expr(l->expr());
            return m;
        }
        auto* ls = ctx->layerStmt();
        if (ls->ident()) {
            m.name = ident(ls->ident());
            m.name_loc = loc(ls->ident());
        }
        if (ls->shard()) {
            m.shard = ident(ls->shard()->ident());
            m.shard_loc = loc(ls->shard()->ident());
        }
        auto* le = ls->layerExpr();
        if (auto* c = dynamic_cast<DistParser::LayerCallContext*>(le)) {
            m.kind = ModelItem::Kind::layer;
            m.value = call(c->call());
        } else if (auto* r = dynamic_cast<DistParser::RepeatContext*>(le)) {
            m.kind = ModelItem::Kind::repeat;
            m.value = expr(r->expr());
            for (auto* i : r->modelItem()) m.body.push_back(model_item(i));
        } else if (auto* r = dynamic_cast<DistParser::ResidualContext*>(le)) {
            m.kind = ModelItem::Kind::residual;
            for (auto* i : r->modelItem()) m.body.push_back(model_item(i));
        }
        return m;
    }

    ExprPtr call(DistParser::CallContext* ctx) {
        auto e = std::make_unique<Expr>();
        e->kind = ExprKind::call;
        e->loc = loc(ctx->ident());
        e->text = ident(ctx->ident());
        for (auto* a : ctx->arg()) {
            Arg arg;
            if (a->ident()) {
                arg.name = ident(a->ident());
                arg.name_loc = loc(a->ident());
            }
            arg.value = expr(a->expr());
            e->args.push_back(std::move(arg));
        }
        return e;
    }

    ExprPtr expr(DistParser::ExprContext* ctx) {
        auto e = std::make_unique<Expr>();
        if (auto* p = dynamic_cast<DistParser::PrimContext*>(ctx)) return primary(p->primary());
        if (auto* u = dynamic_cast<DistParser::UnaryContext*>(ctx)) {
            e->kind = ExprKind::unary;
            e->loc = loc(u->op);
            e->text = u->op->getText();
            e->items.push_back(expr(u->expr()));
            return e;
        }
        antlr4::Token* op = nullptr;
        std::vector<DistParser::ExprContext*> operands;
        if (auto* b = dynamic_cast<DistParser::AddContext*>(ctx)) {
            op = b->op;
            operands = b->expr();
        } else if (auto* b = dynamic_cast<DistParser::MulContext*>(ctx)) {
            op = b->op;
            operands = b->expr();
        } else if (auto* b = dynamic_cast<DistParser::PowContext*>(ctx)) {
            op = dynamic_cast<antlr4::tree::TerminalNode*>(b->children.at(1))->getSymbol();
            operands = b->expr();
        }
        e->kind = ExprKind::binary;
        e->loc = loc(op);
        e->text = op->getText();
        e->items.push_back(expr(operands.at(0)));
        e->items.push_back(expr(operands.at(1)));
        return e;
    }

    ExprPtr primary(DistParser::PrimaryContext* ctx) {
        if (auto* n = ctx->number()) return number(n);
        if (auto* s = ctx->STRING()) {
            auto e = std::make_unique<Expr>();
            e->kind = ExprKind::string;
            e->loc = loc(s->getSymbol());
            e->text = string_value(s->getSymbol());
            return e;
        }
        if (auto* c = ctx->call()) return call(c);
        if (auto* i = ctx->ident()) {
            auto e = std::make_unique<Expr>();
            e->kind = ExprKind::name;
            e->loc = loc(i);
            e->text = ident(i);
            return e;
        }
        std::string first = ctx->getStart()->getText();
        if (first == "true" || first == "false") {
            auto e = std::make_unique<Expr>();
            e->kind = ExprKind::boolean;
            e->loc = loc(ctx->getStart());
            e->bool_value = first == "true";
            e->text = first;
            return e;
        }
        bool has_comma = false;
        for (auto* child : ctx->children) {
            if (child->getText() == ",") has_comma = true;
        }
        if (first == "(" && !has_comma) return expr(ctx->expr(0));
        auto e = std::make_unique<Expr>();
        e->kind = first == "[" ? ExprKind::list : ExprKind::tuple;
        e->loc = loc(ctx);
        for (auto* x : ctx->expr()) e->items.push_back(expr(x));
        return e;
    }

    ExprPtr number(DistParser::NumberContext* ctx) {
        auto e = std::make_unique<Expr>();
        antlr4::Token* t = ctx->INT() ? ctx->INT()->getSymbol() : ctx->FLOAT()->getSymbol();
        e->loc = loc(t);
        e->text = t->getText();
        if (ctx->unit()) e->unit = ctx->unit()->getText();
        std::string digits;
        for (char c : e->text)
            if (c != '_') digits += c;
        if (ctx->INT()) {
            e->kind = ExprKind::integer;
            errno = 0;
            char* end = nullptr;
            long long v = std::strtoll(digits.c_str(), &end, 10);
            if (errno == ERANGE) {
                diags_.error(e->loc, "integer `" + e->text + "` is too large",
                             "integers are 64-bit: at most 9223372036854775807");
            }
            e->int_value = v;
        } else {
            e->kind = ExprKind::real;
            errno = 0;
            double v = std::strtod(digits.c_str(), nullptr);
            if (errno == ERANGE && (std::isinf(v) || v != 0.0)) {
                diags_.error(e->loc, "number `" + e->text + "` is out of range",
                             "numbers are 64-bit floating point");
            }
            e->real_value = v;
        }
        return e;
    }

    // The value of a string token: quotes removed and escapes resolved.
    std::string string_value(antlr4::Token* t) {
        std::string raw = t->getText();
        std::string out;
        for (size_t i = 1; i + 1 < raw.size(); ++i) {
            if (raw[i] != '\\') {
                out += raw[i];
                continue;
            }
            char n = raw[++i];
            switch (n) {
            case 'n': out += '\n'; break;
            case 't': out += '\t'; break;
            case '"': out += '"'; break;
            case '\\': out += '\\'; break;
            default: {
                SourceLoc l = loc(t);
                l.col += static_cast<uint32_t>(i - 1);
                l.length = 2;
                diags_.error(l, std::string("unknown escape `\\") + n + "` in string",
                             "the escapes are \\n, \\t, \\\" and \\\\");
            }
            }
        }
        return out;
    }

  private:
    uint32_t file_;
    Diagnostics& diags_;
};

// Everything one parse needs, kept alive together.
struct Session {
    antlr4::ANTLRInputStream input;
    DistLexer lexer;
    antlr4::CommonTokenStream tokens;
    DistParser parser;

    explicit Session(const std::string& text)
        : input(text), lexer(&input), tokens(&lexer), parser(&tokens) {
        lexer.removeErrorListeners();
        parser.removeErrorListeners();
    }
};

std::vector<Comment> collect_comments(antlr4::CommonTokenStream& tokens) {
    std::vector<Comment> out;
    size_t last_code_line = 0;
    for (antlr4::Token* t : tokens.getTokens()) {
        if (t->getType() == DistLexer::COMMENT) {
            std::string text = t->getText();
            while (!text.empty() &&
                   (text.back() == ' ' || text.back() == '\t' || text.back() == '\r'))
                text.pop_back();
            out.push_back({static_cast<uint32_t>(t->getLine()),
                           static_cast<uint32_t>(t->getCharPositionInLine() + 1), text,
                           t->getLine() != last_code_line});
        } else if (t->getChannel() == antlr4::Token::DEFAULT_CHANNEL) {
            last_code_line = t->getLine();
        }
    }
    return out;
}

} // namespace

std::unique_ptr<Script> parse_script(const SourceManager& sources, uint32_t file,
                                     Diagnostics& diags) {
    const SourceFile& f = sources.file(file);
    if (!check_bytes(f, file, diags)) return nullptr;
    Session s(f.text());
    s.tokens.fill();
    if (!check_tokens(s.tokens.getTokens(), file, s.lexer.getVocabulary(), diags)) return nullptr;

    ErrorListener listener(file, diags, false);
    s.parser.addErrorListener(&listener);
    DistParser::ScriptContext* tree = s.parser.script();
    if (listener.errors > 0) return nullptr;

    size_t before = diags.error_count();
    Builder b(file, diags);
    auto script = std::make_unique<Script>(b.script(tree));
    script->comments = collect_comments(s.tokens);
    if (diags.error_count() > before) return nullptr;
    return script;
}

ExprPtr parse_set_value(const SourceManager& sources, uint32_t file, size_t value_offset,
                        Diagnostics& diags, ExprPtr& count) {
    const SourceFile& f = sources.file(file);
    if (!check_bytes(f, file, diags)) return nullptr;
    std::string text = f.text();
    for (size_t i = 0; i < value_offset && i < text.size(); ++i) text[i] = ' ';
    Session s(text);
    s.tokens.fill();
    if (!check_tokens(s.tokens.getTokens(), file, s.lexer.getVocabulary(), diags)) return nullptr;
    ErrorListener listener(file, diags, true);
    s.parser.addErrorListener(&listener);
    DistParser::SetValueContext* tree = s.parser.setValue();
    if (listener.errors > 0) return nullptr;
    size_t before = diags.error_count();
    Builder b(file, diags);
    ExprPtr value = b.expr(tree->value()->expr(0));
    if (tree->value()->expr().size() > 1) count = b.expr(tree->value()->expr(1));
    if (diags.error_count() > before) return nullptr;
    return value;
}

} // namespace dist::lang
