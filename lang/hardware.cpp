// hardware.cpp: reading hardware profiles with toml++.
#include "lang/hardware.hpp"

#include <toml++/toml.h>

#include <algorithm>
#include <fstream>
#include <sstream>

namespace dist::lang {

namespace {

SourceLoc node_loc(uint32_t file, const toml::node* node, const toml::table& root) {
    const toml::source_region& r = node ? node->source() : root.source();
    return {file, static_cast<uint32_t>(std::max<toml::source_index>(r.begin.line, 1)),
            static_cast<uint32_t>(std::max<toml::source_index>(r.begin.column, 1)), 1};
}

class Reader {
  public:
    Reader(const toml::table& root, uint32_t file, Diagnostics& diags)
        : root_(root), file_(file), diags_(diags) {}

    // A positive number at a dotted path (integers and floats both accepted).
    double number(std::string_view path, bool required = true) {
        toml::node_view<const toml::node> n = root_.at_path(path);
        if (!n) {
            if (required)
                diags_.error(node_loc(file_, nullptr, root_),
                             "hardware profile has no `" + std::string(path) + "`");
            return 0.0;
        }
        std::optional<double> v = n.value<double>();
        if (!v || !(*v > 0.0) || !std::isfinite(*v)) {
            diags_.error(node_loc(file_, n.node(), root_),
                         "`" + std::string(path) + "` must be a positive number");
            return 0.0;
        }
        return *v;
    }

    std::string string(std::string_view path, bool required = true) {
        toml::node_view<const toml::node> n = root_.at_path(path);
        if (!n) {
            if (required)
                diags_.error(node_loc(file_, nullptr, root_),
                             "hardware profile has no `" + std::string(path) + "`");
            return {};
        }
        std::optional<std::string> v = n.value<std::string>();
        if (!v) {
            diags_.error(node_loc(file_, n.node(), root_),
                         "`" + std::string(path) + "` must be a string");
            return {};
        }
        return *v;
    }

  private:
    const toml::table& root_;
    uint32_t file_;
    Diagnostics& diags_;
};

} // namespace

std::optional<HardwareProfile> load_profile(const std::filesystem::path& path,
                                            SourceManager& sources, Diagnostics& diags) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    uint32_t file = sources.add(path.string(), ss.str());
    size_t before = diags.error_count();
    toml::table root;
    try {
        root = toml::parse(sources.file(file).text(), path.string());
    } catch (const toml::parse_error& e) {
        const auto& b = e.source().begin;
        diags.error({file, static_cast<uint32_t>(std::max<toml::source_index>(b.line, 1)),
                     static_cast<uint32_t>(std::max<toml::source_index>(b.column, 1)), 1},
                    "invalid hardware profile: " + std::string(e.description()));
        return std::nullopt;
    }
    Reader r(root, file, diags);
    HardwareProfile p;
    p.path = path.string();
    p.name = r.string("name");
    p.description = r.string("description", false);
    if (const toml::array* aliases = root["aliases"].as_array()) {
        for (const auto& a : *aliases) {
            if (auto s = a.value<std::string>())
                p.aliases.push_back(*s);
            else
                diags.error(node_loc(file, &a, root), "`aliases` must be a list of strings");
        }
    }
    p.peak_flops_f32 = r.number("compute.peak_flops_f32");
    p.peak_flops_bf16 = r.number("compute.peak_flops_bf16");
    p.memory_bytes = static_cast<int64_t>(r.number("memory.bytes"));
    p.memory_bandwidth = r.number("memory.bandwidth");
    if (root.at_path("host.devices")) {
        p.devices_per_host = static_cast<int64_t>(r.number("host.devices"));
    }
    p.intra_host.bandwidth = r.number("links.intra_host.bandwidth");
    p.intra_host.latency = r.number("links.intra_host.latency");
    p.inter_host.bandwidth = r.number("links.inter_host.bandwidth");
    p.inter_host.latency = r.number("links.inter_host.latency");
    if (diags.error_count() > before) return std::nullopt;
    return p;
}

std::vector<std::filesystem::path> profile_files(const std::vector<std::filesystem::path>& roots) {
    std::vector<std::filesystem::path> out;
    std::vector<std::string> seen;
    for (const auto& root : roots) {
        std::error_code ec;
        std::filesystem::path dir = root / "hardware";
        if (!std::filesystem::is_directory(dir, ec)) continue;
        std::vector<std::filesystem::path> here;
        for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
            if (entry.path().extension() == ".toml" && entry.is_regular_file(ec))
                here.push_back(entry.path());
        }
        std::sort(here.begin(), here.end());
        for (const auto& p : here) {
            std::string stem = p.stem().string();
            if (std::find(seen.begin(), seen.end(), stem) != seen.end()) continue;
            seen.push_back(stem);
            out.push_back(p);
        }
    }
    return out;
}

} // namespace dist::lang
