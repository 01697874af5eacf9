// 16-bit (f16 / bf16) products of 2..8 tokens on the tensor cores, activations kept to ~22 bits: each float input is
// split into 16-bit parts whose sum is the input (f16: two parts, 11 bits each; bf16: three of 8), and the weight tile
// is multiplied by each part into the same f32 sums. DeepSeek V4's compressor, indexer and indexer-query products
// (16-bit in the files users download) ran at ~0.4-0.6 TB/s on the warp GEMV at 8 tokens (ncu 12-07 16:5x): every 16
// bytes of weights cost 8 tokens x 32 bytes of activation loads, mostly from L2. Here a warp's 16 rows x 32 inputs
// (1 KB of weights) need the 8 tokens' 32 inputs once (1 KB), and the 16 x 8 sums are one mma a part.
// DFL_CUDA_GEMV16_MMA=1 (opt-in, unmeasured).
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

// The P 16-bit parts of the pair (x0, x1), two values a word: part p rounds what parts 0..p-1 left.
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

// Block b: rows 16 b .. 16 b + 15 for T tokens, its 8 warps taking every 8th run of 32 inputs. The mma's 16 inputs
// are any 16 of the row as long as A and B take the same ones: lane (g, c) (g = lane / 4, c = lane % 4) loads inputs
// 8 c .. 8 c + 7 of a run, of rows g and g + 8 (one 16-byte word each) and of token g (lanes past T read the last
// token's, into sums not stored), and its words' halves are the fragments' inputs 2 c, 2 c + 1 (the first four) and
// 2 c + 8, 2 c + 9 (the next) of two mma steps. Rows past n_out read the last row and are not stored.
template <bool BF16>
__global__ void __launch_bounds__(kMmaWarps * 32) gemv16_mma_kernel(const uint8_t *W, uint64_t row_bytes, int64_t n_in,
                                                                   int64_t n_out, const float *X, int64_t T, float *Y) {
    constexpr int P = BF16 ? 3 : 2, U = 4;  // U: runs a warp has in flight
    __shared__ float red[kMmaWarps][4][32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
    const int64_t row0 = (int64_t)blockIdx.x * 16;
    const uint4 *wa = (const uint4 *)(W + (uint64_t)min(row0 + g, n_out - 1) * row_bytes);
    const uint4 *wb = (const uint4 *)(W + (uint64_t)min(row0 + g + 8, n_out - 1) * row_bytes);
    const float *x = X + (g < T ? g : T - 1) * n_in;
    const int64_t runs = (n_in + 31) / 32;
    float acc[1][1][4] = {};
    for (int64_t j0 = warp; j0 < runs; j0 += U * kMmaWarps) {
        uint4 a[U], b[U];
        float4 x0[U], x1[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int64_t k = 32 * (j0 + u * kMmaWarps) + 8 * c;
            const bool in = k < n_in;  // (n_in a multiple of 8: the lane's 8 inputs all in or all out)
            a[u] = in ? __ldg(wa + k / 8) : make_uint4(0, 0, 0, 0);
            b[u] = in ? __ldg(wb + k / 8) : make_uint4(0, 0, 0, 0);
            x0[u] = in ? __ldg((const float4 *)(x + k)) : make_float4(0, 0, 0, 0);
            x1[u] = in ? __ldg((const float4 *)(x + k + 4)) : make_float4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            uint32_t p01[P], p23[P], p45[P], p67[P];
            split_pair<BF16, P>(x0[u].x, x0[u].y, p01);
            split_pair<BF16, P>(x0[u].z, x0[u].w, p23);
            split_pair<BF16, P>(x1[u].x, x1[u].y, p45);
            split_pair<BF16, P>(x1[u].z, x1[u].w, p67);
#pragma unroll
            for (int p = 0; p < P; p++) {
                mma_16bit_16x8x16<BF16>(acc[0][0], a[u].x, b[u].x, a[u].y, b[u].y, p01[p], p23[p]);
                mma_16bit_16x8x16<BF16>(acc[0][0], a[u].z, b[u].z, a[u].w, b[u].w, p45[p], p67[p]);
            }
        }
    }
    mma_store<1, 1>(red, acc, row0, n_out, T, Y);
}

bool gemv16_mma_on() {
    static const bool on = env_switch("DFL_CUDA_GEMV16_MMA", false);
    return on;
}

void launch_gemv16_mma(cudaStream_t s, const Weight &W, const float *X, int64_t T, float *Y) {
    const unsigned grid = (unsigned)((W.n_out + 15) / 16);
    if (W.type == DFL_TYPE_BF16)
        gemv16_mma_kernel<true><<<grid, kMmaWarps * 32, 0, s>>>(W.data, W.row_bytes, W.n_in, W.n_out, X, T, Y);
    else
        gemv16_mma_kernel<false><<<grid, kMmaWarps * 32, 0, s>>>(W.data, W.row_bytes, W.n_in, W.n_out, X, T, Y);
    check_launch("matmul (16-bit, tensor cores)");
}

}  // namespace cuda
}  // namespace dfl
