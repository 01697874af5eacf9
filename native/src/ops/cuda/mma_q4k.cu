// Products of 2..64 tokens on q4_K on int8 tensor cores (mma.sync m16n8k32), on the file's own layout.
#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/cuda_device.h"
#include "ops/cuda/mma_int8.cuh"
#include "ops/cuda/mma_stream.cuh"

namespace dfl {
namespace cuda {

// A q4_K sub-block's m16n8k32 sums c onto a C fragment e: rows g (scale dsc0, minimum dm0) and g + 8 (dsc1, dm1), tokens
// 2 t4 (activation scale s0, block sum m0) and 2 t4 + 1 (s1, m1). Two fused multiply-adds onto each sum: written as
// e += c x - m y the compiler adds the difference to it, a multiply and an add more an entry (a tenth of the stream
// kernel's instructions at 32 tokens).
__device__ __forceinline__ void q4k_mma_acc(float (&e)[4], const int (&c)[4], float dsc0, float dsc1, float dm0,
                                            float dm1, float s0, float m0, float s1, float m1) {
    e[0] = fmaf(-dm0, m0, fmaf((float)c[0], dsc0 * s0, e[0]));
    e[1] = fmaf(-dm0, m1, fmaf((float)c[1], dsc0 * s1, e[1]));
    e[2] = fmaf(-dm1, m0, fmaf((float)c[2], dsc1 * s0, e[2]));
    e[3] = fmaf(-dm1, m1, fmaf((float)c[3], dsc1 * s1, e[3]));
}

// One warp's q4_K super-block sb of its rows: the 16-byte header and 8 bytes of each of the four 32-byte quant chunks
// per row half.
template <int MT>
struct Q4kStage {
    uint4 hdr[MT][2];
    uint2 q[MT][2][4];
    // sub-block s's scale (d sc) and minimum (dmin m) for each row half
    __device__ __forceinline__ void sub_scales(int s, float (&dsc)[MT][2], float (&dm)[MT][2]) const {
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                int sc, m;
                q4k_scale_min_hdr(hdr[mt][h], s, sc, m);
                dsc[mt][h] = half_bits_to_f32((uint16_t)(hdr[mt][h].x & 0xFFFF)) * (float)sc;
                dm[mt][h] = half_bits_to_f32((uint16_t)(hdr[mt][h].x >> 16)) * (float)m;
            }
    }
    // acc (row tile mt, 8 tokens) += sub-block s against the tokens' fragment b: s0, m0 the scale and block sum of the
    // lane's first C token, s1, m1 of its second
    __device__ __forceinline__ void mma_sub(float (&acc)[4], int mt, int s, uint2 b, const float (&dsc)[MT][2],
                                            const float (&dm)[MT][2], float s0, float m0, float s1, float m1) const {
        const int j = s >> 1, shift = 4 * (s & 1);
        int c[4];
        mma_s8_16x8x32(c, (q[mt][0][j].x >> shift) & 0x0F0F0F0F, (q[mt][1][j].x >> shift) & 0x0F0F0F0F,
                       (q[mt][0][j].y >> shift) & 0x0F0F0F0F, (q[mt][1][j].y >> shift) & 0x0F0F0F0F, b.x, b.y);
        q4k_mma_acc(acc, c, dsc[mt][0], dsc[mt][1], dm[mt][0], dm[mt][1], s0, m0, s1, m1);
    }
    __device__ __forceinline__ void load(const uint8_t *const (&wrow)[MT][2], int64_t sb, int t4) {
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const uint8_t *blk = wrow[mt][h] + sb * kQ4_KBytes;
                hdr[mt][h] = __ldg((const uint4 *)blk);
#pragma unroll
                for (int j = 0; j < 4; j++) q[mt][h][j] = __ldg((const uint2 *)(blk + 16 + 32 * j) + t4);
            }
    }
};

template <int MT, int NT8, bool XT>
__global__ void __launch_bounds__(kMmaWarps * 32) gemv_q4k_mma_kernel(const uint8_t *W, uint64_t row_bytes, int64_t n_in,
                                                                    int64_t n_out, const int8_t *xq, const float *xs,
                                                                    const float *xsum, int64_t T, int T8, float *Y) {
    __shared__ float red[kMmaWarps][NT8 * 4][32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t4 = lane & 3;
    const int64_t nsb = n_in / QK_K, nb = n_in / 32, row0 = (int64_t)blockIdx.x * 16 * MT;
    const uint8_t *wrow[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int h = 0; h < 2; h++) wrow[mt][h] = W + (uint64_t)min(row0 + 16 * mt + 8 * h + g, n_out - 1) * row_bytes;
    const MmaTokens<NT8> tok(T, n_in, nb, g, t4);
    float acc[MT][NT8][4] = {};
    Q4kStage<MT> cur, nxt;
    if (warp < nsb) cur.load(wrow, warp, t4);
    pdl_wait();  // (launch_pdl) as gemv_q8p_mma_kernel
    for (int64_t sb = warp; sb < nsb; sb += kMmaWarps) {
        if (sb + kMmaWarps < nsb) nxt.load(wrow, sb + kMmaWarps, t4);
        // the next sub-block's activations are loaded ahead where the registers allow it (small tiles)
        constexpr bool kAhead = MT * NT8 <= 4;
        MmaActs<NT8, true> xa[kAhead ? 2 : 1];
        if (kAhead) xa[0].template load<XT>(tok, xq, xs, xsum, sb * 8, g, t4, T8);
#pragma unroll
        for (int s = 0; s < 8; s++) {
            const int64_t kb = sb * 8 + s;
            if (!kAhead)
                xa[0].template load<XT>(tok, xq, xs, xsum, kb, g, t4, T8);
            else if (s + 1 < 8)
                xa[(s + 1) & 1].template load<XT>(tok, xq, xs, xsum, kb + 1, g, t4, T8);
            const MmaActs<NT8, true> &x = xa[kAhead ? s & 1 : 0];
            float dsc[MT][2], dm[MT][2];
            cur.sub_scales(s, dsc, dm);
#pragma unroll
            for (int nt = 0; nt < NT8; nt++)
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
                    cur.mma_sub(acc[mt][nt], mt, s, x.b[nt], dsc, dm, x.s[nt][0], x.m[nt][0], x.s[nt][1], x.m[nt][1]);
        }
        cur = nxt;
    }
    mma_store<MT, NT8>(red, acc, row0, n_out, T, Y);
}

// q4_K as mma_stream_kernel's format (the default for 2..32 tokens): a stage is two super-blocks (512 inputs) of the tile's
// rows as in the file (144 bytes each: rows of 288 bytes, 32 past a multiple of 128, so a half-warp's 8-byte quant
// loads fall in distinct banks) and their fragment-ordered activations (scale and block sum a token); warp w multiplies
// sub-block w of each super-block. The register kernel above reads every block's activations from L2 in each warp
// and keeps two super-blocks of weights in flight a warp: at 32 tokens a qwen3-8b layer (109 MB) took 136.9 us, 0.8
// TB/s (H200 12-03), where the staged q8_0 kernel reads 2+.
//
// A stage's 512 sub-block scales and minimums (32 rows, two super-blocks, eight sub-blocks) are decoded by the block,
// two a thread, into a table in the stage before its products (prepare), where each warp decoded its sub-block's of
// every row (a header load and ~12 instructions a row half and super-block): H100 12-06 02:3x, the 27B layer at 8 /
// 16 / 24 / 32 tokens 132.1 / 158.9 / 197.8 / 224.2 -> 116.0 / 151.6 / 190.9 / 214.1 us, qwen3-8b q4_K tg b8 1,985
// -> 2,145 tok/s. The kernel stays issue-bound (ncu at 32 tokens: 0.68 instructions issued a cycle a scheduler, 3.7
// warps each, DRAM 32 % busy).
template <int MT, int NT8>
struct Q4kStream {
    static constexpr int kMT = MT, kNT8 = NT8, kSb = 2, kRow = kSb * kQ4_KBytes;
    static constexpr int kXq = kSb * 8 * 8 * NT8 * 32;  // the stage's 16 blocks of 32, 8 NT8 tokens each
    static constexpr int kXs = kSb * 8 * 8 * NT8 * 8;   // their scale and sum
    // the decoded table: (d sc, dmin m) of [super-block][row][sub-block], rows of 9 pairs (a row a lane g: 18 g mod 32
    // puts the 8 rows a warp reads in distinct banks)
    static constexpr int kPairs = 9, kTable = kSb * 16 * MT * kPairs * 8;
    static constexpr int kWBytes = 16 * MT * kRow, kStage = kWBytes + kXq + kXs + kTable;
    static constexpr bool kPrepare = true;
    static_assert(kRow % 128 == 32, "the quant loads' banks");
    static_assert(16 * MT * kSb * 4 == kMmaWarps * 32, "a thread decodes two sub-blocks");
    static_assert(kSb * 8 == kStageBlocks, "a stage is a chunk of mma_acts' copy");
    const uint8_t *W;
    uint64_t row_bytes;
    int64_t n_in;
    const int8_t *fq;
    const float *fs;
    bool chunked;  // fq in chunks of a stage (MmaX::chunk)
    __device__ __forceinline__ int64_t groups() const { return n_in / (kSb * QK_K); }

    // A thread's share of a stage's copies, its addresses worked out once a tile.
    struct Copies {
        static constexpr int kThreads = kMmaWarps * 32, kWords = kRow / 16, kW = 16 * MT * kWords;
        static constexpr int kWPer = (kW + kThreads - 1) / kThreads, kX = (kXq + kXs) / 16;
        static constexpr int kXPer = (kX + kThreads - 1) / kThreads;
        const uint8_t *w[kWPer];  // stage 0's source of the thread's weight words
        unsigned w_at[kWPer];     // and their offsets in a stage
        const int8_t *fq;
        const float *fs;
        bool chunked;
        __device__ __forceinline__ Copies(const uint8_t *W, uint64_t row_bytes, int64_t n_out, int64_t row0,
                                          const int8_t *fq_, const float *fs_, bool chunked_)
            : fq(fq_), fs(fs_), chunked(chunked_) {
#pragma unroll
            for (int k = 0; k < kWPer; k++) {
                const int c = min((int)threadIdx.x + k * kThreads, kW - 1);  // (past kW: never copied)
                const int r = c / kWords, col = c % kWords;
                w[k] = W + (uint64_t)min(row0 + r, n_out - 1) * row_bytes + col * 16;
                w_at[k] = (unsigned)(r * kRow + col * 16);
            }
        }
        __device__ __forceinline__ void load_w(unsigned st, int64_t j) const {
#pragma unroll
            for (int k = 0; k < kWPer; k++)
                if ((int)threadIdx.x + k * kThreads < kW) cp_async16_at(st + w_at[k], w[k] + j * kRow);
        }
        // stage j's activations: contiguous in the fragment-ordered copy (quants, then scales and sums); chunked,
        // both in one run, as the stage holds them
        __device__ __forceinline__ void load_x(unsigned st, int64_t j) const {
            if (chunked) {
                cp_async_run<kX, kThreads>(st + kWBytes, (const uint8_t *)fq + j * (kXq + kXs));
                return;
            }
            const int8_t *q = fq + j * kXq;
            const float *sc = fs + j * (kXs / 4);
#pragma unroll
            for (int k = 0; k < kXPer; k++) {
                const int c = (int)threadIdx.x + k * kThreads;
                if (c < kXq / 16)
                    cp_async16_at(st + kWBytes + c * 16, q + c * 16);
                else if (c < kX)
                    cp_async16_at(st + kWBytes + c * 16, sc + (c - kXq / 16) * 4);
            }
        }
    };
    __device__ __forceinline__ Copies copies(int64_t row0, int64_t n_out) const {
        return Copies(W, row_bytes, n_out, row0, fq, fs, chunked);
    }

    // the table's row of super-block u, row r of the tile: its (d sc, dmin m) by sub-block
    __device__ __forceinline__ static float2 *table_row(uint8_t *st, int u, int r) {
        return (float2 *)(st + kStage - kTable) + (u * 16 * MT + r) * kPairs;
    }

    // thread t decodes sub-blocks 2 (t % 4) and the next of super-block t / 4 % 2 of row t / 8 into the table
    __device__ __forceinline__ static void prepare(uint8_t *st) {
        const int t = threadIdx.x, r = t >> 3, u = (t >> 2) & 1, s = 2 * (t & 3);
        const uint4 hdr = *(const uint4 *)(st + r * kRow + u * kQ4_KBytes);
        const float d = half_bits_to_f32((uint16_t)(hdr.x & 0xFFFF)), dmin = half_bits_to_f32((uint16_t)(hdr.x >> 16));
        float2 *row = table_row(st, u, r);
#pragma unroll
        for (int k = 0; k < 2; k++) {
            int sc, m;
            q4k_scale_min_hdr(hdr, s + k, sc, m);
            row[s + k] = make_float2(d * (float)sc, dmin * (float)m);
        }
    }

    __device__ __forceinline__ static void mma(uint8_t *st, float (&acc)[MT][NT8][4]) {
        const int lane = threadIdx.x & 31, s = threadIdx.x >> 5, g = lane >> 2, t4 = lane & 3;
        const int8_t *xq = (const int8_t *)(st + kWBytes);
        const float *xs = (const float *)(st + kWBytes + kXq);
        const int shift = 4 * (s & 1);
#pragma unroll
        for (int u = 0; u < kSb; u++) {
            float dsc[MT][2], dm[MT][2];
            uint32_t a[MT][2][2];
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int r = 16 * mt + 8 * h + g;
                    const uint8_t *blk = st + r * kRow + u * kQ4_KBytes;
                    const float2 t = table_row(st, u, r)[s];
                    dsc[mt][h] = t.x;
                    dm[mt][h] = t.y;
                    const uint2 q = *(const uint2 *)(blk + 16 + 32 * (s >> 1) + 8 * t4);
                    a[mt][h][0] = (q.x >> shift) & 0x0F0F0F0F;
                    a[mt][h][1] = (q.y >> shift) & 0x0F0F0F0F;
                }
            const int kb = 8 * u + s;  // the block of 32 in the stage
#pragma unroll
            for (int nt = 0; nt < NT8; nt++) {
                const int tk = kb * 8 * NT8 + 8 * nt;
                const uint2 b = *(const uint2 *)(xq + (tk + g) * 32 + 8 * t4);
                const float4 v = *(const float4 *)(xs + 2 * (tk + 2 * t4));  // scale, sum of token 2 t4; of the next
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    int c[4];
                    mma_s8_16x8x32(c, a[mt][0][0], a[mt][1][0], a[mt][0][1], a[mt][1][1], b.x, b.y);
                    q4k_mma_acc(acc[mt][nt], c, dsc[mt][0], dsc[mt][1], dm[mt][0], dm[mt][1], v.x, v.y, v.z, v.w);
                }
            }
        }
    }
};

// Whether q4_K products of 2..32 tokens stream (mma_stream_kernel on Q4kStream) where it applies: on unless
// DFL_CUDA_Q4K_STREAM=0 (the register kernel below). H100 12-06 00:5x, kernel bench of the 27B layer as graph replays:
// 175.3 / 204.4 / 250.3 / 292.3 -> 134.4 / 173.4 / 218.5 / 246.5 us at 8 / 16 / 24 / 32 tokens, every matrix faster.
static bool q4k_stream_on() {
    static const bool on = env_switch("DFL_CUDA_Q4K_STREAM", true);
    return on;
}

// Units (row tile, stage) a block a product of 25..32 tokens needs to stream (DFL_CUDA_Q4K_STREAM_UNITS, default 0:
// any); fewer go to the register kernel (its 32-row tiles at 32 tokens). Why a knob: qwen3-8b q4_K tg b32 ran faster
// on the register kernel (5,365 against 5,245 tok/s, H100 12-06 02:3x) while every 27B matrix streamed faster; the
// 8B's o, q|k|v and down (4096 rows: 3.9, 5.8 and 11.6 units a block of the 264) were mostly pipeline fill and slots,
// and 12 units won (5,311-5,359 -> 5,516 tok/s, 12-06 03:3x). Since stream-K halves (stream_halves_on) those grids
// need no slots, and streaming them all wins again: the 8B layer at 32 tokens 121.6 (12) -> 119.3 us (0), tg b32
// 5,687 -> 5,730 tok/s (H100 12-06 05:0x, one job).
static int64_t q4k_stream_units() {
    static const int64_t u = env_int("DFL_CUDA_Q4K_STREAM_UNITS", 0);
    return u;
}

// The stream-K product of T tokens, true where it applies (stream_plan).
static bool launch_q4k_stream(CudaDevice &dev, const Weight &W, const CudaDevice::QuantX &qx, int64_t T, float *Y) {
    if (!q4k_stream_on() || !mma_xt_on()) return false;
    const StreamPlan p = stream_plan(dev, W.n_in, 2 * QK_K, W.n_out, T, Y);
    if (!p.ok || (T > 24 && p.units < q4k_stream_units() * p.blocks)) return false;
    stream_product(
        dev, p, qx, qx.xsum, W.n_in, W.n_out, T, Y, mma_chunk_q4k(),
        [&](auto nt8, const MmaX &x) {
            return Q4kStream<2, decltype(nt8)::value>{W.data, W.row_bytes, W.n_in, x.xq, x.xs, x.chunk > 0};
        },
        "matmul (q4_K stream-K int8 mma)");
    return true;
}

static bool q4k_mt2_32() {
    static const bool on = env_switch("DFL_CUDA_Q4K_MT2_32", true);
    return on;
}

bool q4k_mma_ok(const Weight &W) {
    return W.type == DFL_TYPE_Q4_K && W.n_in % QK_K == 0 && W.row_bytes % 16 == 0 && ((uintptr_t)W.data & 15) == 0;
}

void launch_gemv_q4k_mma(CudaDevice &dev, const Weight &W, const float *X, int64_t T, float *Y) {
    const CudaDevice::QuantX qx = quantize_x(dev, X, W.n_in, T, true);
    if (launch_q4k_stream(dev, W, qx, T, Y)) return;
    const int8_t *xq = qx.xq;
    const float *xs = qx.xs;
    const float *xsum = qx.xsum;
    cudaStream_t s = dev.stream();
    const MmaX x = T <= 32 ? mma_acts(dev, xq, xs, xsum, W.n_in, T) : MmaX{xq, xs, xsum, 0};
    auto launch = [&](dim3 grid, auto mt, auto nt8) {
        constexpr int MT = decltype(mt)::value, NT8 = decltype(nt8)::value;
        if (x.T8)
            launch_pdl(gemv_q4k_mma_kernel<MT, NT8, true>, grid, dim3(kMmaWarps * 32), s, W.data, W.row_bytes, W.n_in,
                       W.n_out, x.xq, x.xs, nullptr, T, x.T8, Y);
        else
            launch_pdl(gemv_q4k_mma_kernel<MT, NT8, false>, grid, dim3(kMmaWarps * 32), s, W.data, W.row_bytes, W.n_in,
                       W.n_out, x.xq, x.xs, x.xsum, T, 0, Y);
    };
    // 32-row tiles up to 32 tokens on the fragment-ordered copy (24 with DFL_CUDA_Q4K_MT2_32=0, or on the rows, where
    // 32 x 32 spilled): each activation load serves 32 rows instead of 16. H200, 12-03 21:06, one call: qwen3-8b layer
    // at 32 tokens 215.8 -> 136.9 us, tg b32 q4_K 2,988 -> 4,107 tok/s (llama.cpp 3,082).
    if (q4k_mt2_32() && x.T8)
        dispatch_mma<4>(dev, W.n_out, T, launch);
    else
        dispatch_mma<3>(dev, W.n_out, T, launch);
    check_launch("matmul (q4_K int8 mma)");
}

}  // namespace cuda
}  // namespace dfl
