// Products of 8..64 tokens on repacked q8_0 on int8 tensor cores (mma.sync m16n8k32): the register kernel and the
// kernel staged through shared memory, with their switches (fewer tokens go to the dp4a kernels of gemv_int8.cu).
#include <algorithm>
#include <type_traits>

#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/cuda_device.h"
#include "ops/cuda/mma_int8.cuh"
#include "ops/cuda/mma_stream.cuh"

namespace dfl {
namespace cuda {

// One warp's repacked q8_0 for U blocks of 32 of its rows (kb = kb0 + u kMmaWarps): 8 bytes of quants a lane per row
// half, and the rows' f16 scales as loaded.
template <int MT, int U>
struct Q8pStage {
    uint2 q[U][MT][2];
    uint16_t d[U][MT][2];
    // block u's row scales, converted
    __device__ __forceinline__ void scales(int u, float (&sw)[MT][2]) const {
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int h = 0; h < 2; h++) sw[mt][h] = half_bits_to_f32(d[u][mt][h]);
    }
    // acc (row tile mt, 8 tokens) += block u against the tokens' fragment b: s0 the scale of the lane's first C token,
    // s1 of its second
    __device__ __forceinline__ void mma(float (&acc)[4], int u, int mt, uint2 b, const float (&sw)[MT][2], float s0,
                                       float s1) const {
        int c[4];
        mma_s8_16x8x32(c, q[u][mt][0].x, q[u][mt][1].x, q[u][mt][0].y, q[u][mt][1].y, b.x, b.y);
        acc[0] += (float)c[0] * (sw[mt][0] * s0);
        acc[1] += (float)c[1] * (sw[mt][0] * s1);
        acc[2] += (float)c[2] * (sw[mt][1] * s0);
        acc[3] += (float)c[3] * (sw[mt][1] * s1);
    }
    __device__ __forceinline__ void load(const int8_t *qs, const uint16_t *dw, const int64_t (&wrow)[MT][2], int64_t n_in,
                                         int64_t nb, int64_t kb0, int t4) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int64_t kb = min(kb0 + u * kMmaWarps, nb - 1);  // past the end: a valid block, never used
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    q[u][mt][h] = __ldg((const uint2 *)(qs + wrow[mt][h] * n_in + kb * 32) + t4);
                    d[u][mt][h] = __ldg(dw + wrow[mt][h] * nb + kb);
                }
        }
    }
};

template <int MT, int NT8, int U, bool XT>
__global__ void __launch_bounds__(kMmaWarps * 32) gemv_q8p_mma_kernel(const int8_t *qs, const uint16_t *dw, int64_t n_in,
                                                                    int64_t n_out, const int8_t *xq, const float *xs,
                                                                    int64_t T, int T8, float *Y) {
    __shared__ float red[kMmaWarps][NT8 * 4][32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t4 = lane & 3;
    const int64_t nb = n_in / 32, row0 = (int64_t)blockIdx.x * 16 * MT;
    // rows past n_out and tokens past T read the last valid one; their sums are never stored
    int64_t wrow[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int h = 0; h < 2; h++) wrow[mt][h] = min(row0 + 16 * mt + 8 * h + g, n_out - 1);
    const MmaTokens<NT8> tok(T, n_in, nb, g, t4);
    float acc[MT][NT8][4] = {};
    constexpr int kStep = kMmaWarps * U;  // blocks of 32 per row a block's warps take per iteration
    Q8pStage<MT, U> cur, nxt;
    cur.load(qs, dw, wrow, n_in, nb, warp, t4);
    pdl_wait();  // (launch_pdl) the first weights are in flight; the activations are the kernel before's
    for (int64_t kb0 = warp; kb0 < nb; kb0 += kStep) {
        if (kb0 + kStep < nb) nxt.load(qs, dw, wrow, n_in, nb, kb0 + kStep, t4);
        MmaActs<NT8, false> xa[2];
        xa[0].template load<XT>(tok, xq, xs, nullptr, kb0, g, t4, T8);
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int64_t kb = kb0 + u * kMmaWarps;
            if (u + 1 < U) xa[(u + 1) & 1].template load<XT>(tok, xq, xs, nullptr, min(kb + kMmaWarps, nb - 1), g, t4, T8);
            if (kb >= nb) continue;
            const MmaActs<NT8, false> &x = xa[u & 1];
            float sw[MT][2];
            cur.scales(u, sw);
#pragma unroll
            for (int nt = 0; nt < NT8; nt++)
#pragma unroll
                for (int mt = 0; mt < MT; mt++) cur.mma(acc[mt][nt], u, mt, x.b[nt], sw, x.s[nt][0], x.s[nt][1]);
        }
        cur = nxt;
    }
    mma_store<MT, NT8>(red, acc, row0, n_out, T, Y);
}

// The same products staged through shared memory (DFL_CUDA_Q8P_PIPE=0: the register kernel above): a block's threads
// copy groups of 8 blocks of 32 (256 inputs) of its 16 MT rows, their scales and the fragment-ordered activations by
// cp.async, kPipeStages groups ahead, and each warp multiplies one block of 32 of a group from shared memory. The
// register kernel above keeps 16 KB of weights in flight an SM (8 warps x 2 iterations of 32 rows x 32 bytes) where the
// H200's bandwidth wants ~40 KB (4.8 TB/s x ~1 us over 132 SMs); its layer at 32 tokens ran at 1.3 TB/s (160 us,
// qwen3-8b, 12-03 21:06). Shared memory rows are 288 bytes (256 and 32 of padding) so that a half-warp's 8-byte A
// fragment loads (rows g, bytes 8 t4) fall in distinct banks. Needs n_in % 256 == 0 and the fragment-ordered copy.
constexpr int kPipeGroup = kMmaWarps;   // blocks of 32 a stage holds, one per warp (U of them with U > 1, below)
// A stage of U blocks of 32 a warp (kPipeGroup U a stage) holds its rows in U * 256 + 32 bytes: 8 words past a multiple
// of 32 whatever U, so the fragment loads stay on distinct banks.
__host__ __device__ constexpr int pipe_row_bytes(int U) { return kPipeGroup * 32 * U + 32; }
constexpr int kPipeStages = 4;
// Stages where the grid leaves one block an SM (on unless DFL_CUDA_Q8P_DEEP=0): the 4096-row matrices of qwen3-8b are
// 128 blocks of 32 rows, whose 3 stages ahead hold ~28 KB of weights an SM (the down projection at 8 tokens ran at
// 1.7 TB/s on this kernel, 12-03 23:06 kernel bench); 8 stages hold ~64 KB. H200, 12-04 02:2x, one call: qwen3-8b q8_0
// layer at 32 tokens 149.0 -> 137.7 us, tg b32 4554 -> 4845 tok/s (with DFL_CUDA_Q8P_MMA_MIN=5).
constexpr int kPipeDeepStages = 8;

// A stage's activations come from the fragment-ordered copy (mma_acts_kernel's [kPipeGroup][T8][32] quants and
// [kPipeGroup][T8] scales). Staging the quantizer's rows instead (no copy kernel before the product) was tried and
// lost: H200 12-04 05:1x tg b8 qwen3-8b 1,786 -> 1,659 tok/s; H100 12-05 17:3x 27B q8_0 verify of 16 rows 17.3 -> 21.9 ms.
__host__ __device__ constexpr int pipe_stage_bytes(int MT, int T8, int U = 1) {
    return 16 * MT * pipe_row_bytes(U) + 16 * MT * 16 * U + kPipeGroup * U * 32 * T8 + kPipeGroup * U * 4 * T8;
}

// U: blocks of 32 a warp multiplies a stage
template <int MT, int NT8, int U = 1>
struct PipeStage {
    static constexpr int kGroup = kPipeGroup * U, kRow = pipe_row_bytes(U);
    uint8_t *w;    // [16 MT rows][kRow]
    uint16_t *d;   // [16 MT rows][kGroup] row scales
    int8_t *xq;    // [kGroup][8 NT8 tokens][32]
    float *xs;     // [kGroup][8 NT8 tokens]
    __device__ __forceinline__ PipeStage(uint8_t *base) {
        constexpr int kXq = kGroup * 32 * 8 * NT8;
        w = base;
        d = (uint16_t *)(base + 16 * MT * kRow);
        xq = (int8_t *)(base + 16 * MT * kRow + 16 * MT * 2 * kGroup);
        xs = (float *)(base + 16 * MT * kRow + 16 * MT * 2 * kGroup + kXq);
    }
    // group j's weights and row scales (rows past n_out repeat the last one: never stored)
    __device__ __forceinline__ void load_w(const int8_t *qs, const uint16_t *dw, int64_t n_in, int64_t nb, int64_t n_out,
                                           int64_t row0, int64_t j) const {
        for (int c = threadIdx.x; c < 16 * MT * 16 * U; c += kMmaWarps * 32) {
            const int r = c / (16 * U), col = c % (16 * U);
            const int64_t row = min(row0 + r, n_out - 1);
            cp_async16(w + r * kRow + col * 16, qs + row * n_in + j * kGroup * 32 + col * 16);
        }
        if (threadIdx.x < 16 * MT * U) {  // U 16-byte words of scales a row (at most 64 of the 256 threads)
            const int r = threadIdx.x / U, part = threadIdx.x % U;
            const int64_t row = min(row0 + r, n_out - 1);
            cp_async16(d + r * kGroup + part * 8, dw + row * nb + j * kGroup + part * 8);
        }
    }
    // group j's activations: contiguous in the fragment-ordered copy
    __device__ __forceinline__ void load_x(const int8_t *fq, const float *fs, int64_t j) const {
        constexpr int kQ = kGroup * 8 * NT8 * 32 / 16, kS = kGroup * 8 * NT8 * 4 / 16;
        const int8_t *q = fq + j * kGroup * 8 * NT8 * 32;
        const float *sc = fs + j * kGroup * 8 * NT8;
        for (int c = threadIdx.x; c < kQ + kS; c += kMmaWarps * 32) {
            if (c < kQ)
                cp_async16(xq + c * 16, q + c * 16);
            else
                cp_async16(xs + (c - kQ) * 4, sc + (c - kQ) * 4);
        }
    }
};

// A thread's share of a stage's copies with the addressing done once (the two-blocks-a-warp stages, unless
// DFL_CUDA_Q8P_PIPE_PRE=0): PipeStage::load_w / load_x find each 16-byte word's row, column, source
// and destination again for every stage, in 64-bit arithmetic. Here a thread keeps, for each of its words, the
// source for stage 0 and the destination inside a stage, and a stage adds its own offsets: the same words to the
// same places. Why: ncu (H100 12-05 16:1x) had the 27B's gate|up at 16 tokens issuing 0.58 instructions a cycle per
// scheduler (50 % of the SM's issue) with DRAM 74 % busy: ~460 warp instructions a stage where the multiplies take
// ~140; the copies' address arithmetic is most of the rest.
// (Copying the activations straight from the quantizer's rows into the stage's fragment order, offsets a thread's
// once, with no mma_acts_kernel before, lost: H100 12-06 11:3x, the 27B layer at 16 / 24 / 32 tokens 172.7 / 188.1 /
// 194.1 -> 182.0 / 215.1 / 248.8 us, its 16-row verify 14.14 -> 14.96 ms, qwen3-8b tg b32 5.05 -> 6.47 ms a step.)
template <int MT, int NT8, int U>
struct PipeCopies {
    using Stage = PipeStage<MT, NT8, U>;
    static constexpr int kThreads = kMmaWarps * 32, kGroup = Stage::kGroup, kRow = Stage::kRow;
    static constexpr int kW = 16 * MT * 16 * U;                       // weight words a stage
    static constexpr int kWPer = (kW + kThreads - 1) / kThreads;
    static constexpr int kXq = kGroup * 8 * NT8 * 32 / 16, kX = kXq + kGroup * 8 * NT8 * 4 / 16;  // activation words
    static constexpr int kXPer = (kX + kThreads - 1) / kThreads;
    static constexpr int kScaleOff = 16 * MT * kRow, kXOff = kScaleOff + 16 * MT * 2 * kGroup;  // within a stage
    static_assert(kThreads % (16 * U) == 0, "a thread's weight words keep their column");
    static constexpr unsigned kWStep = kThreads / (16 * U) * kRow;   // a stage offset from one of them to the next
    const int8_t *w[kWPer];      // stage 0's source of the thread's weight words
    unsigned w_at;               // the first one's offset in a stage
    const uint16_t *d = nullptr; // stage 0's source of the thread's scale word (threads < 16 MT U)
    unsigned d_at = 0;
    const int8_t *fq = nullptr;
    const float *fs = nullptr;
    bool chunked = false;  // fq in chunks of a stage (MmaX::chunk)
    PipeCopies() = default;  // (a kernel without PRE: never used)
    __device__ __forceinline__ PipeCopies(const int8_t *qs, const uint16_t *dw, int64_t n_in, int64_t nb, int64_t n_out,
                                          int64_t row0, const int8_t *fq_, const float *fs_, bool chunked_)
        : fq(fq_), fs(fs_), chunked(chunked_) {
#pragma unroll
        for (int k = 0; k < kWPer; k++) {
            const int c = min((int)threadIdx.x + k * kThreads, kW - 1);  // (past kW: never copied)
            const int r = c / (16 * U), col = c % (16 * U);
            w[k] = qs + min(row0 + r, n_out - 1) * n_in + col * 16;
        }
        w_at = (unsigned)(threadIdx.x / (16 * U) * kRow + threadIdx.x % (16 * U) * 16);
        if (threadIdx.x < 16 * MT * U) {
            const int r = threadIdx.x / U, part = threadIdx.x % U;
            d = dw + min(row0 + r, n_out - 1) * nb + part * 8;
            d_at = (unsigned)(kScaleOff + r * kGroup * 2 + part * 16);
        }
    }
    // group j's weights and row scales into the stage at shared address st (PipeStage::load_w's copies)
    __device__ __forceinline__ void load_w(unsigned st, int64_t j) const {
#pragma unroll
        for (int k = 0; k < kWPer; k++)
            if (threadIdx.x + k * kThreads < kW) cp_async16_at(st + w_at + k * kWStep, w[k] + j * kGroup * 32);
        if (d) cp_async16_at(st + d_at, d + j * kGroup);
    }
    // group j's fragment-ordered activations (PipeStage::load_x's copies: quants then scales, both contiguous);
    // chunked, both in one run, as the stage holds them
    __device__ __forceinline__ void load_x(unsigned st, int64_t j) const {
        if (chunked) {
            cp_async_run<kX, kThreads>(st + kXOff, (const uint8_t *)fq + j * kX * 16);
            return;
        }
        const int8_t *q = fq + j * kXq * 16;
        const float *sc = fs + j * (kX - kXq) * 4;
#pragma unroll
        for (int k = 0; k < kXPer; k++) {
            const int c = (int)threadIdx.x + k * kThreads;
            if (c < kXq)
                cp_async16_at(st + kXOff + c * 16, q + c * 16);
            else if (c < kX)
                cp_async16_at(st + kXOff + c * 16, sc + (c - kXq) * 4);
        }
    }
};

// A stage's products into a warp's sums: its U blocks of 32 (warp + kMmaWarps u of the stage's) of every row and token
// tile, each mma's int32 result scaled by its weight row's and token's block scales.
template <int MT, int NT8, int U>
__device__ __forceinline__ void pipe_stage_mma(const PipeStage<MT, NT8, U> &cur, float (&acc)[MT][NT8][4]) {
    using Stage = PipeStage<MT, NT8, U>;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t4 = lane & 3;
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int kb = warp + kMmaWarps * u;  // the warp's block of 32 in the stage
        float sw[MT][2];
        uint2 a[MT][2];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int r = 16 * mt + 8 * h + g;
                sw[mt][h] = half_bits_to_f32(cur.d[r * Stage::kGroup + kb]);
                a[mt][h] = *(const uint2 *)(cur.w + r * Stage::kRow + kb * 32 + t4 * 8);
            }
#pragma unroll
        for (int nt = 0; nt < NT8; nt++) {
            const int tk = kb * 8 * NT8 + 8 * nt;  // the tile's first token in this block's rows
            const uint2 b = *(const uint2 *)(cur.xq + (tk + g) * 32 + t4 * 8);
            const float2 sx = *(const float2 *)(cur.xs + tk + 2 * t4);
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                int c[4];
                mma_s8_16x8x32(c, a[mt][0].x, a[mt][1].x, a[mt][0].y, a[mt][1].y, b.x, b.y);
                acc[mt][nt][0] += (float)c[0] * (sw[mt][0] * sx.x);
                acc[mt][nt][1] += (float)c[1] * (sw[mt][0] * sx.y);
                acc[mt][nt][2] += (float)c[2] * (sw[mt][1] * sx.x);
                acc[mt][nt][3] += (float)c[3] * (sw[mt][1] * sx.y);
            }
        }
    }
}

// Split K (gridDim.y parts): part_stride 0 adds the parts onto Y atomically (two halves onto a zeroed Y: the same
// float in either order), else part p stores its sums at Y + p * part_stride (sum_parts adds them in order after).
// PRE: the copies' addressing done once (PipeCopies), fragment-ordered activations only.
template <int MT, int NT8, int S, int U = 1, bool PRE = false>
__global__ void __launch_bounds__(kMmaWarps * 32, 2) gemv_q8p_pipe_kernel(const int8_t *qs, const uint16_t *dw, int64_t n_in,
                                                                     int64_t n_out, const int8_t *fq, const float *fs,
                                                                     int64_t T, float *Y, int64_t part_stride,
                                                                     int chunk, bool early) {
    pdl_early(early);
    using Stage = PipeStage<MT, NT8, U>;
    extern __shared__ __align__(16) uint8_t pipe_smem[];
    constexpr int kStage = pipe_stage_bytes(MT, 8 * NT8, U);
    const int64_t nb = n_in / 32, row0 = (int64_t)blockIdx.x * 16 * MT;
    // split K (gridDim.y parts): this block's groups [g0, g0 + ng) of the row's
    const int64_t all = nb / Stage::kGroup, g0 = all * blockIdx.y / gridDim.y, ng = all * (blockIdx.y + 1) / gridDim.y - g0;
    const unsigned smem0 = (unsigned)__cvta_generic_to_shared(pipe_smem);
    using Copies = PipeCopies<MT, NT8, U>;
    const Copies cps = PRE ? Copies(qs, dw, n_in, nb, n_out, row0, fq, fs, chunk > 0) : Copies();
    // the weights of the first stages are read before the wait, the activations (the kernel before's) after
#pragma unroll
    for (int st = 0; st < S - 1; st++) {
        if (st >= ng) continue;
        if constexpr (PRE)
            cps.load_w(smem0 + st * kStage, g0 + st);
        else
            Stage(pipe_smem + st * kStage).load_w(qs, dw, n_in, nb, n_out, row0, g0 + st);
    }
    pdl_wait();
#pragma unroll
    for (int st = 0; st < S - 1; st++) {
        if (st < ng) {
            if constexpr (PRE)
                cps.load_x(smem0 + st * kStage, g0 + st);
            else
                Stage(pipe_smem + st * kStage).load_x(fq, fs, g0 + st);
        }
        cp_async_commit();
    }
    float acc[MT][NT8][4] = {};
    for (int64_t j = 0; j < ng; j++) {
        pipe_advance<S>(j, ng, [&](int64_t jn) {
            if constexpr (PRE) {
                const unsigned at = smem0 + (unsigned)(jn % S) * kStage;
                cps.load_w(at, g0 + jn);
                cps.load_x(at, g0 + jn);
            } else {
                const Stage nxt(pipe_smem + (int)(jn % S) * kStage);
                nxt.load_w(qs, dw, n_in, nb, n_out, row0, g0 + jn);
                nxt.load_x(fq, fs, g0 + jn);
            }
        });
        pipe_stage_mma<MT, NT8, U>(Stage(pipe_smem + (int)(j % S) * kStage), acc);
    }
    cp_async_wait<0>();
    __syncthreads();  // the stages are free: the warps' sums are added in their memory
    auto &red = *reinterpret_cast<float(*)[kMmaWarps][NT8 * 4][32]>(pipe_smem);
    if (gridDim.y > 1 && part_stride == 0)
        mma_store<MT, NT8, true>(red, acc, row0, n_out, T, Y);
    else
        mma_store<MT, NT8>(red, acc, row0, n_out, T, Y + (int64_t)blockIdx.y * part_stride);
}

// Repacked q8_0 as mma_stream_kernel's format (DFL_CUDA_Q8P_STREAM=1): the staged kernel's two-blocks-a-warp stages
// (512 inputs) and its copies. (Its fragments by ldmatrix, one x4 load a row tile in the mma's own k order instead of
// the permuted 8-byte loads and the register moves that line them up, lost: H100 12-06 00:5x, the 27B layer at 16
// tokens 176.9 -> 187.5 us, its 16-row verify 15.27 -> 15.70 ms.)
template <int MT, int NT8>
struct Q8pStream {
    static constexpr int kMT = MT, kNT8 = NT8, kStage = pipe_stage_bytes(MT, 8 * NT8, 2);
    static constexpr bool kPrepare = false;
    using Stage = PipeStage<MT, NT8, 2>;
    using Copies = PipeCopies<MT, NT8, 2>;
    static_assert(Stage::kGroup == kStageBlocks, "a stage is a chunk of mma_acts' copy");
    const int8_t *qs;
    const uint16_t *dw;
    int64_t n_in;
    const int8_t *fq;
    const float *fs;
    bool chunked;  // fq in chunks of a stage (MmaX::chunk)
    __device__ __forceinline__ int64_t groups() const { return n_in / 32 / Stage::kGroup; }
    __device__ __forceinline__ Copies copies(int64_t row0, int64_t n_out) const {
        return Copies(qs, dw, n_in, n_in / 32, n_out, row0, fq, fs, chunked);
    }
    __device__ __forceinline__ static void mma(uint8_t *stage, float (&acc)[MT][NT8][4]) {
        pipe_stage_mma<MT, NT8, 2>(Stage(stage), acc);
    }
};

// Whether the tensor-core q8_0 products take gemv_q8p_pipe_kernel where it applies: on unless DFL_CUDA_Q8P_PIPE=0.
// H200, 12-03 22:12, one call: tg b32 qwen3-8b q8_0 4,249 -> 4,572 tok/s (with q8_0 on it from 5 tokens, b8 1,718 ->
// 1,739: within noise, so 2..8 tokens stay on the dp4a kernel).
static bool q8p_pipe_on() {
    static const bool on = env_switch("DFL_CUDA_Q8P_PIPE", true);
    return on;
}

// Whether the two-blocks-a-warp stages take PipeCopies (above): on unless DFL_CUDA_Q8P_PIPE_PRE=0. Measured (H100
// 12-05 17:3x, one call): 27B layer at 8 / 16 tokens 173.1 -> 168.8 / 183.6 -> 179.5 us (kernel bench), 27B q8_0
// verify of 16 rows 17.28 -> 16.50 ms, qwen3-8b q8_0 tg b8 4.34 -> 4.24 ms, b32 5.71 -> 5.12 ms.
static bool q8p_pipe_pre_on() {
    static const bool on = env_switch("DFL_CUDA_Q8P_PIPE_PRE", true);
    return on;
}

static bool q8p_deep_on() {
    static const bool on = env_switch("DFL_CUDA_Q8P_DEEP", true);
    return on;
}

// Whether q8_0 products of 33..64 tokens (prefill chunks, verify batches of 33..64 rows) take the staged
// kernel too (on unless DFL_CUDA_Q8P_PIPE64=0, the register kernel there): H200, 12-04 05:1x, one call: qwen3-8b layer
// at 64 tokens 238.5 -> 229.0 us; 27B qwen35 q8_0 verify of 8 sequences of 8 rows 43.9 -> 36.5 ms, of 16 rows
// 105.7 -> 100.8 ms (light records in both); decode unchanged.
static bool q8p_pipe64_on() {
    static const bool on = env_switch("DFL_CUDA_Q8P_PIPE64", true);
    return on;
}

// (64-row tiles lost twice: 64 rows x 512 inputs a stage at one block an SM, 12-05 19:5x; and 64 x 256 at two blocks an
// SM, half the activations read from L2 a weight byte and the same sums, H100 12-06 10:1x-10:2x: the 27B's gate|up at
// 24 tokens 79.1 -> 75.9 us in the kernel bench, q|k|v|z|b|a at 16 37.3 -> 40.7 on one wave, and end to end on one
// machine even (16 / 23 rows) and on another +0.4-0.6 ms for 16 and 23 rows and the tree, gate|up alone included.)
// Fewest 32-row blocks for which the staged kernel takes 32-row tiles: three quarters of the SMs, as dispatch_mma, unless
// DFL_CUDA_Q8P_PIPE_MT2_MIN says otherwise (e.g. 200: the 4096-row matrices of qwen3-8b on 256 blocks of 16 rows, two an
// SM, instead of 128 of 32 rows, one an SM at 8 warps; for comparisons in one run).
static int64_t pipe_mt2_min_blocks(const CudaDevice &dev) {
    static const int64_t n = env_int("DFL_CUDA_Q8P_PIPE_MT2_MIN", 0);
    return n > 0 ? n : dev.sm_count() * 3 / 4;
}

// Whether the staged kernel multiplies two blocks of 32 a warp a stage (512 inputs a stage, 4 stages up to 16 tokens, 3
// up to 32; the default since 12-04 12:2x, DFL_CUDA_Q8P_PIPE_U2=0 for one) instead of one (256 inputs, 8 stages where the grid
// leaves one block an SM). The 12-04 05:1x kernel bench timed the kernel at 8 tokens in ~0.6 us a stage whatever the
// stages in flight (DFL_CUDA_Q8P_DEEP=0 / 1: 4096 x 12288 30.3 / 30.0 us, 48 stages) and the tile (16-row tiles, two
// blocks an SM: 30.4), and ~0.7 us on gate|up (16 stages a block, 3 waves: 32.3): a cost a stage, not bytes in
// flight. Prediction: half the stages, 4096 x 12288 at 8 tokens 30 -> ~20 us, and a qwen3-8b layer at 8 tokens 85 ->
// ~70 us (tg b8 ~+15 %). Measured: tg b8 +4 % (qwen3-8b 1,836 -> 1,912), 27B b8 +4.5 %, 27B b32 +17 % (1,277 -> 1,492).
static bool q8p_pipe_u2_on() {
    static const bool on = env_switch("DFL_CUDA_Q8P_PIPE_U2", true);
    return on;
}

// Whether W's staged products of up to 32 tokens take the two-blocks-a-warp stages (launch_q8p_pipe), and with them
// PipeCopies (PRE) where q8p_pipe_pre_on: the stages of kStageBlocks a chunked copy serves.
static bool q8p_pipe_u2(const Weight &W) { return q8p_pipe_u2_on() && W.n_in % (2 * kPipeGroup * 32) == 0; }

// Whether a staged product whose grid leaves an SM without a second block (the 4096-row matrices of qwen3-8b: 128
// blocks of 32 rows on 132 SMs) splits its inputs in two halves, each block a half, both added onto the output that
// mma_acts_kernel zeroed (DFL_CUDA_Q8P_SPLITK=0: one block a row tile). Two sums onto 0 are the same float in either
// order, so results stay deterministic. Why: ncu (H200, 12-04 15:0x, 8 tokens) had these products at 1.86 TB/s (o,
// 4096 x 4096, 9.6 us) and 2.6 TB/s (down, 4096 x 12288, 21.3 us), 12 % occupancy, one block an SM with 3 stages of
// ~17 KB in flight, where gate|up (768 blocks) reads at 3.4 TB/s; two blocks an SM double the bytes in flight.
static bool q8p_splitk_on() {
    static const bool on = env_switch("DFL_CUDA_Q8P_SPLITK", true);
    return on;
}

// The row tiles of the staged kernel's grid (launch_q8p_pipe's dispatch_mma_tiles<8, 8>).
static int64_t q8p_pipe_blocks(const CudaDevice &dev, int64_t n_out, int64_t T) {
    const int64_t rows = mma_tile_rows<8>(n_out, T, pipe_mt2_min_blocks(dev));
    return (n_out + rows - 1) / rows;
}

// Where split-K applies: products of up to DFL_CUDA_Q8P_SPLITK_TOKENS tokens (default 64, the staged kernel's limit)
// whose grids have at most DFL_CUDA_Q8P_SPLITK_BLOCKS row tiles (default 5/4 of the SM count: the split grid then
// fits 1.25 waves of two blocks an SM). Measured (H200, 12-04 17:3x, one call): 64 tokens split, qwen3-8b's layer
// 236.8 -> 188.5 us and tg b64 5,895 -> 7,018 tok/s; the 27B's 160-tile grids (5120-row o and down) split, tg b32
// 1,465 -> 1,542; qwen3-8b's 192-tile q|k|v split (a bound of 320) lost ~3 % at 8 tokens (73.3 -> 75.6 us).
static int64_t q8p_splitk_tokens() {
    static const int64_t n = std::min<int64_t>(64, env_int("DFL_CUDA_Q8P_SPLITK_TOKENS", 64));
    return n;
}
static int64_t q8p_splitk_blocks(const CudaDevice &dev) {
    static const int64_t n = env_int("DFL_CUDA_Q8P_SPLITK_BLOCKS", 0);
    return n > 0 ? n : dev.sm_count() * 5 / 4;
}

// Input parts where split-K applies: 4 for rows of at least kSplitK4Groups stages (the 27B's 17,408-input down
// projection), else 2; DFL_CUDA_Q8P_SPLITK_N=2..4 sets it for every split product (for comparisons in one run). More
// than two parts store their sums apart and one more launch adds them in order (sum_parts), so the result is the same
// float every run. Why: the 27B's 5120-row products at 8-16 tokens (160 tiles of 32 rows, two halves) make 320 blocks
// for 264 slots. Measured on the H100 (12-05 16:1x, kernel bench of the 27B layer as graph replays, DFL_BENCH_LAYER=
// qwen35-27b): four parts everywhere took down 5120 x 17408 at 8 / 16 tokens 48.4 / 52.8 -> 43.7 / 47.2 us, but out
// 5120 x 6144 15.2 / 17.7 -> 16.2 / 18.6 and qwen3-8b tg b8 / b32 1,846 / 5,656 -> 1,727 / 5,374 tok/s (4096-input o,
// 12,288-input down): short rows lose, so only the long ones take four. Six or eight parts for the long rows (3.6 /
// 4.8 waves where four make 2.4) changed nothing (H100 12-05 22:4x, the 27B layer at 16 tokens 179.2 -> 178.6 / 182.5).
constexpr int64_t kSplitK4Groups = 32;  // stages of 512 inputs: 16,384 inputs
static int q8p_splitk_n(int64_t groups) {
    static const int64_t forced = env_int("DFL_CUDA_Q8P_SPLITK_N", 0);
    if (forced > 0) return (int)std::min<int64_t>(4, std::max<int64_t>(2, forced));
    return groups >= kSplitK4Groups ? 4 : 2;
}

// Input parts of a staged product (see q8p_splitk_on and q8p_splitk_n): 2 or more where it applies, else 1.
static int q8p_pipe_splits(const CudaDevice &dev, const Weight &W, int64_t T, const float *Y) {
    const int64_t groups = W.n_in / (2 * kPipeGroup * 32);  // stages of the two-blocks-a-warp kernel
    const int n = q8p_splitk_n(groups);
    const bool fits = T <= q8p_splitk_tokens() && groups >= 2 * n && (W.n_out * T) % 4 == 0 && ((uintptr_t)Y & 15) == 0;
    return q8p_splitk_on() && fits && q8p_pipe_blocks(dev, W.n_out, T) <= q8p_splitk_blocks(dev) ? n : 1;
}

// Y[i] = the parts' sums at i added in order (part 0 first), i < count.
__global__ void sum_parts_kernel(const float *part, int n_parts, int64_t count, float *Y) {
    pdl_trigger();  // a following launch_pdl product may start loading its weights
    pdl_wait();     // (launch_chain) the parts are the product's
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x) {
        float v = part[i];
        for (int p = 1; p < n_parts; p++) v += part[p * count + i];
        Y[i] = v;
    }
}

// 32-row tiles (MT = 2) where they nearly fill the GPU, as dispatch_mma; else 16 rows. Up to 64 tokens (32 with
// DFL_CUDA_Q8P_PIPE64=0; the register kernel takes 33..64 then). Tiles of more than 32 tokens keep 4 stages: 8
// of 64 tokens would not fit in shared memory (28 KB a stage at 32 rows).
// splits: input parts (grid.y; Y zeroed when 2 and part_stride is 0, else part p's sums at Y + p * part_stride).
static void launch_q8p_pipe(CudaDevice &dev, const Weight &W, const int8_t *qs, const uint16_t *dw, const MmaX &x,
                            int64_t T, float *Y, int splits = 1, int64_t part_stride = 0) {
    auto launch_u = [&](dim3 grid, auto mt, auto nt8, auto stages, auto u) {
        grid.y = (unsigned)splits;
        constexpr int MT = decltype(mt)::value, NT8 = decltype(nt8)::value, S = decltype(stages)::value;
        constexpr int U = decltype(u)::value;
        const size_t smem = (size_t)S * pipe_stage_bytes(MT, 8 * NT8, U);
        auto go = [&](auto pre) {
            constexpr bool PRE = decltype(pre)::value;
            allow_dynamic_smem<gemv_q8p_pipe_kernel<MT, NT8, S, U, PRE>>(dev.index(), smem,
                                                                         "matmul (q8_0 staged mma smem)");
            launch_maybe_pdl(true, gemv_q8p_pipe_kernel<MT, NT8, S, U, PRE>, grid, dim3(kMmaWarps * 32), smem,
                             dev.stream(), qs, dw, W.n_in, W.n_out, x.xq, x.xs, T, Y, part_stride, x.chunk,
                             pdl_early_for(dev, grid.x * grid.y));
        };
        if constexpr (U == 2) {  // (the two-blocks-a-warp stages alone: fewer kernels to build)
            if (q8p_pipe_pre_on()) {
                go(std::true_type{});
                return;
            }
        }
        go(std::false_type{});
    };
    auto launch_stages = [&](dim3 grid, auto mt, auto nt8, auto stages) {
        launch_u(grid, mt, nt8, stages, std::integral_constant<int, 1>{});
    };
    const bool u2 = q8p_pipe_u2(W);
    auto launch = [&](dim3 grid, auto mt, auto nt8) {
        constexpr int NT8 = decltype(nt8)::value;
        if constexpr (NT8 <= 4) {
            if (u2) {
                constexpr int S = NT8 <= 2 ? 4 : 3;  // two blocks an SM in shared memory (108 KB each at 32 rows)
                launch_u(grid, mt, nt8, std::integral_constant<int, S>{}, std::integral_constant<int, 2>{});
                return;
            }
        }
        if constexpr (decltype(nt8)::value <= 4) {
            if (q8p_deep_on() && grid.x < 2u * (unsigned)dev.sm_count()) {
                launch_stages(grid, mt, nt8, std::integral_constant<int, kPipeDeepStages>{});
                return;
            }
        }
        launch_stages(grid, mt, nt8, std::integral_constant<int, kPipeStages>{});
    };
    dispatch_mma_tiles<8, 8>(W.n_out, T, pipe_mt2_min_blocks(dev), launch);  // (up to 32 tokens: as <4, 4> would)
    check_launch("matmul (q8_0 staged int8 mma)");
}

// Which q8_0 products of 8..32 tokens stream (mma_stream_kernel on Q8pStream): by default the grids of fewer row
// tiles than blocks whose rows hold at least kSplitK4Groups stages (those split-K cuts in four: the 27B's down
// projection, 5120 x 17408); DFL_CUDA_Q8P_STREAM=1 every grid it applies to, 0 none. H100 12-06 00:5x, kernel bench
// (graph replays): the 27B down at 8 / 16 / 24 / 32 tokens 40.4 / 44.1 / 48.9 / 53.0 -> 39.8 / 41.9 / 44.9 / 47.5 us,
// its o (12 stages a row) 16.0 -> 16.2 at 16 tokens. Every grid streaming, the zeroing of the outputs fixed (H100 12-06
// 02:3x): the 27B layer gains only at 24 tokens (191.4 -> 187.6 us) and qwen3-8b q8_0 tg b8 / b32 lose 9 %.
enum class Q8pStreamMode : int { kOff = 0, kAll = 1, kLong = 2 };
static Q8pStreamMode q8p_stream_mode() {
    static const Q8pStreamMode m = [] {
        const int64_t v = env_int("DFL_CUDA_Q8P_STREAM", 2);
        return v == 0 ? Q8pStreamMode::kOff : v == 1 ? Q8pStreamMode::kAll : Q8pStreamMode::kLong;
    }();
    return m;
}

// The stream-K product of T (8..32) tokens, true where it applies (stream_plan).
static bool launch_q8p_stream(CudaDevice &dev, const Weight &W, const CudaDevice::QuantX &qx, int64_t T, float *Y) {
    const Q8pStreamMode mode = q8p_stream_mode();
    if (mode == Q8pStreamMode::kOff || !mma_xt_on()) return false;
    const StreamPlan p = stream_plan(dev, W.n_in, 2 * kPipeGroup * 32, W.n_out, T, Y);
    if (!p.ok || (mode == Q8pStreamMode::kLong && !((p.slots || p.halves) && p.groups >= kSplitK4Groups))) return false;
    stream_product(
        dev, p, qx, nullptr, W.n_in, W.n_out, T, Y, mma_chunk_q8p(),
        [&](auto nt8, const MmaX &x) {
            return Q8pStream<2, decltype(nt8)::value>{q8p_quants(W), q8p_scales(W), W.n_in, x.xq, x.xs, x.chunk > 0};
        },
        "matmul (q8_0 stream-K int8 mma)");
    return true;
}

void launch_q8p_mma(CudaDevice &dev, const Weight &W, const CudaDevice::QuantX &qx, int64_t T, float *Y) {
    if (launch_q8p_stream(dev, W, qx, T, Y)) return;
    const int8_t *xq = qx.xq;
    const float *xs = qx.xs;
    const int8_t *qs = q8p_quants(W);
    const uint16_t *dw = q8p_scales(W);
    const bool pipe = q8p_pipe_on() && (T <= 32 || (T <= 64 && q8p_pipe64_on())) && W.n_in % (kPipeGroup * 32) == 0;
    const int splits = pipe && mma_xt_on() ? q8p_pipe_splits(dev, W, T, Y) : 1;
    const bool halves = splits == 2;  // onto a zeroed Y; more parts are stored apart
    // a chunked copy only where the staged kernel will take PipeCopies' stages of kStageBlocks (launch_q8p_pipe)
    const bool chunk = pipe && T <= 32 && q8p_pipe_u2(W) && q8p_pipe_pre_on() && mma_chunk_q8p();
    const MmaX x = mma_acts(dev, xq, xs, nullptr, W.n_in, T, halves ? Y : nullptr, halves ? W.n_out * T : 0,
                            chunk ? kStageBlocks : 0, &qx);
    if (pipe && x.T8) {
        if (splits <= 2) {
            launch_q8p_pipe(dev, W, qs, dw, x, T, Y, splits);
            return;
        }
        const int64_t count = W.n_out * T;
        float *part = (float *)dev.splitk_buffer((size_t)(splits * count) * sizeof(float));
        launch_q8p_pipe(dev, W, qs, dw, x, T, part, splits, count);
        launch_chain(sum_parts_kernel, dim3(grid_for(count, 256)), dim3(256), 0, dev.stream(), (const float *)part, splits,
                     count, Y);
        check_launch("matmul (q8_0 split-K sums)");
        return;
    }
    dispatch_mma<8>(dev, W.n_out, T, [&](dim3 grid, auto mt, auto nt8) {
        constexpr int MT = decltype(mt)::value, NT8 = decltype(nt8)::value;
        // Blocks of 32 per warp and iteration: 4 where a 2-iteration pipeline of them still leaves registers for the
        // tile; 2 for small tiles (two blocks an SM instead of one: H200, 16 tokens 166 -> 135 us a qwen3-8b layer) and
        // the largest (registers).
        constexpr int U = MT * NT8 > 4 && MT * NT8 <= 8 ? 4 : 2;
        if (x.T8)
            launch_pdl(gemv_q8p_mma_kernel<MT, NT8, U, true>, grid, dim3(kMmaWarps * 32), dev.stream(), qs, dw, W.n_in,
                       W.n_out, x.xq, x.xs, T, x.T8, Y);
        else
            launch_pdl(gemv_q8p_mma_kernel<MT, NT8, U, false>, grid, dim3(kMmaWarps * 32), dev.stream(), qs, dw, W.n_in,
                       W.n_out, x.xq, x.xs, T, 0, Y);
    });
    check_launch("matmul (q8_0 int8 mma)");
}

}  // namespace cuda
}  // namespace dfl
