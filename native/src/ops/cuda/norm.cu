// Row normalisations: one block per row, f32 block reduction of the sum of squares (the CPU sums in double; the
// difference is a few f32 ulps of the scale).
#include <algorithm>

#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/cuda_device.h"
#include "ops/cuda/norm_store.cuh"

namespace dfl {
namespace cuda {

// Up to 1024 threads per row, about four elements each: a decode step or a verify block has only a few rows, so a
// row's block is the whole of the work on its SM and its latency is the op's (256 threads left a 5120-wide row
// at 20 serial loads a thread). DFL_CUDA_NORM_THREADS caps it (for comparisons in one run).
static int norm_max_threads() {
    static const int n = (int)std::min<int64_t>(1024, std::max<int64_t>(32, env_int("DFL_CUDA_NORM_THREADS", 1024)));
    return n;
}

__device__ __forceinline__ float row_rms_scale(const float *x, int64_t n, float eps, float *red) {
    float ss = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) ss += x[i] * x[i];
    ss = block_sum(ss, red);
    return rsqrtf(ss / (float)n + eps);
}

// y may alias x: each thread reads its own elements before writing them, and every read of the reduction happened
// before block_sum's barriers.
__global__ void rmsnorm_kernel(const float *x, const float *w, float *y, int64_t n, float eps, CudaDevice::QuantX q) {
    pdl_trigger();  // a following launch_pdl product may start loading its weights
    pdl_wait();     // (launch_chain)
    __shared__ float red[32];
    const float *xr = x + (int64_t)blockIdx.x * n;
    float *yr = y + (int64_t)blockIdx.x * n;
    const float r = row_rms_scale(xr, n, eps, red);
    q = row_quant(q, n);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) store_normed(yr, i, w ? (xr[i] * r) * w[i] : xr[i] * r, q);
}

__global__ void add_rmsnorm_kernel(float *x, const float *d, const float *w, float *y, int64_t n, float eps,
                                   CudaDevice::QuantX q) {
    pdl_trigger();  // a following launch_pdl product may start loading its weights
    pdl_wait();     // (launch_chain)
    __shared__ float red[32];
    float *xr = x + (int64_t)blockIdx.x * n;
    const float *dr = d + (int64_t)blockIdx.x * n;
    float *yr = y + (int64_t)blockIdx.x * n;
    float ss = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = xr[i] + dr[i];
        xr[i] = v;
        ss += v * v;
    }
    ss = block_sum(ss, red);
    const float r = rsqrtf(ss / (float)n + eps);
    q = row_quant(q, n);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) store_normed(yr, i, w ? (xr[i] * r) * w[i] : xr[i] * r, q);
}

// The kernels above with each thread's elements held in registers (rows of up to kNormRegs x blockDim.x): the norm
// weights are loaded before the wait for the kernel before (they are constant), and after the reduction nothing is
// read again, where the loops above read the row and the weights a second time (one more memory round trip in a
// one-block kernel: ncu timed add_rmsnorm alone at 7.2 us a call, 71 calls a qwen3-8b decode step). ADD: x += d
// first (the residual), written back. Same arithmetic in the same order as the loops above. REGS elements a thread:
// kNormRegs, or twice that for rows wider than kNormRegs x 1024 (DeepSeek V4's HC streams flattened, 16,384 wide:
// such norms a layer and step: 27.9 -> 11.4 us a call at one row, 12-05; DFL_CUDA_NORM_WIDE=0 leaves them on the loops).
constexpr int kNormRegs = 8;

template <bool ADD, int REGS>
__global__ void __launch_bounds__(1024) rmsnorm_regs_kernel(float *x, const float *d, const float *w, float *y, int64_t n, float eps,
                                    CudaDevice::QuantX q) {
    pdl_trigger();
    // the weights held ahead only in the narrow variant (the wide one would spill them: 64 registers at 1024 threads)
    constexpr int WREGS = REGS == kNormRegs ? REGS : 1;
    float wv[WREGS];
#pragma unroll
    for (int k = 0; k < WREGS; k++) {
        const int i = (int)threadIdx.x + k * (int)blockDim.x;  // rows are narrow: 32-bit offsets
        wv[k] = w && i < n ? __ldg(w + i) : 1.0f;
    }
    pdl_wait();  // (launch_chain)
    __shared__ float red[32];
    float *xr = x + (int64_t)blockIdx.x * n;
    float *yr = y + (int64_t)blockIdx.x * n;
    const float *dr = ADD ? d + (int64_t)blockIdx.x * n : nullptr;
    float v[REGS];
    const float ss = load_row_regs(v, n, [&](int i) {
        float x = xr[i];
        if (ADD) {
            x += dr[i];
            xr[i] = x;
        }
        return x;
    });
    store_normed_regs<REGS>(v, ss, n, eps, w != nullptr,
                            [&](int k, int i) { return WREGS == REGS ? wv[k % WREGS] : __ldg(w + i); }, yr, q, red);
}

// Block (head, token): x's row blockIdx.y * heads + blockIdx.x, its z row at z + blockIdx.y * z_stride + blockIdx.x * n.
// With q.xq set (n a multiple of 32: a warp's lanes hold one block of 32) the outputs are also quantized for the
// product after (the DeltaNet's output projection), as the quantizer would.
__global__ void gated_rmsnorm_kernel(float *x, const float *z, int64_t z_stride, const float *w, int64_t n, float eps,
                                     CudaDevice::QuantX q) {
    pdl_trigger();  // a following launch_pdl product may start loading its weights
    pdl_wait();     // (launch_chain)
    __shared__ float red[32];
    const int64_t row = (int64_t)blockIdx.y * gridDim.x + blockIdx.x;
    float *xr = x + row * n;
    const float *zr = z + (int64_t)blockIdx.y * z_stride + (int64_t)blockIdx.x * n;
    const float r = row_rms_scale(xr, n, eps, red);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = w ? (xr[i] * r) * w[i] : xr[i] * r;
        const float o = v * silu_f(zr[i]);
        xr[i] = o;
        if (q.xq) quant_q8_store(q, o, row * n + i);
    }
}

int norm_threads(int64_t n) {
    int t = 32;
    while (t < norm_max_threads() && t * 4 < n) t *= 2;
    return t;
}

// The elements a thread of rmsnorm_regs_kernel holds for rows of n (kNormRegs, or twice that for rows wider than
// kNormRegs x 1024; DFL_CUDA_NORM_WIDE=0: never), or 0 where the rows take the two-pass loops: DFL_CUDA_NORM_REGS=0 (for comparisons in
// one run), n not a multiple of 32 (the quantizer's warps hold whole blocks of 32), or rows too wide.
static int norm_regs(int64_t n) {
    static const bool on = env_switch("DFL_CUDA_NORM_REGS", true), wide = env_switch("DFL_CUDA_NORM_WIDE", true);
    if (!on || n % 32 != 0) return 0;
    for (const int regs : {kNormRegs, 2 * kNormRegs})
        if (n <= (int64_t)regs * norm_threads(n) && (regs == kNormRegs || wide)) return regs;
    return 0;
}

template <bool ADD>
static void launch_norm_regs(cudaStream_t s, int regs, float *x, const float *d, const float *w, float *y, int64_t rows,
                             int64_t n, float eps, const CudaDevice::QuantX &q) {
    const auto kernel = regs == kNormRegs ? rmsnorm_regs_kernel<ADD, kNormRegs> : rmsnorm_regs_kernel<ADD, 2 * kNormRegs>;
    launch_chain(kernel, dim3((unsigned)rows), dim3(norm_threads(n)), 0, s, x, d, w, y, n, eps, q);
}

void launch_rmsnorm(cudaStream_t s, const float *x, const float *w, float *y, int64_t rows, int64_t n, float eps,
                    const CudaDevice::QuantX &q) {
    if (rows <= 0 || n <= 0) return;
    if (const int regs = norm_regs(n))  // x is only read (ADD false)
        launch_norm_regs<false>(s, regs, const_cast<float *>(x), nullptr, w, y, rows, n, eps, q);
    else
        launch_chain(rmsnorm_kernel, dim3((unsigned)rows), dim3(norm_threads(n)), 0, s, x, w, y, n, eps, q);
    check_launch("rmsnorm");
}

void launch_add_rmsnorm(cudaStream_t s, float *x, const float *d, const float *w, float *y, int64_t rows, int64_t n,
                        float eps, const CudaDevice::QuantX &q) {
    if (rows <= 0 || n <= 0) return;
    if (const int regs = norm_regs(n))
        launch_norm_regs<true>(s, regs, x, d, w, y, rows, n, eps, q);
    else
        launch_chain(add_rmsnorm_kernel, dim3((unsigned)rows), dim3(norm_threads(n)), 0, s, x, d, w, y, n, eps, q);
    check_launch("add_rmsnorm");
}

void launch_gated_rmsnorm(cudaStream_t s, float *x, const float *z, int64_t z_stride, const float *w, int64_t T,
                          int64_t heads, int64_t n, float eps, const CudaDevice::QuantX &q) {
    if (T <= 0 || heads <= 0 || n <= 0) return;
    for (int64_t t0 = 0; t0 < T; t0 += 65535) {  // (the grid's y: tokens; staged quantization only up to 64 of them)
        const int64_t nt = std::min<int64_t>(65535, T - t0);
        launch_chain(gated_rmsnorm_kernel, dim3((unsigned)heads, (unsigned)nt), dim3(norm_threads(n)), 0, s,
                     x + t0 * heads * n, z + t0 * z_stride, z_stride, w, n, eps, t0 == 0 ? q : CudaDevice::QuantX{});
    }
    check_launch("gated_rmsnorm");
}

}  // namespace cuda
}  // namespace dfl
