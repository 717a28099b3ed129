// script.cpp: the embedding API's front half: finding the stdlib, loading a script, overrides,
// check, plan and simulate. Each call checks the script with its overrides afresh (a check takes
// milliseconds), so a Script holds text and settings, never a stale Program.
#include "embed/internal.hpp"

#include "actors/plan/lower.hpp"
#include "actors/sim/simulate.hpp"
#include "lang/loader.hpp"

#include <cstdlib>
#include <dlfcn.h>
#include <exception>

namespace fs = std::filesystem;

namespace dist {

namespace embed {

namespace {

void add_existing(std::vector<std::string>& roots, const fs::path& dir) {
    std::error_code ec;
    if (dir.empty() || !fs::is_directory(dir, ec)) return;
    fs::path canonical = fs::weakly_canonical(dir, ec);
    std::string s = (ec ? dir : canonical).string();
    for (const auto& r : roots)
        if (r == s) return;
    roots.push_back(s);
}

// The folder of the shared library (or executable) this function was linked into.
fs::path library_dir() {
    Dl_info info{};
    if (dladdr(reinterpret_cast<void*>(&library_dir), &info) == 0 || info.dli_fname == nullptr)
        return {};
    std::error_code ec;
    fs::path lib = fs::weakly_canonical(fs::path(info.dli_fname), ec);
    return ec ? fs::path() : lib.parent_path();
}

} // namespace

std::vector<fs::path> search_roots(const Options& options) {
    std::vector<fs::path> roots;
    for (const auto& r : options.search_roots) roots.emplace_back(r);
    if (!options.stdlib_dir.empty()) {
        roots.emplace_back(options.stdlib_dir);
    } else {
        for (const auto& r : default_search_roots()) roots.emplace_back(r);
    }
    return roots;
}

Status internal_error(const char* what) {
    return Status::error(std::string("internal error: ") + what);
}

Status check_failed(const lang::CheckResult& checked) {
    std::string text = checked.report();
    return Status::error(text.empty() ? "the script did not check" : text);
}

CheckReport to_report(const lang::CheckResult& checked) {
    CheckReport report;
    report.ok = checked.ok();
    for (const lang::Diagnostic& d : checked.diagnostics.all()) {
        Diagnostic out;
        if (d.loc.valid() && d.loc.file < checked.sources->size()) {
            out.file = checked.sources->file(d.loc.file).name();
            out.line = static_cast<int>(d.loc.line);
            out.column = static_cast<int>(d.loc.col);
        }
        out.message = d.message;
        out.hint = d.hint;
        out.note = d.note;
        report.diagnostics.push_back(std::move(out));
    }
    if (!report.ok && report.diagnostics.empty()) {
        Diagnostic out;
        out.message = "the script did not check";
        report.diagnostics.push_back(out);
    }
    report.text = checked.report();
    return report;
}

} // namespace embed

std::string version() {
    return DIST_VERSION;
}

std::vector<std::string> default_search_roots() {
    std::vector<std::string> roots;
    for (const fs::path& dir : lang::dist_path_roots()) embed::add_existing(roots, dir);
    fs::path lib = embed::library_dir();
    if (!lib.empty()) embed::add_existing(roots, lib.parent_path() / "share" / "dist" / "stdlib");
    embed::add_existing(roots, DIST_INSTALL_STDLIB);
    std::error_code ec;
    fs::path exe = fs::read_symlink("/proc/self/exe", ec);
    if (!ec) embed::add_existing(roots, exe.parent_path().parent_path() / "share/dist/stdlib");
    embed::add_existing(roots, DIST_SOURCE_STDLIB);
    return roots;
}

std::string find_stdlib(const Options& options) {
    try {
        for (const fs::path& root : embed::search_roots(options)) {
            std::error_code ec;
            if (fs::is_directory(root / "std", ec)) return root.string();
        }
    } catch (...) {
        // Out of memory while building paths: no stdlib to report.
    }
    return {};
}

lang::CheckResult Script::Impl::run_check(const std::vector<std::string>& with) const {
    lang::FrontendOptions fo;
    fo.search_roots = roots;
    fo.overrides = with;
    return lang::check_text(path, text, fo);
}

Script::Script(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Script::Script(Script&&) noexcept = default;
Script& Script::operator=(Script&&) noexcept = default;
Script::~Script() = default;

Result<Script> Script::load(const std::string& path, const Options& options) {
    return embed::guarded([&]() -> Result<Script> {
        std::string text, error;
        if (!lang::read_source_file(path, text, error))
            return Status::error("cannot read `" + path + "`: " + error);
        return from_text(path, text, options);
    });
}

Result<Script> Script::from_text(const std::string& name, const std::string& text,
                                 const Options& options) {
    return embed::guarded([&]() -> Result<Script> {
        if (text.size() > lang::max_source_bytes)
            return Status::error("`" + name + "` is larger than " +
                                 std::to_string(lang::max_source_bytes) + " bytes");
        auto impl = std::make_unique<Impl>();
        impl->path = name;
        impl->text = text;
        impl->roots = embed::search_roots(options);
        return Script(std::move(impl));
    });
}

Status Script::set(const std::string& key, const std::string& value) {
    return embed::guarded([&]() -> Status {
        if (key.empty() || key.find('=') != std::string::npos)
            return Status::error("`" + key + "` is not a key");
        const std::string entry = key + "=" + value;
        std::vector<std::string> next;
        for (const auto& o : impl_->overrides)
            if (o.compare(0, key.size() + 1, key + "=") != 0) next.push_back(o);
        next.push_back(entry);
        // Errors located in the new override's own text reject it; errors elsewhere in the
        // script are the script's, reported by check().
        lang::CheckResult checked = impl_->run_check(next);
        std::string errors;
        for (const lang::Diagnostic& d : checked.diagnostics.all()) {
            if (d.note || !d.loc.valid() || d.loc.file >= checked.sources->size()) continue;
            const lang::SourceFile& f = checked.sources->file(d.loc.file);
            if (f.name() == "--set" && f.text() == entry)
                errors += lang::render_diagnostic(*checked.sources, d);
        }
        if (!errors.empty()) return Status::error(errors);
        impl_->overrides = std::move(next);
        return {};
    });
}

std::vector<std::string> Script::overrides() const {
    return impl_->overrides;
}

void Script::clear_overrides() {
    impl_->overrides.clear();
}

const std::string& Script::path() const {
    return impl_->path;
}

CheckReport Script::check() const {
    try {
        return embed::to_report(impl_->run_check());
    } catch (const std::exception& e) {
        CheckReport r;
        r.diagnostics.push_back({"", 0, 0, std::string("internal error: ") + e.what(), "", false});
        r.text = r.diagnostics.back().message + "\n";
        return r;
    } catch (...) {
        CheckReport r;
        r.diagnostics.push_back({"", 0, 0, "internal error", "", false});
        r.text = "internal error\n";
        return r;
    }
}

Result<PlanSummary> Script::plan() const {
    return embed::guarded([&]() -> Result<PlanSummary> {
        lang::CheckResult checked = impl_->run_check();
        if (!checked.ok()) return embed::check_failed(checked);
        plan::PlanResult planned = plan::lower(*checked.program);
        if (!planned.ok()) return Status::error(plan::render_errors(impl_->path, planned.errors));
        const plan::Graph& g = *planned.graph;
        PlanSummary s;
        s.schedule = to_string(g.schedule);
        s.dp = g.dp;
        s.tp = g.tp;
        s.pp = g.pp;
        s.stages = g.num_stages();
        s.microbatches = g.microbatches;
        for (const plan::PlanRank& r : g.ranks) {
            PlanRank out;
            out.rank = r.rank;
            out.dp = r.dp;
            out.pp = r.pp;
            out.tp = r.tp;
            out.host = r.host;
            for (const plan::PlanAction& a : r.actions) out.actions.push_back(plan::to_string(a));
            s.ranks.push_back(std::move(out));
        }
        s.text = plan::print(g);
        return s;
    });
}

Result<SimFigures> Script::simulate() const {
    return embed::guarded([&]() -> Result<SimFigures> {
        lang::CheckResult checked = impl_->run_check();
        if (!checked.ok()) return embed::check_failed(checked);
        const Program& p = *checked.program;
        plan::PlanResult planned = plan::lower(p);
        if (!planned.ok()) return Status::error(plan::render_errors(impl_->path, planned.errors));
        sim::SimResult simulated = sim::simulate(*planned.graph, p);
        if (!simulated.ok())
            return Status::error(plan::render_errors(impl_->path, simulated.errors));
        const sim::Timeline& t = *simulated.timeline;
        SimFigures f;
        f.step_time_s = t.step_time_s;
        f.bubble_fraction = t.bubble_fraction;
        f.mfu = t.mfu;
        f.tokens_per_s = t.tokens_per_s;
        for (const sim::RankReport& r : t.ranks) f.peak_memory_bytes.push_back(r.peak_memory_bytes);
        f.memory_limit_bytes = t.memory_limit_bytes;
        f.fits = t.fits;
        f.text = sim::text_report(t);
        return f;
    });
}

} // namespace dist
