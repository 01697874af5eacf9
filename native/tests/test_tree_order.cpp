// tree_schedule (core/tree_order.h): every token once, each starting from the state after its parent, with at most
// kTreeSlots states set aside, checked by walking the schedule with token ids standing for states.
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

std::vector<int32_t> schedule(const std::vector<int32_t> &parents, bool *ok) {
    std::vector<int32_t> steps(parents.size());
    *ok = tree_schedule(parents.data(), (uint32_t)parents.size(), steps.data());
    return steps;
}

}  // namespace

TEST(tree_schedule_shapes) {
    // a chain; a chain with a leaf under each of its first nodes (BenchmarkGGUF's vt tree); a star; a full binary tree
    std::vector<std::vector<int32_t>> trees;
    std::vector<int32_t> chain(23), spine(23), star(23), binary(31);
    for (int i = 0; i < 23; i++) {
        chain[(size_t)i] = i - 1;
        spine[(size_t)i] = i < 16 ? i - 1 : i - 16;
        star[(size_t)i] = i == 0 ? -1 : 0;
    }
    for (int i = 0; i < 31; i++) binary[(size_t)i] = i == 0 ? -1 : (i - 1) / 2;
    for (const auto &p : {chain, spine, star, binary}) {
        bool ok = false;
        const std::vector<int32_t> steps = schedule(p, &ok);
        CHECK(ok);
        CHECK(walk_errors(p, steps) == 0);
    }
    // a chain needs no slot at all
    bool ok = false;
    for (int32_t s : schedule(chain, &ok)) CHECK(TreeStep::unpack(s).save < 0 && TreeStep::unpack(s).restore < 0);
}

TEST(tree_schedule_random_trees) {
    Rng r(17);
    for (int trial = 0; trial < 2000; trial++) {
        const int n = 1 + (int)(r.next() % 64);
        std::vector<int32_t> p((size_t)n);
        p[0] = -1;
        for (int i = 1; i < n; i++) p[(size_t)i] = (int32_t)(r.next() % (uint64_t)i);
        bool ok = false;
        const std::vector<int32_t> steps = schedule(p, &ok);
        if (n < 32) CHECK(ok);  // (smaller subtrees first: at most log2 n slots wait at once)
        if (ok) CHECK(walk_errors(p, steps) == 0);
    }
}
