// collectives.hpp: the collective-communication interface that tensor- and data-parallel
// reductions go through.
//
// A Collectives object is one member's handle on a group of ranks. Every member calls the same
// collectives in the same order (the plan's verifier proves it); a call returns when this
// member's part is done. Backends: the one-member group below, the in-process group
// (inprocess.hpp) for ranks that share a process, and later Gloo (CPU) and NCCL (GPU) across
// processes. Models see only this header.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace dist::transport {

enum class ReduceOp { sum, max };

/// A collective that cannot complete: the group was aborted (a member failed), a member timed
/// out, or the members disagree about the call. The message names the group, the rank and the
/// call.
class CollectiveError : public std::runtime_error {
  public:
    using std::runtime_error::runtime_error;
};

class Collectives {
  public:
    virtual ~Collectives() = default;
    virtual int rank() const = 0;
    virtual int size() const = 0;

    /// data (n), in place: every member ends with the reduction of all members' data.
    virtual void all_reduce(float* data, int64_t n, ReduceOp op) = 0;
    /// in (n) from every member -> out (size * n), member r's data at offset r * n.
    virtual void all_gather(const float* in, int64_t n, float* out) = 0;
    /// in (size * n) from every member -> out (n): the sum over members of their chunk `rank`.
    virtual void reduce_scatter(const float* in, int64_t n, float* out) = 0;
    /// data (n): every member ends with the root's data.
    virtual void broadcast(float* data, int64_t n, int root) = 0;
    /// Each member sends send[g] values to member g and receives recv[g] from it: `in` holds
    /// what it sends, member by member in order, and `out` receives what each sent it, member
    /// by member in order. The counts must agree (member g's send[r] is member r's recv[g]).
    virtual void all_to_all(const float* in, const std::vector<int64_t>& send, float* out,
                            const std::vector<int64_t>& recv) = 0;
    /// From any thread: ends this member's collective under way, and fails every later one,
    /// with a CollectiveError (a peer has failed and will never join). Backends that abort a
    /// whole group (InProcessGroup::abort) or time out by themselves (Gloo) need nothing here.
    virtual void abort() {}
};

/// The group of one: every collective is the identity (all_gather and reduce_scatter copy).
class SoloCollectives final : public Collectives {
  public:
    int rank() const override { return 0; }
    int size() const override { return 1; }
    void all_reduce(float*, int64_t, ReduceOp) override {}
    void all_gather(const float* in, int64_t n, float* out) override;
    void reduce_scatter(const float* in, int64_t n, float* out) override;
    void broadcast(float*, int64_t, int) override {}
    void all_to_all(const float* in, const std::vector<int64_t>& send, float* out,
                    const std::vector<int64_t>& recv) override;
};

} // namespace dist::transport
