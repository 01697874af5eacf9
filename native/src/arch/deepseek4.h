// The DeepSeek V4 (GGUF arch "deepseek4") layer plan, written against the op table (ops/device.h, "DeepSeek V4"):
// hyper-connection streams around every sub-block, shared-KV attention with a low-rank query, a sliding-window ring,
// compressed rows (HCA; CSA with overlapping windows and a lightning indexer), sinks, grouped low-rank output, and an
// all-MoE FFN (hash-routed first layers, shared expert, clamped SwiGLU). Spec: deepseek4.md §2 (forward), §3 (state).
//
// Per-sequence state (slots, like the recurrent state of qwen35): each layer's window ring [window][head_dim], and
// for compressing layers their compressor buffers (Ds4CompressCall layout), for CSA layers also the indexer
// compressor's. Compressed rows and index keys live in paged pools addressed through the sequence's KV blocks
// (core/seqtable), so the pool's token capacity bounds them.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "arch/model.h"
#include "arch/weights.h"
#include "core/seqtable.h"
#include "core/step_graphs.h"
#include "ops/device.h"

namespace dfl {

// How multi-token forwards run (metadata deepseek4.engine.prefill).
enum class Ds4Prefill { Exact, Dense, Sparse };

struct Ds4HParams {
    int n_layer = 0, n_embd = 0, n_vocab = 0, n_ctx_train = 0;
    int n_head = 0, head_dim = 0, rope_dim = 0;
    int q_lora = 0, o_groups = 0, o_lora = 0;
    int window = 0;
    std::vector<int> ratio;        // per layer: 0 window only, 4 CSA (indexer), other: HCA
    std::vector<float> clamp_exp;  // per layer swiglu_clamp_exp
    std::vector<float> clamp_shexp;
    int idx_heads = 0, idx_dim = 0, idx_top_k = 0;
    int n_expert = 0, n_used = 0, n_shared = 0, n_ff = 0, n_hash = 0;
    bool weights_norm = true;
    float routed_scale = 1.0f;
    int hc = 4, sinkhorn = 20;
    float hc_eps = 1e-6f, eps = 1e-6f;
    float theta = 10000.0f, compress_theta = 160000.0f;
    float yarn_factor = 1.0f, beta_fast = 32.0f, beta_slow = 1.0f;
    int yarn_orig_ctx = 0;
    Ds4Prefill prefill = Ds4Prefill::Exact;
    bool fused_decode = false;  // one-token steps replayed as captured device graphs (where the device has them)

    bool csa(int il) const { return ratio[(size_t)il] == 4; }
    bool compressing(int il) const { return ratio[(size_t)il] > 0; }
    int comp_width(int il) const { return head_dim * (csa(il) ? 2 : 1); }  // compressor projection width
};

// Reads the hyperparameters (deepseek4.* keys, upstream llama.cpp names) and the load-time switches.
Ds4HParams ds4_hparams(const dfl_model_params &p);
// The inverse RoPE frequencies of the compressing layers: compress_theta with the YaRN ramp, no magnitude scaling.
std::vector<float> ds4_compress_inv_freq(const Ds4HParams &h);
// model_estimate for deepseek4.
void estimate_deepseek4(const dfl_model_params &p, dfl_model_estimate *out);
// Compressed rows one KV block of block_size tokens holds for a layer of this ratio.
inline int ds4_rows_per_block(int block_size, int ratio) { return (block_size + ratio - 1) / ratio; }

struct Ds4Layer {
    int ratio = 0;
    bool csa = false;
    const float *hc_attn_base = nullptr, *hc_attn_scale = nullptr, *hc_ffn_base = nullptr, *hc_ffn_scale = nullptr;
    Weight hc_attn_fn, hc_ffn_fn;
    const float *attn_norm = nullptr, *q_norm = nullptr, *kv_norm = nullptr, *sinks = nullptr, *ffn_norm = nullptr;
    Weight wq_a, wq_b, wkv;
    Weight wo_a;  // attn_output_a: group g owns rows [g * o_lora, (g + 1) * o_lora)
    Weight wo_b;
    // compressor (ratio > 0)
    Weight c_kv, c_gate;
    const float *c_ape = nullptr, *c_norm = nullptr;
    // indexer (CSA)
    Weight i_q_b, i_proj, i_kv, i_gate;
    const float *i_ape = nullptr, *i_norm = nullptr;
    // MoE
    Weight gate_inp, exp_gate, exp_up, exp_down, sh_gate, sh_up, sh_down;
    // The products of the normed sub-block input laid side by side where the device copies its weights (fuse), one
    // product each for a step: wq_a | wkv, the compressors' and indexer's c_kv | c_gate | i_kv | i_gate | i_proj (16-bit
    // in quantized files), the shared expert's sh_gate | sh_up; empty where the parts stay apart.
    Weight in_q, in_c, sh_in;
    // rows of in_q's output a token (the region of acts_.fused before in_c's), 0 where not fused
    int64_t in_q_rows() const { return in_q.n_out; }
    const float *exp_bias = nullptr;
    const int32_t *tid2eid = nullptr;  // [vocab][k_table] on the device (hash layers)
    int k_table = 0;
    // offsets (floats) of this layer's parts of a sequence slot; -1 where absent
    int64_t ring_off = -1, comp_off = -1, idx_off = -1;
    int comp_pool = -1;  // index into comp_rows_ / idx_rows_
};

class DeepSeek4Model final : public Model {
public:
    DeepSeek4Model(const dfl_model_params &p, std::unique_ptr<Device> dev);
    ~DeepSeek4Model() override;

    void info(dfl_model_info *out) const override;
    void kv_stats(dfl_kv_stats *out) const override;
    int32_t seq_alloc() override;
    void seq_free(int32_t s) override;
    void seq_reserve(int32_t s, uint32_t n_tokens) override;
    uint32_t seq_length(int32_t s) const override;
    void seq_truncate(int32_t s, uint32_t n) override;
    void seq_snapshot(int32_t s) override;
    void seq_rollback(int32_t s) override;
    void forward(const dfl_batch &b, const TopKOut *topk = nullptr) override;
    void logits_row(uint32_t row, float *out) override;
    uint64_t seq_export(int32_t s, void *buf, uint64_t size) override;
    void seq_import(int32_t s, const void *buf, uint64_t size) override;

    // Bytes of one sequence slot (rings and compressor buffers) and of one token's compressed rows.
    uint64_t slot_bytes() const { return (uint64_t)slot_floats_ * sizeof(float); }
    uint64_t comp_bytes_per_token() const;

private:
    // One step of a forward: entries with their tokens (a sub-range of each caller entry), run batched.
    struct StepEntry {
        int32_t seq = 0;
        uint32_t off = 0, n = 0;  // tokens [off, off + n) of the caller's entry
        const dfl_seq_batch *sb = nullptr;
        bool logits_all = false, logits_last = false;
        int64_t out_row = 0;      // first caller logits row this step's rows go to
        bool record = false;
    };
    struct Acts {
        int64_t cap = 0;
        DevBuf X, X2, flat, mix, post, comb, x, h, F;   // HC streams and sub-block I/O
        DevBuf qa, q, kv, attn, grp_in, grp_out, cat;    // attention
        DevBuf ckv, cgate, ikv, igate, iq, iw, sel;      // compressors and indexer
        DevBuf logit_e, ids, wts, sh_g, sh_u, moe;       // MoE
        DevBuf fused;                                    // fused products' outputs: in_q's, then in_c's (or sh_in's)
        DevBuf meta;
    };
    // Per-sequence recording (DFL_SEQ_RECORD): the slot before the forward and each token's ring row and
    // compressor inputs, so seq_truncate can rebuild the state at any length inside it.
    struct SeqRec {
        DevBuf snap;       // slot_floats (seq_snapshot)
        DevBuf base;       // slot_floats: the slot before the recorded forward
        DevBuf tokens;     // [cap][rec_floats_]
        uint32_t cap = 0;
    };

    void load_weights(const dfl_model_params &p);
    void layout_state();
    void ensure_acts(int64_t T);
    // b at least bytes long (StepGraphs::grow: the graphs dropped where it moves)
    void ensure(DevBuf &b, size_t bytes, const char *what) { graphs_.grow(*dev_, b, bytes, what); }
    float *slot_ptr(int32_t s) const { return states_.f() + (size_t)s * (size_t)slot_floats_; }

    void run_step(const std::vector<StepEntry> &es, bool multi, float *logits_host, const TopKOut *topk);
    void run_layers(const BatchMeta &m, bool dense, const std::vector<StepEntry> &es, int64_t R, const int32_t *out_rows);
    // An HC site: the sub-block input of the streams X and its RMSNorm with norm_w into acts_.h.
    void hc_site(const Weight &fn, const float *base, const float *scale, const float *norm_w, int64_t T);
    // What a sub-block leaves for the streams' merge beside its output in acts_.F: the shared expert's output to
    // add, or null.
    struct SubOut {
        const float *shared = nullptr;
    };
    // The streams merged with the sub-block's output; next: the mixing matrix of the HC site right after (or null).
    void hc_merge(int64_t T, SubOut o, const Weight *next);
    void attention_layer(int il, const BatchMeta &m, bool dense, const std::vector<StepEntry> &es);
    void run_compressor(int il, bool indexer, const BatchMeta &m, const float *kv, const float *gate);
    SubOut moe_layer(int il, const BatchMeta &m);
    void record_rows(const std::vector<StepEntry> &es, const float *src, int64_t width, int64_t rec_off);
    void replay(int32_t s, uint32_t base, uint32_t k);
    // Calls f(row, dim) for each compressed row (then, on a CSA layer, each index key) the first n tokens of q hold,
    // in the order a sequence blob stores them: row is its device address, dim its width in floats.
    template <class F>
    void each_comp_row(const Seq &q, uint32_t n, F f) const;

    std::unique_ptr<Device> dev_;
    Ds4HParams hp_;
    WeightStore w_;
    Weight tok_embd_, output_, out_hc_fn_;
    const float *output_norm_ = nullptr, *out_hc_base_ = nullptr, *out_hc_scale_ = nullptr;
    const float *inv_main_ = nullptr, *inv_comp_ = nullptr;
    std::vector<Ds4Layer> layers_;
    uint32_t n_threads_ = 0;

    int64_t slot_floats_ = 0;
    int64_t rec_floats_ = 0;  // floats recorded per token
    std::vector<int64_t> rec_ring_off_, rec_comp_off_, rec_idx_off_;  // per layer, within a token's record
    DevBuf states_;
    std::vector<DevBuf> comp_rows_, idx_rows_;  // per compressing layer / CSA layer
    SeqTable table_;
    std::vector<SeqRec> rec_;
    Acts acts_;
    DevBuf logits_, topk_;
    std::vector<int64_t> logits_dest_;  // the caller's row of each row of logits_ the last forward left (logits_row)
    // A token-by-token prefill's logits rows by caller row, as each step leaves them (logits_row; steps overwrite
    // logits_): kept_n_ rows after such a forward, 0 otherwise.
    DevBuf kept_;
    int64_t kept_n_ = 0;
    bool keeping_ = false;
    std::vector<int32_t> host_meta_;
    std::vector<uint8_t> host_topk_;
    // Captured one-token steps (fused_decode). A shape whose capture failed runs op by op from then on.
    StepGraphs graphs_{StepGraphs::OnFailure::GiveUp};
};

}  // namespace dfl
