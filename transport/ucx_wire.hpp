// ucx_wire.hpp: what the UCX endpoint (ucx.hpp) puts on the wire: the 64-bit tag of each
// message and the header that announces a tensor. Plain functions with no UCX type, so tests can
// feed them malformed input.
//
// A tensor travels as a header message (magic, version, dtype, shape, byte count), followed in
// the same message by the data when it has at most kUcxInlineBytes; a larger tensor follows as a
// second message, which UCX moves straight into the receiver's tensor (rendezvous, zero-copy
// where the transport allows). Host byte order: both ends run the same architecture (a
// byte-swapped peer fails the magic).
//
// The tag (bit 63 first):
//   [63]     part: 0 the header, 1 the data of a large tensor
//   [62..47] the sending rank (16 bits: ranks 0..65535)
//   [46]     direction: 0 activation, 1 gradient
//   [45..34] stage (12 bits: 0..4095)
//   [33..20] microbatch (14 bits: 0..16383)
//   [19..0]  step modulo 2^20. Only a few consecutive steps are ever in flight, so steps a
//            multiple of 2^20 apart never meet; a negative step is refused.
// The receiving rank is not in the tag: each endpoint has its own UCX worker.
#pragma once

#include "kernels/tensor.hpp"
#include "transport/p2p.hpp"

#include <cstddef>
#include <cstdint>
#include <string>

namespace dist::transport {

/// Tensors of at most this many bytes travel inside the header message (one UCX message).
inline constexpr size_t kUcxInlineBytes = 8192;

/// The UCX tag of (`source`, `tag`) for the header (`data_part` false) or the data message;
/// throws TransportError naming the field that does not fit the layout above.
uint64_t ucx_tag(int source, const P2PTag& tag, bool data_part);

namespace ucx_wire {

inline constexpr uint32_t kMagic = 0x54534944; // "DIST" in memory on a little-endian host
inline constexpr uint16_t kVersion = 1;
inline constexpr uint32_t kMaxDims = 8;
inline constexpr uint8_t kDefined = 1; // a tensor (not a default-constructed one)
inline constexpr uint8_t kInline = 2;  // its bytes follow the header in the same message
/// Headers announcing more bytes than this (1 TiB) are refused before anything is allocated.
inline constexpr uint64_t kMaxBytes = uint64_t{1} << 40;

struct Header {
    uint32_t magic = kMagic;
    uint16_t version = kVersion;
    uint8_t dtype = 0;
    uint8_t flags = 0;
    uint32_t dims = 0;
    uint32_t reserved = 0;
    int64_t shape[kMaxDims] = {};
    uint64_t bytes = 0;
};
static_assert(sizeof(Header) == 88);

/// The largest header message: a header and inline data.
inline constexpr size_t kHeaderBufferBytes = sizeof(Header) + kUcxInlineBytes;

/// The header announcing `t` (an undefined tensor too). Throws TransportError, naming the
/// message `what`, when `t` has more than kMaxDims dimensions.
Header describe(const kernels::Tensor& t, const std::string& what);

/// Whether the tensor's bytes follow in a message of their own (a defined tensor past the
/// inline limit).
inline bool data_follows(const Header& h) {
    return (h.flags & kDefined) && !(h.flags & kInline);
}

/// What a received header message announces.
struct Announced {
    kernels::Tensor tensor; // the announced shape and dtype; undefined for an undefined tensor
    bool complete = false;  // no data message follows (the data came inline and is copied)
};

/// Checks a header message of `length` bytes and allocates its tensor on the CPU. Throws
/// TransportError("malformed message <what>: <why>") for anything a sound sender never sends.
Announced read(const char* message, size_t length, const std::string& what);

} // namespace ucx_wire
} // namespace dist::transport
