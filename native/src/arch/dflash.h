// The DFlash speculative-decoding draft (arch "dflash"): a small Qwen3-style stack whose keys and values come from the
// target's hidden states (context rows, kept in the draft's paged KV cache) and from a block of [root, mask...] tokens
// embedded with the target's table (queries; not kept). Its head is the target's. Written against the op table
// (ops/device.h) like the Qwen plans; it runs only through draft_forward.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "arch/kvpool.h"
#include "arch/model.h"
#include "arch/weights.h"
#include "core/seqtable.h"
#include "core/step_graphs.h"
#include "ops/device.h"

namespace dfl {

struct DFlashHParams {
    int n_layer = 0, n_embd = 0, n_ff = 0, n_head = 0, n_kv = 0, head_dim = 0, n_ctx_train = 0;
    float eps = 1e-6f, theta = 0.0f;
    int window = 0;              // dflash.attention.sliding_window (0: no sliding layers)
    std::vector<bool> sliding;   // per layer: windowed (window > 0 and the pattern says so)
    bool sliding_causal = true;  // dflash.attention.causal != 0: sliding layers are causal inside the block
    float logit_scale = 1.0f, softcap = 0.0f;
    // DFlash2 (spec §5.1; all 0 for a v1 draft): dflash.conv_kernel_size, conv_group_size, selector_rank,
    // selector_top_k
    int conv_k = 0, conv_group = 0, sel_rank = 0, sel_top_k = 0;
    bool dflash2() const { return conv_k > 0; }
};

// Reads the draft's hyperparameters from the metadata handed to model_load (keys "dflash.*").
DFlashHParams dflash_hparams(const dfl_model_params &p);
// model_estimate for a draft.
void estimate_dflash(const dfl_model_params &p, dfl_model_estimate *out);

struct DraftLayer {
    bool sliding = false;
    const float *attn_norm = nullptr, *ffn_norm = nullptr, *q_norm = nullptr, *k_norm = nullptr;
    Weight wq, wk, wv, wo, ffn_gate, ffn_up, ffn_down;
    // k|v and gate|up as one matrix each where the device copies weights (WeightStore::fuse; empty: the parts apart):
    // k and v multiply the block rows and the context rows alike, q only the block's
    Weight kv_proj, gate_up;
    // DFlash2: the dynamic convolutions around the attention and FFN sublayers: base kernels [2][K][H] (device f32;
    // side 0 "prepare", 1 "finish") and the kernel projections (H -> 2 * K * H / group)
    const float *attn_conv_base = nullptr, *ffn_conv_base = nullptr;
    Weight attn_conv_proj, ffn_conv_proj;
};

class DFlashModel final : public Model {
public:
    DFlashModel(const dfl_model_params &p, std::unique_ptr<Device> dev);
    ~DFlashModel() override;

    void info(dfl_model_info *out) const override;
    void kv_stats(dfl_kv_stats *out) const override;
    int32_t seq_alloc() override { return table_.alloc(); }
    void seq_free(int32_t s) override { table_.free(s); }
    void seq_reserve(int32_t s, uint32_t n_tokens) override { table_.reserve(s, n_tokens); }
    uint32_t seq_length(int32_t s) const override { return table_.get(s).len; }
    void seq_truncate(int32_t s, uint32_t n) override;
    void seq_snapshot(int32_t s) override;
    void seq_rollback(int32_t s) override;
    void forward(const dfl_batch &b, const TopKOut *topk = nullptr) override;
    void draft_forward(uint32_t n_entries, const dfl_draft_entry *entries, const TopKOut &topk) override;

private:
    // Activations of one step, sized for `cap` rows (block rows, or one chunk of context rows).
    struct Acts {
        int64_t cap = 0;
        DevBuf feat, g;                // context: target features, their projection
        DevBuf x, xn, mix, ff_g, ff_u; // block: residual stream, normed, layer output, FFN
        DevBuf qf, kf, vf, Q, attn;    // attention (kf, vf also for the context)
        DevBuf dyn, cv;                // DFlash2: a sublayer's dynamic kernels, a conv output
        DevBuf fused;                  // a fused product's rows (k|v, gate|up), up to kFusedMaxTokens of them
    };
    // Where the step's metadata sits in meta_ (device) and host_meta_.
    struct StepLayout {
        int64_t Tc = 0, Tb = 0, rows = 0;
        int32_t Eb = 0;
        uint32_t max_blocks = 0;  // the block table's width (a replayed step's rounded up: StepGraphs::table_width)
        bool graph = false;       // the step is replayed from a device graph (draft_forward)
        size_t ctx_pos = 0, ctx_slot = 0, tokens = 0, pos = 0, ent = 0, kv_slot = 0, t0 = 0, n = 0, len0 = 0, slot = 0,
               bt = 0, out_rows = 0, sel_prev = 0, sel_root = 0, total = 0;
    };

    void load_weights(const dfl_model_params &p);
    Weight weight(const std::string &name, int64_t n_in, int64_t n_out);
    const float *floats(const std::string &name, const std::vector<int64_t> &dims);

    StepLayout validate(uint32_t n, const dfl_draft_entry *es, const TopKOut &topk) const;
    void fill_meta(uint32_t n, const dfl_draft_entry *es, const StepLayout &l);
    BatchMeta block_meta(const StepLayout &l, int64_t max_n, int64_t max_ctx) const;
    void ensure_acts(int64_t rows);
    // b at least bytes long (StepGraphs::grow: the graphs dropped where it moves)
    void ensure(DevBuf &b, size_t bytes, const char *what) { graphs_.grow(*dev_, b, bytes, what); }
    void stage_features(uint32_t n, const dfl_draft_entry *es, int64_t c0, int64_t T);
    void run_context(uint32_t n, const dfl_draft_entry *es, const StepLayout &l);
    void context_chunk(const int32_t *d_pos, const int32_t *d_slot, int64_t T);
    void project_kv(const DraftLayer &L, const float *x, int64_t T, AttnPrep &p);
    void run_block(const BatchMeta &m, int64_t rows, const int32_t *d_out_rows);
    void block_attention(int il, const BatchMeta &m, const float *in);
    void conv(const BatchMeta &m, const float *base, int side, const float *x, float *out);
    void fetch_topk(int64_t rows, const TopKOut &topk, const StepLayout &l);

    std::unique_ptr<Device> dev_;
    DFlashHParams hp_;
    int n_feat_ = 0, n_vocab_ = 0, n_embd_rows_ = 0;  // fc input; rows of the target's head and embedding table
    uint32_t n_threads_ = 0;
    WeightStore w_;  // after dev_: its device buffers go first

    Weight fc_, tok_embd_, output_;
    const float *enc_norm_ = nullptr, *output_norm_ = nullptr, *inv_freq_ = nullptr;
    std::vector<DraftLayer> layers_;
    Weight sel_pred_, sel_succ_, sel_hidden_;  // DFlash2 selector: codebooks [vocab][rank], hidden projection H -> rank

    KVPool kv_;  // per layer
    SeqTable table_;

    Acts acts_;
    DevBuf meta_, logits_, topk_, sel_g_;
    StepGraphs graphs_{StepGraphs::OnFailure::GiveUp};  // draft steps by shape (draft_forward)
    std::vector<int32_t> host_meta_;
    std::vector<float> host_feat_;
    std::vector<uint8_t> host_topk_;
};

}  // namespace dfl
