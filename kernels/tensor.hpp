// tensor.hpp: tensors and the per-device allocators behind them.
//
// The bottom of the compute stack: models/ and the runtime hold Tensors; kernels take raw
// pointers and sizes (llm.c style), so a kernel is easy to test and to port to CUDA. Memory
// comes from a per-device allocator that keeps freed buffers by size and hands them out again,
// so a training step allocates nothing once the first step has run.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace dist::kernels {

enum class DType { f32, bf16, i32 };

/// Bytes per element.
size_t dtype_size(DType t);
const char* to_string(DType t);

struct Device {
    enum class Kind { cpu, cuda } kind = Kind::cpu;
    int index = 0;

    static Device cpu() { return {}; }
    bool operator==(const Device&) const = default;
    /// "cpu" or "cuda:N".
    std::string str() const;
};

/// How a device's memory is obtained and moved. Each function throws std::runtime_error with
/// the exact cause when the device refuses. The CPU's are below; CUDA's come from
/// kernels/cuda/memory.hpp, so this header names no CUDA type.
struct MemoryOps {
    void* (*allocate)(size_t bytes, int device);
    void (*release)(void* ptr, int device);
    void (*zero)(void* ptr, size_t bytes, int device);
    /// Within the device.
    void (*copy)(void* dst, const void* src, size_t bytes, int device);
    void (*to_host)(void* host, const void* src, size_t bytes, int device);
    void (*from_host)(void* dst, const void* host, size_t bytes, int device);
    /// From another device of the same kind, directly (null: through the host).
    void (*from_peer)(void* dst, int device, const void* src, int src_device,
                      size_t bytes) = nullptr;

    /// Host memory: 64-byte aligned, memset and memcpy.
    static MemoryOps host();
};

/// Reuses buffers across steps: a freed buffer goes to the free list of its size class, and a
/// request takes a buffer of its class (size_class: at most a quarter more than asked), so
/// tensors whose sizes change from step to step (a mixture of experts' rows per expert) reuse
/// the buffers of earlier steps instead of piling up a free list of every size ever asked.
/// Of the free buffers of a class a request takes the one freed last, still in the caches
/// where a step frees a microbatch's activations and the next forward allocates them again.
/// When the device refuses a new buffer, the free lists go back to it and it is asked again.
/// bytes_in_use and the peak count the bytes asked for; bytes_reserved the classes' bytes.
class Allocator {
  public:
    explicit Allocator(Device device, MemoryOps ops = MemoryOps::host())
        : device_(device), ops_(ops) {}
    ~Allocator();
    Allocator(const Allocator&) = delete;
    Allocator& operator=(const Allocator&) = delete;

    void* allocate(size_t bytes);
    void release(void* ptr, size_t bytes);
    /// The bytes a request of `bytes` takes: multiples of 64 up to 1 KiB, then four classes
    /// per power of two (p, 1.25p, 1.5p, 1.75p).
    static size_t size_class(size_t bytes);

    Device device() const { return device_; }
    const MemoryOps& ops() const { return ops_; }
    /// Calls that had to ask the system for memory (not served from a free list).
    size_t fresh_allocations() const { return fresh_; }
    size_t bytes_in_use() const { return in_use_; }
    /// The most bytes in use at once since construction or the last reset_peak().
    size_t peak_bytes_in_use() const { return peak_; }
    void reset_peak() {
        std::lock_guard lock(mutex_);
        peak_ = in_use_;
    }
    size_t bytes_reserved() const { return reserved_; }

    /// The process-wide allocator of the CPU.
    static Allocator& cpu();

  private:
    Device device_;
    MemoryOps ops_;
    std::mutex mutex_;
    std::multimap<size_t, void*> free_;
    size_t fresh_ = 0;
    size_t in_use_ = 0;
    size_t peak_ = 0;
    size_t reserved_ = 0;
};

/// A dense, row-major tensor. Copies share storage (like torch.Tensor); `clone` copies data.
class Tensor {
  public:
    Tensor() = default;
    Tensor(std::vector<int64_t> shape, DType dtype = DType::f32,
           Allocator& allocator = Allocator::cpu());

    static Tensor zeros(std::vector<int64_t> shape, DType dtype = DType::f32,
                        Allocator& allocator = Allocator::cpu());

    const std::vector<int64_t>& shape() const { return shape_; }
    int64_t dim(size_t i) const { return shape_.at(i); }
    size_t rank() const { return shape_.size(); }
    int64_t numel() const { return numel_; }
    size_t bytes() const { return static_cast<size_t>(numel_) * dtype_size(dtype_); }
    DType dtype() const { return dtype_; }
    Device device() const { return storage_ ? storage_->allocator->device() : Device::cpu(); }
    bool defined() const { return storage_ != nullptr; }

    void* raw() const { return storage_ ? storage_->ptr : nullptr; }
    /// Typed access; the element type must match the dtype (float for f32, uint16_t for bf16,
    /// int32_t for i32).
    template <typename T> T* data() const { return static_cast<T*>(raw()); }

    void fill_zero();
    Tensor clone() const;
    /// A copy converted to another dtype (f32 <-> bf16, round to nearest even); CPU tensors.
    Tensor to(DType dtype) const;
    /// A copy in the memory of `target`'s device (host <-> device, or within one).
    Tensor to(Allocator& target) const;
    /// Overwrites this tensor's elements with `src`'s, from whichever device holds them. Throws
    /// std::invalid_argument when the two differ in size or dtype.
    void copy_from(const Tensor& src);
    /// This tensor if it is in host memory, else a copy there.
    Tensor on_host() const {
        return device().kind == Device::Kind::cpu ? *this : to(Allocator::cpu());
    }
    std::string shape_str() const;

  private:
    struct Storage {
        Allocator* allocator = nullptr;
        void* ptr = nullptr;
        size_t bytes = 0;
        ~Storage();
    };
    std::shared_ptr<Storage> storage_;
    std::vector<int64_t> shape_;
    int64_t numel_ = 0;
    DType dtype_ = DType::f32;
};

/// bf16 <-> f32 (round to nearest even; NaN stays NaN).
uint16_t f32_to_bf16(float x);
float bf16_to_f32(uint16_t x);

/// IEEE half -> f32, exact (subnormals, infinities and NaN included); for reading checkpoints.
float f16_to_f32(uint16_t x);

} // namespace dist::kernels
