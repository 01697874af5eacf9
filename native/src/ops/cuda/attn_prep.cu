// attn_prep of the full-attention layers: q/k norm, RoPE, and the KV cache write (attention.cu reads them).
#include <cmath>

#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/cuda_device.h"

namespace dfl {
namespace cuda {

constexpr int kPrepThreads = 128;

// One cache row of n elements from x, converted to the cache type as quantize_row does. Called by the whole block
// (blockDim.x a multiple of 32). q8_0: one warp per 32-element block, d = amax / 127 stored as f16, q = round(x / d).
__device__ void store_cache_row(uint32_t type, const float *x, uint8_t *dst, int n) {
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

constexpr int kPrepPerThread = 4;  // head_dim <= 4 x kPrepThreads

// Block (t, h): h < n_head normalises and rotates query head h of token t into Q (and copies its gate); h >= n_head
// does key head h - n_head in place in kf and writes that head's K and V rows into the cache at pool row kv_slot[t].
// head_off (n_head when there is no qf, else 0) is added to blockIdx.y, so a K/V-only call launches only key heads.
// The norm weights and RoPE frequencies are constant: each thread loads its own before the wait for the product
// before (launch_chain), where reading them after the reduction cost the one-block-per-head kernel a memory round
// trip (ncu: 4.9 us a call alone, 36 a qwen3-8b decode step).
// Batches of at least this many tokens (prefill) take their RoPE cosines and sines from a table made once per call
// (rope_table_kernel): every head of a token rotates by the same angles, and the double-precision cos and sin cost
// qwen3-8b 35 us a layer of a 512-token prefill when each of the 40 heads' blocks computed them (ncu, 12-03 23:06).
constexpr int64_t kRopeTableMinTokens = 64;

// cs[t * half + i] = (cos, sin) of pos[t] * inv_freq[i], in double as attn_prep_kernel computes them.
__global__ void rope_table_kernel(const int32_t *pos, const float *inv_freq, int half, int64_t T, float2 *cs) {
    const int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= T * half) return;
    const float ang = (float)pos[k / half] * inv_freq[k % half];
    cs[k] = make_float2((float)cos((double)ang), (float)sin((double)ang));
}

__global__ void attn_prep_kernel(AttnPrep a, const int32_t *pos, const int32_t *kv_slot, int head_off,
                                 const float2 *cs) {
    pdl_trigger();  // small grids: what follows may launch at once and wait (launch_chain)
    extern __shared__ float xs[];  // [head_dim]
    __shared__ float red[32];
    const int hd = a.kv.head_dim, n_kv = a.kv.n_kv, half = a.rope_dim / 2;
    const int64_t t = blockIdx.x;
    const int hh = blockIdx.y + head_off;
    const bool is_q = hh < a.n_head;
    const float *norm = is_q ? a.q_norm : a.k_norm;
    float nw[kPrepPerThread], fr[kPrepPerThread];
#pragma unroll
    for (int k = 0; k < kPrepPerThread; k++) {
        const int d = threadIdx.x + k * blockDim.x;
        nw[k] = norm && d < hd ? __ldg(norm + d) : 1.0f;
        fr[k] = d < half ? __ldg(a.inv_freq + d) : 0.0f;
    }
    pdl_wait();
    const float p = (float)pos[t];  // (read with the row: its latency overlaps)
    const int64_t qs = a.q_pitch(), ks = a.k_pitch(), vs = a.v_pitch();
    const float *src = is_q ? a.qf + t * qs + (int64_t)hh * hd * (a.gated ? 2 : 1)
                            : a.kf + t * ks + (int64_t)(hh - a.n_head) * hd;
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
        if (d < hd) xs[d] = norm ? (xs[d] * r) * nw[k] : xs[d] * r;
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
            const float ang = p * fr[k];
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
    float *kdst = a.kf + t * ks + (int64_t)g * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) kdst[d] = xs[d];
    const uint64_t prow = (uint64_t)kv_slot[t] * n_kv + g;
    store_cache_row(a.kv.type_k, xs, a.kv.k + prow * a.kv.k_row, hd);
    store_cache_row(a.kv.type_v, a.vf + t * vs + (int64_t)g * hd, a.kv.v + prow * a.kv.v_row, hd);
}

void launch_attn_prep(CudaDevice &dev, const BatchMeta &m, const AttnPrep &a) {
    cudaStream_t s = dev.stream();
    if (m.T <= 0) return;
    if (a.kv.head_dim > kPrepPerThread * kPrepThreads)
        fail(DFL_ERR_UNSUPPORTED, "attn_prep: head_dim " + std::to_string(a.kv.head_dim) + " above " +
                                      std::to_string(kPrepPerThread * kPrepThreads));
    if (a.rope_dim > a.kv.head_dim)
        fail(DFL_ERR_INVALID, "attn_prep: rope_dim " + std::to_string(a.rope_dim) + " above head_dim " +
                                  std::to_string(a.kv.head_dim));
    // without qf only the key heads run: blocks y = 0..n_kv-1 map to heads n_head.. (see head_off)
    const int n_q = a.qf ? a.n_head : 0;
    const dim3 grid((unsigned)m.T, (unsigned)(n_q + a.kv.n_kv));
    float2 *cs = nullptr;
    const int half = a.rope_dim / 2;
    if (m.T >= kRopeTableMinTokens && half > 0) {
        cs = (float2 *)dev.scratch((size_t)(m.T * half) * sizeof(float2));
        rope_table_kernel<<<grid_for(m.T * half, 256), 256, 0, s>>>(m.pos, a.inv_freq, half, m.T, cs);
        check_launch("attn_prep (rope table)");
    }
    launch_chain(attn_prep_kernel, grid, dim3(kPrepThreads), (size_t)a.kv.head_dim * sizeof(float), s, a, m.pos,
                 m.kv_slot, (int)(a.n_head - n_q), (const float2 *)cs);
    check_launch("attn_prep");
}

}  // namespace cuda
}  // namespace dfl
