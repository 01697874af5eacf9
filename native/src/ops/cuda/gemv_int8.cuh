// What the int8 GEMVs of repacked q8_0 (gemv_int8.cu) and of q4_K and q6_K (gemv_kquant.cu) share: the block's rows,
// a warp's store of its sums, and the folds' ends: the residual-norm fold (launch_resid_norm, gemv_int8.cu), which
// folds on both the staged-ahead q8_0 kernel and the q4_K one, and the conv fold of the staged-ahead kernel.
#pragma once

#include <cstdint>

#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/cuda_device.h"

namespace dfl {
namespace cuda {

constexpr int kQ8pWarps = 4;  // rows per block

// A warp's sums of output row r for NT tokens: lane 0 stores each token's. The block's main loop is done: a PDL kernel
// after this one may launch (it waits for the end of this one before it reads or writes).
template <int NT>
__device__ __forceinline__ void store_warp_rows(const float (&acc)[NT], float *Y, int64_t n_out, int64_t r,
                                                float scale = 1.0f) {
    pdl_trigger();
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const float v = warp_sum(acc[t]) * scale;
        if ((threadIdx.x & 31) == 0) Y[t * n_out + r] = v;
    }
}

// A residual-norm fold's scale for the product after it (QuantX::rms_parts; parts null: none).
struct RmsFold {
    const float *parts = nullptr;
    int n_parts = 0;
    float n = 0.0f, eps = 0.0f;
};
// What a product's kernel needs of its input's staging to apply a fold's scale.
inline RmsFold rms_fold(const CudaDevice::QuantX &q) {
    return RmsFold{q.rms_parts, q.rms_n_parts, q.rms_n, q.rms_eps};
}
// Where the fold writes: the residual x (updated in place), the norm's weights w, the next product's codes and scales,
// and a partial sum of x^2 a block of 32 rows.
struct NormFold {
    float *x = nullptr;
    const float *w = nullptr;
    int8_t *xq = nullptr;
    float *xs = nullptr;
    float *parts = nullptr;
    float *xsum = nullptr;        // where set, each block's d times its codes' sum too (a q4_K product after)
    unsigned *arrived = nullptr;  // (kFoldGroup) blocks of each 32 rows done so far: zero between launches
};
// How gemv_q8p_ahead_kernel folds the norm: not (kFoldNone); a block of 32 warps holds a quantization block of 32 rows
// (kFoldBlock); the blocks of a 32-row group count themselves in, the last quantizes them (kFoldGroup). kFoldConv: no
// norm; the DeltaNet's causal conv and SiLU on the output's first C rows (ConvFold).
constexpr int kFoldNone = 0, kFoldBlock = 1, kFoldGroup = 2, kFoldConv = 3;

// The one-token conv of a decode step's DeltaNet input projection (launch_conv_fold, kFoldConv): row c < C of the
// product is channel c's new input; with the slot's K - 1 stored inputs and the K taps it makes out[c] =
// silu(sum_j w[j C + c] window[j]), as conv1d_silu_kernel does, and the stored inputs move up by one.
struct ConvFold {
    const float *w = nullptr;       // [K][C] taps
    float *conv = nullptr;          // the layer's stored inputs of slot 0, [K - 1][C]; slot s at s slot_stride
    const int32_t *slot = nullptr;  // the entry's slot (device)
    int64_t slot_stride = 0;
    float *out = nullptr;  // [C]
    int C = 0, K = 0;
};

// The scale a fold before left to its product: rsqrt(mean(x^2) + eps) from the fold's partial sums, lane k adding
// parts k, k + 32, ... in order, then the warp's butterfly (the same bits in every warp). Read after the main loop,
// where the partials' round trip is one more latency at the warp's end, not before its first weight.
__device__ __forceinline__ float fold_scale(const RmsFold &in, int lane) {
    float s = 0.0f;
    for (int k = lane; k < in.n_parts; k += 32) s += ld_act(in.parts + k);
    return rsqrtf(warp_sum(s) / in.n + in.eps);
}

// The fold's end (gemv_q8p_ahead_kernel, FOLD): warp `warp`'s output v of row `row`; lane 0 adds it to x (add_rmsnorm's
// residual: x + d) and leaves x w and x in shared memory; then warp 0 quantizes the block's 32 values of x w as every
// int8 input is quantized (quant_q8_warp: codes and the block's scale, without the norm's scale, which the product
// after applies to its sums) and stores the block's sum of x^2 for it.
__device__ __forceinline__ void norm_fold_store(const NormFold &out, float v, int64_t row, int lane, int warp) {
    __shared__ float xw[32], xr[32];
    if (lane == 0) {
        const float xv = out.x[row] + v;
        out.x[row] = xv;
        xw[warp] = xv * __ldg(out.w + row);
        xr[warp] = xv;
    }
    __syncthreads();
    if (warp != 0) return;
    const int64_t b = row >> 5;  // (row = the block's first: warp 0's)
    quant_q8_warp(xw[lane], out.xq + row + lane, out.xs + b, out.xsum ? out.xsum + b : nullptr);
    const float ss = warp_sum(xr[lane] * xr[lane]);
    if (lane == 0) out.parts[b] = ss;
}

// A block's arrival with 32-row group g of a group fold (`blocks` blocks a group, counted in `arrived`), after a
// barrier past the block's stores: true in every thread of the group's last block, whose fence then makes the other
// blocks' stores visible to it (it clears the count for the next launch when it is done).
__device__ __forceinline__ bool fold_group_last(unsigned *arrived, int64_t g, int blocks) {
    __shared__ bool last;
    if (threadIdx.x == 0) {
        __threadfence();
        last = atomicAdd(arrived + g, 1u) == (unsigned)blocks - 1;
    }
    __syncthreads();
    if (!last) return false;
    __threadfence();
    return true;
}

// The group fold's end (kFoldGroup: blocks of fewer rows than 32, R rows a warp): each warp adds its R outputs to x;
// then the block counts itself in with its group of 32 rows (a fence first, so its x rows are visible to the others),
// and the group's last block reads the 32 rows back from L2 and quantizes x w as norm_fold_store does, then clears
// the count for the next launch. v[r]: this warp's row row0 + r.
template <int R>
__device__ __forceinline__ void norm_fold_group(const NormFold &out, const float (&v)[R], int64_t row0, int lane,
                                                int64_t block_row0, int blocks_a_group) {
    if (lane == 0)
#pragma unroll
        for (int r = 0; r < R; r++) out.x[row0 + r] += v[r];
    __syncthreads();
    const int64_t g = block_row0 >> 5;
    if (!fold_group_last(out.arrived, g, blocks_a_group) || threadIdx.x >= 32) return;
    const int64_t row = (g << 5) + lane;
    const float xv = __ldcg(out.x + row);  // (from L2: the other blocks' rows)
    quant_q8_warp(xv * __ldg(out.w + row), out.xq + row, out.xs + g, out.xsum ? out.xsum + g : nullptr);
    const float ss = warp_sum(xv * xv);
    if (lane == 0) {
        out.parts[g] = ss;
        out.arrived[g] = 0;
    }
}

// The conv of channel c (kFoldConv) from its new input v: lanes base .. base + K - 1 hold its taps, the next K - 1
// its stored inputs (cval); the sum in conv_chunk_regs' order (the same bits as conv1d_silu_kernel), then each stored
// input lane takes the one above it (the last takes v). Every lane of the warp calls it (the shuffles).
__device__ __forceinline__ void conv_fold_row(const ConvFold &f, float cval, float v, int64_t c, int lane, int base,
                                              float *cs, bool stored) {
    const int K = f.K;
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < kConvMaxK; j++) {
        if (j >= K) break;
        const float w = __shfl_sync(0xffffffffu, cval, base + j);
        const float x = j < K - 1 ? __shfl_sync(0xffffffffu, cval, base + K + j) : v;
        acc += w * x;
    }
    const float up = __shfl_down_sync(0xffffffffu, cval, 1);
    if (lane == base) f.out[c] = silu_f(acc);
    if (stored && lane >= base && lane < base + 16) *cs = lane == base + 2 * K - 2 ? v : up;
}

// One token of q4_K W on gemv_q4k_i8_kernel<1, true> (gemv_kquant.cu): the group fold of its rows for the product
// after (launch_resid_norm; qx: W's input, in: a fold before's scale, out: where this fold writes).
void launch_q4k_fold(CudaDevice &dev, const Weight &W, const CudaDevice::QuantX &qx, const RmsFold &in,
                     const NormFold &out);

}  // namespace cuda
}  // namespace dfl
