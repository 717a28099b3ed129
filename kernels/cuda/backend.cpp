// backend.cpp: a CUDA device's Backend: each call makes the device current, runs the op of
// ops.hpp and turns its error string into an exception.
#include "kernels/cuda/backend.hpp"

#include "kernels/cuda/memory.hpp"
#include "kernels/cuda/ops.hpp"

#include <deque>
#include <mutex>
#include <stdexcept>

namespace dist::kernels::cuda {

namespace {

class CudaBackend final : public Backend {
  public:
    explicit CudaBackend(int index) : index_(index), allocator_(cuda::allocator(index)) {}

    Device device() const override { return {Device::Kind::cuda, index_}; }
    Allocator& allocator() override { return allocator_; }
    bool nccl_memory() const override { return true; }
    std::string identity() const override {
        std::string id;
        run(cuda::pci_bus_id(index_, id));
        return id;
    }
    Description describe() const override {
        Description d;
        run(cuda::device_model(index_, d.model, d.memory_bytes));
        return d;
    }

    void matmul_forward(const float* inp, const float* weight, const float* bias, int64_t N,
                        int64_t C, int64_t OC, float* out) override {
        run(cuda::matmul_forward(current(inp), weight, bias, N, C, OC, out));
    }
    void matmul_backward_input(const float* dout, const float* weight, int64_t N, int64_t C,
                               int64_t OC, float* dinp) override {
        run(cuda::matmul_backward_input(current(dout), weight, N, C, OC, dinp));
    }
    void matmul_backward_weight(const float* dout, const float* inp, int64_t N, int64_t C,
                                int64_t OC, float* dweight, float* dbias) override {
        run(cuda::matmul_backward_weight(current(dout), inp, N, C, OC, dweight, dbias));
    }
    void layernorm_forward(const float* inp, const float* weight, const float* bias, int64_t N,
                           int64_t C, double eps, float* out, float* mean, float* rstd) override {
        run(cuda::layernorm_forward(current(inp), weight, bias, N, C, static_cast<float>(eps), out,
                                    mean, rstd));
    }
    void layernorm_backward_input(const float* dout, const float* inp, const float* weight,
                                  const float* mean, const float* rstd, int64_t N, int64_t C,
                                  float* dinp) override {
        run(cuda::layernorm_backward_input(current(dout), inp, weight, mean, rstd, N, C, dinp));
    }
    void layernorm_backward_weight(const float* dout, const float* inp, const float* mean,
                                   const float* rstd, int64_t N, int64_t C, float* dweight,
                                   float* dbias) override {
        run(cuda::layernorm_backward_weight(current(dout), inp, mean, rstd, N, C, dweight, dbias));
    }
    void rmsnorm_forward(const float* inp, const float* weight, int64_t N, int64_t C, double eps,
                         float* out, float* rstd) override {
        run(cuda::rmsnorm_forward(current(inp), weight, N, C, static_cast<float>(eps), out, rstd));
    }
    void rmsnorm_backward_input(const float* dout, const float* inp, const float* weight,
                                const float* rstd, int64_t N, int64_t C, float* dinp) override {
        run(cuda::rmsnorm_backward_input(current(dout), inp, weight, rstd, N, C, dinp));
    }
    void rmsnorm_backward_weight(const float* dout, const float* inp, const float* rstd, int64_t N,
                                 int64_t C, float* dweight) override {
        run(cuda::rmsnorm_backward_weight(current(dout), inp, rstd, N, C, dweight));
    }
    void gelu_forward(const float* inp, int64_t n, float* out) override {
        run(cuda::gelu_forward(current(inp), n, out));
    }
    void gelu_forward_keeping(const float* inp, int64_t n, float* out, float* th) override {
        run(cuda::gelu_forward_keeping(current(inp), n, out, th));
    }
    void gelu_backward_kept(const float* inp, const float* th, const float* dout, int64_t n,
                            float* dinp) override {
        run(cuda::gelu_backward_kept(current(inp), th, dout, n, dinp));
    }
    void swiglu_forward(const float* inp, int64_t N, int64_t H, float* out) override {
        run(cuda::swiglu_forward(current(inp), N, H, out));
    }
    void swiglu_backward(const float* inp, const float* dout, int64_t N, int64_t H,
                         float* dinp) override {
        run(cuda::swiglu_backward(current(inp), dout, N, H, dinp));
    }
    void rope_forward(const float* inp, int64_t B, int64_t T, int64_t H, int64_t D, double theta,
                      int64_t pos0, float* out) override {
        run(cuda::rope_forward(current(inp), B, T, H, D, theta, pos0, out));
    }
    void rope_backward(const float* dout, int64_t B, int64_t T, int64_t H, int64_t D, double theta,
                       int64_t pos0, float* dinp) override {
        run(cuda::rope_backward(current(dout), B, T, H, D, theta, pos0, dinp));
    }
    void embedding_forward(const int32_t* tokens, const float* table, int64_t N, int64_t C,
                           float* out) override {
        run(cuda::embedding_forward(current(tokens), table, N, C, out));
    }
    void embedding_backward(const int32_t* tokens, const float* dout, int64_t N, int64_t C,
                            float* dtable) override {
        run(cuda::embedding_backward(current(tokens), dout, N, C, dtable));
    }
    void positions_forward(const float* wpe, int64_t B, int64_t T, int64_t C, float* out) override {
        run(cuda::positions_forward(current(wpe), B, T, C, out));
    }
    void positions_backward(const float* dout, int64_t B, int64_t T, int64_t C,
                            float* dwpe) override {
        run(cuda::positions_backward(current(dout), B, T, C, dwpe));
    }
    void attention_forward(const float* q, const float* k, const float* v, int64_t B, int64_t T,
                           int64_t H, int64_t KV, int64_t D, float* out, float* lse) override {
        run(cuda::attention_forward(current(q), k, v, B, T, H, KV, D, out, lse));
    }
    void attention_backward(const float* dout, const float* q, const float* k, const float* v,
                            const float* out, const float* lse, int64_t B, int64_t T, int64_t H,
                            int64_t KV, int64_t D, float* dq, float* dk, float* dv) override {
        run(cuda::attention_backward(current(dout), q, k, v, out, lse, B, T, H, KV, D, dq, dk, dv));
    }
    void cross_entropy_forward(const float* logits, const int32_t* targets, int64_t N, int64_t V,
                               float* losses, float* lse) override {
        run(cuda::cross_entropy_forward(current(logits), targets, N, V, losses, lse));
    }
    void cross_entropy_backward(const float* logits, const int32_t* targets, const float* lse,
                                const float* dlosses, int64_t N, int64_t V,
                                float* dlogits) override {
        run(cuda::cross_entropy_backward(current(logits), targets, lse, dlosses, N, V, dlogits));
    }
    void adamw_step(const float* grads, int64_t n, double lr, double beta1, double beta2,
                    double eps, double weight_decay, int64_t step, float* params, float* m,
                    float* v) override {
        run(cuda::adamw_step(current(grads), n, static_cast<float>(lr), beta1, beta2,
                             static_cast<float>(eps), static_cast<float>(weight_decay), step,
                             params, m, v));
    }
    double sum_squares(const float* x, int64_t n) override {
        return reduce(x, n, &cuda::sum_squares);
    }
    double sum(const float* x, int64_t n) override { return reduce(x, n, &cuda::sum); }
    double sum_squares_of(const std::vector<Part>& parts) override {
        run(cuda::set_device(index_));
        Tensor total = Tensor::zeros({2}, DType::f32, allocator_); // 8 bytes: one double
        for (const Part& p : parts)
            run(cuda::sum_squares(p.data, p.n, static_cast<double*>(total.raw())));
        return read_double(total);
    }
    void scale(float* x, int64_t n, double s) override { run(cuda::scale(current(x), n, s)); }
    void synchronize() override {
        run(cuda::set_device(index_));
        run(cuda::synchronize_default_stream());
    }

    void add(const float* a, const float* b, int64_t n, float* out) override {
        run(cuda::add(current(a), b, n, out));
    }
    void fill(float* x, int64_t n, float value) override { run(cuda::fill(current(x), n, value)); }
    void round_bf16(float* x, int64_t n) override { run(cuda::round_bf16(current(x), n)); }
    void to_bf16(const float* x, int64_t n, uint16_t* out) override {
        run(cuda::to_bf16(current(x), n, out));
    }
    void from_bf16(const uint16_t* x, int64_t n, float* out) override {
        run(cuda::from_bf16(current(x), n, out));
    }
    void add_rows(const float* bias, int64_t N, int64_t C, float* out) override {
        run(cuda::add_rows(current(bias), N, C, out));
    }
    void copy_block(const float* src, int64_t src_stride, float* dst, int64_t dst_stride,
                    int64_t rows, int64_t width) override {
        run(cuda::copy_block(current(src), src_stride, dst, dst_stride, rows, width));
    }
    void gelu_erf_forward(const float* inp, int64_t n, float* out) override {
        run(cuda::gelu_erf_forward(current(inp), n, out));
    }
    void gelu_erf_backward(const float* inp, const float* dout, int64_t n, float* dinp) override {
        run(cuda::gelu_erf_backward(current(inp), dout, n, dinp));
    }
    void relu_forward(const float* inp, int64_t n, float* out) override {
        run(cuda::relu_forward(current(inp), n, out));
    }
    void relu_backward(const float* inp, const float* dout, int64_t n, float* dinp) override {
        run(cuda::relu_backward(current(inp), dout, n, dinp));
    }
    void embedding_forward_part(const int32_t* tokens, const float* table, int64_t N, int64_t C,
                                int64_t begin, int64_t rows, float* out) override {
        run(cuda::embedding_forward_part(current(tokens), table, N, C, begin, rows, out));
    }
    void embedding_backward_part(const int32_t* tokens, const float* dout, int64_t N, int64_t C,
                                 int64_t begin, int64_t rows, float* dtable) override {
        run(cuda::embedding_backward_part(current(tokens), dout, N, C, begin, rows, dtable));
    }
    void row_max(const float* logits, int64_t N, int64_t V, float* out) override {
        run(cuda::row_max(current(logits), N, V, out));
    }
    void cross_entropy_part_sums(const float* logits, const int32_t* targets, const float* row_max,
                                 int64_t N, int64_t V, int64_t begin, float* sums) override {
        run(cuda::cross_entropy_part_sums(current(logits), targets, row_max, N, V, begin, sums));
    }
    void cross_entropy_part_finish(const float* row_max, const float* sums, int64_t N, float* lse,
                                   float* losses) override {
        run(cuda::cross_entropy_part_finish(current(row_max), sums, N, lse, losses));
    }
    void cross_entropy_part_backward(const float* logits, const int32_t* targets, const float* lse,
                                     const float* dlosses, int64_t N, int64_t V, int64_t begin,
                                     float* dlogits) override {
        run(cuda::cross_entropy_part_backward(current(logits), targets, lse, dlosses, N, V, begin,
                                              dlogits));
    }

  private:
    // Makes this device current on the calling thread; returns its argument so that it reads
    // as part of the call.
    template <typename T> T* current(T* p) const {
        run(cuda::set_device(index_));
        return p;
    }
    void run(const std::string& error) const {
        if (!error.empty())
            throw std::runtime_error("cuda:" + std::to_string(index_) + ": " + error);
    }
    // A double accumulated on the device, then read back (which waits for the device).
    double reduce(const float* x, int64_t n, std::string (*op)(const float*, int64_t, double*)) {
        Tensor total = Tensor::zeros({2}, DType::f32, allocator_); // 8 bytes: one double
        run(op(current(x), n, static_cast<double*>(total.raw())));
        return read_double(total);
    }
    double read_double(const Tensor& t) const {
        double out = 0.0;
        allocator_.ops().to_host(&out, t.raw(), sizeof(double), index_);
        return out;
    }

    int index_;
    Allocator& allocator_;
};

} // namespace

Backend& backend(int index) {
    static std::mutex mutex;
    static std::deque<std::pair<int, CudaBackend>> made;
    cuda::allocator(index); // throws for a device that does not exist
    std::lock_guard lock(mutex);
    for (auto& [i, b] : made)
        if (i == index) return b;
    made.emplace_back(std::piecewise_construct, std::forward_as_tuple(index),
                      std::forward_as_tuple(index));
    return made.back().second;
}

} // namespace dist::kernels::cuda
