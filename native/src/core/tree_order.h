// The order in which a recurrent op can walk a token tree keeping only a few states aside: depth first, a node's
// smaller subtrees before its largest, so that the state after a node waits in one of a handful of slots only while
// its other subtrees run (at most log2 n slots at once, heavy-path style), where the tree's flat order keeps the state
// after every branch point until its last child.
#pragma once

#include <cstdint>

#include "ops/device.h"  // (TreeStep, kTreeSlots: the devices read the steps)

namespace dfl {

// The schedule of a tree of n tokens (parents[i] < i, parents[0] == -1, n <= 64) into steps[0..n): every token once,
// each after its parent, starting from the state after its parent: the previous step's where that step was the parent,
// else the slot it restores. False (steps unspecified) where it would need more than kTreeSlots slots at once.
bool tree_schedule(const int32_t *parents, uint32_t n, int32_t *steps);

}  // namespace dfl
