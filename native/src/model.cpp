#include "model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <thread>

namespace dfl {

namespace {

struct Meta {
    std::map<std::string, const dfl_meta *> kv;
    std::string prefix;

    const dfl_meta *find(const std::string &k) const {
        auto it = kv.find(prefix + k);
        return it == kv.end() ? nullptr : it->second;
    }
    bool has(const std::string &k) const { return find(k) != nullptr; }
    int64_t i(const std::string &k) const {
        const dfl_meta *m = find(k);
        if (!m) fail(DFL_ERR_INVALID, "model metadata lacks " + prefix + k);
        if (m->kind == DFL_META_INT) return m->i;
        if (m->kind == DFL_META_INT_ARRAY && m->n > 0) {
            // per-layer arrays: accept only when uniform
            for (uint32_t j = 1; j < m->n; j++)
                if (m->ia[j] != m->ia[0])
                    fail(DFL_ERR_UNSUPPORTED, "metadata " + prefix + k + " varies per layer; not supported");
            return m->ia[0];
        }
        fail(DFL_ERR_INVALID, "metadata " + prefix + k + " is not an integer");
    }
    int64_t i(const std::string &k, int64_t def) const { return has(k) ? i(k) : def; }
    double f(const std::string &k, double def) const {
        const dfl_meta *m = find(k);
        if (!m) return def;
        if (m->kind == DFL_META_FLOAT) return m->f;
        if (m->kind == DFL_META_INT) return (double)m->i;
        fail(DFL_ERR_INVALID, "metadata " + prefix + k + " is not a number");
    }
};

int positive(int64_t v, const std::string &what) {
    if (v <= 0 || v > (1 << 30)) fail(DFL_ERR_INVALID, "model hyperparameter " + what + " = " + std::to_string(v) + " is out of range");
    return (int)v;
}

int threads_of(const dfl_model_params &p) {
    if (p.n_threads > 0) return (int)std::min<uint32_t>(p.n_threads, 256);
    const unsigned hc = std::thread::hardware_concurrency();
    return hc == 0 ? 1 : (int)hc;
}

std::string blk(int il, const char *name) { return "blk." + std::to_string(il) + "." + name; }

}  // namespace

Model::Model(const dfl_model_params &p)
    : type_k_(p.cache_type_k), type_v_(p.cache_type_v), pool_(threads_of(p)), scratch_(threads_of(p)) {
    if (!p.arch) fail(DFL_ERR_INVALID, "model params: arch is null");
    load_hparams(p);
    load_weights(p);

    if (!cache_type_ok(type_k_)) fail(DFL_ERR_UNSUPPORTED, std::string("cache type k ") + type_name(type_k_) + " is not supported");
    if (!cache_type_ok(type_v_)) fail(DFL_ERR_UNSUPPORTED, std::string("cache type v ") + type_name(type_v_) + " is not supported");
    if (n_attn_ > 0 && (hp_.head_dim % type_block(type_k_) != 0 || hp_.head_dim % type_block(type_v_) != 0))
        fail(DFL_ERR_INVALID, "head_dim " + std::to_string(hp_.head_dim) + " is not a multiple of the cache type's block");
    if (p.max_seqs == 0) fail(DFL_ERR_INVALID, "max_seqs must be at least 1");
    block_size_ = p.kv_block_size ? p.kv_block_size : 16;
    if (block_size_ > 4096) fail(DFL_ERR_INVALID, "kv_block_size " + std::to_string(block_size_) + " is too large");
    n_blocks_ = n_attn_ > 0 ? blocks_for(p.kv_pool_tokens) : 0;
    if (n_attn_ > 0 && n_blocks_ == 0) fail(DFL_ERR_INVALID, "kv_pool_tokens must be at least 1");
    k_row_ = row_bytes(type_k_, hp_.head_dim);
    v_row_ = row_bytes(type_v_, hp_.head_dim);
    const uint64_t per_layer_tokens = (uint64_t)n_blocks_ * block_size_ * (uint64_t)hp_.n_kv;
    try {
        for (int i = 0; i < n_attn_; i++) {
            // not zero-filled: rows are written before they are read
            k_cache_.emplace_back(new uint8_t[per_layer_tokens * k_row_]);
            v_cache_.emplace_back(new uint8_t[per_layer_tokens * v_row_]);
        }
        seqs_.resize(p.max_seqs);
        states_.assign((size_t)p.max_seqs * (size_t)slot_floats(), 0.0f);
    } catch (const std::bad_alloc &) {
        fail(DFL_ERR_NO_MEMORY, "cannot allocate the KV pool / recurrent state (" + std::to_string(n_blocks_) +
                                    " blocks, " + std::to_string(p.max_seqs) + " sequences)");
    }
    free_blocks_.reserve(n_blocks_);
    for (uint32_t b = n_blocks_; b > 0; b--) free_blocks_.push_back((int32_t)(b - 1));
    inv_freq_ = rope_inv_freq(hp_.theta, hp_.rope_dim);
}

void Model::load_hparams(const dfl_model_params &p) {
    hp_.arch = p.arch;
    Meta m;
    m.prefix = hp_.arch + ".";
    for (uint32_t i = 0; i < p.n_meta; i++) {
        if (!p.meta[i].key) fail(DFL_ERR_INVALID, "metadata entry " + std::to_string(i) + " has no key");
        m.kv[p.meta[i].key] = &p.meta[i];
    }
    if (hp_.arch == "qwen3") {
        hp_.hybrid = false;
    } else if (hp_.arch == "qwen35") {
        hp_.hybrid = true;
        hp_.gated_attn = true;
    } else {
        fail(DFL_ERR_UNSUPPORTED, "architecture \"" + hp_.arch + "\" is not supported by this engine (qwen3, qwen35)");
    }
    const int blocks = positive(m.i("block_count"), m.prefix + "block_count");
    const int64_t nextn = m.i("nextn_predict_layers", 0);
    if (nextn < 0 || nextn >= blocks) fail(DFL_ERR_INVALID, "metadata " + m.prefix + "nextn_predict_layers is out of range");
    hp_.n_layer = blocks - (int)nextn;
    hp_.n_embd = positive(m.i("embedding_length"), m.prefix + "embedding_length");
    hp_.n_ff = positive(m.i("feed_forward_length"), m.prefix + "feed_forward_length");
    hp_.n_head = positive(m.i("attention.head_count"), m.prefix + "attention.head_count");
    hp_.n_kv = positive(m.i("attention.head_count_kv", hp_.n_head), m.prefix + "attention.head_count_kv");
    hp_.head_dim = positive(m.i("attention.key_length", hp_.n_embd / hp_.n_head), m.prefix + "attention.key_length");
    const int vdim = positive(m.i("attention.value_length", hp_.head_dim), m.prefix + "attention.value_length");
    if (vdim != hp_.head_dim) fail(DFL_ERR_UNSUPPORTED, "attention.value_length differs from key_length");
    if (hp_.n_head % hp_.n_kv != 0) fail(DFL_ERR_INVALID, "attention.head_count is not a multiple of head_count_kv");
    hp_.eps = (float)m.f("attention.layer_norm_rms_epsilon", 1e-6);
    hp_.theta = (float)m.f("rope.freq_base", 10000.0);
    hp_.rope_dim = positive(m.i("rope.dimension_count", hp_.head_dim), m.prefix + "rope.dimension_count");
    if (hp_.rope_dim > hp_.head_dim || hp_.rope_dim % 2 != 0)
        fail(DFL_ERR_INVALID, "rope.dimension_count " + std::to_string(hp_.rope_dim) + " does not fit head_dim");
    hp_.n_ctx_train = (int)m.i("context_length", 0);
    if (hp_.hybrid) {
        hp_.full_attn_interval = positive(m.i("full_attention_interval", 4), m.prefix + "full_attention_interval");
        hp_.conv_k = positive(m.i("ssm.conv_kernel"), m.prefix + "ssm.conv_kernel");
        hp_.dk = positive(m.i("ssm.state_size"), m.prefix + "ssm.state_size");
        hp_.n_k = positive(m.i("ssm.group_count"), m.prefix + "ssm.group_count");
        hp_.n_v = positive(m.i("ssm.time_step_rank"), m.prefix + "ssm.time_step_rank");
        const int inner = positive(m.i("ssm.inner_size"), m.prefix + "ssm.inner_size");
        if (inner % hp_.n_v != 0) fail(DFL_ERR_INVALID, "ssm.inner_size is not a multiple of ssm.time_step_rank");
        hp_.dv = inner / hp_.n_v;
        if (hp_.n_v % hp_.n_k != 0) fail(DFL_ERR_INVALID, "ssm.time_step_rank is not a multiple of ssm.group_count");
        if (hp_.conv_k < 2) fail(DFL_ERR_INVALID, "ssm.conv_kernel must be at least 2");
    }
}

const dfl_tensor *Model::tensor(const std::string &name) const {
    auto it = tensors_.find(name);
    return it == tensors_.end() ? nullptr : it->second;
}

static std::string dims_str(const dfl_tensor &t) {
    std::string s = "[";
    for (uint32_t i = 0; i < t.n_dims; i++) s += (i ? ", " : "") + std::to_string(t.dims[i]);
    return s + "]";
}

Weight Model::weight(const std::string &name, int64_t n_in, int64_t n_out, bool optional) {
    const dfl_tensor *t = tensor(name);
    if (!t) {
        if (optional) return Weight{};
        fail(DFL_ERR_INVALID, "tensor " + name + " is missing");
    }
    if (!weight_type_ok(t->type))
        fail(DFL_ERR_UNSUPPORTED, "tensor " + name + " has type " + std::to_string(t->type) + ", which this engine does not support");
    const bool shape_ok = t->dims[0] == (uint64_t)n_in && t->dims[1] == (uint64_t)n_out && t->dims[2] == 1 && t->dims[3] == 1;
    if (!shape_ok)
        fail(DFL_ERR_INVALID, "tensor " + name + " has shape " + dims_str(*t) + ", want [" + std::to_string(n_in) + ", " +
                                  std::to_string(n_out) + "]");
    if (n_in % type_block(t->type) != 0)
        fail(DFL_ERR_INVALID, "tensor " + name + ": row length " + std::to_string(n_in) + " is not a multiple of the " +
                                  type_name(t->type) + " block");
    Weight w;
    w.type = t->type;
    w.n_in = n_in;
    w.n_out = n_out;
    w.row_bytes = row_bytes(t->type, n_in);
    if (t->size < w.row_bytes * (uint64_t)n_out) fail(DFL_ERR_INVALID, "tensor " + name + " has too few bytes");
    w.data = (const uint8_t *)t->data;
    weight_bytes_ += w.row_bytes * (uint64_t)n_out;
    return w;
}

std::vector<float> Model::vec(const std::string &name, int64_t n0, int64_t n1) {
    const dfl_tensor *t = tensor(name);
    if (!t) fail(DFL_ERR_INVALID, "tensor " + name + " is missing");
    uint64_t n = 1;
    for (uint32_t i = 0; i < t->n_dims; i++) n *= t->dims[i];
    if (n != (uint64_t)(n0 * n1) || t->dims[0] != (uint64_t)n0)
        fail(DFL_ERR_INVALID, "tensor " + name + " has shape " + dims_str(*t) + ", want [" + std::to_string(n0) +
                                  (n1 > 1 ? ", " + std::to_string(n1) : "") + "]");
    if (t->type != DFL_TYPE_F32 && t->type != DFL_TYPE_F16 && t->type != DFL_TYPE_BF16)
        fail(DFL_ERR_UNSUPPORTED, "tensor " + name + " must be f32, f16 or bf16");
    if (t->size < (uint64_t)n * (uint64_t)type_block_bytes(t->type)) fail(DFL_ERR_INVALID, "tensor " + name + " has too few bytes");
    std::vector<float> v((size_t)n);
    dequant_row(t->type, t->data, v.data(), (int64_t)n);
    weight_bytes_ += n * (uint64_t)type_block_bytes(t->type);
    return v;
}

void Model::load_weights(const dfl_model_params &p) {
    for (uint32_t i = 0; i < p.n_tensors; i++) {
        const dfl_tensor &t = p.tensors[i];
        if (!t.name) fail(DFL_ERR_INVALID, "tensor entry " + std::to_string(i) + " has no name");
        if (!t.data && t.size > 0) fail(DFL_ERR_INVALID, std::string("tensor ") + t.name + " has no data");
        if (t.n_dims < 1 || t.n_dims > 4) fail(DFL_ERR_INVALID, std::string("tensor ") + t.name + " has a bad dimension count");
        tensors_[t.name] = &t;
    }
    const HParams &h = hp_;
    const dfl_tensor *emb = tensor("token_embd.weight");
    if (!emb) fail(DFL_ERR_INVALID, "tensor token_embd.weight is missing");
    hp_.n_vocab = positive((int64_t)emb->dims[1], "vocabulary size (token_embd.weight dims[1])");

    tok_embd_ = weight("token_embd.weight", h.n_embd, h.n_vocab);
    output_ = weight("output.weight", h.n_embd, h.n_vocab, true);
    if (output_.empty()) output_ = tok_embd_;  // tied embeddings
    output_norm_ = vec("output_norm.weight", h.n_embd);

    layers_.resize((size_t)h.n_layer);
    for (int il = 0; il < h.n_layer; il++) {
        Layer &L = layers_[(size_t)il];
        L.attn = h.is_attn(il);
        L.attn_norm = vec(blk(il, "attn_norm.weight"), h.n_embd);
        L.post_norm = vec(blk(il, h.hybrid ? "post_attention_norm.weight" : "ffn_norm.weight"), h.n_embd);
        if (L.attn) {
            L.kv_index = n_attn_++;
            const int64_t q_out = (int64_t)h.n_head * h.head_dim * (h.gated_attn ? 2 : 1);
            L.wq = weight(blk(il, "attn_q.weight"), h.n_embd, q_out);
            L.wk = weight(blk(il, "attn_k.weight"), h.n_embd, (int64_t)h.n_kv * h.head_dim);
            L.wv = weight(blk(il, "attn_v.weight"), h.n_embd, (int64_t)h.n_kv * h.head_dim);
            L.wo = weight(blk(il, "attn_output.weight"), (int64_t)h.n_head * h.head_dim, h.n_embd);
            L.q_norm = vec(blk(il, "attn_q_norm.weight"), h.head_dim);
            L.k_norm = vec(blk(il, "attn_k_norm.weight"), h.head_dim);
        } else {
            L.rec_index = n_rec_++;
            const int C = h.conv_channels();
            L.wqkv = weight(blk(il, "attn_qkv.weight"), h.n_embd, C);
            L.wz = weight(blk(il, "attn_gate.weight"), h.n_embd, (int64_t)h.n_v * h.dv);
            L.wb = weight(blk(il, "ssm_beta.weight"), h.n_embd, h.n_v);
            L.wa = weight(blk(il, "ssm_alpha.weight"), h.n_embd, h.n_v);
            L.wout = weight(blk(il, "ssm_out.weight"), (int64_t)h.n_v * h.dv, h.n_embd);
            L.conv_w = vec(blk(il, "ssm_conv1d.weight"), h.conv_k, C);
            L.ssm_a = vec(blk(il, "ssm_a"), h.n_v);
            L.dt_bias = vec(blk(il, "ssm_dt.bias"), h.n_v);
            L.ssm_norm = vec(blk(il, "ssm_norm.weight"), h.dv);
        }
        L.ffn_gate = weight(blk(il, "ffn_gate.weight"), h.n_embd, h.n_ff);
        L.ffn_up = weight(blk(il, "ffn_up.weight"), h.n_embd, h.n_ff);
        L.ffn_down = weight(blk(il, "ffn_down.weight"), h.n_ff, h.n_embd);
    }

    if (p.flags & DFL_LOAD_COPY_WEIGHTS) {
        // Copy every referenced matrix so the caller may release its buffers.
        std::map<const uint8_t *, const uint8_t *> moved;
        auto own = [&](Weight &w) {
            if (w.empty()) return;
            auto it = moved.find(w.data);
            if (it != moved.end()) {
                w.data = it->second;
                return;
            }
            const uint64_t n = w.row_bytes * (uint64_t)w.n_out;
            owned_.emplace_back(new uint8_t[n]);
            std::memcpy(owned_.back().get(), w.data, n);
            moved[w.data] = owned_.back().get();
            w.data = owned_.back().get();
        };
        own(tok_embd_);
        own(output_);
        for (Layer &L : layers_)
            for (Weight *w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.wqkv, &L.wz, &L.wb, &L.wa, &L.wout, &L.ffn_gate, &L.ffn_up,
                              &L.ffn_down})
                own(*w);
    }
    tensors_.clear();  // the caller's table is not needed after load
}

void Model::info(dfl_model_info *out) const {
    const uint32_t size = out->struct_size;
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
    i.kv_block_size = block_size_;
    i.kv_blocks_total = n_blocks_;
    i.max_seqs = (uint32_t)seqs_.size();
    i.cache_type_k = type_k_;
    i.cache_type_v = type_v_;
    i.n_threads = (uint32_t)pool_.size();
    i.kv_bytes_per_token = (uint64_t)n_attn_ * (uint64_t)hp_.n_kv * (k_row_ + v_row_);
    i.state_bytes_per_seq = (uint64_t)slot_floats() * sizeof(float);
    i.weight_bytes = weight_bytes_;
    i.rms_eps = hp_.eps;
    i.rope_theta = hp_.theta;
    i.rope_dim = (uint32_t)hp_.rope_dim;
    std::memcpy(out, &i, std::min<size_t>(size ? size : sizeof i, sizeof i));
    out->struct_size = std::min<uint32_t>(size ? size : (uint32_t)sizeof i, (uint32_t)sizeof i);
}

void Model::kv_stats(dfl_kv_stats *out) const {
    out->block_size = block_size_;
    out->blocks_total = n_blocks_;
    out->blocks_free = (uint32_t)free_blocks_.size();
    out->seqs_total = (uint32_t)seqs_.size();
    uint32_t used = 0;
    for (const Seq &s : seqs_) used += s.used;
    out->seqs_free = (uint32_t)seqs_.size() - used;
}

Seq &Model::seq(int32_t s) {
    if (s < 0 || (size_t)s >= seqs_.size() || !seqs_[(size_t)s].used)
        fail(DFL_ERR_INVALID, "sequence " + std::to_string(s) + " is not allocated");
    return seqs_[(size_t)s];
}
const Seq &Model::seq(int32_t s) const { return const_cast<Model *>(this)->seq(s); }

float *Model::state(int32_t s, int r) {
    return states_.data() + (size_t)s * (size_t)slot_floats() + (size_t)r * (size_t)hp_.state_floats();
}
float *Model::conv(int32_t s, int r) {
    return states_.data() + (size_t)s * (size_t)slot_floats() + (size_t)n_rec_ * (size_t)hp_.state_floats() +
           (size_t)r * (size_t)hp_.conv_floats();
}

int32_t Model::seq_alloc() {
    for (size_t i = 0; i < seqs_.size(); i++) {
        if (seqs_[i].used) continue;
        seqs_[i] = Seq{};
        seqs_[i].used = true;
        std::fill(states_.begin() + (ptrdiff_t)(i * (size_t)slot_floats()),
                  states_.begin() + (ptrdiff_t)((i + 1) * (size_t)slot_floats()), 0.0f);
        return (int32_t)i;
    }
    fail(DFL_ERR_NO_SEQ, "all " + std::to_string(seqs_.size()) + " sequence slots are in use");
}

void Model::seq_free(int32_t s) {
    Seq &q = seq(s);
    for (int32_t b : q.blocks) free_blocks_.push_back(b);
    q = Seq{};
}

void Model::grow_blocks(Seq &q, uint32_t tokens) {
    if (n_attn_ == 0) return;
    const uint32_t need = blocks_for(tokens);
    if (need <= q.blocks.size()) return;
    const uint32_t extra = need - (uint32_t)q.blocks.size();
    if (extra > free_blocks_.size())
        fail(DFL_ERR_NO_KV, "KV pool exhausted: need " + std::to_string(extra) + " more blocks, " +
                                std::to_string(free_blocks_.size()) + " free");
    for (uint32_t i = 0; i < extra; i++) {
        q.blocks.push_back(free_blocks_.back());
        free_blocks_.pop_back();
    }
}

void Model::trim_blocks(Seq &q) {
    const uint32_t keep = blocks_for(std::max(q.len, q.reserved));
    while (q.blocks.size() > keep) {
        free_blocks_.push_back(q.blocks.back());
        q.blocks.pop_back();
    }
}

void Model::seq_reserve(int32_t s, uint32_t n_tokens) {
    Seq &q = seq(s);
    grow_blocks(q, n_tokens);
    q.reserved = std::max(q.reserved, n_tokens);
}

uint32_t Model::seq_length(int32_t s) const { return seq(s).len; }

void Model::seq_truncate(int32_t s, uint32_t n) {
    Seq &q = seq(s);
    if (n > q.len) fail(DFL_ERR_INVALID, "truncate sequence " + std::to_string(s) + " to " + std::to_string(n) +
                                             " tokens: it holds only " + std::to_string(q.len));
    if (n == q.len) return;
    if (n_rec_ > 0) {
        if (!q.rec || n < q.rec_base || n > q.rec_base + q.rec_n)
            fail(DFL_ERR_STATE, "truncate sequence " + std::to_string(s) + " to " + std::to_string(n) +
                                    " tokens: its recurrent state was not recorded there (forward with DFL_SEQ_RECORD)");
        const uint32_t k = n - q.rec_base;  // tokens of the recorded forward that stay
        const int64_t sf = hp_.state_floats(), cf = hp_.conv_floats(), C = hp_.conv_channels();
        const int64_t wrows = hp_.conv_k - 1 + q.rec_n;
        for (int r = 0; r < n_rec_; r++) {
            std::memcpy(state(s, r), q.rec_states.data() + ((size_t)k * n_rec_ + r) * (size_t)sf, sizeof(float) * (size_t)sf);
            std::memcpy(conv(s, r), q.rec_window.data() + ((size_t)r * wrows + k) * (size_t)C, sizeof(float) * (size_t)cf);
        }
    }
    q.len = n;
    if (q.snap && n < q.snap_len) q.snap = false;
    trim_blocks(q);
}

void Model::seq_snapshot(int32_t s) {
    Seq &q = seq(s);
    q.snap = true;
    q.snap_len = q.len;
    q.snap_state.assign(states_.begin() + (ptrdiff_t)((size_t)s * (size_t)slot_floats()),
                        states_.begin() + (ptrdiff_t)((size_t)(s + 1) * (size_t)slot_floats()));
}

void Model::seq_rollback(int32_t s) {
    Seq &q = seq(s);
    if (!q.snap) fail(DFL_ERR_STATE, "sequence " + std::to_string(s) + " has no snapshot to roll back to");
    if (q.len < q.snap_len) fail(DFL_ERR_STATE, "sequence " + std::to_string(s) + " is shorter than its snapshot");
    std::copy(q.snap_state.begin(), q.snap_state.end(), states_.begin() + (ptrdiff_t)((size_t)s * (size_t)slot_floats()));
    q.len = q.snap_len;
    q.rec = false;
    trim_blocks(q);
}

// ---------------------------------------------------------------------------------------------------------------------

void Model::attn_layer(const Layer &L, const std::vector<Entry> &ents, const int32_t *pos, const float *xn, int64_t T,
                       float *out) {
    const HParams &h = hp_;
    const int hd = h.head_dim, nh = h.n_head, nkv = h.n_kv;
    const int64_t q_out = L.wq.n_out, qd = (int64_t)nh * hd, kvd = (int64_t)nkv * hd;
    std::vector<float> qf((size_t)(T * q_out)), kf((size_t)(T * kvd)), vf((size_t)(T * kvd));
    matmul(pool_, scratch_, L.wq, xn, T, qf.data());
    matmul(pool_, scratch_, L.wk, xn, T, kf.data());
    matmul(pool_, scratch_, L.wv, xn, T, vf.data());

    std::vector<float> Q((size_t)(T * qd)), gate(h.gated_attn ? (size_t)(T * qd) : 0);
    std::vector<int32_t> ent_of((size_t)T);
    for (size_t e = 0; e < ents.size(); e++)
        for (int64_t i = 0; i < ents[e].n; i++) ent_of[(size_t)(ents[e].t0 + i)] = (int32_t)e;

    // q/k norm, RoPE, K/V into the cache
    pool_.parallel_for(T, [&](int64_t t, int) {
        for (int hh = 0; hh < nh; hh++) {
            const float *src = qf.data() + t * q_out + (int64_t)hh * hd * (h.gated_attn ? 2 : 1);
            float *dst = Q.data() + t * qd + (int64_t)hh * hd;
            rmsnorm(src, L.q_norm.data(), dst, hd, h.eps);
            rope_neox(dst, h.rope_dim, pos[t], inv_freq_.data());
            if (h.gated_attn) std::memcpy(gate.data() + t * qd + (int64_t)hh * hd, src + hd, sizeof(float) * (size_t)hd);
        }
        const Entry &e = ents[(size_t)ent_of[(size_t)t]];
        const Seq &q = seqs_[(size_t)e.seq];
        PagedKV kv;
        kv.n_kv = nkv;
        kv.head_dim = hd;
        kv.block_size = (int)block_size_;
        kv.k = k_cache_[(size_t)L.kv_index].get();
        kv.v = v_cache_[(size_t)L.kv_index].get();
        kv.k_row = k_row_;
        kv.v_row = v_row_;
        kv.blocks = q.blocks.data();
        const int64_t p = (int64_t)e.len0 + (t - e.t0);
        for (int g = 0; g < nkv; g++) {
            float *kr = kf.data() + t * kvd + (int64_t)g * hd;
            rmsnorm(kr, L.k_norm.data(), kr, hd, h.eps);
            rope_neox(kr, h.rope_dim, pos[t], inv_freq_.data());
            quantize_row(type_k_, kr, kv.k_at(p, g), hd);
            quantize_row(type_v_, vf.data() + t * kvd + (int64_t)g * hd, kv.v_at(p, g), hd);
        }
    });

    // attention: tasks = (entry, kv head, chunk of tokens)
    constexpr int64_t kChunk = 16;
    struct Task {
        int32_t e, g;
        int64_t i0, i1;
    };
    std::vector<Task> tasks;
    for (size_t e = 0; e < ents.size(); e++)
        for (int g = 0; g < nkv; g++)
            for (int64_t i0 = 0; i0 < ents[e].n; i0 += kChunk)
                tasks.push_back({(int32_t)e, g, i0, std::min(ents[e].n, i0 + kChunk)});
    std::vector<float> A((size_t)(T * qd));
    const float scale = 1.0f / std::sqrt((float)hd);
    const int group = nh / nkv;
    pool_.parallel_for((int64_t)tasks.size(), [&](int64_t ti, int th) {
        const Task &tk = tasks[(size_t)ti];
        const Entry &e = ents[(size_t)tk.e];
        PagedKV kv;
        kv.type_k = type_k_;
        kv.type_v = type_v_;
        kv.n_kv = nkv;
        kv.head_dim = hd;
        kv.block_size = (int)block_size_;
        kv.k = k_cache_[(size_t)L.kv_index].get();
        kv.v = v_cache_[(size_t)L.kv_index].get();
        kv.k_row = k_row_;
        kv.v_row = v_row_;
        kv.blocks = seqs_[(size_t)e.seq].blocks.data();
        float *scr = scratch_.get(th, attention_scratch(hd, group, tk.i1 - tk.i0));
        attention(kv, tk.g, nh, Q.data() + e.t0 * qd, qd, A.data() + e.t0 * qd, qd, e.len0, tk.i0, tk.i1, scale, scr);
    });
    if (h.gated_attn) {
        pool_.parallel_for(T, [&](int64_t t, int) {
            float *a = A.data() + t * qd;
            const float *g = gate.data() + t * qd;
            for (int64_t i = 0; i < qd; i++) a[i] *= sigmoid(g[i]);
        });
    }
    matmul(pool_, scratch_, L.wo, A.data(), T, out);
}

void Model::gdn_layer(const Layer &L, const std::vector<Entry> &ents, const float *xn, int64_t T, float *out) {
    const HParams &h = hp_;
    const int C = h.conv_channels(), K = h.conv_k, dk = h.dk, dv = h.dv, nk = h.n_k, nv = h.n_v;
    const int64_t vd = (int64_t)nv * dv;
    std::vector<float> qkv((size_t)(T * C)), z((size_t)(T * vd)), bb((size_t)(T * nv)), aa((size_t)(T * nv));
    matmul(pool_, scratch_, L.wqkv, xn, T, qkv.data());
    matmul(pool_, scratch_, L.wz, xn, T, z.data());
    matmul(pool_, scratch_, L.wb, xn, T, bb.data());
    matmul(pool_, scratch_, L.wa, xn, T, aa.data());

    // causal conv per entry (the window starts with the K-1 cached inputs)
    std::vector<float> cv((size_t)(T * C));
    pool_.parallel_for((int64_t)ents.size(), [&](int64_t ei, int) {
        const Entry &e = ents[(size_t)ei];
        Seq &q = seqs_[(size_t)e.seq];
        float *cs = conv(e.seq, L.rec_index);
        std::vector<float> win((size_t)((K - 1 + e.n) * C));
        std::memcpy(win.data(), cs, sizeof(float) * (size_t)(K - 1) * C);
        std::memcpy(win.data() + (size_t)(K - 1) * C, qkv.data() + e.t0 * C, sizeof(float) * (size_t)(e.n * C));
        conv1d_silu(win.data(), e.n, C, L.conv_w.data(), K, cv.data() + e.t0 * C);
        std::memcpy(cs, win.data() + (size_t)e.n * C, sizeof(float) * (size_t)(K - 1) * C);
        if (e.record)
            std::memcpy(q.rec_window.data() + (size_t)L.rec_index * (size_t)((K - 1 + e.n) * C), win.data(),
                        sizeof(float) * win.size());
    });

    // q/k l2 norm and query scale; gates
    const float qscale = 1.0f / std::sqrt((float)dk);
    std::vector<float> beta((size_t)(T * nv)), gl((size_t)(T * nv));
    pool_.parallel_for(T, [&](int64_t t, int) {
        float *row = cv.data() + t * C;
        for (int i = 0; i < nk; i++) {
            float *qh = row + (int64_t)i * dk;
            l2norm(qh, dk, 1e-6f);
            for (int d = 0; d < dk; d++) qh[d] *= qscale;
            l2norm(row + (int64_t)(nk + i) * dk, dk, 1e-6f);
        }
        for (int j = 0; j < nv; j++) {
            beta[(size_t)(t * nv + j)] = sigmoid(bb[(size_t)(t * nv + j)]);
            gl[(size_t)(t * nv + j)] = L.ssm_a[(size_t)j] * softplus(aa[(size_t)(t * nv + j)] + L.dt_bias[(size_t)j]);
        }
    });

    // the delta rule: tasks = (entry, value head)
    std::vector<float> core((size_t)(T * vd));
    const int64_t sf = h.state_floats();
    pool_.parallel_for((int64_t)ents.size() * nv, [&](int64_t task, int th) {
        const Entry &e = ents[(size_t)(task / nv)];
        const int j = (int)(task % nv);
        const int kh = j % nk;  // GGUF order: value heads tiled over the key heads
        const int64_t n = e.n;
        const size_t need = (size_t)(n * (2 * dk + 2 * dv + 2)) + gdn_chunk_scratch(dk, dv);
        float *buf = scratch_.get(th, need);
        float *qj = buf, *kj = qj + n * dk, *vj = kj + n * dk, *gj = vj + n * dv, *bj = gj + n, *oj = bj + n;
        float *cs = oj + n * dv;
        for (int64_t i = 0; i < n; i++) {
            const float *row = cv.data() + (e.t0 + i) * C;
            std::memcpy(qj + i * dk, row + (int64_t)kh * dk, sizeof(float) * (size_t)dk);
            std::memcpy(kj + i * dk, row + (int64_t)(nk + kh) * dk, sizeof(float) * (size_t)dk);
            std::memcpy(vj + i * dv, row + (int64_t)2 * nk * dk + (int64_t)j * dv, sizeof(float) * (size_t)dv);
            gj[i] = gl[(size_t)((e.t0 + i) * nv + j)];
            bj[i] = beta[(size_t)((e.t0 + i) * nv + j)];
        }
        float *S = state(e.seq, L.rec_index) + (int64_t)j * dk * dv;
        if (e.record) {
            Seq &q = seqs_[(size_t)e.seq];
            // slot 0 holds the state before the forward, slot i+1 the state after token i
            const size_t per = (size_t)n_rec_ * (size_t)sf;
            float *base = q.rec_states.data() + (size_t)L.rec_index * (size_t)sf + (size_t)j * dk * dv;
            std::memcpy(base, S, sizeof(float) * (size_t)dk * dv);
            std::vector<float> st((size_t)(n * dk * dv));
            gdn_recurrent(S, dk, dv, qj, kj, vj, gj, bj, n, oj, st.data());
            for (int64_t i = 0; i < n; i++)
                std::memcpy(base + (size_t)(i + 1) * per, st.data() + i * dk * dv, sizeof(float) * (size_t)dk * dv);
        } else if (n > 1) {
            gdn_chunked(S, dk, dv, qj, kj, vj, gj, bj, n, oj, cs);
        } else {
            gdn_recurrent(S, dk, dv, qj, kj, vj, gj, bj, n, oj, nullptr);
        }
        for (int64_t i = 0; i < n; i++)
            std::memcpy(core.data() + (e.t0 + i) * vd + (int64_t)j * dv, oj + i * dv, sizeof(float) * (size_t)dv);
    });

    // gated RMSNorm per value head
    pool_.parallel_for(T, [&](int64_t t, int) {
        for (int j = 0; j < nv; j++) {
            gated_rmsnorm(core.data() + t * vd + (int64_t)j * dv, z.data() + t * vd + (int64_t)j * dv,
                          L.ssm_norm.data(), dv, h.eps);
        }
    });
    matmul(pool_, scratch_, L.wout, core.data(), T, out);
}

void Model::forward(const dfl_batch &b) {
    const HParams &h = hp_;
    if (b.n_seqs == 0) return;
    if (!b.seqs) fail(DFL_ERR_INVALID, "batch: seqs is null");

    // validate everything before touching any state
    std::vector<Entry> ents;
    std::set<int32_t> seen;
    int64_t T = 0, rows = 0;
    for (uint32_t i = 0; i < b.n_seqs; i++) {
        const dfl_seq_batch &sb = b.seqs[i];
        const std::string who = "batch entry " + std::to_string(i) + " (sequence " + std::to_string(sb.seq) + ")";
        Seq &q = seq(sb.seq);
        if (!seen.insert(sb.seq).second) fail(DFL_ERR_INVALID, who + ": the sequence appears twice in one batch");
        if (sb.n_tokens == 0) fail(DFL_ERR_INVALID, who + ": no tokens");
        if (!sb.tokens) fail(DFL_ERR_INVALID, who + ": tokens is null");
        for (uint32_t t = 0; t < sb.n_tokens; t++)
            if (sb.tokens[t] < 0 || sb.tokens[t] >= h.n_vocab)
                fail(DFL_ERR_INVALID, who + ": token " + std::to_string(sb.tokens[t]) + " is outside the vocabulary (" +
                                          std::to_string(h.n_vocab) + ")");
        if (sb.logits > DFL_LOGITS_ALL) fail(DFL_ERR_INVALID, who + ": bad logits mode");
        if ((uint64_t)q.len + sb.n_tokens > (uint64_t)INT32_MAX) fail(DFL_ERR_INVALID, who + ": sequence too long");
        Entry e;
        e.seq = sb.seq;
        e.t0 = T;
        e.n = sb.n_tokens;
        e.len0 = q.len;
        e.logits = sb.logits;
        e.record = (sb.flags & DFL_SEQ_RECORD) != 0 && n_rec_ > 0;
        ents.push_back(e);
        T += sb.n_tokens;
        rows += sb.logits == DFL_LOGITS_ALL ? sb.n_tokens : (sb.logits == DFL_LOGITS_LAST ? 1 : 0);
    }
    if (rows > 0 && !b.logits) fail(DFL_ERR_INVALID, "batch: logits requested but the output buffer is null");
    if (b.n_capture > 0) {
        if (!b.capture_layers || !b.capture) fail(DFL_ERR_INVALID, "batch: capture requested but a buffer is null");
        for (uint32_t c = 0; c < b.n_capture; c++)
            if (b.capture_layers[c] < 0 || b.capture_layers[c] >= h.n_layer)
                fail(DFL_ERR_INVALID, "batch: capture layer " + std::to_string(b.capture_layers[c]) + " is out of range");
    }
    // KV blocks for the new tokens, all or nothing
    if (n_attn_ > 0) {
        uint64_t need = 0;
        for (const Entry &e : ents) {
            const Seq &q = seqs_[(size_t)e.seq];
            const uint32_t want = blocks_for(e.len0 + (uint32_t)e.n);
            if (want > q.blocks.size()) need += want - q.blocks.size();
        }
        if (need > free_blocks_.size())
            fail(DFL_ERR_NO_KV, "KV pool exhausted: the batch needs " + std::to_string(need) + " more blocks, " +
                                    std::to_string(free_blocks_.size()) + " free");
        for (const Entry &e : ents) grow_blocks(seqs_[(size_t)e.seq], e.len0 + (uint32_t)e.n);
    }
    for (const Entry &e : ents) {
        Seq &q = seqs_[(size_t)e.seq];
        q.rec = false;
        if (e.record) {
            q.rec_base = e.len0;
            q.rec_n = (uint32_t)e.n;
            q.rec_states.assign((size_t)(e.n + 1) * (size_t)n_rec_ * (size_t)h.state_floats(), 0.0f);
            q.rec_window.assign((size_t)n_rec_ * (size_t)((h.conv_k - 1 + e.n) * h.conv_channels()), 0.0f);
        }
    }

    const int64_t H = h.n_embd;
    std::vector<int32_t> pos((size_t)T);
    std::vector<float> x((size_t)(T * H)), xn((size_t)(T * H)), mix((size_t)(T * H));
    for (uint32_t i = 0; i < b.n_seqs; i++) {
        const Entry &e = ents[i];
        for (int64_t t = 0; t < e.n; t++) {
            pos[(size_t)(e.t0 + t)] = b.seqs[i].positions ? b.seqs[i].positions[t] : (int32_t)(e.len0 + t);
        }
    }
    pool_.parallel_for(T, [&](int64_t t, int) {
        int32_t tok = 0;
        for (uint32_t i = 0; i < b.n_seqs; i++)
            if (t >= ents[i].t0 && t < ents[i].t0 + ents[i].n) tok = b.seqs[i].tokens[t - ents[i].t0];
        get_row(tok_embd_, tok, x.data() + t * H);
    });

    std::vector<float> g((size_t)(T * h.n_ff)), u((size_t)(T * h.n_ff));
    for (int il = 0; il < h.n_layer; il++) {
        const Layer &L = layers_[(size_t)il];
        pool_.parallel_for(T, [&](int64_t t, int) { rmsnorm(x.data() + t * H, L.attn_norm.data(), xn.data() + t * H, H, h.eps); });
        if (L.attn)
            attn_layer(L, ents, pos.data(), xn.data(), T, mix.data());
        else
            gdn_layer(L, ents, xn.data(), T, mix.data());
        pool_.parallel_for(T, [&](int64_t t, int) {
            float *xr = x.data() + t * H;
            const float *m = mix.data() + t * H;
            for (int64_t i = 0; i < H; i++) xr[i] += m[i];
            rmsnorm(xr, L.post_norm.data(), xn.data() + t * H, H, h.eps);
        });
        matmul(pool_, scratch_, L.ffn_gate, xn.data(), T, g.data());
        matmul(pool_, scratch_, L.ffn_up, xn.data(), T, u.data());
        pool_.parallel_for(T, [&](int64_t t, int) { swiglu(g.data() + t * h.n_ff, u.data() + t * h.n_ff, h.n_ff); });
        matmul(pool_, scratch_, L.ffn_down, g.data(), T, mix.data());
        pool_.parallel_for(T, [&](int64_t t, int) {
            float *xr = x.data() + t * H;
            const float *m = mix.data() + t * H;
            for (int64_t i = 0; i < H; i++) xr[i] += m[i];
        });
        for (uint32_t c = 0; c < b.n_capture; c++) {
            if (b.capture_layers[c] != il) continue;
            for (int64_t t = 0; t < T; t++)
                std::memcpy(b.capture + (t * b.n_capture + c) * H, x.data() + t * H, sizeof(float) * (size_t)H);
        }
    }

    if (rows > 0) {
        std::vector<float> xs((size_t)(rows * H));
        int64_t r = 0;
        for (const Entry &e : ents) {
            if (e.logits == DFL_LOGITS_NONE) continue;
            const int64_t first = e.logits == DFL_LOGITS_ALL ? 0 : e.n - 1;
            for (int64_t t = first; t < e.n; t++, r++)
                rmsnorm(x.data() + (e.t0 + t) * H, output_norm_.data(), xs.data() + r * H, H, h.eps);
        }
        matmul(pool_, scratch_, output_, xs.data(), rows, b.logits);
    }
    for (const Entry &e : ents) {
        Seq &q = seqs_[(size_t)e.seq];
        q.len = e.len0 + (uint32_t)e.n;
        q.rec = e.record;
    }
}

}  // namespace dfl
