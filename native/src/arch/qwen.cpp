#include "arch/qwen.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

#include "arch/hparams.h"
#include "core/batch.h"
#include "core/sized.h"
#include "core/tree_order.h"
#include "quant.h"
#include "rope.h"

namespace dfl {

namespace {

// Most tokens of one sequence in a step replayed from a device graph (a DFlash block is 16, a DDTree up to ~24), and
// most hidden-state capture layers (their ids go into the graph key, 8 bits each after 8 bits of flags).
constexpr int64_t kGraphMaxTokens = 32;
constexpr uint32_t kGraphMaxCaptures = 7;

}  // namespace

QwenModel::QwenModel(const dfl_model_params &p, std::unique_ptr<Device> dev)
    : dev_(std::move(dev)) {
    hp_ = qwen_hparams(p);
    n_threads_ = (uint32_t)threads_of(p);
    check_cache_types(p.cache_type_k, p.cache_type_v);
    const uint32_t block_size = kv_block_size_of(p);
    load_weights(p);
    const uint32_t n_blocks = n_attn_ > 0 ? (uint32_t)ceil_div(p.kv_pool_tokens, block_size) : 0;
    kv_.init(dev_.get(), p.cache_type_k, p.cache_type_v, n_attn_, (uint64_t)n_blocks * block_size, hp_.n_kv, hp_.head_dim,
             (int)block_size, "KV pool");
    if (n_attn_ > 0 && n_blocks == 0) fail(DFL_ERR_INVALID, "kv_pool_tokens must be at least 1");
    table_.init(p.max_seqs, n_blocks, block_size, n_attn_ > 0);
    states_ = DevBuf(dev_.get(), (size_t)p.max_seqs * (size_t)slot_floats() * sizeof(float), "recurrent state");
    if (states_.bytes()) dev_->zero(states_.get(), states_.bytes());
    seq_state_.resize(p.max_seqs);
    const std::vector<float> inv = rope_inv_freq(hp_.theta, hp_.rope_dim);
    inv_freq_ = w_.floats(inv, "rope frequencies");
    ensure_acts(16);
}

void QwenModel::info(dfl_model_info *out) const {
    dfl_model_info i;
    std::memset(&i, 0, sizeof i);
    i.struct_size = sizeof i;
    std::snprintf(i.arch, sizeof i.arch, "%s", hp_.arch.c_str());
    i.n_layer = (uint32_t)hp_.n_layer;
    i.n_embd = (uint32_t)hp_.n_embd;
    i.n_vocab = (uint32_t)hp_.n_vocab;
    i.n_ctx_train = (uint32_t)hp_.n_ctx_train;
    i.n_head = (uint32_t)hp_.n_head;
    i.n_head_kv = (uint32_t)hp_.n_kv;
    i.head_dim = (uint32_t)hp_.head_dim;
    i.n_ff = (uint32_t)hp_.n_ff;
    i.n_attn_layers = (uint32_t)n_attn_;
    i.n_recurrent_layers = (uint32_t)n_rec_;
    i.kv_block_size = table_.block_size();
    i.kv_blocks_total = table_.n_blocks();
    i.max_seqs = table_.max_seqs();
    i.cache_type_k = kv_.type_k();
    i.cache_type_v = kv_.type_v();
    i.n_threads = n_threads_;
    i.kv_bytes_per_token = kv_.bytes_per_token();
    i.state_bytes_per_seq = (uint64_t)slot_floats() * sizeof(float);
    i.weight_bytes = w_.bytes();
    i.rms_eps = hp_.eps;
    i.rope_theta = hp_.theta;
    i.rope_dim = (uint32_t)hp_.rope_dim;
    write_sized(out, i);
}

void QwenModel::kv_stats(dfl_kv_stats *out) const { table_.kv_stats(out); }

int32_t QwenModel::seq_alloc() {
    const int32_t s = table_.alloc();
    if (slot_floats() > 0) dev_->zero(slot_ptr(s), (size_t)slot_floats() * sizeof(float));
    return s;
}

void QwenModel::seq_free(int32_t s) { table_.free(s); }

void QwenModel::seq_reserve(int32_t s, uint32_t n_tokens) { table_.reserve(s, n_tokens); }

uint32_t QwenModel::seq_length(int32_t s) const { return table_.get(s).len; }

// ---------------------------------------------------------------------------------------------------------------------

void QwenModel::ensure_acts(int64_t T) {
    if (T <= acts_.cap) return;
    const int64_t cap = std::max<int64_t>(T, acts_.cap * 2);
    graphs_.drop(*dev_);
    const HParams &h = hp_;
    const size_t f = sizeof(float);
    Acts &a = acts_;
    a = Acts{};  // release the old set first: peak memory is one set
    auto mk = [&](DevBuf &b, int64_t per_token, const char *what) {
        if (per_token > 0) b = DevBuf(dev_.get(), (size_t)(cap * per_token) * f, what);
    };
    const int64_t H = h.n_embd;
    mk(a.x, H, "activations");
    mk(a.xn, H, "activations");
    mk(a.mix, H, "activations");
    mk(a.ff_g, h.n_ff, "activations");
    mk(a.ff_u, h.n_ff, "activations");
    if (dev_->copies_weights()) {
        int64_t widest = 2 * (int64_t)h.n_ff;
        if (n_attn_ > 0) widest = std::max<int64_t>(widest, (int64_t)h.n_head * h.head_dim * (h.gated_attn ? 2 : 1) + 2 * (int64_t)h.n_kv * h.head_dim);
        if (n_rec_ > 0) widest = std::max<int64_t>(widest, (int64_t)h.conv_channels() + (int64_t)h.n_v * h.dv + 2 * h.n_v);
        // the fused products run for at most kFusedMaxTokens tokens
        a.fused = DevBuf(dev_.get(), (size_t)(std::min<int64_t>(cap, kFusedMaxTokens) * widest) * f, "activations");
    }
    if (n_attn_ > 0) {
        const int64_t qd = (int64_t)h.n_head * h.head_dim, kvd = (int64_t)h.n_kv * h.head_dim;
        mk(a.qf, qd * (h.gated_attn ? 2 : 1), "activations");
        mk(a.kf, kvd, "activations");
        mk(a.vf, kvd, "activations");
        mk(a.Q, qd, "activations");
        if (h.gated_attn) mk(a.gate, qd, "activations");
        mk(a.attn, qd, "activations");
    }
    if (n_rec_ > 0) {
        const int64_t vd = (int64_t)h.n_v * h.dv;
        mk(a.qkv, h.conv_channels(), "activations");
        mk(a.cv, h.conv_channels(), "activations");
        mk(a.z, vd, "activations");
        mk(a.core, vd, "activations");
        mk(a.bb, h.n_v, "activations");
        mk(a.aa, h.n_v, "activations");
        mk(a.beta, h.n_v, "activations");
        mk(a.g, h.n_v, "activations");
    }
    a.cap = cap;
}

QwenModel::OutProj QwenModel::attn_layer(const Layer &L, const BatchMeta &m, int64_t T) {
    const HParams &h = hp_;
    Acts &a = acts_;
    const std::vector<RowsView> qkv =
        project_views(*dev_, L.in_proj, {{&L.wq, a.qf.f()}, {&L.wk, a.kf.f()}, {&L.wv, a.vf.f()}}, a.xn.f(), T, a.fused.f());

    const KVLayer kv = kv_.layer(L.kv_index);

    AttnPrep p;
    p.qf = qkv[0].p;
    p.kf = qkv[1].p;
    p.vf = qkv[2].p;
    p.q_stride = qkv[0].stride;
    p.k_stride = qkv[1].stride;
    p.v_stride = qkv[2].stride;
    p.q_norm = L.q_norm;
    p.k_norm = L.k_norm;
    p.inv_freq = inv_freq_;
    p.n_head = h.n_head;
    p.rope_dim = h.rope_dim;
    p.gated = h.gated_attn;
    p.eps = h.eps;
    p.Q = a.Q.f();
    p.gate = h.gated_attn ? a.gate.f() : nullptr;
    p.kv = kv;
    dev_->attn_prep(m, p);

    AttnCall c;
    c.Q = a.Q.f();
    c.out = a.attn.f();
    c.n_head = h.n_head;
    c.scale = 1.0f / std::sqrt((float)h.head_dim);
    c.kv = kv;
    dev_->attention(m, c);
    const int64_t qd = (int64_t)h.n_head * h.head_dim;
    if (h.gated_attn) dev_->sigmoid_mul(a.attn.f(), a.gate.f(), T * qd);
    return OutProj{&L.wo, a.attn.f()};
}

GdnCall QwenModel::gdn_call(const float *cv, const float *g, const float *beta) const {
    GdnCall gc = dfl::gdn_call(cv, (int)hp_.conv_channels(), hp_.n_k, hp_.n_v, hp_.dk, hp_.dv, g, beta);
    gc.state = states_.f();
    gc.slot_stride = slot_floats();
    gc.n_rec = n_rec_;
    return gc;
}

QwenModel::OutProj QwenModel::gdn_layer(const Layer &L, const BatchMeta &m, int64_t T) {
    const HParams &h = hp_;
    Acts &a = acts_;
    const int C = h.conv_channels();
    const int64_t sf = h.state_floats(), cf = h.conv_floats();
    ConvCall cc;  // (x: the projection's qkv rows, below)
    cc.out = a.cv.f();
    cc.w = L.conv_w;
    cc.C = C;
    cc.K = h.conv_k;
    cc.conv = states_.f() + n_rec_ * sf + L.rec_index * cf;
    cc.slot_stride = slot_floats();
    cc.rec_layer = L.rec_index;
    cc.n_rec = n_rec_;
    // the fused projection continues into the conv (its first C rows are the conv's input), the parts' products each
    // before it
    bool conv_done = false;
    const std::vector<RowsView> in = project_views(
        *dev_, L.in_proj, {{&L.wqkv, a.qkv.f()}, {&L.wz, a.z.f()}, {&L.wb, a.bb.f()}, {&L.wa, a.aa.f()}}, a.xn.f(), T,
        a.fused.f(), [&](const float *x, float *y) {
            dev_->matmul_conv1d_silu(L.in_proj, x, T, y, m, cc);
            conv_done = true;
        });
    if (!conv_done) {
        cc.x = in[0].p;
        cc.x_stride = in[0].stride;
        dev_->conv1d_silu(m, cc);
    }

    GdnGates gg;
    gg.cv = a.cv.f();
    gg.C = C;
    gg.n_k = h.n_k;
    gg.dk = h.dk;
    gg.n_v = h.n_v;
    gg.b = in[2].p;
    gg.a = in[3].p;
    gg.b_stride = in[2].stride;
    gg.a_stride = in[3].stride;
    gg.ssm_a = L.ssm_a;
    gg.dt_bias = L.dt_bias;
    gg.beta = a.beta.f();
    gg.g = a.g.f();

    GdnCall gc = gdn_call(a.cv.f(), a.g.f(), a.beta.f());
    gc.out = a.core.f();
    gc.state += L.rec_index * sf;
    gc.rec_layer = L.rec_index;
    gc.rec_inputs = recording_;  // the recording entries' inputs, for a rollback to replay
    dev_->gdn_gates(T, gg);
    dev_->gdn(m, gc);
    dev_->gated_rmsnorm(a.core.f(), in[1].p, in[1].stride, L.ssm_norm, T, h.n_v, h.dv, h.eps);
    return OutProj{&L.wout, a.core.f()};
}

// The whole model on a prepared batch: embeddings, layers, captures, and the logits rows into logits_.
void QwenModel::run_layers(const BatchMeta &m, const dfl_batch &b, int64_t rows, const int32_t *d_out_rows) {
    const HParams &h = hp_;
    Acts &a = acts_;
    const int64_t T = m.T, H = h.n_embd;
    dev_->embed(tok_embd_, m.tokens, T, a.x.f());
    if (h.n_layer > 0) dev_->rmsnorm(a.x.f(), layers_[0].attn_norm, a.xn.f(), T, H, h.eps);
    // the last captured layer: after it the captures go to the host (beside the layers after it, on the side lane)
    const int32_t last_capture =
        b.n_capture > 0 ? *std::max_element(b.capture_layers, b.capture_layers + b.n_capture) : -1;
    for (int il = 0; il < h.n_layer; il++) {
        const Layer &L = layers_[(size_t)il];
        const OutProj o = L.attn ? attn_layer(L, m, T) : gdn_layer(L, m, T);
        // the one product after each norm: the fused weight where there is one (else several read xn)
        auto reader = [](const Weight &fused) { return fused.empty() ? nullptr : &fused; };
        dev_->matmul_add_rmsnorm(*o.W, o.in, T, a.mix.f(), a.x.f(), L.post_norm, a.xn.f(), h.eps, reader(L.gate_up));
        const std::vector<RowsView> gu =
            project_views(*dev_, L.gate_up, {{&L.ffn_gate, a.ff_g.f()}, {&L.ffn_up, a.ff_u.f()}}, a.xn.f(), T, a.fused.f());
        dev_->swiglu_rows(a.ff_g.f(), gu[0].p, gu[1].p, T, h.n_ff, gu[0].stride);
        // the residual add and the next layer's input norm in one pass (the same sums as the two ops apart); where
        // this layer is captured, the capture's copy comes between the norm and its product: no fold (next unknown)
        const bool captured = std::find(b.capture_layers, b.capture_layers + b.n_capture, il) != b.capture_layers + b.n_capture;
        if (il + 1 < h.n_layer) {
            const Layer &next = layers_[(size_t)il + 1];
            dev_->matmul_add_rmsnorm(L.ffn_down, a.ff_g.f(), T, a.mix.f(), a.x.f(), next.attn_norm, a.xn.f(), h.eps,
                                     captured ? nullptr : reader(next.in_proj));
        } else {
            dev_->matmul(L.ffn_down, a.ff_g.f(), T, a.mix.f());
            dev_->add(a.x.f(), a.mix.f(), T * H);
        }
        for (uint32_t c = 0; c < b.n_capture; c++)
            if (b.capture_layers[c] == il)
                dev_->copy_rows(capture_.f() + (int64_t)c * H, (int64_t)b.n_capture * H, a.x.f(), H, T, H);
        if (il == last_capture && capture_landing_) {
            dev_->side_begin();
            dev_->to_host_async(capture_landing_, capture_.get(), (size_t)T * b.n_capture * H * sizeof(float));
            dev_->side_end();
        }
    }
    if (rows > 0) {
        // the normed rows of the logits go through xn, free by now
        dev_->gather_rows(a.x.f(), d_out_rows, rows, H, a.xn.f());
        dev_->rmsnorm(a.xn.f(), output_norm_, a.xn.f(), rows, H, h.eps);
        dev_->matmul(output_, a.xn.f(), rows, logits_.f());
    }
}

// A forward's n floats of captures into the caller's batch.capture, or kept for captures() where that is null: the
// landing itself when the device downloaded them there (no copy), else capture_host_. rows: the logits rows the
// forward downloaded (a download waited for the landing's queued copy already).
void QwenModel::land_captures(const dfl_batch &b, uint64_t n, int64_t rows) {
    const size_t bytes = n * sizeof(float);
    if (capture_landing_) {
        if (rows == 0) dev_->sync();
        if (b.capture)
            std::memcpy(b.capture, capture_landing_, bytes);
        else
            capture_kept_ = capture_landing_;
    } else {
        float *dst = b.capture;
        if (!dst) {
            capture_host_.resize(n);
            dst = capture_host_.data();
            capture_kept_ = dst;
        }
        dev_->to_host(dst, capture_.get(), bytes);
    }
    if (capture_kept_) capture_kept_n_ = n;
}

const float *QwenModel::captures(uint64_t *n_floats) const {
    if (!capture_kept_) return Model::captures(n_floats);
    *n_floats = capture_kept_n_;
    return capture_kept_;
}

void QwenModel::forward_tree(const dfl_batch &b, const TopKOut *topk, const int32_t *const *parents) {
    const HParams &h = hp_;
    logits_rows_ = 0;  // (set when this forward has left its rows)
    capture_kept_ = nullptr, capture_kept_n_ = 0;
    if (b.n_seqs == 0) return;
    if (!b.seqs) fail(DFL_ERR_INVALID, "batch: seqs is null");
    auto tree_of = [&](uint32_t i) -> const int32_t * { return parents ? parents[i] : nullptr; };
    bool any_tree = false;

    // validate everything before touching any state
    std::set<int32_t> seen;
    int64_t T = 0, rows = 0, max_n = 0, max_ctx = 0;
    uint32_t max_blocks = 0;
    int32_t n_record = 0;
    for (uint32_t i = 0; i < b.n_seqs; i++) {
        const dfl_seq_batch &sb = b.seqs[i];
        const std::string who = check_batch_entry(table_, seen, i, sb, h.n_vocab);
        Seq &q = table_.get(sb.seq);
        if (q.tree)
            fail(DFL_ERR_STATE, who + ": the sequence holds an unresolved tree forward (seq_accept_path, seq_truncate or "
                                      "seq_rollback first)");
        if (const int32_t *par = tree_of(i)) {
            any_tree = true;
            if (sb.n_tokens > 64)
                fail(DFL_ERR_INVALID, who + ": a tree entry has at most 64 tokens, not " + std::to_string(sb.n_tokens));
            if (par[0] != -1)
                fail(DFL_ERR_INVALID, who + ": parents[0] = " + std::to_string(par[0]) + ": token 0 must be the root (-1)");
            for (uint32_t t = 1; t < sb.n_tokens; t++) {
                if (par[t] == -1)
                    fail(DFL_ERR_INVALID, who + ": parents[" + std::to_string(t) + "] = -1: a second root (only token 0 has none)");
                if (par[t] < 0 || par[t] >= (int32_t)t)
                    fail(DFL_ERR_INVALID, who + ": parents[" + std::to_string(t) + "] = " + std::to_string(par[t]) +
                                              ": a parent must be an earlier token of the entry (0 <= parent < " +
                                              std::to_string(t) + ")");
            }
        }
        if ((uint64_t)q.len + sb.n_tokens > (uint64_t)INT32_MAX) fail(DFL_ERR_INVALID, who + ": sequence too long");
        T += sb.n_tokens;
        rows += sb.logits == DFL_LOGITS_ALL ? sb.n_tokens : (sb.logits == DFL_LOGITS_LAST ? 1 : 0);
        max_n = std::max<int64_t>(max_n, sb.n_tokens);
        max_ctx = std::max<int64_t>(max_ctx, (int64_t)q.len + sb.n_tokens);
        max_blocks = std::max(max_blocks, table_.blocks_for(q.len + sb.n_tokens));
    }
    auto records = [&](uint32_t i) { return ((b.seqs[i].flags & DFL_SEQ_RECORD) != 0 || tree_of(i)) && n_rec_ > 0; };
    for (uint32_t i = 0; i < b.n_seqs; i++) n_record += records(i) ? 1 : 0;
    const bool any_record = n_record > 0;
    // A decode step (one token per sequence) or a verify step (a few tokens per sequence: DFlash blocks and trees,
    // recorded, with hidden-state capture) is replayed from a device graph where the device has them. The graph
    // freezes the host scalars of the batch, which go into its key (StepGraphs::Key); the block table width is rounded
    // up (kernels treat it and max_ctx as upper bounds and read each sequence's true length from the metadata).
    // Other entries of several tokens are prefill chunks: one-off shapes (a prompt's length), and attention there may
    // take the cuBLAS path. Those of up to kGraphMaxTokens were graphed too until 12-06: a key runs op by op when new
    // and is captured the second time it comes, so the second chat request of the same 22-token prompt took its first
    // token after 1.3 ms against 0.6 for the first (demo model; qwen3-8b 9.0 against 5.1 ms, H100 12-06 11:4x).
    auto verified = [&](uint32_t i) {
        const dfl_seq_batch &sb = b.seqs[i];
        return sb.n_tokens == 1 || sb.logits == DFL_LOGITS_ALL || (sb.flags & DFL_SEQ_RECORD) != 0 || tree_of(i);
    };
    bool prefill_chunk = false;
    for (uint32_t i = 0; i < b.n_seqs; i++) prefill_chunk = prefill_chunk || !verified(i);
    const bool graph_step =
        dev_->has_graphs() && !prefill_chunk && max_n <= kGraphMaxTokens && b.n_capture <= kGraphMaxCaptures;
    if (graph_step) {
        max_blocks = (uint32_t)StepGraphs::table_width(max_blocks);
        max_ctx = (int64_t)max_blocks * table_.block_size();
    }
    check_batch_outputs(b, rows, topk);
    if (b.n_capture > 0) {
        if (!b.capture_layers) fail(DFL_ERR_INVALID, "batch: capture requested but capture_layers is null");
        for (uint32_t c = 0; c < b.n_capture; c++)
            if (b.capture_layers[c] < 0 || b.capture_layers[c] >= h.n_layer)
                fail(DFL_ERR_INVALID, "batch: capture layer " + std::to_string(b.capture_layers[c]) + " is out of range");
    }
    // KV blocks for the new tokens, all or nothing
    check_batch_blocks(table_, b);
    // a sequence whose last recorded forward no truncation resolved: its slot caught up first (before ensure_record
    // may reallocate the inputs it replays)
    for (uint32_t i = 0; i < b.n_seqs; i++) settle(b.seqs[i].seq);
    // device buffers before any state changes, so an allocation failure changes nothing
    ensure_acts(T);
    const int32_t E = (int32_t)b.n_seqs;
    const size_t n_meta = (size_t)(4 * T + 4 * E + (int64_t)E * max_blocks + rows);
    ensure(meta_, n_meta * sizeof(int32_t), "batch metadata");
    ensure(ptrs_, (size_t)3 * E * sizeof(float *), "batch metadata");
    if (rows > 0) ensure(logits_, (size_t)rows * h.n_vocab * sizeof(float), "logits");
    const size_t topk_size = topk ? topk_bytes(rows, topk->k) : 0;
    if (topk_size > 0) ensure(topk_, topk_size, "top-k candidates");
    if (b.n_capture > 0) ensure(capture_, (size_t)T * b.n_capture * h.n_embd * sizeof(float), "hidden-state capture");
    capture_landing_ =
        b.n_capture > 0 ? (float *)dev_->host_landing((size_t)T * b.n_capture * h.n_embd * sizeof(float)) : nullptr;
    // A recorded forward keeps its tokens' inputs, and of a tree room for the states its schedule sets aside (the
    // states after branch points, which later tokens continue from); the slot keeps the state before it.
    for (uint32_t i = 0; i < b.n_seqs; i++)
        if (records(i)) ensure_record(b.seqs[i].seq, b.seqs[i].n_tokens, tree_of(i) != nullptr);
    if (any_tree) ensure(tree_, (size_t)T * (sizeof(uint64_t) + 2 * sizeof(int32_t)), "tree metadata");

    for (uint32_t i = 0; i < b.n_seqs; i++) {
        Seq &q = table_.get(b.seqs[i].seq);
        table_.grow(q, q.len + b.seqs[i].n_tokens);
    }

    // the batch metadata, laid out in one buffer
    host_meta_.assign(n_meta, 0);
    int32_t *tokens = host_meta_.data(), *pos = tokens + T, *ent = pos + T, *kv_slot = ent + T;
    int32_t *t0 = kv_slot + T, *nn = t0 + E, *len0 = nn + E, *slot = len0 + E, *bt = slot + E;
    int32_t *out_rows = bt + (int64_t)E * max_blocks;
    host_ptrs_.assign((size_t)3 * E, nullptr);
    if (any_tree) host_tree_.assign((size_t)(2 * T), 0);
    uint64_t *vis = host_tree_.data();
    int32_t *tpar = any_tree ? (int32_t *)(vis + T) : nullptr, *steps = any_tree ? tpar + T : nullptr;
    const uint32_t bs = table_.block_size();
    int64_t t = 0, r = 0;
    for (int32_t e = 0; e < E; e++) {
        const dfl_seq_batch &sb = b.seqs[e];
        Seq &q = table_.get(sb.seq);
        t0[e] = (int32_t)t;
        nn[e] = (int32_t)sb.n_tokens;
        len0[e] = (int32_t)q.len;
        slot[e] = sb.seq;
        for (size_t k = 0; k < q.blocks.size() && k < max_blocks; k++) bt[(int64_t)e * max_blocks + (int64_t)k] = q.blocks[k];
        const int32_t *par = tree_of((uint32_t)e);
        // a tree's depth-first schedule for the recurrent op (BatchMeta::tree_steps; any tree of at most 64 tokens
        // has one); -1 at a chain's t0
        if (any_tree && !par) steps[t] = -1;
        if (par && tree_schedule(par, sb.n_tokens, steps + t) < 0)
            fail(DFL_ERR_INTERNAL, "batch entry " + std::to_string(e) + ": no schedule for its tree");
        for (uint32_t i = 0; i < sb.n_tokens; i++, t++) {
            tokens[t] = sb.tokens[i];
            pos[t] = sb.positions ? sb.positions[i] : (int32_t)(q.len + i);
            if (any_tree) {
                if (par) {
                    // ancestors-or-self, and the position from the depth
                    vis[t] = (i > 0 ? vis[t0[e] + par[i]] : 0) | ((uint64_t)1 << i);
                    if (!sb.positions) pos[t] = i > 0 ? pos[t0[e] + par[i]] + 1 : (int32_t)q.len;
                    tpar[t] = par[i];
                } else {
                    vis[t] = ~(uint64_t)0;
                    tpar[t] = (int32_t)i - 1;
                }
            }
            ent[t] = e;
            const uint32_t p = q.len + i;
            kv_slot[t] = n_attn_ > 0 ? q.blocks[p / bs] * (int32_t)bs + (int32_t)(p % bs) : -1;
        }
        if (sb.logits == DFL_LOGITS_ALL)
            for (uint32_t i = 0; i < sb.n_tokens; i++) out_rows[r++] = t0[e] + (int32_t)i;
        else if (sb.logits == DFL_LOGITS_LAST)
            out_rows[r++] = t0[e] + (int32_t)sb.n_tokens - 1;
        const bool record = records((uint32_t)e);
        q.rec = false;
        if (record) {
            q.rec_base = q.len;
            q.rec_n = sb.n_tokens;
            const SeqState &ss = seq_state_[(size_t)sb.seq];
            host_ptrs_[(size_t)e] = par ? ss.rec_state.f() : nullptr;
            host_ptrs_[(size_t)(E + e)] = ss.rec_window.f();
            host_ptrs_[(size_t)(2 * E + e)] = ss.rec_in.f();
        }
    }
    dev_->to_device(meta_.get(), host_meta_.data(), n_meta * sizeof(int32_t));
    dev_->to_device(ptrs_.get(), host_ptrs_.data(), host_ptrs_.size() * sizeof(float *));
    if (any_tree) dev_->to_device(tree_.get(), host_tree_.data(), (size_t)T * (sizeof(uint64_t) + 2 * sizeof(int32_t)));

    const int32_t *dm = meta_.get<int32_t>();
    BatchMeta m;
    m.T = T;
    m.n_ent = E;
    m.max_n = max_n;
    m.max_ctx = max_ctx;
    m.tokens = dm;
    m.pos = dm + T;
    m.ent = dm + 2 * T;
    m.kv_slot = n_attn_ > 0 ? dm + 3 * T : nullptr;
    m.t0 = dm + 4 * T;
    m.n = m.t0 + E;
    m.len0 = m.n + E;
    m.slot = m.len0 + E;
    m.block_table = m.slot + E;
    m.max_blocks = (int32_t)max_blocks;
    m.rec_state = ptrs_.get<float *>();
    m.rec_window = ptrs_.get<float *>() + E;
    m.rec_in = ptrs_.get<float *>() + 2 * E;
    m.n_record = n_record;
    recording_ = any_record;
    if (any_tree) {
        m.vis = tree_.get<uint64_t>();
        m.parent = (const int32_t *)(m.vis + T);
        m.tree_steps = m.parent + T;
    }
    const int32_t *d_out_rows = m.block_table + (int64_t)E * max_blocks;

    if (graph_step) {
        StepGraphs::Key key{E, max_blocks, rows};
        if (max_n > 1) {
            key.tokens = T;
            key.max_tokens = max_n;
        }
        // which kernels run: trees (per-token masks), recording (by some entries or all), and the hidden-state
        // captures (their count below kGraphMaxCaptures + 1 = 8, then their layers, 8 bits each)
        static_assert(kGraphMaxCaptures < 8, "the captures' count has bits 2 to 4 of the shape");
        key.shape = (any_tree ? 1u : 0u) | (any_record ? 2u : 0u) | (uint64_t)b.n_capture << 2 |
                    (n_record == E ? 32u : 0u);
        for (uint32_t c = 0; c < b.n_capture; c++) key.shape |= (uint64_t)(b.capture_layers[c] & 0xFF) << (8 * c + 8);
        graphs_.run(*dev_, key, [&] { run_layers(m, b, rows, d_out_rows); });
    } else {
        run_layers(m, b, rows, d_out_rows);
    }
    logits_rows_ = rows;
    if (rows > 0 && topk) {
        // only the candidates cross to the host: ids, then values, then the log-sum-exps
        device_topk(*dev_, logits_.f(), rows, h.n_vocab, topk->k, topk_.get());
        host_topk_.resize(topk_size);
        dev_->to_host(host_topk_.data(), topk_.get(), topk_size);
        unpack_topk(host_topk_.data(), rows, *topk);
    } else if (rows > 0) {
        dev_->to_host(b.logits, logits_.get(), (size_t)rows * h.n_vocab * sizeof(float));
    }
    if (b.n_capture > 0)
        land_captures(b, (uint64_t)T * b.n_capture * h.n_embd, rows);
    else if (rows == 0)
        dev_->sync();
    for (uint32_t i = 0; i < b.n_seqs; i++) {
        Seq &q = table_.get(b.seqs[i].seq);
        q.rec_base = q.len;  // (recording or not: a tree's base)
        q.rec_n = b.seqs[i].n_tokens;
        q.len += b.seqs[i].n_tokens;
        q.rec = records(i);
        q.rec_pending = q.rec;
        q.tree = tree_of(i) != nullptr;
        if (q.tree) q.tree_parents.assign(tree_of(i), tree_of(i) + b.seqs[i].n_tokens);
    }
}

}  // namespace dfl
