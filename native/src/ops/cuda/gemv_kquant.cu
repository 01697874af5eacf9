// q4_K and q6_K products on int8 activations (quantize_x, gemv_int8.cu) by dp4a, each on its own layout: q4_K one
// token (and the DeepSeek V4 experts' z batches, the routed gate and up in one launch), q6_K 1..8 tokens; q4_K's
// kernel also folds the residual and the next norm (launch_q4k_fold). 2..64 tokens of q4_K: mma_q4k.cu.

#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/cuda_device.h"
#include "ops/cuda/gemv_int8.cuh"

namespace dfl {
namespace cuda {

// The two nibble dot products of a lane's quants word: its 16 low nibbles (sub-block 2c) against xa, its 16 high
// nibbles (sub-block 2c + 1) against xb.
__device__ __forceinline__ void q4k_nibble_dots(const uint4 &q, const int4 &xa, const int4 &xb, int &lo, int &hi) {
    const int qw[4] = {(int)q.x, (int)q.y, (int)q.z, (int)q.w};
    lo = __dp4a(qw[0] & 0x0F0F0F0F, xa.x, 0);
    lo = __dp4a(qw[1] & 0x0F0F0F0F, xa.y, lo);
    lo = __dp4a(qw[2] & 0x0F0F0F0F, xa.z, lo);
    lo = __dp4a(qw[3] & 0x0F0F0F0F, xa.w, lo);
    hi = __dp4a((qw[0] >> 4) & 0x0F0F0F0F, xb.x, 0);
    hi = __dp4a((qw[1] >> 4) & 0x0F0F0F0F, xb.y, hi);
    hi = __dp4a((qw[2] >> 4) & 0x0F0F0F0F, xb.z, hi);
    hi = __dp4a((qw[3] >> 4) & 0x0F0F0F0F, xb.w, hi);
}

// Lane p's part of super-block b of a q4_K row against one token's int8 activations (x: its quants, scales and block
// sums): w.x = d sc (q . xq) xs - dmin m xsum per sub-block of 32, the minimum term once per sub-block (by the lane of
// the first half).
__device__ __forceinline__ float q4k_lane_dot(const Q4KLane &l, int64_t b, int p, const int8_t *xq, const float *xs,
                                              const float *xsum) {
    const int c = p >> 1, half = p & 1;
    const int64_t s1 = b * 8 + 2 * c, s2 = s1 + 1;  // the two sub-blocks' indices among the row's blocks of 32
    const int64_t e0 = b * QK_K + 64 * c + 16 * half;
    const int4 xa = ld_act((const int4 *)(xq + e0));
    const int4 xb = ld_act((const int4 *)(xq + e0 + 32));
    int lo, hi;
    q4k_nibble_dots(l.q, xa, xb, lo, hi);
    float v = l.d * ((float)l.sc1 * ld_act(xs + s1) * (float)lo + (float)l.sc2 * ld_act(xs + s2) * (float)hi);
    if (half == 0) v -= l.dmin * ((float)l.m1 * ld_act(xsum + s1) + (float)l.m2 * ld_act(xsum + s2));
    return v;
}

// Member k of a z batch of one-token q4_K products (GemvZ): its stack (the second from z.second), its expert's rows,
// its input row of the quantized batch and its output.
__device__ __forceinline__ void q4k_z_member(int64_t k, const GemvZ &z, uint64_t row_bytes, int64_t n_in,
                                             const uint8_t *&W, float *&Y, const int8_t *&xq, const float *&xs,
                                             const float *&xsum) {
    const int64_t nb32 = n_in / 32;
    if (z.w2 && k >= z.second) {
        k -= z.second;
        W = z.w2;
        Y = z.y2;
    }
    if (z.ids) pdl_wait();  // the expert ids are the kernel before's output
    const int64_t e = z.ids ? (int64_t)z.ids[k] : k;
    W += (uint64_t)(e * z.w_rows) * row_bytes;
    const int64_t xi = k / z.x_div;
    xq += xi * n_in;
    xs += xi * nb32;
    xsum += xi * nb32;
    Y += k * z.y_stride;
}

// q4_K on int8 activations: the layout of gemv_q4_K_kernel (eight lanes per 144-byte super-block, each lane one
// 16-byte load: 16 low nibbles of sub-block 2c and 16 high nibbles of sub-block 2c + 1), the products by dp4a on the
// nibbles and the activations' int8 words: w.x = d sc (q . xq) xs - dmin m xsum per sub-block of 32, the minimum term
// once per sub-block (by the lane of the first half). One token per z member (GemvZ) or NT tokens. (Loading the lane's
// first super-block before the PDL wait, as gemv_q8p_kernel does, lost on the H200: tg b1 qwen3-8b q4_K 377 -> 350
// tok/s, 12-03 22:12; two rows a warp, their super-blocks loaded together, lost on an H100: the 27B layer's q4_K at one
// token 93.6 -> 95.6 us, 12-06 02:3x; a row's first 16 super-blocks copied into shared memory by cp.async before the
// wait, as gemv_q8p_ahead_kernel does, lost on an H100: tg b1 qwen3-8b q4_K 2.84 / 2.86 -> 3.24 / 3.28 ms a step, 12-06
// 15:1x, with twelve blocks an SM at 40 registers.)
// in / FOLD (one token): as gemv_q8p_ahead_kernel's (a fold before: the norm's scale; FOLD: the group fold of its
// rows for the product after, Y not stored).
template <int NT, bool FOLD = false>
__global__ void __launch_bounds__(kQ8pWarps * 32) gemv_q4k_i8_kernel(const uint8_t *W, uint64_t row_bytes, int64_t n_in,
                                                                   int64_t n_out, const int8_t *xq, const float *xs,
                                                                   const float *xsum, float *Y, GemvZ z, RmsFold in,
                                                                   NormFold out) {
    const int64_t nb32 = n_in / 32;
    q4k_z_member(blockIdx.y, z, row_bytes, n_in, W, Y, xq, xs, xsum);
    const int lane = threadIdx.x & 31, p = lane & 7;
    const int64_t r = (int64_t)blockIdx.x * kQ8pWarps + (threadIdx.x >> 5);
    if (r >= n_out) return;
    const uint8_t *row = W + (uint64_t)r * row_bytes;
    const int64_t nb = n_in / QK_K;
    pdl_wait();  // (launch_pdl) the activations are the kernel before's
    float acc[NT] = {};
#pragma unroll 2
    for (int64_t b = lane >> 3; b < nb; b += 4) {
        const Q4KLane l = q4k_lane(row + b * kQ4_KBytes, p);
#pragma unroll
        for (int t = 0; t < NT; t++) acc[t] += q4k_lane_dot(l, b, p, xq + t * n_in, xs + t * nb32, xsum + t * nb32);
    }
    const float scale = in.parts ? fold_scale(in, lane) : 1.0f;
    if (FOLD) {
        pdl_trigger();
        const float v[1] = {warp_sum(acc[0]) * scale};
        norm_fold_group<1>(out, v, r, lane, (int64_t)blockIdx.x * kQ8pWarps, 32 / kQ8pWarps);
        return;
    }
    store_warp_rows<NT>(acc, Y, n_out, r, scale);
}

// The z batch's members (one token each) with R consecutive rows a warp: each super-block step loads the R rows'
// words together and the token's activations once for them. Each warp's ids read, PDL wait and sums amortised over
// R rows, the grid R times smaller (V4's routed down at one token: 6,144 blocks of four 1,152-byte rows, ~1.5 TB/s
// alone, H100 12-07 12:5x). The same terms in the same order as gemv_q4k_i8_kernel<1>. n_out % (4 R)
// == 0 (launch_gemv_q4k_i8 picks R so).
template <int R>
__global__ void __launch_bounds__(kQ8pWarps * 32) gemv_q4k_i8_rows_z_kernel(const uint8_t *W, uint64_t row_bytes,
                                                                          int64_t n_in, int64_t n_out, const int8_t *xq,
                                                                          const float *xs, const float *xsum, float *Y,
                                                                          GemvZ z) {
    q4k_z_member(blockIdx.y, z, row_bytes, n_in, W, Y, xq, xs, xsum);
    const int lane = threadIdx.x & 31, p = lane & 7;
    const int64_t r0 = ((int64_t)blockIdx.x * kQ8pWarps + (threadIdx.x >> 5)) * R;
    const uint8_t *row = W + (uint64_t)r0 * row_bytes;
    const int64_t nb = n_in / QK_K;
    pdl_wait();  // (launch_pdl) the activations are the kernel before's
    float acc[R] = {};
    const int c = p >> 1, half = p & 1;
    for (int64_t b = lane >> 3; b < nb; b += 4) {
        Q4KLane l[R];
#pragma unroll
        for (int j = 0; j < R; j++) l[j] = q4k_lane(row + (uint64_t)j * row_bytes + b * kQ4_KBytes, p);
        // the token's activations once for the R rows (q4k_lane_dot's)
        const int64_t s1 = b * 8 + 2 * c, s2 = s1 + 1, e0 = b * QK_K + 64 * c + 16 * half;
        const int4 xa = ld_act((const int4 *)(xq + e0)), xb = ld_act((const int4 *)(xq + e0 + 32));
        const float xs1 = ld_act(xs + s1), xs2 = ld_act(xs + s2);
        const float xm1 = half == 0 ? ld_act(xsum + s1) : 0.0f, xm2 = half == 0 ? ld_act(xsum + s2) : 0.0f;
#pragma unroll
        for (int j = 0; j < R; j++) {
            int lo, hi;
            q4k_nibble_dots(l[j].q, xa, xb, lo, hi);
            float v = l[j].d * ((float)l[j].sc1 * xs1 * (float)lo + (float)l[j].sc2 * xs2 * (float)hi);
            if (half == 0) v -= l[j].dmin * ((float)l[j].m1 * xm1 + (float)l[j].m2 * xm2);
            acc[j] += v;
        }
    }
    pdl_trigger();
#pragma unroll
    for (int j = 0; j < R; j++) {
        const float v = warp_sum(acc[j]);
        if (lane == 0) Y[r0 + j] = v;
    }
}

// Lane p's 6-bit codes of a q6_K super-block assembled four to a word (the low nibble from ql, the two high bits from
// qh, minus 32 byte by byte), quarter k in q[k].
struct Q6KCodes {
    int q[4][2];
};
__device__ __forceinline__ Q6KCodes q6k_codes(const Q6KLane &l) {
    Q6KCodes c;
#pragma unroll
    for (int w = 0; w < 2; w++) {
        const uint32_t la = l.la[w], lb = l.lb[w], hb = l.hb[w];
        c.q[0][w] = (int)__vsub4((la & 0x0F0F0F0F) | ((hb & 0x03030303) << 4), 0x20202020);
        c.q[1][w] = (int)__vsub4((lb & 0x0F0F0F0F) | (((hb >> 2) & 0x03030303) << 4), 0x20202020);
        c.q[2][w] = (int)__vsub4(((la >> 4) & 0x0F0F0F0F) | (((hb >> 4) & 0x03030303) << 4), 0x20202020);
        c.q[3][w] = (int)__vsub4(((lb >> 4) & 0x0F0F0F0F) | (((hb >> 6) & 0x03030303) << 4), 0x20202020);
    }
    return c;
}

// The codes against one token's int8 activations from element e0 (quarter k at e0 + 32 k: its eight positions share
// one 16-element scale ds[k] and one block of 32 activations).
__device__ __forceinline__ float q6k_codes_dot(const Q6KCodes &c, const float (&ds)[4], int64_t e0, const int8_t *xq,
                                               const float *xs) {
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const int64_t e = e0 + 32 * k;
        const int2 xv = ld_act((const int2 *)(xq + e));
        const int dot = __dp4a(c.q[k][1], xv.y, __dp4a(c.q[k][0], xv.x, 0));
        s += ds[k] * ld_act(xs + e / 32) * (float)dot;
    }
    return s;
}

// q6_K on int8 activations: the layout of gemv_q6_K_kernel (eight lanes per 210-byte super-block; lane p takes half
// h = p / 4 and positions l0 = 8 (p % 4) .. l0 + 7 of each of the half's four 32-wide quarters). The 6-bit codes are
// assembled four to a word (the low nibble from ql, the two high bits from qh, minus 32 byte by byte) and multiplied
// with the activations' int8 words by dp4a; a quarter's eight positions share one 16-element scale and one block of
// 32 activations (q6k_lane).
template <int NT>
__global__ void __launch_bounds__(kQ8pWarps * 32) gemv_q6k_i8_kernel(const uint8_t *W, uint64_t row_bytes, int64_t n_in,
                                                                   int64_t n_out, const int8_t *xq, const float *xs,
                                                                   float *Y) {
    const int lane = threadIdx.x & 31, p = lane & 7, h = p >> 2, l0 = 8 * (p & 3);
    const int64_t r = (int64_t)blockIdx.x * kQ8pWarps + (threadIdx.x >> 5);
    if (r >= n_out) return;
    const uint8_t *row = W + (uint64_t)r * row_bytes;
    const int64_t nb = n_in / QK_K, nb32 = n_in / 32;
    pdl_wait();  // (launch_pdl) as gemv_q4k_i8_kernel
    float acc[NT] = {};
#pragma unroll 2
    for (int64_t b = lane >> 3; b < nb; b += 4) {
        const Q6KLane l = q6k_lane(row + b * kQ6_KBytes, p);
        const Q6KCodes q = q6k_codes(l);
        const int64_t e0 = b * QK_K + 128 * h + l0;
#pragma unroll
        for (int t = 0; t < NT; t++) acc[t] += q6k_codes_dot(q, l.ds, e0, xq + t * n_in, xs + t * nb32);
    }
    store_warp_rows<NT>(acc, Y, n_out, r);
}

using QuantX = CudaDevice::QuantX;

// Whether one-token q4_K products (and the z-batched expert pairs) run on int8 activations (gemv_q4k_i8_kernel): on
// unless DFL_CUDA_Q4K_I8=0 (the float GEMV). H200, qwen3-8b layer shapes: 54 us a layer against the float GEMV's 127.
bool q4k_i8_on() {
    static const bool on = env_switch("DFL_CUDA_Q4K_I8", true);
    return on;
}

bool q4k_i8_ok(const Weight &W, const GemvZ &z) {
    if (W.type != DFL_TYPE_Q4_K || W.n_in % QK_K != 0 || W.row_bytes % 16 != 0 || ((uintptr_t)W.data & 15) != 0)
        return false;
    return ((uint64_t)z.w_rows * W.row_bytes) % 16 == 0;
}

// Rows a warp of a z batch's q4_K members (gemv_q4k_i8_rows_z_kernel): 4 where the member's rows are a multiple of the
// block's (DFL_CUDA_MOE_ROWS=2 or 1: fewer; 1 is gemv_q4k_i8_kernel<1>). H100 12-07 16:5x, the 4-layer V4-Flash file,
// alternated twice, ms a step: b1 0.962 / 0.975 -> 0.960 / 0.955 (2: 0.948 / 0.956), b8 2.128 / 2.156 -> 2.129 /
// 2.112 (2: 2.111 / 2.141), b32 5.870 / 5.890 -> 5.214 / 5.255 (2: 5.537 / 5.465).
static int q4k_z_rows(int64_t n_out) {
    static const int r = pow2_knob(env_int("DFL_CUDA_MOE_ROWS", 4), 4);
    return n_out % (kQ8pWarps * r) == 0 ? r : 1;
}

void launch_gemv_q4k_i8(CudaDevice &dev, const Weight &W, const float *X, int64_t T, float *Y, const GemvZ &z, int nz) {
    // T tokens, or nz z members of one token each reading nx distinct inputs (x_stride must be n_in)
    const int64_t nx = nz > 1 ? (nz - 1) / z.x_div + 1 : T;
    if (nz > 1 && z.x_stride != W.n_in) fail(DFL_ERR_INTERNAL, "q4_K int8 z batch: inputs must be consecutive rows");
    const QuantX qx = quantize_x(dev, X, W.n_in, nx, true, nz <= 1 && T == 1);
    const int8_t *xq = qx.xq;
    const float *xs = qx.xs;
    const float *xsum = qx.xsum;
    const RmsFold in = rms_fold(qx);
    const NormFold out;
    cudaStream_t s = dev.stream();
    // a second stack (GemvZ::w2) doubles the members: nz of each
    const dim3 grid((unsigned)((W.n_out + kQ8pWarps - 1) / kQ8pWarps), (unsigned)(z.w2 ? 2 * nz : nz)),
        block(kQ8pWarps * 32);
    const int R = nz > 1 ? q4k_z_rows(W.n_out) : 1;
    if (R > 1) {
        const dim3 gr((unsigned)(W.n_out / (kQ8pWarps * R)), grid.y);
        if (R == 4)
            launch_pdl(gemv_q4k_i8_rows_z_kernel<4>, gr, block, s, W.data, W.row_bytes, W.n_in, W.n_out, xq, xs, xsum, Y, z);
        else
            launch_pdl(gemv_q4k_i8_rows_z_kernel<2>, gr, block, s, W.data, W.row_bytes, W.n_in, W.n_out, xq, xs, xsum, Y, z);
    } else if (nz > 1) {
        launch_pdl(gemv_q4k_i8_kernel<1>, grid, block, s, W.data, W.row_bytes, W.n_in, W.n_out, xq, xs, xsum, Y, z, in,
                   out);
    } else {
        switch (T) {
#define DFL_Q4K_I8(N) \
    case N: launch_pdl(gemv_q4k_i8_kernel<N>, grid, block, s, W.data, W.row_bytes, W.n_in, W.n_out, xq, xs, xsum, Y, z, in, out); break;
            DFL_Q4K_I8(1) DFL_Q4K_I8(2) DFL_Q4K_I8(3) DFL_Q4K_I8(4) DFL_Q4K_I8(5) DFL_Q4K_I8(6) DFL_Q4K_I8(7)
            DFL_Q4K_I8(8)
#undef DFL_Q4K_I8
        default: fail(DFL_ERR_INTERNAL, "q4_K int8 GEMV: more than 8 tokens");
        }
    }
    check_launch("matmul (q4_K int8)");
}

bool launch_gemv_q4k_i8_pair(CudaDevice &dev, const Weight &A, const Weight &B, const float *X, float *Ya, float *Yb,
                             const GemvZ &z, int nz) {
    // DeepSeek V4's routed gate and up in one launch, not two launches and two quantizers (the 12-05 profile: 28 us for
    // both, ~2 TB/s); DFL_CUDA_MOE_PAIR=0: the two
    static const bool on = env_switch("DFL_CUDA_MOE_PAIR", true);
    if (!on || !q4k_i8_on() || nz < 1 || !q4k_i8_ok(A, z) || !q4k_i8_ok(B, z) || A.type != B.type ||
        A.row_bytes != B.row_bytes || A.n_in != B.n_in || z.x_stride != A.n_in || z.w2)
        return false;
    GemvZ zz = z;
    zz.w2 = B.data;
    zz.y2 = Yb;
    zz.second = nz;
    launch_gemv_q4k_i8(dev, A, X, 1, Ya, zz, nz);
    return true;
}

void launch_q4k_fold(CudaDevice &dev, const Weight &W, const CudaDevice::QuantX &qx, const RmsFold &in,
                     const NormFold &out) {
    const int64_t n = W.n_out;
    launch_pdl(gemv_q4k_i8_kernel<1, true>, dim3((unsigned)(n / kQ8pWarps)), dim3(kQ8pWarps * 32), dev.stream(), W.data,
               W.row_bytes, W.n_in, n, qx.xq, qx.xs, qx.xsum, (float *)nullptr, GemvZ{}, in, out);
}

// Whether q6_K products of up to 8 tokens run on int8 activations (gemv_q6k_i8_kernel): on unless DFL_CUDA_Q6K_I8=0 (the
// float GEMV and f16 mmq). H200, qwen3-8b layer shapes: 94 / 120 / 314 us a layer at 1 / 2 / 8 tokens against 110 / 469
// / 469; the q4_K file's q6_K head 228 us a step against about 300.
bool q6k_i8_on() {
    static const bool on = env_switch("DFL_CUDA_Q6K_I8", true);
    return on;
}

bool q6k_i8_ok(const Weight &W) { return W.type == DFL_TYPE_Q6_K && W.n_in % QK_K == 0 && ((uintptr_t)W.data & 1) == 0; }

void launch_gemv_q6k_i8(CudaDevice &dev, const Weight &W, const float *X, int64_t T, float *Y) {
    const QuantX qx = quantize_x(dev, X, W.n_in, T, false);
    const int8_t *xq = qx.xq;
    const float *xs = qx.xs;
    cudaStream_t s = dev.stream();
    const dim3 grid((unsigned)((W.n_out + kQ8pWarps - 1) / kQ8pWarps)), block(kQ8pWarps * 32);
    switch (T) {
#define DFL_Q6K_I8(N) \
    case N: launch_pdl(gemv_q6k_i8_kernel<N>, grid, block, s, W.data, W.row_bytes, W.n_in, W.n_out, xq, xs, Y); break;
        DFL_Q6K_I8(1) DFL_Q6K_I8(2) DFL_Q6K_I8(3) DFL_Q6K_I8(4) DFL_Q6K_I8(5) DFL_Q6K_I8(6) DFL_Q6K_I8(7) DFL_Q6K_I8(8)
#undef DFL_Q6K_I8
    default: fail(DFL_ERR_INTERNAL, "q6_K int8 GEMV: more than 8 tokens");
    }
    check_launch("matmul (q6_K int8)");
}

}  // namespace cuda
}  // namespace dfl
