// What the row norms and the kernels that end in one (DeepSeek V4's hc_pre_norm) share: a normed value's store with
// its int8 quantization for the product after it.
#pragma once

#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/cuda_device.h"

namespace dfl {
namespace cuda {

// A normed row's values, and where q.xq is set its int8 quantization for the product that follows (CudaDevice::
// stage_quant; n a multiple of 32, so a warp's 32 lanes always hold one block of 32 together).
__device__ __forceinline__ void store_normed(float *yr, int64_t i, float v, const CudaDevice::QuantX &q) {
    yr[i] = v;
    if (q.xq) quant_q8_warp(v, q.xq + i, q.xs + i / 32, q.xsum + i / 32);
}

// q offset to row blockIdx.x of n elements.
__device__ __forceinline__ CudaDevice::QuantX row_quant(CudaDevice::QuantX q, int64_t n) {
    if (q.xq) {
        q.xq += (int64_t)blockIdx.x * n;
        q.xs += (int64_t)blockIdx.x * (n / 32);
        q.xsum += (int64_t)blockIdx.x * (n / 32);
    }
    return q;
}

}  // namespace cuda
}  // namespace dfl
