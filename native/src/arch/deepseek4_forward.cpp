// DeepSeek V4 forward: batch validation, the prefill modes (exact: token by token through the decode path; sparse:
// batched with the indexer; dense: batched, CSA layers see every visible compressed row), and one batched step.
#include <algorithm>
#include <cmath>
#include <set>

#include "arch/deepseek4.h"
#include "core/batch.h"

namespace dfl {

void DeepSeek4Model::run_step(const std::vector<StepEntry> &es, bool dense, float *logits_host, const TopKOut *topk) {
    const Ds4HParams &h = hp_;
    const int32_t E = (int32_t)es.size();
    int64_t T = 0, R = 0;
    size_t max_blocks = 1;
    // A one-token step of unrecorded entries is replayed from a captured graph (fused_decode). The graph freezes the
    // host scalars of the step, so the block table width is rounded up; the kernels read each entry's true length
    // from the metadata and take the width and max_ctx as upper bounds.
    bool graph = h.fused_decode && dev_->has_graphs() && !dense;
    for (const StepEntry &se : es) {
        T += se.n;
        R += se.logits_all ? se.n : (se.logits_last ? 1 : 0);
        max_blocks = std::max(max_blocks, table_.get(se.seq).blocks.size());
        graph = graph && se.n == 1 && !se.record;
    }
    if (graph) max_blocks = StepGraphs::table_width(max_blocks);
    ensure_acts(T);
    const size_t n_meta = (size_t)(3 * T + 4 * E + (int64_t)E * (int64_t)max_blocks + R);
    ensure(acts_.meta, n_meta * sizeof(int32_t), "batch metadata");
    if (R > 0) ensure(logits_, (size_t)R * h.n_vocab * sizeof(float), "logits");
    host_meta_.assign(n_meta, 0);
    int32_t *tokens = host_meta_.data(), *pos = tokens + T, *ent = pos + T;
    int32_t *t0 = ent + T, *nn = t0 + E, *len0 = nn + E, *slot = len0 + E, *bt = slot + E;
    int32_t *out_rows = bt + (int64_t)E * (int64_t)max_blocks;
    std::vector<int64_t> dest;  // caller row of each logits row
    int64_t t = 0, r = 0;
    for (int32_t e = 0; e < E; e++) {
        const StepEntry &se = es[(size_t)e];
        const Seq &q = table_.get(se.seq);
        t0[e] = (int32_t)t;
        nn[e] = (int32_t)se.n;
        len0[e] = (int32_t)(q.len + se.off);
        slot[e] = se.seq;
        for (size_t k = 0; k < q.blocks.size(); k++) bt[(int64_t)e * (int64_t)max_blocks + (int64_t)k] = q.blocks[k];
        for (uint32_t i = 0; i < se.n; i++, t++) {
            tokens[t] = se.sb->tokens[se.off + i];
            pos[t] = se.sb->positions ? se.sb->positions[se.off + i] : (int32_t)(q.len + se.off + i);
            ent[t] = e;
        }
        if (se.logits_all)
            for (uint32_t i = 0; i < se.n; i++) out_rows[r++] = t0[e] + (int32_t)i, dest.push_back(se.out_row + i);
        else if (se.logits_last)
            out_rows[r++] = t0[e] + (int32_t)se.n - 1, dest.push_back(se.out_row);
    }
    dev_->to_device(acts_.meta.get(), host_meta_.data(), n_meta * sizeof(int32_t));
    const int32_t *dm = acts_.meta.get<int32_t>();
    BatchMeta m;
    m.T = T;
    m.n_ent = E;
    m.tokens = dm;
    m.pos = dm + T;
    m.ent = dm + 2 * T;
    m.t0 = dm + 3 * T;
    m.n = m.t0 + E;
    m.len0 = m.n + E;
    m.slot = m.len0 + E;
    m.block_table = m.slot + E;
    m.max_blocks = (int32_t)max_blocks;
    for (int32_t e = 0; e < E; e++) {
        m.max_n = std::max<int64_t>(m.max_n, nn[e]);
        m.max_ctx = std::max<int64_t>(m.max_ctx, (int64_t)len0[e] + nn[e]);
    }
    if (graph) m.max_ctx = (int64_t)max_blocks * table_.block_size();
    const int32_t *d_out_rows = m.block_table + (int64_t)E * (int64_t)max_blocks;

    logits_dest_ = dest;
    auto layers = [&] { run_layers(m, dense, es, R, d_out_rows); };
    if (graph)
        graphs_.run(*dev_, {E, (int64_t)max_blocks, R}, layers);
    else
        layers();
    if (keeping_)
        for (int64_t i = 0; i < R; i++)
            dev_->copy(kept_.f() + dest[(size_t)i] * h.n_vocab, logits_.f() + i * h.n_vocab, (size_t)h.n_vocab * sizeof(float));
    if (R == 0) {
        dev_->sync();
        return;
    }
    if (topk) {
        const size_t bytes = topk_bytes(R, topk->k);
        ensure(topk_, bytes, "top-k candidates");
        device_topk(*dev_, logits_.f(), R, h.n_vocab, topk->k, topk_.get());
        host_topk_.resize(bytes);
        dev_->to_host(host_topk_.data(), topk_.get(), bytes);
        unpack_topk(host_topk_.data(), R, *topk, dest.data());
    } else {
        for (int64_t i = 0; i < R; i++)
            dev_->to_host(logits_host + dest[(size_t)i] * h.n_vocab, logits_.f() + i * h.n_vocab, (size_t)h.n_vocab * sizeof(float));
    }
}

// The layers and, for the R logits rows (out_rows: their tokens), the HC head, the final norm and the output
// projection into logits_. Device work only: a one-token step's run is what a captured graph replays.
void DeepSeek4Model::run_layers(const BatchMeta &m, bool dense, const std::vector<StepEntry> &es, int64_t R,
                                const int32_t *d_out_rows) {
    const Ds4HParams &h = hp_;
    Acts &a = acts_;
    const int64_t T = m.T;
    const int64_t D = h.n_embd, N = h.hc, ND = N * D;
    // every HC stream starts as the token's embedding
    dev_->embed(tok_embd_, m.tokens, T, a.x.f());
    for (int64_t i = 0; i < N; i++) dev_->copy_rows(a.X.f() + i * D, ND, a.x.f(), D, T, D);
    for (int il = 0; il < h.n_layer; il++) {
        const Ds4Layer &L = layers_[(size_t)il];
        hc_site(L.hc_attn_fn, L.hc_attn_base, L.hc_attn_scale, L.attn_norm, T);
        attention_layer(il, m, dense, es);
        hc_merge(T, SubOut{}, &L.hc_ffn_fn);
        // the FFN input's codes, made by its HC site, for both kinds of experts in a batched step (one token: slower,
        // H100 12-08 00:1x; see CudaDevice::keep_quant)
        if (T > 1) dev_->keep_quant(a.h.f());
        hc_site(L.hc_ffn_fn, L.hc_ffn_base, L.hc_ffn_scale, L.ffn_norm, T);
        const SubOut ffn = moe_layer(il, m);
        dev_->keep_quant(nullptr);
        hc_merge(T, ffn, il + 1 < h.n_layer ? &layers_[(size_t)il + 1].hc_attn_fn : nullptr);
    }
    if (R == 0) return;
    // the HC head on the logits rows, final norm, output
    dev_->gather_rows(a.X.f(), d_out_rows, R, ND, a.X2.f());
    dev_->rmsnorm(a.X2.f(), nullptr, a.flat.f(), R, ND, h.eps);
    dev_->matmul(out_hc_fn_, a.flat.f(), R, a.mix.f());
    HcHeadCall hh;
    hh.mix = a.mix.f();
    hh.base = out_hc_base_;
    hh.scale = out_hc_scale_;
    hh.X = a.X2.f();
    hh.T = R;
    hh.D = D;
    hh.N = (int)N;
    hh.eps = h.hc_eps;
    hh.y = a.x.f();
    dev_->hc_head(hh);
    dev_->rmsnorm(a.x.f(), output_norm_, a.x.f(), R, D, h.eps);
    dev_->matmul(output_, a.x.f(), R, logits_.f());
}

void DeepSeek4Model::logits_row(uint32_t row, float *out) {
    if (kept_n_ > 0) return copy_logits_row(*dev_, kept_, kept_n_, hp_.n_vocab, row, out);
    const auto at = std::find(logits_dest_.begin(), logits_dest_.end(), (int64_t)row);
    if (at == logits_dest_.end())
        fail(DFL_ERR_STATE, "logits row " + std::to_string(row) + ": the last forward kept no such row");
    copy_logits_row(*dev_, logits_, (int64_t)logits_dest_.size(), hp_.n_vocab, (uint32_t)(at - logits_dest_.begin()), out);
}

void DeepSeek4Model::forward(const dfl_batch &b, const TopKOut *topk) {
    const Ds4HParams &h = hp_;
    logits_dest_.clear();  // (set when a forward has left its rows)
    kept_n_ = 0;
    keeping_ = false;  // (a token-by-token prefill that failed may have left it set)
    if (b.n_seqs == 0) return;
    if (!b.seqs) fail(DFL_ERR_INVALID, "batch: seqs is null");
    if (b.n_capture > 0) fail(DFL_ERR_UNSUPPORTED, "deepseek4: hidden-state capture is not supported");
    std::set<int32_t> seen;
    int64_t rows = 0;
    uint32_t max_n = 0;
    for (uint32_t i = 0; i < b.n_seqs; i++) {
        const dfl_seq_batch &sb = b.seqs[i];
        const std::string who = check_batch_entry(table_, seen, i, sb, h.n_vocab);
        const Seq &q = table_.get(sb.seq);
        if ((uint64_t)q.len + sb.n_tokens > (uint64_t)INT32_MAX) fail(DFL_ERR_INVALID, who + ": sequence too long");
        rows += sb.logits == DFL_LOGITS_ALL ? sb.n_tokens : (sb.logits == DFL_LOGITS_LAST ? 1 : 0);
        max_n = std::max(max_n, sb.n_tokens);
    }
    check_batch_outputs(b, rows, topk);
    check_batch_blocks(table_, b);
    // recording buffers before any state changes
    auto records = [&](uint32_t i) { return (b.seqs[i].flags & DFL_SEQ_RECORD) != 0; };
    for (uint32_t i = 0; i < b.n_seqs; i++) {
        if (!records(i)) continue;
        SeqRec &rc = rec_[(size_t)b.seqs[i].seq];
        ensure(rc.base, (size_t)slot_floats_ * sizeof(float), "deepseek4 recording");
        if (rc.cap < b.seqs[i].n_tokens) {
            rc.tokens = DevBuf(dev_.get(), (size_t)b.seqs[i].n_tokens * (size_t)rec_floats_ * sizeof(float), "deepseek4 recording");
            rc.cap = b.seqs[i].n_tokens;
        }
    }
    for (uint32_t i = 0; i < b.n_seqs; i++) {
        Seq &q = table_.get(b.seqs[i].seq);
        table_.grow(q, q.len + b.seqs[i].n_tokens);
        q.rec = false;
        if (records(i)) dev_->copy(rec_[(size_t)b.seqs[i].seq].base.get(), slot_ptr(b.seqs[i].seq), slot_bytes());
    }

    std::vector<StepEntry> all;
    int64_t row = 0;
    for (uint32_t i = 0; i < b.n_seqs; i++) {
        const dfl_seq_batch &sb = b.seqs[i];
        StepEntry se;
        se.seq = sb.seq;
        se.n = sb.n_tokens;
        se.sb = &sb;
        se.logits_all = sb.logits == DFL_LOGITS_ALL;
        se.logits_last = sb.logits == DFL_LOGITS_LAST;
        se.out_row = row;
        se.record = records(i);
        row += se.logits_all ? sb.n_tokens : (se.logits_last ? 1 : 0);
        all.push_back(se);
    }
    if (max_n > 1 && h.prefill == Ds4Prefill::Exact) {
        // token by token: step i runs token i of every entry that has one, exactly as decoding would; a top-k
        // forward's logits rows are kept by caller row for logits_row, since the next step overwrites logits_ (a
        // whole-row forward hands them all to the caller)
        keeping_ = rows > 0 && topk;
        if (keeping_) ensure(kept_, (size_t)rows * h.n_vocab * sizeof(float), "logits rows");
        for (uint32_t i = 0; i < max_n; i++) {
            std::vector<StepEntry> step;
            for (const StepEntry &se : all) {
                if (i >= se.n) continue;
                StepEntry s = se;
                s.off = i;
                s.n = 1;
                s.logits_all = se.logits_all;
                s.logits_last = se.logits_last && i == se.n - 1;
                s.out_row = se.logits_all ? se.out_row + i : se.out_row;
                step.push_back(s);
            }
            run_step(step, false, b.logits, topk);
        }
        logits_dest_.clear();
        kept_n_ = keeping_ ? rows : 0;
        keeping_ = false;
    } else {
        run_step(all, max_n > 1 && h.prefill == Ds4Prefill::Dense, b.logits, topk);
    }
    for (uint32_t i = 0; i < b.n_seqs; i++) {
        Seq &q = table_.get(b.seqs[i].seq);
        q.rec_base = q.len;
        q.rec_n = b.seqs[i].n_tokens;
        q.rec = records(i);
        q.len += b.seqs[i].n_tokens;
    }
}

}  // namespace dfl
