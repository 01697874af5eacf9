// DeepSeek V4 sequence state: slots, snapshot / rollback, recorded forwards and truncation (spec §3.5: restore the
// slot as it was before the recorded forward, then replay the kept tokens' ring rows and compressor inputs), and
// seq_export / seq_import.
//
// Blob layout (host byte order):
//   Ds4BlobHeader (128 bytes)
//   the slot: slot_floats f32 (every layer's ring, then its compressor and indexer-compressor buffers)
//   for each compressing layer (layer order): its rows 0 .. n / ratio - 1 ([head_dim] f32 each), then for a CSA layer
//   its index keys 0 .. n / ratio - 1 ([idx_dim] f32 each)
#include <algorithm>
#include <cstring>

#include "arch/deepseek4.h"
#include "core/sized.h"

namespace dfl {

namespace {

constexpr char kMagic[8] = {'D', 'F', 'L', 'D', 'S', '4', '\0', '\0'};
constexpr uint32_t kFormat = 1;

struct Ds4BlobHeader {
    char magic[8];
    uint32_t format, header_bytes;
    uint32_t n_layer, n_embd, n_vocab, head_dim, idx_dim, window, rope_dim, n_tokens;
    uint64_t slot_floats;
    uint64_t shape_hash;     // of the per-layer compress ratios and the dims above
    uint64_t payload_bytes;  // bytes after the header
    uint64_t payload_hash;
    uint8_t reserved[40];
    uint64_t header_hash;    // of the header bytes before this field
};
static_assert(sizeof(Ds4BlobHeader) == 128, "Ds4BlobHeader layout");

// FNV-1a over 64-bit words (then the tail bytes): catches damaged or truncated blobs, not an adversary.
uint64_t hash_bytes(const void *data, uint64_t n, uint64_t h = 0xcbf29ce484222325ull) {
    const uint8_t *p = (const uint8_t *)data;
    uint64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        std::memcpy(&w, p + i, 8);
        h = (h ^ w) * 0x100000001b3ull;
        h ^= h >> 29;
    }
    for (; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

}  // namespace

uint64_t DeepSeek4Model::comp_bytes_per_token() const {
    const uint32_t bs = table_.block_size();
    uint64_t per_block = 0;
    for (const Ds4Layer &L : layers_) {
        if (!L.ratio) continue;
        per_block += (uint64_t)ds4_rows_per_block((int)bs, L.ratio) * (uint64_t)(hp_.head_dim + (L.csa ? hp_.idx_dim : 0)) * 4;
    }
    return (per_block + bs - 1) / bs;
}

void DeepSeek4Model::info(dfl_model_info *out) const {
    dfl_model_info i;
    std::memset(&i, 0, sizeof i);
    i.struct_size = sizeof i;
    std::snprintf(i.arch, sizeof i.arch, "%s", "deepseek4");
    i.n_layer = (uint32_t)hp_.n_layer;
    i.n_embd = (uint32_t)hp_.n_embd;
    i.n_vocab = (uint32_t)hp_.n_vocab;
    i.n_ctx_train = (uint32_t)hp_.n_ctx_train;
    i.n_head = (uint32_t)hp_.n_head;
    i.n_head_kv = 1;
    i.head_dim = (uint32_t)hp_.head_dim;
    i.n_ff = (uint32_t)hp_.n_ff;
    i.n_attn_layers = (uint32_t)hp_.n_layer;
    i.n_recurrent_layers = 0;
    i.kv_block_size = table_.block_size();
    i.kv_blocks_total = table_.n_blocks();
    i.max_seqs = table_.max_seqs();
    i.cache_type_k = DFL_TYPE_F32;
    i.cache_type_v = DFL_TYPE_F32;
    i.n_threads = n_threads_;
    i.kv_bytes_per_token = comp_bytes_per_token();
    i.state_bytes_per_seq = slot_bytes();
    i.weight_bytes = w_.bytes();
    i.rms_eps = hp_.eps;
    i.rope_theta = hp_.theta;
    i.rope_dim = (uint32_t)hp_.rope_dim;
    write_sized(out, i);
}

void DeepSeek4Model::kv_stats(dfl_kv_stats *out) const { table_.kv_stats(out); }

int32_t DeepSeek4Model::seq_alloc() {
    const int32_t s = table_.alloc();
    dev_->zero(slot_ptr(s), slot_bytes());
    return s;
}

void DeepSeek4Model::seq_free(int32_t s) { table_.free(s); }

void DeepSeek4Model::seq_reserve(int32_t s, uint32_t n_tokens) { table_.reserve(s, n_tokens); }

uint32_t DeepSeek4Model::seq_length(int32_t s) const { return table_.get(s).len; }

// Rebuilds the slot of sequence s after tokens [base, base + k) of its recorded forward from the recording's slot
// copy (restored by the caller): their ring rows go back into the rings and their compressor inputs through the
// compressors again (windows closing among them are pooled again, into the same rows, with the same values).
void DeepSeek4Model::replay(int32_t s, uint32_t base, uint32_t k) {
    if (k == 0) return;
    const Ds4HParams &h = hp_;
    const Seq &q = table_.get(s);
    const SeqRec &rc = rec_[(size_t)s];
    ensure_acts(k);
    const int64_t T = k;
    const size_t nb = std::max<size_t>(1, q.blocks.size());
    const size_t n_meta = (size_t)(3 * T + 4 + (int64_t)nb);
    ensure(acts_.meta, n_meta * sizeof(int32_t), "batch metadata");
    host_meta_.assign(n_meta, 0);
    int32_t *pos = host_meta_.data() + T, *t0 = pos + 2 * T;
    for (int64_t t = 0; t < T; t++) pos[t] = (int32_t)(base + t);
    t0[0] = 0;
    t0[1] = (int32_t)k;
    t0[2] = (int32_t)base;
    t0[3] = s;
    for (size_t b = 0; b < q.blocks.size(); b++) t0[4 + b] = q.blocks[b];
    dev_->to_device(acts_.meta.get(), host_meta_.data(), n_meta * sizeof(int32_t));
    const int32_t *dm = acts_.meta.get<int32_t>();
    BatchMeta m;
    m.T = T;
    m.n_ent = 1;
    m.max_n = T;
    m.max_ctx = base + T;
    m.tokens = dm;
    m.pos = dm + T;
    m.ent = dm + 2 * T;
    m.t0 = dm + 3 * T;
    m.n = m.t0 + 1;
    m.len0 = m.t0 + 2;
    m.slot = m.t0 + 3;
    m.block_table = m.t0 + 4;
    m.max_blocks = (int32_t)nb;
    const float *rec = rc.tokens.f();
    Acts &a = acts_;
    for (int il = 0; il < h.n_layer; il++) {
        const Ds4Layer &L = layers_[(size_t)il];
        dev_->copy_rows(a.kv.f(), h.head_dim, rec + rec_ring_off_[(size_t)il], rec_floats_, T, h.head_dim);
        Ds4RingWrite rw;
        rw.kv = a.kv.f();
        rw.ring = states_.f() + L.ring_off;
        rw.slot_stride = slot_floats_;
        rw.window = h.window;
        rw.head_dim = h.head_dim;
        dev_->ds4_ring_write(m, rw);
        for (int indexer = 0; indexer < (L.csa ? 2 : (L.ratio ? 1 : 0)); indexer++) {
            const int width = indexer ? 2 * h.idx_dim : h.comp_width(il);
            const int64_t off = indexer ? rec_idx_off_[(size_t)il] : rec_comp_off_[(size_t)il];
            dev_->copy_rows(a.ckv.f(), width, rec + off, rec_floats_, T, width);
            dev_->copy_rows(a.cgate.f(), width, rec + off + width, rec_floats_, T, width);
            run_compressor(il, indexer != 0, m, a.ckv.f(), a.cgate.f());
        }
    }
}

void DeepSeek4Model::seq_truncate(int32_t s, uint32_t n) {
    Seq &q = table_.get(s);
    const std::string who = "truncate sequence " + std::to_string(s) + " to " + std::to_string(n) + " tokens";
    if (n > q.len) fail(DFL_ERR_INVALID, who + ": it holds only " + std::to_string(q.len));
    if (n == q.len) return;
    if (n == 0) {
        dev_->zero(slot_ptr(s), slot_bytes());
    } else if (q.rec && n >= q.rec_base && n <= q.rec_base + q.rec_n) {
        dev_->copy(slot_ptr(s), rec_[(size_t)s].base.get(), slot_bytes());
        replay(s, q.rec_base, n - q.rec_base);
        q.rec_n = n - q.rec_base;
    } else {
        fail(DFL_ERR_STATE, who + ": its window ring and compressor state were not recorded there (forward with DFL_SEQ_RECORD)");
    }
    table_.set_length(q, n);
}

void DeepSeek4Model::seq_snapshot(int32_t s) {
    table_.get(s);  // (s checked before its state is copied)
    SeqRec &rc = rec_[(size_t)s];
    ensure(rc.snap, slot_bytes(), "sequence snapshot");
    dev_->copy(rc.snap.get(), slot_ptr(s), slot_bytes());
    table_.mark_snapshot(s);
}

void DeepSeek4Model::seq_rollback(int32_t s) {
    Seq &q = table_.snapshot_of(s);
    // compressed rows are append-only: those of windows before the snapshot's length are untouched
    dev_->copy(slot_ptr(s), rec_[(size_t)s].snap.get(), slot_bytes());
    q.rec = false;
    table_.set_length(q, q.snap_len);
}

// ---------------------------------------------------------------------------------------------------------------------

static Ds4BlobHeader blob_header(const Ds4HParams &h, uint64_t slot_floats, uint32_t n) {
    Ds4BlobHeader b;
    std::memset(&b, 0, sizeof b);
    std::memcpy(b.magic, kMagic, sizeof kMagic);
    b.format = kFormat;
    b.header_bytes = sizeof b;
    b.n_layer = (uint32_t)h.n_layer;
    b.n_embd = (uint32_t)h.n_embd;
    b.n_vocab = (uint32_t)h.n_vocab;
    b.head_dim = (uint32_t)h.head_dim;
    b.idx_dim = (uint32_t)h.idx_dim;
    b.window = (uint32_t)h.window;
    b.rope_dim = (uint32_t)h.rope_dim;
    b.n_tokens = n;
    b.slot_floats = slot_floats;
    b.shape_hash = hash_bytes(h.ratio.data(), h.ratio.size() * sizeof(int));
    uint64_t rows = 0;
    for (int il = 0; il < h.n_layer; il++)
        if (h.compressing(il)) rows += (uint64_t)(n / (uint32_t)h.ratio[(size_t)il]) * (h.head_dim + (h.csa(il) ? h.idx_dim : 0));
    b.payload_bytes = (slot_floats + rows) * sizeof(float);
    return b;
}

template <class F>
void DeepSeek4Model::each_comp_row(const Seq &q, uint32_t n, F f) const {
    const int bs = (int)table_.block_size();
    for (const Ds4Layer &L : layers_) {
        if (!L.ratio) continue;
        const int rpb = ds4_rows_per_block(bs, L.ratio);
        for (int pool = 0; pool < (L.csa ? 2 : 1); pool++) {
            const int dim = pool ? hp_.idx_dim : hp_.head_dim;
            float *rows = (pool ? idx_rows_ : comp_rows_)[(size_t)L.comp_pool].f();
            for (int64_t w = 0; w < (int64_t)(n / (uint32_t)L.ratio); w++)
                f(rows + ds4_comp_row(q.blocks.data(), w, L.ratio, bs, rpb) * dim, dim);
        }
    }
}

uint64_t DeepSeek4Model::seq_export(int32_t s, void *buf, uint64_t size) {
    const Seq &q = table_.get(s);
    Ds4BlobHeader b = blob_header(hp_, (uint64_t)slot_floats_, q.len);
    const uint64_t needed = sizeof b + b.payload_bytes;
    if (!buf || size < needed) return needed;
    uint8_t *out = (uint8_t *)buf + sizeof b;
    dev_->to_host(out, slot_ptr(s), slot_bytes());
    out += slot_bytes();
    each_comp_row(q, q.len, [&](const float *row, int dim) {
        dev_->to_host(out, row, (size_t)dim * 4);
        out += (size_t)dim * 4;
    });
    b.payload_hash = hash_bytes((const uint8_t *)buf + sizeof b, b.payload_bytes);
    b.header_hash = hash_bytes(&b, offsetof(Ds4BlobHeader, header_hash));
    std::memcpy(buf, &b, sizeof b);
    return needed;
}

void DeepSeek4Model::seq_import(int32_t s, const void *buf, uint64_t size) {
    Seq &q = table_.get(s);
    const std::string who = "import into sequence " + std::to_string(s);
    if (q.len != 0) fail(DFL_ERR_STATE, who + ": the sequence is not empty (" + std::to_string(q.len) + " tokens)");
    if (!buf || size < sizeof(Ds4BlobHeader)) fail(DFL_ERR_INVALID, who + ": the blob is shorter than its header");
    Ds4BlobHeader b;
    std::memcpy(&b, buf, sizeof b);
    if (std::memcmp(b.magic, kMagic, sizeof kMagic) != 0 || b.format != kFormat || b.header_bytes != sizeof b)
        fail(DFL_ERR_INVALID, who + ": not a deepseek4 sequence blob of format " + std::to_string(kFormat));
    if (b.header_hash != hash_bytes(&b, offsetof(Ds4BlobHeader, header_hash)))
        fail(DFL_ERR_INVALID, who + ": the blob header is damaged");
    const Ds4BlobHeader want = blob_header(hp_, (uint64_t)slot_floats_, b.n_tokens);
    if (b.n_layer != want.n_layer || b.n_embd != want.n_embd || b.n_vocab != want.n_vocab || b.head_dim != want.head_dim ||
        b.idx_dim != want.idx_dim || b.window != want.window || b.rope_dim != want.rope_dim ||
        b.slot_floats != want.slot_floats || b.shape_hash != want.shape_hash)
        fail(DFL_ERR_INVALID, who + ": the blob was made by a model of another shape (layers, dims, window or compress ratios differ)");
    if (b.payload_bytes != want.payload_bytes || size < sizeof b + b.payload_bytes)
        fail(DFL_ERR_INVALID, who + ": the blob is truncated");
    const uint8_t *in = (const uint8_t *)buf + sizeof b;
    if (b.payload_hash != hash_bytes(in, b.payload_bytes)) fail(DFL_ERR_INVALID, who + ": the blob's rows are damaged");
    table_.grow(q, b.n_tokens);  // DFL_ERR_NO_KV, changing nothing, when the pool is short
    dev_->to_device(slot_ptr(s), in, slot_bytes());
    in += slot_bytes();
    each_comp_row(q, b.n_tokens, [&](float *row, int dim) {
        dev_->to_device(row, in, (size_t)dim * 4);
        in += (size_t)dim * 4;
    });
    q.rec = false;
    q.len = b.n_tokens;
}

}  // namespace dfl
