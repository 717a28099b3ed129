// diagnostics.hpp: located errors, as every phase of the front end reports them.
//
// A diagnostic renders as `file:line:col: error: message`, then the source line and a caret
// under the span, then an optional `hint:` line. Several errors are collected and printed once
// each, in source order.
#pragma once

#include "lang/source.hpp"

#include <string>
#include <string_view>
#include <vector>

namespace dist::lang {

struct Diagnostic {
    SourceLoc loc;
    std::string message;
    std::string hint;
    bool note = false; // context for the errors around it ("in the model called here")
};

/// Collects diagnostics; duplicates (same place, same message) are kept once.
class Diagnostics {
  public:
    /// Past this many errors the rest are dropped and a last line says so.
    static constexpr size_t max_errors = 50;

    void error(SourceLoc loc, std::string message, std::string hint = {});
    /// Context for an error reported elsewhere; a note alone is not a failure.
    void note(SourceLoc loc, std::string message);
    bool has_errors() const { return errors_ > 0; }
    /// Errors reported so far (a counter that later code compares to see if a step failed).
    size_t error_count() const { return errors_; }
    size_t count() const { return list_.size(); }
    const std::vector<Diagnostic>& all() const { return list_; }
    /// Order by file, line and column (stable for equal places).
    void sort();
    /// The whole report, one diagnostic after another.
    std::string render(const SourceManager& sources) const;

  private:
    std::vector<Diagnostic> list_;
    size_t errors_ = 0;
    bool truncated_ = false;
};

/// One diagnostic with its source line and caret.
std::string render_diagnostic(const SourceManager& sources, const Diagnostic& d);

/// The candidate closest to `name` by edit distance, or "" when none is close enough to suggest.
std::string closest_name(std::string_view name, const std::vector<std::string>& candidates);

/// "`a`, `b` and `c`" style list for messages.
std::string join_names(const std::vector<std::string>& names, std::string_view last_sep = " and ");

} // namespace dist::lang
