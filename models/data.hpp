// data.hpp: the training data of a run, as a token stream in memory, and the batches cut from it.
//
// The first stage of the training data flow: a file (raw text under a byte tokenizer, or an
// llm.c .bin of uint16 tokens) becomes a TokenData; each step asks it for the batch of that step
// and each evaluation for its windows, as int32 (B,T) arrays that the model's embedding takes.
// A step's batch is drawn from a counter-based generator keyed by (seed, step, row), never from
// a generator with state, so it depends on (seed, step) alone: every mesh sees the same global
// batch, each data-parallel rank takes its slice of rows, and a resumed run continues exactly.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dist::models {

/// A token stream in memory: bytes of a text file (byte tokenizer, vocab 256) or the tokens of an
/// llm.c .bin file.
class TokenData {
  public:
    /// Every byte of a text file is one token (0..255). Errors: missing file, not a regular
    /// file, unreadable, empty, fewer than `min_tokens` tokens (the message says how many there
    /// are and how many a step needs). "" on success; `out` is changed only on success.
    static std::string load_text(const std::string& path, int64_t min_tokens, TokenData& out);

    /// llm.c's format: a header of 256 little-endian int32 (header[0] = 20240520 magic,
    /// header[1] = 1 version, header[2] = token count), then that many little-endian uint16
    /// tokens. Errors name the file and, where it applies, the byte offset: missing or
    /// unreadable file, wrong magic, file shorter than the header, unsupported version, a token
    /// count that disagrees with the file size, fewer than `min_tokens` tokens, a token >=
    /// `vocab` (a .bin may be GPT-2's, vocab 50257). "" on success; `out` is changed only on
    /// success.
    static std::string load_bin(const std::string& path, int32_t vocab, int64_t min_tokens,
                                TokenData& out);

    /// Writes `tokens` in llm.c's .bin format atomically (a temp file in the same folder, fsync,
    /// rename, fsync of the folder); "" on success. Used by tests and tools.
    /// Tokens already in memory (synthetic data); an error when there are none.
    static std::string from_tokens(const std::vector<uint16_t>& tokens, TokenData& out);
    static std::string write_bin(const std::string& path, const std::vector<uint16_t>& tokens);

    /// Number of tokens in the stream.
    int64_t size() const { return static_cast<int64_t>(tokens_.size()); }
    /// The stream itself.
    const std::vector<int32_t>& tokens() const { return tokens_; }

    /// The training batch of step `step`: B windows of T+1 consecutive tokens, window b starting
    /// at an offset drawn from hash64(seed, step, b), uniform over [0, size - T - 1].
    /// inputs (B,T) = window[0..T), targets (B,T) = window[1..T+1). The data-parallel rank
    /// `dp_rank` of `dp` ranks takes rows [dp_rank*B/dp, (dp_rank+1)*B/dp) of that global batch,
    /// written into inputs and targets of shape (B/dp, T). Requires size >= T+1 (load with
    /// min_tokens = T+1), B divisible by dp, 0 <= dp_rank < dp.
    void batch(uint64_t seed, int64_t step, int64_t B, int64_t T, int64_t dp_rank, int64_t dp,
               int32_t* inputs, int32_t* targets) const;

    /// Evaluation windows: the stream cut into consecutive non-overlapping windows of T+1 tokens
    /// starting at 0, T+1, 2(T+1), ... (a last partial window dropped); the number of windows.
    int64_t eval_windows(int64_t T) const;

    /// Window w's inputs (T) = tokens [w(T+1), w(T+1)+T) and targets (T), the same shifted by
    /// one. Requires 0 <= w < eval_windows(T).
    void eval_window(int64_t w, int64_t T, int32_t* inputs, int32_t* targets) const;

  private:
    std::vector<int32_t> tokens_;
};

/// A counter-based 64-bit hash (splitmix64's finaliser applied over the combined key): the
/// random generator behind batch(), exposed for tests and for parameter initialisation
/// elsewhere. For any two fixed arguments it is a bijection of the third, so consecutive
/// counters never collide.
uint64_t hash64(uint64_t a, uint64_t b, uint64_t c);

} // namespace dist::models
