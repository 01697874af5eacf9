// What the C ABI asks of a loaded model, whatever its architecture. Each architecture (arch/*.cpp) implements it once,
// against the op table of ops/device.h, so every device runs the same plan.
#pragma once

#include <memory>

#include "common.h"

namespace dfl {

// Where forward puts each logits row's k best candidates instead of the row (host arrays: ids, vals [rows][k],
// lse [rows]).
struct TopKOut {
    int k = 0;
    int32_t *ids = nullptr;
    float *vals = nullptr;
    float *lse = nullptr;
    float *trans = nullptr;  // DFlash2 draft_forward2: [rows][k][k] selector transition scores (null: not wanted)
};

// Fails (DFL_ERR_INVALID) unless a batch that wants `rows` logits rows has somewhere to put them: b.logits or topk,
// and topk with a supported k and its buffers.
inline void check_batch_outputs(const dfl_batch &b, int64_t rows, const TopKOut *topk) {
    if (rows > 0 && !b.logits && !topk) fail(DFL_ERR_INVALID, "batch: logits requested but the output buffer is null");
    if (topk && (topk->k < 1 || topk->k > 64 || (rows > 0 && (!topk->ids || !topk->vals || !topk->lse))))
        fail(DFL_ERR_INVALID, "batch: top-k needs k in [1, 64] and three output buffers");
}

class Model {
public:
    virtual ~Model() = default;
    virtual void info(dfl_model_info *out) const = 0;
    virtual void kv_stats(dfl_kv_stats *out) const = 0;
    virtual int32_t seq_alloc() = 0;
    virtual void seq_free(int32_t s) = 0;
    virtual void seq_reserve(int32_t s, uint32_t n_tokens) = 0;
    virtual uint32_t seq_length(int32_t s) const = 0;
    virtual void seq_truncate(int32_t s, uint32_t n) = 0;
    virtual void seq_snapshot(int32_t s) = 0;
    virtual void seq_rollback(int32_t s) = 0;
    virtual void forward(const dfl_batch &b, const TopKOut *topk = nullptr) = 0;
    // forward with tree entries (dflash.h forward_tree): parents[e] != null makes entry e a token tree.
    virtual void forward_tree(const dfl_batch &b, const TopKOut *topk, const int32_t *const *parents) {
        if (!parents) return forward(b, topk);
        fail(DFL_ERR_UNSUPPORTED, "this architecture has no tree verification (forward_tree)");
    }
    // Keep one root-to-node path of the sequence's last tree forward (dflash.h seq_accept_path).
    virtual void seq_accept_path(int32_t s, const int32_t *path, uint32_t n) {
        fail(DFL_ERR_UNSUPPORTED, "this architecture has no tree verification (seq_accept_path)");
    }
    // The sequence's whole state as one blob (dflash.h seq_export): returns the bytes it takes, writes them when
    // size covers them.
    virtual uint64_t seq_export(int32_t s, void *buf, uint64_t size) const {
        fail(DFL_ERR_UNSUPPORTED, "this architecture cannot export a sequence's state (seq_export)");
    }
    // Loads a seq_export blob into an empty sequence (dflash.h seq_import).
    virtual void seq_import(int32_t s, const void *buf, uint64_t size) {
        fail(DFL_ERR_UNSUPPORTED, "this architecture cannot import a sequence's state (seq_import)");
    }
    // A DFlash draft step (dflash.h draft_forward); only the dflash architecture has one.
    virtual void draft_forward(uint32_t n_entries, const dfl_draft_entry *entries, const TopKOut &topk) {
        fail(DFL_ERR_UNSUPPORTED, "this architecture is not a DFlash draft; draft_forward needs arch \"dflash\"");
    }
};

// Loads the model of params->arch onto the library's device; DFL_ERR_UNSUPPORTED for an unknown architecture.
std::unique_ptr<Model> load_model(const dfl_model_params &p);
// What load_model would take on the device, without loading.
void estimate_model(const dfl_model_params &p, dfl_model_estimate *out);

}  // namespace dfl
