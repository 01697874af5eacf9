// What the int8 tensor-core product kernels (mma_q8p.cu, mma_q4k.cu, mma_q6k.cu) share: the block's warp count, the
// store of its warps' sums, and the choice of tiles.
#pragma once

#include <type_traits>

#include "ops/cuda/cuda_common.cuh"

namespace dfl {
namespace cuda {

// Warps a block: they split K and add their sums at the end.
constexpr int kMmaWarps = 8;

// C (16 x 8, int32) = A (16 x 32 int8: fragments a0..a3) x B (32 x 8 int8: b0, b1), one q8_0 block of 16 weight rows
// against 8 tokens.
__device__ __forceinline__ void mma_s8_16x8x32(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                               uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};\n"
        : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(0));
}

// A block's copy of one contiguous run of kWords 16-byte words from src to the shared address dst by cp.async, each of
// its kThreads threads the words threadIdx.x + k kThreads (a stage of mma_acts' chunked activations).
template <int kWords, int kThreads>
__device__ __forceinline__ void cp_async_run(unsigned dst, const uint8_t *src) {
    src += threadIdx.x * 16;
    dst += threadIdx.x * 16;
#pragma unroll
    for (int k = 0; k < (kWords + kThreads - 1) / kThreads; k++)
        if (kWords % kThreads == 0 || (int)threadIdx.x + k * kThreads < kWords)
            cp_async16_at(dst + k * kThreads * 16, src + k * kThreads * 16);
}

// The warps' sums of one block of an mma kernel added through shared memory and stored, one 16-row tile at a time (the
// buffer then holds 8 tokens x 32 at most: 32 KB). The C fragment: entry i of lane l is row l / 4 + 8 (i / 2), token
// 2 (l % 4) + i % 2 of its 16 x 8 tile.
// ADD: Y += the sums (atomically; a split-K product's halves onto a zeroed Y), else Y = the sums.
template <int MT, int NT8, bool ADD = false>
__device__ __forceinline__ void mma_store(float (&red)[kMmaWarps][NT8 * 4][32], const float (&acc)[MT][NT8][4],
                                          int64_t row0, int64_t n_out, int64_t T, float *Y) {
    pdl_trigger();  // the main loop is done: a PDL kernel after this one may launch (and wait for its end)
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        if (mt > 0) __syncthreads();  // the previous tile's sums are read
#pragma unroll
        for (int nt = 0; nt < NT8; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) red[warp][nt * 4 + i][lane] = acc[mt][nt][i];
        __syncthreads();
        for (int o = threadIdx.x; o < NT8 * 4 * 32; o += kMmaWarps * 32) {
            const int f = o >> 5, l = o & 31, i = f & 3, nt = f >> 2;
            float v = 0.0f;
#pragma unroll
            for (int w = 0; w < kMmaWarps; w++) v += red[w][f][l];
            const int64_t row = row0 + 16 * mt + (l >> 2) + 8 * (i >> 1), tok = 8 * nt + 2 * (l & 3) + (i & 1);
            if (row < n_out && tok < T) {
                if constexpr (ADD)
                    atomicAdd(Y + tok * n_out + row, v);
                else
                    Y[tok * n_out + row] = v;
            }
        }
    }
}

// A staged kernel's step j of n (S stages in flight by cp.async): waits for stage j, then refills the stage step j - 1
// used (every warp is past it after the barrier) with stage j + S - 1 by load(j + S - 1), and commits the group.
template <int S, typename Load>
__device__ __forceinline__ void pipe_advance(int64_t j, int64_t n, Load &&load) {
    cp_async_wait<S - 2>();
    __syncthreads();
    if (j + S - 1 < n) load(j + S - 1);
    cp_async_commit();
}

// launch(grid, MT, NT8) with MT and the smallest NT8 in 1..N that covers nt8 as std::integral_constant.
template <int MT, int N, typename Launch>
void launch_nt8(int nt8, dim3 grid, Launch &launch) {
    if constexpr (N > 1) {
        if (nt8 < N) {
            launch_nt8<MT, N - 1>(nt8, grid, launch);
            return;
        }
    }
    launch(grid, std::integral_constant<int, MT>{}, std::integral_constant<int, N>{});
}

// An mma kernel's tiling for T tokens and n_out rows: 8-token tiles; 32 rows per warp (MT = 2: half the activation
// loads a weight byte) for up to TwoMaxNT8 tiles where n_out / 32 reaches two_min_blocks; else 16 rows, up to
// OneMaxNT8 tiles. mma_tile_rows gives the rows a block takes (32 or 16; the grid is ceil(n_out / that)),
// dispatch_mma_tiles launches by it.
template <int TwoMaxNT8>
inline int64_t mma_tile_rows(int64_t n_out, int64_t T, int64_t two_min_blocks) {
    return (T + 7) / 8 <= TwoMaxNT8 && n_out / 32 >= two_min_blocks ? 32 : 16;
}

template <int TwoMaxNT8, int OneMaxNT8, typename Launch>
void dispatch_mma_tiles(int64_t n_out, int64_t T, int64_t two_min_blocks, Launch &launch) {
    const int nt8 = (int)((T + 7) / 8);
    const int64_t rows = mma_tile_rows<TwoMaxNT8>(n_out, T, two_min_blocks);
    const dim3 grid((unsigned)((n_out + rows - 1) / rows));
    if (rows == 32)
        launch_nt8<2, TwoMaxNT8>(nt8, grid, launch);
    else
        launch_nt8<1, OneMaxNT8>(nt8, grid, launch);
}

}  // namespace cuda
}  // namespace dfl
