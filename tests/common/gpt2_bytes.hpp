// gpt2_bytes.hpp: GPT-2's stand-in character for each byte, written out from its definition
// (not from the tokenizer under test): printable Latin-1 bytes stand for themselves, the other
// 68 take code points 256, 257, ... in byte order. For the tokenizer's tests.
#pragma once

#include <string>
#include <vector>

namespace dist::tests {

inline std::string gpt2_byte_char(int b) {
    static const std::vector<std::string> table = [] {
        std::vector<std::string> t(256);
        int next = 256;
        for (int c = 0; c < 256; ++c) {
            bool printable = (c >= 33 && c <= 126) || (c >= 161 && c <= 172) || c >= 174;
            int cp = printable ? c : next++;
            std::string s;
            if (cp < 0x80) {
                s += static_cast<char>(cp);
            } else {
                s += static_cast<char>(0xC0 | (cp >> 6));
                s += static_cast<char>(0x80 | (cp & 0x3F));
            }
            t[static_cast<size_t>(c)] = s;
        }
        return t;
    }();
    return table[static_cast<size_t>(b)];
}

} // namespace dist::tests
