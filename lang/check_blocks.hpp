// check_blocks.hpp: the checker of the configuration blocks, split by block over
// check_mesh.cpp, check_schedule.cpp, check_train.cpp and check_blocks.cpp (the rules across
// blocks). Internal to lang/.
#pragma once

#include "lang/check_internal.hpp"

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

namespace dist::lang {

extern const std::vector<std::string> schedule_kinds;

/// The index of `s` in `names`, as the enum whose values are listed in that order.
template <typename E> E pick(const std::vector<std::string>& names, const std::string& s) {
    return static_cast<E>(std::find(names.begin(), names.end(), s) - names.begin());
}

/// "`1`, `2` or `4`": the divisors of n up to `limit`, for hints.
std::string divisors_hint(int64_t n, int64_t limit = 64);

/// State shared by the block checks: what they read from, and the locations later rules
/// point at.
struct BlockChecker {
    const Definitions& defs;
    const std::filesystem::path& dir;
    const FrontendOptions& options;
    SourceManager& sources;
    Diagnostics& diags;
    Program& p;
    uint32_t file;
    bool model_ok;
    bool unknown_block = false;
    bool ok = true;
    const std::vector<Override>* hardware = nullptr; // `--set hardware.KEY=VALUE`

    BlockChecker(const Definitions& d, const std::filesystem::path& dir_, const FrontendOptions& o,
                 SourceManager& s, Diagnostics& dg, Program& prog, uint32_t f, bool model)
        : defs(d), dir(dir_), options(o), sources(s), diags(dg), p(prog), file(f), model_ok(model) {
    }

    // Locations that later rules point at.
    SourceLoc tp_loc, pp_loc, dp_loc, cp_loc, ep_loc, zero_loc, sp_loc, devices_loc, v_loc, m_loc,
        batch_loc, kind_loc;

    bool read_data(BlockReader& r, const std::string& name, DataSpec& out);
    void mesh(const Block* block);
    /// Applies `--set hardware.KEY=VALUE` to the profile just found.
    void edit_profile(HardwareProfile& profile);
    void schedule(const Block* block);
    void custom(const Block* actions);
    void train(const Block* block);
    void generate(const Block* block);
    void cross();
    /// Expert parallelism against the model's mixtures of experts.
    void experts();
    void memory_floor();
};

} // namespace dist::lang
