// tokenize_command.cpp: `dist tokenize`, text files to GPT-2 token ids in llm.c's .bin format.
#include "cli/commands.hpp"

#include "models/data.hpp"
#include "models/tokenizer.hpp"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <ostream>
#include <sstream>

namespace dist::cli {

int run_tokenize(const TokenizeOptions& t, std::ostream& out, std::ostream& err) {
    models::BpeTokenizer tok;
    if (std::string e = models::BpeTokenizer::load(t.tokenizer, tok); !e.empty()) {
        err << "error: " << e << "\n";
        return 1;
    }
    // llm.c's files hold uint16 tokens.
    if (tok.size() > 65536) {
        err << "error: " << t.tokenizer << ": a vocabulary of " << tok.size()
            << " tokens does not fit the 16-bit tokens of a .bin file\n";
        return 1;
    }
    std::optional<int32_t> eot;
    if (t.eot) {
        eot = tok.id_of("<|endoftext|>");
        if (!eot) {
            err << "error: " << t.tokenizer
                << "/vocab.json: --eot needs the token `<|endoftext|>`, which it does not have\n";
            return 1;
        }
    }
    std::vector<uint16_t> tokens;
    int64_t bytes = 0;
    for (const std::string& path : t.inputs) {
        std::error_code ec;
        if (!std::filesystem::is_regular_file(path, ec)) {
            err << "error: `" << path
                << "`: " << (std::filesystem::exists(path, ec) ? "not a file" : "no such file")
                << "\n";
            return 1;
        }
        std::ifstream in(path, std::ios::binary);
        std::stringstream text;
        text << in.rdbuf();
        if (!in.good() && !in.eof()) {
            err << "error: cannot read `" << path << "`\n";
            return 1;
        }
        const std::string s = text.str();
        bytes += static_cast<int64_t>(s.size());
        // Each document begins with the end-of-text token, as llm.c's data scripts write it.
        if (eot) tokens.push_back(static_cast<uint16_t>(*eot));
        try {
            for (int32_t id : tok.encode(s)) tokens.push_back(static_cast<uint16_t>(id));
        } catch (const std::invalid_argument& e) {
            err << "error: `" << path << "`: " << e.what() << "\n";
            return 1;
        }
    }
    if (tokens.empty()) {
        err << "error: the inputs hold no text: nothing to write to `" << t.out << "`\n";
        return 1;
    }
    if (std::string e = models::TokenData::write_bin(t.out, tokens); !e.empty()) {
        err << "error: " << e << "\n";
        return 1;
    }
    char ratio[32];
    std::snprintf(ratio, sizeof ratio, "%.2f",
                  static_cast<double>(bytes) / static_cast<double>(tokens.size()));
    out << t.out << ": " << tokens.size() << " tokens from " << t.inputs.size()
        << (t.inputs.size() == 1 ? " file" : " files") << " (" << bytes << " bytes, " << ratio
        << " bytes per token)\n";
    return 0;
}

} // namespace dist::cli
