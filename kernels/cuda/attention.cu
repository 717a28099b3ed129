// attention.cu: causal self-attention with grouped-query heads on the GPU, forward and backward,
// in the CPU op's layout: q, out (B,T,H,D), k, v (B,T,KV,D), lse (B,H,T).
//
// One warp per row, eight rows per block, and tiles of 32 rows of the other operand staged in
// shared memory, one row per lane: lane j scores row j of the tile, and the tile's contribution
// to the warp's output row (D values spread over the lanes) is a loop over the 32 lanes'
// weights, broadcast by shuffles. Nothing of size (T,T) exists; a row's state is its running
// max, sum and output accumulator (online softmax), held in registers.
//
// Backward runs two kernels so that no two threads ever add into one element (deterministic,
// no atomics): one per query row for dq (over its keys), one per key row for dk and dv (over
// the query rows after it, in every head of its group). Both recompute the probabilities from
// the saved lse, and the second recomputes delta = dout . out for each query row it visits.
#include "kernels/cuda/ops.hpp"

#include "kernels/cuda/common.cuh"

#include <cuda_runtime.h>

#include <cmath>
#include <string>

namespace dist::kernels::cuda {

namespace {

using detail::warp_max;
using detail::warp_sum;

constexpr int warps = 8;   // rows per block, one warp each
constexpr int tile = 32;   // rows of the other operand per shared-memory tile, one per lane
constexpr int max_d = 256; // head dimension limit: each lane holds max_d / 32 accumulators
constexpr int per_lane = max_d / 32;

// Shared tiles are (tile, D + 1): lane j walking row j reads bank (j * (D + 1) + d) % 32,
// which differs for every lane. The warp's own vectors (D) are read by all lanes at once
// (a broadcast).
__host__ __device__ constexpr int64_t padded(int64_t D) {
    return D + 1;
}

/// Copies rows r0..r0+tile-1 of head `head` of x (B,T,heads,D) into s (tile, D + 1); rows past
/// T read as zero. The whole block takes part.
__device__ void load_tile(const float* x, int64_t b, int64_t T, int64_t heads, int64_t head,
                          int64_t D, int64_t r0, float* s) {
    for (int64_t idx = threadIdx.x; idx < tile * D; idx += blockDim.x) {
        int64_t r = idx / D, d = idx % D, row = r0 + r;
        s[r * padded(D) + d] = row < T ? x[((b * T + row) * heads + head) * D + d] : 0.0f;
    }
}

__device__ float dot(const float* a, const float* b, int64_t D) {
    float s = 0.0f;
    for (int64_t d = 0; d < D; ++d) s += a[d] * b[d];
    return s;
}

// grid (ceil(T / warps), H, B), block warps * 32, shared 2 tiles + warps * D floats.
__global__ void __launch_bounds__(warps * 32)
    attention_forward_kernel(const float* q, const float* k, const float* v, int64_t T, int64_t H,
                             int64_t KV, int64_t D, float scale, float* out, float* lse) {
    extern __shared__ float smem[];
    float* ks = smem;
    float* vs = ks + tile * padded(D);
    float* qs = vs + tile * padded(D);
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int64_t b = blockIdx.z, h = blockIdx.y, kvh = h / (H / KV);
    const int64_t t0 = blockIdx.x * int64_t(warps), t = t0 + warp;
    const bool has_row = t < T;
    float* qw = qs + warp * D;
    if (has_row)
        for (int64_t d = lane; d < D; d += 32) qw[d] = q[((b * T + t) * H + h) * D + d] * scale;

    float m = -INFINITY, l = 0.0f, acc[per_lane] = {};
    const int64_t last = (t0 + warps < T ? t0 + warps : T) - 1; // the block's last row
    for (int64_t j0 = 0; j0 <= last; j0 += tile) {
        __syncthreads(); // the previous tile is consumed (and qs is written, the first time)
        load_tile(k, b, T, KV, kvh, D, j0, ks);
        load_tile(v, b, T, KV, kvh, D, j0, vs);
        __syncthreads();
        if (!has_row || j0 > t) continue; // warp-uniform: whole warps skip
        const int64_t j = j0 + lane;
        const float s = j <= t ? dot(qw, ks + lane * padded(D), D) : -INFINITY;
        // Key j0 <= t is visible, so the tile's max is finite and so is mn.
        const float mn = fmaxf(m, warp_max(s));
        const float p = j <= t ? expf(s - mn) : 0.0f;
        const float corr = expf(m - mn); // 0 on the first tile (m = -inf)
        l = l * corr + warp_sum(p);
        const int rows = t - j0 + 1 < tile ? static_cast<int>(t - j0 + 1) : tile;
#pragma unroll
        for (int c = 0; c < per_lane; ++c) acc[c] *= corr;
        for (int r = 0; r < rows; ++r) {
            const float pr = __shfl_sync(0xffffffff, p, r);
            const float* vr = vs + r * padded(D);
#pragma unroll
            for (int c = 0; c < per_lane; ++c)
                if (lane + 32 * c < D) acc[c] += pr * vr[lane + 32 * c];
        }
        m = mn;
    }
    if (!has_row) return;
    const float inv = 1.0f / l;
    float* o = out + ((b * T + t) * H + h) * D;
#pragma unroll
    for (int c = 0; c < per_lane; ++c)
        if (lane + 32 * c < D) o[lane + 32 * c] = acc[c] * inv;
    if (lane == 0) lse[(b * H + h) * T + t] = m + logf(l);
}

// dq for one query row per warp: dq = sum_j ds_j k_j, ds_j = p_j (dout . v_j - delta) scale.
// grid (ceil(T / warps), H, B), shared 2 tiles + 2 * warps * D floats.
__global__ void __launch_bounds__(warps * 32)
    attention_backward_query_kernel(const float* dout, const float* q, const float* k,
                                    const float* v, const float* out, const float* lse, int64_t T,
                                    int64_t H, int64_t KV, int64_t D, float scale, float* dq) {
    extern __shared__ float smem[];
    float* ks = smem;
    float* vs = ks + tile * padded(D);
    float* qs = vs + tile * padded(D);
    float* gs = qs + warps * D;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int64_t b = blockIdx.z, h = blockIdx.y, kvh = h / (H / KV);
    const int64_t t0 = blockIdx.x * int64_t(warps), t = t0 + warp;
    const bool has_row = t < T;
    const int64_t at = ((b * T + t) * H + h) * D;
    float* qw = qs + warp * D;
    float* gw = gs + warp * D;
    float delta = 0.0f, row_lse = 0.0f;
    if (has_row) {
        float part = 0.0f;
        for (int64_t d = lane; d < D; d += 32) {
            qw[d] = q[at + d];
            gw[d] = dout[at + d];
            part += dout[at + d] * out[at + d];
        }
        delta = warp_sum(part);
        row_lse = lse[(b * H + h) * T + t];
    }

    float acc[per_lane] = {};
    const int64_t last = (t0 + warps < T ? t0 + warps : T) - 1;
    for (int64_t j0 = 0; j0 <= last; j0 += tile) {
        __syncthreads();
        load_tile(k, b, T, KV, kvh, D, j0, ks);
        load_tile(v, b, T, KV, kvh, D, j0, vs);
        __syncthreads();
        if (!has_row || j0 > t) continue;
        const int64_t j = j0 + lane;
        float ds = 0.0f;
        if (j <= t) {
            const float p = expf(scale * dot(qw, ks + lane * padded(D), D) - row_lse);
            ds = p * (dot(gw, vs + lane * padded(D), D) - delta) * scale;
        }
        const int rows = t - j0 + 1 < tile ? static_cast<int>(t - j0 + 1) : tile;
        for (int r = 0; r < rows; ++r) {
            const float dr = __shfl_sync(0xffffffff, ds, r);
            const float* kr = ks + r * padded(D);
#pragma unroll
            for (int c = 0; c < per_lane; ++c)
                if (lane + 32 * c < D) acc[c] += dr * kr[lane + 32 * c];
        }
    }
    if (!has_row) return;
#pragma unroll
    for (int c = 0; c < per_lane; ++c)
        if (lane + 32 * c < D) dq[at + lane + 32 * c] += acc[c];
}

// dk and dv for one key row per warp, over the query rows i >= s of every head of its group:
// dv = sum_i p_i dout_i, dk = sum_i ds_i q_i.
// grid (ceil(T / warps), KV, B), shared 2 tiles + 2 * warps * D + 2 * tile floats.
__global__ void __launch_bounds__(warps * 32)
    attention_backward_key_kernel(const float* dout, const float* q, const float* k, const float* v,
                                  const float* out, const float* lse, int64_t T, int64_t H,
                                  int64_t KV, int64_t D, float scale, float* dk, float* dv) {
    extern __shared__ float smem[];
    float* qt = smem;                      // (tile, D + 1) query rows
    float* gt = qt + tile * padded(D);     // (tile, D + 1) their dout rows
    float* kw_all = gt + tile * padded(D); // (warps, D) each warp's key row
    float* vw_all = kw_all + warps * D;    // (warps, D) each warp's value row
    float* lse_t = vw_all + warps * D;     // (tile) the tile rows' lse
    float* delta_t = lse_t + tile;         // (tile) the tile rows' dout . out
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int64_t b = blockIdx.z, kvh = blockIdx.y, group = H / KV;
    const int64_t s0 = blockIdx.x * int64_t(warps), s = s0 + warp;
    const bool has_row = s < T;
    const int64_t at = ((b * T + s) * KV + kvh) * D;
    float* kw = kw_all + warp * D;
    float* vw = vw_all + warp * D;
    if (has_row)
        for (int64_t d = lane; d < D; d += 32) {
            kw[d] = k[at + d];
            vw[d] = v[at + d];
        }

    float dk_acc[per_lane] = {}, dv_acc[per_lane] = {};
    for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
        for (int64_t i0 = s0; i0 < T; i0 += tile) {
            __syncthreads(); // the previous tile is consumed
            load_tile(q, b, T, H, h, D, i0, qt);
            load_tile(dout, b, T, H, h, D, i0, gt);
            __syncthreads();
            for (int r = warp; r < tile; r += warps) { // rows' lse and delta, a warp per row
                const int64_t i = i0 + r;
                float part = 0.0f;
                if (i < T) {
                    const float* o = out + ((b * T + i) * H + h) * D;
                    for (int64_t d = lane; d < D; d += 32) part += gt[r * padded(D) + d] * o[d];
                }
                part = warp_sum(part);
                if (lane == 0) {
                    delta_t[r] = part;
                    lse_t[r] = i < T ? lse[(b * H + h) * T + i] : 0.0f;
                }
            }
            __syncthreads();
            if (!has_row) continue;
            // Rows i0 + r with s <= i < T contribute; s >= s0 = the first i0, so r0 < tile.
            const int r0 = s > i0 ? static_cast<int>(s - i0) : 0;
            const int r1 = T - i0 < tile ? static_cast<int>(T - i0) : tile;
            const int64_t i = i0 + lane;
            float p = 0.0f, ds = 0.0f;
            if (i >= s && i < T) {
                p = expf(scale * dot(qt + lane * padded(D), kw, D) - lse_t[lane]);
                ds = p * (dot(gt + lane * padded(D), vw, D) - delta_t[lane]) * scale;
            }
            for (int r = r0; r < r1; ++r) {
                const float pr = __shfl_sync(0xffffffff, p, r);
                const float dr = __shfl_sync(0xffffffff, ds, r);
                const float* qr = qt + r * padded(D);
                const float* gr = gt + r * padded(D);
#pragma unroll
                for (int c = 0; c < per_lane; ++c) {
                    if (lane + 32 * c < D) {
                        dv_acc[c] += pr * gr[lane + 32 * c];
                        dk_acc[c] += dr * qr[lane + 32 * c];
                    }
                }
            }
        }
    }
    if (!has_row) return;
#pragma unroll
    for (int c = 0; c < per_lane; ++c) {
        if (lane + 32 * c < D) {
            dk[at + lane + 32 * c] += dk_acc[c];
            dv[at + lane + 32 * c] += dv_acc[c];
        }
    }
}

// The shapes the kernels handle; "" when they do.
std::string check_shape(const char* op, int64_t B, int64_t H, int64_t KV, int64_t D) {
    std::string at = std::string(op) + ": ";
    if (KV < 1 || H % KV != 0)
        return at + "query heads (" + std::to_string(H) + ") must be a multiple of key/value " +
               "heads (" + std::to_string(KV) + ")";
    if (D < 1 || D > max_d)
        return at + "head dimension " + std::to_string(D) + " is outside 1.." +
               std::to_string(max_d);
    if (B > 65535 || H > 65535) return at + "batch and heads must each be at most 65535";
    return {};
}

// Dynamic shared memory past the default 48 KiB must be asked for, kernel by kernel.
template <typename Kernel> std::string allow_shared(Kernel kernel, size_t bytes) {
    DIST_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   static_cast<int>(bytes)));
    return {};
}

} // namespace

std::string attention_forward(const float* q, const float* k, const float* v, int64_t B, int64_t T,
                              int64_t H, int64_t KV, int64_t D, float* out, float* lse) {
    if (std::string e = check_shape("attention_forward", B, H, KV, D); !e.empty()) return e;
    if (B == 0 || T == 0 || H == 0) return {};
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
    const size_t bytes = sizeof(float) * static_cast<size_t>(2 * tile * padded(D) + warps * D);
    if (std::string e = allow_shared(attention_forward_kernel, bytes); !e.empty()) return e;
    dim3 grid(static_cast<unsigned>((T + warps - 1) / warps), static_cast<unsigned>(H),
              static_cast<unsigned>(B));
    attention_forward_kernel<<<grid, warps * 32, bytes>>>(q, k, v, T, H, KV, D, scale, out, lse);
    DIST_LAUNCHED();
    return {};
}

std::string attention_backward(const float* dout, const float* q, const float* k, const float* v,
                               const float* out, const float* lse, int64_t B, int64_t T, int64_t H,
                               int64_t KV, int64_t D, float* dq, float* dk, float* dv) {
    if (std::string e = check_shape("attention_backward", B, H, KV, D); !e.empty()) return e;
    if (B == 0 || T == 0 || H == 0) return {};
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
    const unsigned row_blocks = static_cast<unsigned>((T + warps - 1) / warps);

    const size_t query_bytes =
        sizeof(float) * static_cast<size_t>(2 * tile * padded(D) + 2 * warps * D);
    if (std::string e = allow_shared(attention_backward_query_kernel, query_bytes); !e.empty())
        return e;
    dim3 query_grid(row_blocks, static_cast<unsigned>(H), static_cast<unsigned>(B));
    attention_backward_query_kernel<<<query_grid, warps * 32, query_bytes>>>(
        dout, q, k, v, out, lse, T, H, KV, D, scale, dq);
    DIST_LAUNCHED();

    const size_t key_bytes =
        sizeof(float) * static_cast<size_t>(2 * tile * padded(D) + 2 * warps * D + 2 * tile);
    if (std::string e = allow_shared(attention_backward_key_kernel, key_bytes); !e.empty())
        return e;
    dim3 key_grid(row_blocks, static_cast<unsigned>(KV), static_cast<unsigned>(B));
    attention_backward_key_kernel<<<key_grid, warps * 32, key_bytes>>>(dout, q, k, v, out, lse, T,
                                                                       H, KV, D, scale, dk, dv);
    DIST_LAUNCHED();
    return {};
}

} // namespace dist::kernels::cuda
