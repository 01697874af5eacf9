// tree_schedule (core/tree_order.h): every token once, each starting from the state after its parent, with at most
// kTreeSlots states set aside (fewer for smaller trees), checked by walking the schedule with token ids standing for
// states.
#include <vector>

#include "core/tree_order.h"
#include "test.h"

using namespace dfl;
using namespace dfltest;

namespace {

// Walks a schedule: 0 when every step starts from its token's parent's state and every token runs once.
int walk_errors(const std::vector<int32_t> &parents, const std::vector<int32_t> &steps) {
    const size_t n = parents.size();
    std::vector<int> slots(kTreeSlots, -2), runs(n, 0);
    int cur = -1, errors = 0;  // (-1: the state before the root)
    for (int32_t packed : steps) {
        const TreeStep st = TreeStep::unpack(packed);
        if (st.token < 0 || (size_t)st.token >= n) return 1;
        if (st.restore >= 0) cur = slots[(size_t)st.restore];
        errors += cur != parents[(size_t)st.token];
        runs[(size_t)st.token]++;
        cur = st.token;
        if (st.save >= 0) slots[(size_t)st.save] = cur;
    }
    for (int r : runs) errors += r != 1;
    return errors;
}

// The schedule of a tree, and (slots) the most states it keeps aside at once, as tree_schedule returns it and as the
// first step carries it.
std::vector<int32_t> schedule(const std::vector<int32_t> &parents, int *slots) {
    std::vector<int32_t> steps(parents.size());
    *slots = tree_schedule(parents.data(), (uint32_t)parents.size(), steps.data());
    if (!steps.empty() && *slots >= 0) CHECK(TreeStep::unpack(steps[0]).slots == *slots);
    return steps;
}

}  // namespace

TEST(tree_schedule_shapes) {
    // a chain; a chain with a leaf under each of its first nodes (BenchmarkGGUF's vt tree); a star; full binary trees of
    // 31 and 63 nodes (the 63: every waiting state's subtree half its parent's, the most slots a tree of 64 can need)
    struct Case {
        std::vector<int32_t> parents;
        int slots;
    };
    std::vector<Case> cases;
    std::vector<int32_t> chain(23), spine(23), star(23), binary(31), binary63(63);
    for (int i = 0; i < 23; i++) {
        chain[(size_t)i] = i - 1;
        spine[(size_t)i] = i < 16 ? i - 1 : i - 16;
        star[(size_t)i] = i == 0 ? -1 : 0;
    }
    for (int i = 0; i < 31; i++) binary[(size_t)i] = i == 0 ? -1 : (i - 1) / 2;
    for (int i = 0; i < 63; i++) binary63[(size_t)i] = i == 0 ? -1 : (i - 1) / 2;
    cases.push_back({chain, 0});
    cases.push_back({spine, 1});
    cases.push_back({star, 1});
    cases.push_back({binary, 4});
    cases.push_back({binary63, kTreeSlots});
    for (const Case &c : cases) {
        int slots = -1;
        const std::vector<int32_t> steps = schedule(c.parents, &slots);
        CHECK(slots == c.slots);
        CHECK(walk_errors(c.parents, steps) == 0);
    }
    // a chain needs no slot at all
    int slots = -1;
    for (int32_t s : schedule(chain, &slots)) CHECK(TreeStep::unpack(s).save < 0 && TreeStep::unpack(s).restore < 0);
    // more than 64 tokens: none
    std::vector<int32_t> long_chain(65);
    for (int i = 0; i < 65; i++) long_chain[(size_t)i] = i - 1;
    schedule(long_chain, &slots);
    CHECK(slots == -1);
}

TEST(tree_schedule_random_trees) {
    Rng r(17);
    for (int trial = 0; trial < 2000; trial++) {
        const int n = 1 + (int)(r.next() % 64);
        std::vector<int32_t> p((size_t)n);
        p[0] = -1;
        for (int i = 1; i < n; i++) p[(size_t)i] = (int32_t)(r.next() % (uint64_t)i);
        int slots = -1;
        const std::vector<int32_t> steps = schedule(p, &slots);
        CHECK(slots >= 0 && slots <= (n < 32 ? 4 : kTreeSlots));  // (smaller subtrees first: at most log2 n wait)
        if (slots >= 0) CHECK(walk_errors(p, steps) == 0);
    }
}
