// Element-wise ops and row gathers: grid-stride loops, memory bound.
#include <algorithm>

#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/cuda_device.h"
#include "ops/cuda/mma_int8.cuh"

namespace dfl {
namespace cuda {

constexpr int kEltThreads = 256;

__global__ void add_kernel(float *x, const float *d, int64_t n) {
    pdl_trigger();  // a following launch_pdl product may start loading its weights
    pdl_wait();     // (launch_chain)
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        x[i] += d[i];
}

// With q.xq set (CudaDevice::stage_quant, n a multiple of 32) the products are also quantized for the product that
// follows: a warp's lanes hold consecutive elements, one block of 32.
__global__ void swiglu_kernel(float *g, const float *u, int64_t n, CudaDevice::QuantX q) {
    pdl_trigger();  // a following launch_pdl product may start loading its weights
    pdl_wait();     // (launch_chain)
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float v = silu_f(g[i]) * u[i];
        g[i] = v;
        if (q.xq) quant_q8_store(q, v, i);
    }
}

// swiglu of a fused gate|up product's rows where they lie (rows `stride` apart) into rows of n: block (column block,
// row), so no element divides by n. Quantized as swiglu_kernel does (n a multiple of 32).
__global__ void swiglu_rows_kernel(float *out, const float *g, const float *u, int64_t n, int64_t stride,
                                   CudaDevice::QuantX q) {
    pdl_trigger();  // a following launch_pdl product may start loading its weights
    pdl_wait();     // (launch_chain)
    const int64_t t = blockIdx.y, c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= n) return;
    const float v = silu_f(g[t * stride + c]) * u[t * stride + c];
    const int64_t i = t * n + c;
    out[i] = v;
    if (q.xq) quant_q8_store(q, v, i);
}

// Quantized as swiglu_kernel does where q.xq is set (the gated attention's output, for its output projection).
__global__ void sigmoid_mul_kernel(float *a, const float *g, int64_t n, CudaDevice::QuantX q) {
    pdl_trigger();  // a following launch_pdl product may start loading its weights
    pdl_wait();     // (launch_chain)
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float v = a[i] * sigmoid_f(g[i]);
        a[i] = v;
        if (q.xq) quant_q8_store(q, v, i);
    }
}

__global__ void scale_softcap_kernel(float *x, int64_t n, float scale, float cap) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float v = x[i] * scale;
        x[i] = cap > 0.0f ? cap * tanhf(v / cap) : v;
    }
}

// Block (row, chunk): blocks gridDim.y of a row share its floats, a thread's loads all issued before its stores (one
// block a row copied DeepSeek V4's 16,384-float head row in ~27 us, a load's round trip an iteration: ncu 12-07 09:3x).
__global__ void gather_rows_kernel(const float *x, const int32_t *rows, int64_t n, float *out) {
    constexpr int kAhead = 4;
    const float *src = x + (int64_t)rows[blockIdx.x] * n;
    float *dst = out + (int64_t)blockIdx.x * n;
    const int64_t step = (int64_t)gridDim.y * blockDim.x;
    for (int64_t i0 = (int64_t)blockIdx.y * blockDim.x + threadIdx.x; i0 < n; i0 += kAhead * step) {
        float v[kAhead];
#pragma unroll
        for (int k = 0; k < kAhead; k++) v[k] = i0 + k * step < n ? src[i0 + k * step] : 0.0f;
#pragma unroll
        for (int k = 0; k < kAhead; k++)
            if (i0 + k * step < n) dst[i0 + k * step] = v[k];
    }
}

void launch_add(cudaStream_t s, float *x, const float *d, int64_t count) {
    if (count <= 0) return;
    launch_chain(add_kernel, dim3(grid_for(count, kEltThreads)), dim3(kEltThreads), 0, s, x, d, count);
    check_launch("add");
}

void launch_swiglu(cudaStream_t s, float *g, const float *u, int64_t count, const CudaDevice::QuantX &q) {
    if (count <= 0) return;
    launch_chain(swiglu_kernel, dim3(grid_for(count, kEltThreads)), dim3(kEltThreads), 0, s, g, u, count, q);
    check_launch("swiglu");
}

void launch_swiglu_rows(cudaStream_t s, float *out, const float *g, const float *u, int64_t rows, int64_t n,
                        int64_t stride, const CudaDevice::QuantX &q) {
    if (rows <= 0 || n <= 0) return;
    for (int64_t r0 = 0; r0 < rows; r0 += 65535) {  // (the grid's y: rows)
        const int64_t nr = std::min<int64_t>(65535, rows - r0);
        const dim3 grid((unsigned)((n + kEltThreads - 1) / kEltThreads), (unsigned)nr);
        // (a staged quantization is for batches of up to 64 rows: the first chunk is all of them)
        launch_chain(swiglu_rows_kernel, grid, dim3(kEltThreads), 0, s, out + r0 * n, g + r0 * stride, u + r0 * stride, n,
                     stride, r0 == 0 ? q : CudaDevice::QuantX{});
    }
    check_launch("swiglu_rows");
}

void launch_sigmoid_mul(cudaStream_t s, float *a, const float *g, int64_t count, const CudaDevice::QuantX &q) {
    if (count <= 0) return;
    launch_chain(sigmoid_mul_kernel, dim3(grid_for(count, kEltThreads)), dim3(kEltThreads), 0, s, a, g, count, q);
    check_launch("sigmoid_mul");
}

void launch_scale_softcap(cudaStream_t s, float *x, int64_t count, float scale, float cap) {
    if (count <= 0) return;
    scale_softcap_kernel<<<grid_for(count, kEltThreads), kEltThreads, 0, s>>>(x, count, scale, cap);
    check_launch("scale_softcap");
}

void launch_gather_rows(cudaStream_t s, const float *x, const int32_t *rows, int64_t R, int64_t n, float *out) {
    if (R <= 0 || n <= 0) return;
    // (up to 16 blocks a row, four floats a thread in flight: a 16,384-float row is 16 blocks of 1,024)
    const int64_t chunks = std::min<int64_t>(16, (n + 4 * kEltThreads - 1) / (4 * kEltThreads));
    gather_rows_kernel<<<dim3((unsigned)R, (unsigned)chunks), kEltThreads, 0, s>>>(x, rows, n, out);
    check_launch("gather_rows");
}

// DFlash2 dynamic convolution: one thread per (token, channel).
__global__ void dyn_conv_kernel(BatchMeta m, DynConvCall c) {
    const int64_t n = m.T * (int64_t)c.C;
    const int ng = c.C / c.group;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = e / c.C, ch = e % c.C;
        const int64_t i = t - m.t0[m.ent[t]];
        const float *d = c.dyn + t * c.dyn_stride + ch / c.group;
        float acc = 0.0f;
        for (int tap = 0; tap < c.K && tap <= i; tap++)
            acc += (c.base[(int64_t)tap * c.C + ch] + d[(int64_t)tap * ng]) * c.x[(t - tap) * c.C + ch];
        c.out[e] = acc;
    }
}

void launch_dyn_conv(cudaStream_t s, const BatchMeta &m, const DynConvCall &c) {
    const int64_t n = m.T * (int64_t)c.C;
    if (n <= 0) return;
    dyn_conv_kernel<<<grid_for(n, kEltThreads), kEltThreads, 0, s>>>(m, c);
    check_launch("dyn_conv");
}

// DFlash2 selector transitions: block (row r, predecessor i); the predecessor's code times g in shared memory, then
// one warp per successor candidate j at a time.
__global__ void selector_trans_kernel(SelectorCall s) {
    extern __shared__ float cond[];
    const int64_t r = blockIdx.x;
    const int i = blockIdx.y, K = s.K, rank = s.rank;
    const int32_t a = s.prev[r] < 0 ? s.root[r] : s.ids[(int64_t)s.prev[r] * K + i];
    const bool ok = a >= 0 && a < s.pred.n_out;
    for (int q = threadIdx.x; q < rank; q += blockDim.x)
        cond[q] = ok ? load_elem(s.pred.type, s.pred.data + (uint64_t)a * s.pred.row_bytes, q) * s.g[r * rank + q] : 0.0f;
    __syncthreads();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, n_warps = blockDim.x / 32;
    for (int j = warp; j < K; j += n_warps) {
        const int32_t b = s.ids[r * K + j];
        float acc = 0.0f;
        if (ok && b >= 0 && b < s.succ.n_out) {
            const uint8_t *row = s.succ.data + (uint64_t)b * s.succ.row_bytes;
            for (int q = lane; q < rank; q += 32) acc += cond[q] * load_elem(s.succ.type, row, q);
        }
        for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
        if (lane == 0) s.trans[(r * K + i) * K + j] = acc;
    }
}

void launch_selector_trans(cudaStream_t st, const SelectorCall &s) {
    if (s.R <= 0 || s.K <= 0) return;
    selector_trans_kernel<<<dim3((unsigned)s.R, (unsigned)s.K), 128, (size_t)s.rank * sizeof(float), st>>>(s);
    check_launch("selector_trans");
}

}  // namespace cuda
}  // namespace dfl
