// The activations of the int8 tensor-core products (mma_q8p.cu, mma_q4k.cu) in the order their fragments are read, and
// the switches that choose those products for 2..64 tokens.
#include <algorithm>

#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/cuda_device.h"
#include "ops/cuda/mma_int8.cuh"
#include "ops/cuda/mma_stream.cuh"

namespace dfl {
namespace cuda {

// The activations of an mma product in the order its fragments are read, from the quantizer's rows: quants
// [block][token][32] and scales [block][token] (q4_K: each followed by its block sum), T8 tokens a block (those from T
// repeat token T - 1). A warp's B fragment of 8 tokens is then 256 contiguous bytes instead of 32 bytes of 8 rows, and
// a lane's two tokens' scales one load instead of two (q4_K: four). ncu on the H200 (q4_K, 32 tokens) had shown the L1
// 80 % busy with DRAM at 10 %, most of it these loads. With the copy (one more launch), qwen3-8b layer: q8_0 at 16 /
// 32 / 64 tokens 144 -> 130 / 201 -> 166 / 294 -> 245 us, q4_K at 16 / 32 109 -> 104 / 236 -> 221 (at 64 502 -> 543:
// q4_K keeps its rows there); tg b32 q8_0 3,528 -> 4,203 tok/s, q4_K 2,836 -> 2,970.
// zero (n_zero floats, a multiple of 4, 16-byte aligned): the output of a split-K product after it, which adds its
// halves there (after the wait: the kernels before may still read it).
// chunk > 0: the copy in chunks of that many blocks, each the chunk's quants [block][token][32] then its scales (q4_K:
// with the sums) at fq, fs unused: a stage of the staged and streamed kernels is then one contiguous run to copy (where
// the flat copy is two, the quants and the scales, and each 16-byte word needs a test of which and its own address).
__global__ void mma_acts_kernel(const int8_t *xq, const float *xs, const float *xsum, int64_t n_in, int64_t T, int T8,
                                int8_t *fq, float *fs, float *zero, int64_t n_zero, int chunk) {
    pdl_trigger();  // the product may start loading its weights
    pdl_wait();
    const int64_t nb = n_in / 32, i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;  // i: block kb, token t
    for (int64_t z = i; z < n_zero / 4; z += (int64_t)gridDim.x * blockDim.x)
        ((float4 *)zero)[z] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (i >= nb * T8) return;
    const int64_t kb = i / T8, t = min(i % T8, T - 1), src = t * nb + kb;
    const int per = xsum ? 2 : 1;  // floats a (block, token)
    int64_t at = i;                // the (block, token)'s place among its run's
    if (chunk > 0) {
        const int64_t run = (int64_t)chunk * T8, base = kb / chunk * run * (32 + 4 * per);
        at = i % run;
        fq += base;
        fs = (float *)(fq + run * 32);
    }
    const int4 *q = (const int4 *)(xq + t * n_in + kb * 32);
    int4 *dst = (int4 *)(fq + at * 32);
    dst[0] = __ldg(q);
    dst[1] = __ldg(q + 1);
    if (xsum) {
        fs[2 * at] = __ldg(xs + src);
        fs[2 * at + 1] = __ldg(xsum + src);
    } else {
        fs[at] = __ldg(xs + src);
    }
}

// On unless DFL_CUDA_MMA_XT=0 (the rows, for comparisons in one run).
bool mma_xt_on() {
    static const bool on = env_switch("DFL_CUDA_MMA_XT", true);
    return on;
}

// H100 12-06 04:3x, kernel bench (graph replays, one call), chunked against flat: the q4_K stream's layer at 8 / 16 /
// 32 tokens qwen3-8b 72.8 / 93.5 / 127.5 -> 73.5 / 92.7 / 124.8 us, the 27B 115.1 / 151.7 / 228.6 -> 114.0 / 146.1 /
// 215.8 (the stage's copies ~120 -> ~30 instructions a thread); q8_0 even (8B 89.9 / 95.9 / 109.6 -> 91.5 / 96.7 /
// 108.5, 27B 167.1 / 176.9 / 199.2 -> 167.4 / 176.6 / 197.3): chunked by default for q4_K alone.
static int64_t mma_chunk_mode() {
    static const int64_t m = env_int("DFL_CUDA_MMA_CHUNK", 2);
    return m;
}
bool mma_chunk_q4k() { return mma_chunk_mode() != 0; }
bool mma_chunk_q8p() { return mma_chunk_mode() == 1; }

// On unless DFL_CUDA_STREAM_HALVES=0. Why: qwen3-8b's 4096-row q4_K products (128 tiles on 264 blocks) streamed
// through slots and a summing launch, and at 25-32 tokens lost to the register kernel, whose 254 registers leave one
// block (8 warps) an SM; halves are two blocks a tile, four stages each for the o. H100 12-06 05:0x (one job): the
// 8B's q4_K layer at 8 / 16 / 24 / 32 tokens 73.4 / 92.4 / 112.7 / 122.6 -> 67.7 / 85.9 / 106.7 / 121.6 us (119.3
// with DFL_CUDA_Q4K_STREAM_UNITS=0), tg b8 / b32 2,141 / 5,575 -> 2,221 / 5,687 tok/s (5,730 with UNITS=0); q8_0 even
// (1,887 / 6,269 -> 1,902 / 6,248).
bool stream_halves_on() {
    static const bool on = env_switch("DFL_CUDA_STREAM_HALVES", true);
    return on;
}

// Zeroes n_zero floats at zero (a multiple of 4, 16-byte aligned) as mma_acts does for a split product's output, with
// no copy (mma_acts' DFL_CUDA_SKIP_OPS=mma_acts path).
static void mma_zero(CudaDevice &dev, float *zero, int64_t n_zero) {
    if (n_zero <= 0) return;
    launch_pdl(mma_acts_kernel, std::min(grid_for(n_zero / 4, 256), 1024u), 256, dev.stream(), (const int8_t *)nullptr,
               (const float *)nullptr, (const float *)nullptr, int64_t(0), int64_t(1), 8, (int8_t *)nullptr,
               (float *)nullptr, zero, n_zero, 0);
    check_launch("matmul (zeroed output)");
}

MmaX mma_acts(CudaDevice &dev, const int8_t *xq, const float *xs, const float *xsum, int64_t n_in, int64_t T, float *zero,
              int64_t n_zero, int chunk, const CudaDevice::QuantX *staged) {
    if (!mma_xt_on()) return MmaX{xq, xs, xsum, 0};
    const int T8 = (int)((T + 7) / 8 * 8);
    const int64_t nb = n_in / 32;
    if (chunk > 0 && nb % chunk != 0) chunk = 0;
    // the op before wrote this very copy (CudaDevice::stage_rows): only the output to zero, if any
    if (staged && staged->fq && staged->xq == xq && !xsum && chunk == 0 && staged->rows == T && staged->n == n_in &&
        staged->T8 == T8) {
        mma_zero(dev, zero, n_zero);
        return MmaX{staged->fq, staged->fs, nullptr, T8};
    }
    const size_t q_bytes = round256((size_t)(nb * T8 * 32)), s_bytes = (size_t)(nb * T8) * (xsum ? 8 : 4);
    uint8_t *p = (uint8_t *)dev.mma_buffer(q_bytes + s_bytes);  // (chunked: nb T8 (32 + 4 or 8) bytes, no more)
    // the grid covers the output to zero too: sized for the copy alone (nb T8 / 256: 10 blocks for the 27B's 5120
    // inputs at 16 tokens) it zeroed gate|up's 2.2 MB in ~8 us (H100 12-06 00:5x, stream-K's first run)
    const unsigned blocks = std::max(grid_for(nb * T8, 256), std::min(grid_for(n_zero / 4, 256), 1024u));
    // DFL_CUDA_SKIP_OPS=mma_acts: no copy (garbage out), the output zeroed alone: what the copy costs inside a
    // replayed step
    if (skip_op("mma_acts"))
        mma_zero(dev, zero, n_zero);
    else
        launch_pdl(mma_acts_kernel, blocks, 256, dev.stream(), xq, xs, xsum, n_in, T, T8, (int8_t *)p,
                   (float *)(p + q_bytes), zero, n_zero, chunk);
    check_launch("matmul (int8 mma activations)");
    if (chunk > 0) return MmaX{(const int8_t *)p, (const float *)(p + (size_t)chunk * T8 * 32), nullptr, T8, chunk};
    return MmaX{(const int8_t *)p, (const float *)(p + q_bytes), nullptr, T8};
}

// Whether 2..64-token products on repacked q8_0 and on q4_K run on int8 tensor cores (gemv_q8p_mma_kernel,
// gemv_q4k_mma_kernel): on unless DFL_CUDA_I8_MMA=0 (the dp4a and f16 kernels then, for comparisons in one run).
static bool i8_mma_on() {
    static const bool on = env_switch("DFL_CUDA_I8_MMA", true);
    return on;
}

int64_t i8_mma_max_tokens() { return i8_mma_on() ? kI8MmaMaxTokens : 0; }

// 2 (every batch on the tensor cores) unless DFL_CUDA_Q4K_MMA_MIN says otherwise (3..9: the dp4a kernel below it, for
// comparisons in one run).
int64_t q4k_mma_min_tokens() {
    static const int64_t n = std::min<int64_t>(9, std::max<int64_t>(2, env_int("DFL_CUDA_Q4K_MMA_MIN", 2)));
    return n;
}

// launch_stream_slots's kernel: rows of 32-row tiles, G stages a tile, units over blocks as mma_stream_kernel's grid.
__global__ void stream_slots_kernel(const float *slots, int64_t n_out, int64_t T, int64_t G, int64_t units,
                                    int64_t blocks, float *Y) {
    pdl_trigger();
    pdl_wait();
    const int64_t count = n_out * T;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t pieces = stream_pieces(i % n_out / 32, G, units, blocks);
        if (pieces < 2) continue;
        float v = slots[i];
        for (int64_t k = 1; k < pieces; k++) v += slots[k * count + i];
        Y[i] = v;
    }
}

void launch_stream_slots(CudaDevice &dev, const StreamPlan &p, const float *slots, int64_t n_out, int64_t T, float *Y) {
    launch_chain(stream_slots_kernel, dim3(grid_for(p.count, 256)), dim3(256), 0, dev.stream(), slots, n_out, T, p.groups,
                 p.units, p.blocks, Y);
    check_launch("matmul (stream-K pieces)");
}

}  // namespace cuda
}  // namespace dfl
