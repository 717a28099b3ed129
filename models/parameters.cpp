// parameters.cpp: parameter storage and the counter-based initialisation.
#include "models/parameters.hpp"

#include "models/data.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <stdexcept>

namespace dist::models {

namespace {

uint64_t name_hash(const std::string& s) {
    uint64_t h = 1469598103934665603ull; // FNV-1a
    for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
    return h;
}

// Box-Muller turns two uniforms into two independent normals, r cos t and r sin t: elements
// 2k and 2k + 1 of a parameter are that pair, drawn from one hash of (seed, name, k), its high
// half the radius's uniform and its low half the angle's. Both outputs of one log and one
// sincos, rather than one of each per element, make initialisation about three times faster.
struct NormalPair {
    float even, odd;
};

NormalPair normal_pair(uint64_t seed, uint64_t h, uint64_t k, double sd) {
    const uint64_t bits = hash64(seed, h, k);
    const double u1 = 1.0 - static_cast<double>(bits >> 32) * 0x1.0p-32; // in (0, 1]
    const float u2 = static_cast<float>(static_cast<double>(bits & 0xffffffffu) * 0x1.0p-32);
    const float r = static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * sd);
    float s = 0.0f, c = 0.0f;
    ::sincosf(2.0f * static_cast<float>(M_PI) * u2, &s, &c);
    return {r * c, r * s};
}

// initial_value with the name's hash taken once, not at every element.
float initial_value_of(uint64_t seed, uint64_t h, int64_t index, const Init& init) {
    switch (init.kind) {
    case Init::Kind::zeros: return 0.0f;
    case Init::Kind::ones: return 1.0f;
    case Init::Kind::normal: {
        const NormalPair z = normal_pair(seed, h, static_cast<uint64_t>(index) >> 1, init.std);
        return index % 2 == 0 ? z.even : z.odd;
    }
    }
    return 0.0f;
}

// Elements [0, n) of a whole parameter under `init`: a pair of normals at a time.
void fill_whole(uint64_t seed, uint64_t h, int64_t n, const Init& init, float* x) {
    if (init.kind != Init::Kind::normal) {
        std::fill(x, x + n, initial_value_of(seed, h, 0, init));
        return;
    }
    const int64_t pairs = n / 2;
#pragma omp parallel for schedule(static) if (pairs >= (int64_t{1} << 15))
    for (int64_t k = 0; k < pairs; ++k) {
        const NormalPair z = normal_pair(seed, h, static_cast<uint64_t>(k), init.std);
        x[2 * k] = z.even;
        x[2 * k + 1] = z.odd;
    }
    if (n % 2 != 0) x[n - 1] = initial_value_of(seed, h, n - 1, init);
}

} // namespace

float initial_value(uint64_t seed, const std::string& name, int64_t index, const Init& init) {
    return initial_value_of(seed, name_hash(name), index, init);
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
    p.shape = local;
    kernels::Tensor host(local);
    float* x = host.data<float>();
    // Each element depends on its index alone: the threads split them in any order, and a
    // shard evaluates the elements of the whole parameter it holds.
    const uint64_t h = name_hash(p.name);
    const int64_t n = host.numel();
    if (shard.whole()) {
        fill_whole(seed, h, n, init, x);
    } else {
#pragma omp parallel for schedule(static) if (n >= (int64_t{1} << 16))
        for (int64_t i = 0; i < n; ++i)
            x[i] = initial_value_of(seed, h, shard.global_index(shape, i), init);
    }
    p.value = allocator_->device().kind == kernels::Device::Kind::cpu ? host : host.to(*allocator_);
    p.grad = kernels::Tensor::zeros(local, kernels::DType::f32, *allocator_);
    p.m = kernels::Tensor::zeros(local, kernels::DType::f32, *allocator_);
    p.v = kernels::Tensor::zeros(local, kernels::DType::f32, *allocator_);
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

// The parameter of the whole model that `p` is a part of.
template <typename Whole> auto& whole_of(const Parameter& p, Whole& whole) {
    auto* w = whole.find(p.name);
    if (!w) throw std::logic_error("no parameter " + p.name + " in the whole model");
    return *w;
}

// The value and moments of `p` readable on the host (themselves, or copies of device memory).
// Under ZeRO 3, between uses, the value is the owned share: the elements the moments cover.
struct HostState {
    kernels::Tensor value, m, v;
    bool whole;
    explicit HostState(const Parameter& p)
        : value(p.value.defined() ? p.value.on_host() : p.owned.on_host()), m(p.m.on_host()),
          v(p.v.on_host()), whole(p.value.defined()) {}
    // Writes host copies back to the device tensors they came from (nothing for host ones).
    void store(Parameter& p) const {
        (whole ? p.value : p.owned).copy_from(value);
        p.m.copy_from(m);
        p.v.copy_from(v);
    }
    // The value of local element i, which the state holds (always, when whole).
    float& at(const Parameter& p, int64_t i) const {
        return value.data<float>()[whole ? i : i - p.state_begin];
    }
};

// The local elements of `p` whose values this rank holds now: all, or its ZeRO 3 share.
std::pair<int64_t, int64_t> held_values(const Parameter& p) {
    if (p.value.defined()) return {0, p.value.numel()};
    return {p.state_begin, p.state_begin + p.owned.numel()};
}

// The parameters of `store` with their host states, made as a whole store is read or written.
struct HostStates {
    std::map<std::string, HostState> states;
    HostState& of(const Parameter& p) {
        auto it = states.find(p.name);
        if (it == states.end()) it = states.emplace(p.name, HostState(p)).first;
        return it->second;
    }
};

} // namespace

void copy_from_whole(const ParameterStore& whole, ParameterStore& part) {
    HostStates from;
    for (Parameter& p : part.all()) {
        HostState to(p);
        const HostState& h = from.of(whole_of(p, whole));
        auto [lo, hi] = held_values(p);
        for (int64_t i = lo; i < hi; ++i)
            to.at(p, i) = h.value.data<float>()[p.shard.global_index(p.full_shape, i)];
        for (int64_t i = 0; i < p.m.numel(); ++i) {
            int64_t g = p.shard.global_index(p.full_shape, p.state_begin + i);
            to.m.data<float>()[i] = h.m.data<float>()[g];
            to.v.data<float>()[i] = h.v.data<float>()[g];
        }
        to.store(p);
    }
}

void copy_to_whole(const ParameterStore& part, ParameterStore& whole,
                   const std::vector<std::string>& skip) {
    HostStates to;
    for (const Parameter& p : part.all()) {
        if (std::find(skip.begin(), skip.end(), p.name) != skip.end()) continue;
        HostState from(p);
        HostState& h = to.of(whole_of(p, whole));
        auto [lo, hi] = held_values(p);
        for (int64_t i = lo; i < hi; ++i)
            h.value.data<float>()[p.shard.global_index(p.full_shape, i)] = from.at(p, i);
        for (int64_t i = 0; i < p.m.numel(); ++i) {
            int64_t g = p.shard.global_index(p.full_shape, p.state_begin + i);
            h.m.data<float>()[g] = from.m.data<float>()[i];
            h.v.data<float>()[g] = from.v.data<float>()[i];
        }
    }
    for (auto& [name, h] : to.states) h.store(*whole.find(name));
}

namespace {

template <typename T> void put(std::string& out, T x) {
    out.append(reinterpret_cast<const char*>(&x), sizeof x);
}

// Reads what append_serialised wrote, refusing to read past the end.
struct Reader {
    const std::string& in;
    size_t at = 0;
    bool bytes(void* p, size_t n) {
        if (n > in.size() - at) return false;
        std::memcpy(p, in.data() + at, n);
        at += n;
        return true;
    }
    template <typename T> bool get(T& x) { return bytes(&x, sizeof x); }
};

} // namespace

void append_serialised(const ParameterStore& part, const std::vector<std::string>& skip,
                       std::string& out) {
    for (const Parameter& p : part.all()) {
        if (std::find(skip.begin(), skip.end(), p.name) != skip.end()) continue;
        put<uint64_t>(out, p.name.size());
        out += p.name;
        put<uint64_t>(out, p.full_shape.size());
        for (int64_t d : p.full_shape) put(out, d);
        put<int32_t>(out, p.shard.dim);
        put<uint64_t>(out, p.shard.ranges.size());
        for (auto [b, e] : p.shard.ranges) {
            put(out, b);
            put(out, e);
        }
        // The moments may be a share of the elements (ZeRO): where it starts, how long; and
        // whether the values are whole or that share too (ZeRO 3).
        put<int64_t>(out, p.state_begin);
        put<int64_t>(out, p.m.numel());
        HostState h(p);
        put<uint8_t>(out, h.whole ? 1 : 0);
        out.append(reinterpret_cast<const char*>(h.value.data<float>()), h.value.bytes());
        for (const kernels::Tensor* t : {&h.m, &h.v})
            out.append(reinterpret_cast<const char*>(t->data<float>()),
                       static_cast<size_t>(p.m.numel()) * sizeof(float));
    }
}

std::string merge_serialised(const std::string& bytes, ParameterStore& whole) {
    Reader r{bytes};
    ParameterStore part;
    const std::string truncated = "the parameters' message is truncated";
    while (r.at < bytes.size()) {
        uint64_t name_size = 0, dims = 0, ranges = 0;
        if (!r.get(name_size) || name_size > bytes.size() - r.at) return truncated;
        std::string name(name_size, '\0');
        r.bytes(name.data(), name_size);
        const Parameter* w = whole.find(name);
        if (!w) return "the parameters' message names `" + name + "`, which the model lacks";
        if (!r.get(dims) || dims != w->full_shape.size())
            return "the parameters' message gives `" + name + "` another shape";
        std::vector<int64_t> shape(dims);
        for (auto& d : shape)
            if (!r.get(d)) return truncated;
        if (shape != w->full_shape)
            return "the parameters' message gives `" + name + "` another shape";
        Shard shard;
        if (!r.get(shard.dim) || !r.get(ranges)) return truncated;
        if (shard.dim >= static_cast<int32_t>(dims) || shard.dim < -1 || ranges > 64 ||
            (shard.dim < 0 && ranges > 0))
            return "the parameters' message has a bad shard of `" + name + "`";
        shard.ranges.resize(ranges);
        for (auto& [b, e] : shard.ranges) {
            if (!r.get(b) || !r.get(e)) return truncated;
            if (b < 0 || e < b || e > shape[static_cast<size_t>(shard.dim)])
                return "the parameters' message has a shard outside `" + name + "`";
        }
        int64_t numel = 1;
        for (int64_t d : shard.local_shape(shape)) numel *= d;
        int64_t state_begin = 0, state_count = 0;
        if (!r.get(state_begin) || !r.get(state_count)) return truncated;
        if (state_begin < 0 || state_count < 0 || state_begin > numel ||
            state_count > numel - state_begin)
            return "the parameters' message has optimizer state outside `" + name + "`";
        uint8_t whole = 1;
        if (!r.get(whole)) return truncated;
        const size_t ns = static_cast<size_t>(state_count) * sizeof(float);
        const size_t n = whole ? static_cast<size_t>(numel) * sizeof(float) : ns;
        if (n > bytes.size() - r.at || 2 * ns > bytes.size() - r.at - n) return truncated;
        Parameter& p = part.add(name, shape, Init{}, false, 0, shard);
        p.state_begin = state_begin;
        p.m = kernels::Tensor({state_count});
        p.v = kernels::Tensor({state_count});
        if (!whole) {
            p.owned = kernels::Tensor({state_count});
            p.value = kernels::Tensor();
        }
        r.bytes((whole ? p.value : p.owned).data<float>(), n);
        for (kernels::Tensor* t : {&p.m, &p.v}) r.bytes(t->data<float>(), ns);
    }
    copy_to_whole(part, whole);
    return {};
}

int64_t Parameter::numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
}

int64_t ParameterStore::count() const {
    int64_t n = 0;
    for (const auto& p : params_) n += p.value.numel();
    return n;
}

void ParameterStore::zero_grads() {
    for (auto& p : params_) {
        if (p.grad.defined()) p.grad.fill_zero();
        if (p.grad_share.defined()) p.grad_share.fill_zero();
    }
}

} // namespace dist::models
