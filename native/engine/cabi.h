// The C side of native/engine's cgo calls: the library's function table opened by dlopen, and one shim per entry
// point (included by each file of the package that calls the library).
#ifndef DFLASH_ENGINE_CABI_H
#define DFLASH_ENGINE_CABI_H

#include <dlfcn.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include "dflash.h"

// The shims below call through the library's function table. Each copies last_error() within the same C call, so the
// message belongs to the failing call whatever OS thread the goroutine runs on next.

static inline char *dup_error(const dfl_api *a) { return strdup(a->last_error()); }

static inline const dfl_api *open_engine(const char *path, void **handle, char **err) {
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h) { *err = strdup(dlerror()); return NULL; }
	dfl_get_api_fn get = (dfl_get_api_fn)dlsym(h, "dfl_get_api");
	if (!get) { *err = strdup("symbol dfl_get_api not found"); dlclose(h); return NULL; }
	const dfl_api *a = get(DFL_API_VERSION);
	if (!a) { *err = strdup("the library does not implement this ABI version"); dlclose(h); return NULL; }
	*handle = h;
	return a;
}

static inline int32_t w_device_count(const dfl_api *a) { return a->device_count(); }

static inline dfl_status w_model_load(const dfl_api *a, const dfl_model_params *p, dfl_model **out, char **err) {
	dfl_status rc = a->model_load(p, out);
	if (rc) *err = dup_error(a);
	return rc;
}
static inline void w_model_free(const dfl_api *a, dfl_model *m) { a->model_free(m); }
static inline dfl_status w_model_info(const dfl_api *a, const dfl_model *m, dfl_model_info *out, char **err) {
	out->struct_size = sizeof *out;
	dfl_status rc = a->model_info(m, out);
	if (rc) *err = dup_error(a);
	return rc;
}
static inline dfl_status w_kv_stats(const dfl_api *a, const dfl_model *m, dfl_kv_stats *out, char **err) {
	dfl_status rc = a->kv_stats(m, out);
	if (rc) *err = dup_error(a);
	return rc;
}
static inline dfl_status w_seq_alloc(const dfl_api *a, dfl_model *m, int32_t *out, char **err) {
	dfl_status rc = a->seq_alloc(m, out);
	if (rc) *err = dup_error(a);
	return rc;
}
// op: 0 free, 1 reserve, 2 truncate, 3 snapshot, 4 rollback
static inline dfl_status w_seq_op(const dfl_api *a, dfl_model *m, int op, int32_t s, uint32_t n, char **err) {
	dfl_status rc;
	switch (op) {
	case 0: rc = a->seq_free(m, s); break;
	case 1: rc = a->seq_reserve(m, s, n); break;
	case 2: rc = a->seq_truncate(m, s, n); break;
	case 3: rc = a->seq_snapshot(m, s); break;
	default: rc = a->seq_rollback(m, s); break;
	}
	if (rc) *err = dup_error(a);
	return rc;
}
static inline dfl_status w_seq_length(const dfl_api *a, const dfl_model *m, int32_t s, uint32_t *out, char **err) {
	dfl_status rc = a->seq_length(m, s, out);
	if (rc) *err = dup_error(a);
	return rc;
}
static inline dfl_status w_forward(const dfl_api *a, dfl_model *m, const dfl_batch *b, char **err) {
	dfl_status rc = a->forward(m, b);
	if (rc) *err = dup_error(a);
	return rc;
}
static inline dfl_status w_sample(const dfl_api *a, const float *logits, uint32_t n_vocab, const dfl_sampling *p,
                           const int32_t *hist, uint32_t n_hist, uint64_t *rng, int32_t *out, char **err) {
	dfl_status rc = a->sample(logits, n_vocab, p, hist, n_hist, rng, out);
	if (rc) *err = dup_error(a);
	return rc;
}
// Entries appended to the table after its first release exist only when the library's struct_size covers them.
static inline int has_memory_api(const dfl_api *a) {
	return a->struct_size >= offsetof(dfl_api, model_estimate) + sizeof(a->model_estimate);
}
static inline dfl_status w_device_memory(const dfl_api *a, int32_t index, uint64_t *free_b, uint64_t *total_b, char **err) {
	dfl_status rc = a->device_memory(index, free_b, total_b);
	if (rc) *err = dup_error(a);
	return rc;
}
static inline dfl_status w_model_estimate(const dfl_api *a, const dfl_model_params *p, dfl_model_estimate *out, char **err) {
	out->struct_size = sizeof *out;
	dfl_status rc = a->model_estimate(p, out);
	if (rc) *err = dup_error(a);
	return rc;
}
static inline int has_topk_api(const dfl_api *a) {
	return a->struct_size >= offsetof(dfl_api, forward_topk) + sizeof(a->forward_topk);
}
static inline dfl_status w_forward_topk(const dfl_api *a, dfl_model *m, const dfl_batch *b, uint32_t k, int32_t *ids,
                                 float *logits, float *lse, char **err) {
	dfl_status rc = a->forward_topk(m, b, k, ids, logits, lse);
	if (rc) *err = dup_error(a);
	return rc;
}
static inline int has_tree_api(const dfl_api *a) {
	return a->struct_size >= offsetof(dfl_api, seq_accept_path) + sizeof(a->seq_accept_path);
}
static inline dfl_status w_forward_tree(const dfl_api *a, dfl_model *m, const dfl_batch *b, const int32_t *const *parents,
                                 uint32_t k, int32_t *ids, float *logits, float *lse, char **err) {
	dfl_status rc = a->forward_tree(m, b, parents, k, ids, logits, lse);
	if (rc) *err = dup_error(a);
	return rc;
}
static inline dfl_status w_seq_accept_path(const dfl_api *a, dfl_model *m, int32_t s, const int32_t *path, uint32_t n,
                                    char **err) {
	dfl_status rc = a->seq_accept_path(m, s, path, n);
	if (rc) *err = dup_error(a);
	return rc;
}
static inline int has_draft2_api(const dfl_api *a) {
	return a->struct_size >= offsetof(dfl_api, draft_forward2) + sizeof(a->draft_forward2);
}
static inline dfl_status w_draft_forward2(const dfl_api *a, dfl_model *m, uint32_t n, const dfl_draft_entry *es, uint32_t k,
                                   int32_t *ids, float *logits, float *lse, float *trans, char **err) {
	dfl_status rc = a->draft_forward2(m, n, es, k, ids, logits, lse, trans);
	if (rc) *err = dup_error(a);
	return rc;
}
static inline int has_draft_api(const dfl_api *a) {
	return a->struct_size >= offsetof(dfl_api, draft_forward) + sizeof(a->draft_forward);
}
static inline dfl_status w_draft_forward(const dfl_api *a, dfl_model *m, uint32_t n, const dfl_draft_entry *es, uint32_t k,
                                  int32_t *ids, float *logits, float *lse, char **err) {
	dfl_status rc = a->draft_forward(m, n, es, k, ids, logits, lse);
	if (rc) *err = dup_error(a);
	return rc;
}
static inline int has_state_api(const dfl_api *a) {
	return a->struct_size >= offsetof(dfl_api, seq_import) + sizeof(a->seq_import);
}
static inline dfl_status w_seq_export(const dfl_api *a, const dfl_model *m, int32_t s, void *buf, uint64_t size,
                               uint64_t *needed, char **err) {
	dfl_status rc = a->seq_export(m, s, buf, size, needed);
	if (rc) *err = dup_error(a);
	return rc;
}
static inline int has_sample_dist_api(const dfl_api *a) {
	return a->struct_size >= offsetof(dfl_api, sample_dist) + sizeof(a->sample_dist);
}
static inline dfl_status w_sample_dist(const dfl_api *a, const float *logits, uint32_t n_vocab, const dfl_sampling *p,
                                const int32_t *hist, uint32_t n_hist, int32_t *ids, double *probs, uint32_t *n, char **err) {
	dfl_status rc = a->sample_dist(logits, n_vocab, p, hist, n_hist, ids, probs, n);
	if (rc) *err = dup_error(a);
	return rc;
}
static inline int has_candidate_sampling_api(const dfl_api *a) {
	return a->struct_size >= offsetof(dfl_api, logits_row) + sizeof(a->logits_row);
}
static inline dfl_status w_sample_candidates(const dfl_api *a, const int32_t *ids, const float *logits, const uint8_t *suppressed,
                                      uint32_t k, float lse, uint32_t n_vocab, const dfl_sampling *p, uint64_t *rng,
                                      int32_t *out, char **err) {
	dfl_status rc = a->sample_candidates(ids, logits, suppressed, k, lse, n_vocab, p, rng, out);
	if (rc) *err = dup_error(a);
	return rc;
}
static inline int has_captures_api(const dfl_api *a) {
	return a->struct_size >= offsetof(dfl_api, captures) + sizeof(a->captures);
}
static inline dfl_status w_captures(const dfl_api *a, const dfl_model *m, const float **out, uint64_t *n, char **err) {
	dfl_status rc = a->captures(m, out, n);
	if (rc) *err = dup_error(a);
	return rc;
}
static inline dfl_status w_logits_row(const dfl_api *a, dfl_model *m, uint32_t row, float *out, char **err) {
	dfl_status rc = a->logits_row(m, row, out);
	if (rc) *err = dup_error(a);
	return rc;
}
static inline dfl_status w_seq_import(const dfl_api *a, dfl_model *m, int32_t s, const void *buf, uint64_t size, char **err) {
	dfl_status rc = a->seq_import(m, s, buf, size);
	if (rc) *err = dup_error(a);
	return rc;
}

#endif
