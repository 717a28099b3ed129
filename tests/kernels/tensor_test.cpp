// tensor_test.cpp: tensors, buffer reuse by the allocator, bf16 conversion.
#include "kernels/cpu/ops.hpp"
#include "kernels/tensor.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <stdexcept>
#include <vector>

using namespace dist::kernels;

TEST(Tensor, ShapeSizeAndZeros) {
    Tensor t = Tensor::zeros({2, 3, 4});
    EXPECT_EQ(t.numel(), 24);
    EXPECT_EQ(t.bytes(), 96u);
    EXPECT_EQ(t.shape_str(), "(2, 3, 4)");
    for (int64_t i = 0; i < t.numel(); ++i) EXPECT_EQ(t.data<float>()[i], 0.0f);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw()) % 64, 0u);
    EXPECT_THROW(Tensor({2, -1}), std::invalid_argument);
}

TEST(Tensor, CopiesShareStorageAndCloneDoesNot) {
    Tensor a = Tensor::zeros({4});
    Tensor b = a;
    b.data<float>()[0] = 5.0f;
    EXPECT_EQ(a.data<float>()[0], 5.0f);
    Tensor c = a.clone();
    c.data<float>()[0] = 1.0f;
    EXPECT_EQ(a.data<float>()[0], 5.0f);
}

TEST(Allocator, SteadyStateAllocatesNothingNew) {
    Allocator alloc(Device::cpu());
    // A "training step" that makes and drops the same tensors every time.
    auto step = [&] {
        Tensor x({64, 128}, DType::f32, alloc), y({64, 128}, DType::f32, alloc);
        Tensor z({17}, DType::bf16, alloc);
        return x.numel() + y.numel() + z.numel();
    };
    step();
    size_t after_first = alloc.fresh_allocations();
    EXPECT_EQ(after_first, 3u);
    for (int i = 0; i < 10; ++i) step();
    EXPECT_EQ(alloc.fresh_allocations(), after_first);
    EXPECT_EQ(alloc.bytes_in_use(), 0u);
}

// Tensors whose sizes change every step (a mixture of experts' rows per expert) take buffers of
// a few size classes, each at most a quarter above what was asked, and reuse them: the books
// stay as small as the largest step needs, where one free list per exact size grew every step.
TEST(Allocator, SizesThatVaryFromStepToStepReuseAFewClasses) {
    EXPECT_EQ(Allocator::size_class(1), 64u);
    EXPECT_EQ(Allocator::size_class(1024), 1024u);
    EXPECT_EQ(Allocator::size_class(1025), 1280u);
    EXPECT_EQ(Allocator::size_class(4096), 4096u);
    EXPECT_EQ(Allocator::size_class(4097), 5120u);
    EXPECT_EQ(Allocator::size_class(7 << 20), 7u << 20);
    for (size_t b : {1500u, 100000u, 3000000u}) {
        EXPECT_GE(Allocator::size_class(b), b);
        EXPECT_LE(Allocator::size_class(b), b + b / 4);
    }
    Allocator alloc(Device::cpu());
    std::mt19937 rng(3);
    std::uniform_int_distribution<int64_t> rows(200, 300); // rows of 128 floats: 100-150 KiB
    for (int step = 0; step < 200; ++step) {
        std::vector<Tensor> experts;
        for (int e = 0; e < 4; ++e)
            experts.emplace_back(std::vector<int64_t>{rows(rng), 128}, DType::f32, alloc);
    }
    // 100-150 KiB spans the classes 112, 128 and 160 KiB; four tensors of each at most.
    EXPECT_LE(alloc.fresh_allocations(), 12u);
    EXPECT_LE(alloc.bytes_reserved(), 4u * 160 * 1024 * 3);
    EXPECT_EQ(alloc.bytes_in_use(), 0u);
}

// A request takes the buffer of its class freed last (the one still in the caches), not the
// one freed first: GPipe's forwards took the buffers its previous step's first backwards had
// freed, and a step's forwards and backwards ran 10% slower than with the last freed.
TEST(Allocator, ARequestTakesTheBufferFreedLast) {
    Allocator alloc(Device::cpu());
    std::vector<void*> held;
    for (int i = 0; i < 4; ++i) held.push_back(alloc.allocate(4096));
    for (void* p : held) alloc.release(p, 4096); // freed in order: held[3] last
    EXPECT_EQ(alloc.allocate(4096), held[3]);
    EXPECT_EQ(alloc.allocate(4000), held[2]); // the same class
    void* other = alloc.allocate(8192);       // another class: a buffer of its own
    EXPECT_EQ(std::count(held.begin(), held.end(), other), 0);
    alloc.release(held[3], 4096);
    EXPECT_EQ(alloc.allocate(4096), held[3]);
    EXPECT_EQ(alloc.fresh_allocations(), 5u);
    alloc.release(held[2], 4000); // held[0] and held[1] were never taken again
    alloc.release(held[3], 4096);
    alloc.release(other, 8192);
    EXPECT_EQ(alloc.bytes_in_use(), 0u);
}

namespace {
// A device of 1000 bytes: host memory, counted.
size_t budget_used = 0;
std::map<void*, size_t> budget_blocks;
void* budget_allocate(size_t bytes, int device) {
    if (budget_used + bytes > 1000) throw std::runtime_error("out of memory");
    void* p = MemoryOps::host().allocate(bytes, device);
    budget_used += bytes;
    budget_blocks[p] = bytes;
    return p;
}
void budget_release(void* p, int device) {
    budget_used -= budget_blocks.at(p);
    budget_blocks.erase(p);
    MemoryOps::host().release(p, device);
}
} // namespace

TEST(Allocator, AFullDeviceGetsItsFreeBuffersBackBeforeARefusal) {
    MemoryOps ops = MemoryOps::host();
    ops.allocate = budget_allocate;
    ops.release = budget_release;
    {
        Allocator alloc(Device{Device::Kind::cuda, 1}, ops);
        { Tensor a({96}, DType::f32, alloc), b({96}, DType::f32, alloc); } // 768 bytes, freed
        EXPECT_EQ(alloc.bytes_reserved(), 768u);
        // 600 bytes (a 640-byte class) fit only once the two free 384-byte buffers go back.
        Tensor c({150}, DType::f32, alloc);
        EXPECT_EQ(budget_used, 640u);
        EXPECT_EQ(alloc.bytes_reserved(), 640u);
        EXPECT_EQ(alloc.bytes_in_use(), 600u);
        // Nothing free to give back: the device's own error, and the books unchanged.
        try {
            Tensor d({150}, DType::f32, alloc);
            FAIL() << "a device that is full made room";
        } catch (const std::runtime_error& e) {
            EXPECT_STREQ(e.what(), "out of memory");
        }
        EXPECT_EQ(alloc.bytes_in_use(), 600u);
    }
    EXPECT_EQ(budget_used, 0u);
}

TEST(Bf16, RoundsToNearestEven) {
    EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
    EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
    // 1 + 2^-8 is halfway between two bf16 values (1 and 1 + 2^-7): ties go to even, 1.
    EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + std::ldexp(1.0f, -8))), 1.0f);
    // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: ties go to even, 1 + 2^-6.
    EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8))),
              1.0f + std::ldexp(1.0f, -6));
    EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
    EXPECT_TRUE(std::isinf(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::infinity()))));
    Tensor t = Tensor::zeros({3});
    t.data<float>()[1] = 3.140625f; // exactly representable in bf16
    Tensor back = t.to(DType::bf16).to(DType::f32);
    EXPECT_EQ(back.data<float>()[1], 3.140625f);
}

// The CPU backend's vectorised rounding gives the scalar conversion's bits for every kind of
// float: normal, subnormal, ties, infinities and NaNs (a spread of bit patterns).
TEST(Bf16, TheVectorisedRoundingIsTheScalarOne) {
    const int64_t n = 200003; // over the threaded loops' threshold
    std::vector<float> x(static_cast<size_t>(n));
    uint32_t state = 12345;
    for (float& v : x) {
        state = state * 1664525u + 1013904223u;
        std::memcpy(&v, &state, 4);
    }
    x[0] = 1.0f + std::ldexp(1.0f, -8);
    x[1] = std::numeric_limits<float>::quiet_NaN();
    x[2] = -std::numeric_limits<float>::infinity();
    x[3] = std::numeric_limits<float>::denorm_min();
    x[4] = std::numeric_limits<float>::max();
    std::vector<float> r = x, back(x.size());
    std::vector<uint16_t> h(x.size());
    cpu::round_bf16(r.data(), n);
    cpu::to_bf16(x.data(), n, h.data());
    cpu::from_bf16(h.data(), n, back.data());
    for (int64_t i = 0; i < n; ++i) {
        const size_t k = static_cast<size_t>(i);
        uint16_t want = f32_to_bf16(x[k]);
        ASSERT_EQ(h[k], want) << i;
        float expect = bf16_to_f32(want);
        ASSERT_EQ(std::memcmp(&r[k], &expect, 4), 0) << i;
        ASSERT_EQ(std::memcmp(&back[k], &expect, 4), 0) << i;
    }
}

namespace {

// Host memory that counts how a tensor reaches it: every transfer goes through the ops.
struct Counts {
    int allocate = 0, zero = 0, copy = 0, to_host = 0, from_host = 0, from_peer = 0;
} counts;

MemoryOps counting_ops() {
    MemoryOps ops = MemoryOps::host();
    static MemoryOps host = MemoryOps::host();
    ops.allocate = [](size_t b, int d) { return ++counts.allocate, host.allocate(b, d); };
    ops.zero = [](void* p, size_t b, int d) { ++counts.zero, host.zero(p, b, d); };
    ops.copy = [](void* p, const void* s, size_t b, int d) {
        ++counts.copy, host.copy(p, s, b, d);
    };
    ops.to_host = [](void* p, const void* s, size_t b, int d) {
        ++counts.to_host, host.to_host(p, s, b, d);
    };
    ops.from_host = [](void* p, const void* s, size_t b, int d) {
        ++counts.from_host, host.from_host(p, s, b, d);
    };
    ops.from_peer = [](void* p, int d, const void* s, int, size_t b) {
        ++counts.from_peer, host.copy(p, s, b, d);
    };
    return ops;
}

} // namespace

TEST(Allocator, TensorsMoveBetweenDevicesThroughTheDevicesMemoryOps) {
    // A stand-in "device" whose memory is host memory, to see which op each move uses.
    Allocator other(Device{Device::Kind::cuda, 3}, counting_ops());
    Tensor a({4});
    for (int i = 0; i < 4; ++i) a.data<float>()[i] = static_cast<float>(i + 1);
    Tensor b = a.to(other);
    EXPECT_EQ(b.device().str(), "cuda:3");
    EXPECT_EQ(counts.from_host, 1);
    Tensor c = b.clone();
    EXPECT_EQ(counts.copy, 1);
    c.fill_zero();
    EXPECT_EQ(counts.zero, 1);
    Tensor back = b.to(Allocator::cpu());
    EXPECT_EQ(counts.to_host, 1);
    EXPECT_EQ(back.device().str(), "cpu");
    for (int i = 0; i < 4; ++i) EXPECT_EQ(back.data<float>()[i], static_cast<float>(i + 1));
    EXPECT_EQ(counts.allocate, 2);
    // dtype conversion is a CPU operation.
    EXPECT_THROW(b.to(DType::bf16), std::invalid_argument);
    // To another device of the kind: directly, when its ops can; else through the host.
    Allocator peer(Device{Device::Kind::cuda, 4}, counting_ops());
    Tensor d = b.to(peer);
    EXPECT_EQ(counts.from_peer, 1);
    EXPECT_EQ(counts.to_host, 1);
    Tensor dh = d.on_host();
    for (int i = 0; i < 4; ++i) EXPECT_EQ(dh.data<float>()[i], static_cast<float>(i + 1));
    Allocator staged(Device{Device::Kind::cuda, 5}, MemoryOps::host()); // no from_peer
    Tensor e = b.to(staged);
    EXPECT_EQ(counts.to_host, 3); // d's check above, and e's staging
    EXPECT_EQ(e.on_host().data<float>()[3], 4.0f);
}

TEST(Tensor, CopyFromOverwritesInPlaceFromAnyDevice) {
    Allocator other(Device{Device::Kind::cuda, 2}, MemoryOps::host()); // host memory, as a device
    Tensor a({3});
    for (int i = 0; i < 3; ++i) a.data<float>()[i] = static_cast<float>(i + 7);
    Tensor on_device = Tensor::zeros({3}, DType::f32, other);
    void* where = on_device.raw();
    on_device.copy_from(a);
    EXPECT_EQ(on_device.raw(), where); // in place, not a new buffer
    Tensor back = on_device.on_host();
    EXPECT_EQ(back.device(), Device::cpu());
    for (int i = 0; i < 3; ++i) EXPECT_EQ(back.data<float>()[i], static_cast<float>(i + 7));
    EXPECT_EQ(a.on_host().raw(), a.raw()); // a host tensor is its own host copy
    EXPECT_THROW(on_device.copy_from(Tensor({4})), std::invalid_argument);
    EXPECT_THROW(on_device.copy_from(Tensor({3}, DType::i32)), std::invalid_argument);
}
