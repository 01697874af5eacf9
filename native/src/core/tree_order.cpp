#include "core/tree_order.h"

namespace dfl {

// Fixed arrays of a tree's at most 64 tokens: it runs on every tree forward, on the host, before the launch.
int tree_schedule(const int32_t *parents, uint32_t n, int32_t *steps) {
    constexpr uint32_t kMax = 64;
    if (n > kMax) return -1;
    if (n == 0) return 0;
    int size[kMax], first[kMax + 1] = {}, kids[kMax];
    for (uint32_t i = 0; i < n; i++) size[i] = 1;
    for (uint32_t i = n; i-- > 1;) size[parents[i]] += size[i];
    // each node's children in kids[first[u] .. first[u + 1]), by subtree size, smallest first (ties by index)
    for (uint32_t i = 1; i < n; i++) first[parents[i] + 1]++;
    for (uint32_t u = 0; u < n; u++) first[u + 1] += first[u];
    int fill[kMax];
    for (uint32_t u = 0; u < n; u++) fill[u] = first[u];
    for (uint32_t i = 1; i < n; i++) {
        const int u = parents[i];
        int at = fill[u]++;
        for (; at > first[u] && size[kids[at - 1]] > size[i]; at--) kids[at] = kids[at - 1];
        kids[at] = (int)i;
    }

    // an explicit stack of (node, the slot its first step restores from)
    struct Visit {
        int node, restore;
    };
    Visit todo[kMax];
    int depth = 0;
    todo[depth++] = {0, -1};
    bool busy[kTreeSlots] = {};
    int used = 0;
    uint32_t at = 0;
    while (depth > 0) {
        const Visit v = todo[--depth];
        TreeStep st;
        st.token = v.node;
        st.restore = v.restore;
        // the last restore of a slot frees it (the state is read before this step's save may reuse the slot)
        if (v.restore >= 0 && (depth == 0 || todo[depth - 1].restore != v.restore)) busy[v.restore] = false;
        const int k0 = first[v.node], k1 = first[v.node + 1];
        if (k1 - k0 > 1) {
            // the state after this node waits in a slot for every child but the first
            int slot = 0;
            while (slot < kTreeSlots && busy[slot]) slot++;
            if (slot == kTreeSlots) return -1;  // (not for n <= 64: see the header)
            busy[slot] = true;
            st.save = slot;
            used = slot + 1 > used ? slot + 1 : used;
        }
        steps[at++] = st.pack();
        // children pushed so that the smallest runs first and the largest last; all but the first restore the slot
        for (int j = k1; j-- > k0;) todo[depth++] = {kids[j], j == k0 ? -1 : st.save};
    }
    if (at != n) return -1;
    TreeStep first_step = TreeStep::unpack(steps[0]);
    first_step.slots = used;
    steps[0] = first_step.pack();
    return used;
}

}  // namespace dfl
