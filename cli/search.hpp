// search.hpp: `dist search` and the REPL's `search`: one search per device kind asked for.
#pragma once

#include "actors/sim/search.hpp"

#include <string>
#include <vector>

namespace dist::cli {

struct SearchRequest {
    std::string file;                   // the script (names it when `text` is given)
    std::string text;                   // the script's text, when not read from `file`
    std::vector<std::string> overrides; // `--set` (or the REPL's `set`) under every layout
    std::string devices;                // "NAME x COUNT[,NAME x COUNT...]" ("": the script's)
    int32_t top = 10;
    bool exhaustive = false;
};

/// One search per device kind of `q.devices` (or one on the script's mesh). Each report's
/// `extra` holds the overrides that put the script on its devices. `usage` (a bad flag) or
/// `error` (the script does not check) says why there are none.
std::vector<sim::SearchReport> run_searches(const SearchRequest& q, std::string& usage,
                                            std::string& error);

/// The reports as `dist search` prints them: each table, then (after several device kinds) how
/// the best layout moves between them.
std::string searches_text(const std::vector<sim::SearchReport>& reports);

} // namespace dist::cli
