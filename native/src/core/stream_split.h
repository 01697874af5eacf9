// Stream-K's equal shares (the CUDA products of mma_stream.cuh): a product's units, G stages of each row tile in tile
// order, cut into one contiguous share a block, [units b / blocks, units (b + 1) / blocks). A tile cut between blocks
// comes in pieces, which the kernel stores apart (piece k of a tile in slot k) or adds; this is where a unit's block,
// a tile's pieces and the slots a product needs are worked out, on the host and in the kernels alike.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define DFL_SPLIT_HD __host__ __device__
#else
#define DFL_SPLIT_HD
#endif

namespace dfl {

// The block whose share holds unit (units >= blocks: no share is empty).
DFL_SPLIT_HD inline int64_t stream_block_of(int64_t unit, int64_t units, int64_t blocks) {
    return ((unit + 1) * blocks + units - 1) / units - 1;
}

// The pieces of tile t (G units) among the shares.
DFL_SPLIT_HD inline int64_t stream_pieces(int64_t t, int64_t G, int64_t units, int64_t blocks) {
    return stream_block_of((t + 1) * G - 1, units, blocks) - stream_block_of(t * G, units, blocks) + 1;
}

// At most this many pieces a tile: shares hold at least share = units / blocks units, so a tile of G units holds at most
// (G - 2) / share + 1 starts of shares after its first unit, (G - 2) / share + 2 pieces, which this bounds.
inline int64_t stream_most_pieces(int64_t G, int64_t units, int64_t blocks) {
    const int64_t share = units / blocks;
    return (G + share - 1) / share + 1;
}

// Blocks for a grid of fewer tiles than blocks that cuts every tile in two pieces exactly (added onto a zeroed output:
// deterministic, no slots): two a tile where the tiles fit one a multiprocessor (tiles <= sms) and a tile's G units
// halve; else 0 (slots then).
inline int64_t stream_halves_blocks(int64_t tiles, int64_t G, int64_t sms) {
    return tiles <= sms && G % 2 == 0 ? 2 * tiles : 0;
}

}  // namespace dfl

#undef DFL_SPLIT_HD
