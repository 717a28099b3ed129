// inprocess.cpp: the shared-memory collectives of ranks that are threads of one process.
#include "transport/inprocess.hpp"

#include <algorithm>
#include <cstring>

namespace dist::transport {

void SoloCollectives::all_gather(const float* in, int64_t n, float* out) {
    if (in != out) std::memmove(out, in, static_cast<size_t>(n) * sizeof(float));
}

void SoloCollectives::reduce_scatter(const float* in, int64_t n, float* out) {
    if (in != out) std::memmove(out, in, static_cast<size_t>(n) * sizeof(float));
}

void SoloCollectives::all_to_all(const float* in, const std::vector<int64_t>& send, float* out,
                                 const std::vector<int64_t>& recv) {
    if (send.size() != 1 || recv.size() != 1 || send[0] != recv[0])
        throw CollectiveError("all_to_all in a group of one: it sends itself what it receives");
    if (in != out) std::memmove(out, in, static_cast<size_t>(send[0]) * sizeof(float));
}

namespace {

enum Kind {
    all_reduce_kind = 1,
    all_gather_kind,
    reduce_scatter_kind,
    broadcast_kind,
    all_to_all_kind
};

const char* kind_name(int kind) {
    switch (kind) {
    case all_reduce_kind: return "all_reduce";
    case all_gather_kind: return "all_gather";
    case reduce_scatter_kind: return "reduce_scatter";
    case broadcast_kind: return "broadcast";
    case all_to_all_kind: return "all_to_all";
    }
    return "?";
}

// [begin, end) of member r's share of n elements.
std::pair<int64_t, int64_t> chunk(int64_t n, int r, int size) {
    return {n * r / size, n * (r + 1) / size};
}

} // namespace

class InProcessCollectives final : public Collectives {
  public:
    InProcessCollectives(InProcessGroup& group, int rank) : group_(group), rank_(rank) {}
    int rank() const override { return rank_; }
    int size() const override { return group_.size(); }

    void all_reduce(float* data, int64_t n, ReduceOp op) override {
        group_.arrive(rank_, {data, data, n, all_reduce_kind, static_cast<int>(op), 0},
                      "all_reduce");
        auto [begin, end] = chunk(n, rank_, size());
        const auto& slots = group_.slots_;
        // A block at a time through a buffer of our own, member 0's values first and the
        // others' added in member order (the same sums as element by element), so the loops
        // over contiguous floats vectorise and each block is written once to every member.
        constexpr int64_t block = 2048;
        float acc[block];
        for (int64_t at = begin; at < end; at += block) {
            const int64_t len = std::min(block, end - at);
            std::memcpy(acc, slots[0].out + at, static_cast<size_t>(len) * sizeof(float));
            for (size_t m = 1; m < slots.size(); ++m) {
                const float* from = slots[m].out + at;
                if (op == ReduceOp::sum)
                    for (int64_t i = 0; i < len; ++i) acc[i] += from[i];
                else
                    for (int64_t i = 0; i < len; ++i) acc[i] = std::max(acc[i], from[i]);
            }
            for (const auto& s : slots)
                std::memcpy(s.out + at, acc, static_cast<size_t>(len) * sizeof(float));
        }
        group_.barrier(rank_, "all_reduce");
    }

    void all_gather(const float* in, int64_t n, float* out) override {
        group_.arrive(rank_, {in, out, n, all_gather_kind, 0, 0}, "all_gather");
        for (const auto& s : group_.slots_) {
            float* dst = s.out + static_cast<int64_t>(rank_) * n;
            if (dst != in) std::memcpy(dst, in, static_cast<size_t>(n) * sizeof(float));
        }
        group_.barrier(rank_, "all_gather");
    }

    void reduce_scatter(const float* in, int64_t n, float* out) override {
        group_.arrive(rank_, {in, out, n, reduce_scatter_kind, 0, 0}, "reduce_scatter");
        const auto& slots = group_.slots_;
        int64_t offset = static_cast<int64_t>(rank_) * n;
        // Sum into a buffer of our own first: `out` may alias our chunk of `in`, which the
        // other members are reading.
        std::vector<float> acc(slots[0].in + offset, slots[0].in + offset + n);
        for (size_t m = 1; m < slots.size(); ++m)
            for (int64_t i = 0; i < n; ++i) acc[i] += slots[m].in[offset + i];
        group_.barrier(rank_, "reduce_scatter");
        std::memcpy(out, acc.data(), static_cast<size_t>(n) * sizeof(float));
    }

    void broadcast(float* data, int64_t n, int root) override {
        if (root < 0 || root >= size())
            throw CollectiveError(group_.name() + ": broadcast from rank " + std::to_string(root) +
                                  " of a group of " + std::to_string(size()));
        group_.arrive(rank_, {data, data, n, broadcast_kind, 0, root}, "broadcast");
        if (rank_ != root)
            std::memcpy(data, group_.slots_[root].in, static_cast<size_t>(n) * sizeof(float));
        group_.barrier(rank_, "broadcast");
    }

    void all_to_all(const float* in, const std::vector<int64_t>& send, float* out,
                    const std::vector<int64_t>& recv) override {
        const auto n = static_cast<size_t>(size());
        if (send.size() != n || recv.size() != n)
            throw CollectiveError(group_.name() + ": all_to_all on rank " + std::to_string(rank_) +
                                  " with counts for " + std::to_string(send.size()) + " and " +
                                  std::to_string(recv.size()) + " members of " + std::to_string(n));
        InProcessGroup::Slot slot{in, out, static_cast<int64_t>(n), all_to_all_kind, 0, 0};
        slot.send = send.data();
        group_.arrive(rank_, slot, "all_to_all");
        // Every member reads its blocks from the senders' buffers, each at the offset the
        // sender's own counts give.
        const auto& slots = group_.slots_;
        std::string mismatch;
        int64_t at = 0;
        for (size_t g = 0; g < n; ++g) {
            const int64_t* theirs = slots[g].send;
            if (theirs[rank_] != recv[g]) {
                mismatch = group_.name() + ": all_to_all: rank " + std::to_string(g) + " sends " +
                           std::to_string(theirs[rank_]) + " values to rank " +
                           std::to_string(rank_) + ", which expects " + std::to_string(recv[g]);
                break;
            }
            int64_t from = 0;
            for (int r = 0; r < rank_; ++r) from += theirs[r];
            if (recv[g] > 0)
                std::memcpy(out + at, slots[g].in + from,
                            static_cast<size_t>(recv[g]) * sizeof(float));
            at += recv[g];
        }
        // Every member has read the others' counts and blocks before any fails (and frees its
        // own): the disagreement is noted, and after the barrier every member fails with it.
        if (!mismatch.empty()) group_.note(mismatch);
        group_.barrier(rank_, "all_to_all");
        if (std::string why = group_.noted(); !why.empty()) {
            group_.abort(why);
            throw CollectiveError(why);
        }
    }

  private:
    InProcessGroup& group_;
    int rank_;
};

InProcessGroup::InProcessGroup(int size, std::string name, std::chrono::milliseconds timeout)
    : size_(size), name_(std::move(name)), timeout_(timeout), slots_(static_cast<size_t>(size)) {
    if (size < 1) throw std::invalid_argument("a group needs at least one member");
}

std::unique_ptr<Collectives> InProcessGroup::member(int rank) {
    if (rank < 0 || rank >= size_)
        throw std::invalid_argument(name_ + ": no rank " + std::to_string(rank) +
                                    " in a group of " + std::to_string(size_));
    return std::make_unique<InProcessCollectives>(*this, rank);
}

void InProcessGroup::abort(const std::string& why) {
    std::lock_guard lock(mutex_);
    if (abort_reason_.empty()) abort_reason_ = why;
    cv_.notify_all();
}

void InProcessGroup::note(const std::string& why) {
    std::lock_guard lock(mutex_);
    if (noted_.empty()) noted_ = why;
}

std::string InProcessGroup::noted() const {
    std::lock_guard lock(mutex_);
    return noted_;
}

bool InProcessGroup::aborted() const {
    std::lock_guard lock(mutex_);
    return !abort_reason_.empty();
}

void InProcessGroup::arrive(int rank, const Slot& slot, const char* call) {
    std::unique_lock lock(mutex_);
    slots_[static_cast<size_t>(rank)] = slot;
    wait_all(lock, rank, call);
    // Every member sees the same slots, so every member reaches the same verdict.
    const Slot& first = slots_[0];
    for (int m = 0; m < size_; ++m) {
        const Slot& s = slots_[static_cast<size_t>(m)];
        if (s.kind != first.kind || s.n != first.n || s.op != first.op || s.root != first.root) {
            std::string why = name_ + ": rank 0 called " + kind_name(first.kind) + " of " +
                              std::to_string(first.n) + " values but rank " + std::to_string(m) +
                              " called " + kind_name(s.kind) + " of " + std::to_string(s.n);
            if (abort_reason_.empty()) abort_reason_ = why;
            cv_.notify_all();
            throw CollectiveError(why);
        }
    }
}

void InProcessGroup::barrier(int rank, const char* call) {
    std::unique_lock lock(mutex_);
    wait_all(lock, rank, call);
}

void InProcessGroup::wait_all(std::unique_lock<std::mutex>& lock, int rank, const char* call) {
    if (!abort_reason_.empty())
        throw CollectiveError(name_ + ": " + call + " on rank " + std::to_string(rank) +
                              " after the group was aborted: " + abort_reason_);
    uint64_t generation = generation_;
    if (++arrived_ == size_) {
        arrived_ = 0;
        ++generation_;
        cv_.notify_all();
        return;
    }
    auto deadline = std::chrono::steady_clock::now() + timeout_;
    while (generation_ == generation && abort_reason_.empty()) {
        if (cv_.wait_until(lock, deadline) == std::cv_status::timeout &&
            generation_ == generation && abort_reason_.empty()) {
            abort_reason_ = "rank " + std::to_string(rank) + " waited " +
                            std::to_string(timeout_.count()) + " ms in " + call + " for " +
                            std::to_string(size_ - arrived_) + " of " + std::to_string(size_) +
                            " members";
            cv_.notify_all();
        }
    }
    if (generation_ == generation)
        throw CollectiveError(name_ + ": " + call + " on rank " + std::to_string(rank) +
                              " failed: " + abort_reason_);
}

} // namespace dist::transport
