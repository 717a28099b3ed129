// commands.cpp: check, fmt, run and eval: thin layers over the front end and the models.
// (plan and sim are in plan_commands.cpp.)
#include "cli/commands.hpp"

#include "lang/check.hpp"
#include "lang/format.hpp"
#include "lang/loader.hpp"
#include "lang/parse.hpp"
#include "models/atomic_file.hpp"
#include "models/checkpoint.hpp"
#include "models/trainer.hpp"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
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
    if (std::string e = models::write_file_atomically(o.file, {formatted}); !e.empty()) {
        err << "error: " << e << "\n";
        return 1;
    }
    return 0;
}

namespace {

// The script, checked, for commands that compute: one device for now.
std::optional<Program> checked_for_device(const CommonOptions& o, std::ostream& err) {
    lang::CheckResult checked = check(o);
    if (!checked.ok()) {
        err << checked.report();
        return std::nullopt;
    }
    const Program& p = *checked.program;
    if (p.mesh.devices != 1) {
        err << "error: this build computes on one device; the mesh has " << p.mesh.devices
            << " (dp " << p.mesh.dp << ", tp " << p.mesh.tp << ", pp " << p.mesh.pp
            << "). Use --set mesh.dp=1 --set mesh.tp=1 --set mesh.pp=1, or `dist plan` to study "
               "the layout\n";
        return std::nullopt;
    }
    return *checked.program;
}

std::string model_label(const Program& p) {
    return p.model.preset.empty() ? p.model.template_name : p.model.preset;
}

} // namespace

int run_train(const CommonOptions& o, const RunOptions& r, std::ostream& out, std::ostream& err) {
    std::optional<Program> program = checked_for_device(o, err);
    if (!program) return 1;
    const Program& p = *program;
    if (!r.resume.empty() && !r.load.empty()) {
        err << "error: --resume continues a run and --load starts one from weights; give one\n";
        return 2;
    }
    models::TokenData data;
    std::string error = models::load_data(p.train.data, p.model, data);
    if (!error.empty()) {
        err << "error: " << error << "\n";
        return 1;
    }
    models::Model model(p.model, static_cast<uint64_t>(p.train.seed), p.schedule.recompute);
    int64_t first = 0;
    if (!r.resume.empty()) error = models::load_training_state(r.resume, model, first);
    if (!r.load.empty()) error = models::load_weights(r.load, model);
    if (!error.empty()) {
        err << "error: " << error << "\n";
        return 1;
    }
    const int64_t last = p.train.stop_after > 0 ? p.train.stop_after : p.train.steps;
    if (first >= last) {
        err << "error: `" << r.resume << "` is at step " << first << "; the script stops at step "
            << last << "\n";
        return 1;
    }
    std::ofstream metrics;
    if (!r.metrics.empty()) {
        metrics.open(r.metrics, first > 0 ? std::ios::app : std::ios::trunc);
        if (!metrics) {
            err << "error: cannot write `" << r.metrics << "`: " << std::strerror(errno) << "\n";
            return 1;
        }
    }
    const std::string save_dir = !r.save.empty() ? r.save : p.train.checkpoint.dir;
    if (!save_dir.empty()) {
        // Find out now, not after hours of training, that the folder cannot be written.
        std::error_code ec;
        fs::create_directories(save_dir, ec);
        if (ec || ::access(save_dir.c_str(), W_OK) != 0) {
            err << "error: cannot save checkpoints into `" << save_dir
                << "`: " << (ec ? ec.message() : std::strerror(errno)) << "\n";
            return 1;
        }
    }
    const uint64_t seed = static_cast<uint64_t>(p.train.seed);
    bool tty = r.progress && ::isatty(STDERR_FILENO);
    double elapsed = 0.0;
    out << "training " << model_label(p) << " (" << p.model.parameters << " parameters) on "
        << (first > 0 ? "steps " + std::to_string(first + 1) + " to " : "steps 1 to ") << last
        << ", " << p.train.batch << " x " << p.model.context << " tokens each, on one cpu device\n"
        << std::flush;
    std::string save_error;
    error = models::train(p, model, data, first, [&](const models::StepMetrics& m) {
        elapsed += m.step_time_s;
        if (metrics) metrics << models::metrics_json(m) << "\n" << std::flush;
        double eta =
            elapsed / static_cast<double>(m.step - first) * static_cast<double>(last - m.step);
        char line[256];
        std::snprintf(line, sizeof line,
                      "step %5lld/%lld  loss %.4f  lr %.2e  norm %.3f  %.0f tok/s  eta %.0fs",
                      static_cast<long long>(m.step), static_cast<long long>(last), m.loss, m.lr,
                      m.grad_norm, m.tokens_per_s, eta);
        if (tty)
            err << "\r" << line << "\x1b[K" << std::flush;
        else if (r.progress && (m.step == first + 1 || m.step % 10 == 0 || m.step == last))
            err << line << "\n";
        bool periodic = p.train.checkpoint.every > 0 && m.step % p.train.checkpoint.every == 0;
        if (!save_dir.empty() && (periodic || m.step == last)) {
            save_error = models::save_checkpoint(save_dir, model, m.step, seed);
            if (!save_error.empty()) return false;
        }
        return true;
    });
    if (tty) err << "\n";
    if (error.empty()) error = save_error;
    if (!error.empty()) {
        err << "error: " << error << "\n";
        return 1;
    }
    if (!save_dir.empty()) out << "saved " << save_dir << "\n";
    if (r.sample_tokens > 0) {
        GenerateSpec gen = p.generate;
        gen.max_tokens = r.sample_tokens;
        std::vector<int32_t> tokens = {'\n'};
        models::sample(model, gen, seed, tokens);
        std::string text(tokens.begin() + 1, tokens.end());
        for (char& c : text)
            if ((c < 32 && c != '\n' && c != '\t') || c == 127) c = '?';
        out << "sample (" << r.sample_tokens << " tokens, temperature " << gen.temperature
            << ", top-k " << gen.top_k << "):\n"
            << text << "\n";
    }
    return 0;
}

int run_eval(const CommonOptions& o, const std::string& load, const std::string& data_file,
             bool json, std::ostream& out, std::ostream& err) {
    std::optional<Program> program = checked_for_device(o, err);
    if (!program) return 1;
    const Program& p = *program;
    DataSpec spec;
    spec.path = data_file;
    spec.format = fs::path(data_file).extension() == ".bin" ? DataFormat::tokens : DataFormat::text;
    models::TokenData data;
    std::string error = models::load_data(spec, p.model, data);
    models::Model model(p.model, static_cast<uint64_t>(p.train.seed));
    if (error.empty()) error = models::load_weights(load, model);
    if (!error.empty()) {
        err << "error: " << error << "\n";
        return 1;
    }
    models::EvalResult e = models::evaluate(model, data);
    if (json)
        out << nlohmann::json{{"loss", e.loss}, {"tokens", e.tokens}}.dump() << "\n";
    else
        out << "loss " << e.loss << " over " << e.tokens << " tokens (perplexity "
            << std::exp(e.loss) << ")\n";
    return 0;
}

} // namespace dist::cli
