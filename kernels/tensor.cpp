// tensor.cpp: allocators, tensors and bf16 conversion.
#include "kernels/tensor.hpp"

#include "kernels/bf16_bits.hpp"

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <new>
#include <stdexcept>
#include <vector>

namespace dist::kernels {

size_t dtype_size(DType t) {
    return t == DType::bf16 ? 2 : 4;
}
const char* to_string(DType t) {
    return t == DType::f32 ? "f32" : t == DType::bf16 ? "bf16" : "i32";
}

std::string Device::str() const {
    return kind == Kind::cpu ? "cpu" : "cuda:" + std::to_string(index);
}

namespace {

void* host_allocate(size_t bytes, int) {
    // 64-byte alignment: whole cache lines, and aligned AVX-512 loads.
    size_t rounded = (bytes + 63) / 64 * 64;
    return std::aligned_alloc(64, rounded);
}
void host_release(void* ptr, int) {
    std::free(ptr);
}
void host_zero(void* ptr, size_t bytes, int) {
    std::memset(ptr, 0, bytes);
}
void host_copy(void* dst, const void* src, size_t bytes, int) {
    std::memcpy(dst, src, bytes);
}

} // namespace

MemoryOps MemoryOps::host() {
    return {host_allocate, host_release, host_zero, host_copy, host_copy, host_copy};
}

Allocator::~Allocator() {
    for (auto& [bytes, ptr] : free_) ops_.release(ptr, device_.index);
}

size_t Allocator::size_class(size_t bytes) {
    if (bytes <= 1024) return std::max<size_t>(64, (bytes + 63) / 64 * 64);
    const size_t step = std::bit_floor(bytes) / 4;
    return (bytes + step - 1) / step * step;
}

void* Allocator::allocate(size_t asked) {
    const size_t bytes = size_class(asked);
    std::lock_guard<std::mutex> lock(mutex_);
    in_use_ += asked;
    peak_ = std::max(peak_, in_use_);
    // The buffer of this size freed last: what a step freed a moment ago is still in the
    // caches, one freed steps ago (the first of its size, where several are free) is not. Equal
    // keys keep their order of insertion, the newest last.
    if (auto [first, end] = free_.equal_range(bytes); first != end) {
        auto it = std::prev(end);
        void* p = it->second;
        free_.erase(it);
        return p;
    }
    // A device that is full may be full of free buffers of other sizes: give those back to
    // it and ask once more before failing.
    void* p = nullptr;
    for (int attempt = 0; !p; ++attempt) {
        try {
            p = ops_.allocate(bytes, device_.index);
            if (!p) throw std::bad_alloc();
        } catch (...) {
            if (attempt > 0 || free_.empty()) {
                in_use_ -= asked;
                throw;
            }
            for (auto& [size, ptr] : free_) {
                ops_.release(ptr, device_.index);
                reserved_ -= size;
            }
            free_.clear();
        }
    }
    ++fresh_;
    reserved_ += bytes;
    return p;
}

void Allocator::release(void* ptr, size_t asked) {
    if (!ptr) return;
    std::lock_guard<std::mutex> lock(mutex_);
    in_use_ -= asked;
    free_.emplace(size_class(asked), ptr);
}

Allocator& Allocator::cpu() {
    static Allocator a(Device::cpu());
    return a;
}

Tensor::Storage::~Storage() {
    if (allocator) allocator->release(ptr, bytes);
}

Tensor::Tensor(std::vector<int64_t> shape, DType dtype, Allocator& allocator)
    : shape_(std::move(shape)), dtype_(dtype) {
    numel_ = 1;
    for (int64_t d : shape_) {
        if (d < 0) throw std::invalid_argument("negative tensor dimension");
        numel_ *= d;
    }
    storage_ = std::make_shared<Storage>();
    storage_->allocator = &allocator;
    storage_->bytes = bytes();
    storage_->ptr = allocator.allocate(storage_->bytes);
}

Tensor Tensor::zeros(std::vector<int64_t> shape, DType dtype, Allocator& allocator) {
    Tensor t(std::move(shape), dtype, allocator);
    t.fill_zero();
    return t;
}

void Tensor::fill_zero() {
    if (raw()) storage_->allocator->ops().zero(raw(), bytes(), device().index);
}

Tensor Tensor::clone() const {
    Tensor t(shape_, dtype_, *storage_->allocator);
    storage_->allocator->ops().copy(t.raw(), raw(), bytes(), device().index);
    return t;
}

Tensor Tensor::to(Allocator& target) const {
    Tensor t(shape_, dtype_, target);
    t.copy_from(*this);
    return t;
}

void Tensor::copy_from(const Tensor& src) {
    if (src.bytes() != bytes() || src.dtype() != dtype_)
        throw std::invalid_argument("copy of a " + src.shape_str() + " " + to_string(src.dtype()) +
                                    " tensor into a " + shape_str() + " " + to_string(dtype_) +
                                    " one");
    if (bytes() == 0 || src.raw() == raw()) return;
    const MemoryOps& mine = storage_->allocator->ops();
    const MemoryOps& theirs = src.storage_->allocator->ops();
    Device from = src.device(), to = device();
    if (from == to) {
        mine.copy(raw(), src.raw(), bytes(), to.index);
    } else if (from.kind == Device::Kind::cpu) {
        mine.from_host(raw(), src.raw(), bytes(), to.index);
    } else if (to.kind == Device::Kind::cpu) {
        theirs.to_host(raw(), src.raw(), bytes(), from.index);
    } else if (from.kind == to.kind && mine.from_peer) {
        mine.from_peer(raw(), to.index, src.raw(), from.index, bytes());
    } else {
        // Between two devices: through the host.
        std::vector<unsigned char> staging(bytes());
        theirs.to_host(staging.data(), src.raw(), bytes(), from.index);
        mine.from_host(raw(), staging.data(), bytes(), to.index);
    }
}

Tensor Tensor::to(DType dtype) const {
    if (device().kind != Device::Kind::cpu)
        throw std::invalid_argument("dtype conversion of a " + device().str() +
                                    " tensor: copy it to the CPU first");
    if (dtype == dtype_) return clone();
    if (dtype == DType::i32 || dtype_ == DType::i32)
        throw std::invalid_argument("integer tensors do not convert to floating point");
    Tensor t(shape_, dtype, *storage_->allocator);
    if (dtype == DType::bf16) {
        const float* src = data<float>();
        uint16_t* dst = t.data<uint16_t>();
        for (int64_t i = 0; i < numel_; ++i) dst[i] = f32_to_bf16(src[i]);
    } else {
        const uint16_t* src = data<uint16_t>();
        float* dst = t.data<float>();
        for (int64_t i = 0; i < numel_; ++i) dst[i] = bf16_to_f32(src[i]);
    }
    return t;
}

std::string Tensor::shape_str() const {
    std::string s = "(";
    for (size_t i = 0; i < shape_.size(); ++i) s += (i ? ", " : "") + std::to_string(shape_[i]);
    return s + ")";
}

uint16_t f32_to_bf16(float x) {
    uint32_t bits;
    std::memcpy(&bits, &x, 4);
    return static_cast<uint16_t>(bf16_bits(bits) >> 16);
}

float bf16_to_f32(uint16_t x) {
    uint32_t bits = static_cast<uint32_t>(x) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

float f16_to_f32(uint16_t x) {
    const uint32_t sign = static_cast<uint32_t>(x & 0x8000) << 16;
    const uint32_t exponent = (x >> 10) & 0x1f;
    uint32_t mantissa = x & 0x3ff;
    uint32_t bits;
    if (exponent == 0x1f) {
        bits = sign | 0x7f800000u | (mantissa << 13); // infinity or NaN
    } else if (exponent != 0) {
        bits = sign | ((exponent + 112) << 23) | (mantissa << 13); // rebias 15 -> 127
    } else if (mantissa == 0) {
        bits = sign; // signed zero
    } else {
        // Subnormal: shift the mantissa up until its leading one is the implicit bit.
        int e = 113;
        while (!(mantissa & 0x400)) {
            mantissa <<= 1;
            --e;
        }
        bits = sign | (static_cast<uint32_t>(e) << 23) | ((mantissa & 0x3ff) << 13);
    }
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

} // namespace dist::kernels
