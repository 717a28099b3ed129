// internal.hpp: what the embedding API's source files share: the Script's state and the step
// every call starts with (check the script with its overrides, keep the Program).
#pragma once

#include "dist/dist.hpp"

#include "lang/check.hpp"
#include "models/model.hpp"

#include <exception>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace dist {

struct Script::Impl {
    std::string path;
    std::string text;
    std::vector<std::filesystem::path> roots;
    std::vector<std::string> overrides; // KEY=VALUE

    /// The weights the last train() left, and the program they were trained with.
    std::unique_ptr<Program> trained_program;
    std::unique_ptr<models::Model> trained;

    lang::CheckResult run_check(const std::vector<std::string>& with) const;
    lang::CheckResult run_check() const { return run_check(overrides); }
};

namespace embed {

/// An exception that reached the API's boundary, as an error.
Status internal_error(const char* what);

/// Runs `f` (which returns a Status or a Result) and turns any exception into an error: nothing
/// thrown inside the library reaches the application.
template <class F> auto guarded(F&& f) -> decltype(f()) {
    try {
        return f();
    } catch (const std::exception& e) {
        return internal_error(e.what());
    } catch (...) {
        return internal_error("unknown exception");
    }
}

/// A failed check's rendered report as an error.
Status check_failed(const lang::CheckResult& checked);

/// The checker's diagnostics as the API's values.
CheckReport to_report(const lang::CheckResult& checked);

/// The search roots for `options`: its own folders, then its stdlib or the default roots.
std::vector<std::filesystem::path> search_roots(const Options& options);

/// Loads a checkpoint folder into a model of `p`'s shapes; "" on success.
std::string load_model(const Program& p, const std::string& dir,
                       std::unique_ptr<models::Model>& out);

} // namespace embed
} // namespace dist
