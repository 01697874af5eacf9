// The Gated DeltaNet's delta rule of recording entries in parallel form (by default; DFL_CUDA_GDN_PARALLEL=0: never, =2: trees only).
#include "ops/cuda/gdn_head.cuh"

namespace dfl {
namespace cuda {

// The delta rule of a recording entry of at most kGdnParMax tokens in parallel form (launch_gdn: any batch by default;
// DFL_CUDA_GDN_PARALLEL=2 only a batch of token trees): a recording entry's slot keeps the state before and its records keep the inputs, so only the tokens'
// outputs are wanted, and no token has to wait for the one before (the staged kernel runs them one after the other: a
// 16-row verify's gdn and conv cost +0.66 ms over a decode step, a 23-node tree's +1.28, H100 12-06 05:5x). Along a
// token's path (its ancestors, then itself; a chain's are the tokens before), with G_t = g_t + G_parent (log decays
// summed along the path, 0 before the root), S0 the slot's state, column b of it alone:
//   U_t = beta_t (v_t - e^G_t k_t.S0) - sum over proper ancestors j of beta_t e^(G_t - G_j) (k_t.k_j) U_j
//   o_t = e^G_t q_t.S0 + sum over ancestors j and t itself of e^(G_t - G_j) (q_t.k_j) U_j
// the recurrence's sums reordered (S_t = e^g_t S_parent + k_t U_t^T), every exponent <= 0. Parents precede children,
// so U is a forward substitution in token order. Block (value head j, entry e, group z of kGdnParCols columns),
// W warps: warp w, lane c holds rows w DK/W .. of column c of S0 in registers (one load each, all in
// flight at once: the first version read S0 a row at a time, 4 rows in flight, and cost ~70 us a 27B layer where the
// staged kernel costs 29, H100 12-06 06:4x) and every input comes by cp.async; each warp then runs the forward
// substitution for all the block's columns itself, U in registers, and writes the outputs of every W-th token.
// Shared memory: q and k rows (stride DK + 4: read as float4, a quarter warp's 8 rows meet no bank twice), the block's
// v columns, the warps' partial k.S0 and q.S0 (summed into warp 0's), the ancestor-masked k.k and q.k.
// W warps a block: 8 (DFL_CUDA_GDN_PAR_WARPS=4: kGdnThreads' four). Why eight: each warp's share of the S0 products
// and of the masked dots halves, at two blocks an SM still, for a kernel bound by its latency. Measured (H200 12-07
// 06:0x, 27B q8_0, one job): the tree of 23's verify 13.33 / 13.42 -> 13.21 ms, the chains of 16 11.30 / 11.34 -> 11.27.
constexpr int kGdnParCols = 32;  // state columns a block

template <int DK, int W>
struct GdnPar {
    float qk[2][kGdnParMax][DK + 4];  // (16-byte rows: float4 reads; 8 rows' words on 8 distinct bank quads)
    float v[kGdnParMax][kGdnParCols];
    float part[2][W][kGdnParMax][kGdnParCols];  // warp w's k_t.S0 (0) and q_t.S0 (1) over its rows
    float L[kGdnParMax][kGdnParMax];    // beta_t e^(G_t - G_j) k_t.k_j, j a proper ancestor of t, else 0
    float A[kGdnParMax][kGdnParMax];    // e^(G_t - G_j) q_t.k_j, j an ancestor of t or t, else 0
    float g[kGdnParMax], beta[kGdnParMax], G[kGdnParMax], eg[kGdnParMax];
    int32_t par[kGdnParMax];
    uint32_t anc[kGdnParMax];           // bit j: token j is t's proper ancestor
};

// pair w of the lower triangle (i <= t) of an n-token entry: rows t = 0, 1, ... hold t + 1 pairs each
__device__ __forceinline__ void triangle_pair(int w, int &t, int &i) {
    t = (int)((sqrtf(8.0f * (float)w + 1.0f) - 1.0f) * 0.5f);
    while (t * (t + 1) / 2 > w) t--;  // (the float root's rounding, either way)
    while ((t + 1) * (t + 2) / 2 <= w) t++;
    i = w - t * (t + 1) / 2;
}

template <int DK, int W>
__global__ void __launch_bounds__(32 * W) gdn_parallel_kernel(GdnArgs a) {
    constexpr int kThreads = 32 * W, RQ = DK / W;  // RQ: a warp's rows of S0
    extern __shared__ __align__(16) uint8_t par_smem[];
    GdnPar<DK, W> &sm = *reinterpret_cast<GdnPar<DK, W> *>(par_smem);
    const GdnCall &g = a.g;
    const int j = blockIdx.x, dv = g.dv, col0 = blockIdx.z * kGdnParCols;
    const GdnHead hd(a, DK, j, col0);
    if (!hd.recording || hd.n > a.parallel_max) return;  // the staged kernel's (the whole block alike)
    const int n = (int)hd.n, e = hd.e;
    const int64_t t0 = hd.t0;
    const int cols = min(kGdnParCols, dv - col0);
    const int c = threadIdx.x % 32, w = threadIdx.x / 32;
    const int32_t *par = a.parent ? a.parent + t0 : nullptr;  // (null: a chain, token t's parent t - 1)

    // the entry's inputs (q, k, the block's v columns, g, beta, parents) by cp.async
    for (int x = threadIdx.x; x < n * DK / 2; x += kThreads) {  // (16-byte words: C, dk and the offsets are % 4)
        const int t = x / (DK / 2), y = 4 * (x % (DK / 2)), h = y / DK, r = y % DK;
        cp_async16(&sm.qk[h][t][r], hd.cv + (t0 + t) * g.C + (h == 0 ? hd.q_off : hd.k_off) + r);
    }
    const int v_words = cols / 4;  // (dv % 4 == 0)
    for (int x = threadIdx.x; x < n * v_words; x += kThreads) {
        const int t = x / v_words, q = 4 * (x % v_words);
        cp_async16(&sm.v[t][q], hd.cv + (t0 + t) * g.C + hd.v_off + q);
    }
    for (int t = threadIdx.x; t < n; t += kThreads) {
        cp_async4(&sm.g[t], hd.gl + (t0 + t) * g.n_v + j);
        cp_async4(&sm.beta[t], hd.beta + (t0 + t) * g.n_v + j);
        if (par) cp_async4(&sm.par[t], par + t);
    }
    cp_async_commit();
    float s[RQ];  // S0's rows w RQ .. of column c, meanwhile
    load_column(s, hd.S, w * RQ, dv, col0 + c, c < cols);
    cp_async_wait<0>();
    __syncthreads();

    // the path sums and ancestor masks: lane t of the first warp walks token t's ancestors
    if (threadIdx.x < n) {
        const int t = threadIdx.x;
        float G = sm.g[t];
        uint32_t anc = 0;
        for (int p = par ? sm.par[t] : t - 1; p >= 0; p = par ? sm.par[p] : p - 1) {
            G += sm.g[p];
            anc |= 1u << p;
        }
        sm.G[t] = G;
        sm.eg[t] = expf(G);
        sm.anc[t] = anc;
    }
    // the warp's share of k_t.S0 and q_t.S0 (column c, rows w RQ ..)
    for (int t = 0; t < n; t++) {
        float ku = 0.0f, qu = 0.0f;
        const float4 *kr = reinterpret_cast<const float4 *>(&sm.qk[1][t][w * RQ]);
        const float4 *qr = reinterpret_cast<const float4 *>(&sm.qk[0][t][w * RQ]);
#pragma unroll
        for (int i = 0; i < RQ / 4; i++) {
            const float4 k4 = kr[i], q4 = qr[i];
            ku += k4.x * s[4 * i] + k4.y * s[4 * i + 1] + k4.z * s[4 * i + 2] + k4.w * s[4 * i + 3];
            qu += q4.x * s[4 * i] + q4.y * s[4 * i + 1] + q4.z * s[4 * i + 2] + q4.w * s[4 * i + 3];
        }
        sm.part[0][w][t][c] = ku;
        sm.part[1][w][t][c] = qu;
    }
    __syncthreads();

    // the records of the entry's inputs (GdnCall::rec_inputs, GdnRecordLayout): its v columns by every block, a key
    // head's q and k by value head j = kh's first column group, g and beta by each head's first
    float *rin = a.rec_in ? a.rec_in[e] : nullptr;
    if (rin) {
        const GdnRecordLayout rl{n, g.C, g.n_v};
        rin += rl.layer(g.rec_layer);
        for (int x = threadIdx.x; x < n * cols; x += kThreads)
            rin[rl.row(x / cols) + hd.v_off + x % cols] = sm.v[x / cols][x % cols];
        if (blockIdx.z == 0) {
            if (j < g.n_k)
                for (int x = threadIdx.x; x < n * 2 * DK; x += kThreads) {
                    const int t = x / (2 * DK), y = x % (2 * DK), h = y / DK, r = y % DK;
                    rin[rl.row(t) + (h == 0 ? hd.q_off : hd.k_off) + r] = sm.qk[h][t][r];
                }
            for (int t = threadIdx.x; t < n; t += kThreads) {
                rin[rl.g(t) + j] = sm.g[t];
                rin[rl.beta(t) + j] = sm.beta[t];
            }
        }
    }
    // the partial products summed into warp 0's (token t by warp t % 4)
    for (int t = w; t < n; t += W)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float x = sm.part[h][0][t][c];
#pragma unroll
            for (int u = 1; u < W; u++) x += sm.part[h][u][t][c];
            sm.part[h][0][t][c] = x;
        }
    // the masked dot products of the lower triangle's pairs (t, i <= t)
    for (int x = threadIdx.x; x < n * (n + 1) / 2; x += kThreads) {
        int t, i;
        triangle_pair(x, t, i);
        float l = 0.0f, q = 0.0f;
        const bool anc = i < t && (sm.anc[t] >> i & 1u);
        if (anc || i == t) {
            float kk = 0.0f;
            const float4 *ki = reinterpret_cast<const float4 *>(sm.qk[1][i]);
            const float4 *kt = reinterpret_cast<const float4 *>(sm.qk[1][t]);
            const float4 *qt = reinterpret_cast<const float4 *>(sm.qk[0][t]);
#pragma unroll 4
            for (int r = 0; r < DK / 4; r++) {
                const float4 a4 = ki[r], k4 = kt[r], q4 = qt[r];
                kk += k4.x * a4.x + k4.y * a4.y + k4.z * a4.z + k4.w * a4.w;
                q += q4.x * a4.x + q4.y * a4.y + q4.z * a4.z + q4.w * a4.w;
            }
            const float d = expf(sm.G[t] - sm.G[i]);
            l = anc ? sm.beta[t] * d * kk : 0.0f;
            q *= d;
        }
        sm.L[t][i] = l;
        sm.A[t][i] = q;
    }
    __syncthreads();

    // U by forward substitution, every warp alike (lane c its column; U in registers), then the outputs of the
    // warp's tokens w, w + 4, ...
    const float(&ks)[kGdnParMax][kGdnParCols] = sm.part[0][0];
    const float(&qs)[kGdnParMax][kGdnParCols] = sm.part[1][0];
    float u[kGdnParMax];
#pragma unroll
    for (int t = 0; t < kGdnParMax; t++) {
        if (t >= n) break;
        float x = sm.beta[t] * (sm.v[t][c] - sm.eg[t] * ks[t][c]);
#pragma unroll
        for (int i = 0; i < t; i++) x -= sm.L[t][i] * u[i];
        u[t] = x;
    }
    if (!g.out || c >= cols) return;
#pragma unroll
    for (int t = 0; t < kGdnParMax; t++) {
        if (t >= n) break;
        if (t % W != w) continue;
        float o = sm.eg[t] * qs[t][c];
#pragma unroll
        for (int i = 0; i <= t; i++) o += sm.A[t][i] * u[i];
        g.out[(t0 + t) * (int64_t)g.n_v * dv + (int64_t)j * dv + col0 + c] = o;
    }
}

// gdn_parallel_kernel<DK, W> on a grid of (value head, entry, column group).
template <int DK, int W>
static void launch_parallel(cudaStream_t s, const GdnArgs &a, const BatchMeta &m, const GdnCall &g) {
    const dim3 grid((unsigned)g.n_v, (unsigned)m.n_ent, (unsigned)((g.dv + kGdnParCols - 1) / kGdnParCols));
    int dev_index = 0;
    check(cudaGetDevice(&dev_index), "gdn");
    allow_dynamic_smem<gdn_parallel_kernel<DK, W>>(dev_index, sizeof(GdnPar<DK, W>), "gdn (parallel)");
    gdn_parallel_kernel<DK, W><<<grid, 32 * W, sizeof(GdnPar<DK, W>), s>>>(a);
    check_launch("gdn (parallel)");
}

void launch_gdn_parallel(cudaStream_t s, GdnArgs &a, const BatchMeta &m, const GdnCall &g) {
    a.parallel_max = kGdnParMax;
    static const bool eight = env_int("DFL_CUDA_GDN_PAR_WARPS", 8) != 4;
    if (g.dk == 128)
        eight ? launch_parallel<128, 8>(s, a, m, g) : launch_parallel<128, 4>(s, a, m, g);
    else
        eight ? launch_parallel<64, 8>(s, a, m, g) : launch_parallel<64, 4>(s, a, m, g);
}

}  // namespace cuda
}  // namespace dfl
