// Element-wise ops and row gathers: grid-stride loops, memory bound.
#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/cuda_device.h"

namespace dfl {
namespace cuda {

constexpr int kEltThreads = 256;

__global__ void add_kernel(float *x, const float *d, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        x[i] += d[i];
}

__global__ void swiglu_kernel(float *g, const float *u, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        g[i] = silu_f(g[i]) * u[i];
}

__global__ void sigmoid_mul_kernel(float *a, const float *g, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        a[i] *= sigmoid_f(g[i]);
}

__global__ void scale_softcap_kernel(float *x, int64_t n, float scale, float cap) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float v = x[i] * scale;
        x[i] = cap > 0.0f ? cap * tanhf(v / cap) : v;
    }
}

__global__ void gather_rows_kernel(const float *x, const int32_t *rows, int64_t n, float *out) {
    const float *src = x + (int64_t)rows[blockIdx.x] * n;
    float *dst = out + (int64_t)blockIdx.x * n;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i];
}

void launch_add(cudaStream_t s, float *x, const float *d, int64_t count) {
    if (count <= 0) return;
    add_kernel<<<grid_for(count, kEltThreads), kEltThreads, 0, s>>>(x, d, count);
    check_launch("add");
}

void launch_swiglu(cudaStream_t s, float *g, const float *u, int64_t count) {
    if (count <= 0) return;
    swiglu_kernel<<<grid_for(count, kEltThreads), kEltThreads, 0, s>>>(g, u, count);
    check_launch("swiglu");
}

void launch_sigmoid_mul(cudaStream_t s, float *a, const float *g, int64_t count) {
    if (count <= 0) return;
    sigmoid_mul_kernel<<<grid_for(count, kEltThreads), kEltThreads, 0, s>>>(a, g, count);
    check_launch("sigmoid_mul");
}

void launch_scale_softcap(cudaStream_t s, float *x, int64_t count, float scale, float cap) {
    if (count <= 0) return;
    scale_softcap_kernel<<<grid_for(count, kEltThreads), kEltThreads, 0, s>>>(x, count, scale, cap);
    check_launch("scale_softcap");
}

void launch_gather_rows(cudaStream_t s, const float *x, const int32_t *rows, int64_t R, int64_t n, float *out) {
    if (R <= 0 || n <= 0) return;
    gather_rows_kernel<<<(unsigned)R, kEltThreads, 0, s>>>(x, rows, n, out);
    check_launch("gather_rows");
}

}  // namespace cuda
}  // namespace dfl
