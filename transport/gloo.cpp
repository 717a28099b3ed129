// gloo.cpp: the Collectives interface on Gloo (ring all-reduce, all-gather, broadcast and a
// ring reduce-scatter of its own over TCP pairs).
#include "transport/gloo.hpp"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoallv.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include <cstring>
#include <stdexcept>
#include <vector>

namespace dist::transport {

namespace {

// Gloo's rendezvous store on top of ours.
class StoreAdapter final : public gloo::rendezvous::Store {
  public:
    StoreAdapter(KeyValueStore& store, std::chrono::milliseconds timeout)
        : store_(store), timeout_(timeout) {}
    void set(const std::string& key, const std::vector<char>& data) override {
        store_.set(key, data);
    }
    std::vector<char> get(const std::string& key) override { return store_.get(key, timeout_); }
    void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
    void wait(const std::vector<std::string>& keys,
              const std::chrono::milliseconds& timeout) override {
        for (const auto& k : keys) store_.get(k, timeout);
    }

  private:
    KeyValueStore& store_;
    std::chrono::milliseconds timeout_;
};

using ReduceFn = void (*)(void*, const void*, const void*, size_t);

class GlooCollectives final : public Collectives {
  public:
    GlooCollectives(std::shared_ptr<gloo::Context> context, std::string name)
        : context_(std::move(context)), name_(std::move(name)) {}

    int rank() const override { return context_->rank; }
    int size() const override { return context_->size; }

    void all_reduce(float* data, int64_t n, ReduceOp op) override {
        if (n == 0) return;
        guarded("all_reduce", [&] {
            gloo::AllreduceOptions opts(context_);
            opts.setOutput(data, static_cast<size_t>(n));
            opts.setReduceFunction(op == ReduceOp::sum ? static_cast<ReduceFn>(&gloo::sum<float>)
                                                       : static_cast<ReduceFn>(&gloo::max<float>));
            opts.setTag(next_tag());
            gloo::allreduce(opts);
        });
    }

    void all_gather(const float* in, int64_t n, float* out) override {
        if (n == 0) return;
        guarded("all_gather", [&] {
            // Gloo reads the input from the output's own slot when they alias.
            float* slot = out + static_cast<int64_t>(rank()) * n;
            if (slot != in) std::memcpy(slot, in, static_cast<size_t>(n) * sizeof(float));
            gloo::AllgatherOptions opts(context_);
            opts.setInput(slot, static_cast<size_t>(n));
            opts.setOutput(out, static_cast<size_t>(n) * static_cast<size_t>(size()));
            opts.setTag(next_tag());
            gloo::allgather(opts);
        });
    }

    void reduce_scatter(const float* in, int64_t n, float* out) override {
        if (n == 0) return;
        if (size() == 1) {
            if (out != in) std::memmove(out, in, static_cast<size_t>(n) * sizeof(float));
            return;
        }
        guarded("reduce_scatter", [&] { ring_reduce_scatter(in, n, out); });
    }

    void broadcast(float* data, int64_t n, int root) override {
        if (root < 0 || root >= size())
            throw CollectiveError(name_ + ": broadcast from rank " + std::to_string(root) +
                                  " of a group of " + std::to_string(size()));
        if (n == 0) return;
        guarded("broadcast", [&] {
            gloo::BroadcastOptions opts(context_);
            opts.setOutput(data, static_cast<size_t>(n));
            opts.setRoot(root);
            opts.setTag(next_tag());
            gloo::broadcast(opts);
        });
    }

    void all_to_all(const float* in, const std::vector<int64_t>& send, float* out,
                    const std::vector<int64_t>& recv) override {
        const auto n = static_cast<size_t>(size());
        if (send.size() != n || recv.size() != n)
            throw CollectiveError(name_ + ": all_to_all on rank " + std::to_string(rank()) +
                                  " with counts for " + std::to_string(send.size()) +
                                  " members of " + std::to_string(n));
        // Every member takes part even with nothing to send or receive: its peers wait for it.
        guarded("all_to_all", [&] {
            gloo::AlltoallvOptions opts(context_);
            float none = 0.0f;
            opts.setInput(const_cast<float*>(in ? in : &none), send);
            opts.setOutput(out ? out : &none, recv);
            opts.setTag(next_tag());
            gloo::alltoallv(opts);
        });
    }

  private:
    uint32_t next_tag() { return tag_++; }

    // A ring reduce-scatter over Gloo's pairs: in size - 1 steps each member sends one chunk to
    // the next member and adds the chunk it receives from the previous one, so that after the
    // last step it holds the sum of its own chunk. Each member sends and receives
    // (size - 1) / size of the buffer: half the traffic of a ring all-reduce.
    void ring_reduce_scatter(const float* in, int64_t n, float* out) {
        const int p = size(), r = rank();
        const size_t chunk_bytes = static_cast<size_t>(n) * sizeof(float);
        scratch_.assign(in, in + n * p);
        incoming_.resize(static_cast<size_t>(n));
        auto sending = context_->createUnboundBuffer(scratch_.data(), chunk_bytes * p);
        auto receiving = context_->createUnboundBuffer(incoming_.data(), chunk_bytes);
        const int next = (r + 1) % p, previous = (r + p - 1) % p;
        const auto timeout = context_->getTimeout();
        for (int step = 0; step + 1 < p; ++step) {
            // Chunk (r - step - 1) goes on; chunk (r - step - 2) comes in and is added.
            const int64_t send = (r - step - 1 + 2 * p) % p, take = (r - step - 2 + 2 * p) % p;
            const uint64_t slot = gloo::Slot::build(ring_slot_prefix, next_tag());
            receiving->recv(previous, slot, 0, chunk_bytes);
            sending->send(next, slot, static_cast<size_t>(send) * chunk_bytes, chunk_bytes);
            if (!receiving->waitRecv(timeout) || !sending->waitSend(timeout))
                throw std::runtime_error("aborted, or no answer within " +
                                         std::to_string(timeout.count()) + " ms");
            float* into = scratch_.data() + take * n;
            for (int64_t i = 0; i < n; ++i) into[i] += incoming_[static_cast<size_t>(i)];
        }
        std::memcpy(out, scratch_.data() + static_cast<int64_t>(r) * n, chunk_bytes);
    }

    /// Slots of the ring reduce-scatter, apart from those of Gloo's own collectives.
    static constexpr uint8_t ring_slot_prefix = 0x40;

    template <typename F> void guarded(const char* call, F&& f) {
        try {
            f();
        } catch (const std::exception& e) {
            throw CollectiveError(name_ + ": " + call + " on rank " + std::to_string(rank()) +
                                  " failed: " + e.what());
        }
    }

    std::shared_ptr<gloo::Context> context_;
    std::string name_;
    uint32_t tag_ = 0;
    std::vector<float> scratch_, incoming_;
};

} // namespace

std::unique_ptr<Collectives> make_gloo_collectives(KeyValueStore& store, const std::string& prefix,
                                                   int rank, int size, const GlooOptions& options) {
    if (size < 1 || rank < 0 || rank >= size)
        throw std::invalid_argument(prefix + ": no rank " + std::to_string(rank) +
                                    " in a group of " + std::to_string(size));
    try {
        gloo::transport::tcp::attr attr;
        attr.hostname = options.hostname;
        auto device = gloo::transport::tcp::CreateDevice(attr);
        auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
        context->setTimeout(options.timeout);
        StoreAdapter adapter(store, options.timeout);
        gloo::rendezvous::PrefixStore prefixed(prefix, adapter);
        context->connectFullMesh(prefixed, device);
        return std::make_unique<GlooCollectives>(std::move(context), prefix);
    } catch (const std::exception& e) {
        throw CollectiveError(prefix + ": rank " + std::to_string(rank) + " of " +
                              std::to_string(size) + " could not join: " + e.what());
    }
}

} // namespace dist::transport
