// frontend_fuzzer.cpp: libFuzzer over the whole front end. Any input must end in a program or
// in diagnostics: no crash, hang, leak or sanitizer report. Inputs that parse must also format
// to text that parses to the same tree and formats to itself.
#include "lang/check.hpp"
#include "lang/format.hpp"
#include "lang/parse.hpp"

#include <cstdint>
#include <cstdlib>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    std::string text(reinterpret_cast<const char*>(data), size);

    dist::lang::SourceManager sources;
    dist::lang::Diagnostics diags;
    auto script = dist::lang::parse_script(sources, sources.add("fuzz.dist", text), diags);
    (void)diags.render(sources);
    if (script) {
        std::string formatted = dist::lang::format_script(*script);
        dist::lang::Diagnostics again_diags;
        auto again =
            dist::lang::parse_script(sources, sources.add("formatted", formatted), again_diags);
        if (!again) std::abort(); // the formatter wrote something that does not parse
        if (dist::lang::dump(*again) != dist::lang::dump(*script)) std::abort();
        if (dist::lang::format_script(*again) != formatted) std::abort();
    }

    static const std::vector<std::filesystem::path> roots = dist::lang::default_search_roots();
    dist::lang::FrontendOptions options;
    options.search_roots = roots;
    options.check_files = false;
    dist::lang::CheckResult r = dist::lang::check_text("fuzz.dist", text, options);
    (void)r.report();
    return 0;
}
