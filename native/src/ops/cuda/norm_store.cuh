// What the row norms and the kernels that end in one (DeepSeek V4's hc_pre_norm) share: a normed value's store with
// its int8 quantization for the product after it.
#pragma once

#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/cuda_device.h"
#include "ops/cuda/mma_int8.cuh"

namespace dfl {
namespace cuda {

// A normed row's values, and where q.xq is set its int8 quantization for the product that follows (CudaDevice::
// stage_quant; n a multiple of 32, so a warp's 32 lanes always hold one block of 32 together).
__device__ __forceinline__ void store_normed(float *yr, int64_t i, float v, const CudaDevice::QuantX &q) {
    yr[i] = v;
    if (q.xq) quant_q8_store(q, v, i);
}

// q offset to row `row` (a row norm's block: blockIdx.x) of n elements (its fragment-ordered copy told the row:
// QuantX::tok).
__device__ __forceinline__ CudaDevice::QuantX row_quant(CudaDevice::QuantX q, int64_t n, int64_t row) {
    if (q.xq) {
        q.xq += row * n;
        q.xs += row * (n / 32);
        q.xsum += row * (n / 32);
        q.tok = (int32_t)row;
    }
    return q;
}
__device__ __forceinline__ CudaDevice::QuantX row_quant(CudaDevice::QuantX q, int64_t n) {
    return row_quant(q, n, (int64_t)blockIdx.x);
}

// A row norm's block holding its row in registers: v[k] = f(i) for the elements i = threadIdx.x + k * blockDim.x
// below n (0 past it); returns the thread's sum of their squares in k order (what store_normed_regs takes), each
// term by fma as nvcc contracts it in norm.cu, so a file built without contraction (ds4.cu) sums the same bits.
template <int REGS, class F>
__device__ __forceinline__ float load_row_regs(float (&v)[REGS], int64_t n, F f) {
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < REGS; k++) {
        const int i = (int)threadIdx.x + k * (int)blockDim.x;  // rows are narrow: 32-bit offsets
        v[k] = 0.0f;
        if (i < n) {
            v[k] = f(i);
            ss = __fmaf_rn(v[k], v[k], ss);
        }
    }
    return ss;
}

// The end of a row norm whose block holds its row in registers (v[k]: element threadIdx.x + k * blockDim.x, 0 past n;
// ss: the thread's sum of their squares): the scale, and y = (v r) w with its staged quantization, wk(k, i) giving
// weight i (held by the caller or loaded) where weighted. yr: the block's row; n a multiple of 32 (whole warps).
template <int REGS, class WK>
__device__ __forceinline__ void store_normed_regs(const float (&v)[REGS], float ss, int64_t n, float eps, bool weighted,
                                                  WK wk, float *yr, CudaDevice::QuantX q, float *red) {
    ss = block_sum(ss, red);
    const float r = rsqrtf(ss / (float)n + eps);
    q = row_quant(q, n);
#pragma unroll
    for (int k = 0; k < REGS; k++) {
        const int i = (int)threadIdx.x + k * (int)blockDim.x;  // rows are narrow: 32-bit offsets
        if (i < n) store_normed(yr, i, weighted ? (v[k] * r) * wk(k, i) : v[k] * r, q);
    }
}

}  // namespace cuda
}  // namespace dfl
