// parse.hpp: text to AST. The only place where ANTLR is used.
//
// Before ANTLR sees a byte, the text is checked for NUL bytes and invalid UTF-8, and the token
// stream for unknown characters, unterminated strings, nesting deeper than `max_nesting` and
// expressions with more than `max_operators` operators; so neither the generated parser nor any
// later tree walk can run out of stack, whatever the input.
#pragma once

#include "lang/ast.hpp"
#include "lang/diagnostics.hpp"

#include <memory>

namespace dist::lang {

inline constexpr int max_nesting = 64;
inline constexpr int max_operators = 256;

/// Parses one source; returns null (with diagnostics) when it has any syntax error.
std::unique_ptr<Script> parse_script(const SourceManager& sources, uint32_t file,
                                     Diagnostics& diags);

/// Parses the value of a `--set KEY=VALUE` (an expression, or `name x count`) whose source is
/// the whole `KEY=VALUE` text; the value starts at byte `value_offset` (the key is ASCII, so
/// columns stay those of the whole text). Returns null on error; `count` receives the device
/// count when one is written.
ExprPtr parse_set_value(const SourceManager& sources, uint32_t file, size_t value_offset,
                        Diagnostics& diags, ExprPtr& count);

} // namespace dist::lang
