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

// A chunk's max and sum of exp(x - max) into *out, for the row's log-sum-exp; mx is the thread's max of its values.
// fred: 32 floats of shared memory. All threads call it.
__device__ void chunk_max_sumexp(const float *vals, int len, float mx, float *fred, float2 *out) {
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
        *out = make_float2(m, t);
    }
}

// The row's log-sum-exp from its chunks' (max, sum of exp) pairs.
__device__ float row_lse(const float2 *ms, int n_chunks) {
    float m = -INFINITY;
    for (int c = 0; c < n_chunks; c++) m = fmaxf(m, ms[c].x);
    float s = 0.0f;
    for (int c = 0; c < n_chunks; c++)
        if (ms[c].x != -INFINITY) s += ms[c].y * expf(ms[c].x - m);
    return m == -INFINITY ? -INFINITY : m + logf(s);
}

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
    chunk_max_sumexp(vals, len, mx, fred, ms + row * n_chunks + blockIdx.x);
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
    if (threadIdx.x == 0) lse[row] = row_lse(ms + row * n_chunks, n_chunks);
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


// ---- Selection by threshold (k >= DFL_CUDA_TOPK_SELECT_MIN_K) ----
// The kernels above spend one block-wide arg-max pass (two barriers) a candidate: 64 passes for k = 64 in each stage,
// ~0.1 ms a step. These find the k-th largest value by radix select on an order-preserving key (4 rounds of 8-bit
// histograms), gather the items above it and the first of those equal to it (lower id first) by two block scans, and
// rank the k by counting: a fixed number of passes whatever k. Same candidates, same order, same log-sum-exp.

// The key of a value whose unsigned order is the values' order (-0 as +0, which compare equal).
__device__ __forceinline__ uint32_t order_key(float v) {
    const uint32_t u = __float_as_uint(v == 0.0f ? 0.0f : v);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ bool eligible(const Cand &c) { return c.id >= 0 && c.v != -INFINITY; }

// Exclusive prefix sum of x over the block's threads in thread order; *total: the sum over all (every thread).
// ws: 32 ints of shared memory. All threads call it.
__device__ int block_scan(int x, int *ws, int *total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int incl = x;
    for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += y;
    }
    __syncthreads();  // ws is reused by consecutive calls
    if (lane == 31) ws[warp] = incl;
    __syncthreads();
    int before = 0, sum = 0;
    for (int w = 0; w < nw; w++) {
        before += w < warp ? ws[w] : 0;
        sum += ws[w];
    }
    *total = sum;
    return before + incl - x;
}

// Each thread of the selection takes a contiguous run of `per` items (ties must be gathered in id order). Runs lie
// `stride` slots apart in shared memory, stride odd: the threads of a warp read their runs' j-th items from distinct
// banks (runs of 8 packed side by side put a warp's reads on two banks: 16-way conflicts in every pass).
struct RunLayout {
    int per, stride;
    __host__ __device__ constexpr RunLayout(int n, int threads) : per((n + threads - 1) / threads), stride(per | 1) {}
    __host__ __device__ constexpr int slots(int threads) const { return threads * stride; }
    __device__ int slot(int i) const { return i / per * stride + i % per; }
};

struct SelectScratch {
    int hist[256];
    int ws[32];
    int digit, remaining;
    Cand sel[kTopkMaxK];
};

// The digit (8 bits at shift) of the remaining-th largest key among the eligible items whose key has the given prefix
// (mask: the bits already fixed); s.remaining becomes its rank among the items of that digit. run: the thread's len
// items. All threads call it.
__device__ void select_digit(const Cand *run, int len, uint32_t prefix, uint32_t mask, int shift, int remaining,
                             SelectScratch &s) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) s.hist[i] = 0;
    __syncthreads();
    for (int j = 0; j < len; j++) {
        if (!eligible(run[j])) continue;
        const uint32_t key = order_key(run[j].v);
        if ((key & mask) == prefix) atomicAdd(&s.hist[(key >> shift) & 255], 1);
    }
    __syncthreads();
    if (threadIdx.x < 32) {
        // lane l sums digits 255 - 8 l .. 248 - 8 l (largest first); the lane whose range holds the rank walks it
        const int lane = threadIdx.x;
        int sum = 0;
        for (int j = 0; j < 8; j++) sum += s.hist[255 - 8 * lane - j];
        int incl = sum;
        for (int o = 1; o < 32; o <<= 1) {
            const int y = __shfl_up_sync(0xffffffffu, incl, o);
            if (lane >= o) incl += y;
        }
        int cum = incl - sum;
        if (cum < remaining && remaining <= incl)
            for (int j = 0; j < 8; j++) {
                const int d = 255 - 8 * lane - j, h = s.hist[d];
                if (cum + h >= remaining) {
                    s.digit = d;
                    s.remaining = remaining - cum;
                    break;
                }
                cum += h;
            }
    }
    __syncthreads();
}

// out[0..k): the k best of the n eligible items (larger value first, lower id on ties), padded with {-inf, -1}, items
// laid out by RunLayout(n, blockDim.x). Items of equal value must lie in id order. All threads call it.
__device__ void select_topk(const Cand *items, int n, int k, Cand *out, SelectScratch &s) {
    const RunLayout lay(n, (int)blockDim.x);
    const int b = min(n, (int)threadIdx.x * lay.per), len = min(n, b + lay.per) - b;
    const Cand *run = items + threadIdx.x * lay.stride;
    int mine = 0, total = 0;
    for (int j = 0; j < len; j++) mine += eligible(run[j]) ? 1 : 0;
    block_scan(mine, s.ws, &total);
    const bool all = total <= k;
    uint32_t thr = 0, prefix = 0, mask = 0;
    int need_eq = 0;
    if (!all) {
        int remaining = k;
        for (int shift = 24; shift >= 0; shift -= 8) {
            select_digit(run, len, prefix, mask, shift, remaining, s);
            prefix |= (uint32_t)s.digit << shift;
            mask |= 255u << shift;
            remaining = s.remaining;
        }
        thr = prefix;  // the k-th largest key: every larger item and `remaining` of the equal ones (lowest ids)
        need_eq = remaining;
    }
    int gt = 0, eq = 0;
    for (int j = 0; j < len; j++) {
        if (!eligible(run[j])) continue;
        const uint32_t key = order_key(run[j].v);
        gt += all || key > thr;
        eq += !all && key == thr;
    }
    int eq_total = 0, taken = 0;
    const int eq_before = block_scan(eq, s.ws, &eq_total);
    int eq_take = max(0, min(eq, need_eq - eq_before));
    int pos = block_scan(gt + eq_take, s.ws, &taken);
    for (int j = 0; j < len; j++) {
        if (!eligible(run[j])) continue;
        const uint32_t key = order_key(run[j].v);
        if (all || key > thr) {
            s.sel[pos++] = run[j];
        } else if (key == thr && eq_take > 0) {
            s.sel[pos++] = run[j];
            eq_take--;
        }
    }
    __syncthreads();
    // rank by counting: ids are distinct, so the ranks are a permutation
    for (int i = threadIdx.x; i < taken; i += blockDim.x) {
        const Cand c = s.sel[i];
        int r = 0;
        for (int j = 0; j < taken; j++) r += better(s.sel[j], c) ? 1 : 0;
        out[r] = c;
    }
    for (int i = taken + (int)threadIdx.x; i < k; i += blockDim.x) out[i] = Cand{-INFINITY, -1};
    __syncthreads();
}

// Stage 1 by selection: block (chunk, row), as topk_chunks_kernel.
__global__ void topk_select_chunks_kernel(const float *logits, int64_t n, int k, int n_chunks, Cand *cand, float2 *ms) {
    __shared__ float vals[kTopkChunk];
    __shared__ Cand items[RunLayout(kTopkChunk, kTopkThreads1).slots(kTopkThreads1)];
    __shared__ float fred[32];
    __shared__ SelectScratch s;
    const int64_t row = blockIdx.y;
    const int64_t c0 = (int64_t)blockIdx.x * kTopkChunk;
    const int len = (int)min((int64_t)kTopkChunk, n - c0);
    const float *x = logits + row * n + c0;
    const RunLayout lay(len, kTopkThreads1);
    float mx = -INFINITY;
    for (int i = threadIdx.x; i < len; i += blockDim.x) {
        const float v = clean(x[i]);
        vals[i] = v;
        items[lay.slot(i)] = Cand{v, (int32_t)(c0 + i)};
        mx = fmaxf(mx, v);
    }
    chunk_max_sumexp(vals, len, mx, fred, ms + row * n_chunks + blockIdx.x);
    select_topk(items, len, k, cand + (row * n_chunks + blockIdx.x) * k, s);
}

// Stage 2 by selection: block per row, as topk_merge_kernel.
__global__ void topk_select_merge_kernel(const Cand *cand, const float2 *ms, int n_chunks, int k, int32_t *ids,
                                         float *vals, float *lse) {
    // the chunks' candidates [n_chunks][k] (chunk order: equal values lie in id order) by RunLayout, then the k best
    extern __shared__ Cand pool[];
    __shared__ SelectScratch s;
    const int64_t row = blockIdx.x;
    const int n = n_chunks * k;
    const RunLayout lay(n, (int)blockDim.x);
    for (int i = threadIdx.x; i < n; i += blockDim.x) pool[lay.slot(i)] = cand[row * n + i];
    if (threadIdx.x == 0) lse[row] = row_lse(ms + row * n_chunks, n_chunks);
    __syncthreads();
    Cand *best = pool + lay.slots((int)blockDim.x);
    select_topk(pool, n, k, best, s);
    for (int i = threadIdx.x; i < k; i += blockDim.x) {
        ids[row * k + i] = best[i].id;
        vals[row * k + i] = best[i].v;
    }
}

// Selection for k of at least DFL_CUDA_TOPK_SELECT_MIN_K (default 8), one arg-max pass a candidate below: a greedy
// step's few candidates (k = 1 to 3) take fewer passes that way than selection's fixed ~10.
static bool topk_select_on(int k) {
    static const int64_t min_k = env_int("DFL_CUDA_TOPK_SELECT_MIN_K", 8);
    return k >= min_k;
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
    const bool select = topk_select_on(k);
    if (select)
        topk_select_chunks_kernel<<<dim3((unsigned)n_chunks, (unsigned)rows), kTopkThreads1, 0, s>>>(logits, n, k, n_chunks,
                                                                                                   cand, ms);
    else
        topk_chunks_kernel<<<dim3((unsigned)n_chunks, (unsigned)rows), kTopkThreads1, 0, s>>>(logits, n, k, n_chunks, cand, ms);
    check_launch("topk (chunks)");
    // the merge's pool (and, selecting, the k best after it) in dynamic shared memory
    const size_t shm = (select ? (size_t)RunLayout(n_chunks * k, kTopkThreads2).slots(kTopkThreads2) + k
                               : (size_t)n_chunks * k) * sizeof(Cand);
    if (shm > 200 * 1024) fail(DFL_ERR_UNSUPPORTED, "topk: vocabulary too large for k " + std::to_string(k));
    const bool big = shm > 48 * 1024;
    if (select) {
        if (big) allow_dynamic_smem<topk_select_merge_kernel>(dev.index(), 200 * 1024, "topk: shared memory");
        topk_select_merge_kernel<<<(unsigned)rows, kTopkThreads2, shm, s>>>(cand, ms, n_chunks, k, ids, vals, lse);
    } else {
        if (big) allow_dynamic_smem<topk_merge_kernel>(dev.index(), 200 * 1024, "topk: shared memory");
        topk_merge_kernel<<<(unsigned)rows, kTopkThreads2, shm, s>>>(cand, ms, n_chunks, k, ids, vals, lse);
    }
    check_launch("topk (merge)");
}

}  // namespace cuda
}  // namespace dfl
