// check.cpp: the checker's driver. Collects definitions from every loaded file, applies the
// overrides, and hands the model call and the configuration blocks to their own checks.
#include "lang/check.hpp"

#include "lang/check_internal.hpp"
#include "lang/loader.hpp"

#include <cstdlib>
#include <unistd.h>

namespace fs = std::filesystem;

namespace dist::lang {

std::vector<fs::path> dist_path_roots() {
    std::vector<fs::path> roots;
    if (const char* env = std::getenv("DIST_PATH")) {
        std::string s(env);
        size_t start = 0;
        while (start <= s.size()) {
            size_t end = s.find(':', start);
            if (end == std::string::npos) end = s.size();
            if (end > start) roots.emplace_back(s.substr(start, end - start));
            start = end + 1;
        }
    }
    return roots;
}

std::vector<fs::path> default_search_roots() {
    std::vector<fs::path> roots = dist_path_roots();
    std::error_code ec;
    fs::path exe = fs::read_symlink("/proc/self/exe", ec);
    if (!ec) {
        fs::path installed = exe.parent_path().parent_path() / "share" / "dist" / "stdlib";
        if (fs::is_directory(installed, ec)) roots.push_back(installed);
    }
    roots.emplace_back(DIST_SOURCE_STDLIB);
    return roots;
}

namespace {

const std::vector<std::string> block_names = {"mesh", "schedule", "train", "generate"};

// Gathers templates, presets and lets; reports redefinitions and misplaced statements.
void collect(const LoadedProgram& loaded, const SourceManager& sources, Definitions& defs,
             Diagnostics& diags) {
    std::map<std::string, SourceLoc> seen;
    auto define = [&](const Statement& st) {
        auto [it, fresh] = seen.emplace(st.name, st.name_loc);
        if (!fresh) {
            diags.error(st.name_loc, "`" + st.name + "` is already defined",
                        "first defined at " + sources.file(it->second.file).name() + ":" +
                            std::to_string(it->second.line));
            return false;
        }
        return true;
    };
    for (size_t f = 0; f < loaded.files.size(); ++f) {
        bool is_main = f + 1 == loaded.files.size();
        for (const auto& st : loaded.files[f].script->statements) {
            switch (st.kind) {
            case Statement::Kind::import: break;
            case Statement::Kind::model_template:
                if (define(st)) defs.templates[st.name] = {&st};
                break;
            case Statement::Kind::preset:
                if (define(st)) defs.presets[st.name] = {&st};
                break;
            case Statement::Kind::let:
                if (define(st)) {
                    if (auto v = evaluate(*st.value, defs.globals, diags))
                        defs.globals.set(st.name, *v, st.name_loc);
                }
                break;
            case Statement::Kind::model:
            case Statement::Kind::block:
                if (!is_main) {
                    diags.error(st.kind == Statement::Kind::model ? st.value->loc : st.name_loc,
                                "an imported file holds definitions only",
                                "`model =` and configuration blocks belong in the script "
                                "that is run");
                }
                break;
            }
        }
    }
}

CheckResult check_loaded(CheckResult result, const fs::path& path, std::string text,
                         const FrontendOptions& options) {
    SourceManager& sources = *result.sources;
    Diagnostics& diags = result.diagnostics;
    std::vector<fs::path> roots = options.search_roots;
    LoadedProgram loaded = load_program(path, std::move(text), roots, sources, diags);
    std::vector<Override> overrides = parse_overrides(options.overrides, sources, diags);
    if (!loaded.ok || loaded.files.empty()) {
        diags.sort();
        return result;
    }
    Script& main = *loaded.files.back().script;
    std::vector<Override> hardware_overrides;
    std::vector<Override> model_overrides =
        apply_overrides(std::move(overrides), main, diags, hardware_overrides);

    Definitions defs;
    collect(loaded, sources, defs, diags);

    const Statement* model_stmt = nullptr;
    BlockSet blocks;
    blocks.file = main.file;
    blocks.hardware = &hardware_overrides;
    for (const auto& st : main.statements) {
        if (st.kind == Statement::Kind::model) {
            if (model_stmt) {
                diags.error(st.value->loc, "the model is already chosen",
                            "first chosen at line " + std::to_string(model_stmt->loc.line));
            } else {
                model_stmt = &st;
            }
        } else if (st.kind == Statement::Kind::block) {
            const Block* b = st.block.get();
            const Block** slot = b->name == "mesh"       ? &blocks.mesh
                                 : b->name == "schedule" ? &blocks.schedule
                                 : b->name == "train"    ? &blocks.train
                                 : b->name == "generate" ? &blocks.generate
                                                         : nullptr;
            if (!slot) {
                blocks.unknown_block = true;
                std::string best = closest_name(b->name, block_names);
                diags.error(b->loc, "unknown block `" + b->name + "`",
                            best.empty() ? "the blocks are " + join_names(block_names)
                                         : "did you mean `" + best + "`?");
            } else if (*slot) {
                diags.error(b->loc, "`" + b->name + "` is already given",
                            "first given at line " + std::to_string((*slot)->loc.line) +
                                "; merge the two");
            } else {
                *slot = b;
            }
        }
    }

    Program program;
    program.file = path.string();
    bool model_ok = false;
    if (!model_stmt) {
        diags.error({main.file, 1, 1, 1}, "the script chooses no model",
                    "add a line such as `model = gpt(vocab: 256, context: 64, layers: 2, "
                    "heads: 2, width: 64)` after `import \"std/gpt.dist\"`");
    } else {
        model_ok = check_model(*model_stmt, defs, model_overrides, diags, program.model);
    }
    // The blocks are read even when the model failed, so that their errors show too.
    blocks.model_ok = model_ok;
    fs::path dir = fs::absolute(path).parent_path();
    check_blocks(blocks, defs, dir, options, sources, diags, program);
    diags.sort();
    if (!diags.has_errors()) result.program = std::move(program);
    return result;
}

} // namespace

CheckResult check_file(const fs::path& path, const FrontendOptions& options) {
    CheckResult result;
    std::string text, error;
    if (!read_source_file(path, text, error)) {
        result.diagnostics.error({}, "cannot read `" + path.string() + "`: " + error);
        return result;
    }
    return check_loaded(std::move(result), path, std::move(text), options);
}

CheckResult check_text(const std::string& name, const std::string& text,
                       const FrontendOptions& options) {
    return check_loaded(CheckResult{}, fs::path(name), text, options);
}

} // namespace dist::lang
