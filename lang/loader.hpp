// loader.hpp: reading a script and everything it imports.
#pragma once

#include "lang/ast.hpp"
#include "lang/diagnostics.hpp"

#include <filesystem>
#include <memory>
#include <vector>

namespace dist::lang {

inline constexpr size_t max_source_bytes = 8u << 20;
inline constexpr size_t max_import_depth = 32;

struct LoadedFile {
    std::filesystem::path path; // canonical
    std::unique_ptr<Script> script;
};

/// The parsed files, imports before the files that import them; the main script is last.
struct LoadedProgram {
    std::vector<LoadedFile> files;
    bool ok = false;
};

/// Reads `text` as the main script (its folder anchors relative imports) and its imports.
LoadedProgram load_program(const std::filesystem::path& path, std::string text,
                           const std::vector<std::filesystem::path>& roots, SourceManager& sources,
                           Diagnostics& diags);

/// Reads a whole file of at most max_source_bytes; "" and an explanation in `error` otherwise.
bool read_source_file(const std::filesystem::path& path, std::string& text, std::string& error);

} // namespace dist::lang
