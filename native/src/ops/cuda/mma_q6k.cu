// q6_K products of 2..64 tokens on int8 tensor cores, on the file's own layout (DFL_CUDA_Q6K_MMA=0: the dp4a and f16
// kernels). H200, 12-03 22:12, one call: qwen3-8b q4_K (its q6_K head) tg b8 1,566 -> 1,784 tok/s, b32 4,081 -> 4,846.
#include <algorithm>
#include <type_traits>

#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/cuda_device.h"
#include "ops/cuda/mma_common.cuh"

namespace dfl {
namespace cuda {

// The scheme of gemv_q4k_mma_kernel (mma_q4k.cu): a block of 8 warps owns 16 MT weight rows and every token (8 per
// n-tile), its warps split the super-blocks of the rows, and their sums are added through shared memory. What differs:
//  - q6_K has one int8 scale per 16 elements, so each block of 32 takes two mma.m16n8k16 (one per scale), whose int32
//    results are joined by their integer scales before the float product with the activations' scale of the 32;
//  - the 6-bit codes are built from two places (ql nibbles, qh bit pairs), 16 per lane and row per block of 32, where
//    q4_K's lane holds them ready in 8 loaded bytes: the weights would take ~66 registers a warp-row pair for two
//    super-blocks in flight, so they are staged in shared memory instead (cp.async, no registers while in flight);
//  - super-blocks are 210 bytes, so every other one starts 2 bytes off a 4-byte boundary: a stage is 8 whole
//    super-blocks of each row (1680 bytes, a multiple of 16, copied in the largest pieces the row's alignment allows),
//    and the lanes of a warp on an odd super-block put each 4-byte word together from two aligned ones.
// Fragments: lane (g = lane / 4, t4 = lane % 4) gives rows g and g + 8 of the tile and token g of the n-tile the
// positions 4 t4 .. 4 t4 + 3 of each 16-element sub-block, in element order (no permutation): in a q6_K super-block the
// 16 elements of a sub-block have 16 consecutive ql bytes and 16 consecutive qh bytes.
// H200 (standalone, acts copy + product, plain launches): 151936 x 4096 at 2 / 8 / 16 / 32 tokens 231 / 234 / 270 /
// 352 us (2.2 / 2.2 / 1.9 / 1.45 TB/s), 24576 x 4096 at 8 / 32 48 / 71 us, 4096 x 12288 27 / 38 us. Nsight Compute at
// 8 tokens: issue-bound (0.66 warps issued per scheduler cycle with 16 warps an SM, DRAM 40 %). Tried without gain: a
// persistent grid streaming the tiles through one pipeline (240 us), and unsigned codes with the offset of 32 taken
// by an extra mma (two operations fewer a code word; 240 us).
constexpr int kQ6Warps = kMmaWarps;
constexpr int kQ6Group = kQ6Warps;                  // super-blocks of each row a stage holds, one per warp
constexpr int kQ6StageRow = kQ6Group * kQ6_KBytes;  // 1680 bytes: 420 words, 4 banks apart from row to row, so a
                                                    // warp's 8 rows x 4 lanes of words fall in 32 distinct banks

// Stages in flight: two blocks an SM either way (2 x 107.5 KB of shared memory, at most 128 registers).
template <int MT>
__host__ __device__ constexpr int q6_stages() {
    return MT == 1 ? 4 : 2;
}
template <int MT>
__host__ __device__ constexpr size_t q6_smem_bytes() {
    return (size_t)q6_stages<MT>() * 16 * MT * kQ6StageRow;
}

__device__ __forceinline__ void mma_s8_16x8x16(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t b) {
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%7,%7,%7};\n"
        : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
        : "r"(a0), "r"(a1), "r"(b), "r"(0));
}

template <int CB>
__device__ __forceinline__ void q6_cp_async(uint32_t dst, const uint8_t *src) {
    if constexpr (CB == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
    else  // .cg takes only 16 bytes
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(dst), "l"(src), "n"(CB) : "memory");
}

// Stage j of the block's rows (bytes 1680 j .. of each, fewer at the end of the row) into dst, CB bytes a copy; each
// warp takes 2 MT of the 16 MT rows. Rows past n_out copy the last one (never stored).
template <int MT, int CB>
__device__ __forceinline__ void q6_copy_stage(uint32_t dst, const uint8_t *W, uint64_t row_bytes, int64_t row0,
                                              int64_t n_out, int64_t j, int warp, int lane) {
    const uint64_t off = (uint64_t)j * kQ6StageRow;
    const int chunks = (int)(min((uint64_t)kQ6StageRow, row_bytes - off) / CB);
#pragma unroll
    for (int i = 0; i < 2 * MT; i++) {
        const int r = warp + kQ6Warps * i;
        const uint8_t *src = W + (uint64_t)min(row0 + r, n_out - 1) * row_bytes + off;
        const uint32_t d = dst + (uint32_t)(r * kQ6StageRow);
#pragma unroll 1
        for (int c = lane; c < chunks; c += 32) q6_cp_async<CB>(d + (uint32_t)(c * CB), src + c * CB);
    }
}

template <int MT>
__device__ __forceinline__ void q6_copy_stage(int cb, uint32_t dst, const uint8_t *W, uint64_t row_bytes,
                                              int64_t row0, int64_t n_out, int64_t j, int warp, int lane) {
    if (cb == 16)
        q6_copy_stage<MT, 16>(dst, W, row_bytes, row0, n_out, j, warp, lane);
    else if (cb == 8)
        q6_copy_stage<MT, 8>(dst, W, row_bytes, row0, n_out, j, warp, lane);
    else
        q6_copy_stage<MT, 4>(dst, W, row_bytes, row0, n_out, j, warp, lane);
}

// The activations in the order the product reads them (written by q6k_acts_kernel from the quantizer's rows): block
// kb of 32 of token t at fq[(kb T8 + t) 32], its bytes permuted so that lane t4's B fragments of the block's two
// 16-element halves (positions 4 t4 .. 4 t4 + 3 of each) are the 8 bytes at 8 t4; the scales at fs[kb T8 + t]. T8: T
// rounded up to 8, the tokens from T repeating token T - 1. A block's tokens are then one base pointer apart by
// constants (where the rows took three 64-bit addresses a tile) and a lane's fragment one 8-byte load.
__global__ void q6k_acts_kernel(const int8_t *xq, const float *xs, int64_t n_in, int64_t T, int T8, int8_t *fq,
                                float *fs) {
    pdl_trigger();  // the product may start loading its weights
    pdl_wait();
    const int64_t nb = n_in / 32, i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;  // i: block kb, token t
    if (i >= nb * T8) return;
    const int64_t kb = i / T8, t = min(i % T8, T - 1);
    const uint4 *q = (const uint4 *)(xq + t * n_in + kb * 32);
    const uint4 a = __ldg(q), b = __ldg(q + 1);  // words 0..3 (positions 0..15), 4..7 (16..31)
    uint4 *dst = (uint4 *)(fq + i * 32);
    dst[0] = make_uint4(a.x, b.x, a.y, b.y);
    dst[1] = make_uint4(a.z, b.z, a.w, b.w);
    fs[i] = __ldg(xs + t * nb + kb);
}

// The activations of one block of 32 for the lane, per n-tile: its B fragments of the block's two halves and the scales
// of its C entries' two tokens (8 nt + 2 t4 and the next).
template <int NT8>
struct Q6Acts {
    uint2 b[NT8];
    float2 s[NT8];
    // fq, fs: block kb's first token, offset by the lane's (fq by token g and 8 t4 bytes, fs by token 2 t4)
    __device__ __forceinline__ void load(const int8_t *fq, const float *fs) {
#pragma unroll
        for (int nt = 0; nt < NT8; nt++) {
            b[nt] = __ldg((const uint2 *)(fq + 8 * nt * 32));
            s[nt] = __ldg((const float2 *)(fs + 8 * nt));
        }
    }
};

// The 4 bytes at p of a staged row; ODD: p is 2 bytes past a 4-byte boundary (an odd super-block of the stage).
template <bool ODD>
__device__ __forceinline__ uint32_t q6_word(const uint8_t *p) {
    if constexpr (ODD) {
        const uint32_t *w = (const uint32_t *)(p - 2);
        return __byte_perm(w[0], w[1], 0x5432);
    } else {
        return *(const uint32_t *)p;
    }
}

// The lane's words at p of each of its staged rows (rows g and g + 8 of each 16-row tile): bytes 4 t4 of both 16-byte
// halves of a block of 32.
template <int MT, bool ODD>
__device__ __forceinline__ void q6_row_words(const uint8_t *p, int t4, uint32_t (&w)[MT][2][2]) {
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
            for (int lh = 0; lh < 2; lh++) w[mt][i][lh] = q6_word<ODD>(p + (16 * mt + 8 * i) * kQ6StageRow + 16 * lh + 4 * t4);
}

// Four codes of quarter k of a q6_K half as int8 q - 32: the low (k < 2) or high nibbles of ql, with bits 2k, 2k + 1
// of qh's bytes as bits 4, 5 (whether k < 2 is known where the caller's loops are unrolled; the shifts may be
// variable). q - 32 = q + 224 (mod 256) byte by byte without carries: q + 96 stays below 256, and adding the other 128
// is flipping bit 7.
__device__ __forceinline__ uint32_t q6_codes(int k, uint32_t ql, uint32_t qh) {
    const uint32_t lo = (k < 2 ? ql : ql >> 4) & 0x0F0F0F0Fu;
    const uint32_t hi = (k < 2 ? qh << (4 - 2 * k) : qh >> (2 * k - 4)) & 0x30303030u;
    return (lo + hi + 0x60606060u) ^ 0x80808080u;
}

// One warp's super-block of its 16 MT rows (row g of the staged tile at p, rows 8 apart kQ6StageRow bytes apart),
// against the activations of its first block of 32 (fq, fs, lane-offset; blocks T8 tokens apart): acc += the products.
// The blocks of 32 go in the order of the bytes they share: for each half h, quarters 0 and 2 (the low and high
// nibbles of the same ql words), then 1 and 3, all with the half's qh words. Tiles of up to 4 fragments keep the
// super-block's sums apart from d (one multiply a C entry per super-block instead of per block of 32), and of up to 2
// load the next block's activations before this one's mma; larger ones have no registers for it (nvcc 11.8 spilled).
// The halves and the ql word pairs are loops, not unrolled, so that the compiler does not hoist the loads of the ones
// after into the first (registers again).
template <int MT, int NT8, bool ODD>
__device__ __forceinline__ void q6k_sb_mma(const uint8_t *p, int t4, const int8_t *fq, const float *fs, int T8,
                                           float (&acc)[MT][NT8][4]) {
    constexpr bool kSmall = MT * NT8 <= 4;
    constexpr int kBufs = MT * NT8 <= 2 ? 2 : 1;
    float d[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int i = 0; i < 2; i++)
            d[mt][i] = half_bits_to_f32(*(const uint16_t *)(p + (16 * mt + 8 * i) * kQ6StageRow + 208));
    float sum[kSmall ? MT : 1][kSmall ? NT8 : 1][4] = {};
    Q6Acts<NT8> xa[kBufs];
    xa[0].load(fq, fs);  // block 0 comes first
#pragma unroll 1
    for (int h = 0; h < 2; h++) {
        const uint8_t *ph = p + 32 * h;  // the half's qh bytes at ph + 128 + ..., its ql bytes at ph + 32 h + ...
        uint32_t qh[MT][2][2];           // [tile][row g, g + 8][half of the block of 32]
        q6_row_words<MT, ODD>(ph + 128, t4, qh);
#pragma unroll 1
        for (int c = 0; c < 2; c++) {
            uint32_t ql[MT][2][2];
            q6_row_words<MT, ODD>(ph + 32 * h + 32 * c, t4, ql);
#pragma unroll
            for (int kk = 0; kk < 2; kk++) {
                const int n = 2 * c + kk;  // the block's turn in this half
                const int k = c + 2 * kk, j = 4 * h + k;
                // the next block: quarter 2 after 0, 1 after 2, 3 after 1, then the next half's quarter 0
                const int jn = n < 3 ? 4 * h + (n == 0 ? 2 : n == 1 ? 1 : 3) : 4;
                if (kBufs == 1) {
                    if (h + n > 0) xa[0].load(fq + j * T8 * 32, fs + j * T8);
                } else if (n < 3 || h == 0) {
                    xa[(kk + 1) % kBufs].load(fq + jn * T8 * 32, fs + jn * T8);
                }
                const Q6Acts<NT8> &x = xa[kk % kBufs];
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    uint32_t a[2][2];
                    int sc[2][2];
#pragma unroll
                    for (int i = 0; i < 2; i++) {
                        // the block's two scales, one 2-byte load (2-aligned in odd super-blocks too)
                        const int16_t s2 = *(const int16_t *)(p + (16 * mt + 8 * i) * kQ6StageRow + 192 + 2 * j);
                        sc[i][0] = (int)(int8_t)s2;
                        sc[i][1] = (int)s2 >> 8;
#pragma unroll
                        for (int lh = 0; lh < 2; lh++) a[i][lh] = q6_codes(k, ql[mt][i][lh], qh[mt][i][lh]);
                    }
#pragma unroll
                    for (int nt = 0; nt < NT8; nt++) {
                        int c0[4], c1[4];
                        mma_s8_16x8x16(c0, a[0][0], a[1][0], x.b[nt].x);
                        mma_s8_16x8x16(c1, a[0][1], a[1][1], x.b[nt].y);
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            // entry e: row g + 8 (e / 2), token 2 t4 + e % 2; |v| < 2^24, exact as a float
                            const int v = sc[e >> 1][0] * c0[e] + sc[e >> 1][1] * c1[e];
                            const float sx = (e & 1) ? x.s[nt].y : x.s[nt].x;
                            if constexpr (kSmall)
                                sum[mt][nt][e] += (float)v * sx;
                            else
                                acc[mt][nt][e] += (float)v * (d[mt][e >> 1] * sx);
                        }
                    }
                }
            }
        }
    }
    if constexpr (kSmall) {
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int nt = 0; nt < NT8; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) acc[mt][nt][e] += d[mt][e >> 1] * sum[mt][nt][e];
    }
}

// Stage j holds super-blocks 8 j .. 8 j + 7 of the rows; warp w takes the one in slot (w + j) % 8, so that each warp
// alternates between even slots (4-byte aligned) and odd ones (two loads a word). cb: bytes a copy (16, 8 or 4: what
// the row length and the tensor's start allow).
template <int MT, int NT8>
__global__ void __launch_bounds__(kQ6Warps * 32, 2)
    gemv_q6k_mma_kernel(const uint8_t *W, uint64_t row_bytes, int64_t n_in, int64_t n_out, const int8_t *fq,
                        const float *fs, int64_t T, int T8, int cb, float *Y) {
    extern __shared__ __align__(16) uint8_t q6_smem[];
    constexpr int kStages = q6_stages<MT>(), kStageBytes = 16 * MT * kQ6StageRow;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t4 = lane & 3;
    const int64_t nsb = n_in / QK_K, ng = (nsb + kQ6Group - 1) / kQ6Group;
    const int64_t row0 = (int64_t)blockIdx.x * 16 * MT;
    const uint32_t smem = (uint32_t)__cvta_generic_to_shared(q6_smem);
    auto copy = [&](int64_t j) {
        q6_copy_stage<MT>(cb, smem + (uint32_t)((j % kStages) * kStageBytes), W, row_bytes, row0, n_out, j, warp,
                          lane);
    };
    // Every buffer is filled at once, and each refilled as soon as the warps are done with it: all kStages stages in
    // flight (a row of 4096 inputs is two stages, so the block asks for all of its weights at its start). The weights
    // are read before the wait, the activations (the kernel before's) after.
#pragma unroll
    for (int st = 0; st < kStages; st++) {
        if (st < ng) copy(st);
        cp_async_commit();
    }
    pdl_wait();
    fq += g * 32 + 8 * t4;  // the lane's B fragments: token g of each tile, 8 bytes at 8 t4
    fs += 2 * t4;           // the tokens of its C entries
    float acc[MT][NT8][4] = {};
    for (int64_t j = 0; j < ng; j++) {
        cp_async_wait<kStages - 1>();
        __syncthreads();  // stage j is in, for every thread's copies
        const int slot = (int)((warp + j) % kQ6Group);
        const int64_t sb = j * kQ6Group + slot;
        if (sb < nsb) {
            const uint8_t *p = q6_smem + (j % kStages) * kStageBytes + g * kQ6StageRow + slot * kQ6_KBytes;
            const int64_t kb = sb * 8;
            if (slot & 1)
                q6k_sb_mma<MT, NT8, true>(p, t4, fq + kb * T8 * 32, fs + kb * T8, T8, acc);
            else
                q6k_sb_mma<MT, NT8, false>(p, t4, fq + kb * T8 * 32, fs + kb * T8, T8, acc);
        }
        __syncthreads();  // every warp is done with stage j: its buffer takes stage j + kStages
        if (j + kStages < ng) copy(j + kStages);
        cp_async_commit();
    }
    cp_async_wait<0>();  // (only empty groups left) the stages are free: the warps' sums are added in their memory
    mma_store<MT, NT8>(*reinterpret_cast<float(*)[kMmaWarps][NT8 * 4][32]>(q6_smem), acc, row0, n_out, T, Y);
}

// Bytes a cp.async of the rows may take: the largest of 16, 8, 4 that divides the row length and the tensor's start
// (0: rows of an odd number of super-blocks, or a tensor 2 bytes off: the dp4a and f16 kernels take those).
static int q6k_copy_bytes(const Weight &W) {
    const uint64_t a = W.row_bytes | (uint64_t)(uintptr_t)W.data;
    return a % 16 == 0 ? 16 : a % 8 == 0 ? 8 : a % 4 == 0 ? 4 : 0;
}

bool q6k_mma_on() {
    static const bool on = env_switch("DFL_CUDA_Q6K_MMA", true);
    return on;
}

bool q6k_mma_ok(const Weight &W) {
    return W.type == DFL_TYPE_Q6_K && W.n_in > 0 && W.n_in % QK_K == 0 &&
           W.row_bytes == (uint64_t)(W.n_in / QK_K) * kQ6_KBytes && q6k_copy_bytes(W) != 0;
}

// T tokens of quantized rows (xq, xs) into Y (rows of n_out): the activations in fragment order, then the product.
// 32-row tiles (each activation load serves 32 rows) up to 32 tokens where their blocks nearly fill the GPU at two an
// SM (from 6336 rows on 132 SMs: the 4096-row products take 16-row tiles, 256 blocks, where 32-row ones would leave
// half the block slots empty); else 16 rows, up to kQ6MaxNT8 tiles of 8 tokens.
constexpr int kQ6MaxNT8 = 6;  // 7 and 8 tiles of 16 rows spill (nvcc 11.8)

static void q6k_mma_pass(CudaDevice &dev, const Weight &W, const int8_t *xq, const float *xs, int64_t T, float *Y) {
    cudaStream_t s = dev.stream();
    const int T8 = (int)((T + 7) / 8 * 8);
    const int64_t nb = W.n_in / 32;
    const size_t q_bytes = round256((size_t)(nb * T8 * 32)), s_bytes = (size_t)(nb * T8) * 4;
    uint8_t *buf = (uint8_t *)dev.mma_buffer(q_bytes + s_bytes);
    int8_t *fq = (int8_t *)buf;
    float *fs = (float *)(buf + q_bytes);
    launch_pdl(q6k_acts_kernel, grid_for(nb * T8, 256), 256, s, xq, xs, W.n_in, T, T8, fq, fs);
    check_launch("matmul (q6_K int8 mma activations)");
    const int cb = q6k_copy_bytes(W);
    auto launch = [&](dim3 grid, auto mt, auto nt8) {
        constexpr int MT = decltype(mt)::value, NT8 = decltype(nt8)::value;
        constexpr size_t smem = q6_smem_bytes<MT>();
        allow_dynamic_smem<gemv_q6k_mma_kernel<MT, NT8>>(dev.index(), smem, "matmul (q6_K int8 mma smem)");
        launch_maybe_pdl(true, gemv_q6k_mma_kernel<MT, NT8>, grid, dim3(kQ6Warps * 32), smem, s, W.data, W.row_bytes,
                         W.n_in, W.n_out, (const int8_t *)fq, (const float *)fs, T, T8, cb, Y);
    };
    dispatch_mma_tiles<4, kQ6MaxNT8>(W.n_out, T, dev.sm_count() * 3 / 2, launch);
    check_launch("matmul (q6_K int8 mma)");
}

// More than 8 kQ6MaxNT8 (48) tokens: two passes over the weights, the first of 32 tokens (each pass's fragment copy
// waits for the pass before to end: launch_pdl).
void launch_gemv_q6k_mma(CudaDevice &dev, const Weight &W, const float *X, int64_t T, float *Y) {
    const CudaDevice::QuantX qx = quantize_x(dev, X, W.n_in, T, false);
    const int64_t nb = W.n_in / 32, first = T <= 8 * kQ6MaxNT8 ? T : 32;
    q6k_mma_pass(dev, W, qx.xq, qx.xs, first, Y);
    if (first < T) q6k_mma_pass(dev, W, qx.xq + first * W.n_in, qx.xs + first * nb, T - first, Y + first * W.n_out);
}

}  // namespace cuda
}  // namespace dfl
