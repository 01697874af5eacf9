// Gated DeltaNet layer ops: causal depthwise conv + SiLU, q/k L2 norm and gates, and the gated delta rule.
#include <algorithm>
#include <cmath>
#include <limits>

#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/cuda_device.h"
#include "ops/cuda/gdn_head.cuh"

namespace dfl {
namespace cuda {

constexpr int kConvThreads = 128;
constexpr int64_t kConvTokens = 16;     // tokens a conv1d_silu thread runs (a chunk of its entry's)
constexpr int64_t kConvTreeTokens = 8;  // the same in a batch with token trees
static_assert(kConvMaxK - 1 <= kConvTokens && kConvMaxK - 1 <= kConvTreeTokens,
              "only chunk 0 of a chain may read the stored conv rows");
constexpr int kGatesThreads = 128;

// One chain chunk of conv1d_silu_kernel (below) with its window rows loaded into registers first, all at once: the
// kernel's loop issues a token's loads only after the token before is stored (out and the records may alias x for
// the compiler), one memory latency a token. Same sums in the same order. Why: the H100 12-05 16:2x verify profile had
// the DeltaNet's small ops (conv, gates, gated norm) at 1.48 ms of a 16-row verify against 0.65 of a decode step; the
// conv walked its 16 tokens and 19 recorded rows a latency each. Measured (H100 12-05 17:3x, one call): 27B q8_0
// verify of 16 rows 17.28 -> 17.15 ms, of 23 18.80 -> 17.96.
// out: the entry's output rows, x its input rows (xs apart), cs its slot's stored rows, rw its window record (or null).
__device__ __forceinline__ void conv_chunk_regs(const ConvCall &cc, int64_t c, int64_t i0, int64_t i1, const float *cs,
                                                const float *x, int64_t xs, float *rw, float *out) {
    const int C = cc.C, K = cc.K;
    constexpr int kRows = kConvTokens + kConvMaxK - 1;
    float win[kRows], wt[kConvMaxK];
    const int64_t rows = i1 - i0 + K - 1;  // window rows i0 .. i1 + K - 2 (row r < K - 1: the slot's stored row r)
#pragma unroll
    for (int r = 0; r < kRows; r++) {
        const int64_t a = i0 + r;
        win[r] = r < rows ? (a < K - 1 ? cs[a * C + c] : x[(a - (K - 1)) * xs + c]) : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < kConvMaxK; j++) wt[j] = j < K ? cc.w[(int64_t)j * C + c] : 0.0f;
    if (rw) {  // chunk 0 records the stored rows and its tokens' rows, later chunks their tokens' rows
#pragma unroll
        for (int r = 0; r < kRows; r++)
            if (r < rows && (i0 == 0 || r >= K - 1)) rw[(i0 + r) * C + c] = win[r];
    }
#pragma unroll
    for (int t = 0; t < kConvTokens; t++) {
        if (t >= i1 - i0) break;
        float acc = 0.0f;
#pragma unroll
        for (int j = 0; j < kConvMaxK; j++)
            if (j < K) acc += wt[j] * win[t + j];
        out[(i0 + t) * C + c] = silu_f(acc);
    }
}

// Thread (channel c, chunk of an entry's tokens, entry e). Window row r < K-1 is the slot's stored input r, later
// rows are the entry's tokens. Chunks of kConvTokens tokens, so a long prompt runs on many blocks (one thread a channel
// had walked all its tokens: 10,240 threads for a 27B prefill). Only a chain's tokens below K-1 read the stored rows,
// and they are chunk 0's, which alone writes the new state after them (an entry that does not record), walking r
// upwards and reading row n + r > r, not yet overwritten; each chunk records its own tokens' window rows, chunk 0 the
// stored ones too. A tree's tokens of any chunk may reach the stored rows through their ancestors: trees record, so
// nothing overwrites them. Trees run chunks of kConvTreeTokens (each token walks its K - 1 ancestors: a 23-node tree
// on one thread a channel was 23 such walks one after the other).
// A tree entry's token (parent != null) builds its window along its ancestors: window row K-1+a for ancestor a, then
// the old rows past the root.
__global__ void conv1d_silu_kernel(ConvCall cc, const int32_t *t0s, const int32_t *ns, const int32_t *slots,
                                   float *const *rec_window, const int32_t *parent, int64_t chunk) {
    const int e = blockIdx.z;
    const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int C = cc.C, K = cc.K;
    if (c >= C) return;
    const int64_t n = ns[e], t0 = t0s[e];
    const int64_t i0 = (int64_t)blockIdx.y * chunk, i1 = i0 + chunk < n ? i0 + chunk : n;
    if (i0 >= n) return;
    float *cs = cc.conv + (int64_t)slots[e] * cc.slot_stride;
    const int64_t xs = cc.x_pitch();
    const float *x = cc.x + t0 * xs;
    auto window = [&](int64_t r) -> float { return r < K - 1 ? cs[r * C + c] : x[(r - (K - 1)) * xs + c]; };
    const int32_t *par = parent ? parent + t0 : nullptr;
    const bool in_regs = K <= kConvMaxK && !par && i1 - i0 <= kConvTokens;
    float *rw = rec_window ? rec_window[e] : nullptr;
    if (rw) {
        rw += (int64_t)cc.rec_layer * (K - 1 + n) * C;
        if (!in_regs)
            for (int64_t r = i0 == 0 ? 0 : K - 1 + i0; r < K - 1 + i1; r++) rw[r * C + c] = window(r);
    }
    auto w = [&](int j) { return cc.w[(int64_t)j * C + c]; };  // tap-major: a warp's channels side by side
    if (in_regs) conv_chunk_regs(cc, c, i0, i1, cs, x, xs, rw, cc.out + t0 * C);
    for (int64_t i = in_regs ? i1 : i0; i < i1; i++) {
        float acc = 0.0f;
        if (par) {
            int64_t a = i, old = K - 2;
            for (int j = K - 1; j >= 0; j--) {
                acc += w(j) * window(a >= 0 ? K - 1 + a : old--);
                if (a >= 0) a = par[a];
            }
        } else {
            for (int j = 0; j < K; j++) acc += w(j) * window(i + j);
        }
        cc.out[(t0 + i) * C + c] = silu_f(acc);
    }
    if (i0 == 0 && !rw)  // (a recording entry's state stays; a rollback takes the kept rows from its window)
        for (int r = 0; r < K - 1; r++) cs[(int64_t)r * C + c] = window(n + r);
}

void launch_conv1d_silu(cudaStream_t s, const BatchMeta &m, const ConvCall &c) {
    if (m.n_ent <= 0 || c.C <= 0) return;
    // a batch without its token bound as one chunk an entry
    const bool one = m.max_n <= 0;
    const int64_t chunk = one ? std::numeric_limits<int32_t>::max() : m.parent ? kConvTreeTokens : kConvTokens;
    const int64_t chunks = one ? 1 : (m.max_n + chunk - 1) / chunk;
    const dim3 grid((unsigned)((c.C + kConvThreads - 1) / kConvThreads), (unsigned)chunks, (unsigned)m.n_ent);
    conv1d_silu_kernel<<<grid, kConvThreads, 0, s>>>(c, m.t0, m.n, m.slot, m.rec_window, m.parent, chunk);
    check_launch("conv1d_silu");
}

// Block (token, group y of gridDim.y): a warp per q/k head for the L2 norms (q then also scaled by 1/sqrt(dk)), then
// the gates, each spread over the token's blocks.
__global__ void gdn_gates_kernel(GdnGates g) {
    const int64_t t = blockIdx.x;
    const int lane = threadIdx.x & 31, nw = blockDim.x >> 5, warp = (threadIdx.x >> 5) + nw * blockIdx.y;
    const int warps = nw * gridDim.y, threads = blockDim.x * gridDim.y;
    float *row = g.cv + t * g.C;
    const float qscale = 1.0f / sqrtf((float)g.dk);
    for (int hh = warp; hh < 2 * g.n_k; hh += warps) {
        float *x = row + (int64_t)hh * g.dk;
        float ss = 0.0f;
        for (int d = lane; d < g.dk; d += 32) ss += x[d] * x[d];
        ss = warp_sum(ss);
        const float r = 1.0f / sqrtf(ss + 1e-6f);
        const bool is_q = hh < g.n_k;
        for (int d = lane; d < g.dk; d += 32) x[d] = is_q ? (x[d] * r) * qscale : x[d] * r;
    }
    const float *b = g.b + t * g.b_pitch(), *ar = g.a + t * g.a_pitch();
    for (int j = threadIdx.x + blockDim.x * blockIdx.y; j < g.n_v; j += threads) {
        const int64_t i = t * g.n_v + j;
        g.beta[i] = sigmoid_f(b[j]);
        const float xa = ar[j] + g.dt_bias[j];
        const float sp = xa > 20.0f ? xa : log1pf(expf(xa));
        g.g[i] = g.ssm_a[j] * sp;
    }
}

// Blocks a token: a q/k head a warp, over as many blocks as that takes. Measured (H100 12-05 19:2x, one call, against
// one block a token whose four warps walked 8 heads each: ncu had that at 9.5 us alone, 48 calls a 27B step): 27B q8_0
// decode 12.21 -> 12.09 ms, its 23-node tree verify 18.35 -> 18.07 ms, qwen3-8b unchanged (no DeltaNet).
void launch_gdn_gates(cudaStream_t s, int64_t T, const GdnGates &g) {
    if (T <= 0) return;
    constexpr int kWarps = kGatesThreads / 32;
    const unsigned groups = (unsigned)std::max(1, (2 * g.n_k + kWarps - 1) / kWarps);
    gdn_gates_kernel<<<dim3((unsigned)T, groups), kGatesThreads, 0, s>>>(g);
    check_launch("gdn_gates");
}



// Set-aside states of a tree the staged kernel keeps in shared memory (unless DFL_CUDA_GDN_TREE_SMEM=0): 64 KB for
// 128-row heads, so two blocks still fit an SM; a schedule that keeps more (trees of 32 tokens or more may) uses the
// records.
constexpr int kGdnSmemSlots = 4;

// A thread's R state values into / out of slot k of a tree schedule's shared-memory stack ([kGdnSmemSlots][R]
// [threads]: consecutive threads on consecutive words).
template <int R>
__device__ __forceinline__ void stack_store(float *stack, int k, const float (&s)[R]) {
#pragma unroll
    for (int i = 0; i < R; i++) stack[(k * R + i) * (int)blockDim.x + (int)threadIdx.x] = s[i];
}
template <int R>
__device__ __forceinline__ void stack_load(float (&s)[R], const float *stack, int k) {
#pragma unroll
    for (int i = 0; i < R; i++) s[i] = stack[(k * R + i) * (int)blockDim.x + (int)threadIdx.x];
}

// One token of the gated delta rule on a column held by P neighbouring lanes, R rows each (q, k: the lane's rows of
// the token's q and k): S *= exp(g); u = k.S; S += k beta (v - u); returns q.S, the column's output. The partial sums
// meet through log2 P shuffles, the same order in every lane. (Four interleaved partial sums a lane instead of one
// chain of R: no change, H100 12-05 22:4x: 27B verify 16 rows 14.95 -> 15.01 ms, pp4096 +0.5 %.)
template <int R, int P>
__device__ __forceinline__ float delta_step(float (&s)[R], const float *q, const float *k, float v, float decay,
                                            float beta) {
    float u = 0.0f;
#pragma unroll
    for (int i = 0; i < R; i++) {
        s[i] *= decay;
        u += k[i] * s[i];
    }
#pragma unroll
    for (int m = 1; m < P; m <<= 1) u += __shfl_xor_sync(0xffffffffu, u, m);
    const float delta = beta * (v - u);
    float o = 0.0f;
#pragma unroll
    for (int i = 0; i < R; i++) {
        s[i] += k[i] * delta;
        o += q[i] * s[i];
    }
#pragma unroll
    for (int m = 1; m < P; m <<= 1) o += __shfl_xor_sync(0xffffffffu, o, m);
    return o;
}

// Block (value head j, entry e, column group z). Columns of a head's state S [dk][dv] are independent in the delta
// rule; each token's q and k (shared by all columns) are read by every column.
//
// Any head size: one thread per column, the column updated in place in global memory (L1/L2 resident for one head).
__global__ void __launch_bounds__(kGdnThreads) gdn_global_kernel(GdnArgs a) {
    extern __shared__ float qk[];  // [2][dk]
    const GdnCall &g = a.g;
    const int j = blockIdx.x;
    const int dk = g.dk, dv = g.dv;
    const int b = blockIdx.z * blockDim.x + threadIdx.x;
    const bool active = b < dv;
    const GdnHead hd(a, dk, j, b);
    const int64_t n = hd.n, t0 = hd.t0;
    // a recording entry leaves its slot's state as it was: its column is updated in a working copy instead
    float *const S = hd.recording ? a.work + ((int64_t)blockIdx.y * g.n_v + j) * dk * dv : hd.S;
    if (hd.recording && active)
        for (int i = 0; i < dk; i++) S[(int64_t)i * dv + b] = hd.S[(int64_t)i * dv + b];
    for (int64_t it = 0; it < n; it++) {
        const TreeStep st = hd.step(it);  // (a tree: its schedule's order, set-aside states in the records)
        const int64_t tok = t0 + st.token;
        const float *row = hd.cv + hd.row(tok) * g.C;
        __syncthreads();
        for (int i = threadIdx.x; i < 2 * dk; i += blockDim.x)
            qk[i] = i < dk ? row[hd.q_off + i] : row[hd.k_off + (i - dk)];
        __syncthreads();
        if (!active) continue;
        const float *q = qk, *k = qk + dk;
        if (st.restore >= 0) {  // from the state after the token's parent, set aside
            const float *src = hd.aside(st.restore);
            for (int i = 0; i < dk; i++) S[(int64_t)i * dv + b] = src[(int64_t)i * dv + b];
        }
        const float decay = expf(hd.gl[hd.row(tok) * g.n_v + j]);
        const float beta = hd.beta[hd.row(tok) * g.n_v + j];
        const float v = row[hd.v_off];
        float u = 0.0f, o = 0.0f;
        for (int i = 0; i < dk; i++) {
            const float x = S[(int64_t)i * dv + b] * decay;
            S[(int64_t)i * dv + b] = x;
            u += k[i] * x;
        }
        const float delta = beta * (v - u);
        float *dst = st.save >= 0 ? hd.aside(st.save) : nullptr;
        for (int i = 0; i < dk; i++) {
            const float x = S[(int64_t)i * dv + b] + k[i] * delta;
            S[(int64_t)i * dv + b] = x;
            o += q[i] * x;
            if (dst) dst[(int64_t)i * dv + b] = x;
        }
        if (g.out) g.out[tok * (int64_t)g.n_v * dv + (int64_t)j * dv + b] = o;
    }
}

// The staged kernel, for heads of 128 or 64 rows: block (value head j, entry e, column group z) as above, but P
// neighbouring lanes own a column in registers (R = DK / P rows each, the partial sums meeting through log2 P
// shuffles), and the inputs of kGdnChunk tokens at a time (q, k, the block's v columns, g, beta, a tree's steps) are
// copied into shared memory by cp.async, the next chunk while this one is computed, so a token waits on no memory
// and no barrier. Why: the register kernel it replaced (two lanes a column, a token's q/k loaded then a barrier) ran a
// 16-token verify of the 27B in ~27 us a layer against ~5 us for one token, each token a global load and a barrier
// after a 64-long chain. Measured (H100 12-05 17:3x, one call): 27B q8_0 verify of 16 rows 17.28 -> 16.57 ms, of 23
// 18.80 -> 18.12, decode step unchanged (13.29 / 13.22), with the conv in registers pp512 4,363 -> 4,802 tok/s and
// pp4096 6,167 -> 7,096. Every token count runs it, so a decoded token and the same token in a verify block get the
// same sums. (Eight lanes a column, twice the blocks, for the 16-token call's 1.5 warps a scheduler: +0.1 ms on the 27B
// decode and every verify, pp512/pp4096 even, H100 12-06 08:3x. A chain's conv in chunks of 8 instead of 16: even,
// 08:4x.)
constexpr int kGdnChunk = 16;

template <int DK, int P>
struct GdnStage {
    static constexpr int kCols = kGdnThreads / P;  // columns a block owns
    static constexpr int R = DK / P, kSeg = R + 4;  // a lane's rows of q or k, and their stride in qk
    // q (h 0) and k (h 1) of each token, rows p R .. p R + R - 1 at qk[t][h][p]: the four floats of padding put the P
    // lanes of a column on different banks (unpadded, their rows p R + i, 128 bytes apart, fell in one bank: a 4-way
    // conflict on every read)
    float qk[kGdnChunk][2][P][kSeg];
    float v[kGdnChunk][kCols];
    float g[kGdnChunk], beta[kGdnChunk];
    int32_t steps[kGdnChunk];  // a tree's steps (TreeStep packed)
};

template <int DK, int P>
__global__ void __launch_bounds__(kGdnThreads) gdn_staged_kernel(GdnArgs a) {
    using Stage = GdnStage<DK, P>;
    constexpr int R = DK / P, kCols = Stage::kCols;
    __shared__ __align__(16) Stage st[2];
    const GdnCall &g = a.g;
    const int j = blockIdx.x, dv = g.dv;
    const int p = threadIdx.x % P, col = threadIdx.x / P;
    const int col0 = blockIdx.z * kCols, b = col0 + col;
    const bool active = b < dv;
    const int a0 = p * R;
    const GdnHead hd(a, DK, j, col0);
    if (hd.recording && hd.n <= a.parallel_max) return;  // gdn_parallel_kernel's (the whole block alike)
    const int e = hd.e;
    float *const S = hd.S;
    const int64_t n = hd.n, t0 = hd.t0, q_off = hd.q_off, k_off = hd.k_off, v_off = hd.v_off;
    const int v_words = min(kCols, dv - col0) / 4;  // 16-byte words of this block's v columns (dv % 4 == 0)

    // a tree is walked in its schedule (BatchMeta::tree_steps): step it runs token hd.step(it).token, sg.steps holding
    // a chunk's steps; the states it sets aside go to the records, or to shared memory (`stack`, [kGdnSmemSlots][R]
    // [kGdnThreads]) where GdnArgs::smem_stack and the schedule keeps at most kGdnSmemSlots
    const int32_t *steps = hd.steps;
    extern __shared__ float stack[];
    const bool in_smem = steps && a.smem_stack && TreeStep::unpack(steps[0]).slots <= kGdnSmemSlots;

    // chunk c's inputs into stage c % 2, one commit group
    auto load = [&](int64_t c) {
        Stage &sg = st[c & 1];
        const int64_t i0 = c * kGdnChunk, nt = min((int64_t)kGdnChunk, n - i0);
        constexpr int kQk = 2 * DK / 4;  // 16-byte words of a token's q and k
        for (int w = threadIdx.x; w < nt * (kQk + v_words); w += kGdnThreads) {
            const int t = w / (kQk + v_words), x = w % (kQk + v_words);
            const float *row = hd.cv + hd.row(t0 + hd.step(i0 + t).token) * g.C;
            if (x < kQk) {
                const int h = x / (kQk / 2), r = 4 * (x % (kQk / 2));  // q or k, and the word's first row
                cp_async16(&sg.qk[t][h][r / R][r % R], row + (h == 0 ? q_off : k_off) + r);
            } else {
                cp_async16(&sg.v[t][4 * (x - kQk)], row + v_off + 4 * (x - kQk));
            }
        }
        for (int t = threadIdx.x; t < nt; t += kGdnThreads) {
            const int64_t tok = t0 + hd.step(i0 + t).token;
            cp_async4(&sg.g[t], hd.gl + hd.row(tok) * g.n_v + j);
            cp_async4(&sg.beta[t], hd.beta + hd.row(tok) * g.n_v + j);
            if (steps) cp_async4(&sg.steps[t], steps + i0 + t);
        }
        cp_async_commit();
    };

    // GdnCall::rec_inputs: this entry's light record of the layer's inputs (GdnRecordLayout); each value written by
    // one block: its v columns by every block, a key head's q and k by value head j = kh's first column group, g and
    // beta by each head's first group
    const GdnRecordLayout rl{n, g.C, g.n_v};
    float *rin = a.rec_in ? a.rec_in[e] : nullptr;
    if (rin) rin += rl.layer(g.rec_layer);
    // the entry's token that slot t of the chunk from step i0 holds
    auto token_of = [&](const Stage &sg, int64_t i0, int t) -> int64_t {
        return steps ? TreeStep::unpack(sg.steps[t]).token : i0 + t;
    };
    auto record_chunk = [&](const Stage &sg, float *dst, int64_t i0, int64_t nt) {
        const int cu = 4 * v_words;
        for (int w = threadIdx.x; w < nt * cu; w += kGdnThreads)
            dst[rl.row(token_of(sg, i0, w / cu)) + v_off + w % cu] = sg.v[w / cu][w % cu];
        if (blockIdx.z != 0) return;
        if (j < g.n_k)
            for (int w = threadIdx.x; w < nt * 2 * DK; w += kGdnThreads) {
                const int t = w / (2 * DK), x = w % (2 * DK);
                const int h = x / DK, r = x % DK;
                dst[rl.row(token_of(sg, i0, t)) + (h == 0 ? q_off : k_off) + r] = sg.qk[t][h][r / R][r % R];
            }
        for (int t = threadIdx.x; t < nt; t += kGdnThreads) {
            dst[rl.g(token_of(sg, i0, t)) + j] = sg.g[t];
            dst[rl.beta(token_of(sg, i0, t)) + j] = sg.beta[t];
        }
    };

    const int64_t chunks = (n + kGdnChunk - 1) / kGdnChunk;
    if (chunks > 0) load(0);
    float s[R];
    load_column(s, S, a0, dv, b, active);
    for (int64_t c = 0; c < chunks; c++) {
        if (c + 1 < chunks) {
            load(c + 1);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();  // chunk c's copies, by every thread, have landed
        const Stage &sg = st[c & 1];
        const int64_t i0 = c * kGdnChunk, nt = min((int64_t)kGdnChunk, n - i0);
        if (rin) record_chunk(sg, rin, i0, nt);
        for (int t = 0; t < nt; t++) {
            const TreeStep stp = steps ? TreeStep::unpack(sg.steps[t]) : TreeStep{};
            const int64_t tok = t0 + (steps ? stp.token : i0 + t);
            if (stp.restore >= 0 && active) {
                // a tree token: from the state after its parent, set aside (this thread's rows, written by it)
                if (in_smem)
                    stack_load(s, stack, stp.restore);
                else
                    load_column(s, hd.aside(stp.restore), a0, dv, b, true);
            }
            const float v = active ? sg.v[t][col] : 0.0f;
            const float o = delta_step<R, P>(s, sg.qk[t][0][p], sg.qk[t][1][p], v, expf(sg.g[t]), sg.beta[t]);
            if (active) {
                if (p == 0 && g.out) g.out[tok * (int64_t)g.n_v * dv + (int64_t)j * dv + b] = o;
                if (stp.save >= 0) {
                    if (in_smem)
                        stack_store(stack, stp.save, s);
                    else
                        store_column(hd.aside(stp.save), s, a0, dv, b);
                }
            }
        }
        __syncthreads();  // stage c % 2 is read: chunk c + 2 may be copied into it
    }
    if (active && !hd.recording) store_column(S, s, a0, dv, b);  // (a recording entry's slot keeps the state before)
}

// A recording forward's Gated DeltaNet inputs into each recording entry's light records (BatchMeta::rec_in): block
// (token, column group); an entry of n tokens keeps layer r's at r n (C + 2 n_v): rows [n][C], g [n][n_v], beta [n][n_v].
__global__ void record_gdn_inputs_kernel(GdnInputs r, const int32_t *ent, const int32_t *t0s, const int32_t *ns,
                                         float *const *rec_in) {
    const int64_t t = blockIdx.x;
    const int e = ent[t];
    float *dst = rec_in[e];
    if (!dst) return;
    const int64_t n = ns[e], i = t - t0s[e], C = r.C, nv = r.n_v;
    const GdnRecordLayout rl{n, C, nv};
    float *base = dst + rl.layer(r.rec_layer);
    for (int64_t c = (int64_t)blockIdx.y * blockDim.x + threadIdx.x; c < C + 2 * nv; c += (int64_t)gridDim.y * blockDim.x) {
        if (c < C)
            base[rl.row(i) + c] = r.cv[t * C + c];
        else if (c < C + nv)
            base[rl.g(i) + (c - C)] = r.g[t * nv + (c - C)];
        else
            base[rl.beta(i) + (c - C - nv)] = r.beta[t * nv + (c - C - nv)];
    }
}

void launch_record_gdn_inputs(cudaStream_t s, const BatchMeta &m, const GdnInputs &r) {
    if (m.T <= 0) return;
    const int64_t cols = (int64_t)r.C + 2 * r.n_v;
    const dim3 grid((unsigned)m.T, (unsigned)std::min<int64_t>((cols + 255) / 256, 64));
    record_gdn_inputs_kernel<<<grid, dim3(256), 0, s>>>(r, m.ent, m.t0, m.n, m.rec_in);
    check_launch("record_gdn_inputs");
}

// The staged kernel on a's grid, with the tree stack's shared memory where a keeps trees' states there.
template <int DK, int P>
static void launch_gdn_staged(cudaStream_t s, const GdnArgs &a) {
    constexpr int kCols = GdnStage<DK, P>::kCols;
    constexpr size_t kStack = (size_t)kGdnSmemSlots * (DK / P) * kGdnThreads * sizeof(float);
    const size_t shm = a.smem_stack ? kStack : 0;
    if (shm) {
        int dev = 0;
        check(cudaGetDevice(&dev), "gdn");
        allow_dynamic_smem<gdn_staged_kernel<DK, P>>(dev, kStack, "gdn (tree stack)");
    }
    const dim3 grid((unsigned)a.g.n_v, (unsigned)(a.n_ent * a.g.layers), (unsigned)((a.g.dv + kCols - 1) / kCols));
    gdn_staged_kernel<DK, P><<<grid, dim3(kGdnThreads), shm, s>>>(a);
}

GdnArgs gdn_args(const BatchMeta &m, const GdnCall &g) {
    GdnArgs a;
    a.g = g;
    a.n_ent = m.n_ent;
    a.t0 = m.t0;
    a.n = m.n;
    a.slot = m.slot;
    a.rec_state = m.rec_state;
    a.recording = m.rec_in;
    a.rec_in = nullptr;
    a.work = nullptr;
    a.tree_steps = m.tree_steps;
    a.smem_stack = false;
    a.parent = m.parent;
    a.parallel_max = 0;
    return a;
}

void launch_gdn(CudaDevice &dev, const BatchMeta &m, const GdnCall &g) {
    cudaStream_t s = dev.stream();
    if (m.n_ent <= 0 || g.n_v <= 0 || g.dv <= 0) return;
    if (g.n_k <= 0) fail(DFL_ERR_INVALID, "gdn: n_k must be positive");
    check_gdn_replay(m.n_ent, g);
    GdnArgs a = gdn_args(m, g);
    const size_t shm = (size_t)2 * g.dk * sizeof(float);
    const unsigned ys = (unsigned)(m.n_ent * g.layers);  // (entry, layer)
    const dim3 grid_glob((unsigned)g.n_v, ys, (unsigned)((g.dv + kGdnThreads - 1) / kGdnThreads));
    // the staged kernel's 16-byte copies: rows, q/k heads and v columns on 16-byte boundaries
    const bool aligned = g.C % 4 == 0 && g.dv % 4 == 0 && g.layer_in % 4 == 0 && ((uintptr_t)g.cv & 15) == 0;
    const bool staged = aligned && (g.dk == 128 || g.dk == 64);
    // the recording entries of up to kGdnParMax tokens in parallel form (gdn_parallel.cu), the rest staged: by default
    // in any batch (=2: only in a batch of token trees, =0: never). Why: trees first, against the staged kernel a 27B
    // tree of 23 tokens -0.2 ms (H100 12-06 06:5x) and -0.22 ms (H200 12-06 08:1x); the chains too since the kernel's
    // eight warps (H100 12-07 08:0x, two runs each way: verify of 8 / 16 rows 12.43 / 13.53-13.62 -> 12.30-12.36 /
    // 13.41-13.44 ms, the tree and decode even).
    static const int64_t par_mode = env_int("DFL_CUDA_GDN_PARALLEL", 1);
    const bool par_on = par_mode == 1 || (par_mode == 2 && m.parent);
    const bool parallel = par_on && staged && m.rec_in && m.n_record > 0 && m.max_n > 1 && g.layers == 1 && !g.in_rows;
    if (g.rec_inputs) {  // the staged and parallel kernels copy the recording entries' inputs they run themselves
        if (staged)
            a.rec_in = m.rec_in;
        else
            launch_record_gdn_inputs(s, m, gdn_inputs(g));
    }
    if (parallel) launch_gdn_parallel(s, a, m, g);
    // (a batch whose entries all record, none longer than the parallel form takes, has nothing left for the staged
    // kernel: its launch alone cost a decode step's 48 layers ~0.2 ms, H100 12-06 06:5x)
    if (parallel && m.n_record == m.n_ent && m.max_n <= kGdnParMax) {
        check_launch("gdn");
        return;
    }
    if (staged) {
        // a tree's set-aside states in shared memory where they fit (DFL_CUDA_GDN_TREE_SMEM=0: the records). Why: the
        // bench's 23-node tree stored and reloaded the states after its 7 branch points through global memory, 7 x
        // 3.1 MB each way a 27B layer. Measured (H100 12-05 22:4x, one job): its verify 17.34 / 17.11 -> 17.06 ms, the
        // chains unchanged.
        static const bool smem = env_switch("DFL_CUDA_GDN_TREE_SMEM", true);
        a.smem_stack = smem && m.tree_steps;
        if (g.dk == 128)
            launch_gdn_staged<128, 4>(s, a);
        else
            launch_gdn_staged<64, 2>(s, a);
    } else {
        if (m.rec_in)  // (room for every entry: which of them record is on the device)
            a.work = (float *)dev.gdn_buffer((size_t)ys * g.n_v * g.dk * g.dv * sizeof(float));
        gdn_global_kernel<<<grid_glob, dim3(kGdnThreads), shm, s>>>(a);
    }
    check_launch("gdn");
}

}  // namespace cuda
}  // namespace dfl
