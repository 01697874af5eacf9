// DeepSeek V4 MoE on the GPU (device.h: MoeRouteCall, swiglu_clamp, MoeExpertsCall).
//
// Routing runs on the device (a block per token). The routed experts take one of two paths:
//  - few (token, choice) pairs (decode steps, batches of up to 42: P <= moe_direct_max_pairs(), 256 unless set): every
//    pair's gate / up / down product is one member of a z-batched GEMV launch that picks its expert's rows from the
//    chosen ids on the device (launch_gemv_z; past 64 pairs sorted by expert first), then a combine kernel adds the
//    weighted outputs per token in choice order. Nothing comes back to the host, so the step can be captured into a
//    CUDA graph (deepseek4.engine.fused_decode).
//  - many pairs (prefill): the chosen ids come to the host (one wait per MoE layer), the pairs are grouped by expert
//    in token order as on the CPU, their inputs gathered into one contiguous block, each used expert's gate / up /
//    down products run on its group with the device's matmul (so an expert's weights are read once per group), and
//    the same combine kernel adds the outputs.
#include <algorithm>
#include <vector>

#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/cuda_device.h"
#include "ops/cuda/ds4_common.cuh"
#include "ops/cuda/mma_int8.cuh"

namespace dfl {
namespace cuda {

constexpr int kRouteMaxK = 64;

// PyTorch softplus (beta 1, threshold 20), as the CPU's.
__device__ __forceinline__ float softplus_f(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// Hash layers: the K best-scoring of the token's table experts (ties: earlier slot), listed in table order into ids.
// One thread.
__device__ void route_hash(const MoeRouteCall &c, int64_t t, const float *s, int32_t *ids) {
    const int K = c.k;
    const int32_t *row = c.tid2eid + (int64_t)c.tokens[t] * c.k_table;
    uint64_t used = 0;
    for (int j = 0; j < K; j++) {
        int best = -1;
        for (int q = 0; q < c.k_table; q++)
            if (!((used >> q) & 1u) && (best < 0 || s[row[q]] > s[row[best]])) best = q;
        used |= (uint64_t)1 << best;
    }
    int j = 0;
    for (int q = 0; q < c.k_table; q++)
        if ((used >> q) & 1u) ids[j++] = row[q];
}

// The chosen experts' ids and weights (their s, normalised over the K where c.norm, times c.scale). One thread.
__device__ void route_store(const MoeRouteCall &c, int64_t t, const float *s, const int32_t *ids) {
    const int K = c.k;
    float sum = 0.0f;
    for (int j = 0; j < K; j++) sum += s[ids[j]];
    for (int j = 0; j < K; j++) {
        float w = s[ids[j]];
        if (c.norm) w = w / (sum + 1e-20f);
        c.ids[t * K + j] = ids[j];
        c.weights[t * K + j] = w * c.scale;
    }
}

// One block a token: s = sqrt(softplus(logit)) in shared memory; the k experts picked from the token's hash-table row
// (hash layers, one thread) or by rank: thread i counts the experts that beat expert i (a larger s + bias, or an equal
// one with a lower id) and, ranked below K, is ids[rank]; every rank is distinct, so each slot is written once. NaN
// scores rank as -inf. Why by rank: one pass over the E scores a thread, where K dependent rounds of warp arg-max (one
// warp a token, the kernel before 12-07) took ~9 us a call; a 4-layer V4-Flash step (its fourth layer routed) on an
// H100, alternated (12-07 11:2x): 1.035 / 1.040 -> 1.020 / 1.014 ms at one token, 3.461 / 3.446 -> 3.445 / 3.439 at 8.
__global__ void moe_route_kernel(MoeRouteCall c) {
    pdl_trigger();
    pdl_wait();
    extern __shared__ float sh[];
    const int E = c.n_expert, K = c.k;
    float *s = sh, *b = sh + E;
    __shared__ int32_t ids[kRouteMaxK];
    const int64_t t = blockIdx.x;
    for (int i = threadIdx.x; i < E; i += blockDim.x) {
        s[i] = sqrtf(softplus_f(c.logits[t * E + i]));
        const float v = s[i] + (c.bias ? c.bias[i] : 0.0f);
        b[i] = v == v ? v : -INFINITY;
    }
    __syncthreads();
    if (c.tid2eid) {
        if (threadIdx.x == 0) route_hash(c, t, s, ids);
    } else {
        for (int i = threadIdx.x; i < E; i += blockDim.x) {
            const float bi = b[i];
            int rank = 0;
            for (int j = 0; j < E; j++) {
                const float bj = b[j];
                rank += bj > bi || (bj == bi && j < i);
            }
            if (rank < K) ids[rank] = i;
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) route_store(c, t, s, ids);
}

// With q.xq set (CudaDevice::stage_quant, n a multiple of 32) the products are also quantized for the product that
// follows, as swiglu_kernel does.
__global__ void swiglu_clamp_kernel(float *g, const float *u, int64_t n, float limit, CudaDevice::QuantX q) {
    pdl_trigger();  // a following launch_pdl product may start loading its weights
    pdl_wait();     // (launch_chain)
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float a = g[i], b = u[i];
        if (limit > 0.0f) {
            a = fminf(a, limit);
            b = fminf(fmaxf(b, -limit), limit);
        }
        const float v = silu_f(a) * b;
        g[i] = v;
        if (q.xq) quant_q8_store(q, v, i);
    }
}

// xg[r] = x[token of pair order[r]] (pair i = token * k + choice).
__global__ void moe_gather_kernel(const float *x, const int32_t *order, int k, int64_t D, float *xg) {
    const float *src = x + (int64_t)(order[blockIdx.x] / k) * D;
    float *dst = xg + (int64_t)blockIdx.x * D;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) dst[d] = src[d];
}

// Most (token, choice) pairs the direct path may take (DFL_CUDA_MOE_DIRECT_PAIRS is clamped to it): the sort below
// holds them all in one block's shared memory.
constexpr int64_t kMoeDirectMostPairs = 1024;

// The pairs of a direct step sorted by expert, stably (token order within an expert): index[r] is the pair of sorted
// row r, index[P + i] the sorted row of pair i (moe_combine_kernel's row_of_pair), sorted_ids[r] row r's expert. One
// block; P <= kMoeDirectMostPairs (each thread ranks its pairs against all P: ~1k comparisons a pair).
__global__ void moe_sort_pairs_kernel(const int32_t *ids, int P, int32_t *index, int32_t *sorted_ids) {
    __shared__ int32_t s[kMoeDirectMostPairs];
    for (int i = threadIdx.x; i < P; i += blockDim.x) s[i] = ids[i];
    __syncthreads();
    for (int i = threadIdx.x; i < P; i += blockDim.x) {
        const int32_t e = s[i];
        int r = 0;
        for (int j = 0; j < P; j++) r += (s[j] < e) || (s[j] == e && j < i);
        index[r] = i;
        index[P + i] = r;
        sorted_ids[r] = e;
    }
}

// out[t][d] = sum_j weights[t][j] * yg[row of pair (t, j)][d], in j order from 0 as the CPU adds (row_of_pair null:
// pair i's row is i).
__global__ void moe_combine_kernel(const float *yg, const int32_t *row_of_pair, const float *weights, int k, int64_t T,
                                   int64_t D, float *out) {
    pdl_trigger();  // the next chained launch may start (launch_ds4)
    pdl_wait();     // everything below reads what the launch before wrote
    const int64_t n = T * D;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        out[e] = combine_pairs(yg, row_of_pair, weights, k, e / D, D, e % D);
    }
}

void launch_swiglu_clamp(cudaStream_t s, float *g, const float *u, int64_t count, float limit,
                         const CudaDevice::QuantX &q) {
    if (count <= 0) return;
    launch_chain(swiglu_clamp_kernel, dim3(grid_for(count, 256)), dim3(256), 0, s, g, u, count, limit, q);
    check_launch("swiglu_clamp");
}

void CudaDevice::moe_route(const MoeRouteCall &c) {
    if (c.k < 1 || c.k > kRouteMaxK || c.k > c.n_expert)
        fail(DFL_ERR_INVALID, "moe_route: k " + std::to_string(c.k) + " of " + std::to_string(c.n_expert) + " experts");
    if (c.tid2eid && (c.k_table < c.k || c.k_table > 64 || !c.tokens))
        fail(DFL_ERR_INVALID, "moe_route: hash table of " + std::to_string(c.k_table) + " experts per token");
    op("moe_route", [&] {
        if (c.T <= 0) return;
        const size_t shm = 2 * (size_t)c.n_expert * sizeof(float);
        launch_ds4(moe_route_kernel, (unsigned)c.T, (unsigned)std::min(1024, (c.n_expert + 31) / 32 * 32), shm, stream_, c);
        check_launch("moe_route");
    });
}

// The kernel also quantizes its output for the product after it (the routed experts' and the shared expert's down
// projections), as swiglu does: one quantizer launch fewer each (DFL_CUDA_DS4_SWIGLU_QUANT=0: not).
void CudaDevice::swiglu_clamp(float *g, const float *u, int64_t count, float limit) {
    static const bool stage = env_switch("DFL_CUDA_DS4_SWIGLU_QUANT", true);
    op("swiglu_clamp", [&] { launch_swiglu_clamp(stream_, g, u, count, limit, stage ? stage_quant(g, count) : QuantX{}); });
    staged_done();
}

// Most (token, choice) pairs that take the direct path (DFL_CUDA_MOE_DIRECT_PAIRS=N sets it, at most 1,024): 256, a
// batched decode step of 42 sequences with 6 experts each. Past it, grouping by expert reads each shared expert once
// instead of once per pair, but syncs with the host every MoE layer and runs op by op. The direct path waits for no
// host copy and replays from a step graph: the 4-layer V4-Flash b32 step (192 pairs) 5.83 / 5.86 ms direct against
// 17.8 / 16.5 grouped, b1 and b8 even (H100 12-07 16:1x). Past 64 pairs the direct path sorts them by expert first
// (moe_sort_pairs_kernel, the inputs gathered in that order), so that the members reading one expert run side by side
// and its second reads come from L2.
constexpr int64_t kMoeDirectUnsortedPairs = 64;
constexpr int64_t kMoeDirectPairs = 256;
static int64_t moe_direct_max_pairs() {
    static const int64_t n = std::max<int64_t>(
        1, std::min<int64_t>(kMoeDirectMostPairs, env_int("DFL_CUDA_MOE_DIRECT_PAIRS", kMoeDirectPairs)));
    return n;
}

// The direct path: P z-batched products per projection, experts picked on the device, then the combine.
static void moe_experts_direct(CudaDevice &dev, const MoeExpertsCall &c) {
    const int64_t T = c.T, D = c.n_embd, F = c.n_ff, K = c.k, P = T * K;
    const bool sorted = P > kMoeDirectUnsortedPairs;
    // g, u [P][F], yg [P][D]; sorted: xg [P][D] (the inputs in sorted order), index [2P], sorted ids [P]
    float *g = (float *)dev.ds4_buffer((size_t)(P * (2 * F + D) + (sorted ? P * D + 3 * P : 0)) * sizeof(float));
    float *u = g + P * F, *yg = u + P * F, *xg = yg + P * D;
    int32_t *index = (int32_t *)(xg + P * D), *sorted_ids = index + 2 * P;
    GemvZ in;  // gate and up: pair i reads token i / K's input (sorted: row i of xg)
    in.ids = c.ids;
    in.w_rows = F;
    in.x_stride = D;
    in.x_div = (int)K;
    in.y_stride = F;
    const float *x = c.x;
    if (sorted) {
        CudaDevice::OpTimer tm(dev, "moe_experts (sort)");
        launch_ds4(moe_sort_pairs_kernel, 1, 1024, 0, dev.stream(), c.ids, (int)P, index, sorted_ids);
        launch_ds4(moe_gather_kernel, (unsigned)P, 256, 0, dev.stream(), c.x, index, (int)K, D, xg);
        check_launch("moe_experts (sort)");
        in.ids = sorted_ids;
        in.x_div = 1;
        x = xg;
    }
    {
        CudaDevice::OpTimer tm(dev, "moe_experts (gate, up)");
        if (!launch_gemv_q4k_i8_pair(dev, c.gate.rows(0, F), c.up.rows(0, F), x, g, u, in, (int)P)) {
            launch_gemv_z(dev, c.gate, F, in, (int)P, x, g);
            launch_gemv_z(dev, c.up, F, in, (int)P, x, u);
        }
    }
    dev.swiglu_clamp(g, u, P * F, c.limit);
    GemvZ out;  // down: pair i reads its own row of g
    out.ids = in.ids;
    out.w_rows = D;
    out.x_stride = F;
    out.y_stride = D;
    {
        // the down product takes the int8 activations swiglu_clamp staged (the same bytes its quantizer would write)
        // instead of launching that quantizer
        const CudaDevice::StagedScope staged(dev);
        CudaDevice::OpTimer tm(dev, "moe_experts (down)");
        // (one launch with the combine, a warp one row of a token's six experts, lost: H100 12-07 15:2x, b1 0.965 /
        // 0.960 against 0.952 / 0.955 ms, b8 2.22 / 2.20 against 2.18 / 2.17, though 18.5 us alone against the
        // two launches' 18.6 + 4.6)
        launch_gemv_z(dev, c.down, D, out, (int)P, g, yg);
    }
    CudaDevice::OpTimer tm(dev, "moe_experts (combine)");
    launch_ds4(moe_combine_kernel, grid_for(T * D, 256), 256, 0, dev.stream(), yg, sorted ? index + P : nullptr,
               c.weights, (int)K, T, D, c.out);
    check_launch("moe_experts (combine)");
}

void CudaDevice::moe_experts(const MoeExpertsCall &c) {
    const int64_t T = c.T, D = c.n_embd, F = c.n_ff, K = c.k, P = T * K;
    // (DFL_CUDA_SKIP_OPS=moe_experts: the routed experts' launches left out, out unwritten: garbage out)
    if (P <= 0 || skip_op("moe_experts")) return;
    use();
    if (P <= moe_direct_max_pairs()) {
        moe_experts_direct(*this, c);
        return;
    }
    // the choices, grouped by expert in (token, choice) order
    std::vector<int32_t> ids((size_t)P);
    to_host(ids.data(), c.ids, (size_t)P * sizeof(int32_t));
    std::vector<int64_t> count((size_t)c.n_expert + 1, 0);
    for (int32_t e : ids) {
        if (e < 0 || e >= c.n_expert) fail(DFL_ERR_INTERNAL, "moe_experts: expert id " + std::to_string(e) + " out of range");
        count[(size_t)e + 1]++;
    }
    std::vector<int64_t> first(count);  // first[e]: the group's first row
    for (int e = 0; e < c.n_expert; e++) first[(size_t)e + 1] += first[(size_t)e];
    std::vector<int32_t> index((size_t)(2 * P));  // order [P] (pair of each grouped row), then row_of_pair [P]
    {
        std::vector<int64_t> next(first.begin(), first.end() - 1);
        for (int64_t i = 0; i < P; i++) {
            const int64_t r = next[(size_t)ids[(size_t)i]]++;
            index[(size_t)r] = (int32_t)i;
            index[(size_t)(P + i)] = (int32_t)r;
        }
    }
    // device buffers: index, xg [P][D], g, u [P][F], yg [P][D]
    const size_t idx_bytes = ((size_t)(2 * P) * sizeof(int32_t) + 255) & ~(size_t)255;
    uint8_t *buf = (uint8_t *)ds4_buffer(idx_bytes + (size_t)(P * (2 * D + 2 * F)) * sizeof(float));
    int32_t *d_index = (int32_t *)buf;
    float *xg = (float *)(buf + idx_bytes), *g = xg + P * D, *u = g + P * F, *yg = u + P * F;
    to_device(d_index, index.data(), (size_t)(2 * P) * sizeof(int32_t));
    {
        OpTimer tm(*this, "moe_experts (gather)");
        moe_gather_kernel<<<(unsigned)P, 256, 0, stream_>>>(c.x, d_index, (int)K, D, xg);
        check_launch("moe_experts (gather)");
    }
    for (int e = 0; e < c.n_expert; e++) {
        const int64_t n = count[(size_t)e + 1], r0 = first[(size_t)e];
        if (n == 0) continue;
        matmul(c.gate.rows(e * F, F), xg + r0 * D, n, g + r0 * F);
        matmul(c.up.rows(e * F, F), xg + r0 * D, n, u + r0 * F);
    }
    swiglu_clamp(g, u, P * F, c.limit);
    for (int e = 0; e < c.n_expert; e++) {
        const int64_t n = count[(size_t)e + 1], r0 = first[(size_t)e];
        if (n == 0) continue;
        matmul(c.down.rows(e * D, D), g + r0 * F, n, yg + r0 * D);
    }
    OpTimer tm(*this, "moe_experts (combine)");
    launch_ds4(moe_combine_kernel, grid_for(T * D, 256), 256, 0, stream_, yg, d_index + P, c.weights, (int)K, T, D, c.out);
    check_launch("moe_experts (combine)");
}

}  // namespace cuda
}  // namespace dfl
