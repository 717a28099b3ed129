// commands.cpp: check, fmt and plan: thin layers over the front end.
#include "cli/commands.hpp"

#include "lang/check.hpp"
#include "lang/format.hpp"
#include "lang/loader.hpp"
#include "lang/parse.hpp"
#include "lang/program_json.hpp"
#include "models/trainer.hpp"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <sys/stat.h>
#include <unistd.h>

namespace fs = std::filesystem;

namespace dist::cli {

namespace {

lang::CheckResult check(const CommonOptions& o) {
    lang::FrontendOptions fo;
    fo.search_roots = lang::default_search_roots();
    fo.overrides = o.overrides;
    return lang::check_file(o.file, fo);
}

} // namespace

int run_check(const CommonOptions& o, std::ostream& out, std::ostream& err) {
    lang::CheckResult r = check(o);
    if (!r.ok()) {
        err << r.report();
        return 1;
    }
    const Program& p = *r.program;
    char buf[256];
    std::snprintf(buf, sizeof buf, "%s: ok (%s, %.2fM parameters, %lld x %s)\n", o.file.c_str(),
                  p.model.preset.empty() ? p.model.template_name.c_str() : p.model.preset.c_str(),
                  static_cast<double>(p.model.parameters) / 1e6,
                  static_cast<long long>(p.mesh.devices), p.mesh.profile.name.c_str());
    out << buf;
    return 0;
}

int run_plan(const CommonOptions& o, bool json, std::ostream& out, std::ostream& err) {
    lang::CheckResult r = check(o);
    if (!r.ok()) {
        err << r.report();
        return 1;
    }
    if (json)
        out << lang::to_json(*r.program).dump(2) << "\n";
    else
        out << lang::summary(*r.program);
    return 0;
}

int run_fmt(const CommonOptions& o, bool write, bool check_only, std::ostream& out,
            std::ostream& err) {
    std::string text, error;
    if (!lang::read_source_file(o.file, text, error)) {
        err << "error: cannot read `" << o.file << "`: " << error << "\n";
        return 1;
    }
    lang::SourceManager sources;
    lang::Diagnostics diags;
    uint32_t id = sources.add(o.file, text);
    auto script = lang::parse_script(sources, id, diags);
    if (!script) {
        diags.sort();
        err << diags.render(sources);
        return 1;
    }
    std::string formatted = lang::format_script(*script);
    if (check_only) {
        if (formatted != text) {
            err << o.file << ": not formatted; run `dist fmt --write " << o.file << "`\n";
            return 1;
        }
        return 0;
    }
    if (!write) {
        out << formatted;
        return 0;
    }
    if (formatted == text) return 0;
    if (!write_file_atomically(o.file, formatted, error)) {
        err << "error: cannot write `" << o.file << "`: " << error << "\n";
        return 1;
    }
    return 0;
}

bool write_file_atomically(const std::string& path, const std::string& text, std::string& error) {
    fs::path target(path);
    fs::path dir = target.parent_path().empty() ? fs::path(".") : target.parent_path();
    std::string tmpl = (dir / ("." + target.filename().string() + ".tmp-XXXXXX")).string();
    std::vector<char> name(tmpl.begin(), tmpl.end());
    name.push_back('\0');
    int fd = ::mkstemp(name.data());
    if (fd < 0) {
        error = std::strerror(errno);
        return false;
    }
    auto fail = [&](const char* what) {
        error = std::string(what) + ": " + std::strerror(errno);
        ::close(fd);
        ::unlink(name.data());
        return false;
    };
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0 && ::fchmod(fd, st.st_mode & 07777) != 0)
        return fail("chmod");
    size_t done = 0;
    while (done < text.size()) {
        ssize_t n = ::write(fd, text.data() + done, text.size() - done);
        if (n < 0) {
            if (errno == EINTR) continue;
            return fail("write");
        }
        done += static_cast<size_t>(n);
    }
    if (::fsync(fd) != 0) return fail("fsync");
    if (::close(fd) != 0) {
        error = std::strerror(errno);
        ::unlink(name.data());
        return false;
    }
    if (::rename(name.data(), path.c_str()) != 0) {
        error = std::strerror(errno);
        ::unlink(name.data());
        return false;
    }
    int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
    if (dfd >= 0) {
        ::fsync(dfd);
        ::close(dfd);
    }
    return true;
}

int run_train(const CommonOptions& o, const RunOptions& r, std::ostream& out, std::ostream& err) {
    lang::CheckResult checked = check(o);
    if (!checked.ok()) {
        err << checked.report();
        return 1;
    }
    const Program& p = *checked.program;
    if (p.mesh.devices != 1) {
        err << "error: this build trains on one device; the mesh has " << p.mesh.devices << " (dp "
            << p.mesh.dp << ", tp " << p.mesh.tp << ", pp " << p.mesh.pp
            << "). Use --set mesh.dp=1 --set mesh.tp=1 --set mesh.pp=1, or `dist plan` to study "
               "the layout\n";
        return 1;
    }
    models::TokenData data;
    std::string error = models::load_data(p.train.data, p.model, data);
    if (!error.empty()) {
        err << "error: " << error << "\n";
        return 1;
    }
    std::ofstream metrics;
    if (!r.metrics.empty()) {
        metrics.open(r.metrics, std::ios::trunc);
        if (!metrics) {
            err << "error: cannot write `" << r.metrics << "`: " << std::strerror(errno) << "\n";
            return 1;
        }
    }
    models::Model model(p.model, static_cast<uint64_t>(p.train.seed));
    bool tty = r.progress && ::isatty(STDERR_FILENO);
    int64_t last = p.train.stop_after > 0 ? p.train.stop_after : p.train.steps;
    double elapsed = 0.0;
    out << "training " << (p.model.preset.empty() ? p.model.template_name : p.model.preset) << " ("
        << p.model.parameters << " parameters) for " << last << " steps of " << p.train.batch
        << " x " << p.model.context << " tokens on one cpu device\n";
    error = models::train(p, model, data, [&](const models::StepMetrics& m) {
        elapsed += m.step_time_s;
        if (metrics) metrics << models::metrics_json(m) << "\n" << std::flush;
        double eta = elapsed / static_cast<double>(m.step) * static_cast<double>(last - m.step);
        char line[256];
        std::snprintf(line, sizeof line,
                      "step %5lld/%lld  loss %.4f  lr %.2e  norm %.3f  %.0f tok/s  eta %.0fs",
                      static_cast<long long>(m.step), static_cast<long long>(last), m.loss, m.lr,
                      m.grad_norm, m.tokens_per_s, eta);
        if (tty)
            err << "\r" << line << "\x1b[K" << std::flush;
        else if (r.progress && (m.step == 1 || m.step % 10 == 0 || m.step == last))
            err << line << "\n";
        return true;
    });
    if (tty) err << "\n";
    if (!error.empty()) {
        err << "error: " << error << "\n";
        return 1;
    }
    return 0;
}

} // namespace dist::cli
