// Products of more than 64 tokens (prefill chunks, batches of verify blocks) on the repacked q8_0 rows with int8 tensor
// cores, tiled as a GEMM (DFL_CUDA_Q8P_GEMM=1, opt-in, not yet run on a GPU). cuBLAS (gemm.cu) first writes an f16 copy
// of every weight and reads it back: on the 27B qwen35 shape ~135 GB moved a forward, ~40 of a 512-row forward's 119
// ms on the H200, and 128 rows cost nearly what 512 do. Here every weight byte is read once per tile of tokens (the
// tiles of one row tile run side by side, so the L2 serves the repeats) and multiplied as int8.
//
// A block owns kGemmRows weight rows x BN tokens; its 8 warps split them 4 x 2 (32 rows x BN / 2 tokens a warp, so
// every warp runs the whole of K and no sums are added between warps). Stages of kGemmGroup blocks of 32 inputs (the
// rows' quants and f16 scales, the tokens' int8 quants and float scales, as the quantizer wrote them) are copied into
// shared memory by cp.async, kGemmStages - 1 ahead. One mma.sync m16n8k32 is one q8_0 block of 16 rows against 8
// tokens, so its int32 result takes the two scales as it is added to the float sums (the fragments as in
// mma_int8.cu: lane (g, t4) reads 8 bytes at 8 t4 of rows g and g + 8 and of token g).
#include <algorithm>

#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/cuda_device.h"
#include "ops/cuda/mma_common.cuh"

namespace dfl {
namespace cuda {

constexpr int kGemmRows = 128;                 // weight rows a block (4 warps x 32)
constexpr int kGemmGroup = 4;                  // blocks of 32 inputs a stage: 128 bytes of a row
constexpr int kGemmRowBytes = kGemmGroup * 32 + 32;  // 160 bytes = 40 words: rows g = 0..3 of a half-warp's 8-byte
                                                     // fragment loads start 8 banks apart, so they never collide
constexpr int kGemmStages = 3;
constexpr int kGemmMaxOuts = 4;                // q|k|v (qwen35: qkv|z|b|a) is the most parts a product has

// The outputs of one product: rows [r0[i], r0[i] + rows[i]) of W into y[i], T rows ldy[i] apart.
struct GemmDst {
    int n;
    int64_t r0[kGemmMaxOuts], rows[kGemmMaxOuts], ldy[kGemmMaxOuts];
    float *y[kGemmMaxOuts];
};

template <int BN>
struct GemmStage {
    static constexpr int kW = kGemmRows * kGemmRowBytes;  // [row][160] quants
    static constexpr int kWd = kGemmRows * kGemmGroup * 2;  // [row][4] f16 scales
    static constexpr int kX = BN * kGemmRowBytes;           // [token][160] quants
    static constexpr int kXs = BN * kGemmGroup * 4;         // [token][4] float scales
    static constexpr int kBytes = kW + kWd + kX + kXs;
    uint8_t *w;
    uint16_t *wd;
    int8_t *x;
    float *xs;
    __device__ __forceinline__ explicit GemmStage(uint8_t *base)
        : w(base), wd((uint16_t *)(base + kW)), x((int8_t *)(base + kW + kWd)), xs((float *)(base + kW + kWd + kX)) {}

    // Stage j's rows of W (rows past n_out repeat the last one: never stored).
    __device__ __forceinline__ void load_w(const int8_t *qs, const uint16_t *dw, int64_t n_in, int64_t nb, int64_t n_out,
                                           int64_t row0, int64_t j) const {
        constexpr int kChunks = kGemmRows * kGemmGroup * 2;  // 16-byte chunks of quants
        for (int c = threadIdx.x; c < kChunks; c += kMmaWarps * 32) {
            const int r = c >> 3, col = c & 7;
            const int64_t row = min(row0 + r, n_out - 1);
            cp_async16(w + r * kGemmRowBytes + col * 16, qs + row * n_in + j * kGemmGroup * 32 + col * 16);
        }
        if (threadIdx.x < kGemmRows) {
            const int64_t row = min(row0 + threadIdx.x, n_out - 1);
            cp_async8(wd + threadIdx.x * kGemmGroup, dw + row * nb + j * kGemmGroup);
        }
    }
    // Stage j's inputs of the block's tokens (tokens from T repeat token T - 1: never stored).
    __device__ __forceinline__ void load_x(const int8_t *xq, const float *xsc, int64_t n_in, int64_t nb, int64_t T,
                                           int64_t t0, int64_t j) const {
        constexpr int kChunks = BN * kGemmGroup * 2;
        for (int c = threadIdx.x; c < kChunks + BN; c += kMmaWarps * 32) {
            if (c < kChunks) {
                const int tok = c >> 3, col = c & 7;
                const int64_t t = min(t0 + tok, T - 1);
                cp_async16(x + tok * kGemmRowBytes + col * 16, xq + t * n_in + j * kGemmGroup * 32 + col * 16);
            } else {
                const int tok = c - kChunks;
                const int64_t t = min(t0 + tok, T - 1);
                cp_async16(xs + tok * kGemmGroup, xsc + t * nb + j * kGemmGroup);
            }
        }
    }
};

// Y (T x rows, through dst) = X W^T: grid x the token tiles of BN (the fast index, so that the blocks of one row tile run
// together), grid y the row tiles. Needs n_in % 128 == 0.
template <int BN>
__global__ void __launch_bounds__(kMmaWarps * 32, BN <= 64 ? 2 : 1)
    q8p_gemm_kernel(const int8_t *qs, const uint16_t *dw, int64_t n_in, int64_t n_out, const int8_t *xq,
                    const float *xsc, int64_t T, GemmDst dst) {
    using Stage = GemmStage<BN>;
    constexpr int NT8 = BN / 16;  // 8-token tiles a warp
    extern __shared__ __align__(16) uint8_t gemm_smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t4 = lane & 3;
    const int wr = (warp & 3) * 32, wt = (warp >> 2) * (BN / 2);  // the warp's first row and token in the tile
    const int64_t nb = n_in / 32, ng = nb / kGemmGroup;
    const int64_t row0 = (int64_t)blockIdx.y * kGemmRows, t0 = (int64_t)blockIdx.x * BN;
    // the first stages' weights before the wait, the activations (the kernel before's output) after
#pragma unroll
    for (int st = 0; st < kGemmStages - 1; st++)
        if (st < ng) Stage(gemm_smem + st * Stage::kBytes).load_w(qs, dw, n_in, nb, n_out, row0, st);
    pdl_wait();
#pragma unroll
    for (int st = 0; st < kGemmStages - 1; st++) {
        if (st < ng) Stage(gemm_smem + st * Stage::kBytes).load_x(xq, xsc, n_in, nb, T, t0, st);
        cp_async_commit();
    }
    float acc[2][NT8][4] = {};
    for (int64_t j = 0; j < ng; j++) {
        cp_async_wait<kGemmStages - 2>();
        __syncthreads();  // stage j is in; every warp is done with stage j - 1, which is refilled now
        const int64_t jn = j + kGemmStages - 1;
        if (jn < ng) {
            const Stage nxt(gemm_smem + (int)(jn % kGemmStages) * Stage::kBytes);
            nxt.load_w(qs, dw, n_in, nb, n_out, row0, jn);
            nxt.load_x(xq, xsc, n_in, nb, T, t0, jn);
        }
        cp_async_commit();
        const Stage cur(gemm_smem + (int)(j % kGemmStages) * Stage::kBytes);
#pragma unroll
        for (int kk = 0; kk < kGemmGroup; kk++) {
            uint2 a[2][2];
            float sw[2][2];
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int r = wr + 16 * mt + 8 * h + g;
                    a[mt][h] = *(const uint2 *)(cur.w + r * kGemmRowBytes + kk * 32 + t4 * 8);
                    sw[mt][h] = half_bits_to_f32(cur.wd[r * kGemmGroup + kk]);
                }
#pragma unroll
            for (int nt = 0; nt < NT8; nt++) {
                const int tk = wt + 8 * nt;
                const uint2 b = *(const uint2 *)(cur.x + (tk + g) * kGemmRowBytes + kk * 32 + t4 * 8);
                const float s0 = cur.xs[(tk + 2 * t4) * kGemmGroup + kk], s1 = cur.xs[(tk + 2 * t4 + 1) * kGemmGroup + kk];
#pragma unroll
                for (int mt = 0; mt < 2; mt++) {
                    int c[4];
                    mma_s8_16x8x32(c, a[mt][0].x, a[mt][1].x, a[mt][0].y, a[mt][1].y, b.x, b.y);
                    acc[mt][nt][0] += (float)c[0] * (sw[mt][0] * s0);
                    acc[mt][nt][1] += (float)c[1] * (sw[mt][0] * s1);
                    acc[mt][nt][2] += (float)c[2] * (sw[mt][1] * s0);
                    acc[mt][nt][3] += (float)c[3] * (sw[mt][1] * s1);
                }
            }
        }
    }
    cp_async_wait<0>();
    pdl_trigger();  // the main loop is done: a PDL kernel after this one may launch (it waits for this one's end)
    // C entry i of a tile: row g + 8 (i / 2), token 2 t4 + i % 2
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int64_t row = row0 + wr + 16 * mt + 8 * h + g;
            if (row >= n_out) continue;
            int o = 0;
            while (o + 1 < dst.n && row >= dst.r0[o] + dst.rows[o]) o++;
            float *y = dst.y[o] + (row - dst.r0[o]);
            const int64_t ldy = dst.ldy[o];
#pragma unroll
            for (int nt = 0; nt < NT8; nt++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int64_t t = t0 + wt + 8 * nt + 2 * t4 + e;
                    if (t < T) y[t * ldy] = acc[mt][nt][2 * h + e];
                }
        }
}

bool q8p_gemm_on() {
    static const bool on = env_switch("DFL_CUDA_Q8P_GEMM", false);
    return on;
}

bool q8p_gemm_ok(const Weight &W, size_t n_outs) {
    return q8p_ok(W) && W.n_in % (kGemmGroup * 32) == 0 && n_outs >= 1 && n_outs <= (size_t)kGemmMaxOuts;
}

// Token tiles of 64 (two blocks an SM), or 128 with DFL_CUDA_Q8P_GEMM_BN=128 (one block an SM, each weight byte read
// from shared memory for twice the tokens).
static int q8p_gemm_bn() {
    static const int bn = env_int("DFL_CUDA_Q8P_GEMM_BN", 64) == 128 ? 128 : 64;
    return bn;
}

void launch_q8p_gemm(CudaDevice &dev, const Weight &W, const float *X, int64_t T, const std::vector<GemmOut> &outs) {
    GemmDst dst{};
    dst.n = (int)outs.size();
    for (int i = 0; i < dst.n; i++) {
        dst.r0[i] = outs[(size_t)i].r0;
        dst.rows[i] = outs[(size_t)i].rows;
        dst.y[i] = outs[(size_t)i].y;
        dst.ldy[i] = outs[(size_t)i].ldy;
    }
    const CudaDevice::QuantX qx = quantize_x(dev, X, W.n_in, T, false);
    auto launch = [&](auto bn) {
        constexpr int BN = decltype(bn)::value;
        const size_t smem = (size_t)kGemmStages * GemmStage<BN>::kBytes;
        allow_dynamic_smem<q8p_gemm_kernel<BN>>(dev.index(), smem, "matmul (q8_0 int8 gemm smem)");
        const dim3 grid((unsigned)((T + BN - 1) / BN), (unsigned)((W.n_out + kGemmRows - 1) / kGemmRows));
        launch_maybe_pdl(true, q8p_gemm_kernel<BN>, grid, dim3(kMmaWarps * 32), smem, dev.stream(), q8p_quants(W),
                         q8p_scales(W), W.n_in, W.n_out, qx.xq, qx.xs, T, dst);
    };
    if (q8p_gemm_bn() == 128)
        launch(std::integral_constant<int, 128>{});
    else
        launch(std::integral_constant<int, 64>{});
    check_launch("matmul (q8_0 int8 gemm)");
}

}  // namespace cuda
}  // namespace dfl
