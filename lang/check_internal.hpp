// check_internal.hpp: pieces shared by the checker's files (not part of the front end's API).
#pragma once

#include "lang/ast.hpp"
#include "lang/check.hpp"
#include "lang/diagnostics.hpp"
#include "lang/value.hpp"

#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace dist::lang {

inline constexpr int64_t max_blocks = 100000;
inline constexpr int64_t max_ranks = 65536;
inline constexpr int64_t max_microbatches = 65536;

/// A `--set` override after parsing: `path` is the dotted key.
struct Override {
    std::vector<std::string> path;
    ExprPtr value;
    ExprPtr count;
    SourceLoc key_loc;
    SourceLoc value_loc;
};

/// Parses `KEY=VALUE` texts; each becomes a source of its own named `--set`.
std::vector<Override> parse_overrides(const std::vector<std::string>& texts, SourceManager& sources,
                                      Diagnostics& diags);

/// Applies the block overrides to the main script's tree (adding blocks and fields as needed);
/// returns the `model.ARG` ones, which apply when the model template is called. The
/// `hardware.KEY` ones go to `hardware`: they edit the mesh's profile once it is found.
std::vector<Override> apply_overrides(std::vector<Override> overrides, Script& script,
                                      Diagnostics& diags, std::vector<Override>& hardware);

/// Reads the fields of one block, each at most once, and reports the fields it never asked for.
class BlockReader {
  public:
    /// `path` names the block in messages (`mesh`, `train.optimizer`); `block` may be null.
    BlockReader(const Block* block, std::string path, const Scope& scope, Diagnostics& diags);

    bool present() const { return block_ != nullptr; }
    SourceLoc loc() const { return block_ ? block_->loc : SourceLoc{}; }
    const Field* field(const std::string& name);
    const Block* block(const std::string& name);
    /// Location of a field, or of the block when the field is absent.
    SourceLoc loc_of(const std::string& name) const;

    std::optional<int64_t> integer(const std::string& name, int64_t min, int64_t max = INT64_MAX);
    std::optional<double> real(const std::string& name, double min, bool min_exclusive,
                               double max = 1e300, bool max_exclusive = false);
    std::optional<bool> boolean(const std::string& name);
    std::optional<std::string> string(const std::string& name);
    /// A bare name from a fixed set (`kind: 1f1b`).
    std::optional<std::string> choice(const std::string& name,
                                      const std::vector<std::string>& options,
                                      const std::string& what);
    std::optional<Value> value(const std::string& name);
    /// Every item that is a `rank N: ...` row.
    std::vector<const TableRow*> rows();

    /// Reports every field and block that was not asked for.
    void finish();
    bool failed() const { return failed_; }

  private:
    /// The field, refusing a device count (`x N`) where it does not belong.
    const Field* single(const std::string& name);
    /// Reports an error about this block and marks it failed.
    std::nullopt_t fail(SourceLoc loc, std::string message, std::string hint = {});
    /// The field's value when `accept` takes it; "must be WHAT, got ..." otherwise.
    std::optional<Value> typed(const std::string& name, bool (*accept)(const Value&),
                               const char* what);

    const Block* block_;
    std::string path_;
    const Scope& scope_;
    Diagnostics& diags_;
    std::vector<std::string> known_;
    std::set<std::string> fields_, blocks_;
    bool rows_read_ = false;
    bool failed_ = false;
};

/// Integer multiply that saturates at INT64_MAX instead of overflowing.
int64_t sat_mul(int64_t a, int64_t b);
int64_t sat_add(int64_t a, int64_t b);

/// The templates, presets and global `let`s of every loaded file.
struct Definitions {
    struct Template {
        const Statement* stmt = nullptr;
    };
    struct Preset {
        const Statement* stmt = nullptr;
    };
    std::map<std::string, Template> templates;
    std::map<std::string, Preset> presets;
    Scope globals;
};

/// Expands the model call into a ModelSpec; false after reporting errors.
bool check_model(const Statement& model_stmt, const Definitions& defs,
                 const std::vector<Override>& model_overrides, Diagnostics& diags, ModelSpec& out);

/// Reads mesh, schedule, train and generate, and checks how they fit the model.
struct BlockSet {
    const Block* mesh = nullptr;
    const Block* schedule = nullptr;
    const Block* train = nullptr;
    const Block* generate = nullptr;
    uint32_t file = 0;          // the main script, for errors about missing blocks
    bool model_ok = false;      // rules that need the model run only when it checked
    bool unknown_block = false; // a misspelt block: "no such block" errors would only echo it
    const std::vector<Override>* hardware = nullptr; // `--set hardware.KEY=VALUE`
};
bool check_blocks(const BlockSet& blocks, const Definitions& defs,
                  const std::filesystem::path& script_dir, const FrontendOptions& options,
                  SourceManager& sources, Diagnostics& diags, Program& program);

std::string format_bytes(int64_t bytes);

} // namespace dist::lang
