// The Gated DeltaNet's delta rule of recording entries in parallel form (DFL_CUDA_GDN_PARALLEL=1, opt-in).
#include "ops/cuda/gdn_head.cuh"

namespace dfl {
namespace cuda {

// The delta rule of a recording entry of at most kGdnParMax tokens in parallel form (DFL_CUDA_GDN_PARALLEL=1,
// opt-in): a recording entry's slot keeps the state before and its records keep the inputs, so only the tokens'
// outputs are wanted, and no token has to wait for the one before (the staged kernel runs them one after the other: a
// 16-row verify's gdn and conv cost +0.66 ms over a decode step, a 23-node tree's +1.28, H100 12-06 05:5x). Along a
// token's path (its ancestors, then itself; a chain's are the tokens before), with G_t = g_t + G_parent (log decays
// summed along the path, 0 before the root), S0 the slot's state, column b of it alone:
//   U_t = beta_t (v_t - e^G_t k_t.S0) - sum over proper ancestors j of beta_t e^(G_t - G_j) (k_t.k_j) U_j
//   o_t = e^G_t q_t.S0 + sum over ancestors j and t itself of e^(G_t - G_j) (q_t.k_j) U_j
// the recurrence's sums reordered (S_t = e^g_t S_parent + k_t U_t^T), every exponent <= 0. Parents precede children,
// so U is a forward substitution in token order. Block (value head j, entry e, group z of kGdnParCols columns),
// kGdnThreads threads; shared memory: q and k rows (stride DK + 1: a warp reading one column of many rows meets no
// bank twice), the block's v columns, k.S0 (then U) and q.S0 per token and column, the ancestor-masked k.k and q.k.
constexpr int kGdnParCols = 32;  // state columns a block

template <int DK>
struct GdnPar {
    float qk[2][kGdnParMax][DK + 1];
    float v[kGdnParMax][kGdnParCols];
    float ks[kGdnParMax][kGdnParCols];  // k_t.S0 for the block's columns, then U_t
    float qs[kGdnParMax][kGdnParCols];  // q_t.S0
    float L[kGdnParMax][kGdnParMax];    // beta_t e^(G_t - G_j) k_t.k_j, j a proper ancestor of t, else 0
    float A[kGdnParMax][kGdnParMax];    // e^(G_t - G_j) q_t.k_j, j an ancestor of t or t, else 0
    float G[kGdnParMax], beta[kGdnParMax], eg[kGdnParMax];
    int32_t par[kGdnParMax];
    uint32_t anc[kGdnParMax];           // bit j: token j is t's proper ancestor
};

template <int DK>
__global__ void __launch_bounds__(kGdnThreads) gdn_parallel_kernel(GdnArgs a) {
    extern __shared__ __align__(16) uint8_t par_smem[];
    GdnPar<DK> &sm = *reinterpret_cast<GdnPar<DK> *>(par_smem);
    const GdnCall &g = a.g;
    const int j = blockIdx.x, dv = g.dv, col0 = blockIdx.z * kGdnParCols;
    const GdnHead hd(a, DK, j, col0);
    if (!hd.recording || hd.n > a.parallel_max) return;  // the staged kernel's (the whole block alike)
    const int n = (int)hd.n;
    const int64_t t0 = hd.t0;
    const int cols = min(kGdnParCols, dv - col0);
    const int32_t *par = a.parent ? a.parent + t0 : nullptr;  // (null: a chain, token t's parent t - 1)

    // the entry's inputs: q, k, the block's v columns, g, beta
    for (int w = threadIdx.x; w < n * 2 * DK; w += kGdnThreads) {
        const int t = w / (2 * DK), x = w % (2 * DK), h = x / DK, r = x % DK;
        const float *row = hd.cv + hd.row(t0 + t) * g.C;
        sm.qk[h][t][r] = row[(h == 0 ? hd.q_off : hd.k_off) + r];
    }
    for (int w = threadIdx.x; w < n * kGdnParCols; w += kGdnThreads) {
        const int t = w / kGdnParCols, c = w % kGdnParCols;
        sm.v[t][c] = c < cols ? hd.cv[hd.row(t0 + t) * g.C + hd.v_off + c] : 0.0f;
    }
    for (int t = threadIdx.x; t < n; t += kGdnThreads) {
        const int64_t r = hd.row(t0 + t) * g.n_v + j;
        sm.G[t] = hd.gl[r];
        sm.beta[t] = hd.beta[r];
        sm.par[t] = par ? par[t] : t - 1;
    }
    __syncthreads();
    if (threadIdx.x == 0)  // the path sums and ancestor masks, in token order (parents first)
        for (int t = 0; t < n; t++) {
            const int pt = sm.par[t];
            if (pt >= 0) sm.G[t] += sm.G[pt];
            sm.eg[t] = expf(sm.G[t]);
            sm.anc[t] = pt >= 0 ? sm.anc[pt] | 1u << pt : 0u;
        }
    __syncthreads();

    // the masked dot products of every pair (t, i <= t)
    for (int w = threadIdx.x; w < n * n; w += kGdnThreads) {
        const int t = w / n, i = w % n;
        float l = 0.0f, q = 0.0f;
        const bool anc = i < t && (sm.anc[t] >> i & 1u);
        if (anc || i == t) {
            float kk = 0.0f;
#pragma unroll 8
            for (int r = 0; r < DK; r++) {
                const float ki = sm.qk[1][i][r];
                kk += sm.qk[1][t][r] * ki;
                q += sm.qk[0][t][r] * ki;
            }
            const float d = expf(sm.G[t] - sm.G[i]);
            l = anc ? sm.beta[t] * d * kk : 0.0f;
            q *= d;
        }
        sm.L[t][i] = l;
        sm.A[t][i] = q;
    }
    // k_t.S0 and q_t.S0 of the block's columns: lane c a column, warp w the tokens w, w + 4, ...
    {
        constexpr int kWarps = kGdnThreads / 32, kPer = kGdnParMax / kWarps;
        const int c = threadIdx.x % 32, w = threadIdx.x / 32;
        float ku[kPer] = {}, qu[kPer] = {};
        if (c < cols)
#pragma unroll 4
            for (int r = 0; r < DK; r++) {
                const float s0 = hd.S[(int64_t)r * dv + col0 + c];
#pragma unroll
                for (int m = 0; m < kPer; m++) {
                    const int t = w + kWarps * m;
                    if (t < n) {
                        ku[m] += sm.qk[1][t][r] * s0;
                        qu[m] += sm.qk[0][t][r] * s0;
                    }
                }
            }
#pragma unroll
        for (int m = 0; m < kPer; m++) {
            const int t = w + kWarps * m;
            if (t < n) {
                sm.ks[t][c] = ku[m];
                sm.qs[t][c] = qu[m];
            }
        }
    }
    __syncthreads();

    // U by forward substitution, a column a lane of the first warp (into ks, row t once rows < t are final)
    if (threadIdx.x < kGdnParCols) {
        const int c = threadIdx.x;
        for (int t = 0; t < n; t++) {
            float u = sm.beta[t] * (sm.v[t][c] - sm.eg[t] * sm.ks[t][c]);
            for (int i = 0; i < t; i++) u -= sm.L[t][i] * sm.ks[i][c];
            sm.ks[t][c] = u;
        }
    }
    __syncthreads();

    // the outputs: lane c a column, warp w the tokens w, w + 4, ...
    const int c = threadIdx.x % 32;
    if (g.out && c < cols)
        for (int t = threadIdx.x / 32; t < n; t += kGdnThreads / 32) {
            float o = sm.eg[t] * sm.qs[t][c];
            for (int i = 0; i <= t; i++) o += sm.A[t][i] * sm.ks[i][c];
            g.out[(t0 + t) * (int64_t)g.n_v * dv + (int64_t)j * dv + col0 + c] = o;
        }
}

void launch_gdn_parallel(cudaStream_t s, GdnArgs &a, const BatchMeta &m, const GdnCall &g) {
    a.parallel_max = kGdnParMax;
    const dim3 grid((unsigned)g.n_v, (unsigned)m.n_ent, (unsigned)((g.dv + kGdnParCols - 1) / kGdnParCols));
    int dev_index = 0;
    check(cudaGetDevice(&dev_index), "gdn");
    if (g.dk == 128) {
        allow_dynamic_smem<gdn_parallel_kernel<128>>(dev_index, sizeof(GdnPar<128>), "gdn (parallel)");
        gdn_parallel_kernel<128><<<grid, kGdnThreads, sizeof(GdnPar<128>), s>>>(a);
    } else {
        allow_dynamic_smem<gdn_parallel_kernel<64>>(dev_index, sizeof(GdnPar<64>), "gdn (parallel)");
        gdn_parallel_kernel<64><<<grid, kGdnThreads, sizeof(GdnPar<64>), s>>>(a);
    }
    check_launch("gdn (parallel)");
}

}  // namespace cuda
}  // namespace dfl
