// checked_script.hpp: a test script checked against this tree's stdlib, and the overrides of a
// mesh and schedule, for the runtime's tests. Needs DIST_SOURCE_DIR (the tree) defined.
#pragma once

#include "actors/plan/lower.hpp"
#include "lang/check.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

namespace dist::tests {

/// The program of `text` with `overrides`; a failed check fails the test. The environment's
/// DIST_SOURCE_DIR, when set, names the tree (a test program run on another machine).
inline Program checked_script(const std::string& text, const std::vector<std::string>& overrides) {
    lang::FrontendOptions o;
    const char* tree = std::getenv("DIST_SOURCE_DIR");
    o.search_roots = {std::filesystem::path(tree ? tree : DIST_SOURCE_DIR) / "stdlib"};
    o.overrides = overrides;
    lang::CheckResult r = lang::check_text("t.dist", text, o);
    EXPECT_TRUE(r.ok()) << r.report();
    return r.ok() ? *r.program : Program{};
}

/// The program of `examples/NAME` with `overrides` (the checks of its data files skipped); a
/// failed check fails the test.
inline Program checked_example(const std::string& name, std::vector<std::string> overrides = {}) {
    lang::FrontendOptions o;
    o.search_roots = {std::filesystem::path(DIST_SOURCE_DIR) / "stdlib"};
    o.overrides = std::move(overrides);
    o.check_files = false;
    lang::CheckResult r =
        lang::check_file(std::filesystem::path(DIST_SOURCE_DIR) / "examples" / name, o);
    EXPECT_TRUE(r.ok()) << r.report();
    return r.ok() ? *r.program : Program{};
}

/// The plan of `p`; a plan that fails fails the test.
inline plan::Graph planned_graph(const Program& p) {
    plan::PlanResult r = plan::lower(p);
    EXPECT_TRUE(r.ok()) << plan::render_errors(p.file, r.errors);
    return r.ok() ? *r.graph : plan::Graph{};
}

/// `--set` overrides for a dp x tp x pp mesh and a schedule (`v` > 0: virtual stages).
inline std::vector<std::string> mesh_overrides(int dp, int tp, int pp, const std::string& kind,
                                               int microbatches, int v = 0) {
    std::vector<std::string> o{"mesh.dp=" + std::to_string(dp), "mesh.tp=" + std::to_string(tp),
                               "mesh.pp=" + std::to_string(pp), "schedule.kind=" + kind,
                               "schedule.microbatches=" + std::to_string(microbatches)};
    if (v > 0) o.push_back("schedule.virtual_stages=" + std::to_string(v));
    return o;
}

} // namespace dist::tests
