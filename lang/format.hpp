// format.hpp: `dist fmt`, the canonical layout of a script.
//
// Prints the AST back with four-space indentation, one field or layer per line, normalised
// spacing and minimal parentheses, keeping every comment and at most one blank line where the
// source had any. Formatting its own output changes nothing.
#pragma once

#include "lang/ast.hpp"

#include <string>

namespace dist::lang {

std::string format_script(const Script& script);

} // namespace dist::lang
