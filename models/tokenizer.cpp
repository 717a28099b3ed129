// tokenizer.cpp: GPT-2's byte-level BPE.
#include "models/tokenizer.hpp"

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

bool is_space(unsigned char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}
bool is_letter(unsigned char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80;
}
bool is_digit(unsigned char c) {
    return c >= '0' && c <= '9';
}

// GPT-2's split: 's 't 're 've 'm 'll 'd | ?letters | ?digits | ?other | spaces(?!\S) | spaces.
std::vector<std::string> split_words(const std::string& text) {
    std::vector<std::string> words;
    size_t i = 0, n = text.size();
    auto run = [&](size_t j, auto pred) {
        while (j < n) {
            unsigned char c = static_cast<unsigned char>(text[j]);
            if (!pred(c)) break;
            j += c >= 0x80 ? utf8_length(c) : 1;
        }
        return std::min(j, n);
    };
    while (i < n) {
        unsigned char c = static_cast<unsigned char>(text[i]);
        if (c == '\'') {
            bool matched = false;
            for (const char* suffix : {"s", "t", "re", "ve", "m", "ll", "d"}) {
                std::string s(suffix);
                if (text.compare(i + 1, s.size(), s) == 0) {
                    words.push_back(text.substr(i, s.size() + 1));
                    i += s.size() + 1;
                    matched = true;
                    break;
                }
            }
            if (matched) continue;
        }
        size_t start = i, j = i;
        if (c == ' ' && i + 1 < n && !is_space(static_cast<unsigned char>(text[i + 1]))) {
            ++j; // the leading space belongs to the word after it
            c = static_cast<unsigned char>(text[j]);
        }
        if (is_letter(c)) {
            j = run(j, is_letter);
        } else if (is_digit(c)) {
            j = run(j, is_digit);
        } else if (!is_space(c)) {
            j = run(j,
                    [](unsigned char x) { return !is_space(x) && !is_letter(x) && !is_digit(x); });
        } else {
            // White space: a run, leaving its last character to what follows (a space joins the
            // next word; any other is a word of its own).
            j = run(j, is_space);
            if (j < n && j - start > 1) --j;
        }
        words.push_back(text.substr(start, j - start));
        i = j;
    }
    return words;
}

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
    for (const std::string& word : split_words(text)) {
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
