// What attn_prep_kernel (attn_prep.cu) and the decode attention that does its work itself (attention.cu,
// DFL_CUDA_ATTN_PREP_FUSED) share, so that both write the same bits: a head row's q/k norm and RoPE, and a cache row's
// store.
#pragma once

#include <cmath>

#include "ops/cuda/cuda_common.cuh"

namespace dfl {
namespace cuda {

constexpr int kPrepThreads = 128;
constexpr int kPrepPerThread = 4;  // head_dim <= 4 x kPrepThreads

// One cache row of n elements from x, converted to the cache type as quantize_row does. Called by the whole block
// (blockDim.x a multiple of 32). q8_0: one warp per 32-element block, d = amax / 127 stored as f16, q = round(x / d).
__device__ __forceinline__ void store_cache_row(uint32_t type, const float *x, uint8_t *dst, int n) {
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

// The RoPE cosines and sines of this thread's pair indices i = threadIdx.x + k blockDim.x below half, for position p
// (pair i's frequency fr[k]): double cos / sin of the f32 angle as the CPU does (positions reach 1e5+ rad, where the
// fast intrinsics drift).
__device__ __forceinline__ void rope_cs(float p, int half, const float (&fr)[kPrepPerThread], float (&c)[kPrepPerThread],
                                        float (&s)[kPrepPerThread]) {
#pragma unroll
    for (int k = 0; k < kPrepPerThread; k++) {
        c[k] = 1.0f;
        s[k] = 0.0f;
        if ((int)threadIdx.x + k * (int)blockDim.x < half) {
            const float ang = p * fr[k];
            c[k] = (float)cos((double)ang);
            s[k] = (float)sin((double)ang);
        }
    }
}

// NH head rows of one token, row h at xs + h hd in shared memory (each thread's elements d = threadIdx.x + k blockDim.x
// written by itself), normalised in place (RMSNorm over the row with eps; weighted by nw[0] for rows below n_q where
// wq, by nw[1] for the others where wk) and their first 2 half dims rotated by (c, s). A block of kPrepThreads threads;
// red: NH x 32 floats of shared memory. Each row's arithmetic is block_sum's and attn_prep_kernel's own, in the same
// order whatever NH is, so a block doing several rows at once (one barrier for all their sums) writes the same bits
// as one doing one.
template <int NH>
__device__ __forceinline__ void prep_rows(float *xs, int hd, int half, float eps, int n_q,
                                          const float (&nw)[2][kPrepPerThread], bool wq, bool wk,
                                          const float (&c)[kPrepPerThread], const float (&s)[kPrepPerThread],
                                          float (*red)[32]) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    float ss[NH];
#pragma unroll
    for (int h = 0; h < NH; h++) {
        ss[h] = 0.0f;
        for (int d = threadIdx.x; d < hd; d += blockDim.x) {
            const float v = xs[h * hd + d];
            ss[h] += v * v;
        }
        ss[h] = warp_sum(ss[h]);
        if (lane == 0) red[h][w] = ss[h];
    }
    __syncthreads();
#pragma unroll
    for (int h = 0; h < NH; h++) {
        const float t = lane < nwarps ? red[h][lane] : 0.0f;
        const float r = rsqrtf(warp_sum(t) / (float)hd + eps);
        const bool q = h < n_q, weighted = q ? wq : wk;
#pragma unroll
        for (int k = 0; k < kPrepPerThread; k++) {
            const int d = threadIdx.x + k * blockDim.x;
            if (d < hd) xs[h * hd + d] = weighted ? (xs[h * hd + d] * r) * (q ? nw[0][k] : nw[1][k]) : xs[h * hd + d] * r;
        }
    }
    __syncthreads();
#pragma unroll
    for (int h = 0; h < NH; h++)
#pragma unroll
        for (int k = 0; k < kPrepPerThread; k++) {
            const int i = threadIdx.x + k * blockDim.x;
            if (i >= half) break;
            const float x0 = xs[h * hd + i], x1 = xs[h * hd + i + half];
            xs[h * hd + i] = x0 * c[k] - x1 * s[k];
            xs[h * hd + i + half] = x1 * c[k] + x0 * s[k];
        }
    __syncthreads();
}

}  // namespace cuda
}  // namespace dfl
