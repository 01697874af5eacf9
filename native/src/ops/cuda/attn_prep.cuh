// One attention head's q/k norm, RoPE and cache write (attn_prep), by a block of attn_prep_kernel (attn_prep.cu).
#pragma once

#include <cmath>

#include "ops/cuda/cuda_common.cuh"
#include "ops/device.h"

namespace dfl {
namespace cuda {

constexpr int kPrepThreads = 128;
constexpr int kPrepPerThread = 4;  // head_dim <= 4 x kPrepThreads

// One cache row of n elements from x, converted to the cache type as quantize_row does. Called by the whole block
// (blockDim.x a multiple of 32). q8_0: one warp per 32-element block, d = amax / 127 stored as f16, q = round(x / d).
__device__ inline void store_cache_row(uint32_t type, const float *x, uint8_t *dst, int n) {
    switch (type) {
    case DFL_TYPE_F32:
        for (int i = threadIdx.x; i < n; i += blockDim.x) ((float *)dst)[i] = x[i];
        break;
    case DFL_TYPE_F16:
        for (int i = threadIdx.x; i < n; i += blockDim.x) ((uint16_t *)dst)[i] = f32_to_half_bits(x[i]);
        break;
    case DFL_TYPE_BF16:
        for (int i = threadIdx.x; i < n; i += blockDim.x) ((uint16_t *)dst)[i] = f32_to_bf16_bits(x[i]);
        break;
    case DFL_TYPE_Q8_0: {
        const int lane = threadIdx.x & 31, nw = blockDim.x >> 5;
        for (int b = threadIdx.x >> 5; b < n / QK8_0; b += nw) {
            const float v = x[b * QK8_0 + lane];
            const float amax = warp_max(fabsf(v));
            const float d = amax / 127.0f;
            const float id = d != 0.0f ? 1.0f / d : 0.0f;
            uint8_t *blk = dst + (size_t)b * kQ8_0Bytes;
            if (lane == 0) *(uint16_t *)blk = f32_to_half_bits(d);
            blk[2 + lane] = (uint8_t)(int8_t)roundf(v * id);
        }
        break;
    }
    default:
        break;
    }
}

// The norm weights and RoPE frequencies thread threadIdx.x uses for head hh (q heads below a.n_head).
struct PrepConsts {
    float nw[kPrepPerThread], fr[kPrepPerThread];
};
__device__ __forceinline__ PrepConsts prep_consts(const AttnPrep &a, int hh) {
    const int hd = a.kv.head_dim, half = a.rope_dim / 2;
    const float *norm = hh < a.n_head ? a.q_norm : a.k_norm;
    PrepConsts c;
#pragma unroll
    for (int k = 0; k < kPrepPerThread; k++) {
        const int d = threadIdx.x + k * blockDim.x;
        c.nw[k] = norm && d < hd ? __ldg(norm + d) : 1.0f;
        c.fr[k] = d < half ? __ldg(a.inv_freq + d) : 0.0f;
    }
    return c;
}

// Head hh of token t by the whole block (kPrepThreads threads): a query head (hh < a.n_head) is normalised and
// rotated into Q (its gate, the head_dim floats after it in src, copied); key head g = hh - n_head is normalised and
// rotated in place at src (a.kf's row) and written with its value row vsrc into the cache at pool row kv_row. p: the
// token's position; cs: its (cos, sin) table row or null (then computed in double from p, as the CPU does). xs:
// head_dim floats of shared memory, red: 32.
__device__ __forceinline__ void prep_head(const AttnPrep &a, int hh, int64_t t, float p, int64_t kv_row,
                                          const float2 *cs, const float *src, const float *vsrc, const PrepConsts &pc,
                                          float *xs, float *red) {
    const int hd = a.kv.head_dim, half = a.rope_dim / 2;
    const bool is_q = hh < a.n_head;
    const bool norm = is_q ? a.q_norm != nullptr : a.k_norm != nullptr;
    float ss = 0.0f;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        const float v = src[d];
        xs[d] = v;
        ss += v * v;
    }
    ss = block_sum(ss, red);
    const float r = rsqrtf(ss / (float)hd + a.eps);
#pragma unroll
    for (int k = 0; k < kPrepPerThread; k++) {
        const int d = threadIdx.x + k * blockDim.x;
        if (d < hd) xs[d] = norm ? (xs[d] * r) * pc.nw[k] : xs[d] * r;
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < kPrepPerThread; k++) {
        const int i = threadIdx.x + k * blockDim.x;
        if (i >= half) break;
        float c, s;
        if (cs) {
            const float2 v = cs[t * half + i];
            c = v.x, s = v.y;
        } else {
            const float ang = p * pc.fr[k];
            // double cos/sin of the f32 angle as the CPU does: positions reach 1e5+ rad, where the fast intrinsics drift
            c = (float)cos((double)ang), s = (float)sin((double)ang);
        }
        const float x0 = xs[i], x1 = xs[i + half];
        xs[i] = x0 * c - x1 * s;
        xs[i + half] = x1 * c + x0 * s;
    }
    __syncthreads();
    if (is_q) {
        const int64_t qd = (int64_t)a.n_head * hd;
        float *dst = a.Q + t * qd + (int64_t)hh * hd;
        for (int d = threadIdx.x; d < hd; d += blockDim.x) dst[d] = xs[d];
        if (a.gated) {
            float *gd = a.gate + t * qd + (int64_t)hh * hd;
            for (int d = threadIdx.x; d < hd; d += blockDim.x) gd[d] = src[hd + d];
        }
        return;
    }
    const int g = hh - a.n_head;
    float *kdst = (float *)src;  // (a.kf's row: normalised and rotated in place)
    for (int d = threadIdx.x; d < hd; d += blockDim.x) kdst[d] = xs[d];
    const uint64_t prow = (uint64_t)kv_row * a.kv.n_kv + g;
    store_cache_row(a.kv.type_k, xs, a.kv.k + prow * a.kv.k_row, hd);
    store_cache_row(a.kv.type_v, vsrc, a.kv.v + prow * a.kv.v_row, hd);
}

}  // namespace cuda
}  // namespace dfl
