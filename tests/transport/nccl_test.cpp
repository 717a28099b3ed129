// nccl_test.cpp: NCCL collectives on the GPUs of this machine, one rank per GPU (threads of
// this process). Skips where there are fewer GPUs than a test needs.
#include "kernels/cuda/memory.hpp"
#include "kernels/cuda/ops.hpp"
#include "transport/nccl.hpp"

#include <gtest/gtest.h>

#include <future>

using namespace dist;
using namespace dist::transport;

namespace {

// Runs body(rank, collectives, allocator of the rank's GPU) on one thread per rank.
void on_gpus(int size, const std::function<void(int, Collectives&, kernels::Allocator&)>& body) {
    MemoryStore store;
    std::vector<std::future<void>> ranks;
    for (int r = 0; r < size; ++r)
        ranks.push_back(std::async(std::launch::async, [&, r] {
            auto c =
                make_nccl_collectives(store, "nccl test", r, size, r, std::chrono::seconds(60));
            body(r, *c, kernels::cuda::allocator(r));
        }));
    for (auto& f : ranks) {
        ASSERT_EQ(f.wait_for(std::chrono::seconds(120)), std::future_status::ready);
        f.get();
    }
}

} // namespace

TEST(Nccl, AllReduceAllGatherReduceScatterAndBroadcastOnEveryGpu) {
    int gpus = kernels::cuda::device_count();
    if (gpus == 0) GTEST_SKIP() << "no GPU visible";
    const int64_t n = 1000;
    on_gpus(gpus, [&](int r, Collectives& c, kernels::Allocator& gpu) {
        kernels::Tensor host({n * gpus});
        for (int64_t i = 0; i < n * gpus; ++i)
            host.data<float>()[i] = static_cast<float>((r + 1) * (i % 13));
        kernels::Tensor d = host.to(gpu);
        c.all_reduce(d.data<float>(), n, ReduceOp::sum);
        kernels::Tensor back = d.to(kernels::Allocator::cpu());
        float ranks_sum = static_cast<float>(gpus * (gpus + 1) / 2);
        for (int64_t i = 0; i < n; ++i)
            ASSERT_EQ(back.data<float>()[i], ranks_sum * static_cast<float>(i % 13));
        kernels::Tensor gathered({n * gpus}, kernels::DType::f32, gpu);
        kernels::Tensor mine = host.to(gpu);
        c.all_gather(mine.data<float>(), n, gathered.data<float>());
        back = gathered.to(kernels::Allocator::cpu());
        for (int src = 0; src < gpus; ++src)
            ASSERT_EQ(back.data<float>()[src * n + 5], static_cast<float>((src + 1) * 5));
        kernels::Tensor part({n}, kernels::DType::f32, gpu);
        c.reduce_scatter(mine.data<float>(), n, part.data<float>());
        back = part.to(kernels::Allocator::cpu());
        ASSERT_EQ(back.data<float>()[0], ranks_sum * static_cast<float>((r * n) % 13));
        c.broadcast(mine.data<float>(), n, 0);
        back = mine.to(kernels::Allocator::cpu());
        ASSERT_EQ(back.data<float>()[7], 7.0f);
    });
}

TEST(Nccl, ABadGroupIsRefused) {
    MemoryStore store;
    EXPECT_THROW(make_nccl_collectives(store, "g", 2, 2, 0, std::chrono::seconds(1)),
                 std::invalid_argument);
}
