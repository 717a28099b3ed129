// parameters.cpp: parameter storage and the counter-based initialisation.
#include "models/parameters.hpp"

#include "models/data.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace dist::models {

namespace {

uint64_t name_hash(const std::string& s) {
    uint64_t h = 1469598103934665603ull; // FNV-1a
    for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
    return h;
}

double unit_interval(uint64_t bits) {
    return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

} // namespace

float initial_value(uint64_t seed, const std::string& name, int64_t index, const Init& init) {
    switch (init.kind) {
    case Init::Kind::zeros: return 0.0f;
    case Init::Kind::ones: return 1.0f;
    case Init::Kind::normal: {
        // Box-Muller on two uniforms drawn from (seed, name, index) alone.
        uint64_t h = name_hash(name);
        uint64_t i = static_cast<uint64_t>(index);
        double u1 = 1.0 - unit_interval(hash64(seed, h, 2 * i));
        double u2 = unit_interval(hash64(seed, h, 2 * i + 1));
        double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
        return static_cast<float>(z * init.std);
    }
    }
    return 0.0f;
}

std::vector<int64_t> Shard::local_shape(const std::vector<int64_t>& full) const {
    if (whole()) return full;
    std::vector<int64_t> shape = full;
    int64_t n = 0;
    for (auto [b, e] : ranges) n += e - b;
    shape.at(static_cast<size_t>(dim)) = n;
    return shape;
}

int64_t Shard::global_index(const std::vector<int64_t>& full, int64_t local) const {
    if (whole()) return local;
    // local = (outer * L + k) * inner + in, with L the shard's extent along `dim`.
    int64_t inner = 1;
    for (size_t d = static_cast<size_t>(dim) + 1; d < full.size(); ++d) inner *= full[d];
    int64_t extent = local_shape(full)[static_cast<size_t>(dim)];
    int64_t in = local % inner, k = (local / inner) % extent, outer = local / (inner * extent);
    int64_t global_k = 0;
    for (auto [b, e] : ranges) {
        if (k < e - b) {
            global_k = b + k;
            break;
        }
        k -= e - b;
    }
    return (outer * full[static_cast<size_t>(dim)] + global_k) * inner + in;
}

Parameter& ParameterStore::add(std::string name, std::vector<int64_t> shape, Init init, bool decay,
                               uint64_t seed, const Shard& shard) {
    Parameter& p = params_.emplace_back();
    p.name = std::move(name);
    p.init = init;
    p.decay = decay;
    p.full_shape = shape;
    p.shard = shard;
    std::vector<int64_t> local = shard.local_shape(shape);
    p.value = kernels::Tensor(local);
    p.grad = kernels::Tensor::zeros(local);
    p.m = kernels::Tensor::zeros(local);
    p.v = kernels::Tensor::zeros(local);
    float* x = p.value.data<float>();
    for (int64_t i = 0; i < p.value.numel(); ++i)
        x[i] = initial_value(seed, p.name, shard.global_index(shape, i), init);
    return p;
}

Parameter* ParameterStore::find(const std::string& name) {
    for (auto& p : params_)
        if (p.name == name) return &p;
    return nullptr;
}

const Parameter* ParameterStore::find(const std::string& name) const {
    for (const auto& p : params_)
        if (p.name == name) return &p;
    return nullptr;
}

namespace {

// Every (local element, its index in the full parameter) of `p`, with the whole parameter.
template <typename Whole, typename F> void each_element(const Parameter& p, Whole& whole, F&& f) {
    auto* w = whole.find(p.name);
    if (!w) throw std::logic_error("no parameter " + p.name + " in the whole model");
    for (int64_t i = 0; i < p.value.numel(); ++i) f(*w, i, p.shard.global_index(p.full_shape, i));
}

} // namespace

void copy_from_whole(const ParameterStore& whole, ParameterStore& part) {
    for (Parameter& p : part.all())
        each_element(p, whole, [&](const Parameter& w, int64_t i, int64_t g) {
            p.value.data<float>()[i] = w.value.data<float>()[g];
            p.m.data<float>()[i] = w.m.data<float>()[g];
            p.v.data<float>()[i] = w.v.data<float>()[g];
        });
}

void copy_to_whole(const ParameterStore& part, ParameterStore& whole,
                   const std::vector<std::string>& skip) {
    for (const Parameter& p : part.all()) {
        if (std::find(skip.begin(), skip.end(), p.name) != skip.end()) continue;
        each_element(p, whole, [&](Parameter& w, int64_t i, int64_t g) {
            w.value.data<float>()[g] = p.value.data<float>()[i];
            w.m.data<float>()[g] = p.m.data<float>()[i];
            w.v.data<float>()[g] = p.v.data<float>()[i];
        });
    }
}

int64_t ParameterStore::count() const {
    int64_t n = 0;
    for (const auto& p : params_) n += p.value.numel();
    return n;
}

void ParameterStore::zero_grads() {
    for (auto& p : params_) p.grad.fill_zero();
}

} // namespace dist::models
