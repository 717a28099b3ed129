// store.hpp: the key-value store through which the members of a group find each other
// (Gloo's rendezvous, NCCL's unique id, UCX worker addresses).
//
// Across processes the control plane implements it; MemoryStore serves ranks of one process,
// FileStore the processes of one host (tests, benchmarks, the local launcher).
#pragma once

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace dist::transport {

class KeyValueStore {
  public:
    virtual ~KeyValueStore() = default;
    virtual void set(const std::string& key, const std::vector<char>& value) = 0;
    /// The value of `key`, waiting up to `timeout` for it to be set; throws
    /// std::runtime_error naming the key when it is not.
    virtual std::vector<char> get(const std::string& key, std::chrono::milliseconds timeout) = 0;
};

/// A store in this process's memory, safe to share between threads.
class MemoryStore final : public KeyValueStore {
  public:
    void set(const std::string& key, const std::vector<char>& value) override;
    std::vector<char> get(const std::string& key, std::chrono::milliseconds timeout) override;

  private:
    std::mutex mutex_;
    std::condition_variable cv_;
    std::map<std::string, std::vector<char>> values_;
};

/// A store in a directory shared by the processes of one host: one file per key, written to a
/// temporary name and renamed into place, so a reader sees a whole value or none. `get` polls.
/// Files are left behind: use a fresh directory per job.
class FileStore final : public KeyValueStore {
  public:
    /// Creates `dir` when missing; throws std::runtime_error when it cannot.
    explicit FileStore(std::filesystem::path dir);
    void set(const std::string& key, const std::vector<char>& value) override;
    std::vector<char> get(const std::string& key, std::chrono::milliseconds timeout) override;
    const std::filesystem::path& dir() const { return dir_; }

  private:
    std::filesystem::path path_of(const std::string& key) const;
    std::filesystem::path dir_;
};

} // namespace dist::transport
