// Device-independent bookkeeping of one model: sequence slots, the paged KV block pool, reservations, and the
// snapshot / record marks that rollback needs. The state the marks refer to lives on the device, with the model.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common.h"

namespace dfl {

struct Seq {
    bool used = false;
    uint32_t len = 0;
    uint32_t reserved = 0;  // tokens the caller asked to hold
    std::vector<int32_t> blocks;
    // snapshot: length (the recurrent state copy is the model's)
    bool snap = false;
    uint32_t snap_len = 0;
    // the last DFL_SEQ_RECORD forward: lengths rec_base .. rec_base + rec_n can be truncated to
    bool rec = false;
    uint32_t rec_base = 0, rec_n = 0;
    // the slot's recurrent state is still the one before that forward (the model replays its records on the next
    // truncation, or before any other use of the slot)
    bool rec_pending = false;
    // the last forward was a tree (forward_tree) not yet resolved (seq_accept_path / truncate / rollback): its tokens
    // are rows rec_base .. rec_base + rec_n in flat order, tree_parents[i] the parent of token i
    bool tree = false;
    std::vector<int32_t> tree_parents;
};

class SeqTable {
public:
    // paged = the model has attention layers (otherwise no KV blocks are handed out).
    void init(uint32_t max_seqs, uint32_t n_blocks, uint32_t block_size, bool paged);

    int32_t alloc();  // DFL_ERR_NO_SEQ when every slot is used
    void free(int32_t s);
    Seq &get(int32_t s);  // DFL_ERR_INVALID for a slot not allocated
    const Seq &get(int32_t s) const;

    uint32_t block_size() const { return block_size_; }
    uint32_t n_blocks() const { return n_blocks_; }
    uint32_t max_seqs() const { return (uint32_t)seqs_.size(); }
    uint32_t free_blocks() const { return (uint32_t)free_.size(); }
    uint32_t free_seqs() const;
    void kv_stats(dfl_kv_stats *out) const;
    uint32_t blocks_for(uint32_t tokens) const { return (tokens + block_size_ - 1) / block_size_; }
    // Blocks sequence q lacks to hold `tokens` tokens.
    uint32_t missing_blocks(const Seq &q, uint32_t tokens) const;

    // Give q blocks for `tokens` tokens (DFL_ERR_NO_KV, changing nothing, when the pool is short).
    void grow(Seq &q, uint32_t tokens);
    // Return blocks past max(len, reserved).
    void trim(Seq &q);
    void reserve(int32_t s, uint32_t tokens);
    // Cut the length and drop marks that no longer hold; the caller restores device state first.
    void set_length(Seq &q, uint32_t n);
    // Mark sequence s's current length as its snapshot (the caller copies its device state) and return it.
    Seq &mark_snapshot(int32_t s);
    // Sequence s, checked to have a snapshot it can roll back to (DFL_ERR_STATE otherwise).
    Seq &snapshot_of(int32_t s);

private:
    bool paged_ = false;
    uint32_t block_size_ = 16, n_blocks_ = 0;
    std::vector<Seq> seqs_;
    std::vector<int32_t> free_;
};

}  // namespace dfl
