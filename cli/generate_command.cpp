// generate_command.cpp: `dist generate`: saved weights continue prompts on the script's mesh,
// through key/value caches, the text streamed to stdout as it is produced.
#include "cli/planned.hpp"

#include "actors/plan/lower.hpp"
#include "actors/runtime/generate.hpp"
#include "lang/check.hpp"
#include "lang/loader.hpp"
#include "models/checkpoint.hpp"
#include "models/tokenizer.hpp"

#include <chrono>
#include <istream>
#include <ostream>

namespace dist::cli {

namespace {

// A byte-level model's token as text: control bytes other than newline and tab as '?'.
std::string byte_text(int32_t t) {
    char c = static_cast<char>(t);
    return std::string(1, (t < 32 && c != '\n' && c != '\t') || t == 127 ? '?' : c);
}

} // namespace

int run_generate(const CommonOptions& o, const std::string& load, const std::string& tokenizer,
                 const std::vector<std::string>& given, std::istream& in, std::ostream& out,
                 std::ostream& err) {
    std::optional<Planned> plan = planned(o, err);
    if (!plan) return 1;
    const Program& p = plan->program;
    if (!runs_here(p, err)) return 1;
    models::BpeTokenizer bpe;
    if (!tokenizer.empty()) {
        if (std::string e = models::BpeTokenizer::load(tokenizer, bpe); !e.empty()) {
            err << "error: " << e << "\n";
            return 1;
        }
        if (bpe.size() > p.model.vocab) {
            err << "error: the tokenizer has " << bpe.size() << " tokens; the model's vocabulary "
                << p.model.vocab << "\n";
            return 1;
        }
    } else if (p.model.vocab != 256) {
        err << "error: without --tokenizer, prompts are read as bytes, which needs a vocabulary of "
               "256; the model has "
            << p.model.vocab
            << "\nhint: --tokenizer DIR, a folder with GPT-2's vocab.json and "
               "merges.txt\n";
        return 1;
    }
    auto text_of = [&](int32_t t) { return tokenizer.empty() ? byte_text(t) : bpe.decode(t); };
    std::vector<std::string> prompts = given;
    if (prompts.empty()) {
        std::string line;
        while (std::getline(in, line))
            if (!line.empty()) prompts.push_back(line);
    }
    if (prompts.empty()) {
        err << "error: no prompt: give --prompt TEXT or lines on standard input\n";
        return 2;
    }
    models::Model whole(p.model, static_cast<uint64_t>(p.train.seed), Recompute::none, nullptr,
                        p.train.precision);
    if (std::string e = models::load_weights(load, whole); !e.empty()) {
        err << "error: " << e << "\n";
        return 1;
    }
    std::vector<std::vector<int32_t>> tokens;
    try {
        for (const auto& s : prompts) {
            if (!tokenizer.empty()) {
                tokens.push_back(bpe.encode(s));
            } else {
                tokens.emplace_back();
                for (unsigned char c : s) tokens.back().push_back(c);
            }
        }
    } catch (const std::exception& e) {
        err << "error: " << e.what() << "\n";
        return 1;
    }
    runtime::Generator gen(p, plan->graph, whole);
    auto start = std::chrono::steady_clock::now();
    std::vector<std::vector<int32_t>> texts;
    try {
        // One prompt streams token by token; several print in order once all are done.
        bool stream = tokens.size() == 1;
        texts = gen.generate(tokens, p.generate, static_cast<uint64_t>(p.train.seed),
                             [&](size_t, int32_t t) {
                                 if (stream) out << text_of(t) << std::flush;
                             });
        if (stream) {
            out << "\n";
        } else {
            for (const auto& t : texts) {
                for (int32_t c : t) out << text_of(c);
                out << "\n";
            }
        }
    } catch (const std::exception& e) {
        err << "error: " << e.what() << "\n";
        return 1;
    }
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    size_t n = 0;
    for (const auto& t : texts) n += t.size();
    char line[160];
    std::snprintf(line, sizeof line, "%zu tokens in %.2f s (%.0f tokens/s) for %zu prompt%s\n", n,
                  secs, secs > 0 ? static_cast<double>(n) / secs : 0.0, texts.size(),
                  texts.size() == 1 ? "" : "s");
    err << line;
    return 0;
}

} // namespace dist::cli
