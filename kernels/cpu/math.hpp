// math.hpp: exp and tanh that the compiler vectorises.
//
// std::exp and std::tanh are library calls that GCC vectorises only under fast-math, and they
// dominate the element-wise work of a training step (GELU, softmax, cross-entropy). The float
// versions here are Cephes' expf (range reduction by ln 2, a degree-6 polynomial, the exponent
// set through the bits): relative error about 2e-7, straight-line code. Doubles keep the
// library functions: the finite-difference tests run in double and want them exact.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace dist::kernels::cpu {

inline float vexp(float x) {
    x = x < -87.3f ? -87.3f : (x > 88.3f ? 88.3f : x); // keeps 2^fx a normal float
    float fx = std::floor(x * 1.44269504088896341f + 0.5f);
    x = x - fx * 0.693359375f + fx * 2.12194440e-4f;
    float y = 1.9875691500e-4f;
    y = y * x + 1.3981999507e-3f;
    y = y * x + 8.3334519073e-3f;
    y = y * x + 4.1665795894e-2f;
    y = y * x + 1.6666665459e-1f;
    y = y * x + 5.0000001201e-1f;
    y = y * x * x + x + 1.0f;
    int32_t e = (static_cast<int32_t>(fx) + 127) << 23;
    return y * std::bit_cast<float>(e);
}

inline double vexp(double x) {
    return std::exp(x);
}

/// tanh(x) = 1 - 2 / (exp(2x) + 1), exact at the extremes (exp saturates to 0 or inf-like).
inline float vtanh(float x) {
    return 1.0f - 2.0f / (vexp(2.0f * x) + 1.0f);
}

inline double vtanh(double x) {
    return std::tanh(x);
}

} // namespace dist::kernels::cpu
