// Products on int8 activations (quantized per block of 32 by quantize_x_q8_kernel, one launch per product):
//  - q8_0 repacked at load: the quants of a row contiguous (16-byte words, no 34-byte block boundaries to straddle)
//    and the block scales beside them, so that a warp streams its row with 16-byte loads, several in flight per lane,
//    and multiplies with dp4a (four int8 products per instruction) instead of converting every weight to float: one
//    token (the batch-1 decode step), and 2..8 tokens with four rows per warp;
//  - q4_K on its own layout by dp4a, one token (and the DeepSeek V4 experts' z batches);
//  - 9..64 tokens of q8_0, 2..64 of q4_K on int8 tensor cores (mma.sync m16n8k32, one mma per block of 32).

#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/cuda_device.h"

namespace dfl {
namespace cuda {

constexpr int kQ8pWarps = 4;     // rows per block
constexpr int kQ8pUnroll = 4;    // 16-byte words per lane loaded before any is used
constexpr int kQ8pMaxTokens = 16; // tokens per pass

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
__global__ void quantize_x_q8_kernel(const float *x, int64_t n_in, int64_t T, int8_t *xq, float *xs, float *xsum) {
    pdl_trigger();
    pdl_wait();
    const int64_t nb = n_in / 32;
    const int64_t blk = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x & 31;
    if (blk >= nb * T) return;
    // rows of n_in (a multiple of 32) are contiguous: block blk is elements 32 blk.., scale and sum number blk
    quant_q8_warp(x[blk * 32 + lane], xq + blk * 32 + lane, xs + blk, xsum ? xsum + blk : nullptr);
}

// A warp's sums of output row r for NT tokens: lane 0 stores each token's.
template <int NT>
__device__ __forceinline__ void store_warp_rows(const float (&acc)[NT], float *Y, int64_t n_out, int64_t r) {
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const float v = warp_sum(acc[t]);
        if ((threadIdx.x & 31) == 0) Y[t * n_out + r] = v;
    }
}

// q4_K on int8 activations: the layout of gemv_q4_K_kernel (eight lanes per 144-byte super-block, each lane one
// 16-byte load: 16 low nibbles of sub-block 2c and 16 high nibbles of sub-block 2c + 1), the products by dp4a on the
// nibbles and the activations' int8 words: w.x = d sc (q . xq) xs - dmin m xsum per sub-block of 32, the minimum term
// once per sub-block (by the lane of the first half). One token per z member (GemvZ) or NT tokens.
template <int NT>
__global__ void __launch_bounds__(kQ8pWarps * 32) gemv_q4k_i8_kernel(const uint8_t *W, uint64_t row_bytes, int64_t n_in,
                                                                   int64_t n_out, const int8_t *xq, const float *xs,
                                                                   const float *xsum, float *Y, GemvZ z) {
    const int64_t nb32 = n_in / 32;
    {
        const int64_t k = blockIdx.y;
        const int64_t e = z.ids ? (int64_t)z.ids[k] : k;
        W += (uint64_t)(e * z.w_rows) * row_bytes;
        const int64_t xi = k / z.x_div;  // the input's row of the quantized batch
        xq += xi * n_in;
        xs += xi * nb32;
        xsum += xi * nb32;
        Y += k * z.y_stride;
    }
    const int lane = threadIdx.x & 31, p = lane & 7, c = p >> 1, half = p & 1;
    const int64_t r = (int64_t)blockIdx.x * kQ8pWarps + (threadIdx.x >> 5);
    if (r >= n_out) return;
    const uint8_t *row = W + (uint64_t)r * row_bytes;
    const int64_t nb = n_in / QK_K;
    float acc[NT] = {};
#pragma unroll 2
    for (int64_t b = lane >> 3; b < nb; b += 4) {
        const Q4KLane l = q4k_lane(row + b * kQ4_KBytes, p);
        const float d = l.d, dmin = l.dmin;
        const int sc1 = l.sc1, m1 = l.m1, sc2 = l.sc2, m2 = l.m2;
        const int qw[4] = {(int)l.q.x, (int)l.q.y, (int)l.q.z, (int)l.q.w};
        const int64_t s1 = b * 8 + 2 * c, s2 = s1 + 1;  // the two sub-blocks' indices among the row's blocks of 32
        const int64_t e0 = b * QK_K + 64 * c + 16 * half;
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const int4 xa = __ldg((const int4 *)(xq + t * n_in + e0));
            const int4 xb = __ldg((const int4 *)(xq + t * n_in + e0 + 32));
            int lo = __dp4a(qw[0] & 0x0F0F0F0F, xa.x, 0);
            lo = __dp4a(qw[1] & 0x0F0F0F0F, xa.y, lo);
            lo = __dp4a(qw[2] & 0x0F0F0F0F, xa.z, lo);
            lo = __dp4a(qw[3] & 0x0F0F0F0F, xa.w, lo);
            int hi = __dp4a((qw[0] >> 4) & 0x0F0F0F0F, xb.x, 0);
            hi = __dp4a((qw[1] >> 4) & 0x0F0F0F0F, xb.y, hi);
            hi = __dp4a((qw[2] >> 4) & 0x0F0F0F0F, xb.z, hi);
            hi = __dp4a((qw[3] >> 4) & 0x0F0F0F0F, xb.w, hi);
            const float *xst = xs + t * nb32, *xmt = xsum + t * nb32;
            float v = d * ((float)sc1 * __ldg(xst + s1) * (float)lo + (float)sc2 * __ldg(xst + s2) * (float)hi);
            if (half == 0) v -= dmin * ((float)m1 * __ldg(xmt + s1) + (float)m2 * __ldg(xmt + s2));
            acc[t] += v;
        }
    }
    store_warp_rows<NT>(acc, Y, n_out, r);
}

// q6_K on int8 activations: the layout of gemv_q6_K_kernel (eight lanes per 210-byte super-block; lane p takes half
// h = p / 4 and positions l0 = 8 (p % 4) .. l0 + 7 of each of the half's four 32-wide quarters). The 6-bit codes are
// assembled four to a word (the low nibble from ql, the two high bits from qh, minus 32 byte by byte) and multiplied
// with the activations' int8 words by dp4a; a quarter's eight positions share one 16-element scale and one block of
// 32 activations (q6k_lane).
template <int NT>
__global__ void __launch_bounds__(kQ8pWarps * 32) gemv_q6k_i8_kernel(const uint8_t *W, uint64_t row_bytes, int64_t n_in,
                                                                   int64_t n_out, const int8_t *xq, const float *xs,
                                                                   float *Y) {
    const int lane = threadIdx.x & 31, p = lane & 7, h = p >> 2, l0 = 8 * (p & 3);
    const int64_t r = (int64_t)blockIdx.x * kQ8pWarps + (threadIdx.x >> 5);
    if (r >= n_out) return;
    const uint8_t *row = W + (uint64_t)r * row_bytes;
    const int64_t nb = n_in / QK_K, nb32 = n_in / 32;
    float acc[NT] = {};
#pragma unroll 2
    for (int64_t b = lane >> 3; b < nb; b += 4) {
        const Q6KLane l = q6k_lane(row + b * kQ6_KBytes, p);
        const uint32_t *la = l.la, *lb = l.lb, *hb = l.hb;
        int q[4][2];
#pragma unroll
        for (int w = 0; w < 2; w++) {
            q[0][w] = (int)__vsub4((la[w] & 0x0F0F0F0F) | ((hb[w] & 0x03030303) << 4), 0x20202020);
            q[1][w] = (int)__vsub4((lb[w] & 0x0F0F0F0F) | (((hb[w] >> 2) & 0x03030303) << 4), 0x20202020);
            q[2][w] = (int)__vsub4(((la[w] >> 4) & 0x0F0F0F0F) | (((hb[w] >> 4) & 0x03030303) << 4), 0x20202020);
            q[3][w] = (int)__vsub4(((lb[w] >> 4) & 0x0F0F0F0F) | (((hb[w] >> 6) & 0x03030303) << 4), 0x20202020);
        }
        const float *dsc = l.ds;
        const int64_t e0 = b * QK_K + 128 * h + l0;
#pragma unroll
        for (int t = 0; t < NT; t++) {
            float s = 0.0f;
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const int64_t e = e0 + 32 * k;
                const int2 xv = __ldg((const int2 *)(xq + t * n_in + e));
                const int dot = __dp4a(q[k][1], xv.y, __dp4a(q[k][0], xv.x, 0));
                s += dsc[k] * __ldg(xs + t * nb32 + e / 32) * (float)dot;
            }
            acc[t] += s;
        }
    }
    store_warp_rows<NT>(acc, Y, n_out, r);
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
    // do not depend on it, so their latency overlaps the kernels before this one.
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
                const int4 xv = __ldg((const int4 *)(xq + t * n_in) + i);
                int s = __dp4a((int)wv[u].x, xv.x, 0);
                s = __dp4a((int)wv[u].y, xv.y, s);
                s = __dp4a((int)wv[u].z, xv.z, s);
                s = __dp4a((int)wv[u].w, xv.w, s);
                acc[t] += (float)s * sw * __ldg(xs + t * nb + b);
            }
        }
    }
    store_warp_rows<NT>(acc, Y, n_out, row);
}

// Several tokens (a batched decode step, a DFlash verify block): each warp takes R rows, so that every activation word
// a lane loads (and its scale) serves R rows' dp4a, and the R weight rows stream with 16-byte loads side by side.
// With one row per warp the activation loads, not the weights, bound the kernel from about four tokens on.
template <int NT, int R>
__global__ void __launch_bounds__(kQ8pWarps * 32) gemv_q8p_rows_kernel(const int8_t *qs, const uint16_t *dw,
                                                                     int64_t n_in, int64_t n_out, const int8_t *xq,
                                                                     const float *xs, float *Y) {
    const int lane = threadIdx.x & 31;
    const int64_t row0 = ((int64_t)blockIdx.x * kQ8pWarps + (threadIdx.x >> 5)) * R;
    if (row0 >= n_out) return;
    const int64_t nw = n_in / 16, nb = n_in / 32;
    const uint4 *w[R];
    const uint16_t *d[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        const int64_t row = min(row0 + r, n_out - 1);  // a short last group repeats its last row, never stored
        w[r] = (const uint4 *)(qs + row * n_in);
        d[r] = dw + row * nb;
    }
    float acc[R][NT] = {};
    for (int64_t i = lane; i < nw; i += 32) {
        uint4 wv[R];
        float sw[R];
#pragma unroll
        for (int r = 0; r < R; r++) {
            wv[r] = __ldg(w[r] + i);
            sw[r] = half_bits_to_f32(__ldg(d[r] + (i >> 1)));
        }
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const int4 xv = __ldg((const int4 *)(xq + t * n_in) + i);
            const float sx = __ldg(xs + t * nb + (i >> 1));
#pragma unroll
            for (int r = 0; r < R; r++) {
                int s = __dp4a((int)wv[r].x, xv.x, 0);
                s = __dp4a((int)wv[r].y, xv.y, s);
                s = __dp4a((int)wv[r].z, xv.z, s);
                s = __dp4a((int)wv[r].w, xv.w, s);
                acc[r][t] += (float)s * (sw[r] * sx);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const float v = warp_sum(acc[r][t]);
            if (lane == 0 && row0 + r < n_out) Y[t * n_out + row0 + r] = v;
        }
}

// Batched decode, verify blocks and small prefill chunks (2..64 tokens) on int8 tensor cores: one
// mma.sync.m16n8k32 is exactly one q8_0 block of 16 weight rows against 8 tokens, so its int32 result takes the block's
// two scales (the weight row's and the token's) as it is added to the float sums. A warp owns 16 MT rows and every
// token (8 per n-tile), and reads every kMmaWarps-th block of the row; the block's warps then add their sums through
// shared memory. The weights are read once per call and each byte feeds all the tokens, where the dp4a kernels spend
// one activation load per token per 16 weight bytes.
// Fragments: lane (g = lane / 4, t4 = lane % 4) reads 8 consecutive bytes at 8 t4 of a block for rows g and g + 8 and
// for token g. The mma's k order is permuted the same way for both operands (bytes 0..3 are its k 4 t4.., bytes 4..7
// its k 16 + 4 t4..), which leaves every dot product as it is, and each lane loads 8 contiguous bytes.
constexpr int kMmaWarps = 8;
constexpr int kMmaUnroll = 4;  // blocks of 32 per row whose loads are in flight before the first is used
constexpr int64_t kI8MmaMaxTokens = 64;
// Repacked q8_0 takes the dp4a kernels up to 8 tokens: H200, qwen3-8b layer shapes, dp4a 80 / 105 us a layer at 2 / 8
// tokens against the mma kernel's 118 / 128; from 16 tokens the mma kernel wins (149 against 211 us, 231 against 466
// at 32).
constexpr int64_t kQ8pMmaMinTokens = 9;

__device__ __forceinline__ void mma_s8_16x8x32(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                               uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};\n"
        : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(0));
}

// Where a lane of an mma kernel reads per tile of 8 tokens: its B fragment's token row (token 8 nt + g: x) and the
// scale rows of the two tokens of its C entries (8 nt + 2 t4 and the next: s). Tokens past T read the last one (their
// sums are never stored). 32-bit offsets (at most 64 tokens): registers are what limits these kernels.
template <int NT8>
struct MmaTokens {
    int x[NT8], s[NT8][2];
    __device__ __forceinline__ MmaTokens(int64_t T, int64_t n_in, int64_t nb, int g, int t4) {
#pragma unroll
        for (int nt = 0; nt < NT8; nt++) {
            x[nt] = (int)(min((int64_t)(8 * nt + g), T - 1) * n_in);
            s[nt][0] = (int)(min((int64_t)(8 * nt + 2 * t4), T - 1) * nb);
            s[nt][1] = (int)(min((int64_t)(8 * nt + 2 * t4 + 1), T - 1) * nb);
        }
    }
};

// The warps' sums of one block of an mma kernel added through shared memory and stored. The C fragment: entry i of lane
// l is row l / 4 + 8 (i / 2), token 2 (l % 4) + i % 2 of its 16 x 8 tile.
template <int MT, int NT8>
__device__ __forceinline__ void mma_store(float (&red)[kMmaWarps][MT * NT8 * 4][32], const float (&acc)[MT][NT8][4],
                                          int64_t row0, int64_t n_out, int64_t T, float *Y) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < NT8; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) red[warp][(mt * NT8 + nt) * 4 + i][lane] = acc[mt][nt][i];
    __syncthreads();
    for (int o = threadIdx.x; o < MT * NT8 * 4 * 32; o += kMmaWarps * 32) {
        const int f = o >> 5, l = o & 31, i = f & 3, nt = (f >> 2) % NT8, mt = (f >> 2) / NT8;
        float v = 0.0f;
#pragma unroll
        for (int w = 0; w < kMmaWarps; w++) v += red[w][f][l];
        const int64_t row = row0 + 16 * mt + (l >> 2) + 8 * (i >> 1), tok = 8 * nt + 2 * (l & 3) + (i & 1);
        if (row < n_out && tok < T) Y[tok * n_out + row] = v;
    }
}

template <int MT, int NT8>
__global__ void __launch_bounds__(kMmaWarps * 32) gemv_q8p_mma_kernel(const int8_t *qs, const uint16_t *dw, int64_t n_in,
                                                                    int64_t n_out, const int8_t *xq, const float *xs,
                                                                    int64_t T, float *Y) {
    __shared__ float red[kMmaWarps][MT * NT8 * 4][32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t4 = lane & 3;
    const int64_t nb = n_in / 32, row0 = (int64_t)blockIdx.x * 16 * MT;
    // rows past n_out and tokens past T read the last valid one; their sums are never stored
    int64_t wrow[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int h = 0; h < 2; h++) wrow[mt][h] = min(row0 + 16 * mt + 8 * h + g, n_out - 1);
    const MmaTokens<NT8> tok(T, n_in, nb, g, t4);
    const int(&xtok)[NT8] = tok.x;
    const int(&stok)[NT8][2] = tok.s;
    float acc[MT][NT8][4] = {};
    for (int64_t kb0 = warp; kb0 < nb; kb0 += kMmaWarps * kMmaUnroll) {
        uint2 av[kMmaUnroll][MT][2];
#pragma unroll
        for (int u = 0; u < kMmaUnroll; u++) {
            const int64_t kb = kb0 + u * kMmaWarps;
            if (kb < nb) {
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int h = 0; h < 2; h++)
                        av[u][mt][h] = __ldg((const uint2 *)(qs + wrow[mt][h] * n_in + kb * 32) + t4);
            }
        }
#pragma unroll
        for (int u = 0; u < kMmaUnroll; u++) {
            const int64_t kb = kb0 + u * kMmaWarps;
            if (kb >= nb) break;
            float sw[MT][2];
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int h = 0; h < 2; h++) sw[mt][h] = half_bits_to_f32(__ldg(dw + wrow[mt][h] * nb + kb));
#pragma unroll
            for (int nt = 0; nt < NT8; nt++) {
                const uint2 bv = __ldg((const uint2 *)(xq + xtok[nt] + kb * 32) + t4);
                const float s0 = __ldg(xs + stok[nt][0] + kb), s1 = __ldg(xs + stok[nt][1] + kb);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    int c[4];
                    mma_s8_16x8x32(c, av[u][mt][0].x, av[u][mt][1].x, av[u][mt][0].y, av[u][mt][1].y, bv.x, bv.y);
                    acc[mt][nt][0] += (float)c[0] * (sw[mt][0] * s0);
                    acc[mt][nt][1] += (float)c[1] * (sw[mt][0] * s1);
                    acc[mt][nt][2] += (float)c[2] * (sw[mt][1] * s0);
                    acc[mt][nt][3] += (float)c[3] * (sw[mt][1] * s1);
                }
            }
        }
    }
    mma_store<MT, NT8>(red, acc, row0, n_out, T, Y);
}

// q4_K on int8 tensor cores, 2..64 tokens, on the file's own layout: each sub-block of 32 is one mma of 16 rows x 8
// tokens, w.x = d sc xs (q . xq) - dmin m xsum per sub-block (xsum: the token's block sum, from the quantizer). A lane
// reads, per row and super-block, the 16-byte header (d, dmin, the packed 6-bit scales) and 8 bytes of each 32-byte
// quant chunk j at 8 t4: their low nibbles are its fragment of sub-block 2j, their high nibbles of sub-block 2j + 1,
// in the same permuted k order as the q8_0 kernel. Warps split the super-blocks of the rows.
template <int MT, int NT8>
__global__ void __launch_bounds__(kMmaWarps * 32) gemv_q4k_mma_kernel(const uint8_t *W, uint64_t row_bytes, int64_t n_in,
                                                                    int64_t n_out, const int8_t *xq, const float *xs,
                                                                    const float *xsum, int64_t T, float *Y) {
    __shared__ float red[kMmaWarps][MT * NT8 * 4][32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t4 = lane & 3;
    const int64_t nsb = n_in / QK_K, nb = n_in / 32, row0 = (int64_t)blockIdx.x * 16 * MT;
    const uint8_t *wrow[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int h = 0; h < 2; h++) wrow[mt][h] = W + (uint64_t)min(row0 + 16 * mt + 8 * h + g, n_out - 1) * row_bytes;
    const MmaTokens<NT8> tok(T, n_in, nb, g, t4);
    const int(&xtok)[NT8] = tok.x;
    const int(&stok)[NT8][2] = tok.s;
    float acc[MT][NT8][4] = {};
    for (int64_t sb = warp; sb < nsb; sb += kMmaWarps) {
        uint4 hdr[MT][2];
        uint2 q[MT][2][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const uint8_t *blk = wrow[mt][h] + sb * kQ4_KBytes;
                hdr[mt][h] = __ldg((const uint4 *)blk);
#pragma unroll
                for (int j = 0; j < 4; j++) q[mt][h][j] = __ldg((const uint2 *)(blk + 16 + 32 * j) + t4);
            }
#pragma unroll
        for (int s = 0; s < 8; s++) {
            const int j = s >> 1, shift = 4 * (s & 1);
            float dsc[MT][2], dm[MT][2];
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    int sc, m;
                    q4k_scale_min_hdr(hdr[mt][h], s, sc, m);
                    dsc[mt][h] = half_bits_to_f32((uint16_t)(hdr[mt][h].x & 0xFFFF)) * (float)sc;
                    dm[mt][h] = half_bits_to_f32((uint16_t)(hdr[mt][h].x >> 16)) * (float)m;
                }
            const int64_t kb = sb * 8 + s;
#pragma unroll
            for (int nt = 0; nt < NT8; nt++) {
                const uint2 bv = __ldg((const uint2 *)(xq + xtok[nt] + kb * 32) + t4);
                const float s0 = __ldg(xs + stok[nt][0] + kb), s1 = __ldg(xs + stok[nt][1] + kb);
                const float m0 = __ldg(xsum + stok[nt][0] + kb), m1 = __ldg(xsum + stok[nt][1] + kb);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    int c[4];
                    mma_s8_16x8x32(c, (q[mt][0][j].x >> shift) & 0x0F0F0F0F, (q[mt][1][j].x >> shift) & 0x0F0F0F0F,
                                   (q[mt][0][j].y >> shift) & 0x0F0F0F0F, (q[mt][1][j].y >> shift) & 0x0F0F0F0F, bv.x,
                                   bv.y);
                    acc[mt][nt][0] += (float)c[0] * (dsc[mt][0] * s0) - dm[mt][0] * m0;
                    acc[mt][nt][1] += (float)c[1] * (dsc[mt][0] * s1) - dm[mt][0] * m1;
                    acc[mt][nt][2] += (float)c[2] * (dsc[mt][1] * s0) - dm[mt][1] * m0;
                    acc[mt][nt][3] += (float)c[3] * (dsc[mt][1] * s1) - dm[mt][1] * m1;
                }
            }
        }
    }
    mma_store<MT, NT8>(red, acc, row0, n_out, T, Y);
}

// Whether 2..64-token products on repacked q8_0 and on q4_K run on int8 tensor cores (gemv_q8p_mma_kernel,
// gemv_q4k_mma_kernel): on unless DFL_CUDA_I8_MMA=0 (the dp4a and f16 kernels then, for comparisons in one run).
static bool i8_mma_on() {
    static const bool on = env_switch("DFL_CUDA_I8_MMA", true);
    return on;
}

int64_t i8_mma_max_tokens() { return i8_mma_on() ? kI8MmaMaxTokens : 0; }

// Picks an mma kernel's tiling for T tokens and n_out rows and calls launch(grid, MT, NT8) with MT and NT8 as
// std::integral_constant: 8-token tiles; 32 rows per warp (half the activation loads) where n_out / 32 gives every SM a
// block and the shared sums (32 rows x 32 tokens at most) fit, else 16.
template <typename Launch>
static void dispatch_mma(CudaDevice &dev, int64_t n_out, int64_t T, Launch &&launch) {
    using std::integral_constant;
    const int nt8 = (int)((T + 7) / 8);
    const bool two = nt8 <= 4 && n_out / 32 >= dev.sm_count();
    const dim3 grid((unsigned)(two ? (n_out + 31) / 32 : (n_out + 15) / 16));
    if (two) {
        switch (nt8) {
        case 1: launch(grid, integral_constant<int, 2>{}, integral_constant<int, 1>{}); break;
        case 2: launch(grid, integral_constant<int, 2>{}, integral_constant<int, 2>{}); break;
        case 3: launch(grid, integral_constant<int, 2>{}, integral_constant<int, 3>{}); break;
        default: launch(grid, integral_constant<int, 2>{}, integral_constant<int, 4>{}); break;
        }
        return;
    }
    switch (nt8) {
    case 1: launch(grid, integral_constant<int, 1>{}, integral_constant<int, 1>{}); break;
    case 2: launch(grid, integral_constant<int, 1>{}, integral_constant<int, 2>{}); break;
    case 3: launch(grid, integral_constant<int, 1>{}, integral_constant<int, 3>{}); break;
    case 4: launch(grid, integral_constant<int, 1>{}, integral_constant<int, 4>{}); break;
    case 5: launch(grid, integral_constant<int, 1>{}, integral_constant<int, 5>{}); break;
    case 6: launch(grid, integral_constant<int, 1>{}, integral_constant<int, 6>{}); break;
    case 7: launch(grid, integral_constant<int, 1>{}, integral_constant<int, 7>{}); break;
    default: launch(grid, integral_constant<int, 1>{}, integral_constant<int, 8>{}); break;
    }
}

template <int R>
static void launch_q8p_rows(cudaStream_t s, int nt, const int8_t *qs, const uint16_t *dw, int64_t n_in, int64_t n_out,
                            const int8_t *xq, const float *xs, float *y) {
    const dim3 grid((unsigned)((n_out + kQ8pWarps * R - 1) / (kQ8pWarps * R))), block(kQ8pWarps * 32);
#define DFL_Q8P_ROWS(N) \
    case N: gemv_q8p_rows_kernel<N, R><<<grid, block, 0, s>>>(qs, dw, n_in, n_out, xq, xs, y); break;
    switch (nt) {
        DFL_Q8P_ROWS(2) DFL_Q8P_ROWS(3) DFL_Q8P_ROWS(4) DFL_Q8P_ROWS(5) DFL_Q8P_ROWS(6) DFL_Q8P_ROWS(7)
        DFL_Q8P_ROWS(8) DFL_Q8P_ROWS(9) DFL_Q8P_ROWS(10) DFL_Q8P_ROWS(11) DFL_Q8P_ROWS(12) DFL_Q8P_ROWS(13)
        DFL_Q8P_ROWS(14) DFL_Q8P_ROWS(15) DFL_Q8P_ROWS(16)
    }
#undef DFL_Q8P_ROWS
}

// The activations of a product on int8 weights, in the device scratch: rows of int8 per block of 32, their scales and,
// for q4_K (sums), each block's sum of the rounded values times its scale. The quantizer is a PDL launch (the
// product after it may load its weights meanwhile).
using QuantX = CudaDevice::QuantX;

static QuantX quantize_x(CudaDevice &dev, const float *X, int64_t n_in, int64_t rows, bool sums) {
    QuantX staged;
    if (dev.take_staged(X, rows * n_in, &staged)) return staged;  // the norm or SwiGLU before quantized X
    const QuantX q = dev.quant_scratch(rows * n_in, sums);
    launch_pdl(quantize_x_q8_kernel, grid_for(rows * n_in, 256), 256, dev.stream(), X, n_in, rows, q.xq, q.xs, q.xsum);
    check_launch("matmul (quantize x)");
    return q;
}

bool q8p_ok(const Weight &W) { return W.packed != nullptr && W.type == DFL_TYPE_Q8_0 && W.n_in % 32 == 0; }

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
}

void launch_gemv_q8p(CudaDevice &dev, const Weight &W, const float *X, int64_t T, float *Y) {
    const int64_t nb = W.n_in / 32;
    const QuantX qx = quantize_x(dev, X, W.n_in, T, false);
    const int8_t *xq = qx.xq;
    const float *xs = qx.xs;
    cudaStream_t s = dev.stream();
    const int8_t *qs = (const int8_t *)W.packed;
    const uint16_t *dw = (const uint16_t *)(W.packed + (size_t)(W.n_out * W.n_in));
    if (T >= kQ8pMmaMinTokens && T <= i8_mma_max_tokens()) {
        dispatch_mma(dev, W.n_out, T, [&](dim3 grid, auto mt, auto nt8) {
            gemv_q8p_mma_kernel<decltype(mt)::value, decltype(nt8)::value>
                <<<grid, kMmaWarps * 32, 0, s>>>(qs, dw, W.n_in, W.n_out, xq, xs, T, Y);
        });
        check_launch("matmul (q8_0 int8 mma)");
        return;
    }
    const dim3 grid((unsigned)((W.n_out + kQ8pWarps - 1) / kQ8pWarps)), block(kQ8pWarps * 32);
    // Groups of four rows per warp need enough of them to fill the GPU (132 SMs x 2 blocks of 16 rows).
    const bool wide = W.n_out >= 4224;
    for (int64_t t0 = 0; t0 < T; t0 += kQ8pMaxTokens) {
        const int nt = (int)std::min<int64_t>(kQ8pMaxTokens, T - t0);
        const int8_t *xq0 = xq + t0 * W.n_in;
        const float *xs0 = xs + t0 * nb;
        float *y0 = Y + t0 * W.n_out;
        if (nt == 1) {
            launch_pdl(gemv_q8p_kernel<1>, grid, block, s, qs, dw, W.n_in, W.n_out, xq0, xs0, y0, GemvZ{});
        } else if (wide) {
            launch_q8p_rows<4>(s, nt, qs, dw, W.n_in, W.n_out, xq0, xs0, y0);
        } else {
            launch_q8p_rows<2>(s, nt, qs, dw, W.n_in, W.n_out, xq0, xs0, y0);
        }
        check_launch("matmul (q8_0 dp4a)");
    }
}

// Whether one-token q4_K products (and the z-batched expert pairs) run on int8 activations (gemv_q4k_i8_kernel): on
// unless DFL_CUDA_Q4K_I8=0 (the float GEMV). H200, qwen3-8b layer shapes: 54 us a layer against the float GEMV's 127.
bool q4k_i8_on() {
    static const bool on = env_switch("DFL_CUDA_Q4K_I8", true);
    return on;
}

bool q4k_i8_ok(const Weight &W, const GemvZ &z) {
    if (W.type != DFL_TYPE_Q4_K || W.n_in % QK_K != 0 || W.row_bytes % 16 != 0 || ((uintptr_t)W.data & 15) != 0)
        return false;
    return ((uint64_t)z.w_rows * W.row_bytes) % 16 == 0;
}

void launch_gemv_q4k_i8(CudaDevice &dev, const Weight &W, const float *X, int64_t T, float *Y, const GemvZ &z, int nz) {
    // T tokens, or nz z members of one token each reading nx distinct inputs (x_stride must be n_in)
    const int64_t nx = nz > 1 ? (nz - 1) / z.x_div + 1 : T;
    if (nz > 1 && z.x_stride != W.n_in) fail(DFL_ERR_INTERNAL, "q4_K int8 z batch: inputs must be consecutive rows");
    const QuantX qx = quantize_x(dev, X, W.n_in, nx, true);
    const int8_t *xq = qx.xq;
    const float *xs = qx.xs;
    const float *xsum = qx.xsum;
    cudaStream_t s = dev.stream();
    const dim3 grid((unsigned)((W.n_out + kQ8pWarps - 1) / kQ8pWarps), (unsigned)nz), block(kQ8pWarps * 32);
    if (nz > 1) {
        gemv_q4k_i8_kernel<1><<<grid, block, 0, s>>>(W.data, W.row_bytes, W.n_in, W.n_out, xq, xs, xsum, Y, z);
    } else {
        switch (T) {
#define DFL_Q4K_I8(N) \
    case N: gemv_q4k_i8_kernel<N><<<grid, block, 0, s>>>(W.data, W.row_bytes, W.n_in, W.n_out, xq, xs, xsum, Y, z); break;
            DFL_Q4K_I8(1) DFL_Q4K_I8(2) DFL_Q4K_I8(3) DFL_Q4K_I8(4) DFL_Q4K_I8(5) DFL_Q4K_I8(6) DFL_Q4K_I8(7)
            DFL_Q4K_I8(8)
#undef DFL_Q4K_I8
        default: fail(DFL_ERR_INTERNAL, "q4_K int8 GEMV: more than 8 tokens");
        }
    }
    check_launch("matmul (q4_K int8)");
}

// Whether q6_K products of up to 8 tokens run on int8 activations (gemv_q6k_i8_kernel): DFL_CUDA_Q6K_I8=1 (off by
// default until measured against the float GEMV on a GPU).
bool q6k_i8_on() {
    static const bool on = env_switch("DFL_CUDA_Q6K_I8", false);
    return on;
}

bool q6k_i8_ok(const Weight &W) { return W.type == DFL_TYPE_Q6_K && W.n_in % QK_K == 0 && ((uintptr_t)W.data & 1) == 0; }

void launch_gemv_q6k_i8(CudaDevice &dev, const Weight &W, const float *X, int64_t T, float *Y) {
    const QuantX qx = quantize_x(dev, X, W.n_in, T, false);
    const int8_t *xq = qx.xq;
    const float *xs = qx.xs;
    cudaStream_t s = dev.stream();
    const dim3 grid((unsigned)((W.n_out + kQ8pWarps - 1) / kQ8pWarps)), block(kQ8pWarps * 32);
    switch (T) {
#define DFL_Q6K_I8(N) \
    case N: gemv_q6k_i8_kernel<N><<<grid, block, 0, s>>>(W.data, W.row_bytes, W.n_in, W.n_out, xq, xs, Y); break;
        DFL_Q6K_I8(1) DFL_Q6K_I8(2) DFL_Q6K_I8(3) DFL_Q6K_I8(4) DFL_Q6K_I8(5) DFL_Q6K_I8(6) DFL_Q6K_I8(7) DFL_Q6K_I8(8)
#undef DFL_Q6K_I8
    default: fail(DFL_ERR_INTERNAL, "q6_K int8 GEMV: more than 8 tokens");
    }
    check_launch("matmul (q6_K int8)");
}

bool q4k_mma_ok(const Weight &W) {
    return W.type == DFL_TYPE_Q4_K && W.n_in % QK_K == 0 && W.row_bytes % 16 == 0 && ((uintptr_t)W.data & 15) == 0;
}

void launch_gemv_q4k_mma(CudaDevice &dev, const Weight &W, const float *X, int64_t T, float *Y) {
    const QuantX qx = quantize_x(dev, X, W.n_in, T, true);
    const int8_t *xq = qx.xq;
    const float *xs = qx.xs;
    const float *xsum = qx.xsum;
    cudaStream_t s = dev.stream();
    dispatch_mma(dev, W.n_out, T, [&](dim3 grid, auto mt, auto nt8) {
        gemv_q4k_mma_kernel<decltype(mt)::value, decltype(nt8)::value>
            <<<grid, kMmaWarps * 32, 0, s>>>(W.data, W.row_bytes, W.n_in, W.n_out, xq, xs, xsum, T, Y);
    });
    check_launch("matmul (q4_K int8 mma)");
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
    const int8_t *qs = (const int8_t *)stack.packed;
    const uint16_t *dw = (const uint16_t *)(stack.packed + (size_t)(stack.n_out * n_in));
    const dim3 grid((unsigned)((rows + kQ8pWarps - 1) / kQ8pWarps), (unsigned)nz), block(kQ8pWarps * 32);
    launch_pdl(gemv_q8p_kernel<1>, grid, block, s, qs, dw, n_in, rows, xq, xs, Y, z);
    check_launch("matmul (q8_0 dp4a, z batch)");
}

}  // namespace cuda
}  // namespace dfl
