// store.cpp: the in-memory and the file-based key-value stores.
#include "transport/store.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <thread>

namespace dist::transport {

void MemoryStore::set(const std::string& key, const std::vector<char>& value) {
    std::lock_guard lock(mutex_);
    values_[key] = value;
    cv_.notify_all();
}

std::vector<char> MemoryStore::get(const std::string& key, std::chrono::milliseconds timeout) {
    std::unique_lock lock(mutex_);
    if (!cv_.wait_for(lock, timeout, [&] { return values_.count(key) != 0; }))
        throw std::runtime_error("store: no value for `" + key + "` after " +
                                 std::to_string(timeout.count()) + " ms");
    return values_.at(key);
}

} // namespace dist::transport

// ----- FileStore ---------------------------------------------------------------------------------

namespace dist::transport {

namespace {
// Distinguishes the temporary files of concurrent writers in one process.
std::atomic<uint64_t> tmp_counter{0};
} // namespace

FileStore::FileStore(std::filesystem::path dir) : dir_(std::move(dir)) {
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
    if (ec || !std::filesystem::is_directory(dir_))
        throw std::runtime_error("store: cannot use directory `" + dir_.string() +
                                 "`: " + (ec ? ec.message() : "not a directory"));
}

// Keys become file names: letters, digits, '-', '_' and '.' stay, every other byte is %XX, so
// `prefix/ucx/0` names one file and a key cannot climb out of the directory.
std::filesystem::path FileStore::path_of(const std::string& key) const {
    static const char* digits = "0123456789ABCDEF";
    std::string name = "k_";
    for (unsigned char c : key) {
        if (std::isalnum(c) || c == '-' || c == '_' || c == '.') {
            name += static_cast<char>(c);
        } else {
            name += '%';
            name += digits[c >> 4];
            name += digits[c & 15];
        }
    }
    return dir_ / name;
}

void FileStore::set(const std::string& key, const std::vector<char>& value) {
    auto target = path_of(key);
    auto tmp = dir_ / (".tmp." + std::to_string(::getpid()) + "." +
                       std::to_string(tmp_counter.fetch_add(1)) + "." + target.filename().string());
    {
        std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
        out.write(value.data(), static_cast<std::streamsize>(value.size()));
        out.flush();
        if (!out) throw std::runtime_error("store: cannot write `" + tmp.string() + "`");
    }
    std::error_code ec;
    std::filesystem::rename(tmp, target, ec);
    if (ec)
        throw std::runtime_error("store: cannot rename `" + tmp.string() + "` to `" +
                                 target.string() + "`: " + ec.message());
}

std::vector<char> FileStore::get(const std::string& key, std::chrono::milliseconds timeout) {
    auto path = path_of(key);
    auto deadline = std::chrono::steady_clock::now() + timeout;
    auto pause = std::chrono::milliseconds(1);
    for (;;) {
        std::ifstream in(path, std::ios::binary);
        if (in) return std::vector<char>(std::istreambuf_iterator<char>(in), {});
        if (std::chrono::steady_clock::now() >= deadline)
            throw std::runtime_error("store: no value for `" + key + "` in `" + dir_.string() +
                                     "` after " + std::to_string(timeout.count()) + " ms");
        std::this_thread::sleep_for(pause);
        pause = std::min(pause * 2, std::chrono::milliseconds(50));
    }
}

} // namespace dist::transport
