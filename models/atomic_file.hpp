// atomic_file.hpp: replacing a file whole or not at all.
//
// Every file Dist writes for a user (checkpoints, token files, formatted scripts) goes through
// here, so that a crash, a full disk or a kill leaves either the old file or the new one, never
// half of either.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace dist::models {

/// Replaces `path` with the concatenation of `parts`: a temporary file beside it (so the rename
/// stays on one file system), fsync, rename over the target, fsync of the folder. An existing
/// file keeps its permissions; a new one gets 0666 less the umask. On failure the old file is
/// untouched, no temporary remains, and the message says what failed and why ("" on success).
std::string write_file_atomically(const std::string& path,
                                  const std::vector<std::string_view>& parts);

} // namespace dist::models
