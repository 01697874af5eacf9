#include "arch/dflash.h"
#include "arch/hparams.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <thread>

#include "core/sized.h"
#include "quant.h"
#include "rope.h"

namespace dfl {

namespace {

constexpr const char *kPrefix = "dflash.";
// Context rows go through fc and the layers' K/V in chunks of this many, so a long prompt's features (n_feat floats
// per row, e.g. 25 600) need no device buffer of the whole prompt.
constexpr int64_t kCtxChunk = 256;
// The longest block of a draft step replayed from a device graph (as the targets' verify steps: up to 32 a sequence).
constexpr int64_t kGraphMaxBlock = 32;

const dfl_meta *find(const MetaMap &m, const std::string &k) { return meta_find(m, kPrefix + k); }

int64_t meta_int(const MetaMap &m, const std::string &k) {
    const dfl_meta *v = find(m, k);
    if (!v) fail(DFL_ERR_INVALID, std::string("model metadata lacks ") + kPrefix + k);
    if (v->kind != DFL_META_INT) fail(DFL_ERR_INVALID, std::string("metadata ") + kPrefix + k + " is not an integer");
    return v->i;
}

int64_t meta_int(const MetaMap &m, const std::string &k, int64_t def) { return find(m, k) ? meta_int(m, k) : def; }

double meta_float(const MetaMap &m, const std::string &k, double def) { return meta_number(find(m, k), kPrefix + k, def); }

int positive(int64_t v, const std::string &k) { return positive_hparam(v, kPrefix + k); }

// The per-layer sliding flags: an int array of 0/1 (bools arrive as ints), one per layer; absent = no sliding layer.
std::vector<bool> sliding_pattern(const MetaMap &m, int n_layer, int window) {
    std::vector<bool> s((size_t)n_layer, false);
    const dfl_meta *v = find(m, "attention.sliding_window_pattern");
    if (window <= 0 || !v) return s;
    if (v->kind != DFL_META_INT_ARRAY || v->n != (uint32_t)n_layer || (v->n > 0 && !v->ia))
        fail(DFL_ERR_INVALID, std::string("metadata ") + kPrefix + "attention.sliding_window_pattern must be an array of " +
                                  std::to_string(n_layer) + " integers (one per layer)");
    for (int il = 0; il < n_layer; il++) s[(size_t)il] = v->ia[il] != 0;
    return s;
}

}  // namespace

DFlashHParams dflash_hparams(const dfl_model_params &p) {
    const MetaMap m = meta_map(p);
    DFlashHParams h;
    h.n_layer = positive(meta_int(m, "block_count"), "block_count");
    h.n_embd = positive(meta_int(m, "embedding_length"), "embedding_length");
    h.n_ff = positive(meta_int(m, "feed_forward_length"), "feed_forward_length");
    h.n_head = positive(meta_int(m, "attention.head_count"), "attention.head_count");
    h.n_kv = positive(meta_int(m, "attention.head_count_kv", h.n_head), "attention.head_count_kv");
    h.head_dim = positive(meta_int(m, "attention.key_length", h.n_embd / h.n_head), "attention.key_length");
    if (h.n_head % h.n_kv != 0) fail(DFL_ERR_INVALID, "dflash.attention.head_count is not a multiple of head_count_kv");
    if (h.head_dim % 2 != 0) fail(DFL_ERR_INVALID, "dflash.attention.key_length must be even (NeoX RoPE)");
    if (!find(m, "rope.freq_base")) fail(DFL_ERR_INVALID, "model metadata lacks dflash.rope.freq_base");
    h.theta = (float)meta_float(m, "rope.freq_base", 0);
    if (!(h.theta > 0)) fail(DFL_ERR_INVALID, "dflash.rope.freq_base must be positive");
    h.eps = (float)meta_float(m, "attention.layer_norm_rms_epsilon", 1e-6);
    h.n_ctx_train = (int)meta_int(m, "context_length", 0);
    const int64_t window = meta_int(m, "attention.sliding_window", 0);
    if (window < 0 || window > (1 << 30)) fail(DFL_ERR_INVALID, "dflash.attention.sliding_window is out of range");
    h.window = (int)window;
    h.sliding = sliding_pattern(m, h.n_layer, h.window);
    h.sliding_causal = meta_int(m, "attention.causal", 1) != 0;
    h.logit_scale = (float)meta_float(m, "logit_scale", 1.0);
    h.softcap = (float)meta_float(m, "final_logit_softcapping", 0.0);
    // DFlash2: the four keys come together (llama.cpp refuses a selector without them)
    const char *d2[] = {"conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k"};
    int present = 0;
    for (const char *k : d2) present += find(m, k) != nullptr;
    if (present > 0) {
        if (present != 4) fail(DFL_ERR_INVALID, "a DFlash2 draft needs all of dflash.conv_kernel_size, conv_group_size, selector_rank and selector_top_k");
        h.conv_k = positive(meta_int(m, d2[0]), d2[0]);
        h.conv_group = positive(meta_int(m, d2[1]), d2[1]);
        h.sel_rank = positive(meta_int(m, d2[2]), d2[2]);
        h.sel_top_k = positive(meta_int(m, d2[3]), d2[3]);
        if (h.n_embd % h.conv_group != 0)
            fail(DFL_ERR_INVALID, "dflash.embedding_length " + std::to_string(h.n_embd) + " is not a multiple of dflash.conv_group_size " +
                                      std::to_string(h.conv_group));
        if (h.sel_top_k > 64) fail(DFL_ERR_UNSUPPORTED, "dflash.selector_top_k " + std::to_string(h.sel_top_k) + " is above 64");
    }
    return h;
}

void estimate_dflash(const dfl_model_params &p, dfl_model_estimate *out) {
    const DFlashHParams h = dflash_hparams(p);
    check_cache_types(p.cache_type_k, p.cache_type_v);
    dfl_model_estimate e;
    std::memset(&e, 0, sizeof e);
    e.struct_size = sizeof e;
    std::set<const void *> seen;  // a head tied to the embedding table is uploaded once
    int64_t n_feat = 0;
    for (uint32_t i = 0; i < p.n_tensors; i++) {
        const dfl_tensor &t = p.tensors[i];
        if (!t.name || !seen.insert(t.data).second) continue;
        if (std::string(t.name) == "fc.weight") n_feat = (int64_t)t.dims[0];
        e.weight_bytes += t.size;
        if (t.n_dims >= 2 && t.dims[1] > 1) e.weight_bytes += device_weight_copy_bytes(t.type, t.size);
    }
    e.kv_bytes_per_token = (uint64_t)h.n_layer * (uint64_t)h.n_kv *
                           (row_bytes(p.cache_type_k, h.head_dim) + row_bytes(p.cache_type_v, h.head_dim));
    const uint64_t qd = (uint64_t)h.n_head * h.head_dim, kvd = (uint64_t)h.n_kv * h.head_dim;
    // (and a fused product's rows: gate|up, the wider of its two)
    uint64_t per_row = 4ull * h.n_embd + 4ull * h.n_ff + 3 * qd + 2 * kvd + (uint64_t)n_feat;
    if (h.dflash2()) per_row += (uint64_t)h.n_embd + 2ull * h.conv_k * (h.n_embd / h.conv_group) + (uint64_t)h.sel_rank;
    e.scratch_bytes = 512ull * per_row * sizeof(float);
    write_sized(out, e);
}

DFlashModel::DFlashModel(const dfl_model_params &p, std::unique_ptr<Device> dev)
    : dev_(std::move(dev)) {
    hp_ = dflash_hparams(p);
    n_threads_ = (uint32_t)threads_of(p);
    check_cache_types(p.cache_type_k, p.cache_type_v);
    const uint32_t block_size = kv_block_size_of(p);
    load_weights(p);
    const uint32_t n_blocks = (uint32_t)ceil_div(p.kv_pool_tokens, block_size);
    if (n_blocks == 0) fail(DFL_ERR_INVALID, "kv_pool_tokens must be at least 1");
    table_.init(p.max_seqs, n_blocks, block_size, true);
    kv_.init(dev_.get(), p.cache_type_k, p.cache_type_v, hp_.n_layer, (uint64_t)n_blocks * block_size, hp_.n_kv,
             hp_.head_dim, (int)block_size, "draft KV pool");
    const std::vector<float> inv = rope_inv_freq(hp_.theta, hp_.head_dim);
    inv_freq_ = w_.floats(inv, "rope frequencies");
    ensure_acts(16);
}

// ---- weights --------------------------------------------------------------------------------------------------------

// A validated 2-D weight, uploaded, with the device's own layout.
Weight DFlashModel::weight(const std::string &name, int64_t n_in, int64_t n_out) {
    Weight w = w_.matrix(name, n_in, n_out);
    w_.upload(w);
    dev_->prepare_weight(w);
    return w;
}

// A small f32/f16/bf16 tensor of exactly these dims (ggml order), converted to f32 on the device.
const float *DFlashModel::floats(const std::string &name, const std::vector<int64_t> &dims) {
    const dfl_tensor *t = &w_.need(name);
    int64_t count = 1;
    bool ok = true;
    for (uint32_t i = 0; i < 4; i++) {
        const int64_t want = i < dims.size() ? dims[i] : 1;
        if ((int64_t)t->dims[i] != want) ok = false;
        count *= want;
    }
    if (!ok) {
        std::string w = "[";
        for (size_t i = 0; i < dims.size(); i++) w += (i ? ", " : "") + std::to_string(dims[i]);
        fail(DFL_ERR_INVALID, "tensor " + name + " has shape " + dims_str(*t) + ", want " + w + "]");
    }
    if (t->type != DFL_TYPE_F32 && t->type != DFL_TYPE_F16 && t->type != DFL_TYPE_BF16)
        fail(DFL_ERR_UNSUPPORTED, "tensor " + name + " must be f32, f16 or bf16");
    if (t->size < (uint64_t)count * type_block_bytes(t->type)) fail(DFL_ERR_INVALID, "tensor " + name + " has too few bytes");
    std::vector<float> v((size_t)count);
    dequant_row(t->type, t->data, v.data(), count);
    return w_.floats(v, name.c_str(), (uint64_t)count * (uint64_t)type_block_bytes(t->type));
}

void DFlashModel::load_weights(const dfl_model_params &p) {
    w_.init(dev_.get(), p);
    const DFlashHParams &h = hp_;
    // sizes the file does not state as keys: the feature width (fc), and the target's vocabulary (its head, table)
    for (const char *name : {"fc.weight", "output.weight", "token_embd.weight"})
        if (!w_.find(name)) fail(DFL_ERR_INVALID, std::string("tensor ") + name + " is missing");
    n_feat_ = positive((int64_t)w_.find("fc.weight")->dims[0], "feature width (fc.weight dims[0])");
    n_vocab_ = positive((int64_t)w_.find("output.weight")->dims[1], "vocabulary size (output.weight dims[1])");
    n_embd_rows_ = positive((int64_t)w_.find("token_embd.weight")->dims[1], "vocabulary size (token_embd.weight dims[1])");

    fc_ = weight("fc.weight", n_feat_, h.n_embd);
    enc_norm_ = w_.vec("enc.output_norm.weight", h.n_embd);
    output_norm_ = w_.vec("output_norm.weight", h.n_embd);
    tok_embd_ = weight("token_embd.weight", h.n_embd, n_embd_rows_);
    output_ = weight("output.weight", h.n_embd, n_vocab_);
    const int64_t qd = (int64_t)h.n_head * h.head_dim, kvd = (int64_t)h.n_kv * h.head_dim;
    layers_.resize((size_t)h.n_layer);
    for (int il = 0; il < h.n_layer; il++) {
        DraftLayer &L = layers_[(size_t)il];
        L.sliding = h.sliding[(size_t)il];
        L.attn_norm = w_.vec(blk(il, "attn_norm.weight"), h.n_embd);
        L.ffn_norm = w_.vec(blk(il, "ffn_norm.weight"), h.n_embd);
        L.q_norm = w_.vec(blk(il, "attn_q_norm.weight"), h.head_dim);
        L.k_norm = w_.vec(blk(il, "attn_k_norm.weight"), h.head_dim);
        L.wq = weight(blk(il, "attn_q.weight"), h.n_embd, qd);
        L.wk = w_.matrix(blk(il, "attn_k.weight"), h.n_embd, kvd);
        L.wv = w_.matrix(blk(il, "attn_v.weight"), h.n_embd, kvd);
        L.kv_proj = w_.fuse({&L.wk, &L.wv});
        L.wo = weight(blk(il, "attn_output.weight"), qd, h.n_embd);
        L.ffn_gate = w_.matrix(blk(il, "ffn_gate.weight"), h.n_embd, h.n_ff);
        L.ffn_up = w_.matrix(blk(il, "ffn_up.weight"), h.n_embd, h.n_ff);
        L.gate_up = w_.fuse({&L.ffn_gate, &L.ffn_up});
        L.ffn_down = weight(blk(il, "ffn_down.weight"), h.n_ff, h.n_embd);
        if (h.dflash2()) {
            const int64_t proj = 2ll * h.conv_k * (h.n_embd / h.conv_group);
            L.attn_conv_base = floats(blk(il, "attn_conv_base"), {h.n_embd, h.conv_k, 2});
            L.ffn_conv_base = floats(blk(il, "ffn_conv_base"), {h.n_embd, h.conv_k, 2});
            L.attn_conv_proj = weight(blk(il, "attn_conv_proj.weight"), h.n_embd, proj);
            L.ffn_conv_proj = weight(blk(il, "ffn_conv_proj.weight"), h.n_embd, proj);
        }
    }
    if (h.dflash2()) {
        // codebooks: one row of rank per token of the target's vocabulary
        for (const char *name : {"selector_predecessor.weight", "selector_successor.weight"})
            if (!w_.find(name)) fail(DFL_ERR_INVALID, std::string("tensor ") + name + " is missing");
        sel_pred_ = weight("selector_predecessor.weight", h.sel_rank, n_vocab_);
        sel_succ_ = weight("selector_successor.weight", h.sel_rank, n_vocab_);
        sel_hidden_ = weight("selector_hidden.weight", h.n_embd, h.sel_rank);
    }
    w_.done();
}

// ---- model interface ------------------------------------------------------------------------------------------------

void DFlashModel::info(dfl_model_info *out) const {
    dfl_model_info i;
    std::memset(&i, 0, sizeof i);
    i.struct_size = sizeof i;
    std::snprintf(i.arch, sizeof i.arch, "%s", "dflash");
    i.n_layer = (uint32_t)hp_.n_layer;
    i.n_embd = (uint32_t)hp_.n_embd;
    i.n_vocab = (uint32_t)n_vocab_;
    i.n_ctx_train = (uint32_t)hp_.n_ctx_train;
    i.n_head = (uint32_t)hp_.n_head;
    i.n_head_kv = (uint32_t)hp_.n_kv;
    i.head_dim = (uint32_t)hp_.head_dim;
    i.n_ff = (uint32_t)hp_.n_ff;
    i.n_attn_layers = (uint32_t)hp_.n_layer;
    i.kv_block_size = table_.block_size();
    i.kv_blocks_total = table_.n_blocks();
    i.max_seqs = table_.max_seqs();
    i.cache_type_k = kv_.type_k();
    i.cache_type_v = kv_.type_v();
    i.n_threads = n_threads_;
    i.kv_bytes_per_token = kv_.bytes_per_token();
    i.weight_bytes = w_.bytes();
    i.rms_eps = hp_.eps;
    i.rope_theta = hp_.theta;
    i.rope_dim = (uint32_t)hp_.head_dim;
    i.n_feat = (uint32_t)n_feat_;
    i.selector_top_k = (uint32_t)hp_.sel_top_k;
    write_sized(out, i);
}

void DFlashModel::kv_stats(dfl_kv_stats *out) const { table_.kv_stats(out); }

// Attention only: cutting the length is all a truncate or rollback needs.
void DFlashModel::seq_truncate(int32_t s, uint32_t n) {
    Seq &q = table_.get(s);
    if (n > q.len) fail(DFL_ERR_INVALID, "truncate sequence " + std::to_string(s) + " to " + std::to_string(n) +
                                             " tokens: it holds only " + std::to_string(q.len));
    table_.set_length(q, n);
}

void DFlashModel::seq_snapshot(int32_t s) { table_.mark_snapshot(s); }

void DFlashModel::seq_rollback(int32_t s) {
    Seq &q = table_.snapshot_of(s);
    table_.set_length(q, q.snap_len);
}

void DFlashModel::forward(const dfl_batch &, const TopKOut *) {
    fail(DFL_ERR_UNSUPPORTED, "a dflash draft runs through draft_forward");
}

// ---- draft step -----------------------------------------------------------------------------------------------------

DFlashModel::~DFlashModel() { graphs_.drop(*dev_); }

void DFlashModel::ensure_acts(int64_t rows) {
    if (rows <= acts_.cap) return;
    graphs_.drop(*dev_);  // they point at the old activations
    const int64_t cap = std::max<int64_t>(rows, acts_.cap * 2);
    const DFlashHParams &h = hp_;
    Acts &a = acts_;
    a = Acts{};  // release the old set first: peak memory is one set
    auto mk = [&](DevBuf &b, int64_t per_row) { b = DevBuf(dev_.get(), (size_t)(cap * per_row) * sizeof(float), "draft activations"); };
    const int64_t qd = (int64_t)h.n_head * h.head_dim, kvd = (int64_t)h.n_kv * h.head_dim;
    mk(a.feat, n_feat_);
    mk(a.g, h.n_embd);
    mk(a.x, h.n_embd);
    mk(a.xn, h.n_embd);
    mk(a.mix, h.n_embd);
    mk(a.ff_g, h.n_ff);
    mk(a.ff_u, h.n_ff);
    mk(a.qf, qd);
    mk(a.kf, kvd);
    mk(a.vf, kvd);
    mk(a.Q, qd);
    mk(a.attn, qd);
    if (h.dflash2()) {
        mk(a.dyn, 2ll * h.conv_k * (h.n_embd / h.conv_group));
        mk(a.cv, h.n_embd);
    }
    a.fused = DevBuf(dev_.get(), (size_t)(std::min<int64_t>(cap, kFusedMaxTokens) * std::max<int64_t>(2 * kvd, 2ll * h.n_ff)) *
                                     sizeof(float),
                     "draft activations");
    a.cap = cap;
}

// Checks every entry before any state changes and lays out the step's metadata.
DFlashModel::StepLayout DFlashModel::validate(uint32_t n, const dfl_draft_entry *es, const TopKOut &topk) const {
    StepLayout l;
    std::set<int32_t> seen;
    uint64_t need = 0;
    uint32_t longest = 0;  // block
    for (uint32_t i = 0; i < n; i++) {
        const dfl_draft_entry &e = es[i];
        const std::string who = "draft entry " + std::to_string(i) + " (sequence " + std::to_string(e.seq) + ")";
        const Seq &q = table_.get(e.seq);
        if (!seen.insert(e.seq).second) fail(DFL_ERR_INVALID, who + ": the sequence appears twice in one step");
        if (e.n_ctx > 0 && !e.features) fail(DFL_ERR_INVALID, who + ": features is null");
        if (e.n_block > 0 && !e.block) fail(DFL_ERR_INVALID, who + ": block is null");
        for (uint32_t t = 0; t < e.n_block; t++)
            if (e.block[t] < 0 || e.block[t] >= n_embd_rows_)
                fail(DFL_ERR_INVALID, who + ": token " + std::to_string(e.block[t]) + " is outside the vocabulary (" +
                                          std::to_string(n_embd_rows_) + ")");
        const uint64_t end = (uint64_t)q.len + e.n_ctx + e.n_block;
        if (end > (uint64_t)INT32_MAX) fail(DFL_ERR_INVALID, who + ": sequence too long");
        l.Tc += e.n_ctx;
        if (e.n_block > 0) {
            l.Tb += e.n_block;
            l.Eb++;
            l.rows += e.n_block - 1;
            longest = std::max(longest, e.n_block);
        }
        l.max_blocks = std::max(l.max_blocks, table_.blocks_for((uint32_t)end));
        need += table_.missing_blocks(q, (uint32_t)end);
    }
    if (topk.k < 1 || topk.k > 64) fail(DFL_ERR_INVALID, "draft step: k must be in [1, 64]");
    if (l.rows > 0 && (!topk.ids || !topk.vals || !topk.lse))
        fail(DFL_ERR_INVALID, "draft step: an output buffer is null");
    if (topk.trans && !hp_.dflash2())
        fail(DFL_ERR_UNSUPPORTED, "draft step: transition scores need a DFlash2 draft (this one has no candidate selector)");
    if (need > table_.free_blocks())
        fail(DFL_ERR_NO_KV, "draft KV pool exhausted: the step needs " + std::to_string(need) + " more blocks, " +
                                std::to_string(table_.free_blocks()) + " free");
    // A speculative step's draft (blocks of up to kGraphMaxBlock rows, its context rows in one chunk) is replayed from a
    // device graph where the device has them (DFL_DRAFT_GRAPHS=0: op by op). The graph freezes the step's host
    // scalars, so the block table's width is rounded up; the kernels take it and max_ctx as upper bounds.
    static const bool graphs_on = env_switch("DFL_DRAFT_GRAPHS", true);
    l.graph = graphs_on && dev_->has_graphs() && l.Tb > 0 && longest <= kGraphMaxBlock && l.Tc <= kCtxChunk;
    if (l.graph) l.max_blocks = (uint32_t)StepGraphs::table_width(l.max_blocks);
    // one int32 buffer: context pos and kv_slot [Tc]; block tokens, pos, ent, kv_slot [Tb]; per block entry t0, n,
    // len0, slot [Eb] and the block table [Eb][max_blocks]; the logits rows [rows]
    size_t off = 0;
    auto take = [&](size_t &at, int64_t count) {
        at = off;
        off += (size_t)count;
    };
    take(l.ctx_pos, l.Tc);
    take(l.ctx_slot, l.Tc);
    take(l.tokens, l.Tb);
    take(l.pos, l.Tb);
    take(l.ent, l.Tb);
    take(l.kv_slot, l.Tb);
    take(l.t0, l.Eb);
    take(l.n, l.Eb);
    take(l.len0, l.Eb);
    take(l.slot, l.Eb);
    take(l.bt, (int64_t)l.Eb * l.max_blocks);
    take(l.out_rows, l.rows);
    take(l.sel_prev, l.rows);
    take(l.sel_root, l.rows);
    l.total = off;
    return l;
}

// The host metadata of a step whose sequences hold their blocks already. Cache positions are contiguous: context row
// j of an entry sits at len + j, block row i at len + n_ctx + i; RoPE positions are the same.
void DFlashModel::fill_meta(uint32_t n, const dfl_draft_entry *es, const StepLayout &l) {
    host_meta_.assign(l.total, 0);
    int32_t *hm = host_meta_.data();
    const uint32_t bs = table_.block_size();
    int64_t c = 0, t = 0, r = 0;
    int32_t eb = 0;
    for (uint32_t i = 0; i < n; i++) {
        const dfl_draft_entry &e = es[i];
        const Seq &q = table_.get(e.seq);
        auto slot_of = [&](uint32_t p) { return q.blocks[p / bs] * (int32_t)bs + (int32_t)(p % bs); };
        for (uint32_t j = 0; j < e.n_ctx; j++, c++) {
            hm[l.ctx_pos + c] = (int32_t)(q.len + j);
            hm[l.ctx_slot + c] = slot_of(q.len + j);
        }
        if (e.n_block == 0) continue;
        const uint32_t base = q.len + e.n_ctx;
        hm[l.t0 + eb] = (int32_t)t;
        hm[l.n + eb] = (int32_t)e.n_block;
        hm[l.len0 + eb] = (int32_t)base;
        hm[l.slot + eb] = e.seq;
        for (size_t k = 0; k < q.blocks.size() && k < l.max_blocks; k++)
            hm[l.bt + (size_t)eb * l.max_blocks + k] = q.blocks[k];
        for (uint32_t j = 1; j < e.n_block; j++, r++) {
            hm[l.out_rows + r] = (int32_t)(t + j);  // row 0 is discarded
            // selector: block position 1 follows the root token, later ones the candidates of the row before
            hm[l.sel_prev + r] = j == 1 ? -1 : (int32_t)(r - 1);
            hm[l.sel_root + r] = e.block[0];
        }
        for (uint32_t j = 0; j < e.n_block; j++, t++) {
            hm[l.tokens + t] = e.block[j];
            hm[l.pos + t] = (int32_t)(base + j);
            hm[l.ent + t] = eb;
            hm[l.kv_slot + t] = slot_of(base + j);
        }
        eb++;
    }
}

BatchMeta DFlashModel::block_meta(const StepLayout &l, int64_t max_n, int64_t max_ctx) const {
    const int32_t *dm = meta_.get<int32_t>();
    BatchMeta m;
    m.T = l.Tb;
    m.n_ent = l.Eb;
    m.max_n = max_n;
    m.max_ctx = max_ctx;
    m.tokens = dm + l.tokens;
    m.pos = dm + l.pos;
    m.ent = dm + l.ent;
    m.kv_slot = dm + l.kv_slot;
    m.t0 = dm + l.t0;
    m.n = dm + l.n;
    m.len0 = dm + l.len0;
    m.slot = dm + l.slot;
    m.block_table = dm + l.bt;
    m.max_blocks = (int32_t)l.max_blocks;
    return m;
}


// T context rows already in acts_.feat: g = RMSNorm(fc f), then every layer's K = RoPE(k_norm(W_k g)), V = W_v g
// into its cache (no attn_norm, no queries: context rows are only keys and values; k and v one product where fused).
void DFlashModel::context_chunk(const int32_t *d_pos, const int32_t *d_slot, int64_t T) {
    const DFlashHParams &h = hp_;
    Acts &a = acts_;
    dev_->matmul(fc_, a.feat.f(), T, a.g.f());
    dev_->rmsnorm(a.g.f(), enc_norm_, a.g.f(), T, h.n_embd, h.eps);
    BatchMeta m;
    m.T = T;
    m.pos = d_pos;
    m.kv_slot = d_slot;
    for (int il = 0; il < h.n_layer; il++) {
        const DraftLayer &L = layers_[(size_t)il];
        AttnPrep p;
        project_kv(L, a.g.f(), T, p);
        p.k_norm = L.k_norm;
        p.inv_freq = inv_freq_;
        p.n_head = h.n_head;
        p.rope_dim = h.head_dim;
        p.eps = h.eps;
        p.kv = kv_.layer(il);
        dev_->attn_prep(m, p);
    }
}

// A layer's K and V of T rows of x (one product where k|v is fused), where the attention prep reads them.
void DFlashModel::project_kv(const DraftLayer &L, const float *x, int64_t T, AttnPrep &p) {
    Acts &a = acts_;
    const std::vector<RowsView> kv =
        project_views(*dev_, L.kv_proj, {{&L.wk, a.kf.f()}, {&L.wv, a.vf.f()}}, x, T, a.fused.f());
    p.kf = kv[0].p;
    p.vf = kv[1].p;
    p.k_stride = kv[0].stride;
    p.v_stride = kv[1].stride;
}

// Context rows [c0, c0 + T) of the step (every entry's, in entry order) into acts_.feat.
void DFlashModel::stage_features(uint32_t n, const dfl_draft_entry *es, int64_t c0, int64_t T) {
    const int64_t nf = n_feat_;
    host_feat_.resize((size_t)(T * nf));
    uint32_t e = 0;
    int64_t j = c0;  // the next context row to stage: row j of entry e
    for (int64_t r = 0; r < T;) {
        while (e < n && j >= es[e].n_ctx) {
            j -= es[e].n_ctx;
            e++;
        }
        const int64_t take = std::min<int64_t>(T - r, es[e].n_ctx - j);
        std::memcpy(host_feat_.data() + r * nf, es[e].features + j * nf, sizeof(float) * (size_t)(take * nf));
        r += take;
        j += take;
    }
    dev_->to_device(acts_.feat.get(), host_feat_.data(), host_feat_.size() * sizeof(float));
}

// Every entry's context rows, in entry order, in chunks of kCtxChunk rows (a chunk may span entries).
void DFlashModel::run_context(uint32_t n, const dfl_draft_entry *es, const StepLayout &l) {
    const int32_t *dm = meta_.get<int32_t>();
    for (int64_t c0 = 0; c0 < l.Tc; c0 += kCtxChunk) {
        const int64_t T = std::min(kCtxChunk, l.Tc - c0);
        stage_features(n, es, c0, T);
        context_chunk(dm + l.ctx_pos + c0, dm + l.ctx_slot + c0, T);
    }
}

void DFlashModel::block_attention(int il, const BatchMeta &m, const float *in) {
    const DraftLayer &L = layers_[(size_t)il];
    const DFlashHParams &h = hp_;
    Acts &a = acts_;
    const int64_t T = m.T;
    AttnPrep p;
    project_kv(L, in, T, p);  // (k|v first: it takes the int8 rows the norm before staged)
    dev_->matmul(L.wq, in, T, a.qf.f());
    const KVLayer kv = kv_.layer(il);
    p.qf = a.qf.f();
    p.q_norm = L.q_norm;
    p.k_norm = L.k_norm;
    p.inv_freq = inv_freq_;
    p.n_head = h.n_head;
    p.rope_dim = h.head_dim;
    p.eps = h.eps;
    p.Q = a.Q.f();
    p.kv = kv;
    dev_->attn_prep(m, p);
    AttnCall c;
    c.Q = a.Q.f();
    c.out = a.attn.f();
    c.n_head = h.n_head;
    c.scale = 1.0f / std::sqrt((float)h.head_dim);
    // full layers: the block sees all of itself; sliding layers: causal unless the file says otherwise, windowed
    c.causal = L.sliding && h.sliding_causal;
    c.window = L.sliding ? h.window : 0;
    c.kv = kv;
    dev_->attention(m, c);
    dev_->matmul(L.wo, a.attn.f(), T, a.mix.f());
}

// DFlash2: one side (0 "prepare", 1 "finish") of a sublayer's dynamic convolution, with the kernels in acts_.dyn.
void DFlashModel::conv(const BatchMeta &m, const float *base, int side, const float *x, float *out) {
    const DFlashHParams &h = hp_;
    const int64_t per_side = (int64_t)h.conv_k * (h.n_embd / h.conv_group);
    DynConvCall c;
    c.x = x;
    c.out = out;
    c.dyn = acts_.dyn.f() + side * per_side;
    c.dyn_stride = 2 * per_side;
    c.base = base + (int64_t)side * h.conv_k * h.n_embd;
    c.C = h.n_embd;
    c.K = h.conv_k;
    c.group = h.conv_group;
    dev_->dyn_conv(m, c);
}

// The block rows through the layers (pre-norm Qwen3), then the draft's norm, the target's head and the logit
// scaling of `rows` rows into logits_ (and, for DFlash2, the selector's projection of the normed rows into sel_g_).
//
// DFlash2 wraps both sublayers in dynamic convolutions over the block positions (spec §5.1 (a), as llama.cpp's
// build_dflash2_conv): with n the normed sublayer input, the kernels come from n, "prepare" convolves n before the
// sublayer and "finish" its output (after attn_output / ffn_down) before the residual add. Context rows (K/V only)
// see no convolution.
void DFlashModel::run_block(const BatchMeta &m, int64_t rows, const int32_t *d_out_rows) {
    const DFlashHParams &h = hp_;
    Acts &a = acts_;
    const int64_t T = m.T, H = h.n_embd;
    const bool d2 = h.dflash2();
    // the FFN of gate|up rows where the fused product leaves them
    auto ffn = [&](const DraftLayer &L, const float *in) {
        const std::vector<RowsView> gu =
            project_views(*dev_, L.gate_up, {{&L.ffn_gate, a.ff_g.f()}, {&L.ffn_up, a.ff_u.f()}}, in, T, a.fused.f());
        dev_->swiglu_rows(a.ff_g.f(), gu[0].p, gu[1].p, T, h.n_ff, gu[0].stride);
        dev_->matmul(L.ffn_down, a.ff_g.f(), T, a.mix.f());
    };
    dev_->embed(tok_embd_, m.tokens, T, a.x.f());
    dev_->rmsnorm(a.x.f(), layers_[0].attn_norm, a.xn.f(), T, H, h.eps);
    for (int il = 0; il < h.n_layer; il++) {
        const DraftLayer &L = layers_[(size_t)il];
        // the residual add of the layer's output and the next layer's norm, one op (the last layer's: the add alone)
        auto add_out = [&](const float *out) {
            if (il + 1 < h.n_layer)
                dev_->add_rmsnorm(a.x.f(), out, layers_[(size_t)il + 1].attn_norm, a.xn.f(), T, H, h.eps);
            else
                dev_->add(a.x.f(), out, T * H);
        };
        if (d2) {
            dev_->matmul(L.attn_conv_proj, a.xn.f(), T, a.dyn.f());
            conv(m, L.attn_conv_base, 0, a.xn.f(), a.cv.f());
            block_attention(il, m, a.cv.f());
            conv(m, L.attn_conv_base, 1, a.mix.f(), a.cv.f());
            dev_->add_rmsnorm(a.x.f(), a.cv.f(), L.ffn_norm, a.xn.f(), T, H, h.eps);
            dev_->matmul(L.ffn_conv_proj, a.xn.f(), T, a.dyn.f());
            conv(m, L.ffn_conv_base, 0, a.xn.f(), a.cv.f());
            ffn(L, a.cv.f());
            conv(m, L.ffn_conv_base, 1, a.mix.f(), a.cv.f());
            add_out(a.cv.f());
            continue;
        }
        block_attention(il, m, a.xn.f());
        dev_->add_rmsnorm(a.x.f(), a.mix.f(), L.ffn_norm, a.xn.f(), T, H, h.eps);
        ffn(L, a.xn.f());
        add_out(a.mix.f());
    }
    if (rows == 0) return;
    dev_->gather_rows(a.x.f(), d_out_rows, rows, H, a.xn.f());
    dev_->rmsnorm(a.xn.f(), output_norm_, a.xn.f(), rows, H, h.eps);
    dev_->matmul(output_, a.xn.f(), rows, logits_.f());
    // the selector scores these logits: llama.cpp applies the scaling and soft-capping for DFlash2 (and leaves them
    // to the sampler for v1); the engine applies them to both
    if (h.logit_scale != 1.0f || h.softcap > 0)
        dev_->scale_softcap(logits_.f(), rows * n_vocab_, h.logit_scale, h.softcap);
    // g_p = selector_hidden · h_p, h_p the final normed hidden state (llama.cpp's t_embd, result_norm)
    if (d2) dev_->matmul(sel_hidden_, a.xn.f(), rows, sel_g_.f());
}

// The k best of each logits row and its log-sum-exp, computed on the device; only they cross to the host. With
// topk.trans (DFlash2), also the selector's transition scores between the k candidates of consecutive rows.
void DFlashModel::fetch_topk(int64_t rows, const TopKOut &topk, const StepLayout &l) {
    const size_t rkk = topk.trans ? (size_t)rows * (size_t)topk.k * (size_t)topk.k : 0;
    int32_t *d_ids = topk_.get<int32_t>();
    float *d_trans = (float *)(topk_.get<uint8_t>() + topk_bytes(rows, topk.k));  // after the candidates
    device_topk(*dev_, logits_.f(), rows, n_vocab_, topk.k, d_ids);
    if (topk.trans) {
        const int32_t *dm = meta_.get<int32_t>();
        SelectorCall s;
        s.ids = d_ids;
        s.prev = dm + l.sel_prev;
        s.root = dm + l.sel_root;
        s.g = sel_g_.f();
        s.pred = sel_pred_;
        s.succ = sel_succ_;
        s.R = rows;
        s.K = topk.k;
        s.rank = hp_.sel_rank;
        s.trans = d_trans;
        dev_->selector_trans(s);
    }
    const size_t bytes = topk_bytes(rows, topk.k) + rkk * 4;  // the candidates, then the transition scores
    host_topk_.resize(bytes);
    dev_->to_host(host_topk_.data(), topk_.get(), bytes);
    unpack_topk(host_topk_.data(), rows, topk);
    if (topk.trans) std::memcpy(topk.trans, host_topk_.data() + topk_bytes(rows, topk.k), rkk * 4);
}

void DFlashModel::draft_forward(uint32_t n, const dfl_draft_entry *es, const TopKOut &topk) {
    const StepLayout l = validate(n, es, topk);
    // device buffers before any state changes, so an allocation failure changes nothing
    ensure_acts(std::max<int64_t>(l.Tb, std::min(l.Tc, kCtxChunk)));
    ensure(meta_, std::max<size_t>(l.total, 1) * sizeof(int32_t), "draft step metadata");
    if (l.rows > 0) {
        ensure(logits_, (size_t)l.rows * n_vocab_ * sizeof(float), "draft logits");
        ensure(topk_, (size_t)l.rows * (2 * (size_t)topk.k + 1 + (topk.trans ? (size_t)topk.k * topk.k : 0)) * 4,
               "draft top-k candidates");
        if (hp_.dflash2()) ensure(sel_g_, (size_t)l.rows * hp_.sel_rank * sizeof(float), "draft selector projection");
    }
    int64_t max_n = 0, max_ctx = 0;
    for (uint32_t i = 0; i < n; i++) {
        Seq &q = table_.get(es[i].seq);
        const uint32_t end = q.len + es[i].n_ctx + es[i].n_block;
        table_.grow(q, end);  // block rows need cache rows too, past the length the step leaves
        if (es[i].n_block > 0) {
            max_n = std::max<int64_t>(max_n, es[i].n_block);
            max_ctx = std::max<int64_t>(max_ctx, end);
        }
    }
    fill_meta(n, es, l);
    if (l.total > 0) dev_->to_device(meta_.get(), host_meta_.data(), l.total * sizeof(int32_t));

    const int32_t *dm = meta_.get<int32_t>();
    if (l.graph) {
        // the context rows (one chunk, staged first) and the block through the head, as one replayed graph
        if (l.Tc > 0) stage_features(n, es, 0, l.Tc);
        StepGraphs::Key key{l.Eb, (int64_t)l.max_blocks, l.rows};
        key.tokens = l.Tb;
        key.max_tokens = max_n;
        key.shape = (uint64_t)l.Tc;
        const BatchMeta m = block_meta(l, max_n, (int64_t)l.max_blocks * table_.block_size());
        graphs_.run(*dev_, key, [&] {
            if (l.Tc > 0) context_chunk(dm + l.ctx_pos, dm + l.ctx_slot, l.Tc);
            run_block(m, l.rows, dm + l.out_rows);
        });
    } else {
        if (l.Tc > 0) run_context(n, es, l);
        if (l.Tb > 0) run_block(block_meta(l, max_n, max_ctx), l.rows, dm + l.out_rows);
    }
    if (l.rows > 0)
        fetch_topk(l.rows, topk, l);
    else
        dev_->sync();
    for (uint32_t i = 0; i < n; i++) {
        Seq &q = table_.get(es[i].seq);
        q.len += es[i].n_ctx;  // the block's rows stay past the length, to be overwritten
        table_.trim(q);
    }
}

}  // namespace dfl
