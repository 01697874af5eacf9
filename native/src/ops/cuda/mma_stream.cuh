// Stream-K for the staged int8 tensor-core products (repacked q8_0 in mma_q8p.cu, q4_K in mma_q4k.cu): a product's
// work as one stream of (row tile, stage) units, tile by tile, cut into one equal share a block for a grid of exactly
// two blocks an SM, each block streaming its share through one cp.async pipeline and storing a tile's sums when it
// leaves it. Why: the 27B's q8_0 products at 16 tokens ran at 2.27 TB/s where one token's ran at 2.67 (H100 12-05
// 22:4x) with the SMs half busy: their grids end in part waves (gate|up 1,088 tiles on 264 slots: 4.12 waves; down 640
// split blocks: 2.42; o 320: 1.21) and every block fills its pipeline from empty (the 6- and 8-way splits that would
// fill the waves lost that again). A tile cut between blocks is added: with at least as many tiles as blocks a tile
// has at most two pieces, added onto the zeroed output (either order gives the same float); with fewer (SLOTS), piece
// k of a tile goes to slot k and launch_stream_slots adds them in order. Deterministic both ways. Measured (H100 12-06
// 00:5x, the 27B layer): the part waves were not the cost of q8_0's gate|up (no gain there), the long rows' pipeline
// fill was (the down 44.1 -> 41.9 us at 16 tokens); q4_K, whose register kernel kept little in flight, gained 15-23 %.
#pragma once

#include <cstdint>
#include <type_traits>

#include "core/stream_split.h"
#include "ops/cuda/cuda_device.h"
#include "ops/cuda/mma_common.cuh"
#include "ops/cuda/mma_int8.cuh"

namespace dfl {
namespace cuda {

// F, a weight format's stage (the kernel's argument): kMT, kNT8 (the tile: 16 kMT rows, 8 kNT8 tokens), kStage (bytes
// a stage in shared memory), groups() (stages a row), copies(row0, n_out) (a Copies whose load_w(at, j) and
// load_x(at, j) copy stage j of the tile at row0 and its activations into the stage at shared address at by cp.async)
// and mma(stage, acc) (a stage's products into a warp's sums); where kPrepare, prepare(stage) first (every thread, a
// barrier after it).
template <class F, int S, bool SLOTS>
__global__ void __launch_bounds__(kMmaWarps * 32, 2)
    mma_stream_kernel(F f, int64_t n_out, int64_t T, float *Y, float *slots, bool early) {
    pdl_early(early);
    constexpr int MT = F::kMT, NT8 = F::kNT8, kStage = F::kStage, kRows = 16 * MT;
    static_assert(sizeof(float) * kMmaWarps * NT8 * 4 * 32 <= kStage, "a stage holds the warps' sums");
    extern __shared__ __align__(16) uint8_t stream_smem[];
    const int64_t G = f.groups(), units = (n_out + kRows - 1) / kRows * G;
    const int64_t u0 = units * blockIdx.x / gridDim.x, n = units * (blockIdx.x + 1) / gridDim.x - u0;
    const unsigned smem0 = (unsigned)__cvta_generic_to_shared(stream_smem);
    // the copies' next unit: tile lt, stage lg
    int64_t lt = u0 / G, lg = u0 % G;
    auto ld = f.copies(lt * kRows, n_out);
    auto next_unit = [&] {
        if (++lg < G) return;
        lg = 0;
        ld = f.copies(++lt * kRows, n_out);
    };
    // the weights of the first stages are read before the wait, the activations (the kernel before's) after
#pragma unroll
    for (int st = 0; st < S - 1; st++)
        if (st < n) {
            ld.load_w(smem0 + st * kStage, lg);
            next_unit();
        }
    pdl_wait();
#pragma unroll
    for (int st = 0; st < S - 1; st++) {
        if (st < n) ld.load_x(smem0 + st * kStage, (u0 + st) % G);
        cp_async_commit();
    }
    float acc[MT][NT8][4] = {};
    int64_t ct = u0 / G, cg = u0 % G;  // the unit being multiplied
    for (int64_t j = 0; j < n; j++) {
        pipe_advance<S>(j, n, [&](int64_t jn) {
            const unsigned at = smem0 + (unsigned)(jn % S) * kStage;
            ld.load_w(at, lg);
            ld.load_x(at, lg);
            next_unit();
        });
        uint8_t *cur = stream_smem + (int)(j % S) * kStage;
        if constexpr (F::kPrepare) {  // the stage's shared part worked out once by the block, then multiplied
            F::prepare(cur);
            __syncthreads();
        }
        F::mma(cur, acc);
        if (++cg < G && j + 1 < n) continue;
        // the tile's piece is done: its sums through the stage's memory, which the next step refills after its barrier
        __syncthreads();
        auto &red = *reinterpret_cast<float(*)[kMmaWarps][NT8 * 4][32]>(cur);
        const int64_t row0 = ct * kRows;
        if (ct * G >= u0 && cg == G) {  // the whole tile is this block's
            mma_store<MT, NT8>(red, acc, row0, n_out, T, Y);
        } else if constexpr (SLOTS) {
            const int64_t k = blockIdx.x - stream_block_of(ct * G, units, gridDim.x);
            mma_store<MT, NT8>(red, acc, row0, n_out, T, slots + k * n_out * T);
        } else {
            mma_store<MT, NT8, true>(red, acc, row0, n_out, T, Y);
        }
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int nt = 0; nt < NT8; nt++)
#pragma unroll
                for (int i = 0; i < 4; i++) acc[mt][nt][i] = 0.0f;
        ct++;
        cg = 0;
    }
}

// A stream-K product's grid: G stages a row of 32-row tiles, one share a block of two an SM; slots where there are
// fewer tiles than blocks (then most pieces a tile at most), else the tiles' pieces are added onto the output, which
// must be zeroed first (count floats at Y, a multiple of 4 and 16-byte aligned: mma_acts_kernel zeroes it). With
// stream_halves_on, a grid of at most one tile an SM takes two blocks a tile, each half of it, added onto the output
// (stream_halves_blocks): no slots and no launch to add them.
struct StreamPlan {
    int64_t groups = 0, units = 0, blocks = 0, most = 1, count = 0;
    bool slots = false, halves = false, ok = false;  // halves: fewer tiles than two blocks an SM, cut in two
};

inline StreamPlan stream_plan(const CudaDevice &dev, int64_t n_in, int64_t stage_inputs, int64_t n_out, int64_t T,
                              const float *Y) {
    StreamPlan p;
    if (T < 1 || T > 32 || n_in % stage_inputs != 0) return p;
    const int64_t tiles = (n_out + 31) / 32;
    p.groups = n_in / stage_inputs;
    p.units = tiles * p.groups;
    p.blocks = 2 * (int64_t)dev.sm_count();
    p.count = n_out * T;
    p.slots = tiles < p.blocks;
    const bool addable = p.count % 4 == 0 && ((uintptr_t)Y & 15) == 0;  // pieces may be added onto a zeroed Y
    if (p.slots && addable && stream_halves_on()) {
        if (const int64_t halves = stream_halves_blocks(tiles, p.groups, dev.sm_count())) {
            p.blocks = halves;
            p.slots = false;
            p.halves = true;
        }
    }
    if (p.units < p.blocks || (!p.slots && !addable)) return p;
    p.most = stream_most_pieces(p.groups, p.units, p.blocks);
    p.ok = true;
    return p;
}

// Y = the slots' pieces of each row added in order, for the rows of tiles cut in two or more (the others' whole sums
// are in Y already): after a stream-K product with slots (mma_int8.cu).
void launch_stream_slots(CudaDevice &dev, const StreamPlan &p, const float *slots, int64_t n_out, int64_t T, float *Y);

// The kernel of F at S stages with the plan's grid, then the slots' sums where it has slots.
template <class F, int S>
void launch_stream(CudaDevice &dev, const F &f, const StreamPlan &p, int64_t n_out, int64_t T, float *Y, float *slots,
                   const char *what) {
    static_assert(F::kMT == 2, "stream_plan's tiles are 32 rows");
    const size_t smem = (size_t)S * F::kStage;
    auto go = [&](auto with_slots) {
        constexpr bool SLOTS = decltype(with_slots)::value;
        allow_dynamic_smem<mma_stream_kernel<F, S, SLOTS>>(dev.index(), smem, what);
        launch_maybe_pdl(true, mma_stream_kernel<F, S, SLOTS>, dim3((unsigned)p.blocks), dim3(kMmaWarps * 32), smem,
                         dev.stream(), f, n_out, T, Y, slots, pdl_early_for(dev, p.blocks));
    };
    if (p.slots)
        go(std::true_type{});
    else
        go(std::false_type{});
    check_launch(what);
    if (p.slots) launch_stream_slots(dev, p, slots, n_out, T, Y);
}

// A stream-K product of T tokens on the plan p: the activations' fragment-ordered copy (zeroing Y where pieces are added
// onto it; chunked: in chunks of a stage, mma_acts), the slots where it has them, then the format make(nt8, x)
// returns for the tile of T tokens (std::integral_constant nt8, 1..4) at 4 stages up to 16 tokens and 3 beyond (two
// blocks an SM in shared memory).
template <class Make>
void stream_product(CudaDevice &dev, const StreamPlan &p, const CudaDevice::QuantX &qx, const float *xsum, int64_t n_in,
                    int64_t n_out, int64_t T, float *Y, bool chunked, Make &&make, const char *what) {
    const MmaX x = mma_acts(dev, qx.xq, qx.xs, xsum, n_in, T, p.slots ? nullptr : Y, p.slots ? 0 : p.count,
                            chunked ? kStageBlocks : 0, &qx);
    float *slots = p.slots ? (float *)dev.splitk_buffer((size_t)(p.most * p.count) * sizeof(float)) : nullptr;
    auto launch = [&](dim3, auto, auto nt8) {
        constexpr int S = decltype(nt8)::value <= 2 ? 4 : 3;
        const auto f = make(nt8, x);
        launch_stream<std::decay_t<decltype(f)>, S>(dev, f, p, n_out, T, Y, slots, what);
    };
    launch_nt8<2, 4>((int)((T + 7) / 8), dim3(), launch);
}

}  // namespace cuda
}  // namespace dfl
