// The DeepSeek V4 layer plan (deepseek4.h): weights, activations and the forward pass. Sequence state, recording and
// export are in deepseek4_state.cpp; hyperparameters in deepseek4_hparams.cpp.
#include "arch/deepseek4.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "rope.h"

namespace dfl {

DeepSeek4Model::DeepSeek4Model(const dfl_model_params &p, std::unique_ptr<Device> dev) : dev_(std::move(dev)) {
    hp_ = ds4_hparams(p);
    n_threads_ = (uint32_t)threads_of(p);
    const uint32_t block_size = kv_block_size_of(p);
    load_weights(p);
    // Every sequence token holds KV blocks (they bound the compressed rows a sequence may append).
    const uint32_t n_blocks = (uint32_t)ceil_div(p.kv_pool_tokens, block_size);
    if (n_blocks == 0) fail(DFL_ERR_INVALID, "kv_pool_tokens must be at least 1");
    table_.init(p.max_seqs, n_blocks, block_size, true);
    layout_state();
    states_ = DevBuf(dev_.get(), (size_t)p.max_seqs * (size_t)slot_floats_ * sizeof(float), "deepseek4 sequence state");
    dev_->zero(states_.get(), states_.bytes());
    for (int il = 0; il < hp_.n_layer; il++) {
        Ds4Layer &L = layers_[(size_t)il];
        if (!L.ratio) continue;
        const size_t rows = (size_t)n_blocks * (size_t)ds4_rows_per_block((int)block_size, L.ratio);
        L.comp_pool = (int)comp_rows_.size();
        comp_rows_.emplace_back(dev_.get(), rows * hp_.head_dim * sizeof(float), "deepseek4 compressed rows");
        idx_rows_.emplace_back();
        if (L.csa) idx_rows_.back() = DevBuf(dev_.get(), rows * hp_.idx_dim * sizeof(float), "deepseek4 index keys");
    }
    rec_.resize(p.max_seqs);
    inv_main_ = w_.floats(rope_inv_freq(hp_.theta, hp_.rope_dim), "rope frequencies");
    inv_comp_ = w_.floats(ds4_compress_inv_freq(hp_), "compress rope frequencies");
    ensure_acts(16);
}

DeepSeek4Model::~DeepSeek4Model() { graphs_.drop(*dev_); }

void DeepSeek4Model::load_weights(const dfl_model_params &p) {
    w_.init(dev_.get(), p);
    const Ds4HParams &h = hp_;
    const int64_t D = h.n_embd, N = h.hc, mix = (2 + N) * N, HD = (int64_t)h.n_head * h.head_dim;
    auto up = [&](Weight w) {
        w_.upload(w);
        dev_->prepare_weight(w);
        return w;
    };
    tok_embd_ = up(w_.matrix("token_embd.weight", D, h.n_vocab));
    output_ = up(w_.matrix("output.weight", D, h.n_vocab));
    output_norm_ = w_.vec("output_norm.weight", D);
    out_hc_fn_ = up(w_.matrix("output_hc_fn.weight", N * D, N));
    out_hc_base_ = w_.vec("output_hc_base.weight", N);
    out_hc_scale_ = w_.vec("output_hc_scale.weight", 1);

    layers_.resize((size_t)h.n_layer);
    for (int il = 0; il < h.n_layer; il++) {
        Ds4Layer &L = layers_[(size_t)il];
        L.ratio = h.ratio[(size_t)il];
        L.csa = h.csa(il);
        L.hc_attn_fn = up(w_.matrix(blk(il, "hc_attn_fn.weight"), N * D, mix));
        L.hc_attn_base = w_.vec(blk(il, "hc_attn_base.weight"), mix);
        L.hc_attn_scale = w_.vec(blk(il, "hc_attn_scale.weight"), 3);
        L.hc_ffn_fn = up(w_.matrix(blk(il, "hc_ffn_fn.weight"), N * D, mix));
        L.hc_ffn_base = w_.vec(blk(il, "hc_ffn_base.weight"), mix);
        L.hc_ffn_scale = w_.vec(blk(il, "hc_ffn_scale.weight"), 3);
        L.attn_norm = w_.vec(blk(il, "attn_norm.weight"), D);
        L.wq_a = w_.matrix(blk(il, "attn_q_a.weight"), D, h.q_lora);
        L.q_norm = w_.vec(blk(il, "attn_q_a_norm.weight"), h.q_lora);
        L.wq_b = up(w_.matrix(blk(il, "attn_q_b.weight"), h.q_lora, HD));
        L.wkv = w_.matrix(blk(il, "attn_kv.weight"), D, h.head_dim);
        L.kv_norm = w_.vec(blk(il, "attn_kv_a_norm.weight"), h.head_dim);
        L.sinks = w_.vec(blk(il, "attn_sinks.weight"), h.n_head);
        L.wo_a = up(w_.matrix(blk(il, "attn_output_a.weight"), HD / h.o_groups, (int64_t)h.o_groups * h.o_lora));
        L.wo_b = up(w_.matrix(blk(il, "attn_output_b.weight"), (int64_t)h.o_groups * h.o_lora, D));
        if (L.ratio) {
            const int cw = h.comp_width(il);
            L.c_kv = w_.matrix(blk(il, "attn_compressor_kv.weight"), D, cw);
            L.c_gate = w_.matrix(blk(il, "attn_compressor_gate.weight"), D, cw);
            L.c_ape = w_.vec(blk(il, "attn_compressor_ape.weight"), cw, L.ratio);
            L.c_norm = w_.vec(blk(il, "attn_compressor_norm.weight"), h.head_dim);
        }
        if (L.csa) {
            L.i_q_b = up(w_.matrix(blk(il, "indexer.attn_q_b.weight"), h.q_lora, (int64_t)h.idx_heads * h.idx_dim));
            L.i_proj = w_.matrix(blk(il, "indexer.proj.weight"), D, h.idx_heads);
            L.i_kv = w_.matrix(blk(il, "indexer_compressor_kv.weight"), D, 2 * h.idx_dim);
            L.i_gate = w_.matrix(blk(il, "indexer_compressor_gate.weight"), D, 2 * h.idx_dim);
            L.i_ape = w_.vec(blk(il, "indexer_compressor_ape.weight"), 2 * h.idx_dim, L.ratio);
            L.i_norm = w_.vec(blk(il, "indexer_compressor_norm.weight"), h.idx_dim);
        }
        L.ffn_norm = w_.vec(blk(il, "ffn_norm.weight"), D);
        L.gate_inp = up(w_.matrix(blk(il, "ffn_gate_inp.weight"), D, h.n_expert));
        if (il < h.n_hash) {
            const dfl_tensor &t = w_.need(blk(il, "ffn_gate_tid2eid.weight"));
            if (t.type != 26 /* ggml I32 */ || t.n_dims != 2 || t.dims[1] != (uint64_t)h.n_vocab)
                fail(DFL_ERR_INVALID, "tensor " + blk(il, "ffn_gate_tid2eid.weight") + " must be I32 [k, vocab], has " + dims_str(t));
            L.k_table = (int)t.dims[0];
            if (h.n_used > L.k_table)
                fail(DFL_ERR_INVALID, "deepseek4.expert_used_count " + std::to_string(h.n_used) + " exceeds the " +
                                          std::to_string(L.k_table) + " experts per token of the hash table of layer " +
                                          std::to_string(il));
            const size_t n = (size_t)L.k_table * (size_t)h.n_vocab;
            if (t.size < n * 4) fail(DFL_ERR_INVALID, "tensor " + blk(il, "ffn_gate_tid2eid.weight") + " has too few bytes");
            const int32_t *ids = (const int32_t *)t.data;
            for (size_t i = 0; i < n; i++)
                if (ids[i] < 0 || ids[i] >= h.n_expert)
                    fail(DFL_ERR_INVALID, "tensor " + blk(il, "ffn_gate_tid2eid.weight") + " holds expert id " +
                                              std::to_string(ids[i]) + " outside [0, " + std::to_string(h.n_expert) + ")");
            L.tid2eid = (const int32_t *)w_.upload_copy(t.data, n * 4);
        } else {
            L.exp_bias = w_.find(blk(il, "exp_probs_b.bias")) ? w_.vec(blk(il, "exp_probs_b.bias"), h.n_expert) : nullptr;
        }
        // expert stacks are multiplied by row slices (moe_experts): checked for the device's kernels, uploaded, and
        // given the device's own layout only where a slice can use it (device_packs_stacks: the CPU's)
        auto stack = [&](const char *name, int64_t n_in, int64_t n_out) {
            Weight w = w_.stack(blk(il, name), n_in, n_out, h.n_expert);
            dev_->check_stack(w, blk(il, name));
            w_.upload(w);
            if (device_packs_stacks()) dev_->prepare_weight(w);
            return w;
        };
        L.exp_gate = stack("ffn_gate_exps.weight", D, h.n_ff);
        L.exp_up = stack("ffn_up_exps.weight", D, h.n_ff);
        L.exp_down = stack("ffn_down_exps.weight", h.n_ff, D);
        if (h.n_shared > 0) {
            const int64_t sf = (int64_t)h.n_ff * h.n_shared;
            L.sh_gate = w_.matrix(blk(il, "ffn_gate_shexp.weight"), D, sf);
            L.sh_up = w_.matrix(blk(il, "ffn_up_shexp.weight"), D, sf);
            L.sh_down = up(w_.matrix(blk(il, "ffn_down_shexp.weight"), sf, D));
        }
        L.in_q = w_.fuse({&L.wq_a, &L.wkv});
        Weight *cparts[] = {&L.c_kv, &L.c_gate, &L.i_kv, &L.i_gate, &L.i_proj};  // attention_layer's order
        L.in_c = w_.fuse(std::vector<Weight *>(cparts, cparts + (L.csa ? 5 : L.ratio ? 2 : 0)));
        L.sh_in = h.n_shared > 0 ? w_.fuse({&L.sh_gate, &L.sh_up}) : Weight{};
    }
    w_.done();
}

void DeepSeek4Model::layout_state() {
    const Ds4HParams &h = hp_;
    int64_t off = 0, rec = 0;
    rec_ring_off_.assign((size_t)h.n_layer, -1);
    rec_comp_off_.assign((size_t)h.n_layer, -1);
    rec_idx_off_.assign((size_t)h.n_layer, -1);
    for (int il = 0; il < h.n_layer; il++) {
        Ds4Layer &L = layers_[(size_t)il];
        L.ring_off = off;
        off += (int64_t)h.window * h.head_dim;
        rec_ring_off_[(size_t)il] = rec;
        rec += h.head_dim;
        if (L.ratio) {
            L.comp_off = off;
            off += (int64_t)(L.csa ? 4 : 2) * L.ratio * h.comp_width(il);
            rec_comp_off_[(size_t)il] = rec;
            rec += 2 * (int64_t)h.comp_width(il);
        }
        if (L.csa) {
            L.idx_off = off;
            off += 4ll * L.ratio * 2 * h.idx_dim;
            rec_idx_off_[(size_t)il] = rec;
            rec += 4ll * h.idx_dim;
        }
    }
    slot_floats_ = off;
    rec_floats_ = rec;
}

void DeepSeek4Model::ensure_acts(int64_t T) {
    if (T <= acts_.cap) return;
    graphs_.drop(*dev_);  // they point at the old activations
    const int64_t cap = std::max<int64_t>(T, acts_.cap * 2);
    const Ds4HParams &h = hp_;
    Acts &a = acts_;
    a = Acts{};
    auto mk = [&](DevBuf &b, int64_t per_token, const char *what, size_t elem = sizeof(float)) {
        b = DevBuf(dev_.get(), (size_t)(cap * std::max<int64_t>(per_token, 1)) * elem, what);
    };
    const int64_t D = h.n_embd, N = h.hc, HD = (int64_t)h.n_head * h.head_dim;
    int64_t cw = 1;
    for (int il = 0; il < h.n_layer; il++)
        if (h.compressing(il)) cw = std::max<int64_t>(cw, h.comp_width(il));
    mk(a.X, N * D, "activations");
    mk(a.X2, N * D, "activations");
    mk(a.flat, N * D, "activations");
    mk(a.mix, (2 + N) * N, "activations");
    mk(a.post, N, "activations");
    mk(a.comb, N * N, "activations");
    mk(a.x, D, "activations");
    mk(a.h, D, "activations");
    mk(a.F, D, "activations");
    mk(a.qa, h.q_lora, "activations");
    mk(a.q, HD, "activations");
    mk(a.kv, h.head_dim, "activations");
    mk(a.attn, HD, "activations");
    mk(a.grp_in, HD / h.o_groups, "activations");
    mk(a.grp_out, h.o_lora, "activations");
    mk(a.cat, (int64_t)h.o_groups * h.o_lora, "activations");
    mk(a.ckv, cw, "activations");
    mk(a.cgate, cw, "activations");
    mk(a.ikv, 2 * h.idx_dim, "activations");
    mk(a.igate, 2 * h.idx_dim, "activations");
    mk(a.iq, (int64_t)h.idx_heads * h.idx_dim, "activations");
    mk(a.iw, h.idx_heads, "activations");
    mk(a.sel, h.idx_top_k, "activations", sizeof(int32_t));
    mk(a.logit_e, h.n_expert, "activations");
    mk(a.ids, h.n_used, "activations", sizeof(int32_t));
    mk(a.wts, h.n_used, "activations");
    mk(a.sh_g, (int64_t)h.n_ff * std::max(1, h.n_shared), "activations");
    mk(a.sh_u, (int64_t)h.n_ff * std::max(1, h.n_shared), "activations");
    mk(a.moe, D, "activations");
    if (dev_->copies_weights()) {
        // the fused products run for at most kFusedMaxTokens tokens; in_c's outputs lie after in_q's
        int64_t widest = 1;
        for (const Ds4Layer &L : layers_)
            widest = std::max({widest, L.in_q_rows() + L.in_c.n_out, L.sh_in.n_out});
        a.fused = DevBuf(dev_.get(), (size_t)(widest * std::min<int64_t>(cap, kFusedMaxTokens)) * sizeof(float), "activations");
    }
    a.cap = cap;
}

// ---------------------------------------------------------------------------------------------------------------------

// mHC pre of one site over T tokens: x (sub-block input), post and comb from the streams X, and h = rmsnorm(x).
void DeepSeek4Model::hc_site(const Weight &fn, const float *base, const float *scale, const float *norm_w, int64_t T) {
    const Ds4HParams &h = hp_;
    Acts &a = acts_;
    const int64_t ND = (int64_t)h.hc * h.n_embd;
    const bool fold = dev_->hc_fold();  // the norm applied to the product, inside hc_pre (it is linear)
    HcPreCall c;
    c.norm = fold;
    c.norm_eps = h.eps;
    c.mix = a.mix.f();
    c.base = base;
    c.scale = scale;
    c.X = a.X.f();
    c.T = T;
    c.D = h.n_embd;
    c.N = h.hc;
    c.iters = h.sinkhorn;
    c.eps = h.hc_eps;
    c.x = a.x.f();
    c.post = a.post.f();
    c.comb = a.comb.f();
    if (fold) {
        dev_->hc_site(fn, c, a.mix.f(), norm_w, h.eps, a.h.f());  // (the product of the raw streams first)
    } else {
        dev_->rmsnorm(a.X.f(), nullptr, a.flat.f(), T, ND, h.eps);
        dev_->matmul(fn, a.flat.f(), T, a.mix.f());
        dev_->hc_pre_norm(c, norm_w, h.eps, a.h.f());
    }
}

// mHC post: the streams become post * F + comb^T X (through X2, then swapped); the shared expert's output, where
// set, is added to F first.
void DeepSeek4Model::hc_merge(int64_t T, SubOut o, const Weight *next) {
    Acts &a = acts_;
    HcPostCall c;
    c.F = a.F.f();
    c.F2 = o.shared;
    c.X = a.X.f();
    c.post = a.post.f();
    c.comb = a.comb.f();
    c.T = T;
    c.D = hp_.n_embd;
    c.N = hp_.hc;
    c.out = a.X2.f();
    c.next_fn = dev_->hc_fold() ? next : nullptr;  // (the folded site multiplies the raw streams: out itself)
    dev_->hc_post(c);
    std::swap(a.X, a.X2);
}

// Copies rows [0, n) of each step entry's tokens (width floats, contiguous) into the recording of its sequence, at
// the entry's token offset, column rec_off.
void DeepSeek4Model::record_rows(const std::vector<StepEntry> &es, const float *src, int64_t width, int64_t rec_off) {
    int64_t t0 = 0;
    for (const StepEntry &se : es) {
        if (se.record)
            dev_->copy_rows(rec_[(size_t)se.seq].tokens.f() + (int64_t)se.off * rec_floats_ + rec_off, rec_floats_,
                            src + t0 * width, width, se.n, width);
        t0 += se.n;
    }
}

// Feeds T tokens' compressor inputs (c = wkv · h, z = wgate · h) of layer il's attention compressor, or its indexer's,
// closing (and storing) the windows they complete.
void DeepSeek4Model::run_compressor(int il, bool indexer, const BatchMeta &m, const float *kv, const float *gate) {
    const Ds4HParams &h = hp_;
    const Ds4Layer &L = layers_[(size_t)il];
    const uint32_t bs = table_.block_size();
    Ds4CompressCall c;
    c.kv = kv;
    c.gate = gate;
    c.ape = indexer ? L.i_ape : L.c_ape;
    c.norm = indexer ? L.i_norm : L.c_norm;
    c.inv_freq = inv_comp_;
    c.ratio = L.ratio;
    c.head_dim = indexer ? h.idx_dim : h.head_dim;
    c.rope_dim = h.rope_dim;
    c.overlap = indexer || L.csa;
    c.eps = h.eps;
    c.state = states_.f() + (indexer ? L.idx_off : L.comp_off);
    c.slot_stride = slot_floats_;
    c.rows = (indexer ? idx_rows_ : comp_rows_)[(size_t)L.comp_pool].f();
    c.block_size = (int)bs;
    c.rows_per_block = ds4_rows_per_block((int)bs, L.ratio);
    dev_->ds4_compress(m, c);
}

void DeepSeek4Model::attention_layer(int il, const BatchMeta &m, bool dense, const std::vector<StepEntry> &es) {
    const Ds4HParams &h = hp_;
    const Ds4Layer &L = layers_[(size_t)il];
    Acts &a = acts_;
    const int64_t T = m.T, H = h.n_head, hd = h.head_dim, HD = H * hd;
    const float *inv = L.ratio ? inv_comp_ : inv_main_;
    const uint32_t bs = table_.block_size();
    const int rpb = L.ratio ? ds4_rows_per_block((int)bs, L.ratio) : 1;
    auto rope_call = [&](float *x, int64_t stride, int n_head, int head_dim, const float *f, bool inverse) {
        RopeTailCall r;
        r.x = x;
        r.rows = T;
        r.row_stride = stride;
        r.n_head = n_head;
        r.head_dim = head_dim;
        r.rope_dim = h.rope_dim;
        r.pos = m.pos;
        r.inv_freq = f;
        r.inverse = inverse;
        return r;
    };
    auto rope = [&](float *x, int64_t stride, int n_head, int head_dim, const float *f, bool inverse) {
        dev_->rope_tail(rope_call(x, stride, n_head, head_dim, f, inverse));
    };
    // the products of the sub-block input, in two (where fused): the query's low rank and the shared K = V row, then
    // the compressors' and the indexer's inputs (outputs inside acts_.fused for one token, the second after the first)
    const std::vector<float *> qk = project(*dev_, L.in_q, {{&L.wq_a, a.qa.f()}, {&L.wkv, a.kv.f()}}, a.h.f(), T, a.fused.f());
    float *qa = qk[0], *kv = qk[1];
    // in_c's parts, in load_weights' order: the compressor's two (ratio > 0), then the indexer's three (CSA layers)
    const std::pair<const Weight *, float *> call[] = {{&L.c_kv, a.ckv.f()}, {&L.c_gate, a.cgate.f()}, {&L.i_kv, a.ikv.f()},
                                                       {&L.i_gate, a.igate.f()}, {&L.i_proj, a.iw.f()}};
    const std::vector<std::pair<const Weight *, float *>> couts(call, call + (L.csa ? 5 : L.ratio ? 2 : 0));
    std::vector<float *> cin;
    auto compress = [&](bool indexer, const float *ckv, const float *cg) {
        const int width = indexer ? 2 * h.idx_dim : h.comp_width(il);
        const int64_t rec_off = indexer ? rec_idx_off_[(size_t)il] : rec_comp_off_[(size_t)il];
        record_rows(es, ckv, width, rec_off);
        record_rows(es, cg, width, rec_off + width);
        run_compressor(il, indexer, m, ckv, cg);
    };
    // on the device's side lane, beside the query: the shared K = V row (normed, rotated, recorded) and the
    // compressors (inputs, windows, stored rows). They read kv and h alone, and what they write only the indexer and
    // the attention read, after join_side.
    dev_->side_begin();
    dev_->norm_rope_tail(L.kv_norm, h.eps, rope_call(kv, hd, 1, (int)hd, inv, false));
    record_rows(es, kv, hd, rec_ring_off_[(size_t)il]);
    if (!couts.empty()) {
        cin = project(*dev_, L.in_c, couts, a.h.f(), T, a.fused.f() + std::min(a.cap, kFusedMaxTokens) * L.in_q_rows());
        if (L.ratio) compress(false, cin[0], cin[1]);
        if (L.csa) compress(true, cin[2], cin[3]);
    }
    dev_->side_end();
    // query: low rank, normed, per-head unweighted RMSNorm, rotated
    dev_->rmsnorm(qa, L.q_norm, qa, T, h.q_lora, h.eps);
    dev_->matmul(L.wq_b, qa, T, a.q.f());
    dev_->norm_rope_tail(nullptr, h.eps, rope_call(a.q.f(), HD, (int)H, (int)hd, inv, false));

    const int32_t *sel = nullptr;
    if (L.csa) {
        if (!dense) {
            // the lightning indexer picks the compressed rows each token attends to
            dev_->matmul(L.i_q_b, qa, T, a.iq.f());
            rope(a.iq.f(), (int64_t)h.idx_heads * h.idx_dim, h.idx_heads, h.idx_dim, inv_comp_, false);
            Ds4IndexerCall ic;
            ic.q = a.iq.f();
            ic.w = cin[4];
            ic.keys = idx_rows_[(size_t)L.comp_pool].f();
            ic.n_head = h.idx_heads;
            ic.head_dim = h.idx_dim;
            ic.ratio = L.ratio;
            ic.top_k = h.idx_top_k;
            ic.head_scale = 1.0f / std::sqrt((float)h.idx_heads);
            ic.dot_scale = 1.0f / std::sqrt((float)h.idx_dim);
            ic.block_size = (int)bs;
            ic.rows_per_block = rpb;
            ic.sel = a.sel.get<int32_t>();
            dev_->join_side();  // (the indexer's keys and weights)
            dev_->ds4_indexer_topk(m, ic);
            sel = a.sel.get<int32_t>();
        }
    }
    dev_->join_side();  // (K = V and the compressed rows)
    Ds4AttnCall c;
    c.Q = a.q.f();
    c.kv = kv;
    c.ring = states_.f() + L.ring_off;
    c.slot_stride = slot_floats_;
    c.window = h.window;
    c.comp = L.ratio ? comp_rows_[(size_t)L.comp_pool].f() : nullptr;
    c.ratio = L.ratio;
    c.block_size = (int)bs;
    c.rows_per_block = rpb;
    c.sel = sel;
    c.top_k = h.idx_top_k;
    c.sinks = L.sinks;
    c.n_head = (int)H;
    c.head_dim = (int)hd;
    c.scale = 1.0f / std::sqrt((float)hd);
    c.out = a.attn.f();
    // values carry RoPE (K = V): the output is un-rotated so it depends on relative position only
    c.unrotate = inv;
    c.rope_dim = h.rope_dim;
    // the window rows into the ring, by the attention op where no query of the step reads the rows they replace
    c.ring_write = m.max_n == 1;
    dev_->ds4_attention(m, c);
    if (!c.ring_write) dev_->ds4_ring_write(m, ds4_ring_write_call(c));
    // grouped low-rank output projection: every group at once where the device takes T tokens so (one token always),
    // else each group's input columns gathered, its product scattered into its columns of cat
    if (!dev_->matmul_grouped(L.wo_a, h.o_groups, a.attn.f(), T, a.cat.f())) {
        const int64_t gin = HD / h.o_groups;
        for (int g = 0; g < h.o_groups; g++) {
            dev_->copy_rows(a.grp_in.f(), gin, a.attn.f() + g * gin, HD, T, gin);
            dev_->matmul(L.wo_a.rows((int64_t)g * h.o_lora, h.o_lora), a.grp_in.f(), T, a.grp_out.f());
            dev_->copy_rows(a.cat.f() + (int64_t)g * h.o_lora, (int64_t)h.o_groups * h.o_lora, a.grp_out.f(), h.o_lora, T,
                            h.o_lora);
        }
    }
    dev_->matmul(L.wo_b, a.cat.f(), T, a.F.f());
}

DeepSeek4Model::SubOut DeepSeek4Model::moe_layer(int il, const BatchMeta &m) {
    const Ds4HParams &h = hp_;
    const Ds4Layer &L = layers_[(size_t)il];
    Acts &a = acts_;
    const int64_t T = m.T;
    dev_->matmul(L.gate_inp, a.h.f(), T, a.logit_e.f());  // (first: it takes the int8 h that hc_pre_norm staged)
    SubOut o;
    if (h.n_shared > 0) {
        // the shared expert (weight 1: F = routed + shared) on the device's side lane, beside the routing and the
        // routed experts: it reads h alone and writes what only hc_merge reads, after join_side
        dev_->side_begin();
        const int64_t sf = (int64_t)h.n_ff * h.n_shared;
        const std::vector<float *> gu =
            project(*dev_, L.sh_in, {{&L.sh_gate, a.sh_g.f()}, {&L.sh_up, a.sh_u.f()}}, a.h.f(), T, a.fused.f());
        dev_->swiglu_clamp(gu[0], gu[1], T * sf, h.clamp_shexp[(size_t)il]);
        dev_->matmul(L.sh_down, gu[0], T, a.moe.f());
        o.shared = a.moe.f();  // added to the routed experts' F by hc_merge
        dev_->side_end();
    }
    MoeRouteCall r;
    r.logits = a.logit_e.f();
    r.bias = L.exp_bias;
    r.tid2eid = L.tid2eid;
    r.tokens = m.tokens;
    r.T = T;
    r.n_expert = h.n_expert;
    r.k = h.n_used;
    r.k_table = L.k_table;
    r.norm = h.weights_norm;
    r.scale = h.routed_scale;
    r.ids = a.ids.get<int32_t>();
    r.weights = a.wts.f();
    dev_->moe_route(r);
    MoeExpertsCall e;
    e.x = a.h.f();
    e.gate = L.exp_gate;
    e.up = L.exp_up;
    e.down = L.exp_down;
    e.T = T;
    e.n_expert = h.n_expert;
    e.n_ff = h.n_ff;
    e.n_embd = h.n_embd;
    e.k = h.n_used;
    e.limit = h.clamp_exp[(size_t)il];
    e.ids = a.ids.get<int32_t>();
    e.weights = a.wts.f();
    e.out = a.F.f();
    dev_->moe_experts(e);
    dev_->join_side();
    return o;
}

}  // namespace dfl
