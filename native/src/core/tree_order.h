// The order in which a recurrent op walks a token tree keeping only a few states aside: depth first, a node's
// smaller subtrees before its largest, so that the state after a node waits in one of a handful of slots only while
// its other subtrees run (heavy-path style: a waiting state's subtree is at most half its parent's, so a tree of at
// most 64 tokens has at most 5 waiting at once, kTreeSlots), where the tree's flat order would keep the state after
// every branch point until its last child.
#pragma once

#include <cstdint>

#include "ops/device.h"  // (TreeStep, kTreeSlots: the devices read the steps)

namespace dfl {

// The schedule of a tree of n tokens (parents[i] < i, parents[0] == -1, n <= 64) into steps[0..n): every token once,
// each after its parent, starting from the state after its parent: the previous step's where that step was the parent,
// else the slot it restores. Returns the most slots it keeps at once (0 for a chain; also in the first step's
// TreeStep::slots), or -1 where n > 64.
int tree_schedule(const int32_t *parents, uint32_t n, int32_t *steps);

}  // namespace dfl
