// tensor_parallel_test.cpp: the Megatron-LM split of the model's layers against the model on
// one device.
//
// Every tp rank is a thread with its own Model and a member of one in-process group. The
// losses must equal the one-device loss, each rank's parameters must be exactly its slice of the
// one-device parameters (initialisation depends on the global index only), and its gradients
// that slice of the one-device gradients, up to float reduction order.
#include "model_fixtures.hpp"
#include "transport/inprocess.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <future>

using namespace dist;
using namespace dist::models;
using namespace dist::models::fixtures;

namespace {

// Two microbatches with split backward in a mixed order: F0 F1 I1 I0 W0 W1.
template <typename M> std::vector<double> step(M& model, const Data& a, const Data& b) {
    model.params().zero_grads();
    std::vector<double> losses{model.forward(0, a.tokens, a.targets),
                               model.forward(1, b.tokens, b.targets)};
    model.backward_input(1, 0.5);
    model.backward_input(0, 0.5);
    model.backward_weight(0);
    model.backward_weight(1);
    return losses;
}

void expect_tp_matches_one_device(const std::string& model_line, int tp,
                                  Recompute recompute = Recompute::none) {
    ModelSpec spec = spec_of(model_line);
    auto vocab = static_cast<int32_t>(spec.vocab);
    Data a = data(2, 5, vocab, 1), b = data(2, 5, vocab, 2);
    Model whole(spec, 42);
    std::vector<double> expect = step(whole, a, b);

    transport::InProcessGroup group(tp, "tp group");
    std::vector<std::unique_ptr<Model>> shards(static_cast<size_t>(tp));
    std::vector<std::future<std::vector<double>>> runs;
    for (int r = 0; r < tp; ++r)
        runs.push_back(std::async(std::launch::async, [&, r] {
            auto member = group.member(r);
            auto& m = shards[static_cast<size_t>(r)];
            m = std::make_unique<Model>(spec, 42, recompute, member.get());
            try {
                return step(*m, a, b);
            } catch (...) {
                group.abort("rank " + std::to_string(r) + " failed");
                throw;
            }
        }));
    for (int r = 0; r < tp; ++r) {
        std::vector<double> losses = runs[static_cast<size_t>(r)].get();
        for (size_t i = 0; i < expect.size(); ++i)
            EXPECT_NEAR(losses[i], expect[i], 1e-5 * std::abs(expect[i]))
                << "rank " << r << " microbatch " << i;
    }

    int64_t split_params = 0, held = 0;
    for (int r = 0; r < tp; ++r) {
        Model& m = *shards[static_cast<size_t>(r)];
        for (const Parameter& p : m.params().all()) {
            const Parameter* w = whole.params().find(p.name);
            ASSERT_NE(w, nullptr) << p.name;
            EXPECT_EQ(p.full_shape, w->value.shape()) << p.name;
            held += p.value.numel();
            if (!p.shard.whole()) ++split_params;
            float scale = 0.0f;
            for (int64_t i = 0; i < w->grad.numel(); ++i)
                scale = std::max(scale, std::abs(w->grad.data<float>()[i]));
            for (int64_t i = 0; i < p.value.numel(); ++i) {
                int64_t g = p.shard.global_index(p.full_shape, i);
                ASSERT_EQ(p.value.data<float>()[i], w->value.data<float>()[g])
                    << p.name << " rank " << r << " element " << i;
                ASSERT_NEAR(p.grad.data<float>()[i], w->grad.data<float>()[g], 1e-5f * scale)
                    << p.name << " rank " << r << " element " << i << " (global " << g << ")";
            }
        }
    }
    // Every rank holds a part of the split parameters: in all, the whole model once, plus the
    // replicated ones tp times.
    int64_t replicated = 0;
    for (const Parameter& p : shards[0]->params().all())
        if (p.shard.whole()) replicated += p.value.numel();
    EXPECT_EQ(held, whole.params().count() + (tp - 1) * replicated);
    EXPECT_GT(split_params, 0);
}

const char* gpt = "gpt(vocab: 12, context: 6, layers: 2, heads: 4, width: 8)";
const char* llama =
    "llama(vocab: 12, context: 6, layers: 2, heads: 4, kv_heads: 2, width: 8, hidden: 12)";

} // namespace

TEST(Shard, MapsLocalElementsToTheirPlaceInTheFullParameter) {
    // Rows 1 and 3..4 of a (5, 3) matrix: local (3, 3).
    Shard rows{0, {{1, 2}, {3, 5}}};
    std::vector<int64_t> full{5, 3};
    EXPECT_EQ(rows.local_shape(full), (std::vector<int64_t>{3, 3}));
    std::vector<int64_t> expect{3, 4, 5, 9, 10, 11, 12, 13, 14};
    for (int64_t i = 0; i < 9; ++i) EXPECT_EQ(rows.global_index(full, i), expect[i]) << i;
    // Columns 2..3 of a (2, 4) matrix: local (2, 2).
    Shard cols = Shard::range(1, 2, 4);
    EXPECT_EQ(cols.local_shape({2, 4}), (std::vector<int64_t>{2, 2}));
    std::vector<int64_t> expect_cols{2, 3, 6, 7};
    for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(cols.global_index({2, 4}, i), expect_cols[i]);
    // The whole parameter maps to itself.
    EXPECT_EQ(Shard{}.global_index({2, 4}, 5), 5);
}

// Shards sent as bytes (how other processes' parameters reach a checkpoint) land where
// copy_to_whole puts them; bad bytes are refused with a message, not written out of bounds.
TEST(Shard, SerialisedShardsMergeLikeCopyToWholeAndBadBytesAreRefused) {
    auto fill = [](ParameterStore& s, float base) {
        for (Parameter& p : s.all())
            for (int64_t i = 0; i < p.value.numel(); ++i) {
                p.value.data<float>()[i] = base + static_cast<float>(i);
                p.m.data<float>()[i] = -base - static_cast<float>(i);
                p.v.data<float>()[i] = 2 * base + static_cast<float>(i);
            }
    };
    ParameterStore part;
    part.add("w", {5, 3}, Init{}, true, 1, Shard{0, {{1, 2}, {3, 5}}});
    part.add("b", {4}, Init{}, false, 1, Shard::range(0, 2, 4));
    part.add("tied", {2, 2}, Init{}, true, 1);
    fill(part, 100);
    ParameterStore direct, merged;
    for (ParameterStore* s : {&direct, &merged}) {
        s->add("w", {5, 3}, Init{}, true, 1);
        s->add("b", {4}, Init{}, false, 1);
        s->add("tied", {2, 2}, Init{}, true, 1);
        fill(*s, 0);
    }
    copy_to_whole(part, direct, {"tied"});
    std::string bytes;
    append_serialised(part, {"tied"}, bytes);
    ASSERT_EQ(merge_serialised(bytes, merged), "");
    for (const Parameter& d : direct.all()) {
        const Parameter* m = merged.find(d.name);
        for (int64_t i = 0; i < d.value.numel(); ++i) {
            EXPECT_EQ(m->value.data<float>()[i], d.value.data<float>()[i]) << d.name << i;
            EXPECT_EQ(m->m.data<float>()[i], d.m.data<float>()[i]) << d.name << i;
            EXPECT_EQ(m->v.data<float>()[i], d.v.data<float>()[i]) << d.name << i;
        }
    }
    // Every truncation, a name the model lacks, a shard past the parameter's end.
    for (size_t n = 1; n < bytes.size(); n += 7)
        EXPECT_NE(merge_serialised(bytes.substr(0, n), merged), "") << n;
    ParameterStore other;
    other.add("w", {5, 3}, Init{}, true, 1);
    EXPECT_NE(merge_serialised(bytes, other).find("`b`, which the model lacks"), std::string::npos);
    ParameterStore wide;
    wide.add("x", {4}, Init{}, true, 1, Shard::range(0, 0, 4));
    std::string past;
    append_serialised(wide, {}, past);
    ParameterStore small;
    small.add("x", {4}, Init{}, true, 1);
    std::string edited = past;
    // The range's end sits after the name (8 + 1 bytes), the shape (8 + 8), dim (4), count (8)
    // and the range's begin (8).
    const size_t end_at = 8 + 1 + 8 + 8 + 4 + 8 + 8;
    int64_t too_far = 9;
    std::memcpy(edited.data() + end_at, &too_far, sizeof too_far);
    EXPECT_NE(merge_serialised(edited, small).find("a shard outside `x`"), std::string::npos);
    EXPECT_EQ(merge_serialised(past, small), "");
}

// ZeRO: each data-parallel member holds the moments of its share of the elements, and under
// ZeRO 3 only that share's values (the rest undefined). Both members' shares, copied or sent as
// bytes, make up the whole parameter; and a whole parameter loads into a member's share.
TEST(Shard, ZeroSharesOfTheStateMakeUpTheWholeParameter) {
    auto member = [](int64_t begin, int64_t end, bool values_too) {
        ParameterStore s;
        Parameter& p = s.add("w", {2, 5}, Init{}, true, 1, Shard::range(1, 1, 4)); // 2 x 3
        p.state_begin = begin;
        p.m = kernels::Tensor({end - begin});
        p.v = kernels::Tensor({end - begin});
        for (int64_t i = 0; i < end - begin; ++i) {
            p.m.data<float>()[i] = 10.0f + static_cast<float>(begin + i);
            p.v.data<float>()[i] = 20.0f + static_cast<float>(begin + i);
        }
        for (int64_t i = 0; i < 6; ++i) p.value.data<float>()[i] = static_cast<float>(i);
        if (values_too) {
            p.owned = kernels::Tensor({end - begin});
            for (int64_t i = 0; i < end - begin; ++i)
                p.owned.data<float>()[i] = static_cast<float>(begin + i);
            p.value = kernels::Tensor();
        }
        return s;
    };
    for (bool zero3 : {false, true}) {
        ParameterStore a = member(0, 3, zero3), b = member(3, 6, zero3);
        ParameterStore direct, merged;
        for (ParameterStore* s : {&direct, &merged}) s->add("w", {2, 5}, Init::ones(), true, 1);
        copy_to_whole(a, direct);
        copy_to_whole(b, direct);
        std::string bytes;
        append_serialised(a, {}, bytes);
        append_serialised(b, {}, bytes);
        ASSERT_EQ(merge_serialised(bytes, merged), "");
        // Local element i of the 2 x 3 shard is column 1 + i % 3 of row i / 3.
        for (const ParameterStore* s : {&direct, &merged}) {
            const Parameter& w = *s->find("w");
            for (int64_t i = 0; i < 6; ++i) {
                int64_t g = (i / 3) * 5 + 1 + i % 3;
                EXPECT_EQ(w.value.data<float>()[g], static_cast<float>(i)) << zero3 << i;
                EXPECT_EQ(w.m.data<float>()[g], 10.0f + static_cast<float>(i)) << zero3 << i;
                EXPECT_EQ(w.v.data<float>()[g], 20.0f + static_cast<float>(i)) << zero3 << i;
            }
            EXPECT_EQ(w.value.data<float>()[0], 1.0f); // outside the shard: untouched
        }
        // Back into a member: its share of the moments (and of the values under ZeRO 3).
        ParameterStore c = member(3, 6, zero3);
        Parameter& cp = *c.find("w");
        cp.m.fill_zero();
        (zero3 ? cp.owned : cp.value).fill_zero();
        copy_from_whole(merged, c);
        EXPECT_EQ(cp.m.data<float>()[0], 13.0f);
        EXPECT_EQ((zero3 ? cp.owned : cp.value).data<float>()[zero3 ? 0 : 3], 3.0f);
    }
    // A share that claims elements past the parameter's end is refused.
    ParameterStore a = member(0, 3, false);
    std::string bytes;
    append_serialised(a, {}, bytes);
    // The share's begin follows the name (8 + 1), shape (8 + 16), dim (4), count (8), range
    // (16).
    const size_t begin_at = 8 + 1 + 8 + 16 + 4 + 8 + 16;
    int64_t far = 5;
    std::memcpy(bytes.data() + begin_at, &far, sizeof far);
    ParameterStore whole;
    whole.add("w", {2, 5}, Init{}, true, 1);
    EXPECT_NE(merge_serialised(bytes, whole).find("optimizer state outside `w`"),
              std::string::npos);
}

TEST(Parameters, ADevicesStoreIsReadAndWrittenThroughTheHost) {
    // A stand-in device whose memory is host memory: what differs from a CPU store is only
    // that every read and write must go through to_host / from_host copies.
    kernels::Allocator device(kernels::Device{kernels::Device::Kind::cuda, 1},
                              kernels::MemoryOps::host());
    ParameterStore host_part, device_part(device);
    for (ParameterStore* s : {&host_part, &device_part}) {
        s->add("w", {5, 3}, Init::normal(0.02), true, 7, Shard{0, {{1, 2}, {3, 5}}});
        s->add("b", {4}, Init::normal(0.02), false, 7, Shard::range(0, 2, 4));
    }
    // The same initial values, materialised on the host and copied.
    for (const Parameter& h : host_part.all()) {
        const Parameter* d = device_part.find(h.name);
        EXPECT_EQ(d->value.device(), device.device());
        EXPECT_EQ(d->grad.device(), device.device());
        for (int64_t i = 0; i < h.value.numel(); ++i)
            EXPECT_EQ(d->value.data<float>()[i], h.value.data<float>()[i]) << h.name << i;
    }
    ParameterStore whole;
    whole.add("w", {5, 3}, Init{}, true, 1);
    whole.add("b", {4}, Init{}, false, 1);
    for (Parameter& p : whole.all())
        for (int64_t i = 0; i < p.value.numel(); ++i) {
            p.value.data<float>()[i] = static_cast<float>(i) + 0.5f;
            p.m.data<float>()[i] = -static_cast<float>(i);
            p.v.data<float>()[i] = 3.0f * static_cast<float>(i);
        }
    copy_from_whole(whole, host_part);
    copy_from_whole(whole, device_part);
    ParameterStore from_host, from_device;
    for (ParameterStore* s : {&from_host, &from_device}) {
        s->add("w", {5, 3}, Init{}, true, 1);
        s->add("b", {4}, Init{}, false, 1);
    }
    copy_to_whole(host_part, from_host);
    copy_to_whole(device_part, from_device);
    std::string host_bytes, device_bytes;
    append_serialised(host_part, {}, host_bytes);
    append_serialised(device_part, {}, device_bytes);
    EXPECT_EQ(device_bytes, host_bytes);
    for (const Parameter& h : from_host.all()) {
        const Parameter* d = from_device.find(h.name);
        for (int64_t i = 0; i < h.value.numel(); ++i) {
            EXPECT_EQ(d->value.data<float>()[i], h.value.data<float>()[i]) << h.name << i;
            EXPECT_EQ(d->m.data<float>()[i], h.m.data<float>()[i]) << h.name << i;
            EXPECT_EQ(d->v.data<float>()[i], h.v.data<float>()[i]) << h.name << i;
        }
    }
    // And the shard took the whole's elements: row 1 of w is its elements 3..5.
    EXPECT_EQ(device_part.find("w")->value.data<float>()[0], 3.5f);
}

TEST(TensorParallel, GroupOfOneIsExactlyTheOneDeviceModel) {
    ModelSpec spec = spec_of(gpt);
    Data a = data(2, 5, 12, 1), b = data(2, 5, 12, 2);
    transport::SoloCollectives solo;
    Model plain(spec, 3), grouped(spec, 3, Recompute::none, &solo);
    EXPECT_EQ(step(plain, a, b), step(grouped, a, b));
    for (size_t i = 0; i < plain.params().all().size(); ++i) {
        const Parameter& p = plain.params().all()[i];
        const Parameter& q = grouped.params().all()[i];
        EXPECT_TRUE(q.shard.whole());
        EXPECT_EQ(0, std::memcmp(p.grad.raw(), q.grad.raw(), p.grad.bytes())) << p.name;
    }
}

TEST(TensorParallel, GptOnTwoRanksMatchesOneDevice) {
    expect_tp_matches_one_device(gpt, 2);
}

TEST(TensorParallel, GptOnFourRanksMatchesOneDevice) {
    expect_tp_matches_one_device(gpt, 4);
}

TEST(TensorParallel, LlamaWithGroupedQueriesOnTwoRanksMatchesOneDevice) {
    expect_tp_matches_one_device(llama, 2);
}

TEST(TensorParallel, FullRecomputationOnTwoRanksMatchesOneDevice) {
    expect_tp_matches_one_device(gpt, 2, Recompute::full);
}

TEST(TensorParallel, RanksHoldTheirSliceOfTheVocabulary) {
    ModelSpec spec = spec_of(gpt);
    transport::InProcessGroup group(4, "tp");
    auto member = group.member(2);
    // Constructing needs no collective: a rank alone can build its shard.
    Model m(spec, 42, Recompute::none, member.get());
    const Parameter* wte = m.params().find("wte.weight");
    ASSERT_NE(wte, nullptr);
    EXPECT_EQ(wte->value.shape(), (std::vector<int64_t>{3, 8}));
    EXPECT_EQ(wte->shard.ranges, (std::vector<std::pair<int64_t, int64_t>>{{6, 9}}));
    // Norms are replicated; the MLP's projection is split by columns.
    EXPECT_TRUE(m.params().find("h.0.ln_1.weight")->shard.whole());
    EXPECT_EQ(m.params().find("h.0.mlp.proj.weight")->shard.dim, 1);
}
