// The tensor-core kernel on the packed weights of f16, bf16 and quantized matrices for 2..64 tokens (batched decode,
// verify blocks and small prefill chunks of the weights the int8 kernels do not take): launch_matmul's middle path.
#include <mma.h>

#include <algorithm>

#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/cuda_device.h"

namespace dfl {
namespace cuda {

// One block computes kMmqRows output rows for all T tokens (padded to 16 * NF). Per K tile of 256 elements (one K-quant
// super-block, eight q8_0 blocks): the raw weight bytes of the tile are copied into shared memory with 16-byte
// asynchronous copies (q8_0 and q6_K blocks are only 2-byte aligned, so each row's window starts at its 16-byte
// aligned-down address), decoded once into a 16-bit tile, and multiplied on tensor cores against the matching slice of
// X, which the caller converted to the same 16-bit type once per call (small: it stays in L1/L2, so the fragments are
// read from it directly). The raw tiles are double-buffered: the copy of tile k + 1 is in flight while tile k is
// decoded and multiplied. Every weight byte is read once per call whatever T is, and the decode is shared by all
// tokens. When the row tiles alone leave the GPU short of blocks, K is split over blockIdx.y (partial sums in scratch,
// summed in a fixed order so results do not depend on scheduling).

constexpr int kMmqRows = 64;                  // output rows per block: 16 per warp
constexpr int kMmqWarps = kMmqRows / 16;
constexpr int kMmqK = 256;                    // K elements per tile
constexpr int kMmqLd = kMmqK + 8;             // 16-bit tile row stride: 528 bytes shifts banks by 4 per row
constexpr int kMmqCLd = kMmqRows + 4;         // f32 output staging, [token][row]
constexpr int kMmqMinTilesPerSplit = 4;       // a split must stream enough K to amortise its partial-sum write

// Bytes of `klen` elements (a multiple of the block size) of a row of `type`.
__host__ __device__ __forceinline__ int mmq_tile_bytes(uint32_t type, int klen) {
    switch (type) {
    case DFL_TYPE_Q8_0: return klen / QK8_0 * kQ8_0Bytes;
    case DFL_TYPE_Q4_K: return klen / QK_K * kQ4_KBytes;
    case DFL_TYPE_Q6_K: return klen / QK_K * kQ6_KBytes;
    default: return 2 * klen;  // f16, bf16
    }
}

// Raw bytes kept per row of a tile: the tile's bytes plus up to 15 of misalignment, in whole 16-byte words.
static int mmq_raw_ld(uint32_t type) { return (mmq_tile_bytes(type, kMmqK) + 15) / 16 * 16 + 16; }

// Two raw buffers, then the 16-bit weight tile. The output staging (16 * NF x kMmqCLd floats, at most 17 KB) reuses the
// raw buffers, which are at least 2 * 64 * 160 bytes (q4_K).
static size_t mmq_smem_bytes(uint32_t type) {
    return (size_t)2 * kMmqRows * mmq_raw_ld(type) + (size_t)kMmqRows * kMmqLd * 2;
}

// Starts copying bytes [p, p + len) of the weight into `dst`, which receives the 16-byte words from p's aligned-down
// address on, so the tile starts at dst + (p & 15). Words wholly inside the tensor [lo, hi) are asynchronous 16-byte
// copies; a word crossing the tensor's ends (only when its start or size is not 16-byte aligned) is copied byte by
// byte at once, so nothing outside the tensor is read. Lane `lane` of `nl` threads takes every nl-th word.
__device__ __forceinline__ void mmq_copy_raw(const uint8_t *p, int len, const uint8_t *lo, const uint8_t *hi,
                                             uint8_t *dst, int lane, int nl) {
    const uint8_t *a0 = (const uint8_t *)((uintptr_t)p & ~(uintptr_t)15);
    const int words = (int)(((p + len) - a0) + 15) / 16;
    for (int w = lane; w < words; w += nl) {
        const uint8_t *a = a0 + 16 * w;
        if (a >= lo && a + 16 <= hi) {
            cp_async16(dst + 16 * w, a);
        } else {
            for (int b = 0; b < 16; b++) dst[16 * w + b] = (a + b >= lo && a + b < hi) ? a[b] : (uint8_t)0;
        }
    }
}

__device__ __forceinline__ uint16_t sh_u16(const uint8_t *p) { return *(const uint16_t *)p; }  // p even

// Eight consecutive weights j0 .. j0 + 7 (j0 a multiple of 8) of the tile at `t` (shared memory, even address),
// as 16-bit bits of the tile's element type. Same arithmetic as load_elem, rounded to f16 once at the end.
__device__ __forceinline__ void mmq_decode8(uint32_t type, const uint8_t *t, int j0, uint16_t (&o)[8]) {
    switch (type) {
    case DFL_TYPE_Q8_0: {
        const uint8_t *b = t + (j0 / QK8_0) * kQ8_0Bytes;
        const float d = half_bits_to_f32(sh_u16(b));
        const uint8_t *qs = b + 2 + (j0 % QK8_0);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const uint16_t v = sh_u16(qs + 2 * k);
            o[2 * k] = f32_to_half_bits(d * (float)(int8_t)(v & 0xFF));
            o[2 * k + 1] = f32_to_half_bits(d * (float)(int8_t)(v >> 8));
        }
        break;
    }
    case DFL_TYPE_Q4_K: {
        const int c = j0 / 64, l = j0 % 64;
        const float d = half_bits_to_f32(sh_u16(t)), dmin = half_bits_to_f32(sh_u16(t + 2));
        int sc, m;
        q4k_scale_min_dev(2 * c + (l >= 32), t + 4, sc, m);
        const float ds = d * (float)sc, dm = dmin * (float)m;
        const uint8_t *q = t + 16 + 32 * c + (l & 31);
        const int shift = l < 32 ? 0 : 4;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const uint16_t v = sh_u16(q + 2 * k);
            o[2 * k] = f32_to_half_bits(ds * (float)((v >> shift) & 0x0F) - dm);
            o[2 * k + 1] = f32_to_half_bits(ds * (float)((v >> (8 + shift)) & 0x0F) - dm);
        }
        break;
    }
    case DFL_TYPE_Q6_K: {
        const int h = j0 / 128, r = j0 % 128, k = r / 32, l = r % 32;
        const float d = half_bits_to_f32(sh_u16(t + 208));
        const float ds = d * (float)(int8_t)t[192 + 8 * h + l / 16 + 2 * k];
        const uint8_t *ql = t + 64 * h + l + 32 * (k & 1);
        const uint8_t *qh = t + 128 + 32 * h + l;
        const int lshift = k < 2 ? 0 : 4;
#pragma unroll
        for (int m = 0; m < 4; m++) {
            const uint16_t lv = sh_u16(ql + 2 * m), hv = sh_u16(qh + 2 * m);
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int lo = (lv >> (8 * e + lshift)) & 0x0F;
                const int hi = (hv >> (8 * e + 2 * k)) & 3;
                o[2 * m + e] = f32_to_half_bits(ds * (float)((lo | (hi << 4)) - 32));
            }
        }
        break;
    }
    default: {  // f16, bf16: the bits as they are
#pragma unroll
        for (int k = 0; k < 8; k++) o[k] = sh_u16(t + 2 * (j0 + k));
        break;
    }
    }
}

// X (T x n_in, f32) -> Xh (t_pad x k_pad, f16 or bf16), zero beyond T and n_in so padded tiles add nothing.
__global__ void mmq_convert_x_kernel(const float *X, int64_t T, int64_t n_in, int64_t t_pad, int64_t k_pad,
                                     uint16_t *out, bool bf16) {
    const int64_t n = t_pad * k_pad;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = i / k_pad, k = i % k_pad;
        const float v = (t < T && k < n_in) ? X[t * n_in + k] : 0.0f;
        out[i] = bf16 ? f32_to_bf16_bits(v) : f32_to_half_bits(v);
    }
}

// Block (bx, by): rows [64 bx, 64 bx + 64), K tiles [by * tiles_per_split, ...). Writes out[by][t][row] (out = Y when
// there is one split). Xh is t_pad x k_pad 16-bit values, zero-padded.
template <typename E, int NF>
__global__ void __launch_bounds__(kMmqWarps * 32) mmq_kernel(uint32_t type, const uint8_t *W, uint64_t row_bytes,
                                                            int64_t n_in, int64_t n_out, const uint16_t *Xh,
                                                            int64_t k_pad, int64_t T, int tiles_per_split, int raw_ld,
                                                            float *out) {
    namespace wmma = nvcuda::wmma;
    extern __shared__ __align__(128) uint8_t smem[];
    uint8_t *const raw = smem;  // two buffers of kMmqRows * raw_ld bytes
    uint16_t *wt = (uint16_t *)(smem + 2 * kMmqRows * raw_ld);
    float *cs = (float *)smem;  // after the K loop, the raw buffers stage the output

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int64_t row0 = (int64_t)blockIdx.x * kMmqRows;
    const int n_tiles = (int)((n_in + kMmqK - 1) / kMmqK);
    const int kt0 = blockIdx.y * tiles_per_split;
    const int kt1 = min(n_tiles, kt0 + tiles_per_split);
    const int full_bytes = mmq_tile_bytes(type, kMmqK);
    const uint8_t *lo = W, *hi = W + (uint64_t)n_out * row_bytes;

    // Tile kt's raw bytes into buffer b: warp w takes rows w, w + 4, ..., its lanes the words of a row.
    auto issue_tile = [&](int kt, int b) {
        const int64_t left = n_in - (int64_t)kt * kMmqK;
        const int bytes = mmq_tile_bytes(type, left < kMmqK ? (int)left : kMmqK);
#pragma unroll 4
        for (int r = warp; r < kMmqRows; r += kMmqWarps) {
            if (row0 + r >= n_out) continue;
            const uint8_t *p = W + (uint64_t)(row0 + r) * row_bytes + (uint64_t)kt * full_bytes;
            mmq_copy_raw(p, bytes, lo, hi, raw + (b * kMmqRows + r) * raw_ld, lane, 32);
        }
        cp_async_commit();
    };

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[NF];
#pragma unroll
    for (int f = 0; f < NF; f++) wmma::fill_fragment(acc[f], 0.0f);

    issue_tile(kt0, 0);
    for (int kt = kt0; kt < kt1; kt++) {
        const int b = (kt - kt0) & 1;
        if (kt + 1 < kt1) {
            issue_tile(kt + 1, b ^ 1);  // its buffer was last decoded two tiles ago, before the barrier below
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();  // every thread's copies of tile kt have landed
        const int64_t left = n_in - (int64_t)kt * kMmqK;
        const int klen = left < kMmqK ? (int)left : kMmqK;
        // decode: a warp per row at a time, 8 weights per lane; rows past n_out and K past n_in are zeros
        for (int g = tid; g < kMmqRows * (kMmqK / 8); g += kMmqWarps * 32) {
            const int r = g / (kMmqK / 8), j0 = 8 * (g % (kMmqK / 8));
            uint16_t v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            if (row0 + r < n_out && j0 < klen) {
                const uint8_t *p = W + (uint64_t)(row0 + r) * row_bytes + (uint64_t)kt * full_bytes;
                mmq_decode8(type, raw + (b * kMmqRows + r) * raw_ld + ((uintptr_t)p & 15), j0, v);
            }
            uint4 u;
            u.x = v[0] | ((uint32_t)v[1] << 16);
            u.y = v[2] | ((uint32_t)v[3] << 16);
            u.z = v[4] | ((uint32_t)v[5] << 16);
            u.w = v[6] | ((uint32_t)v[7] << 16);
            *(uint4 *)(wt + r * kMmqLd + j0) = u;
        }
        __syncthreads();
        const E *xk = (const E *)(Xh + (int64_t)kt * kMmqK);
#pragma unroll 4
        for (int kk = 0; kk < kMmqK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, E, wmma::row_major> a;
            wmma::load_matrix_sync(a, (const E *)(wt + warp * 16 * kMmqLd + kk), kMmqLd);
#pragma unroll
            for (int f = 0; f < NF; f++) {
                // B[k][n] = X[token 16 f + n][k]: token-major X read column-major, from global (L1/L2)
                wmma::fragment<wmma::matrix_b, 16, 16, 16, E, wmma::col_major> bf;
                wmma::load_matrix_sync(bf, xk + f * 16 * k_pad + kk, (unsigned)k_pad);
                wmma::mma_sync(acc[f], a, bf, acc[f]);
            }
        }
        __syncthreads();  // the next tile overwrites wt, and the copy after it this raw buffer
    }
    cp_async_wait<0>();  // no copy may still be landing where the output is staged (the loop always waits; be sure)
    __syncthreads();
#pragma unroll
    for (int f = 0; f < NF; f++)
        wmma::store_matrix_sync(cs + f * 16 * kMmqCLd + warp * 16, acc[f], kMmqCLd, wmma::mem_col_major);
    __syncthreads();
    float *o = out + (int64_t)blockIdx.y * T * n_out;
    for (int i = tid; i < T * kMmqRows; i += kMmqWarps * 32) {
        const int t = i / kMmqRows, r = i % kMmqRows;
        if (row0 + r < n_out) o[(int64_t)t * n_out + row0 + r] = cs[t * kMmqCLd + r];
    }
}

// Y = sum over the splits of the partial sums, in split order.
__global__ void mmq_reduce_kernel(const float *part, int splits, int64_t n, float *Y) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float s = 0.0f;
        for (int k = 0; k < splits; k++) s += part[(int64_t)k * n + i];
        Y[i] = s;
    }
}

// Whether the tensor-core path reads this weight: 16-bit and quantized types whose rows start on even addresses (the
// decoder reads shared memory in 16-bit words) and whose n_in is whole blocks.
bool mmq_ok(const Weight &W) {
    if (((uintptr_t)W.data & 1) != 0 || W.row_bytes % 2 != 0 || W.n_in <= 0) return false;
    switch (W.type) {
    case DFL_TYPE_F16:
    case DFL_TYPE_BF16: return W.n_in % 8 == 0;
    case DFL_TYPE_Q8_0: return W.n_in % QK8_0 == 0;
    case DFL_TYPE_Q4_K:
    case DFL_TYPE_Q6_K: return W.n_in % QK_K == 0;
    default: return false;
    }
}

template <typename E, int NF>
static void launch_mmq_nf(CudaDevice &dev, const Weight &W, const uint16_t *Xh, int64_t k_pad, int64_t T, dim3 grid,
                          int tiles_per_split, float *out) {
    // the largest size any type needs (f16), so that one opt-in serves every weight type
    allow_dynamic_smem<mmq_kernel<E, NF>>(dev.index(), mmq_smem_bytes(DFL_TYPE_F16), "matmul (mmq smem)");
    mmq_kernel<E, NF><<<grid, kMmqWarps * 32, mmq_smem_bytes(W.type), dev.stream()>>>(
        W.type, W.data, W.row_bytes, W.n_in, W.n_out, Xh, k_pad, T, tiles_per_split, mmq_raw_ld(W.type), out);
}

void launch_mmq(CudaDevice &dev, const Weight &W, const float *X, int64_t T, float *Y) {
    cudaStream_t s = dev.stream();
    const int nf = (int)((T + 15) / 16);
    const int64_t t_pad = 16 * nf;
    const int n_tiles = (int)((W.n_in + kMmqK - 1) / kMmqK);
    const int64_t k_pad = (int64_t)n_tiles * kMmqK;
    const int64_t row_tiles = (W.n_out + kMmqRows - 1) / kMmqRows;
    // about two resident blocks per SM: split K only when the row tiles alone leave the GPU short of blocks
    const int64_t want_blocks = 2 * (int64_t)dev.sm_count();
    int splits = (int)std::min<int64_t>(std::max<int64_t>(1, n_tiles / kMmqMinTilesPerSplit),
                                        std::max<int64_t>(1, (want_blocks + row_tiles - 1) / row_tiles));
    const int tiles_per_split = (n_tiles + splits - 1) / splits;
    splits = (n_tiles + tiles_per_split - 1) / tiles_per_split;  // no empty split
    const size_t x_bytes = round256((size_t)t_pad * k_pad * 2);
    const size_t part_bytes = splits > 1 ? (size_t)splits * T * W.n_out * 4 : 0;
    uint8_t *scr = (uint8_t *)dev.scratch(x_bytes + part_bytes);
    uint16_t *Xh = (uint16_t *)scr;
    float *part = splits > 1 ? (float *)(scr + x_bytes) : Y;
    const bool bf16 = W.type == DFL_TYPE_BF16;
    mmq_convert_x_kernel<<<grid_for(t_pad * k_pad, 256), 256, 0, s>>>(X, T, W.n_in, t_pad, k_pad, Xh, bf16);
    check_launch("matmul (mmq convert X)");
    const dim3 grid((unsigned)row_tiles, (unsigned)splits);
    if (bf16) {
        switch (nf) {
        case 1: launch_mmq_nf<__nv_bfloat16, 1>(dev, W, Xh, k_pad, T, grid, tiles_per_split, part); break;
        case 2: launch_mmq_nf<__nv_bfloat16, 2>(dev, W, Xh, k_pad, T, grid, tiles_per_split, part); break;
        case 3: launch_mmq_nf<__nv_bfloat16, 3>(dev, W, Xh, k_pad, T, grid, tiles_per_split, part); break;
        default: launch_mmq_nf<__nv_bfloat16, 4>(dev, W, Xh, k_pad, T, grid, tiles_per_split, part); break;
        }
    } else {
        switch (nf) {
        case 1: launch_mmq_nf<__half, 1>(dev, W, Xh, k_pad, T, grid, tiles_per_split, part); break;
        case 2: launch_mmq_nf<__half, 2>(dev, W, Xh, k_pad, T, grid, tiles_per_split, part); break;
        case 3: launch_mmq_nf<__half, 3>(dev, W, Xh, k_pad, T, grid, tiles_per_split, part); break;
        default: launch_mmq_nf<__half, 4>(dev, W, Xh, k_pad, T, grid, tiles_per_split, part); break;
        }
    }
    check_launch("matmul (mmq)");
    if (splits > 1) {
        const int64_t n = T * W.n_out;
        mmq_reduce_kernel<<<grid_for(n, 256), 256, 0, s>>>(part, splits, n, Y);
        check_launch("matmul (mmq reduce)");
    }
}

}  // namespace cuda
}  // namespace dfl
