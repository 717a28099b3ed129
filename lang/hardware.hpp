// hardware.hpp: hardware profiles (stdlib/hardware/*.toml), read with toml++.
//
// A mesh names a device kind; the checker looks the name up here (file name or alias) and the
// simulator prices work with the numbers. Errors in a profile are located in the TOML file.
#pragma once

#include "lang/diagnostics.hpp"
#include "lang/program.hpp"

#include <filesystem>
#include <optional>
#include <vector>

namespace dist::lang {

/// Reads one profile file; reports errors (with the file's own line and column) and returns
/// nullopt when it cannot be used.
std::optional<HardwareProfile> load_profile(const std::filesystem::path& path,
                                            SourceManager& sources, Diagnostics& diags);

/// Every `hardware/*.toml` under the search roots, by file stem, first root first.
std::vector<std::filesystem::path> profile_files(const std::vector<std::filesystem::path>& roots);

} // namespace dist::lang
