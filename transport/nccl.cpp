// nccl.cpp: the Collectives interface on NCCL communicators.
#include "transport/nccl.hpp"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace dist::transport {

namespace {

#define DIST_NCCL_CHECK(call)                                                                      \
    do {                                                                                           \
        ncclResult_t r_ = (call);                                                                  \
        if (r_ != ncclSuccess)                                                                     \
            throw CollectiveError(where(__FILE__, __LINE__) + #call + ": " +                       \
                                  ncclGetErrorString(r_));                                         \
    } while (0)

#define DIST_CUDA_CHECK(call)                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess)                                                                     \
            throw CollectiveError(where(__FILE__, __LINE__) + #call + ": " +                       \
                                  cudaGetErrorString(e_));                                         \
    } while (0)

std::string where(const char* file, int line) {
    return std::string(file) + ":" + std::to_string(line) + ": ";
}

class NcclCollectives final : public Collectives {
  public:
    NcclCollectives(ncclComm_t comm, cudaStream_t stream, cudaEvent_t ready, int device, int rank,
                    int size, std::string name)
        : comm_(comm), stream_(stream), ready_(ready), device_(device), rank_(rank), size_(size),
          name_(std::move(name)) {}
    ~NcclCollectives() override {
        cudaSetDevice(device_);
        // An aborted group's peers may be gone: abort rather than destroy (no last handshake).
        if (comm_) aborted_ ? ncclCommAbort(comm_) : ncclCommDestroy(comm_);
        cudaEventDestroy(ready_);
        cudaStreamDestroy(stream_);
    }

    void abort() override { aborted_ = true; }

    int rank() const override { return rank_; }
    int size() const override { return size_; }

    void all_reduce(float* data, int64_t n, ReduceOp op) override {
        run("all_reduce", [&] {
            DIST_NCCL_CHECK(ncclAllReduce(data, data, static_cast<size_t>(n), ncclFloat,
                                          op == ReduceOp::sum ? ncclSum : ncclMax, comm_, stream_));
        });
    }
    void all_gather(const float* in, int64_t n, float* out) override {
        run("all_gather", [&] {
            DIST_NCCL_CHECK(
                ncclAllGather(in, out, static_cast<size_t>(n), ncclFloat, comm_, stream_));
        });
    }
    void reduce_scatter(const float* in, int64_t n, float* out) override {
        run("reduce_scatter", [&] {
            DIST_NCCL_CHECK(ncclReduceScatter(in, out, static_cast<size_t>(n), ncclFloat, ncclSum,
                                              comm_, stream_));
        });
    }
    void broadcast(float* data, int64_t n, int root) override {
        if (root < 0 || root >= size_)
            throw CollectiveError(name_ + ": broadcast from rank " + std::to_string(root) +
                                  " of a group of " + std::to_string(size_));
        run("broadcast", [&] {
            DIST_NCCL_CHECK(
                ncclBroadcast(data, data, static_cast<size_t>(n), ncclFloat, root, comm_, stream_));
        });
    }

    void all_to_all(const float* in, const std::vector<int64_t>& send, float* out,
                    const std::vector<int64_t>& recv) override {
        if (send.size() != static_cast<size_t>(size_) || recv.size() != static_cast<size_t>(size_))
            throw CollectiveError(name_ + ": all_to_all on rank " + std::to_string(rank_) +
                                  " with counts for " + std::to_string(send.size()) +
                                  " members of " + std::to_string(size_));
        run("all_to_all", [&] {
            // One send and one receive per peer, grouped so that NCCL runs them together.
            DIST_NCCL_CHECK(ncclGroupStart());
            int64_t s = 0, r = 0;
            for (int g = 0; g < size_; ++g) {
                const auto c = static_cast<size_t>(g);
                if (send[c] > 0)
                    DIST_NCCL_CHECK(ncclSend(in + s, static_cast<size_t>(send[c]), ncclFloat, g,
                                             comm_, stream_));
                if (recv[c] > 0)
                    DIST_NCCL_CHECK(ncclRecv(out + r, static_cast<size_t>(recv[c]), ncclFloat, g,
                                             comm_, stream_));
                s += send[c];
                r += recv[c];
            }
            DIST_NCCL_CHECK(ncclGroupEnd());
        });
    }

  private:
    template <typename F> void run(const char* call, F&& f) {
        try {
            if (aborted_ || !comm_) throw CollectiveError("the group was aborted");
            DIST_CUDA_CHECK(cudaSetDevice(device_));
            // The data was written by kernels on the device's default stream, with which this
            // non-blocking stream does not synchronise by itself: wait for what is queued there.
            DIST_CUDA_CHECK(cudaEventRecord(ready_, cudaStreamLegacy));
            DIST_CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_, 0));
            try {
                f();
                wait();
            } catch (const CollectiveError&) {
                // After an error NCCL's state is unknown, its kernel may still be waiting for
                // peers: abort, so that neither this member nor its destructor waits for them.
                if (comm_) ncclCommAbort(comm_);
                comm_ = nullptr;
                throw;
            }
        } catch (const CollectiveError& e) {
            throw CollectiveError(name_ + ": " + call + " on rank " + std::to_string(rank_) +
                                  " failed: " + e.what());
        }
    }

    // Waits for the collective on this member's stream, polling so that an abort (a peer that
    // failed and will never join) ends the wait: the communicator is then aborted here, by the
    // only thread that uses it.
    void wait() {
        auto pause = std::chrono::microseconds(10);
        for (;;) {
            cudaError_t e = cudaStreamQuery(stream_);
            if (e == cudaSuccess) break;
            if (e != cudaErrorNotReady) DIST_CUDA_CHECK(e);
            ncclResult_t async = ncclSuccess;
            DIST_NCCL_CHECK(ncclCommGetAsyncError(comm_, &async));
            if (async != ncclSuccess && async != ncclInProgress) DIST_NCCL_CHECK(async);
            if (aborted_) throw CollectiveError("aborted while waiting for the other members");
            std::this_thread::sleep_for(pause);
            pause = std::min(pause * 2, std::chrono::microseconds(200));
        }
        ncclResult_t async = ncclSuccess;
        DIST_NCCL_CHECK(ncclCommGetAsyncError(comm_, &async));
        DIST_NCCL_CHECK(async);
    }

    ncclComm_t comm_;
    std::atomic<bool> aborted_{false};
    cudaStream_t stream_;
    cudaEvent_t ready_;
    int device_, rank_, size_;
    std::string name_;
};

} // namespace

std::unique_ptr<Collectives> make_nccl_collectives(KeyValueStore& store, const std::string& prefix,
                                                   int rank, int size, int device,
                                                   std::chrono::milliseconds timeout) {
    if (size < 1 || rank < 0 || rank >= size)
        throw std::invalid_argument(prefix + ": no rank " + std::to_string(rank) +
                                    " in a group of " + std::to_string(size));
    try {
        DIST_CUDA_CHECK(cudaSetDevice(device));
        ncclUniqueId id;
        const std::string key = prefix + "/nccl-unique-id";
        if (rank == 0) {
            DIST_NCCL_CHECK(ncclGetUniqueId(&id));
            store.set(key, std::vector<char>(id.internal, id.internal + sizeof id.internal));
        } else {
            std::vector<char> bytes = store.get(key, timeout);
            if (bytes.size() != sizeof id.internal)
                throw CollectiveError("the unique id in the store has " +
                                      std::to_string(bytes.size()) + " bytes, not " +
                                      std::to_string(sizeof id.internal));
            std::copy(bytes.begin(), bytes.end(), id.internal);
        }
        ncclComm_t comm;
        DIST_NCCL_CHECK(ncclCommInitRank(&comm, size, id, rank));
        cudaStream_t stream;
        DIST_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
        cudaEvent_t ready;
        DIST_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
        return std::make_unique<NcclCollectives>(comm, stream, ready, device, rank, size, prefix);
    } catch (const std::exception& e) {
        throw CollectiveError(prefix + ": rank " + std::to_string(rank) + " of " +
                              std::to_string(size) + " on cuda:" + std::to_string(device) +
                              " could not join: " + e.what());
    }
}

} // namespace dist::transport
