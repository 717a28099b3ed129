// repl_search.cpp: `search` (the fastest layouts of the current program, as `dist search`
// finds them) and `use N` (adopt the N-th of them as the current layout).
#include "cli/repl.hpp"
#include "cli/repl_format.hpp"
#include "cli/search.hpp"

#include <cstdlib>
#include <ostream>

namespace dist::cli {

void ReplSession::cmd_search(const std::string& args) {
    SearchRequest q;
    q.file = name_;
    if (file_.empty()) q.text = text_;
    q.overrides = override_texts();
    // `--top K` and `--devices NAME x COUNT[,...]` (a list that may hold spaces, up to the next
    // flag).
    std::string rest = trim(args);
    while (!rest.empty()) {
        size_t next = rest.find(" --", 1);
        std::string flag = trim(rest.substr(0, next));
        rest = next == std::string::npos ? "" : trim(rest.substr(next));
        size_t space = flag.find(' ');
        std::string name = flag.substr(0, space);
        std::string value = space == std::string::npos ? "" : trim(flag.substr(space));
        if (name == "--devices" && !value.empty()) {
            q.devices = value;
        } else if (name == "--top" && !value.empty()) {
            char* end = nullptr;
            long k = std::strtol(value.c_str(), &end, 10);
            if (*end != '\0' || k < 1 || k > 1000) {
                error("`--top` is a number from 1 to 1000, not `" + value + "`");
                return;
            }
            q.top = static_cast<int32_t>(k);
        } else {
            error("`search` takes `--top K` and `--devices NAME x COUNT[,NAME x COUNT...]`",
                  "for example `search --top 5 --devices h100 x 64,h200 x 64`");
            return;
        }
    }
    std::string usage, failure;
    std::vector<sim::SearchReport> reports = run_searches(q, usage, failure);
    if (!usage.empty()) {
        error(usage);
        return;
    }
    if (!failure.empty()) {
        out_.flush();
        err_ << failure;
        err_.flush();
        return;
    }
    out_ << searches_text(reports);
    // `use N` takes the rows of the last table.
    searched_.clear();
    const sim::SearchReport& last = reports.back();
    for (const sim::SearchRow& row : last.rows) {
        std::vector<std::string> set = last.extra;
        for (std::string& s : sim::overrides_of(row.layout)) set.push_back(std::move(s));
        std::string line;
        for (const std::string& s : set) line += (line.empty() ? "" : " ") + s;
        searched_.push_back(line);
    }
    if (!searched_.empty())
        out_ << "(`use N` adopts row N" << (reports.size() > 1 ? " of the last table" : "")
             << ")\n";
}

void ReplSession::cmd_use(const std::string& args) {
    if (searched_.empty()) {
        error("there are no search results to use", "run `search` first");
        return;
    }
    char* end = nullptr;
    std::string n = trim(args);
    long k = std::strtol(n.c_str(), &end, 10);
    if (n.empty() || *end != '\0' || k < 1 || k > static_cast<long>(searched_.size())) {
        error("`use` takes a row of the last search, 1 to " + std::to_string(searched_.size()),
              "for example `use 1`");
        return;
    }
    cmd_set(searched_[static_cast<size_t>(k - 1)]);
}

} // namespace dist::cli
