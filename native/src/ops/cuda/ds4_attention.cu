// DeepSeek V4's sink attention on the GPU (device.h: Ds4AttnCall) over the window ring and the compressed rows, with
// the work a plan may fold into it (the output's un-rotation, the ring write), and the
// grouped output projection after it. Built without FMA contraction as the other ds4 files (cuda.mk).
#include <algorithm>
#include <type_traits>

#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/cuda_device.h"
#include "ops/cuda/ds4_common.cuh"

namespace dfl {
namespace cuda {

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

// Token t's keys in a Ds4AttnCall: its entry e, cache position p, window rows lo..p (n_win of them), and nk keys in
// all (the window's, then the compressed rows, selected or all).
struct AttnKeys {
    int32_t e;
    int64_t p, lo, n_win, nk;
};
__device__ __forceinline__ AttnKeys attn_keys(const BatchMeta &m, const Ds4AttnCall &c, int64_t t) {
    AttnKeys k;
    k.e = m.ent[t];
    const int64_t len0 = m.len0[k.e];
    k.p = len0 + (t - m.t0[k.e]);
    k.lo = k.p - c.window + 1 > 0 ? k.p - c.window + 1 : 0;
    k.n_win = k.p - k.lo + 1;
    const int64_t n_comp = c.comp ? (c.sel ? c.top_k : (k.p + 1) / c.ratio) : 0;
    k.nk = k.n_win + n_comp;
    return k;
}

// Split blockIdx.z of gridDim.z's keys [jb, je) of nk: an equal run of whole tiles (the last ones may be short or
// empty).
__device__ __forceinline__ void split_keys(int64_t nk, int64_t &jb, int64_t &je) {
    const int64_t tiles = (nk + kAttnTile - 1) / kAttnTile, run = (tiles + gridDim.z - 1) / gridDim.z;
    jb = blockIdx.z * run * kAttnTile;
    je = jb + run * kAttnTile < nk ? jb + run * kAttnTile : nk;
}

// A tile's key rows (k_sh[j], head_dim floats each, on 16-byte boundaries) into shared memory at kt by cp.async, every
// 16-byte piece in flight at once, waited for by each thread (a barrier after it makes them the block's); the rows of
// padded slots (null) zeroed.
__device__ __forceinline__ void copy_tile_async(float *kt, const float *const *k_sh, int tile, int hd) {
    const int pieces = hd / 4;  // 16-byte pieces a row
    for (int i = threadIdx.x; i < tile * pieces; i += blockDim.x) {
        const int j = i / pieces, p4 = 4 * (i % pieces);
        if (const float *k = k_sh[j])
            cp_async16(kt + j * hd + p4, k + p4);
        else
            *(float4 *)(kt + j * hd + p4) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    cp_async_commit();
    cp_async_wait<0>();
}

// The end of a (token, head) block: its output row in shared memory (row, head_dim floats, complete), with FOLD the
// call's un-rotation of it (a thread a pair) and, from head 0, the token's ring write; then stored. (Its int8
// quantization staged here for the grouped product, DFL_CUDA_DS4_ATTN_QUANT=1 until 12-07, measured even at batch 1
// and +1-2 % at batch 8 on an H100, 12-05 and 12-07 09:4x.)
template <bool FOLD>
__device__ void attn_finish(const BatchMeta &m, const Ds4AttnCall &c, int64_t t, int h, float *row) {
    const int hd = c.head_dim;
    __syncthreads();  // the row is complete
    if (FOLD && c.unrotate) {
        rotate_tail_block(row, hd, c.rope_dim, -(double)m.pos[t], c.unrotate);
        __syncthreads();
    }
    const int64_t qo = (t * c.n_head + h) * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) c.out[qo + d] = row[d];
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
// ASYNC (SMEM only; rows on 16-byte boundaries): the tile's rows copied by cp.async, every 16-byte piece of the tile
// in flight at once, where the register copy has four rows in flight a thread (eight round trips a tile of 32).
template <bool FOLD, bool SMEM, bool SPLIT>
__global__ void __launch_bounds__(kDs4Threads) ds4_attention_kernel(BatchMeta m, Ds4AttnCall c, float *parts,
                                                                      bool async, bool skip_empty) {
    pdl_trigger();  // the next chained launch may start (launch_ds4)
    pdl_wait();     // everything below reads what the launch before wrote
    extern __shared__ float q_sh[];  // [head_dim], then with SMEM the tile's rows [kAttnTile][head_dim]
    __shared__ float l_sh[kAttnTile];
    __shared__ const float *k_sh[kAttnTile];
    const int64_t t = blockIdx.x;
    const int h = blockIdx.y, hd = c.head_dim;
    const AttnKeys ks = attn_keys(m, c, t);
    const int32_t e = ks.e;
    const int64_t p = ks.p, lo = ks.lo, n_win = ks.n_win, nk = ks.nk;
    const float *q = c.Q + (t * c.n_head + h) * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) q_sh[d] = q[d];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    float acc[kAttnMaxDimsPerThread];
#pragma unroll
    for (int k = 0; k < kAttnMaxDimsPerThread; k++) acc[k] = 0.0f;
    // the key range: all of them, or this block's run of whole tiles
    int64_t jb = 0, je = nk;
    if (SPLIT) split_keys(nk, jb, je);
    const bool sink = !SPLIT || blockIdx.z == 0;
    float mx = sink ? c.sinks[h] : -INFINITY, den = sink ? 1.0f : 0.0f;
    for (int64_t j0 = jb; j0 < je; j0 += kAttnTile) {
        const int tile = (int)(je - j0 < kAttnTile ? je - j0 : kAttnTile);
        if (threadIdx.x < tile) k_sh[threadIdx.x] = attn_key(m, c, t, e, p, lo, n_win, j0 + threadIdx.x);
        // (the barrier also orders q_sh's fill before the first use) a tile of padded selection slots alone changes
        // nothing (its max -inf: alpha 1, no term): skipped with skip_empty
        if (!skip_empty)
            __syncthreads();
        else if (!__syncthreads_or(threadIdx.x < tile && k_sh[threadIdx.x] != nullptr))
            continue;
        float *kt = q_sh + hd;
        if (SMEM && async) {
            copy_tile_async(kt, k_sh, tile, hd);
            __syncthreads();
        } else if (SMEM) {
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
        attn_finish<FOLD>(m, c, t, h, q_sh);
    }
}

constexpr int kAttnMaxSplits = 8;

// Block (t, h): the splits' parts of ds4_attention_kernel<.., SPLIT> rescaled to their common max and added in split
// order, divided, then finished as the unsplit kernel finishes its row.
template <bool FOLD>
__global__ void __launch_bounds__(kDs4Threads) ds4_attention_combine_kernel(BatchMeta m, Ds4AttnCall c,
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
    attn_finish<FOLD>(m, c, t, h, row);
}

// ---- grouped heads ----------------------------------------------------------------------------------------------
//
// DFL_CUDA_DS4_ATTN_GROUP=G (opt-in: 2, 4 or 8; unmeasured): block (token t, heads h0..h0 + G - 1, split s) of 256
// threads. V4's 64 query heads of a token share its one K = V row per key, so ds4_attention_kernel's (token, head)
// blocks each copy every key row from L2: ~64 KB a tile a block, 512 blocks x 5 tiles at b8 (~164 MB a layer, ~30 us at
// the L2's rate before any arithmetic; CSA layers with ~12 tiles more). The 10-layer step's attention took ~59 / ~79 us
// a window / CSA layer at b8 and ~15 / ~46 at b1 (CUPTI trace, H100 12-08 01:3x), on the chain. Here a tile's rows are
// copied once for G heads (cp.async, as the split kernel's), each score one warp's dot as there (four at once); thread
// g < G keeps head g's running max and denominator, the tile's exp(score - new max) is worked out once a (head, key)
// into shared memory, and each thread adds its dims of every head over the tile's keys in key order. Every (head, dim)
// sees the same floats in the same order as ds4_attention_kernel over the same split, so the same sums; the parts go to
// ds4_attention_combine_kernel unchanged. Needs rows on 16-byte boundaries (the async copy).
constexpr int kAttnGroupThreads = 256;
constexpr int kAttnGroupDims = kAttnMaxHeadDim / kAttnGroupThreads;  // a thread's dims of a head, at most
constexpr int kAttnGroupDots = 4;                                    // scores a warp sums at once

template <int G, bool FOLD, bool SPLIT>
__global__ void __launch_bounds__(kAttnGroupThreads, 2)
    ds4_attention_group_kernel(BatchMeta m, Ds4AttnCall c, float *parts, bool skip_empty) {
    pdl_trigger();
    pdl_wait();
    extern __shared__ float group_sh[];  // the G query rows [G][head_dim], then the tile's rows [kAttnTile][head_dim]
    // the tile's scores, then exp(score - new max) (0 for a padded slot); rows padded by one: thread g < G walks row g
    __shared__ float p_sh[G][kAttnTile + 1];
    __shared__ float mn_sh[G], al_sh[G], dn_sh[G];
    __shared__ const float *k_sh[kAttnTile];
    const int64_t t = blockIdx.x;
    const int h0 = (int)blockIdx.y * G, hd = c.head_dim, tid = threadIdx.x;
    const int lane = tid & 31, warp = tid >> 5, n_warps = blockDim.x >> 5;
    const AttnKeys ks = attn_keys(m, c, t);
    float *q_sh = group_sh, *kt = group_sh + G * hd;
    const float *q = c.Q + (t * c.n_head + h0) * hd;  // the G heads' rows, one after another
    for (int i = tid; i < G * hd; i += blockDim.x) q_sh[i] = q[i];
    int64_t jb = 0, je = ks.nk;
    if (SPLIT) split_keys(ks.nk, jb, je);
    const bool sink = !SPLIT || blockIdx.z == 0;
    float mx = -INFINITY, den = 0.0f;  // thread g < G: head h0 + g's
    if (tid < G) {
        mx = sink ? c.sinks[h0 + tid] : -INFINITY;
        den = sink ? 1.0f : 0.0f;
    }
    float acc[G][kAttnGroupDims] = {};
    for (int64_t j0 = jb; j0 < je; j0 += kAttnTile) {
        const int tile = (int)(je - j0 < kAttnTile ? je - j0 : kAttnTile);
        if (tid < tile) k_sh[tid] = attn_key(m, c, t, ks.e, ks.p, ks.lo, ks.n_win, j0 + tid);
        if (!skip_empty)
            __syncthreads();
        else if (!__syncthreads_or(tid < tile && k_sh[tid] != nullptr))
            continue;
        copy_tile_async(kt, k_sh, tile, hd);
        __syncthreads();
        // scores, four (head, key) dots a warp at once (each summed as ds4_attention_kernel sums it: the dependent adds
        // of one dot are the latency; a padded slot's zeroed row is multiplied too and its sum dropped)
        for (int i0 = warp; i0 < G * tile; i0 += kAttnGroupDots * n_warps) {
            int gi[kAttnGroupDots], ji[kAttnGroupDots];
            float sc[kAttnGroupDots];
#pragma unroll
            for (int u = 0; u < kAttnGroupDots; u++) {
                const int i = i0 + u * n_warps < G * tile ? i0 + u * n_warps : i0;
                gi[u] = i / tile;
                ji[u] = i % tile;
                sc[u] = 0.0f;
            }
            for (int d = lane; d < hd; d += 32)
#pragma unroll
                for (int u = 0; u < kAttnGroupDots; u++) sc[u] += q_sh[gi[u] * hd + d] * kt[ji[u] * hd + d];
#pragma unroll
            for (int u = 0; u < kAttnGroupDots; u++) sc[u] = warp_sum(sc[u]);
            if (lane == 0)
#pragma unroll
                for (int u = 0; u < kAttnGroupDots; u++)
                    if (i0 + u * n_warps < G * tile) p_sh[gi[u]][ji[u]] = k_sh[ji[u]] ? sc[u] * c.scale : -INFINITY;
        }
        __syncthreads();
        if (tid < G) {  // head tid: the tile's max, the new max, the rescale of what came before
            float tmax = -INFINITY;
            for (int j = 0; j < tile; j++) tmax = fmaxf(tmax, p_sh[tid][j]);
            const float mnew = fmaxf(mx, tmax), alpha = mx == -INFINITY ? 0.0f : expf(mx - mnew);
            den *= alpha;
            mx = mnew;
            mn_sh[tid] = mnew;
            al_sh[tid] = alpha;
        }
        __syncthreads();
        for (int i = tid; i < G * tile; i += blockDim.x) {
            const int g = i / tile, j = i % tile;
            p_sh[g][j] = k_sh[j] ? expf(p_sh[g][j] - mn_sh[g]) : 0.0f;
        }
        __syncthreads();
        if (tid < G)
            for (int j = 0; j < tile; j++)
                if (k_sh[j]) den += p_sh[tid][j];
#pragma unroll
        for (int g = 0; g < G; g++) {
            const float alpha = al_sh[g];
#pragma unroll
            for (int k = 0; k < kAttnGroupDims; k++) acc[g][k] *= alpha;
        }
        for (int j = 0; j < tile; j++) {
            if (!k_sh[j]) continue;
            const float *kr = kt + j * hd;
            float kv[kAttnGroupDims];
#pragma unroll
            for (int k = 0; k < kAttnGroupDims; k++) {
                const int d = tid + k * kAttnGroupThreads;
                kv[k] = d < hd ? kr[d] : 0.0f;
            }
#pragma unroll
            for (int g = 0; g < G; g++) {
                const float pj = p_sh[g][j];
#pragma unroll
                for (int k = 0; k < kAttnGroupDims; k++)
                    if (tid + k * kAttnGroupThreads < hd) acc[g][k] += pj * kv[k];
            }
        }
        __syncthreads();  // k_sh, p_sh and the tile's rows are refilled by the next tile
    }
    if constexpr (SPLIT) {
#pragma unroll
        for (int g = 0; g < G; g++) {
            float *part = parts + ((t * c.n_head + h0 + g) * gridDim.z + blockIdx.z) * (2 + hd);
            if (tid == g) part[0] = mx, part[1] = den;
#pragma unroll
            for (int k = 0; k < kAttnGroupDims; k++) {
                const int d = tid + k * kAttnGroupThreads;
                if (d < hd) part[2 + d] = acc[g][k];
            }
        }
    } else {
        if (tid < G) dn_sh[tid] = den;
        __syncthreads();  // (every read of q_sh is past: the last tile's barrier)
#pragma unroll
        for (int g = 0; g < G; g++)
#pragma unroll
            for (int k = 0; k < kAttnGroupDims; k++) {
                const int d = tid + k * kAttnGroupThreads;
                if (d < hd) q_sh[g * hd + d] = acc[g][k] / dn_sh[g];
            }
        for (int g = 0; g < G; g++) attn_finish<FOLD>(m, c, t, h0 + g, q_sh + g * hd);
    }
}

// The splits of an attention launch of `blocks` blocks a split: enough for two blocks an SM, at most kAttnMaxSplits,
// at least min_splits (which ds4_attention reads clamped to that bound).
static int attn_splits(int64_t blocks, int64_t min_splits, int sms) {
    if (blocks <= 0) return 1;
    const int64_t fill = (2 * (int64_t)sms + blocks - 1) / blocks;
    return (int)std::max<int64_t>(min_splits, std::min<int64_t>(kAttnMaxSplits, fill));
}

// ds4_attention_combine_kernel over S splits' parts, a block a (token, head), with or without the fold.
static void launch_attn_combine(cudaStream_t st, const BatchMeta &m, const Ds4AttnCall &c, const float *parts, int S,
                                bool fold) {
    const dim3 grid((unsigned)m.T, (unsigned)c.n_head);
    const size_t row = (size_t)c.head_dim * sizeof(float);
    if (fold)
        launch_ds4(ds4_attention_combine_kernel<true>, grid, kDs4Threads, row, st, m, c, parts, S);
    else
        launch_ds4(ds4_attention_combine_kernel<false>, grid, kDs4Threads, row, st, m, c, parts, S);
    check_launch("ds4_attention (combine)");
}

// The heads a block of the grouped kernel takes (DFL_CUDA_DS4_ATTN_GROUP: the most of 8, 4, 2 not above it that divides
// n_head), or 0: the (token, head) kernels.
static int ds4_attn_group(int n_head) {
    static const int64_t want = env_int("DFL_CUDA_DS4_ATTN_GROUP", 0);
    for (int g : {8, 4, 2})
        if (g <= want && n_head % g == 0) return g;
    return 0;
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
    // The keys of a step of few (token, head) blocks split over up to kAttnMaxSplits blocks each, enough for two a SM
    // (then a combining launch; DFL_CUDA_DS4_ATTN_SPLIT=0: one block a head), and each tile's key rows through shared
    // memory (66 KB a block at head_dim 512) where split (DFL_CUDA_DS4_ATTN_SMEM=1 / 0: always / never). H100, 3-layer
    // V4-Flash file, decode after 1,024 tokens (12-05 13:2x, two runs each): batch 1 1.289 / 1.285 ms a step with
    // neither, 1.363 / 1.357 with the shared rows alone, 1.028 / 1.026 with both (5 splits of 64 heads: -20 %); after
    // 16 tokens even (0.697 / 0.690 against 0.686 / 0.704, 12-05 11:0x). Batch 8's 512 blocks do not split, and shared
    // rows without splits cost it +14 % (3.20 / 3.23 -> 3.70 / 3.67 ms).
    static const bool split = env_switch("DFL_CUDA_DS4_ATTN_SPLIT", true);
    static const int64_t smem_env = env_int("DFL_CUDA_DS4_ATTN_SMEM", -1);
    const int64_t heads = m.T * c.n_head;
    // DFL_CUDA_DS4_ATTN_MIN_SPLITS=N (opt-in, unmeasured): at least N splits, where batch 8's 512 blocks run unsplit
    // (the 10-layer step's attention ~59 us a layer at b8 against ~25 at b1, CUPTI trace 12-08 01:3x)
    static const int64_t min_splits =
        std::max<int64_t>(1, std::min<int64_t>(kAttnMaxSplits, env_int("DFL_CUDA_DS4_ATTN_MIN_SPLITS", 1)));
    const int S = split ? attn_splits(heads, min_splits, sm_count()) : 1;
    const bool smem = (smem_env < 0 ? S > 1 : smem_env == 1) &&
                      (size_t)c.head_dim * (1 + kAttnTile) * sizeof(float) <= shared_optin();
    // the tiles' rows by cp.async (DFL_CUDA_DS4_ATTN_ASYNC=0: by registers; the same floats in the same order): where
    // shared, the register copy's eight round trips a 32-row tile (four rows in flight a thread) become one. The
    // 2-layer V4-Flash step on an H100 (12-07 09:2x): 0.665 -> 0.648 / 0.652 ms at one token, b8 the same.
    static const bool async_env = env_switch("DFL_CUDA_DS4_ATTN_ASYNC", true);
    const bool rows16 = c.head_dim % 4 == 0 && c.slot_stride % 4 == 0 &&
                        (((uintptr_t)c.ring | (uintptr_t)c.kv | (uintptr_t)c.comp) & 15) == 0;  // every key row
    const bool async = async_env && smem && rows16;
    // ds4_attention_kernel skips tiles of padded selection slots alone (the indexer's top_k slots past the rows a short
    // context has: 16 tiles of 512 at V4's top_k, each a barrier, a round of key addresses and a warp sum a slot; the
    // same bits). H100 12-07 21:2x, 4-layer V4-Flash, two alternated runs: b1 0.949 / 0.952 -> 0.936 / 0.935 ms, b8
    // 2.016 / 2.029 -> 1.982 / 1.973, b32 5.20 / 5.23 -> 5.04 / 5.06. DFL_CUDA_DS4_ATTN_SKIP=0: every tile.
    static const bool skip_empty = env_switch("DFL_CUDA_DS4_ATTN_SKIP", true);
    const int G = rows16 && async_env ? ds4_attn_group(c.n_head) : 0;
    if (G && (size_t)(G + kAttnTile) * c.head_dim * sizeof(float) <= shared_optin()) {
        ds4_attention_grouped(m, c, G, split ? min_splits : 0, skip_empty, fold);
    } else {
        op("ds4_attention", [&] {
            if (m.T <= 0 || c.n_head <= 0) return;
            const size_t shared = (size_t)c.head_dim * (smem ? 1 + kAttnTile : 1) * sizeof(float);
            const size_t part_bytes = (size_t)(heads * S * (2 + c.head_dim)) * sizeof(float);
            float *parts = S > 1 ? (float *)ds4_buffer(part_bytes) : nullptr;
            auto launch = [&](auto kernel, dim3 grid) {
                // set once a kernel and GPU, by the op-by-op run of a step shape, before any graph capture of it: the
                // most any head_dim takes, or the GPU's bound where that is less (132 KB is more than a block may have
                // on GPUs other than the H100 / H200; smem is off for a head too wide for it)
                if (shared > 48 * 1024)
                    set_attribute_once(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)std::min(shared_optin(), kAttnMaxHeadDim * (1 + kAttnTile) * sizeof(float)),
                                       index(), "ds4_attention");
                launch_ds4(kernel, grid, kDs4Threads, shared, stream_, m, c, parts, async, skip_empty);
            };
            const dim3 grid((unsigned)m.T, (unsigned)c.n_head);
            if (S > 1) {
                const dim3 sgrid((unsigned)m.T, (unsigned)c.n_head, (unsigned)S);
                if (smem)
                    launch(ds4_attention_kernel<false, true, true>, sgrid);
                else
                    launch(ds4_attention_kernel<false, false, true>, sgrid);
                check_launch("ds4_attention (splits)");
                launch_attn_combine(stream_, m, c, parts, S, fold);
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
    }
    if (fold) return;
    if (c.unrotate) rope_tail(ds4_unrotate_call(m, c));
    if (c.ring_write) ds4_ring_write(m, ds4_ring_write_call(c));
}

// The grouped-heads attention (ds4_attention_group_kernel, G heads a block): split over enough blocks for two an SM
// (min_splits at least; 0: never split), then ds4_attention_combine_kernel as the split (token, head) kernel's.
void CudaDevice::ds4_attention_grouped(const BatchMeta &m, const Ds4AttnCall &c, int G, int64_t min_splits,
                                       bool skip_empty, bool fold) {
    op("ds4_attention", [&] {
        if (m.T <= 0 || c.n_head <= 0) return;
        const int S = min_splits == 0 ? 1 : attn_splits(m.T * (c.n_head / G), min_splits, sm_count());
        const size_t shared = (size_t)(G + kAttnTile) * c.head_dim * sizeof(float);
        const size_t part_bytes = (size_t)(m.T * c.n_head * S * (2 + c.head_dim)) * sizeof(float);
        float *parts = S > 1 ? (float *)ds4_buffer(part_bytes) : nullptr;
        auto launch = [&](auto kernel, dim3 grid) {
            if (shared > 48 * 1024)
                set_attribute_once(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   (int)std::min(shared_optin(), (8 + kAttnTile) * kAttnMaxHeadDim * sizeof(float)),
                                   index(), "ds4_attention (grouped)");
            launch_ds4(kernel, grid, kAttnGroupThreads, shared, stream_, m, c, parts, skip_empty);
        };
        auto go = [&](auto g) {
            constexpr int kG = decltype(g)::value;
            const dim3 grid((unsigned)m.T, (unsigned)(c.n_head / kG), (unsigned)S);
            if (S > 1)
                launch(ds4_attention_group_kernel<kG, false, true>, grid);
            else if (fold)
                launch(ds4_attention_group_kernel<kG, true, false>, grid);
            else
                launch(ds4_attention_group_kernel<kG, false, false>, grid);
        };
        if (G == 8)
            go(std::integral_constant<int, 8>{});
        else if (G == 4)
            go(std::integral_constant<int, 4>{});
        else
            go(std::integral_constant<int, 2>{});
        check_launch("ds4_attention (grouped)");
        if (S > 1) launch_attn_combine(stream_, m, c, parts, S, fold);
    });
}

bool CudaDevice::matmul_grouped(const Weight &W, int groups, const float *x, int64_t T, float *y) {
    if (groups < 1 || W.n_out % groups != 0) fail(DFL_ERR_INVALID, "matmul_grouped: rows do not divide into groups");
    const int64_t rows = W.n_out / groups;
    if (q8p_grouped_takes(W, groups, T)) {
        op("matmul_grouped", [&] { launch_gemv_q8p_grouped(*this, W, groups, x, T, y); });
        return true;
    }
    if (T != 1) return false;
    op("matmul_grouped", [&] {
        GemvZ z;  // group g: rows g * rows.., input slice g, output slice g
        z.w_rows = rows;
        z.x_stride = W.n_in;
        z.y_stride = rows;
        launch_gemv_z(*this, W, rows, z, groups, x, y);
    });
    return true;
}
}  // namespace cuda
}  // namespace dfl
