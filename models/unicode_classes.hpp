// unicode_classes.hpp: the Unicode classes of GPT-2's pre-tokenizer pattern, as JavaScript's
// regular expressions define them (\p{L} letters, \p{N} numbers, \s white space), generated
// from Node's tables by scripts/unicode-classes.js into unicode_classes.cpp.
#pragma once

namespace dist::models::unicode {

bool is_letter(char32_t cp);
bool is_number(char32_t cp);
bool is_space(char32_t cp);

} // namespace dist::models::unicode
