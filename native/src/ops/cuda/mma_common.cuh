// What the int8 tensor-core product kernels (mma_int8.cu, mma_q6k.cu) share: the block's warp count and the store of
// its warps' sums.
#pragma once

#include "ops/cuda/cuda_common.cuh"

namespace dfl {
namespace cuda {

// Warps a block: they split K and add their sums at the end.
constexpr int kMmaWarps = 8;

// The warps' sums of one block of an mma kernel added through shared memory and stored, one 16-row tile at a time (the
// buffer then holds 8 tokens x 32 at most: 32 KB). The C fragment: entry i of lane l is row l / 4 + 8 (i / 2), token
// 2 (l % 4) + i % 2 of its 16 x 8 tile.
template <int MT, int NT8>
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
            if (row < n_out && tok < T) Y[tok * n_out + row] = v;
        }
    }
}

}  // namespace cuda
}  // namespace dfl
