// The k best logits of each row and the row's log-sum-exp, on the device, so that a decode step brings back k
// candidates per sequence instead of the whole vocabulary (600 KB per row for a 150k vocabulary).
//
// Two stages: (1) the row is cut into chunks that fit in shared memory; each block picks its chunk's k best by
// repeated block-wide arg-max and its (max, sum of exp) pair; (2) one block per row picks the k best among the
// chunks' candidates the same way and merges the log-sum-exp. Order: larger value first, lower id on ties, as the
// host sampler's candidate order. NaN counts as -inf.
#include <cfloat>

#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/cuda_device.h"

namespace dfl {
namespace cuda {

constexpr int kTopkChunk = 2048;   // floats of a row per stage-1 block (8 KB of shared memory)
constexpr int kTopkThreads1 = 256;
constexpr int kTopkThreads2 = 1024;
constexpr int kTopkMaxK = 64;

struct Cand {
    float v;
    int32_t id;
};

__device__ __forceinline__ bool better(const Cand &a, const Cand &b) {
    return a.v > b.v || (a.v == b.v && (unsigned)a.id < (unsigned)b.id);
}

__device__ __forceinline__ Cand warp_best(Cand c) {
    for (int o = 16; o > 0; o >>= 1) {
        Cand x;
        x.v = __shfl_xor_sync(0xffffffffu, c.v, o);
        x.id = __shfl_xor_sync(0xffffffffu, c.id, o);
        if (better(x, c)) c = x;
    }
    return c;
}

// The block's best candidate, returned to every thread. red holds one Cand per warp.
__device__ Cand block_best(Cand c, Cand *red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    c = warp_best(c);
    __syncthreads();  // red is reused by consecutive calls
    if (lane == 0) red[warp] = c;
    __syncthreads();
    Cand r = lane < nw ? red[lane] : Cand{-INFINITY, -1};
    r = warp_best(r);
    return r;
}

__device__ __forceinline__ float clean(float x) { return x != x ? -INFINITY : x; }

// Stage 1: block (chunk, row). Writes k candidates of the chunk (padded with id -1, -inf) and its (max, sumexp).
__global__ void topk_chunks_kernel(const float *logits, int64_t n, int k, int n_chunks, Cand *cand, float2 *ms) {
    __shared__ float vals[kTopkChunk];
    __shared__ Cand red[32];
    __shared__ float fred[32];
    const int64_t row = blockIdx.y;
    const int64_t c0 = (int64_t)blockIdx.x * kTopkChunk;
    const int len = (int)min((int64_t)kTopkChunk, n - c0);
    const float *x = logits + row * n + c0;
    float mx = -INFINITY;
    for (int i = threadIdx.x; i < kTopkChunk; i += blockDim.x) {
        const float v = i < len ? clean(x[i]) : -INFINITY;
        vals[i] = v;
        mx = fmaxf(mx, v);
    }
    // the chunk's max and sum of exp(x - max), for the row's log-sum-exp
    {
        const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
        mx = warp_max(mx);
        if (lane == 0) fred[warp] = mx;
        __syncthreads();
        float m = -INFINITY;
        for (int w = 0; w < nw; w++) m = fmaxf(m, fred[w]);
        float s = 0.0f;
        if (m != -INFINITY)
            for (int i = threadIdx.x; i < len; i += blockDim.x) s += vals[i] == -INFINITY ? 0.0f : expf(vals[i] - m);
        s = warp_sum(s);
        __syncthreads();
        if (lane == 0) fred[warp] = s;
        __syncthreads();
        if (threadIdx.x == 0) {
            float t = 0.0f;
            for (int w = 0; w < nw; w++) t += fred[w];
            ms[row * n_chunks + blockIdx.x] = make_float2(m, t);
        }
    }
    Cand *out = cand + (row * n_chunks + blockIdx.x) * k;
    for (int j = 0; j < k; j++) {
        Cand c{-INFINITY, -1};
        for (int i = threadIdx.x; i < len; i += blockDim.x) {
            const Cand x2{vals[i], (int32_t)(c0 + i)};
            if (c.id < 0 || better(x2, c)) c = x2;
        }
        const Cand b = block_best(c, red);  // the same for every thread
        if (b.id < 0 || b.v == -INFINITY) {
            // nothing with a probability is left in the chunk: the rest is padding
            for (int jj = j + (int)threadIdx.x; jj < k; jj += blockDim.x) out[jj] = Cand{-INFINITY, -1};
            break;
        }
        if (threadIdx.x == 0) {
            out[j] = b;
            vals[b.id - c0] = -INFINITY;
        }
        __syncthreads();
    }
}

// Stage 2: block per row. Picks the k best of the chunks' candidates, writes ids, values and the log-sum-exp.
__global__ void topk_merge_kernel(const Cand *cand, const float2 *ms, int n_chunks, int k, int32_t *ids, float *vals,
                                  float *lse) {
    extern __shared__ Cand pool[];
    __shared__ Cand red[32];
    const int64_t row = blockIdx.x;
    const int n = n_chunks * k;
    for (int i = threadIdx.x; i < n; i += blockDim.x) pool[i] = cand[row * n + i];
    if (threadIdx.x == 0) {
        float m = -INFINITY;
        for (int c = 0; c < n_chunks; c++) m = fmaxf(m, ms[row * n_chunks + c].x);
        float s = 0.0f;
        for (int c = 0; c < n_chunks; c++) {
            const float2 p = ms[row * n_chunks + c];
            if (p.x != -INFINITY) s += p.y * expf(p.x - m);
        }
        lse[row] = m == -INFINITY ? -INFINITY : m + logf(s);
    }
    __syncthreads();
    for (int j = 0; j < k; j++) {
        Cand c{-INFINITY, -1};
        for (int i = threadIdx.x; i < n; i += blockDim.x)
            if (pool[i].id >= 0 && (c.id < 0 || better(pool[i], c))) c = pool[i];
        const Cand b = block_best(c, red);
        if (b.id < 0) {  // fewer than k values with a probability in the row
            for (int jj = j + (int)threadIdx.x; jj < k; jj += blockDim.x) {
                ids[row * k + jj] = -1;
                vals[row * k + jj] = -INFINITY;
            }
            break;
        }
        if (threadIdx.x == 0) {
            ids[row * k + j] = b.id;
            vals[row * k + j] = b.v;
        }
        // retire the chosen candidate (a token is a candidate of one chunk only)
        for (int i = threadIdx.x; i < n; i += blockDim.x)
            if (pool[i].id == b.id) pool[i].id = -1;
        __syncthreads();
    }
}

void launch_topk(CudaDevice &dev, const float *logits, int64_t rows, int64_t n, int k, int32_t *ids, float *vals,
                 float *lse) {
    if (rows <= 0) return;
    if (k < 1 || k > kTopkMaxK) fail(DFL_ERR_INVALID, "topk: k " + std::to_string(k) + " outside [1, 64]");
    const int n_chunks = (int)((n + kTopkChunk - 1) / kTopkChunk);
    const size_t cand_bytes = (size_t)rows * n_chunks * k * sizeof(Cand);
    const size_t ms_bytes = (size_t)rows * n_chunks * sizeof(float2);
    uint8_t *scr = (uint8_t *)dev.scratch(cand_bytes + ms_bytes + 256);
    Cand *cand = (Cand *)scr;
    float2 *ms = (float2 *)(scr + ((cand_bytes + 255) & ~(size_t)255));
    cudaStream_t s = dev.stream();
    topk_chunks_kernel<<<dim3((unsigned)n_chunks, (unsigned)rows), kTopkThreads1, 0, s>>>(logits, n, k, n_chunks, cand, ms);
    check_launch("topk (chunks)");
    const size_t shm = (size_t)n_chunks * k * sizeof(Cand);
    if (shm > 48 * 1024) {
        static thread_local bool raised = false;
        if (!raised) {
            check(cudaFuncSetAttribute(topk_merge_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024),
                  "topk: shared memory");
            raised = true;
        }
        if (shm > 200 * 1024) fail(DFL_ERR_UNSUPPORTED, "topk: vocabulary too large for k " + std::to_string(k));
    }
    topk_merge_kernel<<<(unsigned)rows, kTopkThreads2, shm, s>>>(cand, ms, n_chunks, k, ids, vals, lse);
    check_launch("topk (merge)");
}

}  // namespace cuda
}  // namespace dfl
