#include "core/seqtable.h"

#include <algorithm>

namespace dfl {

void SeqTable::init(uint32_t max_seqs, uint32_t n_blocks, uint32_t block_size, bool paged) {
    paged_ = paged;
    block_size_ = block_size;
    n_blocks_ = paged ? n_blocks : 0;
    seqs_.assign(max_seqs, Seq{});
    free_.clear();
    free_.reserve(n_blocks_);
    for (uint32_t b = n_blocks_; b > 0; b--) free_.push_back((int32_t)(b - 1));
}

int32_t SeqTable::alloc() {
    for (size_t i = 0; i < seqs_.size(); i++) {
        if (seqs_[i].used) continue;
        seqs_[i] = Seq{};
        seqs_[i].used = true;
        return (int32_t)i;
    }
    fail(DFL_ERR_NO_SEQ, "all " + std::to_string(seqs_.size()) + " sequence slots are in use");
}

void SeqTable::free(int32_t s) {
    Seq &q = get(s);
    for (int32_t b : q.blocks) free_.push_back(b);
    q = Seq{};
}

Seq &SeqTable::get(int32_t s) {
    if (s < 0 || (size_t)s >= seqs_.size() || !seqs_[(size_t)s].used)
        fail(DFL_ERR_INVALID, "sequence " + std::to_string(s) + " is not allocated");
    return seqs_[(size_t)s];
}
const Seq &SeqTable::get(int32_t s) const { return const_cast<SeqTable *>(this)->get(s); }

Seq &SeqTable::mark_snapshot(int32_t s) {
    Seq &q = get(s);
    q.snap = true;
    q.snap_len = q.len;
    return q;
}

Seq &SeqTable::snapshot_of(int32_t s) {
    Seq &q = get(s);
    if (!q.snap) fail(DFL_ERR_STATE, "sequence " + std::to_string(s) + " has no snapshot to roll back to");
    if (q.len < q.snap_len) fail(DFL_ERR_STATE, "sequence " + std::to_string(s) + " is shorter than its snapshot");
    return q;
}

uint32_t SeqTable::free_seqs() const {
    uint32_t n = 0;
    for (const Seq &q : seqs_) n += !q.used;
    return n;
}

void SeqTable::kv_stats(dfl_kv_stats *out) const {
    out->block_size = block_size();
    out->blocks_total = n_blocks();
    out->blocks_free = free_blocks();
    out->seqs_total = max_seqs();
    out->seqs_free = free_seqs();
}

uint32_t SeqTable::missing_blocks(const Seq &q, uint32_t tokens) const {
    if (!paged_) return 0;
    const uint32_t want = blocks_for(tokens);
    return want > q.blocks.size() ? want - (uint32_t)q.blocks.size() : 0;
}

void SeqTable::grow(Seq &q, uint32_t tokens) {
    const uint32_t extra = missing_blocks(q, tokens);
    if (extra == 0) return;
    if (extra > free_.size())
        fail(DFL_ERR_NO_KV, "KV pool exhausted: need " + std::to_string(extra) + " more blocks, " +
                                std::to_string(free_.size()) + " free");
    for (uint32_t i = 0; i < extra; i++) {
        q.blocks.push_back(free_.back());
        free_.pop_back();
    }
}

void SeqTable::trim(Seq &q) {
    const uint32_t keep = blocks_for(std::max(q.len, q.reserved));
    while (q.blocks.size() > keep) {
        free_.push_back(q.blocks.back());
        q.blocks.pop_back();
    }
}

void SeqTable::reserve(int32_t s, uint32_t tokens) {
    Seq &q = get(s);
    grow(q, tokens);
    q.reserved = std::max(q.reserved, tokens);
}

void SeqTable::set_length(Seq &q, uint32_t n) {
    q.len = n;
    if (q.snap && n < q.snap_len) q.snap = false;
    trim(q);
}

}  // namespace dfl
