// tokenizer.cpp: GPT-2's byte-level BPE.
#include "models/tokenizer.hpp"

#include "models/unicode_classes.hpp"

#include <nlohmann/json.hpp>

#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>

namespace dist::models {

namespace {

std::string utf8(uint32_t cp) {
    std::string s;
    if (cp < 0x80) {
        s += static_cast<char>(cp);
    } else if (cp < 0x800) {
        s += static_cast<char>(0xC0 | (cp >> 6));
        s += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
        s += static_cast<char>(0xE0 | (cp >> 12));
        s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        s += static_cast<char>(0x80 | (cp & 0x3F));
    }
    return s;
}

// Length of the UTF-8 sequence starting with byte c (1 for stray continuation bytes).
size_t utf8_length(unsigned char c) {
    return c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
}

// One character of the text: its code point, or `invalid` for a byte that starts no valid
// UTF-8 sequence (kept as it is: the bytes of any text round trip).
constexpr char32_t invalid = 0xFFFFFFFF;

std::pair<char32_t, size_t> decode_at(const std::string& text, size_t i) {
    auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
    const unsigned char c = byte(i);
    if (c < 0x80) return {c, 1};
    size_t len = c >= 0xF0 && c < 0xF5 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 && c < 0xE0 ? 2 : 0;
    if (len == 0 || i + len > text.size()) return {invalid, 1};
    char32_t cp = c & (len == 2 ? 0x1F : len == 3 ? 0x0F : 0x07);
    for (size_t k = 1; k < len; ++k) {
        if ((byte(i + k) & 0xC0) != 0x80) return {invalid, 1};
        cp = (cp << 6) | (byte(i + k) & 0x3F);
    }
    // Overlong forms, surrogates and values past U+10FFFF are not characters.
    if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
        (cp >= 0xD800 && cp <= 0xDFFF))
        return {invalid, 1};
    return {cp, len};
}

enum class Kind { letter, number, space, other };

Kind kind_of(char32_t cp) {
    if (cp == invalid) return Kind::other;
    if (unicode::is_letter(cp)) return Kind::letter;
    if (unicode::is_number(cp)) return Kind::number;
    if (unicode::is_space(cp)) return Kind::space;
    return Kind::other;
}

} // namespace

// GPT-2's pattern 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+,
// applied left to right as a regular expression engine does.
std::vector<std::string> BpeTokenizer::split(const std::string& text) {
    // The characters, with where each starts.
    std::vector<Kind> kinds;
    std::vector<size_t> at;
    for (size_t i = 0; i < text.size();) {
        auto [cp, len] = decode_at(text, i);
        kinds.push_back(kind_of(cp));
        at.push_back(i);
        i += len;
    }
    const size_t n = kinds.size();
    at.push_back(text.size());
    std::vector<std::string> words;
    size_t i = 0;
    while (i < n) {
        if (text[at[i]] == '\'') {
            bool matched = false;
            for (const char* suffix : {"s", "t", "re", "ve", "m", "ll", "d"}) {
                std::string s(suffix);
                if (text.compare(at[i] + 1, s.size(), s) == 0) {
                    words.push_back(text.substr(at[i], s.size() + 1));
                    i += s.size() + 1; // ASCII: one character per byte
                    matched = true;
                    break;
                }
            }
            if (matched) continue;
        }
        size_t start = i, j = i;
        // A space joins the word after it, of whatever kind, unless that is white space too.
        if (text[at[i]] == ' ' && i + 1 < n && kinds[i + 1] != Kind::space) ++j;
        const Kind k = kinds[j];
        while (j < n && kinds[j] == k) ++j;
        // White space followed by more text leaves its last character to what follows (a
        // space joins the next word; any other is a word of its own).
        if (k == Kind::space && j < n && j - start > 1) --j;
        words.push_back(text.substr(at[start], at[j] - at[start]));
        i = j;
    }
    return words;
}

namespace {

std::string read_file(const std::string& path, std::string& error) {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
        error = "cannot read `" + path + "`";
        return {};
    }
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

} // namespace

std::string BpeTokenizer::load(const std::string& dir, BpeTokenizer& out) {
    std::string error;
    std::string vocab = read_file(dir + "/vocab.json", error);
    if (!error.empty()) return error;
    std::string merges = read_file(dir + "/merges.txt", error);
    if (!error.empty()) return error;
    error = from_text(vocab, merges, out);
    return error.empty() ? "" : dir + ": " + error;
}

std::string BpeTokenizer::from_text(const std::string& vocab_json, const std::string& merges,
                                    BpeTokenizer& out) {
    out = BpeTokenizer();
    // GPT-2's printable stand-ins for the 256 bytes.
    out.byte_chars_.resize(256);
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
        bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        std::string ch = utf8(printable ? b : next++);
        out.byte_chars_[b] = ch;
        out.bytes_[ch] = static_cast<int>(b);
    }
    nlohmann::json vocab;
    try {
        vocab = nlohmann::json::parse(vocab_json);
    } catch (const nlohmann::json::parse_error& e) {
        return std::string("vocab.json is not JSON: ") + e.what();
    }
    if (!vocab.is_object()) return "vocab.json is not an object of token: id";
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
        if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
            it.value().get<int64_t>() > std::numeric_limits<int32_t>::max())
            return "vocab.json: the id of `" + it.key() + "` is not a non-negative integer";
        auto id = it.value().get<int32_t>();
        out.ids_[it.key()] = id;
        if (static_cast<size_t>(id) >= out.tokens_.size()) out.tokens_.resize(id + 1);
        out.tokens_[static_cast<size_t>(id)] = it.key();
    }
    std::istringstream lines(merges);
    std::string line;
    int32_t rank = 0, number = 0;
    while (std::getline(lines, line)) {
        ++number;
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (line.empty() || line.rfind("#version", 0) == 0) continue;
        size_t space = line.find(' ');
        if (space == std::string::npos || space == 0 || space + 1 == line.size() ||
            line.find(' ', space + 1) != std::string::npos)
            return "merges.txt:" + std::to_string(number) + ": expected two symbols, found `" +
                   line + "`";
        out.ranks_.emplace(std::make_pair(line.substr(0, space), line.substr(space + 1)), rank++);
    }
    return {};
}

std::vector<std::string> BpeTokenizer::bpe(const std::string& word) const {
    std::vector<std::string> symbols;
    for (unsigned char c : word) symbols.push_back(byte_chars_[c]);
    while (symbols.size() > 1) {
        int32_t best = std::numeric_limits<int32_t>::max();
        size_t at = 0;
        for (size_t i = 0; i + 1 < symbols.size(); ++i) {
            auto it = ranks_.find({symbols[i], symbols[i + 1]});
            if (it != ranks_.end() && it->second < best) {
                best = it->second;
                at = i;
            }
        }
        if (best == std::numeric_limits<int32_t>::max()) break;
        // Merge every occurrence of the best pair, left to right.
        std::string a = symbols[at], b = symbols[at + 1];
        std::vector<std::string> merged;
        for (size_t i = 0; i < symbols.size(); ++i) {
            if (i + 1 < symbols.size() && symbols[i] == a && symbols[i + 1] == b) {
                merged.push_back(a + b);
                ++i;
            } else {
                merged.push_back(symbols[i]);
            }
        }
        symbols = std::move(merged);
    }
    return symbols;
}

std::vector<int32_t> BpeTokenizer::encode(const std::string& text) const {
    std::vector<int32_t> ids;
    for (const std::string& word : split(text)) {
        for (const std::string& piece : bpe(word)) {
            auto it = ids_.find(piece);
            if (it == ids_.end())
                throw std::invalid_argument("the tokenizer's vocabulary has no `" + piece + "`");
            ids.push_back(it->second);
        }
    }
    return ids;
}

std::string BpeTokenizer::decode(int32_t id) const {
    if (id < 0 || static_cast<size_t>(id) >= tokens_.size()) return {};
    const std::string& chars = tokens_[static_cast<size_t>(id)];
    std::string bytes;
    for (size_t i = 0; i < chars.size();) {
        size_t len = utf8_length(static_cast<unsigned char>(chars[i]));
        auto it = bytes_.find(chars.substr(i, len));
        if (it != bytes_.end()) bytes += static_cast<char>(it->second);
        i += len;
    }
    return bytes;
}

std::string BpeTokenizer::decode(const std::vector<int32_t>& ids) const {
    std::string out;
    for (int32_t id : ids) out += decode(id);
    return out;
}

} // namespace dist::models
