// Tensor-core attention for batches with many query rows per entry (prefill chunks, verify blocks).
//
// The CUDA-core kernel (attention.cu) does T^2 work on scalar FMAs, which dominates a long prefill. Here each entry's
// K and V are gathered from the paged cache into contiguous f16 scratch, and then, per chunk of query rows, cuBLAS
// computes S = scale * Q K^T (f16 in, f32 out), a masked softmax writes P in f16, and cuBLAS computes O = P V (f32
// out). GQA costs nothing extra: the G query heads of a group are stacked as G * rows rows of one GEMM against their
// KV head, so one strided batch (entry, KV head) covers everything.
//
// Scratch layouts (cols = max_ctx rounded up to 8, rows = query rows per chunk):
//   K16, V16  [n_ent][n_kv][cols][head_dim]     f16, zero past the entry's context (V must be finite: P is 0 there,
//                                               but 0 * NaN would poison O)
//   Q16       [n_ent][n_head][rows][head_dim]   f16, zero for rows past the entry's n
//   S         [n_ent][n_head][rows][cols]       f32
//   P         [n_ent][n_head][rows][cols]       f16
//   O         [n_ent][n_head][rows][head_dim]   f32
// Head h = kvh * group + g, so (entry, kvh) owns group * rows consecutive rows of Q16, S, P and O.
//
// Only exact values on the host are used for shapes: T and n_ent. max_n and max_ctx are upper bounds (possibly
// bucketed); rows past an entry's n and columns past its causal limit are masked on the device.
#include <algorithm>
#include <cmath>
#include <string>

#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/cuda_device.h"

namespace dfl {
namespace cuda {

constexpr int64_t kGemmAttnMinRows = 64;             // fewest query rows (per entry, upper bound) for this path
constexpr size_t kGemmAttnScoreBudget = 256u << 20;  // bytes of S + P per chunk of query rows
constexpr size_t kGemmAttnMaxScratch = (size_t)3 << 29;  // 1.5 GiB: beyond it the CUDA-core kernel runs instead
constexpr int64_t kGemmAttnMaxPadding = 16;          // padded query rows (n_ent * max_n) at most this many times T
constexpr int64_t kGemmAttnRowAlign = 16;            // query rows per chunk are a multiple of this
constexpr int kGemmAttnThreads = 256;


// Shapes and scratch of one call, from the host's exact T and n_ent and the upper bounds max_n and max_ctx.
struct GemmAttnPlan {
    int64_t cols = 0;   // K/V positions per entry (max_ctx rounded up to 8), the row stride of S and P
    int64_t n_max = 0;  // query rows per entry to cover
    int64_t rows = 0;   // query rows per chunk
    size_t kv_bytes = 0, q_bytes = 0, s_bytes = 0, p_bytes = 0, o_bytes = 0;
    size_t total() const { return 2 * kv_bytes + q_bytes + s_bytes + p_bytes + o_bytes; }
};

static GemmAttnPlan plan_attention_gemm(const BatchMeta &m, const AttnCall &c) {
    GemmAttnPlan p;
    const size_t n_ent = (size_t)m.n_ent, n_head = (size_t)c.n_head, n_kv = (size_t)c.kv.n_kv, hd = (size_t)c.kv.head_dim;
    p.cols = (m.max_ctx + 7) / 8 * 8;
    // no entry has more tokens than the batch (an entry may have none, so T - (n_ent - 1) is no bound)
    p.n_max = std::min<int64_t>(m.max_n, m.T);
    const int64_t n_pad = (p.n_max + kGemmAttnRowAlign - 1) / kGemmAttnRowAlign * kGemmAttnRowAlign;
    // rows per chunk: S (4 bytes) + P (2 bytes) per score within the budget, at least one aligned group of rows
    const size_t per_row = n_ent * n_head * (size_t)p.cols * 6;
    p.rows = (int64_t)(kGemmAttnScoreBudget / per_row) / kGemmAttnRowAlign * kGemmAttnRowAlign;
    p.rows = std::max<int64_t>(kGemmAttnRowAlign, std::min<int64_t>(p.rows, n_pad));
    const size_t scores = n_ent * n_head * (size_t)p.rows * (size_t)p.cols;
    p.kv_bytes = round256(n_ent * n_kv * (size_t)p.cols * hd * sizeof(__half));
    p.q_bytes = round256(n_ent * n_head * (size_t)p.rows * hd * sizeof(__half));
    p.s_bytes = round256(scores * sizeof(float));
    p.p_bytes = round256(scores * sizeof(__half));
    p.o_bytes = round256(n_ent * n_head * (size_t)p.rows * hd * sizeof(float));
    return p;
}

static bool gemm_cache_type(uint32_t t) {
    return t == DFL_TYPE_F32 || t == DFL_TYPE_F16 || t == DFL_TYPE_BF16 || t == DFL_TYPE_Q8_0;
}

bool attention_gemm_path(const BatchMeta &m, const AttnCall &c) {
    // A decode-shaped batch (one token per entry) never comes here: it must not touch scratch, and the CUDA-core
    // kernel is the faster one for it. min(max_n, T) is the tightest host bound on an entry's token count.
    if (m.T <= m.n_ent || m.n_ent <= 0) return false;
    // its masks are causal over whole entries; other masks (DFlash draft blocks, a few rows each) take the paged kernel
    if (!c.causal || c.window > 0) return false;
    if (m.vis) return false;  // token trees (forward_tree) need per-token masks: the paged kernel applies them
    if (std::min<int64_t>(m.max_n, m.T) < kGemmAttnMinRows) return false;
    const int hd = c.kv.head_dim;
    if (hd <= 0 || hd % 8 != 0 || hd > 512) return false;  // 16-byte aligned f16 rows for the tensor-core GEMMs
    if (c.kv.n_kv <= 0 || c.n_head % c.kv.n_kv != 0) return false;
    if (!gemm_cache_type(c.kv.type_k) || !gemm_cache_type(c.kv.type_v)) return false;
    if (m.max_ctx <= 0 || m.max_ctx >= (int64_t)1 << 30) return false;
    // Every entry is padded to n_max rows and max_ctx positions: a batch of many short or decode entries beside one
    // long prefill would spend its time (and scratch) on padding; the CUDA-core kernel handles those.
    const GemmAttnPlan p = plan_attention_gemm(m, c);
    if (p.n_max * m.n_ent > kGemmAttnMaxPadding * m.T) return false;
    return p.total() <= kGemmAttnMaxScratch;
}

// Block (position p, entry e): K and V rows of every KV head at position p of the entry, dequantized to f16.
__global__ void gather_kv_f16_kernel(KVLayer kv, const int32_t *len0, const int32_t *ns, const int32_t *block_table,
                                     int max_blocks, int64_t cols, __half *k16, __half *v16) {
    const int64_t p = blockIdx.x;
    const int e = blockIdx.y;
    const int hd = kv.head_dim, n_kv = kv.n_kv;
    const int64_t ctx = (int64_t)len0[e] + ns[e];
    const bool live = p < ctx;
    uint64_t row = 0;
    if (live) {
        const int32_t *bt = block_table + (int64_t)e * max_blocks;
        row = (uint64_t)bt[p / kv.block_size] * kv.block_size + (uint64_t)(p % kv.block_size);
    }
    for (int i = threadIdx.x; i < n_kv * hd; i += blockDim.x) {
        const int kvh = i / hd, d = i % hd;
        float kx = 0.0f, vx = 0.0f;
        if (live) {
            const uint64_t prow = row * n_kv + kvh;
            kx = load_elem(kv.type_k, kv.k + prow * kv.k_row, d);
            vx = load_elem(kv.type_v, kv.v + prow * kv.v_row, d);
        }
        const int64_t o = (((int64_t)e * n_kv + kvh) * cols + p) * hd + d;
        k16[o] = __float2half_rn(kx);
        v16[o] = __float2half_rn(vx);
    }
}

// Block (local row li, head h, entry e): query row r0 + li of the entry as f16, zero past the entry's tokens.
__global__ void gather_q_f16_kernel(const float *Q, int n_head, int hd, const int32_t *t0, const int32_t *ns,
                                    int64_t r0, int64_t rows, __half *q16) {
    const int64_t li = blockIdx.x;
    const int h = blockIdx.y, e = blockIdx.z;
    const int64_t i = r0 + li;
    const bool live = i < ns[e];
    const float *src = Q + ((int64_t)t0[e] + i) * n_head * hd + (int64_t)h * hd;
    __half *dst = q16 + (((int64_t)e * n_head + h) * rows + li) * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) dst[d] = __float2half_rn(live ? src[d] : 0.0f);
}

__device__ __forceinline__ float block_max(float v, float *red) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    if (lane == 0) red[w] = v;
    __syncthreads();
    float s = lane < nw ? red[lane] : -INFINITY;
    s = warp_max(s);
    __syncthreads();
    return s;
}

// Block per S row (entry e, head h, local row li): P = softmax over the row's causal prefix [0, len0 + i], zero in
// the other columns up to n_cols (the GEMM's inner size). Rows past the entry's tokens get all-zero P.
__global__ void __launch_bounds__(kGemmAttnThreads)
    causal_softmax_kernel(const float *S, __half *P, int n_head, const int32_t *len0, const int32_t *ns, int64_t r0,
                          int64_t rows, int64_t ld, int64_t n_cols) {
    __shared__ float red[32];
    const int64_t r = blockIdx.x;
    const int e = (int)(r / (n_head * rows));
    const int64_t i = r0 + r % rows;
    const float *s = S + r * ld;
    __half *p = P + r * ld;
    int64_t lim = 0;
    if (i < ns[e]) lim = min((int64_t)len0[e] + i + 1, n_cols);  // min: safety against a too-small bound
    float mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < lim; j += blockDim.x) mx = fmaxf(mx, s[j]);
    mx = block_max(mx, red);
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < lim; j += blockDim.x) sum += expf(s[j] - mx);
    sum = block_sum(sum, red);
    const float inv = lim > 0 ? 1.0f / sum : 0.0f;
    for (int64_t j = threadIdx.x; j < n_cols; j += blockDim.x)
        p[j] = __float2half_rn(j < lim ? expf(s[j] - mx) * inv : 0.0f);
}

// The same for rows of up to 128 * V columns, a warp per row holding it in registers: one read of S and one exp per
// score, where the block kernel reads S three times and takes two exps (qwen3-8b, 512-token prefill: 45.6 us a
// layer, ncu 12-03 23:06, for 50 MB of S and P).
template <int V>
__global__ void __launch_bounds__(kGemmAttnThreads)
    causal_softmax_warp_kernel(const float *S, __half *P, int n_head, const int32_t *len0, const int32_t *ns, int64_t r0,
                               int64_t rows, int64_t ld, int64_t n_cols, int64_t n_rows) {
    const int lane = threadIdx.x & 31;
    const int64_t r = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (r >= n_rows) return;
    const int e = (int)(r / (n_head * rows));
    const int64_t i = r0 + r % rows;
    int64_t lim = 0;
    if (i < ns[e]) lim = min((int64_t)len0[e] + i + 1, n_cols);
    const float4 *s = (const float4 *)(S + r * ld);
    float v[V][4];
    float mx = -INFINITY;
#pragma unroll
    for (int k = 0; k < V; k++) {
        const int64_t c = 4 * (lane + 32 * k);
        const float4 x = c < lim ? s[c / 4] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        const float xs[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
        for (int j = 0; j < 4; j++) {
            v[k][j] = c + j < lim ? xs[j] : -INFINITY;
            mx = fmaxf(mx, v[k][j]);
        }
    }
    mx = warp_max(mx);
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < V; k++)
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int64_t c = 4 * (lane + 32 * k) + j;
            v[k][j] = c < lim ? expf(v[k][j] - mx) : 0.0f;
            sum += v[k][j];
        }
    sum = warp_sum(sum);
    const float inv = lim > 0 ? 1.0f / sum : 0.0f;
    __half *p = P + r * ld;
#pragma unroll
    for (int k = 0; k < V; k++) {
        const int64_t c = 4 * (lane + 32 * k);
        if (c >= n_cols) break;
        const __half2 a = __floats2half2_rn(v[k][0] * inv, v[k][1] * inv), b = __floats2half2_rn(v[k][2] * inv, v[k][3] * inv);
        uint2 w;
        w.x = *(const uint32_t *)&a;
        w.y = *(const uint32_t *)&b;
        *(uint2 *)(p + c) = w;
    }
}

// P from S for rows [r0, r0 + rows) of every (entry, head): the warp kernel where a row fits its registers.
static void launch_causal_softmax(cudaStream_t s, const float *S, __half *P, int n_ent, int n_head, const int32_t *len0,
                                  const int32_t *ns, int64_t r0, int64_t rows, int64_t ld, int64_t n_cols) {
    const int64_t n_rows = (int64_t)n_ent * n_head * rows;
    const unsigned wgrid = (unsigned)((n_rows + kGemmAttnThreads / 32 - 1) / (kGemmAttnThreads / 32));
    if (n_cols <= 128)
        causal_softmax_warp_kernel<1><<<wgrid, kGemmAttnThreads, 0, s>>>(S, P, n_head, len0, ns, r0, rows, ld, n_cols, n_rows);
    else if (n_cols <= 256)
        causal_softmax_warp_kernel<2><<<wgrid, kGemmAttnThreads, 0, s>>>(S, P, n_head, len0, ns, r0, rows, ld, n_cols, n_rows);
    else if (n_cols <= 512)
        causal_softmax_warp_kernel<4><<<wgrid, kGemmAttnThreads, 0, s>>>(S, P, n_head, len0, ns, r0, rows, ld, n_cols, n_rows);
    else if (n_cols <= 1024)
        causal_softmax_warp_kernel<8><<<wgrid, kGemmAttnThreads, 0, s>>>(S, P, n_head, len0, ns, r0, rows, ld, n_cols, n_rows);
    else
        causal_softmax_kernel<<<(unsigned)n_rows, kGemmAttnThreads, 0, s>>>(S, P, n_head, len0, ns, r0, rows, ld, n_cols);
    check_launch("attention (softmax)");
}

// Block (local row li, head h, entry e): the finished output row back into out, for rows the entry has.
__global__ void scatter_o_kernel(const float *O, float *out, int n_head, int hd, const int32_t *t0, const int32_t *ns,
                                 int64_t r0, int64_t rows) {
    const int64_t li = blockIdx.x;
    const int h = blockIdx.y, e = blockIdx.z;
    const int64_t i = r0 + li;
    if (i >= ns[e]) return;
    const float *src = O + (((int64_t)e * n_head + h) * rows + li) * hd;
    float *dst = out + ((int64_t)t0[e] + i) * n_head * hd + (int64_t)h * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) dst[d] = src[d];
}

void launch_attention_gemm(CudaDevice &dev, const BatchMeta &m, const AttnCall &c) {
    cudaStream_t s = dev.stream();
    cublasHandle_t blas = dev.blas();
    const int n_ent = m.n_ent, n_head = c.n_head, n_kv = c.kv.n_kv, hd = c.kv.head_dim;
    const int group = n_head / n_kv;
    const GemmAttnPlan plan = plan_attention_gemm(m, c);
    const int64_t cols = plan.cols, rows = plan.rows, n_max = plan.n_max;
    uint8_t *base = (uint8_t *)dev.scratch(plan.total());
    __half *k16 = (__half *)base;
    __half *v16 = (__half *)(base + plan.kv_bytes);
    __half *q16 = (__half *)(base + 2 * plan.kv_bytes);
    float *S = (float *)(base + 2 * plan.kv_bytes + plan.q_bytes);
    __half *P = (__half *)(base + 2 * plan.kv_bytes + plan.q_bytes + plan.s_bytes);
    float *O = (float *)(base + 2 * plan.kv_bytes + plan.q_bytes + plan.s_bytes + plan.p_bytes);

    gather_kv_f16_kernel<<<dim3((unsigned)cols, (unsigned)n_ent), kGemmAttnThreads, 0, s>>>(
        c.kv, m.len0, m.n, m.block_table, m.max_blocks, cols, k16, v16);
    check_launch("attention (gather K/V)");

    const int batch = n_ent * n_kv;
    const int64_t M = (int64_t)group * rows;  // GEMM rows of one (entry, KV head)
    const float zero = 0.0f, one = 1.0f, scale = c.scale;
    for (int64_t r0 = 0; r0 < n_max; r0 += rows) {
        // Causal skip: a single entry has exactly T tokens, so len0 <= max_ctx - T and this chunk's rows see no
        // column past max_ctx - T + r0 + rows. With several entries the host knows no such bound.
        int64_t n_cols = cols;
        if (n_ent == 1) n_cols = std::min<int64_t>(cols, (m.max_ctx - m.T + r0 + rows + 7) / 8 * 8);
        n_cols = std::max<int64_t>(n_cols, 8);
        const dim3 rgrid((unsigned)rows, (unsigned)n_head, (unsigned)n_ent);
        gather_q_f16_kernel<<<rgrid, 128, 0, s>>>(c.Q, n_head, hd, m.t0, m.n, r0, rows, q16);
        check_launch("attention (gather Q)");
        // column-major view: S^T [n_cols x M] = K [hd x n_cols]^T * Q^T [hd x M]
        check_blas(cublasGemmStridedBatchedEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)n_cols, (int)M, hd, &scale, k16,
                                              CUDA_R_16F, hd, (long long)cols * hd, q16, CUDA_R_16F, hd,
                                              (long long)M * hd, &zero, S, CUDA_R_32F, (int)cols, (long long)M * cols,
                                              batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                   "attention (Q K^T)");
        launch_causal_softmax(s, S, P, n_ent, n_head, m.len0, m.n, r0, rows, cols, n_cols);
        // O^T [hd x M] = V^T [hd x n_cols] * P^T [n_cols x M]
        check_blas(cublasGemmStridedBatchedEx(blas, CUBLAS_OP_N, CUBLAS_OP_N, hd, (int)M, (int)n_cols, &one, v16,
                                              CUDA_R_16F, hd, (long long)cols * hd, P, CUDA_R_16F, (int)cols,
                                              (long long)M * cols, &zero, O, CUDA_R_32F, hd, (long long)M * hd, batch,
                                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                   "attention (P V)");
        scatter_o_kernel<<<rgrid, 128, 0, s>>>(O, c.out, n_head, hd, m.t0, m.n, r0, rows);
        check_launch("attention (scatter O)");
    }
}

}  // namespace cuda
}  // namespace dfl
