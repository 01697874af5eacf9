// Device helpers shared by the DeepSeek V4 kernels (ds4.cu, ds4_compress.cu, ds4_moe.cu).
#pragma once

#include <mutex>
#include <set>
#include <tuple>

#include "ops/cuda/cuda_common.cuh"

namespace dfl {
namespace cuda {

constexpr int kDs4MaxHc = 16;  // hyper-connection streams a kernel holds in shared memory (V4 has 4)
constexpr int kDs4Threads = 128;

// cudaFuncSetAttribute(kernel, attr, value) on GPU `device`, the first time it is asked for that kernel, attribute and
// GPU (the op-by-op run of a step shape asks, before any graph capture of it).
template <class K>
void set_attribute_once(K kernel, cudaFuncAttribute attr, int value, int device, const char *op) {
    static std::mutex mu;
    static std::set<std::tuple<const void *, int, int>> done;
    std::lock_guard<std::mutex> lk(mu);
    if (!done.insert({(const void *)kernel, (int)attr, device}).second) return;
    check(cudaFuncSetAttribute(kernel, attr, value), op);
}

// DeepSeek V4's kernels between products: plain launches. As chained (PDL) launches (DFL_CUDA_DS4_CHAIN=1 until
// 12-07) a 2-layer V4-Flash step on an H100 was even or slower, 12-05 and 12-07 09:5x (b1 0.616 / 0.614 -> 0.613 /
// 0.616 ms, b8 1.78 -> 1.78 / 1.80). Their pdl_trigger() still lets a PDL-launched product after them load its weights
// early; their pdl_wait() returns at once.
template <typename... Params, typename... Args>
inline void launch_ds4(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shm, cudaStream_t s, Args &&...args) {
    kernel<<<grid, block, shm, s>>>(std::forward<Args>(args)...);
}

// The MoE output of token t at channel d: its k (token, choice) pairs' rows of y weighted and added in choice order
// from 0 (pair t * k + j's row is row_of_pair[t * k + j], or t * k + j where row_of_pair is null), as the CPU adds
// them (ds4_combine_pairs).
__device__ __forceinline__ float combine_pairs(const float *y, const int32_t *row_of_pair, const float *weights, int k,
                                               int64_t t, int64_t D, int64_t d) {
    float o = 0.0f;
    for (int j = 0; j < k; j++) {
        const int64_t row = row_of_pair ? (int64_t)row_of_pair[t * k + j] : t * k + j;
        o += weights[t * k + j] * y[row * D + d];
    }
    return o;
}

// Interleaved RoPE of one pair (x[0], x[1]) by angle pos * inv_freq, rounded as the CPU's ds4_rope_tail_head: the
// angle in f32, its cosine and sine in double, rounded to f32.
__device__ __forceinline__ void rotate_pair(float *x, double pos, float inv_freq) {
    const float ang = (float)pos * inv_freq;
    double sd, cd;
    sincos((double)ang, &sd, &cd);
    const float c = (float)cd, s = (float)sd;
    const float x0 = x[0], x1 = x[1];
    x[0] = x0 * c - x1 * s;
    x[1] = x1 * c + x0 * s;
}

// The block rotates the trailing rope_dim values of one head row x (head_dim wide) by pos, a thread a pair, as
// rope_tail_kernel does.
__device__ __forceinline__ void rotate_tail_block(float *x, int head_dim, int rope_dim, double pos, const float *inv_freq) {
    for (int i = threadIdx.x; i < rope_dim / 2; i += blockDim.x) rotate_pair(x + head_dim - rope_dim + 2 * i, pos, inv_freq[i]);
}

// Sum over the block in double (every thread gets it); `red` is 32 doubles of shared memory. The CPU's rmsnorm sums
// squares in double, so the compressed rows' norm scale matches it to the last bit in practice.
__device__ __forceinline__ double block_sum_double(double v, double *red) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) red[w] = v;
    __syncthreads();
    double s = 0.0;
    for (int i = 0; i < nw; i++) s += red[i];
    __syncthreads();
    return s;
}

}  // namespace cuda
}  // namespace dfl
