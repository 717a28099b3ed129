// commands.cpp: check, fmt and eval: thin layers over the front end and the models.
// (plan and sim are in plan_commands.cpp, run in run_command.cpp.)
#include "cli/commands.hpp"
#include "cli/planned.hpp"
#include "lang/program_json.hpp"

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

int run_check(const CommonOptions& o, std::ostream& out, std::ostream& err) {
    lang::CheckResult r = check_script(o);
    if (!r.ok()) {
        err << r.report();
        return 1;
    }
    const Program& p = *r.program;
    char buf[256];
    std::snprintf(buf, sizeof buf, "%s: ok (%s, %.2fM parameters, %s)\n", o.file.c_str(),
                  p.model.preset.empty() ? p.model.template_name.c_str() : p.model.preset.c_str(),
                  static_cast<double>(p.model.parameters) / 1e6,
                  lang::devices_text(p.mesh).c_str());
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

int run_eval(const CommonOptions& o, const std::string& load, const std::string& data_file,
             bool json, std::ostream& out, std::ostream& err) {
    // Evaluation runs the whole model on this machine, whatever the mesh.
    lang::CheckResult checked = check_script(o);
    if (!checked.ok()) {
        err << checked.report();
        return 1;
    }
    const Program& p = *checked.program;
    DataSpec spec;
    spec.path = data_file;
    spec.format = fs::path(data_file).extension() == ".bin" ? DataFormat::tokens : DataFormat::text;
    models::TokenData data;
    std::string error = models::load_data(spec, p.model, data);
    models::Model model(p.model, static_cast<uint64_t>(p.train.seed), Recompute::none, nullptr,
                        p.train.precision);
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
