// gloo.cpp: the Collectives interface on Gloo (ring all-reduce, all-gather and broadcast over
// TCP pairs).
#include "transport/gloo.hpp"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include <cstring>
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
        // An all-reduce of the whole buffer, keeping this member's chunk: twice the traffic of
        // a dedicated reduce-scatter, and simple to get right.
        scratch_.assign(in, in + n * size());
        all_reduce(scratch_.data(), n * size(), ReduceOp::sum);
        std::memcpy(out, scratch_.data() + static_cast<int64_t>(rank()) * n,
                    static_cast<size_t>(n) * sizeof(float));
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

  private:
    uint32_t next_tag() { return tag_++; }

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
    std::vector<float> scratch_;
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
