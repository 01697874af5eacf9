// attn_prep of the full-attention layers: q/k norm, RoPE, and the KV cache write (attention.cu reads them).
#include <cmath>

#include "ops/cuda/attn_prep.cuh"
#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/cuda_device.h"

namespace dfl {
namespace cuda {

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
    const int hd = a.kv.head_dim;
    const int64_t t = blockIdx.x;
    const int hh = blockIdx.y + head_off;
    const PrepConsts pc = prep_consts(a, hh);
    pdl_wait();
    const float p = (float)pos[t];  // (read with the row: its latency overlaps)
    const bool is_q = hh < a.n_head;
    const int g = hh - a.n_head;
    const float *src = is_q ? a.qf + t * a.q_pitch() + (int64_t)hh * hd * (a.gated ? 2 : 1)
                            : a.kf + t * a.k_pitch() + (int64_t)g * hd;
    const float *vsrc = is_q ? nullptr : a.vf + t * a.v_pitch() + (int64_t)g * hd;
    prep_head(a, hh, t, p, is_q ? 0 : kv_slot[t], cs, src, vsrc, pc, xs, red);
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
