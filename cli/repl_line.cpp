// repl_line.cpp: the terminal around a ReplSession. On a terminal: libedit's readline, with
// history in ~/.dist_history and tab completion of commands, keys and schedule kinds. Otherwise
// one command per line of standard input and no prompt, so a session can be scripted and its
// output compared (`--echo` prints each command before its answer, for transcripts).
#include "cli/repl.hpp"

#include <cstdlib>
#include <cstring>
#include <editline/readline.h>
#include <iostream>
#include <sstream>
#include <string>
#include <unistd.h>

namespace dist::cli {

namespace {

// libedit's completion callbacks are plain functions: they reach the session through these.
const ReplSession* completing = nullptr;
std::vector<std::string> candidates;

char* next_candidate(const char* text, int state) {
    static size_t index = 0;
    if (state == 0) index = 0;
    size_t n = std::strlen(text);
    while (index < candidates.size()) {
        const std::string& c = candidates[index++];
        if (c.compare(0, n, text) == 0) return ::strdup(c.c_str());
    }
    return nullptr;
}

// Which words fit where the cursor is: a command first, then what that command takes.
char** complete(const char* text, int start, int /*end*/) {
    rl_attempted_completion_over = 1;
    std::istringstream before(std::string(rl_line_buffer, static_cast<size_t>(start)));
    std::vector<std::string> words;
    for (std::string w; before >> w;) words.push_back(w);
    candidates.clear();
    const auto& kinds = ReplSession::schedule_kinds();
    if (words.empty()) {
        candidates = ReplSession::commands();
    } else if ((words[0] == "set" || words[0] == "unset") && words.size() == 1) {
        candidates = completing->keys();
    } else if (words[0] == "set" && words.size() == 2 && words[1] == "schedule.kind") {
        candidates = kinds;
    } else if (words[0] == "compare") {
        candidates = kinds;
        if (words.size() == 1)
            for (const std::string& k : completing->keys()) candidates.push_back(k + "=");
    } else if (words[0] == "help" && words.size() == 1) {
        candidates = {"set"};
    }
    return rl_completion_matches(text, next_candidate);
}

std::string history_file() {
    const char* home = std::getenv("HOME");
    return home && *home ? std::string(home) + "/.dist_history" : "";
}

int interactive(ReplSession& session) {
    completing = &session;
    rl_readline_name = "dist";
    rl_attempted_completion_function = complete;
    // `=` and `,` end words too, so `compare mesh.pp=2,4` completes its key.
    static char breaks[] = " \t\n=,";
    rl_completer_word_break_characters = breaks;
    using_history();
    stifle_history(1000);
    std::string history = history_file();
    if (!history.empty()) read_history(history.c_str()); // none yet is fine
    while (char* raw = readline("dist> ")) {
        std::string line = raw;
        std::free(raw);
        if (line.find_first_not_of(" \t") != std::string::npos) add_history(line.c_str());
        if (!session.execute(line)) break;
    }
    std::cout << std::endl;
    // A history that cannot be written is not worth a message.
    if (!history.empty()) write_history(history.c_str());
    completing = nullptr;
    return 0;
}

} // namespace

int run_repl(const std::string& file, const std::vector<std::string>& overrides, bool echo) {
    ReplSession session(std::cout, std::cerr);
    if (!session.load(file)) return 1;
    for (const std::string& o : overrides) session.execute("set " + o);
    if (::isatty(STDIN_FILENO)) return interactive(session);
    for (std::string line; std::getline(std::cin, line);) {
        if (echo) std::cout << "> " << line << "\n";
        if (!session.execute(line)) break;
    }
    std::cout.flush();
    return 0;
}

} // namespace dist::cli
