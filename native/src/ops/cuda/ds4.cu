// DeepSeek V4 ops on the GPU (device.h, "DeepSeek V4"): the hyper-connection pre / post / head, the tail RoPE, the
// window ring write and the sink attention over the ring and the compressed rows. The compressors and the indexer are
// in ds4_compress.cu, the MoE in ds4_moe.cu. Every kernel computes what ops/cpu/ds4_ops.cpp computes, in f32, mostly
// in the same order of operations; these files are built without FMA contraction (cuda.mk) so that element-wise
// arithmetic rounds as the CPU's (-ffp-contract=off) does.
#include <algorithm>
#include <mutex>
#include <set>
#include <utility>

#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/cuda_device.h"
#include "ops/cuda/ds4_common.cuh"
#include "ops/cuda/norm_store.cuh"

namespace dfl {
namespace cuda {

constexpr int kDs4Threads = 128;

bool ds4_chain_on() {
    static const bool on = env_switch("DFL_CUDA_DS4_CHAIN", false);
    return on;
}

// ---- hyper-connections ----------------------------------------------------------------------------------------------

// Sinkhorn projection of one n x n matrix (n * n <= 32), the CPU's ds4_sinkhorn step for step: lane a * n + b of the
// calling warp holds c[a][b] in v and gets the result. Every sum is taken in the CPU's order (each lane adds its row's
// or column's values itself, from lane 0 of the row or column on), so the result is the serial one bit for bit.
__device__ float sinkhorn_warp(float v, int n, int iters, float eps) {
    const int lane = threadIdx.x & 31, a = lane / n, b = lane % n;
    auto row_sum = [&](float x) {
        float sum = 0.0f;
        for (int j = 0; j < n; j++) sum += __shfl_sync(0xffffffffu, x, (a * n + j) & 31);
        return sum;
    };
    auto col_sum = [&](float x) {
        float sum = 0.0f;
        for (int i = 0; i < n; i++) sum += __shfl_sync(0xffffffffu, x, (i * n + b) & 31);
        return sum;
    };
    float mx = __shfl_sync(0xffffffffu, v, (a * n) & 31);
    for (int j = 1; j < n; j++) mx = fmaxf(mx, __shfl_sync(0xffffffffu, v, (a * n + j) & 31));
    const float e = expf(v - mx);
    v = e / row_sum(e) + eps;
    // the first column normalisation always runs (iters <= 1 included), as on the CPU
    for (int it = 0; it < (iters > 1 ? iters : 1); it++) {
        if (it > 0) v = v / (row_sum(v) + eps);
        v = v / (col_sum(v) + eps);
    }
    return v;
}

// The block weights one token's N streams X [N][D] into y [D] over channels [d0, d1), summing in stream order as the
// CPU reference does.
__device__ void mix_streams_block(const float *weight, const float *X, int N, int64_t D, int64_t d0, int64_t d1,
                                  float *y) {
    for (int64_t d = d0 + threadIdx.x; d < d1; d += blockDim.x) {
        float s = 0.0f;
        for (int i = 0; i < N; i++) s += weight[i] * X[i * D + d];
        y[d] = s;
    }
}

constexpr int64_t kHcChunk = 1024;  // channels a block of hc_pre / hc_head mixes

// hc_post_mix's parts hold at most this many sums a token and part: the (2 + N) * N mixing entries of N <= 4 streams
// and the sum of squares.
constexpr int kHcPartRow = 25;

// A token's mixing product where hc_post_mix left it as parts (HcPreCall::parts): thread i < M + 1 adds column i of
// the parts in part order into mix_sh; returns the norm's scale from column M (every thread, after a barrier).
__device__ float hc_sum_parts(const HcPreCall &c, int64_t t, int M, float *mix_sh) {
    if ((int)threadIdx.x <= M) {
        const float *col = c.parts + t * c.n_parts * (M + 1) + threadIdx.x;
        float s = 0.0f;
        for (int p = 0; p < c.n_parts; p++) s += col[(int64_t)p * (M + 1)];
        mix_sh[threadIdx.x] = s;
    }
    __syncthreads();
    return rsqrtf(mix_sh[M] / (float)((int64_t)c.N * c.D) + c.norm_eps);
}

// The folded norm's scale of token t's streams (HcPreCall::norm): the first 256 threads (or the block's, if fewer)
// sum the squares of its N * D values, four 16-byte loads in flight a thread (loaded one at a time, each waiting for
// the one before, the 64 KB took ~28 us a call: the 12-05 05:1x profile). A wider block's other threads add zeros, so
// its sum is hc_pre_kernel's (256 threads) bit for bit.
__device__ float hc_fold_scale(const HcPreCall &c, int64_t t, float *red) {
    const int64_t n = (int64_t)c.N * c.D;
    const float *X = c.X + t * n;
    const int nt = blockDim.x < 256 ? (int)blockDim.x : 256;
    float ss = 0.0f;
    if ((int)threadIdx.x < nt) {
        if (n % 4 == 0 && ((uintptr_t)X & 15) == 0) {
            const float4 *X4 = (const float4 *)X;
#pragma unroll 4
            for (int64_t i = threadIdx.x; i < n / 4; i += nt) {
                const float4 v = X4[i];
                ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
            }
        } else {
            for (int64_t i = threadIdx.x; i < n; i += nt) ss += X[i] * X[i];
        }
    }
    ss = block_sum(ss, red);
    return rsqrtf(ss / (float)n + c.norm_eps);
}

// pre (N sigmoids) into shared memory from the token's mixing row scaled by r; then warp 0 stores post and comb
// (Sinkhorn one lane per entry) while the other warps go on.
__device__ void hc_pre_weights(const HcPreCall &c, int64_t t, const float *mix, float r, bool store, float *pre) {
    const int N = c.N;
    if ((int)threadIdx.x < N) pre[threadIdx.x] = sigmoid_f(mix[threadIdx.x] * r * c.scale[0] + c.base[threadIdx.x]) + c.eps;
    __syncthreads();
    if (store && threadIdx.x < 32) {  // the whole warp: sinkhorn_warp shuffles across it
        const int lane = threadIdx.x;
        if (lane < N) c.post[t * N + lane] = 2.0f * sigmoid_f(mix[N + lane] * r * c.scale[1] + c.base[N + lane]);
        const int k = lane < N * N ? lane : 0;
        const float v = sinkhorn_warp(mix[2 * N + k] * r * c.scale[2] + c.base[2 * N + k], N, c.iters, c.eps);
        if (lane < N * N) c.comb[t * N * N + lane] = v;
    }
}

// hc_pre_weights of token t from its mixing row, or from the parts' sums, scaled by the streams' norm where c.norm.
__device__ void hc_pre_begin(const HcPreCall &c, int64_t t, bool store, float *pre, float *red, float *mix_sh) {
    const int M = (2 + c.N) * c.N;
    float r = 1.0f;
    if (c.parts)
        r = hc_sum_parts(c, t, M, mix_sh);
    else if (c.norm)
        r = hc_fold_scale(c, t, red);
    hc_pre_weights(c, t, c.parts ? mix_sh : c.mix + t * M, r, store, pre);
}

// Block (token, chunk of kHcChunk channels): the first lanes derive pre, which every chunk mixes its channels with;
// chunk 0's warp 0 then derives post and comb while its other warps mix: the other chunks need neither, so no block
// waits for Sinkhorn's iterations before mixing (every block ran them, all warps waiting, before the 12-05 change).
// With norm, every block first takes the token's RMSNorm scale: from the streams (64 KB for V4: from L2 after the
// first block), or from the parts' sum of squares.
__global__ void hc_pre_kernel(HcPreCall c) {
    pdl_trigger();  // the next chained launch may start (launch_ds4)
    pdl_wait();     // everything below reads what the launch before wrote
    __shared__ float pre[kDs4MaxHc];
    __shared__ float red[32];
    __shared__ float mix_sh[kHcPartRow];
    const int64_t t = blockIdx.x;
    const int N = c.N;
    hc_pre_begin(c, t, blockIdx.y == 0, pre, red, mix_sh);
    const int64_t d0 = (int64_t)blockIdx.y * kHcChunk, d1 = d0 + kHcChunk < c.D ? d0 + kHcChunk : c.D;
    mix_streams_block(pre, c.X + t * N * c.D, N, c.D, d0, d1, c.x + t * c.D);
}

// hc_pre and the sub-block's RMSNorm in one block a token (Device::hc_pre_norm): hc_pre_kernel's pre, post and comb,
// the token's x mixed channel by channel into registers as rmsnorm_regs_kernel holds a row (channel i + k x
// blockDim, blockDim norm_threads(D)), so its sum of squares, scale and y = (x r) w with the staged quantization are
// that kernel's bit for bit: two launches a site become one.
constexpr int kHcNormRegs = 8;

__global__ void __launch_bounds__(1024) hc_pre_norm_kernel(HcPreCall c, const float *w, float eps, float *y,
                                                           CudaDevice::QuantX q) {
    pdl_trigger();  // a following launch_pdl product may start loading its weights
    pdl_wait();     // (launch_chain)
    __shared__ float pre[kDs4MaxHc];
    __shared__ float red[32];
    __shared__ float mix_sh[kHcPartRow];
    const int64_t t = blockIdx.x;
    const int N = c.N;
    const int64_t D = c.D;
    hc_pre_begin(c, t, true, pre, red, mix_sh);
    const float *X = c.X + t * N * D;
    float v[kHcNormRegs];
    const float ss = load_row_regs(v, D, [&](int d) {
        float s = 0.0f;  // mix_streams_block's sum
        for (int i = 0; i < N; i++) s += pre[i] * X[i * D + d];
        c.x[t * D + d] = s;
        return s;
    });
    store_normed_regs<kHcNormRegs>(v, ss, D, eps, w != nullptr, [&](int, int d) { return __ldg(w + d); }, y + t * D, q, red);
}

// The sub-block output F of token t at channel d: F (+ F2), or the routed pairs weighted in choice order as
// moe_combine_kernel adds them (HcPostCall::pairs), + F2.
__device__ __forceinline__ float hc_post_f(const HcPostCall &c, int64_t t, int64_t d) {
    const float f = c.pairs ? combine_pairs(c.pairs, nullptr, c.pair_w, c.k, t, c.D, d) : c.F[t * c.D + d];
    return c.F2 ? f + c.F2[t * c.D + d] : f;
}

// One thread per output element (token, stream b, channel d).
__global__ void hc_post_kernel(HcPostCall c) {
    pdl_trigger();  // the next chained launch may start (launch_ds4)
    pdl_wait();     // everything below reads what the launch before wrote
    const int N = c.N;
    const int64_t total = c.T * N * c.D;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = e / (N * c.D), d = e % c.D;
        const int b = (int)((e / c.D) % N);
        const float *X = c.X + t * N * c.D, *comb = c.comb + t * N * N;
        float s = 0.0f;
        for (int a = 0; a < N; a++) s += comb[a * N + b] * X[a * c.D + d];
        c.out[e] = c.post[t * N + b] * hc_post_f(c, t, d) + s;
    }
}

// hc_post of token blockIdx.x over a part of the channels (blockIdx.y), every stream of them, and the next site's
// mixing product over the same values: each thread a channel at a time, its N outputs (hc_post_kernel's floats)
// multiplied by the M rows' N weights of that channel, the block's M sums and sum of squares into the token's part
// row (Device::hc_post_mix). The mixing matrix (24 x 16,384 f16 for V4, 786 KB) is read once a token, a part a block.
constexpr int kHcMixN = 4, kHcMixM = (2 + kHcMixN) * kHcMixN;
constexpr int kHcPostMixThreads = 256;

template <class WT>
__device__ __forceinline__ float hc_weight(const WT *p) {
    if constexpr (sizeof(WT) == 2)
        return half_bits_to_f32(__ldg((const unsigned short *)p));
    else
        return __ldg(p);
}

template <class WT>
__global__ void __launch_bounds__(kHcPostMixThreads) hc_post_mix_kernel(HcPostCall c, const WT *fn, int64_t fn_stride,
                                                                        int64_t chunk, float *parts) {
    pdl_trigger();  // the next chained launch may start (launch_ds4)
    pdl_wait();     // everything below reads what the launch before wrote
    constexpr int N = kHcMixN, M = kHcMixM;
    __shared__ float red[M + 1][kHcPostMixThreads / 32];
    const int64_t t = blockIdx.x, D = c.D;
    const int64_t d0 = (int64_t)blockIdx.y * chunk, d1 = d0 + chunk < D ? d0 + chunk : D;
    const float *X = c.X + t * N * D, *comb = c.comb + t * N * N, *post = c.post + t * N;
    float *out = c.out + t * N * D;
    float acc[M + 1];
#pragma unroll
    for (int i = 0; i <= M; i++) acc[i] = 0.0f;
    for (int64_t d = d0 + threadIdx.x; d < d1; d += blockDim.x) {
        const float f = hc_post_f(c, t, d);
        float xa[N];
#pragma unroll
        for (int a = 0; a < N; a++) xa[a] = X[a * D + d];
#pragma unroll
        for (int b = 0; b < N; b++) {
            float s = 0.0f;
#pragma unroll
            for (int a = 0; a < N; a++) s += comb[a * N + b] * xa[a];
            const float o = post[b] * f + s;
            out[b * D + d] = o;
            acc[M] += o * o;
#pragma unroll
            for (int i = 0; i < M; i++) acc[i] += hc_weight(fn + i * fn_stride + b * D + d) * o;
        }
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int i = 0; i <= M; i++) {
        const float v = warp_sum(acc[i]);
        if (lane == 0) red[i][warp] = v;
    }
    __syncthreads();
    if (threadIdx.x <= M) {
        float s = 0.0f;
        for (int w = 0; w < kHcPostMixThreads / 32; w++) s += red[threadIdx.x][w];
        parts[(t * gridDim.y + blockIdx.y) * (M + 1) + threadIdx.x] = s;
    }
}

__global__ void hc_head_kernel(HcHeadCall c) {
    pdl_trigger();  // the next chained launch may start (launch_ds4)
    pdl_wait();     // everything below reads what the launch before wrote
    __shared__ float a[kDs4MaxHc];
    const int64_t t = blockIdx.x;
    const int N = c.N;
    if (threadIdx.x < N) a[threadIdx.x] = sigmoid_f(c.mix[t * N + threadIdx.x] * c.scale[0] + c.base[threadIdx.x]) + c.eps;
    __syncthreads();
    const int64_t d0 = (int64_t)blockIdx.y * kHcChunk, d1 = d0 + kHcChunk < c.D ? d0 + kHcChunk : c.D;
    mix_streams_block(a, c.X + t * N * c.D, N, c.D, d0, d1, c.y + t * c.D);
}

// ---- RoPE -----------------------------------------------------------------------------------------------------------

// One thread per (row, head, rotated pair).
__global__ void rope_tail_kernel(RopeTailCall c) {
    pdl_trigger();  // the next chained launch may start (launch_ds4)
    pdl_wait();     // everything below reads what the launch before wrote
    const int half = c.rope_dim / 2;
    const int64_t total = c.rows * c.n_head * half;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = e / ((int64_t)c.n_head * half);
        const int h = (int)((e / half) % c.n_head), i = (int)(e % half);
        const double pos = c.inverse ? -(double)c.pos[r] : (double)c.pos[r];
        float *x = c.x + r * c.row_stride + (int64_t)h * c.head_dim + c.head_dim - c.rope_dim;
        rotate_pair(x + 2 * i, pos, c.inv_freq[i]);
    }
}

// The block rotates the trailing rope_dim values of one head row x (head_dim wide) by pos, a thread a pair, as
// rope_tail_kernel does.
__device__ __forceinline__ void rotate_tail_block(float *x, int head_dim, int rope_dim, double pos, const float *inv_freq) {
    for (int i = threadIdx.x; i < rope_dim / 2; i += blockDim.x) rotate_pair(x + head_dim - rope_dim + 2 * i, pos, inv_freq[i]);
}

// Block per head row (token row / n_head, head row % n_head): the row's RMSNorm (weight w or none) as rmsnorm's
// kernel sums it, one element in four a thread, written in place; then its tail's pairs rotated as rope_tail_kernel
// does (Device::norm_rope_tail). head_dim at most kNormRopeRegs x the block (up to 1024 threads).
constexpr int kNormRopeRegs = 8;

__global__ void norm_rope_tail_kernel(const float *w, float eps, RopeTailCall c) {
    pdl_trigger();  // the next chained launch may start (launch_ds4)
    pdl_wait();     // everything below reads what the launch before wrote
    __shared__ float red[32];
    const int64_t row = blockIdx.x / c.n_head;
    const int n = c.head_dim;
    float *x = c.x + row * c.row_stride + (int64_t)(blockIdx.x % c.n_head) * n;
    float v[kNormRopeRegs];
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < kNormRopeRegs; k++) {
        const int i = (int)threadIdx.x + k * (int)blockDim.x;
        v[k] = i < n ? x[i] : 0.0f;
        ss += v[k] * v[k];
    }
    ss = block_sum(ss, red);
    const float r = rsqrtf(ss / (float)n + eps);
#pragma unroll
    for (int k = 0; k < kNormRopeRegs; k++) {
        const int i = (int)threadIdx.x + k * (int)blockDim.x;
        if (i < n) x[i] = w ? (v[k] * r) * w[i] : v[k] * r;
    }
    __syncthreads();  // the pairs' two values come from different threads
    const double pos = c.inverse ? -(double)c.pos[row] : (double)c.pos[row];
    rotate_tail_block(x, n, c.rope_dim, pos, c.inv_freq);
}

// ---- window ring ----------------------------------------------------------------------------------------------------

// Block (entry, i): the entry's i-th of its last min(n, window) tokens goes to ring row position % window.
__global__ void ring_write_kernel(BatchMeta m, Ds4RingWrite c) {
    pdl_trigger();  // the next chained launch may start (launch_ds4)
    pdl_wait();     // everything below reads what the launch before wrote
    const int32_t e = blockIdx.x;
    const int64_t n = m.n[e], cnt = n < c.window ? n : c.window;
    if ((int64_t)blockIdx.y >= cnt) return;
    const int64_t i = n - cnt + blockIdx.y;
    const float *src = c.kv + ((int64_t)m.t0[e] + i) * c.head_dim;
    float *dst = c.ring + (int64_t)m.slot[e] * c.slot_stride + (((int64_t)m.len0[e] + i) % c.window) * c.head_dim;
    for (int d = threadIdx.x; d < c.head_dim; d += blockDim.x) dst[d] = src[d];
}

// ---- sink attention -------------------------------------------------------------------------------------------------

constexpr int kAttnTile = 32;                       // keys whose logits a block holds at once
constexpr int kAttnMaxDimsPerThread = 8;            // head_dim <= 8 * kDs4Threads
constexpr int kAttnMaxHeadDim = kAttnMaxDimsPerThread * kDs4Threads;

// Key j of token t (at cache position p of entry e) of a Ds4AttnCall, in the CPU's order: the window rows lo..p, then
// the compressed rows (selected or all). Null for a padded (-1) selection slot.
__device__ const float *attn_key(const BatchMeta &m, const Ds4AttnCall &c, int64_t t, int32_t e, int64_t p, int64_t lo,
                                 int64_t n_win, int64_t j) {
    const int hd = c.head_dim;
    if (j < n_win) {
        const int64_t q = lo + j, len0 = m.len0[e];
        if (q < len0) return c.ring + (int64_t)m.slot[e] * c.slot_stride + (q % c.window) * hd;
        return c.kv + ((int64_t)m.t0[e] + q - len0) * hd;
    }
    int64_t w = j - n_win;
    if (c.sel) {
        w = c.sel[t * c.top_k + w];
        if (w < 0) return nullptr;
    }
    const int32_t *blocks = m.block_table + (int64_t)e * m.max_blocks;
    return c.comp + ds4_comp_row(blocks, w, c.ratio, c.block_size, c.rows_per_block) * hd;
}

// The end of a (token, head) block: its output row in shared memory (row, head_dim floats, complete), with FOLD the
// call's un-rotation of it (a thread a pair) and, from head 0, the token's ring write; stored with its int8
// quantization where oq.xq is set (for the grouped product after: a warp's lanes hold 32 consecutive dims, head_dim
// % 32 == 0).
template <bool FOLD>
__device__ void attn_finish(const BatchMeta &m, const Ds4AttnCall &c, const CudaDevice::QuantX &oq, int64_t t, int h,
                            float *row) {
    const int hd = c.head_dim;
    __syncthreads();  // the row is complete
    if (FOLD && c.unrotate) {
        rotate_tail_block(row, hd, c.rope_dim, -(double)m.pos[t], c.unrotate);
        __syncthreads();
    }
    const int64_t qo = (t * c.n_head + h) * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        const float v = row[d];
        c.out[qo + d] = v;
        if (oq.xq) quant_q8_warp(v, oq.xq + qo + d, oq.xs + (qo + d) / 32, oq.xsum + (qo + d) / 32);
    }
    if (FOLD && c.ring_write && h == 0) {  // one token an entry (the plan's condition): its row goes to p % window
        const int32_t e = m.ent[t];
        const int64_t p = (int64_t)m.len0[e] + (t - m.t0[e]);
        const float *src = c.kv + t * hd;
        float *dst = c.ring + (int64_t)m.slot[e] * c.slot_stride + (p % c.window) * hd;
        for (int d = threadIdx.x; d < hd; d += blockDim.x) dst[d] = src[d];
    }
}

// Block (token, head), online softmax over tiles of keys: the running max starts at the sink's logit and the running
// denominator at exp(0) = 1 for it, which is the CPU's exp(sink - mx) term once rescaled. Each thread owns the output
// dims d = threadIdx.x + k * blockDim.x. FOLD: the call's unrotate and ring_write here (the output row goes through
// shared memory, where a thread a pair rotates its tail as rope_tail_kernel does; block (t, 0) copies the token's kv
// row to the ring), where the launcher would run rope_tail_kernel and ring_write_kernel after it. SMEM: each tile's
// key rows are copied into shared memory once and both the scores and the value sums read them there, where each read
// them from L2 (K = V: every row was read twice, and the 64 heads of a token read the same rows: ~170 MB of L2 reads a
// V4 layer at batch 1); the same floats in the same order, so the same output bits.
// SPLIT: block (t, h, s) of gridDim.z runs the s-th of gridDim.z equal runs of the key tiles, the sink only in the
// first, and leaves its running max, denominator and unnormalised sums in parts [t][h][s][2 + head_dim]
// (ds4_attention_combine_kernel finishes): a decode step's 64 (token, head) blocks are half of the SMs.
template <bool FOLD, bool SMEM, bool SPLIT>
__global__ void __launch_bounds__(kDs4Threads) ds4_attention_kernel(BatchMeta m, Ds4AttnCall c, CudaDevice::QuantX oq,
                                                                      float *parts) {
    pdl_trigger();  // the next chained launch may start (launch_ds4)
    pdl_wait();     // everything below reads what the launch before wrote
    extern __shared__ float q_sh[];  // [head_dim], then with SMEM the tile's rows [kAttnTile][head_dim]
    __shared__ float l_sh[kAttnTile];
    __shared__ const float *k_sh[kAttnTile];
    const int64_t t = blockIdx.x;
    const int h = blockIdx.y, hd = c.head_dim;
    const int32_t e = m.ent[t];
    const int64_t len0 = m.len0[e], p = len0 + (t - m.t0[e]);
    const int64_t lo = p - c.window + 1 > 0 ? p - c.window + 1 : 0, n_win = p - lo + 1;
    const int64_t n_comp = c.comp ? (c.sel ? c.top_k : (p + 1) / c.ratio) : 0, nk = n_win + n_comp;
    const float *q = c.Q + (t * c.n_head + h) * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) q_sh[d] = q[d];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    float acc[kAttnMaxDimsPerThread];
#pragma unroll
    for (int k = 0; k < kAttnMaxDimsPerThread; k++) acc[k] = 0.0f;
    // the key range: all of them, or this block's run of whole tiles
    int64_t jb = 0, je = nk;
    if (SPLIT) {
        const int64_t tiles = (nk + kAttnTile - 1) / kAttnTile, run = (tiles + gridDim.z - 1) / gridDim.z;
        jb = blockIdx.z * run * kAttnTile;
        je = jb + run * kAttnTile < nk ? jb + run * kAttnTile : nk;
    }
    const bool sink = !SPLIT || blockIdx.z == 0;
    float mx = sink ? c.sinks[h] : -INFINITY, den = sink ? 1.0f : 0.0f;
    for (int64_t j0 = jb; j0 < je; j0 += kAttnTile) {
        const int tile = (int)(je - j0 < kAttnTile ? je - j0 : kAttnTile);
        if (threadIdx.x < tile) k_sh[threadIdx.x] = attn_key(m, c, t, e, p, lo, n_win, j0 + threadIdx.x);
        __syncthreads();  // also orders q_sh's fill before the first use
        float *kt = q_sh + hd;
        if (SMEM) {
            // a thread's dims of four rows at a time in registers, then stored: 16 loads in flight a thread
#pragma unroll 4
            for (int j = 0; j < tile; j++) {
                const float *k = k_sh[j];
                float v[kAttnMaxDimsPerThread];
#pragma unroll
                for (int kk = 0; kk < kAttnMaxDimsPerThread; kk++) {
                    const int d = threadIdx.x + kk * blockDim.x;
                    v[kk] = k && d < hd ? k[d] : 0.0f;
                }
#pragma unroll
                for (int kk = 0; kk < kAttnMaxDimsPerThread; kk++) {
                    const int d = threadIdx.x + kk * blockDim.x;
                    if (d < hd) kt[j * hd + d] = v[kk];
                }
            }
            __syncthreads();
        }
        auto row = [&](int j) { return SMEM ? kt + j * hd : k_sh[j]; };  // (k_sh[j] null: no key)
        for (int j = warp; j < tile; j += n_warps) {
            const float *k = k_sh[j], *kr = row(j);
            float s = 0.0f;
            if (k)
                for (int d = lane; d < hd; d += 32) s += q_sh[d] * kr[d];
            s = warp_sum(s);
            if (lane == 0) l_sh[j] = k ? s * c.scale : -INFINITY;
        }
        __syncthreads();
        float tmax = -INFINITY;
        for (int j = 0; j < tile; j++) tmax = fmaxf(tmax, l_sh[j]);
        // (a split's max starts at -inf: nothing to rescale until its first key; the sink's start is finite)
        const float mnew = fmaxf(mx, tmax), alpha = mx == -INFINITY ? 0.0f : expf(mx - mnew);
        den *= alpha;
#pragma unroll
        for (int k = 0; k < kAttnMaxDimsPerThread; k++) acc[k] *= alpha;
        for (int j = 0; j < tile; j++) {
            if (!k_sh[j]) continue;
            const float *kr = row(j);
            const float pj = expf(l_sh[j] - mnew);
            den += pj;
#pragma unroll
            for (int kk = 0; kk < kAttnMaxDimsPerThread; kk++) {
                const int d = threadIdx.x + kk * blockDim.x;
                if (d < hd) acc[kk] += pj * kr[d];
            }
        }
        mx = mnew;
        __syncthreads();  // k_sh / l_sh are refilled by the next tile
    }
    if constexpr (SPLIT) {
        float *part = parts + ((t * c.n_head + h) * gridDim.z + blockIdx.z) * (2 + hd);
        if (threadIdx.x == 0) part[0] = mx, part[1] = den;
#pragma unroll
        for (int kk = 0; kk < kAttnMaxDimsPerThread; kk++) {
            const int d = threadIdx.x + kk * blockDim.x;
            if (d < hd) part[2 + d] = acc[kk];
        }
    } else {
        // the row through q_sh (free: the last tile's barrier passed every read of it)
#pragma unroll
        for (int kk = 0; kk < kAttnMaxDimsPerThread; kk++) {
            const int d = threadIdx.x + kk * blockDim.x;
            if (d < hd) q_sh[d] = acc[kk] / den;
        }
        attn_finish<FOLD>(m, c, oq, t, h, q_sh);
    }
}

constexpr int kAttnMaxSplits = 8;

// Block (t, h): the splits' parts of ds4_attention_kernel<.., SPLIT> rescaled to their common max and added in split
// order, divided, then finished as the unsplit kernel finishes its row.
template <bool FOLD>
__global__ void __launch_bounds__(kDs4Threads) ds4_attention_combine_kernel(BatchMeta m, Ds4AttnCall c, CudaDevice::QuantX oq,
                                                                          const float *parts, int S) {
    pdl_trigger();  // the next chained launch may start (launch_ds4)
    pdl_wait();     // everything below reads what the launch before wrote
    extern __shared__ float row[];  // [head_dim]
    const int64_t t = blockIdx.x;
    const int h = blockIdx.y, hd = c.head_dim;
    const float *P = parts + (t * c.n_head + h) * S * (2 + hd);
    float M = -INFINITY;
    for (int s = 0; s < S; s++) M = fmaxf(M, P[s * (2 + hd)]);
    float w[kAttnMaxSplits], den = 0.0f;
#pragma unroll
    for (int s = 0; s < kAttnMaxSplits; s++) {
        const float mx = s < S ? P[s * (2 + hd)] : -INFINITY;
        w[s] = mx == -INFINITY ? 0.0f : expf(mx - M);  // (a split with no key: nothing)
        if (s < S) den += P[s * (2 + hd) + 1] * w[s];
    }
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float a = 0.0f;
#pragma unroll
        for (int s = 0; s < kAttnMaxSplits; s++)
            if (s < S) a += P[s * (2 + hd) + 2 + d] * w[s];
        row[d] = a / den;
    }
    attn_finish<FOLD>(m, c, oq, t, h, row);
}

// ---- launchers ------------------------------------------------------------------------------------------------------

// cudaFuncSetAttribute(MaxDynamicSharedMemorySize, bytes) for a kernel on GPU `device`, the first time it is asked.
template <class K>
static void allow_shared(K kernel, size_t bytes, int device, const char *op) {
    static std::mutex mu;
    static std::set<std::pair<const void *, int>> done;
    std::lock_guard<std::mutex> lk(mu);
    if (!done.insert({(const void *)kernel, device}).second) return;
    check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes), op);
}

// What hc_pre's kernels need of a call: Sinkhorn runs one lane per entry of the N x N matrix, and parts fit a row.
static void check_hc_pre(const HcPreCall &c) {
    if (c.N < 1 || c.N * c.N > 32) fail(DFL_ERR_UNSUPPORTED, "hc_pre: " + std::to_string(c.N) + " streams (at most 5)");
    if (c.parts && ((2 + c.N) * c.N + 1 > kHcPartRow || !c.norm || c.n_parts < 1))
        fail(DFL_ERR_INTERNAL, "hc_pre: parts of " + std::to_string(c.N) + " streams (at most 4), or without the norm");
}

void CudaDevice::hc_pre(const HcPreCall &c) {
    check_hc_pre(c);
    op("hc_pre", [&] {
        if (c.T <= 0 || c.D <= 0) return;
        launch_ds4(hc_pre_kernel, dim3((unsigned)c.T, (unsigned)((c.D + kHcChunk - 1) / kHcChunk)), 256, 0, stream_, c);
        check_launch("hc_pre");
    });
}

// hc_pre with the sub-block's RMSNorm in one launch where a block holds a row (DFL_CUDA_HC_PRE_NORM=1; off: the
// two ops).
void CudaDevice::hc_pre_norm(const HcPreCall &c, const float *w, float eps, float *y) {
    static const bool on = env_switch("DFL_CUDA_HC_PRE_NORM", false);
    const int threads = norm_threads(c.D);
    if (!on || c.D % 32 != 0 || c.D > (int64_t)kHcNormRegs * threads || c.N > kDs4MaxHc)
        return Device::hc_pre_norm(c, w, eps, y);
    check_hc_pre(c);
    op("hc_pre_norm", [&] {
        const QuantX q = stage_rows(y, c.T, c.D);  // (clears an earlier op's staging, whatever T is)
        if (c.T <= 0) return;
        launch_chain(hc_pre_norm_kernel, dim3((unsigned)c.T), dim3(threads), 0, stream_, c, w, eps, y, q);
        check_launch("hc_pre_norm");
    });
    staged_done();
}

// The plan multiplies the raw streams and hc_pre applies their norm, where a 16,384-wide rmsnorm launch (~20 us in the
// two-pass loops, the 12-05 profile) ran before each site's mixing product. DFL_CUDA_HC_FOLD=0 keeps the launch (for
// comparisons in one run).
bool CudaDevice::hc_fold() const {
    static const bool on = env_switch("DFL_CUDA_HC_FOLD", true);
    return on;
}

void CudaDevice::hc_post(const HcPostCall &c) {
    op("hc_post", [&] {
        const int64_t n = c.T * c.N * c.D;
        if (n <= 0) return;
        launch_ds4(hc_post_kernel, grid_for(n, 256), 256, 0, stream_, c);
        check_launch("hc_post");
    });
}

// hc_post with the next site's mixing product as parts (DFL_CUDA_HC_POST_MIX=1): for up to kHcPartsMaxT tokens of 4
// streams and an f16 or f32 mixing matrix; otherwise hc_post alone (0 parts: the plan multiplies).
int CudaDevice::hc_post_mix(const HcPostCall &c, const Weight &fn, float *parts) {
    static const bool on = env_switch("DFL_CUDA_HC_POST_MIX", false);
    const bool f16 = fn.type == DFL_TYPE_F16, f32 = fn.type == DFL_TYPE_F32;
    if (!on || c.N != kHcMixN || !(f16 || f32) || c.T < 1 || c.T > kHcPartsMaxT || c.D < 1 || fn.n_out != kHcMixM ||
        fn.n_in != (int64_t)c.N * c.D || fn.row_bytes != (uint64_t)fn.n_in * (f16 ? 2 : 4))
        return Device::hc_post_mix(c, fn, parts);
    const int n_parts = (int)std::min<int64_t>(kHcMaxParts, (c.D + kHcPostMixThreads - 1) / kHcPostMixThreads);
    const int64_t chunk = (c.D + n_parts - 1) / n_parts;
    op("hc_post_mix", [&] {
        const dim3 grid((unsigned)c.T, (unsigned)n_parts);
        if (f16)
            launch_ds4(hc_post_mix_kernel<uint16_t>, grid, kHcPostMixThreads, 0, stream_, c, (const uint16_t *)fn.data, fn.n_in,
                                                                                   chunk, parts);
        else
            launch_ds4(hc_post_mix_kernel<float>, grid, kHcPostMixThreads, 0, stream_, c, (const float *)fn.data, fn.n_in, chunk,
                                                                               parts);
        check_launch("hc_post_mix");
    });
    return n_parts;
}

void CudaDevice::hc_head(const HcHeadCall &c) {
    if (c.N < 1 || c.N > kDs4MaxHc) fail(DFL_ERR_UNSUPPORTED, "hc_head: " + std::to_string(c.N) + " streams (at most 16)");
    op("hc_head", [&] {
        if (c.T <= 0 || c.D <= 0) return;
        launch_ds4(hc_head_kernel, dim3((unsigned)c.T, (unsigned)((c.D + kHcChunk - 1) / kHcChunk)), 256, 0, stream_, c);
        check_launch("hc_head");
    });
}

void CudaDevice::rope_tail(const RopeTailCall &c) {
    op("rope_tail", [&] {
        const int64_t n = c.rows * c.n_head * (c.rope_dim / 2);
        if (n <= 0) return;
        launch_ds4(rope_tail_kernel, grid_for(n, 256), 256, 0, stream_, c);
        check_launch("rope_tail");
    });
}

// The head rows' norm and RoPE in one kernel (twice a DeepSeek V4 layer: the query heads and the K = V row);
// DFL_CUDA_NORM_ROPE=0: the two ops.
void CudaDevice::norm_rope_tail(const float *w, float eps, const RopeTailCall &c) {
    static const bool on = env_switch("DFL_CUDA_NORM_ROPE", true);
    const int threads = norm_threads(c.head_dim);
    if (!on || c.head_dim > threads * kNormRopeRegs) return Device::norm_rope_tail(w, eps, c);
    op("norm_rope_tail", [&] {
        const int64_t rows = c.rows * c.n_head;
        if (rows <= 0) return;
        launch_ds4(norm_rope_tail_kernel, (unsigned)rows, threads, 0, stream_, w, eps, c);
        check_launch("norm_rope_tail");
    });
}

void CudaDevice::ds4_ring_write(const BatchMeta &m, const Ds4RingWrite &c) {
    op("ds4_ring_write", [&] {
        if (m.n_ent <= 0 || c.window <= 0) return;
        launch_ds4(ring_write_kernel, dim3((unsigned)m.n_ent, (unsigned)c.window), kDs4Threads, 0, stream_, m, c);
        check_launch("ds4_ring_write");
    });
}

void CudaDevice::ds4_attention(const BatchMeta &m, const Ds4AttnCall &c) {
    if (c.head_dim < 1 || c.head_dim > kAttnMaxHeadDim)
        fail(DFL_ERR_UNSUPPORTED, "ds4_attention: head_dim " + std::to_string(c.head_dim) + " (at most 1024)");
    if (c.window < 1) fail(DFL_ERR_INVALID, "ds4_attention: window must be at least 1");
    if (c.comp && c.ratio < 1) fail(DFL_ERR_INVALID, "ds4_attention: compressed rows need a ratio");
    if (c.unrotate && (c.rope_dim < 2 || c.rope_dim > c.head_dim))
        fail(DFL_ERR_INVALID, "ds4_attention: rope_dim " + std::to_string(c.rope_dim) + " outside 2.." + std::to_string(c.head_dim));
    // unrotate and ring_write inside the attention kernel, two launches fewer a layer (rope_tail ~4.5 us and the ring
    // write ~4.9 us op by op, the 12-05 profile); DFL_CUDA_DS4_ATTN_FOLD=0: the two kernels after it
    static const bool fold = env_switch("DFL_CUDA_DS4_ATTN_FOLD", true);
    // the output's int8 quantization staged for the grouped product after it (its quantizer launch saved), where the
    // output is final here (folded, or nothing to un-rotate): DFL_CUDA_DS4_ATTN_QUANT=1
    static const bool quant = env_switch("DFL_CUDA_DS4_ATTN_QUANT", false);
    const bool stage = quant && (fold || !c.unrotate) && c.head_dim % 32 == 0;
    // each tile's key rows through shared memory (DFL_CUDA_DS4_ATTN_SMEM=1; 66 KB a block at head_dim 512), and the
    // keys of a step of few (token, head) blocks split over up to kAttnMaxSplits blocks each, enough for two a SM
    // (DFL_CUDA_DS4_ATTN_SPLIT=1; then a combining launch)
    static const bool smem = env_switch("DFL_CUDA_DS4_ATTN_SMEM", false), split = env_switch("DFL_CUDA_DS4_ATTN_SPLIT", false);
    const int64_t heads = m.T * c.n_head;
    const int S = split && heads > 0 ? (int)std::min<int64_t>(kAttnMaxSplits, (2 * sm_count() + heads - 1) / heads) : 1;
    op("ds4_attention", [&] {
        const QuantX q = stage ? stage_rows(c.out, m.T, (int64_t)c.n_head * c.head_dim) : QuantX{};
        if (m.T <= 0 || c.n_head <= 0) return;
        const size_t shared = (size_t)c.head_dim * (smem ? 1 + kAttnTile : 1) * sizeof(float);
        float *parts = S > 1 ? (float *)ds4_buffer((size_t)(heads * S * (2 + c.head_dim)) * sizeof(float)) : nullptr;
        auto launch = [&](auto kernel, dim3 grid) {
            // the most any head_dim takes, set once a kernel and GPU: by the op-by-op run of a step shape, before any
            // graph capture of it
            if (shared > 48 * 1024)
                allow_shared(kernel, (size_t)kAttnMaxHeadDim * (1 + kAttnTile) * sizeof(float), index(), "ds4_attention");
            launch_ds4(kernel, grid, kDs4Threads, shared, stream_, m, c, q, parts);
        };
        const dim3 grid((unsigned)m.T, (unsigned)c.n_head);
        if (S > 1) {
            const dim3 sgrid((unsigned)m.T, (unsigned)c.n_head, (unsigned)S);
            if (smem)
                launch(ds4_attention_kernel<false, true, true>, sgrid);
            else
                launch(ds4_attention_kernel<false, false, true>, sgrid);
            check_launch("ds4_attention (splits)");
            const size_t row = (size_t)c.head_dim * sizeof(float);
            if (fold)
                launch_ds4(ds4_attention_combine_kernel<true>, grid, kDs4Threads, row, stream_, m, c, q, parts, S);
            else
                launch_ds4(ds4_attention_combine_kernel<false>, grid, kDs4Threads, row, stream_, m, c, q, parts, S);
        } else if (fold && smem) {
            launch(ds4_attention_kernel<true, true, false>, grid);
        } else if (fold) {
            launch(ds4_attention_kernel<true, false, false>, grid);
        } else if (smem) {
            launch(ds4_attention_kernel<false, true, false>, grid);
        } else {
            launch(ds4_attention_kernel<false, false, false>, grid);
        }
        check_launch("ds4_attention");
    });
    if (stage) staged_done();
    if (fold) return;
    if (c.unrotate) rope_tail(ds4_unrotate_call(m, c));
    if (c.ring_write) ds4_ring_write(m, ds4_ring_write_call(c));
}

void CudaDevice::matmul_grouped(const Weight &W, int groups, const float *x, float *y) {
    if (groups < 1 || W.n_out % groups != 0) fail(DFL_ERR_INVALID, "matmul_grouped: rows do not divide into groups");
    const int64_t rows = W.n_out / groups;
    // the groups' inputs are one token's consecutive slices: the attention's staged quantization of its output, if
    // no call came between (DFL_CUDA_DS4_ATTN_QUANT=1), serves them as one batch of `groups` rows
    const StagedScope staged(*this);
    op("matmul_grouped", [&] {
        GemvZ z;  // group g: rows g * rows.., input slice g, output slice g
        z.w_rows = rows;
        z.x_stride = W.n_in;
        z.y_stride = rows;
        launch_gemv_z(*this, W, rows, z, groups, x, y);
    });
}

}  // namespace cuda
}  // namespace dfl
