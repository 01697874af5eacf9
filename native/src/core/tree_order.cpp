#include "core/tree_order.h"

#include <algorithm>
#include <vector>

namespace dfl {

bool tree_schedule(const int32_t *parents, uint32_t n, int32_t *steps) {
    if (n == 0) return true;
    std::vector<std::vector<int>> kids(n);
    for (uint32_t i = 1; i < n; i++) kids[(size_t)parents[i]].push_back((int)i);
    std::vector<int> size(n, 1);
    for (uint32_t i = n; i-- > 1;) size[(size_t)parents[i]] += size[i];
    for (auto &k : kids) std::stable_sort(k.begin(), k.end(), [&](int a, int b) { return size[(size_t)a] < size[(size_t)b]; });

    // an explicit stack of (node, the slot its first step restores from)
    struct Visit {
        int node, restore;
    };
    std::vector<Visit> todo = {{0, -1}};
    std::vector<bool> busy(kTreeSlots, false);
    uint32_t at = 0;
    while (!todo.empty()) {
        const Visit v = todo.back();
        todo.pop_back();
        TreeStep st;
        st.token = v.node;
        st.restore = v.restore;
        // the last restore of a slot frees it (the state is read before this step's save may reuse the slot)
        if (v.restore >= 0 && (todo.empty() || todo.back().restore != v.restore)) busy[(size_t)v.restore] = false;
        const std::vector<int> &k = kids[(size_t)v.node];
        if (k.size() > 1) {
            // the state after this node waits in a slot for every child but the first
            int slot = 0;
            while (slot < kTreeSlots && busy[(size_t)slot]) slot++;
            if (slot == kTreeSlots) return false;
            busy[(size_t)slot] = true;
            st.save = slot;
        }
        steps[at++] = st.pack();
        // children pushed so that the smallest runs first and the largest last; all but the first restore the slot
        for (size_t j = k.size(); j-- > 0;) todo.push_back({k[j], j == 0 ? -1 : st.save});
    }
    return at == n;
}

}  // namespace dfl
