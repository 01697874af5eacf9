// Qwen3 / Qwen3.5 models on the CPU: weights, paged KV pool, sequences, recurrent state and the batched forward.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ops.h"

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
    int64_t state_floats() const { return (int64_t)n_v * dk * dv; }             // recurrent state of one layer
    int64_t conv_floats() const { return (int64_t)(conv_k - 1) * conv_channels(); }  // conv state of one layer
};

struct Layer {
    bool attn = true;
    int kv_index = -1;   // index among attention layers
    int rec_index = -1;  // index among recurrent layers
    std::vector<float> attn_norm, post_norm;
    // attention
    Weight wq, wk, wv, wo;
    std::vector<float> q_norm, k_norm;
    // gated delta net
    Weight wqkv, wz, wb, wa, wout;
    std::vector<float> conv_w, ssm_a, dt_bias, ssm_norm;
    // ffn
    Weight ffn_gate, ffn_up, ffn_down;
};

struct Seq {
    bool used = false;
    uint32_t len = 0;
    uint32_t reserved = 0;  // tokens the caller asked to hold
    std::vector<int32_t> blocks;
    // snapshot
    bool snap = false;
    uint32_t snap_len = 0;
    std::vector<float> snap_state;
    // per-token record of the last DFL_SEQ_RECORD forward
    bool rec = false;
    uint32_t rec_base = 0, rec_n = 0;
    std::vector<float> rec_states;  // [rec_n + 1][n_rec][state_floats]
    std::vector<float> rec_window;  // [n_rec][conv_k - 1 + rec_n][channels]
};

class Model {
public:
    explicit Model(const dfl_model_params &p);

    void info(dfl_model_info *out) const;
    void kv_stats(dfl_kv_stats *out) const;
    int32_t seq_alloc();
    void seq_free(int32_t s);
    void seq_reserve(int32_t s, uint32_t n_tokens);
    uint32_t seq_length(int32_t s) const;
    void seq_truncate(int32_t s, uint32_t n);
    void seq_snapshot(int32_t s);
    void seq_rollback(int32_t s);
    void forward(const dfl_batch &b);

    const HParams &hparams() const { return hp_; }

private:
    struct Entry {
        int32_t seq;
        int64_t t0, n;        // first row in the batch, token count
        uint32_t len0;        // sequence length before the forward
        uint32_t logits;
        bool record;
    };

    void load_hparams(const dfl_model_params &p);
    void load_weights(const dfl_model_params &p);
    Weight weight(const std::string &name, int64_t n_in, int64_t n_out, bool optional = false);
    std::vector<float> vec(const std::string &name, int64_t n0, int64_t n1 = 1);
    const dfl_tensor *tensor(const std::string &name) const;

    Seq &seq(int32_t s);
    const Seq &seq(int32_t s) const;
    uint32_t blocks_for(uint32_t tokens) const { return (tokens + block_size_ - 1) / block_size_; }
    void grow_blocks(Seq &q, uint32_t tokens);
    void trim_blocks(Seq &q);
    float *state(int32_t s, int rec_layer);  // recurrent state of one layer
    float *conv(int32_t s, int rec_layer);   // conv state of one layer
    int64_t slot_floats() const { return n_rec_ * (hp_.state_floats() + hp_.conv_floats()); }

    void attn_layer(const Layer &L, const std::vector<Entry> &ents, const int32_t *pos, const float *xn, int64_t T,
                    float *out);
    void gdn_layer(const Layer &L, const std::vector<Entry> &ents, const float *xn, int64_t T, float *out);

    HParams hp_;
    std::map<std::string, const dfl_tensor *> tensors_;
    std::vector<std::unique_ptr<uint8_t[]>> owned_;
    uint64_t weight_bytes_ = 0;

    Weight tok_embd_, output_;
    std::vector<float> output_norm_;
    std::vector<Layer> layers_;
    std::vector<float> inv_freq_;
    int n_attn_ = 0, n_rec_ = 0;

    // KV pool
    uint32_t type_k_, type_v_;
    uint32_t block_size_, n_blocks_;
    uint64_t k_row_, v_row_;
    std::vector<std::unique_ptr<uint8_t[]>> k_cache_, v_cache_;  // per attention layer
    std::vector<int32_t> free_blocks_;

    // sequences and their recurrent-state slots
    std::vector<Seq> seqs_;
    std::vector<float> states_;  // [max_seqs][slot_floats]

    ThreadPool pool_;
    Scratch scratch_;
};

}  // namespace dfl
