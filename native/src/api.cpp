// The exported C ABI: one function table per supported version. Every entry point catches all exceptions.
#include <algorithm>
#include <memory>
#include <new>
#include <string>

#include "arch/model.h"
#include "arch/qwen.h"
#include "ops/device.h"
#include "sample.h"

struct dfl_model {
    std::unique_ptr<dfl::Model> impl;
};

namespace {

thread_local std::string g_last_error;

template <class F>
dfl_status guard(const char *what, F &&f) {
    try {
        f();
        return DFL_OK;
    } catch (const dfl::Error &e) {
        g_last_error = std::string(what) + ": " + e.what();
        return e.code;
    } catch (const std::bad_alloc &) {
        g_last_error = std::string(what) + ": out of memory";
        return DFL_ERR_NO_MEMORY;
    } catch (const std::exception &e) {
        g_last_error = std::string(what) + ": " + e.what();
        return DFL_ERR_INTERNAL;
    } catch (...) {
        g_last_error = std::string(what) + ": unknown error";
        return DFL_ERR_INTERNAL;
    }
}

dfl_model *need(dfl_model *m) {
    if (!m) dfl::fail(DFL_ERR_INVALID, "model is null");
    return m;
}
const dfl_model *need(const dfl_model *m) {
    if (!m) dfl::fail(DFL_ERR_INVALID, "model is null");
    return m;
}

const char *last_error() { return g_last_error.c_str(); }

int32_t device_count() {
    try {
        return dfl::device_count();
    } catch (...) {
        return 0;
    }
}

dfl_status model_load(const dfl_model_params *p, dfl_model **out) {
    return guard("load model", [&] {
        if (!p || !out) dfl::fail(DFL_ERR_INVALID, "params or out is null");
        if (p->struct_size < sizeof(dfl_model_params))
            dfl::fail(DFL_ERR_INVALID, "dfl_model_params.struct_size " + std::to_string(p->struct_size) + " is too small");
        *out = nullptr;
        std::unique_ptr<dfl_model> m(new dfl_model);
        m->impl = dfl::load_model(*p);
        *out = m.release();
    });
}

void model_free(dfl_model *m) { delete m; }

dfl_status model_info(const dfl_model *m, dfl_model_info *out) {
    return guard("model info", [&] {
        if (!out) dfl::fail(DFL_ERR_INVALID, "out is null");
        need(m)->impl->info(out);
    });
}

dfl_status kv_stats(const dfl_model *m, dfl_kv_stats *out) {
    return guard("kv stats", [&] {
        if (!out) dfl::fail(DFL_ERR_INVALID, "out is null");
        need(m)->impl->kv_stats(out);
    });
}

dfl_status seq_alloc(dfl_model *m, int32_t *out) {
    return guard("alloc sequence", [&] {
        if (!out) dfl::fail(DFL_ERR_INVALID, "out is null");
        *out = need(m)->impl->seq_alloc();
    });
}

dfl_status seq_free(dfl_model *m, int32_t s) {
    return guard("free sequence", [&] { need(m)->impl->seq_free(s); });
}

dfl_status seq_reserve(dfl_model *m, int32_t s, uint32_t n) {
    return guard("reserve", [&] { need(m)->impl->seq_reserve(s, n); });
}

dfl_status seq_length(const dfl_model *m, int32_t s, uint32_t *out) {
    return guard("sequence length", [&] {
        if (!out) dfl::fail(DFL_ERR_INVALID, "out is null");
        *out = need(m)->impl->seq_length(s);
    });
}

dfl_status seq_truncate(dfl_model *m, int32_t s, uint32_t n) {
    return guard("truncate", [&] { need(m)->impl->seq_truncate(s, n); });
}

dfl_status seq_snapshot(dfl_model *m, int32_t s) {
    return guard("snapshot", [&] { need(m)->impl->seq_snapshot(s); });
}

dfl_status seq_rollback(dfl_model *m, int32_t s) {
    return guard("rollback", [&] { need(m)->impl->seq_rollback(s); });
}

dfl_status forward(dfl_model *m, const dfl_batch *b) {
    return guard("forward", [&] {
        if (!b) dfl::fail(DFL_ERR_INVALID, "batch is null");
        need(m)->impl->forward(*b);
    });
}

dfl_status forward_topk(dfl_model *m, const dfl_batch *b, uint32_t k, int32_t *ids, float *logits, float *lse) {
    return guard("forward", [&] {
        if (!b) dfl::fail(DFL_ERR_INVALID, "batch is null");
        dfl::TopKOut out;
        out.k = (int)std::min<uint32_t>(k, 1u << 20);
        out.ids = ids;
        out.vals = logits;
        out.lse = lse;
        need(m)->impl->forward(*b, &out);
    });
}

dfl_status draft_forward(dfl_model *m, uint32_t n_entries, const dfl_draft_entry *entries, uint32_t k, int32_t *ids,
                         float *logits, float *lse) {
    return guard("draft forward", [&] {
        if (n_entries > 0 && !entries) dfl::fail(DFL_ERR_INVALID, "entries is null");
        dfl::TopKOut out;
        out.k = (int)std::min<uint32_t>(k, 1u << 20);
        out.ids = ids;
        out.vals = logits;
        out.lse = lse;
        need(m)->impl->draft_forward(n_entries, entries, out);
    });
}

dfl_status draft_forward2(dfl_model *m, uint32_t n_entries, const dfl_draft_entry *entries, uint32_t k, int32_t *ids,
                          float *logits, float *lse, float *trans) {
    return guard("draft forward", [&] {
        if (n_entries > 0 && !entries) dfl::fail(DFL_ERR_INVALID, "entries is null");
        dfl::TopKOut out;
        out.k = (int)std::min<uint32_t>(k, 1u << 20);
        out.ids = ids;
        out.vals = logits;
        out.lse = lse;
        out.trans = trans;
        need(m)->impl->draft_forward(n_entries, entries, out);
    });
}

dfl_status forward_tree(dfl_model *m, const dfl_batch *b, const int32_t *const *parents, uint32_t k, int32_t *ids,
                        float *logits, float *lse) {
    return guard("forward", [&] {
        if (!b) dfl::fail(DFL_ERR_INVALID, "batch is null");
        if (k == 0) {
            need(m)->impl->forward_tree(*b, nullptr, parents);
            return;
        }
        dfl::TopKOut out;
        out.k = (int)std::min<uint32_t>(k, 1u << 20);
        out.ids = ids;
        out.vals = logits;
        out.lse = lse;
        need(m)->impl->forward_tree(*b, &out, parents);
    });
}

dfl_status seq_accept_path(dfl_model *m, int32_t s, const int32_t *path, uint32_t n) {
    return guard("accept path", [&] {
        if (n > 0 && !path) dfl::fail(DFL_ERR_INVALID, "path is null");
        need(m)->impl->seq_accept_path(s, path, n);
    });
}

dfl_status seq_export(const dfl_model *m, int32_t s, void *buf, uint64_t size, uint64_t *needed) {
    return guard("export sequence", [&] {
        const uint64_t n = need(m)->impl->seq_export(s, buf, size);
        if (needed) *needed = n;
        else if (!buf || size < n)
            dfl::fail(DFL_ERR_INVALID, "the blob takes " + std::to_string(n) + " bytes, the buffer has " +
                                           std::to_string(buf ? size : 0) + " and needed is null");
    });
}

dfl_status seq_import(dfl_model *m, int32_t s, const void *buf, uint64_t size) {
    return guard("import sequence", [&] { need(m)->impl->seq_import(s, buf, size); });
}

dfl_status sample(const float *logits, uint32_t n_vocab, const dfl_sampling *p, const int32_t *history,
                  uint32_t n_history, uint64_t *rng, int32_t *out) {
    return guard("sample", [&] {
        if (!logits || !p || !rng || !out || (n_history > 0 && !history)) dfl::fail(DFL_ERR_INVALID, "null argument");
        *out = dfl::sample_token(logits, n_vocab, *p, history, n_history, rng);
    });
}

dfl_status sample_dist(const float *logits, uint32_t n_vocab, const dfl_sampling *p, const int32_t *history,
                       uint32_t n_history, int32_t *ids, double *probs, uint32_t *n) {
    return guard("sample distribution", [&] {
        if (!logits || !p || !ids || !probs || !n || (n_history > 0 && !history)) dfl::fail(DFL_ERR_INVALID, "null argument");
        *n = dfl::sample_distribution(logits, n_vocab, *p, history, n_history, ids, probs);
    });
}

dfl_status sample_candidates(const int32_t *ids, const float *logits, const uint8_t *suppressed, uint32_t k, float lse,
                             uint32_t n_vocab, const dfl_sampling *p, uint64_t *rng, int32_t *out) {
    return guard("sample candidates", [&] {
        if (!ids || !logits || !p || !rng || !out) dfl::fail(DFL_ERR_INVALID, "null argument");
        *out = dfl::sample_candidates(ids, logits, suppressed, k, lse, n_vocab, *p, rng);
    });
}

dfl_status logits_row(dfl_model *m, uint32_t row, float *out) {
    return guard("logits row", [&] {
        if (!out) dfl::fail(DFL_ERR_INVALID, "out is null");
        need(m)->impl->logits_row(row, out);
    });
}

dfl_status captures(const dfl_model *m, const float **out, uint64_t *n_floats) {
    return guard("captures", [&] {
        if (!out || !n_floats) dfl::fail(DFL_ERR_INVALID, "null argument");
        *out = need(m)->impl->captures(n_floats);
    });
}

dfl_status device_memory(int32_t index, uint64_t *free_bytes, uint64_t *total_bytes) {
    return guard("device memory", [&] {
        if (!free_bytes || !total_bytes) dfl::fail(DFL_ERR_INVALID, "null argument");
        if (index < 0 || index >= dfl::device_count())
            dfl::fail(DFL_ERR_INVALID, std::string(dfl::device_kind()) + ":" + std::to_string(index) + " does not exist (" +
                                           std::to_string(dfl::device_count()) + " device(s))");
        dfl::device_memory(index, free_bytes, total_bytes);
    });
}

dfl_status model_estimate(const dfl_model_params *p, dfl_model_estimate *out) {
    return guard("estimate model", [&] {
        if (!p || !out) dfl::fail(DFL_ERR_INVALID, "params or out is null");
        if (p->struct_size < sizeof(dfl_model_params))
            dfl::fail(DFL_ERR_INVALID, "dfl_model_params.struct_size " + std::to_string(p->struct_size) + " is too small");
        dfl::estimate_model(*p, out);
    });
}

const dfl_api kApiV1 = {
    DFL_API_VERSION, sizeof(dfl_api), dfl::device_kind(), last_error, device_count, model_load, model_free, model_info,
    kv_stats, seq_alloc, seq_free, seq_reserve, seq_length, seq_truncate, seq_snapshot, seq_rollback, forward, sample,
    device_memory, model_estimate, forward_topk, draft_forward, draft_forward2, forward_tree, seq_accept_path,
    seq_export, seq_import, sample_dist, sample_candidates, logits_row, captures,
};

}  // namespace

extern "C" __attribute__((visibility("default"))) const dfl_api *dfl_get_api(uint32_t version) {
    return version == 1 ? &kApiV1 : nullptr;
}
