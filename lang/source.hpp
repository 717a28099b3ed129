// source.hpp: source files and locations.
//
// Every AST node and diagnostic points into a SourceManager, which owns the text of the scripts,
// the imported library files and the `--set` overrides (each override is a one-line source of its
// own, so its errors print with a caret like any other).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace dist::lang {

/// A place in a source: file id, 1-based line and column (in code points), and a length.
struct SourceLoc {
    uint32_t file = 0;
    uint32_t line = 0;
    uint32_t col = 0;
    uint32_t length = 0;

    bool valid() const { return line != 0; }
};

/// One file (or `--set` text) and its line index.
class SourceFile {
  public:
    SourceFile(std::string name, std::string text);

    const std::string& name() const { return name_; }
    const std::string& text() const { return text_; }
    /// Number of lines (a trailing newline does not start a new one).
    uint32_t line_count() const { return static_cast<uint32_t>(line_starts_.size()); }
    /// The text of a 1-based line without its newline; empty when out of range.
    std::string_view line(uint32_t n) const;

  private:
    std::string name_;
    std::string text_;
    std::vector<size_t> line_starts_;
};

/// Owns every source of one check; ids are stable indexes.
class SourceManager {
  public:
    uint32_t add(std::string name, std::string text);
    const SourceFile& file(uint32_t id) const { return *files_.at(id); }
    size_t size() const { return files_.size(); }

  private:
    std::vector<std::unique_ptr<SourceFile>> files_;
};

} // namespace dist::lang
