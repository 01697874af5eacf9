// What the C ABI asks of a loaded model, whatever its architecture. Each architecture (arch/*.cpp) implements it once,
// against the op table of ops/device.h, so every device runs the same plan.
#pragma once

#include <cstring>
#include <memory>

#include "common.h"
#include "ops/device.h"

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

// Bytes of `rows` rows of k candidates as Device::topk leaves them in one buffer: ids [rows][k], values [rows][k],
// log-sum-exps [rows].
inline size_t topk_bytes(int64_t rows, int k) { return (size_t)rows * (2 * (size_t)k + 1) * 4; }

// Device::topk of `rows` logits rows of n_vocab into buf (topk_bytes(rows, k) on the device) in that layout.
inline void device_topk(Device &dev, const float *logits, int64_t rows, int64_t n_vocab, int k, void *buf) {
    int32_t *ids = (int32_t *)buf;
    float *vals = (float *)(ids + (size_t)rows * k), *lse = vals + (size_t)rows * k;
    dev.topk(logits, rows, n_vocab, k, ids, vals, lse);
}

// Those candidates, copied to the host as `host`, into out: row i to out's row dest[i] (dest null: row i).
inline void unpack_topk(const uint8_t *host, int64_t rows, const TopKOut &out, const int64_t *dest = nullptr) {
    const size_t k = (size_t)out.k, rk = (size_t)rows * k;
    const int32_t *ids = (const int32_t *)host;
    const float *vals = (const float *)(ids + rk), *lse = vals + rk;
    if (!dest) {
        std::memcpy(out.ids, ids, rk * 4);
        std::memcpy(out.vals, vals, rk * 4);
        std::memcpy(out.lse, lse, (size_t)rows * 4);
        return;
    }
    for (int64_t i = 0; i < rows; i++) {
        const size_t d = (size_t)dest[i];
        std::memcpy(out.ids + d * k, ids + (size_t)i * k, k * 4);
        std::memcpy(out.vals + d * k, vals + (size_t)i * k, k * 4);
        out.lse[d] = lse[i];
    }
}

// Fails (DFL_ERR_INVALID) unless a batch that wants `rows` logits rows has somewhere to put them: b.logits or topk,
// and topk with a supported k and its buffers.
inline void check_batch_outputs(const dfl_batch &b, int64_t rows, const TopKOut *topk) {
    if (rows > 0 && !b.logits && !topk) fail(DFL_ERR_INVALID, "batch: logits requested but the output buffer is null");
    if (topk && (topk->k < 1 || topk->k > 64 || (rows > 0 && (!topk->ids || !topk->vals || !topk->lse))))
        fail(DFL_ERR_INVALID, "batch: top-k needs k in [1, 64] and three output buffers");
}

// Row `row` of the logits a forward left on the device (n_rows rows of n_vocab floats; 0 when it kept none) into the
// host's out (dflash.h logits_row).
inline void copy_logits_row(Device &dev, const DevBuf &logits, int64_t n_rows, int64_t n_vocab, uint32_t row, float *out) {
    if ((int64_t)row >= n_rows)
        fail(DFL_ERR_STATE, "logits row " + std::to_string(row) + ": the last forward kept " + std::to_string(n_rows) +
                                " logits rows");
    dev.to_host(out, logits.f() + (int64_t)row * n_vocab, (size_t)n_vocab * sizeof(float));
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
    virtual uint64_t seq_export(int32_t s, void *buf, uint64_t size) {
        fail(DFL_ERR_UNSUPPORTED, "this architecture cannot export a sequence's state (seq_export)");
    }
    // Loads a seq_export blob into an empty sequence (dflash.h seq_import).
    virtual void seq_import(int32_t s, const void *buf, uint64_t size) {
        fail(DFL_ERR_UNSUPPORTED, "this architecture cannot import a sequence's state (seq_import)");
    }
    // A whole logits row of the last forward (dflash.h logits_row).
    virtual void logits_row(uint32_t row, float *out) {
        fail(DFL_ERR_UNSUPPORTED, "this architecture keeps no logits rows (logits_row)");
    }
    // The captures the last forward left in the library (dflash.h captures): where they are, and in *n_floats how
    // many.
    virtual const float *captures(uint64_t *n_floats) const {
        fail(DFL_ERR_STATE, "the last forward left no hidden-state captures in the library (captures)");
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
