// The qwen3 / qwen35 plan's loading: hyperparameters from the metadata, which plan a model's architecture gets, the
// device bytes it will need (estimate_model), and its weights bound, fused and prepared for the device.
#include <cstring>

#include "arch/deepseek4.h"
#include "arch/dflash.h"
#include "arch/hparams.h"
#include "arch/qwen.h"
#include "core/sized.h"
#include "quant.h"

namespace dfl {

namespace {

struct Meta {
    MetaMap kv;
    std::string prefix;

    const dfl_meta *find(const std::string &k) const { return meta_find(kv, prefix + k); }
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
    double f(const std::string &k, double def) const { return meta_number(find(k), prefix + k, def); }
};

}  // namespace

HParams qwen_hparams(const dfl_model_params &p) {
    HParams hp_;
    hp_.arch = p.arch;
    Meta m;
    m.prefix = hp_.arch + ".";
    m.kv = meta_map(p);
    if (hp_.arch == "qwen3") {
        hp_.hybrid = false;
    } else if (hp_.arch == "qwen35") {
        hp_.hybrid = true;
        hp_.gated_attn = true;
    } else {
        fail(DFL_ERR_UNSUPPORTED, "architecture \"" + hp_.arch + "\" is not supported by this engine (qwen3, qwen35)");
    }
    const int blocks = positive_hparam(m.i("block_count"), m.prefix + "block_count");
    const int64_t nextn = m.i("nextn_predict_layers", 0);
    if (nextn < 0 || nextn >= blocks) fail(DFL_ERR_INVALID, "metadata " + m.prefix + "nextn_predict_layers is out of range");
    hp_.n_layer = blocks - (int)nextn;
    hp_.n_embd = positive_hparam(m.i("embedding_length"), m.prefix + "embedding_length");
    hp_.n_ff = positive_hparam(m.i("feed_forward_length"), m.prefix + "feed_forward_length");
    hp_.n_head = positive_hparam(m.i("attention.head_count"), m.prefix + "attention.head_count");
    hp_.n_kv = positive_hparam(m.i("attention.head_count_kv", hp_.n_head), m.prefix + "attention.head_count_kv");
    hp_.head_dim = positive_hparam(m.i("attention.key_length", hp_.n_embd / hp_.n_head), m.prefix + "attention.key_length");
    const int vdim = positive_hparam(m.i("attention.value_length", hp_.head_dim), m.prefix + "attention.value_length");
    if (vdim != hp_.head_dim) fail(DFL_ERR_UNSUPPORTED, "attention.value_length differs from key_length");
    if (hp_.n_head % hp_.n_kv != 0) fail(DFL_ERR_INVALID, "attention.head_count is not a multiple of head_count_kv");
    hp_.eps = (float)m.f("attention.layer_norm_rms_epsilon", 1e-6);
    hp_.theta = (float)m.f("rope.freq_base", 10000.0);
    hp_.rope_dim = positive_hparam(m.i("rope.dimension_count", hp_.head_dim), m.prefix + "rope.dimension_count");
    if (hp_.rope_dim > hp_.head_dim || hp_.rope_dim % 2 != 0)
        fail(DFL_ERR_INVALID, "rope.dimension_count " + std::to_string(hp_.rope_dim) + " does not fit head_dim");
    hp_.n_ctx_train = (int)m.i("context_length", 0);
    if (hp_.hybrid) {
        hp_.full_attn_interval = positive_hparam(m.i("full_attention_interval", 4), m.prefix + "full_attention_interval");
        hp_.conv_k = positive_hparam(m.i("ssm.conv_kernel"), m.prefix + "ssm.conv_kernel");
        hp_.dk = positive_hparam(m.i("ssm.state_size"), m.prefix + "ssm.state_size");
        hp_.n_k = positive_hparam(m.i("ssm.group_count"), m.prefix + "ssm.group_count");
        hp_.n_v = positive_hparam(m.i("ssm.time_step_rank"), m.prefix + "ssm.time_step_rank");
        const int inner = positive_hparam(m.i("ssm.inner_size"), m.prefix + "ssm.inner_size");
        if (inner % hp_.n_v != 0) fail(DFL_ERR_INVALID, "ssm.inner_size is not a multiple of ssm.time_step_rank");
        hp_.dv = inner / hp_.n_v;
        if (hp_.n_v % hp_.n_k != 0) fail(DFL_ERR_INVALID, "ssm.time_step_rank is not a multiple of ssm.group_count");
        if (hp_.conv_k < 2) fail(DFL_ERR_INVALID, "ssm.conv_kernel must be at least 2");
        if (hp_.conv_k > kConvMaxK)
            fail(DFL_ERR_UNSUPPORTED, "ssm.conv_kernel " + std::to_string(hp_.conv_k) + " is more than " +
                                          std::to_string(kConvMaxK) + " taps");
    }
    return hp_;
}

// The architectures this engine has a layer plan for.
static void require_served_arch(const dfl_model_params &p) {
    if (!p.arch) fail(DFL_ERR_INVALID, "model params: arch is null");
    const std::string arch = p.arch;
    if (arch != "qwen3" && arch != "qwen35" && arch != "dflash" && arch != "deepseek4")
        fail(DFL_ERR_UNSUPPORTED, "architecture \"" + arch + "\" is not supported by this engine (qwen3, qwen35, dflash, deepseek4)");
}

static bool is_dflash(const dfl_model_params &p) { return std::string(p.arch) == "dflash"; }
static bool is_deepseek4(const dfl_model_params &p) { return std::string(p.arch) == "deepseek4"; }

std::unique_ptr<Model> load_model(const dfl_model_params &p) {
    require_served_arch(p);
    if (is_dflash(p)) return std::unique_ptr<Model>(new DFlashModel(p, make_device(p)));
    if (is_deepseek4(p)) return std::unique_ptr<Model>(new DeepSeek4Model(p, make_device(p)));
    return std::unique_ptr<Model>(new QwenModel(p, make_device(p)));
}

void estimate_model(const dfl_model_params &p, dfl_model_estimate *out) {
    require_served_arch(p);
    if (is_dflash(p)) return estimate_dflash(p, out);
    if (is_deepseek4(p)) return estimate_deepseek4(p, out);
    const HParams h = qwen_hparams(p);
    check_cache_types(p.cache_type_k, p.cache_type_v);
    dfl_model_estimate e;
    std::memset(&e, 0, sizeof e);
    e.struct_size = sizeof e;
    int n_attn = 0;
    for (int il = 0; il < h.n_layer; il++) n_attn += h.is_attn(il);
    const int n_rec = h.n_layer - n_attn;
    e.weight_bytes = estimate_weight_bytes(p, h.n_layer, [](const dfl_tensor &) { return true; });
    e.kv_bytes_per_token = (uint64_t)n_attn * (uint64_t)h.n_kv *
                           (row_bytes(p.cache_type_k, h.head_dim) + row_bytes(p.cache_type_v, h.head_dim));
    e.state_bytes_per_seq = (uint64_t)n_rec * (uint64_t)(h.state_floats() + h.conv_floats()) * sizeof(float);
    const uint64_t qd = (uint64_t)h.n_head * h.head_dim, kvd = (uint64_t)h.n_kv * h.head_dim;
    const uint64_t per_token = 3ull * h.n_embd + 2ull * h.n_ff + (n_attn ? qd * 5 + 2 * kvd : 0) +
                               (n_rec ? 2ull * h.conv_channels() + 2ull * h.n_v * h.dv + 4ull * h.n_v : 0);
    e.scratch_bytes = 512ull * per_token * sizeof(float);
    // ensure_record's buffers: K - 1 conv rows, then per row a conv row and its Gated DeltaNet inputs, and of a tree
    // the kTreeSlots states its schedule sets aside (BatchMeta::rec_state)
    const uint64_t state = (uint64_t)n_rec * (uint64_t)h.state_floats() * sizeof(float);
    const uint64_t conv_row = (uint64_t)n_rec * (uint64_t)h.conv_channels() * sizeof(float);
    const uint64_t inputs = (uint64_t)n_rec * (uint64_t)(h.conv_channels() + 2 * h.n_v) * sizeof(float);
    if (n_rec > 0) {
        e.record_bytes_fixed = (uint64_t)(h.conv_k - 1) * conv_row;
        e.record_bytes_per_row = inputs + conv_row;
        e.tree_record_bytes_per_row = e.record_bytes_per_row;
        e.tree_record_bytes_fixed = (uint64_t)kTreeSlots * state;
    }
    write_sized(out, e);
}

void QwenModel::load_weights(const dfl_model_params &p) {
    w_.init(dev_.get(), p);
    const HParams &h = hp_;
    const dfl_tensor *emb = w_.find("token_embd.weight");
    if (!emb) fail(DFL_ERR_INVALID, "tensor token_embd.weight is missing");
    hp_.n_vocab = positive_hparam((int64_t)emb->dims[1], "vocabulary size (token_embd.weight dims[1])");

    tok_embd_ = w_.matrix("token_embd.weight", h.n_embd, h.n_vocab);
    w_.upload(tok_embd_);
    output_ = w_.matrix("output.weight", h.n_embd, h.n_vocab, true);
    if (output_.empty()) output_ = tok_embd_;  // tied embeddings
    w_.upload(output_);
    output_norm_ = w_.vec("output_norm.weight", h.n_embd);

    layers_.resize((size_t)h.n_layer);
    for (int il = 0; il < h.n_layer; il++) {
        Layer &L = layers_[(size_t)il];
        L.attn = h.is_attn(il);
        L.attn_norm = w_.vec(blk(il, "attn_norm.weight"), h.n_embd);
        L.post_norm = w_.vec(blk(il, h.hybrid ? "post_attention_norm.weight" : "ffn_norm.weight"), h.n_embd);
        if (L.attn) {
            L.kv_index = n_attn_++;
            const int64_t q_out = (int64_t)h.n_head * h.head_dim * (h.gated_attn ? 2 : 1);
            L.wq = w_.matrix(blk(il, "attn_q.weight"), h.n_embd, q_out);
            L.wk = w_.matrix(blk(il, "attn_k.weight"), h.n_embd, (int64_t)h.n_kv * h.head_dim);
            L.wv = w_.matrix(blk(il, "attn_v.weight"), h.n_embd, (int64_t)h.n_kv * h.head_dim);
            L.wo = w_.matrix(blk(il, "attn_output.weight"), (int64_t)h.n_head * h.head_dim, h.n_embd);
            L.q_norm = w_.vec(blk(il, "attn_q_norm.weight"), h.head_dim);
            L.k_norm = w_.vec(blk(il, "attn_k_norm.weight"), h.head_dim);
        } else {
            L.rec_index = n_rec_++;
            const int C = h.conv_channels();
            L.wqkv = w_.matrix(blk(il, "attn_qkv.weight"), h.n_embd, C);
            L.wz = w_.matrix(blk(il, "attn_gate.weight"), h.n_embd, (int64_t)h.n_v * h.dv);
            L.wb = w_.matrix(blk(il, "ssm_beta.weight"), h.n_embd, h.n_v);
            L.wa = w_.matrix(blk(il, "ssm_alpha.weight"), h.n_embd, h.n_v);
            L.wout = w_.matrix(blk(il, "ssm_out.weight"), (int64_t)h.n_v * h.dv, h.n_embd);
            L.conv_w = w_.vec_transposed(blk(il, "ssm_conv1d.weight"), h.conv_k, C);  // (ConvCall: tap-major)
            L.ssm_a = w_.vec(blk(il, "ssm_a"), h.n_v);
            L.dt_bias = w_.vec(blk(il, "ssm_dt.bias"), h.n_v);
            L.ssm_norm = w_.vec(blk(il, "ssm_norm.weight"), h.dv);
        }
        L.ffn_gate = w_.matrix(blk(il, "ffn_gate.weight"), h.n_embd, h.n_ff);
        L.ffn_up = w_.matrix(blk(il, "ffn_up.weight"), h.n_embd, h.n_ff);
        L.ffn_down = w_.matrix(blk(il, "ffn_down.weight"), h.n_ff, h.n_embd);
        if (L.attn) {
            L.in_proj = w_.fuse({&L.wq, &L.wk, &L.wv});
            w_.upload(L.wo);
        } else {
            L.in_proj = w_.fuse({&L.wqkv, &L.wz, &L.wb, &L.wa});
            w_.upload(L.wout);
        }
        L.gate_up = w_.fuse({&L.ffn_gate, &L.ffn_up});
        w_.upload(L.ffn_down);
        // the device's decode layout of the rest of what decode steps multiply with (fuse gave the fused ones theirs)
        for (Weight *w : {&L.wo, &L.wout, &L.ffn_down})
            if (!w->empty()) dev_->prepare_weight(*w);
    }
    dev_->prepare_weight(output_);
    w_.done();
}

}  // namespace dfl
