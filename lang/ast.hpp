// ast.hpp: the syntax tree of a .dist script, as parse.cpp builds it from ANTLR's parse tree.
//
// Plain structs that own their children; every node carries its SourceLoc. The checker reads
// this tree, `--set` overrides edit it, and the formatter prints it back with its comments.
#pragma once

#include "lang/source.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace dist::lang {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

enum class ExprKind { integer, real, string, boolean, name, unary, binary, call, tuple, list };

/// A named or positional argument of a call.
struct Arg {
    std::string name; // empty for a positional argument
    SourceLoc name_loc;
    ExprPtr value;
};

/// An expression. `text` holds the lexeme of a number, the value of a string, the identifier of
/// a name or call, or the operator of a unary / binary expression.
struct Expr {
    ExprKind kind = ExprKind::integer;
    SourceLoc loc;
    std::string text;
    std::string unit;        // byte unit of a number (`GiB`), or empty
    int64_t int_value = 0;   // integer literals (before the unit is applied)
    double real_value = 0.0; // real literals
    bool bool_value = false;
    std::vector<ExprPtr> items; // operands, tuple and list elements
    std::vector<Arg> args;      // call arguments
};

/// `name: value` in a block; `count` is set for `devices: h200 x 8`.
struct Field {
    std::string name;
    SourceLoc loc;
    ExprPtr value;
    ExprPtr count;
};

/// `rank 0: 0F0 0F1 ...` in a custom schedule's `actions` block.
struct TableRow {
    SourceLoc loc;
    ExprPtr rank;
    std::vector<std::string> actions;
    std::vector<SourceLoc> action_locs;
};

struct Block;

/// One entry of a block: a field, a nested block or a table row.
struct BlockItem {
    enum class Kind { field, block, row } kind = Kind::field;
    Field field;
    std::unique_ptr<Block> block;
    TableRow row;
    uint32_t end_line = 0;
};

/// `name { ... }`.
struct Block {
    std::string name;
    SourceLoc loc;
    std::vector<BlockItem> items;
    uint32_t end_line = 0;
};

/// One entry of a model template body.
struct ModelItem {
    enum class Kind { let, layer, repeat, residual } kind = Kind::layer;
    SourceLoc loc;
    std::string name; // let name or layer label ("" when unlabelled)
    SourceLoc name_loc;
    ExprPtr value; // let value, repeat count, or the layer call
    std::string shard;
    SourceLoc shard_loc;
    std::vector<ModelItem> body; // repeat / residual
    uint32_t end_line = 0;
};

struct Param {
    std::string name;
    SourceLoc loc;
    ExprPtr default_value;
};

/// A top-level statement.
struct Statement {
    enum class Kind { import, model_template, preset, let, model, block } kind = Kind::let;
    SourceLoc loc;
    std::string name; // import path, template / preset / let name
    SourceLoc name_loc;
    ExprPtr value;                // let value, preset call, model call
    std::vector<Param> params;    // model template
    std::vector<ModelItem> body;  // model template
    std::unique_ptr<Block> block; // block
    uint32_t end_line = 0;
};

/// A `#` comment, kept for the formatter.
struct Comment {
    uint32_t line = 0;
    uint32_t col = 0;
    std::string text;
    bool own_line = true; // nothing but white space before it on its line
};

struct Script {
    uint32_t file = 0;
    std::vector<Statement> statements;
    std::vector<Comment> comments;
};

/// A location-free rendering of the tree (S-expressions), for golden tests and round trips.
std::string dump(const Script& script);
std::string dump(const Expr& expr);

ExprPtr clone(const Expr& e);

} // namespace dist::lang
