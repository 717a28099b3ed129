// store.cpp: the in-memory key-value store.
#include "transport/store.hpp"

#include <stdexcept>

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
