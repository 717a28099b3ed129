// bf16_bits.hpp: float -> bf16 rounding as bits, one definition for the CPU's loops and the
// CUDA kernels, so that a bf16 run rounds alike on either device (CUDA's own
// __float2bfloat16_rn turns every NaN into one canonical NaN; this keeps its sign and payload).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define DIST_HOST_DEVICE __host__ __device__
#else
#define DIST_HOST_DEVICE
#endif

namespace dist::kernels {

/// The bits of the bf16 nearest to float bits `b`, in the top half of a word (ties to even; a
/// NaN keeps its sign and top payload and is made quiet). Branch-free, so the loops vectorise.
DIST_HOST_DEVICE inline uint32_t bf16_bits(uint32_t b) {
    uint32_t rounded = (b + 0x7fffu + ((b >> 16) & 1u)) & 0xffff0000u;
    uint32_t nan = ((b & 0x7fffffffu) > 0x7f800000u) ? 0xffffffffu : 0u;
    return (rounded & ~nan) | (((b | 0x00400000u) & 0xffff0000u) & nan);
}

} // namespace dist::kernels

#undef DIST_HOST_DEVICE
