// What the int8 tensor-core products of repacked q8_0 (mma_q8p.cu) and of q4_K (mma_q4k.cu) share: where a lane reads
// its tokens' activations, the fragment-ordered copy of them (mma_int8.cu) and the choice of tiles.
#pragma once

#include <cstdint>

#include "ops/cuda/cuda_device.h"
#include "ops/cuda/mma_common.cuh"

namespace dfl {
namespace cuda {

// Batched decode, verify blocks and small prefill chunks (2..64 tokens) on int8 tensor cores: one
// mma.sync.m16n8k32 is exactly one q8_0 block of 16 weight rows against 8 tokens, so its int32 result takes the block's
// two scales (the weight row's and the token's) as it is added to the float sums. A warp owns 16 MT rows and every
// token (8 per n-tile), and reads every kMmaWarps-th block of the row; the block's warps then add their sums through
// shared memory. The weights are read once per call and each byte feeds all the tokens, where the dp4a kernels spend
// one activation load per token per 16 weight bytes.
// Fragments: lane (g = lane / 4, t4 = lane % 4) reads 8 consecutive bytes at 8 t4 of a block for rows g and g + 8 and
// for token g. The mma's k order is permuted the same way for both operands (bytes 0..3 are its k 4 t4.., bytes 4..7
// its k 16 + 4 t4..), which leaves every dot product as it is, and each lane loads 8 contiguous bytes.
// Software pipelining: each warp holds two iterations of weights in registers (the quants and their raw scales,
// converted only when used) and loads the next block's activations before this one's mma, so that it waits about one
// memory latency per iteration, under the previous iteration's arithmetic. (Loading and using each block of 32 in turn
// waited for its scales from memory and its activations from L2 one block after the other: H200, qwen3-8b layer at 32
// / 64 tokens 232 / 372 us against 200 / 292 now.)
constexpr int64_t kI8MmaMaxTokens = 64;

// Element i's code c and its block's scale d also where mma_acts_kernel's flat copy would put them (QuantX::fq), the
// last row's also in the padding tokens after it, as the copy repeats it. Called by the warp holding the block. 32-bit
// arithmetic (at most 64 rows), and no division for a row norm's element (i < n in row q.tok): a 12-05 form of this
// fold lost, its producers slower by more than the copies it saved, and 64-bit divisions an element would do that.
__device__ __forceinline__ void quant_frag_store(const CudaDevice::QuantX &q, Q8Code c, int64_t i) {
    const uint32_t n = (uint32_t)q.n, e = (uint32_t)i, lane = e & 31;
    uint32_t t = (uint32_t)q.tok, k = e;
    if (e >= n) {  // an op indexing all its rows at once
        const uint32_t r = e / n;
        t += r;
        k = e - r * n;
    }
    const uint32_t T8 = (uint32_t)q.T8, at0 = (k >> 5) * T8, end = t + 1 == (uint32_t)q.rows ? T8 : t + 1;
    for (uint32_t u = t; u < end; u++) {  // (end is the same for the whole warp: one row's block)
        q.fq[(at0 + u) * 32 + lane] = c.q;
        if (lane == 0) q.fs[at0 + u] = c.d;
    }
}

// quant_q8_warp's store of element i of q's rows (and its block's sum where q has them), and of its fragment-ordered
// copy where q has one.
__device__ __forceinline__ void quant_q8_store(const CudaDevice::QuantX &q, float v, int64_t i) {
    const Q8Code c = quant_q8_warp(v, q.xq + i, q.xs + i / 32, q.xsum ? q.xsum + i / 32 : nullptr);
    if (q.fq) quant_frag_store(q, c, i);
}

// Where a lane of an mma kernel reads per tile of 8 tokens: its B fragment's token row (token 8 nt + g: x) and the
// scale rows of the two tokens of its C entries (8 nt + 2 t4 and the next: s). Tokens past T read the last one (their
// sums are never stored). 32-bit offsets (at most 64 tokens): registers are what limits these kernels.
template <int NT8>
struct MmaTokens {
    int x[NT8], s[NT8][2];
    __device__ __forceinline__ MmaTokens(int64_t T, int64_t n_in, int64_t nb, int g, int t4) {
#pragma unroll
        for (int nt = 0; nt < NT8; nt++) {
            x[nt] = (int)(min((int64_t)(8 * nt + g), T - 1) * n_in);
            s[nt][0] = (int)(min((int64_t)(8 * nt + 2 * t4), T - 1) * nb);
            s[nt][1] = (int)(min((int64_t)(8 * nt + 2 * t4 + 1), T - 1) * nb);
        }
    }
};

// The activations of one block of 32 for the lane's tokens: its B fragment per 8-token tile and the scales of its
// C entries' two tokens (q4_K also their block sums). XT: from mma_acts_kernel's fragment-ordered copy (xq, xs there,
// T8 tokens a block), else from the quantizer's rows.
template <int NT8, bool SUM>
struct MmaActs {
    uint2 b[NT8];
    float s[NT8][2];
    float m[SUM ? NT8 : 1][2];
    template <bool XT>
    __device__ __forceinline__ void load(const MmaTokens<NT8> &tok, const int8_t *xq, const float *xs, const float *xsum,
                                         int64_t kb, int g, int t4, int T8) {
#pragma unroll
        for (int nt = 0; nt < NT8; nt++) {
            if constexpr (XT) {
                const int64_t r = kb * T8 + 8 * nt;  // the tile's first token in block kb's rows
                b[nt] = __ldg((const uint2 *)(xq + (r + g) * 32) + t4);
                if constexpr (SUM) {
                    const float4 v = __ldg((const float4 *)(xs + 2 * (r + 2 * t4)));
                    s[nt][0] = v.x;
                    m[nt][0] = v.y;
                    s[nt][1] = v.z;
                    m[nt][1] = v.w;
                } else {
                    const float2 v = __ldg((const float2 *)(xs + r + 2 * t4));
                    s[nt][0] = v.x;
                    s[nt][1] = v.y;
                }
            } else {
                b[nt] = __ldg((const uint2 *)(xq + tok.x[nt] + kb * 32) + t4);
                s[nt][0] = __ldg(xs + tok.s[nt][0] + kb);
                s[nt][1] = __ldg(xs + tok.s[nt][1] + kb);
                if constexpr (SUM) {
                    m[nt][0] = __ldg(xsum + tok.s[nt][0] + kb);
                    m[nt][1] = __ldg(xsum + tok.s[nt][1] + kb);
                }
            }
        }
    }
};

// What an mma kernel reads its activations from: the quantizer's rows, or (T8 > 0) mma_acts_kernel's copy; chunk > 0:
// the copy in chunks of that many blocks of 32, each its quants then its scales (mma_acts), xs the first chunk's scales.
struct MmaX {
    const int8_t *xq;
    const float *xs, *xsum;
    int T8 = 0;
    int chunk = 0;
};

// The blocks of 32 of a stage of the staged and streamed kernels (PipeStage<., ., 2>, Q4kStream): their chunk.
constexpr int kStageBlocks = 16;

// On unless DFL_CUDA_MMA_XT=0 (the rows, for comparisons in one run).
bool mma_xt_on();

// The fragment-ordered copy of the quantizer's rows (mma_acts_kernel), or the rows themselves when it is off. zero
// (n_zero floats): the output of a split-K product after it, zeroed by the same launch. chunk (blocks of 32, dividing
// n_in / 32; where mma_chunk_on): a stage's quants and scales one contiguous run (see mma_acts_kernel).
// staged: the QuantX xq came from, whose own fragment-ordered copy (QuantX::fq) is taken where it is this one.
MmaX mma_acts(CudaDevice &dev, const int8_t *xq, const float *xs, const float *xsum, int64_t n_in, int64_t T,
              float *zero = nullptr, int64_t n_zero = 0, int chunk = 0, const CudaDevice::QuantX *staged = nullptr);

// Whether a stream-K grid of at most one tile a multiprocessor cuts each tile in halves (StreamPlan) instead of
// storing pieces in slots that one more launch adds (on unless DFL_CUDA_STREAM_HALVES=0).
bool stream_halves_on();

// Whether the streamed q4_K products (mma_chunk_q4k) and the staged and streamed q8_0 ones (mma_chunk_q8p) take their
// activations in chunks of a stage (DFL_CUDA_MMA_CHUNK: 0 neither, 1 both, default 2 q4_K alone).
bool mma_chunk_q4k();
bool mma_chunk_q8p();

// Picks an mma kernel's tiling for T tokens and n_out rows (dispatch_mma_tiles): 32-row tiles up to TwoMaxNT8 where
// they nearly fill the GPU (the blocks of 32 rows, one per SM: the kernels use most registers).
template <int TwoMaxNT8, typename Launch>
void dispatch_mma(CudaDevice &dev, int64_t n_out, int64_t T, Launch &&launch) {
    dispatch_mma_tiles<TwoMaxNT8, 8>(n_out, T, dev.sm_count() * 3 / 4, launch);
}

}  // namespace cuda
}  // namespace dfl
