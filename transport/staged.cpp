// staged.cpp: device data through host collectives.
#include "transport/staged.hpp"

#include <algorithm>
#include <vector>

namespace dist::transport {

namespace {

class HostStaged final : public Collectives {
  public:
    HostStaged(std::unique_ptr<Collectives> host, kernels::Allocator& device)
        : host_(std::move(host)), device_(device) {}
    int rank() const override { return host_->rank(); }
    int size() const override { return host_->size(); }

    void all_reduce(float* data, int64_t n, ReduceOp op) override {
        float* h = down(data, n, a_);
        host_->all_reduce(h, n, op);
        up(h, n, data);
    }
    void all_gather(const float* in, int64_t n, float* out) override {
        float* h = down(in, n, a_);
        b_.resize(static_cast<size_t>(n) * static_cast<size_t>(size()));
        host_->all_gather(h, n, b_.data());
        up(b_.data(), static_cast<int64_t>(b_.size()), out);
    }
    void reduce_scatter(const float* in, int64_t n, float* out) override {
        float* h = down(in, n * size(), a_);
        b_.resize(static_cast<size_t>(n));
        host_->reduce_scatter(h, n, b_.data());
        up(b_.data(), n, out);
    }
    void broadcast(float* data, int64_t n, int root) override {
        float* h = down(data, n, a_);
        host_->broadcast(h, n, root);
        up(h, n, data);
    }
    void all_to_all(const float* in, const std::vector<int64_t>& send, float* out,
                    const std::vector<int64_t>& recv) override {
        int64_t sent = 0, received = 0;
        for (int64_t c : send) sent += c;
        for (int64_t c : recv) received += c;
        float* h = down(in, sent, a_);
        b_.resize(static_cast<size_t>(std::max<int64_t>(received, 1)));
        host_->all_to_all(h, send, b_.data(), recv);
        up(b_.data(), received, out);
    }
    void abort() override { host_->abort(); }

  private:
    float* down(const float* device, int64_t n, std::vector<float>& buffer) {
        buffer.resize(static_cast<size_t>(n));
        if (n > 0)
            device_.ops().to_host(buffer.data(), device, static_cast<size_t>(n) * sizeof(float),
                                  device_.device().index);
        return buffer.data();
    }
    void up(const float* host, int64_t n, float* device) {
        if (n > 0)
            device_.ops().from_host(device, host, static_cast<size_t>(n) * sizeof(float),
                                    device_.device().index);
    }

    std::unique_ptr<Collectives> host_;
    kernels::Allocator& device_;
    std::vector<float> a_, b_;
};

} // namespace

std::unique_ptr<Collectives> make_host_staged(std::unique_ptr<Collectives> host,
                                              kernels::Allocator& device) {
    return std::make_unique<HostStaged>(std::move(host), device);
}

} // namespace dist::transport
