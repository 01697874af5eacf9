// 16-bit float-weight (f16 / bf16) products of 2..8 tokens on the tensor cores, activations kept to ~22 bits: each
// float input is split into 16-bit parts whose sum is the input (f16: two parts, 11 bits each; bf16: three of 8), and
// the weight tile is multiplied by each part into the same f32 sums. DeepSeek V4's compressor, indexer and
// indexer-query products (16-bit in the files users download) ran at ~0.4-0.6 TB/s on the warp GEMV at 8 tokens (ncu
// 12-07 16:5x): every 16 bytes of weights cost 8 tokens x 32 bytes of activation loads, mostly from L2. Here a warp's
// 16 rows x 32 inputs (1 KB of weights) need the 8 tokens' 32 inputs once (1 KB), and the 16 x 8 sums are one mma a
// part. On unless DFL_CUDA_GEMV16_MMA=0 (H100 12-07 21:2x, 4-layer V4-Flash, two alternated runs: b8 2.016 / 2.029 ->
// 1.988 / 1.989 ms, b1 and b32 even). f32 rows the same way on tf32 (3xTF32, DFL_CUDA_GEMV32_MMA=1) lost at b8 (2.043 /
// 2.045 ms) and were deleted.
#include "ops/cuda/cuda_device.h"
#include "ops/cuda/mma_common.cuh"

namespace dfl {
namespace cuda {

// C (16 x 8, f32) += A (16 x 16, 16-bit: a0..a3) x B (16 x 8, 16-bit: b0, b1).
template <bool BF16>
__device__ __forceinline__ void mma_16bit_16x8x16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                                  uint32_t b0, uint32_t b1) {
    if constexpr (BF16)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// The P 16-bit parts of the pair (x0, x1), two values a word: part p rounds what parts 0..p-1 left. f16 parts carry
// ~22 bits of inputs of magnitude 2^-3 and more (smaller ones' second part goes subnormal: an error floor of ~2^-25
// absolute an input), and an input of magnitude 65,520 or more becomes inf, its sums NaN: the inputs here are
// normalised activations (V4's sub-block inputs and query low rank). bf16's three parts hold any f32 but inf.
template <bool BF16, int P>
__device__ __forceinline__ void split_pair(float x0, float x1, uint32_t (&out)[P]) {
#pragma unroll
    for (int p = 0; p < P; p++) {
        if constexpr (BF16) {
            const __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
            x0 -= __low2float(h), x1 -= __high2float(h);
            out[p] = *(const uint32_t *)&h;
        } else {
            const __half2 h = __floats2half2_rn(x0, x1);
            x0 -= __low2float(h), x1 -= __high2float(h);
            out[p] = *(const uint32_t *)&h;
        }
    }
}

// One lane's part of a run of 32 inputs: inputs 8 c .. 8 c + 7 of the run (c = lane % 4) of rows g and g + 8 of the
// warp's 16 (g = lane / 4) and of token g; mma() multiplies them into the warp's 16 x 8 sums. The mma's k inputs are
// any of the run's as long as A and B take the same ones: a lane's 8 are its fragments' inputs of the lane's column c
// in two consecutive mma steps of k = 16.
template <uint32_t TYPE>
struct MmaRun {
    static constexpr bool BF16 = TYPE == DFL_TYPE_BF16;
    static constexpr int P = BF16 ? 3 : 2;  // the input's 16-bit parts
    uint4 w0, w8;  // rows g and g + 8
    float4 x0, x1;
    __device__ __forceinline__ void load(const uint8_t *ra, const uint8_t *rb, const float *x, int64_t k, bool in) {
        w0 = in ? __ldg((const uint4 *)ra + k / 8) : make_uint4(0, 0, 0, 0);
        w8 = in ? __ldg((const uint4 *)rb + k / 8) : make_uint4(0, 0, 0, 0);
        x0 = in ? __ldg((const float4 *)(x + k)) : make_float4(0, 0, 0, 0);
        x1 = in ? __ldg((const float4 *)(x + k + 4)) : make_float4(0, 0, 0, 0);
    }
    // step 1: A's inputs 2 c, 2 c + 1 are the lane's 0, 1 (w0.x, w8.x) and 2 c + 8, 2 c + 9 its 2, 3 (w0.y, w8.y); step 2
    // its 4..7
    __device__ __forceinline__ void mma(float (&acc)[4]) const {
        uint32_t p01[P], p23[P], p45[P], p67[P];
        split_pair<BF16, P>(x0.x, x0.y, p01);
        split_pair<BF16, P>(x0.z, x0.w, p23);
        split_pair<BF16, P>(x1.x, x1.y, p45);
        split_pair<BF16, P>(x1.z, x1.w, p67);
#pragma unroll
        for (int p = 0; p < P; p++) {
            mma_16bit_16x8x16<BF16>(acc, w0.x, w8.x, w0.y, w8.y, p01[p], p23[p]);
            mma_16bit_16x8x16<BF16>(acc, w0.z, w8.z, w0.w, w8.w, p45[p], p67[p]);
        }
    }
};

// Block b: rows 16 b .. 16 b + 15 for T tokens, its 8 warps taking every 8th run of 32 inputs (MmaRun: what a lane
// loads and multiplies). Lanes past T read the last token's inputs, into sums not stored; rows past n_out read the last
// row and are not stored.
template <uint32_t TYPE>
__global__ void __launch_bounds__(kMmaWarps * 32) gemv_mma_float_kernel(const uint8_t *W, uint64_t row_bytes,
                                                                       int64_t n_in, int64_t n_out, const float *X,
                                                                       int64_t T, float *Y) {
    constexpr int U = 4;  // runs a warp has in flight
    __shared__ float red[kMmaWarps][4][32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
    const int64_t row0 = (int64_t)blockIdx.x * 16;
    const uint8_t *ra = W + (uint64_t)min(row0 + g, n_out - 1) * row_bytes;
    const uint8_t *rb = W + (uint64_t)min(row0 + g + 8, n_out - 1) * row_bytes;
    const float *x = X + (g < T ? g : T - 1) * n_in;
    const int64_t runs = (n_in + 31) / 32;
    float acc[1][1][4] = {};
    for (int64_t j0 = warp; j0 < runs; j0 += U * kMmaWarps) {
        MmaRun<TYPE> r[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int64_t k = 32 * (j0 + u * kMmaWarps) + 8 * c;
            r[u].load(ra, rb, x, k, k < n_in);  // (n_in a multiple of 8: the lane's 8 inputs all in or all out)
        }
#pragma unroll
        for (int u = 0; u < U; u++) r[u].mma(acc[0][0]);
    }
    mma_store<1, 1>(red, acc, row0, n_out, T, Y);
}

bool gemv_mma_float_takes(uint32_t type) {
    static const bool on = env_switch("DFL_CUDA_GEMV16_MMA", true);
    return (type == DFL_TYPE_F16 || type == DFL_TYPE_BF16) && on;
}

void launch_gemv_mma_float(cudaStream_t s, const Weight &W, const float *X, int64_t T, float *Y) {
    const unsigned grid = (unsigned)((W.n_out + 15) / 16);
    const auto kernel =
        W.type == DFL_TYPE_BF16 ? gemv_mma_float_kernel<DFL_TYPE_BF16> : gemv_mma_float_kernel<DFL_TYPE_F16>;
    kernel<<<grid, kMmaWarps * 32, 0, s>>>(W.data, W.row_bytes, W.n_in, W.n_out, X, T, Y);
}

}  // namespace cuda
}  // namespace dfl
