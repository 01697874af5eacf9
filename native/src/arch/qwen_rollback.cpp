// Rolling a Qwen sequence back after a speculative forward: truncation to a recorded length, the snapshot and its
// rollback, and accepting a root-to-node path of a token tree. Attention layers only move K/V rows (or just the
// length); Gated DeltaNet layers replay the kept tokens' recorded inputs (ensure_record's buffers, written by the
// forward of a DFL_SEQ_RECORD entry or a tree) onto the state before the forward, which the slot kept, and rebuild
// the conv window from the recorded inputs. Until then the sequence's slot lags behind its length (Seq::rec_pending):
// a truncation replays only the tokens it keeps, and anything else that uses the slot settles it first.
#include <algorithm>
#include <string>
#include <vector>

#include "arch/qwen.h"

namespace dfl {

void QwenModel::ensure_record(int32_t s, uint32_t n, bool tree) {
    SeqState &ss = seq_state_[(size_t)s];
    const HParams &h = hp_;
    const uint32_t cap = std::max<uint32_t>(n, 16);
    // of a tree the states its schedule sets aside (a device's working copy of the state is its own)
    if (tree && ss.rec_state.bytes() == 0)
        ss.rec_state = DevBuf(dev_.get(), (size_t)kTreeSlots * n_rec_ * (size_t)h.state_floats() * sizeof(float),
                              "tree record states");
    if (n > ss.rec_cap) {
        ss.rec_window.reset();
        ss.rec_window =
            DevBuf(dev_.get(), (size_t)n_rec_ * (size_t)(h.conv_k - 1 + cap) * h.conv_channels() * sizeof(float), "record windows");
        ss.rec_cap = cap;
    }
    if (n > ss.rec_in_rows) {
        ss.rec_in.reset();
        ss.rec_in = DevBuf(dev_.get(), (size_t)cap * n_rec_ * (size_t)rec_in_row_floats() * sizeof(float), "record inputs");
        ss.rec_in_rows = cap;
    }
}

// The kept k tokens of a recorded forward replayed from the state before it, which the slot kept: one gdn call over
// every recurrent layer (their recorded inputs and slot states each at a fixed stride), in place, one launch.
void QwenModel::replay_records(int32_t s, uint32_t k, const int32_t *path) {
    Seq &q = table_.get(s);
    q.rec_pending = false;
    if (k == 0) return;
    const HParams &h = hp_;
    const SeqState &ss = seq_state_[(size_t)s];
    const int64_t sf = h.state_floats(), C = h.conv_channels(), n = q.rec_n;
    std::vector<int32_t> host = {0, (int32_t)k, s};  // t0, n, slot of a one-entry batch, then the path's rows
    if (path) host.insert(host.end(), path, path + k);
    ensure(replay_meta_, host.size() * sizeof(int32_t), "replay metadata");
    dev_->to_device(replay_meta_.get(), host.data(), host.size() * sizeof(int32_t));
    BatchMeta m;
    m.T = k;
    m.n_ent = 1;
    m.max_n = k;
    m.t0 = replay_meta_.get<int32_t>();
    m.n = m.t0 + 1;
    m.slot = m.t0 + 2;
    const float *in = ss.rec_in.f();
    const GdnRecordLayout rl{n, C, h.n_v};
    GdnCall gc = gdn_call(in + rl.row(0), in + rl.g(0), in + rl.beta(0));
    gc.out = nullptr;
    gc.exact = true;
    gc.layers = n_rec_;
    gc.layer_in = rl.layer(1);
    gc.layer_state = sf;
    if (path) gc.in_rows = m.t0 + 3;
    dev_->gdn(m, gc);
}

// Each recurrent layer's conv state after k tokens of the last recorded forward: window rows k .. k + K - 2, one
// strided copy for all layers.
void QwenModel::restore_conv(int32_t s, uint32_t k) {
    const Seq &q = table_.get(s);
    const int64_t sf = hp_.state_floats(), cf = hp_.conv_floats(), C = hp_.conv_channels();
    const int64_t wrows = hp_.conv_k - 1 + q.rec_n;
    dev_->copy_rows(slot_ptr(s) + n_rec_ * sf, cf, seq_state_[(size_t)s].rec_window.f() + (size_t)k * C, wrows * C, n_rec_,
                    cf);
}

void QwenModel::settle(int32_t s) {
    Seq &q = table_.get(s);
    if (!q.rec_pending) return;
    replay_records(s, q.rec_n);
    restore_conv(s, q.rec_n);
    q.rec = false;  // (the state before is gone: no truncation into the forward's tokens now)
}

void QwenModel::seq_truncate(int32_t s, uint32_t n) {
    Seq &q = table_.get(s);
    if (n > q.len) fail(DFL_ERR_INVALID, "truncate sequence " + std::to_string(s) + " to " + std::to_string(n) +
                                             " tokens: it holds only " + std::to_string(q.len));
    if (n == q.len) {
        if (!q.tree) settle(s);
        return;
    }
    if (q.tree && n >= q.rec_base) {
        // within the tree: only a chain prefix of the flat order is a sequence
        const uint32_t k = n - q.rec_base;
        std::vector<int32_t> path(k);
        for (uint32_t i = 0; i < k; i++) {
            if (q.tree_parents[i] != (int32_t)i - 1)
                fail(DFL_ERR_STATE, "truncate sequence " + std::to_string(s) + " to " + std::to_string(n) +
                                        " tokens: its last forward was a tree whose first " + std::to_string(k) +
                                        " tokens are not a chain (use seq_accept_path)");
            path[i] = (int32_t)i;
        }
        seq_accept_path(s, path.data(), k);
        return;
    }
    if (n_rec_ > 0) {
        if (!q.rec || !q.rec_pending || n < q.rec_base || n > q.rec_base + q.rec_n)
            fail(DFL_ERR_STATE, "truncate sequence " + std::to_string(s) + " to " + std::to_string(n) +
                                    " tokens: its recurrent state was not recorded there (forward with DFL_SEQ_RECORD)");
        const uint32_t k = n - q.rec_base;  // tokens of the recorded forward that stay
        replay_records(s, k);
        restore_conv(s, k);
    }
    q.tree = false;
    table_.set_length(q, n);
}

void QwenModel::seq_snapshot(int32_t s) {
    settle(s);  // (s checked before its state is copied)
    SeqState &ss = seq_state_[(size_t)s];
    const size_t bytes = (size_t)slot_floats() * sizeof(float);
    if (bytes > 0) {
        if (ss.snap.bytes() < bytes) ss.snap = DevBuf(dev_.get(), bytes, "sequence snapshot");
        dev_->copy(ss.snap.get(), slot_ptr(s), bytes);
    }
    table_.mark_snapshot(s);
}

void QwenModel::seq_rollback(int32_t s) {
    Seq &q = table_.snapshot_of(s);
    const size_t bytes = (size_t)slot_floats() * sizeof(float);
    if (bytes > 0) dev_->copy(slot_ptr(s), seq_state_[(size_t)s].snap.get(), bytes);
    q.rec = false;
    q.rec_pending = false;
    q.tree = false;
    table_.set_length(q, q.snap_len);
}

void QwenModel::seq_accept_path(int32_t s, const int32_t *path, uint32_t n) {
    Seq &q = table_.get(s);
    const std::string who = "sequence " + std::to_string(s);
    if (!q.tree) fail(DFL_ERR_STATE, who + ": its last forward was not a tree forward (or its tree was resolved already)");
    if (n > q.rec_n)
        fail(DFL_ERR_STATE, who + ": a path of " + std::to_string(n) + " nodes is longer than the tree (" +
                                std::to_string(q.rec_n) + " tokens)");
    for (uint32_t d = 0; d < n; d++) {
        const int32_t want = d == 0 ? -1 : path[d - 1];
        if (path[d] < 0 || (uint32_t)path[d] >= q.rec_n)
            fail(DFL_ERR_STATE, who + ": path[" + std::to_string(d) + "] = " + std::to_string(path[d]) +
                                    " is not a node of the tree (" + std::to_string(q.rec_n) + " tokens)");
        if (d == 0 && path[0] != 0) fail(DFL_ERR_STATE, who + ": path[0] = " + std::to_string(path[0]) + " is not the root (0)");
        if (q.tree_parents[(size_t)path[d]] != want)
            fail(DFL_ERR_STATE, who + ": path[" + std::to_string(d) + "] = " + std::to_string(path[d]) +
                                    " is not a child of path[" + std::to_string(d - 1) + "] = " + std::to_string(want) +
                                    " (its parent is " + std::to_string(q.tree_parents[(size_t)path[d]]) + ")");
    }
    const uint32_t base = q.rec_base, bs = table_.block_size();
    // K/V: node path[d] (row base + path[d], path[d] >= d) moves to row base + d; rows below d are written only
    // by earlier moves, so no source is overwritten before it is read
    if (n_attn_ > 0) {
        auto row = [&](uint32_t p) { return (uint64_t)q.blocks[p / bs] * bs + p % bs; };
        const uint64_t kb = kv_.k_bytes(), vb = kv_.v_bytes();
        for (uint32_t d = 1; d < n; d++) {
            if ((uint32_t)path[d] == d) continue;
            const uint64_t src = row(base + (uint32_t)path[d]), dst = row(base + d);
            for (int l = 0; l < n_attn_; l++) {
                dev_->copy(kv_.k(l) + dst * kb, kv_.k(l) + src * kb, kb);
                dev_->copy(kv_.v(l) + dst * vb, kv_.v(l) + src * vb, vb);
            }
        }
    }
    if (n_rec_ > 0) {
        const int64_t sf = hp_.state_floats(), cf = hp_.conv_floats(), C = hp_.conv_channels(), K1 = hp_.conv_k - 1;
        const int64_t wrows = K1 + q.rec_n;
        const SeqState &ss = seq_state_[(size_t)s];
        float *slot = slot_ptr(s);
        replay_records(s, n, path);
        // the conv state: the last K-1 inputs along old state rows 0..K-2, then the path's window rows
        std::vector<int64_t> rows;
        for (int64_t r = 0; r < K1; r++) rows.push_back(r);
        for (uint32_t d = 0; d < n; d++) rows.push_back(K1 + path[d]);
        const size_t off = rows.size() - (size_t)K1;
        for (int64_t i = 0; i < K1; i++)  // row i of every layer's conv state in one strided copy
            dev_->copy_rows(slot + n_rec_ * sf + i * C, cf, ss.rec_window.f() + (size_t)rows[off + i] * C, wrows * C, n_rec_,
                            C);
    }
    q.tree = false;
    q.rec = false;
    table_.set_length(q, base + n);
}

}  // namespace dfl
