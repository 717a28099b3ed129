// ucx_wire.cpp: tags and tensor headers of the UCX endpoint (layout: ucx_wire.hpp).
#include "transport/ucx_wire.hpp"

#include <cstdio>
#include <cstring>
#include <new>
#include <vector>

namespace dist::transport {

namespace {

constexpr int kTagPartShift = 63, kTagSourceShift = 47, kTagDirectionShift = 46,
              kTagStageShift = 34, kTagMicrobatchShift = 20;
constexpr int64_t kMaxSource = (1 << 16) - 1, kMaxStage = (1 << 12) - 1,
                  kMaxMicrobatch = (1 << 14) - 1, kStepModulus = 1 << 20;

std::string hex(uint64_t v) {
    char buf[24];
    std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
    return buf;
}

} // namespace

uint64_t ucx_tag(int source, const P2PTag& tag, bool data_part) {
    auto refuse = [&](const std::string& field, int64_t value, int64_t max) {
        return TransportError("cannot tag " + tag.str() + " from rank " + std::to_string(source) +
                              " for UCX: " + field + " " + std::to_string(value) +
                              " is outside 0.." + std::to_string(max));
    };
    if (source < 0 || source > kMaxSource) throw refuse("rank", source, kMaxSource);
    if (tag.stage < 0 || tag.stage > kMaxStage) throw refuse("stage", tag.stage, kMaxStage);
    if (tag.microbatch < 0 || tag.microbatch > kMaxMicrobatch)
        throw refuse("microbatch", tag.microbatch, kMaxMicrobatch);
    if (tag.step < 0) throw refuse("step", tag.step, INT64_MAX);
    return (uint64_t{data_part} << kTagPartShift) |
           (static_cast<uint64_t>(source) << kTagSourceShift) |
           (uint64_t{tag.direction == Direction::gradient} << kTagDirectionShift) |
           (static_cast<uint64_t>(tag.stage) << kTagStageShift) |
           (static_cast<uint64_t>(tag.microbatch) << kTagMicrobatchShift) |
           static_cast<uint64_t>(tag.step % kStepModulus);
}

namespace ucx_wire {

Header describe(const kernels::Tensor& t, const std::string& what) {
    Header h;
    if (!t.defined()) return h;
    if (t.rank() > kMaxDims)
        throw TransportError(what + ": a tensor of rank " + std::to_string(t.rank()) +
                             " (at most " + std::to_string(kMaxDims) + " dimensions travel)");
    h.flags = kDefined;
    h.dtype = static_cast<uint8_t>(t.dtype());
    h.dims = static_cast<uint32_t>(t.rank());
    for (size_t i = 0; i < t.rank(); ++i) h.shape[i] = t.dim(i);
    h.bytes = t.bytes();
    if (h.bytes <= kUcxInlineBytes) h.flags |= kInline;
    return h;
}

Announced read(const char* message, size_t length, const std::string& what) {
    auto refuse = [&](const std::string& why) {
        return TransportError("malformed message " + what + ": " + why);
    };
    if (length < sizeof(Header))
        throw refuse(std::to_string(length) + " bytes, shorter than a header (" +
                     std::to_string(sizeof(Header)) + ")");
    Header h;
    std::memcpy(&h, message, sizeof h);
    if (h.magic != kMagic) throw refuse("bad magic " + hex(h.magic));
    if (h.version != kVersion)
        throw refuse("protocol version " + std::to_string(h.version) + ", this build speaks " +
                     std::to_string(kVersion));
    Announced out;
    if (!(h.flags & kDefined)) {
        if (length != sizeof(Header)) throw refuse("an undefined tensor with data");
        out.complete = true;
        return out;
    }
    if (h.dtype > static_cast<uint8_t>(kernels::DType::i32))
        throw refuse("unknown dtype " + std::to_string(h.dtype));
    if (h.dims > kMaxDims) throw refuse(std::to_string(h.dims) + " dimensions");
    auto dtype = static_cast<kernels::DType>(h.dtype);
    std::vector<int64_t> shape(h.shape, h.shape + h.dims);
    uint64_t numel = 1;
    for (int64_t d : shape) {
        if (d < 0) throw refuse("negative dimension " + std::to_string(d));
        if (d != 0 && numel > kMaxBytes / static_cast<uint64_t>(d))
            throw refuse("more than " + std::to_string(kMaxBytes) + " bytes");
        numel *= static_cast<uint64_t>(d);
    }
    if (numel > kMaxBytes / kernels::dtype_size(dtype))
        throw refuse("more than " + std::to_string(kMaxBytes) + " bytes");
    if (numel * kernels::dtype_size(dtype) != h.bytes)
        throw refuse("byte count " + std::to_string(h.bytes) + " does not match its shape");
    bool inline_data = h.flags & kInline;
    if (inline_data != (h.bytes <= kUcxInlineBytes))
        throw refuse(std::string(inline_data ? "inline" : "separate") + " data of " +
                     std::to_string(h.bytes) + " bytes");
    size_t expect = sizeof(Header) + (inline_data ? h.bytes : 0);
    if (length != expect)
        throw refuse(std::to_string(length) + " bytes where " + std::to_string(expect) +
                     " were expected");
    try {
        out.tensor = kernels::Tensor(std::move(shape), dtype);
    } catch (const std::bad_alloc&) {
        throw refuse("cannot allocate " + std::to_string(h.bytes) + " bytes");
    }
    if (inline_data) {
        if (h.bytes) std::memcpy(out.tensor.raw(), message + sizeof h, h.bytes);
        out.complete = true;
    }
    return out;
}

} // namespace ucx_wire
} // namespace dist::transport
