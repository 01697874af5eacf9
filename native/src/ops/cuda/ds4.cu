// DeepSeek V4 ops on the GPU (device.h, "DeepSeek V4"): the hyper-connection pre / post / head, the tail RoPE and the
// window ring write. The sink attention and its grouped output projection are in ds4_attention.cu, the compressors and
// the indexer in ds4_compress.cu, the MoE in ds4_moe.cu. Every kernel computes what ops/cpu/ds4_ops.cpp computes, in f32, mostly
// in the same order of operations; these files are built without FMA contraction (cuda.mk) so that element-wise
// arithmetic rounds as the CPU's (-ffp-contract=off) does.
#include <cooperative_groups.h>
#include <type_traits>

#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/cuda_device.h"
#include "ops/cuda/ds4_common.cuh"
#include "ops/cuda/norm_store.cuh"

namespace dfl {
namespace cuda {

// ---- hyper-connections ----------------------------------------------------------------------------------------------

// Sinkhorn projection of one n x n matrix (n * n <= 32), the CPU's ds4_sinkhorn step for step: lane a * n + b of the
// calling warp holds c[a][b] in v and gets the result. Every sum is taken in the CPU's order (each lane adds its row's
// or column's values itself, from lane 0 of the row or column on), so the result is the serial one bit for bit.
// NC > 0: n is NC, known when compiled, so each sum's shuffles are unrolled and issued back to back (with n at run
// time, each waited for the one before: 20 rounds of that were most of the ~9 us rank 0 of the HC site kernel ran
// alone after the other blocks had left, ncu 12-07 10:0x).
template <int NC = 0>
__device__ float sinkhorn_warp(float v, int n_rt, int iters, float eps) {
    const int n = NC > 0 ? NC : n_rt;
    const int lane = threadIdx.x & 31, a = lane / n, b = lane % n;
    auto row_sum = [&](float x) {
        float sum = 0.0f;
#pragma unroll
        for (int j = 0; j < n; j++) sum += __shfl_sync(0xffffffffu, x, (a * n + j) & 31);
        return sum;
    };
    auto col_sum = [&](float x) {
        float sum = 0.0f;
#pragma unroll
        for (int i = 0; i < n; i++) sum += __shfl_sync(0xffffffffu, x, (i * n + b) & 31);
        return sum;
    };
    float mx = __shfl_sync(0xffffffffu, v, (a * n) & 31);
#pragma unroll
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

// post and comb of token t from its mixing row scaled by r (Sinkhorn one lane per entry): the calling warp, whole
// (sinkhorn_warp shuffles across it). NC: c.N known when compiled (sinkhorn_warp).
template <int NC = 0>
__device__ void hc_post_comb_warp(const HcPreCall &c, int64_t t, const float *mix, float r) {
    const int N = NC > 0 ? NC : c.N, lane = threadIdx.x & 31;
    if (lane < N) c.post[t * N + lane] = 2.0f * sigmoid_f(mix[N + lane] * r * c.scale[1] + c.base[N + lane]);
    const int k = lane < N * N ? lane : 0;
    const float v = sinkhorn_warp<NC>(mix[2 * N + k] * r * c.scale[2] + c.base[2 * N + k], N, c.iters, c.eps);
    if (lane < N * N) c.comb[t * N * N + lane] = v;
}

// pre (N sigmoids) into shared memory from the token's mixing row scaled by r; then, where store, warp 0 stores post
// and comb while the other warps go on.
template <int NC = 0>
__device__ void hc_pre_weights(const HcPreCall &c, int64_t t, const float *mix, float r, bool store, float *pre) {
    const int N = NC > 0 ? NC : c.N;
    if ((int)threadIdx.x < N) pre[threadIdx.x] = sigmoid_f(mix[threadIdx.x] * r * c.scale[0] + c.base[threadIdx.x]) + c.eps;
    __syncthreads();
    if (store && threadIdx.x < 32) hc_post_comb_warp<NC>(c, t, mix, r);
}

// hc_pre_weights of token t from its mixing row, scaled by the streams' norm where c.norm.
__device__ void hc_pre_begin(const HcPreCall &c, int64_t t, bool store, float *pre, float *red) {
    const float r = c.norm ? hc_fold_scale(c, t, red) : 1.0f;
    hc_pre_weights(c, t, c.mix + t * ((2 + c.N) * c.N), r, store, pre);
}

// Block (token, chunk of kHcChunk channels): the first lanes derive pre, which every chunk mixes its channels with;
// chunk 0's warp 0 then derives post and comb while its other warps mix: the other chunks need neither, so no block
// waits for Sinkhorn's iterations before mixing (every block ran them, all warps waiting, before the 12-05 change).
// With norm, every block first takes the token's RMSNorm scale from the streams (64 KB for V4: from L2 after the
// first block).
__global__ void hc_pre_kernel(HcPreCall c) {
    pdl_trigger();  // the next chained launch may start (launch_ds4)
    pdl_wait();     // everything below reads what the launch before wrote
    __shared__ float pre[kDs4MaxHc];
    __shared__ float red[32];
    const int64_t t = blockIdx.x;
    const int N = c.N;
    hc_pre_begin(c, t, blockIdx.y == 0, pre, red);
    const int64_t d0 = (int64_t)blockIdx.y * kHcChunk, d1 = d0 + kHcChunk < c.D ? d0 + kHcChunk : c.D;
    mix_streams_block(pre, c.X + t * N * c.D, N, c.D, d0, d1, c.x + t * c.D);
}

// A whole HC site of one token in one cluster of B blocks (Device::hc_site, the norm folded; N = 4 streams, D / B
// threads a block; B = kHcSiteBlocks, or 16 with DFL_CUDA_HC_SITE_BLOCKS=16). Why: the site was three launches on one
// token's 64 KB (the f16 mixing product, hc_pre, rmsnorm: ~26 us of a V4 layer's ~232 at batch 1, twice a layer, H100
// 12-07 08:2x), each a few dependent round trips on few blocks. Block b multiplies its N * D / B stream values (4
// consecutive a thread, the float4 load of the stream and one 4-wide load of each fn row) into the (2 + N) N partial
// sums of the mixing product and the sum of their squares; the cluster adds the blocks' partials in rank order (every
// block alike, so all hold the same totals: DSMEM reads), derives pre (rank 0 also post and comb, as hc_pre does);
// block b then mixes channels [b D / B, ..) of x, the cluster adds their squares, and y = rmsnorm(x) w with the staged
// quantization for the product after it. mix is not written. The sums' order differs from the ops apart (last bits of
// the product).
// late (DFL_CUDA_HC_SITE_LATE=0: not): rank 0's warp 0 runs Sinkhorn (post and comb, which only hc_post reads, a
// sub-block later) after its share of y, not before the norm's cluster barrier, and every block leaves once the
// cluster's reads of its shared memory are done (a split barrier: arrive after its own remote reads, wait at the end):
// Sinkhorn's 20 dependent rounds of shuffles and divisions stop holding up the other seven blocks' norm (ncu 12-07
// 09:5x: 15 of the kernel's 26 cycles between issues were warps waiting at a barrier). The 2-layer V4-Flash step on an
// H100, alternated (09:5x): b1 0.616 / 0.622 / 0.614 -> 0.610 / 0.606 ms, b8 even (1.78).
// mixr (the default; DFL_CUDA_HC_COMB_SIDE=0: null): rank 0 leaves the token's mixing row scaled by the norm there
// and runs no Sinkhorn; hc_comb_kernel derives post and comb from it on the side lane.
constexpr int kHcSiteBlocks = 8;  // the portable cluster size
constexpr int kHcSiteN = 4;

// The two halves of a cluster barrier (cl.sync() is both): arrive (release: this thread's writes before it are
// visible to the cluster after the wait) and wait for every thread of the cluster to have arrived (acquire).
__device__ __forceinline__ void cluster_arrive() { asm volatile("barrier.cluster.arrive.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory"); }

// Four consecutive mixing weights of a row (col a multiple of 4), as loaded (WT's raw bits: before pdl_wait, from the
// constant weights), and as floats.
template <typename WT>
struct HcSiteW4 {
    using Raw = typename std::conditional<sizeof(WT) == 2, uint2, float4>::type;
    static __device__ __forceinline__ Raw load(const uint8_t *row, int64_t col) {
        return __ldg((const Raw *)(row + col * (int64_t)sizeof(WT)));
    }
    static __device__ __forceinline__ float4 get(const Raw &u) {
        if constexpr (sizeof(WT) == 2) {
            const float2 a = __half22float2(*(const __half2 *)&u.x), b = __half22float2(*(const __half2 *)&u.y);
            return make_float4(a.x, a.y, b.x, b.y);
        } else {
            return u;
        }
    }
};

// The block's partial sums of the M mixing rows with this thread's four stream values v (wr: its four weights of each
// row, as loaded) and of v's squares: warp sums into red, then thread m <= M adds the warps' in warp order into dst[m].
template <typename WT, int M>
__device__ __forceinline__ void hc_block_partials(const typename HcSiteW4<WT>::Raw (&wr)[M], float4 v, float (*red)[M + 1],
                                                  float *dst) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    float acc[M + 1];
#pragma unroll
    for (int m = 0; m < M; m++) {
        const float4 wv = HcSiteW4<WT>::get(wr[m]);
        acc[m] = wv.x * v.x + wv.y * v.y + wv.z * v.z + wv.w * v.w;
    }
    acc[M] = v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
#pragma unroll
    for (int m = 0; m <= M; m++) {
        const float s = warp_sum(acc[m]);
        if (lane == 0) red[warp][m] = s;
    }
    __syncthreads();
    if ((int)threadIdx.x <= M) {
        float s = 0.0f;
        for (int i = 0; i < nw; i++) s += red[i][threadIdx.x];
        dst[threadIdx.x] = s;
    }
}

// A token's totals from hc_post's partial sums P (nparts blocks of M + 1) into tot (M + 1, shared memory): warp w's
// lanes add blocks w, w + nw, .. (their loads in flight together), then thread m adds the warps' sums in warp order.
// (One thread a total adding all 64 in turn, each load waiting for the one before, was ~8 us of the site's kernel, ncu
// 12-07 10:0x.) Ends with a barrier.
template <int M>
__device__ __forceinline__ void hc_parts_totals(const float *P, int nparts, float (*red)[M + 1], float *tot) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    if (lane <= M) {
        float s = 0.0f;
#pragma unroll 4
        for (int j = warp; j < nparts; j += nw) s += ld_act(P + (int64_t)j * (M + 1) + lane);
        red[warp][lane] = s;
    }
    __syncthreads();
    if ((int)threadIdx.x <= M) {
        float s = 0.0f;
        for (int i = 0; i < nw; i++) s += red[i][threadIdx.x];
        tot[threadIdx.x] = s;
    }
    __syncthreads();
}

template <typename WT, int B, bool PARTS>
__global__ void __launch_bounds__(512) hc_site_kernel(HcPreCall c, const uint8_t *fn, uint64_t fn_row_bytes,
                                                       const float *w, float eps, float *y, CudaDevice::QuantX q,
                                                       bool late, const float *parts, int nparts, float *mixr) {
    namespace cg = cooperative_groups;
    constexpr int N = kHcSiteN, M = (2 + N) * N;
    using W4 = HcSiteW4<WT>;
    __shared__ float part[M + 1], part2[1], tot[M + 1], pre[N];
    __shared__ float red[32][M + 1];
    cg::cluster_group cl = cg::this_cluster();
    const int rank = (int)cl.block_rank();
    const int64_t t = blockIdx.y, D = c.D, ND = N * D;
    // this thread's 4 columns of each mixing row, loaded while the kernel before ends (the weights are constant)
    const int64_t col = (int64_t)rank * N * blockDim.x + 4 * (int64_t)threadIdx.x;
    typename W4::Raw wr[M];
    if constexpr (!PARTS) {
#pragma unroll
        for (int m = 0; m < M; m++) wr[m] = W4::load(fn + (uint64_t)m * fn_row_bytes, col);
    }
    const int64_t d = (int64_t)rank * blockDim.x + threadIdx.x;  // the channel of x and y this thread mixes and norms
    const float wd = w ? __ldg(w + d) : 1.0f;                     // (the norm's weight: constant too)
    pdl_trigger();  // a following launch_pdl product may start loading its weights
    pdl_wait();     // (launch_chain) everything below reads what the kernel before wrote
    const float *X = c.X + t * ND;
    if constexpr (PARTS) {
        hc_parts_totals<M>(parts + t * nparts * (M + 1), nparts, red, tot);
    } else {
        // the mixing product's partial sums over this block's columns, and their squares
        hc_block_partials<WT, M>(wr, *(const float4 *)(X + col), red, part);
        cl.sync();  // every block's partials written
        if ((int)threadIdx.x <= M) {
            float s = 0.0f;
            for (int b = 0; b < B; b++) s += cl.map_shared_rank(part, b)[threadIdx.x];
            tot[threadIdx.x] = s;
        }
        __syncthreads();
    }
    const float r = rsqrtf(tot[M] / (float)ND + c.norm_eps);
    hc_pre_weights<N>(c, t, tot, r, rank == 0 && !late && !mixr, pre);  // (its barrier orders pre)
    if (mixr && rank == 0 && (int)threadIdx.x < M) mixr[t * M + threadIdx.x] = tot[threadIdx.x] * r;  // (hc_comb_kernel)
    // x over this block's channels, then y = rmsnorm(x) w
    float s = 0.0f;
    for (int i = 0; i < N; i++) s += pre[i] * X[i * D + d];
    c.x[t * D + d] = s;
    const float ss = block_sum(__fmaf_rn(s, s, 0.0f), &red[0][0]);
    if (threadIdx.x == 0) part2[0] = ss;
    cl.sync();
    float ss_all = 0.0f;
    for (int b = 0; b < B; b++) ss_all += cl.map_shared_rank(part2, b)[0];
    if (late) cluster_arrive();  // this block reads no other's shared memory from here on
    const float rn = rsqrtf(ss_all / (float)D + eps);
    const float v = w ? (s * rn) * wd : s * rn;
    y[t * D + d] = v;
    const CudaDevice::QuantX qt = row_quant(q, D, t);  // row t of the staging: a token a cluster
    if (qt.xq) quant_q8_store(qt, v, d);
    if (!late) {
        cl.sync();  // no block leaves while another reads its shared memory
        return;
    }
    if (!mixr && rank == 0 && threadIdx.x < 32) hc_post_comb_warp<N>(c, t, tot, r);
    cluster_wait();  // (likewise: every block arrived once its own reads were done)
}

// post and comb of token t (block t, one warp) from the site kernel's mixing row, already scaled by the norm (mixr:
// tot * r, so a factor 1 here rounds as r there): Sinkhorn on the device's side lane (unless DFL_CUDA_HC_COMB_SIDE=0), off
// the main lane, where only hc_post reads them, a sub-block later (after the model's join_side).
__global__ void hc_comb_kernel(HcPreCall c, const float *mixr) {
    constexpr int N = kHcSiteN, M = (2 + N) * N;
    pdl_trigger();
    pdl_wait();
    hc_post_comb_warp<N>(c, blockIdx.x, mixr + (int64_t)blockIdx.x * M, 1.0f);
}

// The sub-block output F of token t at channel d: F (+ F2).
__device__ __forceinline__ float hc_post_f(const HcPostCall &c, int64_t t, int64_t d) {
    const float f = c.F[t * c.D + d];
    return c.F2 ? f + c.F2[t * c.D + d] : f;
}

// hc_post with the next HC site's mixing product begun (the default; HcPostCall::next_fn, norm folded): a
// block of kHcPartsThreads threads computes 4 consecutive outputs a thread, as hc_post_kernel computes each, and leaves
// the partial sums of fn · out over its 4 kHcPartsThreads columns and of their squares in parts [T][ND / that][M + 1];
// the site's hc_site_kernel<.., PARTS> adds a token's in block order instead of reading fn (98 KB a block of its
// 8-block cluster: ~17 us a site alone on 8 SMs, ncu 12-07 09:5x) and multiplying. Here fn's 786 KB are read by the
// ND / 256 blocks a token (64 for V4), their rows loaded before the PDL wait.
constexpr int kHcPartsThreads = 64;
constexpr int kHcPartsCols = 4 * kHcPartsThreads;

template <typename WT>
__global__ void __launch_bounds__(kHcPartsThreads) hc_post_parts_kernel(HcPostCall c, const uint8_t *fn,
                                                                        uint64_t fn_row_bytes, float *parts) {
    constexpr int N = kHcSiteN, M = (2 + N) * N;
    using W4 = HcSiteW4<WT>;
    __shared__ float red[kHcPartsThreads / 32][M + 1];
    const int64_t ND = (int64_t)N * c.D, per_token = ND / kHcPartsCols;
    const int64_t t = blockIdx.x / per_token, j = blockIdx.x % per_token;
    const int64_t col = j * kHcPartsCols + 4 * (int64_t)threadIdx.x;  // within the token's N * D
    typename W4::Raw wr[M];
#pragma unroll
    for (int m = 0; m < M; m++) wr[m] = W4::load(fn + (uint64_t)m * fn_row_bytes, col);
    pdl_trigger();
    pdl_wait();
    const int b = (int)(col / c.D);
    const int64_t d0 = col % c.D;
    const float *X = c.X + t * ND, *comb = c.comb + t * N * N;
    float o[4];
#pragma unroll
    for (int k = 0; k < 4; k++) {
        float s = 0.0f;
        for (int a = 0; a < N; a++) s += comb[a * N + b] * X[a * c.D + d0 + k];
        o[k] = c.post[t * N + b] * hc_post_f(c, t, d0 + k) + s;
    }
    *(float4 *)(c.out + t * ND + col) = make_float4(o[0], o[1], o[2], o[3]);
    hc_block_partials<WT, M>(wr, make_float4(o[0], o[1], o[2], o[3]), red, parts + (t * per_token + j) * (M + 1));
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

// ---- launchers ------------------------------------------------------------------------------------------------------

// What hc_pre's kernels need of a call: Sinkhorn runs one lane per entry of the N x N matrix.
static void check_hc_pre(const HcPreCall &c) {
    if (c.N < 1 || c.N * c.N > 32) fail(DFL_ERR_UNSUPPORTED, "hc_pre: " + std::to_string(c.N) + " streams (at most 5)");
}

void CudaDevice::hc_pre(const HcPreCall &c) {
    check_hc_pre(c);
    op("hc_pre", [&] {
        if (c.T <= 0 || c.D <= 0) return;
        launch_ds4(hc_pre_kernel, dim3((unsigned)c.T, (unsigned)((c.D + kHcChunk - 1) / kHcChunk)), 256, 0, stream_, c);
        check_launch("hc_pre");
    });
}

// Whether an HC site runs as one kernel (hc_site_kernel): on unless DFL_CUDA_HC_SITE=0.
static bool hc_site_on() {
    static const bool on = env_switch("DFL_CUDA_HC_SITE", true);
    return on;
}

// Whether fn is a mixing matrix the site's kernels (and hc_post's partial sums of it) read for streams of D channels:
// (2 + N) N rows of N D, f16 or f32, rows in 16-byte words.
static bool hc_site_weight_ok(const Weight &fn, int64_t D) {
    return fn.n_in == kHcSiteN * D && fn.n_out == (2 + kHcSiteN) * kHcSiteN &&
           (fn.type == DFL_TYPE_F16 || fn.type == DFL_TYPE_F32) && ((uintptr_t)fn.data & 15) == 0 && fn.row_bytes % 16 == 0;
}

// The HC site in one cluster a token (hc_site_kernel; DFL_CUDA_HC_SITE=0: the three ops; the 2-layer V4-Flash step
// on an H100, 12-07 09:2x: 0.667 -> 0.644 ms at one token, 1.91 -> 1.78 / 1.80 at 8), where its shape allows: the norm
// folded, 4 streams, an f16 or f32 mixing matrix of (2 + N) N rows of N D, D / blocks a multiple of 32 up to 512,
// 1..64 tokens; else the three ops. DFL_CUDA_HC_SITE_BLOCKS=16 (opt-in, unmeasured): clusters of 16 blocks (a
// non-portable size, which the H100 and H200 schedule), each block's share of the site's weights, streams and
// reductions halved: the 8-block kernel spent ~15 us of its 17 alone on 8 SMs (ncu 12-07 09:5x).
void CudaDevice::hc_site(const Weight &fn, HcPreCall c, float *mix, const float *w, float eps, float *y) {
    static const bool on = hc_site_on(), late = env_switch("DFL_CUDA_HC_SITE_LATE", true);
    static const int blocks = env_int("DFL_CUDA_HC_SITE_BLOCKS", kHcSiteBlocks) == 16 ? 16 : kHcSiteBlocks;
    const int64_t threads = c.D / blocks;
    const bool shape = c.norm && c.N == kHcSiteN && c.D % blocks == 0 && threads % 32 == 0 && threads <= 512 &&
                       hc_site_weight_ok(fn, c.D) && ((uintptr_t)c.X & 15) == 0;
    // hc_post's partial sums of this very product, if it left them just before (DFL_CUDA_HC_PARTS, the default)
    const HcParts hp = hc_parts_;
    hc_parts_ = HcParts{};
    const bool parts = hp.p && hp.X == c.X && hp.fn == fn.data && hp.T == c.T && hp.call == calls_;
    // Sinkhorn (post and comb) on the side lane, off the main one (DFL_CUDA_HC_COMB_SIDE=0: rank 0's last warp): rank 0
    // of the site's cluster ran its 20 rounds alone after the other blocks had left, and the next product waited for
    // it (ncu 12-07 10:0x / 11:2x: the kernel 15-18 us, its SMs busy ~8). The 4-layer V4-Flash step on an H100 with
    // the unrolled Sinkhorn, alternated (12-07 12:0x): b1 0.968 / 0.971 -> 0.960 / 0.967 ms, b8 3.371 / 3.400 -> 3.365
    // / 3.388. mix holds T rows of (2 + N) N.
    static const bool side_env = env_switch("DFL_CUDA_HC_COMB_SIDE", true);
    const bool side = side_env && lanes_ && !on_side_ && mix;  // (from the main lane: its call count is restored below)
    // (thread-block clusters: sm_90 on; up to 64 tokens, each cluster reading the whole mixing matrix: a prefill's
    // thousands would read it thousands of times)
    if (!on || !shape || cc_major() < 9 || c.T <= 0 || c.T > 64) return Device::hc_site(fn, c, mix, w, eps, y);
    check_hc_pre(c);
    const int nparts = (int)(kHcSiteN * c.D / kHcPartsCols);
    op("hc_site", [&] {
        const QuantX q = stage_rows(y, c.T, c.D);  // (clears an earlier op's staging)
        const dim3 grid((unsigned)blocks, (unsigned)c.T), block((unsigned)threads);
        auto launch = [&](auto kernel) {
            if (blocks > kHcSiteBlocks)
                set_attribute_once(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1, index(), "hc_site (16-block clusters)");
            launch_maybe_pdl(pdl_chain_on(), (unsigned)blocks, kernel, grid, block, 0, stream_, c, fn.data, fn.row_bytes, w,
                             eps, y, q, late, hp.p, nparts, side ? mix : nullptr);
        };
        const bool wide = blocks > kHcSiteBlocks;
        if (parts) {  // (the weights' type no matter: the kernel reads none)
            wide ? launch(hc_site_kernel<float, 16, true>) : launch(hc_site_kernel<float, kHcSiteBlocks, true>);
            hc_parts_taken_++;
        } else if (fn.type == DFL_TYPE_F16)
            wide ? launch(hc_site_kernel<uint16_t, 16, false>) : launch(hc_site_kernel<uint16_t, kHcSiteBlocks, false>);
        else
            wide ? launch(hc_site_kernel<float, 16, false>) : launch(hc_site_kernel<float, kHcSiteBlocks, false>);
        check_launch("hc_site");
    });
    staged_done();
    if (!side) return;
    // the comb is the site's own tail: the main lane's call count is kept, so the staging of y stays open to the
    // product after the site (side_begin counts as a call there)
    const uint64_t main_calls = calls_;
    side_begin();
    op("hc_comb", [&] {
        launch_ds4(hc_comb_kernel, (unsigned)c.T, 32, 0, stream_, c, mix);
        check_launch("hc_comb");
        hc_side_combs_++;
    });
    side_end();
    calls_ = main_calls;
}

// The plan multiplies the raw streams and hc_pre applies their norm, where a 16,384-wide rmsnorm launch (~20 us in the
// two-pass loops, the 12-05 profile) ran before each site's mixing product. DFL_CUDA_HC_FOLD=0 keeps the launch (for
// comparisons in one run).
bool CudaDevice::hc_fold() const {
    static const bool on = env_switch("DFL_CUDA_HC_FOLD", true);
    return on;
}

void CudaDevice::hc_post(const HcPostCall &c) {
    // the next site's mixing product begun here (hc_post_parts_kernel) where that site's kernel will take it
    // 4-layer V4-Flash on an H100 with the side-lane Sinkhorn, alternated twice (12-07 12:5x): b1 0.957 / 0.957 ->
    // 0.949 / 0.949 ms, b8 3.416 / 3.411 -> 3.403 / 3.390. DFL_CUDA_HC_PARTS=0: hc_post_kernel, the site reads fn.
    static const bool parts_on = env_switch("DFL_CUDA_HC_PARTS", true);
    const Weight *fn = c.next_fn;
    const int M = (2 + kHcSiteN) * kHcSiteN;
    const bool parts = parts_on && hc_site_on() && fn && cc_major() >= 9 && c.T > 0 && c.T <= 64 && c.N == kHcSiteN &&
                       (c.N * c.D) % kHcPartsCols == 0 && hc_site_weight_ok(*fn, c.D) && ((uintptr_t)c.out & 15) == 0;
    hc_parts_ = HcParts{};
    const int64_t nblocks = c.T * c.N * c.D / kHcPartsCols;
    float *p = parts ? (float *)grow(hc_parts_buf_, (size_t)(nblocks * (M + 1)) * sizeof(float), "hc site partial sums")
                     : nullptr;
    op("hc_post", [&] {
        const int64_t n = c.T * c.N * c.D;
        if (n <= 0) return;
        if (!p) {
            launch_ds4(hc_post_kernel, grid_for(n, 256), 256, 0, stream_, c);
        } else if (fn->type == DFL_TYPE_F16) {
            launch_maybe_pdl(pdl_chain_on(), hc_post_parts_kernel<uint16_t>, dim3((unsigned)nblocks), dim3(kHcPartsThreads),
                             0, stream_, c, fn->data, fn->row_bytes, p);
        } else {
            launch_maybe_pdl(pdl_chain_on(), hc_post_parts_kernel<float>, dim3((unsigned)nblocks), dim3(kHcPartsThreads), 0,
                             stream_, c, fn->data, fn->row_bytes, p);
        }
        check_launch("hc_post");
        if (p) hc_parts_ = HcParts{c.out, fn->data, c.T, calls_, p};  // (calls_ counts this op: use() came first)
    });
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

}  // namespace cuda
}  // namespace dfl
