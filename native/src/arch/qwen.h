// The Qwen3 and Qwen3.5 (hybrid Gated DeltaNet) layer plans, written once against the op table (ops/device.h).
#pragma once

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

struct HParams {
    std::string arch;
    int n_layer = 0;  // trunk layers run by the engine
    int n_embd = 0, n_ff = 0, n_head = 0, n_kv = 0, head_dim = 0, n_vocab = 0, n_ctx_train = 0;
    float eps = 1e-6f, theta = 10000.0f;
    int rope_dim = 0;
    // qwen35 hybrid
    bool hybrid = false;
    bool gated_attn = false;
    int full_attn_interval = 0;
    int conv_k = 0, dk = 0, n_k = 0, n_v = 0, dv = 0;

    bool is_attn(int il) const { return !hybrid || (il + 1) % full_attn_interval == 0; }
    int conv_channels() const { return 2 * n_k * dk + n_v * dv; }
    int64_t state_floats() const { return (int64_t)n_v * dk * dv; }                  // recurrent state of one layer
    int64_t conv_floats() const { return (int64_t)(conv_k - 1) * conv_channels(); }  // conv state of one layer
};

// Reads the architecture's hyperparameters from the metadata handed to model_load.
HParams qwen_hparams(const dfl_model_params &p);

struct Layer {
    bool attn = true;
    int kv_index = -1;   // index among attention layers
    int rec_index = -1;  // index among recurrent layers
    const float *attn_norm = nullptr, *post_norm = nullptr;
    // attention
    Weight wq, wk, wv, wo;
    const float *q_norm = nullptr, *k_norm = nullptr;
    // gated delta net
    Weight wqkv, wz, wb, wa, wout;
    const float *conv_w = nullptr, *ssm_a = nullptr, *dt_bias = nullptr, *ssm_norm = nullptr;
    // ffn
    Weight ffn_gate, ffn_up, ffn_down;
    // Matrices that read the same input, side by side in one device buffer (empty where the device keeps the
    // caller's mapping or the types differ): q|k|v or qkv|z|b|a, and gate|up. The parts above point into them.
    Weight in_proj, gate_up;
};

class QwenModel final : public Model {
public:
    QwenModel(const dfl_model_params &p, std::unique_ptr<Device> dev);
    ~QwenModel() override { graphs_.drop(*dev_); }

    void info(dfl_model_info *out) const override;
    void kv_stats(dfl_kv_stats *out) const override;
    int32_t seq_alloc() override;
    void seq_free(int32_t s) override;
    void seq_reserve(int32_t s, uint32_t n_tokens) override;
    uint32_t seq_length(int32_t s) const override;
    void seq_truncate(int32_t s, uint32_t n) override;
    void seq_snapshot(int32_t s) override;
    void seq_rollback(int32_t s) override;
    void forward(const dfl_batch &b, const TopKOut *topk = nullptr) override { forward_tree(b, topk, nullptr); }
    void forward_tree(const dfl_batch &b, const TopKOut *topk, const int32_t *const *parents) override;
    void logits_row(uint32_t row, float *out) override { copy_logits_row(*dev_, logits_, logits_rows_, hp_.n_vocab, row, out); }
    const float *captures(uint64_t *n_floats) const override;
    void seq_accept_path(int32_t s, const int32_t *path, uint32_t n) override;
    uint64_t seq_export(int32_t s, void *buf, uint64_t size) override;
    void seq_import(int32_t s, const void *buf, uint64_t size) override;

private:
    // Activations of one forward, sized for `cap` tokens; grown (never per decode step) when a batch is larger.
    struct Acts {
        int64_t cap = 0;
        DevBuf x, xn, mix, ff_g, ff_u;              // residual stream, normed, layer output, FFN
        DevBuf qf, kf, vf, Q, gate, attn;           // attention
        DevBuf qkv, z, bb, aa, cv, beta, g, core;   // Gated DeltaNet
        DevBuf fused;                               // output of a fused projection, before it is split
    };
    // Per-sequence device buffers for snapshot and recording, allocated when first needed. A recorded forward leaves
    // the slot's recurrent state as it was and keeps its tokens' Gated DeltaNet inputs (rec_in), from which a rollback
    // replays the tokens it keeps onto the slot; of a tree, rec_state holds the states its schedule sets aside
    // (BatchMeta::rec_state).
    struct SeqState {
        DevBuf snap;        // slot_floats
        DevBuf rec_state;   // kTreeSlots * n_rec * state_floats, once the sequence has verified a tree
        DevBuf rec_window;  // n_rec * (K - 1 + rec_cap) * C
        DevBuf rec_in;      // rec_in_rows * n_rec * (C + 2 n_v) (BatchMeta::rec_in)
        uint32_t rec_cap = 0, rec_in_rows = 0;
    };

    void load_weights(const dfl_model_params &p);
    float *slot_ptr(int32_t s) const { return states_.f() + (size_t)s * (size_t)slot_floats(); }
    int64_t slot_floats() const { return n_rec_ * (hp_.state_floats() + hp_.conv_floats()); }
    void ensure_acts(int64_t T);
    // b at least bytes long (StepGraphs::grow: the graphs dropped where it moves)
    void ensure(DevBuf &b, size_t bytes, const char *what) { graphs_.grow(*dev_, b, bytes, what); }
    void ensure_record(int32_t s, uint32_t n, bool tree);
    // Sequence s's recurrent state after k tokens of its last recorded forward, the first k or (a tree) the nodes
    // path[0..k-1]: those tokens' recorded inputs through the Gated DeltaNet op again, from the state before it that
    // the slot still holds. The slot then holds the state after them (Seq::rec_pending cleared).
    void replay_records(int32_t s, uint32_t k, const int32_t *path = nullptr);
    // Sequence s's recurrent and conv state made the ones after every token of its last recorded forward, where no
    // truncation or accepted path did it yet: before any other use of the slot (a forward, a snapshot, an export)
    void settle(int32_t s);
    void restore_conv(int32_t s, uint32_t k);
    int64_t rec_in_row_floats() const { return (int64_t)hp_.conv_channels() + 2 * hp_.n_v; }

    void run_layers(const BatchMeta &m, const dfl_batch &b, int64_t rows, const int32_t *d_out_rows);
    void land_captures(const dfl_batch &b, uint64_t n, int64_t rows);
    // A layer's mixer up to its output projection: that weight and its input (run_layers multiplies them with the
    // residual add and the next norm, Device::matmul_add_rmsnorm)
    struct OutProj {
        const Weight *W;
        const float *in;
    };
    OutProj attn_layer(const Layer &L, const BatchMeta &m, int64_t T);
    OutProj gdn_layer(const Layer &L, const BatchMeta &m, int64_t T);
    // A gdn call of this model's shape on inputs cv, g, beta, from the slots' states of the first recurrent layer
    GdnCall gdn_call(const float *cv, const float *g, const float *beta) const;

    std::unique_ptr<Device> dev_;
    HParams hp_;
    WeightStore w_;  // after dev_: its device buffers go first

    Weight tok_embd_, output_;
    const float *output_norm_ = nullptr;
    const float *inv_freq_ = nullptr;
    std::vector<Layer> layers_;
    int n_attn_ = 0, n_rec_ = 0;
    uint32_t n_threads_ = 0;

    // KV pool and recurrent state
    KVPool kv_;                              // per attention layer
    DevBuf states_;                          // [max_seqs][slot_floats]
    SeqTable table_;
    std::vector<SeqState> seq_state_;

    Acts acts_;
    DevBuf meta_, ptrs_, logits_, capture_, topk_;
    // where the device downloads the captures during the forward (Device::host_landing), or null: after it
    float *capture_landing_ = nullptr;
    // the captures the last forward left here for captures() (its batch's capture was null): the landing, or
    // capture_host_ where there is none; null when it left none
    const float *capture_kept_ = nullptr;
    uint64_t capture_kept_n_ = 0;
    std::vector<float> capture_host_;
    int64_t logits_rows_ = 0;     // rows of logits_ the last forward left there (logits_row)
    DevBuf replay_meta_;          // replay_records' one-entry batch: t0, n, slot, then a tree path's rows
    bool recording_ = false;      // the forward running has recording entries
    DevBuf tree_;                 // BatchMeta vis [T] (u64) then parent [T] of a batch with trees
    std::vector<uint64_t> host_tree_;
    std::vector<uint8_t> host_topk_;
    std::vector<int32_t> host_meta_;
    std::vector<float *> host_ptrs_;

    // Decode steps replayed as device graphs. A failed capture is tried again on the shape's next step.
    StepGraphs graphs_{StepGraphs::OnFailure::Retry};
};

}  // namespace dfl
