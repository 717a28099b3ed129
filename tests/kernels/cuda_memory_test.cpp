// cuda_memory_test.cpp: Tensors in CUDA device memory, through the device's Allocator.
#include "kernels/cuda/memory.hpp"
#include "kernels/cuda/ops.hpp"

#include <gtest/gtest.h>

using namespace dist::kernels;

TEST(CudaMemory, AMissingDeviceIsAnErrorNotACrash) {
    int n = cuda::device_count();
    EXPECT_THROW(cuda::allocator(n), std::invalid_argument);
    EXPECT_THROW(cuda::allocator(-1), std::invalid_argument);
}

TEST(CudaMemory, TensorsRoundTripThroughDeviceMemoryAndBuffersAreReused) {
    if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU visible";
    Allocator& gpu = cuda::allocator(0);
    EXPECT_EQ(gpu.device().str(), "cuda:0");
    Tensor host({3, 5});
    for (int64_t i = 0; i < host.numel(); ++i) host.data<float>()[i] = 0.5f * static_cast<float>(i);
    size_t fresh = 0;
    for (int round = 0; round < 3; ++round) {
        Tensor d = host.to(gpu);
        EXPECT_EQ(d.device().str(), "cuda:0");
        Tensor twin = d.clone(); // device to device
        Tensor back = twin.to(Allocator::cpu());
        for (int64_t i = 0; i < host.numel(); ++i)
            ASSERT_EQ(back.data<float>()[i], host.data<float>()[i]);
        d.fill_zero();
        Tensor zero = d.to(Allocator::cpu());
        for (int64_t i = 0; i < host.numel(); ++i) ASSERT_EQ(zero.data<float>()[i], 0.0f);
        if (round == 0) fresh = gpu.fresh_allocations();
    }
    EXPECT_EQ(gpu.fresh_allocations(), fresh);
    EXPECT_THROW(host.to(gpu).to(DType::bf16), std::invalid_argument);
}
