// Paged causal attention of the full-attention layers (attn_prep.cu writes its Q and the KV cache rows).
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/cuda_device.h"
#include "ops/cuda/mma_int8.cuh"

namespace dfl {
namespace cuda {

constexpr int kAttnThreads = 128;
constexpr int kAttnTilePos = 64;  // cache positions scored per step
constexpr int kAttnMaxDimsPerThread = 4;  // head_dim <= 512
constexpr int kAttnWarpPos = 4;  // most cache positions a warp scores together (AttnArgs::warp_pos)

// Positions a warp scores together: 4 (their loads in flight at once; H200, qwen3-8b, with the other two 12-03 opt-ins:
// tg b1 205 -> 213 tok/s), or 1 with DFL_CUDA_ATTN_WARP_POS=1 (each waits its own memory latency).
static int attn_warp_pos() {
    static const int n = env_int("DFL_CUDA_ATTN_WARP_POS", kAttnWarpPos) < kAttnWarpPos ? 1 : kAttnWarpPos;
    return n;
}

struct AttnArgs {
    const float *Q;
    float *out;
    int n_head, n_kv, head_dim, block_size, max_blocks;
    float scale;
    const uint8_t *k, *v;
    uint32_t type_k, type_v;
    uint64_t k_row, v_row;
    const int32_t *ent, *t0, *len0, *n, *block_table;
    const uint64_t *vis;  // tree visibility per token (BatchMeta::vis), or null
    bool causal;
    int window;
    int warp_pos;  // cache positions a warp scores together (1..kAttnWarpPos)
    CudaDevice::QuantX q;  // where set, the output's int8 quantization for the product after (CudaDevice::stage_rows)
};

// Element i of the output (the token's rows of n_head x head_dim, i a multiple of 32 at lane 0: whole warps of
// consecutive elements), and its quantization where a.q is set.
__device__ __forceinline__ void store_attn_out(const AttnArgs &a, int64_t i, float v) {
    a.out[i] = v;
    if (a.q.xq) quant_q8_store(a.q, v, i);
}

// What a block of the decode kernels (grid: token, group of G query heads, split) works on: its token t and entry e,
// first query head h0 and KV head kvh, the cache positions [p_begin, p_end) its split covers of those the token sees,
// the entry's block table and the token's tree visibility mask.
struct AttnBlock {
    int64_t t, p_begin, p_end;
    int h0, e, kvh;
    const int32_t *bt;
    uint64_t vis;
    __device__ AttnBlock(const AttnArgs &a, int G, int64_t split_len) {
        t = blockIdx.x;
        h0 = blockIdx.y * G;
        e = a.ent[t];
        int64_t lo, hi;
        attn_range((int64_t)a.len0[e] + (t - a.t0[e]), a.len0[e], a.n[e], a.causal, a.window, &lo, &hi);
        p_begin = max(lo, (int64_t)blockIdx.z * split_len);
        p_end = min(hi, (int64_t)blockIdx.z * split_len + split_len);
        kvh = h0 / (a.n_head / a.n_kv);
        bt = a.block_table + (int64_t)e * a.max_blocks;
        vis = a.vis ? a.vis[t] : ~(uint64_t)0;
    }
};

// One block per (token, group of G query heads sharing one KV head, split). Each step scores a tile of cache
// positions (one warp per position: every K element is loaded once and used for the G heads), folds the tile into
// each head's running softmax (max m, sum l; one warp per head keeps them in shared memory), and accumulates V
// (thread d holds output dims d, d + blockDim... of all G heads, again one load of each V element for G heads).
// Without splits (gridDim.z == 1) the block writes the normalised output. With splits, block z covers positions
// [z * split_len, (z + 1) * split_len) and writes its unnormalised accumulators and (m, l) for attention_combine.
// Cache element of a type fixed at compile time (CT >= 0: the decode switch folds away, so unrolled loops can batch
// their loads) or read at run time (CT < 0: K and V of different types).
template <int CT>
__device__ __forceinline__ float load_cache(uint32_t type, const uint8_t *row, int64_t i) {
    return load_elem(CT >= 0 ? (uint32_t)CT : type, row, i);
}

template <int G, int CT>
__global__ void __launch_bounds__(kAttnThreads) attention_kernel(AttnArgs a, int64_t split_len, float *part_o,
                                                                 float *part_ml) {
    extern __shared__ float qs[];  // [G][head_dim]
    __shared__ float sc[G][kAttnTilePos];
    __shared__ float m_s[G], l_s[G], corr_s[G];
    __shared__ uint64_t row_s[kAttnTilePos];  // pool row of each tile position, found once while scoring
    pdl_trigger();  // launch_chain: a small grid, the next kernel may launch at once and wait
    pdl_wait();
    const AttnBlock B(a, G, split_len);
    const int64_t t = B.t, p_begin = B.p_begin, p_end = B.p_end;
    const int h0 = B.h0, e = B.e, kvh = B.kvh;
    const int32_t *bt = B.bt;
    const uint64_t vis = B.vis;
    const int hd = a.head_dim;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const int64_t qd = (int64_t)a.n_head * hd;
    for (int i = threadIdx.x; i < G * hd; i += blockDim.x) qs[i] = a.Q[t * qd + (int64_t)h0 * hd + i];
    if (threadIdx.x < G) {
        m_s[threadIdx.x] = -INFINITY;
        l_s[threadIdx.x] = 0.0f;
    }
    __syncthreads();

    float acc[G][kAttnMaxDimsPerThread];
#pragma unroll
    for (int g = 0; g < G; g++)
#pragma unroll
        for (int k = 0; k < kAttnMaxDimsPerThread; k++) acc[g][k] = 0.0f;
    for (int64_t p0 = p_begin; p0 < p_end; p0 += kAttnTilePos) {
        const int cnt = (int)min((int64_t)kAttnTilePos, p_end - p0);
        // A warp scores wp = a.warp_pos consecutive positions at once, so that their K loads are in flight together:
        // one position at a time, a decode step over a short context waits a full memory latency per position.
        const int wp = a.warp_pos;
        for (int j0 = warp * wp; j0 < cnt; j0 += nw * wp) {
            const uint8_t *kr[kAttnWarpPos];
#pragma unroll
            for (int q = 0; q < kAttnWarpPos; q++) {
                // past the warp's wp positions or the tile's end: a repeat of a scored position, not stored
                const int j = min(j0 + min(q, wp - 1), cnt - 1);
                const int64_t p = p0 + j;
                const uint64_t row = (uint64_t)bt[p / a.block_size] * a.block_size + p % a.block_size;
                if (lane == 0 && q < wp && j0 + q < cnt) row_s[j] = row;
                kr[q] = a.k + (row * a.n_kv + kvh) * a.k_row;
            }
            float dot[kAttnWarpPos][G];
#pragma unroll
            for (int q = 0; q < kAttnWarpPos; q++)
#pragma unroll
                for (int g = 0; g < G; g++) dot[q][g] = 0.0f;
#pragma unroll 2
            for (int d = lane; d < hd; d += 32) {
                float kd[kAttnWarpPos];
#pragma unroll
                for (int q = 0; q < kAttnWarpPos; q++) kd[q] = q < wp ? load_cache<CT>(a.type_k, kr[q], d) : 0.0f;
#pragma unroll
                for (int g = 0; g < G; g++) {
                    const float qv = qs[g * hd + d];
#pragma unroll
                    for (int q = 0; q < kAttnWarpPos; q++) dot[q][g] += qv * kd[q];
                }
            }
#pragma unroll
            for (int q = 0; q < kAttnWarpPos; q++) {
                const int j = j0 + q;
#pragma unroll
                for (int g = 0; g < G; g++) {
                    const float v = warp_sum(dot[q][g]);
                    // a tree token does not see the entry's tokens off its ancestor path
                    if (lane == 0 && q < wp && j < cnt)
                        sc[g][j] = attn_visible(vis, p0 + j, a.len0[e]) ? v * a.scale : -INFINITY;
                }
            }
        }
        __syncthreads();
        for (int g = warp; g < G; g += nw) {  // the new running max of head g
            float mx = -INFINITY;
            for (int j = lane; j < cnt; j += 32) mx = fmaxf(mx, sc[g][j]);
            mx = warp_max(mx);
            const float mnew = fmaxf(m_s[g], mx);
            if (lane == 0) {
                // 0 on the first tile (m = -inf); 1 while nothing was visible yet (a tree row's masked tile)
                corr_s[g] = mnew == -INFINITY ? 1.0f : expf(m_s[g] - mnew);
                m_s[g] = mnew;
            }
        }
        __syncthreads();
        for (int i = threadIdx.x; i < G * kAttnTilePos; i += blockDim.x) {
            const int g = i / kAttnTilePos, j = i % kAttnTilePos;
            if (j < cnt) sc[g][j] = sc[g][j] == -INFINITY ? 0.0f : expf(sc[g][j] - m_s[g]);
        }
        __syncthreads();
        for (int g = warp; g < G; g += nw) {  // l = l * corr + sum of the tile's weights
            float sum = 0.0f;
            for (int j = lane; j < cnt; j += 32) sum += sc[g][j];
            sum = warp_sum(sum);
            if (lane == 0) l_s[g] = l_s[g] * corr_s[g] + sum;
        }
        float corr[G];
#pragma unroll
        for (int g = 0; g < G; g++) corr[g] = corr_s[g];
#pragma unroll
        for (int g = 0; g < G; g++)
#pragma unroll
            for (int k = 0; k < kAttnMaxDimsPerThread; k++) acc[g][k] *= corr[g];
        // unrolled so several positions' V loads are in flight at once (each is a dependent-free load; without
        // unrolling every position would cost a full memory latency)
#pragma unroll 8
        for (int j = 0; j < cnt; j++) {
            const uint8_t *vr = a.v + (row_s[j] * a.n_kv + kvh) * a.v_row;
#pragma unroll
            for (int k = 0; k < kAttnMaxDimsPerThread; k++) {
                const int d = threadIdx.x + k * blockDim.x;
                if (d < hd) {
                    const float vd = load_cache<CT>(a.type_v, vr, d);
#pragma unroll
                    for (int g = 0; g < G; g++) acc[g][k] += sc[g][j] * vd;
                }
            }
        }
        __syncthreads();  // sc, corr_s and l_s are rewritten by the next tile
    }
    if (gridDim.z == 1) {
#pragma unroll
        for (int g = 0; g < G; g++) {
            const float inv = 1.0f / l_s[g];
            float *o = a.out + t * qd + (int64_t)(h0 + g) * hd;
#pragma unroll
            for (int k = 0; k < kAttnMaxDimsPerThread; k++) {
                const int d = threadIdx.x + k * blockDim.x;
                if (d < hd) o[d] = acc[g][k] * inv;
            }
        }
        return;
    }
    // an empty split (outside the positions this token sees) leaves m = -inf, l = 0: it weighs nothing in the combine
#pragma unroll
    for (int g = 0; g < G; g++) {
        const int64_t part = ((int64_t)t * a.n_head + h0 + g) * gridDim.z + blockIdx.z;
        float *po = part_o + part * hd;
#pragma unroll
        for (int k = 0; k < kAttnMaxDimsPerThread; k++) {
            const int d = threadIdx.x + k * blockDim.x;
            if (d < hd) po[d] = acc[g][k];
        }
        if (threadIdx.x == 0) {
            part_ml[2 * part] = m_s[g];
            part_ml[2 * part + 1] = l_s[g];
        }
    }
}

// --- decode attention, a warp per run of positions ------------------------------------------------------------------
// attention_kernel scores a tile with the whole block, then takes its softmax and accumulates V between barriers: over
// a short context (a decode step) a tile waits about a dozen memory latencies in a row (21 us a layer at batch 1 over a
// 16-144-token context, H200). Here each warp keeps its own running softmax over its own runs of positions, loads the K
// and V rows of a whole run at once (one latency per run), and the block's warps merge at the end as splits do. Lane l
// holds dims [DPL l, DPL l + DPL) of every row: head_dim 32 DPL; cache types f32, f16 and bf16, K and V the same.

// f(std::integral_constant<int, G>) for G, one of the query heads per block the kernels are instantiated for
// (kAttnHeads, below).
template <typename F>
static void with_heads_per_block(int G, F &&f) {
    switch (G) {
    case 8: f(std::integral_constant<int, 8>{}); break;
    case 6: f(std::integral_constant<int, 6>{}); break;
    case 4: f(std::integral_constant<int, 4>{}); break;
    case 3: f(std::integral_constant<int, 3>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    default: f(std::integral_constant<int, 1>{}); break;
    }
}

// BYTES of a cache row as loaded (one vector load), converted when used.
template <int BYTES>
struct RawWords {
    uint32_t w[BYTES / 4];
    __device__ __forceinline__ void load(const uint8_t *p) {
        if constexpr (BYTES % 16 == 0) {
#pragma unroll
            for (int i = 0; i < BYTES / 16; i++) {
                const uint4 v = __ldg((const uint4 *)p + i);
                w[4 * i] = v.x, w[4 * i + 1] = v.y, w[4 * i + 2] = v.z, w[4 * i + 3] = v.w;
            }
        } else if constexpr (BYTES == 8) {
            const uint2 v = __ldg((const uint2 *)p);
            w[0] = v.x, w[1] = v.y;
        } else {
            w[0] = __ldg((const unsigned int *)p);
        }
    }
    template <int CT>
    __device__ __forceinline__ float elem(int i) const {
        if constexpr (CT == DFL_TYPE_F32) return __uint_as_float(w[i]);
        const uint16_t h = (uint16_t)(w[i / 2] >> (16 * (i & 1)));
        if constexpr (CT == DFL_TYPE_BF16) return bf16_bits_to_f32(h);
        return half_bits_to_f32(h);
    }
};

// Positions a warp loads at once: as many as keep its registers (K and V rows, C x G scores, G x DPL query and
// output values) near 160.
__host__ __device__ constexpr int attn_warp_chunk(int G, int DPL, int words) {
    for (int c = 16; c > 2; c /= 2)
        if (2 * c * words + c * G + 2 * G * DPL <= 160) return c;
    return 2;
}

template <int G, int CT, int DPL>
__global__ void __launch_bounds__(kAttnThreads) attention_warp_kernel(AttnArgs a, int64_t split_len, float *part_o,
                                                                      float *part_ml) {
    constexpr int kWarps = kAttnThreads / 32, ES = CT == DFL_TYPE_F32 ? 4 : 2, HD = 32 * DPL;
    using Row = RawWords<DPL * ES>;
    constexpr int C = attn_warp_chunk(G, DPL, DPL * ES / 4);
    __shared__ float m_w[kWarps][G], l_w[kWarps][G];
    __shared__ float o_w[kWarps][G][HD];
    pdl_trigger();  // launch_chain: a small grid, the next kernel may launch at once and wait
    // The batch's metadata (entries, lengths, block tables, tree masks) is copied in before the step's first kernel and
    // no kernel writes it, so it is read before the wait, with the pool rows of the warp's first positions: its chain
    // of dependent loads overlaps the kernel before (attn_prep), leaving Q, K and V after the wait.
    const AttnBlock B(a, G, split_len);
    const int64_t t = B.t, p_begin = B.p_begin, p_end = B.p_end;
    const int h0 = B.h0, kvh = B.kvh;
    const int32_t *bt = B.bt;
    const uint64_t vis = B.vis;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t qd = (int64_t)a.n_head * HD, len0 = a.len0[B.e];
    // lane j < cnt of the warp's positions c0..: the pool row of position c0 + j
    auto pool_row = [&](int64_t c0, int cnt) -> uint64_t {
        if (lane >= cnt) return 0;
        const int64_t p = c0 + lane;
        return (uint64_t)bt[p / a.block_size] * a.block_size + p % a.block_size;
    };
    const int64_t c_first = p_begin + (int64_t)warp * C;
    uint64_t my_row = c_first < p_end ? pool_row(c_first, (int)min((int64_t)C, p_end - c_first)) : 0;
    pdl_wait();
    float q[G][DPL], acc[G][DPL], m[G], l[G];
#pragma unroll
    for (int g = 0; g < G; g++) {
        m[g] = -INFINITY;
        l[g] = 0.0f;
#pragma unroll
        for (int i = 0; i < DPL; i++) {
            q[g][i] = a.Q[t * qd + (int64_t)(h0 + g) * HD + lane * DPL + i];
            acc[g][i] = 0.0f;
        }
    }
    for (int64_t c0 = c_first; c0 < p_end; c0 += (int64_t)kWarps * C) {
        const int cnt = (int)min((int64_t)C, p_end - c0);
        if (c0 != c_first) my_row = pool_row(c0, cnt);
        Row kr[C], vr[C];
#pragma unroll
        for (int j = 0; j < C; j++) {
            const uint64_t row = __shfl_sync(0xffffffffu, my_row, min(j, cnt - 1));  // past cnt: a repeat, masked
            kr[j].load(a.k + (row * a.n_kv + kvh) * a.k_row + lane * DPL * ES);
            vr[j].load(a.v + (row * a.n_kv + kvh) * a.v_row + lane * DPL * ES);
        }
        float sc[C][G];
#pragma unroll
        for (int j = 0; j < C; j++)
#pragma unroll
            for (int g = 0; g < G; g++) {
                float d = 0.0f;
#pragma unroll
                for (int i = 0; i < DPL; i++) d += q[g][i] * kr[j].template elem<CT>(i);
                sc[j][g] = d;
            }
#pragma unroll
        for (int j = 0; j < C; j++) {
            // a tree token does not see the entry's tokens off its ancestor path
            const bool seen = j < cnt && attn_visible(vis, c0 + j, len0);
#pragma unroll
            for (int g = 0; g < G; g++) {
                const float v = warp_sum(sc[j][g]);
                sc[j][g] = seen ? v * a.scale : -INFINITY;
            }
        }
#pragma unroll
        for (int g = 0; g < G; g++) {
            float mx = m[g];
#pragma unroll
            for (int j = 0; j < C; j++) mx = fmaxf(mx, sc[j][g]);
            if (mx == -INFINITY) continue;  // nothing seen yet (the same in every lane)
            const float corr = expf(m[g] - mx);  // 0 on the first run that sees something
            l[g] *= corr;
#pragma unroll
            for (int i = 0; i < DPL; i++) acc[g][i] *= corr;
#pragma unroll
            for (int j = 0; j < C; j++) {
                const float p = expf(sc[j][g] - mx);  // unseen: exp(-inf) = 0
                l[g] += p;
#pragma unroll
                for (int i = 0; i < DPL; i++) acc[g][i] += p * vr[j].template elem<CT>(i);
            }
            m[g] = mx;
        }
    }
#pragma unroll
    for (int g = 0; g < G; g++) {
        if (lane == 0) {
            m_w[warp][g] = m[g];
            l_w[warp][g] = l[g];
        }
#pragma unroll
        for (int i = 0; i < DPL; i++) o_w[warp][g][lane * DPL + i] = acc[g][i];
    }
    __syncthreads();
    // the warps' softmaxes merged as the split combine does; a block that saw nothing leaves m = -inf, l = 0
    for (int idx = threadIdx.x; idx < G * HD; idx += blockDim.x) {
        const int g = idx / HD, d = idx % HD;
        float M = -INFINITY;
#pragma unroll
        for (int w = 0; w < kWarps; w++) M = fmaxf(M, m_w[w][g]);
        float L = 0.0f, O = 0.0f;
#pragma unroll
        for (int w = 0; w < kWarps; w++) {
            if (m_w[w][g] == -INFINITY) continue;
            const float f = expf(m_w[w][g] - M);
            L += f * l_w[w][g];
            O += f * o_w[w][g][d];
        }
        if (gridDim.z == 1) {
            store_attn_out(a, t * qd + (int64_t)(h0 + g) * HD + d, O / L);  // G * HD a multiple of 32: whole warps
        } else {
            const int64_t part = ((int64_t)t * a.n_head + h0 + g) * gridDim.z + blockIdx.z;
            part_o[part * HD + d] = O;
            if (d == 0) {
                part_ml[2 * part] = M;
                part_ml[2 * part + 1] = L;
            }
        }
    }
}

// Whether decode attention quantizes its output for the o projection (AttnArgs::q): on unless DFL_CUDA_ATTN_QUANT=0
// (for comparisons in one run; DFL_CUDA_FUSE_QUANT=0 turns off every such fusion).
static bool attn_quant_on() {
    static const bool on = env_switch("DFL_CUDA_ATTN_QUANT", true);
    return on;
}

// Whether decode attention runs attention_warp_kernel where it can (unless DFL_CUDA_ATTN_WARP=0).
static bool attn_warp_on() {
    static const bool on = env_switch("DFL_CUDA_ATTN_WARP", true);
    return on;
}

template <int G, int DPL>
static void launch_attention_warp_dpl(uint32_t type, dim3 grid, cudaStream_t s, const AttnArgs &a, int64_t split_len,
                                      float *part_o, float *part_ml) {
    switch (type) {
    case DFL_TYPE_F32: launch_chain(attention_warp_kernel<G, DFL_TYPE_F32, DPL>, grid, dim3(kAttnThreads), 0, s, a, split_len, part_o, part_ml); break;
    case DFL_TYPE_BF16: launch_chain(attention_warp_kernel<G, DFL_TYPE_BF16, DPL>, grid, dim3(kAttnThreads), 0, s, a, split_len, part_o, part_ml); break;
    default: launch_chain(attention_warp_kernel<G, DFL_TYPE_F16, DPL>, grid, dim3(kAttnThreads), 0, s, a, split_len, part_o, part_ml); break;
    }
}

template <int G>
static void launch_attention_warp_g(dim3 grid, cudaStream_t s, const AttnArgs &a, int64_t split_len, float *part_o,
                                    float *part_ml) {
    switch (a.head_dim) {
    case 64: launch_attention_warp_dpl<G, 2>(a.type_k, grid, s, a, split_len, part_o, part_ml); break;
    case 128: launch_attention_warp_dpl<G, 4>(a.type_k, grid, s, a, split_len, part_o, part_ml); break;
    default: launch_attention_warp_dpl<G, 8>(a.type_k, grid, s, a, split_len, part_o, part_ml); break;
    }
}

// attention_warp_kernel for this call if it takes it (else false): K and V of one type among f32, f16 and bf16, rows
// of whole 16-byte words, head_dim 64, 128 or 256.
static bool attention_warp_takes(const AttnArgs &a) {
    const bool type_ok = a.type_k == a.type_v &&
                         (a.type_k == DFL_TYPE_F32 || a.type_k == DFL_TYPE_F16 || a.type_k == DFL_TYPE_BF16);
    const bool hd_ok = a.head_dim == 64 || a.head_dim == 128 || a.head_dim == 256;
    return attn_warp_on() && type_ok && hd_ok && a.k_row % 16 == 0 && a.v_row % 16 == 0 &&
           ((uintptr_t)a.k | (uintptr_t)a.v) % 16 == 0;
}

static bool launch_attention_warp(int G, dim3 grid, cudaStream_t s, const AttnArgs &a, int64_t split_len,
                                  float *part_o, float *part_ml) {
    if (!attention_warp_takes(a)) return false;
    with_heads_per_block(G, [&](auto g) {
        launch_attention_warp_g<decltype(g)::value>(grid, s, a, split_len, part_o, part_ml);
    });
    return true;
}

// Block (token, head): merges the splits' partial softmaxes, rescaling each by exp(m_split - m_max).
__global__ void attention_combine_kernel(AttnArgs a, int n_split, const float *part_o, const float *part_ml) {
    pdl_trigger();
    pdl_wait();  // (launch_chain)
    const int64_t t = blockIdx.x;
    const int h = blockIdx.y;
    const int hd = a.head_dim;
    const int64_t base = ((int64_t)t * a.n_head + h) * n_split;
    float M = -INFINITY;
    for (int z = 0; z < n_split; z++) M = fmaxf(M, part_ml[2 * (base + z)]);
    float L = 0.0f;
    for (int z = 0; z < n_split; z++) {
        const float mz = part_ml[2 * (base + z)];
        if (mz != -INFINITY) L += expf(mz - M) * part_ml[2 * (base + z) + 1];
    }
    const float inv = 1.0f / L;
    const int64_t o = t * (int64_t)a.n_head * hd + (int64_t)h * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {  // a.q set: hd % 32 == 0, whole warps
        float s = 0.0f;
        for (int z = 0; z < n_split; z++) {
            const float mz = part_ml[2 * (base + z)];
            if (mz != -INFINITY) s += expf(mz - M) * part_o[(base + z) * hd + d];
        }
        store_attn_out(a, o + d, s * inv);
    }
}

constexpr int64_t kAttnMinSplitLen = 256;  // positions; shorter splits cost more in the combine than they gain

// Query heads a block (G). By default the largest instantiated G dividing the GQA group (one block a KV head at batch
// 1), unless that grid, splits included, does not fill the SMs: then the largest G whose grid fills them, else one
// head a block. Why fewer: each warp reduces G x 16 dot products by shuffles and takes G x 17 exponentials one after
// another; with G times the blocks each runs a G-th of that chain, reading each K and V row G times (from L2: 48
// positions are 24 KB a KV head, 1,024 positions 4 MB a layer). H100, one job each, alternated twice: 12-07 00:2x,
// G = 1 everywhere, qwen3-8b q8_0 tg b1 3.619 / 3.669 -> 3.522 / 3.515 ms, b8 4.179 / 4.137 -> 3.994 / 3.997; 12-07
// 01:3x, split grids too (b1 over 1,024 positions: 8 blocks x 4 splits -> 32 x 4), b1 4.295 / 4.273 -> 4.038 / 4.007
// ms, b8 even (its grid fills the SMs either way). DFL_CUDA_ATTN_G=N: at most N heads a block everywhere, no rule (8:
// the grids before the rule).
static int attn_max_heads() {
    static const int n = (int)std::max<int64_t>(0, env_int("DFL_CUDA_ATTN_G", 0));
    return n;  // 0: unset, the rule
}

constexpr int kAttnHeads[] = {8, 6, 4, 3, 2, 1};  // the instantiated G (with_heads_per_block), largest first

struct AttnSplit {
    int64_t n = 1, len;  // splits of the positions, and each one's length
};

// Few (token, head) rows over a long context would leave most SMs idle: split the positions so that there are about
// two blocks per SM, each split at least kAttnMinSplitLen long, and merge the partial softmaxes.
static AttnSplit attn_split(int64_t blocks, int64_t max_ctx, int sm_count) {
    const int64_t want = (2 * (int64_t)sm_count + blocks - 1) / blocks;
    const int64_t max_split = (max_ctx + kAttnMinSplitLen - 1) / kAttnMinSplitLen;
    AttnSplit sp;
    sp.n = std::max<int64_t>(1, std::min<int64_t>({want, max_split, 64}));
    sp.len = max_ctx;
    if (sp.n > 1) {
        sp.len = (max_ctx + sp.n - 1) / sp.n;
        sp.len = (sp.len + kAttnTilePos - 1) / kAttnTilePos * kAttnTilePos;
        sp.n = (max_ctx + sp.len - 1) / sp.len;
    }
    return sp;
}

// G and the splits of a decode attention call (attn_max_heads says how G is chosen): the instantiated G dividing the
// group, largest first, each with its splits, until one's grid fills the SMs or the rule does not apply to it.
static int attn_heads(int group, int64_t T, int n_head, int64_t max_ctx, int sm_count, AttnSplit &sp) {
    const int cap = attn_max_heads() > 0 ? attn_max_heads() : 8;
    for (int g : kAttnHeads) {
        if (g > cap || group % g != 0) continue;
        sp = attn_split(T * (n_head / g), max_ctx, sm_count);
        const bool fills = T * (n_head / g) * sp.n >= sm_count;
        if (fills || g == 1 || attn_max_heads() > 0) return g;
    }
    return 1;  // (not reached: g = 1 divides every group)
}

template <int G>
static void launch_attention_typed(uint32_t tk, uint32_t tv, dim3 grid, size_t shm, cudaStream_t s, const AttnArgs &a,
                                   int64_t split_len, float *part_o, float *part_ml) {
    const int ct = tk == tv ? (int)tk : -1;
    switch (ct) {
    case DFL_TYPE_F32: launch_chain(attention_kernel<G, DFL_TYPE_F32>, grid, dim3(kAttnThreads), shm, s, a, split_len, part_o, part_ml); break;
    case DFL_TYPE_F16: launch_chain(attention_kernel<G, DFL_TYPE_F16>, grid, dim3(kAttnThreads), shm, s, a, split_len, part_o, part_ml); break;
    case DFL_TYPE_BF16: launch_chain(attention_kernel<G, DFL_TYPE_BF16>, grid, dim3(kAttnThreads), shm, s, a, split_len, part_o, part_ml); break;
    case DFL_TYPE_Q8_0: launch_chain(attention_kernel<G, DFL_TYPE_Q8_0>, grid, dim3(kAttnThreads), shm, s, a, split_len, part_o, part_ml); break;
    default: launch_chain(attention_kernel<G, -1>, grid, dim3(kAttnThreads), shm, s, a, split_len, part_o, part_ml); break;
    }
}

static void launch_attention_kernel(int G, dim3 grid, size_t shm, cudaStream_t s, const AttnArgs &a, int64_t split_len,
                                    float *part_o, float *part_ml) {
    if (launch_attention_warp(G, grid, s, a, split_len, part_o, part_ml)) return;
    with_heads_per_block(G, [&](auto g) {
        launch_attention_typed<decltype(g)::value>(a.type_k, a.type_v, grid, shm, s, a, split_len, part_o, part_ml);
    });
}

void launch_attention(CudaDevice &dev, const BatchMeta &m, const AttnCall &c) {
    cudaStream_t s = dev.stream();
    if (m.T <= 0) return;
    if (c.kv.head_dim > kAttnThreads * kAttnMaxDimsPerThread)
        fail(DFL_ERR_UNSUPPORTED, "attention: head_dim " + std::to_string(c.kv.head_dim) + " above 512");
    if (c.kv.n_kv <= 0 || c.n_head % c.kv.n_kv != 0)
        fail(DFL_ERR_INVALID, "attention: n_head must be a multiple of n_kv");
    if (attention_gemm_path(m, c)) {  // many query rows per entry: tensor cores (attention_gemm.cu)
        launch_attention_gemm(dev, m, c);
        return;
    }
    AttnArgs a;
    a.Q = c.Q;
    a.out = c.out;
    a.n_head = c.n_head;
    a.n_kv = c.kv.n_kv;
    a.head_dim = c.kv.head_dim;
    a.block_size = c.kv.block_size;
    a.max_blocks = m.max_blocks;
    a.scale = c.scale;
    a.k = c.kv.k;
    a.v = c.kv.v;
    a.type_k = c.kv.type_k;
    a.type_v = c.kv.type_v;
    a.k_row = c.kv.k_row;
    a.v_row = c.kv.v_row;
    a.ent = m.ent;
    a.t0 = m.t0;
    a.len0 = m.len0;
    a.n = m.n;
    a.block_table = m.block_table;
    a.vis = m.vis;
    a.causal = c.causal;
    a.window = c.window;
    a.warp_pos = attn_warp_pos();
    const int64_t rows = m.T * c.n_head;
    AttnSplit sp;
    const int G = attn_heads(c.n_head / c.kv.n_kv, m.T, c.n_head, m.max_ctx, dev.sm_count(), sp);
    const int64_t n_split = sp.n, split_len = sp.len;
    const size_t shm = (size_t)G * c.kv.head_dim * sizeof(float);
    // The output's quantization for the o projection, written by the kernel that writes the output (the warp kernel,
    // or the combine after splits): one quantizer launch fewer a layer. The split partials follow it in the scratch.
    const int64_t n_out = (int64_t)c.n_head * c.kv.head_dim;
    const bool quant = attn_quant_on() && c.kv.head_dim % 32 == 0 && (n_split > 1 || attention_warp_takes(a));
    const size_t n_part = n_split > 1 ? (size_t)rows * (size_t)n_split : 0;
    const size_t q_bytes = quant ? CudaDevice::quant_scratch_bytes(m.T * n_out, true) : 0;
    const size_t o_bytes = round256(n_part * c.kv.head_dim * sizeof(float));
    uint8_t *scr = n_part || q_bytes ? (uint8_t *)dev.scratch(q_bytes + o_bytes + n_part * 2 * sizeof(float)) : nullptr;
    // (the scratch is now large enough: the staging takes its start without growing it)
    a.q = quant ? dev.stage_rows(c.out, m.T, n_out) : dev.stage_quant(nullptr, 0);
    if (n_split <= 1) {
        launch_attention_kernel(G, dim3((unsigned)m.T, (unsigned)(c.n_head / G), 1), shm, s, a, (int64_t)1 << 62,
                                nullptr, nullptr);
        check_launch("attention");
        return;
    }
    float *part_o = (float *)(scr + q_bytes), *part_ml = (float *)(scr + q_bytes + o_bytes);
    launch_attention_kernel(G, dim3((unsigned)m.T, (unsigned)(c.n_head / G), (unsigned)n_split), shm, s, a, split_len,
                            part_o, part_ml);
    check_launch("attention (split)");
    launch_chain(attention_combine_kernel, dim3((unsigned)m.T, (unsigned)c.n_head), dim3(kAttnThreads), 0, s, a,
                 (int)n_split, (const float *)part_o, (const float *)part_ml);
    check_launch("attention");
}

}  // namespace cuda
}  // namespace dfl
