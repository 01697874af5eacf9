// DeepSeek V4 hyperparameters from the deepseek4.* metadata (upstream llama.cpp key names, spec appendix §1), the
// compress RoPE frequencies, and model_estimate.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "arch/deepseek4.h"
#include "arch/hparams.h"
#include "core/sized.h"
#include "quant.h"

namespace dfl {

namespace {

constexpr const char *kPrefix = "deepseek4.";

struct Ds4Meta {
    MetaMap kv;

    const dfl_meta *find(const std::string &k) const { return meta_find(kv, kPrefix + k); }
    [[noreturn]] static void bad(const std::string &k, const std::string &why) {
        fail(DFL_ERR_INVALID, std::string("metadata ") + kPrefix + k + " " + why);
    }
    // An integer key (a per-layer array must be uniform).
    int64_t i(const std::string &k) const {
        const dfl_meta *m = find(k);
        if (!m) bad(k, "is missing");
        if (m->kind == DFL_META_INT) return m->i;
        if (m->kind == DFL_META_INT_ARRAY && m->n > 0) {
            for (uint32_t j = 1; j < m->n; j++)
                if (m->ia[j] != m->ia[0]) bad(k, "varies per layer; one value is supported");
            return m->ia[0];
        }
        bad(k, "is not an integer");
    }
    int64_t i(const std::string &k, int64_t def) const { return find(k) ? i(k) : def; }
    double f(const std::string &k, double def) const { return meta_number(find(k), kPrefix + k, def); }
    // A per-layer float (scalar or array of at least n values; longer arrays carry MTP layers).
    std::vector<float> per_layer(const std::string &k, int n, double def) const {
        const dfl_meta *m = find(k);
        std::vector<float> v((size_t)n, (float)def);
        if (!m) return v;
        if (m->kind == DFL_META_FLOAT || m->kind == DFL_META_INT) {
            std::fill(v.begin(), v.end(), (float)(m->kind == DFL_META_FLOAT ? m->f : (double)m->i));
        } else if (m->kind == DFL_META_FLOAT_ARRAY || m->kind == DFL_META_INT_ARRAY) {
            if (m->n < (uint32_t)n) bad(k, "has " + std::to_string(m->n) + " entries for " + std::to_string(n) + " layers");
            for (int j = 0; j < n; j++) v[(size_t)j] = (float)(m->kind == DFL_META_FLOAT_ARRAY ? m->fa[j] : (double)m->ia[j]);
        } else {
            bad(k, "is not a number or number array");
        }
        return v;
    }
    std::string s(const std::string &k, const std::string &def) const {
        const dfl_meta *m = find(k);
        if (!m) return def;
        if (m->kind != DFL_META_STRING || !m->s) bad(k, "is not a string");
        return m->s;
    }
};

int positive(int64_t v, const std::string &what) { return positive_hparam(v, kPrefix + what); }

const dfl_tensor *find_tensor(const dfl_model_params &p, const char *name) {
    for (uint32_t i = 0; i < p.n_tensors; i++)
        if (p.tensors[i].name && std::strcmp(p.tensors[i].name, name) == 0) return &p.tensors[i];
    return nullptr;
}

}  // namespace

Ds4HParams ds4_hparams(const dfl_model_params &p) {
    Ds4Meta m;
    m.kv = meta_map(p);
    Ds4HParams h;
    const int blocks = positive(m.i("block_count"), "block_count");
    const int64_t nextn = m.i("nextn_predict_layers", 0);
    if (nextn < 0 || nextn >= blocks) Ds4Meta::bad("nextn_predict_layers", "is out of range");
    h.n_layer = blocks - (int)nextn;
    h.n_embd = positive(m.i("embedding_length"), "embedding_length");
    h.n_ctx_train = (int)m.i("context_length", 0);
    h.n_head = positive(m.i("attention.head_count"), "attention.head_count");
    if (m.i("attention.head_count_kv", 1) != 1)
        fail(DFL_ERR_UNSUPPORTED, "deepseek4.attention.head_count_kv must be 1 (one shared K=V head)");
    h.head_dim = positive(m.i("attention.key_length"), "attention.key_length");
    if (m.i("attention.value_length", h.head_dim) != h.head_dim)
        fail(DFL_ERR_UNSUPPORTED, "deepseek4.attention.value_length must equal key_length (K = V)");
    h.rope_dim = positive(m.i("rope.dimension_count", h.head_dim), "rope.dimension_count");
    h.eps = (float)m.f("attention.layer_norm_rms_epsilon", 1e-6);
    h.theta = (float)m.f("rope.freq_base", 10000.0);
    h.compress_theta = (float)m.f("attention.compress_rope_freq_base", 160000.0);
    h.yarn_factor = (float)m.f("rope.scaling.factor", 1.0);
    h.beta_fast = (float)m.f("rope.scaling.yarn_beta_fast", 32.0);
    h.beta_slow = (float)m.f("rope.scaling.yarn_beta_slow", 1.0);
    h.yarn_orig_ctx = (int)m.i("rope.scaling.original_context_length", h.n_ctx_train);
    const std::string scaling = m.s("rope.scaling.type", "yarn");
    if (scaling == "none") h.yarn_factor = 1.0f;
    else if (scaling != "yarn")
        fail(DFL_ERR_UNSUPPORTED, "deepseek4.rope.scaling.type \"" + scaling + "\" is not supported (yarn, none)");
    h.q_lora = positive(m.i("attention.q_lora_rank"), "attention.q_lora_rank");
    h.o_groups = positive(m.i("attention.output_group_count"), "attention.output_group_count");
    h.o_lora = positive(m.i("attention.output_lora_rank"), "attention.output_lora_rank");
    h.window = positive(m.i("attention.sliding_window"), "attention.sliding_window");
    h.idx_heads = positive(m.i("attention.indexer.head_count"), "attention.indexer.head_count");
    h.idx_dim = positive(m.i("attention.indexer.key_length"), "attention.indexer.key_length");
    h.idx_top_k = positive(m.i("attention.indexer.top_k"), "attention.indexer.top_k");
    h.n_expert = positive(m.i("expert_count"), "expert_count");
    h.n_used = positive(m.i("expert_used_count"), "expert_used_count");
    h.n_shared = (int)m.i("expert_shared_count", 1);
    h.n_ff = positive(m.i("expert_feed_forward_length"), "expert_feed_forward_length");
    h.n_hash = (int)m.i("hash_layer_count", 0);
    h.weights_norm = m.i("expert_weights_norm", 1) != 0;
    h.routed_scale = (float)m.f("expert_weights_scale", 1.0);
    if (m.find("expert_gating_func") && m.i("expert_gating_func") != 4)
        fail(DFL_ERR_UNSUPPORTED, "deepseek4.expert_gating_func must be 4 (sqrt-softplus)");
    if (m.i("expert_group_count", 0) > 1) fail(DFL_ERR_UNSUPPORTED, "deepseek4: group-limited routing is not supported");
    h.hc = positive(m.i("hyper_connection.count", 4), "hyper_connection.count");
    if (h.hc > 16) fail(DFL_ERR_UNSUPPORTED, "deepseek4.hyper_connection.count above 16 is not supported");
    h.sinkhorn = positive(m.i("hyper_connection.sinkhorn_iterations", 20), "hyper_connection.sinkhorn_iterations");
    h.hc_eps = (float)m.f("hyper_connection.epsilon", 1e-6);
    h.clamp_exp = m.per_layer("swiglu_clamp_exp", h.n_layer, 0.0);
    h.clamp_shexp = m.find("swiglu_clamp_shexp") ? m.per_layer("swiglu_clamp_shexp", h.n_layer, 0.0) : h.clamp_exp;

    const dfl_meta *r = m.find("attention.compress_ratios");
    if (!r || r->kind != DFL_META_INT_ARRAY) Ds4Meta::bad("attention.compress_ratios", "is missing or not an integer array");
    if (r->n < (uint32_t)h.n_layer)
        Ds4Meta::bad("attention.compress_ratios", "has " + std::to_string(r->n) + " entries for " + std::to_string(h.n_layer) + " layers");
    for (int il = 0; il < h.n_layer; il++) {
        if (r->ia[il] < 0 || r->ia[il] > (1 << 20)) Ds4Meta::bad("attention.compress_ratios", "has a bad entry");
        h.ratio.push_back((int)r->ia[il]);
    }

    const dfl_tensor *emb = find_tensor(p, "token_embd.weight");
    if (!emb || emb->n_dims < 2) fail(DFL_ERR_INVALID, "tensor token_embd.weight is missing");
    h.n_vocab = positive((int64_t)emb->dims[1], "vocabulary size (token_embd.weight dims[1])");

    const std::string mode = m.s("engine.prefill", "exact");
    if (mode == "exact") h.prefill = Ds4Prefill::Exact;
    else if (mode == "dense") h.prefill = Ds4Prefill::Dense;
    else if (mode == "sparse") h.prefill = Ds4Prefill::Sparse;
    else fail(DFL_ERR_INVALID, "deepseek4.engine.prefill = \"" + mode + "\": allowed values are exact, dense, sparse");

    // deepseek4.engine.fused_decode (the plugin's --ds4-fused-decode, cuda only): one-token steps (decode, and exact
    // prefill's token steps) are captured once per shape and replayed as one device graph, with no host round trip
    // inside a step. A device without graphs runs them op by op, which computes the same.
    h.fused_decode = m.i("engine.fused_decode", 0) != 0;

    // shapes the plan relies on
    if (h.rope_dim % 2 != 0 || h.rope_dim > h.head_dim || h.rope_dim > h.idx_dim)
        fail(DFL_ERR_INVALID, "deepseek4.rope.dimension_count " + std::to_string(h.rope_dim) +
                                  " must be even and fit the head (" + std::to_string(h.head_dim) + ") and indexer (" +
                                  std::to_string(h.idx_dim) + ") dims");
    if (((int64_t)h.n_head * h.head_dim) % h.o_groups != 0)
        fail(DFL_ERR_INVALID, "deepseek4: heads x head_dim do not divide into attention.output_group_count groups");
    if (h.n_used > h.n_expert) fail(DFL_ERR_INVALID, "deepseek4.expert_used_count exceeds expert_count");
    if (h.n_hash < 0 || h.n_hash > h.n_layer) Ds4Meta::bad("hash_layer_count", "is out of range");
    return h;
}

std::vector<float> ds4_compress_inv_freq(const Ds4HParams &h) {
    const int dim = h.rope_dim, half = dim / 2;
    std::vector<float> f((size_t)half);
    const float base = h.compress_theta, factor = h.yarn_factor;
    // YaRN (spec §2.5.1): pairs below `low` keep their frequency, above `high` are divided by factor, linear between
    const double pi2 = 2.0 * 3.14159265358979323846;
    auto corr = [&](double rot) { return (double)dim * std::log((double)h.yarn_orig_ctx / (rot * pi2)) / (2.0 * std::log((double)base)); };
    double low = std::floor(corr(h.beta_fast)), high = std::ceil(corr(h.beta_slow));
    low = std::max(low, 0.0);
    high = std::min(high, (double)(dim - 1));
    if (low == high) high += 0.001;
    for (int i = 0; i < half; i++) {
        const float pf = (float)std::pow((double)base, (double)((float)(2 * i) / (float)dim));
        const float extrap = 1.0f / pf;
        if (factor == 1.0f || h.yarn_orig_ctx <= 0) {
            f[(size_t)i] = extrap;
            continue;
        }
        const float interp = 1.0f / (factor * pf);
        float ramp = (float)(((double)i - low) / (high - low));
        ramp = std::min(1.0f, std::max(0.0f, ramp));
        const float keep = 1.0f - ramp;  // weight of the original (extrapolated) frequency
        f[(size_t)i] = interp * (1.0f - keep) + extrap * keep;
    }
    return f;
}

void estimate_deepseek4(const dfl_model_params &p, dfl_model_estimate *out) {
    const Ds4HParams h = ds4_hparams(p);
    dfl_model_estimate e;
    std::memset(&e, 0, sizeof e);
    e.struct_size = sizeof e;
    // the hash tables get no copy of the device's own, expert stacks (3-D) only where device_packs_stacks
    const bool stacks = device_packs_stacks();
    e.weight_bytes = estimate_weight_bytes(p, h.n_layer, [&](const dfl_tensor &t) {
        return (t.n_dims < 3 || stacks) && std::strstr(t.name, "tid2eid") == nullptr;
    });
    const uint32_t bs = p.kv_block_size ? p.kv_block_size : 16;
    uint64_t per_block = 0;  // compressed-row bytes one KV block holds over all layers
    uint64_t slot = 0;
    for (int il = 0; il < h.n_layer; il++) {
        slot += (uint64_t)h.window * h.head_dim;
        if (!h.compressing(il)) continue;
        const int m = h.ratio[(size_t)il];
        per_block += (uint64_t)ds4_rows_per_block((int)bs, m) * h.head_dim * sizeof(float);
        slot += (uint64_t)(h.csa(il) ? 4 : 2) * m * h.comp_width(il);
        if (h.csa(il)) {
            per_block += (uint64_t)ds4_rows_per_block((int)bs, m) * h.idx_dim * sizeof(float);
            slot += 4ull * m * 2 * h.idx_dim;
        }
    }
    e.kv_bytes_per_token = (per_block + bs - 1) / bs;
    e.state_bytes_per_seq = slot * sizeof(float);
    const uint64_t hd = (uint64_t)h.n_head * h.head_dim;
    const uint64_t per_token = 4ull * h.hc * h.n_embd + 4ull * h.n_embd + 3 * hd + (uint64_t)h.q_lora +
                               2ull * h.o_groups * h.o_lora + 4ull * h.head_dim + 2ull * h.idx_heads * h.idx_dim +
                               (uint64_t)h.n_expert + 2ull * h.n_used * h.n_embd + 2ull * h.n_ff * (h.n_shared + 1);
    e.scratch_bytes = 512ull * per_token * sizeof(float);
    write_sized(out, e);
}

}  // namespace dfl
