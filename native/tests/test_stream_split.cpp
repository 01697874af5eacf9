// core/stream_split.h: every unit in exactly one share, a unit's block found from its index, and no tile cut in more
// pieces than the slots a product allocates (a piece past them would write outside the buffer).
#include "core/stream_split.h"
#include "test.h"

namespace dfltest {

TEST(stream_split_shares_cover_units_once_and_pieces_fit_the_slots) {
    struct Case {
        int64_t tiles, G, blocks;
    };
    // the 27B's products at two blocks an SM of an H100 (gate|up, qkv|z|b|a, o, down), and shares shorter than a tile,
    // equal to one, and a grid with as many units as blocks
    for (const Case &c : {Case{1088, 10, 264}, Case{515, 10, 264}, Case{160, 12, 264}, Case{160, 34, 264},
                          Case{32, 32, 264}, Case{7, 3, 5}, Case{66, 8, 264}, Case{264, 1, 264}, Case{13, 7, 13}}) {
        const int64_t units = c.tiles * c.G;
        int64_t covered = 0;
        for (int64_t b = 0; b < c.blocks; b++) {
            const int64_t u0 = units * b / c.blocks, u1 = units * (b + 1) / c.blocks;
            CHECK(u1 > u0);
            for (int64_t u = u0; u < u1; u++) CHECK(dfl::stream_block_of(u, units, c.blocks) == b);
            covered += u1 - u0;
        }
        CHECK(covered == units);
        const int64_t most = dfl::stream_most_pieces(c.G, units, c.blocks);
        int64_t worst = 0;
        for (int64_t t = 0; t < c.tiles; t++) {
            const int64_t pieces = dfl::stream_pieces(t, c.G, units, c.blocks);
            CHECK(pieces >= 1);
            worst = pieces > worst ? pieces : worst;
        }
        CHECK(worst <= most);
        // with at least as many tiles as blocks no tile has more than two pieces (added onto a zeroed output)
        if (c.tiles >= c.blocks) CHECK(worst <= 2);
    }
}

TEST(stream_split_halves_cut_every_tile_in_two) {
    struct Case {
        int64_t tiles, G;
    };
    // qwen3-8b's 4096-row o (8 stages a row) and down (24), a grid of one tile, and a tile per multiprocessor
    for (const Case &c : {Case{128, 8}, Case{128, 24}, Case{1, 2}, Case{132, 12}}) {
        const int64_t blocks = dfl::stream_halves_blocks(c.tiles, c.G, 132);
        CHECK(blocks == 2 * c.tiles);
        const int64_t units = c.tiles * c.G;
        for (int64_t t = 0; t < c.tiles; t++) CHECK(dfl::stream_pieces(t, c.G, units, blocks) == 2);
    }
    CHECK(dfl::stream_halves_blocks(133, 8, 132) == 0);  // more tiles than multiprocessors: slots
    CHECK(dfl::stream_halves_blocks(128, 9, 132) == 0);  // a tile of odd stages does not halve
}

}  // namespace dfltest
