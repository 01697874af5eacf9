// Products on float activations that no int8 kernel takes: one warp a row (or a few warps, or R rows a warp)
// streaming each weight row once for up to kGemvMaxTokens tokens or a z batch of one-token members (GemvZ),
// decoding f32, f16, bf16, q8_0, q4_K and q6_K rows in registers with f32 accumulation; a block a row for few long
// 16-bit rows; element by element for shapes the vector kernels refuse. launch_matmul (matmul.cu) picks them.
#include <algorithm>

#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/cuda_device.h"

namespace dfl {
namespace cuda {

constexpr int kGemvWarps = 4;  // output rows per block

static bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

__device__ __forceinline__ float4 ldg4(const float *p) { return __ldg((const float4 *)p); }

__device__ __forceinline__ float dot4(float4 a, float4 b) { return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w; }

// 8 consecutive x values of token t at element i (16-byte aligned).
__device__ __forceinline__ void load_x8(const float *X, int64_t n_in, int t, int64_t i, float (&x)[8]) {
    const float4 a = ldg4(X + t * n_in + i), b = ldg4(X + t * n_in + i + 4);
    x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
}

__device__ __forceinline__ void unpack_half8(uint4 v, float (&w)[8]) {
    const __half2 *h = (const __half2 *)&v;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const float2 f = __half22float2(h[k]);
        w[2 * k] = f.x, w[2 * k + 1] = f.y;
    }
}

__device__ __forceinline__ void unpack_bf16x8(uint4 v, float (&w)[8]) {
    const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int k = 0; k < 4; k++) {
        w[2 * k] = __uint_as_float(u[k] << 16);
        w[2 * k + 1] = __uint_as_float(u[k] & 0xFFFF0000u);
    }
}

// A 16-byte word of 16-bit weights (bf16 or f16) as 8 floats.
template <bool BF16>
__device__ __forceinline__ void unpack_16bit8(uint4 v, float (&w)[8]) {
    if constexpr (BF16)
        unpack_bf16x8(v, w);
    else
        unpack_half8(v, w);
}

// Each gemv kernel: warp `w` of block b computes output row r = b * kGemvWarps + w for all NT tokens.
// Requirements checked by the dispatcher: X 16-byte aligned, n_in a multiple of 8 (and of the block size), and for
// f32/f16/bf16/q4_K rows 16-byte aligned.

// Moves W, X and Y to this block's member of a z batch (blockIdx.y; the plain launch has one member, z = 0, and an
// empty GemvZ, which moves nothing).
__device__ __forceinline__ void gemv_z_apply(const GemvZ &z, uint64_t row_bytes, const uint8_t *&W, const float *&X,
                                             float *&Y) {
    const int64_t k = blockIdx.y;
    const int64_t e = z.ids ? (int64_t)z.ids[k] : k;
    W += (uint64_t)(e * z.w_rows) * row_bytes;
    X += (k / z.x_div) * z.x_stride;
    Y += k * z.y_stride;
}

// The output row of this warp and which slice of it the warp reads. Small matrices (few rows) would leave most SMs
// idle with one warp per row, so there `wpr` warps (2 or 4) of one block share a row, each taking every wpr-th step.
struct RowSlice {
    int64_t row;
    int part;
    bool valid;
};

__device__ __forceinline__ RowSlice row_slice(int wpr, int64_t n_out) {
    const int warp = threadIdx.x >> 5;
    RowSlice s;
    s.row = (int64_t)blockIdx.x * (kGemvWarps / wpr) + warp / wpr;
    s.part = warp % wpr;
    s.valid = s.row < n_out;
    return s;
}

// Warp sums, then (wpr > 1) the slices of a row through shared memory. Every thread of the block must get here:
// rows past n_out run empty loops instead of returning early.
template <int NT>
__device__ __forceinline__ void finish_row(float (&acc)[NT], float *Y, int64_t n_out, const RowSlice &rs, int wpr) {
    __shared__ float red[kGemvWarps][NT];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float v[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) v[t] = warp_sum(acc[t]);
    if (wpr == 1) {
        if (lane == 0 && rs.valid) {
#pragma unroll
            for (int t = 0; t < NT; t++) Y[t * n_out + rs.row] = v[t];
        }
        return;
    }
    if (lane == 0) {
#pragma unroll
        for (int t = 0; t < NT; t++) red[warp][t] = v[t];
    }
    __syncthreads();
    if (lane == 0 && rs.part == 0 && rs.valid) {
#pragma unroll
        for (int t = 0; t < NT; t++) {
            float sum = 0.0f;
            for (int p = 0; p < wpr; p++) sum += red[warp + p][t];
            Y[t * n_out + rs.row] = sum;
        }
    }
}

template <int NT>
__global__ void __launch_bounds__(kGemvWarps * 32) gemv_f32_kernel(const uint8_t *W, uint64_t row_bytes, int64_t n_in,
                                                                  int64_t n_out, const float *X, float *Y, int wpr, GemvZ z) {
    gemv_z_apply(z, row_bytes, W, X, Y);
    const RowSlice rs = row_slice(wpr, n_out);
    const int64_t r = rs.row;
    const int lane = threadIdx.x & 31;
    const float *w = (const float *)(W + (uint64_t)r * row_bytes);
    float acc[NT] = {};
#pragma unroll 4
    for (int64_t i = 4 * (lane + 32 * rs.part); i < (rs.valid ? n_in : 0); i += 128 * wpr) {
        const float4 wv = ldg4(w + i);
#pragma unroll
        for (int t = 0; t < NT; t++) acc[t] += dot4(wv, ldg4(X + t * n_in + i));
    }
    finish_row<NT>(acc, Y, n_out, rs, wpr);
}

template <int NT, bool BF16>
__global__ void __launch_bounds__(kGemvWarps * 32) gemv_16bit_kernel(const uint8_t *W, uint64_t row_bytes,
                                                                    int64_t n_in, int64_t n_out, const float *X,
                                                                    float *Y, int wpr, GemvZ z) {
    gemv_z_apply(z, row_bytes, W, X, Y);
    const RowSlice rs = row_slice(wpr, n_out);
    const int64_t r = rs.row;
    const int lane = threadIdx.x & 31;
    const uint4 *w = (const uint4 *)(W + (uint64_t)r * row_bytes);
    float acc[NT] = {};
#pragma unroll 4
    for (int64_t j = lane + 32 * rs.part; j < (rs.valid ? n_in / 8 : 0); j += 32 * wpr) {
        float wf[8];
        unpack_16bit8<BF16>(__ldg(w + j), wf);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            float x[8];
            load_x8(X, n_in, t, 8 * j, x);
            float s = 0.0f;
#pragma unroll
            for (int k = 0; k < 8; k++) s += wf[k] * x[k];
            acc[t] += s;
        }
    }
    finish_row<NT>(acc, Y, n_out, rs, wpr);
}

// One token through matrices of few, long 16-bit rows (DeepSeek V4's HC mixing: 24 rows of 16,384, and its head's 4):
// a block per row, each thread a few 16-byte words, the block summing them. The warp kernel above leaves most SMs idle
// there (24 rows: 24 blocks) and walks each row's 4,096-input slices a warp at a time (~12 us a call, the 12-05
// profile). DFL_CUDA_GEMV_ROW_BLOCK=0: the warp kernel.
constexpr int kRowBlockThreads = 1024;

template <bool BF16>
__global__ void __launch_bounds__(kRowBlockThreads) gemv_16bit_row_block_kernel(const uint8_t *W, uint64_t row_bytes,
                                                                                int64_t n_in, int64_t n_out, const float *X,
                                                                                float *Y) {
    __shared__ float red[32];
    const uint4 *w = (const uint4 *)(W + (uint64_t)blockIdx.x * row_bytes);
    const int t = blockIdx.y;
    float acc = 0.0f;
    for (int64_t j = threadIdx.x; j < n_in / 8; j += blockDim.x) {
        float wf[8], x[8];
        unpack_16bit8<BF16>(__ldg(w + j), wf);
        load_x8(X, n_in, t, 8 * j, x);
        float s = 0.0f;
#pragma unroll
        for (int k = 0; k < 8; k++) s += wf[k] * x[k];
        acc += s;
    }
    acc = block_sum(acc, red);
    if (threadIdx.x == 0) Y[t * n_out + blockIdx.x] = acc;
}

static bool row_block_on() {
    static const bool on = env_switch("DFL_CUDA_GEMV_ROW_BLOCK", true);
    return on;
}

// Whether T tokens through W take gemv_16bit_row_block_kernel, a block a row and token: 16-bit rows, at most 64 of
// them, of 4,096+ inputs. (V4's head mixing of 8 tokens on the warp kernel, 4 blocks of 16,384 inputs: 39 us, ncu
// 12-07 16:5x.) Each token's sums are the one-token call's.
static bool row_block_takes(const Weight &W, int64_t T) {
    return row_block_on() && T <= kGemvMaxTokens && (W.type == DFL_TYPE_F16 || W.type == DFL_TYPE_BF16) && W.n_out <= 64 &&
           W.n_in >= 4096;
}

// q8_0: four lanes per 34-byte block (8 quants each), so a warp reads 8 consecutive blocks per step. Blocks are only
// 2-byte aligned, hence the 16-bit loads.
template <int NT>
__global__ void __launch_bounds__(kGemvWarps * 32) gemv_q8_0_kernel(const uint8_t *W, uint64_t row_bytes, int64_t n_in,
                                                                   int64_t n_out, const float *X, float *Y, int wpr, GemvZ z) {
    gemv_z_apply(z, row_bytes, W, X, Y);
    const RowSlice rs = row_slice(wpr, n_out);
    const int64_t r = rs.row;
    const int lane = threadIdx.x & 31, part = lane & 3;
    const uint8_t *row = W + (uint64_t)r * row_bytes;
    const int64_t nb = n_in / QK8_0;
    float acc[NT] = {};
#pragma unroll 4
    for (int64_t b = (lane >> 2) + 8 * rs.part; b < (rs.valid ? nb : 0); b += 8 * wpr) {
        const uint8_t *blk = row + b * kQ8_0Bytes;
        const float d = half_bits_to_f32(__ldg((const unsigned short *)blk));
        const unsigned short *qs = (const unsigned short *)(blk + 2 + 8 * part);
        float q[8];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const unsigned short v = __ldg(qs + k);
            q[2 * k] = (float)(int8_t)(v & 0xFF);
            q[2 * k + 1] = (float)(int8_t)(v >> 8);
        }
#pragma unroll
        for (int t = 0; t < NT; t++) {
            float x[8];
            load_x8(X, n_in, t, b * QK8_0 + 8 * part, x);
            float s = 0.0f;
#pragma unroll
            for (int k = 0; k < 8; k++) s += q[k] * x[k];
            acc[t] += d * s;
        }
    }
    finish_row<NT>(acc, Y, n_out, rs, wpr);
}

// q8_0 rows that start on 16-byte boundaries (row_bytes a multiple of 16, i.e. whole groups of 8 blocks = 17 words):
// the warp stages 64 blocks (136 words) of its row at a time in shared memory with 16-byte loads, up to 5 per lane
// issued back to back, so several times more bytes are in flight per instruction than with the 2-byte loads of
// gemv_q8_0_kernel; it then decodes from shared memory with four lanes per block as that kernel does.
constexpr int kQ8WideBlocks = 64;
constexpr int kQ8WideWords = kQ8WideBlocks * kQ8_0Bytes / 16;  // 136
constexpr int kQ8WideLoads = (kQ8WideWords + 31) / 32;          // 5

template <int NT>
__global__ void __launch_bounds__(kGemvWarps * 32) gemv_q8_0_wide_kernel(const uint8_t *W, uint64_t row_bytes,
                                                                        int64_t n_in, int64_t n_out, const float *X,
                                                                        float *Y, int wpr, GemvZ z) {
    gemv_z_apply(z, row_bytes, W, X, Y);
    __shared__ __align__(16) uint8_t stage[kGemvWarps][kQ8WideWords * 16];
    const RowSlice rs = row_slice(wpr, n_out);
    const int lane = threadIdx.x & 31, part = lane & 3;
    uint8_t *st = stage[threadIdx.x >> 5];
    const uint4 *roww = (const uint4 *)(W + (uint64_t)rs.row * row_bytes);
    const int64_t nb = n_in / QK8_0;
    const int64_t nwords = nb * kQ8_0Bytes / 16;
    float acc[NT] = {};
    // the loop bounds are the same for every lane of the warp, so the __syncwarp calls are reached by all
    for (int64_t c0 = (int64_t)rs.part * kQ8WideBlocks; c0 < (rs.valid ? nb : 0); c0 += (int64_t)kQ8WideBlocks * wpr) {
        const int64_t w0 = c0 * kQ8_0Bytes / 16;
        const int cw = (int)(nwords - w0 < kQ8WideWords ? nwords - w0 : kQ8WideWords);
        uint4 v[kQ8WideLoads];
#pragma unroll
        for (int k = 0; k < kQ8WideLoads; k++)
            if (lane + 32 * k < cw) v[k] = __ldg(roww + w0 + lane + 32 * k);
#pragma unroll
        for (int k = 0; k < kQ8WideLoads; k++)
            if (lane + 32 * k < cw) *(uint4 *)(st + 16 * (lane + 32 * k)) = v[k];
        __syncwarp();
        const int cb = (int)(nb - c0 < kQ8WideBlocks ? nb - c0 : kQ8WideBlocks);
#pragma unroll 4
        for (int b = lane >> 2; b < cb; b += 8) {
            const uint8_t *blk = st + b * kQ8_0Bytes;
            const float d = half_bits_to_f32(*(const uint16_t *)blk);
            const uint16_t *qs = (const uint16_t *)(blk + 2 + 8 * part);
            float q[8];
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const uint16_t u = qs[k];
                q[2 * k] = (float)(int8_t)(u & 0xFF);
                q[2 * k + 1] = (float)(int8_t)(u >> 8);
            }
#pragma unroll
            for (int t = 0; t < NT; t++) {
                float x[8];
                load_x8(X, n_in, t, (c0 + b) * QK8_0 + 8 * part, x);
                float s = 0.0f;
#pragma unroll
                for (int k = 0; k < 8; k++) s += q[k] * x[k];
                acc[t] += d * s;
            }
        }
        __syncwarp();  // the next chunk overwrites the stage
    }
    finish_row<NT>(acc, Y, n_out, rs, wpr);
}

// q4_K: eight lanes per 144-byte super-block, each lane one 16-byte load of quants (32 weights: 16 low nibbles of
// one sub-block, 16 high nibbles of the next); a warp covers four super-blocks per step.
template <int NT>
__global__ void __launch_bounds__(kGemvWarps * 32) gemv_q4_K_kernel(const uint8_t *W, uint64_t row_bytes, int64_t n_in,
                                                                   int64_t n_out, const float *X, float *Y, int wpr, GemvZ z) {
    gemv_z_apply(z, row_bytes, W, X, Y);
    const RowSlice rs = row_slice(wpr, n_out);
    const int64_t r = rs.row;
    const int lane = threadIdx.x & 31, p = lane & 7, c = p >> 1, half = p & 1;
    const uint8_t *row = W + (uint64_t)r * row_bytes;
    const int64_t nb = n_in / QK_K;
    float acc[NT] = {};
    // unrolled so the next super-block's loads are in flight while this one is decoded
#pragma unroll 2
    for (int64_t b = (lane >> 3) + 4 * rs.part; b < (rs.valid ? nb : 0); b += 4 * wpr) {
        const Q4KLane l = q4k_lane(row + b * kQ4_KBytes, p);
        const float d1 = l.d * (float)l.sc1, mm1 = l.dmin * (float)l.m1, d2 = l.d * (float)l.sc2, mm2 = l.dmin * (float)l.m2;
        const uint32_t qw[4] = {l.q.x, l.q.y, l.q.z, l.q.w};
        float lo[16], hi[16];
#pragma unroll
        for (int k = 0; k < 16; k++) {
            const uint32_t byte = (qw[k >> 2] >> (8 * (k & 3))) & 0xFF;
            lo[k] = (float)(byte & 0x0F);
            hi[k] = (float)(byte >> 4);
        }
        const int64_t e0 = b * QK_K + 64 * c + 16 * half;
#pragma unroll
        for (int t = 0; t < NT; t++) {
            float slo = 0.0f, shi = 0.0f, xlo = 0.0f, xhi = 0.0f;
#pragma unroll
            for (int k = 0; k < 16; k += 4) {
                const float4 a = ldg4(X + t * n_in + e0 + k), h = ldg4(X + t * n_in + e0 + 32 + k);
                slo += lo[k] * a.x + lo[k + 1] * a.y + lo[k + 2] * a.z + lo[k + 3] * a.w;
                shi += hi[k] * h.x + hi[k + 1] * h.y + hi[k + 2] * h.z + hi[k + 3] * h.w;
                xlo += (a.x + a.y) + (a.z + a.w);
                xhi += (h.x + h.y) + (h.z + h.w);
            }
            acc[t] += (d1 * slo - mm1 * xlo) + (d2 * shi - mm2 * xhi);
        }
    }
    finish_row<NT>(acc, Y, n_out, rs, wpr);
}

// q6_K: eight lanes per 210-byte super-block; lane p owns 8 positions l of half h = p / 4 and decodes the 4 weights
// each (one per 32-wide quarter) from two ql bytes and one qh byte. Blocks are 2-byte aligned: 16-bit loads.
template <int NT>
__global__ void __launch_bounds__(kGemvWarps * 32) gemv_q6_K_kernel(const uint8_t *W, uint64_t row_bytes, int64_t n_in,
                                                                   int64_t n_out, const float *X, float *Y, int wpr, GemvZ z) {
    gemv_z_apply(z, row_bytes, W, X, Y);
    const RowSlice rs = row_slice(wpr, n_out);
    const int64_t r = rs.row;
    const int lane = threadIdx.x & 31, p = lane & 7, h = p >> 2, l0 = 8 * (p & 3);
    const uint8_t *row = W + (uint64_t)r * row_bytes;
    const int64_t nb = n_in / QK_K;
    float acc[NT] = {};
#pragma unroll 2
    for (int64_t b = (lane >> 3) + 4 * rs.part; b < (rs.valid ? nb : 0); b += 4 * wpr) {
        const Q6KLane l = q6k_lane(row + b * kQ6_KBytes, p);
        uint8_t la[8], lb[8], hb[8];
#pragma unroll
        for (int m = 0; m < 8; m++) {
            const int w = m >> 2, sh = 8 * (m & 3);
            la[m] = (l.la[w] >> sh) & 0xFF, lb[m] = (l.lb[w] >> sh) & 0xFF, hb[m] = (l.hb[w] >> sh) & 0xFF;
        }
        const float *ds = l.ds;
        float q[4][8];
#pragma unroll
        for (int m = 0; m < 8; m++) {
            q[0][m] = (float)((int)((la[m] & 0x0F) | (((hb[m] >> 0) & 3) << 4)) - 32);
            q[1][m] = (float)((int)((lb[m] & 0x0F) | (((hb[m] >> 2) & 3) << 4)) - 32);
            q[2][m] = (float)((int)((la[m] >> 4) | (((hb[m] >> 4) & 3) << 4)) - 32);
            q[3][m] = (float)((int)((lb[m] >> 4) | (((hb[m] >> 6) & 3) << 4)) - 32);
        }
        const int64_t e0 = b * QK_K + 128 * h + l0;
#pragma unroll
        for (int t = 0; t < NT; t++) {
            float s = 0.0f;
#pragma unroll
            for (int k = 0; k < 4; k++) {
                float x[8];
                load_x8(X, n_in, t, e0 + 32 * k, x);
                float sk = 0.0f;
#pragma unroll
                for (int m = 0; m < 8; m++) sk += q[k][m] * x[m];
                s += ds[k] * sk;
            }
            acc[t] += s;
        }
    }
    finish_row<NT>(acc, Y, n_out, rs, wpr);
}

// Fallback for shapes the vector kernels do not take (unaligned pointers, odd n_in): element by element.
__global__ void gemv_generic_kernel(uint32_t type, const uint8_t *W, uint64_t row_bytes, int64_t n_in, int64_t n_out,
                                    const float *X, int64_t T, float *Y, GemvZ z) {
    gemv_z_apply(z, row_bytes, W, X, Y);
    const int64_t r = (int64_t)blockIdx.x * kGemvWarps + (threadIdx.x >> 5);
    if (r >= n_out) return;
    const int lane = threadIdx.x & 31;
    const uint8_t *row = W + (uint64_t)r * row_bytes;
    for (int64_t t = 0; t < T; t++) {
        float acc = 0.0f;
        for (int64_t i = lane; i < n_in; i += 32) acc += load_elem(type, row, i) * X[t * n_in + i];
        acc = warp_sum(acc);
        if (lane == 0) Y[t * n_out + r] = acc;
    }
}

// Warps sharing a row of a matrix of n rows: few rows share each among 2 or 4 warps so the grid
// still covers the GPU.
static int gemv_wpr(int64_t n) { return n < 1024 ? 4 : n < 2048 ? 2 : 1; }

// A call of one matrix (no z batch): the kernels that take no GemvZ may serve it.
static bool plain_call(const GemvZ &z, int nz) { return nz == 1 && !z.ids && z.w_rows == 0; }

template <int NT>
static void launch_gemv_nt(cudaStream_t s, const Weight &W, const float *X, float *Y, const GemvZ &z, int nz) {
    if constexpr (NT > 1) {
        if (plain_call(z, nz) && gemv_mma_float_takes(W.type)) return launch_gemv_mma_float(s, W, X, NT, Y);
    }
    const int wpr = gemv_wpr(W.n_out);
    const int64_t rows_per_block = kGemvWarps / wpr;
    const dim3 grid((unsigned)((W.n_out + rows_per_block - 1) / rows_per_block), (unsigned)nz);
    const dim3 block(kGemvWarps * 32);
    switch (W.type) {
    case DFL_TYPE_F32:
        gemv_f32_kernel<NT><<<grid, block, 0, s>>>(W.data, W.row_bytes, W.n_in, W.n_out, X, Y, wpr, z);
        break;
    case DFL_TYPE_F16:
        gemv_16bit_kernel<NT, false><<<grid, block, 0, s>>>(W.data, W.row_bytes, W.n_in, W.n_out, X, Y, wpr, z);
        break;
    case DFL_TYPE_BF16:
        gemv_16bit_kernel<NT, true><<<grid, block, 0, s>>>(W.data, W.row_bytes, W.n_in, W.n_out, X, Y, wpr, z);
        break;
    case DFL_TYPE_Q8_0:
        if (((uintptr_t)W.data & 15) == 0 && W.row_bytes % 16 == 0)
            gemv_q8_0_wide_kernel<NT><<<grid, block, 0, s>>>(W.data, W.row_bytes, W.n_in, W.n_out, X, Y, wpr, z);
        else
            gemv_q8_0_kernel<NT><<<grid, block, 0, s>>>(W.data, W.row_bytes, W.n_in, W.n_out, X, Y, wpr, z);
        break;
    case DFL_TYPE_Q4_K:
        gemv_q4_K_kernel<NT><<<grid, block, 0, s>>>(W.data, W.row_bytes, W.n_in, W.n_out, X, Y, wpr, z);
        break;
    case DFL_TYPE_Q6_K:
        gemv_q6_K_kernel<NT><<<grid, block, 0, s>>>(W.data, W.row_bytes, W.n_in, W.n_out, X, Y, wpr, z);
        break;
    default:
        fail(DFL_ERR_UNSUPPORTED, "matmul: unsupported weight type " + std::to_string(W.type));
    }
}

// Whether the vectorised gemv kernels can read this weight and these activations.
static bool gemv_vector_ok(const Weight &W, const float *X) {
    if (!aligned16(X) || W.n_in % 8 != 0) return false;
    switch (W.type) {
    case DFL_TYPE_F32:
    case DFL_TYPE_F16:
    case DFL_TYPE_BF16:
    case DFL_TYPE_Q4_K:
        return aligned16(W.data) && W.row_bytes % 16 == 0;
    case DFL_TYPE_Q8_0:
    case DFL_TYPE_Q6_K:
        return ((uintptr_t)W.data & 1) == 0;
    default:
        return false;
    }
}

void launch_gemv(cudaStream_t s, const Weight &W, const float *X, int64_t T, float *Y, const GemvZ &z, int nz) {
    if (plain_call(z, nz) && row_block_takes(W, T) && gemv_vector_ok(W, X)) {
        const auto kernel = W.type == DFL_TYPE_BF16 ? gemv_16bit_row_block_kernel<true> : gemv_16bit_row_block_kernel<false>;
        kernel<<<dim3((unsigned)W.n_out, (unsigned)T), kRowBlockThreads, 0, s>>>(W.data, W.row_bytes, W.n_in, W.n_out, X, Y);
        check_launch("matmul (gemv, a block a row)");
        return;
    }
    if (!gemv_vector_ok(W, X)) {
        const dim3 grid((unsigned)((W.n_out + kGemvWarps - 1) / kGemvWarps), (unsigned)nz);
        gemv_generic_kernel<<<grid, kGemvWarps * 32, 0, s>>>(W.type, W.data, W.row_bytes, W.n_in, W.n_out, X, T, Y, z);
        check_launch("matmul (gemv)");
        return;
    }
    switch (T) {
    case 1: launch_gemv_nt<1>(s, W, X, Y, z, nz); break;
    case 2: launch_gemv_nt<2>(s, W, X, Y, z, nz); break;
    case 3: launch_gemv_nt<3>(s, W, X, Y, z, nz); break;
    case 4: launch_gemv_nt<4>(s, W, X, Y, z, nz); break;
    case 5: launch_gemv_nt<5>(s, W, X, Y, z, nz); break;
    case 6: launch_gemv_nt<6>(s, W, X, Y, z, nz); break;
    case 7: launch_gemv_nt<7>(s, W, X, Y, z, nz); break;
    default: launch_gemv_nt<8>(s, W, X, Y, z, nz); break;
    }
    check_launch("matmul (gemv)");
}

// Whether the vector kernels can read every matrix and input of a z batch: the first and the second of each are
// aligned as the kernels need (the rest follow, being further steps of the same strides).
static bool gemv_z_vector_ok(const Weight &W, const float *X, const GemvZ &z) {
    Weight next = W;
    next.data = W.data + (uint64_t)z.w_rows * W.row_bytes;
    return gemv_vector_ok(W, X) && gemv_vector_ok(next, X + z.x_stride);
}

void launch_gemv_z(CudaDevice &dev, const Weight &stack, int64_t rows, const GemvZ &z, int nz, const float *X, float *Y) {
    if (nz <= 0 || rows <= 0) return;
    if (stack.packed && q8p_ok(stack) && z.x_stride == stack.n_in && !z.ids) {
        launch_gemv_q8p_z(dev, stack, rows, z, nz, X, Y);
        return;
    }
    const Weight W = stack.rows(0, rows);  // member 0's rows; the kernels move to member z's
    if (q4k_i8_on() && q4k_i8_ok(W, z) && z.x_stride == W.n_in && gemv_vector_ok(W, X)) {
        launch_gemv_q4k_i8(dev, W, X, 1, Y, z, nz);
        return;
    }
    if (gemv_z_vector_ok(W, X, z)) {
        launch_gemv_nt<1>(dev.stream(), W, X, Y, z, nz);
        check_launch("matmul (z batch)");
        return;
    }
    const dim3 grid((unsigned)((rows + kGemvWarps - 1) / kGemvWarps), (unsigned)nz);
    gemv_generic_kernel<<<grid, kGemvWarps * 32, 0, dev.stream()>>>(W.type, W.data, W.row_bytes, W.n_in, rows, X, 1, Y,
                                                                   z);
    check_launch("matmul (z batch)");
}

}  // namespace cuda
}  // namespace dfl
