// The host description of a batch of entries both CUDA op test programs upload to the two devices.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common.h"
#include "core/tree_order.h"
#include "cuda_test.h"
#include "ops/device.h"
#include "test.h"

namespace dfltest {

// Parents of a random n-token tree (a spine with branches).
inline std::vector<int32_t> random_tree(Rng &r, int n) {
    std::vector<int32_t> p((size_t)n);
    p[0] = -1;
    for (int i = 1; i < n; i++) p[(size_t)i] = r.next() % 3 == 0 ? i - 1 : (int32_t)(r.next() % (uint64_t)i);
    return p;
}

// Entries (each a sequence in slot `slot` with len0 cached tokens and n new ones) with KV blocks of block_size tokens
// handed out shuffled, so block tables are not the identity; `spare` unused blocks besides, token ids below
// token_range.
struct Batch {
    struct Ent {
        int32_t n, len0, slot;
        bool record = false;
    };
    std::vector<Ent> ents;
    int block_size;
    int64_t T = 0, max_n = 0, max_ctx = 0;
    int32_t max_blocks = 1, n_blocks = 0, n_slots = 0;
    std::vector<int32_t> tokens, pos, ent, kv_slot, t0, n, len0, slot, block_table;
    std::unique_ptr<Dual> d_tokens, d_pos, d_ent, d_kv_slot, d_t0, d_n, d_len0, d_slot, d_bt;

    Batch(std::vector<Ent> e, int bs, Rng &r, int spare = 3, uint64_t token_range = 100)
        : ents(std::move(e)), block_size(bs) {
        for (const Ent &x : ents) {
            max_n = std::max<int64_t>(max_n, x.n);
            max_ctx = std::max<int64_t>(max_ctx, (int64_t)x.len0 + x.n);
            max_blocks = std::max<int32_t>(max_blocks, (int32_t)dfl::ceil_div((int64_t)x.len0 + x.n, bs));
            n_blocks += (int32_t)dfl::ceil_div((int64_t)x.len0 + x.n, bs);
            n_slots = std::max(n_slots, x.slot + 1);
        }
        n_blocks += spare;
        std::vector<int32_t> ids((size_t)n_blocks);
        for (int32_t i = 0; i < n_blocks; i++) ids[(size_t)i] = i;
        for (int32_t i = n_blocks - 1; i > 0; i--) std::swap(ids[(size_t)i], ids[(size_t)(r.next() % (uint64_t)(i + 1))]);
        block_table.assign(ents.size() * (size_t)max_blocks, 0);
        size_t next = 0;
        for (size_t ei = 0; ei < ents.size(); ei++) {
            const Ent &x = ents[ei];
            const int32_t nb = (int32_t)dfl::ceil_div((int64_t)x.len0 + x.n, bs);
            for (int32_t b = 0; b < nb; b++) block_table[ei * (size_t)max_blocks + (size_t)b] = ids[next++];
            t0.push_back((int32_t)T);
            n.push_back(x.n);
            len0.push_back(x.len0);
            slot.push_back(x.slot);
            for (int32_t i = 0; i < x.n; i++) {
                const int32_t p = x.len0 + i;
                tokens.push_back((int32_t)(r.next() % token_range));
                pos.push_back(p);
                ent.push_back((int32_t)ei);
                kv_slot.push_back(block_table[ei * (size_t)max_blocks + (size_t)(p / bs)] * bs + p % bs);
            }
            T += x.n;
        }
        d_tokens.reset(new Dual(tokens));
        d_pos.reset(new Dual(pos));
        d_ent.reset(new Dual(ent));
        d_kv_slot.reset(new Dual(kv_slot));
        d_t0.reset(new Dual(t0));
        d_n.reset(new Dual(n));
        d_len0.reset(new Dual(len0));
        d_slot.reset(new Dual(slot));
        d_bt.reset(new Dual(block_table));
    }
    int64_t pool_rows() const { return (int64_t)n_blocks * block_size; }
    // Token trees (forward_tree): par[e] the parents of entry e's tokens (empty: an ordinary entry), with their
    // depth-first schedules (BatchMeta::tree_steps, as QwenModel::forward builds them).
    std::unique_ptr<Dual> d_parent, d_vis, d_steps;
    void set_trees(const std::vector<std::vector<int32_t>> &par) {
        std::vector<int32_t> parent, steps;
        std::vector<uint64_t> vis;
        for (size_t ei = 0; ei < ents.size(); ei++) {
            const bool tree = ei < par.size() && !par[ei].empty();
            steps.resize(parent.size() + (size_t)ents[ei].n, 0);
            if (!tree || dfl::tree_schedule(par[ei].data(), (uint32_t)ents[ei].n, steps.data() + parent.size()) < 0)
                steps[parent.size()] = -1;
            for (int32_t i = 0; i < ents[ei].n; i++) {
                parent.push_back(tree ? par[ei][(size_t)i] : i - 1);
                vis.push_back(tree ? (i > 0 ? vis[vis.size() - (size_t)i + (size_t)par[ei][(size_t)i]] : 0) | (uint64_t)1 << i
                                   : ~(uint64_t)0);
            }
        }
        d_parent.reset(new Dual(parent));
        d_vis.reset(new Dual(vis));
        d_steps.reset(new Dual(steps));
    }
    dfl::BatchMeta meta(bool gpu) const {
        dfl::BatchMeta m;
        m.T = T;
        m.n_ent = (int32_t)ents.size();
        m.max_n = max_n;
        m.max_ctx = max_ctx;
        m.tokens = d_tokens->p<int32_t>(gpu);
        m.pos = d_pos->p<int32_t>(gpu);
        m.ent = d_ent->p<int32_t>(gpu);
        m.kv_slot = d_kv_slot->p<int32_t>(gpu);
        m.t0 = d_t0->p<int32_t>(gpu);
        m.n = d_n->p<int32_t>(gpu);
        m.len0 = d_len0->p<int32_t>(gpu);
        m.slot = d_slot->p<int32_t>(gpu);
        m.block_table = d_bt->p<int32_t>(gpu);
        m.max_blocks = max_blocks;
        if (d_parent) {
            m.parent = d_parent->p<int32_t>(gpu);
            m.vis = d_vis->p<uint64_t>(gpu);
            m.tree_steps = d_steps->p<int32_t>(gpu);
        }
        return m;
    }
    std::string str() const {
        std::string s = "T=" + std::to_string(T) + " [";
        for (size_t i = 0; i < ents.size() && i < 4; i++)
            s += (i ? " " : "") + std::to_string(ents[i].len0) + "+" + std::to_string(ents[i].n);
        return s + (ents.size() > 4 ? " ...]" : "]");
    }
};

}  // namespace dfltest
