// source.cpp: line indexing of sources.
#include "lang/source.hpp"

namespace dist::lang {

SourceFile::SourceFile(std::string name, std::string text)
    : name_(std::move(name)), text_(std::move(text)) {
    line_starts_.push_back(0);
    for (size_t i = 0; i < text_.size(); ++i) {
        if (text_[i] == '\n' && i + 1 < text_.size()) line_starts_.push_back(i + 1);
    }
}

std::string_view SourceFile::line(uint32_t n) const {
    if (n == 0 || n > line_starts_.size()) return {};
    size_t begin = line_starts_[n - 1];
    size_t end = text_.find('\n', begin);
    if (end == std::string::npos) end = text_.size();
    if (end > begin && text_[end - 1] == '\r') --end;
    return std::string_view(text_).substr(begin, end - begin);
}

uint32_t SourceManager::add(std::string name, std::string text) {
    files_.push_back(std::make_unique<SourceFile>(std::move(name), std::move(text)));
    return static_cast<uint32_t>(files_.size() - 1);
}

} // namespace dist::lang
