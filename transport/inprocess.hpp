// inprocess.hpp: collectives among ranks that are threads of one process.
//
// The members of an InProcessGroup hand each other pointers to their buffers and reduce in
// shared memory: each member reduces one contiguous chunk of the data across every member's
// buffer, in rank order, and writes the result back to all of them, so all members end with
// bitwise-equal results and the reduction order does not depend on thread timing. Two barriers
// frame each call (buffers published; every chunk written). A member that fails calls abort(),
// which wakes every waiting member with a CollectiveError instead of leaving it blocked; a
// member that waits longer than the timeout gets one too.
#pragma once

#include "transport/collectives.hpp"

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace dist::transport {

class InProcessGroup {
  public:
    /// `name` appears in errors ("tp group 0").
    InProcessGroup(int size, std::string name,
                   std::chrono::milliseconds timeout = std::chrono::minutes(5));

    int size() const { return size_; }
    const std::string& name() const { return name_; }

    /// Fails every pending and future collective of the group with `why`.
    void abort(const std::string& why);
    bool aborted() const;

    /// The handle of member `rank`.
    std::unique_ptr<Collectives> member(int rank);

  private:
    friend class InProcessCollectives;

    struct Slot {
        const float* in = nullptr;
        float* out = nullptr;
        int64_t n = 0;
        int kind = 0;
        int op = 0;
        int root = 0;
        const int64_t* send = nullptr; // all_to_all: the counts for each member
    };
    /// Publishes this member's slot, waits for every member, and checks they agree.
    void arrive(int rank, const Slot& slot, const char* call);
    /// Waits until every member has arrived at this barrier (the second of a call).
    void barrier(int rank, const char* call);
    void wait_all(std::unique_lock<std::mutex>& lock, int rank, const char* call);
    /// A member's reason the call in progress fails (the first kept), and what was kept: read
    /// by every member after the call's barrier.
    void note(const std::string& why);
    std::string noted() const;

    const int size_;
    const std::string name_;
    const std::chrono::milliseconds timeout_;
    mutable std::mutex mutex_;
    std::condition_variable cv_;
    std::vector<Slot> slots_;
    int arrived_ = 0;
    uint64_t generation_ = 0;
    std::string abort_reason_;
    std::string noted_;
};

} // namespace dist::transport
