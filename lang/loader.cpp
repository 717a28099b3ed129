// loader.cpp: import resolution (script folder, DIST_PATH, stdlib), cycle detection, parsing.
#include "lang/loader.hpp"

#include "lang/parse.hpp"

#include <algorithm>
#include <cstring>
#include <fstream>

namespace fs = std::filesystem;

namespace dist::lang {

bool read_source_file(const fs::path& path, std::string& text, std::string& error) {
    std::error_code ec;
    fs::file_status st = fs::status(path, ec);
    if (ec || !fs::exists(st)) {
        error = "no such file";
        return false;
    }
    if (fs::is_directory(st)) {
        error = "it is a directory";
        return false;
    }
    if (!fs::is_regular_file(st)) {
        error = "it is not a regular file";
        return false;
    }
    std::ifstream in(path, std::ios::binary);
    if (!in) {
        error = std::strerror(errno);
        return false;
    }
    text.clear();
    char buf[65536];
    while (in.read(buf, sizeof buf) || in.gcount() > 0) {
        text.append(buf, static_cast<size_t>(in.gcount()));
        if (text.size() > max_source_bytes) {
            error = "larger than " + std::to_string(max_source_bytes >> 20) + " MiB";
            return false;
        }
    }
    return true;
}

namespace {

bool within(const fs::path& path, const fs::path& root) {
    auto p = path.begin();
    for (auto r = root.begin(); r != root.end(); ++r, ++p) {
        if (r->empty()) continue;
        if (p == path.end() || *p != *r) return false;
    }
    return true;
}

class Loader {
  public:
    Loader(const std::vector<fs::path>& roots, SourceManager& sources, Diagnostics& diags)
        : roots_(roots), sources_(sources), diags_(diags) {}

    bool load(const fs::path& canonical, std::string text, std::string display_name) {
        uint32_t id = sources_.add(std::move(display_name), std::move(text));
        std::unique_ptr<Script> script = parse_script(sources_, id, diags_);
        if (!script) return false;
        stack_.push_back(canonical);
        bool ok = true;
        for (const auto& st : script->statements) {
            if (st.kind != Statement::Kind::import) continue;
            fs::path target;
            if (!resolve(st, canonical.parent_path(), target)) {
                ok = false;
                continue;
            }
            if (std::find(stack_.begin(), stack_.end(), target) != stack_.end()) {
                std::string chain;
                auto it = std::find(stack_.begin(), stack_.end(), target);
                for (; it != stack_.end(); ++it) chain += it->filename().string() + " -> ";
                chain += target.filename().string();
                diags_.error(st.name_loc, "import cycle: " + chain,
                             "move what both files need into a third file that both import");
                ok = false;
                continue;
            }
            if (loaded(target)) continue;
            if (stack_.size() >= max_import_depth) {
                diags_.error(st.name_loc, "imports nested more than " +
                                              std::to_string(max_import_depth) + " deep");
                ok = false;
                continue;
            }
            std::string body, error;
            if (!read_source_file(target, body, error)) {
                diags_.error(st.name_loc, "cannot read `" + st.name + "`: " + error);
                ok = false;
                continue;
            }
            ok = load(target, std::move(body), display(target)) && ok;
        }
        stack_.pop_back();
        files_.push_back({canonical, std::move(script)});
        return ok;
    }

    std::vector<LoadedFile> take() { return std::move(files_); }

  private:
    bool loaded(const fs::path& p) const {
        return std::any_of(files_.begin(), files_.end(),
                           [&](const LoadedFile& f) { return f.path == p; });
    }

    // A library file shows as `std/gpt.dist` rather than a long absolute path.
    std::string display(const fs::path& p) const {
        for (const auto& root : roots_) {
            std::error_code ec;
            fs::path r = fs::weakly_canonical(root, ec);
            if (!ec && within(p, r)) return p.lexically_relative(r).string();
        }
        return p.string();
    }

    bool resolve(const Statement& st, const fs::path& here, fs::path& out) {
        const std::string& name = st.name;
        fs::path rel(name);
        if (name.empty()) {
            diags_.error(st.name_loc, "empty import path");
            return false;
        }
        if (rel.is_absolute()) {
            diags_.error(st.name_loc, "import paths are relative",
                         "name the file from the script's folder or the library, e.g. "
                         "\"std/gpt.dist\"");
            return false;
        }
        for (const auto& part : rel) {
            if (part == "..") {
                diags_.error(st.name_loc, "import paths may not contain `..`",
                             "put shared files in a folder named by DIST_PATH");
                return false;
            }
        }
        if (rel.extension() != ".dist") {
            diags_.error(st.name_loc, "imports name .dist files, not `" + name + "`");
            return false;
        }
        std::vector<fs::path> roots{here};
        roots.insert(roots.end(), roots_.begin(), roots_.end());
        std::vector<std::string> looked;
        for (const auto& root : roots) {
            std::error_code ec;
            fs::path candidate = root / rel;
            looked.push_back(root.empty() ? "." : root.string());
            if (!fs::exists(candidate, ec)) continue;
            fs::path canon = fs::canonical(candidate, ec);
            fs::path canon_root = fs::canonical(root.empty() ? fs::path(".") : root, ec);
            if (ec) continue;
            if (!within(canon, canon_root)) {
                diags_.error(st.name_loc,
                             "`" + name + "` leads outside `" + root.string() +
                                 "` through a symbolic link",
                             "imports stay inside the folder they are found in");
                return false;
            }
            out = canon;
            return true;
        }
        std::string hint = "looked in ";
        for (size_t i = 0; i < looked.size(); ++i) hint += (i ? ", " : "") + looked[i];
        diags_.error(st.name_loc, "cannot find `" + name + "`", hint);
        return false;
    }

    const std::vector<fs::path>& roots_;
    SourceManager& sources_;
    Diagnostics& diags_;
    std::vector<fs::path> stack_;
    std::vector<LoadedFile> files_;
};

} // namespace

LoadedProgram load_program(const fs::path& path, std::string text,
                           const std::vector<fs::path>& roots, SourceManager& sources,
                           Diagnostics& diags) {
    std::error_code ec;
    fs::path canonical = fs::weakly_canonical(fs::absolute(path, ec), ec);
    Loader loader(roots, sources, diags);
    LoadedProgram out;
    out.ok = loader.load(canonical, std::move(text), path.string());
    out.files = loader.take();
    return out;
}

} // namespace dist::lang
