// check.hpp: the front end's entry points: script text to a checked Program.
//
// load (imports resolved against the script's folder, DIST_PATH and stdlib/) -> parse each file
// -> apply `--set` overrides to the main script's tree -> check (templates expanded, blocks
// read, every rule of the language enforced) -> Program. Errors come back as values.
#pragma once

#include "lang/diagnostics.hpp"
#include "lang/program.hpp"

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace dist::lang {

struct FrontendOptions {
    /// Folders holding `std/` and `hardware/`, searched after the importing script's folder.
    std::vector<std::filesystem::path> search_roots;
    /// `KEY=VALUE` overrides, as given to `--set`.
    std::vector<std::string> overrides;
    /// Check that data files named by the script exist (off for fuzzing).
    bool check_files = true;
};

struct CheckResult {
    std::shared_ptr<SourceManager> sources = std::make_shared<SourceManager>();
    Diagnostics diagnostics;
    std::optional<Program> program;

    bool ok() const { return program.has_value() && !diagnostics.has_errors(); }
    std::string report() const { return diagnostics.render(*sources); }
};

/// DIST_PATH entries, then the stdlib installed beside the executable, then the source tree's.
std::vector<std::filesystem::path> default_search_roots();
/// The folders of the DIST_PATH environment variable (colon-separated), in order.
std::vector<std::filesystem::path> dist_path_roots();

CheckResult check_file(const std::filesystem::path& path, const FrontendOptions& options);

/// Checks text as if it were a file called `name` in the current folder.
CheckResult check_text(const std::string& name, const std::string& text,
                       const FrontendOptions& options);

} // namespace dist::lang
