// diagnostics.cpp: rendering of located errors and "did you mean" suggestions.
#include "lang/diagnostics.hpp"

#include <algorithm>
#include <cctype>

namespace dist::lang {

namespace {

// A quoted name or number from the source may be any length: keep messages readable by
// cutting each long `quoted` token to its first and last characters.
std::string shorten_quotes(const std::string& s) {
    constexpr size_t keep = 24;
    std::string out;
    size_t i = 0;
    while (i < s.size()) {
        size_t open = s.find('`', i);
        size_t close = open == std::string::npos ? open : s.find('`', open + 1);
        if (close == std::string::npos) {
            out += s.substr(i);
            break;
        }
        out += s.substr(i, open + 1 - i);
        std::string inner = s.substr(open + 1, close - open - 1);
        bool code = inner.find(' ') != std::string::npos; // an example the message shows
        if (!code && inner.size() > 2 * keep + 3)
            inner = inner.substr(0, keep) + "..." + inner.substr(inner.size() - keep);
        out += inner + "`";
        i = close + 1;
    }
    return out;
}

} // namespace

void Diagnostics::error(SourceLoc loc, std::string message, std::string hint) {
    ++errors_;
    message = shorten_quotes(message);
    hint = shorten_quotes(hint);
    for (const auto& d : list_) {
        if (d.loc.file == loc.file && d.loc.line == loc.line && d.loc.col == loc.col &&
            d.message == message)
            return;
    }
    if (list_.size() >= max_errors) {
        truncated_ = true;
        return;
    }
    list_.push_back({loc, std::move(message), std::move(hint)});
}

void Diagnostics::note(SourceLoc loc, std::string message) {
    if (list_.size() >= max_errors) return;
    Diagnostic d{loc, std::move(message), {}};
    d.note = true;
    list_.push_back(std::move(d));
}

void Diagnostics::sort() {
    // A note explains the errors just before it: sort those groups by their first error and
    // print the note after them.
    struct Group {
        SourceLoc key;
        std::vector<Diagnostic> items;
    };
    std::vector<Group> groups;
    for (auto& d : list_) {
        if (d.note && !groups.empty()) {
            groups.back().items.push_back(std::move(d));
            continue;
        }
        groups.push_back({d.loc, {}});
        groups.back().items.push_back(std::move(d));
    }
    std::stable_sort(groups.begin(), groups.end(), [](const Group& a, const Group& b) {
        if (a.key.file != b.key.file) return a.key.file < b.key.file;
        if (a.key.line != b.key.line) return a.key.line < b.key.line;
        return a.key.col < b.key.col;
    });
    list_.clear();
    for (auto& g : groups)
        for (auto& d : g.items) list_.push_back(std::move(d));
}

std::string Diagnostics::render(const SourceManager& sources) const {
    std::string out;
    for (const auto& d : list_) out += render_diagnostic(sources, d);
    if (truncated_) {
        out +=
            "error: too many errors (" + std::to_string(max_errors) + " shown); fix these first\n";
    }
    return out;
}

namespace {

// Byte length of the UTF-8 sequence that starts with `c` (1 for anything malformed).
size_t utf8_len(unsigned char c) {
    if (c < 0x80) return 1;
    if ((c >> 5) == 0x6) return 2;
    if ((c >> 4) == 0xe) return 3;
    if ((c >> 3) == 0x1e) return 4;
    return 1;
}

// The displayable form of one source line: tabs become spaces, control bytes become '?', and a
// long line is cut to a window around the column so that the caret stays on screen.
struct ShownLine {
    std::string text;
    size_t caret_col = 0; // 0-based display column of the caret
    size_t caret_len = 1;
};

ShownLine show_line(std::string_view line, uint32_t col, uint32_t length) {
    // Split the line into code points (as columns count them).
    std::vector<std::string_view> cps;
    for (size_t i = 0; i < line.size();) {
        size_t n = std::min(utf8_len(static_cast<unsigned char>(line[i])), line.size() - i);
        cps.push_back(line.substr(i, n));
        i += n;
    }
    constexpr size_t window = 100;
    size_t caret = col > 0 ? col - 1 : 0;
    size_t begin = 0;
    if (cps.size() > window && caret > window / 2) begin = std::min(caret - window / 2, cps.size());
    size_t end = std::min(cps.size(), begin + window);
    ShownLine s;
    if (begin > 0) s.text = "...";
    s.caret_col = s.text.size() + (caret >= begin ? caret - begin : 0);
    for (size_t i = begin; i < end; ++i) {
        std::string_view cp = cps[i];
        if (cp.size() == 1) {
            unsigned char c = static_cast<unsigned char>(cp[0]);
            if (c == '\t')
                s.text += ' ';
            else if (c < 0x20 || c == 0x7f || c >= 0x80)
                s.text += '?';
            else
                s.text += cp;
        } else {
            s.text += cp;
        }
    }
    if (end < cps.size()) s.text += "...";
    size_t max_len = end > caret ? end - caret : 1;
    s.caret_len = std::max<size_t>(1, std::min<size_t>(length, max_len));
    return s;
}

} // namespace

std::string render_diagnostic(const SourceManager& sources, const Diagnostic& d) {
    std::string out;
    if (d.loc.valid() && d.loc.file < sources.size()) {
        const SourceFile& f = sources.file(d.loc.file);
        out += f.name() + ":" + std::to_string(d.loc.line) + ":" + std::to_string(d.loc.col) +
               (d.note ? ": note: " : ": error: ") + d.message + "\n";
        std::string_view line = f.line(d.loc.line);
        ShownLine s = show_line(line, d.loc.col, d.loc.length);
        out += "    " + s.text + "\n";
        out += "    " + std::string(s.caret_col, ' ') + "^";
        if (s.caret_len > 1) out += std::string(s.caret_len - 1, '~');
        out += "\n";
    } else {
        out += "error: " + d.message + "\n";
    }
    if (!d.hint.empty()) out += "hint: " + d.hint + "\n";
    return out;
}

namespace {

size_t edit_distance(std::string_view a, std::string_view b) {
    // Optimal string alignment: insertions, deletions, substitutions and swaps of neighbours.
    std::vector<size_t> before(b.size() + 1), prev(b.size() + 1), cur(b.size() + 1);
    for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
        cur[0] = i;
        for (size_t j = 1; j <= b.size(); ++j) {
            size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
            cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
                cur[j] = std::min(cur[j], before[j - 2] + 1);
        }
        before = prev;
        std::swap(prev, cur);
    }
    return prev[b.size()];
}

} // namespace

std::string closest_name(std::string_view name, const std::vector<std::string>& candidates) {
    if (name.size() > 64) return {};
    auto lower = [](std::string_view s) {
        std::string out(s);
        for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        return out;
    };
    std::string best;
    size_t best_d = std::max<size_t>(1, name.size() / 3) + 1;
    for (const auto& c : candidates) {
        if (c == name || c.size() > 64) continue;
        // A difference of case alone is the closest there is.
        size_t d = lower(c) == lower(name) ? 0 : edit_distance(name, c);
        if (d < best_d) {
            best_d = d;
            best = c;
        }
    }
    return best;
}

std::string join_names(const std::vector<std::string>& names, std::string_view last_sep) {
    std::string out;
    for (size_t i = 0; i < names.size(); ++i) {
        if (i > 0) out += (i + 1 == names.size()) ? std::string(last_sep) : ", ";
        out += "`" + names[i] + "`";
    }
    return out;
}

} // namespace dist::lang
