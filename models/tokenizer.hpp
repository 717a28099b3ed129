// tokenizer.hpp: GPT-2's byte-level byte-pair encoding, read from a Hugging Face tokenizer's
// `vocab.json` and `merges.txt`, for models trained with it (GPT-2's checkpoints).
//
// Text is split into words the way GPT-2's pattern splits it (contractions, letters, digits,
// other symbols, each with an optional leading space; runs of white space), every byte of a word
// becomes one of 256 printable characters, and the word's adjacent pairs are merged in the
// order of merges.txt. Decoding maps the characters back to bytes, so any byte string round
// trips. Letters, numbers and white space are the Unicode classes of GPT-2's pattern, as
// JavaScript defines them (unicode_classes.hpp); a byte that starts no valid UTF-8 character is
// a symbol of its own.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace dist::models {

class BpeTokenizer {
  public:
    /// Reads `dir`/vocab.json and `dir`/merges.txt; "" or an error naming the file and line.
    static std::string load(const std::string& dir, BpeTokenizer& out);
    /// From the two files' contents (tests build small ones by hand).
    static std::string from_text(const std::string& vocab_json, const std::string& merges,
                                 BpeTokenizer& out);

    /// GPT-2's pre-tokenization: `text` cut into the words its pattern matches, in order.
    static std::vector<std::string> split(const std::string& text);
    /// Token ids of `text`. Throws std::invalid_argument when a piece has no id in the vocabulary.
    std::vector<int32_t> encode(const std::string& text) const;
    /// The bytes of one token ("" for an unknown id).
    std::string decode(int32_t id) const;
    std::string decode(const std::vector<int32_t>& ids) const;
    int64_t size() const { return static_cast<int64_t>(tokens_.size()); }
    /// The id of a token given by its characters (GPT-2's "<|endoftext|>" is 50256), if any.
    std::optional<int32_t> id_of(const std::string& token) const {
        auto it = ids_.find(token);
        if (it == ids_.end()) return std::nullopt;
        return it->second;
    }

  private:
    std::vector<std::string> bpe(const std::string& word) const;

    std::unordered_map<std::string, int32_t> ids_;
    std::vector<std::string> tokens_; // id -> its characters (UTF-8)
    std::map<std::pair<std::string, std::string>, int32_t> ranks_;
    std::vector<std::string> byte_chars_;        // byte -> its character (UTF-8)
    std::unordered_map<std::string, int> bytes_; // character -> byte
};

} // namespace dist::models
