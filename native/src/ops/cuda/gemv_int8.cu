// Products on int8 activations (quantized per block of 32 by quantize_x_q8_kernel, one launch per product):
//  - q8_0 repacked at load: the quants of a row contiguous (16-byte words, no 34-byte block boundaries to straddle)
//    and the block scales beside them, so that a warp streams its row with 16-byte loads, several in flight per lane,
//    and multiplies with dp4a (four int8 products per instruction) instead of converting every weight to float: one
//    token (the batch-1 decode step), and 2..7 tokens with four rows per warp;
//  - q4_K on its own layout by dp4a, one token (and the DeepSeek V4 experts' z batches); q6_K likewise, 1..8 tokens:
//    gemv_kquant.cu (what both files' kernels share, the residual-norm fold's device side among it: gemv_int8.cuh);
//  - 8..64 tokens of q8_0 (DFL_CUDA_Q8P_MMA_MIN), 2..64 of q4_K on int8 tensor cores: mma_q8p.cu, mma_q4k.cu.

#include <algorithm>

#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/cuda_device.h"
#include "ops/cuda/gemv_int8.cuh"
#include "ops/cuda/mma_int8.cuh"

namespace dfl {
namespace cuda {

constexpr int kQ8pUnroll = 4;    // 16-byte words per lane loaded before any is used
constexpr int kQ8pMaxTokens = 16; // tokens per pass
// Repacked q8_0 takes the dp4a kernels up to 7 tokens, the tensor-core kernel from 8: H200, qwen3-8b layer shapes,
// 12-04 02:2x, one call: dp4a 66.3 / 69.9 / 87.9 us a layer at 2 / 4 / 8 tokens, the mma kernel 84.9 / 85.7 / 84.9;
// tg b8 1719 -> 1793 tok/s with it from 5 tokens (and DFL_CUDA_Q8P_DEEP) where dp4a took up to 8.
// DFL_CUDA_Q8P_MMA_MIN overrides it (for comparisons in one run).
int64_t q8p_mma_min_tokens() {
    static const int64_t n = std::max<int64_t>(2, env_int("DFL_CUDA_Q8P_MMA_MIN", 8));
    return n;
}

// Repack: block b of row r (d, then 32 quants) -> qs[r][32b..32b+31], d[r][b].
__global__ void repack_q8_0_kernel(const uint8_t *raw, uint64_t row_bytes, int64_t n_in, int64_t n_out, int8_t *qs,
                                   uint16_t *d) {
    const int64_t nb = n_in / 32;
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;  // one thread per block of 32
    if (i >= nb * n_out) return;
    const int64_t r = i / nb, b = i % nb;
    const uint8_t *blk = raw + (uint64_t)r * row_bytes + (uint64_t)b * 34;
    d[i] = (uint16_t)blk[0] | (uint16_t)((uint16_t)blk[1] << 8);
    int8_t *q = qs + r * n_in + b * 32;
    for (int k = 0; k < 32; k++) q[k] = (int8_t)blk[2 + k];
}

// x (T rows of n_in floats) -> int8 per block of 32 with one float scale: amax / 127, rounded to nearest; and, where
// xsum is not null, each block's sum of the rounded values times its scale (the q4_K kernel's sub-block minimums).
// Launched by launch_pdl: the product that follows may start (and load its weights) while this runs.
__global__ void quantize_x_q8_kernel(const float *x, int64_t n_in, int64_t T, CudaDevice::QuantX q) {
    pdl_trigger();
    pdl_wait();
    const int64_t nb = n_in / 32;
    const int64_t blk = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x & 31;
    if (blk >= nb * T) return;
    // rows of n_in (a multiple of 32) are contiguous: block blk is elements 32 blk.., scale and sum number blk
    quant_q8_store(q, x[blk * 32 + lane], blk * 32 + lane);
}

// The int32 dot product of 16 int8 weights and 16 int8 activations (four dp4a).
__device__ __forceinline__ int dot16_i8(const uint4 &w, const int4 &x) {
    int s = __dp4a((int)w.x, x.x, 0);
    s = __dp4a((int)w.y, x.y, s);
    s = __dp4a((int)w.z, x.z, s);
    return __dp4a((int)w.w, x.w, s);
}

// z: block row blockIdx.y of a grouped launch reads matrix z of a stack of n_out-row matrices (w_rows apart), its
// input z / x_div (x_stride quants apart) and writes y_stride floats further (launch_gemv_q8p_z); 0 in a plain one.
template <int NT>
__global__ void __launch_bounds__(kQ8pWarps * 32) gemv_q8p_kernel(const int8_t *qs, const uint16_t *dw, int64_t n_in,
                                                                int64_t n_out, const int8_t *xq, const float *xs,
                                                                float *Y, GemvZ z) {
    {
        const int64_t k = blockIdx.y, nbz = n_in / 32;
        qs += k * z.w_rows * n_in;
        dw += k * z.w_rows * nbz;
        xq += (k / z.x_div) * z.x_stride;
        xs += (k / z.x_div) * (z.x_stride / 32);
        Y += k * z.y_stride;
    }
    const int lane = threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * kQ8pWarps + (threadIdx.x >> 5);
    if (row >= n_out) return;
    const int64_t nw = n_in / 16, nb = n_in / 32;
    const uint4 *w = (const uint4 *)(qs + row * n_in);
    const uint16_t *d = dw + row * nb;
    float acc[NT] = {};
    // The first words of the row are loaded before the wait for the activations' quantizer (launch_pdl): the weights
    // do not depend on it, so their latency overlaps the kernels before this one. (Their scales too, as a runtime
    // choice beside this loop, lost on the H200: tg b1 q8_0 280 -> 252 tok/s, 12-03 18:45; cuda-notes.)
    uint4 wv[kQ8pUnroll];
#pragma unroll
    for (int u = 0; u < kQ8pUnroll; u++)
        if (lane + 32 * u < nw) wv[u] = __ldg(w + lane + 32 * u);
    pdl_wait();
    for (int64_t i0 = lane; i0 < nw; i0 += 32 * kQ8pUnroll) {
        if (i0 != lane) {
#pragma unroll
            for (int u = 0; u < kQ8pUnroll; u++)
                if (i0 + 32 * u < nw) wv[u] = __ldg(w + i0 + 32 * u);
        }
#pragma unroll
        for (int u = 0; u < kQ8pUnroll; u++) {
            const int64_t i = i0 + 32 * u;
            if (i >= nw) break;
            const int64_t b = i >> 1;  // two words per block of 32
            const float sw = half_bits_to_f32(__ldg(d + b));
#pragma unroll
            for (int t = 0; t < NT; t++) {
                const int s = dot16_i8(wv[u], ld_act((const int4 *)(xq + t * n_in) + i));
                acc[t] += (float)s * sw * ld_act(xs + t * nb + b);
            }
        }
    }
    store_warp_rows<NT>(acc, Y, n_out, row);
}

// The rows kernels' R rows from row0 on: their quants (w) and scales (d); a short last group repeats its last row, never
// stored.
template <int R>
__device__ __forceinline__ void q8p_rows_at(const int8_t *qs, const uint16_t *dw, int64_t row0, int64_t n_in,
                                            int64_t n_out, const uint4 *(&w)[R], const uint16_t *(&d)[R]) {
#pragma unroll
    for (int r = 0; r < R; r++) {
        const int64_t row = min(row0 + r, n_out - 1);
        w[r] = (const uint4 *)(qs + row * n_in);
        d[r] = dw + row * (n_in / 32);
    }
}

// The rows kernels' U words a lane of each of R rows in flight (wv, dv): the first, from word `first` + lane on.
template <int R, int U>
__device__ __forceinline__ void q8p_rows_load(const uint4 *const (&w)[R], const uint16_t *const (&d)[R], int64_t first,
                                              int64_t nw, uint4 (&wv)[U][R], uint16_t (&dv)[U][R]) {
#pragma unroll
    for (int u = 0; u < U; u++)
#pragma unroll
        for (int r = 0; r < R; r++) {
            const int64_t i = first + 32 * u;
            if (i < nw) {
                wv[u][r] = __ldg(w[r] + i);
                dv[u][r] = __ldg(d[r] + (i >> 1));
            }
        }
}

// The rows kernels' stream from word `first` (this lane's first, loaded by q8p_rows_load) to the row's end: each word
// multiplied as its slot is refilled with the word 32 U further, the dp4a sums of NT tokens added to acc. Token t's
// activations are x_ld quants (x_ld / 32 scales) after token t - 1's.
template <int NT, int R, int U>
__device__ __forceinline__ void q8p_rows_stream(const uint4 *const (&w)[R], const uint16_t *const (&d)[R], int64_t first,
                                                int64_t nw, int64_t x_ld, const int8_t *xq, const float *xs,
                                                uint4 (&wv)[U][R], uint16_t (&dv)[U][R], float (&acc)[R][NT]) {
    const int64_t nb = x_ld / 32;
    for (int64_t i0 = first; i0 < nw; i0 += 32 * U) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int64_t i = i0 + 32 * u;
            if (i >= nw) break;
            uint4 wq[R];
            float sw[R];
            const int64_t next = i + 32 * U;
#pragma unroll
            for (int r = 0; r < R; r++) {
                wq[r] = wv[u][r];
                sw[r] = half_bits_to_f32(dv[u][r]);
                if (next < nw) {
                    wv[u][r] = __ldg(w[r] + next);
                    dv[u][r] = __ldg(d[r] + (next >> 1));
                }
            }
#pragma unroll
            for (int t = 0; t < NT; t++) {
                const int4 xv = ld_act((const int4 *)(xq + t * x_ld) + i);
                const float sx = ld_act(xs + t * nb + (i >> 1));
#pragma unroll
                for (int r = 0; r < R; r++) acc[r][t] += (float)dot16_i8(wq[r], xv) * (sw[r] * sx);
            }
        }
    }
}

// Several tokens (a batched decode step, a DFlash verify block): each warp takes R rows, so that every activation word
// a lane loads (and its scale) serves R rows' dp4a, and the R weight rows stream with 16-byte loads side by side.
// With one row per warp the activation loads, not the weights, bound the kernel from about four tokens on. A lane keeps
// U = 4 / R words of each row (with their scales) in flight, each slot refilled as soon as its word is used (more
// spill, or cost a block an SM, at 8 tokens). One token asks for six blocks an SM: left alone, nvcc 11.8 gave it 102
// registers (five blocks) where two tokens take 80; at six it takes 74, no spills.
// GROUPED (launch_gemv_q8p_grouped): blockIdx.y = g multiplies the g-th n_out rows of a stack by the g-th n_in columns
// of each input row (x_ld quants and x_ld / 32 scales a token) into the g-th n_out columns of each output row (y_ld
// floats a token). A template switch: the offsets cost the plain one-token kernel 16 registers (nvcc 11.8).
template <int NT, int R, bool GROUPED = false>
__global__ void __launch_bounds__(kQ8pWarps * 32, NT > 8 ? 3 : NT == 1 ? 6 : 4)
    gemv_q8p_rows_kernel(const int8_t *qs, const uint16_t *dw, int64_t n_in, int64_t n_out, const int8_t *xq,
                         const float *xs, float *Y, int64_t x_ld, int64_t y_ld) {
    constexpr int U = 4 / R;
    if constexpr (GROUPED) {
        const int64_t g = blockIdx.y;
        qs += g * n_out * n_in;
        dw += g * n_out * (n_in / 32);
        xq += g * n_in;
        xs += g * (n_in / 32);
        Y += g * n_out;
    } else {
        x_ld = n_in;
        y_ld = n_out;
    }
    const int lane = threadIdx.x & 31;
    const int64_t row0 = ((int64_t)blockIdx.x * kQ8pWarps + (threadIdx.x >> 5)) * R;
    if (row0 >= n_out) return;
    const int64_t nw = n_in / 16;
    const uint4 *w[R];
    const uint16_t *d[R];
    q8p_rows_at<R>(qs, dw, row0, n_in, n_out, w, d);
    uint4 wv[U][R];
    uint16_t dv[U][R];
    q8p_rows_load<R, U>(w, d, lane, nw, wv, dv);
    pdl_wait();  // (launch_pdl) the activations are the kernel before's
    float acc[R][NT] = {};
    q8p_rows_stream<NT, R, U>(w, d, lane, nw, x_ld, xq, xs, wv, dv, acc);
    pdl_trigger();
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const float v = warp_sum(acc[r][t]);
            if (lane == 0 && row0 + r < n_out) Y[t * y_ld + row0 + r] = v;
        }
}

// One token, R rows a warp, as gemv_q8p_rows_kernel<1, R>, but each lane first copies A words of each of its rows
// (and the rows' first 16 A scales, by the warp's first 2 A lanes) into shared memory by cp.async, before the wait for
// the activations: 512 A bytes a row in flight per warp where the rows kernel has 64 a lane in registers. Why: a
// one-token step spends ~a quarter of its time in the kernels between products (norms, attention: 0.93 of 3.45 ms a
// qwen3-8b q8_0 step, skip-ops 12-04), during which the memory is nearly idle; the product's resident blocks (six an
// SM) can then hold ~26 MB of its weights (the 27B's out projection whole) instead of ~6. Unlike the L2 prefetch that
// lost (DFL_CUDA_L2_AHEAD, 12-04), the bytes land where they are used and cannot be evicted before. Each lane reads
// back only its own quants (no barrier for them); the scales are shared within the warp (__syncwarp). Every lane
// sums its words in the rows kernel's order: the same floats as gemv_q8p_rows_kernel<1, 2> at R = 2. At R = 1 it
// stands in for gemv_q8p_kernel, which rounds each term as (s sw) sx where this kernel takes s (sw sx): last bits
// may differ from DFL_CUDA_GEMV_AHEAD=0's.
// Layout of a warp's share (q8p_ahead_warp_words 16-byte words): R rows of 32 A quant words, then R rows of 2 A words
// of scales.
__host__ __device__ constexpr int q8p_ahead_warp_words(int R, int A) { return R * (32 * A + 2 * A); }

// (One row a warp: eight blocks an SM, so that a 4096-row matrix's 1,024 blocks are one wave; 64 registers, and at
// A = 8 an 8-byte spill with nvcc 11.8, measured so at 14:3x.)
// WARPS a block: kQ8pWarps, or 32 for the residual-norm fold (FOLD: one row a warp, a block's 32 rows one block of 32
// of the next product's input; one block an SM, the same 32 warps an SM as eight blocks of four).
// in: where set, the input's codes are of x w before the norm's scale (a fold before this product): every output
// times rsqrt(sum / n + eps), the sum of in.n_parts partial sums added in a fixed order (every warp the same bits).
// out (FOLD): the output row is not stored; x[row] += it (the residual, add_rmsnorm's sum), and the block quantizes
// its 32 rows of x w (w the norm's weights) for the next product, with its partial sum of x^2.
// conv (kFoldConv): see ConvFold; each row's K taps and K - 1 stored inputs are one value a lane (16 lanes a row),
// the taps loaded before the wait, the stored inputs just after it (the slot's rows are the step before's, but the
// wait orders this launch after whatever rewrote them), both in flight through the main loop.
template <int R, int A, int WARPS = kQ8pWarps, int FOLD = kFoldNone>
__global__ void __launch_bounds__(WARPS * 32, WARPS == 32 ? 1 : R == 1 ? 8 : 6)
    gemv_q8p_ahead_kernel(const int8_t *qs, const uint16_t *dw, int64_t n_in, int64_t n_out, const int8_t *xq,
                          const float *xs, float *Y, RmsFold in, NormFold out, ConvFold conv) {
    static_assert(FOLD != kFoldConv || R <= 2, "the conv fold: 16 lanes a row");
    static_assert(FOLD != kFoldBlock || (R == 1 && WARPS == 32), "the block fold: 32 rows a block, a row a warp");
    static_assert(FOLD != kFoldGroup || 32 % (WARPS * R) == 0, "the group fold: whole blocks a group of 32 rows");
    constexpr int U = 4 / R, kQuantWords = 32 * A, kScaleWords = 2 * A;
    extern __shared__ uint4 ahead_smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t row0 = ((int64_t)blockIdx.x * WARPS + warp) * R;
    if (row0 >= n_out) return;
    const int64_t nw = n_in / 16;  // (the launcher asks nw >= 32 A, n_in / 32 a multiple of 8)
    uint4 *sq = ahead_smem + (size_t)warp * q8p_ahead_warp_words(R, A);
    const uint16_t *ss = (const uint16_t *)(sq + R * kQuantWords);
    const uint4 *w[R];
    const uint16_t *d[R];
    q8p_rows_at<R>(qs, dw, row0, n_in, n_out, w, d);
    {
        const unsigned at = (unsigned)__cvta_generic_to_shared(sq + lane);  // this lane's word of the warp's share
#pragma unroll
        for (int r = 0; r < R; r++) {
#pragma unroll
            for (int u = 0; u < A; u++) cp_async16_at(at + (r * kQuantWords + 32 * u) * 16, w[r] + lane + 32 * u);
            if (lane < kScaleWords) cp_async16_at(at + (R * kQuantWords + r * kScaleWords) * 16, (const uint4 *)d[r] + lane);
        }
    }
    cp_async_commit();
    // the words after the staged ones into registers, as the rows kernel's first
    uint4 wv[U][R];
    uint16_t dv[U][R];
    q8p_rows_load<R, U>(w, d, kQuantWords + lane, nw, wv, dv);
    // (kFoldConv) this lane's value of row row0 + lane / 16: tap j = lane % 16 (j < K), stored input j - K (j < 2K - 1)
    const int cj = lane & 15;
    const int64_t crow = row0 + (lane >> 4);
    const bool ctap = FOLD == kFoldConv && (lane >> 4) < R && crow < conv.C && cj < conv.K;
    const bool cstored = FOLD == kFoldConv && (lane >> 4) < R && crow < conv.C && cj >= conv.K && cj < 2 * conv.K - 1;
    float *cs = nullptr;
    float cval = 0.0f;
    if (FOLD == kFoldConv) {
        if (ctap) cval = __ldg(conv.w + (int64_t)cj * conv.C + crow);
        if (cstored) cs = conv.conv + (int64_t)__ldg(conv.slot) * conv.slot_stride + (int64_t)(cj - conv.K) * conv.C + crow;
    }
    pdl_wait();  // (launch_pdl) the activations are the kernel before's
    if (FOLD == kFoldConv && cstored) cval = *cs;
    cp_async_wait<0>();
    __syncwarp();  // (the scales: copied by the first 2 A lanes)
    float acc[R][1] = {};
#pragma unroll
    for (int u = 0; u < A; u++) {
        const int i = lane + 32 * u;
        const int4 xv = ld_act((const int4 *)xq + i);
        const float sx = ld_act(xs + (i >> 1));
#pragma unroll
        for (int r = 0; r < R; r++) {
            const float sw = half_bits_to_f32(ss[r * 8 * kScaleWords + (i >> 1)]);
            acc[r][0] += (float)dot16_i8(sq[r * kQuantWords + i], xv) * (sw * sx);
        }
    }
    q8p_rows_stream<1, R, U>(w, d, kQuantWords + lane, nw, n_in, xq, xs, wv, dv, acc);
    pdl_trigger();
    const float scale = in.parts ? fold_scale(in, lane) : 1.0f;
    if (FOLD == kFoldBlock) {
        norm_fold_store(out, warp_sum(acc[0][0]) * scale, row0, lane, warp);
        return;
    }
    if (FOLD == kFoldGroup) {
        float v[R];
#pragma unroll
        for (int r = 0; r < R; r++) v[r] = warp_sum(acc[r][0]) * scale;
        norm_fold_group<R>(out, v, row0, lane, (int64_t)blockIdx.x * WARPS * R, 32 / (WARPS * R));
        return;
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
        const float v = warp_sum(acc[r][0]) * scale;
        if (lane == 0 && row0 + r < n_out) Y[row0 + r] = v;
        if (FOLD == kFoldConv && row0 + r < conv.C) conv_fold_row(conv, cval, v, row0 + r, lane, 16 * r, cs, cstored);
    }
}

// GROUPED: the group launch (gemv_q8p_rows_kernel), n_in and n_out a group's, x_ld and y_ld the whole rows'.
template <int R, bool GROUPED = false>
static void launch_q8p_rows(cudaStream_t s, int nt, const int8_t *qs, const uint16_t *dw, int64_t n_in, int64_t n_out,
                            const int8_t *xq, const float *xs, float *y, int groups = 1, int64_t x_ld = 0,
                            int64_t y_ld = 0) {
    const dim3 grid((unsigned)((n_out + kQ8pWarps * R - 1) / (kQ8pWarps * R)), (unsigned)groups), block(kQ8pWarps * 32);
#define DFL_Q8P_ROWS(N) \
    case N:                                                                                                               \
        launch_pdl(gemv_q8p_rows_kernel<N, R, GROUPED>, grid, block, s, qs, dw, n_in, n_out, xq, xs, y, x_ld, y_ld);      \
        break;
    switch (nt) {
        DFL_Q8P_ROWS(1) DFL_Q8P_ROWS(2) DFL_Q8P_ROWS(3) DFL_Q8P_ROWS(4) DFL_Q8P_ROWS(5) DFL_Q8P_ROWS(6) DFL_Q8P_ROWS(7)
        DFL_Q8P_ROWS(8) DFL_Q8P_ROWS(9) DFL_Q8P_ROWS(10) DFL_Q8P_ROWS(11) DFL_Q8P_ROWS(12) DFL_Q8P_ROWS(13)
        DFL_Q8P_ROWS(14) DFL_Q8P_ROWS(15) DFL_Q8P_ROWS(16)
    }
#undef DFL_Q8P_ROWS
}

// Words a lane of each row that one-token q8_0 products stage in shared memory before their wait
// (gemv_q8p_ahead_kernel): 8 unless DFL_CUDA_GEMV_AHEAD=0 (none: the rows kernel and gemv_q8p_kernel) or 4. H100 12-06
// 14:3x, one job, alternated twice: qwen3-8b q8_0 tg b1 3.916 / 3.896 -> 3.803 / 3.846 ms with the one-row-a-warp
// products too (3.910 / 3.892 with only the wide ones; 4 words: 3.924 / 3.938), the 27B's decode 11.67 / 11.65 ->
// 11.36 / 11.41 ms, its verify blocks even.
static int q8p_ahead_words() {
    static const int a = [] {
        const int64_t v = env_int("DFL_CUDA_GEMV_AHEAD", 8);
        return v >= 8 ? 8 : v >= 4 ? 4 : 0;
    }();
    return a;
}

// Whether one-token products on gemv_q8p_kernel (one row a warp: qwen3-8b's o and down) take the staged-ahead kernel
// too, one row a warp: on unless DFL_CUDA_GEMV_AHEAD_R1=0 (their share of the 14:3x gain above: 0.1 ms of the 8B's).
static bool q8p_ahead_r1() {
    static const bool on = env_switch("DFL_CUDA_GEMV_AHEAD_R1", true);
    return on;
}

template <int R, int A, int WARPS = kQ8pWarps, int FOLD = kFoldNone>
static void launch_q8p_ahead(CudaDevice &dev, const Weight &W, const int8_t *xq, const float *xs, float *y,
                             const RmsFold &in, const NormFold &out = NormFold{}, const ConvFold &conv = ConvFold{}) {
    const dim3 grid((unsigned)((W.n_out + WARPS * R - 1) / (WARPS * R))), block(WARPS * 32);
    // 34,816 bytes at R = 2, A = 8 (< 48 KB); the fold's 32 warps 139,264
    const size_t smem = (size_t)WARPS * q8p_ahead_warp_words(R, A) * 16;
    prefer_shared_carveout<gemv_q8p_ahead_kernel<R, A, WARPS, FOLD>>(dev.index(), "matmul (q8_0 staged-ahead carveout)");
    if (smem > 48 * 1024)
        allow_dynamic_smem<gemv_q8p_ahead_kernel<R, A, WARPS, FOLD>>(dev.index(), smem, "matmul (q8_0 staged-ahead smem)");
    launch_maybe_pdl(true, gemv_q8p_ahead_kernel<R, A, WARPS, FOLD>, grid, block, smem, dev.stream(), q8p_quants(W),
                     q8p_scales(W), W.n_in, W.n_out, xq, xs, y, in, out, conv);
}

// One token of W on gemv_q8p_ahead_kernel, R rows a warp (q8p_ahead_rows said it takes it).
template <int R>
static void launch_q8p_ahead_one(CudaDevice &dev, const Weight &W, const int8_t *xq, const float *xs, float *y,
                                 const RmsFold &in) {
    if (q8p_ahead_words() == 8)
        launch_q8p_ahead<R, 8>(dev, W, xq, xs, y, in);
    else
        launch_q8p_ahead<R, 4>(dev, W, xq, xs, y, in);
}

// The quantizer is a PDL launch (the product after it may load its weights meanwhile).
using QuantX = CudaDevice::QuantX;

QuantX quantize_x(CudaDevice &dev, const float *X, int64_t n_in, int64_t rows, bool sums, bool folded_ok) {
    QuantX staged;
    if (dev.take_staged(X, rows * n_in, &staged)) {  // the norm or SwiGLU before quantized X
        if (staged.rms_parts && !folded_ok)
            fail(DFL_ERR_INTERNAL, "matmul: a folded norm's codes reached a product that cannot scale them");
        return staged;
    }
    const QuantX q = dev.quant_scratch(rows * n_in, sums);
    if (skip_op("quantize_x"))  // (DFL_CUDA_SKIP_OPS: what the quantizer costs inside a replayed step; garbage out)
        return q;
    launch_pdl(quantize_x_q8_kernel, grid_for(rows * n_in, 256), 256, dev.stream(), X, n_in, rows, q);
    check_launch("matmul (quantize x)");
    return q;
}

// (A row range of a repacked weight starts its scales at 2 n_in / 32 bytes a row: the kernels' 16-byte loads need
// both regions on 16 bytes.)
bool q8p_ok(const Weight &W) {
    return W.packed != nullptr && W.packed_aux != nullptr && W.type == DFL_TYPE_Q8_0 && W.n_in % 32 == 0 &&
           ((uintptr_t)W.packed & 15) == 0 && ((uintptr_t)W.packed_aux & 15) == 0;
}

void repack_q8_0(CudaDevice &dev, Weight &W) {
    if (W.type != DFL_TYPE_Q8_0 || W.n_in % 32 != 0 || W.packed) return;
    const int64_t nb = W.n_in / 32;
    const size_t q_bytes = (size_t)(W.n_out * W.n_in), d_bytes = (size_t)(W.n_out * nb) * 2;
    uint8_t *p = (uint8_t *)dev.alloc_weight(q_bytes + d_bytes, "repacked q8_0 weight");
    const int64_t n = nb * W.n_out;
    repack_q8_0_kernel<<<grid_for(n, 256), 256, 0, dev.stream()>>>(W.data, W.row_bytes, W.n_in, W.n_out, (int8_t *)p,
                                                                 (uint16_t *)(p + q_bytes));
    check_launch("repack q8_0");
    W.packed = p;
    W.packed_aux = p + q_bytes;
    W.packed_row_bytes = (uint64_t)W.n_in;
    W.packed_aux_row_bytes = (uint64_t)nb * 2;
}

// Whether one token of a wide q8_0 matrix (n_out >= 4224: q|k|v, gate|up) takes the rows kernel with four rows a warp:
// on unless DFL_CUDA_Q8P_ROWS1=0. H200, 12-03 21:06, one call: 6144 x 4096 9.1 -> 6.6 us, 24576 x 4096 31.5 -> 29.7
// (graph replays), tg b1 qwen3-8b q8_0 279.9 -> 289.2 tok/s. On 4096-row matrices it is not faster (R = 2 at 18:06: 8.0
// against 8.5, 21.4 against 19.8 us), so they keep gemv_q8p_kernel.
static bool q8p_rows1_on() {
    static const bool on = env_switch("DFL_CUDA_Q8P_ROWS1", true);
    return on;
}

// Rows a warp of the rows kernel for one token of a wide matrix: 2, or DFL_CUDA_Q8P_ROWS1_R=4 (for comparisons in one
// run; one row a warp lost: 27B q8_0 tg b1 9.22 -> 10.59 ms, H200 12-07 06:0x). Why 2: with four the 27B's qkv|z|b|a
// (16,480 rows) made 1,030 blocks where six an SM fit (76 registers), 1.3 waves, and ran at 2.39 TB/s where
// gate|up's 2.75 waves ran at 2.78 (H100 12-05 16:1x). Measured (H100 12-05 17:3x, one call): the 27B layer at one
// token 168.6 -> 152.9 us (kernel bench), its decode step 13.25 -> 12.63 ms (with the staged gdn and the conv in
// registers), qwen3-8b q8_0 tg b1 4.125 -> 4.075 ms.
static int q8p_rows1_r() {
    static const int r = [] {
        const int64_t v = env_int("DFL_CUDA_Q8P_ROWS1_R", 2);
        return v == 4 ? 4 : 2;
    }();
    return r;
}

// Rows a warp of the dp4a kernels for nt tokens: gemv_q8p_kernel's one at one token, the rows kernel's 2 or 4 else.
// Groups of four rows per warp need enough of them to fill the GPU (132 SMs x 2 blocks of 16 rows): matrices of
// 4224+ rows (set on qwen3-8b's 4096 / 6144-row shapes, 12-03). The 27B's 5120-row matrices (out, o, down) stay on the
// rows kernel at one token although ncu had them at 29 % achieved occupancy there (320 blocks, H100 12-06 11:3x): a row a
// warp (gemv_q8p_kernel, twice the warps) took its decode step 11.99 -> 12.72 ms (12-06 12:5x).
static int q8p_dp4a_rows(const Weight &W, int nt) {
    const bool wide = W.n_out >= 4224;
    if (nt > 1) return wide ? 4 : 2;
    return wide && q8p_rows1_on() ? q8p_rows1_r() : 1;
}

// Rows a warp of W's one-token product on gemv_q8p_ahead_kernel (1 or 2), where DFL_CUDA_GEMV_AHEAD (and at one row a
// warp DFL_CUDA_GEMV_AHEAD_R1) asks for it and the rows have the staged words (32 A of them) and 16-byte aligned scale
// rows; 0 where one token of W takes another kernel.
static int q8p_ahead_rows(const Weight &W) {
    const int a = q8p_ahead_words(), r = q8p_dp4a_rows(W, 1);
    if (!q8p_ok(W) || a == 0 || r > 2 || (r == 1 && !q8p_ahead_r1()) || W.n_in / 16 < 32 * a || W.n_in % 256 != 0)
        return 0;
    return r;
}

// The residual-norm fold (CudaDevice::matmul_add_rmsnorm): on unless DFL_CUDA_RESID_NORM=0. H100 12-06 19:4x, one
// job, alternated twice: qwen3-8b q8_0 tg b1 3.912 / 3.911 -> 3.606 / 3.570 ms a step. Why: a one-token step runs an
// add_rmsnorm kernel after each layer's output projection and down projection (0.33 of a 3.45 ms qwen3-8b q8_0 step
// on the H200, skip-ops 12-04; all of it, 19:4x showed): a chained launch, the row's round trip through L2 and a
// one-block reduction between two products. Here the product before does the residual add and the quantization of
// its 32-row blocks itself; the norm's scale, a sum over the whole row, waits for the product after, which
// multiplies its sums by it (fold_scale). Where: one token of a q8_0 matrix of at most 32 rows an SM whose rows
// take the one-row staged-ahead kernel (qwen3-8b's o and down, 4096 rows), its output read by one product on the
// staged-ahead kernel (the fused q|k|v or gate|up).
// 1: the block fold only (q8_0, 32 rows a block, a row a warp, at most 32 rows an SM); 2 (the default since H100
// 12-06 21:0x, one job, alternated twice: the 27B q8_0 tg b1 12.05 / 12.04 -> 11.70 / 11.66 ms, qwen3-8b q4_K 2.862 /
// 2.867 -> 2.784 / 2.780 ms): also the group fold, for the rows of any one-token staged-ahead q8_0 product (the 27B's
// 5120-row out, o and down, two rows a warp, 640 blocks of 8 rows: a 32-row group's last block quantizes it) and of
// the q4_K int8 GEMV (qwen3-8b q4_K's o and down, a row a warp), before a product on either; 0: never.
static int resid_norm_mode() {
    static const int m = (int)std::min<int64_t>(2, std::max<int64_t>(0, env_int("DFL_CUDA_RESID_NORM", 2)));
    return m;
}

// Whether W's rows take the block fold (else the group fold): a row a warp, at most 32 rows an SM, and the block's
// 32 warps' staged words (139,264 bytes, and the fold's 256 static) within what a block may have.
static bool resid_norm_block(const CudaDevice &dev, const Weight &W) {
    const size_t smem = (size_t)32 * q8p_ahead_warp_words(1, 8) * 16 + 256;
    return q8p_ahead_rows(W) == 1 && W.n_out / 32 <= dev.sm_count() && smem <= dev.shared_optin();
}

// Whether one token of W runs on the staged-ahead q8_0 GEMV with A = 8 words (the form the folds extend), as
// launch_matmul picks it.
static bool q8p_ahead_one(const Weight &W) {
    return q8p_takes(W, 1) && q8p_ahead_words() == 8 && q8p_ahead_rows(W) > 0;
}

// Whether one token of W with its input at X runs a kernel that can fold (as the product before) or scale (as the one
// after), as launch_matmul picks it: the staged-ahead q8_0 GEMV (A = 8 words) or the q4_K int8 GEMV.
static bool resid_norm_kernel(const Weight &W, const float *X) {
    if (q8p_takes(W, 1)) return q8p_ahead_one(W);
    return W.type == DFL_TYPE_Q4_K && q4k_i8_on() && q4k_i8_ok(W, GemvZ{}) && ((uintptr_t)X & 15) == 0;
}

bool resid_norm_takes(const CudaDevice &dev, const Weight &W, int64_t T, const Weight *next, const float *y) {
    const int mode = resid_norm_mode();
    // (X of W is the quantizer's or the staging's, any alignment: only next's input decides its path)
    if (mode == 0 || T != 1 || !next || W.n_out % 32 != 0 || next->n_in != W.n_out || !resid_norm_kernel(W, nullptr) ||
        !resid_norm_kernel(*next, y))
        return false;
    return mode == 2 || (W.type == DFL_TYPE_Q8_0 && next->type == DFL_TYPE_Q8_0 && resid_norm_block(dev, W));
}

CudaDevice::QuantX launch_resid_norm(CudaDevice &dev, const Weight &W, const float *X, float *x, const float *w,
                                     float eps) {
    const int64_t n = W.n_out, nb = n / 32;
    const bool q4 = W.type == DFL_TYPE_Q4_K;
    const QuantX qx = quantize_x(dev, X, W.n_in, 1, q4, true);
    // (a folded input would be read from the buffer this fold writes)
    if (qx.rms_parts) fail(DFL_ERR_INTERNAL, "residual-norm fold: its input is a folded norm's");
    // the codes, their scales and block sums, the groups' partial sums of x^2
    const size_t q_bytes = round256((size_t)n), s_bytes = round256((size_t)nb * 4);
    uint8_t *p = (uint8_t *)dev.fold_buffer(q_bytes + 3 * s_bytes);
    QuantX out;
    out.xq = (int8_t *)p;
    out.xs = (float *)(p + q_bytes);
    out.xsum = (float *)(p + q_bytes + s_bytes);
    float *parts = (float *)(p + q_bytes + 2 * s_bytes);
    out.rms_parts = parts;
    out.rms_n_parts = (int32_t)nb;
    out.rms_n = (float)n;
    out.rms_eps = eps;
    const RmsFold in;
    const bool block = !q4 && resid_norm_block(dev, W);
    const NormFold f{x, w, out.xq, out.xs, parts, out.xsum, block ? nullptr : dev.fold_counts(nb)};
    if (q4)
        launch_q4k_fold(dev, W, qx, in, f);
    else if (block)
        launch_q8p_ahead<1, 8, 32, kFoldBlock>(dev, W, qx.xq, qx.xs, nullptr, in, f);
    else if (q8p_ahead_rows(W) == 1)
        launch_q8p_ahead<1, 8, kQ8pWarps, kFoldGroup>(dev, W, qx.xq, qx.xs, nullptr, in, f);
    else
        launch_q8p_ahead<2, 8, kQ8pWarps, kFoldGroup>(dev, W, qx.xq, qx.xs, nullptr, in, f);
    check_launch("matmul (with the residual and the next norm)");
    return out;
}

// The DeltaNet conv in its input projection's product (CudaDevice::matmul_conv1d_silu, kFoldConv; DFL_CUDA_CONV_FOLD=0
// off). Why: at one token the conv is a plain launch between the product and the gates, 2.9 us a layer of the 27B's b1
// step (0.141 of 11.45 ms left out, skip-ops H100 12-07 01:3x) for 40 KB of work. Measured (H200 12-07 06:0x, one
// job): the 27B q8_0 tg b1 9.225 / 9.213 -> 9.147 ms.
// Where: one token of one entry that records nothing, no tree, on the staged-ahead q8_0 GEMV (A = 8), K <= kConvMaxK.
bool conv_fold_takes(const Weight &W, int64_t T, const BatchMeta &m, const ConvCall &c) {
    static const bool on = env_switch("DFL_CUDA_CONV_FOLD", true);
    if (!on || T != 1 || m.T != 1 || m.n_ent != 1 || m.n_record != 0 || m.parent || skip_op("conv1d_silu")) return false;
    if (c.K < 1 || c.K > kConvMaxK || c.C > W.n_out || c.x_stride != W.n_out) return false;
    return q8p_ahead_one(W);
}

// One token of W on gemv_q8p_ahead_kernel with the conv fold, its input X quantized (or taken staged, with a fold
// before's scale).
void launch_conv_fold(CudaDevice &dev, const Weight &W, const float *X, float *Y, const BatchMeta &m, const ConvCall &c) {
    const QuantX qx = quantize_x(dev, X, W.n_in, 1, false, true);
    const RmsFold in = rms_fold(qx);
    const ConvFold conv{c.w, c.conv, m.slot, c.slot_stride, c.out, c.C, c.K};
    if (q8p_ahead_rows(W) == 1)
        launch_q8p_ahead<1, 8, kQ8pWarps, kFoldConv>(dev, W, qx.xq, qx.xs, Y, in, NormFold{}, conv);
    else
        launch_q8p_ahead<2, 8, kQ8pWarps, kFoldConv>(dev, W, qx.xq, qx.xs, Y, in, NormFold{}, conv);
    check_launch("matmul (with the conv)");
}

void launch_gemv_q8p(CudaDevice &dev, const Weight &W, const float *X, int64_t T, float *Y) {
    const int64_t nb = W.n_in / 32;
    const bool mma = T >= q8p_mma_min_tokens() && T <= i8_mma_max_tokens();
    const QuantX qx = quantize_x(dev, X, W.n_in, T, false, true);
    // codes a residual-norm fold staged carry the norm's scale apart: only the staged-ahead kernel applies it
    const RmsFold in = rms_fold(qx);
    if (in.parts && (T != 1 || mma || q8p_ahead_rows(W) == 0))
        fail(DFL_ERR_INTERNAL, "matmul: a folded norm's codes reached a q8_0 product that cannot scale them");
    const int8_t *xq = qx.xq;
    const float *xs = qx.xs;
    cudaStream_t s = dev.stream();
    const int8_t *qs = q8p_quants(W);
    const uint16_t *dw = q8p_scales(W);
    if (mma) {
        launch_q8p_mma(dev, W, qx, T, Y);
        return;
    }
    const dim3 grid((unsigned)((W.n_out + kQ8pWarps - 1) / kQ8pWarps)), block(kQ8pWarps * 32);
    for (int64_t t0 = 0; t0 < T; t0 += kQ8pMaxTokens) {
        const int nt = (int)std::min<int64_t>(kQ8pMaxTokens, T - t0);
        const int8_t *xq0 = xq + t0 * W.n_in;
        const float *xs0 = xs + t0 * nb;
        float *y0 = Y + t0 * W.n_out;
        switch (q8p_dp4a_rows(W, nt)) {
        case 1:
            if (nt == 1 && q8p_ahead_rows(W) == 1) {
                launch_q8p_ahead_one<1>(dev, W, xq0, xs0, y0, in);
                break;
            }
            launch_pdl(gemv_q8p_kernel<1>, grid, block, s, qs, dw, W.n_in, W.n_out, xq0, xs0, y0, GemvZ{});
            break;
        case 2:
            if (nt == 1 && q8p_ahead_rows(W) == 2) {
                launch_q8p_ahead_one<2>(dev, W, xq0, xs0, y0, in);
                break;
            }
            launch_q8p_rows<2>(s, nt, qs, dw, W.n_in, W.n_out, xq0, xs0, y0);
            break;
        default: launch_q8p_rows<4>(s, nt, qs, dw, W.n_in, W.n_out, xq0, xs0, y0); break;
        }
        check_launch("matmul (q8_0 dp4a)");
    }
}

void launch_gemv_q8p_z(CudaDevice &dev, const Weight &stack, int64_t rows, const GemvZ &z, int nz, const float *X,
                       float *Y) {
    // the inputs are nx consecutive rows of n_in floats, quantized as a batch of nx tokens
    const int64_t n_in = stack.n_in, nx = (nz - 1) / z.x_div + 1;
    const QuantX qx = quantize_x(dev, X, n_in, nx, false);
    const int8_t *xq = qx.xq;
    const float *xs = qx.xs;
    cudaStream_t s = dev.stream();
    // the scales of the packed stack follow all of its quants; a member's rows start w_rows rows further in each
    const int8_t *qs = q8p_quants(stack);
    const uint16_t *dw = q8p_scales(stack);
    const dim3 grid((unsigned)((rows + kQ8pWarps - 1) / kQ8pWarps), (unsigned)nz), block(kQ8pWarps * 32);
    launch_pdl(gemv_q8p_kernel<1>, grid, block, s, qs, dw, n_in, rows, xq, xs, Y, z);
    check_launch("matmul (q8_0 dp4a, z batch)");
}

// DeepSeek V4's grouped wo_a (8 groups of 1,024 rows of 4,096) at a batched decode step ran, a group at a time, a
// gather of its input columns, a quantizer, an 8-token product and a scatter; the product of a row slice of the
// repacked stack fell to the f16 tensor-core kernel (mmq_kernel<__half>, 43 us a group alone: ncu 12-07 13:1x; row
// slices keep the int8 kernels since, Weight::packed_aux). Here the input is quantized once as T rows of groups x n_in,
// and the rows kernel's group launch (blockIdx.y a group) reads each weight row once for every token. The 4-layer
// V4-Flash step on an H100, alternated twice (12-07 13:1x): b8 3.376 / 3.379 -> 2.177 / 2.171 ms, b1 unchanged.
// DFL_CUDA_GROUPED_ROWS=N: up to N (<= 16) tokens; 0: the gather. Lost (H100 12-07 15:2x, alternated twice, deleted):
// 17..64 tokens in passes of 16 (b32 13.08 / 16.27 against 13.37 / 13.12 ms: the gathered groups' int8 products were
// as fast) and one token on the group launch (b1 0.969 / 0.954 against 0.952 / 0.955 ms, b8 2.21 / 2.18 against
// 2.18 / 2.17: faster alone under ncu, 19.8 against the z batch's 22.5 us, slower in the replayed step).
bool q8p_grouped_takes(const Weight &W, int groups, int64_t T) {
    static const int64_t most = std::min<int64_t>(kQ8pMaxTokens, env_int("DFL_CUDA_GROUPED_ROWS", kQ8pMaxTokens));
    return q8p_ok(W) && groups > 1 && W.n_out % groups == 0 && T >= 2 && T <= most;
}

void launch_gemv_q8p_grouped(CudaDevice &dev, const Weight &W, int groups, const float *X, int64_t T, float *Y) {
    const int64_t rows = W.n_out / groups, x_ld = groups * W.n_in;
    const QuantX qx = quantize_x(dev, X, x_ld, T, false);
    const int8_t *qs = q8p_quants(W);
    const uint16_t *dw = q8p_scales(W);
    const int nt = (int)T;
    // rows a warp as the whole stack's (four for V4's 8,192)
    if (q8p_dp4a_rows(W, nt) == 4)
        launch_q8p_rows<4, true>(dev.stream(), nt, qs, dw, W.n_in, rows, qx.xq, qx.xs, Y, groups, x_ld, W.n_out);
    else
        launch_q8p_rows<2, true>(dev.stream(), nt, qs, dw, W.n_in, rows, qx.xq, qx.xs, Y, groups, x_ld, W.n_out);
    check_launch("matmul (q8_0 dp4a, grouped)");
}

}  // namespace cuda
}  // namespace dfl
